//! `pkeyfw events` on a pinned attachment with no other pkeyfw process:
//! refused frames sent across a veth the test makes come out as traps 257
//! (Bad P_Key) and 258 (Bad Q_Key) with the frame's fields; a second reader
//! is told who holds the events instead of silently splitting them.

use crate::common;

use std::time::Duration;

use pkeyfw_common::{Reason, judge};
use pkeyfw_testkit::netns::{VethPair, send};
use serde_json::Value;

#[test]
fn events_streams_traps_from_a_pinned_attachment() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pe")).unwrap();
    let (_dir, policy_path) = common::policy_file(common::cases::BASE);
    let policy = common::policy(common::cases::BASE);
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    common::attach_pinned(&pair.ns_b, &pair.b, &policy_path);

    // One frame refused for its P_Key, one for its Q_Key.
    let cases = common::cases::all();
    let pick = |reason: Reason| {
        cases
            .iter()
            .find(|c| c.policy == policy && c.reason == reason && !c.pass)
            .unwrap_or_else(|| panic!("a case refused by {}", reason.name()))
            .frame
            .clone()
    };
    let frames = [pick(Reason::PkeyViolation), pick(Reason::QkeyViolation)];
    // (P_Key, Q_Key) of each.
    let want: Vec<(u16, u32)> = frames
        .iter()
        .map(|f| {
            let roce = judge(&f[..], &policy, &policy.config()).roce.unwrap();
            (roce.pkey(), roce.qkey())
        })
        .collect();

    // A syslog socket of the test's own: each trap goes there too.
    let log_dir = tempfile::tempdir().unwrap();
    let log_path = log_dir.path().join("log");
    let log = std::os::unix::net::UnixDatagram::bind(&log_path).unwrap();
    log.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (_reader, rx) = common::lines_of(
        common::pkeyfw_in(&pair.ns_b)
            .args(["events", &pair.b, "--json", "--syslog"])
            .arg(&log_path),
    );
    // The reader holds the ring once it is running: a second one is told.
    std::thread::sleep(Duration::from_millis(300));
    let second = common::pkeyfw_in(&pair.ns_b)
        .args(["events", &pair.b])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && said.contains("read by another `pkeyfw events`"),
        "{said}"
    );

    send(&pair.ns_a, &pair.a, &frames).unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("pkeyfw events printed the traps");
        let v: Value = serde_json::from_str(&line).unwrap();
        got.push(v);
    }
    let [pkey, qkey] = [&got[0], &got[1]];
    assert_eq!(pkey["trap"], 257, "{pkey}");
    assert_eq!(pkey["reason"], "pkey_violation");
    assert_eq!(pkey["interface"], pair.b.as_str());
    assert_eq!(pkey["verdict"], "drop");
    assert_eq!(pkey["pkey"], want[0].0);
    assert_eq!(qkey["trap"], 258, "{qkey}");
    assert_eq!(qkey["reason"], "qkey_violation");
    assert_eq!(qkey["pkey"], want[1].0);
    assert_eq!(qkey["qkey"], want[1].1);
    for v in [pkey, qkey] {
        assert_eq!(v["src"], "192.0.2.1", "{v}");
        assert_eq!(v["dst"], "192.0.2.2", "{v}");
    }
    // The same two traps in syslog's format: facility daemon, warning.
    let mut logged = Vec::new();
    let mut buf = [0u8; 2048];
    while logged.len() < 2 {
        let n = log.recv(&mut buf).expect("pkeyfw events logged the traps");
        logged.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    for (line, trap) in logged
        .iter()
        .zip(["trap 257 (Bad P_Key)", "trap 258 (Bad Q_Key)"])
    {
        assert!(line.starts_with("<28>pkeyfw["), "{line}");
        assert!(
            line.contains(&format!("]: {} {trap} drop", pair.b)),
            "{line}"
        );
    }
}

/// A switch port's refusals come out as trap 259 with the port, the
/// direction and the verdict, and `stats` counts them as
/// PortRcvConstraintErrors.
#[test]
fn switch_ports_send_trap_259() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("ps")).unwrap();
    let (_dir, policy_path) = common::policy_file(&format!(
        "[switch]\nviolation = \"corrupt\"\n[[switch.port]]\ninterface = \"{}\"\npkeys = [0x8001]\n",
        pair.b
    ));
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    common::succeed(common::pkeyfw_in(&pair.ns_b).args([
        "switch",
        "attach",
        "--policy",
        policy_path.to_str().unwrap(),
    ]));
    let (_reader, rx) =
        common::lines_of(common::pkeyfw_in(&pair.ns_b).args(["events", &pair.b, "--json"]));
    std::thread::sleep(Duration::from_millis(300));
    // Another partition, received on the port.
    let frame = pkeyfw_testkit::wire::Packet::rc(0x8002, 0x100).bytes();
    send(&pair.ns_a, &pair.a, &[frame]).unwrap();
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("pkeyfw events printed the trap");
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["trap"], 259, "{v}");
    assert_eq!(v["kind"], "switch_port", "{v}");
    assert_eq!(v["port"], pair.b.as_str(), "{v}");
    assert_eq!(v["direction"], "inbound", "{v}");
    assert_eq!(v["verdict"], "corrupt", "{v}");
    assert_eq!(v["pkey"], 0x8002, "{v}");
    assert_eq!(v["dest_qp"], 0x100, "{v}");
    let stats = common::succeed(common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b, "--json"]));
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    let port = &stats["switch"];
    assert_eq!(port["port_rcv_constraint_errors"], 1, "{stats}");
    assert_eq!(port["port_xmit_constraint_errors"], 0, "{stats}");
    assert_eq!(port["inbound"]["pkey_violation"]["corrupt"], 1, "{stats}");
}

/// A flood of refused frames spends the refused frames' budget only: what
/// it holds back is counted exactly, by kind, in `stats` and in the
/// reader's window summary, and the frames' events plus those held back
/// are every frame.
#[test]
fn a_flood_is_counted_where_the_budget_holds_it_back() {
    let _root = common::pins_root();
    const FLOOD: u64 = 400;
    common::require_root();
    let pair = VethPair::create(&common::tag("pf")).unwrap();
    let (_dir, policy_path) = common::policy_file(common::cases::BASE);
    let _cleanup = common::Unpin(common::pins(&pair.ns_b, &pair.b));
    common::attach_pinned(&pair.ns_b, &pair.b, &policy_path);
    let (_reader, rx) = common::lines_of(
        common::pkeyfw_in(&pair.ns_b)
            .args(["events", &pair.b, "--json", "--window", "1"])
            .args(["--per-source", "100000"]),
    );
    std::thread::sleep(Duration::from_millis(300));
    // Junk to port 4791: one malformed RoCE frame, many times.
    let mut junk = pkeyfw_testkit::wire::Packet::rc(0x8002, 0x100).bytes();
    junk.truncate(junk.len() - 20);
    send(&pair.ns_a, &pair.a, &vec![junk; FLOOD as usize]).unwrap();

    let (mut traps, mut held) = (0, 0);
    while traps + held < FLOOD {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{traps} traps and {held} held back of {FLOOD}"));
        let v: Value = serde_json::from_str(&line).unwrap();
        match v.get("kernel_suppressed") {
            Some(n) => {
                assert_eq!(v["kind"], "frame", "{v}");
                held += n.as_u64().unwrap();
            }
            None => traps += 1,
        }
    }
    assert_eq!(traps + held, FLOOD);
    assert!(held > 0 && traps >= 64, "{traps} traps, {held} held back");
    let stats = common::succeed(common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b, "--json"]));
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    let counted = &stats["events_suppressed"];
    assert_eq!(counted["frame"], held, "{stats}");
    for other in [
        "foreign_join",
        "qkey_mismatch",
        "switch_port",
        "quarantined",
    ] {
        assert_eq!(counted[other], 0, "{stats}");
    }
    let text = common::succeed(common::pkeyfw_in(&pair.ns_b).args(["stats", &pair.b]));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("(counted, not sent): frame {held}")),
        "{text}"
    );
}
