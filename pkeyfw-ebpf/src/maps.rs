//! The filter object's maps, and the policy generation the verdict reads
//! through them.

use aya_ebpf::{
    Global,
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    macros::btf_map,
};
use pkeyfw_common::{
    Capture, Stamp, Tables,
    abi::{
        BindSpec, Config, Creation, EVENTS_BYTES, Event, EventBudget, EventKind, GENERATIONS,
        GROUP_CAPACITY, GroupEntry, GroupKey, JoinAction, ListenKey, MAX_RULES, MIN_QPNS,
        PARTITIONS, PROBE_ROOM, QUARANTINE_WORDS, QpEntry, QpStats, REPORTS_BYTES, SWITCH_PORTS,
        SenderLayout, VIOLATION_SLOTS,
        cm::{CONNECTION_CAPACITY, LISTEN_CAPACITY, cm_state},
        counters::REASON_SLOTS,
        listed_key, port_entry_flags, port_key_index, qp_index, quarantine_bit,
    },
    tenant::Rules,
};

/// The hash maps' flags: entries are allocated as they are made, so that
/// memory follows what is bound rather than the capacity.
const GROWN: usize = BPF_F_NO_PREALLOC as usize;
/// The QP table's: its memory can be mapped, so that the loader publishes
/// an entry with one atomic store (an update through the system call
/// copies it with `memcpy`, which a frame could read half-done).
pub const MAPPED: usize = BPF_F_MMAPABLE as usize;

/// `LAYOUT_VERSION`, written by the loader: what a later pkeyfw checks
/// before it reads these maps through their pins.
#[btf_map]
pub static ABI: Array<u32, 1> = Array::new();
/// The generation of the policy in force (0 or 1).
#[btf_map]
pub static ACTIVE: Array<u32, 1> = Array::new();
/// Per generation: default P_Key, unknown-QP rule, monitor flag.
#[btf_map]
pub static CONFIG: Array<Config, { GENERATIONS as usize }> = Array::new();
/// `qp_index(generation, QPN)` → the receiving QP's type, P_Key, Q_Key and
/// flags, one u64 (`QpEntry::to_bits`): an array, whose lookup the kernel
/// inlines (no call), indexed by QPN, which rdma_rxe keeps below 2^20.
#[btf_map]
pub static QPS: Array<u64, { (GENERATIONS * MIN_QPNS) as usize }, MAPPED> = Array::new();
/// (generation, multicast address) → the group's P_Key and Q_Key.
#[btf_map]
pub static GROUPS: HashMap<GroupKey, GroupEntry, { GROUP_CAPACITY as usize }, GROWN> =
    HashMap::new();
/// (generation, partition) → which memberships the port's P_Key table
/// holds, under the generation's serial (`port_entry`): QP1 frames and the
/// violation counters look here.
#[btf_map]
pub static PORT_KEYS: Array<u32, { (GENERATIONS * PARTITIONS) as usize }> = Array::new();
/// Frames per (reason, verdict), per CPU: received (a host port, or a
/// switch port's inbound check) and forwarded out (a switch port's outbound
/// check).
#[btf_map]
pub static REASONS: PerCpuArray<u64, REASON_SLOTS> = PerCpuArray::new();
#[btf_map]
pub static XMIT_REASONS: PerCpuArray<u64, REASON_SLOTS> = PerCpuArray::new();
/// Frames passed and dropped per QPN's entry (`QpStats`).
#[btf_map]
pub static QP_STATS: Array<QpStats, { MIN_QPNS as usize }> = Array::new();

/// Frames per stamping outcome, per CPU.
#[btf_map]
pub static STAMPS: PerCpuArray<u64, { Stamp::COUNT }> = PerCpuArray::new();
/// The probes' counters: written by the probes only, declared here so that
/// they are pinned with the filter.
#[btf_map]
pub static CAPTURES: PerCpuArray<u64, { Capture::COUNT }> = PerCpuArray::new();
/// Where rdma_rxe keeps a frame's sending QP: set by the loader from BTF.
#[unsafe(no_mangle)]
pub static SENDER: Global<SenderLayout> = Global::new(SenderLayout::NONE);

/// The `[[bind]]` rules, per generation, that the QP-creation probe
/// matches; the Q_Key each QP's program set: written by the probes and the
/// loader, declared here so that they are pinned with the filter.
#[btf_map]
pub static BIND_RULES: Array<BindSpec, { (GENERATIONS * MAX_RULES) as usize }> = Array::new();
#[btf_map]
pub static QKEYS: HashMap<u32, u32, { PROBE_ROOM as usize }, GROWN> = HashMap::new();
/// Who made each QP, as the QP-creation probe saw it (read by the loader
/// only: every later match of the rules).
#[btf_map]
pub static CREATIONS: HashMap<u32, Creation, { PROBE_ROOM as usize }, GROWN> = HashMap::new();
/// One bit per QPN: a QP a `[[bind]]` rule would bind that the QP-creation
/// probe had no room for. Always has room (2 MiB for every QPN); a frame
/// to or from such a QP is refused until it is bound or destroyed.
#[btf_map]
pub static QUARANTINE: Array<u64, { QUARANTINE_WORDS as usize }> = Array::new();

/// (generation, ifindex) of every port a switch port's policy lists: RoCE
/// that entered the switch through any other interface leaves through none
/// of them.
#[btf_map]
pub static LISTED: HashMap<u64, u8, { (GENERATIONS * SWITCH_PORTS) as usize }, GROWN> =
    HashMap::new();

/// What the probes do about a foreign multicast join, per generation:
/// theirs, declared here as every map of the filter is (the loader pins
/// them all).
#[btf_map]
pub static JOIN_ACTION: Array<JoinAction, { GENERATIONS as usize }> = Array::new();

/// The rdma_cm listeners the probes recorded (who made each), by what a CM
/// request names of its listener; the P_Key of each CM exchange, by its
/// sender's communication ID; which of these the probes keep up
/// (`cm_state`): the probes', declared here as every map of the filter is.
#[btf_map]
pub static LISTENERS: HashMap<ListenKey, Creation, { LISTEN_CAPACITY as usize }, GROWN> =
    HashMap::new();
#[btf_map]
pub static CONNECTIONS: LruHashMap<u64, u16, { CONNECTION_CAPACITY as usize }> = LruHashMap::new();
#[btf_map]
pub static CM_STATE: Array<u64, { cm_state::SLOTS as usize }> = Array::new();
/// Who made the listener a CM request names, as the stage that found it
/// leaves it for the stage that binds it: one program run's, per CPU (an
/// ingress program runs to its end before the next starts on its CPU).
#[btf_map]
pub static LISTENER_FOUND: PerCpuArray<Creation, 1> = PerCpuArray::new();

/// P_Key and Q_Key violations per partition (`violation_key`), as an IB
/// port counts them, updated atomically (refused frames only).
#[btf_map]
pub static VIOLATIONS: Array<u64, { VIOLATION_SLOTS as usize }> = Array::new();
/// Refused frames, for the CLI's violation lines.
#[btf_map]
pub static EVENTS: RingBuf<Event, { EVENTS_BYTES as usize }> = RingBuf::new();
/// The QP probes' reports (theirs; declared here as every map of the
/// filter is).
#[btf_map]
pub static REPORTS: RingBuf<Event, { REPORTS_BYTES as usize }> = RingBuf::new();
/// Per CPU and event kind: events sent in the current window, and those
/// held back or lost.
#[btf_map]
pub static EVENT_BUDGET: PerCpuArray<EventBudget, { EventKind::COUNT }> = PerCpuArray::new();

/// The policy in force: its generation's maps and settings. The settings
/// where the map keeps them, each read where it is used (a copy would be
/// read whole, and kept on the stack through the verdict).
#[inline(always)]
pub fn policy() -> (Generation, &'static Config) {
    let generation = match ACTIVE.get(0) {
        Some(g) => *g & 1,
        None => 0,
    };
    let config = CONFIG.get(generation).unwrap_or(&NO_CONFIG);
    (
        Generation {
            generation,
            port_serial: config.port_serial,
        },
        config,
    )
}

/// The settings where `CONFIG` has none (it always has both generations').
static NO_CONFIG: Config = Config {
    default_pkey: 0,
    unknown_qp: 0,
    monitor: 0,
    stamp: 0,
    switch: 0,
    access_pkey: 0,
    port_serial: 0,
};

/// The maps of one policy generation: what the verdict reads.
pub struct Generation {
    pub generation: u32,
    /// Its `PORT_KEYS` entries' serial.
    pub port_serial: u32,
}

impl Tables for Generation {
    /// One 8-byte load of the entry, wherever a writer is: the old entry
    /// or the new one, never part of each.
    #[inline(always)]
    fn qp(&self, qpn: u32) -> Option<QpEntry> {
        let word = QPS.get_ptr(qp_index(self.generation, qpn))?;
        // SAFETY: a live, 8-byte aligned array element.
        QpEntry::from_bits(unsafe { core::ptr::read_volatile(word) })
    }

    #[inline(always)]
    fn group(&self, addr: &[u8; 16]) -> Option<GroupEntry> {
        let key = GroupKey {
            generation: self.generation,
            addr: *addr,
        };
        // SAFETY: the value is copied out at once.
        unsafe { GROUPS.get(&key).copied() }
    }

    #[inline(always)]
    fn port_flags(&self, key: u16) -> u8 {
        PORT_KEYS
            .get(port_key_index(self.generation, key))
            .map_or(0, |&entry| port_entry_flags(entry, self.port_serial))
    }

    #[inline(always)]
    fn quarantined(&self, qpn: u32) -> bool {
        let (word, bit) = quarantine_bit(qpn);
        QUARANTINE.get(word).is_some_and(|w| w & bit != 0)
    }

    #[inline(always)]
    fn listed(&self, ifindex: u32) -> bool {
        // SAFETY: only whether the entry exists is read.
        unsafe { LISTED.get(&listed_key(self.generation, ifindex)).is_some() }
    }

    #[inline(always)]
    fn cm_records(&self) -> u64 {
        CM_STATE.get(cm_state::RECORDS).copied().unwrap_or(0)
    }

    #[inline(always)]
    fn listeners_unrecorded(&self) -> bool {
        CM_STATE.get(cm_state::UNRECORDED).is_some_and(|&n| n != 0)
    }

    #[inline(always)]
    fn listener(&self, key: &ListenKey) -> Option<&Creation> {
        // SAFETY: read in place, while the program runs (RCU).
        unsafe { LISTENERS.get(key) }
    }

    #[inline(always)]
    fn connection(&self, key: u64) -> Option<u16> {
        // SAFETY: the value is copied out at once.
        unsafe { CONNECTIONS.get(&key) }.copied()
    }
}

impl Rules for Generation {
    #[inline(always)]
    fn rule(&self, index: u32) -> Option<&BindSpec> {
        bind_rule(self.generation, index)
    }
}

/// The `[[bind]]` rules of generation `.0`, alone.
pub struct RulesOf(pub u32);

impl Rules for RulesOf {
    #[inline(always)]
    fn rule(&self, index: u32) -> Option<&BindSpec> {
        bind_rule(self.0, index)
    }
}

#[inline(always)]
fn bind_rule(generation: u32, index: u32) -> Option<&'static BindSpec> {
    BIND_RULES.get(generation * MAX_RULES + index)
}
