//! `clamp-bench` binary: parses the command line and hands over to the
//! library, so tests can drive the same code as a child process.

use clamp_bench::cli::Cli;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    match clamp_bench::runner::execute(Cli::parse().command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("clamp-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}
