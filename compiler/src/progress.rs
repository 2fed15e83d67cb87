//! Progress of a long compile: the trait the pipeline reports to, terminal bars, and the
//! request to stop that a signal or Ctrl-C leaves for the compile to find.

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
    /// The signal number of a request to stop (SIGINT, SIGTERM), if one came. The compile asks
    /// before each unit of work (a file read, a bucket, a shard) and before it commits, and
    /// then fails with [`crate::CompileError::Interrupted`], removing what it wrote.
    fn interrupted(&self) -> Option<i32> {
        None
    }
}

/// A request to stop running compiles: set from a signal handler (the store is
/// async-signal-safe) or another thread, read through [`Progress::interrupted`].
#[derive(Debug, Default)]
pub struct Interrupt(std::sync::atomic::AtomicI32);

impl Interrupt {
    /// No request yet.
    pub const fn new() -> Interrupt {
        Interrupt(std::sync::atomic::AtomicI32::new(0))
    }
    /// Asks the compiles watching this to stop, naming `signal`.
    pub fn request(&self, signal: i32) {
        self.0.store(signal, std::sync::atomic::Ordering::Relaxed);
    }
    /// The signal of the request, if one came.
    pub fn requested(&self) -> Option<i32> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            s => Some(s),
        }
    }
}

/// The process's one [`Interrupt`], which [`stop_on_signals`] points SIGINT, SIGTERM and
/// SIGHUP at.
static SIGNALLED: std::sync::OnceLock<std::sync::Arc<Interrupt>> = std::sync::OnceLock::new();

/// Makes SIGINT, SIGTERM and SIGHUP ask running compiles to stop (they then remove what they
/// wrote and fail with [`crate::CompileError::Interrupted`]), and ignores SIGXFSZ, so that a
/// write past the file-size limit fails with an error the compile reports and cleans up after,
/// instead of killing the process without a word. A second signal while a stop is under way
/// ends the process at once (exit 128 + the signal). For programs (the `dsc` CLI) that own
/// their signals; returns the interrupt to watch ([`TerminalBars::with_interrupt`]).
#[allow(unsafe_code)]
pub fn stop_on_signals() -> std::sync::Arc<Interrupt> {
    extern "C" fn on_signal(signal: libc::c_int) {
        // Async-signal-safe: atomic loads and stores, and _exit.
        if let Some(interrupt) = SIGNALLED.get() {
            if interrupt.requested().is_some() {
                // SAFETY: _exit is async-signal-safe and ends the process.
                unsafe { libc::_exit(128 + signal) };
            }
            interrupt.request(signal);
        }
    }
    let interrupt = SIGNALLED.get_or_init(Default::default).clone();
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs a handler that only touches atomics and calls _exit.
        unsafe { libc::signal(signal, handler) };
    }
    // SAFETY: ignoring a signal changes nothing but its disposition.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    interrupt
}

/// Fails with [`crate::CompileError::Interrupted`] when `progress` says to stop.
pub(crate) fn check(progress: &dyn Progress) -> crate::error::Result<()> {
    match progress.interrupted() {
        Some(signal) => Err(crate::CompileError::Interrupted { signal }),
        None => Ok(()),
    }
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
    interrupt: Option<std::sync::Arc<Interrupt>>,
}

#[cfg(feature = "progress-bar")]
impl TerminalBars {
    /// Bars on stderr; none when `quiet` or when stderr is not a terminal.
    pub fn new(quiet: bool) -> TerminalBars {
        TerminalBars {
            current: Mutex::new(None),
            hidden: quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()),
            interrupt: None,
        }
    }

    /// These bars, and a compile that stops when `interrupt` is requested.
    pub fn with_interrupt(mut self, interrupt: std::sync::Arc<Interrupt>) -> TerminalBars {
        self.interrupt = Some(interrupt);
        self
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
    fn interrupted(&self) -> Option<i32> {
        self.interrupt.as_ref().and_then(|i| i.requested())
    }
}
