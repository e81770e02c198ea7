//! `pkeyfw switch`: every port of a switch policy at once. Each port is an
//! ordinary attachment (pinned, so the enforcement outlives any process and
//! no tenant can stop it), whose policy is its part of the switch file: the
//! per-interface commands (`stats`, `events`, `reload`, `detach`) work on a
//! port as on a host's interface.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use super::{
    NetnsArg,
    attach::{self, AttachArgs, Mode},
    detach::{self, DetachArgs},
    reload::{self, ReloadArgs},
};
use crate::{control::bridge, policy::SwitchPolicy};

/// Enforce partitions at the ports of a switch (a bridge or router).
///
/// The policy's `[[switch.port]]` tables name the interfaces, each with
/// its P_Key table and checks; see the README's "Switch ports".
#[derive(clap::Subcommand)]
pub enum SwitchCommand {
    Attach(SwitchAttachArgs),
    Reload(SwitchArgs),
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
        SwitchCommand::Attach(args) => attach_all(args),
        SwitchCommand::Reload(args) => each_port(args, "reloading", |iface, netns| {
            reload::run(&ReloadArgs {
                iface,
                netns,
                policy: Some(args.policy.clone()),
            })
        }),
        SwitchCommand::Detach(args) => each_port(args, "detaching", |iface, netns| {
            detach::run(&DetachArgs { iface, netns })
        }),
    }
}

/// The ports, validated in full before any is touched.
fn ports(args: &SwitchArgs) -> Result<Vec<String>> {
    let switch = SwitchPolicy::load(&args.policy)?;
    Ok(switch.ports.into_iter().map(|(iface, _)| iface).collect())
}

fn netns(args: &SwitchArgs) -> NetnsArg {
    NetnsArg {
        netns: args.netns.netns.clone(),
    }
}

fn attach_all(args: &SwitchAttachArgs) -> Result<()> {
    let ports = ports(&args.switch)?;
    args.switch.netns.enter()?;
    refuse_unlisted(&ports, &args.switch.policy)?;
    for (i, iface) in ports.iter().enumerate() {
        let attached = attach::run(&AttachArgs {
            iface: iface.clone(),
            netns: netns(&args.switch),
            policy: args.switch.policy.clone(),
            mode: args.mode,
            pin: true,
            watch: false,
            log_rate: 0,
            trace: false,
        });
        if let Err(e) = attached {
            // None rather than some: the ports attached so far go again.
            for done in ports[..i].iter().rev() {
                let _ = detach::run(&DetachArgs {
                    iface: done.clone(),
                    netns: netns(&args.switch),
                });
            }
            return Err(e.context(format!(
                "attaching switch port {iface}; the ports attached before it were detached"
            )));
        }
    }
    println!(
        "pkeyfw: switch attached: {} ports ({})",
        ports.len(),
        ports.join(", ")
    );
    Ok(())
}

/// Refuses a policy that leaves ports of its ports' bridges out: a tenant
/// there would send RoCE that no port judged on the way in (which the
/// listed ports then refuse, as they refuse it from a port that joins the
/// bridge later). The whole bridge is the switch.
fn refuse_unlisted(ports: &[String], policy: &Path) -> Result<()> {
    let bridges = bridge::with_unlisted(ports)?;
    if !bridges.is_empty() {
        let said: Vec<String> = bridges.iter().map(ToString::to_string).collect();
        bail!(
            "{}: {}; expected every port of the bridge as a [[switch.port]], or taken out of the bridge",
            policy.display(),
            said.join("; ")
        );
    }
    Ok(())
}

/// Runs `what` on every port, carrying on past failures; fails if any did.
fn each_port(
    args: &SwitchArgs,
    doing: &str,
    what: impl Fn(String, NetnsArg) -> Result<()>,
) -> Result<()> {
    let ports = ports(args)?;
    let failed: Vec<String> = ports
        .iter()
        .filter_map(|iface| {
            what(iface.clone(), netns(args))
                .with_context(|| format!("{doing} switch port {iface}"))
                .map_err(|e| eprintln!("pkeyfw: {e:#}"))
                .err()
                .map(|()| iface.clone())
        })
        .collect();
    if !failed.is_empty() {
        bail!("{doing} failed on {}", failed.join(", "));
    }
    Ok(())
}
