//! What a tenant host made, noted beside its pins (`Pins::tenant_host`), so
//! that `detach`, `reload`, a replacing attach, `stats`, `qps` and the
//! metrics find each tenant's device and port.

use std::path::Path;

use crate::{
    host::netns::NetnsId,
    loading::pins::{self, Pins},
    policy::OwnDevice,
};

/// What a tenant host made, noted beside its pins.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The tenants' devices, in the policy's order.
    pub devices: Vec<Tenant>,
    /// The uplink's `arp_ignore` before the first attach made it 1.
    pub arp_ignore: Option<String>,
}

/// A tenant's device, and whose it is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tenant {
    #[serde(flatten)]
    pub made: Made,
    /// The key its rule gives, and the rule's line.
    pub pkey: u16,
    pub line: usize,
}

/// A tenant's device as made: what `stats`, its port and its removal need.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Made {
    /// The soft-RoCE device and its network device.
    pub device: String,
    pub iface: String,
    /// The network device's index and MAC, and its routing table.
    pub ifindex: u32,
    pub mac: String,
    pub table: u32,
    pub addrs: Vec<String>,
}

impl Made {
    /// `dev` as noted before it is made, so that whatever of it an attach
    /// killed on the way leaves is removed: its names and addresses (what
    /// removing it and keeping it go by), no index, MAC or table yet.
    pub fn pending(dev: &OwnDevice) -> Made {
        Made {
            device: dev.name.clone(),
            iface: dev.iface.clone(),
            ifindex: 0,
            mac: String::new(),
            table: 0,
            addrs: dev.addrs.iter().map(ToString::to_string).collect(),
        }
    }
}

/// The tenant host on `uplink` (in this network namespace) and what it
/// noted, if there is one.
pub fn host(uplink: &str) -> Option<(Pins, Record)> {
    let pins = Pins::tenant_host(uplink);
    if !pins.exists() {
        return None;
    }
    let record = pins.tenants().unwrap_or_default();
    Some((pins, record))
}

/// Every tenant host, of every network namespace: its pins (whose netns
/// and iface name it) and what it noted.
pub fn everywhere() -> Vec<(Pins, Record)> {
    let root = Path::new(pins::BPFFS).join("pkeyfw/tenants");
    let mut found = Vec::new();
    for space in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let Ok(id) = space.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        for uplink in std::fs::read_dir(space.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let pins = Pins::tenant_host_at(&uplink.file_name().to_string_lossy(), NetnsId(id));
            let record = pins.tenants().unwrap_or_default();
            found.push((pins, record));
        }
    }
    found
}

/// The tenant device whose port is `iface` of network namespace `netns`,
/// and its uplink, if it is one.
pub fn port_of(iface: &str, netns: NetnsId) -> Option<(String, Tenant)> {
    everywhere()
        .into_iter()
        .filter(|(p, _)| p.netns == netns)
        .find_map(|(p, r)| {
            let t = r.devices.into_iter().find(|t| t.made.iface == iface)?;
            Some((p.iface, t))
        })
}
