//! Keeping a filter's QP table in step with the QPs that exist: real
//! programs get new QPNs every run, so `[[bind]]` rules are applied to what
//! RDMA netlink reports, and re-applied whenever that changes.
//!
//! RDMA netlink (Linux 6.1) sends no notification when a QP is created, so
//! a foreground attachment polls: one snapshot is a handful of netlink dumps
//! (well under a millisecond on a host), taken every [`POLL`]. A switch to
//! a new table is the usual one-write generation switch, so a frame is never
//! judged by a half-bound table.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;

use crate::{
    maps::Maps,
    policy::{Binding, Policy, QpRule},
    rdma::{self, Qp},
};

/// How often the QPs are read. A new QP is bound within one period plus a
/// switch; frames that reach it before follow the unknown-QP rule.
pub const POLL: Duration = Duration::from_millis(5);

/// The base policy and what was last applied from it.
pub struct Binder {
    ifindex: u32,
    base: Policy,
    /// QPs bound by rules, as last applied.
    applied: BTreeMap<u32, Bound>,
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
            applied: BTreeMap::new(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.base
    }

    /// Whether the policy binds anything by rule (else there is nothing to
    /// poll for).
    pub fn active(&self) -> bool {
        !self.base.binds.is_empty()
    }

    /// The policy to enforce for the QPs that exist now.
    pub fn effective(&mut self) -> Result<(Policy, Vec<String>)> {
        let qps = if self.active() {
            rdma::qps_on(self.ifindex)?
        } else {
            Vec::new()
        };
        let (effective, bindings) = self.base.with_discovered(&qps);
        let bound = bound(&qps, &bindings);
        let changes = changes(&self.applied, &bound);
        self.applied = bound;
        Ok((effective, changes))
    }

    /// Re-reads the QPs and switches the filter if their bindings changed;
    /// returns one line per QP bound or released.
    pub fn sync(&mut self, maps: &mut Maps) -> Result<Vec<String>> {
        let before = self.applied.clone();
        let (effective, changes) = self.effective()?;
        if !changes.is_empty()
            && let Err(e) = maps.apply(&effective)
        {
            self.applied = before;
            return Err(e);
        }
        Ok(changes)
    }

    /// Switches to a new base policy (a reload), with the QPs that exist.
    pub fn replace(&mut self, base: Policy, maps: &mut Maps) -> Result<Vec<String>> {
        let old = std::mem::replace(&mut self.base, base);
        let before = self.applied.clone();
        let applied = self
            .effective()
            .and_then(|(effective, changes)| maps.apply(&effective).map(|()| changes));
        if applied.is_err() {
            self.base = old;
            self.applied = before;
        }
        applied
    }
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
        s += &format!(" {comm}");
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
