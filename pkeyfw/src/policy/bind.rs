//! `[[bind]]` rules: bind the QPs that RDMA netlink discovers — by owner
//! command, PID, QPN range or type — to a partition, since the QPNs a
//! program gets change with every run.
//!
//! Rules apply in file order; the first that matches a QP decides it. A
//! `[[qp]]` entry wins over every rule: the QPN it names is bound as it says.
//! A UD QP needs a Q_Key: a `type = "ud"` rule must give `qkey`; a rule
//! without `type` binds UD QPs with its `qkey`, and a UD QP whose first
//! matching rule has none is left unbound (the unknown-QP rule judges its
//! frames) and reported as such, rather than bound without a Q_Key check or
//! handed to a later rule its author did not write for it.

use std::{collections::btree_map::Entry, ops::RangeInclusive};

use pkeyfw_common::{abi::QpType, verdict::MULTICAST_QPN};
use serde::Deserialize;
use toml::Spanned;

use super::{
    Conn, Policy, PolicyError, QpRule,
    error::position,
    file::{Ctx, MIN_QPN},
};
use crate::control::rdma::Qp;

/// Longest command name the kernel keeps (`TASK_COMM_LEN` - 1).
const MAX_COMM: usize = 15;
/// Largest PID Linux hands out (`PID_MAX_LIMIT`).
const MAX_PID: u32 = 1 << 22;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBind {
    comm: Option<Spanned<String>>,
    pid: Option<Spanned<i64>>,
    qpn: Option<Spanned<toml::Value>>,
    #[serde(rename = "type")]
    qp_type: Option<Spanned<String>>,
    pkey: Option<Spanned<i64>>,
    pkey_index: Option<Spanned<i64>>,
    qkey: Option<Spanned<i64>>,
}

/// A validated `[[bind]]` rule. It matches a QP when every matcher it gives
/// does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindRule {
    /// Line of its `[[bind]]` header.
    pub line: usize,
    /// The owner's command name, exactly (for kernel QPs, the kernel
    /// module's name).
    pub comm: Option<String>,
    pub pid: Option<u32>,
    pub qpns: Option<RangeInclusive<u32>>,
    pub qp_type: Option<QpType>,
    pub pkey: u16,
    /// The Q_Key of the UD QPs it binds.
    pub qkey: Option<u32>,
}

impl BindRule {
    /// Whether the rule tells processes apart only by the command name they
    /// choose themselves.
    pub fn by_name_only(&self) -> bool {
        self.comm.is_some() && self.pid.is_none()
    }
}

/// What judges the frames of one discovered QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Binding {
    /// QP0, QP1 (fixed rules) or a QP with no RoCE transport (raw, driver):
    /// never bound.
    Exempt,
    /// A `[[qp]]` entry names its QPN.
    Entry(QpRule),
    /// `binds[rule]`, the first rule that matches it.
    Rule {
        rule: usize,
        line: usize,
        bound: QpRule,
    },
    /// A UD QP whose first matching rule gives no Q_Key: left unbound.
    NoQkey { rule: usize, line: usize },
    /// A QP of another device with the same QPN was bound first; the filter
    /// keys QPs by QPN alone, so that binding judges this one's frames too.
    Taken(QpRule),
    /// No rule matches: the unknown-QP rule judges its frames.
    Unbound,
}

impl BindRule {
    pub fn matches(&self, qp: &Qp) -> bool {
        self.comm
            .as_deref()
            .is_none_or(|c| qp.comm.as_deref() == Some(c))
            && self.pid.is_none_or(|p| qp.pid == Some(p))
            && self.qpns.as_ref().is_none_or(|r| r.contains(&qp.qpn))
            && self
                .qp_type
                .is_none_or(|t| qp.qp_type.transport() == Some(t))
    }

    /// How it binds a QP of `transport`; None for a UD QP when it has no
    /// Q_Key.
    fn bind(&self, transport: QpType) -> Option<QpRule> {
        let qkey = match transport {
            QpType::Ud => Some(self.qkey?),
            _ => None,
        };
        Some(QpRule {
            qp_type: transport,
            pkey: self.pkey,
            qkey,
        })
    }
}

impl Policy {
    /// The policy to enforce while `qps` exist: the `[[qp]]` entries plus
    /// every discovered QP a rule binds (and, for stamping, the connections
    /// of the bound connected QPs), and what decides each of `qps` (in
    /// their order). Deterministic for the same input, so a caller can
    /// compare results to see whether anything changed.
    pub fn with_discovered(&self, qps: &[Qp]) -> (Policy, Vec<Binding>) {
        let mut effective = self.clone();
        let bindings = qps
            .iter()
            .map(|qp| {
                let Some(transport) = qp.qp_type.transport() else {
                    return Binding::Exempt;
                };
                if let Some(entry) = self.qps.get(&qp.qpn) {
                    return Binding::Entry(*entry);
                }
                let Some((rule, r)) = self.binds.iter().enumerate().find(|(_, r)| r.matches(qp))
                else {
                    return Binding::Unbound;
                };
                let Some(bound) = r.bind(transport) else {
                    return Binding::NoQkey { rule, line: r.line };
                };
                match effective.qps.entry(qp.qpn) {
                    Entry::Vacant(slot) => {
                        slot.insert(bound);
                        Binding::Rule {
                            rule,
                            line: r.line,
                            bound,
                        }
                    }
                    Entry::Occupied(first) => Binding::Taken(*first.get()),
                }
            })
            .collect::<Vec<Binding>>();
        for (qp, binding) in qps.iter().zip(&bindings) {
            let bound = matches!(binding, Binding::Entry(_) | Binding::Rule { .. });
            if let (true, Some(remote_qpn)) = (bound, qp.remote_qpn)
                && qp.qp_type.transport() != Some(QpType::Ud)
            {
                let conn = Conn {
                    remote_qpn,
                    peer: qp.peer.map(|a| a.ip()),
                };
                effective.conns.entry(conn).or_insert(qp.qpn);
            }
        }
        (effective, bindings)
    }
}

pub(super) fn rules(
    cx: &Ctx,
    pkeys: &[u16],
    raw: &[Spanned<RawBind>],
) -> Result<Vec<BindRule>, PolicyError> {
    raw.iter()
        .enumerate()
        .map(|(i, b)| rule(cx, pkeys, b, &format!("bind[{i}]")))
        .collect()
}

fn rule(
    cx: &Ctx,
    pkeys: &[u16],
    b: &Spanned<RawBind>,
    field: &str,
) -> Result<BindRule, PolicyError> {
    let raw = b.get_ref();
    if raw.comm.is_none() && raw.pid.is_none() && raw.qpn.is_none() && raw.qp_type.is_none() {
        return Err(cx.err(
            b.span(),
            field,
            "matches every QP; give at least one of comm, pid, qpn, type",
        ));
    }
    let comm = raw
        .comm
        .as_ref()
        .map(|c| comm(cx, c, &format!("{field}.comm")))
        .transpose()?;
    let pid = raw
        .pid
        .as_ref()
        .map(|p| pid(cx, p, &format!("{field}.pid")))
        .transpose()?;
    let qpns = raw
        .qpn
        .as_ref()
        .map(|q| qpns(cx, q, &format!("{field}.qpn")))
        .transpose()?;
    let qp_type = raw
        .qp_type
        .as_ref()
        .map(|t| {
            QpType::from_name(t.get_ref()).ok_or_else(|| {
                cx.err(
                    t.span(),
                    &format!("{field}.type"),
                    format!(
                        "`{}` is not a QP type; expected \"rc\", \"uc\", \"ud\" or \"xrc\"",
                        t.get_ref()
                    ),
                )
            })
        })
        .transpose()?;
    let pkey = cx.binding(pkeys, &raw.pkey, &raw.pkey_index, b.span(), field)?;

    let qkey_field = format!("{field}.qkey");
    let qkey = match (&raw.qkey, qp_type) {
        (Some(k), None | Some(QpType::Ud)) => Some(cx.qkey(k, &qkey_field)?),
        (None, Some(QpType::Ud)) => {
            return Err(cx.err(
                b.span(),
                &qkey_field,
                "missing; a rule for UD QPs needs the Q_Key they accept",
            ));
        }
        (Some(k), Some(other)) => {
            return Err(cx.err(
                k.span(),
                &qkey_field,
                format!("given for {} QPs; only UD QPs have a Q_Key", other.name()),
            ));
        }
        (None, _) => None,
    };
    Ok(BindRule {
        line: position(cx.text, b.span().start).0,
        comm,
        pid,
        qpns,
        qp_type,
        pkey,
        qkey,
    })
}

fn comm(cx: &Ctx, c: &Spanned<String>, field: &str) -> Result<String, PolicyError> {
    let name = c.get_ref();
    if name.is_empty() {
        return Err(cx.err(
            c.span(),
            field,
            "is empty; expected a command name as /proc/PID/comm shows it",
        ));
    }
    if name.len() > MAX_COMM {
        return Err(cx.err(
            c.span(),
            field,
            format!(
                "`{name}` is {} bytes; the kernel keeps at most {MAX_COMM} of a command name (/proc/PID/comm), so it would never match",
                name.len()
            ),
        ));
    }
    Ok(name.clone())
}

fn pid(cx: &Ctx, p: &Spanned<i64>, field: &str) -> Result<u32, PolicyError> {
    u32::try_from(*p.get_ref())
        .ok()
        .filter(|p| (1..=MAX_PID).contains(p))
        .ok_or_else(|| {
            cx.err(
                p.span(),
                field,
                format!(
                    "{} is out of range; expected a process ID in 1..={MAX_PID}",
                    p.get_ref()
                ),
            )
        })
}

/// `qpn = 0x100` or `qpn = [0x100, 0x1ff]`.
fn qpns(
    cx: &Ctx,
    q: &Spanned<toml::Value>,
    field: &str,
) -> Result<RangeInclusive<u32>, PolicyError> {
    let bindable = |n: &toml::Value| {
        n.as_integer()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (MIN_QPN..MULTICAST_QPN).contains(n))
    };
    let out_of_range = |what: String| {
        cx.err(
            q.span(),
            field,
            format!("{what} is out of range; expected QPNs in 0x2..=0xfffffe (QP0, QP1 and the multicast QPN have fixed rules)"),
        )
    };
    let range = match q.get_ref() {
        toml::Value::Integer(n) => {
            let qpn = bindable(q.get_ref()).ok_or_else(|| out_of_range(n.to_string()))?;
            qpn..=qpn
        }
        toml::Value::Array(pair) if pair.len() == 2 && pair.iter().all(|n| n.is_integer()) => {
            let ends = pair
                .iter()
                .map(|n| bindable(n).ok_or_else(|| out_of_range(n.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
            ends[0]..=ends[1]
        }
        other => {
            return Err(cx.err(
                q.span(),
                field,
                format!("`{other}` is not a QPN or a range; expected e.g. 0x100 or [0x100, 0x1ff]"),
            ));
        }
    };
    if range.is_empty() {
        return Err(cx.err(
            q.span(),
            field,
            format!(
                "[{:#x}, {:#x}] is empty; expected [lo, hi] with lo <= hi",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(range)
}

#[cfg(test)]
mod tests;
