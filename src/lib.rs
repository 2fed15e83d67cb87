//! `dsc`, the dataset compiler's command line: parse flags, call the crates, print. [`run`] is
//! the whole command; the `dsc` binary calls it, and so does the Python package's `dsc` console
//! script (through its extension), so that `pip install` brings the same command line.
#![forbid(unsafe_code)]

mod args;
mod bench_cmd;
mod compile_cmd;
mod digits_cmd;
mod gen_cmd;
mod inspect_cmd;
mod lineage_cmd;
mod order_cmd;
mod output;
mod report_cmd;
mod show_cmd;
mod side_file;
mod storage_cmd;
mod upload;
mod verify_cmd;

use clap::Parser;
use dsc_format::spelling::{spell, Spelling};
use std::ffi::OsString;
use std::io::Write;

/// Exit code for a failed check (`dsc verify` found problems).
const EXIT_PROBLEMS: u8 = 1;
/// Exit code for an error (bad input, I/O).
const EXIT_ERROR: u8 = 2;

/// Whether this process is the `dsc` binary itself, which can start itself again (to remove a
/// replaced cache after a compile has returned), and not a host that runs this command line
/// in-process (the Python package's console script, where the program is the interpreter).
static OWN_BINARY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// [`run`], from the `dsc` binary's own `main`.
pub fn run_binary<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    OWN_BINARY.store(true, std::sync::atomic::Ordering::Relaxed);
    run(args)
}

pub(crate) fn is_own_binary() -> bool {
    OWN_BINARY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs the command line `args` (the program's name first, as `std::env::args_os` gives it) and
/// returns the process's exit code. Meant to be the whole process: it sets the exit code of a
/// shard truncated under a reader, may start rayon's global pool, and installs signal handlers
/// for the commands that clean up when stopped.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let code = run_command(args);
    // A host process (Python) outlives this call: what was printed must reach it now.
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    code
}

fn run_command<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    // A shard truncated under a reader: one line naming it, then the error exit code.
    dsc_loader::sigbus::exit_with(i32::from(EXIT_ERROR));
    // The command owns its process: freed buffers are kept for the next file's.
    dsc_compiler::keep_freed_memory();
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cli = match args::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(said) = args::loader_flag_elsewhere(&e, args.get(1..).unwrap_or(&[])) {
                eprintln!("dsc: {said}");
                return e.exit_code() as u8;
            }
            // --help and --version are "errors" that print to stdout and exit 0.
            let _ = e.print();
            return e.exit_code() as u8;
        }
    };
    if let Some(n) = cli.threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
        {
            eprintln!("dsc: cannot start {n} threads: {e}");
            return EXIT_ERROR;
        }
    }
    // A read of a cache in object storage stops between two chunks of a download on SIGINT
    // or SIGTERM, saying what it was fetching, and keeps nothing half-fetched.
    let remote = |p: &std::path::Path| dsc_loader::is_remote(&p.to_string_lossy());
    let fetches = match &cli.command {
        args::Command::Order(a) => a.caches.iter().any(|c| remote(c)),
        args::Command::Bench(a) => remote(&a.cache),
        args::Command::Show(a) => remote(&a.cache),
        args::Command::Verify(a) => remote(&a.cache),
        _ => false,
    };
    if fetches {
        let interrupt = dsc_compiler::stop_on_signals();
        dsc_store::stop_downloads_when(move || interrupt.requested());
    }
    let result = match cli.command {
        args::Command::Gen(a) => gen_cmd::run(a),
        args::Command::Compile(a) => compile_cmd::run(*a),
        args::Command::Inspect(a) => inspect_cmd::run(a),
        args::Command::Verify(a) => verify_cmd::run(a),
        args::Command::Show(a) => show_cmd::run(a),
        args::Command::Report(a) => report_cmd::run(a),
        args::Command::Order(a) => order_cmd::run(a),
        args::Command::Bench(a) => bench_cmd::run(a),
        args::Command::DigitSplit(a) => digits_cmd::run(a),
        args::Command::Merge(a) => compile_cmd::merge(a),
        args::Command::Append(a) => lineage_cmd::append(*a),
        args::Command::Compact(a) => lineage_cmd::compact(a),
        args::Command::Log(a) => lineage_cmd::log(a),
        args::Command::Tag(a) => lineage_cmd::tag(a),
        args::Command::Gc(a) => lineage_cmd::gc(a),
        args::Command::Compress(a) => storage_cmd::compress(a),
        args::Command::Decompress(a) => storage_cmd::decompress(a),
        args::Command::Status(a) => compile_cmd::status(a),
        args::Command::RemoveReplaced(a) => compile_cmd::remove_replaced(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if output::is_broken_pipe(&e) {
                return 0;
            }
            // The libraries name options by their keys; the command line spells them as flags.
            let message = spell(&output::error_chain(&e), Spelling::Cli);
            eprintln!("dsc: {message}");
            // Stopped by a signal: the shell's convention, 128 + the signal.
            let store = |s: &dsc_store::StoreError| match s {
                dsc_store::StoreError::Interrupted { signal, .. }
                | dsc_store::StoreError::Stopped { signal, .. } => Some(*signal),
                _ => None,
            };
            let signal = match e.downcast_ref::<dsc_compiler::CompileError>() {
                Some(dsc_compiler::CompileError::Interrupted { signal }) => Some(*signal),
                _ => e
                    .downcast_ref::<dsc_store::StoreError>()
                    .and_then(store)
                    .or_else(|| match e.downcast_ref::<dsc_loader::LoadError>() {
                        Some(dsc_loader::LoadError::Store(s)) => store(s),
                        _ => None,
                    }),
            };
            match signal {
                Some(signal) => (128 + signal) as u8,
                None => EXIT_ERROR,
            }
        }
    }
}
