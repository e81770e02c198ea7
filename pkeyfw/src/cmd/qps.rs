//! `pkeyfw qps`: the QPs of the RDMA devices bound to an interface, as RDMA
//! netlink reports them, with what a policy makes of each and, when the
//! interface is attached, the filter's counters for it.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write,
    net::SocketAddr,
    path::PathBuf,
};

use anyhow::{Result, bail};
use pkeyfw_common::{
    abi::{QpStats, qp_flags},
    pkey,
};
use serde_json::{Value, json};

use super::NetnsArg;
use crate::{
    host::{
        netlink,
        rdma::{self, Device, IbQpType, Qp},
    },
    loading::maps::Maps,
    loading::pins::{Pins, State, record},
    policy::{Binding, Policy, QpRule},
    reporting::{describe, reach},
};

/// Everything `pkeyfw qps` shows.
struct View {
    iface: String,
    devices: Vec<Device>,
    qps: Vec<Qp>,
    /// The policy's file, the policy with the discovered QPs, and each QP's
    /// binding.
    policy: Option<(PathBuf, Policy, Vec<Binding>)>,
    /// The filter's counters by QPN, when the interface is attached.
    counters: BTreeMap<u32, QpStats>,
}

/// The QPs of the RDMA devices bound to an interface, and what binds
/// each.
///
/// Lists what the kernel's RDMA netlink reports (as `rdma resource show
/// qp`): device, port, QPN, type, state, peer QPN, owner (PID and
/// command, or the kernel module) and, for rdma_cm QPs, both addresses.
/// With a policy (--policy, else the one the interface's attachment
/// runs) it shows what binds each QP — a [[qp]] entry, a [[bind]] rule,
/// or the unknown-QP rule — and, when the interface is attached, the
/// filter's per-QP counters.
#[derive(clap::Args)]
pub struct QpsArgs {
    pub iface: String,
    #[command(flatten)]
    pub netns: NetnsArg,
    /// Partition policy (TOML).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// One JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &QpsArgs) -> Result<()> {
    args.netns.enter()?;
    let (iface, policy, json) = (args.iface.as_str(), args.policy.as_deref(), args.json);
    // A tenant host's QPs are on its tenants' devices: each port's own.
    if let Some((_, record)) = record::host(iface) {
        if !json {
            println!(
                "{iface}: uplink of {} tenants' own devices, each with a port of its own:\n",
                record.devices.len()
            );
        }
        for t in &record.devices {
            show(&t.made.iface, policy, json)?;
        }
        return Ok(());
    }
    show(iface, policy, json)
}

/// `pkeyfw qps` of one interface.
fn show(iface: &str, policy: Option<&std::path::Path>, json: bool) -> Result<()> {
    let devices = rdma::devices_on(netlink::if_index(iface)?)?;
    if devices.is_empty() {
        bail!(
            "no RDMA device is bound to {iface} (soft-RoCE makes one: rdma link add rxe0 type rxe netdev {iface})"
        );
    }
    let pins = Pins::of(iface);
    let maps = if pins.exists() && matches!(pins.state(), Ok(State::Live { .. })) {
        Some(Maps::from_pins(&pins.dir)?)
    } else {
        None
    };
    // Who made each QP as the attachment's probes saw it, where they did.
    let mut qps = rdma::qps_of(&devices)?;
    let records = maps.as_ref().map(Maps::creations).transpose()?;
    rdma::identify(&mut qps, &records.unwrap_or_default());
    let path = match policy {
        Some(p) => Some(p.to_path_buf()),
        None if pins.exists() => pins.remembered_policy().ok(),
        None => None,
    };
    let policy = match path {
        Some(path) => {
            let policy = Policy::load_port(&path, iface, Some(crate::host::iface::guid(iface)?))?;
            let (effective, bindings) = policy.with_discovered(&qps);
            Some((path, effective, bindings))
        }
        None => None,
    };
    let counters = match &maps {
        Some(maps) => maps.qp_counters()?.into_iter().collect(),
        None => BTreeMap::new(),
    };
    let view = View {
        iface: iface.to_string(),
        devices,
        qps,
        policy,
        counters,
    };
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", view.json())?;
    } else {
        view.text(&mut out)?;
    }
    Ok(())
}

impl View {
    /// Devices whose RDMA traffic the filter never sees (hardware), and
    /// devices whose QPs are bound to more than one partition: rdma_rxe
    /// delivers traffic between QPs of one device inside the driver, where
    /// neither XDP nor TC sees it, so those partitions are not isolated
    /// from each other.
    fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self.devices.iter().filter_map(reach::warning).collect();
        let Some((_, _, bindings)) = &self.policy else {
            return warnings;
        };
        let mut partitions: BTreeMap<&str, BTreeSet<u16>> = BTreeMap::new();
        for (qp, binding) in self.qps.iter().zip(bindings) {
            if let Binding::Entry(r) | Binding::Rule { bound: r, .. } = binding {
                partitions
                    .entry(qp.device.as_str())
                    .or_default()
                    .insert(pkey::key(r.pkey));
            }
        }
        warnings.extend(
            partitions
                .into_iter()
                .filter(|(_, keys)| keys.len() > 1)
                .map(|(device, keys)| {
                    let keys: Vec<String> = keys.iter().map(|k| format!("{k:#06x}")).collect();
                    format!(
                        "{device} has QPs bound to partitions {}: traffic between QPs of one rxe device stays inside the driver, where pkeyfw cannot judge it; give each tenant its own RDMA device",
                        keys.join(", ")
                    )
                }),
        );
        warnings
    }

    fn json(&self) -> Value {
        let devices: Vec<_> = self.devices.iter().map(reach::device_json).collect();
        let qps: Vec<_> = self
            .qps
            .iter()
            .enumerate()
            .map(|(i, qp)| {
                let stats = self.counters.get(&qp.qpn);
                json!({
                    "device": qp.device,
                    "port": qp.port,
                    "qpn": qp.qpn,
                    "type": qp.qp_type.to_string(),
                    "state": qp.state.to_string(),
                    "remote_qpn": qp.remote_qpn,
                    "pid": qp.pid,
                    "comm": qp.comm,
                    "kernel": qp.kernel,
                    "local": qp.local.map(|a| a.to_string()),
                    "peer": qp.peer.map(|a| a.to_string()),
                    "binding": self.policy.as_ref().map(|(_, p, b)| binding_json(p, &b[i])),
                    "passed": stats.map(|s| s.passed),
                    "dropped": stats.map(|s| s.dropped),
                })
            })
            .collect();
        json!({
            "interface": self.iface,
            "devices": devices,
            "policy": self.policy.as_ref().map(|(path, ..)| path.display().to_string()),
            "qps": qps,
            "warnings": self.warnings(),
        })
    }

    fn text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|d| {
                let ports: Vec<String> = d.ports.iter().map(u32::to_string).collect();
                format!("{} ({}) port {}", d.name, d.driver, ports.join(", "))
            })
            .collect();
        write!(
            out,
            "{}: {} QPs on {}; ",
            self.iface,
            self.qps.len(),
            devices.join("; ")
        )?;
        match &self.policy {
            Some((path, p, _)) => writeln!(
                out,
                "policy {} (unknown QPs: {})",
                path.display(),
                p.unknown_qp.name()
            )?,
            None => writeln!(out, "no policy (give --policy to see bindings)")?,
        }
        for (i, qp) in self.qps.iter().enumerate() {
            writeln!(out, "  {}", summary(qp))?;
            let Some((_, policy, bindings)) = &self.policy else {
                continue;
            };
            write!(out, "      {}", binding_text(policy, qp, &bindings[i]))?;
            match self.counters.get(&qp.qpn) {
                Some(s) => writeln!(out, "; passed {}, dropped {}", s.passed, s.dropped)?,
                None => writeln!(out)?,
            }
        }
        for w in self.warnings() {
            writeln!(out, "warning: {w}")?;
        }
        Ok(())
    }
}

/// `rxe0/1 QP 0x000012 RC RTS pid 5151 rping, peer QP 0x000013, 10.0.0.1:18515 → 10.0.0.2:41234`.
fn summary(qp: &Qp) -> String {
    let port = qp.port.map_or("-".to_string(), |p| p.to_string());
    let owner = match (qp.kernel, qp.pid, &qp.comm) {
        (true, _, Some(name)) => format!("[{}]", describe::name(name)),
        (_, Some(pid), comm) => format!(
            "pid {pid} {}",
            describe::name(comm.as_deref().unwrap_or("?"))
        ),
        _ => "owner gone".to_string(),
    };
    let mut s = format!(
        "{}/{port} QP {:#08x} {:<7} {:<5} {owner}",
        qp.device, qp.qpn, qp.qp_type, qp.state
    );
    if let Some(r) = qp.remote_qpn {
        s += &format!(", peer QP {r:#08x}");
    }
    if qp.local.is_some() || qp.peer.is_some() {
        s += &format!(", {} → {}", addr(qp.local), addr(qp.peer));
    }
    s
}

fn addr(a: Option<SocketAddr>) -> String {
    a.map_or("?".to_string(), |a| a.to_string())
}

fn rule_text(r: &QpRule) -> String {
    let mut s = format!("P_Key {}", describe::pkey(r.pkey));
    match r.qkey {
        Some(q) => s += &format!(", Q_Key {q:#010x}"),
        None if r.flags & qp_flags::OWN_QKEY != 0 => s += ", the Q_Key its program sets",
        None => {}
    }
    s
}

fn binding_text(policy: &Policy, qp: &Qp, binding: &Binding) -> String {
    let unknown = format!("unbound → unknown_qp {}", policy.unknown_qp.name());
    match binding {
        Binding::Exempt if matches!(qp.qp_type, IbQpType::Smi | IbQpType::Gsi) => {
            "QP0/QP1: fixed rules".to_string()
        }
        Binding::Exempt => "never bound: no RoCE transport".to_string(),
        Binding::Entry(r) => format!("[[qp]] entry: {}", rule_text(r)),
        Binding::Rule { rule, line, bound } => {
            format!("bind[{rule}] (line {line}): {}", rule_text(bound))
        }
        Binding::Taken(r) => format!("QPN bound for another device's QP: {}", rule_text(r)),
        Binding::Unbound => unknown,
        Binding::Unidentified => "quarantined: who made it cannot be told".to_string(),
        Binding::Foreign { rule: Some(r) } => format!(
            "quarantined: made on another tenant's device by bind[{r}]'s tenant (line {})",
            policy.binds[*r].line
        ),
        Binding::Foreign { rule: None } => {
            "quarantined: made on a tenant's device by a creator no rule binds".to_string()
        }
    }
}

fn binding_json(policy: &Policy, binding: &Binding) -> Value {
    let (by, rule, line, bound) = match binding {
        Binding::Exempt => ("exempt", None, None, None),
        Binding::Entry(r) => ("qp", None, None, Some(r)),
        Binding::Rule { rule, line, bound } => ("bind", Some(rule), Some(line), Some(bound)),
        Binding::Taken(r) => ("taken", None, None, Some(r)),
        Binding::Unbound => ("unknown_qp", None, None, None),
        Binding::Unidentified => ("unidentified", None, None, None),
        Binding::Foreign { rule } => (
            "foreign",
            rule.as_ref(),
            rule.map(|r| &policy.binds[r].line),
            None,
        ),
    };
    json!({
        "by": by,
        "rule": rule,
        "line": line,
        "pkey": bound.map(|r| r.pkey),
        "qkey": bound.and_then(|r| r.qkey),
        "unknown_qp": (by == "unknown_qp").then(|| policy.unknown_qp.name()),
    })
}

#[cfg(test)]
mod tests;
