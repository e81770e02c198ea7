//! Enforcement never vanishes with a process: a foreground attach that is
//! killed leaves the filter enforcing; pins are made only in the host's
//! bpffs (never in the private one of `ip netns exec`); `--netns` does the
//! interface work in another network namespace while the pins stay in the
//! host's, keyed by namespace so that equal interface names never collide.
//! Traffic only crosses veths between namespaces the tests make (and always
//! remove).

use crate::common;

use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
    time::Duration,
};

use pkeyfw::host::netlink;
use pkeyfw_testkit::netns::{VethPair, capture_during, in_netns, send};
use serde_json::Value;

/// The base policy in a file, removed with the returned directory.
fn policy_file() -> (tempfile::TempDir, PathBuf) {
    common::policy_file(common::cases::BASE)
}

/// A frame the base policy refuses and one it passes.
fn frames() -> (Vec<u8>, Vec<u8>) {
    let policy = common::policy(common::cases::BASE);
    let cases: Vec<_> = common::cases::all()
        .into_iter()
        .filter(|c| c.policy == policy)
        .collect();
    let refused = cases.iter().find(|c| !c.pass).expect("a refused case");
    let passed = cases.iter().find(|c| c.pass).expect("a passed case");
    (refused.frame.clone(), passed.frame.clone())
}

/// Sends the refused and the passed frame from `a` (in `ns_a`) to `b` (in
/// `ns_b`): whether each arrived.
fn crossing(ns_a: &str, a: &str, ns_b: &str, b: &str) -> (bool, bool) {
    let (refused, passed) = frames();
    let (sent, got) = capture_during(ns_b, b, Duration::from_millis(300), || {
        send(ns_a, a, &[refused.clone(), passed.clone()])
    })
    .unwrap();
    sent.unwrap();
    (got.contains(&refused), got.contains(&passed))
}

/// Asserts that `b` enforces: the refused frame stops, the passed crosses.
fn enforces(ns_a: &str, a: &str, ns_b: &str, b: &str) {
    assert_eq!(
        crossing(ns_a, a, ns_b, b),
        (false, true),
        "(refused crossed, passed crossed) on {b} in {ns_b}"
    );
}

fn xdp_on(ns: &str, iface: &str) -> Option<netlink::Attached> {
    let iface = iface.to_string();
    in_netns(ns, move || {
        netlink::xdp_attached(netlink::if_index(&iface).unwrap()).unwrap()
    })
    .unwrap()
}

/// `pkeyfw` run here: in the host's network and mount namespaces.
fn pkeyfw() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pkeyfw"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The JSON objects `stats --json` printed.
fn stats_json(cmd: &mut Command) -> Vec<Value> {
    let out = common::succeed(cmd);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A SIGKILLed foreground attach leaves the filter attached and enforcing;
/// stats shows its process gone; detach removes it and leaves nothing.
#[test]
fn a_killed_foreground_attach_keeps_enforcing_until_detach() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pp")).unwrap();
    let (_dir, policy) = policy_file();
    let pins = common::pins(&pair.ns_b, &pair.b);
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    let fg = common::Foreground::start(&pair, &policy, "auto");
    enforces(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b);
    // nsenter execs pkeyfw: the child is the attach process itself.
    let pid = fg.kill();

    assert!(xdp_on(&pair.ns_b, &pair.b).is_some(), "still attached");
    enforces(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b);
    let out = common::succeed(common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b]));
    let said = text(&out);
    assert!(
        said.contains(&format!("foreground, process {pid} gone")),
        "{said}"
    );
    let json = stats_json(common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b, "--json"]));
    assert_eq!(json[0]["process"]["pid"], pid);
    assert_eq!(json[0]["process"]["running"], false);

    common::succeed(common::pkeyfw_in(&pair.ns_b).args(["detach", &pair.b]));
    assert_eq!(xdp_on(&pair.ns_b, &pair.b), None, "no program left");
    assert!(!pins.exists(), "no pins left");
    assert_eq!(
        crossing(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b),
        (true, true),
        "nothing filters any more"
    );
}

/// SIGQUIT (the service's stop signal, for restarts and upgrades) ends a
/// foreground attach and leaves its filter enforcing, as a crash does;
/// `stats` shows its process gone and `detach` removes it.
#[test]
fn sigquit_exits_and_keeps_enforcing() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pq")).unwrap();
    let (_dir, policy) = policy_file();
    let pins = common::pins(&pair.ns_b, &pair.b);
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    let fg = common::Foreground::start(&pair, &policy, "auto");
    let (pid, status) = fg.signal(libc::SIGQUIT);
    assert!(status.success(), "a clean exit, not a core dump: {status}");
    assert!(xdp_on(&pair.ns_b, &pair.b).is_some(), "still attached");
    enforces(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b);
    let said = text(&common::succeed(
        common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b]),
    ));
    assert!(
        said.contains(&format!("foreground, process {pid} gone")),
        "{said}"
    );
    common::succeed(common::pkeyfw_in(&pair.ns_b).args(["detach", &pair.b]));
    assert!(!pins.exists(), "no pins left");
}

/// A new attach replaces one whose foreground process is gone.
#[test]
fn attach_replaces_an_attachment_whose_process_is_gone() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pp")).unwrap();
    let (_dir, policy) = policy_file();
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    common::Foreground::start(&pair, &policy, "auto").kill();
    let pins = common::pins(&pair.ns_b, &pair.b);
    let link_id = || {
        let link: aya::programs::links::FdLink =
            aya::programs::links::PinnedLink::from_pin(pins.link())
                .unwrap()
                .into();
        link.info().unwrap().id()
    };
    let (link, program) = (link_id(), xdp_on(&pair.ns_b, &pair.b).unwrap().prog_id);
    let out = common::attach_pinned(&pair.ns_b, &pair.b, &policy);
    assert!(text(&out).contains("replacing"), "{}", text(&out));
    assert!(!text(&out).contains("detaching it first"), "{}", text(&out));
    // The same link now runs the new program: it was switched, never
    // detached.
    assert_eq!(link_id(), link, "the same link");
    assert_ne!(xdp_on(&pair.ns_b, &pair.b).unwrap().prog_id, program);
    enforces(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b);
    let json = stats_json(common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b, "--json"]));
    assert_eq!(json[0]["held"], "pinned");
    common::succeed(common::pkeyfw_in(&pair.ns_b).args(["detach", &pair.b]));
    assert_eq!(xdp_on(&pair.ns_b, &pair.b), None, "no program left");
}

/// `ip netns exec` gives pkeyfw a private bpffs whose pins would vanish with
/// it: the attach is refused, saying what to do instead, and attaches
/// nothing.
#[test]
fn attach_under_ip_netns_exec_is_refused() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pp")).unwrap();
    let (_dir, policy) = policy_file();
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    for extra in [&["--pin"][..], &[][..]] {
        let out = Command::new("ip")
            .args(["netns", "exec", &pair.ns_b])
            .arg(env!("CARGO_BIN_EXE_pkeyfw"))
            .args(["attach", &pair.b, "--policy", policy.to_str().unwrap()])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let said = text(&out);
        assert!(!out.status.success(), "{said}");
        assert!(said.contains("ip netns exec"), "{said}");
        assert!(said.contains("pkeyfw attach --netns NS"), "{said}");
        assert_eq!(xdp_on(&pair.ns_b, &pair.b), None, "nothing attached");
        assert!(
            !common::pins(&pair.ns_b, &pair.b).exists(),
            "nothing pinned"
        );
        assert_eq!(
            crossing(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b),
            (true, true),
            "nothing filters"
        );
    }
}

/// `--netns` from the host's namespaces: attach pins in the host's bpffs and
/// enforces in the namespace; stats and detach reach it by name or path.
#[test]
fn netns_option_attaches_and_detaches_from_the_host() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pp")).unwrap();
    let (_dir, policy) = policy_file();
    let pins = common::pins(&pair.ns_b, &pair.b);
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    common::succeed(pkeyfw().args([
        "attach",
        "--netns",
        &pair.ns_b,
        &pair.b,
        "--pin",
        "--policy",
        policy.to_str().unwrap(),
    ]));
    assert!(pins.exists(), "pinned in the host's bpffs");
    enforces(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b);

    let path = VethPair::netns_path(&pair.ns_b);
    let json = stats_json(pkeyfw().args(["stats", "--netns", &path, &pair.b, "--json"]));
    assert_eq!(json.len(), 1);
    assert_eq!(json[0]["interface"], pair.b.as_str());
    assert_eq!(json[0]["netns"], pair.ns_b.as_str());
    let all = stats_json(pkeyfw().args(["stats", "--json"]));
    assert!(
        all.iter()
            .any(|s| s["interface"] == pair.b.as_str() && s["netns"] == pair.ns_b.as_str()),
        "stats lists it: {all:?}"
    );
    let out = common::succeed(pkeyfw().args(["stats", "--netns", &pair.ns_b]));
    assert!(
        text(&out).contains(&format!("{} (netns {})", pair.b, pair.ns_b)),
        "{}",
        text(&out)
    );

    // reload and qps look into the namespace too.
    common::succeed(pkeyfw().args(["reload", "--netns", &pair.ns_b, &pair.b]));
    enforces(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b);
    let out = pkeyfw()
        .args(["qps", "--netns", &pair.ns_b, &pair.b])
        .output()
        .unwrap();
    // No RDMA here: it fails, but after finding the interface.
    assert!(text(&out).contains("RDMA"), "{}", text(&out));
    assert!(!text(&out).contains("no interface"), "{}", text(&out));

    // Without --netns the host's (absent) interface of that name is meant.
    let out = pkeyfw().args(["detach", &pair.b]).output().unwrap();
    assert!(!out.status.success());
    assert!(xdp_on(&pair.ns_b, &pair.b).is_some());

    common::succeed(pkeyfw().args(["detach", "--netns", &pair.ns_b, &pair.b]));
    assert_eq!(xdp_on(&pair.ns_b, &pair.b), None, "no program left");
    assert!(!pins.exists(), "no pins left");
    assert_eq!(
        crossing(&pair.ns_a, &pair.a, &pair.ns_b, &pair.b),
        (true, true),
        "nothing filters any more"
    );
}

/// Two namespaces with an interface of the same name, both attached: both
/// listed, detaching one leaves the other enforcing.
#[test]
fn equal_interface_names_in_two_namespaces_do_not_collide() {
    let _root = common::pins_root();
    common::require_root();
    let one = VethPair::create(&common::tag("pp")).unwrap();
    let two = VethPair::create(&common::tag("pp")).unwrap();
    let (_dir, policy) = policy_file();
    // The second pair's end takes the first's name.
    let name = one.b.clone();
    for args in [
        vec!["-n", &two.ns_b, "link", "set", &two.b, "down"],
        vec!["-n", &two.ns_b, "link", "set", &two.b, "name", &name],
        vec!["-n", &two.ns_b, "link", "set", &name, "up"],
    ] {
        common::succeed(Command::new("ip").args(args));
    }
    let _clean_one = common::Unpin(common::pins(&one.ns_b, &name));
    let _clean_two = common::Unpin(common::pins(&two.ns_b, &name));
    for ns in [&one.ns_b, &two.ns_b] {
        common::succeed(pkeyfw().args([
            "attach",
            "--netns",
            ns,
            &name,
            "--pin",
            "--policy",
            policy.to_str().unwrap(),
        ]));
    }
    enforces(&one.ns_a, &one.a, &one.ns_b, &name);
    enforces(&two.ns_a, &two.a, &two.ns_b, &name);
    let all = stats_json(pkeyfw().args(["stats", "--json"]));
    for ns in [&one.ns_b, &two.ns_b] {
        assert!(
            all.iter()
                .any(|s| s["interface"] == name.as_str() && s["netns"] == ns.as_str()),
            "{name} of {ns} listed: {all:?}"
        );
    }

    common::succeed(pkeyfw().args(["detach", "--netns", &one.ns_b, &name]));
    assert_eq!(xdp_on(&one.ns_b, &name), None, "the first is detached");
    assert!(!common::pins(&one.ns_b, &name).exists());
    assert_eq!(
        crossing(&one.ns_a, &one.a, &one.ns_b, &name),
        (true, true),
        "nothing filters the first"
    );
    assert!(xdp_on(&two.ns_b, &name).is_some(), "the second stays");
    assert!(common::pins(&two.ns_b, &name).exists());
    enforces(&two.ns_a, &two.a, &two.ns_b, &name);
    let json = stats_json(pkeyfw().args(["stats", "--netns", &two.ns_b, &name, "--json"]));
    assert_eq!(json[0]["interface"], name.as_str());

    common::succeed(pkeyfw().args(["detach", "--netns", &two.ns_b, &name]));
    assert_eq!(xdp_on(&two.ns_b, &name), None);
}

/// A QP the creation probe bound (UD, with the Q_Key its program set) and
/// one it quarantined, as the probe leaves them in the maps.
const PROBED_QP: u32 = 0x77;
const PROBED_QKEY: u32 = 0x0000_abcd;
const QUARANTINED_QP: u32 = 0x78;

/// Writes what the QP-creation and modify probes would have into the maps
/// pinned under `dir` (the host has no RDMA devices to make them).
fn probe_state(dir: &std::path::Path) {
    use aya::maps::{Array, HashMap, Map, MapData};
    use pkeyfw_common::abi::{QpEntry, QpType, name, qp_flags, qp_index, quarantine_bit};
    let open = |n: &str| MapData::from_pin(dir.join(n)).unwrap();
    let maps = pkeyfw::loading::maps::Maps::from_pins(dir).unwrap();
    let live = maps.active_generation().unwrap();
    let mut qkeys: HashMap<_, u32, u32> =
        HashMap::try_from(Map::HashMap(open(name::QKEYS))).unwrap();
    qkeys.insert(&PROBED_QP, &PROBED_QKEY, 0).unwrap();
    let mut qps: Array<_, u64> = Array::try_from(Map::Array(open(name::QPS))).unwrap();
    let entry = QpEntry {
        qkey: PROBED_QKEY,
        pkey: 0x8001,
        qp_type: QpType::Ud as u8,
        flags: qp_flags::RULE | qp_flags::PROBE | qp_flags::OWN_QKEY,
    };
    qps.set(qp_index(live, PROBED_QP), &entry.to_bits(), 0)
        .unwrap();
    let mut quarantine: Array<_, u64> =
        Array::try_from(Map::Array(open(name::QUARANTINE))).unwrap();
    let (word, bit) = quarantine_bit(QUARANTINED_QP);
    quarantine.set(word, &bit, 0).unwrap();
}

/// An attach that replaces one whose process died keeps what its probes
/// knew: the QP bound at creation, with the Q_Key its program set, and the
/// one in quarantine. (Before, it started from empty maps: the UD QP was
/// rebound without its Q_Key, refusing every frame, and the quarantined QP
/// fell to the unknown-QP rule.)
#[test]
fn a_replacing_attach_keeps_what_the_probes_knew() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let (_dir, policy) = common::policy_file(&format!(
        "{}\n[[bind]]\nuid = 4242\npkey = 0x8001\n",
        common::cases::BASE.replace("unknown_qp = \"default-pkey\"", "unknown_qp = \"pass\"")
    ));
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    let pins = common::pins(&pair.ns_b, &pair.b);
    let fg = common::Foreground::start(&pair, &policy, "auto");
    probe_state(&pins.dir);
    fg.kill();
    common::attach_pinned(&pair.ns_b, &pair.b, &policy);
    let maps = pkeyfw::loading::maps::Maps::from_pins(&pins.dir).unwrap();
    assert_eq!(maps.bound_by().unwrap()[2], ("probe", 1));
    assert_eq!(maps.quarantined().unwrap(), vec![QUARANTINED_QP]);
    let ud = |qkey| pkeyfw_testkit::wire::Packet::ud(0x8001, PROBED_QP, qkey).bytes();
    let to_quarantined = pkeyfw_testkit::wire::Packet::rc(0x8001, QUARANTINED_QP).bytes();
    let (sent, got) = capture_during(&pair.ns_b, &pair.b, Duration::from_millis(300), || {
        send(
            &pair.ns_a,
            &pair.a,
            &[ud(PROBED_QKEY), ud(0x1111), to_quarantined.clone()],
        )
    })
    .unwrap();
    sent.unwrap();
    assert!(
        got.contains(&ud(PROBED_QKEY)),
        "its own Q_Key is its Q_Key still"
    );
    assert!(!got.contains(&ud(0x1111)), "another Q_Key is refused");
    assert!(!got.contains(&to_quarantined), "the quarantine stays");
    common::succeed(common::pkeyfw_in(&pair.ns_b).args(["detach", &pair.b]));
}

/// A `netns` rule of a pinned attachment (which never re-reads its policy)
/// outlives its namespace: it holds the namespace's cookie, so it matches
/// nothing once the namespace is gone, and `stats` says so.
#[test]
fn a_netns_rule_whose_namespace_is_gone_is_reported() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let tenant = common::tag("pkt");
    let add = std::process::Command::new("ip")
        .args(["netns", "add", &tenant])
        .status()
        .unwrap();
    assert!(add.success());
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }
    let gone = Gone(tenant.clone());
    let (_dir, policy) = common::policy_file(&format!(
        "{}\n[[bind]]\nnetns = \"/run/netns/{tenant}\"\npkey = 0x8001\n",
        common::cases::BASE
    ));
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    common::attach_pinned(&pair.ns_b, &pair.b, &policy);
    let stats = |json: bool| {
        let mut cmd = common::pkeyfw_in(&pair.ns_b);
        cmd.args(["stats", &pair.b]);
        if json {
            cmd.arg("--json");
        }
        String::from_utf8(common::succeed(&mut cmd).stdout).unwrap()
    };
    let gone_rules = || {
        let v: Value = serde_json::from_str(&stats(true)).unwrap();
        v["gone_netns_rules"].as_array().unwrap().len()
    };
    assert_eq!(gone_rules(), 0, "the namespace is there");
    drop(gone);
    assert_eq!(gone_rules(), 1, "{}", stats(false));
    assert!(
        stats(false).contains("[[bind]] rule 1: its network namespace"),
        "{}",
        stats(false)
    );
    common::succeed(common::pkeyfw_in(&pair.ns_b).args(["detach", &pair.b]));
}
