//! A switch port's programs in the kernel (BPF_PROG_TEST_RUN): the inbound
//! check (XDP, and the TC ingress program of `--mode skb`), the outbound
//! check (TC egress), access-port stamping and restoring, and corruption,
//! each against the partition rules and the host's copy of the verdict.

use crate::common;

use pkeyfw::{
    loading::{filter::Filter, maps::ReasonCounts},
    policy::{Policy, SwitchRole},
};
use pkeyfw_common::{Direction, Reason, Verdict, pkey, switch};
use pkeyfw_testkit::{
    stamping::{self, check_rewritten, udp_sum},
    wire::{Packet, icrc_holds},
};

/// A switch port with table `pkeys`.
fn port(pkeys: &[u16], role: SwitchRole) -> Policy {
    let mut policy = Policy::with_table(pkeys.to_vec());
    policy.switch = Some(role);
    policy
}

const CHECKS: SwitchRole = SwitchRole {
    inbound: true,
    outbound: true,
    corrupt: false,
    access: None,
};

/// What one direction did with a frame: passed or not, what it counted,
/// the frame as it left.
fn run(filter: &Filter, direction: Direction, frame: &[u8]) -> (Verdict, Reason, Option<Vec<u8>>) {
    let counters = |f: &Filter| -> ReasonCounts {
        match direction {
            Direction::Inbound => f.maps().reasons(),
            Direction::Outbound => f.maps().xmit_reasons(),
        }
        .unwrap()
    };
    let before = counters(filter);
    let out = match direction {
        Direction::Inbound => {
            let (pass, out) = filter.run_out(frame).unwrap();
            pass.then_some(out)
        }
        Direction::Outbound => filter.run_egress(frame).unwrap(),
    };
    let after = counters(filter);
    let counted: Vec<(Reason, Verdict)> = Reason::ALL
        .into_iter()
        .flat_map(|r| Verdict::ALL.map(|v| (r, v)))
        .filter(|&(r, v)| after.get(r, v) == before.get(r, v) + 1)
        .collect();
    let [(reason, verdict)] = counted[..] else {
        panic!("{direction:?}: not one count for the frame: {counted:?}");
    };
    assert_eq!(
        out.is_some(),
        verdict != Verdict::Drop,
        "{direction:?}: returned vs counted"
    );
    (verdict, reason, out)
}

/// Every key against every table, both directions, IPv4/IPv6/VLAN, UD and
/// RC: inbound admits what the port's host may send, outbound what it may
/// receive; the host's verdict agrees.
#[test]
fn checks_follow_the_rules_in_both_directions() {
    let tables: [&[u16]; 4] = [&[0x8001], &[0x0001], &[0x8002], &[0xffff, 0x0001]];
    let keys = [
        0x8001, 0x0001, 0x8002, 0x0002, 0xffff, 0x7fff, 0x0000, 0x8000,
    ];
    let mut failures = Vec::new();
    let mut filter = common::filter(&port(tables[0], CHECKS));
    for table in tables {
        let policy = port(table, CHECKS);
        filter.apply(&policy).unwrap();
        for key in keys {
            let frames = [
                ("ud v4", Packet::ud(key, 0x100, 0x11)),
                ("rc v4", Packet::rc(key, 0x100)),
                ("ud v6", Packet::ud(key, 0x100, 0x11).over_v6(Vec::new())),
                ("rc vlan", {
                    let mut p = Packet::rc(key, 0x100);
                    p.vlans = vec![0x8100];
                    p
                }),
                ("ud v1", Packet::ud(key, 0x100, 0x11).as_v1()),
            ];
            for (what, p) in frames {
                let flags = policy
                    .port_flags()
                    .get(&pkey::key(key))
                    .copied()
                    .unwrap_or(0);
                for direction in Direction::ALL {
                    let allowed = match direction {
                        Direction::Inbound => pkey::port::admits(key, flags),
                        Direction::Outbound => pkey::port::matches(key, flags),
                    };
                    let want = match allowed {
                        true => (Verdict::Pass, Reason::Ok),
                        false => (Verdict::Drop, Reason::PkeyViolation),
                    };
                    let frame = p.bytes();
                    let host = switch::judge(&frame[..], &policy, &policy.config(), direction)
                        .expect("a checking port judges");
                    let (verdict, reason, _) = run(&filter, direction, &frame);
                    if (verdict, reason) != want || host.outcome.verdict() != verdict {
                        failures.push(format!(
                            "table {table:x?} key {key:#06x} {what} {direction:?}: want {want:?}, kernel {verdict:?}/{reason:?}, host {:?}",
                            host.outcome.verdict()
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Limited members meet nobody limited; a limited port's own frames go in.
#[test]
fn the_seeds_four_hosts() {
    let (a, b, d) = (&[0x8001u16][..], &[0x0001u16][..], &[0x8002u16][..]);
    let send = |from: &[u16], to: &[u16]| {
        let key = from[0];
        let frame = Packet::rc(key, 0x100).bytes();
        let inbound = common::filter(&port(from, CHECKS));
        let outbound = common::filter(&port(to, CHECKS));
        run(&inbound, Direction::Inbound, &frame).2.is_some()
            && run(&outbound, Direction::Outbound, &frame).2.is_some()
    };
    assert!(send(a, b) && send(b, a), "A ⟷ B");
    assert!(!send(b, b), "B → C (both limited)");
    assert!(
        !send(d, b) && !send(b, d) && !send(a, d),
        "D is alone in 0x0002"
    );
}

/// QP0 is exempt both ways; a cut-short RoCE frame is refused both ways.
#[test]
fn smi_exempt_and_malformed_refused() {
    let filter = common::filter(&port(&[0x8001], CHECKS));
    let smi = Packet::ud(0x8002, 0, 0).bytes();
    let mut cut = Packet::rc(0x8001, 0x100).bytes();
    cut.truncate(Packet::rc(0x8001, 0x100).headers_end() - 1);
    for direction in Direction::ALL {
        let (v, r, _) = run(&filter, direction, &smi);
        assert_eq!((v, r), (Verdict::Pass, Reason::Smi), "{direction:?} QP0");
        let (v, r, _) = run(&filter, direction, &cut);
        assert_eq!(
            (v, r),
            (Verdict::Drop, Reason::Malformed),
            "{direction:?} cut"
        );
    }
    let tcp = pkeyfw_testkit::cases::frames::tcp().bytes();
    for direction in Direction::ALL {
        assert_eq!(run(&filter, direction, &tcp).1, Reason::NotRoce);
    }
}

/// An access port: 0xFFFF in becomes the port's key (ICRC and checksum
/// true), any key out becomes 0xFFFF; another key in is refused.
#[test]
fn access_port_stamps_in_and_restores_out() {
    let role = SwitchRole {
        access: Some(0x8001),
        ..CHECKS
    };
    let filter = common::filter(&port(&[0x8001], role));
    for (what, p) in [
        ("ud v4", Packet::ud(0xffff, 0x100, 0x11)),
        ("rc v6", Packet::rc(0xffff, 0x100).over_v6(Vec::new())),
    ] {
        for checksum in [true, false] {
            let input = stamping::frame(&p, checksum);
            let (v, r, out) = run(&filter, Direction::Inbound, &input);
            assert_eq!((v, r), (Verdict::Pass, Reason::Ok), "{what} in");
            check_rewritten(what, &p, &input, &out.unwrap(), 0x8001);

            let mut back = p.clone();
            back.pkey = 0x0001;
            let input = stamping::frame(&back, checksum);
            let (v, _, out) = run(&filter, Direction::Outbound, &input);
            assert_eq!(v, Verdict::Pass, "{what} out");
            check_rewritten(what, &back, &input, &out.unwrap(), 0xffff);
        }
    }
    // Posing as another partition, or leaving with a key the host may not
    // receive: refused, not stamped.
    let foreign = Packet::rc(0x8002, 0x100).bytes();
    assert_eq!(run(&filter, Direction::Inbound, &foreign).0, Verdict::Drop);
    assert_eq!(run(&filter, Direction::Outbound, &foreign).0, Verdict::Drop);
    // The host behind an access port has no other key to send, not even
    // a limited membership of its own partition.
    let limited = Packet::rc(0x0001, 0x100).bytes();
    assert_eq!(run(&filter, Direction::Inbound, &limited).0, Verdict::Drop);
    // Out, 0xFFFF is refused like any key of a partition the port is not in.
    let default = Packet::rc(0xffff, 0x100).bytes();
    assert_eq!(run(&filter, Direction::Outbound, &default).0, Verdict::Drop);
    // An access port checks both ways whatever its flags say (the policy
    // refuses such a port; the kernel does not rely on that).
    let unchecked = common::filter(&port(
        &[0x8001],
        SwitchRole {
            inbound: false,
            outbound: false,
            ..role
        },
    ));
    for direction in Direction::ALL {
        assert_eq!(run(&unchecked, direction, &foreign).0, Verdict::Drop);
    }
    let stamps = filter.maps().stamps().unwrap();
    assert_eq!(
        (
            stamps[pkeyfw_common::Stamp::Stamped.index() as usize],
            stamps[pkeyfw_common::Stamp::Restored.index() as usize]
        ),
        (4, 4)
    );
}

/// An access port is an HCA whose every QP holds the port's key, though
/// its table (from a partitions.conf with `Default=0x7fff : ALL=full`)
/// holds the default partition too: a tenant behind it that makes frames
/// by hand reaches no other partition. In, only 0xFFFF over RoCE v2 (what
/// its unmodified rdma_rxe sends) passes, as the port's key; 0x7FFF, a
/// key of another port's partition, a full member's key of its own and
/// RoCE v1 are refused. Out, a frame must match the port's key itself,
/// except a QP1 frame, which may match any entry of the table, as QP1
/// does. (Before, each of these was judged against the whole table.)
#[test]
fn an_access_port_admits_only_its_own_key() {
    let role = SwitchRole {
        access: Some(0x8001),
        ..CHECKS
    };
    let filter = common::filter(&port(&[0xffff, 0x8001, 0x8002], role));
    for (what, p) in [
        ("0x7fff", Packet::rc(0x7fff, 0x100)),
        ("0x8002 of another port", Packet::rc(0x8002, 0x100)),
        ("0x8001 by hand", Packet::ud(0x8001, 0x100, 0x11)),
        ("RoCE v1 0xffff", Packet::rc(0xffff, 0x100).as_v1()),
        ("RoCE v1 0x8001", Packet::rc(0x8001, 0x100).as_v1()),
        ("QP1 0x7fff", Packet::ud(0x7fff, 1, 0x8001_0000)),
    ] {
        let (v, r, _) = run(&filter, Direction::Inbound, &p.bytes());
        assert_eq!((v, r), (Verdict::Drop, Reason::PkeyViolation), "in: {what}");
    }
    let own = Packet::rc(0xffff, 0x100);
    let (v, _, out) = run(&filter, Direction::Inbound, &own.bytes());
    assert_eq!(v, Verdict::Pass);
    let (out, at) = (out.unwrap(), own.bth_at() + 2);
    assert_eq!(
        u16::from_be_bytes([out[at], out[at + 1]]),
        0x8001,
        "stamped"
    );

    for (what, p, pass) in [
        (
            "0xffff of a default-partition host",
            Packet::rc(0xffff, 0x100),
            false,
        ),
        ("0x7fff", Packet::rc(0x7fff, 0x100), false),
        ("0x8002", Packet::rc(0x8002, 0x100), false),
        ("0x8001", Packet::rc(0x8001, 0x100), true),
        ("0x0001, a limited member", Packet::rc(0x0001, 0x100), true),
        ("QP1 0xffff", Packet::ud(0xffff, 1, 0x8001_0000), true),
        ("QP1 0x8002", Packet::ud(0x8002, 1, 0x8001_0000), true),
    ] {
        let (v, _, _) = run(&filter, Direction::Outbound, &p.bytes());
        assert_eq!(v == Verdict::Pass, pass, "out: {what}");
    }
}

/// `corrupt`: a refused RoCE v2 frame goes on with a wrong ICRC, P_Key 0
/// and a true UDP checksum, counted as corrupt, and stays so through a
/// second refusing port (its ICRC is not mended by a second flip); one that
/// cannot be corrupted (RoCE v1) is dropped.
#[test]
fn corrupt_breaks_the_icrc_and_keeps_the_checksum() {
    let role = SwitchRole {
        corrupt: true,
        ..CHECKS
    };
    let filter = common::filter(&port(&[0x0001], role));
    let p = Packet::rc(0x0001, 0x100);
    let input = stamping::frame(&p, true);
    assert_eq!(icrc_holds(&input), Some(true));
    for direction in Direction::ALL {
        let (v, r, out) = run(&filter, direction, &input);
        assert_eq!(
            (v, r),
            match direction {
                // A limited member's own frame goes in.
                Direction::Inbound => (Verdict::Pass, Reason::Ok),
                Direction::Outbound => (Verdict::Corrupt, Reason::PkeyViolation),
            },
            "{direction:?}"
        );
        let out = out.unwrap();
        if direction == Direction::Outbound {
            assert_eq!(icrc_holds(&out), Some(false), "ICRC broken");
            assert_eq!(udp_sum(&out, &p), 0xffff, "UDP checksum still true");
            let pkey_at = p.bth_at() + 2;
            assert_eq!(out[pkey_at..pkey_at + 2], [0, 0], "P_Key made invalid");
            let check = p.bth_at() - 8 + 6..p.bth_at() - 8 + 8;
            let icrc = input.len() - 4..input.len();
            for (i, (a, b)) in input.iter().zip(&out).enumerate() {
                assert!(
                    a == b
                        || check.contains(&i)
                        || icrc.contains(&i)
                        || (pkey_at..pkey_at + 2).contains(&i),
                    "byte {i} changed"
                );
            }
            // A second refusing port leaves it as it is.
            let (v, r, again) = run(&filter, direction, &out);
            assert_eq!((v, r), (Verdict::Corrupt, Reason::PkeyViolation), "again");
            assert_eq!(again.as_deref(), Some(&out[..]), "left as it is");
        }
    }
    let v1 = Packet::rc(0x8002, 0x100).as_v1().bytes();
    assert_eq!(run(&filter, Direction::Inbound, &v1).0, Verdict::Drop);
}
