//! What the kernel says about interfaces (rtnetlink): RTM_GETLINK's
//! IFLA_XDP, the source of truth for the XDP mode and for whether a program
//! is attached at all; RTM_GETTFILTER for the clsact filters that no link
//! holds (kernels before 6.6); every link, and the links as they change, for
//! the bridges switch ports are in; and the changes that give a tenant a
//! network device of its own (see [`crate::control::tenancy`]): links,
//! addresses, routes and routing rules made and removed.

use anyhow::{Context as _, Result, bail};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
    rule::RuleMessage,
    tc::{TcAttribute, TcFilterBpfOption, TcMessage, TcOption},
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
    let mut link = LinkMessage::default();
    link.header.index = index;
    let socket = request(RouteNetlinkMessage::GetLink(link), 0, "RTM_GETLINK")?;
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

/// A BPF classifier under an interface's clsact qdisc: what deleting it
/// takes (`tc filter del … prio P handle H bpf`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BpfFilter {
    pub priority: u16,
    pub handle: u32,
    pub prog_id: u32,
}

/// The BPF classifiers named `program` under interface `index`'s clsact
/// hook `parent` (RTM_GETTFILTER dump); none when it has no clsact qdisc.
pub fn bpf_filters(index: u32, parent: u32, program: &str) -> Result<Vec<BpfFilter>> {
    let mut filter = TcMessage::default();
    filter.header.index = index as i32;
    filter.header.parent = parent.into();
    let replies = dump(
        RouteNetlinkMessage::GetTrafficFilter(filter),
        "RTM_GETTFILTER",
    )
    .with_context(|| format!("RTM_GETTFILTER for interface {index}"))?;
    Ok(replies
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewTrafficFilter(m) => named(m, program),
            _ => None,
        })
        .collect())
}

/// Every interface of this network namespace (RTM_GETLINK dump).
pub fn links() -> Result<Vec<LinkMessage>> {
    let replies = dump(
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        "RTM_GETLINK",
    )?;
    Ok(replies
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) => Some(link),
            _ => None,
        })
        .collect())
}

/// A route netlink socket of this network namespace that receives every
/// RTM_NEWLINK and RTM_DELLINK (RTNLGRP_LINK), non-blocking; read it with
/// [`link_changes`].
pub fn link_watch() -> Result<Socket> {
    let mut socket = Socket::new(NETLINK_ROUTE).context("netlink socket")?;
    socket.bind_auto()?;
    socket
        .add_membership(libc::RTNLGRP_LINK)
        .context("joining RTNLGRP_LINK")?;
    socket.set_non_blocking(true)?;
    Ok(socket)
}

/// The links a datagram of [`link_watch`]'s announces, as they are now
/// (RTM_NEWLINK; a deleted one is not a member of anything).
pub fn link_changes(datagram: &[u8]) -> Result<Vec<LinkMessage>> {
    Ok(messages(datagram)
        .context("decoding an RTM_NEWLINK")?
        .into_iter()
        .filter_map(|m| match m.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => Some(link),
            _ => None,
        })
        .collect())
}

/// The routing rules of `family` (RTM_GETRULE dump), in the order the
/// kernel consults them.
pub fn rules(family: AddressFamily) -> Result<Vec<RuleMessage>> {
    let mut rule = RuleMessage::default();
    rule.header.family = family;
    Ok(dump(RouteNetlinkMessage::GetRule(rule), "RTM_GETRULE")?
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewRule(r) => Some(r),
            _ => None,
        })
        .collect())
}

/// The addresses of interface `index` (RTM_GETADDR dump).
pub fn addresses(index: u32) -> Result<Vec<std::net::IpAddr>> {
    let replies = dump(
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        "RTM_GETADDR",
    )?;
    Ok(replies
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) if a.header.index == index => {
                a.attributes.into_iter().find_map(|a| match a {
                    AddressAttribute::Local(ip) => Some(ip),
                    AddressAttribute::Address(ip) if ip.is_ipv6() => Some(ip),
                    _ => None,
                })
            }
            _ => None,
        })
        .collect())
}

/// Makes what `message` describes (a link, an address, a route, a rule:
/// NLM_F_CREATE | NLM_F_EXCL), or says why the kernel would not.
pub fn create(message: RouteNetlinkMessage, what: &str) -> Result<()> {
    acked(message, NLM_F_CREATE | NLM_F_EXCL, what)
}

/// Sends a change (a removal, a link's settings) and waits for the
/// kernel's answer.
pub fn change(message: RouteNetlinkMessage, what: &str) -> Result<()> {
    acked(message, 0, what)
}

/// Sends `message` with NLM_F_ACK and `flags`; the kernel's error, if any,
/// as an `io::Error` (so that callers can tell ENOENT and EEXIST).
fn acked(message: RouteNetlinkMessage, flags: u16, what: &str) -> Result<()> {
    let socket = request(message, NLM_F_ACK | flags, "a route netlink request")
        .with_context(|| what.to_string())?;
    loop {
        let (reply, _) = socket
            .recv_from_full()
            .with_context(|| format!("{what}: the kernel's answer"))?;
        for message in messages(&reply).with_context(|| format!("{what}: decoding the answer"))? {
            if let NetlinkPayload::Error(e) = message.payload {
                return match e.code {
                    None => Ok(()),
                    Some(_) => Err(anyhow::Error::new(e.to_io()).context(what.to_string())),
                };
            }
        }
    }
}

/// The replies to a dump request (`what` names it in errors).
fn dump(message: RouteNetlinkMessage, what: &'static str) -> Result<Vec<RouteNetlinkMessage>> {
    let socket = request(message, NLM_F_DUMP, what)?;
    let mut found = Vec::new();
    loop {
        let (reply, _) = socket
            .recv_from_full()
            .with_context(|| format!("{what} reply"))?;
        let decoded = messages(&reply).with_context(|| format!("decoding the {what} reply"))?;
        for message in decoded {
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(e) => bail!("{what}: {e}"),
                NetlinkPayload::InnerMessage(m) => found.push(m),
                _ => {}
            }
        }
    }
}

/// The messages of one netlink datagram.
fn messages(datagram: &[u8]) -> Result<Vec<NetlinkMessage<RouteNetlinkMessage>>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < datagram.len() {
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&datagram[at..])?;
        let length = message.header.length as usize;
        out.push(message);
        if length == 0 {
            break;
        }
        at += length;
    }
    Ok(out)
}

/// A route netlink socket on which `message` was sent, with
/// NLM_F_REQUEST and `flags`; `what` names it in errors.
fn request(message: RouteNetlinkMessage, flags: u16, what: &'static str) -> Result<Socket> {
    let mut socket = Socket::new(NETLINK_ROUTE).context("netlink socket")?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    let mut request = NetlinkMessage::new(header, NetlinkPayload::from(message));
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0).context(what)?;
    Ok(socket)
}

/// The filter `m`, if it is a BPF classifier running `program`.
fn named(m: &TcMessage, program: &str) -> Option<BpfFilter> {
    let options = m.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(o) => Some(o),
        _ => None,
    })?;
    let bpf = || {
        options.iter().filter_map(|o| match o {
            TcOption::Bpf(b) => Some(b),
            _ => None,
        })
    };
    let name = bpf().find_map(|b| match b {
        TcFilterBpfOption::ProgName(name) => Some(name),
        _ => None,
    })?;
    if name != program {
        return None;
    }
    let prog_id = bpf()
        .find_map(|b| match b {
            TcFilterBpfOption::ProgId(id) => Some(*id),
            _ => None,
        })
        .unwrap_or(0);
    Some(BpfFilter {
        priority: (m.header.info >> 16) as u16,
        handle: m.header.handle.into(),
        prog_id,
    })
}
