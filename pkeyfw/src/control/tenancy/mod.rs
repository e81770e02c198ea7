//! Devices of their own for a host's tenants (`own_device`): for each, a
//! soft-RoCE device on a network device of its own ([`net`]), which only
//! its tenant opens ([`guard`]). Two tenants' QPs then meet only as frames
//! that leave one rdma_rxe device and enter another through the network
//! stack, where each device's port judges and stamps them; on one shared
//! device they would meet inside rdma_rxe, unjudged.
//!
//! rdma_rxe cannot leave the initial network namespace before Linux 7.x,
//! and a tenant bound by cgroup or ids runs in the host's: its device, and
//! the address rdma_cm resolves to it, live there on every kernel.

pub mod guard;
mod net;

use std::net::IpAddr;

use anyhow::{Context as _, Result, bail};

use crate::{
    host::{netlink, rdma},
    loading::pins::record::Made,
    policy::OwnDevice,
};

pub use net::TABLES;

/// Makes `dev` on the uplink numbered `uplink`: its interface, then its
/// soft-RoCE device on it. On a failure nothing of it is left.
pub fn make(dev: &OwnDevice, uplink: u32) -> Result<Made> {
    let ifindex = net::make(dev, uplink)?;
    if let Err(e) = rdma::link::add_rxe(&dev.name, &dev.iface) {
        let _ = net::remove(&dev.iface);
        return Err(e);
    }
    made(dev, ifindex)
}

fn made(dev: &OwnDevice, ifindex: u32) -> Result<Made> {
    let mac = netlink::mac_address(ifindex)?;
    Ok(Made {
        device: dev.name.clone(),
        iface: dev.iface.clone(),
        ifindex,
        mac: mac.map(|b| format!("{b:02x}")).join(":"),
        table: net::table_of(ifindex),
        addrs: dev.addrs.iter().map(ToString::to_string).collect(),
    })
}

/// `dev` as an earlier attach made it on the uplink numbered `uplink`, to
/// be kept (its QPs live on): None if neither its interface nor its
/// device exists. Refused where a name is taken by something else, or the
/// interface's addresses are not the policy's any more.
pub fn existing(dev: &OwnDevice, uplink: u32) -> Result<Option<Made>> {
    let found = rdma::link::index_of(&dev.name)?;
    if !net::is_tenant_link(&dev.iface, uplink)? {
        if netlink::if_index(&dev.iface).is_ok() {
            bail!(
                "interface {} exists and is no tenant device's interface on this uplink (a macvlan of it); rename it or choose another name",
                dev.iface
            );
        }
        if found.is_some() {
            bail!(
                "RDMA device {} exists on another interface; remove it (`rdma link delete {}`) or choose another name",
                dev.name,
                dev.name
            );
        }
        return Ok(None);
    }
    let ifindex = netlink::if_index(&dev.iface)?;
    let on_it = rdma::devices_on(ifindex)?;
    match found {
        Some(_) if on_it.iter().any(|d| d.name == dev.name) => {}
        Some(_) => bail!(
            "RDMA device {} exists on another interface than {}; remove it (`rdma link delete {}`)",
            dev.name,
            dev.iface,
            dev.name
        ),
        None => rdma::link::add_rxe(&dev.name, &dev.iface)?,
    }
    let have = addresses(ifindex)?;
    for p in &dev.addrs {
        if !have.contains(&p.addr) {
            bail!(
                "{} has not its address {} any more: the policy changed it, or something removed it; detach and attach to make its device anew",
                dev.iface,
                p.addr
            );
        }
    }
    made(dev, ifindex).map(Some)
}

/// The addresses on interface `index`.
fn addresses(index: u32) -> Result<Vec<IpAddr>> {
    netlink::addresses(index)
}

/// Removes a tenant's device and its interface (with its addresses,
/// routes and rules). What is gone already is no error.
pub fn remove(device: &str, iface: &str) -> Result<()> {
    if let Some(index) = rdma::link::index_of(device)? {
        rdma::link::delete(index).with_context(|| format!("removing RDMA device {device}"))?;
    }
    net::remove(iface)
}

/// Puts the local table's routing rules back where Linux keeps them once no
/// tenant's is left ahead of them (an attach moved them).
pub fn restore_routing() -> Result<()> {
    net::restore_local_rules()
}

/// What a host needs before it gives tenants devices: an uplink with no
/// RDMA device of its own (its device would list every tenant's address
/// among its GIDs, its upper devices' as a RoCE NIC's does, and rdma_cm
/// would take tenants' addresses for it), and soft-RoCE.
pub fn check_uplink(uplink: &str, index: u32) -> Result<()> {
    let own = rdma::devices_on(index)?;
    if let Some(d) = own.first() {
        bail!(
            "{uplink} carries RDMA device {} of its own: with devices per tenant, the tenants' addresses are its upper devices', which it would list among its GIDs, and rdma_cm would resolve a tenant's address to it; remove it (`rdma link delete {}`) — pkeyfw gives every tenant a device on {uplink}",
            d.name,
            d.name
        );
    }
    if !std::path::Path::new("/sys/module/rdma_rxe").exists() {
        bail!(
            "rdma_rxe is not loaded (`modprobe rdma_rxe`): the tenants' devices are soft-RoCE devices"
        );
    }
    Ok(())
}

/// The uplink's `arp_ignore`, to be put back at the end.
pub fn uplink_arp_ignore(uplink: &str) -> Result<String> {
    net::read_sysctl(&format!("ipv4/conf/{uplink}/arp_ignore"))
}

/// Makes the uplink, whose `arp_ignore` is `old`, answer ARP only for its
/// own addresses (else it answers for the tenants', which are the host's
/// too).
pub fn quiet_uplink(uplink: &str, old: &str) -> Result<()> {
    if old == "0" {
        net::sysctl(&format!("ipv4/conf/{uplink}/arp_ignore"), "1")?;
    }
    Ok(())
}

/// Puts the uplink's ARP setting back.
pub fn restore_uplink(uplink: &str, old: &str) -> Result<()> {
    if netlink::if_index(uplink).is_err() {
        return Ok(());
    }
    net::sysctl(&format!("ipv4/conf/{uplink}/arp_ignore"), old)
}
