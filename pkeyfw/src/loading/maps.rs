//! The XDP program's maps, typed: opening them (from a fresh load or from
//! bpffs pins), switching them to a policy without ever exposing a half-written
//! one, and reading the counters.
//!
//! Everything a later process needs is in the maps themselves (which QPs each
//! generation binds, which stats slot each uses), so `pkeyfw reload` in
//! another process switches a pinned filter exactly as the process that
//! attached it would.

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{Array, HashMap, Map, MapData, MapError, MapInfo, PerCpuArray, RingBuf},
};
use pkeyfw_common::{
    Reason, Stamp,
    abi::{
        Config, ConnKey, GENERATIONS, GROUP_CAPACITY, GroupEntry, GroupKey, QPN_MASK, QpEntry,
        QpStats, name, port_key_index, qp_key,
    },
};

use crate::policy::{Conn, Policy, QpRule};

/// How long a retired policy generation stays untouched before it is
/// rewritten: far longer than any XDP program run, which is all that could
/// still be reading it.
const GRACE: Duration = Duration::from_millis(20);

/// Frames per reason, in [`Reason`] order.
pub type ReasonCounts = [u64; Reason::COUNT];
/// Frames per stamping outcome, in [`Stamp`] order.
pub type StampCounts = [u64; Stamp::COUNT];

/// Every map, in the order [`Maps::build`] takes them.
const MAP_NAMES: [&str; 10] = [
    name::ACTIVE,
    name::CONFIG,
    name::QPS,
    name::GROUPS,
    name::PORT_KEYS,
    name::REASONS,
    name::QP_STATS,
    name::EVENTS,
    name::CONNS,
    name::STAMPS,
];

/// The program's maps.
pub struct Maps {
    /// (name, kernel id) of every map, for memory accounting.
    ids: Vec<(&'static str, u32)>,
    /// QPs a policy may bind: the size of `QP_STATS`.
    capacity: u32,
    /// When this process last retired a generation (None: not known here).
    retired: Option<Instant>,
    active: Array<MapData, u32>,
    config: Array<MapData, Config>,
    qps: HashMap<MapData, u32, QpEntry>,
    groups: HashMap<MapData, GroupKey, GroupEntry>,
    port_keys: HashMap<MapData, u32, u8>,
    reasons: PerCpuArray<MapData, u64>,
    qp_stats: Array<MapData, QpStats>,
    events: RingBuf<MapData>,
    conns: HashMap<MapData, ConnKey, u32>,
    stamps: PerCpuArray<MapData, u64>,
}

/// What a generation holds, as read back from the maps.
struct Held {
    qps: Vec<(u32, QpEntry)>,
    groups: Vec<GroupKey>,
    port_keys: Vec<u32>,
    conns: Vec<ConnKey>,
}

impl Maps {
    /// Takes the maps out of a freshly loaded object, pinning each under
    /// `pin` when given.
    pub(crate) fn take(ebpf: &mut Ebpf, pin: Option<&Path>) -> Result<Maps> {
        let maps = MAP_NAMES.map(|name| {
            let map = ebpf
                .take_map(name)
                .ok_or_else(|| anyhow!("the XDP object has no map {name}"))?;
            if let Some(dir) = pin {
                map.pin(dir.join(name))
                    .with_context(|| format!("pinning map {name} under {}", dir.display()))?;
            }
            Ok(map)
        });
        Maps::build(maps)
    }

    /// Opens the maps a pinned or foreground attachment pinned under `dir`.
    pub fn from_pins(dir: &Path) -> Result<Maps> {
        let maps = MAP_NAMES.map(|name| {
            let path = dir.join(name);
            let data = MapData::from_pin(&path)
                .with_context(|| format!("opening pinned map {}", path.display()))?;
            Ok(match name {
                name::QPS | name::GROUPS | name::PORT_KEYS | name::CONNS => Map::HashMap(data),
                name::REASONS | name::STAMPS => Map::PerCpuArray(data),
                name::EVENTS => Map::RingBuf(data),
                _ => Map::Array(data),
            })
        });
        Maps::build(maps)
    }

    fn build(maps: [Result<Map>; MAP_NAMES.len()]) -> Result<Maps> {
        let maps = maps.into_iter().collect::<Result<Vec<Map>>>()?;
        let ids = MAP_NAMES
            .iter()
            .zip(&maps)
            .map(|(&name, map)| Ok((name, data(map)?.info()?.id())))
            .collect::<Result<_>>()?;
        let [
            active,
            config,
            qps,
            groups,
            port_keys,
            reasons,
            qp_stats,
            events,
            conns,
            stamps,
        ] = <[Map; MAP_NAMES.len()]>::try_from(maps).map_err(|_| anyhow!("one map per name"))?;
        let capacity = data(&qp_stats)?.info()?.max_entries();
        Ok(Maps {
            ids,
            capacity,
            retired: None,
            active: typed(active, name::ACTIVE)?,
            config: typed(config, name::CONFIG)?,
            qps: typed(qps, name::QPS)?,
            groups: typed(groups, name::GROUPS)?,
            port_keys: typed(port_keys, name::PORT_KEYS)?,
            reasons: typed(reasons, name::REASONS)?,
            qp_stats: typed(qp_stats, name::QP_STATS)?,
            events: typed(events, name::EVENTS)?,
            conns: typed(conns, name::CONNS)?,
            stamps: typed(stamps, name::STAMPS)?,
        })
    }

    /// The ring buffer of violation events.
    pub fn events(&mut self) -> &mut RingBuf<MapData> {
        &mut self.events
    }

    /// The generation the program reads.
    pub fn active_generation(&self) -> Result<u32> {
        Ok(self.active.get(&0, 0).context("reading ACTIVE")? & 1)
    }

    /// Frames per reason, summed over CPUs.
    pub fn reasons(&self) -> Result<ReasonCounts> {
        let mut counts = [0; Reason::COUNT];
        for reason in Reason::ALL {
            let per_cpu = self
                .reasons
                .get(&reason.index(), 0)
                .context("reading REASONS")?;
            counts[reason.index() as usize] = per_cpu.iter().sum();
        }
        Ok(counts)
    }

    /// Frames per stamping outcome, summed over CPUs.
    pub fn stamps(&self) -> Result<StampCounts> {
        let mut counts = [0; Stamp::COUNT];
        for stamp in Stamp::ALL {
            let per_cpu = self
                .stamps
                .get(&stamp.index(), 0)
                .context("reading STAMPS")?;
            counts[stamp.index() as usize] = per_cpu.iter().sum();
        }
        Ok(counts)
    }

    /// Whether the active policy stamps.
    pub fn stamping(&self) -> Result<bool> {
        let config = self
            .config
            .get(&self.active_generation()?, 0)
            .context("reading CONFIG")?;
        Ok(config.stamp != 0)
    }

    /// Passed and dropped frames of every QP of the active policy, by QPN.
    pub fn qp_counters(&self) -> Result<Vec<(u32, QpStats)>> {
        let held = self.held(self.active_generation()?)?;
        let mut out = held
            .qps
            .into_iter()
            .map(|(qpn, entry)| {
                let stats = self
                    .qp_stats
                    .get(&entry.slot, 0)
                    .context("reading QP_STATS")?;
                Ok((qpn, stats))
            })
            .collect::<Result<Vec<_>>>()?;
        out.sort_unstable_by_key(|&(qpn, _)| qpn);
        Ok(out)
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

    /// Switches the program to `policy`. The policy is written into the idle
    /// generation and made live by one write to `ACTIVE`: every frame is judged
    /// by the old policy or the new one, never a mix. On error the running
    /// policy stays in force and the idle generation is left empty.
    pub fn apply(&mut self, policy: &Policy) -> Result<()> {
        if policy.qps.len() > self.capacity as usize {
            bail!(
                "the policy binds {} QPs; this filter was loaded for at most {}",
                policy.qps.len(),
                self.capacity
            );
        }
        if policy.conns.len() > self.capacity as usize {
            bail!(
                "the policy has {} connections; this filter was loaded for at most {}",
                policy.conns.len(),
                self.capacity
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
        self.clear(idle)?;
        let slots = self
            .held(active)?
            .qps
            .into_iter()
            .map(|(q, e)| (q, e.slot))
            .collect();
        if let Err(e) = self.write(idle, policy, slots) {
            let _ = self.clear(idle);
            return Err(e.context("the running policy is unchanged"));
        }
        self.active.set(0, &idle, 0).context("switching ACTIVE")?;
        self.retired = Some(Instant::now());
        Ok(())
    }

    /// Binds (or rebinds) one QP in the live generation, in place: one map
    /// entry, which a frame sees whole or not at all, and nothing else of the
    /// policy changes. A new QP gets a zeroed stats slot.
    pub fn bind_live(&mut self, qpn: u32, rule: &QpRule) -> Result<()> {
        let g = self.active_generation()?;
        let held = self.held(g)?.qps;
        let slot = match held.iter().find(|(q, _)| *q == qpn) {
            Some((_, e)) => e.slot,
            None => {
                let used: HashSet<u32> = held.iter().map(|(_, e)| e.slot).collect();
                let slot = (0..self.capacity)
                    .find(|s| !used.contains(s))
                    .context("no free QP stats slot")?;
                self.qp_stats
                    .set(slot, &QpStats::default(), 0)
                    .context("resetting QP_STATS")?;
                slot
            }
        };
        self.qps
            .insert(&qp_key(g, qpn), &Policy::qp_entry(rule, slot), 0)
            .with_context(|| format!("writing QPS entry {qpn:#x}"))
    }

    /// Removes one QP from the live generation, in place.
    pub fn unbind_live(&mut self, qpn: u32) -> Result<()> {
        let g = self.active_generation()?;
        ignore_missing(self.qps.remove(&qp_key(g, qpn)))
    }

    /// Writes `policy` into generation `g`, which no frame reads. QPs the
    /// active policy binds keep their stats slot; new ones get a zeroed one.
    fn write(&mut self, g: u32, policy: &Policy, mut slots: StdHashMap<u32, u32>) -> Result<()> {
        self.config
            .set(g, &policy.config(), 0)
            .context("writing CONFIG")?;
        for (key, flags) in policy.port_flags() {
            self.port_keys
                .insert(&port_key_index(g, key), &flags, 0)
                .context("writing PORT_KEYS")?;
        }
        let used: HashSet<u32> = slots.values().copied().collect();
        let mut free = (0..self.capacity).filter(|s| !used.contains(s));
        for (&qpn, rule) in &policy.qps {
            let slot = match slots.get(&qpn) {
                Some(&slot) => slot,
                None => {
                    let slot = free.next().context("no free QP stats slot")?;
                    self.qp_stats
                        .set(slot, &QpStats::default(), 0)
                        .context("resetting QP_STATS")?;
                    slots.insert(qpn, slot);
                    slot
                }
            };
            self.qps
                .insert(&qp_key(g, qpn), &Policy::qp_entry(rule, slot), 0)
                .with_context(|| format!("writing QPS entry {qpn:#x}"))?;
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
        for (conn, &local) in &policy.conns {
            self.conns
                .insert(&conn_key(g, conn), &local, 0)
                .with_context(|| format!("writing CONNS entry for local QP {local:#x}"))?;
        }
        Ok(())
    }

    /// What generation `g` holds, read from the maps.
    fn held(&self, g: u32) -> Result<Held> {
        let qps = self
            .qps
            .iter()
            .filter_map(|item| match item {
                Ok((key, entry)) if key >> 24 == g => Some(Ok((key & QPN_MASK, entry))),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<_, _>>()
            .context("reading QPS")?;
        let groups = self
            .groups
            .keys()
            .filter(|k| k.as_ref().map_or(true, |k| k.generation == g))
            .collect::<Result<_, _>>()
            .context("reading GROUPS")?;
        let port_keys = self
            .port_keys
            .keys()
            .filter(|k| {
                k.as_ref().map_or(true, |&k| {
                    port_key_index(g, 0) <= k && k < port_key_index(g + 1, 0)
                })
            })
            .collect::<Result<_, _>>()
            .context("reading PORT_KEYS")?;
        let conns = self
            .conns
            .keys()
            .filter(|k| k.as_ref().map_or(true, |k| k.generation == g))
            .collect::<Result<_, _>>()
            .context("reading CONNS")?;
        Ok(Held {
            qps,
            groups,
            port_keys,
            conns,
        })
    }

    /// Empties generation `g`, once nothing can still be reading it.
    fn clear(&mut self, g: u32) -> Result<()> {
        let held = self.held(g)?;
        if held.qps.is_empty()
            && held.groups.is_empty()
            && held.port_keys.is_empty()
            && held.conns.is_empty()
        {
            return Ok(());
        }
        let since = self.retired.map_or(Duration::ZERO, |r| r.elapsed());
        std::thread::sleep(GRACE.saturating_sub(since));
        for (qpn, _) in held.qps {
            ignore_missing(self.qps.remove(&qp_key(g, qpn)))?;
        }
        for key in held.groups {
            ignore_missing(self.groups.remove(&key))?;
        }
        for key in held.port_keys {
            ignore_missing(self.port_keys.remove(&key))?;
        }
        for key in held.conns {
            ignore_missing(self.conns.remove(&key))?;
        }
        Ok(())
    }
}

/// The `CONNS` key of a connection in generation `g`.
fn conn_key(g: u32, conn: &Conn) -> ConnKey {
    ConnKey {
        generation: g,
        remote_qpn: conn.remote_qpn,
        addr: conn.peer.map_or([0; 16], crate::policy::Group::key_addr),
    }
}

fn typed<T: TryFrom<Map, Error = MapError>>(map: Map, name: &str) -> Result<T> {
    T::try_from(map).with_context(|| format!("map {name}"))
}

/// The map data behind the map kinds pkeyfw uses.
fn data(map: &Map) -> Result<&MapData> {
    match map {
        Map::Array(d) | Map::HashMap(d) | Map::PerCpuArray(d) | Map::RingBuf(d) => Ok(d),
        _ => bail!("unexpected map kind"),
    }
}

/// `remove` of a key that is not there is not an error when clearing.
fn ignore_missing(r: Result<(), MapError>) -> Result<()> {
    match r {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
