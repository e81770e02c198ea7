//! The loaded XDP program and its maps: filling them from a policy (without
//! ever exposing a half-written one), running frames through the program with
//! BPF_PROG_TEST_RUN, and reading the counters.

use std::{
    collections::HashMap as StdHashMap,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, MapInfo, PerCpuArray, RingBuf},
    programs::{TestRun, TestRunOptions, Xdp, XdpMode, links::FdLink},
};
use pkeyfw_common::{
    Reason,
    maps::{
        Config, DEFAULT_QP_CAPACITY, GENERATIONS, GROUP_CAPACITY, GroupEntry, GroupKey, QpEntry,
        QpStats, name, port_key_index, qp_key,
    },
};

use crate::policy::Policy;

/// The program's name in the object.
pub const PROGRAM: &str = "pkeyfw";
/// The empty XDP_PASS program the benchmark compares against.
pub const EMPTY_PROGRAM: &str = "pkeyfw_empty";

/// The XDP object built from pkeyfw-ebpf.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pkeyfw"));

/// How long a retired policy generation stays untouched before it is
/// rewritten: far longer than any XDP program run, which is what readers of
/// the old generation could still be in.
const GRACE: Duration = Duration::from_millis(20);

/// XDP actions the program returns.
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// Frames per reason, in [`Reason`] order.
pub type ReasonCounts = [u64; Reason::COUNT];

/// The program's maps, typed.
pub struct Maps {
    /// (name, kernel id) of every map, for memory accounting.
    ids: Vec<(&'static str, u32)>,
    active: Array<MapData, u32>,
    config: Array<MapData, Config>,
    qps: HashMap<MapData, u32, QpEntry>,
    groups: HashMap<MapData, GroupKey, GroupEntry>,
    port_keys: Array<MapData, u8>,
    reasons: PerCpuArray<MapData, u64>,
    qp_stats: Array<MapData, QpStats>,
    events: RingBuf<MapData>,
}

/// Every map, in the order [`Maps::build`] takes them.
const MAP_NAMES: [&str; 8] = [
    name::ACTIVE,
    name::CONFIG,
    name::QPS,
    name::GROUPS,
    name::PORT_KEYS,
    name::REASONS,
    name::QP_STATS,
    name::EVENTS,
];

impl Maps {
    /// Takes the maps out of a freshly loaded object, pinning each under
    /// `pin` when given.
    fn take(ebpf: &mut Ebpf, pin: Option<&Path>) -> Result<Maps> {
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
                name::QPS | name::GROUPS => Map::HashMap(data),
                name::REASONS => Map::PerCpuArray(data),
                name::EVENTS => Map::RingBuf(data),
                _ => Map::Array(data),
            })
        });
        Maps::build(maps)
    }

    fn build(maps: [Result<Map>; MAP_NAMES.len()]) -> Result<Maps> {
        let [
            active,
            config,
            qps,
            groups,
            port_keys,
            reasons,
            qp_stats,
            events,
        ] = maps;
        let [
            active,
            config,
            qps,
            groups,
            port_keys,
            reasons,
            qp_stats,
            events,
        ] = [
            active?, config?, qps?, groups?, port_keys?, reasons?, qp_stats?, events?,
        ];
        let ids = MAP_NAMES
            .iter()
            .zip([
                &active, &config, &qps, &groups, &port_keys, &reasons, &qp_stats, &events,
            ])
            .map(|(&name, map)| Ok((name, data(map)?.info()?.id())))
            .collect::<Result<_>>()?;
        Ok(Maps {
            ids,
            active: typed(active, name::ACTIVE)?,
            config: typed(config, name::CONFIG)?,
            qps: typed(qps, name::QPS)?,
            groups: typed(groups, name::GROUPS)?,
            port_keys: typed(port_keys, name::PORT_KEYS)?,
            reasons: typed(reasons, name::REASONS)?,
            qp_stats: typed(qp_stats, name::QP_STATS)?,
            events: typed(events, name::EVENTS)?,
        })
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

    /// Passed and dropped frames of every QP of the active policy, by QPN.
    pub fn qp_counters(&self) -> Result<Vec<(u32, QpStats)>> {
        let generation = self.active_generation()?;
        let mut out = Vec::new();
        for item in self.qps.iter() {
            let (key, entry) = item.context("iterating QPS")?;
            if key >> 24 == generation {
                let stats = self
                    .qp_stats
                    .get(&entry.slot, 0)
                    .context("reading QP_STATS")?;
                out.push((key & 0x00ff_ffff, stats));
            }
        }
        out.sort_unstable_by_key(|&(qpn, _)| qpn);
        Ok(out)
    }
}

fn typed<T: TryFrom<Map, Error = aya::maps::MapError>>(map: Map, name: &str) -> Result<T> {
    T::try_from(map).with_context(|| format!("map {name}"))
}

/// The map data behind the map kinds pkeyfw uses.
fn data(map: &Map) -> Result<&MapData> {
    match map {
        Map::Array(d) | Map::HashMap(d) | Map::PerCpuArray(d) | Map::RingBuf(d) => Ok(d),
        _ => bail!("unexpected map kind"),
    }
}

/// What one generation of the maps holds, so that it can be cleared.
struct Written {
    policy: Policy,
    retired: Option<Instant>,
}

/// The XDP program loaded into the kernel, with its maps.
pub struct Filter {
    ebpf: Ebpf,
    maps: Maps,
    capacity: u32,
    active: u32,
    generations: [Option<Written>; GENERATIONS as usize],
    /// Stats slot of every QPN bound in either generation.
    slots: StdHashMap<u32, u32>,
    free_slots: Vec<u32>,
    next_slot: u32,
    link: Option<aya::programs::xdp::XdpLinkId>,
}

impl Filter {
    /// Loads the program into the kernel with room for `qp_capacity` QPs per
    /// policy. Nothing is attached; the policy is empty until [`apply`](Self::apply).
    pub fn load(qp_capacity: u32) -> Result<Filter> {
        Filter::load_with(qp_capacity, None)
    }

    /// [`load`](Self::load), pinning the program and its maps under `dir`
    /// so that other pkeyfw processes reach them.
    pub fn load_pinned(qp_capacity: u32, dir: &Path) -> Result<Filter> {
        Filter::load_with(qp_capacity, Some(dir))
    }

    fn load_with(qp_capacity: u32, pin: Option<&Path>) -> Result<Filter> {
        let capacity = qp_capacity.max(DEFAULT_QP_CAPACITY).next_power_of_two();
        raise_memlock();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(name::QPS, capacity * GENERATIONS)
            .map_max_entries(name::QP_STATS, capacity)
            .load(OBJECT)
            .map_err(|e| privileged("loading the XDP object", e.into()))?;
        let program: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| anyhow!("the XDP object has no program {PROGRAM}"))?
            .try_into()?;
        program
            .load()
            .map_err(|e| privileged("loading the XDP program (verifier)", e.into()))?;
        if let Some(dir) = pin {
            program
                .pin(dir.join(PROGRAM))
                .with_context(|| format!("pinning the program under {}", dir.display()))?;
        }
        let maps = Maps::take(&mut ebpf, pin)?;
        Ok(Filter {
            ebpf,
            maps,
            capacity,
            active: 0,
            generations: [None, None],
            slots: StdHashMap::new(),
            free_slots: Vec::new(),
            next_slot: 0,
            link: None,
        })
    }

    fn program_mut(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .expect("loaded at construction")
    }

    /// The kernel's id of the loaded program.
    pub fn program_id(&self) -> Result<u32> {
        Ok(self.program().info()?.id())
    }

    /// Attaches the program to interface `iface` of this network namespace.
    /// The attachment lives as long as this `Filter`, unless
    /// [`pin_link`](Self::pin_link) hands it to bpffs.
    pub fn attach(&mut self, iface: &str, mode: XdpMode) -> Result<()> {
        let name = std::ffi::CString::new(iface)?;
        let id = self.program_mut().attach(name.as_c_str(), mode)?;
        self.link = Some(id);
        Ok(())
    }

    /// Pins the attachment at `path`: it outlives this process until the pin
    /// is removed.
    pub fn pin_link(&mut self, path: &Path) -> Result<()> {
        let id = self.link.take().context("not attached")?;
        let link = self.program_mut().take_link(id)?;
        let link: FdLink = link
            .try_into()
            .context("this kernel attached XDP without a bpf_link, which cannot be pinned")?;
        link.pin(path)
            .with_context(|| format!("pinning the link at {}", path.display()))?;
        Ok(())
    }

    /// Detaches the program, if this `Filter` holds its attachment.
    pub fn detach(&mut self) -> Result<()> {
        if let Some(id) = self.link.take() {
            self.program_mut().detach(id)?;
        }
        Ok(())
    }

    fn program(&self) -> &Xdp {
        self.ebpf
            .program(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .expect("loaded at construction")
    }

    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    pub fn maps_mut(&mut self) -> &mut Maps {
        &mut self.maps
    }

    /// Switches the program to `policy`. The policy is written into the idle
    /// generation and made live by one write to `ACTIVE`: every frame is judged
    /// by the old policy or the new one, never a mix. On error the running
    /// policy stays in force.
    pub fn apply(&mut self, policy: &Policy) -> Result<()> {
        if policy.qps.len() > self.capacity as usize {
            bail!(
                "the policy binds {} QPs; this filter was loaded for at most {}",
                policy.qps.len(),
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
        let idle = 1 - self.active;
        self.clear(idle)?;
        if let Err(e) = self.write(idle, policy) {
            // Leave the idle generation empty; the active one was never touched.
            self.generations[idle as usize] = Some(Written {
                policy: policy.clone(),
                retired: None,
            });
            let _ = self.clear(idle);
            return Err(e.context("the running policy is unchanged"));
        }
        self.maps
            .active
            .set(0, &idle, 0)
            .context("switching ACTIVE")?;
        if let Some(old) = &mut self.generations[self.active as usize] {
            old.retired = Some(Instant::now());
        }
        self.generations[idle as usize] = Some(Written {
            policy: policy.clone(),
            retired: None,
        });
        self.active = idle;
        Ok(())
    }

    /// Writes `policy` into generation `g`, which no frame reads.
    fn write(&mut self, g: u32, policy: &Policy) -> Result<()> {
        self.maps
            .config
            .set(g, &policy.config(), 0)
            .context("writing CONFIG")?;
        for (key, flags) in policy.port_flags() {
            self.maps
                .port_keys
                .set(port_key_index(g, key), &flags, 0)
                .context("writing PORT_KEYS")?;
        }
        for (&qpn, rule) in &policy.qps {
            let slot = self.slot(qpn)?;
            self.maps
                .qps
                .insert(&qp_key(g, qpn), &Policy::qp_entry(rule, slot), 0)
                .with_context(|| format!("writing QPS entry {qpn:#x}"))?;
        }
        for (addr, group) in &policy.groups {
            let key = GroupKey {
                generation: g,
                addr: *addr,
            };
            self.maps
                .groups
                .insert(&key, &group.entry(), 0)
                .with_context(|| format!("writing GROUPS entry {}", group.addr))?;
        }
        Ok(())
    }

    /// Empties generation `g` once its grace period is over, and frees the
    /// stats slots of QPs that only it bound.
    fn clear(&mut self, g: u32) -> Result<()> {
        let Some(written) = self.generations[g as usize].take() else {
            return Ok(());
        };
        if let Some(retired) = written.retired {
            std::thread::sleep(GRACE.saturating_sub(retired.elapsed()));
        }
        let policy = &written.policy;
        for key in policy.port_flags().keys() {
            self.maps.port_keys.set(port_key_index(g, *key), &0, 0)?;
        }
        let other = self.generations[1 - g as usize].as_ref().map(|w| &w.policy);
        for qpn in policy.qps.keys() {
            ignore_missing(self.maps.qps.remove(&qp_key(g, *qpn)))?;
            if !other.is_some_and(|p| p.qps.contains_key(qpn))
                && let Some(slot) = self.slots.remove(qpn)
            {
                self.free_slots.push(slot);
            }
        }
        for addr in policy.groups.keys() {
            let key = GroupKey {
                generation: g,
                addr: *addr,
            };
            ignore_missing(self.maps.groups.remove(&key))?;
        }
        Ok(())
    }

    /// The stats slot of `qpn`: its own if it has one, else a fresh zeroed one.
    fn slot(&mut self, qpn: u32) -> Result<u32> {
        if let Some(&slot) = self.slots.get(&qpn) {
            return Ok(slot);
        }
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None if self.next_slot < self.capacity => {
                self.next_slot += 1;
                self.next_slot - 1
            }
            None => bail!("no free QP stats slot (capacity {})", self.capacity),
        };
        self.maps
            .qp_stats
            .set(slot, &QpStats::default(), 0)
            .context("resetting QP_STATS")?;
        self.slots.insert(qpn, slot);
        Ok(slot)
    }

    /// Runs one frame through the program in the kernel (BPF_PROG_TEST_RUN)
    /// and returns whether it passed.
    pub fn run(&self, frame: &[u8]) -> Result<bool> {
        let result = self
            .program()
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat: 1,
                ..Default::default()
            })
            .map_err(|e| privileged("BPF_PROG_TEST_RUN", e.into()))?;
        match result.return_value {
            XDP_PASS => Ok(true),
            XDP_DROP => Ok(false),
            other => bail!("the XDP program returned {other}, expected XDP_PASS or XDP_DROP"),
        }
    }

    /// Runs one frame and returns whether it passed and the reason the kernel
    /// counted for it (read from the change of the per-reason counters).
    pub fn judge(&self, frame: &[u8]) -> Result<(bool, Reason)> {
        let before = self.maps.reasons()?;
        let pass = self.run(frame)?;
        let after = self.maps.reasons()?;
        let counted: Vec<Reason> = Reason::ALL
            .into_iter()
            .filter(|r| after[r.index() as usize] != before[r.index() as usize])
            .collect();
        match counted[..] {
            [reason] if after[reason.index() as usize] == before[reason.index() as usize] + 1 => {
                Ok((pass, reason))
            }
            _ => bail!("the per-reason counters did not change by exactly one frame: {counted:?}"),
        }
    }

    /// Total run time of `repeat` kernel-side repetitions of `frame`, through
    /// the filter or (`empty`) through the empty XDP_PASS program.
    pub fn time(&mut self, empty: bool, frame: &[u8], repeat: u32) -> Result<Duration> {
        let name = if empty { EMPTY_PROGRAM } else { PROGRAM };
        let program: &mut Xdp = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("the XDP object has no program {name}"))?
            .try_into()?;
        if program.fd().is_err() {
            program.load()?;
        }
        let result = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..Default::default()
            })
            .map_err(|e| privileged("BPF_PROG_TEST_RUN", e.into()))?;
        Ok(result.duration)
    }
}

/// `remove` of a key that is not there is not an error when clearing.
fn ignore_missing(r: Result<(), aya::maps::MapError>) -> Result<()> {
    match r {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Adds the likely cause to errors of privileged BPF operations.
fn privileged(what: &str, err: anyhow::Error) -> anyhow::Error {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        err.context(format!(
            "{what} failed: pkeyfw needs root (CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON); run it with sudo"
        ))
    } else {
        err.context(format!("{what} failed"))
    }
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit; failure only matters on old kernels, where the
    // load then reports it.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}
