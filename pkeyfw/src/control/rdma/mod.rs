//! The RDMA devices bound to an interface and their QPs, as the kernel's
//! RDMA netlink reports them (what `rdma link` and `rdma resource show qp`
//! print): which QPs exist, who owns them, and for rdma_cm connections the
//! addresses at both ends. `[[bind]]` rules bind QPs found here.
//!
//! Which driver runs each device comes from sysfs ([`Driver`]).
//!
//! Each call reads a fresh snapshot in a handful of netlink dumps and
//! returns it sorted, so polling it and comparing results is cheap and
//! stable.

mod driver;
pub mod link;
mod nldev;
mod socket;
pub mod verbs;

use std::{collections::BTreeMap, fmt, net::SocketAddr};

use anyhow::{Context as _, Result};
use pkeyfw_common::abi::QpType;

pub use self::{driver::Driver, socket::NoRdmaNetlink};
use self::{
    nldev::{Request, command},
    socket::Connection,
};

/// An RDMA device with ports bound to the interface asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// The kernel's device index.
    pub index: u32,
    pub name: String,
    /// Its ports bound to the interface.
    pub ports: Vec<u32>,
    /// How many ports it has.
    pub port_count: u32,
    /// Which driver runs it: whether its traffic crosses the interface.
    pub driver: Driver,
}

/// A QP, as RDMA netlink reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Qp {
    /// The RDMA device, e.g. `rxe0`.
    pub device: String,
    /// None until the QP is first moved to INIT.
    pub port: Option<u32>,
    pub qpn: u32,
    /// The connected peer's QPN (RC and UC, once connected).
    pub remote_qpn: Option<u32>,
    pub qp_type: IbQpType,
    pub state: QpState,
    /// The owning process, in our PID namespace (user QPs).
    pub pid: Option<u32>,
    /// The owner's command (`/proc/PID/comm`), or for kernel QPs the name
    /// of the kernel module that made it.
    pub comm: Option<String>,
    /// What `/proc/PID` says of the owning process (user QPs).
    pub owner: Option<Owner>,
    /// Made by the kernel (a ULP or ib_core itself), not by a process.
    pub kernel: bool,
    /// For a QP made through rdma_cm: its local address and port.
    pub local: Option<SocketAddr>,
    /// For a QP made through rdma_cm: the peer's address and port.
    pub peer: Option<SocketAddr>,
}

/// What `[[bind]]` rules match of a QP's owning process, from `/proc/PID`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Effective ids.
    pub uid: u32,
    pub gid: u32,
    /// Network namespace inode number; `None` where `/proc/PID/ns/net`
    /// cannot be read. That takes ptrace access, which a service without
    /// CAP_SYS_PTRACE (the shipped unit) lacks to another user's process:
    /// then a `netns` rule does not match, while the ids and the cgroup,
    /// from files anyone may read, still bind the QP.
    pub netns: Option<u32>,
    /// Its cgroup v2, as `/proc/PID/cgroup` names it ("/a/b").
    pub cgroup: String,
}

/// `enum ib_qp_type`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum IbQpType {
    Smi,
    Gsi,
    Rc,
    Uc,
    Ud,
    RawIpv6,
    RawEthertype,
    RawPacket,
    XrcIni,
    XrcTgt,
    Driver,
    Other(u8),
}

impl From<u8> for IbQpType {
    fn from(v: u8) -> IbQpType {
        match v {
            0 => IbQpType::Smi,
            1 => IbQpType::Gsi,
            2 => IbQpType::Rc,
            3 => IbQpType::Uc,
            4 => IbQpType::Ud,
            5 => IbQpType::RawIpv6,
            6 => IbQpType::RawEthertype,
            8 => IbQpType::RawPacket,
            9 => IbQpType::XrcIni,
            10 => IbQpType::XrcTgt,
            0xff => IbQpType::Driver,
            other => IbQpType::Other(other),
        }
    }
}

impl IbQpType {
    /// The RoCE transport a policy binds it as; None for QP0 and QP1 (fixed
    /// rules) and for QPs that carry no RoCE transport (raw, driver).
    pub fn transport(self) -> Option<QpType> {
        match self {
            IbQpType::Rc => Some(QpType::Rc),
            IbQpType::Uc => Some(QpType::Uc),
            IbQpType::Ud => Some(QpType::Ud),
            IbQpType::XrcIni | IbQpType::XrcTgt => Some(QpType::Xrc),
            _ => None,
        }
    }
}

/// Names as `rdma resource show qp` prints them; width and alignment apply.
impl fmt::Display for IbQpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            IbQpType::Smi => "SMI",
            IbQpType::Gsi => "GSI",
            IbQpType::Rc => "RC",
            IbQpType::Uc => "UC",
            IbQpType::Ud => "UD",
            IbQpType::RawIpv6 => "RAW_IPV6",
            IbQpType::RawEthertype => "RAW_ETHERTYPE",
            IbQpType::RawPacket => "RAW_PACKET",
            IbQpType::XrcIni => "XRC_INI",
            IbQpType::XrcTgt => "XRC_TGT",
            IbQpType::Driver => "DRIVER",
            IbQpType::Other(v) => return f.pad(&format!("UNKNOWN({v})")),
        };
        f.pad(name)
    }
}

/// `enum ib_qp_state`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
    Other(u8),
}

impl From<u8> for QpState {
    fn from(v: u8) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            other => QpState::Other(other),
        }
    }
}

/// Names as `rdma resource show qp` prints them; width and alignment apply.
impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
            QpState::Other(v) => return f.pad(&format!("UNKNOWN({v})")),
        };
        f.pad(name)
    }
}

/// An rdma_cm ID with a QP: the addresses of that QP's connection.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CmId {
    qpn: u32,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

/// The RDMA devices with a port bound to interface `ifindex` (in this
/// network namespace), by device index. None is not an error.
pub fn devices_on(ifindex: u32) -> Result<Vec<Device>> {
    let mut nl = Connection::open()?;
    let mut devices = Vec::new();
    for reply in dump(&mut nl, command::GET, None)? {
        let info = nldev::device(&reply).context("decoding an RDMA device")?;
        let mut ports = Vec::new();
        for reply in dump(&mut nl, command::PORT_GET, Some(info.index))? {
            let port =
                nldev::port(&reply).with_context(|| format!("decoding a port of {}", info.name))?;
            if port.netdev == Some(ifindex) {
                ports.push(port.port);
            }
        }
        if !ports.is_empty() {
            devices.push(Device {
                index: info.index,
                driver: Driver::of(&info.name),
                name: info.name,
                ports,
                port_count: info.ports,
            });
        }
    }
    devices.sort_by_key(|d| d.index);
    Ok(devices)
}

/// The QPs of `devices` on their bound ports, sorted by device and QPN.
pub fn qps_of(devices: &[Device]) -> Result<Vec<Qp>> {
    let mut nl = Connection::open()?;
    let mut comms = BTreeMap::new();
    let mut all = Vec::new();
    for device in devices {
        let mut qps = Vec::new();
        for reply in dump(&mut nl, command::RES_QP_GET, Some(device.index))? {
            qps.extend(
                nldev::qps(&reply)
                    .with_context(|| format!("decoding the QPs of {}", device.name))?,
            );
        }
        let mut cm_ids = Vec::new();
        for reply in dump(&mut nl, command::RES_CM_ID_GET, Some(device.index))? {
            cm_ids.extend(
                nldev::cm_ids(&reply)
                    .with_context(|| format!("decoding the rdma_cm IDs of {}", device.name))?,
            );
        }
        all.extend(assemble(device, qps, &cm_ids, &mut |pid| {
            comms
                .entry(pid)
                .or_insert_with(|| (comm_of(pid), owner_of(pid)))
                .clone()
        }));
    }
    all.sort_by(|a, b| (&a.device, a.qpn).cmp(&(&b.device, b.qpn)));
    Ok(all)
}

/// Every QP of every RDMA device bound to interface `ifindex`; empty when
/// no device is.
pub fn qps_on(ifindex: u32) -> Result<Vec<Qp>> {
    qps_of(&devices_on(ifindex)?)
}

/// The attributes of every reply of a dump of `command`.
fn dump(nl: &mut Connection, command: u16, device: Option<u32>) -> Result<Vec<Vec<u8>>> {
    nl.dump(Request { command, device })?
        .into_iter()
        .map(|reply| {
            anyhow::ensure!(
                reply.command == command,
                "RDMA netlink answered command {} to a dump of command {command}",
                reply.command
            );
            Ok(reply.attrs)
        })
        .collect()
}

/// Keeps the QPs on `device`'s bound ports (and those not on a port yet when
/// every port is bound), with their owner's command and rdma_cm addresses.
fn assemble(
    device: &Device,
    qps: Vec<Qp>,
    cm_ids: &[CmId],
    owner: &mut impl FnMut(u32) -> (Option<String>, Option<Owner>),
) -> Vec<Qp> {
    let every_port = device.ports.len() as u32 == device.port_count;
    qps.into_iter()
        .filter(|qp| qp.port.map_or(every_port, |p| device.ports.contains(&p)))
        .map(|mut qp| {
            if !qp.kernel
                && let Some(pid) = qp.pid
            {
                (qp.comm, qp.owner) = owner(pid);
            }
            if let Some(id) = cm_ids.iter().find(|id| id.qpn == qp.qpn) {
                qp.local = id.local;
                qp.peer = id.peer;
            }
            qp
        })
        .collect()
}

/// `/proc/PID/comm`, as `rdma` prints it; None once the process is gone.
fn comm_of(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_string())
}

/// `/proc/PID`'s effective ids, network namespace and cgroup v2; None once
/// the process is gone.
pub fn owner_of(pid: u32) -> Option<Owner> {
    use std::os::unix::fs::MetadataExt as _;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    // "Uid:\treal\teffective\tsaved\tfs"
    let effective = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    Some(Owner {
        uid: effective("Uid:")?,
        gid: effective("Gid:")?,
        netns: std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .ok()
            .map(|m| m.ino() as u32),
        cgroup: cgroups
            .lines()
            .find_map(|l| l.strip_prefix("0::"))?
            .to_string(),
    })
}

#[cfg(test)]
impl Qp {
    /// A user QP on rxe0 port 1 in RTS, for tests.
    pub(crate) fn user(qpn: u32, qp_type: IbQpType, pid: u32, comm: &str) -> Qp {
        Qp {
            device: "rxe0".into(),
            port: Some(1),
            qpn,
            remote_qpn: None,
            qp_type,
            state: QpState::Rts,
            pid: Some(pid),
            comm: Some(comm.into()),
            owner: None,
            kernel: false,
            local: None,
            peer: None,
        }
    }
}

#[cfg(test)]
mod tests;
