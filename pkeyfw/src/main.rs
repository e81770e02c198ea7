//! The `pkeyfw` command line.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Result;
use clap::{Parser, Subcommand};
use pkeyfw::{policy::Policy, replay};

/// InfiniBand partition isolation (P_Keys, Q_Keys) for RoCE, enforced in XDP.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a capture through the XDP program in the kernel (BPF_PROG_TEST_RUN)
    /// and print each frame's verdict and reason, then totals per reason.
    ///
    /// Nothing is attached to any interface. Needs root.
    Replay {
        /// Partition policy (TOML).
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// A pcap or pcapng capture (Ethernet or Linux cooked link type).
        capture: PathBuf,
        /// One JSON object per frame, then one with the totals.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pkeyfw: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Replay {
            policy,
            capture,
            json,
        } => {
            let policy = Policy::load(&policy)?;
            replay::run(&policy, &capture, json, &mut std::io::stdout().lock())?;
            Ok(())
        }
    }
}
