//! `pkeyfw switch reload` of the ports attached already: every port takes
//! its new table before any port switches to it. First each port's new
//! policy is written into its idle generation (one that cannot take it
//! fails the reload, and no port has changed); then each is made live by
//! one map write, the ports one right after another. A frame crossing the
//! switch in those microseconds may still meet one port's new table and
//! another's old: each a valid policy, as when a subnet manager updates an
//! InfiniBand fabric's ports one by one.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

use crate::{
    attachment::{Target, target},
    loading::{
        maps::Staged,
        pins::{Holder, PolicyEvent},
    },
};

/// Switches the attached `ports` (in this network namespace, `netns` as
/// the user gave it) to their tables in `policy`, together.
pub fn run(ports: &[String], policy: &Path, netns: Option<&str>) -> Result<()> {
    let mut targets = ports
        .iter()
        .map(|p| target(p, Some(policy), netns).with_context(|| format!("switch port {p}")))
        .collect::<Result<Vec<_>>>()?;
    for (t, port) in targets.iter().zip(ports) {
        if let Holder::Foreground(pid) = t.holder {
            bail!(
                "switch port {port} is held by a foreground `pkeyfw attach` (pid {pid}), which switches itself alone; stop it, or `pkeyfw reload` it alone"
            );
        }
    }
    // A switch port's policy is its table and role: no QP or [[bind]]
    // rule for a binder to apply.
    let staged = stage(&mut targets, ports)?;
    let staged = flip(&mut targets, ports, staged)?;
    for ((t, s), port) in targets.iter_mut().zip(staged).zip(ports) {
        t.pins.note_policy(PolicyEvent::Reloaded);
        t.maps
            .settle(s, &t.policy)
            .and_then(|()| t.pins.remember_policy(&t.path))
            .with_context(|| format!("switch port {port} runs the new policy, but"))?;
    }
    Ok(())
}

/// Writes every port's new policy into its idle generation; on a failure,
/// drops what was written.
fn stage(targets: &mut [Target], ports: &[String]) -> Result<Vec<Staged>> {
    let mut staged = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let t = &mut targets[i];
        match t.maps.stage(&t.policy) {
            Ok(s) => staged.push(s),
            Err(e) => {
                t.pins.note_policy(PolicyEvent::Refused);
                for (t, s) in targets.iter_mut().zip(staged) {
                    let _ = t.maps.discard(s);
                }
                return Err(e.context(format!(
                    "writing the new policy of switch port {port}; no port changed"
                )));
            }
        }
    }
    Ok(staged)
}

/// Makes every port's staged policy live; on a failure, the ports switched
/// so far switch back and the staged policies are dropped.
fn flip(targets: &mut [Target], ports: &[String], staged: Vec<Staged>) -> Result<Vec<Staged>> {
    for (i, port) in ports.iter().enumerate() {
        if let Err(e) = targets[i].maps.flip(&staged[i]) {
            targets[i].pins.note_policy(PolicyEvent::Refused);
            for (t, s) in targets[..i].iter_mut().zip(&staged) {
                let _ = t.maps.unflip(s);
            }
            for (t, s) in targets.iter_mut().zip(staged) {
                let _ = t.maps.discard(s);
            }
            return Err(e.context(format!(
                "switching switch port {port}; every port runs its old policy again"
            )));
        }
    }
    Ok(staged)
}
