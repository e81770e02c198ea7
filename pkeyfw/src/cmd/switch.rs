//! `pkeyfw switch`: every port of a switch policy at once. Each port is an
//! ordinary attachment (pinned, so the enforcement outlives any process and
//! no tenant can stop it), whose policy is its part of the switch file: the
//! per-interface commands (`stats`, `events`, `reload`, `detach`) work on a
//! port as on a host's interface.

mod two_phase;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use super::{
    NetnsArg,
    attach::{self, AttachArgs},
    detach::{self, DetachArgs},
};
use crate::{attachment::Mode, host::bridge, loading::pins::Pins, policy::SwitchPolicy};

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
        SwitchCommand::Attach(args) => attach_all(args),
        SwitchCommand::Reload(args) => reload_all(args),
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
    attach_ports(&ports, &args.switch, args.mode)?;
    println!(
        "pkeyfw: switch attached: {} ports ({})",
        ports.len(),
        ports.join(", ")
    );
    Ok(())
}

/// Attaches `ports` with their tables, pinned: all or none.
fn attach_ports(ports: &[String], args: &SwitchArgs, mode: Mode) -> Result<()> {
    for (i, iface) in ports.iter().enumerate() {
        let attached = attach::run(&AttachArgs {
            iface: iface.clone(),
            netns: netns(args),
            policy: args.policy.clone(),
            mode,
            pin: true,
            watch: false,
            log_rate: 0,
            trace: false,
        });
        if let Err(e) = attached {
            // None rather than some: the ports attached so far go again.
            detach_ports(&ports[..i], args);
            return Err(e.context(format!(
                "attaching switch port {iface}; the ports attached before it were detached"
            )));
        }
    }
    Ok(())
}

/// Detaches `ports`, last first, as far as they go.
fn detach_ports(ports: &[String], args: &SwitchArgs) {
    for iface in ports.iter().rev() {
        let _ = detach::run(&DetachArgs {
            iface: iface.clone(),
            netns: netns(args),
        });
    }
}

/// Attaches the ports the policy adds, then switches the others together
/// (see [`two_phase`]): the ports a reload adds are listed by all once it
/// is done. A bridge port the policy still does not list is warned about,
/// not refused: its RoCE goes to no listed port meanwhile, and a reload
/// must not wait for it.
fn reload_all(args: &SwitchReloadArgs) -> Result<()> {
    let ports = ports(&args.switch)?;
    let netns = args.switch.netns.enter()?;
    for b in bridge::with_unlisted(&ports)? {
        eprintln!(
            "pkeyfw: warning: {}: {b}; their RoCE reaches none of the switch's ports",
            args.switch.policy.display()
        );
    }
    let (added, kept): (Vec<String>, Vec<String>) =
        ports.iter().cloned().partition(|p| !Pins::of(p).exists());
    attach_ports(&added, &args.switch, args.mode)?;
    if let Err(e) = two_phase::run(&kept, &args.switch.policy, netns) {
        detach_ports(&added, &args.switch);
        return Err(e.context("the ports the policy adds were detached again"));
    }
    println!(
        "pkeyfw: switch reloaded: {} ports run {}{}",
        ports.len(),
        args.switch.policy.display(),
        match added.is_empty() {
            true => String::new(),
            false => format!(" (attached: {})", added.join(", ")),
        }
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
