//! Keeping a filter's QP table in step with the QPs that exist: real
//! programs get new QPNs every run, so `[[bind]]` rules are applied to what
//! RDMA netlink reports, and re-applied whenever that changes — each QP by
//! who made it as the QP-creation probe recorded it, never as `/proc`
//! says later (see [`rdma::identify`]).
//!
//! RDMA netlink (Linux 6.1) sends no notification when a QP is created, so
//! a foreground attachment reads it every [`POLL`], and at once when the
//! QP-creation probe ([`crate::control::probes`]) fires. A QP that appears or goes is
//! one map entry added to or removed from the live policy (a frame sees the
//! entry whole or not at all); anything else that changes switches
//! generations as a reload does.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::Result;

use crate::{
    host::rdma::{self, Qp, Records},
    loading::maps::Maps,
    policy::{Binding, Policy, QpRule},
};

/// How often the QPs are read without a wake-up. A snapshot is a handful of
/// netlink dumps, skipped entirely while the QPs stay the same.
pub const POLL: Duration = Duration::from_millis(5);

/// The base policy and what was last applied from it.
pub struct Binder {
    ifindex: u32,
    base: Policy,
    /// The QPs of the last snapshot, as RDMA netlink reported them.
    seen: Option<Vec<Qp>>,
    /// The QPs that existed when this process's probes started (device,
    /// QPN): only those may be read from `/proc`. A later one the probe
    /// has no record of (its record map full) is not told by `/proc`, which
    /// a tenant can steer, but quarantined.
    before_probes: Option<BTreeSet<(String, u32)>>,
    /// QPs no rule can be matched against (see
    /// [`Binding::Unidentified`](crate::policy::Binding)), as last planned.
    unidentified: Vec<u32>,
    /// QPs a rule binds whose QPN the filter's QP table does not cover (a
    /// device numbering its QPs beyond what the table was sized for), as
    /// last planned.
    beyond: Vec<u32>,
    /// QPs made on a tenant's own device by anyone else (see
    /// [`Binding::Foreign`](crate::policy::Binding)), as last planned, with
    /// who made them.
    foreign: Vec<(u32, String)>,
    /// The policy last applied with them.
    applied: Option<Policy>,
    /// QPs bound by rules, as last applied, for the messages.
    bound: BTreeMap<u32, Bound>,
}

/// A QP a rule bound, for the messages.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Bound {
    rule: QpRule,
    by: String,
    owner: String,
}

impl Binder {
    pub fn new(ifindex: u32, base: Policy) -> Binder {
        Binder {
            ifindex,
            base,
            seen: None,
            before_probes: None,
            unidentified: Vec::new(),
            beyond: Vec::new(),
            foreign: Vec::new(),
            applied: None,
            bound: BTreeMap::new(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.base
    }

    /// Whether the QPs that exist matter: the policy binds by rule.
    /// (Stamping needs nothing from them: egress asks rdma_rxe which QP
    /// sends.)
    pub fn active(&self) -> bool {
        !self.base.binds.is_empty()
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The QPs RDMA netlink reports, if the policy binds by rule.
    fn qps(&self) -> Result<Vec<Qp>> {
        if self.active() {
            rdma::qps_on(self.ifindex)
        } else {
            Ok(Vec::new())
        }
    }

    /// The policy to enforce for the QPs that exist now, who made them
    /// told by `records` (the probes' records, of the attachment replaced,
    /// or none), and one line per QP bound or released since the last call;
    /// recorded as applied (the caller applies it, and quarantines
    /// [`Binder::unidentified`]).
    pub fn effective(&mut self, records: &Records) -> Result<(Policy, Vec<String>)> {
        let qps = self.qps()?;
        // The table is made for what this policy binds.
        let (effective, bound) = self.plan(&qps, records, u32::MAX);
        let lines = self.commit(qps, effective.clone(), bound);
        Ok((effective, lines))
    }

    /// Notes the QPs that exist as this process's probes start: every later
    /// one's maker comes from the probe's record, or is unknown.
    pub fn probes_started(&mut self) -> Result<()> {
        let qps = rdma::qps_on(self.ifindex)?;
        self.before_probes = Some(qps.into_iter().map(|q| (q.device, q.qpn)).collect());
        Ok(())
    }

    /// Forgets the last snapshot: the next [`Binder::sync`] plans afresh
    /// (who made the QPs changed under it).
    pub fn forget_snapshot(&mut self) {
        self.seen = None;
    }

    /// The QPs last planned that no rule can be matched against: to be
    /// quarantined.
    pub fn unidentified(&self) -> &[u32] {
        &self.unidentified
    }

    /// What the base policy makes of a snapshot (its QPs told apart by
    /// `records`) for a QP table of `qpns` QPNs; notes the QPs no rule can
    /// be matched against, and those a rule binds beyond the table.
    fn plan(&mut self, qps: &[Qp], records: &Records, qpns: u32) -> (Policy, BTreeMap<u32, Bound>) {
        let mut qps = qps.to_vec();
        rdma::identify(&mut qps, records);
        if let Some(before) = &self.before_probes {
            for qp in &mut qps {
                if matches!(qp.maker, rdma::Maker::Read(_))
                    && !qp.kernel
                    && !before.contains(&(qp.device.clone(), qp.qpn))
                {
                    qp.maker = rdma::Maker::Unknown;
                }
            }
        }
        let (mut effective, bindings) = self.base.with_discovered(&qps);
        self.unidentified = qps
            .iter()
            .zip(&bindings)
            .filter(|(_, b)| matches!(b, Binding::Unidentified))
            .map(|(qp, _)| qp.qpn)
            .collect();
        self.foreign = qps
            .iter()
            .zip(&bindings)
            .filter_map(|(qp, b)| match b {
                Binding::Foreign { rule } => Some((
                    qp.qpn,
                    match rule {
                        Some(r) => format!(
                            "{}, whom the rule at line {} binds",
                            owner(qp),
                            self.base.binds[*r].line
                        ),
                        None => format!("{}, whom no rule binds", owner(qp)),
                    },
                )),
                _ => None,
            })
            .collect();
        self.beyond = effective.qps.split_off(&qpns).into_keys().collect();
        let mut bound = bound(&qps, &bindings);
        bound.retain(|qpn, _| *qpn < qpns);
        (effective, bound)
    }

    /// Quarantines the QPs no rule can be matched against, those made on a
    /// tenant's own device by anyone else, and those a rule binds beyond
    /// the QP table, with a line for each not
    /// quarantined before.
    pub fn quarantine(&self, maps: &mut Maps, before: &[u32]) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        for (qpn, by) in &self.foreign {
            maps.quarantine(*qpn)?;
            if !before.contains(qpn) {
                lines.push(format!(
                    "pkeyfw: quarantined QP {qpn:#08x} ({by}): it was made on a device pkeyfw made for another tenant; its frames are refused until it is destroyed"
                ));
            }
        }
        for &qpn in &self.unidentified {
            maps.quarantine(qpn)?;
            if !before.contains(&qpn) {
                lines.push(format!(
                    "pkeyfw: quarantined QP {qpn:#08x}: it was made before any QP-creation probe ran and who made it cannot be read now (its thread is gone), so no [[bind]] rule can be matched against it; its frames are refused until it is destroyed"
                ));
            }
        }
        for &qpn in &self.beyond {
            maps.quarantine(qpn)?;
            if !before.contains(&qpn) {
                lines.push(format!(
                    "pkeyfw: quarantined QP {qpn:#08x}: a rule binds it, but its number is beyond the QP table (QPNs up to {:#x}, what the interface's RDMA devices hand out); its frames are refused until it is destroyed",
                    maps.qpns() - 1
                ));
            }
        }
        Ok(lines)
    }

    /// The QPs last planned that are quarantined (see [`Binder::quarantine`]).
    fn quarantined(&self) -> Vec<u32> {
        let foreign = self.foreign.iter().map(|(qpn, _)| qpn);
        self.unidentified
            .iter()
            .chain(foreign)
            .chain(&self.beyond)
            .copied()
            .collect()
    }

    /// Records a snapshot as applied; the lines saying what changed.
    fn commit(
        &mut self,
        qps: Vec<Qp>,
        effective: Policy,
        bound: BTreeMap<u32, Bound>,
    ) -> Vec<String> {
        let lines = changes(&self.bound, &bound);
        self.bound = bound;
        self.seen = Some(qps);
        self.applied = Some(effective);
        lines
    }

    /// Re-reads the QPs and, if their bindings changed, updates the filter;
    /// returns one line per QP bound or released. Nothing is recorded until
    /// the filter took it, so a failed update is tried again next time.
    pub fn sync(&mut self, maps: &mut Maps) -> Result<Vec<String>> {
        let qps = self.qps()?;
        if self.seen.as_ref() == Some(&qps) {
            return Ok(Vec::new());
        }
        let before = self.quarantined();
        let (effective, bound) = self.plan(&qps, &maps.creations()?, maps.qpns());
        match &self.applied {
            Some(old) if same_but_qps(old, &effective) => {
                for (qpn, rule) in &effective.qps {
                    if old.qps.get(qpn) != Some(rule) {
                        maps.bind_live(*qpn, rule)?;
                    }
                }
                for qpn in old.qps.keys() {
                    if !effective.qps.contains_key(qpn) {
                        maps.unbind_live(*qpn)?;
                    }
                }
            }
            _ => maps.apply(&effective)?,
        }
        let mut lines = self.quarantine(maps, &before)?;
        lines.extend(self.commit(qps, effective, bound));
        Ok(lines)
    }

    /// Switches to a new base policy (a reload), with the QPs that exist;
    /// on error the old one stays.
    pub fn replace(&mut self, base: Policy, maps: &mut Maps) -> Result<Vec<String>> {
        // The new policy decides whether there are QPs to read.
        let old = std::mem::replace(&mut self.base, base);
        let before = self.quarantined();
        let applied = self.qps().and_then(|qps| {
            let (effective, bound) = self.plan(&qps, &maps.creations()?, maps.qpns());
            maps.apply(&effective)?;
            let lines = self.quarantine(maps, &before)?;
            Ok((qps, effective, bound, lines))
        });
        match applied {
            Ok((qps, effective, bound, mut lines)) => {
                lines.extend(self.commit(qps, effective, bound));
                Ok(lines)
            }
            Err(e) => {
                self.base = old;
                Err(e)
            }
        }
    }
}

/// Whether two policies differ in their QP tables at most.
fn same_but_qps(a: &Policy, b: &Policy) -> bool {
    let strip = |p: &Policy| Policy {
        qps: BTreeMap::new(),
        ..p.clone()
    };
    strip(a) == strip(b)
}

/// The rule-bound QPs of a snapshot.
fn bound(qps: &[Qp], bindings: &[Binding]) -> BTreeMap<u32, Bound> {
    qps.iter()
        .zip(bindings)
        .filter_map(|(qp, b)| match *b {
            Binding::Rule { rule, line, bound } => Some((
                qp.qpn,
                Bound {
                    rule: bound,
                    by: format!("bind[{rule}] (line {line})"),
                    owner: owner(qp),
                },
            )),
            _ => None,
        })
        .collect()
}

fn owner(qp: &Qp) -> String {
    let mut s = format!("{} {}", qp.device, qp.qp_type);
    if let Some(pid) = qp.pid {
        s += &format!(", pid {pid}");
    }
    if let Some(comm) = &qp.comm {
        s += &format!(" {}", crate::reporting::describe::name(comm));
    }
    if matches!(qp.maker, rdma::Maker::Seen(_)) {
        s += ", as seen at creation";
    }
    s
}

fn changes(old: &BTreeMap<u32, Bound>, new: &BTreeMap<u32, Bound>) -> Vec<String> {
    let mut lines = Vec::new();
    for (qpn, b) in new {
        if old.get(qpn) != Some(b) {
            let mut keys = format!("P_Key {:#06x}", b.rule.pkey);
            if let Some(q) = b.rule.qkey {
                keys += &format!(", Q_Key {q:#010x}");
            }
            lines.push(format!(
                "pkeyfw: bound QP {qpn:#08x} ({}) by {}: {keys}",
                b.owner, b.by
            ));
        }
    }
    for (qpn, b) in old {
        if !new.contains_key(qpn) {
            lines.push(format!(
                "pkeyfw: released QP {qpn:#08x} ({}): no rule binds it now",
                b.owner
            ));
        }
    }
    lines
}
