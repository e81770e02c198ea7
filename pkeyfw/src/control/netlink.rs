//! What the kernel says about an interface's XDP attachment (rtnetlink
//! RTM_GETLINK, IFLA_XDP): the source of truth for the mode and for whether
//! a program is attached at all.

use anyhow::{Context as _, Result, bail};
use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// How an XDP program runs on an interface.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (native).
    Native,
    /// In the generic network stack.
    Skb,
    /// Offloaded to the NIC, or several at once.
    Other,
    /// Not XDP: pkeyfw's TC ingress program (`--mode skb`), in the network
    /// stack after GRO, where it sees GSO/GRO super-packets whole.
    Tc,
}

impl XdpMode {
    pub fn name(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Skb => "skb",
            XdpMode::Other => "other",
            XdpMode::Tc => "tc",
        }
    }
}

/// The XDP program attached to an interface, if any.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    pub mode: XdpMode,
    pub prog_id: u32,
}

/// The interface index of `name` in this network namespace.
pub fn if_index(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name).context("interface name")?;
    // SAFETY: a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        bail!("no interface {name} in this network namespace");
    }
    Ok(index)
}

/// The interface's link-layer address (its MAC on Ethernet).
pub fn mac_address(index: u32) -> Result<[u8; 6]> {
    get_link(index)?
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(mac) => <[u8; 6]>::try_from(mac.as_slice()).ok(),
            _ => None,
        })
        .with_context(|| format!("interface {index} has no Ethernet address"))
}

/// RTM_GETLINK for one interface.
fn get_link(index: u32) -> Result<LinkMessage> {
    let mut socket = Socket::new(NETLINK_ROUTE).context("netlink socket")?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;

    let mut link = LinkMessage::default();
    link.header.index = index;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let mut request = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetLink(link)),
    );
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0).context("RTM_GETLINK")?;

    let (reply, _) = socket.recv_from_full().context("RTM_GETLINK reply")?;
    let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply)
        .context("decoding the RTM_GETLINK reply")?;
    match message.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => Ok(link),
        NetlinkPayload::Error(e) => bail!("RTM_GETLINK for interface {index}: {e}"),
        other => bail!("unexpected RTM_GETLINK reply {other:?}"),
    }
}

/// The XDP program attached to interface `index`.
pub fn xdp_attached(index: u32) -> Result<Option<Attached>> {
    let link = get_link(index)?;
    let Some(xdp) = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Xdp(x) => Some(x),
        _ => None,
    }) else {
        return Ok(None);
    };
    let mode = xdp.iter().find_map(|x| match x {
        LinkXdp::Attached(XdpAttached::None) => Some(None),
        LinkXdp::Attached(XdpAttached::Driver) => Some(Some(XdpMode::Native)),
        LinkXdp::Attached(XdpAttached::SocketBuffer) => Some(Some(XdpMode::Skb)),
        LinkXdp::Attached(_) => Some(Some(XdpMode::Other)),
        _ => None,
    });
    let prog_id = xdp.iter().find_map(|x| match x {
        LinkXdp::ProgId(id) => Some(*id),
        _ => None,
    });
    Ok(match (mode.flatten(), prog_id) {
        (Some(mode), Some(prog_id)) => Some(Attached { mode, prog_id }),
        (Some(mode), None) => Some(Attached { mode, prog_id: 0 }),
        _ => None,
    })
}
