//! `pkeyfw policy check` and partitions.conf policies end to end: the CLI,
//! the port GUID from --port-guid or from a real interface's MAC (EUI-64),
//! and attach deriving its table from the interface it is attached to.

use crate::common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use pkeyfw_testkit::netns::VethPair;
use serde_json::Value;

const PARTITIONS: &str = "\
# storage is shared: servers full, clients limited
Default=0x7fff : ALL=full ;
storage=0x0001 , ipoib : 0x021122fffe334455=full, 0x0000000000000042 ;
compute=0x0002 : 0x42=full ;
";

const POLICY: &str = "[port]\npartitions = \"partitions.conf\"\n\n[[qp]]\nqpn = 0x11\ntype = \"rc\"\npkey_index = 1\n";

fn files(dir: &Path, policy: &str) -> PathBuf {
    std::fs::write(dir.join("partitions.conf"), PARTITIONS).unwrap();
    let path = dir.join("policy.toml");
    std::fs::write(&path, policy).unwrap();
    path
}

fn pkeyfw(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
        .args(args)
        .output()
        .unwrap()
}

fn check_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_table_depends_on_the_port_guid() {
    let dir = tempfile::tempdir().unwrap();
    let policy = files(dir.path(), POLICY);
    let p = policy.to_str().unwrap();

    let server = check_json(&pkeyfw(&[
        "policy",
        "check",
        "--policy",
        p,
        "--port-guid",
        "0x021122fffe334455",
        "--json",
    ]));
    assert_eq!(server["guid"], "0x021122fffe334455");
    assert_eq!(server["pkeys"], serde_json::json!([0xffff, 0x8001]));
    assert_eq!(server["qps"][0]["pkey"], 0x8001);
    assert_eq!(server["groups"][0]["addr"], "ff12:401b:8001::ffff:ffff");

    let client = check_json(&pkeyfw(&[
        "policy",
        "check",
        "--policy",
        p,
        "--port-guid",
        "66",
        "--json",
    ]));
    assert_eq!(client["pkeys"], serde_json::json!([0xffff, 0x0001, 0x8002]));
    assert_eq!(
        client["qps"][0]["pkey"], 0x0001,
        "pkey_index 1 is this port's entry"
    );

    // A port in no partition but the default one has a one-entry table.
    let out = pkeyfw(&["policy", "check", "--policy", p, "--port-guid", "0x99"]);
    assert!(
        !out.status.success(),
        "pkey_index 1 does not exist on this port"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(
        "policy.toml:7:14: qp[0].pkey_index: 1 is out of range; expected an index in 0..=0"
    ));

    let text = pkeyfw(&[
        "policy",
        "check",
        "--policy",
        p,
        "--port-guid",
        "0x021122fffe334455",
    ]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("[1] 0x8001 (full, partition 0x0001)") && text.contains("storage"),
        "{text}"
    );
}

#[test]
fn policy_errors_point_into_the_right_file() {
    let dir = tempfile::tempdir().unwrap();
    let both = files(
        dir.path(),
        "[port]\npkeys = [0xffff]\npartitions = \"partitions.conf\"\n",
    );
    let out = pkeyfw(&[
        "policy",
        "check",
        "--policy",
        both.to_str().unwrap(),
        "--port-guid",
        "1",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("policy.toml:3:14: port.partitions: given together with `pkeys`")
    );

    let no_guid = files(dir.path(), POLICY);
    let out = pkeyfw(&["policy", "check", "--policy", no_guid.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs this port's GUID"));

    std::fs::write(
        dir.path().join("partitions.conf"),
        "storage=0x18001 : ALL ;\n",
    )
    .unwrap();
    let out = pkeyfw(&[
        "policy",
        "check",
        "--policy",
        no_guid.to_str().unwrap(),
        "--port-guid",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("partitions.conf:1:9:"), "{err}");

    let out = pkeyfw(&[
        "policy",
        "check",
        "--policy",
        no_guid.to_str().unwrap(),
        "--port-guid",
        "0xnope",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--port-guid 0xnope"));
}

/// A port's GUID is the EUI-64 of its MAC: 02:11:22:33:44:55 → 0x001122fffe334455.
#[test]
fn guid_from_a_real_interface() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&format!("pg{}", std::process::id() % 10000)).unwrap();
    let ip = |args: &[&str]| assert!(Command::new("ip").args(args).status().unwrap().success());
    ip(&[
        "-n",
        &pair.ns_b,
        "link",
        "set",
        &pair.b,
        "address",
        "02:11:22:33:44:55",
    ]);
    let dir = tempfile::tempdir().unwrap();
    // 0x001122fffe334455 is a full member of "storage" in this file.
    let conf = PARTITIONS.replace("0x021122fffe334455", "0x001122fffe334455");
    std::fs::write(dir.path().join("partitions.conf"), conf).unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let in_b = |args: &[&str]| common::pkeyfw_in(&pair.ns_b).args(args).output().unwrap();
    let checked = check_json(&in_b(&[
        "policy",
        "check",
        "--policy",
        policy.to_str().unwrap(),
        "--iface",
        &pair.b,
        "--json",
    ]));
    assert_eq!(checked["guid"], "0x001122fffe334455");
    assert_eq!(checked["pkeys"], serde_json::json!([0xffff, 0x8001]));
    // No RDMA device is bound to a veth the test made (nor exists without
    // ib_core): none named, no device warned of as out of reach.
    assert_eq!(checked["rdma_devices"], serde_json::json!([]));
    assert!(
        !checked["warnings"].to_string().contains("RDMA"),
        "{}",
        checked["warnings"]
    );

    // attach derives the same GUID from the interface it attaches to.
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    let out = in_b(&[
        "attach",
        &pair.b,
        "--pin",
        "--policy",
        policy.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("0x8001 (full, partition 0x0001)"));
    let stats = check_json(&in_b(&["stats", &pair.b, "--json"]));
    assert_eq!(stats["qps"][0]["qpn"], 0x11);
}

/// A `cgroup` rule's tenants can fill the QP-creation probe's table unless
/// the rdma cgroup bounds them: `policy check` says so for a cgroup with no
/// `rdma.max` (the host has no RDMA device to set one for; the guest's
/// lab sets them).
#[test]
fn a_cgroup_rule_without_an_rdma_limit_is_warned_about() {
    common::require_root();
    let cgroup = common::Cgroups::new("rdma");
    let v = checked(&format!(
        "[port]\npkeys = [0xffff, 0x8001]\n[[bind]]\ncgroup = \"{}\"\npkey = 0x8001\n",
        cgroup.base().display()
    ));
    let warned = v["warnings"].as_array().unwrap().iter().any(|w| {
        w.as_str()
            .unwrap()
            .contains("has no rdma.max hca_object limit")
    });
    assert!(warned, "{v}");
    assert_eq!(v["rdma_limits"], serde_json::json!([]));
}

/// A `uid`, `gid` or `netns` rule is a tenant boundary too, but its
/// tenant's processes may run in any cgroup: no one `rdma.max` bounds it,
/// and `policy check` says so.
#[test]
fn a_uid_rule_is_warned_about_as_unbounded() {
    let v = checked("[port]\npkeys = [0xffff, 0x8001]\n[[bind]]\nuid = 1001\npkey = 0x8001\n");
    let warned = v["warnings"].as_array().unwrap().iter().any(|w| {
        let w = w.as_str().unwrap();
        w.contains("bound by uid 1001 has no rdma.max limit pkeyfw can check")
    });
    assert!(warned, "{v}");
}

/// `pkeyfw policy check --json` of a policy with this text.
fn checked(text: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, text).unwrap();
    check_json(&pkeyfw(&[
        "policy",
        "check",
        "--policy",
        policy.to_str().unwrap(),
        "--json",
    ]))
}
