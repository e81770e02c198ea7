//! An interface's identity: its name, index and namespace, and the port
//! GUID RoCE derives from its MAC (looked up through
//! [`netlink`](super::netlink)), resolved once and passed down.

use anyhow::Result;

use super::netlink;

/// An interface, looked up once, in its namespace.
pub struct Iface {
    pub name: String,
    pub index: u32,
    /// The namespace as the caller named it, for messages.
    pub netns: Option<String>,
    /// Its port GUID, the EUI-64 of its MAC (as RoCE derives its GID).
    pub guid: u64,
}

impl Iface {
    /// `name` in this thread's network namespace, which the caller knows
    /// as `netns`.
    pub fn resolve(name: &str, netns: Option<&str>) -> Result<Iface> {
        let index = netlink::if_index(name)?;
        Ok(Iface {
            name: name.to_string(),
            index,
            netns: netns.map(str::to_string),
            guid: guid_from_mac(netlink::mac_address(index)?),
        })
    }
}

/// The EUI-64 port GUID of an interface in this network namespace.
pub fn guid(iface: &str) -> Result<u64> {
    Ok(Iface::resolve(iface, None)?.guid)
}

/// The port GUID RoCE derives from a MAC (the GID's interface ID, EUI-64):
/// flip the universal/local bit and insert ff:fe in the middle.
fn guid_from_mac(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}
