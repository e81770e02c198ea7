//! The real XDP program in the kernel (BPF_PROG_TEST_RUN): every case of the
//! table, and every valid frame cut at every byte offset.

use crate::common;

use pkeyfw::loading::maps::ReasonCounts;
use pkeyfw_common::{Reason, Verdict, abi::QpStats};

#[test]
fn every_case_in_the_kernel() {
    let mut failures = Vec::new();
    let cases = common::cases::all();
    let mut filter = common::filter(&cases[0].policy);
    for case in &cases {
        filter.apply(&case.policy).expect("apply");
        let (pass, reason) = filter.run_counted(&case.frame).expect("run");
        if (reason, pass) != (case.reason, case.pass) {
            failures.push(format!(
                "{}: want {:?}/{}, got {reason:?}/{pass}",
                case.name, case.reason, case.pass
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The TC ingress program (`--mode skb`) gives every case the XDP verdict.
/// (A test run's skb is never GSO; tests/gso.rs covers super-packets.)
/// BPF_PROG_TEST_RUN takes one page of skb data at most: the longer cases
/// reach this program through a veth in tests/attach.rs (skb mode).
#[test]
fn every_case_through_the_tc_ingress_program() {
    const TEST_RUN_MAX: usize = 3500;
    let mut failures = Vec::new();
    let cases = common::cases::all();
    let mut filter = common::filter(&cases[0].policy);
    for case in cases.iter().filter(|c| c.frame.len() <= TEST_RUN_MAX) {
        filter.apply(&case.policy).expect("apply");
        let before = filter.maps().reasons().unwrap();
        let (pass, _) = filter.run_ingress(&case.frame).expect("run");
        let after = filter.maps().reasons().unwrap();
        let counted = Reason::ALL
            .into_iter()
            .find(|&r| after.total(r) != before.total(r));
        if (counted, pass) != (Some(case.reason), case.pass) {
            failures.push(format!(
                "{}: want {:?}/{}, got {counted:?}/{pass}",
                case.name, case.reason, case.pass
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A refused frame counts once against its partition, through either
/// program: the TC ingress program counts it in the stage that reports it,
/// not in its verdict's stage too.
#[test]
fn a_violation_counts_once_through_either_program() {
    use common::cases::QPB;
    use pkeyfw_testkit::wire::Packet;
    let policy = common::policy(common::cases::BASE);
    let filter = common::filter(&policy);
    // Limited to limited: a P_Key violation of partition 1.
    let frame = Packet::rc(0x0001, QPB).bytes();
    assert!(!filter.run(&frame).unwrap());
    assert_eq!(
        filter.maps().violations().unwrap(),
        [(Reason::PkeyViolation, 1, 1)],
        "XDP"
    );
    assert!(!filter.run_ingress(&frame).unwrap().0);
    assert_eq!(
        filter.maps().violations().unwrap(),
        [(Reason::PkeyViolation, 1, 2)],
        "then TC ingress"
    );
}

#[test]
fn truncated_frames_in_the_kernel() {
    let policy = common::policy(common::cases::BASE);
    let filter = common::filter(&policy);
    // BPF_PROG_TEST_RUN refuses XDP input shorter than an Ethernet header.
    const ETH: usize = 14;
    for (name, packet) in common::cases::valid_frames() {
        let frame = packet.bytes();
        for len in ETH..=frame.len() {
            let (pass, reason) = filter.run_counted(&frame[..len]).expect("run");
            if len < packet.headers_end() {
                assert_eq!(
                    (reason, pass),
                    (Reason::Malformed, false),
                    "{name} cut at {len}"
                );
            } else {
                assert_eq!((reason, pass), (Reason::Ok, true), "{name} cut at {len}");
            }
        }
    }
}

#[test]
fn counters_count_every_frame_once() {
    let cases = common::cases::all();
    let policy = &cases[0].policy;
    let filter = common::filter(policy);
    assert!(
        !policy.monitor,
        "an enforcing policy: a refused frame is dropped"
    );
    let mut want = ReasonCounts::default();
    for case in cases.iter().filter(|c| &c.policy == policy) {
        filter.run(&case.frame).expect("run");
        want.add(
            case.reason,
            if case.pass {
                Verdict::Pass
            } else {
                Verdict::Drop
            },
        );
    }
    assert_eq!(filter.maps().reasons().unwrap(), want);
}

/// QP `qpn`'s (passed, dropped) in the filter's per-QP counters, if the
/// table holds it.
fn passed_dropped(stats: &[(u32, QpStats)], qpn: u32) -> Option<(u64, u64)> {
    stats
        .iter()
        .find(|(q, _)| *q == qpn)
        .map(|(_, s)| (s.passed, s.dropped))
}

#[test]
fn qp_counters_follow_the_verdicts() {
    let policy = common::policy(common::cases::BASE);
    let filter = common::filter(&policy);
    use common::cases::{QPA, QPB};
    use pkeyfw_testkit::wire::Packet;
    for _ in 0..3 {
        filter.run(&Packet::rc(0x0001, QPA).bytes()).unwrap(); // ok
    }
    for _ in 0..2 {
        filter.run(&Packet::rc(0x0001, QPB).bytes()).unwrap(); // limited→limited
    }
    filter.run(&Packet::rc(0x8001, QPB).bytes()).unwrap(); // ok
    let stats = filter.maps().qp_counters().unwrap();
    let get = |qpn| passed_dropped(&stats, qpn);
    assert_eq!(get(QPA), Some((3, 0)));
    assert_eq!(get(QPB), Some((1, 2)));
    assert_eq!(stats.len(), policy.qps.len());
}

/// Every CPU adds to one QP's counters and one partition's violations
/// (shared, atomic): frames judged on each CPU in turn are all counted.
#[test]
fn frames_on_every_cpu_count_in_one_qps_and_one_partitions_counters() {
    use common::cases::{QPA, QPB};
    use pkeyfw_testkit::{cpus, wire::Packet};
    let policy = common::policy(common::cases::BASE);
    let filter = common::filter(&policy);
    let (ok, refused) = (
        Packet::rc(0x0001, QPA).bytes(),
        Packet::rc(0x0001, QPB).bytes(),
    );
    let each = cpus::allowed().unwrap();
    for &cpu in &each {
        cpus::on(cpu, || {
            assert!(filter.run(&ok).unwrap(), "ok on CPU {cpu}");
            assert!(!filter.run(&refused).unwrap(), "refused on CPU {cpu}");
        })
        .unwrap();
    }
    let n = each.len() as u64;
    let stats = filter.maps().qp_counters().unwrap();
    let get = |qpn| passed_dropped(&stats, qpn);
    assert_eq!((get(QPA), get(QPB)), (Some((n, 0)), Some((0, n))));
    assert_eq!(
        filter.maps().violations().unwrap(),
        [(Reason::PkeyViolation, 1, n)]
    );
}

#[test]
fn reapplying_keeps_counters_of_kept_qps_and_forgets_removed_ones() {
    use common::cases::{QPA, QPB};
    use pkeyfw_testkit::wire::Packet;
    let policy = common::policy(common::cases::BASE);
    let mut filter = common::filter(&policy);
    filter.run(&Packet::rc(0x0001, QPA).bytes()).unwrap();
    let mut smaller = policy.clone();
    smaller.qps.remove(&QPB);
    filter.apply(&smaller).unwrap();
    filter.run(&Packet::rc(0x0001, QPA).bytes()).unwrap();
    let (pass, reason) = filter
        .run_counted(&Packet::rc(0x8001, QPB).bytes())
        .unwrap();
    assert_eq!(
        (pass, reason),
        (false, Reason::PkeyViolation),
        "QPB is unknown now"
    );
    let stats = filter.maps().qp_counters().unwrap();
    assert_eq!(stats.iter().find(|(q, _)| *q == QPA).unwrap().1.passed, 2);
    assert!(stats.iter().all(|(q, _)| *q != QPB));
}

/// The kernel counts what it did: in monitor mode a refused frame is counted
/// as passed by monitor mode under its reason, never as a drop.
#[test]
fn monitor_mode_counts_refusals_as_monitor_passes() {
    use common::cases::{QPB, QPD};
    use pkeyfw_testkit::wire::Packet;
    let policy =
        common::policy(&common::cases::BASE.replace("mode = \"enforce\"", "mode = \"monitor\""));
    let filter = common::filter(&policy);
    let refused = Packet::rc(0x0001, QPB).bytes(); // limited → limited
    let allowed = Packet::rc(0x8002, QPD).bytes();
    assert_eq!(
        filter.run_verdict(&refused).unwrap(),
        (Verdict::Monitor, Reason::PkeyViolation)
    );
    assert_eq!(
        filter.run_verdict(&allowed).unwrap(),
        (Verdict::Pass, Reason::Ok)
    );
    let counts = filter.maps().reasons().unwrap();
    assert_eq!(counts.get(Reason::PkeyViolation, Verdict::Drop), 0);
    assert_eq!(counts.refused(), 1);
    assert_eq!(counts.passed_by(Reason::PkeyViolation), 1);
}
