//! The ways pkeyfw is deployed, checked as far as this machine allows: the
//! systemd unit (contrib/systemd/pkeyfw@.service) passes `systemd-analyze
//! verify` and rates "OK" or better in `systemd-analyze security`; the
//! Kubernetes manifests (deploy/kubernetes) parse, match the API's schema
//! (every field known and of its type, the required ones present), and ship
//! a policy pkeyfw accepts; both run commands pkeyfw's CLI accepts. The
//! node-pool example (deploy/kubernetes-node-pools) replaces the policy
//! with one every node of a pool loads with its pool's partition, whose
//! rule binds a process in a cgroup shaped like a pod's. The CNI plugin's
//! manifests (deploy/kubernetes-cni) match the schemas too, their
//! NetworkAttachmentDefinitions hold configurations the plugin accepts
//! as they are, and the pod example names one of them.

use crate::common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::ConfigMap, core::v1::Namespace};
use serde::{Deserialize as _, Serialize, de::DeserializeOwned};

const UNIT: &str = include_str!("../../../contrib/systemd/pkeyfw@.service");

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

fn deploy(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(dir)
}

fn read_yaml(dir: &Path, name: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(dir.join(name)).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}

/// The resources `kustomization.yaml` lists, parsed.
fn manifests() -> Vec<serde_yaml::Value> {
    let dir = deploy("kubernetes");
    let kustomization = read_yaml(&dir, "kustomization.yaml");
    assert_eq!(kustomization["kind"], "Kustomization");
    kustomization["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| read_yaml(&dir, r.as_str().unwrap()))
        .collect()
}

/// The node-pool example's patches: ConfigMaps that replace the base's
/// whole (a strategic merge patch replaces each key of `data` it gives,
/// and each gives every key the base's has, so none of the base's stays).
fn node_pool_patches() -> Vec<serde_yaml::Value> {
    let dir = deploy("kubernetes-node-pools");
    let kustomization = read_yaml(&dir, "kustomization.yaml");
    assert_eq!(kustomization["kind"], "Kustomization");
    assert_eq!(
        kustomization["resources"],
        serde_yaml::from_str::<serde_yaml::Value>("[../kubernetes]").unwrap(),
        "the example is an overlay of deploy/kubernetes"
    );
    let base = manifests();
    kustomization["patches"]
        .as_sequence()
        .expect("patches")
        .iter()
        .map(|p| {
            let patch = read_yaml(&dir, p["path"].as_str().expect("a patch file"));
            assert_eq!(
                patch["kind"], "ConfigMap",
                "only ConfigMap patches are checked: add others here"
            );
            let replaced = base
                .iter()
                .find(|m| {
                    m["kind"] == "ConfigMap" && m["metadata"]["name"] == patch["metadata"]["name"]
                })
                .expect("the patch names the base's ConfigMap");
            for key in replaced["data"].as_mapping().unwrap().keys() {
                assert!(
                    !patch["data"][key].is_null(),
                    "the patch leaves the base's {key:?}"
                );
            }
            patch
        })
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
    for m in manifests().into_iter().chain(node_pool_patches()) {
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

    // What `cgroup` rules need: the host's cgroup hierarchy at the path
    // the host gives it, the host's cgroup namespace, entered through
    // PID 1 (the host's, hostPID), which takes SYS_PTRACE.
    let cgroup = mounts
        .iter()
        .find(|m| m["mountPath"] == "/sys/fs/cgroup")
        .expect("the host's cgroup hierarchy is mounted at /sys/fs/cgroup");
    assert_eq!(cgroup["readOnly"], true);
    let volume = spec["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == cgroup["name"])
        .unwrap();
    assert_eq!(volume["hostPath"]["path"], "/sys/fs/cgroup");
    assert_eq!(spec["hostPID"], true);
    let command: Vec<&str> = container["command"]
        .as_sequence()
        .expect("a command")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        command,
        [
            "nsenter",
            "--cgroup=/proc/1/ns/cgroup",
            "--",
            "/usr/local/bin/pkeyfw"
        ]
    );
    let caps = &container["securityContext"]["capabilities"]["add"];
    assert!(
        caps.as_sequence()
            .unwrap()
            .iter()
            .any(|c| c == "SYS_PTRACE"),
        "{caps:?}"
    );
}

/// The node pools of the example's partitions.conf: each member's GUID
/// and its pool's P_Key (the default partition, `ALL`, is no pool).
fn pools(partitions_conf: &str) -> Vec<(String, u16)> {
    let mut members = Vec::new();
    for line in partitions_conf.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() || line.contains("ALL") {
            continue;
        }
        let (head, list) = line.split_once(':').expect("NAME=PKEY : MEMBERS;");
        let pkey = head.split_once('=').unwrap().1.trim();
        let pkey = u16::from_str_radix(pkey.trim_start_matches("0x"), 16).unwrap();
        for member in list.trim().trim_end_matches(';').split(',') {
            let (guid, membership) = member.trim().split_once('=').unwrap();
            assert_eq!(membership, "full", "a pool's nodes talk among themselves");
            members.push((guid.to_string(), pkey | 0x8000));
        }
    }
    members
}

/// `/sys/fs/cgroup/kubepods.slice` as the kubelet (systemd driver) makes
/// it, under a directory of the test's in the host's cgroup v2 hierarchy:
/// a pod's slice and a container's scope, a process in the scope. The
/// process is killed and the cgroups removed on drop.
struct PodCgroups {
    // Dropped in this order: an empty cgroup can be removed, so its
    // process first.
    container: common::Killed,
    cgroups: common::Cgroups,
}

impl PodCgroups {
    fn create() -> PodCgroups {
        let mut cgroups = common::Cgroups::new("k8s");
        let scope = cgroups.make(
            "kubepods.slice/kubepods-besteffort.slice/\
             kubepods-besteffort-pod6f2a4c1e_93b7_4d0a_8c55_0e1f2a3b4c5d.slice/\
             cri-containerd-3c1f9a0b7d2e4f6a8b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a.scope",
        );
        let container = common::Killed(Command::new("sleep").arg("600").spawn().unwrap());
        std::fs::write(scope.join("cgroup.procs"), container.0.id().to_string()).unwrap();
        PodCgroups { container, cgroups }
    }

    fn kubepods(&self) -> PathBuf {
        self.cgroups.base().join("kubepods.slice")
    }
}

/// An RC QP on rxe0 that process `pid` owns.
fn qp_of(pid: u32, qpn: u32) -> pkeyfw::host::rdma::Qp {
    use pkeyfw::host::rdma::{IbQpType, QpState};
    let mut qp = pkeyfw::host::rdma::Qp {
        device: "rxe0".into(),
        device_index: 0,
        port: Some(1),
        qpn,
        remote_qpn: None,
        qp_type: IbQpType::Rc,
        state: QpState::Rts,
        pid: Some(pid),
        comm: None,
        maker: pkeyfw::host::rdma::Maker::Unasked,
        kernel: false,
        local: None,
        peer: None,
    };
    // As /proc tells it: a QP made before any probe ran.
    pkeyfw::host::rdma::identify(std::slice::from_mut(&mut qp), &Default::default());
    qp
}

/// The node-pool example, on this machine: its policy, with the pods'
/// subtree made here (no kubelet runs here), loads for every node of
/// every pool with the pool's partition at index 1 and its rule binding
/// to it; a node in no pool is refused, naming the place; and the rule
/// binds a QP of a process in a pod's container scope to its node's
/// partition — as pkeyfw matches it from /proc, and as the QP-creation
/// probe does in the kernel (the cgroup at the rule's depth above the
/// creator's is the rule's) — and not one of a process outside the pods.
#[test]
fn the_node_pool_example_binds_pods_to_their_nodes_partition() {
    common::require_root();
    let patches = node_pool_patches();
    let config = &patches[0]["data"];
    let pods = PodCgroups::create();
    let dir = tempfile::tempdir().unwrap();
    let policy_path = dir.path().join("policy.toml");
    let text = config["policy.toml"].as_str().unwrap();
    let here = text.replace(
        "\"/sys/fs/cgroup/kubepods.slice\"",
        &format!("{:?}", pods.kubepods()),
    );
    assert_ne!(here, text, "the rule binds the kubelet's pods");
    std::fs::write(&policy_path, here).unwrap();
    let partitions_conf = config["partitions.conf"].as_str().unwrap();
    std::fs::write(dir.path().join("partitions.conf"), partitions_conf).unwrap();

    let check = |guid: &str| {
        Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
            .args(["policy", "check", "--json", "--port-guid", guid, "--policy"])
            .arg(&policy_path)
            .output()
            .unwrap()
    };
    let nodes = pools(partitions_conf);
    let per_pool = nodes
        .iter()
        .fold(BTreeMap::<u16, usize>::new(), |mut m, (_, p)| {
            *m.entry(*p).or_default() += 1;
            m
        });
    assert!(
        per_pool.len() >= 2 && per_pool.values().all(|&n| n >= 2),
        "{per_pool:?}"
    );
    for (guid, pkey) in &nodes {
        let out = check(guid);
        assert!(
            out.status.success(),
            "{guid}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["pkeys"], serde_json::json!([0xffff, pkey]), "{guid}: {v}");
        assert_eq!(v["binds"].as_array().unwrap().len(), 1, "{v}");
        assert_eq!(v["binds"][0]["pkey"], *pkey, "{guid}: {v}");
    }
    let outside = check("0x505400fffec10001");
    let said = String::from_utf8_lossy(&outside.stderr);
    assert!(
        !outside.status.success()
            && said.contains("policy.toml:")
            && said.contains("pkey_index: 1 is out of range"),
        "a node in no pool: {said}"
    );

    let (guid, pkey) = &nodes[0];
    let policy = pkeyfw::policy::Policy::load_for(&policy_path, pkeyfw::policy::parse_guid(guid))
        .unwrap_or_else(|e| panic!("{e}"));
    let pod = pods.container.0.id();
    let (_, bindings) =
        policy.with_discovered(&[qp_of(pod, 0x40), qp_of(std::process::id(), 0x41)]);
    match bindings[..] {
        [
            pkeyfw::policy::Binding::Rule { rule: 0, bound, .. },
            pkeyfw::policy::Binding::Unbound,
        ] => {
            assert_eq!(bound.pkey, *pkey)
        }
        _ => panic!("the pod's QP bound by the rule, not the test's own: {bindings:?}"),
    }

    let spec = policy.binds[0].spec();
    assert_ne!(spec.matchers & pkeyfw_common::abi::matcher::CGROUP, 0);
    // Who made it, as /proc tells it and as the probe records it: its
    // cgroup's ancestor at the rule's depth is the rule's directory.
    let made = *qp_of(pod, 0x12)
        .maker
        .creation()
        .expect("the pod's process lives");
    assert_eq!(
        made.cgroups[spec.cgroup_level as usize], spec.cgroup,
        "the creator's ancestor at depth {}",
        spec.cgroup_level
    );
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(
        std::fs::metadata(pods.kubepods()).unwrap().ino(),
        spec.cgroup,
        "the rule's directory is the pods' slice"
    );
}

/// A NetworkAttachmentDefinition (Multus' CRD, k8s.cni.cncf.io/v1), as its
/// schema has it: a `config` string and nothing else in `spec`.
#[derive(serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NetworkAttachmentDefinition {
    api_version: String,
    kind: String,
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: NetworkAttachmentSpec,
}

#[derive(serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct NetworkAttachmentSpec {
    config: String,
}

/// deploy/kubernetes-cni's NetworkAttachmentDefinitions.
fn cni_networks() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(deploy("kubernetes-cni").join("networks.yaml")).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_json::to_value(serde_yaml::Value::deserialize(doc).unwrap()).unwrap())
        .collect()
}

#[test]
fn the_cni_manifests_match_the_api_schema() {
    let dir = deploy("kubernetes-cni");
    let kustomization = read_yaml(&dir, "kustomization.yaml");
    assert_eq!(kustomization["kind"], "Kustomization");
    for r in kustomization["resources"].as_sequence().expect("resources") {
        let m = serde_json::to_value(read_yaml(&dir, r.as_str().unwrap())).unwrap();
        match m["kind"].as_str() {
            Some("DaemonSet") => matches_schema::<DaemonSet>(&m),
            Some("Namespace") => matches_schema::<Namespace>(&m),
            other => panic!("no schema checked for kind {other:?}: add it here"),
        }
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let pod = serde_json::to_value(read_yaml(&dir, "pod.yaml")).unwrap();
    matches_schema::<k8s_openapi::api::core::v1::Pod>(&pod).unwrap_or_else(|e| panic!("{e}"));
    let networks = cni_networks();
    assert!(!networks.is_empty());
    for n in &networks {
        assert_eq!(
            (&n["apiVersion"], &n["kind"]),
            (
                &serde_json::json!("k8s.cni.cncf.io/v1"),
                &serde_json::json!("NetworkAttachmentDefinition")
            )
        );
        matches_schema::<NetworkAttachmentDefinition>(n).unwrap_or_else(|e| panic!("{e}"));
    }
    // A misspelt field is caught.
    let mut bad = networks[0].clone();
    bad["spec"]["conifg"] = bad["spec"]["config"].clone();
    assert!(matches_schema::<NetworkAttachmentDefinition>(&bad).is_err());
}

/// Each NetworkAttachmentDefinition's conflist chains pkeyfw after the
/// bridge plugin, with a configuration the plugin takes as it is (what the
/// runtime hands it: the plugin's object with the list's version and
/// name); the pod example names one of them; the DaemonSet installs the
/// image's binary as the runtime's `pkeyfw` and runs a command the CLI
/// accepts.
#[test]
fn the_cni_manifests_hold_together() {
    use pkeyfw::cni::{
        config::NetConf,
        protocol::{Command, Invocation},
    };
    let add = Invocation {
        command: Command::Add,
        container: "c1".to_string(),
        ifname: "net1".to_string(),
        netns: Some("/run/netns/p".to_string()),
        args: BTreeMap::new(),
    };
    let mut names = Vec::new();
    for n in cni_networks() {
        let list: serde_json::Value =
            serde_json::from_str(n["spec"]["config"].as_str().unwrap()).unwrap();
        assert_eq!(
            list["name"], n["metadata"]["name"],
            "the network is named as its object"
        );
        let plugins = list["plugins"].as_array().expect("a conflist");
        assert_eq!(plugins[0]["type"], "bridge", "pkeyfw chains after bridge");
        let mut plugin = plugins.last().unwrap().clone();
        assert_eq!(plugin["type"], "pkeyfw");
        plugin["cniVersion"] = list["cniVersion"].clone();
        plugin["name"] = list["name"].clone();
        let conf = NetConf::parse(plugin.to_string().as_bytes(), &add)
            .unwrap_or_else(|(e, _)| panic!("{}: {e}", list["name"]));
        assert_eq!(conf.trunk.as_deref(), Some("eth1"));
        names.push(list["name"].as_str().unwrap().to_string());
    }
    let dir = deploy("kubernetes-cni");
    let pod = read_yaml(&dir, "pod.yaml");
    let wanted = pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]
        .as_str()
        .expect("the pod names a network");
    assert!(
        names.iter().any(|n| n == wanted),
        "{wanted} is not in networks.yaml"
    );

    let ds = read_yaml(&dir, "daemonset.yaml");
    let spec = &ds["spec"]["template"]["spec"];
    let install = spec["initContainers"][0]["command"][2].as_str().unwrap();
    assert!(
        install.contains("cp /usr/local/bin/pkeyfw ")
            && install.ends_with(" /host/opt/cni/bin/pkeyfw"),
        "{install}"
    );
    let containerfile = std::fs::read_to_string(deploy("Containerfile")).unwrap();
    assert!(containerfile.contains("/usr/local/bin/pkeyfw"));
    let args: Vec<String> = spec["containers"][0]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    <pkeyfw::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("pkeyfw".to_string()).chain(args.clone()),
    )
    .unwrap_or_else(|e| panic!("pkeyfw {args:?}: {e}"));
}
