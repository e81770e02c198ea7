//! The RDMA devices bound to an interface and their QPs, as the kernel's
//! RDMA netlink reports them (what `rdma link` and `rdma resource show qp`
//! print): which QPs exist, who made them, and for rdma_cm connections the
//! addresses at both ends. `[[bind]]` rules bind QPs found here, by who
//! made them: what the QP-creation probe saw ([`Maker::Seen`]), or for a
//! QP made before any probe ran, what `/proc` says ([`Maker::Read`]).
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

use std::{collections::BTreeMap, fmt, net::SocketAddr, path::Path};

use anyhow::{Context as _, Result};
use pkeyfw_common::{
    abi::{CGROUP_LEVELS, Creation, ListenKey, NO_DEVICE, QpType, comm_bytes, family, v4_mapped},
    cm,
};

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
    /// Its index.
    pub device_index: u32,
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
    /// Who made it, as the rules match it ([`identify`]).
    pub maker: Maker,
    /// Made by the kernel (a ULP or ib_core itself), not by a process.
    pub kernel: bool,
    /// For a QP made through rdma_cm: its local address and port.
    pub local: Option<SocketAddr>,
    /// For a QP made through rdma_cm: the peer's address and port.
    pub peer: Option<SocketAddr>,
}

/// Who made a QP, as `[[bind]]` rules match it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Maker {
    /// Not asked yet (RDMA netlink alone).
    Unasked,
    /// What the QP-creation probe saw as the kernel created it.
    Seen(Creation),
    /// What `/proc` and RDMA netlink say now: for a QP made before any
    /// probe ran.
    Read(Creation),
    /// Neither: a process's QP whose thread is gone, or whose `/proc`
    /// entry cannot be read. No rule can tell whose it is.
    Unknown,
}

impl Maker {
    /// What the rules match, if anything is known.
    pub fn creation(&self) -> Option<&Creation> {
        match self {
            Maker::Seen(c) | Maker::Read(c) => Some(c),
            Maker::Unasked | Maker::Unknown => None,
        }
    }
}

/// The QP-creation probe's records, by QPN.
pub type Records = BTreeMap<u32, Creation>;

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
    /// As `enum ib_qp_type` numbers it.
    pub fn raw(self) -> u8 {
        match self {
            IbQpType::Smi => 0,
            IbQpType::Gsi => 1,
            IbQpType::Rc => 2,
            IbQpType::Uc => 3,
            IbQpType::Ud => 4,
            IbQpType::RawIpv6 => 5,
            IbQpType::RawEthertype => 6,
            IbQpType::RawPacket => 8,
            IbQpType::XrcIni => 9,
            IbQpType::XrcTgt => 10,
            IbQpType::Driver => 0xff,
            IbQpType::Other(v) => v,
        }
    }

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

/// A listening rdma_cm ID, as RDMA netlink reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CmListener {
    /// rdma_cm's port space (`enum rdma_ucm_port_space`).
    ps: u32,
    /// The address and port it listens on.
    addr: SocketAddr,
    /// Its process (a user's), in our PID namespace.
    pid: Option<u32>,
    /// A kernel user's.
    kernel: bool,
}

/// A listener on a device, and who made it as the listen probe would have
/// recorded it: for one that was listening before any probe ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub key: ListenKey,
    /// None where its process cannot be read (gone, or in another PID
    /// namespace).
    pub creation: Option<Creation>,
}

/// The rdma_cm listeners of `devices` in this network namespace, once
/// each (a wildcard listener is one per device), who made each read from
/// `/proc` as its owner is now (a kernel user's by its port and device).
/// RDMA netlink does not say which wildcard listener takes one family
/// only (`afonly`): each is taken for one of both.
pub fn listeners_of(devices: &[Device]) -> Result<Vec<Listener>> {
    let here = crate::host::netns::current_cookie()?;
    let host =
        crate::host::netns::NetnsId::host().ok() == crate::host::netns::NetnsId::current().ok();
    let mut nl = Connection::open()?;
    let mut found: BTreeMap<ListenKey, Option<Creation>> = BTreeMap::new();
    for device in devices {
        for reply in dump(&mut nl, command::RES_CM_ID_GET, Some(device.index))? {
            let listeners = nldev::listeners(&reply)
                .with_context(|| format!("decoding the rdma_cm IDs of {}", device.name))?;
            for l in listeners {
                let (af, addr) = match l.addr.ip() {
                    std::net::IpAddr::V4(a) => (family::INET, v4_mapped(a.octets())),
                    std::net::IpAddr::V6(a) => (family::INET6, a.octets()),
                };
                let key = cm::listen_key(cm::service_id(l.ps, l.addr.port()), af, addr, false);
                let wildcard = key.addr == [0; 16];
                // A listener takes a QP type by its port space.
                let ib_qp_type = if l.ps == PS_UDP { 4 } else { 2 };
                let device = if wildcard { NO_DEVICE } else { device.index };
                let creation = if l.kernel {
                    // Kernel users listen in the host's namespace.
                    if !host {
                        continue;
                    }
                    Some(Creation {
                        comm: comm_bytes(RDMA_CM.as_bytes()),
                        uid: u32::MAX,
                        gid: u32::MAX,
                        device,
                        ports: [l.addr.port(), 0],
                        kernel: 1,
                        ib_qp_type,
                        ..Creation::default()
                    })
                } else {
                    match l.pid.and_then(creation_of) {
                        // Its process's namespace is where it listens.
                        Some(c) if c.netns != here => continue,
                        c => c.map(|c| Creation {
                            device,
                            ib_qp_type,
                            ..c
                        }),
                    }
                };
                found.entry(key).or_insert(creation);
            }
        }
    }
    Ok(found
        .into_iter()
        .map(|(key, creation)| Listener { key, creation })
        .collect())
}

/// rdma_cm's module: the kernel user its kernel users' QPs and listeners
/// are recorded as.
const RDMA_CM: &str = "rdma_cm";
/// rdma_cm's UDP port space, whose listeners take UD QPs.
const PS_UDP: u32 = 0x0111;

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

/// The index of the RDMA device named `name`; the error says it is none.
pub fn device_index(name: &str) -> Result<u32, String> {
    let found = Connection::open()
        .and_then(|mut nl| {
            dump(&mut nl, command::GET, None)?
                .iter()
                .map(|reply| nldev::device(reply).context("decoding an RDMA device"))
                .collect::<Result<Vec<_>>>()
        })
        .map_err(|e| format!("cannot list the RDMA devices: {e:#}"))?;
    found
        .into_iter()
        .find(|d| d.name == name)
        .map(|d| d.index)
        .ok_or_else(|| format!("`{name}` is no RDMA device here (`rdma link` lists them)"))
}

/// The QPs of `devices` on their bound ports, sorted by device and QPN, as
/// RDMA netlink reports them: who made them not yet asked ([`identify`]).
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
            comms.entry(pid).or_insert_with(|| comm_of(pid)).clone()
        }));
    }
    all.sort_by(|a, b| (&a.device, a.qpn).cmp(&(&b.device, b.qpn)));
    Ok(all)
}

/// Every QP of every RDMA device bound to interface `ifindex`; empty when
/// no device is. Who made them not yet asked ([`identify`]).
pub fn qps_on(ifindex: u32) -> Result<Vec<Qp>> {
    qps_of(&devices_on(ifindex)?)
}

/// Who made each of `qps`: the probe's record of its creation where there
/// is one of this QP (a kernel user's or a process's as RDMA netlink says,
/// and of its type: else an earlier QP's with the number), else `/proc`.
pub fn identify(qps: &mut [Qp], records: &Records) {
    let mut read = BTreeMap::new();
    for qp in qps {
        // uverbs makes a process's XRC target QPs as a kernel user would
        // (RDMA netlink names them ib_uverbs's): they are the process's, as
        // the probe records them.
        let process = !qp.kernel || qp.comm.as_deref() == Some(UVERBS);
        let seen = records
            .get(&qp.qpn)
            .filter(|c| (c.kernel == 0) == process && c.ib_qp_type == qp.qp_type.raw());
        qp.maker = match seen {
            Some(c) => Maker::Seen(*c),
            None if !process => Maker::Read(kernel_user(qp.comm.as_deref().unwrap_or(""), qp)),
            // (An XRC target QP names no process.)
            None => match qp.pid.filter(|_| !qp.kernel) {
                Some(pid) => read.entry(pid).or_insert_with(|| creation_of(pid)).map_or(
                    Maker::Unknown,
                    |c| {
                        Maker::Read(Creation {
                            device: qp.device_index,
                            ib_qp_type: qp.qp_type.raw(),
                            ..c
                        })
                    },
                ),
                None => Maker::Unknown,
            },
        };
    }
}

/// The module name uverbs gives the QPs it makes for a process.
pub const UVERBS: &str = "ib_uverbs";

/// A kernel user's QP, by its module's name: every task field matches
/// nothing, as the probe records it.
fn kernel_user(module: &str, qp: &Qp) -> Creation {
    let port = |a: Option<SocketAddr>| a.map_or(0, |a| a.port());
    Creation {
        comm: comm_bytes(module.as_bytes()),
        uid: u32::MAX,
        gid: u32::MAX,
        device: qp.device_index,
        ports: [port(qp.local), port(qp.peer)],
        kernel: 1,
        ib_qp_type: qp.qp_type.raw(),
        ..Creation::default()
    }
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
    comm: &mut impl FnMut(u32) -> Option<String>,
) -> Vec<Qp> {
    let every_port = device.ports.len() as u32 == device.port_count;
    qps.into_iter()
        .filter(|qp| qp.port.map_or(every_port, |p| device.ports.contains(&p)))
        .map(|mut qp| {
            qp.device_index = device.index;
            if !qp.kernel
                && let Some(pid) = qp.pid
            {
                qp.comm = comm(pid);
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
/// (A name need not be UTF-8: shown with replacement characters.)
fn comm_of(pid: u32) -> Option<String> {
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let comm = comm.strip_suffix(b"\n").unwrap_or(&comm);
    Some(String::from_utf8_lossy(comm).into_owned())
}

/// What `/proc/PID` says of a process, as the probe would have recorded it
/// as a QP's maker: its command, effective ids, network namespace cookie
/// and cgroups (the QP's own fields left at 0). Read as bytes: no name a
/// process gives itself makes it unreadable. None once the process is gone
/// (or its cgroup is).
pub fn creation_of(pid: u32) -> Option<Creation> {
    let status = std::fs::read(format!("/proc/{pid}/status")).ok()?;
    // "Uid:\treal\teffective\tsaved\tfs"
    let effective = |field: &[u8]| -> Option<u32> {
        let line = status
            .split(|&b| b == b'\n')
            .find_map(|l| l.strip_prefix(field))?;
        std::str::from_utf8(line)
            .ok()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let cgroups = std::fs::read(format!("/proc/{pid}/cgroup")).ok()?;
    let cgroup = cgroups
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"0::"))?;
    Some(Creation {
        // The namespace's cookie takes ptrace access, which a service
        // without CAP_SYS_PTRACE lacks to another user's process: then 0,
        // which no `netns` rule matches.
        netns: crate::host::netns::cookie_of_pid(pid).unwrap_or(0),
        cgroups: cgroup_ids(cgroup)?,
        comm: comm_bytes(comm.strip_suffix(b"\n").unwrap_or(&comm)),
        pid,
        uid: effective(b"Uid:")?,
        gid: effective(b"Gid:")?,
        ..Creation::default()
    })
}

/// The ids of cgroup `path` ("/a/b", as `/proc/PID/cgroup` names it) and
/// its ancestors, by level from the root, as the probe records them.
fn cgroup_ids(path: &[u8]) -> Option<[u64; CGROUP_LEVELS]> {
    use std::os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _};
    let mut dir = crate::host::identity::cgroup2_mount()?;
    let mut ids = [0; CGROUP_LEVELS];
    let names = path.split(|&b| b == b'/').filter(|n| !n.is_empty());
    for (level, name) in std::iter::once(&b""[..]).chain(names).enumerate() {
        if level >= CGROUP_LEVELS {
            break;
        }
        dir.push(Path::new(std::ffi::OsStr::from_bytes(name)));
        ids[level] = std::fs::metadata(&dir).ok()?.ino();
    }
    Some(ids)
}

#[cfg(test)]
impl Qp {
    /// A user QP on rxe0 port 1 in RTS, for tests.
    pub(crate) fn user(qpn: u32, qp_type: IbQpType, pid: u32, comm: &str) -> Qp {
        Qp {
            device: "rxe0".into(),
            device_index: 0,
            port: Some(1),
            qpn,
            remote_qpn: None,
            qp_type,
            state: QpState::Rts,
            pid: Some(pid),
            comm: Some(comm.into()),
            // Named and numbered, in no cgroup and with no ids a rule
            // names.
            maker: Maker::Read(Creation {
                comm: comm_bytes(comm.as_bytes()),
                pid,
                uid: u32::MAX,
                gid: u32::MAX,
                ib_qp_type: qp_type.raw(),
                ..Creation::default()
            }),
            kernel: false,
            local: None,
            peer: None,
        }
    }

    /// The QP, made by effective ids `uid` and `gid` in the cgroup whose
    /// ids from the root down are `cgroups`.
    pub(crate) fn made_by(mut self, uid: u32, gid: u32, cgroups: &[u64]) -> Qp {
        if let Maker::Read(c) | Maker::Seen(c) = &mut self.maker {
            (c.uid, c.gid) = (uid, gid);
            c.cgroups[..cgroups.len()].copy_from_slice(cgroups);
        }
        self
    }
}

#[cfg(test)]
mod tests;
