//! P_Key stamping in the kernel (BPF_PROG_TEST_RUN, veth pairs): the TC
//! egress program gives every frame no rdma_rxe QP sent the port's default
//! P_Key (or drops it), whatever it names; the XDP program writes 0xFFFF
//! back into what it passes, each with a valid ICRC and UDP checksum; the
//! counters say which outcome each frame had, as the host-side decision
//! predicts. A QP's own frames need rdma_rxe (the soft-RoCE guest); here
//! the host decision is checked for them.

use crate::common;

use common::{
    cases::{QPA, QPB, UD, UD_LIMITED},
    stamping::*,
};
use std::time::Duration;

use aya::programs::XdpMode;
use pkeyfw::{
    loading::filter::{Egress, Filter},
    policy::Policy,
};
use pkeyfw_common::{
    Reason, Stamp,
    stamp::{self, Action, Origin},
};
use pkeyfw_testkit::{
    netns::{VethPair, capture_during, in_netns, send},
    wire::{Packet, icrc_of},
};
use proptest::{collection::vec, prelude::*, test_runner::TestRunner};

/// Payload sizes: empty, odd (the ICRC then sits at an odd checksum offset),
/// an MTU's worth, and 4096 (an IB MTU).
const PAYLOADS: [usize; 4] = [0, 1, 1000, 4096];
/// The same through the egress program, whose BPF_PROG_TEST_RUN takes one
/// page of linear skb data at most: 3400 stands in for 4096.
const EGRESS_PAYLOADS: [usize; 4] = [0, 1, 1000, 3400];

/// Runs `frame` through the egress program: the output (`None`: dropped),
/// and the one stamping counter that moved (none when stamping is off).
fn egress(filter: &Filter, frame: &[u8]) -> (Option<Vec<u8>>, Option<Stamp>) {
    let before = filter.maps().stamps().unwrap();
    let out = filter.run_egress(frame).expect("run egress");
    (out, moved(before, filter.maps().stamps().unwrap()))
}

fn moved(before: [u64; Stamp::COUNT], after: [u64; Stamp::COUNT]) -> Option<Stamp> {
    let changed: Vec<Stamp> = Stamp::ALL
        .into_iter()
        .filter(|s| after[s.index() as usize] != before[s.index() as usize])
        .collect();
    match changed[..] {
        [] => None,
        [s] if after[s.index() as usize] == before[s.index() as usize] + 1 => Some(s),
        _ => panic!("stamping counters moved by more than one frame: {changed:?}"),
    }
}

/// What the host-side decision says of `frame` from `origin`.
fn predicted(policy: &Policy, frame: &[u8], origin: Origin) -> Option<(Stamp, Option<u16>)> {
    stamp::egress(frame, policy, &policy.config(), || origin).map(|e| match e {
        Action::Rewrite(plan, s) => (s, Some(plan.new)),
        Action::Leave(s) | Action::Drop(s) => (s, None),
    })
}

/// Frames as a QP sends them (UD from `src_qp`, or RC) with P_Key `pkey`.
fn ud_from(src_qp: u32, pkey: u16) -> Packet {
    Packet {
        src_qp,
        ..Packet::ud(pkey, 0x99, 0x1111_1111)
    }
}

/// Outgoing frames from no QP (a process's socket: BPF_PROG_TEST_RUN's
/// dummy socket is none of rdma_rxe's), the P_Key each must leave with and
/// the counter it moves. Naming a bound QP claims nothing.
fn egress_cases() -> Vec<(&'static str, Packet, u16, Stamp)> {
    let mut tcp = Packet::rc(0xffff, TO_QPD_AT_PEER);
    tcp.ip_proto = 6;
    let mut bad_version = ud_from(UD, 0x8001);
    bad_version.tver = 1;
    vec![
        (
            "UD naming a bound QP",
            ud_from(UD, 0xffff),
            0xffff,
            Stamp::Unbound,
        ),
        (
            "UD naming a bound QP, IPv6",
            ud_from(UD, 0xffff).over_v6(vec![]),
            0xffff,
            Stamp::Unbound,
        ),
        (
            "UD naming a bound QP, its key",
            ud_from(UD, 0x8001),
            0xffff,
            Stamp::Defaulted,
        ),
        (
            "UD naming a limited QP, its key, IPv6",
            ud_from(UD_LIMITED, 0x0003).over_v6(vec![]),
            0xffff,
            Stamp::Defaulted,
        ),
        (
            "RC to a peer",
            Packet::rc(0xffff, TO_QPD_AT_PEER),
            0xffff,
            Stamp::Unbound,
        ),
        (
            "UD naming an unbound QP, forged key",
            ud_from(UNBOUND_QP, 0x8002),
            0xffff,
            Stamp::Defaulted,
        ),
        (
            "RC, forged key",
            Packet::rc(0x8003, TO_QPB_ANYWHERE),
            0xffff,
            Stamp::Defaulted,
        ),
        (
            "from QP1",
            Packet {
                src_qp: 1,
                ..Packet::ud(0xffff, 1, 0x8001_0000)
            },
            0xffff,
            Stamp::Forged,
        ),
        (
            "from QP1 to another QP, a key of the table",
            Packet {
                src_qp: 1,
                ..Packet::ud(0x8001, 0x99, 0x8001_0000)
            },
            0x8001,
            Stamp::Forged,
        ),
        (
            "to QP1, a key not in the table",
            Packet::ud(0x8007, 1, 0x8001_0000),
            0x8007,
            Stamp::Forged,
        ),
        (
            "to QP0, the limited twin of a full key",
            Packet::ud(0x0002, 0, 0),
            0x0002,
            Stamp::Forged,
        ),
        (
            "a transport header version no RoCE stack sends",
            bad_version,
            0x8001,
            Stamp::Malformed,
        ),
        ("TCP", tcp, 0xffff, Stamp::NotRoce),
        (
            "RoCE v1",
            ud_from(UD, 0xffff).as_v1(),
            0xffff,
            Stamp::NotRoce,
        ),
    ]
}

/// The host decision for frames rdma_rxe says a QP sent: a bound QP's
/// frames carry its key (to QP1 too), an unbound one's the default, QP1's
/// own keep a key of the table or get the default one; the kernel side
/// needs rxe (the guest's stamping scenarios).
#[test]
fn a_qps_frames_carry_its_own_key() {
    let policy = stamping_policy();
    let cases = [
        (
            "UD, bound",
            UD,
            ud_from(UD, 0xffff),
            (Stamp::Stamped, Some(0x8001)),
        ),
        (
            "UD, limited",
            UD_LIMITED,
            ud_from(UD_LIMITED, 0xffff),
            (Stamp::Stamped, Some(0x0003)),
        ),
        (
            "already stamped",
            UD,
            ud_from(UD, 0x8001),
            (Stamp::Unchanged, None),
        ),
        // What a frame names is not who sends it: QP UD's key, whatever
        // the DETH says.
        (
            "UD naming another QP",
            UD,
            ud_from(UD_LIMITED, 0xffff),
            (Stamp::Stamped, Some(0x8001)),
        ),
        (
            "RC, bound",
            QPA,
            Packet::rc(0xffff, TO_QPB_ANYWHERE),
            (Stamp::Stamped, Some(0x8001)),
        ),
        (
            "RC, unbound",
            UNBOUND_QP,
            Packet::rc(0x8003, TO_QPB_ANYWHERE),
            (Stamp::Defaulted, Some(0xffff)),
        ),
        (
            "QP1, a key of the table",
            1,
            Packet {
                src_qp: 1,
                ..Packet::ud(0x8001, 1, 0x8001_0000)
            },
            (Stamp::Management, None),
        ),
        // Held back, rxe would send it again and again: the default key.
        (
            "QP1, a key not in the table",
            1,
            Packet {
                src_qp: 1,
                ..Packet::ud(0x8007, 1, 0x8001_0000)
            },
            (Stamp::Defaulted, Some(0xffff)),
        ),
        // A tenant's UD QP sending to QP1: its own key, as any of its frames.
        (
            "UD to QP1",
            UD,
            Packet {
                src_qp: UD,
                ..Packet::ud(0xffff, 1, 0x8001_0000)
            },
            (Stamp::Stamped, Some(0x8001)),
        ),
    ];
    for (name, qp, p, expected) in cases {
        let input = frame(&p, true);
        assert_eq!(
            predicted(&policy, &input, Origin::Qp(qp)),
            Some(expected),
            "{name}"
        );
    }
}

#[test]
fn egress_gives_a_process_the_default_pkey() {
    let policy = stamping_policy();
    let filter = common::filter(&policy);
    for (name, template, pkey, outcome) in egress_cases() {
        for len in EGRESS_PAYLOADS {
            for checksum in [false, true] {
                let p = Packet {
                    payload: (0..len).map(|i| (i * 7 + len) as u8).collect(),
                    ..template.clone()
                };
                let what = format!("{name}, {len} bytes, checksum {checksum}");
                let input = frame(&p, checksum);
                let (out, counted) = egress(&filter, &input);
                assert_eq!(counted, Some(outcome), "{what}: counter");
                assert_eq!(
                    predicted(&policy, &input, Origin::Other).map(|(s, _)| s),
                    Some(outcome),
                    "{what}: host"
                );
                match outcome {
                    Stamp::Defaulted => {
                        check_rewritten(&what, &p, &input, &out.expect("sent"), pkey)
                    }
                    Stamp::Forged | Stamp::Malformed => assert_eq!(out, None, "{what}: sent"),
                    _ => assert!(out.as_ref() == Some(&input), "{what}: changed"),
                }
            }
        }
    }
}

#[test]
fn without_stamping_nothing_changes_or_counts() {
    let mut policy = stamping_policy();
    policy.stamp = false;
    let filter = common::filter(&policy);
    for (name, p, _, _) in egress_cases() {
        let input = frame(&p, true);
        assert_eq!(
            egress(&filter, &input),
            (Some(input.clone()), None),
            "{name}: egress"
        );
        assert_eq!(filter.run_out(&input).unwrap().1, input, "{name}: ingress");
    }
    assert_eq!(filter.maps().stamps().unwrap(), [0; Stamp::COUNT]);
    assert!(!filter.maps().stamping().unwrap());
}

#[test]
fn ingress_restores_the_default_pkey_of_passed_frames() {
    let policy = stamping_policy();
    let filter = common::filter(&policy);
    assert!(filter.maps().stamping().unwrap());
    for len in PAYLOADS {
        for checksum in [false, true] {
            let what = format!("{len} bytes, checksum {checksum}");
            let p = Packet {
                payload: vec![0x5a; len],
                ..Packet::rc(0x8001, QPA)
            };
            let input = frame(&p, checksum);
            let before = filter.maps().stamps().unwrap();
            assert_eq!(
                filter.run_counted(&input).unwrap(),
                (true, Reason::Ok),
                "{what}"
            );
            assert_eq!(
                moved(before, filter.maps().stamps().unwrap()),
                Some(Stamp::Restored),
                "{what}"
            );
            let (pass, out) = filter.run_out(&input).unwrap();
            assert!(pass, "{what}");
            check_rewritten(&what, &p, &input, &out, 0xffff);
        }
    }
    // Two limited members: dropped on the stamped value, not rewritten.
    let limited = frame(&Packet::rc(0x0001, QPB), true);
    assert_eq!(
        filter.run_counted(&limited).unwrap(),
        (false, Reason::PkeyViolation)
    );
    assert_eq!(filter.run_out(&limited).unwrap(), (false, limited.clone()));
    // Already the default: nothing to do.
    let default = frame(&Packet::ud(0xffff, 1, 0x8001_0000), true);
    assert_eq!(filter.run_out(&default).unwrap(), (true, default.clone()));
}

/// Sends a UD frame naming the bound QP, with another partition's key, out
/// of `pair.a` (a packet socket: no QP's): the P_Key `pair.b` sees.
fn pkey_on_the_wire(pair: &VethPair) -> u16 {
    let p = ud_from(UD, 0x8002);
    let (sent, got) = capture_during(&pair.ns_b, &pair.b, Duration::from_millis(300), || {
        send(&pair.ns_a, &pair.a, &[p.bytes()])
    })
    .expect("capture");
    sent.expect("send");
    let (l3, udp, bth) = offsets(&p);
    match &got[..] {
        [f] => {
            let end = f.len() - 4;
            let icrc = u32::from_le_bytes(f[end..].try_into().unwrap());
            assert_eq!(icrc, icrc_of(&f[..end], l3, udp, bth), "ICRC on the wire");
            u16::from_be_bytes([f[bth + 2], f[bth + 3]])
        }
        _ => panic!("expected one frame, captured {}", got.len()),
    }
}

/// Both hooks on a real interface: stamping while attached, in the
/// foreground and pinned, and nothing left after detaching or removing pins.
#[test]
fn egress_hooks_attach_pin_and_detach() {
    let _root = common::pins_root();
    common::require_root();
    for (i, how) in [Egress::Tcx, Egress::Clsact].into_iter().enumerate() {
        let pair = VethPair::create(&format!("pks{}{i}", std::process::id() % 10000)).unwrap();
        let pins = common::pins(&pair.ns_a, &pair.a);
        let _unpin = common::Unpin(common::pins(&pair.ns_a, &pair.a));
        in_netns(&pair.ns_a, || {
            let mut filter = Filter::load_pinned(0, &{
                pins.create().unwrap();
                pins.dir.clone()
            })
            .unwrap();
            filter.apply(&stamping_policy()).unwrap();
            filter.attach(&pair.a, XdpMode::Skb).unwrap();
            filter.attach_egress(&pair.a, how).unwrap();
            assert_eq!(pkey_on_the_wire(&pair), 0xffff, "{how:?}: attached");
            filter.detach().unwrap();
            assert_eq!(pkey_on_the_wire(&pair), 0x8002, "{how:?}: detached");

            filter.attach(&pair.a, XdpMode::Skb).unwrap();
            filter.attach_egress(&pair.a, how).unwrap();
            filter.pin_link(&pins).unwrap();
            drop(filter);
            assert_eq!(pkey_on_the_wire(&pair), 0xffff, "{how:?}: pinned");
            pins.remove().unwrap();
            assert_eq!(pkey_on_the_wire(&pair), 0x8002, "{how:?}: pins removed");
        })
        .unwrap();
    }
}

/// A clsact stamper that no link holds (kernels before 6.6; here forced)
/// is deleted by the attachment that replaces it: left in place it would
/// go on rewriting frames from maps nobody updates. Here the old one
/// stamps and the new one does not, so a frame shows which ran.
#[test]
fn a_replacing_filter_deletes_the_clsact_stamper_it_replaces() {
    let _root = common::pins_root();
    common::require_root();
    let pair = VethPair::create(&common::tag("pkr")).unwrap();
    let pins = common::pins(&pair.ns_a, &pair.a);
    let _unpin = common::Unpin(common::pins(&pair.ns_a, &pair.a));
    in_netns(&pair.ns_a, || {
        let index = pkeyfw::host::netlink::if_index(&pair.a).unwrap();
        let stampers = || {
            pkeyfw::host::netlink::bpf_filters(
                index,
                0xffff_fff3, // clsact egress
                pkeyfw::loading::programs::STAMP_PROGRAM,
            )
            .unwrap()
        };
        pins.create().unwrap();
        let mut old = Filter::load_pinned(0, &pins.dir).unwrap();
        old.apply(&stamping_policy()).unwrap();
        old.attach(&pair.a, XdpMode::Skb).unwrap();
        old.attach_egress(&pair.a, Egress::Clsact).unwrap();
        old.pin_link(&pins).unwrap();
        drop(old); // as a crash leaves it: the clsact filter stays
        assert_eq!(pkey_on_the_wire(&pair), 0xffff, "the old stamper runs");
        let [was] = stampers()[..] else {
            panic!("one clsact stamper expected: {:?}", stampers())
        };

        let mut new = common::filter(&Policy {
            stamp: false,
            ..stamping_policy()
        });
        new.replacing(index).unwrap();
        new.attach_egress(&pair.a, Egress::Clsact).unwrap();
        let both = stampers();
        assert_eq!(both.len(), 2, "{both:?}");
        assert!(
            both.iter()
                .all(|f| f.prog_id == was.prog_id || f.priority > was.priority),
            "the new filter runs after the old: {both:?}"
        );
        new.remove_replaced().unwrap();
        let left = stampers();
        assert!(
            matches!(left[..], [f] if f.prog_id != was.prog_id),
            "only the new stamper is left: {left:?}"
        );
        assert_eq!(
            pkey_on_the_wire(&pair),
            0x8002,
            "the new, non-stamping filter alone"
        );
        new.detach().unwrap();
    })
    .unwrap();
}

/// Random bound and unbound frames, out through egress and in through the
/// XDP program under the same policy: every passed frame ends with 0xFFFF
/// and a valid ICRC and checksum.
#[test]
fn egress_then_ingress_ends_with_the_default_pkey() {
    let policy = stamping_policy();
    let filter = common::filter(&policy);
    let senders = prop_oneof![Just(UD), Just(UD_LIMITED), Just(UNBOUND_QP), Just(1)];
    let keys = prop_oneof![Just(0xffffu16), Just(0x8001), Just(0x0001), Just(0x8002)];
    let strategy = (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        senders,
        keys,
        prop_oneof![Just(QPA), Just(QPB), Just(UD), Just(UD_LIMITED), Just(1u32)],
        vec(any::<u8>(), 0..=1200),
    );
    let mut runner = TestRunner::new(proptest::test_runner::Config::with_cases(512));
    runner
        .run(
            &strategy,
            |(ud, v6, checksum, src_qp, pkey, dest_qp, payload)| {
                let mut p = if ud {
                    Packet {
                        src_qp,
                        ..Packet::ud(pkey, dest_qp, 0x1111_1111)
                    }
                } else {
                    Packet::rc(pkey, dest_qp)
                };
                p.payload = payload;
                if ud && src_qp == 1 {
                    p.qkey = 0x8001_0000;
                }
                if v6 {
                    p = p.over_v6(vec![]);
                }
                let input = frame(&p, checksum);
                // No QP sends here: only management frames are dropped on
                // the way out, the rest leave with the default key.
                let (wire, _) = egress(&filter, &input);
                let management = dest_qp <= 1 || (ud && src_qp <= 1);
                let Some(wire) = wire else {
                    prop_assert!(management);
                    return Ok(());
                };
                prop_assert!(!management);
                prop_assert_eq!(&wire[p.bth_at() + 2..p.bth_at() + 4], &[0xff, 0xff]);
                let (pass, out) = filter.run_out(&wire).unwrap();
                if pass {
                    let (l3, udp, bth) = offsets(&p);
                    prop_assert_eq!(&out[bth + 2..bth + 4], &[0xff, 0xff]);
                    let end = out.len() - 4;
                    let icrc = u32::from_le_bytes(out[end..].try_into().unwrap());
                    prop_assert_eq!(icrc, icrc_of(&out[..end], l3, udp, bth));
                    if checksum {
                        prop_assert_eq!(udp_sum(&out, &p), 0xffff);
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}

/// Sends each payload from a UDP socket of an unprivileged user (uid and gid
/// 65534, no groups) in namespace `ns` to `to`.
fn send_unprivileged(ns: &str, to: std::net::SocketAddr, payloads: &[Vec<u8>]) {
    in_netns(ns, || {
        // The raw system calls change this thread's credentials only (libc's
        // wrappers would change every thread of the test process).
        // SAFETY: plain credential system calls on the calling thread.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
        }
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
        for p in payloads {
            socket.send_to(p, to).expect("send");
        }
    })
    .expect("in the sender's namespace");
}

/// A veth pair, A 192.0.2.1 and B 192.0.2.2.
fn addressed_pair(prefix: &str) -> VethPair {
    let pair = VethPair::create(&common::tag(prefix)).unwrap();
    for (ns, dev, addr) in [
        (&pair.ns_a, &pair.a, "192.0.2.1/24"),
        (&pair.ns_b, &pair.b, "192.0.2.2/24"),
    ] {
        common::succeed(
            std::process::Command::new("ip").args(["-n", ns, "addr", "add", addr, "dev", dev]),
        );
    }
    pair
}

/// (destination QP, P_Key) of the RoCE frames among `frames`.
fn roce_keys(frames: &[Vec<u8>]) -> Vec<(u32, u16)> {
    frames
        .iter()
        .filter_map(|f| {
            pkeyfw_common::parse::classify(&f[..])
                .roce()
                .map(|r| (r.dest_qp(), r.pkey()))
        })
        .collect()
}

/// An unprivileged local user with a UDP socket writes BTHs by hand, with
/// stamping on at its host's egress: it cannot claim a bound QP (and so its
/// partition) by naming it, nor keep a key of the port's table by posing as
/// QP1 (such a frame does not leave); every key it writes leaves as the
/// port's default P_Key.
#[test]
fn forged_pkeys_from_a_udp_socket_do_not_leave_the_host() {
    common::require_root();
    let pair = addressed_pair("pkf");
    let roce = |p: Packet| {
        let bytes = p.bytes();
        bytes[p.bth_at()..].to_vec()
    };
    let claims_bound_qp = Packet {
        src_qp: UD, // bound to 0x8001
        ..Packet::ud(0xffff, 0x99, 0x1111_1111)
    };
    let forged = Packet {
        src_qp: UNBOUND_QP,
        ..Packet::ud(0x8002, 0x99, 0x1111_1111)
    };
    let forged_rc = Packet::rc(0x8003, 0x99);
    let forged_management = Packet::ud(0x8007, 1, 0x8001_0000);
    // Posing as QP1 with a key the port holds, to another tenant's QP.
    let poses_as_qp1 = Packet {
        src_qp: 1,
        ..Packet::ud(0x8001, 0x99, 0x0123_4567)
    };
    let payloads = [
        claims_bound_qp,
        forged,
        forged_rc,
        forged_management,
        poses_as_qp1,
    ]
    .map(roce);
    in_netns(&pair.ns_b, || {
        let mut filter = Filter::load(0).unwrap();
        filter.apply(&stamping_policy()).unwrap();
        filter.attach_egress(&pair.b, Egress::Auto).unwrap();
        let (_, got) = capture_during(&pair.ns_a, &pair.a, Duration::from_millis(500), || {
            send_unprivileged(&pair.ns_b, "192.0.2.1:4791".parse().unwrap(), &payloads)
        })
        .expect("capture");
        let seen = roce_keys(&got);
        assert_eq!(
            seen,
            [(0x99, 0xffff), (0x99, 0xffff), (0x99, 0xffff)],
            "P_Keys that left the host: a process's frames carry the default key only, and its management frames none"
        );
        let stamps = filter.maps().stamps().unwrap();
        assert_eq!(stamps[Stamp::Defaulted.index() as usize], 2);
        assert_eq!(stamps[Stamp::Unbound.index() as usize], 1);
        assert_eq!(stamps[Stamp::Forged.index() as usize], 2);
        assert_eq!(stamps[Stamp::Management.index() as usize], 0);
        assert_eq!(stamps[Stamp::Stamped.index() as usize], 0);
    })
    .unwrap();
}

/// A process's datagram that waits for its neighbour (ARP unresolved) still
/// leaves after the process closed its socket, which by then has no UDP
/// port, as rdma_rxe's sockets have none: it must claim no QP. The far end
/// ignores ARP for a moment (`arp_ignore = 8`), the unprivileged sender
/// sends a UD frame naming the bound QP and closes its socket, then the far
/// end answers: the frame leaves with the default key, not the QP's.
#[test]
fn a_closed_sockets_frame_waiting_for_arp_claims_no_qp() {
    common::require_root();
    let pair = addressed_pair("pka");
    let arp_ignore = |value: u8| {
        common::succeed(std::process::Command::new("ip").args([
            "netns",
            "exec",
            &pair.ns_a,
            "sysctl",
            "-qw",
            &format!("net.ipv4.conf.{}.arp_ignore={value}", pair.a),
        ]));
    };
    let names_bound_qp = ud_from(UD, 0xffff);
    let payload = names_bound_qp.bytes()[names_bound_qp.bth_at()..].to_vec();
    in_netns(&pair.ns_b, || {
        let mut filter = Filter::load(0).unwrap();
        filter.apply(&stamping_policy()).unwrap();
        filter.attach_egress(&pair.b, Egress::Auto).unwrap();
        arp_ignore(8);
        let (_, got) = capture_during(&pair.ns_a, &pair.a, Duration::from_secs(2), || {
            // The socket is closed when this returns; its frame waits.
            send_unprivileged(
                &pair.ns_b,
                "192.0.2.1:4791".parse().unwrap(),
                std::slice::from_ref(&payload),
            );
            std::thread::sleep(Duration::from_millis(300));
            arp_ignore(0);
        })
        .expect("capture");
        let seen = roce_keys(&got);
        assert_eq!(
            seen,
            [(0x99, 0xffff)],
            "a closed socket's frame must leave with the default key"
        );
        let stamps = filter.maps().stamps().unwrap();
        assert_eq!(stamps[Stamp::Unbound.index() as usize], 1, "{stamps:?}");
        assert_eq!(stamps[Stamp::Stamped.index() as usize], 0, "{stamps:?}");
    })
    .unwrap();
}
