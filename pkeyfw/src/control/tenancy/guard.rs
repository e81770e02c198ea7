//! The device guard (pkeyfw-ebpf's `pkeyfw-guard`): a cgroup device program
//! on the cgroup v2 root that lets only a tenant's processes (and root
//! outside every tenant) open the device nodes of the RDMA device pkeyfw
//! made for it. It is attached with `BPF_F_ALLOW_MULTI`, beside whatever
//! systemd (`DeviceAllow=`) or a container runtime attaches below: every
//! program must allow an open. Its link and maps are pinned with the tenant
//! host's, so it outlives pkeyfw's process and goes with `pkeyfw detach`.
//!
//! A policy is written into the generation not in force ([`Guard::stage`])
//! and put in force by one write ([`Guard::switch`]), or not at all: an
//! open sees the rules and the nodes' owners of one policy, never a mix.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData},
    programs::CgroupDevice,
};
use pkeyfw_common::abi::{
    BindSpec, CLOSED, DEVICE_NODES, MAX_RULES, NO_TENANT, guard_name, node_key,
};

use crate::{
    control::probes,
    host::identity,
    loading::{btf::Btf, cost::Cost, syscall},
};

/// The guard object built from pkeyfw-ebpf's `pkeyfw-guard`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pkeyfw-guard"));
const PROGRAM: &str = "pkeyfw_guard";
/// The pinned link, in the tenant host's pins.
const LINK: &str = "guard-link";
/// The maps it pins beside the link.
const MAPS: [&str; 5] = [
    guard_name::NODES,
    guard_name::TENANTS,
    guard_name::MAJORS,
    guard_name::SEALED,
    guard_name::ACTIVE,
];

/// The guard's maps, as the loader writes them.
pub struct Guard {
    nodes: HashMap<MapData, u32, [u32; 2]>,
    tenants: Array<MapData, BindSpec>,
    majors: HashMap<MapData, u32, u32>,
    sealed: Array<MapData, u32>,
    active: Array<MapData, u32>,
}

impl Guard {
    /// Loads the guard with its maps pinned under `dir` (sealed: no RDMA
    /// node it does not know opens), and attaches it to the root of the
    /// cgroup v2 hierarchy, its link pinned there too. Every RDMA device's
    /// nodes are made known, as no tenant's.
    pub fn attach(dir: &Path) -> Result<Guard> {
        let root = identity::cgroup2_mount().context(
            "the cgroup v2 hierarchy is not mounted: the device guard, which keeps each tenant to its own RDMA device, attaches at its root",
        )?;
        let layout = Btf::kernel().and_then(|btf| probes::task_layout(&btf))?;
        let mut loader = EbpfLoader::new();
        for map in MAPS {
            loader.map_pin_path(map, dir.join(map));
        }
        let mut ebpf = loader
            .override_global("LAYOUT", &layout, true)
            .load(OBJECT)
            .context("loading the device guard")?;
        let mut guard = Guard::take(&mut ebpf)?;
        guard.seal(true)?;
        guard.stage(&[], &BTreeMap::new(), &BTreeSet::new())?;
        let program: &mut CgroupDevice = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| anyhow!("the guard object has no {PROGRAM}"))?
            .try_into()?;
        program.load().context(
            "loading the device guard (a cgroup device program: Linux 6.1 or later reads who opens a device)",
        )?;
        let cgroup = fs::File::open(&root)
            .with_context(|| format!("opening the cgroup v2 root {}", root.display()))?;
        let prog = program.fd()?.as_fd().as_raw_fd();
        pin_link(prog, cgroup.as_raw_fd(), &dir.join(LINK))
            .with_context(|| format!("attaching the device guard to {}", root.display()))?;
        Ok(guard)
    }

    /// The guard pinned under `dir`.
    pub fn open(dir: &Path) -> Result<Guard> {
        let mut loader = EbpfLoader::new();
        for map in MAPS {
            loader.map_pin_path(map, dir.join(map));
        }
        // Maps only: the pinned ones are reused, no program is loaded.
        let mut ebpf = loader
            .load(OBJECT)
            .context("opening the device guard's maps")?;
        Guard::take(&mut ebpf)
    }

    fn take(ebpf: &mut Ebpf) -> Result<Guard> {
        let mut map = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| anyhow!("the guard object has no map {name}"))
        };
        Ok(Guard {
            nodes: HashMap::try_from(map(guard_name::NODES)?)?,
            tenants: Array::try_from(map(guard_name::TENANTS)?)?,
            majors: HashMap::try_from(map(guard_name::MAJORS)?)?,
            sealed: Array::try_from(map(guard_name::SEALED)?)?,
            active: Array::try_from(map(guard_name::ACTIVE)?)?,
        })
    }

    /// The generation in force.
    fn active(&self) -> Result<u32> {
        Ok(self.active.get(&0, 0)? & 1)
    }

    /// While sealed, an RDMA node the guard does not know is refused: a
    /// device being made has nodes before they can be named.
    pub fn seal(&mut self, on: bool) -> Result<()> {
        Ok(self.sealed.set(0, &u32::from(on), 0)?)
    }

    /// Writes the generation not in force: the host policy's rules
    /// `specs` (as the probes read them: whose tenant each opener is), and
    /// the owner of every RDMA device's nodes as they are now — of a
    /// device in `owners` (by name) its tenant's rule, of one in `closed`
    /// (going) no tenant, of the rest anyone. In the generation in force a
    /// node it did not know yet is closed if its device is in `owners` (one
    /// being made), anyone's otherwise. Nodes of devices gone are
    /// forgotten. Also notes the RDMA core's majors.
    pub fn stage(
        &mut self,
        specs: &[BindSpec],
        owners: &BTreeMap<String, u32>,
        closed: &BTreeSet<String>,
    ) -> Result<()> {
        let staged = self.active()? ^ 1;
        for i in 0..MAX_RULES {
            let spec = specs.get(i as usize).copied().unwrap_or_default();
            self.tenants.set(staged * MAX_RULES + i, &spec, 0)?;
        }
        let now = device_nodes()?;
        if now.len() > DEVICE_NODES as usize {
            bail!(
                "{} RDMA device nodes; the device guard tells at most {DEVICE_NODES} apart",
                now.len()
            );
        }
        for (key, device) in &now {
            let owner = match owners.get(device) {
                Some(&rule) => rule,
                None if closed.contains(device) => CLOSED,
                None => NO_TENANT,
            };
            let mut both = self.nodes.get(key, 0).unwrap_or_else(|_| {
                let before = if owners.contains_key(device) {
                    CLOSED
                } else {
                    NO_TENANT
                };
                [before; 2]
            });
            both[staged as usize] = owner;
            self.nodes.insert(key, &both, 0)?;
        }
        self.forget(&now)?;
        for major in rdma_majors()? {
            self.majors.insert(&major, &1, 0)?;
        }
        Ok(())
    }

    /// Puts the generation [`Guard::stage`] wrote in force, or, called
    /// again, the one before back: one write.
    pub fn switch(&mut self) -> Result<()> {
        let staged = self.active()? ^ 1;
        Ok(self.active.set(0, &staged, 0)?)
    }

    /// Forgets the nodes of devices that are gone (a minor of theirs that
    /// a new device takes is that device's).
    pub fn forget_gone(&mut self) -> Result<()> {
        self.forget(&device_nodes()?)
    }

    fn forget(&mut self, now: &BTreeMap<u32, String>) -> Result<()> {
        let old: Vec<u32> = self.nodes.keys().collect::<Result<_, _>>()?;
        for key in old.iter().filter(|k| !now.contains_key(k)) {
            let _ = self.nodes.remove(key);
        }
        Ok(())
    }
}

/// Loads (verifies) the guard's program, attaching nothing, and returns
/// what it cost.
pub fn cost() -> Result<Cost> {
    let layout = Btf::kernel().and_then(|btf| probes::task_layout(&btf))?;
    let mut ebpf = EbpfLoader::new()
        .override_global("LAYOUT", &layout, true)
        .load(OBJECT)
        .context("loading the device guard")?;
    let program: &mut CgroupDevice = ebpf
        .program_mut(PROGRAM)
        .ok_or_else(|| anyhow!("the guard object has no {PROGRAM}"))?
        .try_into()?;
    let started = std::time::Instant::now();
    program
        .load()
        .with_context(|| format!("loading {PROGRAM} (verifier)"))?;
    Ok(Cost::of(&program.info()?, PROGRAM, started.elapsed()))
}

/// Removes the guard pinned under `dir`: unpinning its link detaches it.
pub fn remove(dir: &Path) -> Result<()> {
    for name in std::iter::once(LINK).chain(MAPS) {
        let path = dir.join(name);
        if path.exists() {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Whether a guard is pinned under `dir`.
pub fn pinned(dir: &Path) -> bool {
    dir.join(LINK).exists()
}

/// `union bpf_attr` for BPF_LINK_CREATE (its first fields).
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    _rest: [u64; 4],
}

/// `union bpf_attr` for BPF_OBJ_PIN.
#[repr(C)]
#[derive(Default)]
struct ObjPin {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// Links program `prog` to cgroup `cgroup` as a device program and pins
/// the link at `at`: the kernel attaches a cgroup link as
/// BPF_F_ALLOW_MULTI, so that the programs of the cgroups below run too.
/// (aya makes the link but offers no way to pin one of a cgroup.)
fn pin_link(prog: i32, cgroup: i32, at: &Path) -> Result<()> {
    const BPF_OBJ_PIN: libc::c_long = 6;
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_CGROUP_DEVICE: u32 = 6;
    let mut create = LinkCreate {
        prog_fd: prog as u32,
        target_fd: cgroup as u32,
        attach_type: BPF_CGROUP_DEVICE,
        ..LinkCreate::default()
    };
    // SAFETY: the command's attribute layout, no pointers.
    let link = unsafe { syscall::bpf(BPF_LINK_CREATE, &mut create) }.context("BPF_LINK_CREATE")?;
    // SAFETY: a descriptor the kernel just made, owned from here.
    let link =
        unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(link as i32) };
    let path = std::ffi::CString::new(at.as_os_str().as_encoded_bytes())?;
    let mut pin = ObjPin {
        pathname: path.as_ptr() as u64,
        bpf_fd: link.as_raw_fd() as u32,
        ..ObjPin::default()
    };
    // SAFETY: `pathname` points to a NUL-terminated path for the call.
    unsafe { syscall::bpf(BPF_OBJ_PIN, &mut pin) }
        .with_context(|| format!("pinning the guard's link at {}", at.display()))?;
    Ok(())
}

/// Every RDMA device's character device nodes (uverbs, umad, issm), by
/// [`node_key`], with the device's name.
fn device_nodes() -> Result<BTreeMap<u32, String>> {
    let mut nodes = BTreeMap::new();
    for class in ["infiniband_verbs", "infiniband_mad"] {
        let Ok(entries) = fs::read_dir(format!("/sys/class/{class}")) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            let (Ok(dev), Ok(ibdev)) = (
                fs::read_to_string(path.join("dev")),
                fs::read_to_string(path.join("ibdev")),
            ) else {
                continue;
            };
            let (major, minor) = dev
                .trim()
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .with_context(|| {
                    format!("{}/dev: `{}` is no MAJOR:MINOR", path.display(), dev.trim())
                })?;
            nodes.insert(node_key(major, minor), ibdev.trim().to_string());
        }
    }
    Ok(nodes)
}

/// The character device majors the RDMA core registered (/proc/devices).
fn rdma_majors() -> Result<Vec<u32>> {
    let text = fs::read_to_string("/proc/devices").context("reading /proc/devices")?;
    Ok(text
        .lines()
        .take_while(|l| !l.starts_with("Block devices"))
        .filter_map(|l| l.trim().split_once(' '))
        .filter(|(_, name)| name.starts_with("infiniband"))
        .filter_map(|(major, _)| major.parse().ok())
        .collect())
}
