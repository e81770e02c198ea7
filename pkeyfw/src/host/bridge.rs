//! The bridges switch ports are in: which interfaces are ports of the same
//! bridge (IFLA_MASTER) and which of those a switch's policy does not list.
//! A router's ports have no bridge, so there is nothing to find for them.

use std::collections::HashSet;

use anyhow::Result;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};

use super::netlink;

/// One interface, as far as bridges go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// Its master (a bridge, a bond, a VRF…), by index.
    pub master: Option<u32>,
    pub is_bridge: bool,
}

impl Link {
    pub fn of(m: &LinkMessage) -> Link {
        let mut link = Link {
            index: m.header.index,
            name: String::new(),
            master: None,
            is_bridge: false,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(name) => link.name = name.clone(),
                LinkAttribute::Controller(master) => link.master = Some(*master),
                LinkAttribute::LinkInfo(info) => {
                    link.is_bridge = info.contains(&LinkInfo::Kind(InfoKind::Bridge));
                }
                _ => {}
            }
        }
        link
    }
}

/// Every interface of this network namespace.
pub fn links() -> Result<Vec<Link>> {
    Ok(netlink::links()?.iter().map(Link::of).collect())
}

/// A bridge, and its ports that a switch's policy does not list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bridge {
    pub index: u32,
    pub name: String,
    /// By name, sorted.
    pub unlisted: Vec<String>,
}

/// The bridge switch port `iface` is a port of, with its ports that are
/// not `listed`; `None` for a router's port.
pub fn of_port(iface: &str, listed: &HashSet<u32>) -> Result<Option<Bridge>> {
    let port = HashSet::from([netlink::if_index(iface)?]);
    Ok(bridges(&links()?, &port, listed).into_iter().next())
}

/// The bridges of a switch policy's ports (by name, in this network
/// namespace) that have ports it does not list.
pub fn with_unlisted(ports: &[String]) -> Result<Vec<Bridge>> {
    let listed = ports
        .iter()
        .map(|p| netlink::if_index(p))
        .collect::<Result<HashSet<_>>>()?;
    let mut found = bridges(&links()?, &listed, &listed);
    found.retain(|b| !b.unlisted.is_empty());
    Ok(found)
}

impl std::fmt::Display for Bridge {
    /// "bridge br0 has ports the policy does not list: tap7, tap9".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bridge {} has ports the policy does not list: {}",
            self.name,
            self.unlisted.join(", ")
        )
    }
}

/// The bridges any of `ports` is a port of, each with its ports that are
/// not `listed` (interfaces by index).
pub fn bridges(links: &[Link], ports: &HashSet<u32>, listed: &HashSet<u32>) -> Vec<Bridge> {
    let masters: HashSet<u32> = links
        .iter()
        .filter(|l| ports.contains(&l.index))
        .filter_map(|l| l.master)
        .collect();
    let mut found: Vec<Bridge> = links
        .iter()
        .filter(|l| l.is_bridge && masters.contains(&l.index))
        .map(|bridge| {
            let mut unlisted: Vec<String> = links
                .iter()
                .filter(|l| l.master == Some(bridge.index) && !listed.contains(&l.index))
                .map(|l| l.name.clone())
                .collect();
            unlisted.sort();
            Bridge {
                index: bridge.index,
                name: bridge.name.clone(),
                unlisted,
            }
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, master: Option<u32>, is_bridge: bool) -> Link {
        Link {
            index,
            name: name.to_string(),
            master,
            is_bridge,
        }
    }

    /// A bridge's unlisted ports are found from any of its listed ones; a
    /// bond's slaves and a router's ports are no bridge's.
    #[test]
    fn unlisted_ports_of_the_ports_bridges() {
        let links = [
            link(1, "br0", None, true),
            link(2, "swa", Some(1), false),
            link(3, "swb", Some(1), false),
            link(4, "tap7", Some(1), false),
            link(5, "bond0", None, false),
            link(6, "eth1", Some(5), false),
            link(7, "rt0", None, false),
        ];
        let set = |i: &[u32]| i.iter().copied().collect::<HashSet<_>>();
        let listed = set(&[2, 3, 6, 7]);
        assert_eq!(
            bridges(&links, &listed, &listed),
            [Bridge {
                index: 1,
                name: "br0".to_string(),
                unlisted: vec!["tap7".to_string()],
            }]
        );
        assert_eq!(
            bridges(&links, &set(&[3]), &set(&[2, 3, 4]))[0].unlisted,
            Vec::<String>::new()
        );
        assert!(bridges(&links, &set(&[6, 7]), &listed).is_empty());
    }
}
