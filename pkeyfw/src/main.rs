//! The `pkeyfw` command: the command line ([`pkeyfw::cli`]) parsed and run.

use std::process::ExitCode;

use clap::Parser as _;
use pkeyfw::cli::Cli;

fn main() -> ExitCode {
    match Cli::parse().run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pkeyfw: {e:#}");
            ExitCode::FAILURE
        }
    }
}
