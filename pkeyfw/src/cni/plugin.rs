//! What each CNI command does on the node. ADD: the pod's RDMA device,
//! confined to its namespace, its Q_Key guard where the network sets one,
//! then its bridge port an access port of its partition; all or nothing.
//! DEL: the port, the guard and the device, whatever is left of them.
//! CHECK: all three as ADD left them. STATUS: whether the node can isolate
//! a pod at all. GC: DEL for every attachment of the network the runtime
//! no longer knows.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use aya::util::KernelVersion;
use serde_json::Value;

use super::{
    config::NetConf,
    device, guard,
    node::{self, Bridge, Lock, Port},
    port, prev,
    protocol::{CniError, Invocation, code},
};
use crate::host::{netlink, netns::Netns};

/// How long an invocation waits for another to finish with the node's
/// ports: ten pods started at once wait for nine ADDs, on a slow machine
/// (an emulated guest) some seconds each. A runtime that gives up sooner
/// kills the plugin, which lets the lock go, and DELs.
const LOCK_WAIT: Duration = Duration::from_secs(300);

/// ADD: the result, prevResult with the pod's device.
pub fn add(inv: &Invocation, conf: &NetConf) -> Result<Value, CniError> {
    let netns_path = inv.netns.as_deref().unwrap_or_default();
    let prev_result = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::config(
            "prevResult",
            "missing",
            "pkeyfw is a chained plugin: list it after the bridge plugin in the network's conflist",
        )
    })?;
    let listed = prev::interfaces(prev_result, &inv.ifname, netns_path)?;
    device::require_exclusive()?;
    let netns = open(netns_path)?;
    let side = port::host_side(&inv.ifname, &netns, &listed.host)?;
    if let Some(trunk) = &conf.trunk {
        port::check_trunk(trunk, &side)?;
    }
    let _lock = lock()?;
    let mut bridge = Bridge::load(&side.bridge)
        .map_err(|e| CniError::setup(e, "reading the bridge's record"))?;
    if let Some(i) = bridge.find(&inv.container, &inv.ifname) {
        return Err(CniError::new(
            code::SETUP,
            format!(
                "{}/{} already has port {}",
                inv.container, inv.ifname, bridge.ports[i].interface
            ),
            "a runtime adds an attachment once: DEL it first",
        ));
    }
    let mut gone = forget(port::prune(&mut bridge));
    uplink(&mut bridge, conf.trunk.as_ref(), &mut gone)?;
    let name = node::device_name(&inv.container, &inv.ifname);
    // The bridge without the pod's port, for its undoing.
    let without = bridge.clone();
    let mut undo = Undo::default();
    let started = Instant::now();
    device::make(&name, &inv.ifname, &netns)?;
    let made = started.elapsed();
    undo.push(|| {
        let _ = device::remove(&name, Some(&netns));
    });
    if let Some(qkey) = conf.qkey {
        guard::attach(&name, &inv.ifname, netns_path, qkey)
            .map_err(|e| CniError::setup(e, "pinning the pod's Q_Key"))?;
        undo.push(|| {
            let _ = guard::detach(&name, &inv.ifname, netns.id.0);
        });
    }
    bridge.ports.push(Port {
        interface: side.port.clone(),
        pkey: conf.pkey,
        container: inv.container.clone(),
        ifname: inv.ifname.clone(),
        netns: netns_path.to_string(),
        netns_inode: netns.id.0,
        network: conf.name.clone(),
        device: name.clone(),
        qkey: conf.qkey,
        pod: inv.pod(),
    });
    // A reload that fails leaves every port as it was, the new one
    // detached; a record that cannot be written takes the port out again.
    port::apply(&bridge, &gone).map_err(|e| {
        CniError::setup(
            e,
            &format!("making {} an access port of {:#06x}", side.port, conf.pkey),
        )
    })?;
    undo.push(|| {
        let _ = port::apply(&without, std::slice::from_ref(&side.port));
    });
    bridge
        .save()
        .map_err(|e| CniError::setup(e, "recording the port"))?;
    undo.done();
    eprintln!(
        "pkeyfw: {} {}: device {name}, port {} of {} stamps {:#06x} (device {} ms, port {} ms)",
        inv.pod().unwrap_or_else(|| inv.container.clone()),
        inv.ifname,
        side.port,
        side.bridge,
        conf.pkey,
        made.as_millis(),
        (started.elapsed() - made).as_millis(),
    );
    Ok(prev::with_device(
        prev_result,
        conf.version,
        listed.pod,
        &name,
        netns_path,
    ))
}

/// What an ADD made so far, undone last first when it is dropped before
/// [`done`](Undo::done): an ADD that fails leaves nothing.
#[derive(Default)]
struct Undo<'a> {
    steps: Vec<Box<dyn FnOnce() + 'a>>,
}

impl<'a> Undo<'a> {
    fn push(&mut self, step: impl FnOnce() + 'a) {
        self.steps.push(Box::new(step));
    }

    /// The ADD completed: nothing to undo.
    fn done(mut self) {
        self.steps.clear();
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        while let Some(step) = self.steps.pop() {
            step();
        }
    }
}

/// Gives `bridge` the uplink the network names. The networks whose pods
/// share a bridge name the same one; a bridge whose pods all went without
/// a DEL takes the new one, and its old one, if another, is detached with
/// them (`gone`).
fn uplink(
    bridge: &mut Bridge,
    trunk: Option<&String>,
    gone: &mut Vec<String>,
) -> Result<(), CniError> {
    if !bridge.ports.is_empty() && bridge.trunk.as_ref() != trunk {
        return Err(CniError::config(
            "trunk",
            format!(
                "{} differs from the {} of the other networks on bridge {}",
                trunk.map_or("none", String::as_str),
                bridge.trunk.as_deref().unwrap_or("none"),
                bridge.name
            ),
            "the networks whose pods share a bridge must name the same uplink",
        ));
    }
    if let Some(old) = bridge.trunk.take()
        && Some(&old) != trunk
    {
        gone.push(old);
    }
    bridge.trunk = trunk.cloned();
    Ok(())
}

/// DEL: the port out of its bridge's attachment, then the Q_Key guard
/// and the device, as far as any is left; a second DEL finds nothing and
/// succeeds.
pub fn del(inv: &Invocation) -> Result<(), CniError> {
    let _lock = lock()?;
    let name = node::device_name(&inv.container, &inv.ifname);
    let removed = remove_ports(|p| p.container == inv.container && p.ifname == inv.ifname);
    // A namespace that is gone took its interfaces and their devices; the
    // record (above) found a guard's pins by its inode.
    let netns = inv
        .netns
        .as_deref()
        .and_then(|p| Netns::at(Path::new(p)).ok());
    if let Some(netns) = &netns {
        guard::detach(&name, &inv.ifname, netns.id.0)
            .map_err(|e| CniError::setup(e, "removing the pod's Q_Key guard"))?;
    }
    device::remove(&name, netns.as_ref())
        .map_err(|e| CniError::setup(e, &format!("removing the pod's device {name}")))?;
    removed.map(|_| ())
}

/// GC: DEL of every attachment of this network the runtime does not list.
pub fn gc(conf: &NetConf) -> Result<(), CniError> {
    let _lock = lock()?;
    let removed = remove_ports(|p| {
        p.network == conf.name
            && !conf
                .valid_attachments
                .iter()
                .any(|(c, i)| *c == p.container && *i == p.ifname)
    })?;
    for p in removed {
        let netns = Netns::at(Path::new(&p.netns)).ok();
        device::remove(&p.device, netns.as_ref())
            .map_err(|e| CniError::setup(e, &format!("removing device {}", p.device)))?;
    }
    Ok(())
}

/// Takes the ports `which` picks (and those whose interface is gone) out
/// of every bridge's attachment, and their pods' Q_Key guards; returns
/// those `which` picked.
fn remove_ports(which: impl Fn(&Port) -> bool) -> Result<Vec<Port>, CniError> {
    let mut removed = Vec::new();
    for mut bridge in
        Bridge::all().map_err(|e| CniError::setup(e, "reading the bridges' records"))?
    {
        let mut dropped = forget(port::prune(&mut bridge));
        let (out, kept): (Vec<Port>, Vec<Port>) = bridge.ports.drain(..).partition(&which);
        bridge.ports = kept;
        if dropped.is_empty() && out.is_empty() {
            continue;
        }
        dropped.extend(out.iter().map(|p| p.interface.clone()));
        if bridge.ports.is_empty() {
            dropped.extend(bridge.trunk.clone());
        }
        port::apply(&bridge, &dropped)
            .and_then(|()| bridge.save())
            .map_err(|e| {
                CniError::setup(e, &format!("taking ports out of bridge {}", bridge.name))
            })?;
        for p in &out {
            guard::detach(&p.device, &p.ifname, p.netns_inode)
                .map_err(|e| CniError::setup(e, "removing a pod's Q_Key guard"))?;
        }
        removed.extend(out);
    }
    Ok(removed)
}

/// What is left of pods whose namespace went without a DEL: their Q_Key
/// guards' pins are removed; their ports' interfaces, for the bridge's
/// attachment to drop.
fn forget(gone: Vec<Port>) -> Vec<String> {
    gone.into_iter()
        .map(|p| {
            let _ = guard::detach(&p.device, &p.ifname, p.netns_inode);
            p.interface
        })
        .collect()
}

/// CHECK: the device and the port as ADD left them.
pub fn check(inv: &Invocation, conf: &NetConf) -> Result<(), CniError> {
    let netns_path = inv.netns.as_deref().unwrap_or_default();
    let name = node::device_name(&inv.container, &inv.ifname);
    let prev_result = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::config("prevResult", "missing", "CHECK needs the result of the ADD")
    })?;
    if prev::device(prev_result, &inv.ifname, netns_path).as_deref() != Some(name.as_str()) {
        return Err(CniError::config(
            "prevResult.interfaces",
            format!("the pod's RDMA device {name} is not listed"),
            "expected the result pkeyfw's ADD returned",
        ));
    }
    let netns = open(netns_path)?;
    device::check(&name, &inv.ifname, &netns)?;
    let _lock = lock()?;
    let bridges = Bridge::all().map_err(|e| CniError::setup(e, "reading the bridges' records"))?;
    let Some(found) = bridges
        .iter()
        .find_map(|b| b.find(&inv.container, &inv.ifname).map(|i| &b.ports[i]))
    else {
        return Err(CniError::new(
            code::CHECK,
            "the pod has no bridge port",
            "no bridge's record names the attachment",
        ));
    };
    if found.qkey != conf.qkey
        || (found.qkey.is_some() && !guard::attached(&inv.ifname, found.netns_inode))
    {
        return Err(CniError::new(
            code::CHECK,
            "the pod's Q_Key guard is not as configured",
            format!(
                "the configuration says {}, ADD pinned {}, and its attachment is {}",
                conf.qkey
                    .map_or("none".to_string(), |q| format!("{q:#010x}")),
                found
                    .qkey
                    .map_or("none".to_string(), |q| format!("{q:#010x}")),
                if guard::attached(&inv.ifname, found.netns_inode) {
                    "live"
                } else {
                    "not there"
                },
            ),
        ));
    }
    if found.pkey != conf.pkey {
        return Err(CniError::new(
            code::CHECK,
            format!(
                "the pod's port {} stamps {:#06x}",
                found.interface, found.pkey
            ),
            format!("the configuration says {:#06x}", conf.pkey),
        ));
    }
    if netlink::if_index(&found.interface).is_err() || !port::attached(&found.interface) {
        return Err(CniError::new(
            code::CHECK,
            format!("the pod's port {} is not enforcing", found.interface),
            "its interface or its pinned attachment is gone",
        ));
    }
    Ok(())
}

/// STATUS: whether an ADD could isolate a pod here.
pub fn status() -> Result<(), CniError> {
    let kernel = KernelVersion::current().map_err(|e| {
        CniError::new(
            code::UNAVAILABLE,
            "cannot read the kernel's version",
            e.to_string(),
        )
    })?;
    ready(device::require_exclusive(), kernel)
}

/// STATUS's answer: ready where the RDMA subsystem is exclusive (as
/// `exclusive` found it) and `kernel`'s rdma_rxe moves into a namespace,
/// else unavailable (50) for what an ADD would refuse (100).
fn ready(exclusive: Result<(), CniError>, kernel: KernelVersion) -> Result<(), CniError> {
    exclusive
        .and_then(|()| device::require_movable(kernel))
        .map_err(|e| CniError::new(code::UNAVAILABLE, e.msg, e.details))
}

fn open(path: &str) -> Result<Netns, CniError> {
    Netns::at(Path::new(path)).map_err(|e| {
        CniError::new(
            code::ENV,
            format!("CNI_NETNS: {path} is not a network namespace"),
            format!("{e:#}"),
        )
    })
}

fn lock() -> Result<Lock, CniError> {
    let started = Instant::now();
    match Lock::take(LOCK_WAIT) {
        Ok(Some(lock)) => Ok(lock),
        Ok(None) => Err(CniError::new(
            code::TRY_AGAIN,
            "another invocation holds the node's ports",
            format!(
                "waited {} s for {}/lock",
                started.elapsed().as_secs(),
                node::DIR
            ),
        )),
        Err(e) => Err(CniError::setup(e, "taking the node's lock")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bridge(trunk: Option<&str>, pods: usize) -> Bridge {
        let port = |i: usize| Port {
            interface: format!("veth{i}"),
            pkey: 0x8001,
            container: format!("c{i}"),
            ifname: "eth0".to_string(),
            netns: format!("/run/netns/p{i}"),
            netns_inode: 4026532000 + i as u64,
            network: "roce".to_string(),
            device: node::device_name(&format!("c{i}"), "eth0"),
            qkey: None,
            pod: None,
        };
        Bridge {
            name: "roce0".to_string(),
            trunk: trunk.map(str::to_string),
            ports: (0..pods).map(port).collect(),
        }
    }

    /// STATUS says not ready (50) wherever ADD would refuse (100): in
    /// shared mode, and in exclusive mode on a kernel whose rdma_rxe does
    /// not move into a namespace (Linux 6.1, 6.12).
    #[test]
    fn status_is_not_ready_where_add_refuses() {
        let exclusive = || Ok(());
        for old in [KernelVersion::new(6, 1, 0), KernelVersion::new(6, 12, 38)] {
            let e = ready(exclusive(), old).unwrap_err();
            assert_eq!(e.code, code::UNAVAILABLE, "{old}");
            assert!(e.msg.contains("cannot be confined"), "{e}");
            assert!(e.details.contains("Linux 7"), "{e}");
        }
        ready(exclusive(), KernelVersion::new(7, 3, 0)).unwrap();
        let shared = CniError::new(code::NODE, "shares every device", "");
        let e = ready(Err(shared), KernelVersion::new(7, 3, 0)).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (code::UNAVAILABLE, "shares every device")
        );
    }

    /// Networks sharing a bridge agree on its uplink; a bridge left with no
    /// pod takes another, and drops its old one.
    #[test]
    fn the_bridges_uplink() {
        let (eth1, eth2) = ("eth1".to_string(), "eth2".to_string());
        let mut gone = Vec::new();
        let mut b = bridge(Some("eth1"), 2);
        let e = uplink(&mut b, Some(&eth2), &mut gone).unwrap_err();
        assert_eq!(e.code, code::CONFIG);
        assert!(
            e.msg.starts_with("trunk: eth2 differs from the eth1"),
            "{e}"
        );
        assert!(uplink(&mut b, None, &mut gone).is_err());
        uplink(&mut b, Some(&eth1), &mut gone).unwrap();
        assert_eq!((b.trunk.as_deref(), gone.len()), (Some("eth1"), 0));
        let mut b = bridge(Some("eth1"), 0);
        uplink(&mut b, Some(&eth2), &mut gone).unwrap();
        assert_eq!((b.trunk.as_deref(), &gone[..]), (Some("eth2"), &[eth1][..]));
        let mut b = bridge(None, 0);
        uplink(&mut b, None, &mut gone).unwrap();
        assert_eq!(b.trunk, None);
    }
}
