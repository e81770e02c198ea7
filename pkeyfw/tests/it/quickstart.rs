//! The README's quick starts work as written: each policy block the README
//! shows (marked `<!-- quickstart-policy: NAME -->`) passes `pkeyfw policy
//! check` as it stands, and says what its quick start claims — the tenants'
//! cgroups bound to their partitions, the bridge's access ports the very
//! fabric `pkeyfw lab switch` builds and checks.

use crate::common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

const MARKER: &str = "<!-- quickstart-policy: ";

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README's marked policy blocks, by name, in order.
fn policy_blocks(readme: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut rest = readme;
    while let Some(at) = rest.find(MARKER) {
        rest = &rest[at + MARKER.len()..];
        let (name, after) = rest.split_once(" -->\n").expect("a marker ends with -->");
        let body = after
            .strip_prefix("```toml\n")
            .unwrap_or_else(|| panic!("quickstart-policy {name}: a ```toml block must follow"));
        let (text, _) = body
            .split_once("\n```\n")
            .unwrap_or_else(|| panic!("quickstart-policy {name}: the block never closes"));
        blocks.push((name.to_string(), format!("{text}\n")));
    }
    blocks
}

fn block(name: &str) -> String {
    let blocks = policy_blocks(&readme());
    let names: Vec<&str> = blocks.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["tenants", "switch"],
        "the README's quick-start policies"
    );
    blocks.into_iter().find(|(n, _)| n == name).unwrap().1
}

/// `pkeyfw policy check --json` on `text`; it must succeed.
fn check(text: &str) -> Value {
    let (_dir, path) = common::policy_file(text);
    let out = Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
        .args(["policy", "check", "--json", "--policy"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pkeyfw policy check refused the README's policy:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The `cgroup = "…"` paths a policy names, in order.
fn cgroups(policy: &str) -> Vec<String> {
    policy
        .lines()
        .filter_map(|l| l.trim().strip_prefix("cgroup = \""))
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect()
}

/// The tenants' cgroups, `base/P` for each README path
/// `/sys/fs/cgroup/P`; removed with the returned set.
fn tenant_cgroups(paths: &[String]) -> (common::Cgroups, Vec<PathBuf>) {
    let mut made = common::Cgroups::new("qs");
    let here = paths
        .iter()
        .map(|path| {
            let below = path
                .strip_prefix("/sys/fs/cgroup/")
                .unwrap_or_else(|| panic!("{path}: a tenant cgroup under /sys/fs/cgroup"));
            made.make(below)
        })
        .collect();
    (made, here)
}

/// Quick start 2: the tenants' policy, with their cgroups made as the
/// README makes them, checks clean; each tenant's cgroup binds its
/// partition, stamped, and gets a device of its own (one per rule, no two
/// alike), which needs no rdma.max: a tenant's table is its own.
#[test]
fn the_tenants_quick_start_policy_checks() {
    common::require_root();
    let readme = readme();
    let text = block("tenants");
    let paths = cgroups(&text);
    assert_eq!(paths.len(), 2, "one rule per tenant");
    for path in &paths {
        assert!(
            readme
                .lines()
                .any(|l| l.starts_with("mkdir -p ") && l.split(' ').any(|w| w == path)),
            "the README makes {path}"
        );
    }
    assert!(
        text.contains("stamp = true"),
        "tenants on several hosts need stamping"
    );

    let (_made, here) = tenant_cgroups(&paths);
    let mut local = text.clone();
    for (path, dir) in paths.iter().zip(&here) {
        local = local.replace(&format!("\"{path}\""), &format!("{:?}", dir));
    }
    let checked = check(&local);
    let binds = checked["binds"].as_array().unwrap();
    let bound: Vec<(&str, u64)> = binds
        .iter()
        .map(|b| (b["cgroup"].as_str().unwrap(), b["pkey"].as_u64().unwrap()))
        .collect();
    let expected: Vec<(&str, u64)> = here
        .iter()
        .map(|d| d.to_str().unwrap())
        .zip([0x8001, 0x8002])
        .collect();
    assert_eq!(bound, expected, "tenant a in 0x0001, tenant b in 0x0002");
    let devices: Vec<&str> = binds
        .iter()
        .map(|b| {
            b["own_device"]["name"]
                .as_str()
                .expect("a device of its own")
        })
        .collect();
    assert_eq!(devices, ["rxe_a", "rxe_b"]);
    assert!(
        readme.contains("/tenants/a/cgroup.procs; exec ibv_rc_pingpong -d rxe_a "),
        "the README runs tenant a's program in its cgroup, on its own device"
    );
    assert_eq!(checked["warnings"], serde_json::json!([]));
}

/// Quick start 3: the bridge's policy checks, and its ports are those of
/// `pkeyfw lab switch`'s access round (names, tables, stamps, checks).
#[test]
fn the_bridge_quick_start_policy_is_the_switch_labs() {
    let readme = check(&block("switch"));
    let lab = check(&pkeyfw::lab::switch::access_policy());
    let ports = |v: &Value| v["switch"]["ports"].clone();
    assert_eq!(ports(&readme).as_array().unwrap().len(), 4);
    assert_eq!(ports(&readme), ports(&lab));
    for port in ports(&readme).as_array().unwrap() {
        assert!(port["stamp"].is_u64(), "{port}: an access port");
        assert_eq!(port["warnings"], serde_json::json!([]), "{port}");
    }
}
