//! The node's side of the plugin: for each bridge its pods' ports are on,
//! a record of the ports (which pod, which key, which device) and the
//! switch policy written from it, which the node's switch attachment of
//! that bridge runs (`pkeyfw switch`); and the lock under which
//! invocations change them one at a time.
//!
//! Both live under /run/pkeyfw/cni/NETNS (`host`, or the inode of the
//! runtime's network namespace where it runs in one of its own, as a node
//! of kind does: its bridges are not the host's), as the attachment's pins
//! live in bpffs and the pods' devices and veths in the kernel: none
//! outlives a reboot, and the runtime adds every pod again after one.
//!
//! Each pod's port is an access port of its partition whose table holds
//! the pod's key alone (`stamp`: its frames, sent by an unmodified
//! rdma_rxe with 0xFFFF, are stamped with the pod's key and checked as its
//! HCA would send them; what leaves to it must match that key, QP1's
//! frames too, and gets 0xFFFF back). The bridge's uplink, if
//! the network names one (`trunk`), is a port whose table holds the full
//! key of every partition on the bridge (and 0xFFFF): it carries stamped
//! frames between nodes, each judged at its pod's port on either end.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    fs::{self, File},
    io::ErrorKind,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::host::netns::NetnsId;

/// Where the plugin keeps the node's lock, records and policies.
pub const DIR: &str = "/run/pkeyfw/cni";

/// Where the records and policies of the bridges of this process's
/// network namespace are.
pub fn records() -> PathBuf {
    let here = NetnsId::current().ok();
    let name = match here {
        Some(id) if NetnsId::host().ok() != Some(id) => format!("net-{}", id.0),
        _ => "host".to_string(),
    };
    Path::new(DIR).join(name)
}

/// A pod's port on a bridge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// The bridge port: the host side of the pod's veth.
    pub interface: String,
    /// The pod's key, stamped at the port.
    pub pkey: u16,
    /// The attachment: `CNI_CONTAINERID`, `CNI_IFNAME`, `CNI_NETNS`.
    pub container: String,
    pub ifname: String,
    pub netns: String,
    /// Its inode: the Q_Key guard's pins are found by it once the
    /// namespace is gone.
    pub netns_inode: u64,
    /// The network (`name` of the configuration).
    pub network: String,
    /// The pod's RDMA device.
    pub device: String,
    /// The Q_Key the pod's guard pins, if the network sets one.
    pub qkey: Option<u32>,
    /// The pod, where the runtime says which (`namespace/name`).
    pub pod: Option<String>,
}

/// What the node knows of one bridge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bridge {
    pub name: String,
    /// The uplink, if a network on the bridge names one.
    pub trunk: Option<String>,
    pub ports: Vec<Port>,
}

impl Bridge {
    /// The record of bridge `name`, or an empty one.
    pub fn load(name: &str) -> Result<Bridge> {
        Bridge::read(&records(), name)
    }

    /// The record of bridge `name` in `dir`, or an empty one.
    fn read(dir: &Path, name: &str) -> Result<Bridge> {
        let path = dir.join(format!("{name}.json"));
        match fs::read_to_string(&path) {
            Ok(text) => {
                serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Bridge {
                name: name.to_string(),
                ..Bridge::default()
            }),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Every bridge of this namespace the node has a record of.
    pub fn all() -> Result<Vec<Bridge>> {
        Bridge::all_in(&records())
    }

    fn all_in(dir: &Path) -> Result<Vec<Bridge>> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".json")
                    .map(str::to_string)
            })
            .collect();
        names.sort();
        names.iter().map(|n| Bridge::read(dir, n)).collect()
    }

    /// Every bridge of every namespace the plugin has run in, with that
    /// namespace as the other commands label it (`host`, its `ip netns`
    /// name, or `net:[INODE]`): what `pkeyfw metrics` says of pods.
    pub fn everywhere() -> Vec<(String, Bridge)> {
        let Ok(dirs) = fs::read_dir(DIR) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for dir in dirs.filter_map(|e| e.ok()).map(|e| e.path()) {
            let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let label = match name.strip_prefix("net-").map(str::parse) {
                Some(Ok(inode)) => NetnsId(inode).label(),
                _ if name == "host" => "host".to_string(),
                _ => continue,
            };
            for bridge in Bridge::all_in(&dir).unwrap_or_default() {
                found.push((label.clone(), bridge));
            }
        }
        found
    }

    /// Writes the record, or removes it (and the policy) once no pod is
    /// left.
    pub fn save(&self) -> Result<()> {
        if self.ports.is_empty() {
            for path in [record_path(&self.name), policy_path(&self.name)] {
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != ErrorKind::NotFound => {
                        return Err(e).with_context(|| format!("removing {}", path.display()));
                    }
                    _ => {}
                }
            }
            return Ok(());
        }
        write_atomic(
            &record_path(&self.name),
            &serde_json::to_string_pretty(self)?,
        )
    }

    /// The port of attachment (`container`, `ifname`), by position.
    pub fn find(&self, container: &str, ifname: &str) -> Option<usize> {
        self.ports
            .iter()
            .position(|p| p.container == container && p.ifname == ifname)
    }

    /// The trunk's table: 0xFFFF and the full key of every partition a pod
    /// of the bridge is in.
    pub fn trunk_keys(&self) -> Vec<u16> {
        let full: BTreeSet<u16> = self.ports.iter().map(|p| p.pkey | 0x8000).collect();
        let mut keys = vec![pkeyfw_common::pkey::DEFAULT];
        keys.extend(
            full.into_iter()
                .filter(|&k| k != pkeyfw_common::pkey::DEFAULT),
        );
        keys
    }

    /// The switch policy of the bridge: each pod's port an access port of
    /// its key, and the trunk. None when no pod is left.
    pub fn policy(&self) -> Option<String> {
        if self.ports.is_empty() {
            return None;
        }
        let mut text = format!(
            "# The ports of bridge {}, written by the pkeyfw CNI plugin as pods come\n\
             # and go (docs/operations.md, \"Kubernetes: a partition per pod\"); the\n\
             # record beside it says which pod each port is.\n\n\
             [switch]\nviolation = \"drop\"\n",
            self.name
        );
        for p in &self.ports {
            let who = comment(p.pod.as_deref().unwrap_or("a container"));
            let _ = write!(
                text,
                "\n[[switch.port]]  # {who}: {} ({}), network {}, device {}\n\
                 interface = \"{}\"\npkeys = [{:#06x}]\nstamp = {:#06x}\n",
                p.ifname,
                short(&p.container),
                comment(&p.network),
                p.device,
                p.interface,
                p.pkey,
                p.pkey,
            );
        }
        if let Some(trunk) = &self.trunk {
            let keys: Vec<String> = self
                .trunk_keys()
                .iter()
                .map(|k| format!("{k:#06x}"))
                .collect();
            let _ = write!(
                text,
                "\n[[switch.port]]  # the uplink: every partition of the bridge's pods, stamped\n\
                 interface = \"{trunk}\"\npkeys = [{}]\n",
                keys.join(", ")
            );
        }
        Some(text)
    }

    /// The interfaces the policy names.
    pub fn interfaces(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| p.interface.clone())
            .chain(self.trunk.clone())
            .collect()
    }
}

/// `text` fit for a comment of the policy: one line, whatever the runtime
/// passed.
fn comment(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A container ID as people read one: its first 12 characters.
fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// The record of bridge `name`.
pub fn record_path(bridge: &str) -> PathBuf {
    records().join(format!("{bridge}.json"))
}

/// The switch policy of bridge `name`, which its ports' attachments run.
pub fn policy_path(bridge: &str) -> PathBuf {
    records().join(format!("{bridge}.toml"))
}

/// Replaces `path`'s contents at once (a reader sees the old or the new).
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// The node's lock: held, invocations change the records, the policies,
/// the devices and the attachments one at a time. Released on drop (and
/// by the kernel when the process dies).
pub struct Lock {
    _file: File,
}

impl Lock {
    /// Takes the lock, waiting up to `wait`; None if another invocation
    /// held it all that time.
    pub fn take(wait: Duration) -> Result<Option<Lock>> {
        fs::create_dir_all(DIR).with_context(|| format!("making {DIR}"))?;
        let path = Path::new(DIR).join("lock");
        let file = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
        let until = Instant::now() + wait;
        loop {
            // SAFETY: flock on a descriptor this File owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Some(Lock { _file: file }));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The name of the pod's RDMA device, from its attachment alone, so that
/// DEL finds it after an ADD that failed before recording it: `pkfw` and 40
/// bits of the attachment's FNV-1a hash.
pub fn device_name(container: &str, ifname: &str) -> String {
    let hash = container
        .bytes()
        .chain([0])
        .chain(ifname.bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("pkfw{:010x}", hash >> 24)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(interface: &str, pkey: u16, container: &str) -> Port {
        Port {
            interface: interface.to_string(),
            pkey,
            container: container.to_string(),
            ifname: "eth0".to_string(),
            netns: format!("/run/netns/{container}"),
            netns_inode: 4026532000,
            network: "roce".to_string(),
            device: device_name(container, "eth0"),
            qkey: None,
            pod: Some(format!("default/{container}")),
        }
    }

    fn three() -> Bridge {
        Bridge {
            name: "roce0".to_string(),
            trunk: Some("eth1".to_string()),
            ports: vec![
                port("veth0a", 0x8001, "a"),
                port("veth0b", 0x0001, "b"),
                port("veth0c", 0x0002, "c"),
            ],
        }
    }

    /// The policy the plugin writes is one `pkeyfw switch` takes, with
    /// each pod's port an access port of its key and the trunk a full
    /// member of every partition there.
    #[test]
    fn the_policy_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roce0.toml");
        fs::write(&path, three().policy().unwrap()).unwrap();
        let switch = crate::policy::SwitchPolicy::load(&path).unwrap();
        let ports: Vec<(&str, Vec<u16>, Option<u16>)> = switch
            .ports
            .iter()
            .map(|(i, p)| (i.as_str(), p.pkeys.clone(), p.switch.unwrap().access))
            .collect();
        assert_eq!(
            ports,
            [
                ("veth0a", vec![0x8001], Some(0x8001)),
                ("veth0b", vec![0x0001], Some(0x0001)),
                ("veth0c", vec![0x0002], Some(0x0002)),
                ("eth1", vec![0xffff, 0x8001, 0x8002], None),
            ]
        );
        assert_eq!(three().interfaces(), ["veth0a", "veth0b", "veth0c", "eth1"]);
        let mut none = three();
        none.ports.clear();
        assert_eq!(none.policy(), None);
    }

    /// What the runtime passed stays in its comment: a pod's name cannot
    /// add a line to the policy.
    #[test]
    fn names_stay_in_comments() {
        let mut b = three();
        b.ports[0].pod = Some("x\n[[switch.port]]\ninterface = \"eth9\"".to_string());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roce0.toml");
        fs::write(&path, b.policy().unwrap()).unwrap();
        let switch = crate::policy::SwitchPolicy::load(&path).unwrap();
        assert_eq!(switch.ports.len(), 4);
    }

    /// The default partition's limited key needs no second entry.
    #[test]
    fn the_trunk_table() {
        let mut b = three();
        b.ports.push(port("veth0d", 0x7fff, "d"));
        b.ports.push(port("veth0e", 0x8001, "e"));
        assert_eq!(b.trunk_keys(), [0xffff, 0x8001, 0x8002]);
    }

    #[test]
    fn device_names() {
        let a = device_name("c1", "eth0");
        assert_eq!(a.len(), 14);
        assert!(a.starts_with("pkfw"));
        assert_eq!(a, device_name("c1", "eth0"));
        assert_ne!(a, device_name("c1", "net1"));
        assert_ne!(device_name("c1e", "th0"), device_name("c1", "eth0"));
    }
}
