//! Hot reload under traffic: while frames flood the veth, the attachment is
//! switched back and forth between two policies many times. Every frame must
//! be judged by one policy or the other, never by a mix of the two.

use crate::common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use pkeyfw::policy::Policy;
use pkeyfw_common::judge;
use pkeyfw_testkit::{
    netns::{VethPair, capture_during, send},
    wire::Packet,
};

/// P1 binds QP 0x10 to 0x8001 and passes unknown QPs; P2 does not bind it and
/// drops unknown QPs. A frame to 0x10 with P_Key 0x8002 is dropped by both
/// (P1: P_Key violation, P2: unknown QP) but would pass a half-switched
/// filter holding P2's QP table with P1's unknown-QP rule.
const P1: &str = "[port]\npkeys = [0xffff, 0x8001]\n[enforcement]\nunknown_qp = \"pass\"\n[[qp]]\nqpn = 0x10\ntype = \"rc\"\npkey = 0x8001\n[[qp]]\nqpn = 0x11\ntype = \"rc\"\npkey = 0xffff\n";
const P2: &str = "[port]\npkeys = [0xffff, 0x8002]\n[enforcement]\nunknown_qp = \"drop\"\n[[qp]]\nqpn = 0x11\ntype = \"rc\"\npkey = 0xffff\n";

/// Frame `n` of a kind, made unique by its PSN-like payload.
fn frame(pkey: u16, qpn: u32, n: u32) -> Vec<u8> {
    let mut p = Packet::rc(pkey, qpn);
    p.payload = n.to_be_bytes().repeat(4);
    p.bytes()
}

#[test]
fn reload_under_flood_never_mixes_policies() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&format!("pr{}", std::process::id() % 10000)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (f1, f2) = (dir.path().join("p1.toml"), dir.path().join("p2.toml"));
    std::fs::write(&f1, P1).unwrap();
    std::fs::write(&f2, P2).unwrap();
    let (p1, p2) = (common::policy(P1), common::policy(P2));
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));

    common::attach_pinned(&pair.ns_b, &pair.b, &f1);

    // The mixed-state detector and a frame every policy passes.
    let verdicts = |f: &[u8], p: &Policy| judge(f, p, &p.config()).pass;
    let probe = frame(0x8002, 0x10, 0);
    assert!(!verdicts(&probe, &p1) && !verdicts(&probe, &p2));
    assert!(verdicts(&frame(0xffff, 0x11, 0), &p1) && verdicts(&frame(0xffff, 0x11, 0), &p2));

    let stop = Arc::new(AtomicBool::new(false));
    let (sent_probes, reloads, got) = {
        let flooding = stop.clone();
        let (ns_a, a) = (pair.ns_a.clone(), pair.a.clone());
        let flood = std::thread::spawn(move || {
            let mut n = 0u32;
            while !flooding.load(Ordering::Relaxed) {
                let batch: Vec<Vec<u8>> = (0..64)
                    .flat_map(|i| [frame(0x8002, 0x10, n + i), frame(0xffff, 0x11, n + i)])
                    .collect();
                send(&ns_a, &a, &batch).unwrap();
                n += 64;
            }
            n
        });
        let (reloads, got) =
            capture_during(&pair.ns_b, &pair.b, Duration::from_millis(300), || {
                let mut reloads = 0;
                for i in 0..30 {
                    let file = if i % 2 == 0 { &f2 } else { &f1 };
                    common::succeed(common::pkeyfw_in(&pair.ns_b).args([
                        "reload",
                        &pair.b,
                        "--policy",
                        file.to_str().unwrap(),
                    ]));
                    reloads += 1;
                }
                stop.store(true, Ordering::Relaxed);
                reloads
            })
            .unwrap();
        (flood.join().unwrap(), reloads, got)
    };
    assert_eq!(reloads, 30);
    assert!(sent_probes > 0);
    let ours: Vec<&Vec<u8>> = got
        .iter()
        .filter(|f| f.len() > 14 && f[12..14] == [8, 0])
        .collect();
    for f in &ours {
        assert!(
            verdicts(f, &p1) || verdicts(f, &p2),
            "a frame both policies drop crossed: {}",
            pkeyfw::reporting::describe::frame(f)
        );
    }
    assert!(!ours.is_empty(), "the frames both policies pass must cross");

    // An invalid policy changes nothing.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[port]\npkeys = [0xffff]\n[[qp]]\nqpn = 0x10\ntype = \"rc\"\npkey = 0x8001\n",
    )
    .unwrap();
    let before = stats_qps(&pair);
    let out = common::pkeyfw_in(&pair.ns_b)
        .args(["reload", &pair.b, "--policy", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.toml:6:8: qp[0].pkey"));
    assert_eq!(stats_qps(&pair), before, "the running policy is untouched");

    // Without --policy, reload re-reads the file the attachment runs.
    let out = common::succeed(common::pkeyfw_in(&pair.ns_b).args(["reload", &pair.b]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("p1.toml"));
}

fn stats_qps(pair: &VethPair) -> Vec<u64> {
    let out = common::pkeyfw_in(&pair.ns_b)
        .args(["stats", &pair.b, "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["qps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["qpn"].as_u64().unwrap())
        .collect()
}

#[test]
fn sighup_reloads_a_foreground_attachment_and_refuses_a_bad_file() {
    let _root = common::pins_root();
    use std::io::{BufRead, BufReader};
    common::require_root();
    let pair = VethPair::create(&format!("ph{}", std::process::id() % 10000)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, P1).unwrap();
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    let mut child = common::pkeyfw_in(&pair.ns_b)
        .args(["attach", &pair.b, "--policy", file.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().contains("attached to"));
    // Holding maps, it runs ahead of tenants' tasks (loading::priority);
    // what it starts would not.
    // SAFETY: reads a process's scheduling policy.
    let policy = unsafe { libc::sched_getscheduler(child.id() as i32) };
    assert_eq!(
        policy,
        libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK,
        "a foreground attachment's scheduling policy"
    );
    let hup = |child: &std::process::Child| {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    };

    std::fs::write(&file, P2).unwrap();
    hup(&child);
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.contains("reloaded") && line.contains("1 QPs"),
        "{line}"
    );
    assert_eq!(stats_qps(&pair), [0x11]);

    std::fs::write(&file, "[port]\npkeys = []\n").unwrap();
    hup(&child);
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.contains("reload refused") && line.contains("policy.toml:2:9: port.pkeys"),
        "{line}"
    );
    assert_eq!(stats_qps(&pair), [0x11], "the running policy stays");

    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

/// Swaps a Kubernetes-style ConfigMap directory to `text`: a new timestamped
/// directory, then the `..data` symlink renamed over (atomically), as the
/// kubelet does; `policy.toml` links through `..data`.
fn configmap_swap(dir: &std::path::Path, version: u32, text: &str) {
    let data = dir.join(format!("..v{version}"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("policy.toml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..v{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[test]
fn watch_follows_a_configmap_swap_and_refuses_a_bad_file_once() {
    let _root = common::pins_root();
    use std::io::{BufRead, BufReader};
    common::require_root();
    let pair = VethPair::create(&common::tag("pw")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    configmap_swap(dir.path(), 1, P1);
    let file = dir.path().join("policy.toml");
    std::os::unix::fs::symlink("..data/policy.toml", &file).unwrap();
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    let mut child = common::pkeyfw_in(&pair.ns_b)
        .args([
            "attach",
            &pair.b,
            "--watch",
            "--policy",
            file.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().contains("attached to"));
    assert_eq!(stats_qps(&pair), [0x10, 0x11]);

    configmap_swap(dir.path(), 2, P2);
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.contains("changed, reloaded") && line.contains("1 QPs"),
        "{line}"
    );
    assert_eq!(stats_qps(&pair), [0x11]);

    configmap_swap(dir.path(), 3, "[port]\npkeys = []\n");
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.contains("refused") && line.contains("policy.toml:2:9: port.pkeys"),
        "{line}"
    );
    // Several polls go by on the bad file: it is reported once, and the
    // next line is the good file coming back.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(stats_qps(&pair), [0x11], "the running policy stays");
    configmap_swap(dir.path(), 4, P1);
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.contains("changed, reloaded") && line.contains("2 QPs"),
        "{line}"
    );
    assert_eq!(stats_qps(&pair), [0x10, 0x11]);

    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

/// QPs bound and released one by one (as the foreground attach follows
/// them) each count their own frames, their QPN's: a QPN bound afresh
/// starts from zero, another QP's counts stay; a QP beyond the QP table is
/// refused and leaves nothing; and so after a reload.
#[test]
fn live_binds_count_by_qpn_from_zero() {
    use pkeyfw::{loading::filter::Filter, policy::QpRule};
    use pkeyfw_common::abi::{QpType, qp_flags};
    use pkeyfw_testkit::wire::Packet;

    common::require_root();
    let policy = common::policy(common::cases::BASE);
    let mut filter = Filter::load(policy.qpns()).unwrap();
    filter.apply(&policy).unwrap();
    let rule = QpRule {
        qp_type: QpType::Rc,
        pkey: 0x8001,
        qkey: None,
        flags: qp_flags::RULE,
    };
    let (a, b) = (0x100, 0x101);
    let beyond = filter.maps().qpns();
    let frames_to = |filter: &Filter, qpn: u32, n: usize| {
        for _ in 0..n {
            assert!(filter.run(&Packet::rc(0x8001, qpn).bytes()).unwrap());
        }
    };
    let passed = |filter: &Filter, qpn: u32| {
        filter
            .maps()
            .qp_counters()
            .unwrap()
            .into_iter()
            .find(|&(q, _)| q == qpn)
            .map(|(_, s)| s.passed)
    };
    for round in 0..2 {
        filter.maps_mut().bind_live(a, &rule).unwrap();
        filter.maps_mut().bind_live(b, &rule).unwrap();
        frames_to(&filter, a, 3);
        frames_to(&filter, b, 5);
        assert_eq!((passed(&filter, a), passed(&filter, b)), (Some(3), Some(5)));
        let e = filter.maps_mut().bind_live(beyond, &rule).unwrap_err();
        assert!(format!("{e:#}").contains("beyond the QP table"), "{e:#}");
        assert_eq!(passed(&filter, beyond), None);
        // A released and bound again counts from zero; B keeps its own.
        filter.maps_mut().unbind_live(a).unwrap();
        assert_eq!(passed(&filter, a), None);
        filter.maps_mut().bind_live(a, &rule).unwrap();
        frames_to(&filter, a, 1);
        assert_eq!((passed(&filter, a), passed(&filter, b)), (Some(1), Some(5)));
        for q in [a, b] {
            filter.maps_mut().unbind_live(q).unwrap();
        }
        if round == 0 {
            filter.apply(&policy).unwrap();
        }
    }
}
