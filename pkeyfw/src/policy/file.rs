//! The TOML policy file: serde shapes with spans, then validation into a
//! [`Policy`]. Every refusal names the file, line, column and field.

use std::{collections::BTreeMap, net::IpAddr};

use pkeyfw_common::{
    abi::{OnForeignJoin, QPN_MASK, QpType, UnknownQp},
    verdict::MULTICAST_QPN,
};
use serde::Deserialize;
use toml::Spanned;

use super::{
    Group, Policy, PolicyError, QpRule,
    bind::{self, RawBind},
    ctx::{Ctx, MIN_QPN},
    error::position,
    partitions,
};

/// Largest P_Key table a port can have (IBA: 32K entries).
const MAX_PKEYS: usize = 1 << 15;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    port: Option<Spanned<RawPort>>,
    enforcement: Option<RawEnforcement>,
    #[serde(default)]
    qp: Vec<Spanned<RawQp>>,
    #[serde(default)]
    group: Vec<Spanned<RawGroup>>,
    #[serde(default)]
    bind: Vec<Spanned<RawBind>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    pkeys: Option<Spanned<Vec<Spanned<i64>>>>,
    partitions: Option<Spanned<String>>,
    guid: Option<Spanned<String>>,
    #[serde(rename = "self")]
    is_sm: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnforcement {
    mode: Option<Spanned<String>>,
    unknown_qp: Option<Spanned<String>>,
    stamp: Option<bool>,
    probe_capacity: Option<Spanned<i64>>,
    foreign_join: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQp {
    qpn: Option<Spanned<i64>>,
    #[serde(rename = "type")]
    qp_type: Option<Spanned<String>>,
    pkey: Option<Spanned<i64>>,
    pkey_index: Option<Spanned<i64>>,
    qkey: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    addr: Option<Spanned<String>>,
    pkey: Option<Spanned<i64>>,
    pkey_index: Option<Spanned<i64>>,
    qkey: Option<Spanned<i64>>,
}

pub(super) fn parse(cx: &Ctx, port_guid: Option<u64>) -> Result<Policy, PolicyError> {
    let raw: RawPolicy = cx.toml()?;

    let port = raw.port.as_ref().ok_or_else(|| {
        cx.err(
            0..0,
            "port",
            "missing; expected a [port] table with `pkeys` or `partitions`",
        )
    })?;
    let table = port_table(cx, port, port_guid)?;
    let pkeys = table.pkeys.clone();

    let (monitor, unknown_qp) = enforcement(cx, raw.enforcement.as_ref())?;

    let mut qps = BTreeMap::new();
    let mut first_line = BTreeMap::new();
    for (i, q) in raw.qp.iter().enumerate() {
        let field = format!("qp[{i}]");
        let (qpn, rule) = qp(cx, &pkeys, q, &field)?;
        let (line, _) = position(cx.text, q.span().start);
        if let Some(first) = first_line.insert(qpn, line) {
            return Err(cx.err(
                q.get_ref().qpn.as_ref().map_or(q.span(), Spanned::span),
                &format!("{field}.qpn"),
                format!("QPN {qpn:#x} is already bound at line {first}; expected each QPN once"),
            ));
        }
        qps.insert(qpn, rule);
    }

    let mut groups: BTreeMap<[u8; 16], Group> = table
        .groups
        .iter()
        .map(|g| (Group::key_addr(g.addr), *g))
        .collect();
    for (i, g) in raw.group.iter().enumerate() {
        let field = format!("group[{i}]");
        let group = group(cx, &pkeys, g, &field)?;
        let key = Group::key_addr(group.addr);
        if groups.insert(key, group).is_some() {
            let addr = g.get_ref().addr.as_ref().map_or(g.span(), Spanned::span);
            return Err(cx.err(
                addr,
                &format!("{field}.addr"),
                format!(
                    "group {} is defined twice (here, or in the partitions file too)",
                    group.addr
                ),
            ));
        }
    }

    let binds = bind::rules(cx, &pkeys, &raw.bind)?;
    bind::check_own_devices(
        cx,
        &binds,
        &raw.bind.iter().map(Spanned::span).collect::<Vec<_>>(),
        &raw.qp.iter().map(Spanned::span).collect::<Vec<_>>(),
    )?;
    // One table for every tenant's port: derived for one GUID, which the
    // ports (whose MACs, hence GUIDs, are made at attach) cannot give.
    let raw_port = port.get_ref();
    if binds.iter().any(|b| b.own.is_some())
        && let Some(p) = &raw_port.partitions
        && raw_port.guid.is_none()
    {
        return Err(cx.err(
            p.span(),
            "port.partitions",
            "derives the table for the interface's GUID, which each tenant's own device (a macvlan of its own MAC) does not share; expected `guid` in [port]: the GUID whose memberships every tenant's port takes",
        ));
    }
    let mut warnings = table.warnings;
    let on_join = raw
        .enforcement
        .as_ref()
        .and_then(|e| e.foreign_join.as_ref());
    let foreign_join = on_join.map_or(Ok(OnForeignJoin::default()), |f| foreign_join(cx, f))?;
    if let (true, OnForeignJoin::Kill, Some(f)) = (monitor, foreign_join, on_join) {
        let (line, _) = position(cx.text, f.span().start);
        warnings.push(format!(
            "{}:{line}: foreign_join = \"kill\" kills nothing in monitor mode: foreign joins are only reported",
            cx.path.display()
        ));
    }
    if !monitor {
        warnings.extend(binds.iter().filter(|b| b.no_boundary()).map(|b| {
            format!(
                "{}:{}: this [[bind]] rule matches only by comm, pid, qpn or type, which a process chooses or gets by chance: no boundary between tenants (add cgroup, uid, gid or netns)",
                cx.path.display(),
                b.line
            )
        }));
        warnings.extend(binds.iter().filter(|b| b.kernel && b.port.is_none()).map(|b| {
            format!(
                "{}:{}: this kernel = true rule names no port: it binds every QP of its kernel users alike, whatever they serve (NVMe over Fabrics, iSER, NFS/RDMA, SMB Direct and RDS all make rdma_cm QPs, and an unprivileged user can make the kernel open RDS connections); add port (e.g. 4420 for NVMe over Fabrics)",
                cx.path.display(),
                b.line
            )
        }));
        if let Some(line) = shared_device(&binds) {
            warnings.push(format!("{}: {line}", cx.path.display()));
        }
        warnings.extend(first_line.iter().map(|(qpn, line)| {
            format!(
                "{}:{line}: this [[qp]] entry binds QPN {qpn:#x} by number alone, which any process can come to hold (rxe hands QPNs out in sequence): no boundary between tenants; a cgroup, uid, gid or netns rule that matches the QP's creator binds it instead",
                cx.path.display(),
            )
        }));
    }

    Ok(Policy {
        pkeys,
        names: table.names,
        guid: table.guid,
        warnings,
        monitor,
        unknown_qp,
        qps,
        groups,
        binds,
        stamp: raw
            .enforcement
            .as_ref()
            .and_then(|e| e.stamp)
            .unwrap_or(false),
        foreign_join,
        probe_capacity: match raw
            .enforcement
            .as_ref()
            .and_then(|e| e.probe_capacity.as_ref())
        {
            Some(n) => Some(probe_capacity(cx, n)?),
            None => None,
        },
        switch: None,
        listed: Vec::new(),
        owner: None,
    })
}

/// The port's P_Key table, given as `pkeys` or derived from `partitions`.
pub(super) struct PortTable {
    pub(super) pkeys: Vec<u16>,
    pub(super) names: Vec<String>,
    pub(super) guid: Option<u64>,
    pub(super) groups: Vec<Group>,
    pub(super) warnings: Vec<String>,
}

fn port_table(
    cx: &Ctx,
    port: &Spanned<RawPort>,
    port_guid: Option<u64>,
) -> Result<PortTable, PolicyError> {
    let raw = port.get_ref();
    let guid = match &raw.guid {
        Some(g) => Some(parse_guid(g.get_ref()).ok_or_else(|| {
            cx.err(
                g.span(),
                "port.guid",
                format!(
                    "`{}` is not a GUID; expected 64 bits such as \"0x0002c90300a1b2c3\"",
                    g.get_ref()
                ),
            )
        })?),
        None => port_guid,
    };
    match (&raw.pkeys, &raw.partitions) {
        (Some(_), Some(p)) => Err(cx.err(
            p.span(),
            "port.partitions",
            "given together with `pkeys`; expected one of the two",
        )),
        (None, None) => Err(cx.err(
            port.span(),
            "port.pkeys",
            "missing; expected `pkeys` (the P_Key table) or `partitions` (an OpenSM partitions.conf)",
        )),
        (Some(list), None) => Ok(PortTable {
            pkeys: pkey_table(cx, list, "port")?,
            names: Vec::new(),
            guid,
            groups: Vec::new(),
            warnings: Vec::new(),
        }),
        (None, Some(file)) => {
            let Some(guid) = guid else {
                return Err(cx.err(
                    file.span(),
                    "port.partitions",
                    "needs this port's GUID: set `guid` under [port], or give --port-guid or --iface",
                ));
            };
            partitions_table(cx, file, "port.partitions", guid, raw.is_sm.unwrap_or(false))
        }
    }
}

/// Derives the table from an OpenSM partitions file, relative to the policy;
/// `field` names `file` in errors.
pub(super) fn partitions_table(
    cx: &Ctx,
    file: &Spanned<String>,
    field: &str,
    guid: u64,
    is_sm: bool,
) -> Result<PortTable, PolicyError> {
    let path = cx.named(file.get_ref());
    let text = std::fs::read_to_string(&path).map_err(|e| {
        cx.err(
            file.span(),
            field,
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let derived = partitions::derive(
        &path,
        &text,
        &partitions::Options {
            port_guid: guid,
            is_sm,
        },
    )
    .map_err(|e| PolicyError {
        file: e.file,
        line: e.line,
        column: e.column,
        field: String::new(),
        message: e.message,
    })?;
    let groups = derived
        .groups
        .iter()
        .map(|g| Group {
            addr: IpAddr::V6(g.mgid),
            pkey: g.pkey,
            qkey: g.qkey,
        })
        .collect();
    Ok(PortTable {
        pkeys: derived.pkeys,
        names: derived.names,
        guid: Some(guid),
        groups,
        warnings: derived.warnings,
    })
}

/// A GUID written as hex (`0x…`) or decimal.
pub fn parse_guid(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// A P_Key table given as a list, at `table`.pkeys.
pub(super) fn pkey_table(
    cx: &Ctx,
    list: &Spanned<Vec<Spanned<i64>>>,
    table: &str,
) -> Result<Vec<u16>, PolicyError> {
    let name = format!("{table}.pkeys");
    if list.get_ref().is_empty() {
        return Err(cx.err(
            list.span(),
            &name,
            "is empty; expected at least the default P_Key (index 0)",
        ));
    }
    if list.get_ref().len() > MAX_PKEYS {
        return Err(cx.err(
            list.span(),
            &name,
            format!(
                "has {} entries; a port holds at most {MAX_PKEYS}",
                list.get_ref().len()
            ),
        ));
    }
    let mut pkeys = Vec::with_capacity(list.get_ref().len());
    for (i, v) in list.get_ref().iter().enumerate() {
        let field = format!("{name}[{i}]");
        let p = cx.pkey(v, &field)?;
        if let Some(first) = pkeys.iter().position(|&q| q == p) {
            return Err(cx.err(
                v.span(),
                &field,
                format!("{p:#06x} repeats index {first}; expected each P_Key once"),
            ));
        }
        pkeys.push(p);
    }
    Ok(pkeys)
}

/// `mode`: whether it is "monitor" rather than "enforce".
pub(super) fn monitor_mode(
    cx: &Ctx,
    m: &Spanned<String>,
    field: &str,
) -> Result<bool, PolicyError> {
    match m.get_ref().as_str() {
        "enforce" => Ok(false),
        "monitor" => Ok(true),
        other => Err(cx.err(
            m.span(),
            field,
            format!("`{other}` is not a mode; expected \"enforce\" or \"monitor\""),
        )),
    }
}

fn enforcement(cx: &Ctx, e: Option<&RawEnforcement>) -> Result<(bool, UnknownQp), PolicyError> {
    let Some(e) = e else {
        return Ok((false, UnknownQp::default()));
    };
    let monitor = match &e.mode {
        None => false,
        Some(m) => monitor_mode(cx, m, "enforcement.mode")?,
    };
    let unknown_qp = match &e.unknown_qp {
        None => UnknownQp::default(),
        Some(u) => UnknownQp::from_name(u.get_ref()).ok_or_else(|| {
            cx.err(
                u.span(),
                "enforcement.unknown_qp",
                format!(
                    "`{}` is not a rule; expected \"default-pkey\", \"drop\" or \"pass\"",
                    u.get_ref()
                ),
            )
        })?,
    };
    Ok((monitor, unknown_qp))
}

/// `[enforcement] foreign_join`: what the probes do about a local QP that
/// joins another partition's multicast group.
fn foreign_join(cx: &Ctx, f: &Spanned<String>) -> Result<OnForeignJoin, PolicyError> {
    OnForeignJoin::from_name(f.get_ref()).ok_or_else(|| {
        cx.err(
            f.span(),
            "enforcement.foreign_join",
            format!(
                "`{}` is not an action; expected \"report\" or \"kill\"",
                f.get_ref()
            ),
        )
    })
}

/// `[enforcement] probe_capacity`: QPs the QP-creation probe may bind at
/// once, below what the devices hold (1 to 2^24, every QPN).
fn probe_capacity(cx: &Ctx, n: &Spanned<i64>) -> Result<u32, PolicyError> {
    let max = u64::from(QPN_MASK) + 1;
    let v = cx.int(
        n,
        "enforcement.probe_capacity",
        max,
        "a number of QPs in 1..=16777216",
    )?;
    if v == 0 {
        return Err(cx.err(
            n.span(),
            "enforcement.probe_capacity",
            "0 leaves no QP bindable at creation; expected a number of QPs in 1..=16777216",
        ));
    }
    Ok(v as u32)
}

fn qp(
    cx: &Ctx,
    pkeys: &[u16],
    q: &Spanned<RawQp>,
    field: &str,
) -> Result<(u32, QpRule), PolicyError> {
    let raw = q.get_ref();
    let qpn_field = format!("{field}.qpn");
    let qpn = cx.need(&raw.qpn, q.span(), &qpn_field, "a QPN in 0x2..=0xfffffe")?;
    let qpn = u32::try_from(*qpn.get_ref())
        .ok()
        .filter(|n| (MIN_QPN..MULTICAST_QPN).contains(n))
        .ok_or_else(|| {
            cx.err(
                qpn.span(),
                &qpn_field,
                format!(
                    "{} is out of range; expected a QPN in 0x2..=0xfffffe (QP0, QP1 and the multicast QPN have fixed rules)",
                    qpn.get_ref()
                ),
            )
        })?;

    let type_field = format!("{field}.type");
    let t = cx.need(
        &raw.qp_type,
        q.span(),
        &type_field,
        "\"rc\", \"uc\", \"ud\" or \"xrc\"",
    )?;
    let qp_type = QpType::from_name(t.get_ref()).ok_or_else(|| {
        cx.err(
            t.span(),
            &type_field,
            format!(
                "`{}` is not a QP type; expected \"rc\", \"uc\", \"ud\" or \"xrc\"",
                t.get_ref()
            ),
        )
    })?;

    let pkey = cx.binding(pkeys, &raw.pkey, &raw.pkey_index, q.span(), field)?;

    let qkey_field = format!("{field}.qkey");
    let qkey = match (&raw.qkey, qp_type) {
        (Some(k), QpType::Ud) => Some(cx.qkey(k, &qkey_field)?),
        (None, QpType::Ud) => {
            return Err(cx.err(
                q.span(),
                &qkey_field,
                "missing; a UD QP needs the Q_Key it accepts",
            ));
        }
        (Some(k), other) => {
            return Err(cx.err(
                k.span(),
                &qkey_field,
                format!("given for a {} QP; only UD QPs have a Q_Key", other.name()),
            ));
        }
        (None, _) => None,
    };
    Ok((
        qpn,
        QpRule {
            qp_type,
            pkey,
            qkey,
            flags: 0,
        },
    ))
}

fn group(
    cx: &Ctx,
    pkeys: &[u16],
    g: &Spanned<RawGroup>,
    field: &str,
) -> Result<Group, PolicyError> {
    let raw = g.get_ref();
    let addr_field = format!("{field}.addr");
    let a = cx.need(
        &raw.addr,
        g.span(),
        &addr_field,
        "a multicast IPv6 or IPv4 address",
    )?;
    let addr: IpAddr = a.get_ref().parse().map_err(|_| {
        cx.err(
            a.span(),
            &addr_field,
            format!(
                "`{}` is not an IP address; expected a multicast IPv6 or IPv4 address",
                a.get_ref()
            ),
        )
    })?;
    if !addr.is_multicast() {
        return Err(cx.err(
            a.span(),
            &addr_field,
            format!("{addr} is not multicast; expected ff00::/8 or 224.0.0.0/4"),
        ));
    }
    let pkey = cx.binding(pkeys, &raw.pkey, &raw.pkey_index, g.span(), field)?;
    let qkey_field = format!("{field}.qkey");
    let qkey = cx.need(&raw.qkey, g.span(), &qkey_field, "the group's 32-bit Q_Key")?;
    let qkey = cx.qkey(qkey, &qkey_field)?;
    Ok(Group { addr, pkey, qkey })
}

/// Where two tenants (the rules by cgroup, ids or namespace) would share
/// the interface's RDMA devices, which no rule gives a device of its own:
/// one line naming them.
fn shared_device(binds: &[bind::BindRule]) -> Option<String> {
    let tenants: Vec<String> = binds
        .iter()
        .filter(|b| b.beats_entries() && b.own.is_none())
        .map(|b| format!("line {} ({})", b.line, b.tenant()))
        .collect();
    (tenants.len() > 1).then(|| {
        format!(
            "the tenants of the rules at {} share the interface's RDMA devices: their QPs reach each other inside rdma_rxe, where nothing judges them (two limited members, or two partitions, alike); give each rule an own_device",
            tenants.join(", ")
        )
    })
}
