//! Progress of a long compile: the trait the pipeline reports to, and terminal bars.

#[cfg(feature = "progress-bar")]
use indicatif::{ProgressBar, ProgressStyle};
#[cfg(feature = "progress-bar")]
use std::sync::Mutex;

/// Receives progress of a long compile. Every method has an empty default.
pub trait Progress: Sync {
    /// A stage begins; `total` units of work are expected (0 when unknown).
    fn stage(&self, _name: &str, _total: u64) {}
    /// `n` more units of the current stage are done.
    fn advance(&self, _n: u64) {}
    /// The compile has finished or failed.
    fn finish(&self) {}
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// Progress bars on stderr, one per stage: what the CLI and the Python binding show on a
/// terminal.
#[cfg(feature = "progress-bar")]
#[derive(Debug)]
pub struct TerminalBars {
    current: Mutex<Option<ProgressBar>>,
    hidden: bool,
}

#[cfg(feature = "progress-bar")]
impl TerminalBars {
    /// Bars on stderr; none when `quiet` or when stderr is not a terminal.
    pub fn new(quiet: bool) -> TerminalBars {
        TerminalBars {
            current: Mutex::new(None),
            hidden: quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()),
        }
    }
}

#[cfg(feature = "progress-bar")]
impl Progress for TerminalBars {
    fn stage(&self, name: &str, total: u64) {
        let mut current = self.current.lock().expect("progress lock");
        if let Some(bar) = current.take() {
            bar.finish_and_clear();
        }
        if self.hidden {
            return;
        }
        let bar = if total > 0 {
            ProgressBar::new(total).with_style(
                ProgressStyle::with_template("{prefix:>16} [{bar:40}] {pos}/{len} {elapsed}")
                    .expect("template")
                    .progress_chars("=> "),
            )
        } else {
            ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{prefix:>16} {spinner} {elapsed}").expect("template"),
            )
        };
        bar.set_prefix(name.to_string());
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        *current = Some(bar);
    }
    fn advance(&self, n: u64) {
        if let Some(bar) = &*self.current.lock().expect("progress lock") {
            bar.inc(n);
        }
    }
    fn finish(&self) {
        if let Some(bar) = self.current.lock().expect("progress lock").take() {
            bar.finish_and_clear();
        }
    }
}
