//! The `pkeyfw` command line as clap defines it: the binary parses it, and
//! the package's man pages and shell completions are generated from it
//! (examples/package_docs.rs), so they say what the binary accepts.

use anyhow::Result;
use clap::{Parser, Subcommand};

#[cfg(feature = "lab")]
use crate::cmd::lab;
use crate::cmd::{
    attach, detach, events, kernel, metrics, policy, qps, reload, replay, stats, switch,
};

/// InfiniBand partition isolation (P_Keys, Q_Keys) for RoCE, enforced in XDP.
///
/// Exit status: 0 on success, 1 on any error (the message says what and
/// where), 2 on a usage error.
#[derive(Parser)]
#[command(name = "pkeyfw", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Attach(attach::AttachArgs),
    Reload(reload::ReloadArgs),
    Detach(detach::DetachArgs),
    Stats(stats::StatsArgs),
    Metrics(metrics::MetricsArgs),
    Events(events::EventsArgs),
    Qps(qps::QpsArgs),
    #[cfg(feature = "lab")]
    Lab(lab::LabArgs),
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    Replay(replay::ReplayArgs),
    #[command(subcommand)]
    Switch(switch::SwitchCommand),
    Kernel(kernel::KernelArgs),
}

impl Cli {
    /// Runs the command given.
    pub fn run(&self) -> Result<()> {
        match &self.command {
            Command::Attach(args) => attach::run(args),
            Command::Reload(args) => reload::run(args),
            Command::Detach(args) => detach::run(args),
            Command::Stats(args) => stats::run(args),
            Command::Metrics(args) => metrics::run(args),
            Command::Events(args) => events::run(args),
            Command::Qps(args) => qps::run(args),
            #[cfg(feature = "lab")]
            Command::Lab(args) => lab::run(args),
            Command::Policy(command) => policy::run(command),
            Command::Replay(args) => replay::run(args),
            Command::Switch(command) => switch::run(command),
            Command::Kernel(args) => kernel::run(args),
        }
    }
}
