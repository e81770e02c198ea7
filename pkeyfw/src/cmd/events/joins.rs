//! Ports of a switch's bridge that its policy does not list, for `pkeyfw
//! events`: those there already when it starts, and each that joins since,
//! as the kernel announces it (RTM_NEWLINK). What a port's policy lists is
//! read from its maps at each announcement, so a reload that lists a port
//! is seen; a port that leaves and joins again is reported again.

use std::collections::{BTreeMap, HashSet};

use anyhow::{Context as _, Result};
use netlink_sys::Socket;
use serde_json::json;
use tokio::{io::unix::AsyncFd, sync::mpsc};

use crate::{
    host::{
        bridge::{self, Link},
        netlink,
        netns::NetnsId,
    },
    loading::maps::Maps,
    reporting::live::Live,
};

/// A port that is in a switch's bridge and not in its policy.
pub struct Unlisted {
    pub port: String,
    pub bridge: String,
    /// Unless the host's.
    pub netns: Option<String>,
}

impl Unlisted {
    /// `tap7 unlisted_port: a port of bridge br0 …`.
    pub fn text(&self) -> String {
        let netns = self
            .netns
            .as_ref()
            .map_or(String::new(), |ns| format!(" (netns {ns})"));
        format!(
            "{} unlisted_port: a port of bridge {}{netns} that the switch's policy does not list: its RoCE reaches none of the switch's ports until it is listed",
            self.port, self.bridge
        )
    }

    pub fn json(&self, time: String) -> serde_json::Value {
        json!({"time": time, "interface": self.port, "trap": null, "kind": "unlisted_port", "bridge": self.bridge, "netns": self.netns})
    }
}

/// One network namespace's switch ports: a bridge's name and one of its
/// ports' maps, by the bridge's index.
struct Watch {
    socket: AsyncFd<Socket>,
    netns: Option<String>,
    bridges: BTreeMap<u32, (String, Maps)>,
    /// Reported and still unlisted in their bridge.
    reported: HashSet<u32>,
}

impl Watch {
    /// What `link` says: a port to report, once.
    fn judge(&mut self, link: &Link) -> Option<Unlisted> {
        let listed = link
            .master
            .and_then(|m| self.bridges.get(&m))
            .map(|(name, maps)| (name, maps.listed().is_ok_and(|l| l.contains(&link.index))));
        match listed {
            Some((bridge, false)) => self.reported.insert(link.index).then(|| Unlisted {
                port: link.name.clone(),
                bridge: bridge.clone(),
                netns: self.netns.clone(),
            }),
            _ => {
                self.reported.remove(&link.index);
                None
            }
        }
    }

    /// Sends what is unlisted now, then each port that joins unlisted,
    /// until the socket fails (said on stderr).
    async fn run(mut self, links: Vec<Link>, tx: mpsc::UnboundedSender<Unlisted>) {
        for link in &links {
            self.send(link, &tx);
        }
        let failed = loop {
            let mut ready = match self.socket.readable().await {
                Ok(ready) => ready,
                Err(e) => break anyhow::Error::from(e),
            };
            let datagram = match ready.try_io(|s| s.get_ref().recv_from_full()) {
                Ok(Ok((datagram, _))) => datagram,
                Ok(Err(e)) => break e.into(),
                Err(_would_block) => continue,
            };
            match netlink::link_changes(&datagram) {
                Ok(changed) => changed.iter().for_each(|m| self.send(&Link::of(m), &tx)),
                Err(e) => break e,
            }
        };
        eprintln!("pkeyfw: no longer watching for unlisted bridge ports: {failed:#}");
    }

    fn send(&mut self, link: &Link, tx: &mpsc::UnboundedSender<Unlisted>) {
        if let Some(unlisted) = self.judge(link) {
            let _ = tx.send(unlisted);
        }
    }
}

/// Watches the bridges of the switch ports among `live`, one network
/// namespace at a time, sending every unlisted port to `tx` (on `runtime`).
pub fn watch(
    live: &[Live],
    tx: &mpsc::UnboundedSender<Unlisted>,
    runtime: &tokio::runtime::Runtime,
) -> Result<()> {
    let _entered = runtime.enter();
    let mut by_netns: BTreeMap<NetnsId, Vec<&Live>> = BTreeMap::new();
    for a in live {
        if a.maps.switch_port()? {
            by_netns.entry(a.pins.netns).or_default().push(a);
        }
    }
    for (id, ports) in by_netns {
        let ns = id.find().context("a switch's network namespace")?;
        let (socket, links) = ns.run(|| -> Result<(Socket, Vec<Link>)> {
            // The socket first: no join between the two is missed.
            Ok((netlink::link_watch()?, bridge::links()?))
        })??;
        let mut bridges = BTreeMap::new();
        for a in ports {
            let master = links
                .iter()
                .find(|l| l.name == a.pins.iface)
                .and_then(|l| l.master);
            if let Some(bridge) = links
                .iter()
                .find(|l| Some(l.index) == master && l.is_bridge)
            {
                bridges
                    .entry(bridge.index)
                    .or_insert((bridge.name.clone(), Maps::from_pins(&a.pins.dir)?));
            }
        }
        // SAFETY: the socket's fd is owned by the socket, which the
        // AsyncFd owns; it closes only when the AsyncFd is dropped.
        let socket = unsafe { AsyncFd::register(socket) }.map_err(|e| e.into_parts().1)?;
        let watch = Watch {
            socket,
            netns: id.unless_host(),
            bridges,
            reported: HashSet::new(),
        };
        tokio::spawn(watch.run(links, tx.clone()));
    }
    Ok(())
}
