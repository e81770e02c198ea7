//! Keeping a filter's QP table in step with the QPs that exist: real
//! programs get new QPNs every run, so `[[bind]]` rules are applied to what
//! RDMA netlink reports, and re-applied whenever that changes.
//!
//! RDMA netlink (Linux 6.1) sends no notification when a QP is created, so
//! a foreground attachment reads it every [`POLL`], and at once when the
//! QP-creation probe ([`crate::control::probes`]) fires. A QP that appears or goes is
//! one map entry added to or removed from the live policy (a frame sees the
//! entry whole or not at all); anything else that changes switches
//! generations as a reload does.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;

use crate::{
    control::rdma::{self, Qp},
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
    /// The QPs of the last snapshot.
    seen: Option<Vec<Qp>>,
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

    fn qps(&self) -> Result<Vec<Qp>> {
        if self.active() {
            rdma::qps_on(self.ifindex)
        } else {
            Ok(Vec::new())
        }
    }

    /// The policy to enforce for the QPs that exist now, and one line per
    /// QP bound or released since the last call; recorded as applied (the
    /// caller applies it).
    pub fn effective(&mut self) -> Result<(Policy, Vec<String>)> {
        let qps = self.qps()?;
        let (effective, bound) = self.plan(&qps);
        let lines = self.commit(qps, effective.clone(), bound);
        Ok((effective, lines))
    }

    /// What the base policy makes of a snapshot.
    fn plan(&self, qps: &[Qp]) -> (Policy, BTreeMap<u32, Bound>) {
        let (effective, bindings) = self.base.with_discovered(qps);
        (effective, bound(qps, &bindings))
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
        let (effective, bound) = self.plan(&qps);
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
        Ok(self.commit(qps, effective, bound))
    }

    /// Switches to a new base policy (a reload), with the QPs that exist;
    /// on error the old one stays.
    pub fn replace(&mut self, base: Policy, maps: &mut Maps) -> Result<Vec<String>> {
        // The new policy decides whether there are QPs to read.
        let old = std::mem::replace(&mut self.base, base);
        let applied = self.qps().and_then(|qps| {
            let (effective, bound) = self.plan(&qps);
            maps.apply(&effective).map(|()| (qps, effective, bound))
        });
        match applied {
            Ok((qps, effective, bound)) => Ok(self.commit(qps, effective, bound)),
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
