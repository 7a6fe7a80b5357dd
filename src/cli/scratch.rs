//! Temporary copies of inputs read from a pipe are removed when the
//! command ends, and also when SIGINT, SIGTERM or SIGHUP ends it: the
//! default action of those kills the process before a `TempPath`'s drop
//! can run, and an interrupted `import --npy /dev/stdin` left its copy
//! (up to the whole matrix) in the temporary directory.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Paths to remove if a terminating signal comes.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Whether the thread that waits for the signals runs (or why not).
static WATCHER: OnceLock<Result<(), String>> = OnceLock::new();

/// Has `path` removed if SIGINT, SIGTERM or SIGHUP comes; the process then
/// ends as the signal's default action ends it. A signal the process was
/// started ignoring is left alone. (Its owner removes the path in the
/// normal course; removing a path already gone does nothing.)
pub fn remove_on_signal(path: &Path) -> anyhow::Result<()> {
    WATCHER
        .get_or_init(|| start_watcher().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| anyhow::anyhow!("cannot watch for signals: {e}"))?;
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).push(path.to_path_buf());
    Ok(())
}

fn start_watcher() -> std::io::Result<()> {
    // A signal the process was started ignoring (`nohup`, a background
    // job of a script) stays ignored: watching it would make it fatal.
    let watched: Vec<i32> = [SIGINT, SIGTERM, SIGHUP].into_iter().filter(|&s| !ignored(s)).collect();
    let mut signals = signal_hook::iterator::Signals::new(watched)?;
    std::thread::Builder::new()
        .name("deltamem-signals".into())
        .spawn(move || {
            let Some(signal) = signals.forever().next() else {
                return;
            };
            for path in LIVE.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                let _ = std::fs::remove_file(path);
            }
            // Ends the process as if no handler had been installed (the
            // exit only if that could not be done).
            let _ = signal_hook::low_level::emulate_default_handler(signal);
            std::process::exit(128 + signal);
        })?;
    Ok(())
}

/// Whether `signal` is ignored (SIG_IGN), as a process may be started.
fn ignored(signal: i32) -> bool {
    // SAFETY: an all-zero `sigaction` is a valid value of this plain C
    // struct, and sigaction(2) with a null new action only writes the
    // current disposition into `old`, which lives for the call.
    let (rc, old) = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        let rc = libc::sigaction(signal, std::ptr::null(), &mut old);
        (rc, old)
    };
    rc == 0 && old.sa_sigaction == libc::SIG_IGN
}

/// `interop::write_atomically`, with its temporary sibling removed on a
/// terminating signal too: a SIGTERM during an export of a 1M-node bank
/// left a 14.6 GB `.NAME.tmp-PID` beside the output.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<(), deltamem::interop::InteropError>,
) -> anyhow::Result<()> {
    // Resolved once: the temporary file removed on a signal is the one
    // written.
    let target = deltamem::interop::output_target(path)?;
    if let deltamem::interop::OutputTarget::Replace(file) = &target {
        remove_on_signal(&deltamem::interop::temp_sibling(file))?;
    }
    Ok(deltamem::interop::write_to(path, target, write)?)
}
