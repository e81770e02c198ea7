//! A switch's ports, each an ordinary attachment (pinned, so that the
//! enforcement outlives any process and no tenant can stop it) whose
//! policy is its part of the switch file: attached all or none, reloaded
//! together (`two_phase`), detached as far as they go. `pkeyfw switch`
//! and the CNI plugin's bridge ports run on these.

mod two_phase;

use std::path::Path;

use anyhow::{Context as _, Result, bail};

use super::{Mode, Options, Say, detach::detach_saying, enter};
use crate::{host::bridge, loading::pins::Pins, policy::SwitchPolicy};

/// What a reload did.
pub struct Reloaded {
    /// Every port, as the policy lists them.
    pub ports: Vec<String>,
    /// The ports the policy added, attached.
    pub added: Vec<String>,
}

impl Reloaded {
    /// What it says, the switch policy being at `policy`.
    pub fn line(&self, policy: &Path) -> String {
        format!(
            "pkeyfw: switch reloaded: {} ports run {}{}",
            self.ports.len(),
            policy.display(),
            match self.added.is_empty() {
                true => String::new(),
                false => format!(" (attached: {})", self.added.join(", ")),
            }
        )
    }
}

/// The ports, validated in full before any is touched.
fn ports(policy: &Path) -> Result<Vec<String>> {
    let switch = SwitchPolicy::load(policy)?;
    Ok(switch.ports.into_iter().map(|(iface, _)| iface).collect())
}

/// Attaches every port of the switch policy at `policy` (interfaces of
/// network namespace `netns`, None: this thread's), pinned: all or none.
/// Returns the ports.
pub fn attach(policy: &Path, netns: Option<&str>, mode: Mode, say: Say) -> Result<Vec<String>> {
    let ports = ports(policy)?;
    let _entered = enter(netns)?;
    refuse_unlisted(&ports, policy)?;
    attach_ports(&ports, policy, netns, mode, say)?;
    Ok(ports)
}

/// Attaches `ports` with their tables, pinned: all or none.
fn attach_ports(
    ports: &[String],
    policy: &Path,
    netns: Option<&str>,
    mode: Mode,
    say: Say,
) -> Result<()> {
    for (i, iface) in ports.iter().enumerate() {
        if let Err(e) = super::attach(iface, netns, policy, &Options::pinned(mode), say) {
            // None rather than some: the ports attached so far go again.
            detach_ports(&ports[..i], netns, say);
            return Err(e.context(format!(
                "attaching switch port {iface}; the ports attached before it were detached"
            )));
        }
    }
    Ok(())
}

/// Detaches `ports`, last first, as far as they go.
fn detach_ports(ports: &[String], netns: Option<&str>, say: Say) {
    for iface in ports.iter().rev() {
        let _ = detach_saying(iface, netns, say);
    }
}

/// Attaches the ports the policy adds, then switches the others together
/// (see `two_phase`): the ports a reload adds are listed by all once it
/// is done. A bridge port the policy still does not list is warned about,
/// not refused: its RoCE goes to no listed port meanwhile, and a reload
/// must not wait for it.
pub fn reload(policy: &Path, netns: Option<&str>, mode: Mode, say: Say) -> Result<Reloaded> {
    let ports = ports(policy)?;
    let _entered = enter(netns)?;
    for b in bridge::with_unlisted(&ports)? {
        err!(
            say,
            "pkeyfw: warning: {}: {b}; their RoCE reaches none of the switch's ports",
            policy.display()
        );
    }
    let (added, kept): (Vec<String>, Vec<String>) =
        ports.iter().cloned().partition(|p| !Pins::of(p).exists());
    attach_ports(&added, policy, netns, mode, say)?;
    if let Err(e) = two_phase::run(&kept, policy, netns) {
        detach_ports(&added, netns, say);
        return Err(e.context("the ports the policy adds were detached again"));
    }
    Ok(Reloaded { ports, added })
}

/// Detaches every port of the switch policy at `policy`, carrying on past
/// failures (each said); fails if any did.
pub fn detach(policy: &Path, netns: Option<&str>, say: Say) -> Result<()> {
    let ports = ports(policy)?;
    let failed: Vec<String> = ports
        .iter()
        .filter_map(|iface| {
            detach_saying(iface, netns, say)
                .with_context(|| format!("detaching switch port {iface}"))
                .map_err(|e| err!(say, "pkeyfw: {e:#}"))
                .err()
                .map(|()| iface.clone())
        })
        .collect();
    if !failed.is_empty() {
        bail!("detaching failed on {}", failed.join(", "));
    }
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
