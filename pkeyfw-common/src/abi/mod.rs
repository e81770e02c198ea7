//! The BPF maps' names, sizes and value layouts: the kernel/user ABI.
//!
//! A policy lives in one of two generations. Every QP-table, group and port
//! entry is keyed by its generation, and `ACTIVE` names the generation the
//! program reads. A new policy is written into the idle generation and made
//! live by one write to `ACTIVE`, so each frame is judged wholly by one policy.
//!
//! The bottom of the crate: the rules (`parse`, `verdict`, `capture`,
//! `tenant`, `stamp`, `switch`) read and write these types and never the
//! other way, so a change of a rule cannot change the layout. [`counters`]
//! holds the lists that index the counter maps.

pub mod cm;
pub mod counters;

pub use cm::{CmLayout, ConnectionKind, ListenKey, connection_key, family};
use counters::{Capture, REASON_SLOTS, Reason, Stamp};

/// Map names, as the loader finds them in the object.
pub mod name {
    pub const ABI: &str = "ABI";
    pub const ACTIVE: &str = "ACTIVE";
    pub const CONFIG: &str = "CONFIG";
    pub const QPS: &str = "QPS";
    pub const GROUPS: &str = "GROUPS";
    pub const PORT_KEYS: &str = "PORT_KEYS";
    pub const REASONS: &str = "REASONS";
    pub const XMIT_REASONS: &str = "XMIT_REASONS";
    pub const QP_STATS: &str = "QP_STATS";
    pub const EVENTS: &str = "EVENTS";
    pub const EVENT_BUDGET: &str = "EVENT_BUDGET";
    pub const STAMPS: &str = "STAMPS";
    pub const CAPTURES: &str = "CAPTURES";
    pub const VIOLATIONS: &str = "VIOLATIONS";
    pub const BIND_RULES: &str = "BIND_RULES";
    pub const QKEYS: &str = "QKEYS";
    pub const QUARANTINE: &str = "QUARANTINE";
    pub const LISTED: &str = "LISTED";
    pub const JOIN_ACTION: &str = "JOIN_ACTION";
    pub const CREATIONS: &str = "CREATIONS";
    pub const REPORTS: &str = "REPORTS";
    pub const LISTENERS: &str = "LISTENERS";
    pub const CONNECTIONS: &str = "CONNECTIONS";
    pub const CM_STATE: &str = "CM_STATE";
    pub const LISTENER_FOUND: &str = "LISTENER_FOUND";
}

/// The layout of every map below, as one number: `ABI[0]` holds it, so a
/// filter pinned by a pkeyfw with another layout is refused, not misread.
/// The counter maps' sizes are part of it, so a new reason or stamping
/// outcome changes it by itself; raise [`LAYOUT`] with any other change to
/// a map's name, kind, key, value or indexing.
pub const LAYOUT_VERSION: u32 =
    LAYOUT << 24 | (REASON_SLOTS as u32) << 16 | (Stamp::COUNT as u32) << 8 | Capture::COUNT as u32;
/// The hand-kept part of [`LAYOUT_VERSION`].
const LAYOUT: u32 = 23;

/// The kind of a map, as the loader opens its pin.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MapKind {
    Array,
    HashMap,
    LruHashMap,
    PerCpuArray,
    RingBuf,
}

/// How many entries a map has.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MapSize {
    /// As declared in the program.
    Fixed,
    /// This many entries per QPN the QP table covers ([`Capacity::qpns`]).
    PerQpn(u32),
    /// One per QP the QP-creation probe may record: what the attached
    /// interface's RDMA devices can hold at once (`max_qp`).
    Probed,
    /// The probes' report ring: bytes for what every possible CPU's
    /// budgets let through in a window ([`REPORT_BYTES_PER_CPU`]).
    ReportRing,
}

/// What a filter is loaded for: the maps' sizes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// QPNs the QP table covers, 0 to `qpns - 1`: every QPN the
    /// interface's RDMA devices hand out ([`RXE_QPNS`] for rdma_rxe) and
    /// every one a `[[qp]]` entry names. A frame to a higher QPN finds no
    /// entry; a QP a rule would bind there is quarantined.
    pub qpns: u32,
    /// QPs the QP-creation probe may record at once (who made each, the
    /// Q_Key each set).
    pub probed: u32,
    /// The system's possible CPUs, whose event budgets the probes' report
    /// ring has room for (the loader counts them).
    pub cpus: u32,
}

impl Capacity {
    /// A table of `qpns` QPNs, and the probe's tables as on an interface
    /// without RDMA devices.
    pub const fn of(qpns: u32) -> Capacity {
        Capacity {
            qpns,
            probed: PROBE_ROOM,
            cpus: 1,
        }
    }

    /// The entries of a map sized by the loader; None for a fixed size.
    pub const fn entries(self, size: MapSize) -> Option<u32> {
        match size {
            MapSize::Fixed => None,
            MapSize::PerQpn(n) => Some(self.qpns * n),
            MapSize::Probed => Some(self.probed),
            MapSize::ReportRing => Some((self.cpus * REPORT_BYTES_PER_CPU).next_power_of_two()),
        }
    }
}

/// One map of the filter object.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub name: &'static str,
    pub kind: MapKind,
    pub size: MapSize,
}

/// Every map of the filter object: the loader takes, pins, opens and sizes
/// the maps from this table, and refuses an object with a map it lacks.
pub const MAPS: [MapSpec; 25] = {
    use MapKind::*;
    use MapSize::*;
    const fn spec(name: &'static str, kind: MapKind, size: MapSize) -> MapSpec {
        MapSpec { name, kind, size }
    }
    [
        spec(name::ABI, Array, Fixed),
        spec(name::ACTIVE, Array, Fixed),
        spec(name::CONFIG, Array, Fixed),
        spec(name::QPS, Array, PerQpn(GENERATIONS)),
        spec(name::GROUPS, HashMap, Fixed),
        spec(name::PORT_KEYS, Array, Fixed),
        spec(name::REASONS, PerCpuArray, Fixed),
        spec(name::XMIT_REASONS, PerCpuArray, Fixed),
        spec(name::QP_STATS, Array, PerQpn(1)),
        spec(name::EVENTS, RingBuf, Fixed),
        spec(name::EVENT_BUDGET, PerCpuArray, Fixed),
        spec(name::STAMPS, PerCpuArray, Fixed),
        spec(name::CAPTURES, PerCpuArray, Fixed),
        spec(name::VIOLATIONS, Array, Fixed),
        spec(name::BIND_RULES, Array, Fixed),
        spec(name::QKEYS, HashMap, Probed),
        spec(name::QUARANTINE, Array, Fixed),
        spec(name::LISTED, HashMap, Fixed),
        spec(name::JOIN_ACTION, Array, Fixed),
        spec(name::CREATIONS, HashMap, Probed),
        spec(name::REPORTS, RingBuf, ReportRing),
        spec(name::LISTENERS, HashMap, Fixed),
        spec(name::CONNECTIONS, LruHashMap, Fixed),
        spec(name::CM_STATE, Array, Fixed),
        spec(name::LISTENER_FOUND, PerCpuArray, Fixed),
    ]
};

/// Policy generations: the live one and the one being written.
pub const GENERATIONS: u32 = 2;
/// Partitions per generation in `PORT_KEYS` (15-bit key portions).
pub const PARTITIONS: u32 = 1 << 15;
/// QPNs a host port's QP table covers at least (the maps' declared size;
/// the loader sets the real one, see [`Capacity`]): what hand-written
/// `[[qp]]` entries name, with room to spare for a reload's.
pub const MIN_QPNS: u32 = 1 << 16;
/// QPNs rdma_rxe hands out, 0 to 2^20: its QPN is the QP's index in the
/// device's pool, allocated cyclically (so numbers sweep the whole range)
/// from 16 to 2^20 inclusive on Linux 6.x and 7.x (to 2^17 on 5.10).
pub const RXE_QPNS: u32 = (1 << 20) + 1;
/// QPs the QP-creation probe records at once when the interface has no
/// RDMA device to size its tables from (see [`Capacity`]).
pub const PROBE_ROOM: u32 = 1 << 16;
/// QPNs the quarantine covers: all of them (24 bits).
pub const QUARANTINE_WORDS: u32 = (QPN_MASK + 1) / 64;

/// `QPS` index of QPN `qpn`'s entry in generation `generation`: the two
/// generations of a QPN side by side, so that one lookup, whose bound the
/// kernel checks inline, finds either, and a QPN beyond the table finds
/// none.
#[inline(always)]
pub const fn qp_index(generation: u32, qpn: u32) -> u32 {
    (qpn & QPN_MASK) << 1 | generation & 1
}

/// `QUARANTINE`: the word and the bit of QPN `qpn`.
#[inline(always)]
pub const fn quarantine_bit(qpn: u32) -> (u32, u64) {
    let qpn = qpn & QPN_MASK;
    (qpn / 64, 1 << (qpn % 64))
}
/// Capacity of the multicast group table, both generations together.
pub const GROUP_CAPACITY: u32 = 1 << 12;

/// Largest valid destination QPN; 0xFFFFFF is the multicast QPN.
pub const QPN_MASK: u32 = 0x00ff_ffff;

/// Ports a switch policy may name: the `LISTED` entries of a generation.
pub const SWITCH_PORTS: u32 = 1 << 12;

/// `LISTED` key: an interface (its ifindex) that a switch port's policy in
/// a generation lists as a port of its switch.
#[inline(always)]
pub const fn listed_key(generation: u32, ifindex: u32) -> u64 {
    (generation as u64) << 32 | ifindex as u64
}

/// `VIOLATIONS` index: what an InfiniBand port counts as P_KeyViolations or
/// Q_KeyViolations, per partition of the frame's P_Key when the port's
/// table holds it, else under partition 0 ([`OTHER_PARTITION`]), so that a
/// sender spraying made-up keys adds one counter, not 32,768 (`None` for
/// every other reason). The value counts refused frames, dropped or
/// monitored.
#[inline(always)]
pub const fn violation_key(reason: Reason, pkey: u16, in_table: bool) -> Option<u32> {
    let kind = match reason {
        Reason::PkeyViolation => 0,
        Reason::QkeyViolation => 1,
        _ => return None,
    };
    let partition = if in_table {
        crate::pkey::key(pkey)
    } else {
        OTHER_PARTITION
    };
    Some(kind << 15 | partition as u32)
}

/// The `VIOLATIONS` partition of keys the port's table does not hold
/// (partition 0 is never valid, so no real one shares it).
pub const OTHER_PARTITION: u16 = 0;

/// Slots of `VIOLATIONS`: both kinds, every partition (an array, so that
/// counting one is a few instructions, not a hash lookup).
pub const VIOLATION_SLOTS: u32 = 2 * PARTITIONS;

/// `PORT_KEYS` index of a partition in a generation.
#[inline(always)]
pub const fn port_key_index(generation: u32, pkey: u16) -> u32 {
    generation * PARTITIONS + crate::pkey::key(pkey) as u32
}

/// Bits of [`Config::port_serial`]: a `PORT_KEYS` entry keeps the rest
/// for the membership flags.
pub const PORT_SERIAL_BITS: u32 = 24;

/// A `PORT_KEYS` entry: a partition's membership flags, valid only while
/// its generation's [`Config::port_serial`] is `serial`. Writing a
/// generation takes a new serial, which empties it of every older entry at
/// once: an array lookup, where a hash kept clearing cheap.
#[inline(always)]
pub const fn port_entry(serial: u32, flags: u8) -> u32 {
    serial << 8 | flags as u32
}

/// The membership flags of a `PORT_KEYS` entry under `serial` (none for
/// an entry of an older policy).
#[inline(always)]
pub const fn port_entry_flags(entry: u32, serial: u32) -> u8 {
    if entry >> 8 == serial { entry as u8 } else { 0 }
}

crate::named_enum! {
    /// A QP's transport, numbered as the BTH opcode's top three bits.
    pub enum QpType: u8 {
        Rc = 0 => "rc",
        Uc = 1 => "uc",
        Ud = 3 => "ud",
        Xrc = 5 => "xrc",
    }
}

impl QpType {
    /// The RoCE transport of an `enum ib_qp_type`; None for QP0, QP1 and
    /// the raw and driver types, which no rule binds.
    #[inline(always)]
    pub const fn of_ib(ib_qp_type: u32) -> Option<QpType> {
        match ib_qp_type {
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            9 | 10 => Some(QpType::Xrc),
            _ => None,
        }
    }
}

crate::named_enum! {
    /// What happens to RoCE frames for a QP (or group) the policy does not know.
    #[derive(Default)]
    pub enum UnknownQp: u8 {
        /// Pass if the P_Key matches the port's default P_Key (index 0), else
        /// drop as a P_Key violation: what a port with only its default entry
        /// would do.
        #[default]
        DefaultPkey = 0 => "default-pkey",
        Drop = 1 => "drop",
        Pass = 2 => "pass",
    }
}

impl UnknownQp {
    /// Decodes the config byte; an unknown value fails closed.
    #[inline(always)]
    pub const fn from_u8(v: u8) -> UnknownQp {
        match UnknownQp::from_repr(v) {
            Some(rule) => rule,
            None => UnknownQp::Drop,
        }
    }
}

crate::named_enum! {
    /// What the probes do when a local QP joins a multicast group of a
    /// partition it is not in (`[enforcement] foreign_join`).
    #[derive(Default)]
    pub enum OnForeignJoin: u8 {
        /// Count it and report it.
        #[default]
        Report = 0 => "report",
        /// Report it, and SIGKILL the joining process before the verb
        /// returns (a probe cannot refuse the verb); not in monitor mode.
        Kill = 1 => "kill",
    }
}

/// `JOIN_ACTION[generation]`: an [`OnForeignJoin`] as u8, what the probes
/// do (a policy in monitor mode reports). A map of its own, not a
/// [`Config`] field: the XDP program copies `Config` whole, and a larger
/// copy takes it past Linux 6.1's verifier limit.
pub type JoinAction = u8;

/// `CONFIG[generation]`: the policy's global settings.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Config {
    /// The port's P_Key table index 0.
    pub default_pkey: u16,
    /// An [`UnknownQp`] as u8.
    pub unknown_qp: u8,
    /// Non-zero: count drops but pass them.
    pub monitor: u8,
    /// Non-zero: stamp outgoing frames with the sending QP's P_Key and
    /// restore 0xFFFF in passed incoming ones (see [`crate::stamp`]).
    pub stamp: u8,
    /// [`switch_flags`] bits: non-zero makes this a switch port (see
    /// [`crate::switch`]), where none of the host's rules apply.
    pub switch: u8,
    /// A switch access port's P_Key: frames entering with 0xFFFF get it,
    /// frames leaving get 0xFFFF back. 0: not an access port.
    pub access_pkey: u16,
    /// Which `PORT_KEYS` entries of this generation are its policy's (see
    /// [`port_entry`]); kept when a generation is cleared, so that a serial
    /// is never reused.
    pub port_serial: u32,
}

/// [`Config::switch`] bits.
pub mod switch_flags {
    /// A switch port: set whenever any other bit or an access key is.
    pub const PORT: u8 = 1 << 0;
    /// Check frames received on the port (PortRcvConstraintErrors).
    pub const INBOUND: u8 = 1 << 1;
    /// Check frames forwarded out of the port (PortXmitConstraintErrors).
    pub const OUTBOUND: u8 = 1 << 2;
    /// Pass refused frames with their ICRC broken instead of dropping them.
    pub const CORRUPT: u8 = 1 << 3;
}

/// What the loader chose for the filter's programs at load: the object's
/// global `SETUP`, read-only data the verifier knows, so that it removes
/// the code these choices turn off rather than walk it.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Setup {
    /// [`role`]: a host's port or a switch's (fixed for an attachment: a
    /// reload cannot change it).
    pub role: u8,
    /// Non-zero: XDP over multi-buffer frames (`xdp.frags`), whose
    /// fragments the XDP helpers reach (Linux 5.18 or later); else the
    /// linear part is the whole frame and is written directly.
    pub frags: u8,
    /// Non-zero: the coarse clock (`bpf_ktime_get_coarse_ns`, Linux 5.11
    /// or later) times the event budget; else the precise one.
    pub coarse_clock: u8,
    pub _pad: u8,
}

/// [`Setup::role`] values.
pub mod role {
    /// A host's port: the partition rules for its own QPs, stamping.
    pub const HOST: u8 = 0;
    /// A switch's port (see [`crate::switch`]).
    pub const SWITCH: u8 = 1;
}

/// A `QPS` entry: the receiving QP as the policy binds it, one u64 (see
/// [`QpEntry::to_bits`]). The program reads it with one 8-byte load and
/// every writer (the loader through the map's memory, the probes) writes
/// it with one 8-byte store or atomic exchange, so that no frame is judged
/// by half of one entry and half of another; no entry is a stored zero.
/// Its counters are its QPN's (`QP_STATS`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct QpEntry {
    /// Required Q_Key (UD only).
    pub qkey: u32,
    pub pkey: u16,
    /// A [`QpType`] as u8.
    pub qp_type: u8,
    /// [`qp_flags`] bits.
    pub flags: u8,
}

impl QpEntry {
    /// The entry as stored: the Q_Key in bits 0-31, the P_Key in 32-47,
    /// the type in 48-55 and the flags, [`qp_flags::VALID`] among them, in
    /// 56-63.
    #[inline(always)]
    pub const fn to_bits(self) -> u64 {
        self.qkey as u64
            | (self.pkey as u64) << 32
            | (self.qp_type as u64) << 48
            | ((self.flags | qp_flags::VALID) as u64) << 56
    }

    /// The entry `bits` holds; none for a word without
    /// [`qp_flags::VALID`] (a removed entry is a stored zero).
    #[inline(always)]
    pub const fn from_bits(bits: u64) -> Option<QpEntry> {
        let flags = (bits >> 56) as u8;
        if flags & qp_flags::VALID == 0 {
            return None;
        }
        Some(QpEntry {
            qkey: bits as u32,
            pkey: (bits >> 32) as u16,
            qp_type: (bits >> 48) as u8,
            flags: flags & !qp_flags::VALID,
        })
    }

    /// What a stored word (the table's, or none) holds.
    #[inline(always)]
    pub const fn bits(entry: Option<QpEntry>) -> u64 {
        match entry {
            Some(e) => e.to_bits(),
            None => 0,
        }
    }
}

/// [`QpEntry::flags`] bits.
pub mod qp_flags {
    /// A UD QP whose program has set no Q_Key yet: every UD frame for it is
    /// refused (see [`crate::tenant`]).
    pub const UNSET_QKEY: u8 = 1 << 0;
    /// Bound by a `[[bind]]` rule (by the probe or the loader), not a
    /// `[[qp]]` entry: the QP's destruction removes it, and the probe may
    /// rebind its QPN.
    pub const RULE: u8 = 1 << 1;
    /// The Q_Key is the QP's own, captured when its program sets it.
    pub const OWN_QKEY: u8 = 1 << 2;
    /// Bound by the QP-creation probe, which saw the creator: userspace
    /// leaves it as it is while the rules stay.
    pub const PROBE: u8 = 1 << 3;
    /// Set in every stored entry (and only there: [`super::QpEntry`]'s
    /// own flags never carry it), so that a zero word is no entry.
    pub const VALID: u8 = 1 << 7;
}

/// `GROUPS` key: a multicast destination (IPv4 as v4-mapped IPv6) in a generation.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub generation: u32,
    pub addr: [u8; 16],
}

/// `::ffff:a.b.c.d`.
#[inline(always)]
pub const fn v4_mapped(a: [u8; 4]) -> [u8; 16] {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
    ]
}

/// What the RDMA probes (pkeyfw-probes) need to read the kernel's RDMA
/// structures: byte offsets, from the kernel's BTF since they change between
/// kernels, and the RDMA devices (by index) of the attachment's interface.
/// The probes object's global `LAYOUT`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct QpLayout {
    /// `struct ib_qp`: `device`, `qp_num`.
    pub qp_device: u32,
    pub qp_num: u32,
    /// `struct ib_device`: `index`.
    pub device_index: u32,
    /// Device indices; [`NO_DEVICE`] where unused.
    pub devices: [u32; DEVICES],
    /// `struct ib_qp`: `qp_type`, `res`; `struct rdma_restrack_entry`:
    /// `type`, `user`, `kern_name`.
    pub qp_type: u32,
    pub qp_res: u32,
    pub res_type: u32,
    pub res_user: u32,
    pub res_kern_name: u32,
    /// `struct ib_qp_attr`: `qkey`.
    pub attr_qkey: u32,
    /// `struct task_struct`: `cred`, `nsproxy`; `struct cred`: `euid`,
    /// `egid`; `struct nsproxy`: `net_ns`; `struct net`: `net_cookie`.
    pub task_cred: u32,
    pub task_nsproxy: u32,
    pub cred_euid: u32,
    pub cred_egid: u32,
    pub nsproxy_net: u32,
    pub net_cookie: u32,
    /// QPNs the QP table covers (`Capacity::qpns`).
    pub qpns: u32,
    /// `struct rdma_cm_id`: `route.addr.src_addr`, `route.addr.dst_addr`
    /// (rdma_cm's BTF); 0 where unknown: no rdma_cm port is read.
    pub cm_src: u32,
    pub cm_dst: u32,
}

impl QpLayout {
    /// Nothing known: no device of the attachment's, no offset.
    pub const NONE: QpLayout = QpLayout {
        qp_device: 0,
        qp_num: 0,
        device_index: 0,
        devices: [NO_DEVICE; DEVICES],
        qp_type: 0,
        qp_res: 0,
        res_type: 0,
        res_user: 0,
        res_kern_name: 0,
        attr_qkey: 0,
        task_cred: 0,
        task_nsproxy: 0,
        cred_euid: 0,
        cred_egid: 0,
        nsproxy_net: 0,
        net_cookie: 0,
        qpns: 0,
        cm_src: 0,
        cm_dst: 0,
    };

    /// `enum ib_qp_attr_mask`: `IB_QP_QKEY` (the same value as libibverbs').
    pub const MASK_QKEY: u32 = 1 << 6;
    /// `enum rdma_restrack_type`: `RDMA_RESTRACK_QP` (PD, CQ, QP, …).
    pub const RESTRACK_QP: u32 = 2;
}

/// RDMA devices an attachment follows, at most.
pub const DEVICES: usize = 4;
/// An unused device slot (device indices start at 0).
pub const NO_DEVICE: u32 = u32::MAX;

/// What the egress program reads to learn, from rdma_rxe's own state, which
/// QP sent a frame: rxe sends each QP's frames through a kernel socket it
/// made for that QP and keeps the QP in the socket's user data. A frame is
/// a QP's only when its socket's user data is an rxe QP whose socket is
/// this one, on one of `devices` (the rdma_rxe devices of the attached
/// interface). Byte offsets from the kernel's, ib_core's and rdma_rxe's
/// BTF; the filter object's global `SENDER`, set at load.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SenderLayout {
    /// `struct sk_buff`: `sk`; `struct sock`: `sk_user_data`.
    pub skb_sk: u32,
    pub sk_user_data: u32,
    /// `struct rxe_qp`: `ibqp` (its `struct ib_qp`), `sk` (its `struct
    /// socket`); `struct socket`: `sk`.
    pub rxe_ibqp: u32,
    pub rxe_sk: u32,
    pub socket_sk: u32,
    /// `struct ib_qp`: `device`, `qp_num`; `struct ib_device`: `index`.
    pub qp_device: u32,
    pub qp_num: u32,
    pub device_index: u32,
    /// The rdma_rxe devices' indices; [`NO_DEVICE`] where unused. With none,
    /// no frame is any QP's.
    pub devices: [u32; DEVICES],
}

impl SenderLayout {
    /// Whether any rdma_rxe device is known: else no frame is any QP's.
    #[inline(always)]
    pub const fn knows_qps(&self) -> bool {
        self.devices[0] != NO_DEVICE
    }

    /// No rdma_rxe device: every frame is a process's.
    pub const NONE: SenderLayout = SenderLayout {
        skb_sk: 0,
        sk_user_data: 0,
        rxe_ibqp: 0,
        rxe_sk: 0,
        socket_sk: 0,
        qp_device: 0,
        qp_num: 0,
        device_index: 0,
        devices: [NO_DEVICE; DEVICES],
    };
}

/// `GROUPS` value.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GroupEntry {
    pub qkey: u32,
    pub pkey: u16,
    pub _pad: u16,
}

/// `CREATIONS[qpn]`: who made the QP numbered `qpn`, as the QP-creation
/// probe saw it at creation (the task in the verb, or the kernel user),
/// and which QP that is: only that QP's destruction removes what the
/// probes bound for the number; `LISTENERS[key]`: who made an rdma_cm
/// listener, as the listen probe saw it (its `qp` the listener's
/// `struct rdma_cm_id`, its `ib_qp_type` the listener's).
/// Every later match of the rules (a reload, a replacing attach, a release
/// from quarantine) reads this, never `/proc`, which a tenant can make
/// unreadable (a name that is not UTF-8, a thread that exited) or steer (a
/// setuid exec after the creation). The destroy probe removes it.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Creation {
    /// The `struct ib_qp`: a later QP with the number is another one.
    pub qp: u64,
    /// Network namespace cookie; 0 for a kernel user's QP.
    pub netns: u64,
    /// The creator's cgroup and its ancestors, by level from the root (0),
    /// as `bpf_get_current_ancestor_cgroup_id` gives them; 0 below its own
    /// level, and for a kernel user's QP.
    pub cgroups: [u64; CGROUP_LEVELS],
    /// Command name of the creating thread, or the kernel user's module.
    pub comm: [u8; 16],
    /// Process (thread group) id, in the initial PID namespace.
    pub pid: u32,
    /// Effective ids; `u32::MAX` (no id) for a kernel user's QP.
    pub uid: u32,
    pub gid: u32,
    /// The RDMA device's index.
    pub device: u32,
    /// For a kernel user's QP made through rdma_cm: the rdma_cm ports it
    /// serves (local) and connects to (peer); 0 where none.
    pub ports: [u16; 2],
    /// Non-zero: a kernel user made it.
    pub kernel: u8,
    /// `enum ib_qp_type`, to tell a record from a later QP's of the number.
    pub ib_qp_type: u8,
    pub _pad: [u8; 2],
}

/// The device guard's (`pkeyfw-guard`) maps, by name.
pub mod guard_name {
    pub const NODES: &str = "NODES";
    pub const TENANTS: &str = "TENANTS";
    pub const MAJORS: &str = "MAJORS";
    pub const SEALED: &str = "SEALED";
    pub const ACTIVE: &str = "ACTIVE";
}

/// Device nodes the guard can tell apart: every RDMA device's uverbs, umad
/// and issm nodes.
pub const DEVICE_NODES: u32 = 1 << 12;
/// Character device majors the RDMA core registers (uverbs, umad: 231, and
/// the dynamic ones beyond their fixed minors), as many as the guard keeps.
pub const DEVICE_MAJORS: u32 = 16;
/// `NODES` value of a node of no tenant's device: anyone's to open.
pub const NO_TENANT: u32 = u32::MAX;
/// `NODES` value of a node of a tenant's device that no tenant may open
/// (root outside every tenant may): one a reload removes, or one made
/// after the generation was written. No rule has this index.
pub const CLOSED: u32 = u32::MAX - 1;

/// `NODES` key of character device `major:minor` (as `dev_t` packs them:
/// 12 bits of major, 20 of minor).
#[inline(always)]
pub const fn node_key(major: u32, minor: u32) -> u32 {
    major << 20 | (minor & 0x000f_ffff)
}

/// Levels of a creator's cgroup path kept in [`Creation::cgroups`], the
/// root's included: a `cgroup` rule may name a directory at most
/// `CGROUP_LEVELS - 1` below the root.
pub const CGROUP_LEVELS: usize = 8;

/// Rules per generation.
pub const MAX_RULES: u32 = 64;

/// [`BindSpec::matchers`] bits: which fields a rule compares.
pub mod matcher {
    pub const COMM: u32 = 1 << 0;
    pub const PID: u32 = 1 << 1;
    pub const QPN: u32 = 1 << 2;
    pub const TYPE: u32 = 1 << 3;
    pub const CGROUP: u32 = 1 << 4;
    pub const UID: u32 = 1 << 5;
    pub const GID: u32 = 1 << 6;
    pub const NETNS: u32 = 1 << 7;
    /// The rule is for QPs the kernel makes (a ULP's), which no process
    /// can make; without it, for user QPs only.
    pub const KERNEL: u32 = 1 << 8;
    /// The rdma_cm port a kernel user's QP serves or connects to.
    pub const PORT: u32 = 1 << 9;
    /// The RDMA device (by index).
    pub const DEVICE: u32 = 1 << 10;
    /// Not a matcher: the rule whose tenant the attachment's device was
    /// made for (`own_device`), in that device's attachment.
    pub const OWNER: u32 = 1 << 11;
    /// Not a matcher: set on every rule of a device made for one tenant
    /// (the attachment of a tenant's own device), where only the
    /// [`OWNER`] rule binds (see [`crate::tenant::foreign`]).
    pub const OWNED: u32 = 1 << 12;
    /// Matchers that describe a task, which a kernel QP has none of.
    pub const TASK: u32 = PID | CGROUP | UID | GID | NETNS;
    /// Matchers a process cannot choose: only the administrator moves it
    /// to another cgroup, ids or network namespace.
    pub const BOUNDARY: u32 = CGROUP | UID | GID | NETNS;
    /// Set on every rule in use: an all-zero slot ends the list.
    pub const IN_USE: u32 = 1 << 31;
}

/// `BIND_RULES[generation * MAX_RULES + i]`: one `[[bind]]` rule.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct BindSpec {
    /// cgroup v2 id (the directory's inode) and its depth below the root.
    pub cgroup: u64,
    /// Network namespace cookie (`net->net_cookie`): unlike its inode
    /// number, never given to another namespace while the system runs.
    pub netns: u64,
    pub cgroup_level: u32,
    /// [`matcher`] bits.
    pub matchers: u32,
    pub pid: u32,
    pub qpn_lo: u32,
    pub qpn_hi: u32,
    /// Effective user and group ids, as the initial user namespace sees them.
    pub uid: u32,
    pub gid: u32,
    /// The Q_Key of the UD QPs it binds, when `pinned_qkey`.
    pub qkey: u32,
    pub pkey: u16,
    /// A [`QpType`] as u8, with [`matcher::TYPE`].
    pub qp_type: u8,
    /// Non-zero: the policy gives the Q_Key; else the QP's program sets it.
    pub pinned_qkey: u8,
    /// Command name, NUL-padded, with [`matcher::COMM`].
    pub comm: [u8; 16],
    /// With [`matcher::DEVICE`]: the RDMA device's index.
    pub device: u32,
    /// With [`matcher::PORT`]: the rdma_cm port.
    pub port: u16,
    pub _pad: u16,
}

/// `comm` as the kernel keeps it: at most 15 bytes, NUL-padded.
pub fn comm_bytes(name: &[u8]) -> [u8; 16] {
    let mut out = [0; 16];
    let n = if name.len() < 15 { name.len() } else { 15 };
    let mut i = 0;
    while i < n {
        out[i] = name[i];
        i += 1;
    }
    out
}

/// `comm` as copied out of the kernel, NUL-padded as rules keep theirs:
/// every byte from the first NUL on is zeroed. `bpf_get_current_comm`
/// copies with `strscpy` on kernels before 6.14 or so, which writes the
/// name and its NUL and leaves the bytes after as they were: a shorter
/// name written over a longer one's buffer keeps the longer one's tail,
/// and no rule would match it. Word operations, no loop or branch.
#[inline(always)]
pub const fn comm_padded(raw: [u8; 16]) -> [u8; 16] {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Bit 7 of each zero byte set (and maybe of bytes above the first
    // zero one, which are cleared anyway); the bytes below the first NUL.
    const fn below_nul(w: u64) -> (u64, bool) {
        let zeros = w.wrapping_sub(ONES) & !w & HIGHS;
        let first = zeros.isolate_lowest_one();
        ((first >> 7).wrapping_sub(1), zeros != 0)
    }
    let w0 = u64::from_le_bytes([
        raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
    ]);
    let w1 = u64::from_le_bytes([
        raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15],
    ]);
    let (keep0, ended) = below_nul(w0);
    let (keep1, _) = below_nul(w1);
    // A NUL in the first word clears the whole second one.
    let keep1 = keep1 & (ended as u64).wrapping_sub(1);
    let (a, b) = ((w0 & keep0).to_le_bytes(), (w1 & keep1).to_le_bytes());
    [
        a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], b[0], b[1], b[2], b[3], b[4], b[5], b[6],
        b[7],
    ]
}

/// `QP_STATS[qpn]`: frames judged by QPN `qpn`'s entry, counted by every
/// CPU with atomic adds: a QPN costs 16 bytes whatever the CPUs (a run per
/// CPU cost 16 MiB per CPU for rdma_rxe's million QPNs, per attachment).
/// A QP's frames come in as one flow (rdma_rxe's UDP source port is the
/// QP's), which one receive queue and so one CPU takes, so the counters of
/// one QP are seldom contended.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct QpStats {
    pub passed: u64,
    pub dropped: u64,
}

/// A refused frame, reported through the `EVENTS` ring buffer.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Event {
    /// Source and destination (IPv4 as v4-mapped IPv6, or the GIDs); zero
    /// when the frame was too malformed to tell.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// DETH Q_Key, for UD.
    pub qkey: u32,
    pub dest_qp: u32,
    pub pkey: u16,
    pub opcode: u8,
    /// A [`Reason`] as u8.
    pub reason: u8,
    /// Non-zero when monitor mode passed the frame anyway.
    pub monitor: u8,
    /// An [`EventKind`] as u8.
    pub kind: u8,
    /// A [`Direction`](crate::Direction) as u8: where a switch port
    /// refused the frame.
    pub direction: u8,
    /// A [`Verdict`](crate::Verdict) as u8: what was done with the frame.
    pub verdict: u8,
    /// DETH source QP, for UD (the sender, as a trap names it).
    pub src_qp: u32,
}

crate::named_enum! {
    /// What an [`Event`] reports; each kind has its own budget
    /// (`EVENT_BUDGET[kind]`), so no flood of one hides another.
    #[derive(Default)]
    pub enum EventKind: u8 as counter {
        /// A refused frame (`reason`, `monitor` and the headers).
        #[default]
        Frame = 0 => "frame",
        /// A QP joined a group of a partition it is not in: `dest_qp` is the
        /// QP, `pkey` its P_Key (0 when unbound), `dst` the group, `qkey`
        /// the group's P_Key.
        ForeignJoin = 1 => "foreign_join",
        /// A UD QP set a Q_Key other than the one the policy pins:
        /// `dest_qp` is the QP, `pkey` its P_Key, `qkey` the Q_Key it set,
        /// `src_qp` the policy's.
        QkeyMismatch = 2 => "qkey_mismatch",
        /// A switch port refused a frame (trap 259, "Bad P_Key (switch
        /// external port)"): as `Frame`, with `direction`.
        SwitchPort = 3 => "switch_port",
        /// A QP a rule would bind found no room in the probe's tables:
        /// `dest_qp` is the QP, quarantined.
        Quarantined = 4 => "quarantined",
        /// A QP was made on a device pkeyfw made for one tenant by someone
        /// else (see [`crate::tenant::foreign`]): `dest_qp` is the QP,
        /// quarantined; `pkey` the key its creator's rule gives (0: no rule
        /// matches it), `src_qp` the creating process (0: a kernel user).
        ForeignDevice = 5 => "foreign_device",
    }
}

/// Size of the `EVENTS` ring buffer (refused frames).
pub const EVENTS_BYTES: u32 = 1 << 16;
/// Room in the `REPORTS` ring (the probes' reports: joins, Q_Keys,
/// quarantines) per possible CPU: each report kind's budget for a window,
/// a record (header and event) of 64 bytes each, for up to four kinds. So
/// no flood, and no number of CPUs, fills it while its reader keeps up
/// within a window; a report that still finds no room is counted
/// ([`EventBudget::lost`]).
pub const REPORT_BYTES_PER_CPU: u32 = 4 * EVENTS_PER_WINDOW * 64;
/// `REPORTS` as declared (the loader sizes it for the CPUs).
pub const REPORTS_BYTES: u32 = 1 << 16;
/// Events of one kind each CPU may send per window: a flood of violations
/// costs the host a counter increment per frame, not a ring-buffer write.
pub const EVENTS_PER_WINDOW: u32 = 64;
/// The window: 2^30 ns, about a second.
pub const EVENT_WINDOW_SHIFT: u32 = 30;
/// How often a CPU reads the clock to see whether the window has passed:
/// when the jiffy count (read inline, where the clock is a call) shifted by
/// this changes, every 64 ticks (64 ms to 640 ms as the kernel's HZ goes).
pub const EVENT_TICK_SHIFT: u32 = 6;

/// `EVENT_BUDGET[kind]`: per CPU, the current window, the events of that
/// kind sent in it, and every one its budget held back (which `stats`,
/// `events` and the metrics report).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct EventBudget {
    pub window: u64,
    pub sent: u64,
    pub suppressed: u64,
    /// The jiffy count the clock was last read at (see
    /// [`EVENT_TICK_SHIFT`]).
    pub tick: u64,
    /// Events the budget let through that their ring had no room for.
    pub lost: u64,
}

impl EventBudget {
    /// Whether one more event may be sent, `jiffies` the kernel's tick
    /// count and `clock` its monotonic clock in ns; counts it if so. The
    /// clock, a call, is read once per [`EVENT_TICK_SHIFT`] ticks at most:
    /// a flood of refused frames costs a counter increment each.
    #[inline(always)]
    pub fn spend(&mut self, jiffies: u64, clock: impl FnOnce() -> u64) -> bool {
        let tick = jiffies >> EVENT_TICK_SHIFT;
        if self.tick != tick {
            self.tick = tick;
            let window = clock() >> EVENT_WINDOW_SHIFT;
            if self.window != window {
                self.window = window;
                self.sent = 0;
            }
        }
        if self.sent >= EVENTS_PER_WINDOW as u64 {
            self.suppressed += 1;
            return false;
        }
        self.sent += 1;
        true
    }
}

// The layouts the kernel and the host share: a change here is a change of
// LAYOUT_VERSION.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Config>() == 12);
    assert!(size_of::<Setup>() == 4);
    assert!(size_of::<GroupKey>() == 20);
    assert!(size_of::<GroupEntry>() == 8);
    assert!(size_of::<QpStats>() == 16);
    assert!(size_of::<Creation>() == 56 + 8 * CGROUP_LEVELS);
    assert!(size_of::<Event>() == 52);
    assert!(size_of::<EventBudget>() == 40);
    assert!(size_of::<QpLayout>() == 72 + 4 * DEVICES);
    assert!(size_of::<SenderLayout>() == 32 + 4 * DEVICES);
    assert!(size_of::<BindSpec>() == 80);
    assert!(size_of::<ListenKey>() == 32);
    assert!(size_of::<CmLayout>() == 64);
};

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::Event {}
    // SAFETY: plain `repr(C)` data with no padding bytes left uninitialised by
    // construction (explicit `_pad` fields), valid for any bit pattern.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::Setup {}
    unsafe impl aya::Pod for super::GroupKey {}
    unsafe impl aya::Pod for super::QpLayout {}
    unsafe impl aya::Pod for super::SenderLayout {}
    unsafe impl aya::Pod for super::GroupEntry {}
    unsafe impl aya::Pod for super::QpStats {}
    unsafe impl aya::Pod for super::Creation {}
    unsafe impl aya::Pod for super::EventBudget {}
    unsafe impl aya::Pod for super::BindSpec {}
    unsafe impl aya::Pod for super::ListenKey {}
    unsafe impl aya::Pod for super::CmLayout {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry is one word and back; a zero word (a removed entry) is
    /// none, whatever an entry's own fields are.
    #[test]
    fn an_entry_is_one_word() {
        let e = QpEntry {
            qkey: 0x8765_4321,
            pkey: 0x8001,
            qp_type: QpType::Xrc as u8,
            flags: qp_flags::RULE | qp_flags::OWN_QKEY | qp_flags::PROBE | qp_flags::UNSET_QKEY,
        };
        assert_eq!(QpEntry::from_bits(e.to_bits()), Some(e));
        assert_eq!(QpEntry::from_bits(0), None);
        assert_eq!(
            QpEntry::from_bits(QpEntry::default().to_bits()),
            Some(QpEntry::default())
        );
        assert_eq!(QpEntry::bits(None), 0);
        // The valid bit alone decides: the rest of a word may be anything.
        assert_eq!(
            QpEntry::from_bits(!(u64::from(qp_flags::VALID) << 56)),
            None
        );
    }

    /// Both generations of a QPN sit side by side, and a QPN's index is
    /// below the table's size exactly when the QPN is below its QPNs.
    #[test]
    fn qp_indices_interleave_the_generations() {
        assert_eq!(qp_index(0, 5), 10);
        assert_eq!(qp_index(1, 5), 11);
        assert_eq!(qp_index(1, QPN_MASK), (QPN_MASK << 1) | 1);
        let qpns = 100;
        for qpn in [0, 99, 100, 0xff_ffff] {
            for g in 0..GENERATIONS {
                assert_eq!(qp_index(g, qpn) < qpns * GENERATIONS, qpn < qpns);
            }
        }
    }

    #[test]
    fn port_entries_of_an_older_serial_are_empty() {
        let entry = port_entry(7, 0b11);
        assert_eq!(port_entry_flags(entry, 7), 0b11);
        assert_eq!(port_entry_flags(entry, 8), 0);
        assert_eq!(port_entry_flags(0, 1), 0);
    }

    /// A tenant's burst of refused frames or probe events on one CPU spends
    /// that window's budget only: the next window's first event is sent,
    /// however many frames came in between or how long after.
    #[test]
    fn a_burst_does_not_silence_a_later_window() {
        let mut budget = EventBudget::default();
        for _ in 0..EVENTS_PER_WINDOW {
            assert!(budget.spend(0, || 0));
        }
        assert!(!budget.spend(0, || 0));
        // Within the same ticks the clock is not read again.
        assert!(!budget.spend(1, || panic!("the clock read within a tick")));
        assert!(budget.spend(5 << EVENT_TICK_SHIFT, || 5 << EVENT_WINDOW_SHIFT));
        assert_eq!(budget.suppressed, 2);
    }

    /// The buffer a creation is recorded in is reused: a short name written
    /// over a longer one without padding (Linux 6.1's strscpy) must read
    /// as the short name alone, as a rule names it (issue 47: ib_send_bw's
    /// QPs went unbound after ib_atomic_bw's).
    #[test]
    fn a_name_copied_over_a_longer_one_reads_as_itself() {
        let mut buf = comm_bytes(b"ib_atomic_bw_F");
        buf[..13].copy_from_slice(b"ib_send_bw_F\0");
        assert_ne!(buf, comm_bytes(b"ib_send_bw_F"));
        assert_eq!(comm_padded(buf), comm_bytes(b"ib_send_bw_F"));
        for name in [
            &b""[..],
            b"a",
            b"1234567",
            b"12345678",
            b"123456789",
            b"123456789012345",
        ] {
            let mut tail = [0xffu8; 16];
            tail[..name.len()].copy_from_slice(name);
            tail[name.len()] = 0;
            assert_eq!(comm_padded(tail), comm_bytes(name), "{name:?}");
            assert_eq!(comm_padded(comm_bytes(name)), comm_bytes(name));
        }
        // Bytes of 0x01 and 0x80 around the NUL are no NUL to the word trick.
        let mut odd = [0x80u8; 16];
        odd[..4].copy_from_slice(&[0x01, 0x80, 0x01, 0x00]);
        assert_eq!(comm_padded(odd), comm_bytes(&[0x01, 0x80, 0x01]));
    }
}
