//! The `pkeyfw` command: the command line ([`pkeyfw::cli`]) parsed and run,
//! or, started by a container runtime as its CNI plugin, the plugin
//! ([`pkeyfw::cni`], through [`pkeyfw::cmd::cni`]).

use std::process::ExitCode;

use clap::Parser as _;
use pkeyfw::cli::Cli;

fn main() -> ExitCode {
    if pkeyfw::cmd::cni::invoked() {
        return pkeyfw::cmd::cni::main();
    }
    match Cli::parse().run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pkeyfw: {e:#}");
            ExitCode::FAILURE
        }
    }
}
