//! `own_device`: what a tenant's device is given as, every refusal with
//! its position, and the policy of each device's port.

use std::{net::IpAddr, path::Path};

use pkeyfw_common::abi::matcher;

use super::Prefix;
use crate::policy::{Policy, PolicyError};

const TWO: &str = r#"[port]
pkeys = [0xffff, 0x8001, 0x0001]

[enforcement]
unknown_qp = "drop"

[[bind]]
uid = 1001
pkey = 0x8001
own_device = { name = "rxe_a", address = "192.0.2.11/24", gateway = "192.0.2.254" }

[[bind]]
uid = 1002
pkey = 0x0001
own_device = { name = "rxe_b", interface = "ten-b", address = ["192.0.2.12/24", "2001:db8::12/64"] }
"#;

fn parse(text: &str) -> Result<Policy, PolicyError> {
    Policy::parse(Path::new("p.toml"), text)
}

#[track_caller]
fn refused(text: &str, line: usize, field: &str, says: &str) {
    let e = parse(text).expect_err("must be refused");
    assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    assert!(e.message.contains(says), "{e} lacks {says:?}");
}

fn prefix(text: &str) -> Prefix {
    let (a, l) = text.split_once('/').unwrap();
    Prefix {
        addr: a.parse().unwrap(),
        len: l.parse().unwrap(),
    }
}

#[test]
fn each_rule_gives_its_tenant_a_device() {
    let p = parse(TWO).unwrap();
    assert!(p.gives_devices());
    let devices: Vec<_> = p.own_devices().collect();
    assert_eq!(devices.len(), 2);
    let (rule, a) = devices[0];
    assert_eq!(
        (rule, a.name.as_str(), a.iface.as_str()),
        (0, "rxe_a", "rxe_a")
    );
    assert_eq!(a.addrs, [prefix("192.0.2.11/24")]);
    assert_eq!(a.gateways, ["192.0.2.254".parse::<IpAddr>().unwrap()]);
    let (_, b) = devices[1];
    assert_eq!(b.iface, "ten-b");
    assert_eq!(
        b.addrs,
        [prefix("192.0.2.12/24"), prefix("2001:db8::12/64")]
    );
    assert_eq!(p.tenant_of("ten-b"), Some(1));
    assert_eq!(p.tenant_of("rxe_b"), None);
}

/// A device's port: the default key and its tenant's in its table, every
/// rule kept (to tell its tenant's QPs from anyone's), its own the owner.
#[test]
fn a_tenant_port_holds_its_tenants_key_and_knows_every_rule() {
    let p = parse(TWO).unwrap();
    let b = p.for_tenant(1);
    assert_eq!(b.pkeys, [0xffff, 0x0001]);
    assert_eq!(b.owner, Some(1));
    assert!(!b.gives_devices());
    let specs = b.specs();
    assert_eq!(specs.len(), 2);
    assert!(specs.iter().all(|s| s.owned()));
    assert_eq!(
        specs
            .iter()
            .map(|s| s.matchers & matcher::OWNER != 0)
            .collect::<Vec<_>>(),
        [false, true]
    );
    // The host policy marks nothing: it binds no QP itself.
    assert!(p.specs().iter().all(|s| !s.owned()));
}

#[test]
fn a_device_is_refused_with_its_position() {
    let with = |own: &str| {
        format!(
            "[port]\npkeys = [0xffff, 0x8001]\n[[bind]]\nuid = 1\npkey = 0x8001\nown_device = {own}\n"
        )
    };
    refused(
        &with(r#"{ address = "192.0.2.1/24" }"#),
        6,
        "bind[0].own_device.name",
        "missing",
    );
    refused(
        &with(r#"{ name = "rxe a", address = "192.0.2.1/24" }"#),
        6,
        "bind[0].own_device.name",
        "letters, digits",
    );
    refused(
        &with(r#"{ name = "a-name-far-too-long", address = "192.0.2.1/24" }"#),
        6,
        "bind[0].own_device.name",
        "1 to 15",
    );
    refused(
        &with(r#"{ name = "rxe_a" }"#),
        6,
        "bind[0].own_device.address",
        "missing",
    );
    refused(
        &with(r#"{ name = "rxe_a", address = "192.0.2.1" }"#),
        6,
        "bind[0].own_device.address",
        "no prefix length",
    );
    refused(
        &with(r#"{ name = "rxe_a", address = "192.0.2.1/33" }"#),
        6,
        "bind[0].own_device.address",
        "expected 1..=32",
    );
    refused(
        &with(r#"{ name = "rxe_a", address = "127.0.0.2/8" }"#),
        6,
        "bind[0].own_device.address",
        "not loopback",
    );
    refused(
        &with(r#"{ name = "rxe_a", address = "fe80::1/64" }"#),
        6,
        "bind[0].own_device.address",
        "link-local",
    );
    refused(
        &with(r#"{ name = "rxe_a", address = ["192.0.2.1/24", "192.0.2.1/24"] }"#),
        6,
        "bind[0].own_device.address",
        "given twice",
    );
    refused(
        &with(r#"{ name = "rxe_a", address = "192.0.2.1/24", gateway = "198.51.100.1" }"#),
        6,
        "bind[0].own_device.gateway",
        "in none of the device's prefixes",
    );
    refused(
        &with(r#"{ name = "rxe_a", address = "192.0.2.1/24", mtu = 9000 }"#),
        6,
        "",
        "unknown field `mtu`",
    );
}

#[test]
fn every_rule_has_a_device_of_its_own_or_none_does() {
    let base = "[port]\npkeys = [0xffff, 0x8001]\n[[bind]]\nuid = 1\npkey = 0x8001\nown_device = { name = \"rxe_a\", address = \"192.0.2.1/24\" }\n";
    refused(
        &format!("{base}[[bind]]\nuid = 2\npkey = 0x8001\n"),
        7,
        "bind[1]",
        "has no own_device, where the rule at line 3 has one",
    );
    refused(
        &format!(
            "{base}[[bind]]\nuid = 2\npkey = 0x8001\nown_device = {{ name = \"rxe_a\", address = \"192.0.2.2/24\" }}\n"
        ),
        7,
        "bind[1].own_device",
        "device rxe_a is also the rule's at line 3",
    );
    refused(
        &format!(
            "{base}[[bind]]\nuid = 2\npkey = 0x8001\nown_device = {{ name = \"rxe_b\", address = \"192.0.2.1/24\" }}\n"
        ),
        7,
        "bind[1].own_device",
        "address 192.0.2.1 is also the rule's at line 3",
    );
    refused(
        &format!("{base}[[qp]]\nqpn = 0x11\ntype = \"rc\"\npkey = 0x8001\n"),
        7,
        "qp[0]",
        "binds a QPN",
    );
    refused(
        "[port]\npkeys = [0xffff, 0x8001]\n[[bind]]\ncomm = \"x\"\npkey = 0x8001\nown_device = { name = \"rxe_a\", address = \"192.0.2.1/24\" }\n",
        3,
        "bind[0].own_device",
        "is for a tenant",
    );
    refused(
        "[port]\npkeys = [0xffff, 0x8001]\n[[bind]]\nuid = 1\ntype = \"ud\"\npkey = 0x8001\nown_device = { name = \"rxe_a\", address = \"192.0.2.1/24\" }\n",
        3,
        "bind[0].type",
        "narrows a rule with an own_device",
    );
}

/// Two tenants with no device of their own share the interface's: said in
/// one line naming both; with devices, or with one tenant, nothing.
#[test]
fn tenants_sharing_a_device_are_named_in_one_line() {
    let shared = "[port]\npkeys = [0xffff, 0x8001, 0x0001]\n\
        [[bind]]\nuid = 1001\npkey = 0x8001\n[[bind]]\nuid = 1002\npkey = 0x0001\n";
    let p = parse(shared).unwrap();
    let said: Vec<&String> = p
        .warnings
        .iter()
        .filter(|w| w.contains("share the interface's RDMA devices"))
        .collect();
    assert_eq!(said.len(), 1, "{:?}", p.warnings);
    assert!(
        said[0].contains("line 3 (uid 1001)") && said[0].contains("line 6 (uid 1002)"),
        "{}",
        said[0]
    );
    let alone =
        parse("[port]\npkeys = [0xffff, 0x8001]\n[[bind]]\nuid = 1001\npkey = 0x8001\n").unwrap();
    assert!(!alone.warnings.iter().any(|w| w.contains("share")));
    assert!(
        !parse(TWO)
            .unwrap()
            .warnings
            .iter()
            .any(|w| w.contains("share"))
    );
}

#[test]
fn prefixes_contain_their_network() {
    let p = prefix("192.0.2.11/24");
    assert_eq!(p.network(), "192.0.2.0".parse::<IpAddr>().unwrap());
    assert!(p.contains("192.0.2.254".parse().unwrap()));
    assert!(!p.contains("192.0.3.1".parse().unwrap()));
    assert!(!p.contains("2001:db8::1".parse().unwrap()));
    let v6 = prefix("2001:db8::12/64");
    assert_eq!(v6.network(), "2001:db8::".parse::<IpAddr>().unwrap());
    assert!(v6.contains("2001:db8::ffff".parse().unwrap()));
    assert!(prefix("10.0.0.1/32").contains("10.0.0.1".parse().unwrap()));
}

/// A table derived from partitions.conf is derived for one GUID: with own
/// devices (each a MAC, so a GUID, of its own) the policy names it.
#[test]
fn a_derived_table_for_own_devices_names_its_guid() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("partitions.conf"),
        "Default=0x7fff : ALL=full ;\nA=0x0001 : ALL=full ;\n",
    )
    .unwrap();
    let policy = |guid: &str| {
        format!(
            "[port]\npartitions = \"partitions.conf\"\n{guid}\n[[bind]]\nuid = 1\npkey = 0x8001\nown_device = {{ name = \"rxe_a\", address = \"192.0.2.1/24\" }}\n"
        )
    };
    let path = dir.path().join("p.toml");
    std::fs::write(&path, policy("")).unwrap();
    let e = Policy::load_for(&path, Some(0x0002_c903_00a1_b2c3)).expect_err("no guid");
    assert_eq!((e.line, e.field.as_str()), (2, "port.partitions"), "{e}");
    assert!(e.message.contains("expected `guid` in [port]"), "{e}");
    std::fs::write(&path, policy("guid = \"0x0002c90300a1b2c3\"")).unwrap();
    let p = Policy::load_for(&path, Some(0x1111_1111_1111_1111)).unwrap();
    assert_eq!(p.for_tenant(0).pkeys, [0xffff, 0x8001]);
}
