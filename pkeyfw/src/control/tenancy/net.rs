//! A tenant's network device: a macvlan of the uplink in bridge mode, with
//! a MAC and addresses of its own, so that rdma_rxe never takes a frame
//! between two tenants' devices for its own loopback (it does so when the
//! destination MAC is its netdev's); the macvlan hands it to the other
//! tenant's macvlan through the network stack, where their ports' programs
//! stamp and judge it.
//!
//! rdma_rxe (Linux 6.1 to 7.x) routes in the initial network namespace,
//! where every tenant's address is a local one: left to the local table, a
//! frame for another tenant would loop back through `lo`, where no rxe
//! device takes it. So each tenant device has a routing table of its own,
//! consulted ahead of the local table for lookups bound to its interface
//! (rdma_rxe's, ib_core's address resolution, rdma_cm's once a source is
//! bound) and for what is sent from its addresses: its prefixes through
//! its interface, its own addresses local. Nothing else is routed by them:
//! the host's other traffic keeps its routes. Its interface accepts frames
//! from the host's own addresses (the other tenants': `accept_local`,
//! loose reverse-path filtering, which its table answers), answers ARP
//! only for its own addresses, takes no router advertisement; the uplink
//! answers ARP only for its own (else it would claim the tenants'
//! addresses for itself).

use std::{fs, net::IpAddr};

use anyhow::{Context as _, Result, bail};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressFlags, AddressMessage},
    link::{
        InfoData, InfoKind, InfoMacVlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
        MacVlanMode,
    },
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType},
    rule::{RuleAction, RuleAttribute, RuleMessage},
};

use crate::{
    host::netlink,
    policy::{OwnDevice, Prefix},
};

/// The routing tables of tenant devices: this plus the interface's index
/// ("PK" in its top bytes, far above the tables hosts number by hand).
pub const TABLES: u32 = 0x504b_0000;
/// The table of the local routes, which Linux consults first.
const LOCAL_TABLE: u32 = 255;
/// Where a tenant's rules go: ahead of the local table's rule, which is
/// moved from 0 (Linux's place for it) to [`LOCAL_PREF`] (one moved
/// elsewhere already stays, the tenants' rules right before it).
const TENANT_PREF: u32 = 0;
const LOCAL_PREF: u32 = 1;

/// The routing table of the tenant interface numbered `index`.
pub fn table_of(index: u32) -> u32 {
    TABLES + index
}

/// Whether routing table `table` is a tenant device's.
fn ours(table: u32) -> bool {
    table >= TABLES
}

/// The families a device's addresses are of.
fn families(dev: &OwnDevice) -> Vec<AddressFamily> {
    let mut f = Vec::new();
    for p in &dev.addrs {
        let family = family_of(p.addr);
        if !f.contains(&family) {
            f.push(family);
        }
    }
    f
}

fn family_of(addr: IpAddr) -> AddressFamily {
    if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// Makes `dev`'s interface on the uplink `uplink` (an index), up, with
/// its addresses, table and rules; returns its index. On a failure what
/// was made is removed.
pub fn make(dev: &OwnDevice, uplink: u32) -> Result<u32> {
    let mut link = LinkMessage::default();
    link.attributes = vec![
        LinkAttribute::IfName(dev.iface.clone()),
        LinkAttribute::Link(uplink),
        LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::MacVlan),
            LinkInfo::Data(InfoData::MacVlan(vec![InfoMacVlan::Mode(
                MacVlanMode::Bridge,
            )])),
        ]),
    ];
    netlink::create(
        RouteNetlinkMessage::NewLink(link),
        &format!("making interface {} (a macvlan)", dev.iface),
    )
    .map_err(|e| match errno(&e) {
        Some(libc::EOPNOTSUPP) => e.context(format!(
            "this kernel makes no macvlan interfaces (CONFIG_MACVLAN; `modprobe macvlan`), which {} needs",
            dev.name
        )),
        _ => e,
    })?;
    let index = netlink::if_index(&dev.iface)?;
    if let Err(e) = configure(dev, index) {
        let _ = remove(&dev.iface);
        return Err(e);
    }
    Ok(index)
}

/// The errno the kernel answered with, if that is what `e` is.
pub fn errno(e: &anyhow::Error) -> Option<i32> {
    e.root_cause()
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::raw_os_error)
}

fn configure(dev: &OwnDevice, index: u32) -> Result<()> {
    let iface = &dev.iface;
    for (key, value) in [
        ("ipv4/conf/{}/accept_local", "1"),
        ("ipv4/conf/{}/rp_filter", "2"),
        ("ipv4/conf/{}/arp_ignore", "1"),
        ("ipv4/conf/{}/arp_announce", "2"),
    ] {
        sysctl(&key.replace("{}", iface), value)?;
    }
    // Without IPv6 there is nothing to keep from it.
    if fs::exists(format!("/proc/sys/net/ipv6/conf/{iface}")).unwrap_or(false) {
        sysctl(&format!("ipv6/conf/{iface}/accept_ra"), "0")?;
        sysctl(&format!("ipv6/conf/{iface}/autoconf"), "0")?;
    }
    for p in &dev.addrs {
        add_address(index, p).with_context(|| format!("giving {iface} address {p}"))?;
    }
    set_up(index).with_context(|| format!("setting {iface} up"))?;
    let table = table_of(index);
    for p in &dev.addrs {
        let own = Prefix {
            addr: p.addr,
            len: if p.addr.is_ipv4() { 32 } else { 128 },
        };
        netlink::create(
            route(index, table, own, RouteType::Local, RouteScope::Host, None),
            &format!("routing {} to itself in table {table}", p.addr),
        )?;
        let net = Prefix {
            addr: p.network(),
            len: p.len,
        };
        netlink::create(
            route(
                index,
                table,
                net,
                RouteType::Unicast,
                RouteScope::Link,
                Some(p.addr),
            ),
            &format!("routing {net} through {iface} in table {table}"),
        )?;
    }
    for gw in &dev.gateways {
        let mut r = route(
            index,
            table,
            Prefix {
                addr: if gw.is_ipv4() {
                    IpAddr::from([0u8; 4])
                } else {
                    IpAddr::from([0u16; 8])
                },
                len: 0,
            },
            RouteType::Unicast,
            RouteScope::Universe,
            None,
        );
        if let RouteNetlinkMessage::NewRoute(m) = &mut r {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(*gw)));
        }
        netlink::create(r, &format!("routing through {gw} in table {table}"))?;
    }
    for family in families(dev) {
        let pref = place_local_rule(family)?;
        netlink::create(
            RouteNetlinkMessage::NewRule(rule(
                family,
                pref,
                table,
                vec![RuleAttribute::Oifname(iface.clone())],
            )),
            &format!("a routing rule for lookups bound to {iface}"),
        )?;
        for p in dev.addrs.iter().filter(|p| family_of(p.addr) == family) {
            let mut r = rule(
                family,
                pref,
                table,
                vec![
                    RuleAttribute::Source(p.addr),
                    RuleAttribute::Iifname("lo".to_string()),
                ],
            );
            r.header.src_len = if p.addr.is_ipv4() { 32 } else { 128 };
            netlink::create(
                RouteNetlinkMessage::NewRule(r),
                &format!("a routing rule for what {} sends", p.addr),
            )?;
        }
    }
    Ok(())
}

fn add_address(index: u32, p: &Prefix) -> Result<()> {
    let mut a = AddressMessage::default();
    a.header.family = family_of(p.addr);
    a.header.prefix_len = p.len;
    a.header.index = index;
    // The tenant's prefix is routed by its table, not the host's main one;
    // an IPv6 address is usable at once (no duplicate detection to wait
    // for: pkeyfw chose it for this host).
    let mut flags = AddressFlags::Noprefixroute;
    if p.addr.is_ipv6() {
        flags |= AddressFlags::Nodad;
    }
    a.attributes = vec![
        AddressAttribute::Local(p.addr),
        AddressAttribute::Flags(flags),
    ];
    if p.addr.is_ipv4() {
        a.attributes.push(AddressAttribute::Address(p.addr));
    }
    netlink::create(RouteNetlinkMessage::NewAddress(a), "RTM_NEWADDR")
}

fn set_up(index: u32) -> Result<()> {
    let mut link = LinkMessage::default();
    link.header.index = index;
    link.header.flags = LinkFlags::Up;
    link.header.change_mask = LinkFlags::Up;
    netlink::change(RouteNetlinkMessage::SetLink(link), "RTM_SETLINK")
}

/// A route of `kind` to `to` through interface `index` in `table`.
fn route(
    index: u32,
    table: u32,
    to: Prefix,
    kind: RouteType,
    scope: RouteScope,
    source: Option<IpAddr>,
) -> RouteNetlinkMessage {
    let mut r = RouteMessage::default();
    r.header.address_family = family_of(to.addr);
    r.header.destination_prefix_length = to.len;
    r.header.protocol = RouteProtocol::Static;
    r.header.scope = scope;
    r.header.kind = kind;
    r.attributes = vec![RouteAttribute::Table(table), RouteAttribute::Oif(index)];
    if to.len > 0 {
        r.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(to.addr)));
    }
    if let Some(s) = source {
        r.attributes
            .push(RouteAttribute::PrefSource(RouteAddress::from(s)));
    }
    RouteNetlinkMessage::NewRoute(r)
}

/// A rule: what `selectors` match looks `table` up, at preference `pref`.
fn rule(
    family: AddressFamily,
    pref: u32,
    table: u32,
    selectors: Vec<RuleAttribute>,
) -> RuleMessage {
    let mut r = RuleMessage::default();
    r.header.family = family;
    r.header.action = RuleAction::ToTable;
    r.attributes = selectors;
    r.attributes.push(RuleAttribute::Priority(pref));
    r.attributes.push(RuleAttribute::Table(table));
    r
}

/// A rule's table and preference.
fn table_and_pref(r: &RuleMessage) -> (u32, u32) {
    let table = r
        .attributes
        .iter()
        .find_map(|a| match a {
            RuleAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table));
    let pref = r
        .attributes
        .iter()
        .find_map(|a| match a {
            RuleAttribute::Priority(p) => Some(*p),
            _ => None,
        })
        .unwrap_or(0);
    (table, pref)
}

/// Whether `r` is the rule that sends every lookup to the local table: it
/// selects nothing (the kernel reports its protocol and suppression
/// settings besides).
fn is_local_rule(r: &RuleMessage) -> bool {
    let selects = r.attributes.iter().any(|a| {
        matches!(
            a,
            RuleAttribute::Iifname(_)
                | RuleAttribute::Oifname(_)
                | RuleAttribute::Source(_)
                | RuleAttribute::Destination(_)
                | RuleAttribute::FwMark(_)
                | RuleAttribute::L3MDev(_)
                | RuleAttribute::UidRange(_)
                | RuleAttribute::IpProtocol(_)
                | RuleAttribute::SourcePortRange(_)
                | RuleAttribute::DestinationPortRange(_)
                | RuleAttribute::TunId(_)
        )
    });
    r.header.action == RuleAction::ToTable
        && r.header.src_len == 0
        && r.header.dst_len == 0
        && r.header.tos == 0
        && !selects
        && table_and_pref(r).0 == LOCAL_TABLE
}

/// Makes room for the tenants' rules of `family` ahead of the local
/// table's, moving its rule from preference 0 to 1 where it is still at 0;
/// returns the preference the tenants' rules take: the one before the
/// local table's. A rule of someone else at preference 1 would come
/// before the local table once it moved there: refused.
fn place_local_rule(family: AddressFamily) -> Result<u32> {
    let rules = netlink::rules(family)?;
    let Some(local) = rules.iter().find(|r| is_local_rule(r)) else {
        bail!(
            "no routing rule looks up the local table ({family:?}); expected Linux's `0: from all lookup local`"
        );
    };
    match table_and_pref(local).1 {
        TENANT_PREF => {
            if let Some(other) = rules
                .iter()
                .find(|r| table_and_pref(r).1 == LOCAL_PREF && !is_local_rule(r))
            {
                bail!(
                    "a routing rule of preference {LOCAL_PREF} (table {}) would come before the local table once pkeyfw moves that to {LOCAL_PREF} for the tenants' rules; move it after it",
                    table_and_pref(other).0
                );
            }
            // So that the last tenant's removal puts it back, and only then;
            // noted first, so that a kill between the two leaves no rule
            // moved unnoted (a note of a rule not moved is no harm).
            fs::create_dir_all(RUN_DIR)?;
            fs::write(moved_note(family), "")?;
            move_local_rule(family, TENANT_PREF, LOCAL_PREF)?;
            Ok(TENANT_PREF)
        }
        // Moved already (by pkeyfw, or by another program ahead of its own
        // rules): the tenants' go right before it, after whatever was put
        // before it (rules of a preference go in the order they came).
        at => Ok(at - 1),
    }
}

/// Where pkeyfw notes that it moved the local table's rule of `family`.
fn moved_note(family: AddressFamily) -> String {
    let name = if family == AddressFamily::Inet {
        "inet"
    } else {
        "inet6"
    };
    format!("{RUN_DIR}/local-rule-moved.{name}")
}

/// pkeyfw's notes that are no BPF objects.
const RUN_DIR: &str = "/run/pkeyfw";

/// Puts the local table's rules back at preference 0 where pkeyfw moved
/// them and no tenant's rule is left ahead of them.
pub fn restore_local_rules() -> Result<()> {
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        if fs::exists(moved_note(family)).unwrap_or(false) {
            restore_local_rule(family)?;
        }
    }
    Ok(())
}

fn restore_local_rule(family: AddressFamily) -> Result<()> {
    let rules = netlink::rules(family)?;
    if rules.iter().any(|r| ours(table_and_pref(r).0)) {
        return Ok(());
    }
    let at = |pref: u32| {
        rules
            .iter()
            .any(|r| is_local_rule(r) && table_and_pref(r).1 == pref)
    };
    if at(LOCAL_PREF) {
        if at(TENANT_PREF) {
            // A move killed between its two steps: the copy goes.
            netlink::change(
                RouteNetlinkMessage::DelRule(rule(family, LOCAL_PREF, LOCAL_TABLE, Vec::new())),
                &format!("removing the local table's routing rule at preference {LOCAL_PREF}"),
            )?;
        } else {
            move_local_rule(family, LOCAL_PREF, TENANT_PREF)?;
        }
    }
    let _ = fs::remove_file(moved_note(family));
    Ok(())
}

/// Moves the local table's rule of `family` from preference `from` to
/// `to`: the new one first, so that no lookup ever misses the local
/// table.
fn move_local_rule(family: AddressFamily, from: u32, to: u32) -> Result<()> {
    netlink::create(
        RouteNetlinkMessage::NewRule(rule(family, to, LOCAL_TABLE, Vec::new())),
        &format!("adding the local table's routing rule at preference {to}"),
    )?;
    netlink::change(
        RouteNetlinkMessage::DelRule(rule(family, from, LOCAL_TABLE, Vec::new())),
        &format!("removing the local table's routing rule at preference {from}"),
    )
}

/// Removes interface `iface` (its addresses and routes go with it) and the
/// rules that looked its table up. What is already gone is no error.
pub fn remove(iface: &str) -> Result<()> {
    let Ok(index) = netlink::if_index(iface) else {
        return Ok(());
    };
    let table = table_of(index);
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        for r in netlink::rules(family)? {
            if table_and_pref(&r).0 == table {
                netlink::change(
                    RouteNetlinkMessage::DelRule(r),
                    "removing a tenant's routing rule",
                )?;
            }
        }
    }
    let mut link = LinkMessage::default();
    link.header.index = index;
    netlink::change(
        RouteNetlinkMessage::DelLink(link),
        &format!("removing interface {iface}"),
    )
}

/// Whether `iface` is a macvlan of the uplink numbered `uplink`: the
/// interface an earlier attach made for a tenant.
pub fn is_tenant_link(iface: &str, uplink: u32) -> Result<bool> {
    let Ok(index) = netlink::if_index(iface) else {
        return Ok(false);
    };
    let link = netlink::links()?
        .into_iter()
        .find(|l| l.header.index == index)
        .context("an interface vanished while it was read")?;
    let macvlan = link.attributes.iter().any(|a| {
        matches!(a, LinkAttribute::LinkInfo(info)
            if info.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::MacVlan))))
    });
    let on_uplink = link
        .attributes
        .iter()
        .any(|a| matches!(a, LinkAttribute::Link(l) if *l == uplink));
    Ok(macvlan && on_uplink)
}

/// Writes `value` to /proc/sys/net/`key`.
pub fn sysctl(key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/net/{key}");
    fs::write(&path, value).with_context(|| format!("writing {value} to {path}"))
}

/// Reads /proc/sys/net/`key`.
pub fn read_sysctl(key: &str) -> Result<String> {
    let path = format!("/proc/sys/net/{key}");
    Ok(fs::read_to_string(&path)
        .with_context(|| format!("reading {path}"))?
        .trim()
        .to_string())
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::route::RouteProtocol;

    use super::*;

    /// The local table's rule as the kernel dumps it (its protocol and
    /// suppression settings besides the table), and what is not it.
    #[test]
    fn the_local_rule_is_told_by_what_it_selects() {
        let dumped = |extra: Vec<RuleAttribute>| {
            let mut r = RuleMessage::default();
            r.header.family = AddressFamily::Inet;
            r.header.table = 255;
            r.header.action = RuleAction::ToTable;
            r.attributes = vec![
                RuleAttribute::Table(LOCAL_TABLE),
                RuleAttribute::SuppressPrefixLen(u32::MAX),
                RuleAttribute::Protocol(RouteProtocol::Kernel),
            ];
            r.attributes.extend(extra);
            r
        };
        assert!(is_local_rule(&dumped(Vec::new())));
        assert_eq!(table_and_pref(&dumped(Vec::new())), (LOCAL_TABLE, 0));
        assert!(is_local_rule(&dumped(vec![RuleAttribute::Priority(1)])));
        assert!(!is_local_rule(&dumped(vec![RuleAttribute::Oifname(
            "rxe_a".into()
        )])));
        let mut from = dumped(Vec::new());
        from.header.src_len = 32;
        assert!(!is_local_rule(&from));
        let mut main = dumped(Vec::new());
        main.attributes[0] = RuleAttribute::Table(254);
        assert!(!is_local_rule(&main));
        assert!(ours(table_of(7)) && !ours(254) && !ours(LOCAL_TABLE));
    }
}
