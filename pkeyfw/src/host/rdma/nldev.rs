//! The RDMA netlink device protocol ("nldev", include/uapi/rdma/rdma_netlink.h
//! and drivers/infiniband/core/nldev.c): dump requests, and the attributes
//! pkeyfw reads from the replies. Pure functions over byte buffers, so that
//! every layout is tested here without an RDMA device.
//!
//! nldev messages have no family header: the netlink header is followed
//! directly by attributes, in host byte order. Each resource dump message
//! repeats the device's index and name and holds one table attribute
//! (`RES_QP`, `RES_CM_ID`) of entry attributes; a long table continues in the
//! next message of the dump.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLA_HEADER_SIZE, NetlinkDeserializable, NetlinkHeader,
    NetlinkSerializable, NlasIterator, parse_u8, parse_u16, parse_u32,
};

use super::{CmId, CmListener, IbQpType, Qp, QpState};

/// `RDMA_NL_NLDEV`: the netlink client id of nldev.
const CLIENT: u16 = 5;

/// `enum rdma_nldev_command` values pkeyfw sends.
pub mod command {
    /// Devices (`rdma dev`).
    pub const GET: u16 = 1;
    /// Ports of one device (`rdma link`).
    pub const PORT_GET: u16 = 5;
    /// QPs of one device (`rdma resource show qp`).
    pub const RES_QP_GET: u16 = 10;
    /// rdma_cm IDs of one device (`rdma resource show cm_id`).
    pub const RES_CM_ID_GET: u16 = 11;
    /// A device's settings, its network namespace among them (`rdma dev
    /// set`).
    pub const SET: u16 = 2;
    /// A soft device on a network device (`rdma link add`).
    pub const NEWLINK: u16 = 3;
    /// Removes one (`rdma link delete`).
    pub const DELLINK: u16 = 4;
    /// The subsystem's settings (`rdma system`).
    pub const SYS_GET: u16 = 6;
}

/// `enum rdma_nldev_attr` values pkeyfw reads (ABI: fixed numbers).
pub mod attr {
    pub const DEV_INDEX: u16 = 1;
    pub const DEV_NAME: u16 = 2;
    pub const PORT_INDEX: u16 = 3;
    pub const RES_QP: u16 = 19;
    pub const RES_QP_ENTRY: u16 = 20;
    pub const RES_LQPN: u16 = 21;
    pub const RES_RQPN: u16 = 22;
    pub const RES_TYPE: u16 = 26;
    pub const RES_STATE: u16 = 27;
    pub const RES_PID: u16 = 28;
    pub const RES_KERN_NAME: u16 = 29;
    pub const RES_CM_ID: u16 = 30;
    pub const RES_CM_ID_ENTRY: u16 = 31;
    pub const RES_PS: u16 = 32;
    pub const RES_SRC_ADDR: u16 = 33;
    pub const RES_DST_ADDR: u16 = 34;
    pub const NDEV_INDEX: u16 = 50;
    pub const NDEV_NAME: u16 = 51;
    pub const LINK_TYPE: u16 = 65;
    pub const SYS_NETNS_MODE: u16 = 66;
    pub const NET_NS_FD: u16 = 68;
}

/// `AF_INET` and `AF_INET6`, as `sa_family_t` in a sockaddr.
const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

/// `RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)`: the netlink message type.
pub const fn message_type(command: u16) -> u16 {
    (CLIENT << 10) + command
}

/// A dump request: every object of a kind, of one device or of all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub command: u16,
    /// `DEV_INDEX`: required by every dump but the device list.
    pub device: Option<u32>,
}

impl Request {
    fn attrs(&self) -> Vec<DefaultNla> {
        self.device
            .map(|d| DefaultNla::new(attr::DEV_INDEX, d.to_ne_bytes().to_vec()))
            .into_iter()
            .collect()
    }
}

impl NetlinkSerializable for Request {
    fn message_type(&self) -> u16 {
        message_type(self.command)
    }

    fn buffer_len(&self) -> usize {
        self.attrs().as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        self.attrs().as_slice().emit(buffer)
    }
}

/// A request that is no dump: a command and its attributes, each as the
/// kernel's policy types it (strings NUL-terminated, numbers in host
/// order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doit {
    pub command: u16,
    pub attrs: Vec<(u16, Vec<u8>)>,
}

impl Doit {
    pub fn new(command: u16) -> Doit {
        Doit {
            command,
            attrs: Vec::new(),
        }
    }

    pub fn u32(mut self, kind: u16, value: u32) -> Doit {
        self.attrs.push((kind, value.to_ne_bytes().to_vec()));
        self
    }

    /// A NUL-terminated string (`NLA_NUL_STRING`).
    pub fn string(mut self, kind: u16, value: &str) -> Doit {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.attrs.push((kind, bytes));
        self
    }

    fn nlas(&self) -> Vec<DefaultNla> {
        self.attrs
            .iter()
            .map(|(kind, value)| DefaultNla::new(*kind, value.clone()))
            .collect()
    }
}

impl NetlinkSerializable for Doit {
    fn message_type(&self) -> u16 {
        message_type(self.command)
    }

    fn buffer_len(&self) -> usize {
        self.nlas().as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        self.nlas().as_slice().emit(buffer)
    }
}

/// One reply message: its command and its undecoded attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub command: u16,
    pub attrs: Vec<u8>,
}

impl NetlinkDeserializable for Reply {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Reply, DecodeError> {
        if header.message_type >> 10 != CLIENT {
            return Err(format!("message type {:#x} is not nldev", header.message_type).into());
        }
        Ok(Reply {
            command: header.message_type & 0x3ff,
            attrs: payload.to_vec(),
        })
    }
}

/// The attributes of one nesting level, in order, by type without the
/// nested and byte-order flags.
struct Attrs<'a>(Vec<(u16, &'a [u8])>);

impl<'a> Attrs<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Attrs<'a>, DecodeError> {
        NlasIterator::new(bytes)
            .map(|nla| {
                nla.map(|nla| {
                    let (kind, end) = (nla.kind(), nla.length() as usize);
                    (kind, &nla.into_inner()[NLA_HEADER_SIZE..end])
                })
            })
            .collect::<Result<_, _>>()
            .map(Attrs)
    }

    /// The value of `kind`; the last one if repeated, as the kernel's
    /// `nla_parse` keeps.
    fn get(&self, kind: u16) -> Option<&'a [u8]> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| *v)
    }

    /// Every value of `kind`, in order: the entries of a table.
    fn all(&self, kind: u16) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.0
            .iter()
            .filter(move |(k, _)| *k == kind)
            .map(|(_, v)| *v)
    }

    fn u32(&self, kind: u16) -> Result<Option<u32>, DecodeError> {
        self.get(kind).map(parse_u32).transpose()
    }

    fn u8(&self, kind: u16) -> Result<Option<u8>, DecodeError> {
        self.get(kind).map(parse_u8).transpose()
    }

    /// A NUL-terminated string.
    fn string(&self, kind: u16) -> Option<String> {
        self.get(kind).map(|v| {
            let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
            String::from_utf8_lossy(&v[..end]).into_owned()
        })
    }

    fn need_u32(&self, kind: u16, what: &str) -> Result<u32, DecodeError> {
        self.u32(kind)?
            .ok_or_else(|| format!("no {what} attribute").into())
    }

    fn need_u8(&self, kind: u16, what: &str) -> Result<u8, DecodeError> {
        self.u8(kind)?
            .ok_or_else(|| format!("no {what} attribute").into())
    }

    fn need_string(&self, kind: u16, what: &str) -> Result<String, DecodeError> {
        self.string(kind)
            .ok_or_else(|| format!("no {what} attribute").into())
    }
}

/// An RDMA device, from the device list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    /// Its last port number (`PORT_INDEX` means that in `CMD_GET`); ports
    /// count from 1.
    pub ports: u32,
}

/// A port and the index of the network device it is bound to, if that is
/// in this network namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    pub port: u32,
    pub netdev: Option<u32>,
}

/// A `CMD_GET` reply.
pub fn device(attrs: &[u8]) -> Result<DeviceInfo, DecodeError> {
    let a = Attrs::parse(attrs)?;
    Ok(DeviceInfo {
        index: a.need_u32(attr::DEV_INDEX, "DEV_INDEX")?,
        name: a.need_string(attr::DEV_NAME, "DEV_NAME")?,
        ports: a.need_u32(attr::PORT_INDEX, "PORT_INDEX")?,
    })
}

/// Whether a `CMD_SYS_GET` reply says the subsystem is in exclusive
/// network-namespace mode (`SYS_NETNS_MODE` 0; 1 is shared).
pub fn netns_exclusive(attrs: &[u8]) -> Result<bool, DecodeError> {
    Ok(Attrs::parse(attrs)?.need_u8(attr::SYS_NETNS_MODE, "SYS_NETNS_MODE")? == 0)
}

/// A `CMD_PORT_GET` reply.
pub fn port(attrs: &[u8]) -> Result<PortInfo, DecodeError> {
    let a = Attrs::parse(attrs)?;
    Ok(PortInfo {
        port: a.need_u32(attr::PORT_INDEX, "PORT_INDEX")?,
        netdev: a.u32(attr::NDEV_INDEX)?,
    })
}

/// The entries of a resource table message: the device's name and the raw
/// entries of `table`.
fn table<'a>(
    a: &Attrs<'a>,
    table: u16,
    entry: u16,
) -> Result<(String, Vec<Attrs<'a>>), DecodeError> {
    let name = a.need_string(attr::DEV_NAME, "DEV_NAME")?;
    let entries = match a.get(table) {
        Some(t) => Attrs::parse(t)?
            .all(entry)
            .map(Attrs::parse)
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    Ok((name, entries))
}

/// The QPs of a `CMD_RES_QP_GET` reply. `comm` is the kernel's name for
/// kernel QPs and left empty for user QPs (the kernel sends only the PID).
pub fn qps(attrs: &[u8]) -> Result<Vec<Qp>, DecodeError> {
    let a = Attrs::parse(attrs)?;
    let (device, entries) = table(&a, attr::RES_QP, attr::RES_QP_ENTRY)?;
    entries
        .iter()
        .map(|e| {
            let kern_name = e.string(attr::RES_KERN_NAME);
            Ok(Qp {
                device: device.clone(),
                device_index: 0,
                port: e.u32(attr::PORT_INDEX)?,
                qpn: e.need_u32(attr::RES_LQPN, "RES_LQPN")?,
                // 0 until an RC or UC QP is connected: no peer yet.
                remote_qpn: e.u32(attr::RES_RQPN)?.filter(|&q| q != 0),
                qp_type: IbQpType::from(e.need_u8(attr::RES_TYPE, "RES_TYPE")?),
                state: QpState::from(e.need_u8(attr::RES_STATE, "RES_STATE")?),
                // 0 when the owner is a zombie (older kernels still send it).
                pid: e.u32(attr::RES_PID)?.filter(|&p| p != 0),
                kernel: kern_name.is_some(),
                comm: kern_name,
                maker: super::Maker::Unasked,
                local: None,
                peer: None,
            })
        })
        .collect()
}

/// The rdma_cm IDs of a `CMD_RES_CM_ID_GET` reply that have a QP.
pub fn cm_ids(attrs: &[u8]) -> Result<Vec<CmId>, DecodeError> {
    let a = Attrs::parse(attrs)?;
    let (_, entries) = table(&a, attr::RES_CM_ID, attr::RES_CM_ID_ENTRY)?;
    let mut ids = Vec::new();
    for e in &entries {
        // Listening and unconnected IDs have no QP.
        let Some(qpn) = e.u32(attr::RES_LQPN)? else {
            continue;
        };
        ids.push(CmId {
            qpn,
            local: e.get(attr::RES_SRC_ADDR).and_then(sockaddr),
            peer: e.get(attr::RES_DST_ADDR).and_then(sockaddr),
        });
    }
    Ok(ids)
}

/// The listening rdma_cm IDs of a `CMD_RES_CM_ID_GET` reply: a listener's
/// own, bound to a device, or one a wildcard listener made on the device
/// (which names its process or kernel user).
pub fn listeners(attrs: &[u8]) -> Result<Vec<CmListener>, DecodeError> {
    /// `RDMA_CM_LISTEN` of `enum rdma_cm_state`.
    const LISTEN: u8 = 8;
    let a = Attrs::parse(attrs)?;
    let (_, entries) = table(&a, attr::RES_CM_ID, attr::RES_CM_ID_ENTRY)?;
    let mut found = Vec::new();
    for e in &entries {
        if e.u8(attr::RES_STATE)? != Some(LISTEN) {
            continue;
        }
        let Some(addr) = e.get(attr::RES_SRC_ADDR).and_then(sockaddr) else {
            continue;
        };
        found.push(CmListener {
            ps: e.need_u32(attr::RES_PS, "RES_PS")?,
            addr,
            pid: e.u32(attr::RES_PID)?.filter(|&p| p != 0),
            kernel: e.string(attr::RES_KERN_NAME).is_some(),
        });
    }
    Ok(found)
}

/// An IPv4 or IPv6 `struct sockaddr_storage` (family in host order, port and
/// address in network order); None for other families (AF_IB).
pub fn sockaddr(bytes: &[u8]) -> Option<SocketAddr> {
    let family = parse_u16(bytes.get(0..2)?).ok()?;
    let port = u16::from_be_bytes(bytes.get(2..4)?.try_into().ok()?);
    let ip = match family {
        AF_INET => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes.get(4..8)?).ok()?)),
        // sin6_flowinfo sits between the port and the address.
        AF_INET6 => IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes.get(8..24)?).ok()?,
        )),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}
