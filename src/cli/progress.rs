//! Progress bars for commands that can run for more than a second. Drawn
//! on stderr, and only when stderr is a terminal and `--quiet` is off, so
//! pipes, logs and scripts never see a control character.

use std::fmt;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{HumanDuration, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
}

fn wanted(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

impl Progress {
    /// A bar counting `total` units of `what` (e.g. "rows").
    pub fn bar(total: u64, what: &str, quiet: bool) -> Progress {
        if !wanted(quiet) {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let template = format!("{{spinner}} {{bar:40}} {{human_pos}}/{{human_len}} {what} ({{per_sec}}, eta {{eta}})");
        if let Ok(style) = ProgressStyle::with_template(&template) {
            let eta = |state: &ProgressState, w: &mut dyn fmt::Write| {
                let _ = w.write_str(&eta_text(state.pos(), state.eta()));
            };
            bar.set_style(style.progress_chars("=> ").with_key("eta", eta));
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar: Some(bar) }
    }

    /// A spinner for work of unknown length (the library reports no steps).
    pub fn spinner(message: &str, quiet: bool) -> Progress {
        if !wanted(quiet) {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(message.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress { bar: Some(bar) }
    }

    pub fn set(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
    }

    pub fn inc(&self, delta: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(delta);
        }
    }

    /// Prints a line above the bar (a bare eprintln would be overdrawn).
    pub fn note(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The time left as the bar shows it: unknown ("?") until the first unit
/// is done, since indicatif's estimate is 0 s before it has a rate (a
/// batch query spends its first pass there).
fn eta_text(done: u64, eta: Duration) -> String {
    match done {
        0 => "?".to_string(),
        _ => format!("{:#}", HumanDuration(eta)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_estimate_is_shown_before_the_first_unit() {
        assert_eq!(eta_text(0, Duration::ZERO), "?");
        assert_eq!(eta_text(0, Duration::from_secs(5)), "?");
        assert_eq!(
            eta_text(3, Duration::from_secs(90)),
            format!("{:#}", HumanDuration(Duration::from_secs(90)))
        );
    }
}
