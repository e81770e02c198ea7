//! The rdma_cm listeners the listen probe did not see start: those that
//! were listening before any probe ran (an NVMe over Fabrics target set up
//! at boot, a server started before pkeyfw), recorded from RDMA netlink and
//! `/proc` as their owners are now, as QPs made before the probes are; and
//! those it found no room for. Until every listener that exists is
//! recorded, a request no recorded listener answers is refused
//! (`cm_state::UNRECORDED`), as a QP the probes cannot bind is quarantined.

use std::collections::BTreeSet;

use anyhow::Result;
use pkeyfw_common::abi::{Creation, ListenKey, family};

use crate::{host::rdma, loading::maps::Maps};

/// Records the listeners of interface `ifindex`'s devices that have no
/// record, and says whether any is left without one; a line for each.
pub fn reconcile(maps: &mut Maps, ifindex: u32) -> Result<Vec<String>> {
    let before = maps.unrecorded_listeners()?;
    let devices = rdma::devices_on(ifindex)?;
    let listeners = rdma::listeners_of(&devices)?;
    let recorded: BTreeSet<ListenKey> = maps.listeners()?.into_iter().map(|(k, _)| k).collect();
    let (mut lines, mut unrecorded) = (Vec::new(), 0);
    for l in listeners.iter().filter(|l| !recorded.contains(&l.key)) {
        let what = describe(&l.key);
        match &l.creation {
            Some(c) if maps.record_listener(&l.key, c)? => lines.push(format!(
                "pkeyfw: recorded the rdma_cm listener on {what}, listening before the probes ran, as {}",
                owner(c)
            )),
            // One recorded meanwhile, by the probe.
            Some(_) if maps.listeners()?.iter().any(|(k, _)| *k == l.key) => {}
            Some(_) => {
                unrecorded += 1;
                lines.push(format!(
                    "pkeyfw: no room to record the rdma_cm listener on {what}: requests no recorded listener answers are refused"
                ));
            }
            None => {
                unrecorded += 1;
                lines.push(format!(
                    "pkeyfw: who made the rdma_cm listener on {what} cannot be read (its process is gone): requests no recorded listener answers are refused until it is"
                ));
            }
        }
    }
    // A listener the probe failed to record since the count was read is
    // left to the next reconciliation.
    if maps.unrecorded_listeners()? == before {
        maps.set_unrecorded_listeners(unrecorded)?;
    }
    Ok(lines)
}

/// `tcp port 4420 at 192.0.2.2`, `udp port 7174 at any address`.
fn describe(key: &ListenKey) -> String {
    let space = match key.service_id >> 16 & 0xffff {
        0x0106 => "tcp",
        0x0111 => "udp",
        0x013f => "ib",
        0x0002 => "ipoib",
        _ => "rdma_cm",
    };
    let at = match key.family {
        _ if key.addr == [0; 16] => "any address".to_string(),
        family::INET => std::net::Ipv6Addr::from(key.addr)
            .to_ipv4_mapped()
            .map_or_else(|| "?".into(), |a| a.to_string()),
        _ => std::net::Ipv6Addr::from(key.addr).to_string(),
    };
    format!("{space} port {} at {at}", key.service_id & 0xffff)
}

/// Who a record names.
fn owner(c: &Creation) -> String {
    if c.kernel != 0 {
        return "a kernel user's (rdma_cm)".into();
    }
    let end = c.comm.iter().position(|&b| b == 0).unwrap_or(c.comm.len());
    let comm = String::from_utf8_lossy(&c.comm[..end]);
    format!(
        "process {} {} (uid {})",
        c.pid,
        crate::reporting::describe::name(&comm),
        c.uid
    )
}
