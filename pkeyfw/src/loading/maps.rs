//! The XDP program's maps, typed: opening them (from a fresh load or from
//! bpffs pins), switching them to a policy without ever exposing a half-written
//! one, and reading the counters.
//!
//! Everything a later process needs is in the maps themselves (which QPs each
//! generation binds; a QP's counters are its QPN's), so `pkeyfw reload` in
//! another process switches a pinned filter exactly as the process that
//! attached it would. The QP table is written through its mapped memory,
//! an entry in one store ([`QpTable`]).

use std::{
    collections::{BTreeMap, HashMap as StdHashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    sync::atomic::{Ordering, fence},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use aya::{
    Ebpf, Pod,
    maps::{
        Array, HashMap, IterableMap as _, Map, MapData, MapError, MapInfo, PerCpuArray, RingBuf,
    },
};
use pkeyfw_common::{
    Capture, Reason, Stamp, Verdict,
    abi::{
        BindSpec, Config, Creation, EventBudget, EventKind, GENERATIONS, GROUP_CAPACITY,
        GroupEntry, GroupKey, JoinAction, LAYOUT_VERSION, ListenKey, MAPS, MAX_RULES, MapKind,
        OTHER_PARTITION, PARTITIONS, PORT_SERIAL_BITS, QpEntry, QpStats,
        cm::cm_state,
        counters::{REASON_SLOTS, reason_slot},
        listed_key, matcher, name, port_entry, port_key_index, qp_flags, quarantine_bit,
        violation_key,
    },
};

use super::{batch, qp_table::QpTable};
use crate::{
    host::netlink,
    policy::{Policy, QpRule},
};

/// How long a retired policy generation stays untouched before it is
/// rewritten: far longer than any XDP program run, which is all that could
/// still be reading it.
const GRACE: Duration = Duration::from_millis(20);

/// Frames per (reason, verdict), as the kernel counted them.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ReasonCounts([u64; REASON_SLOTS]);

impl Default for ReasonCounts {
    fn default() -> ReasonCounts {
        ReasonCounts([0; REASON_SLOTS])
    }
}

impl ReasonCounts {
    /// Frames counted under `reason` with `verdict`.
    pub fn get(&self, reason: Reason, verdict: Verdict) -> u64 {
        self.0[reason_slot(reason, verdict) as usize]
    }

    /// Frames counted under `reason`, whatever was done with them.
    pub fn total(&self, reason: Reason) -> u64 {
        Verdict::ALL.iter().map(|&v| self.get(reason, v)).sum()
    }

    /// Frames counted under `reason` that the partition rules refused
    /// (dropped, or passed by monitor mode).
    pub fn refused_by(&self, reason: Reason) -> u64 {
        self.get(reason, Verdict::Drop)
            + self.get(reason, Verdict::Monitor)
            + self.get(reason, Verdict::Corrupt)
    }

    /// Frames counted under `reason` that went on: allowed, or refused and
    /// passed by monitor mode.
    pub fn passed_by(&self, reason: Reason) -> u64 {
        self.get(reason, Verdict::Pass) + self.get(reason, Verdict::Monitor)
    }

    /// Frames the partition rules refused, whatever the reason.
    pub fn refused(&self) -> u64 {
        Reason::ALL.iter().map(|&r| self.refused_by(r)).sum()
    }

    /// Counts one frame (for tallies made on the host, as replay's).
    pub fn add(&mut self, reason: Reason, verdict: Verdict) {
        self.0[reason_slot(reason, verdict) as usize] += 1;
    }
}

/// Frames per stamping outcome, in [`Stamp`] order.
pub type StampCounts = [u64; Stamp::COUNT];
/// Verbs per RDMA-probe outcome, in [`Capture`] order.
pub type CaptureCounts = [u64; Capture::COUNT];
/// Events the kernel's budgets held back, per [`EventKind`].
pub type SuppressedCounts = [u64; EventKind::COUNT];

/// The program's maps.
pub struct Maps {
    /// (name, kernel id) of every map, for memory accounting.
    ids: Vec<(&'static str, u32)>,
    /// When this process last retired a generation (None: not known here).
    retired: Option<Instant>,
    active: Array<MapData, u32>,
    config: Array<MapData, Config>,
    qps: QpTable,
    groups: HashMap<MapData, GroupKey, GroupEntry>,
    port_keys: Array<MapData, u32>,
    reasons: PerCpuArray<MapData, u64>,
    xmit_reasons: PerCpuArray<MapData, u64>,
    /// Every QPN's counters, by QPN.
    qp_stats: Array<MapData, QpStats>,
    events: RingBuf<MapData>,
    reports: RingBuf<MapData>,
    event_budget: PerCpuArray<MapData, EventBudget>,
    stamps: PerCpuArray<MapData, u64>,
    captures: PerCpuArray<MapData, u64>,
    violations: Array<MapData, u64>,
    bind_rules: Array<MapData, BindSpec>,
    qkeys: HashMap<MapData, u32, u32>,
    creations: HashMap<MapData, u32, Creation>,
    quarantine: Array<MapData, u64>,
    listed: HashMap<MapData, u64, u8>,
    join_action: Array<MapData, JoinAction>,
    listeners: HashMap<MapData, ListenKey, Creation>,
    connections: HashMap<MapData, u64, u16>,
    cm_state: Array<MapData, u64>,
    /// The other maps, held open.
    _rest: Vec<Map>,
}

/// What a generation holds, as read back from the maps.
struct Held {
    /// The QPNs it has an entry for.
    qps: Vec<u32>,
    groups: Vec<GroupKey>,
    /// `LISTED` keys.
    listed: Vec<u64>,
}

/// A policy written into the idle generation, not live yet
/// ([`Maps::stage`]): [`Maps::flip`] makes it live, [`Maps::discard`]
/// drops it.
#[must_use]
pub struct Staged {
    idle: u32,
    /// Whether the `[[bind]]` rules stay, and with them the probe's
    /// bindings (`carried` into the new generation).
    keep: bool,
    carried: Vec<(u32, QpEntry)>,
}

/// The object's own maps for `--trace`: aya-log's ring buffer (read by
/// `Filter::kernel_log`) and the frame each CPU is to log.
const OWN: [&str; 2] = ["AYA_LOGS", "TRACED"];

/// The maps of a filter by name, before they are typed.
type ByName = StdHashMap<&'static str, Map>;

impl Maps {
    /// Takes the maps out of a freshly loaded object, pinning each under
    /// `pin` when given, and stamps the object with [`LAYOUT_VERSION`].
    pub(crate) fn take(ebpf: &mut Ebpf, pin: Option<&Path>) -> Result<Maps> {
        let mut maps = ByName::new();
        for spec in &MAPS {
            let map = ebpf
                .take_map(spec.name)
                .ok_or_else(|| anyhow!("the XDP object has no map {}", spec.name))?;
            maps.insert(spec.name, map);
        }
        // Data sections (.rodata, .bss) and `--trace`'s maps are the
        // object's own, not shared.
        if let Some((name, _)) = ebpf
            .maps()
            .find(|(name, _)| !name.starts_with('.') && !OWN.contains(name))
        {
            bail!("the XDP object has a map {name} that pkeyfw_common::abi::MAPS does not list");
        }
        let abi = maps.get_mut(name::ABI).context("no map ABI")?;
        Array::<_, u32>::try_from(abi)?
            .set(0, &LAYOUT_VERSION, 0)
            .context("writing ABI")?;

        if let Some(dir) = pin {
            for (name, map) in &maps {
                map.pin(dir.join(name))
                    .with_context(|| format!("pinning map {name} under {}", dir.display()))?;
            }
        }
        Maps::build(maps)
    }

    /// Opens the maps a pinned or foreground attachment pinned under `dir`,
    /// refusing those of another layout.
    pub fn from_pins(dir: &Path) -> Result<Maps> {
        let open = |name: &str| {
            let path = dir.join(name);
            MapData::from_pin(&path)
                .with_context(|| format!("opening pinned map {}", path.display()))
        };
        let another = |found: String| {
            anyhow!(
                "the filter pinned under {} was loaded by a pkeyfw with another map layout ({found}; this one reads layout {LAYOUT_VERSION}): `pkeyfw detach` it and attach again",
                dir.display()
            )
        };
        let abi: Array<_, u32> = Array::try_from(Map::Array(
            open(name::ABI).map_err(|_| another("no layout version".into()))?,
        ))?;
        match abi.get(&0, 0).context("reading ABI")? {
            LAYOUT_VERSION => {}
            v => return Err(another(format!("layout {v}"))),
        }
        let mut maps = ByName::new();
        for spec in &MAPS {
            let data = open(spec.name)?;
            maps.insert(
                spec.name,
                match spec.kind {
                    MapKind::Array => Map::Array(data),
                    MapKind::HashMap => Map::HashMap(data),
                    MapKind::LruHashMap => Map::LruHashMap(data),
                    MapKind::PerCpuArray => Map::PerCpuArray(data),
                    MapKind::RingBuf => Map::RingBuf(data),
                },
            );
        }
        Maps::build(maps)
    }

    fn build(mut maps: ByName) -> Result<Maps> {
        let ids = MAPS
            .iter()
            .map(|spec| Ok((spec.name, data(&maps[spec.name])?.info()?.id())))
            .collect::<Result<_>>()?;
        let qps = match maps.remove(name::QPS) {
            Some(Map::Array(data)) => QpTable::map(data)?,
            _ => bail!("no array map {}", name::QPS),
        };
        let mut take = |name| maps.remove(name);
        Ok(Maps {
            ids,
            retired: None,
            active: typed(take(name::ACTIVE), name::ACTIVE)?,
            config: typed(take(name::CONFIG), name::CONFIG)?,
            qps,
            groups: typed(take(name::GROUPS), name::GROUPS)?,
            port_keys: typed(take(name::PORT_KEYS), name::PORT_KEYS)?,
            reasons: typed(take(name::REASONS), name::REASONS)?,
            xmit_reasons: typed(take(name::XMIT_REASONS), name::XMIT_REASONS)?,
            qp_stats: typed(take(name::QP_STATS), name::QP_STATS)?,
            events: typed(take(name::EVENTS), name::EVENTS)?,
            reports: typed(take(name::REPORTS), name::REPORTS)?,
            event_budget: typed(take(name::EVENT_BUDGET), name::EVENT_BUDGET)?,
            stamps: typed(take(name::STAMPS), name::STAMPS)?,
            captures: typed(take(name::CAPTURES), name::CAPTURES)?,
            violations: typed(take(name::VIOLATIONS), name::VIOLATIONS)?,
            bind_rules: typed(take(name::BIND_RULES), name::BIND_RULES)?,
            qkeys: typed(take(name::QKEYS), name::QKEYS)?,
            creations: typed(take(name::CREATIONS), name::CREATIONS)?,
            quarantine: typed(take(name::QUARANTINE), name::QUARANTINE)?,
            listed: typed(take(name::LISTED), name::LISTED)?,
            join_action: typed(take(name::JOIN_ACTION), name::JOIN_ACTION)?,
            listeners: typed(take(name::LISTENERS), name::LISTENERS)?,
            connections: typed(take(name::CONNECTIONS), name::CONNECTIONS)?,
            cm_state: typed(take(name::CM_STATE), name::CM_STATE)?,
            _rest: maps.into_values().collect(),
        })
    }

    /// The ring buffer of violation events.
    pub fn events(&mut self) -> &mut RingBuf<MapData> {
        &mut self.events
    }

    /// The ring buffer of the probes' reports (joins, Q_Keys, quarantines).
    pub fn reports(&mut self) -> &mut RingBuf<MapData> {
        &mut self.reports
    }

    /// The generation the program reads.
    pub fn active_generation(&self) -> Result<u32> {
        Ok(self.active.get(&0, 0).context("reading ACTIVE")? & 1)
    }

    /// Frames per (reason, verdict), summed over CPUs.
    pub fn reasons(&self) -> Result<ReasonCounts> {
        Ok(ReasonCounts(summed(&self.reasons, name::REASONS)?))
    }

    /// Frames a switch port's outbound check judged, per (reason, verdict),
    /// summed over CPUs.
    pub fn xmit_reasons(&self) -> Result<ReasonCounts> {
        Ok(ReasonCounts(summed(
            &self.xmit_reasons,
            name::XMIT_REASONS,
        )?))
    }

    /// Whether the live policy is a switch port's.
    pub fn switch_port(&self) -> Result<bool> {
        Ok(self.live_config()?.switch != 0)
    }

    /// The interfaces (by index) a switch port's live policy lists as the
    /// ports of its switch.
    pub fn listed(&self) -> Result<HashSet<u32>> {
        let keys = self.listed_keys(self.active_generation()?)?;
        Ok(keys.into_iter().map(|k| k as u32).collect())
    }

    /// Refuses a reload that would make a host port a switch port or back:
    /// the programs attached differ (a switch port always has the egress
    /// program), so that takes a detach and an attach.
    pub fn same_role(&self, policy: &Policy) -> Result<()> {
        let (live, new) = (self.switch_port()?, policy.switch.is_some());
        if live != new {
            let what = |switch| {
                if switch {
                    "a switch port"
                } else {
                    "a host port"
                }
            };
            bail!(
                "the attachment is {} and the new policy makes it {}; detach and attach it instead",
                what(live),
                what(new)
            );
        }
        Ok(())
    }

    /// Frames per stamping outcome, summed over CPUs.
    pub fn stamps(&self) -> Result<StampCounts> {
        summed(&self.stamps, name::STAMPS)
    }

    /// Verbs per RDMA-probe outcome, summed over CPUs.
    pub fn captures(&self) -> Result<CaptureCounts> {
        summed(&self.captures, name::CAPTURES)
    }

    /// Events the kernel held back per kind (over its budget), summed over
    /// CPUs.
    pub fn suppressed(&self) -> Result<SuppressedCounts> {
        self.per_kind(|b| b.suppressed)
    }

    /// Events per kind the budget let through that found their ring full,
    /// summed over CPUs.
    pub fn lost(&self) -> Result<SuppressedCounts> {
        self.per_kind(|b| b.lost)
    }

    /// One `EVENT_BUDGET` count per kind, summed over CPUs.
    fn per_kind(&self, count: impl Fn(&EventBudget) -> u64) -> Result<SuppressedCounts> {
        let mut counts = [0; EventKind::COUNT];
        for (kind, n) in counts.iter_mut().enumerate() {
            let per_cpu = self
                .event_budget
                .get(&(kind as u32), 0)
                .context("reading EVENT_BUDGET")?;
            *n = per_cpu.iter().map(&count).sum();
        }
        Ok(counts)
    }

    /// P_Key and Q_Key violations per partition (15-bit key portion;
    /// [`OTHER_PARTITION`] for keys the port's table does not hold), as an
    /// InfiniBand port counts them: (reason, partition, frames), those that
    /// counted any, in key order.
    pub fn violations(&self) -> Result<Vec<(Reason, u16, u64)>> {
        let mut out = Vec::new();
        let counts: Vec<u64> =
            batch::array_values(self.violations.map()).context("reading VIOLATIONS")?;
        for (key, count) in (0u32..).zip(counts).filter(|&(_, n)| n != 0) {
            let partition = (key & 0x7fff) as u16;
            let reason = [Reason::PkeyViolation, Reason::QkeyViolation]
                .into_iter()
                .find(|&r| violation_key(r, partition, partition != OTHER_PARTITION) == Some(key))
                .with_context(|| format!("VIOLATIONS has a key {key:#x} of no reason"))?;
            out.push((reason, partition, count));
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Whether the active policy stamps.
    pub fn stamping(&self) -> Result<bool> {
        let config = self.live_config()?;
        Ok(config.stamp != 0 || config.access_pkey != 0)
    }

    /// The live generation's settings.
    pub fn live_config(&self) -> Result<Config> {
        self.config
            .get(&self.active_generation()?, 0)
            .context("reading CONFIG")
    }

    /// QPNs the QP table covers: 0 to `qpns() - 1`.
    pub fn qpns(&self) -> u32 {
        self.qps.qpns()
    }

    /// Passed and dropped frames of every QP of the active policy, by QPN.
    pub fn qp_counters(&self) -> Result<Vec<(u32, QpStats)>> {
        let live = self.active_generation()?;
        self.qps
            .entries(live)
            .map(|(qpn, _)| Ok((qpn, self.qp_stats_of(qpn)?)))
            .collect()
    }

    /// The frames counted against QPN `qpn`'s entries.
    fn qp_stats_of(&self, qpn: u32) -> Result<QpStats> {
        self.qp_stats.get(&qpn, 0).context("reading QP_STATS")
    }

    /// Zeroes QPNs `qpns`' counters.
    fn zero_stats(&mut self, qpns: &[u32]) -> Result<()> {
        let zeroed: Vec<(u32, QpStats)> = qpns.iter().map(|&q| (q, QpStats::default())).collect();
        batch::update(self.qp_stats.map(), &zeroed).context("resetting QP_STATS")
    }

    /// QPs the QP-creation probe had no room to bind, quarantined now (a
    /// QP bound since is judged by its binding).
    pub fn quarantined(&self) -> Result<Vec<u32>> {
        let words: Vec<u64> =
            batch::array_values(self.quarantine.map()).context("reading QUARANTINE")?;
        Ok(words
            .iter()
            .enumerate()
            .flat_map(|(i, &w)| {
                (0..64)
                    .filter(move |b| w & (1 << b) != 0)
                    .map(move |b| i as u32 * 64 + b)
            })
            .collect())
    }

    /// Puts QPN `qpn` in quarantine as the QP-creation probe does when it
    /// has no room to bind a QP: the binder's QPs whose maker cannot be
    /// told, and the tests'. A read and a write of the QPN's word, not one
    /// atomic operation: a bit the probe sets in the same word at that
    /// moment (for another QP it had no room for) can be lost.
    pub fn quarantine(&mut self, qpn: u32) -> Result<()> {
        let (word, bit) = quarantine_bit(qpn);
        let old = self
            .quarantine
            .get(&word, 0)
            .context("reading QUARANTINE")?;
        self.quarantine
            .set(word, &(old | bit), 0)
            .context("writing QUARANTINE")
    }

    /// The live policy's `netns` rules (their index among its rules) whose
    /// namespace no longer exists: they match nothing (a cookie is never
    /// reused), which the administrator should know.
    pub fn gone_netns_rules(&self) -> Result<Vec<(usize, u64)>> {
        let rules = self.rules(self.active_generation()?)?;
        let mut by_netns = rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.matchers & matcher::NETNS != 0)
            .map(|(i, r)| (i, r.netns))
            .peekable();
        if by_netns.peek().is_none() {
            return Ok(Vec::new());
        }
        let live = crate::host::netns::live_cookies();
        Ok(by_netns.filter(|(_, c)| !live.contains(c)).collect())
    }

    /// QPs of the live policy by what bound them: `[[qp]]` entries
    /// ("entry"), rules applied by pkeyfw ("rule"), rules applied by the
    /// QP-creation probe ("probe").
    pub fn bound_by(&self) -> Result<[(&'static str, u64); 3]> {
        let mut by = [("entry", 0), ("rule", 0), ("probe", 0)];
        for (_, e) in self.qps.entries(self.active_generation()?) {
            let i = match (e.flags & qp_flags::RULE, e.flags & qp_flags::PROBE) {
                (0, _) => 0,
                (_, 0) => 1,
                _ => 2,
            };
            by[i].1 += 1;
        }
        Ok(by)
    }

    /// Kernel memory of each map (its fdinfo `memlock`), in bytes.
    pub fn memory(&self) -> Result<Vec<(&'static str, u64)>> {
        self.ids
            .iter()
            .map(|&(name, id)| {
                let fd = MapInfo::from_id(id)?.fd()?;
                let info = std::fs::read_to_string(format!(
                    "/proc/self/fdinfo/{}",
                    fd.as_fd().as_raw_fd()
                ))?;
                let bytes = info
                    .lines()
                    .find_map(|l| l.strip_prefix("memlock:"))
                    .and_then(|v| v.trim().parse().ok())
                    .with_context(|| format!("no memlock in the fdinfo of map {name}"))?;
                Ok((name, bytes))
            })
            .collect()
    }

    /// Takes over what the QP-creation and modify probes of the attachment
    /// this one replaces (`old`) knew, before anything is applied: the
    /// Q_Key each QP set, the probe's bindings of the live generation with
    /// their rules (kept by [`apply`](Self::apply) while the rules stay)
    /// and their counts, and the quarantine. A binding whose QPN this
    /// filter's table does not cover is quarantined, not lost.
    pub fn inherit(&mut self, old: &Maps) -> Result<()> {
        let creations: Vec<(u32, Creation)> =
            batch::entries(old.creations.map()).context("reading the old CREATIONS")?;
        batch::update(self.creations.map(), &creations).context("writing CREATIONS")?;
        for item in old.qkeys.iter() {
            let (qpn, qkey) = item.context("reading the old QKEYS")?;
            self.qkeys.insert(&qpn, &qkey, 0).context("writing QKEYS")?;
        }
        let (from, to) = (old.active_generation()?, self.active_generation()?);
        let rules = old.rules(from)?;
        self.write_rules(to, &rules)?;
        let mut quarantine: Vec<u64> =
            batch::array_values(old.quarantine.map()).context("reading the old QUARANTINE")?;
        for (qpn, e) in old.qps.entries(from) {
            if e.flags & qp_flags::PROBE == 0 {
                continue;
            }
            if qpn >= self.qpns() {
                let (word, bit) = quarantine_bit(qpn);
                quarantine[word as usize] |= bit;
                continue;
            }
            let stats = old.qp_stats_of(qpn)?;
            self.qp_stats
                .set(qpn, &stats, 0)
                .context("writing QP_STATS")?;
            self.qps.set(to, qpn, Some(e))?;
        }
        let words: Vec<(u32, u64)> = (0..).zip(quarantine).filter(|&(_, w)| w != 0).collect();
        batch::update(self.quarantine.map(), &words).context("writing QUARANTINE")?;
        self.inherit_connection_setup(old)
    }

    /// The connection probes' records of the attachment this one replaces:
    /// its listeners (and how many found no room), its connections.
    fn inherit_connection_setup(&mut self, old: &Maps) -> Result<()> {
        let listeners = old.listeners()?;
        batch::update(self.listeners.map(), &listeners).context("writing LISTENERS")?;
        let connections: Vec<(u64, u16)> =
            batch::entries(old.connections.map()).context("reading the old CONNECTIONS")?;
        batch::update(self.connections.map(), &connections).context("writing CONNECTIONS")?;
        let unrecorded = old.unrecorded_listeners()?;
        self.cm_state
            .set(cm_state::UNRECORDED, &unrecorded, 0)
            .context("writing CM_STATE")
    }

    /// Takes what the replaced attachment's connection probes recorded
    /// since [`Maps::inherit`] (`then`: what was taken then): a listener
    /// or connection recorded or forgotten meanwhile is here too.
    fn inherit_late_connection_setup(
        &mut self,
        old: &Maps,
        then: &BTreeMap<ListenKey, Creation>,
    ) -> Result<()> {
        let now: BTreeMap<ListenKey, Creation> = old.listeners()?.into_iter().collect();
        follow(&mut self.listeners, then, &now, name::LISTENERS)?;
        let connections: Vec<(u64, u16)> =
            batch::entries(old.connections.map()).context("reading the old CONNECTIONS")?;
        batch::update(self.connections.map(), &connections).context("writing CONNECTIONS")?;
        let unrecorded = old.unrecorded_listeners()?;
        if unrecorded > self.unrecorded_listeners()? {
            self.cm_state
                .set(cm_state::UNRECORDED, &unrecorded, 0)
                .context("writing CM_STATE")?;
        }
        Ok(())
    }

    /// The rdma_cm listeners the probes recorded, with who made each.
    pub fn listeners(&self) -> Result<Vec<(ListenKey, Creation)>> {
        batch::entries(self.listeners.map()).context("reading LISTENERS")
    }

    /// Records a listener as the listen probe does, unless one holds its
    /// key: whether it was. (Listeners that were listening before any
    /// probe ran, and the tests'.)
    pub fn record_listener(&mut self, key: &ListenKey, creator: &Creation) -> Result<bool> {
        // BPF_NOEXIST.
        match self.listeners.insert(key, creator, 1) {
            Ok(()) => Ok(true),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {
                Ok(false)
            }
            Err(e) => Err(anyhow!(e).context("writing LISTENERS")),
        }
    }

    /// Says how many listeners are not recorded for want of room (see
    /// `cm_state::UNRECORDED`): none once every one that exists is.
    pub fn set_unrecorded_listeners(&mut self, n: u64) -> Result<()> {
        self.cm_state
            .set(cm_state::UNRECORDED, &n, 0)
            .context("writing CM_STATE")
    }

    /// Listeners the probe found no room to record (see
    /// `cm_state::UNRECORDED`).
    pub fn unrecorded_listeners(&self) -> Result<u64> {
        self.cm_state
            .get(&cm_state::UNRECORDED, 0)
            .context("reading CM_STATE")
    }

    /// Which records of connection setup the probes keep
    /// (`cm_state::RECORDS` bits).
    pub fn cm_records(&self) -> Result<u64> {
        self.cm_state
            .get(&cm_state::RECORDS, 0)
            .context("reading CM_STATE")
    }

    /// Says which records of connection setup the probes keep: the loader,
    /// once the probes that keep them are attached (or none, where none
    /// could be).
    pub fn set_cm_records(&mut self, records: u64) -> Result<()> {
        self.cm_state
            .set(cm_state::RECORDS, &records, 0)
            .context("writing CM_STATE")
    }

    /// What the replaced attachment's probes saw after [`Maps::inherit`]
    /// and until now: they ran until this attachment's probes did, and
    /// both since, so theirs is the whole story. Its records and Q_Keys
    /// become this filter's; the QPNs whose record changed meanwhile (a QP
    /// destroyed, or its number handed to a new one) lose what the probes
    /// bound here for them, and are returned: to be bound afresh.
    pub fn inherit_late(&mut self, old: &Maps) -> Result<Vec<u32>> {
        let listeners = self.listeners()?.into_iter().collect();
        self.inherit_late_connection_setup(old, &listeners)?;
        let then = self.creations()?;
        let now = old.creations()?;
        let changed = follow(&mut self.creations, &then, &now, name::CREATIONS)?;
        for &qpn in &changed {
            self.forget_probed(qpn);
        }
        let keys: Vec<(u32, u32)> = old
            .qkeys
            .iter()
            .collect::<Result<_, _>>()
            .context("reading the old QKEYS")?;
        for qpn in self.qkeys.keys().collect::<Result<Vec<u32>, _>>()? {
            if !keys.iter().any(|(q, _)| *q == qpn) {
                ignore_missing(self.qkeys.remove(&qpn)).context("writing QKEYS")?;
            }
        }
        for (qpn, qkey) in keys {
            self.qkeys.insert(&qpn, &qkey, 0).context("writing QKEYS")?;
        }
        Ok(changed)
    }

    /// Drops what the probes bound for QPN `qpn` (its entries in both
    /// generations): a QP gone, or another's now.
    fn forget_probed(&mut self, qpn: u32) {
        for g in 0..GENERATIONS {
            if let Some(e) = self
                .qps
                .get(g, qpn)
                .filter(|e| e.flags & qp_flags::PROBE != 0)
            {
                self.qps.replace(g, qpn, Some(e), None);
            }
        }
    }

    /// Forgets every record of who made the QPs and the listeners: no
    /// probe keeps them current (a later QP with a number would be taken
    /// for the last one's, a listener that went would hold its key from
    /// the next), so every QP is read from `/proc` again.
    pub fn forget_creations(&mut self) -> Result<()> {
        for qpn in self.creations.keys().collect::<Result<Vec<u32>, _>>()? {
            ignore_missing(self.creations.remove(&qpn)).context("writing CREATIONS")?;
        }
        for key in self
            .listeners
            .keys()
            .collect::<Result<Vec<ListenKey>, _>>()?
        {
            ignore_missing(self.listeners.remove(&key)).context("writing LISTENERS")?;
        }
        Ok(())
    }

    /// Who made each QP the probes saw created, by QPN (see [`Creation`]).
    pub fn creations(&self) -> Result<BTreeMap<u32, Creation>> {
        let entries: Vec<(u32, Creation)> =
            batch::entries(self.creations.map()).context("reading CREATIONS")?;
        Ok(entries.into_iter().collect())
    }

    /// Switches the program to `policy`. The policy is written into the idle
    /// generation and made live by one write to `ACTIVE`: every frame is judged
    /// by the old policy or the new one, never a mix. On error the running
    /// policy stays in force and the idle generation is left empty.
    pub fn apply(&mut self, policy: &Policy) -> Result<()> {
        let staged = self.stage(policy)?;
        self.flip(&staged)?;
        self.settle(staged, policy)
    }

    /// Writes `policy` into the idle generation, which no frame reads: the
    /// first half of [`apply`](Self::apply), so that several filters (a
    /// switch's ports) can all take a policy before any switches to it. On
    /// error the idle generation is left empty.
    pub fn stage(&mut self, policy: &Policy) -> Result<Staged> {
        if let Some(qpn) = policy.qps.keys().find(|&&q| q >= self.qpns()) {
            bail!(
                "the policy binds a QP the filter has no room for: {}; `pkeyfw detach` and attach again to make a table for it",
                self.qps.beyond(*qpn)
            );
        }
        if policy.groups.len() > (GROUP_CAPACITY / GENERATIONS) as usize {
            bail!(
                "the policy has {} multicast groups; at most {} are supported",
                policy.groups.len(),
                GROUP_CAPACITY / GENERATIONS
            );
        }
        let active = self.active_generation()?;
        let idle = 1 - active;
        let rules: Vec<BindSpec> = policy.specs();
        // While the rules stay, what the probe bound at creation stays: it
        // saw the creator, which /proc no longer may (a thread gone, a
        // setuid exec since).
        let keep = self.rules(active)? == rules;
        self.clear(idle)?;
        let held: Vec<(u32, QpEntry)> = self.qps.entries(active).collect();
        let live = held.iter().map(|(q, _)| *q).collect();
        let carried = held
            .into_iter()
            .filter(|(q, e)| keep && e.flags & qp_flags::PROBE != 0 && !is_entry(policy, *q))
            .collect::<Vec<_>>();
        let written = self
            .write(idle, policy, &rules, &live)
            .and_then(|()| self.put(idle, &carried));
        if let Err(e) = written {
            let _ = self.clear(idle);
            return Err(e.context("the running policy is unchanged"));
        }
        Ok(Staged {
            idle,
            keep,
            carried,
        })
    }

    /// Makes a staged policy live: one write to `ACTIVE`, after every entry
    /// of it (stored through the table's memory) is visible to every CPU.
    pub fn flip(&mut self, staged: &Staged) -> Result<()> {
        fence(Ordering::SeqCst);
        self.active
            .set(0, &staged.idle, 0)
            .context("switching ACTIVE")?;
        self.retired = Some(Instant::now());
        Ok(())
    }

    /// Makes the policy a [`flip`](Self::flip) retired live again (its
    /// generation is untouched until the next [`stage`](Self::stage)).
    pub fn unflip(&mut self, staged: &Staged) -> Result<()> {
        self.active
            .set(0, &(1 - staged.idle), 0)
            .context("switching ACTIVE back")
    }

    /// Drops a staged policy that is not live.
    pub fn discard(&mut self, staged: Staged) -> Result<()> {
        self.clear(staged.idle)
    }

    /// After [`flip`](Self::flip): the probe's bindings made in the retired
    /// generation meanwhile carried into the live one (see
    /// [`settle_probed`](Self::settle_probed)).
    pub fn settle(&mut self, staged: Staged, policy: &Policy) -> Result<()> {
        if !staged.keep {
            return Ok(());
        }
        // The probe wrote the retired generation until now (a run of it
        // that read ACTIVE before the switch is over within this).
        std::thread::sleep(Duration::from_millis(1));
        self.settle_probed(1 - staged.idle, staged.idle, &staged.carried, &|q: &u32| {
            is_entry(policy, *q)
        })
    }

    /// After a switch with the rules kept: the probe's bindings in the new
    /// generation `new` made as in the retired one `old`, which the probe
    /// kept current while `new` was written. What was carried over and not
    /// touched since follows `old` (a QP destroyed meanwhile goes, one
    /// created anew with the number is rebound); a QP the probe bound only
    /// in `old` meanwhile is added. An entry the probe wrote into `new`
    /// since the switch is left alone: each change is an exchange of the
    /// entry read for the new one.
    fn settle_probed(
        &mut self,
        old: u32,
        new: u32,
        carried: &[(u32, QpEntry)],
        entry: &impl Fn(&u32) -> bool,
    ) -> Result<()> {
        let probe_bound = |qps: &QpTable, g: u32, qpn: u32| {
            qps.get(g, qpn).filter(|e| e.flags & qp_flags::PROBE != 0)
        };
        for &(qpn, put) in carried {
            match probe_bound(&self.qps, old, qpn) {
                Some(e) if e == put => {}
                now => {
                    self.qps.replace(new, qpn, Some(put), now);
                }
            }
        }
        let late: Vec<(u32, QpEntry)> = self
            .qps
            .entries(old)
            .filter(|(qpn, e)| e.flags & qp_flags::PROBE != 0 && !entry(qpn))
            .collect();
        for (qpn, e) in late {
            self.qps.replace(new, qpn, None, Some(e));
        }
        Ok(())
    }

    /// Writes QP-table entries into generation `g` as they are.
    fn put(&mut self, g: u32, entries: &[(u32, QpEntry)]) -> Result<()> {
        for &(qpn, e) in entries {
            self.qps.set(g, qpn, Some(e))?;
        }
        Ok(())
    }

    /// Generation `g`'s rules as the probe reads them (the unused slots
    /// left out).
    fn rules(&self, g: u32) -> Result<Vec<BindSpec>> {
        let mut rules = Vec::new();
        for i in 0..MAX_RULES {
            let spec = self
                .bind_rules
                .get(&(g * MAX_RULES + i), 0)
                .context("reading BIND_RULES")?;
            if spec == BindSpec::default() {
                break;
            }
            rules.push(spec);
        }
        Ok(rules)
    }

    /// Binds (or rebinds) one QP in the live generation, in place: one
    /// entry, stored whole, and nothing else of the policy changes. A new
    /// QP's counters start from zero. A rule binding the QP-creation probe
    /// made stays: it saw the QP's creator, and may hold the Q_Key the QP
    /// set since (the entry is exchanged only for the one read, so one the
    /// probe stores meanwhile stands too).
    pub fn bind_live(&mut self, qpn: u32, rule: &QpRule) -> Result<()> {
        let g = self.active_generation()?;
        ensure!(qpn < self.qpns(), "{}", self.qps.beyond(qpn));
        let existing = self.qps.get(g, qpn);
        if existing.is_some_and(|e| e.flags & qp_flags::PROBE != 0) {
            return Ok(());
        }
        let rule = &self.with_qkey(qpn, rule);
        if existing.is_none() {
            self.zero_stats(&[qpn])?;
        }
        self.qps
            .replace(g, qpn, existing, Some(Policy::qp_entry(rule)));
        Ok(())
    }

    /// Removes one QP from the live generation, in place (a stored zero).
    /// The probe's bindings stay: it removes them when their QP is
    /// destroyed.
    pub fn unbind_live(&mut self, qpn: u32) -> Result<()> {
        let g = self.active_generation()?;
        if let Some(e) = self
            .qps
            .get(g, qpn)
            .filter(|e| e.flags & qp_flags::PROBE == 0)
        {
            self.qps.replace(g, qpn, Some(e), None);
        }
        Ok(())
    }

    /// A rule that binds a UD QP with its own Q_Key, with the one it set if
    /// the probe saw it.
    fn with_qkey(&self, qpn: u32, rule: &QpRule) -> QpRule {
        let mut rule = *rule;
        if rule.flags & qp_flags::OWN_QKEY != 0 && rule.qkey.is_none() {
            rule.qkey = self.qkeys.get(&qpn, 0).ok();
        }
        rule
    }

    /// Writes generation `g`'s `[[bind]]` rules for the QP-creation probe
    /// (the rest of its slots emptied).
    fn write_rules(&mut self, g: u32, rules: &[BindSpec]) -> Result<()> {
        for i in 0..MAX_RULES {
            let spec = rules.get(i as usize).copied().unwrap_or_default();
            self.bind_rules
                .set(g * MAX_RULES + i, &spec, 0)
                .context("writing BIND_RULES")?;
        }
        Ok(())
    }

    /// Writes `policy` into generation `g`, which no frame reads. QPs the
    /// active policy binds (`live`) keep their counters; new ones start
    /// from zero.
    fn write(
        &mut self,
        g: u32,
        policy: &Policy,
        rules: &[BindSpec],
        live: &HashSet<u32>,
    ) -> Result<()> {
        self.write_rules(g, rules)?;
        // A new serial first: it empties the generation's port table, and
        // stays taken even if what follows fails.
        let serial = self.next_port_serial(g)?;
        let config = Config {
            port_serial: serial,
            ..policy.config()
        };
        self.config.set(g, &config, 0).context("writing CONFIG")?;
        self.join_action
            .set(g, &(policy.join_action() as JoinAction), 0)
            .context("writing JOIN_ACTION")?;
        for (key, flags) in policy.port_flags() {
            self.port_keys
                .set(port_key_index(g, key), &port_entry(serial, flags), 0)
                .context("writing PORT_KEYS")?;
        }
        let zeroed: Vec<u32> = policy
            .qps
            .keys()
            .copied()
            .filter(|q| !live.contains(q))
            .collect();
        self.zero_stats(&zeroed)?;
        for (&qpn, rule) in &policy.qps {
            let rule = self.with_qkey(qpn, rule);
            self.qps.set(g, qpn, Some(Policy::qp_entry(&rule)))?;
        }
        for (addr, group) in &policy.groups {
            let key = GroupKey {
                generation: g,
                addr: *addr,
            };
            self.groups
                .insert(&key, &group.entry(), 0)
                .with_context(|| format!("writing GROUPS entry {}", group.addr))?;
        }
        // By index in this (the ports') namespace: a port that does not
        // exist has nothing to send, and one made later with its name is
        // not listed until the policy is applied again.
        for index in policy
            .listed
            .iter()
            .filter_map(|i| netlink::if_index(i).ok())
        {
            self.listed
                .insert(&listed_key(g, index), &1, 0)
                .with_context(|| format!("writing LISTED entry {index}"))?;
        }
        Ok(())
    }

    /// The `PORT_KEYS` serial for a new policy in generation `g`, which no
    /// frame reads: one more than its last, or, once the serials run out, 1
    /// with every entry of the generation zeroed.
    fn next_port_serial(&mut self, g: u32) -> Result<u32> {
        let last = self
            .config
            .get(&g, 0)
            .context("reading CONFIG")?
            .port_serial;
        if let Some(next) = last.checked_add(1).filter(|&s| s < 1 << PORT_SERIAL_BITS) {
            return Ok(next);
        }
        let zeroed: Vec<(u32, u32)> = (0..PARTITIONS)
            .map(|p| (port_key_index(g, p as u16), 0))
            .collect();
        batch::update(self.port_keys.map(), &zeroed).context("clearing PORT_KEYS")?;
        Ok(1)
    }

    /// What generation `g` holds, read from the maps (its port table is
    /// emptied by a new serial, so not listed).
    fn held(&self, g: u32) -> Result<Held> {
        let groups = self
            .groups
            .keys()
            .filter(|k| k.as_ref().map_or(true, |k| k.generation == g))
            .collect::<Result<_, _>>()
            .context("reading GROUPS")?;
        Ok(Held {
            qps: self.qps.entries(g).map(|(qpn, _)| qpn).collect(),
            groups,
            listed: self.listed_keys(g)?,
        })
    }

    /// Generation `g`'s `LISTED` keys.
    fn listed_keys(&self, g: u32) -> Result<Vec<u64>> {
        self.listed
            .keys()
            .filter(|k| k.as_ref().map_or(true, |k| k >> 32 == u64::from(g)))
            .collect::<Result<_, _>>()
            .context("reading LISTED")
    }

    /// Empties generation `g`, once nothing can still be reading it.
    fn clear(&mut self, g: u32) -> Result<()> {
        let held = self.held(g)?;
        let empty = held.qps.is_empty() && held.groups.is_empty() && held.listed.is_empty();
        // A generation never written needs no wait; any other may still be
        // read, if only its settings and port table, which are rewritten
        // next.
        if empty && self.config.get(&g, 0).context("reading CONFIG")? == Config::default() {
            return Ok(());
        }
        let since = self.retired.map_or(Duration::ZERO, |r| r.elapsed());
        std::thread::sleep(GRACE.saturating_sub(since));
        for qpn in held.qps {
            self.qps.set(g, qpn, None)?;
        }
        for key in held.groups {
            ignore_missing(self.groups.remove(&key))?;
        }
        for key in held.listed {
            ignore_missing(self.listed.remove(&key))?;
        }
        Ok(())
    }
}

/// Whether `policy` binds `qpn` by a `[[qp]]` entry (which wins over what
/// the probe bound).
fn is_entry(policy: &Policy, qpn: u32) -> bool {
    policy
        .qps
        .get(&qpn)
        .is_some_and(|r| r.flags & qp_flags::RULE == 0)
}

/// The first `N` counters of a per-CPU counter map, each summed over CPUs.
fn summed<const N: usize>(map: &PerCpuArray<MapData, u64>, name: &str) -> Result<[u64; N]> {
    let mut counts = [0; N];
    for (slot, count) in counts.iter_mut().enumerate() {
        let per_cpu = map
            .get(&(slot as u32), 0)
            .with_context(|| format!("reading {name}"))?;
        *count = per_cpu.iter().sum();
    }
    Ok(counts)
}

fn typed<T: TryFrom<Map, Error = MapError>>(map: Option<Map>, name: &str) -> Result<T> {
    let map = map.with_context(|| format!("no map {name}"))?;
    T::try_from(map).with_context(|| format!("map {name}"))
}

/// The map data behind the map kinds pkeyfw uses.
fn data(map: &Map) -> Result<&MapData> {
    match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::RingBuf(d) => Ok(d),
        _ => bail!("unexpected map kind"),
    }
}

/// Brings `map`, whose entries were `then`, to `now`: the keys whose entry
/// changed (removed, added or replaced), in order.
fn follow<K: Pod + Ord, V: Pod + PartialEq>(
    map: &mut HashMap<MapData, K, V>,
    then: &BTreeMap<K, V>,
    now: &BTreeMap<K, V>,
    name: &str,
) -> Result<Vec<K>> {
    let mut changed = Vec::new();
    for (key, v) in then {
        if now.get(key) != Some(v) {
            ignore_missing(map.remove(key)).with_context(|| format!("writing {name}"))?;
            changed.push(*key);
        }
    }
    for (key, v) in now {
        if then.get(key) != Some(v) {
            map.insert(key, v, 0)
                .with_context(|| format!("writing {name}"))?;
            changed.push(*key);
        }
    }
    changed.sort_unstable();
    changed.dedup();
    Ok(changed)
}

/// `remove` of a key that is not there is not an error when clearing.
/// (aya reports a delete's ENOENT as a failed syscall; the QP-creation
/// and destroy probes may remove an entry first.)
fn ignore_missing(r: Result<(), MapError>) -> Result<()> {
    match r {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
