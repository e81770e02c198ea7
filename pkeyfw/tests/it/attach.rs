//! `pkeyfw attach / stats / detach` on a veth pair between two namespaces the
//! test creates (and always removes): what crosses the veth is exactly what
//! the verdict passes, the counters match, detach leaves nothing behind.

use crate::common;

use std::time::Duration;

use pkeyfw::{
    host::netlink,
    loading::{maps::ReasonCounts, pins::Pins},
};
use pkeyfw_common::{Reason, Verdict, judge};
use pkeyfw_testkit::netns::{VethPair, capture_during, in_netns, send};
use serde_json::Value;

fn stats_json(pair: &VethPair) -> Value {
    let out = common::succeed(common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b, "--json"]));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one object per interface: {text}");
    serde_json::from_str(lines[0]).unwrap()
}

/// How many programs are on B's tcx ingress hook (kernels without tcx: 0).
fn tcx_ingress_on(pair: &VethPair) -> usize {
    use aya::programs::{SchedClassifier, TcAttachType};
    let b = std::ffi::CString::new(pair.b.as_str()).unwrap();
    in_netns(&pair.ns_b, move || {
        SchedClassifier::query_tcx(b.as_c_str(), TcAttachType::Ingress)
            .map(|(_, programs)| programs.len())
            .unwrap_or(0)
    })
    .unwrap()
}

fn xdp_on(pair: &VethPair) -> Option<netlink::Attached> {
    let b = pair.b.clone();
    in_netns(&pair.ns_b, move || {
        netlink::xdp_attached(netlink::if_index(&b).unwrap()).unwrap()
    })
    .unwrap()
}

/// Sends every case frame of the base policy; checks what crossed and the
/// counters against the host verdict. Jumbo MTU: some cases are longer
/// than any RoCE packet.
fn check_traffic(pair: &VethPair, mode: &str) {
    pair.set_mtu(9000).unwrap();
    let policy = common::policy(common::cases::BASE);
    let cases: Vec<_> = common::cases::all()
        .into_iter()
        .filter(|c| c.policy == policy)
        .collect();
    let frames: Vec<Vec<u8>> = cases.iter().map(|c| c.frame.clone()).collect();
    let mut want_counts = ReasonCounts::default();
    let mut want: Vec<Vec<u8>> = Vec::new();
    for f in &frames {
        let o = judge(&f[..], &policy, &policy.config());
        want_counts.add(o.reason, o.verdict());
        if o.pass {
            want.push(f.clone());
        }
    }
    let (sent, mut got) = capture_during(&pair.ns_b, &pair.b, Duration::from_millis(300), || {
        send(&pair.ns_a, &pair.a, &frames)
    })
    .unwrap();
    sent.unwrap();
    got.sort();
    want.sort();
    // A packet socket taps frames before TC ingress (but after XDP): in tc
    // mode it sees everything, so only the counters below tell; tests/gso.rs
    // checks what a socket behind the filter receives.
    if mode != "tc" && got != want {
        let show = |v: &[Vec<u8>], other: &[Vec<u8>]| -> Vec<String> {
            v.iter()
                .filter(|f| !other.contains(f))
                .map(|f| pkeyfw::reporting::describe::frame(f))
                .collect()
        };
        panic!(
            "the frames that crossed the veth are not those the verdict passes\nunexpected: {:#?}\nmissing: {:#?}",
            show(&got, &want),
            show(&want, &got)
        );
    }
    assert!(
        want.len() < frames.len(),
        "some frames must be dropped for this to mean anything"
    );

    let stats = stats_json(pair);
    assert_eq!(stats["interface"], pair.b.as_str());
    assert_eq!(stats["mode"], mode);
    for r in Reason::ALL {
        assert_eq!(
            stats["reasons"][r.name()],
            want_counts.total(r),
            "{}",
            r.name()
        );
        for v in Verdict::ALL {
            assert_eq!(
                stats["verdicts"][r.name()][v.name()],
                want_counts.get(r, v),
                "{} {}",
                r.name(),
                v.name()
            );
        }
    }
    let qps = stats["qps"].as_array().unwrap();
    assert_eq!(qps.len(), policy.qps.len());
    let qpa = qps.iter().find(|q| q["qpn"] == common::cases::QPA).unwrap();
    assert!(qpa["passed"].as_u64().unwrap() > 0 && qpa["dropped"].as_u64().unwrap() > 0);
}

fn foreground(mode: &str, reported: &str) {
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let (_dir, policy) = common::policy_file(common::cases::BASE);
    let fg = common::Foreground::start(&pair, &policy, mode);
    check_traffic(&pair, reported);
    let out = fg.stop();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("drop pkey_violation"),
        "violation lines: {text}"
    );
    assert!(text.contains("detached from"), "{text}");
    assert!(text.contains("pkey_violation"), "final counters: {text}");
    assert_eq!(xdp_on(&pair), None, "no program left on the interface");
    assert_eq!(tcx_ingress_on(&pair), 0, "no TC ingress program left");
    assert!(!common::pins(&pair.ns_b, &pair.b).exists(), "no pins left");
}

#[test]
fn foreground_native() {
    let _root = common::pins_root();
    foreground("native", "native");
}

#[test]
fn foreground_skb() {
    let _root = common::pins_root();
    foreground("skb", "tc");
}

fn pinned(mode: &str, reported: &str) {
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let (_dir, policy) = common::policy_file(common::cases::BASE);
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    common::succeed(common::pkeyfw_in(&pair.ns_b).args([
        "attach",
        &pair.b,
        "--policy",
        policy.to_str().unwrap(),
        "--pin",
        "--mode",
        mode,
    ]));
    // The process is gone; the filter runs on.
    check_traffic(&pair, reported);
    common::succeed(common::pkeyfw_in(&pair.ns_b).args(["detach", &pair.b]));
    assert_eq!(xdp_on(&pair), None, "no program left on the interface");
    assert_eq!(tcx_ingress_on(&pair), 0, "no TC ingress program left");
    assert!(!common::pins(&pair.ns_b, &pair.b).exists(), "no pins left");
    let again = common::pkeyfw_in(&pair.ns_b)
        .args(["detach", &pair.b])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("no pinned pkeyfw attachment"));
}

#[test]
fn pinned_native() {
    let _root = common::pins_root();
    pinned("native", "native");
}

#[test]
fn pinned_skb() {
    let _root = common::pins_root();
    pinned("skb", "tc");
}

#[test]
fn auto_mode_gets_native_on_veth() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let (_dir, policy) = common::policy_file("[port]\npkeys = [0xffff]\n");
    let _fg = common::Foreground::start(&pair, &policy, "auto");
    assert_eq!(stats_json(&pair)["mode"], "native");
}

#[test]
fn a_second_attach_is_refused_and_changes_nothing() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let (_dir, policy) = common::policy_file(common::cases::BASE);
    let _fg = common::Foreground::start(&pair, &policy, "native");
    let before = xdp_on(&pair).expect("attached");
    for extra in [&[][..], &["--pin"][..]] {
        let out = common::pkeyfw_in(&pair.ns_b)
            .args(["attach", &pair.b, "--policy", policy.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("already managed by pkeyfw"));
    }
    assert_eq!(xdp_on(&pair), Some(before));
    let detach = common::pkeyfw_in(&pair.ns_b)
        .args(["detach", &pair.b])
        .output()
        .unwrap();
    assert!(
        !detach.status.success(),
        "detach refuses a foreground attachment"
    );
    assert!(String::from_utf8_lossy(&detach.stderr).contains("foreground"));
}

/// While an attach is still loading (its owner noted, nothing pinned yet),
/// `stats` says who sets it up instead of failing on the missing program,
/// and neither a second attach nor `detach` takes its pins for stale ones.
#[test]
fn an_attachment_being_set_up_is_said_and_left_alone() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pu")).unwrap();
    let (_dir, policy) = common::policy_file(common::cases::BASE);
    let pins = common::pins(&pair.ns_b, &pair.b);
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    // What an attach has done before it loads: this process is its owner.
    pins.create().unwrap();
    pins.remember_owner().unwrap();
    let pid = std::process::id();

    let v = stats_json(&pair);
    assert_eq!(v["state"], "setting_up", "{v}");
    assert_eq!(v["pid"], pid, "{v}");
    let text = common::succeed(common::pkeyfw_in(&pair.ns_b).args(["stats"]));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("being set up by `pkeyfw attach` (process {pid})")),
        "{text}"
    );
    for (args, said) in [
        (
            vec!["attach", &pair.b, "--policy", policy.to_str().unwrap()],
            "being set up by another `pkeyfw attach`",
        ),
        (
            vec!["detach", &pair.b],
            "is being set up by `pkeyfw attach`",
        ),
    ] {
        let out = common::pkeyfw_in(&pair.ns_b).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(said),
            "{args:?}: {err}"
        );
        assert!(pins.dir.exists(), "{args:?} left the pins alone");
    }
    assert_eq!(xdp_on(&pair), None);
}

#[test]
fn bad_policy_or_interface_attaches_nothing() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let (_bad_dir, bad) = common::policy_file(
        "[port]\npkeys = [0xffff]\n[[qp]]\nqpn = 5\ntype = \"ud\"\npkey = 0xffff\n",
    );
    let out = common::pkeyfw_in(&pair.ns_b)
        .args(["attach", &pair.b, "--policy", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":3:1: qp[0].qkey"), "{err}");
    assert_eq!(xdp_on(&pair), None);
    assert!(!common::pins(&pair.ns_b, &pair.b).exists());

    let (_good_dir, good) = common::policy_file("[port]\npkeys = [0xffff]\n");
    let out = common::pkeyfw_in(&pair.ns_b)
        .args(["attach", "nosuchif0", "--policy", good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no interface nosuchif0"));
    assert!(!Pins::of("nosuchif0").exists());
}

/// A filter pinned by a pkeyfw whose maps have another layout is refused
/// with the reason, never read as this one's; detach still removes it.
#[test]
fn a_filter_of_another_layout_is_refused_not_misread() {
    let _root = common::pins_root();
    use aya::maps::{Array, Map, MapData};
    use pkeyfw_common::abi::{LAYOUT_VERSION, name};
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let (_dir, policy) = common::policy_file("[port]\npkeys = [0xffff]\n");
    let pins = common::pins(&pair.ns_b, &pair.b);
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    common::succeed(common::pkeyfw_in(&pair.ns_b).args([
        "attach",
        &pair.b,
        "--policy",
        policy.to_str().unwrap(),
        "--pin",
    ]));
    stats_json(&pair);
    let abi = MapData::from_pin(pins.dir.join(name::ABI)).unwrap();
    Array::<_, u32>::try_from(Map::Array(abi))
        .unwrap()
        .set(0, &(LAYOUT_VERSION + 1), 0)
        .unwrap();
    let out = common::pkeyfw_in(&pair.ns_b)
        .args(["stats", &pair.b, "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("another map layout"), "{err}");
    common::succeed(common::pkeyfw_in(&pair.ns_b).args(["detach", &pair.b]));
    assert_eq!(xdp_on(&pair), None, "no program left on the interface");
}

/// RoCE inside SRv6 is decapsulated after XDP: attach says so when the
/// interface's namespace accepts SRv6.
#[test]
fn attach_warns_when_srv6_would_bypass_it() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pk")).unwrap();
    let (_dir, policy) = common::policy_file("[port]\npkeys = [0xffff]\n");
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    let attach = |what: &str| {
        let out = common::succeed(common::pkeyfw_in(&pair.ns_b).args([
            "attach",
            &pair.b,
            "--policy",
            policy.to_str().unwrap(),
            "--pin",
        ]));
        common::succeed(common::pkeyfw_in(&pair.ns_b).args(["detach", &pair.b]));
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        (err.contains("seg6_enabled"), format!("{what}: {err}"))
    };
    let (warned, err) = attach("seg6 off");
    assert!(!warned, "{err}");
    in_netns(&pair.ns_b, || {
        std::fs::write(
            format!("/proc/sys/net/ipv6/conf/{}/seg6_enabled", pair.b),
            "1",
        )
    })
    .unwrap()
    .unwrap();
    let (warned, err) = attach("seg6 on");
    assert!(warned, "{err}");
}
