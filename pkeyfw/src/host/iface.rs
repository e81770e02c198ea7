//! An interface's identity as RoCE sees it: the port GUID it derives from
//! the interface's MAC (its index and MAC are [`netlink`](super::netlink)'s).

use anyhow::Result;

use super::netlink;

/// The EUI-64 port GUID of an interface in this network namespace.
pub fn guid(iface: &str) -> Result<u64> {
    let mac = netlink::mac_address(netlink::if_index(iface)?)?;
    Ok(guid_from_mac(mac))
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
