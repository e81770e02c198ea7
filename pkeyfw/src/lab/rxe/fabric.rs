//! Four soft-RoCE hosts on a bridge, for switch mode: each host's rdma_rxe
//! device on its end of a veth pair, whose other end is a port of a Linux
//! bridge in a namespace of its own (the switch).
//!
//! rdma_rxe (Linux 6.1) lives in the initial namespace only, so the four
//! host ends are all local to one another: as in [`super::topology`], a
//! rule per host sends what its rxe device sends (rxe routes with its
//! netdev as the output interface) out of its own end, ahead of the local
//! table, and the neighbours are static; the bridge's forwarding entries
//! are static too, so no frame is flooded to a port it is not for. The
//! switch namespace has no IPv6, to keep its wire quiet. Everything is
//! undone on drop.

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result};
use pkeyfw_testkit::netns::in_netns;

use super::topology::{self, Changes, End, PREF, TABLE};

/// The switch's network namespace and bridge.
pub const NETNS: &str = "pkfw-switch";
const BRIDGE: &str = "pkfw-br";

/// One host: its end, and the switch port its veth pair ends at.
#[derive(Clone, Debug)]
pub struct Host {
    pub end: End,
    pub port: String,
}

pub struct Fabric {
    /// A, B, C and D.
    pub hosts: [Host; 4],
    changes: Changes,
}

impl Fabric {
    pub fn create() -> Result<Fabric> {
        let mut f = Fabric {
            hosts: [0u8, 1, 2, 3].map(|i| {
                let name = char::from(b'a' + i);
                Host {
                    end: End {
                        iface: format!("pkfw-{name}"),
                        addr: Ipv4Addr::new(192, 0, 2, 11 + i),
                        device: format!("pkfw_rxe_{name}"),
                        gid_index: 0,
                    },
                    port: format!("sw-{name}"),
                }
            }),
            changes: Changes::default(),
        };
        f.build()?;
        Ok(f)
    }

    fn build(&mut self) -> Result<()> {
        let c = &mut self.changes;
        // A leftover of an interrupted run.
        let _ = topology::ip(&["netns", "del", NETNS]);
        c.ip(&["netns", "add", NETNS], &["netns", "del", NETNS])?;
        in_netns(NETNS, || {
            ["all", "default"].into_iter().try_for_each(|conf| {
                let path = format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6");
                std::fs::write(&path, "1").with_context(|| format!("writing {path}"))
            })
        })??;
        let sw = |a: &[&str]| topology::ip(&[&["-n", NETNS], a].concat());
        sw(&["link", "add", BRIDGE, "type", "bridge"])?;
        sw(&["link", "set", BRIDGE, "up"])?;
        for Host { end, port } in &self.hosts {
            c.ip(
                &[
                    "link", "add", &end.iface, "type", "veth", "peer", "name", port, "netns", NETNS,
                ],
                &["link", "del", &end.iface],
            )?;
            sw(&["link", "set", port, "master", BRIDGE, "up"])?;
            topology::ip(&[
                "addr",
                "add",
                &format!("{}/32", end.addr),
                "dev",
                &end.iface,
            ])?;
            topology::ip(&["link", "set", &end.iface, "up"])?;
            let mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", end.iface))?;
            topology::run(
                "bridge",
                &[
                    "-n",
                    NETNS,
                    "fdb",
                    "replace",
                    mac.trim(),
                    "dev",
                    port,
                    "master",
                    "static",
                ],
            )?;
        }
        for (i, me) in self.hosts.iter().enumerate() {
            let table = TABLE + i as u32;
            for peer in self.hosts.iter().filter(|h| h.end.iface != me.end.iface) {
                c.route(&me.end, &peer.end, &peer.end.iface, table)?;
            }
            c.rule(PREF + i as u32, &["oif", &me.end.iface], table)?;
        }
        c.local_rule_below()?;
        let ifaces: Vec<&str> = self.hosts.iter().map(|h| h.end.iface.as_str()).collect();
        c.accept_local(&ifaces)?;
        for h in &self.hosts {
            c.rxe(&h.end)?;
        }
        for h in &mut self.hosts {
            h.end.gid_index = topology::gid_index(&h.end.device, h.end.addr)?;
        }
        Ok(())
    }
}
