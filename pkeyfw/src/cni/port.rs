//! The pod's bridge port: the host side of the pod's veth, the bridge it
//! is a port of, and the bridge's switch attachment, which runs the
//! policy the node writes for the bridge ([`super::node`]). A reload of
//! that attachment attaches the ports it adds first and then switches
//! every port to its new table together (as `pkeyfw switch reload`): no other
//! port's enforcement pauses while a pod comes or goes.

use std::fs;

use anyhow::{Context as _, Result};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};

use super::{
    node::{self, Bridge, Port},
    protocol::CniError,
};
use crate::{
    attachment::{self, Mode, Say, switch},
    host::{bridge::Link, netlink, netns::Netns},
    loading::pins::{Pins, State},
};

/// Where the pod's interface comes out on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSide {
    /// The bridge port: the veth's host end.
    pub port: String,
    pub bridge: String,
    bridge_index: u32,
}

/// The host side of the pod's `ifname` (a veth in `netns`): its peer,
/// which `listed` (prevResult's host interfaces) must name, and the bridge
/// the peer is a port of.
pub fn host_side(ifname: &str, netns: &Netns, listed: &[String]) -> Result<HostSide, CniError> {
    let pod_links = netns
        .run(netlink::links)
        .and_then(|l| l)
        .map_err(|e| CniError::setup(e, "reading the pod's interfaces"))?;
    let peer = pod_links
        .iter()
        .find(|m| Link::of(m).name == ifname)
        .and_then(peer_index)
        .ok_or_else(|| {
            CniError::config(
                "prevResult.interfaces",
                format!("the pod's {ifname} is no veth with a peer on the host"),
                "pkeyfw needs the pod's interface to be a veth on a bridge, as the bridge plugin makes it",
            )
        })?;
    let links: Vec<Link> = netlink::links()
        .map_err(|e| CniError::setup(e, "reading the host's interfaces"))?
        .iter()
        .map(Link::of)
        .collect();
    let port = links.iter().find(|l| l.index == peer).ok_or_else(|| {
        CniError::config(
            "prevResult.interfaces",
            format!("the peer of the pod's {ifname} is not in this namespace"),
            "pkeyfw runs in the namespace of the pod's bridge, as the runtime runs plugins",
        )
    })?;
    if !listed.contains(&port.name) {
        return Err(CniError::config(
            "prevResult.interfaces",
            format!("the host side of {ifname}, {}, is not listed", port.name),
            "expected the bridge port the plugin before pkeyfw made among its host interfaces",
        ));
    }
    let bridge = port
        .master
        .and_then(|m| links.iter().find(|l| l.index == m && l.is_bridge))
        .ok_or_else(|| {
            CniError::config(
                "prevResult.interfaces",
                format!(
                    "{} (the host side of {ifname}) is no bridge's port",
                    port.name
                ),
                "list pkeyfw after the bridge plugin: its switch attachment is the bridge's",
            )
        })?;
    Ok(HostSide {
        port: port.name.clone(),
        bridge: bridge.name.clone(),
        bridge_index: bridge.index,
    })
}

/// The peer of a veth, by its index in the peer's namespace (IFLA_LINK).
fn peer_index(m: &LinkMessage) -> Option<u32> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(index) => Some(*index),
        _ => None,
    })
}

/// Checks that `trunk` is a port of the pod's bridge.
pub fn check_trunk(trunk: &str, side: &HostSide) -> Result<(), CniError> {
    let link = netlink::links()
        .map_err(|e| CniError::setup(e, "reading the host's interfaces"))?
        .iter()
        .map(Link::of)
        .find(|l| l.name == trunk);
    match link {
        Some(l) if l.master == Some(side.bridge_index) => Ok(()),
        Some(_) => Err(CniError::config(
            "trunk",
            format!("{trunk} is not a port of bridge {}", side.bridge),
            "expected the bridge's uplink, a port of the bridge the pods' veths are on",
        )),
        None => Err(CniError::config(
            "trunk",
            format!("no interface {trunk}"),
            "expected the bridge's uplink, as `ip link` names it",
        )),
    }
}

/// Takes out of `bridge` the ports whose interface is gone (a pod whose
/// namespace went away without a DEL); returns them.
pub fn prune(bridge: &mut Bridge) -> Vec<Port> {
    let (gone, kept): (Vec<Port>, Vec<Port>) = bridge
        .ports
        .drain(..)
        .partition(|p| netlink::if_index(&p.interface).is_err());
    bridge.ports = kept;
    gone
}

/// Makes the bridge's switch attachment run `bridge`: its policy written
/// and reloaded (the ports it adds attached first, then every port
/// switched), then the attachments of `dropped` (interfaces the policy no
/// longer names) removed. With no pod left, every port is detached. If
/// the reload fails, the policy file is as it was and so is every port.
pub fn apply(bridge: &Bridge, dropped: &[String]) -> Result<()> {
    let path = node::policy_path(&bridge.name);
    if let Some(text) = bridge.policy() {
        let before = fs::read_to_string(&path).ok();
        node::write_atomic(&path, &text)?;
        match switch::reload(&path, None, Mode::Auto, Say::STDERR) {
            Ok(reloaded) => eprintln!("{}", reloaded.line(&path)),
            Err(e) => {
                let restored = match before {
                    Some(text) => node::write_atomic(&path, &text),
                    None => fs::remove_file(&path).map_err(Into::into),
                };
                return Err(match restored {
                    Ok(()) => e,
                    Err(r) => e.context(format!("and restoring {} failed: {r:#}", path.display())),
                });
            }
        }
    }
    for iface in dropped {
        if Pins::of(iface).exists() {
            let detached = attachment::detach(iface, None)
                .with_context(|| format!("detaching the bridge port {iface}"))?;
            eprintln!("{}", detached.line(iface));
        }
    }
    Ok(())
}

/// Whether `port`'s attachment is in place: pinned and live.
pub fn attached(port: &str) -> bool {
    let pins = Pins::of(port);
    pins.exists() && matches!(pins.state(), Ok(State::Live { .. }))
}
