//! The ways pkeyfw is deployed, checked as far as this machine allows: the
//! systemd unit (contrib/systemd/pkeyfw@.service) passes `systemd-analyze
//! verify` and rates "OK" or better in `systemd-analyze security`; the
//! Kubernetes manifests (deploy/kubernetes) parse, match the API's schema
//! (every field known and of its type, the required ones present), and ship
//! a policy pkeyfw accepts; both run commands pkeyfw's CLI accepts.

use std::{path::Path, process::Command};

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::ConfigMap, core::v1::Namespace};
use serde::{Serialize, de::DeserializeOwned};

const UNIT: &str = include_str!("../../contrib/systemd/pkeyfw@.service");

/// The unit as instance `pkfwtest0`, running this build's pkeyfw, in a
/// fresh directory.
fn instance() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pkeyfw@pkfwtest0.service");
    let text = UNIT.replace("/usr/local/bin/pkeyfw", env!("CARGO_BIN_EXE_pkeyfw"));
    assert_ne!(text, UNIT, "the unit runs /usr/local/bin/pkeyfw");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn analyze(args: &[&str], unit: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .args(args)
        .arg(unit)
        .output()
        .expect("systemd-analyze (cargo xtask test installs systemd)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_unit_verifies_and_is_hardened() {
    let (_dir, unit) = instance();
    let (ok, said) = analyze(&["verify"], &unit);
    assert!(
        ok && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
    let (_, said) = analyze(&["security", "--offline=yes"], &unit);
    let score: f64 = said
        .lines()
        .find_map(|l| l.split("Overall exposure level for ").nth(1))
        .and_then(|rest| rest.split(": ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {said}"));
    // systemd rates below 4.0 "OK" (and below 2.0 "SAFE").
    assert!(score < 4.0, "exposure {score}:\n{said}");
}

/// Runs pkeyfw with `args`: it may fail (no such interface or file here),
/// but not on its usage (exit status 2).
fn accepted(args: &[String]) {
    let out = Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
        .args(args)
        .output()
        .unwrap();
    assert_ne!(
        out.status.code(),
        Some(2),
        "pkeyfw {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_unit_runs_commands_pkeyfw_accepts() {
    for key in ["ExecStart", "ExecReload"] {
        let exec = UNIT
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=/usr/local/bin/pkeyfw ")))
            .unwrap_or_else(|| panic!("{key} runs pkeyfw"));
        accepted(
            &exec
                .split_whitespace()
                .map(|a| a.replace("%i", "pkfwnosuch0"))
                .collect::<Vec<_>>(),
        );
    }
}

/// The resources `kustomization.yaml` lists, parsed.
fn manifests() -> Vec<serde_yaml::Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let read = |name: &str| {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        serde_yaml::from_str::<serde_yaml::Value>(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let kustomization = read("kustomization.yaml");
    assert_eq!(kustomization["kind"], "Kustomization");
    kustomization["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| read(r.as_str().unwrap()))
        .collect()
}

/// Reads `manifest` as API type `T` (k8s-openapi's, generated from the
/// Kubernetes OpenAPI schema: a missing required field or a value of the
/// wrong type does not read) and writes it back: what the schema does not
/// know (a misspelt field, one at the wrong level) is dropped, so the two
/// must be equal.
fn matches_schema<T: DeserializeOwned + Serialize>(
    manifest: &serde_json::Value,
) -> Result<(), String> {
    let what = format!("{} {}", manifest["kind"], manifest["metadata"]["name"]);
    let typed: T = serde_json::from_value(manifest.clone())
        .map_err(|e| format!("{what} does not match its schema: {e}"))?;
    let back = serde_json::to_value(&typed).unwrap();
    match unknown(manifest, &back, String::new()) {
        Some(path) => Err(format!("{what}: {path} is not in the schema")),
        None => Ok(()),
    }
}

/// The first place `read` has what `known` has not.
fn unknown(read: &serde_json::Value, known: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (read, known) {
        (Value::Object(r), Value::Object(k)) => r.iter().find_map(|(key, v)| match k.get(key) {
            Some(kv) => unknown(v, kv, format!("{at}.{key}")),
            None => Some(format!("{at}.{key}")),
        }),
        (Value::Array(r), Value::Array(k)) if r.len() == k.len() => r
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(i, (r, k))| unknown(r, k, format!("{at}[{i}]"))),
        (r, k) if r == k => None,
        _ => Some(at),
    }
}

#[test]
fn the_kubernetes_manifests_match_the_api_schema() {
    for m in manifests() {
        let json = serde_json::to_value(&m).unwrap();
        let checked = match m["kind"].as_str() {
            Some("DaemonSet") => matches_schema::<DaemonSet>(&json),
            Some("ConfigMap") => matches_schema::<ConfigMap>(&json),
            Some("Namespace") => matches_schema::<Namespace>(&json),
            other => panic!("no schema checked for kind {other:?}: add it here"),
        };
        checked.unwrap_or_else(|e| panic!("{e}"));
    }
    // The check can fail: a misspelt field is caught.
    let mut ds = manifests()
        .into_iter()
        .find(|m| m["kind"] == "DaemonSet")
        .unwrap();
    ds["spec"]["template"]["spec"]["hostNetwrok"] = true.into();
    let json = serde_json::to_value(&ds).unwrap();
    let caught = matches_schema::<DaemonSet>(&json).expect_err("a misspelt field must not pass");
    assert!(
        caught.ends_with(".spec.template.spec.hostNetwrok is not in the schema"),
        "{caught}"
    );
}

#[test]
fn the_kubernetes_manifests_hold_together() {
    let all = manifests();
    let of = |kind: &str| {
        all.iter()
            .find(|m| m["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    for m in &all {
        assert!(
            m["apiVersion"].is_string() && m["metadata"]["name"].is_string(),
            "{m:?}"
        );
    }
    let config = of("ConfigMap");
    let ds = of("DaemonSet");
    assert_eq!(ds["apiVersion"], "apps/v1");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"],
        "the selector selects the pods"
    );
    assert_eq!(spec["hostNetwork"], true);

    // The shipped policy loads, for a port of the fabric.
    let dir = tempfile::tempdir().unwrap();
    for file in ["policy.toml", "partitions.conf"] {
        std::fs::write(
            dir.path().join(file),
            config["data"][file].as_str().unwrap(),
        )
        .unwrap();
    }
    let check = Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
        .args([
            "policy",
            "check",
            "--port-guid",
            "0x0002c90300a1b2c3",
            "--policy",
        ])
        .arg(dir.path().join("policy.toml"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    // The container runs a command pkeyfw accepts (on an interface that
    // does not exist here: never the host's own).
    assert!(config["data"]["interface"].is_string());
    let container = &spec["containers"][0];
    let args: Vec<String> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| {
            a.as_str()
                .unwrap()
                .replace("$(PKEYFW_INTERFACE)", "pkfwnosuch0")
        })
        .collect();
    accepted(&args);
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let policy = mounts
        .iter()
        .find(|m| m["mountPath"] == "/etc/pkeyfw")
        .expect("the policy is mounted at /etc/pkeyfw");
    // Mounted whole (a subPath mount never sees the kubelet's updates,
    // which `--watch` follows).
    assert!(policy["subPath"].is_null());
    assert!(args.contains(&"--watch".to_string()));
    assert!(
        mounts.iter().any(|m| m["mountPath"] == "/sys/fs/bpf"),
        "the host's bpffs, so that pins outlive the pod"
    );
}
