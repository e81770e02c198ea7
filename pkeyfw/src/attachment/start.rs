//! Starting an attachment: the interface checked (pkeyfw's or another
//! program's already), the programs loaded for the role and the kernel,
//! the policy applied with the QPs that exist, the programs attached and
//! their links pinned; replacing an attachment whose process is gone, what
//! its probes knew carried over and its links switched in place.

use anyhow::{Context as _, Result, bail};
use aya::programs::XdpMode as AyaMode;
use pkeyfw_common::abi::{Capacity, SenderLayout};

use super::{Job, Mode, Named as _, Say};
use crate::{
    control::{binder::Binder, limits, probes},
    host::{
        netlink::{self, XdpMode},
        rdma,
    },
    loading::{
        filter::{Egress, Filter, Load},
        maps::Maps,
        pins::{Aside, Holder, Pins, State},
    },
    policy::Policy,
    reporting::reach::Reach,
};

/// Refuses an interface that pkeyfw or another XDP program already holds;
/// clears pins that an exited attachment left behind. An attachment whose
/// foreground process is gone is to be replaced: its mode is returned.
pub(super) fn refuse_if_taken(pins: &Pins, job: &Job) -> Result<Option<XdpMode>> {
    let say = job.say;
    if pins.exists() {
        match pins.state() {
            Ok(State::Live {
                holder: Holder::Gone(pid),
                mode,
            }) => {
                err!(
                    say,
                    "pkeyfw: replacing the attachment on {} whose foreground process {pid} is gone",
                    pins.iface
                );
                return Ok(Some(mode));
            }
            Ok(State::Live { holder, .. }) => {
                let how = match holder {
                    Holder::Pinned => format!("pinned; `pkeyfw detach {}` first", job.iface.cli()),
                    _ => format!(
                        "held by a foreground `pkeyfw attach`, {}",
                        holder.describe()
                    ),
                };
                bail!("{} is already managed by pkeyfw ({how})", pins.iface);
            }
            Ok(State::SettingUp(pid)) => bail!(
                "{} is being set up by another `pkeyfw attach` (process {pid})",
                pins.iface
            ),
            Ok(State::Stale) | Err(_) => {
                err!(
                    say,
                    "pkeyfw: removing stale pins of an exited attachment under {}",
                    pins.dir.display()
                );
                pins.remove()?;
            }
        }
    }
    if let Some(other) = netlink::xdp_attached(job.iface.index)? {
        bail!(
            "{} already has an XDP program (id {}, {} mode); pkeyfw will not replace it",
            pins.iface,
            other.prog_id,
            other.mode.name()
        );
    }
    Ok(None)
}

/// Loads, fills (binding the QPs that exist), attaches and pins the links.
/// Replacing an attachment (`old`, set aside, with its maps), it carries the
/// probes' state over and switches the old links to the new programs (no
/// moment without a filter); the old probes run on until the caller's
/// start (see [`replaced`]).
pub(super) fn attach_filter(
    pins: &Pins,
    binder: &mut Binder,
    job: &Job,
    old: Option<&(Aside, Result<Maps>)>,
) -> Result<(Filter, XdpMode, Vec<String>)> {
    let (iface, say) = (&job.iface.name, job.say);
    // Who made the QPs, as the replaced attachment's probes saw them.
    let records = match old {
        Some((_, Ok(maps))) => maps.creations()?,
        _ => Default::default(),
    };
    let (policy, bound) = binder.effective(&records).unwrap_or_else(|e| {
        err!(
            say,
            "pkeyfw: warning: cannot read the QPs ({e:#}); [[bind]] rules bind none yet"
        );
        (binder.policy().clone(), Vec::new())
    });
    // The interface's RDMA devices, read once for what follows from them.
    let devices = rdma::devices_on(binder.ifindex());
    let reach = Reach::of(iface, devices.as_deref());
    if let Some(line) = reach.line {
        out!(say, "pkeyfw: {line}");
    }
    for w in reach.warnings {
        err!(say, "pkeyfw: warning: {w}");
    }
    let sender = sender(devices.as_deref(), &policy, say);
    let room = probe_capacity(devices.as_deref().unwrap_or_default(), &policy, say);
    // (The loader counts the CPUs.)
    let capacity = Capacity {
        qpns: room.qpns.max(policy.qpns()),
        probed: room.qps,
        ..Capacity::of(0)
    };
    let mut filter = Filter::load_with(&Load {
        capacity,
        switch: policy.switch.is_some(),
        pin: Some(&pins.dir),
        trace: job.opts.trace,
        sender,
    })?;
    if let Some((_, maps)) = old {
        match maps {
            Ok(maps) => filter.maps_mut().inherit(maps)?,
            Err(e) => err!(
                say,
                "pkeyfw: warning: what the replaced attachment's probes knew is lost ({e:#}): its QPs are bound again from /proc, without the Q_Keys they set"
            ),
        }
        filter.replacing(binder.ifindex())?;
    }
    let old = old.map(|(aside, _)| aside);
    filter.apply(&policy)?;
    let mut bound = bound;
    bound.extend(binder.quarantine(filter.maps_mut(), &[])?);
    let took_over = match old.filter(|old| old.link().exists()) {
        Some(old) => {
            let egress = old.egress_link();
            match filter.take_over(&old.link(), egress.exists().then_some(egress.as_path())) {
                Ok(()) => true,
                Err(e) => {
                    err!(
                        say,
                        "pkeyfw: cannot switch the old attachment in place ({e:#}): detaching it first"
                    );
                    old.remove()?;
                    false
                }
            }
        }
        None => false,
    };
    // Skb mode is the TC ingress program, not generic XDP: it sees a GSO/GRO
    // super-packet whole (see docs/security.md), and runs on 6.1 (clsact) too.
    let skb = |filter: &mut Filter| {
        filter
            .attach_ingress(iface, Egress::Auto)
            .context("attaching the TC ingress program")
    };
    let tried = match job.opts.mode {
        _ if took_over => Ok(()),
        Mode::Native => filter.attach(iface, AyaMode::Driver),
        Mode::Skb => skb(&mut filter),
        Mode::Auto => filter.attach(iface, AyaMode::Driver).or_else(|native| {
            skb(&mut filter).with_context(|| format!("native mode failed too: {native:#}"))
        }),
    };
    tried.with_context(|| format!("attaching to {}", iface))?;
    // A switch port's outbound check and restore are the egress program's
    // too; attached whatever the role, so that a reload may change it.
    if (policy.stamp || policy.switch.is_some()) && !filter.has_egress() {
        filter
            .attach_egress(iface, Egress::Auto)
            .with_context(|| format!("attaching the egress program to {}", iface))?;
    }
    let mode = if filter.is_tc() {
        XdpMode::Tc
    } else {
        netlink::xdp_attached(job.iface.index)?
            .filter(|a| Ok(a.prog_id) == filter.program_id().as_ref().map_err(|_| ()).copied())
            .context("the kernel does not report the program as attached")?
            .mode
    };
    filter.pin_link(pins)?;
    // The new filter is in place: one old filter left (gone meanwhile, or
    // not deletable) is said, not a reason to undo the attachment.
    if let Err(e) = filter.remove_replaced() {
        err!(say, "pkeyfw: warning: {e:#}");
    }
    Ok((filter, mode, bound))
}

/// Ends a replaced attachment (`old`) once this one's probes run
/// (`probing`) or could not: what its probes saw since [`attach`] carried
/// their state over is carried too, so that no QP was created unseen, and
/// its pins and filters go. Records of who made the QPs that no probe kept
/// current throughout (the old probes gone first, or no new ones) are
/// dropped: a later QP with a number would be taken for the last one's.
pub(super) fn replaced(
    filter: &mut Filter,
    binder: &mut Binder,
    old: Option<&(Aside, Result<Maps>)>,
    probing: bool,
    say: Say,
) -> Result<()> {
    let kept = match old {
        Some((aside, Ok(maps))) if probing && aside.dir.exists() => {
            match filter.maps_mut().inherit_late(maps) {
                Ok(changed) => {
                    if !changed.is_empty() {
                        binder.forget_snapshot();
                    }
                    true
                }
                Err(e) => {
                    err!(
                        say,
                        "pkeyfw: warning: what the replaced attachment's probes saw in its last moments is lost ({e:#})"
                    );
                    false
                }
            }
        }
        Some(_) => false,
        None => probing,
    };
    if !kept {
        filter.maps_mut().forget_creations()?;
        binder.forget_snapshot();
    }
    if let Some((aside, _)) = old
        && aside.dir.exists()
    {
        aside.remove()?;
    }
    Ok(())
}

/// QPs the QP-creation probe may bind at once: what the interface's RDMA
/// devices hold (lowered by the policy), and the QPNs they give them; with
/// what bounds each tenant's share, said.
fn probe_capacity(devices: &[rdma::Device], policy: &Policy, say: Say) -> limits::ProbeCapacity {
    let capacity = limits::probe_capacity(devices, policy);
    let names: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    if policy.binds.is_empty() || names.is_empty() {
        return capacity;
    }
    if policy.owner.is_some() {
        out!(
            say,
            "pkeyfw: the QP-creation probe binds up to {} QPs of {} at once ({}; a table of its own)",
            capacity.qps,
            names.join(", "),
            capacity.from
        );
        return capacity;
    }
    let (lines, warnings) = limits::tenant_bounds(policy, &names, Some(capacity.qps));
    out!(
        say,
        "pkeyfw: the QP-creation probe binds up to {} QPs at once ({})",
        capacity.qps,
        capacity.from
    );
    for line in lines {
        out!(say, "pkeyfw: {line}");
    }
    for w in capacity.notes.iter().chain(&warnings) {
        err!(say, "pkeyfw: warning: {w}");
    }
    capacity
}

/// Where the egress program learns which rdma_rxe QP sent a frame; where
/// it cannot, every frame is a process's, which a stamping policy is warned
/// of.
fn sender(
    devices: Result<&[rdma::Device], &anyhow::Error>,
    policy: &Policy,
    say: Say,
) -> SenderLayout {
    let layout = devices
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(probes::sender_layout);
    if policy.stamp {
        match &layout {
            Ok(l) if !l.knows_qps() => err!(
                say,
                "pkeyfw: warning: the interface has no rdma_rxe device: every outgoing RoCE frame leaves with the default P_Key"
            ),
            Ok(_) => {}
            Err(e) => err!(
                say,
                "pkeyfw: warning: rdma_rxe's QPs cannot be told apart ({e:#}): every outgoing RoCE frame leaves with the default P_Key"
            ),
        }
    }
    layout.unwrap_or(SenderLayout::NONE)
}
