//! `deltamem freeze`, `compact` and `repair`: rewriting a bank's files.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::progress::Progress;
use super::{Status, write_json_line};

#[derive(Serialize)]
struct FreezeOut {
    out: String,
    nodes: u64,
    bytes_written: u64,
    /// The frozen copy was opened and its WAL, rows, links and payload
    /// records read back from the disk and checked.
    verified: bool,
    /// Its vector columns were read back and checked too (`--verify-vectors`);
    /// otherwise they were checked in memory as they were copied.
    vectors_verified: bool,
}

#[derive(Serialize)]
struct CompactOut {
    bank: String,
    nodes: u64,
    bytes_before: u64,
    bytes_after: u64,
    generation: u32,
}

fn print(value: &impl Serialize) -> anyhow::Result<()> {
    let mut out = super::stdout();
    write_json_line(&mut out, value)?;
    out.flush().context("cannot write to stdout")
}

/// Freezes from a read-only handle, so it works beside a running writer
/// and freezes what was committed when it started; then checks the copy.
/// The copy's vectors are the source's bytes, each checked against its
/// row's CRC before it was written; reading them back from the disk costs
/// as much disk time as writing them (reads and writes share the device),
/// so only `verify_vectors` does it. Everything freeze encoded anew (rows,
/// payload offsets, WAL, manifest) is always read back.
pub fn freeze(path: &Path, out_dir: &Path, verify_vectors: bool, quiet: bool) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let progress = Progress::spinner(
        &format!("freezing {} into {}", path.display(), out_dir.display()),
        quiet,
    );
    let scope = if verify_vectors {
        deltamem::VerifyScope::Everything
    } else {
        deltamem::VerifyScope::SkipVectorColumns
    };
    // The copy is read back and verified before it is renamed to OUT; one
    // that does not verify is removed.
    let report = bank
        .freeze_to_checked(out_dir, scope)
        .with_context(|| format!("cannot freeze {} into {}", path.display(), out_dir.display()))?;
    drop(progress);
    print(&FreezeOut {
        out: report.out,
        nodes: report.nodes,
        bytes_written: report.bytes_written,
        verified: true,
        vectors_verified: verify_vectors,
    })?;
    Ok(Status::Ok)
}

pub fn compact(path: &Path, quiet: bool) -> anyhow::Result<Status> {
    let mut bank = super::open_write(path)?;
    let progress = Progress::spinner(&format!("compacting {}", path.display()), quiet);
    let result = bank
        .compact()
        .with_context(|| format!("cannot compact {}", path.display()));
    drop(progress);
    let closed = super::close(bank, path);
    let report = result?;
    closed?;
    print(&CompactOut {
        bank: path.display().to_string(),
        nodes: report.nodes,
        bytes_before: report.bytes_before,
        bytes_after: report.bytes_after,
        generation: report.generation,
    })?;
    Ok(Status::Ok)
}

#[derive(Serialize)]
struct RepairOut {
    bank: String,
    /// False when the WAL had no damage to drop (or the flag was not given).
    repaired: bool,
    damaged_lsn: Option<u64>,
    damaged_offset_bytes: Option<u64>,
    dropped_lsns: Option<[u64; 2]>,
}

/// Reports (or, with `drop`, drops) the intact WAL records that follow a
/// damaged one. Without `drop` it opens read-only and changes nothing;
/// exit status 1 then means there is damage to repair.
pub fn repair(path: &Path, drop: bool) -> anyhow::Result<Status> {
    let damage = if drop {
        deltamem::Bank::repair_dir(path).with_context(|| format!("cannot repair {}", path.display()))?
    } else {
        match super::open_read(path) {
            Ok(bank) => {
                bank.check_writer_open()
                    .with_context(|| format!("cannot repair {}", path.display()))?;
                None
            }
            Err(e) => match e.downcast_ref::<deltamem::BankError>() {
                Some(damaged @ deltamem::BankError::WalDamaged { .. }) => {
                    eprintln!("deltamem: {damaged}");
                    eprintln!("deltamem: nothing changed; pass --drop-damaged-wal-tail to drop those records");
                    return Ok(Status::Failed);
                }
                _ => return Err(e),
            },
        }
    };
    print(&RepairOut {
        bank: path.display().to_string(),
        repaired: damage.is_some(),
        damaged_lsn: damage.as_ref().map(|d| d.lsn),
        damaged_offset_bytes: damage.as_ref().map(|d| d.offset_bytes),
        dropped_lsns: damage
            .as_ref()
            .map(|d| [*d.dropped_lsns.start(), *d.dropped_lsns.end()]),
    })?;
    Ok(Status::Ok)
}
