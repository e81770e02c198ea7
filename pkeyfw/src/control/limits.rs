//! What bounds the QP-creation probe's tables: how many QPs the attached
//! interface's RDMA devices hold at once (`max_qp`, the tables' size) and
//! which numbers they give them (the QPNs the QP table covers), and how
//! many each tenant may create (the rdma cgroup controller's
//! `rdma.max`, which charges every QP a process creates through uverbs as
//! an `hca_object`). A table a tenant fills quarantines the QPs it has no
//! room for; a tenant bounded by `rdma.max` cannot fill it for others.

use std::collections::BTreeMap;

use pkeyfw_common::abi::{PROBE_ROOM, QPN_MASK, RXE_QPNS};

use crate::{
    host::{
        identity::{self, Cgroup},
        rdma::{self, Device, Driver},
    },
    policy::Policy,
};

/// `max_qp` assumed for a device that cannot be asked (no libibverbs):
/// above what common RoCE NICs report (mlx5: 2^17..2^18). Too small fails
/// closed (the QPs beyond it are quarantined), not open.
const ASSUMED_MAX_QP: u32 = 1 << 18;

/// QPs the probe binds at once on a tenant's own device by default: its
/// table is its alone (a tenant that fills it quarantines only its own
/// QPs), and each device's tables weigh on the kernel's memory.
pub const TENANT_QPS: u32 = 1 << 14;

/// How many QPs the probe may bind at once on an interface, and why.
pub struct ProbeCapacity {
    pub qps: u32,
    /// QPNs the devices give their QPs: 0 to `qpns - 1` (0 with no device).
    pub qpns: u32,
    /// Where the number comes from ("rxe0 max_qp 1048560", …).
    pub from: String,
    /// What could not be read, said.
    pub notes: Vec<String>,
}

/// QPs the probe may bind at once on an interface with `devices`: their
/// `max_qp` summed, lowered to the policy's `probe_capacity`.
pub fn probe_capacity(devices: &[Device], policy: &Policy) -> ProbeCapacity {
    let mut notes = Vec::new();
    let mut from = Vec::new();
    let mut qpns = 0;
    let held: u64 = if devices.is_empty() {
        from.push("no RDMA device".to_string());
        PROBE_ROOM.into()
    } else {
        devices
            .iter()
            .map(|d| {
                let max_qp = match rdma::verbs::max_qp(&d.name) {
                    Ok(n) => {
                        from.push(format!("{} max_qp {n}", d.name));
                        n
                    }
                    Err(e) => {
                        notes.push(format!(
                            "cannot read {}'s max_qp ({e:#}): the QP-creation probe's tables are sized for {ASSUMED_MAX_QP} of its QPs, and QPs beyond are quarantined",
                            d.name
                        ));
                        from.push(format!("{} assumed {ASSUMED_MAX_QP}", d.name));
                        ASSUMED_MAX_QP
                    }
                };
                qpns = qpns.max(device_qpns(&d.driver, max_qp));
                u64::from(max_qp)
            })
            .sum()
    };
    let every_qpn = u64::from(QPN_MASK) + 1;
    let mut held = held.min(every_qpn) as u32;
    // A tenant's own device: a table of its own, which only its own QPs
    // can fill.
    if policy.owner.is_some() && held > TENANT_QPS {
        from = vec![format!(
            "a tenant's own device, {TENANT_QPS} unless probe_capacity is lower"
        )];
        held = TENANT_QPS;
    }
    let qps = match policy.probe_capacity {
        Some(p) if p < held => {
            from.insert(0, format!("the policy's probe_capacity, below {held}:"));
            p
        }
        _ => held,
    };
    ProbeCapacity {
        qps,
        qpns,
        from: from.join(", "),
        notes,
    }
}

/// QPNs a device of `driver` holding `max_qp` QPs gives them, 0 to the
/// result - 1: rdma_rxe numbers a QP by its pool index ([`RXE_QPNS`]); a
/// hardware device by its QP context's index, below `max_qp` rounded up to
/// a power of two (a QP numbered beyond is quarantined by the probe, and
/// a hardware device's frames never reach XDP).
fn device_qpns(driver: &Driver, max_qp: u32) -> u32 {
    match driver {
        Driver::Rxe => RXE_QPNS,
        _ => max_qp.min(QPN_MASK).next_power_of_two(),
    }
}

/// The `hca_object` limit on each device that bounds the processes of
/// `cgroup`: the lowest `rdma.max` of it and its ancestors up to the
/// hierarchy's root (which has none). A device missing is unlimited.
fn rdma_limits(cgroup: &Cgroup) -> BTreeMap<String, u64> {
    let mut limits: BTreeMap<String, u64> = BTreeMap::new();
    let Some(root) = identity::cgroup2_mount() else {
        return limits;
    };
    let dir = root.join(cgroup.name.trim_start_matches('/'));
    for d in dir.ancestors().take_while(|d| d.starts_with(&root)) {
        let Ok(text) = std::fs::read_to_string(d.join("rdma.max")) else {
            continue;
        };
        for (device, objects) in parse_rdma_max(&text) {
            let l = limits.entry(device).or_insert(objects);
            *l = (*l).min(objects);
        }
    }
    limits
}

/// `rdma.max` lines: "rxe0 hca_handle=max hca_object=100"; the devices
/// with a finite `hca_object`.
fn parse_rdma_max(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let device = words.next()?;
            let objects = words
                .find_map(|w| w.strip_prefix("hca_object="))?
                .parse()
                .ok()?;
            Some((device.to_string(), objects))
        })
        .collect()
}

/// What `policy check` and `attach` say of the tenants' bounds: per
/// `cgroup` rule, its `rdma.max` on `devices` (every device named, when
/// none is given), and a warning where it is unlimited, or where the
/// limits add up to more than `capacity` (when known).
pub fn tenant_bounds(
    policy: &Policy,
    devices: &[String],
    capacity: Option<u32>,
) -> (Vec<String>, Vec<String>) {
    let (mut lines, mut warnings) = (Vec::new(), Vec::new());
    // Each tenant's own device has a table of its own: no tenant fills
    // another's, whatever its limit.
    if policy.gives_devices() || policy.owner.is_some() {
        return (lines, warnings);
    }
    let mut total = 0u64;
    let mut unbounded = false;
    for (i, rule) in policy.binds.iter().enumerate() {
        let Some(cgroup) = &rule.cgroup else {
            // A boundary by ids or namespace: its tenants' processes may sit
            // in any cgroup, so no one limit bounds them.
            if rule.beats_entries() {
                unbounded = true;
                warnings.push(format!(
                    "bind[{i}] (line {}): a tenant bound by {} has no rdma.max limit pkeyfw can check (its processes may run in any cgroup): it can create QPs until the QP-creation probe's table is full, and every later QP a rule binds is quarantined; run its processes in a cgroup with an rdma.max hca_object limit, or bind it by that cgroup",
                    rule.line,
                    rule.tenant()
                ));
            }
            continue;
        };
        let limits = rdma_limits(cgroup);
        let relevant: Vec<(&String, &u64)> = limits
            .iter()
            .filter(|(d, _)| devices.is_empty() || devices.contains(d))
            .collect();
        // Every device bounded (any, when none is named).
        let covered = match devices {
            [] => !limits.is_empty(),
            _ => devices.iter().all(|d| limits.contains_key(d)),
        };
        if covered {
            let text: Vec<String> = relevant
                .iter()
                .map(|(d, n)| format!("{d} hca_object={n}"))
                .collect();
            total += relevant.iter().map(|(_, n)| **n).sum::<u64>();
            lines.push(format!(
                "bind[{i}] (line {}): cgroup {}: rdma.max {}",
                rule.line,
                cgroup.name,
                text.join(", ")
            ));
        } else {
            unbounded = true;
            warnings.push(format!(
                "bind[{i}] (line {}): cgroup {} has no rdma.max hca_object limit{}: its tenants can create QPs until the QP-creation probe's table is full, and every later QP a rule binds is quarantined (set one, e.g. `echo \"rxe0 hca_object=1024\" > {}/rdma.max`)",
                rule.line,
                cgroup.name,
                if devices.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", devices.join(", "))
                },
                cgroup.path.display()
            ));
        }
    }
    if let Some(capacity) = capacity
        && !unbounded
        && total > u64::from(capacity)
    {
        warnings.push(format!(
            "the cgroup rules' rdma.max limits add up to {total} QPs, more than the {capacity} the QP-creation probe's table holds: tenants at their limits quarantine each other's new QPs"
        ));
    }
    (lines, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rdma_max_as_the_kernel_writes_it() {
        let text = "rxe0 hca_handle=max hca_object=100\nrxe1 hca_handle=2 hca_object=max\nmlx5_0 hca_handle=max hca_object=7\n";
        assert_eq!(
            parse_rdma_max(text),
            vec![("rxe0".to_string(), 100), ("mlx5_0".to_string(), 7)]
        );
        assert!(parse_rdma_max("").is_empty());
    }
}
