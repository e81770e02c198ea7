//! Project tasks: `cargo xtask setup | build | test`.
//!
//! xtask must build with whatever stable toolchain the machine has: it is what
//! installs the pinned ones.

mod cmd;
mod setup;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "pkeyfw project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the pinned toolchains and bpf-linker if missing (idempotent).
    Setup,
    /// Set up, then build target/release/pkeyfw with the XDP object embedded.
    Build,
    /// Set up, then run every test of the project (needs root).
    Test,
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Build => setup::run().and_then(|()| build()),
        Task::Test => setup::run().and_then(|()| test::run()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Builds the release CLI.
fn build() -> Result<()> {
    cmd::cargo(&["build", "--release", "--package", "pkeyfw"])
}
