//! `[[bind]]` rules: bind QPs to a partition by who creates them — cgroup,
//! effective uid or gid, network namespace — or by owner command, PID, QPN
//! range or type, since the QPNs a program gets change with every run.
//!
//! The QP-creation probe applies the rules in the kernel as each QP is
//! created (`pkeyfw_common::tenant`); the same rules, applied here to what
//! RDMA netlink and `/proc` report, bind the QPs that existed before.
//! Rules apply in file order; the first that matches a QP decides it. A
//! `[[qp]]` entry wins over every rule: the QPN it names is bound as it says.
//! A UD QP bound by a rule with `qkey` accepts that Q_Key; by a rule
//! without, the Q_Key its program sets.

use std::{
    collections::{BTreeMap, btree_map::Entry},
    ops::RangeInclusive,
    path::Path,
};

use pkeyfw_common::{
    abi::{BindSpec, CGROUP_LEVELS, MAX_RULES, QpType, comm_bytes, matcher, qp_flags},
    verdict::MULTICAST_QPN,
};
use serde::Deserialize;
use toml::Spanned;

use super::{
    Policy, PolicyError, QpRule,
    ctx::{Ctx, MIN_QPN},
    error::position,
    own_device::{self, OwnDevice, RawOwnDevice},
};
use crate::host::{
    identity::{self, Cgroup, Netns},
    rdma::{Maker, Qp},
};

/// Longest command name the kernel keeps (`TASK_COMM_LEN` - 1).
const MAX_COMM: usize = 15;
/// Largest PID Linux hands out (`PID_MAX_LIMIT`).
const MAX_PID: u32 = 1 << 22;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBind {
    comm: Option<Spanned<String>>,
    pid: Option<Spanned<i64>>,
    cgroup: Option<Spanned<String>>,
    uid: Option<Spanned<i64>>,
    gid: Option<Spanned<i64>>,
    netns: Option<Spanned<String>>,
    kernel: Option<Spanned<bool>>,
    port: Option<Spanned<i64>>,
    device: Option<Spanned<String>>,
    qpn: Option<Spanned<toml::Value>>,
    #[serde(rename = "type")]
    qp_type: Option<Spanned<String>>,
    pkey: Option<Spanned<i64>>,
    pkey_index: Option<Spanned<i64>>,
    qkey: Option<Spanned<i64>>,
    own_device: Option<Spanned<RawOwnDevice>>,
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
    /// The creator's cgroup: this directory or one below it.
    pub cgroup: Option<Cgroup>,
    /// The creator's effective ids.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The creator's network namespace.
    pub netns: Option<Netns>,
    /// For the QPs kernel users make (ULPs), matched by module name (`comm`),
    /// rdma_cm port, QPN and type; else for user QPs only.
    pub kernel: bool,
    /// A kernel user's QP by the rdma_cm port it serves or connects to
    /// (NVMe over Fabrics 4420, iSER 3260, NFS/RDMA 20049, SMB Direct 5445,
    /// RDS 18634).
    pub port: Option<u16>,
    /// The RDMA device, by name and (what the probe compares) index.
    pub device: Option<(String, u32)>,
    pub qpns: Option<RangeInclusive<u32>>,
    pub qp_type: Option<QpType>,
    pub pkey: u16,
    /// The Q_Key of the UD QPs it binds; None: the Q_Key each sets.
    pub qkey: Option<u32>,
    /// The device pkeyfw makes for this rule's tenant alone.
    pub own: Option<OwnDevice>,
}

impl BindRule {
    /// Whether the rule tells tenants apart only by what a process chooses
    /// or is given by chance (command name, PID, QPN, type), rather than by
    /// what only the administrator sets (cgroup, ids, network namespace).
    pub fn no_boundary(&self) -> bool {
        !self.kernel && !self.beats_entries()
    }

    /// Whether it binds its QPs even where a `[[qp]]` entry names their
    /// QPN (see [`BindSpec::beats_entries`]): it matches by cgroup, ids or
    /// network namespace.
    pub fn beats_entries(&self) -> bool {
        self.cgroup.is_some() || self.uid.is_some() || self.gid.is_some() || self.netns.is_some()
    }

    /// Who its tenant is: the cgroup, ids and network namespace it names,
    /// e.g. `cgroup /tenants/a, uid 1001`.
    pub fn tenant(&self) -> String {
        let mut by = Vec::new();
        if let Some(c) = &self.cgroup {
            by.push(format!("cgroup {}", c.name));
        }
        if let Some(u) = self.uid {
            by.push(format!("uid {u}"));
        }
        if let Some(g) = self.gid {
            by.push(format!("gid {g}"));
        }
        if let Some(n) = &self.netns {
            by.push(format!("network namespace {}", n.path.display()));
        }
        by.join(", ")
    }

    /// The rule as the QP-creation probe reads it.
    pub fn spec(&self) -> BindSpec {
        let mut s = BindSpec {
            matchers: matcher::IN_USE,
            pkey: self.pkey,
            ..BindSpec::default()
        };
        if let Some(c) = &self.comm {
            s.matchers |= matcher::COMM;
            s.comm = comm_bytes(c.as_bytes());
        }
        if let Some(p) = self.pid {
            s.matchers |= matcher::PID;
            s.pid = p;
        }
        if let Some(c) = &self.cgroup {
            s.matchers |= matcher::CGROUP;
            (s.cgroup, s.cgroup_level) = (c.id, c.level);
        }
        if let Some(u) = self.uid {
            s.matchers |= matcher::UID;
            s.uid = u;
        }
        if let Some(g) = self.gid {
            s.matchers |= matcher::GID;
            s.gid = g;
        }
        if let Some(n) = &self.netns {
            s.matchers |= matcher::NETNS;
            s.netns = n.cookie;
        }
        if let Some(r) = &self.qpns {
            s.matchers |= matcher::QPN;
            (s.qpn_lo, s.qpn_hi) = (*r.start(), *r.end());
        }
        if let Some(t) = self.qp_type {
            s.matchers |= matcher::TYPE;
            s.qp_type = t as u8;
        }
        if self.kernel {
            s.matchers |= matcher::KERNEL;
        }
        if let Some(p) = self.port {
            s.matchers |= matcher::PORT;
            s.port = p;
        }
        if let Some((_, index)) = &self.device {
            s.matchers |= matcher::DEVICE;
            s.device = *index;
        }
        if let Some(q) = self.qkey {
            (s.qkey, s.pinned_qkey) = (q, 1);
        }
        s
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
    /// A QP of another device with the same QPN was bound first; the filter
    /// keys QPs by QPN alone, so that binding judges this one's frames too.
    Taken(QpRule),
    /// Made on a tenant's own device by a creator that tenant's rule does
    /// not match (`rule`: the one that does, if any): quarantined, as the
    /// QP-creation probe does (see `pkeyfw_common::tenant::foreign`).
    Foreign { rule: Option<usize> },
    /// No rule matches: the unknown-QP rule judges its frames.
    Unbound,
    /// Who made it cannot be told (a QP made before any probe ran whose
    /// thread is gone): no rule can be said to match, nor none to; it is
    /// quarantined, its frames refused both ways until it is destroyed.
    Unidentified,
}

impl BindRule {
    /// Whether it matches `qp`, by who made it: what the QP-creation probe
    /// saw, or `/proc` for a QP made before any probe ran (see
    /// [`Maker`](crate::host::rdma::Maker)); the very match the probe
    /// makes. Nothing matches a QP whose maker is unknown.
    pub fn matches(&self, qp: &Qp) -> bool {
        let Some(transport) = qp.qp_type.transport() else {
            return false;
        };
        qp.maker
            .creation()
            .is_some_and(|c| self.spec().matches(c, qp.qpn, transport))
    }

    /// How it binds a QP of `transport`: a UD QP without a Q_Key in the
    /// rule gets the one its program sets (filled in by the loader).
    fn bind(&self, transport: QpType) -> QpRule {
        let own = transport == QpType::Ud && self.qkey.is_none();
        QpRule {
            qp_type: transport,
            pkey: self.pkey,
            qkey: if transport == QpType::Ud {
                self.qkey
            } else {
                None
            },
            flags: qp_flags::RULE | if own { qp_flags::OWN_QKEY } else { 0 },
        }
    }
}

impl Policy {
    /// The policy to enforce while `qps` exist: the `[[qp]]` entries plus
    /// every discovered QP a rule binds (a boundary rule's replacing the
    /// entry of its QPN), and what decides each of `qps` (in their order). Deterministic for the same input, so a caller can
    /// compare results to see whether anything changed.
    pub fn with_discovered(&self, qps: &[Qp]) -> (Policy, Vec<Binding>) {
        let mut effective = self.clone();
        let bindings = qps
            .iter()
            .map(|qp| {
                let Some(transport) = qp.qp_type.transport() else {
                    return Binding::Exempt;
                };
                let matched = self.binds.iter().enumerate().find(|(_, r)| r.matches(qp));
                if let Some(owner) = self.owner
                    && matched.is_none_or(|(rule, _)| rule != owner)
                    && qp.maker.creation().is_some()
                {
                    return Binding::Foreign {
                        rule: matched.map(|(rule, _)| rule),
                    };
                }
                // An entry names a QPN, which comes by chance: it decides
                // unless a boundary rule claims the QP.
                if let Some(entry) = self.qps.get(&qp.qpn)
                    && !matched.is_some_and(|(_, r)| r.beats_entries())
                {
                    return Binding::Entry(*entry);
                }
                let Some((rule, r)) = matched else {
                    return match qp.maker {
                        Maker::Unknown => Binding::Unidentified,
                        _ => Binding::Unbound,
                    };
                };
                let bound = r.bind(transport);
                let ruled = Binding::Rule {
                    rule,
                    line: r.line,
                    bound,
                };
                match effective.qps.entry(qp.qpn) {
                    Entry::Vacant(slot) => {
                        slot.insert(bound);
                        ruled
                    }
                    Entry::Occupied(mut e) if e.get().flags & qp_flags::RULE == 0 => {
                        e.insert(bound);
                        ruled
                    }
                    Entry::Occupied(first) => Binding::Taken(*first.get()),
                }
            })
            .collect::<Vec<Binding>>();
        (effective, bindings)
    }
}

pub(super) fn rules(
    cx: &Ctx,
    pkeys: &[u16],
    raw: &[Spanned<RawBind>],
) -> Result<Vec<BindRule>, PolicyError> {
    if raw.len() > MAX_RULES as usize {
        return Err(cx.err(
            raw[MAX_RULES as usize].span(),
            &format!("bind[{MAX_RULES}]"),
            format!("one rule too many; the kernel matches at most {MAX_RULES} [[bind]] rules"),
        ));
    }
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
    if raw.comm.is_none()
        && raw.pid.is_none()
        && raw.cgroup.is_none()
        && raw.uid.is_none()
        && raw.gid.is_none()
        && raw.netns.is_none()
        && raw.kernel.is_none()
        && raw.port.is_none()
        && raw.device.is_none()
        && raw.qpn.is_none()
        && raw.qp_type.is_none()
    {
        return Err(cx.err(
            b.span(),
            field,
            "matches every QP; give at least one of cgroup, uid, gid, netns, kernel, port, device, comm, pid, qpn, type",
        ));
    }
    let cgroup = resolved(
        cx,
        &raw.cgroup,
        &format!("{field}.cgroup"),
        identity::cgroup,
    )?;
    if let (Some(c), Some(path)) = (&cgroup, &raw.cgroup)
        && c.level as usize >= CGROUP_LEVELS
    {
        return Err(cx.err(
            path.span(),
            &format!("{field}.cgroup"),
            format!(
                "`{}` is {} levels below the root; the QP-creation probe records a creator's cgroups {} levels deep, so a rule may name one at most {} below the root",
                path.get_ref(),
                c.level,
                CGROUP_LEVELS,
                CGROUP_LEVELS - 1
            ),
        ));
    }
    let netns = resolved(cx, &raw.netns, &format!("{field}.netns"), identity::netns)?;
    let kernel = raw.kernel.as_ref().is_some_and(|k| *k.get_ref());
    if let Some(k) = &raw.kernel
        && *k.get_ref()
        && (raw.cgroup.is_some()
            || raw.uid.is_some()
            || raw.gid.is_some()
            || raw.netns.is_some()
            || raw.pid.is_some())
    {
        return Err(cx.err(
            k.span(),
            &format!("{field}.kernel"),
            "a kernel user's QPs have no process: give comm (the module's name), qpn or type, not cgroup, uid, gid, netns or pid",
        ));
    }
    if kernel
        && let Some(c) = &raw.comm
        && c.get_ref() == crate::host::rdma::UVERBS
    {
        return Err(cx.err(
            c.span(),
            &format!("{field}.comm"),
            "ib_uverbs makes QPs for processes, which are bound as the process's, never by a kernel rule",
        ));
    }
    let port = match &raw.port {
        Some(p) if !kernel => {
            return Err(cx.err(
                p.span(),
                &format!("{field}.port"),
                "is for kernel = true rules: the rdma_cm port a kernel user's QP serves or connects to (a process's QPs are bound by who made them)",
            ));
        }
        Some(p) => Some(
            u16::try_from(*p.get_ref())
                .ok()
                .filter(|&n| n != 0)
                .ok_or_else(|| {
                    cx.err(
                        p.span(),
                        &format!("{field}.port"),
                        format!(
                            "{} is out of range; expected an rdma_cm port in 1..=65535 (NVMe over Fabrics 4420, iSER 3260, NFS/RDMA 20049, SMB Direct 5445, RDS 18634)",
                            p.get_ref()
                        ),
                    )
                })?,
        ),
        None => None,
    };
    let device = raw
        .device
        .as_ref()
        .map(|d| {
            crate::host::rdma::device_index(d.get_ref())
                .map(|index| (d.get_ref().clone(), index))
                .map_err(|why| cx.err(d.span(), &format!("{field}.device"), why))
        })
        .transpose()?;
    let uid = raw
        .uid
        .as_ref()
        .map(|u| id(cx, u, &format!("{field}.uid"), "user"))
        .transpose()?;
    let gid = raw
        .gid
        .as_ref()
        .map(|g| id(cx, g, &format!("{field}.gid"), "group"))
        .transpose()?;
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
        cgroup,
        uid,
        gid,
        netns,
        kernel,
        port,
        device,
        qpns,
        qp_type,
        pkey,
        qkey,
        own: raw
            .own_device
            .as_ref()
            .map(|o| own_device::own_device(cx, o, field))
            .transpose()?,
    })
}

/// What a policy with own devices must also be: every rule a tenant's,
/// with a device of its own (none may share the interface's), no two
/// devices alike, and no `[[qp]]` entry (a QPN names no device, and each
/// device numbers its QPs from the same start).
pub(super) fn check_own_devices(
    cx: &Ctx,
    binds: &[BindRule],
    spans: &[std::ops::Range<usize>],
    qp_spans: &[std::ops::Range<usize>],
) -> Result<(), PolicyError> {
    let Some(first) = binds.iter().position(|b| b.own.is_some()) else {
        return Ok(());
    };
    let first_line = binds[first].line;
    if let Some(i) = binds.iter().position(|b| b.own.is_none()) {
        return Err(cx.err(
            spans[i].clone(),
            &format!("bind[{i}]"),
            format!(
                "has no own_device, where the rule at line {first_line} has one; expected one for every rule: its tenant's QPs would share the interface's device with the others', and meet them inside rdma_rxe"
            ),
        ));
    }
    if let Some(q) = qp_spans.first() {
        return Err(cx.err(
            q.clone(),
            "qp[0]",
            format!(
                "binds a QPN, which each tenant's device hands out from the same start (the rule at line {first_line} gives its tenant a device); expected [[bind]] rules only"
            ),
        ));
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, b) in binds.iter().enumerate() {
        let own = b.own.as_ref().expect("every rule has one by now");
        if !b.beats_entries() && !b.kernel {
            return Err(cx.err(
                spans[i].clone(),
                &format!("bind[{i}].own_device"),
                "is for a tenant, which a rule tells by cgroup, uid, gid or netns (or kernel = true); this one matches only what a process chooses, so anyone could be its tenant",
            ));
        }
        let chosen = [
            (b.comm.is_some() && !b.kernel, "comm"),
            (b.pid.is_some(), "pid"),
            (b.qpns.is_some(), "qpn"),
            (b.qp_type.is_some(), "type"),
        ];
        if let Some((_, what)) = chosen.iter().find(|(given, _)| *given) {
            return Err(cx.err(
                spans[i].clone(),
                &format!("bind[{i}].{what}"),
                "narrows a rule with an own_device, whose device is all of its tenant's: every QP its tenant makes there must be bound, and one this rule left to another would be quarantined; expected the tenant alone (cgroup, uid, gid, netns; kernel with comm and port)",
            ));
        }
        if b.device.is_some() {
            return Err(cx.err(
                spans[i].clone(),
                &format!("bind[{i}].device"),
                "names an existing device, where own_device has pkeyfw make one; expected one of them",
            ));
        }
        let names = [("device", &own.name), ("interface", &own.iface)]
            .into_iter()
            .map(|(what, n)| (format!("{what} {n}"), n.clone()))
            .chain(
                own.addrs
                    .iter()
                    .map(|p| (format!("address {}", p.addr), p.addr.to_string())),
            );
        for (said, key) in names {
            let kind = said.split(' ').next().unwrap_or_default();
            let key = format!("{}:{key}", if kind == "address" { "a" } else { "n" });
            if let Some(&j) = seen.get(&key)
                && j != i
            {
                return Err(cx.err(
                    spans[i].clone(),
                    &format!("bind[{i}].own_device"),
                    format!(
                        "{said} is also the rule's at line {}; expected each tenant's device, interface and addresses its own",
                        binds[j].line
                    ),
                ));
            }
            seen.insert(key, i);
        }
    }
    Ok(())
}

/// A path the rule names, resolved to what it claims to be.
fn resolved<T>(
    cx: &Ctx,
    path: &Option<Spanned<String>>,
    field: &str,
    resolve: fn(&Path) -> Result<T, String>,
) -> Result<Option<T>, PolicyError> {
    path.as_ref()
        .map(|p| {
            resolve(Path::new(p.get_ref()))
                .map_err(|why| cx.err(p.span(), field, format!("`{}` {why}", p.get_ref())))
        })
        .transpose()
}

/// A uid or gid: what the kernel's `(uid_t)-1` ("no id") is not.
fn id(cx: &Ctx, v: &Spanned<i64>, field: &str, what: &str) -> Result<u32, PolicyError> {
    u32::try_from(*v.get_ref())
        .ok()
        .filter(|&n| n != u32::MAX)
        .ok_or_else(|| {
            cx.err(
                v.span(),
                field,
                format!(
                    "{} is out of range; expected a {what} id in 0..=4294967294",
                    v.get_ref()
                ),
            )
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
