//! `pkeyfw switch`: every port of a switch policy at once
//! ([`crate::attachment::switch`]). Each port is an ordinary attachment,
//! whose policy is its part of the switch file: the per-interface commands
//! (`stats`, `events`, `reload`, `detach`) work on a port as on a host's
//! interface.

use std::path::PathBuf;

use anyhow::Result;

use super::NetnsArg;
use crate::attachment::{Mode, Say, switch};

/// Enforce partitions at the ports of a switch (a bridge or router).
///
/// The policy's `[[switch.port]]` tables name the interfaces, each with
/// its P_Key table and checks; see docs/policy.md, "Switch ports".
#[derive(clap::Subcommand)]
pub enum SwitchCommand {
    Attach(SwitchAttachArgs),
    Reload(SwitchReloadArgs),
    Detach(SwitchArgs),
}

/// Attach every port of a switch policy, pinned; all or none.
#[derive(clap::Args)]
pub struct SwitchAttachArgs {
    #[command(flatten)]
    pub switch: SwitchArgs,
    /// How inbound frames are judged: native XDP (in the driver) or skb
    /// (TC ingress); auto tries native first. Outbound is TC egress.
    #[arg(long, value_enum, default_value = "auto")]
    pub mode: Mode,
}

/// Switch every port to its new table, all before any (see docs/policy.md,
/// "Switch ports"); ports the policy adds are attached first.
#[derive(clap::Args)]
pub struct SwitchReloadArgs {
    #[command(flatten)]
    pub switch: SwitchArgs,
    /// How the ports the policy adds judge inbound frames (as `switch
    /// attach --mode`).
    #[arg(long, value_enum, default_value = "auto")]
    pub mode: Mode,
}

/// A switch policy and the namespace of its interfaces.
#[derive(clap::Args)]
pub struct SwitchArgs {
    /// Switch policy (TOML, with [switch]).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    #[command(flatten)]
    pub netns: NetnsArg,
}

pub fn run(command: &SwitchCommand) -> Result<()> {
    match command {
        SwitchCommand::Attach(args) => {
            let ports = switch::attach(
                &args.switch.policy,
                args.switch.netns.name(),
                args.mode,
                Say::TERMINAL,
            )?;
            println!(
                "pkeyfw: switch attached: {} ports ({})",
                ports.len(),
                ports.join(", ")
            );
        }
        SwitchCommand::Reload(args) => {
            let reloaded = switch::reload(
                &args.switch.policy,
                args.switch.netns.name(),
                args.mode,
                Say::TERMINAL,
            )?;
            println!("{}", reloaded.line(&args.switch.policy));
        }
        SwitchCommand::Detach(args) => {
            switch::detach(&args.policy, args.netns.name(), Say::TERMINAL)?
        }
    }
    Ok(())
}
