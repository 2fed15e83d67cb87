//! The `dsc` binary: the command line of the `dsc_cli` library (src/lib.rs).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(dsc_cli::run_binary(std::env::args_os()))
}
