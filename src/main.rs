//! `dsc`, the dataset compiler's command line: parse flags, call the crates, print.
#![forbid(unsafe_code)]

mod args;
mod bench_cmd;
mod compile_cmd;
mod digits_cmd;
mod gen_cmd;
mod inspect_cmd;
mod order_cmd;
mod output;
mod report_cmd;
mod show_cmd;
mod storage_cmd;
mod upload;
mod verify_cmd;

use clap::Parser;
use dsc_format::spelling::{spell, Spelling};
use std::process::ExitCode;

/// Exit code for a failed check (`dsc verify` found problems).
const EXIT_PROBLEMS: u8 = 1;
/// Exit code for an error (bad input, I/O).
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    // A shard truncated under a reader: one line naming it, then the error exit code.
    dsc_loader::sigbus::exit_with(i32::from(EXIT_ERROR));
    let cli = args::Cli::parse();
    if let Some(n) = cli.threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
        {
            eprintln!("dsc: cannot start {n} threads: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
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
        args::Command::Compress(a) => storage_cmd::compress(a),
        args::Command::Decompress(a) => storage_cmd::decompress(a),
        args::Command::Status(a) => compile_cmd::status(a),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if output::is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            // The libraries name options by their keys; the command line spells them as flags.
            let message = spell(&output::error_chain(&e), Spelling::Cli);
            eprintln!("dsc: {message}");
            // Stopped by a signal: the shell's convention, 128 + the signal.
            let signal = match e.downcast_ref::<dsc_compiler::CompileError>() {
                Some(dsc_compiler::CompileError::Interrupted { signal }) => Some(*signal),
                _ => match e.downcast_ref::<dsc_store::StoreError>() {
                    Some(dsc_store::StoreError::Interrupted { signal, .. }) => Some(*signal),
                    _ => None,
                },
            };
            match signal {
                Some(signal) => ExitCode::from((128 + signal) as u8),
                None => ExitCode::from(EXIT_ERROR),
            }
        }
    }
}
