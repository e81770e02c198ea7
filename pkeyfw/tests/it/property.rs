//! Random policies and random frames: the kernel's verdict must equal the
//! host's, frame for frame. The frames are built near RoCE (the interesting
//! space) and then mutated and cut, to reach every parser path.

use crate::common;

use std::{collections::BTreeMap, net::IpAddr};

use pkeyfw::policy::{Group, Policy, QpRule};
use pkeyfw_common::{
    abi::{QpType, UnknownQp, qp_flags},
    judge,
    verdict::{GSI_QKEY, MULTICAST_QPN},
};
use pkeyfw_testkit::wire::{Ext, Net, Packet};
use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};

/// A small partition space, so that matches and mismatches are both common.
fn pkey() -> impl Strategy<Value = u16> {
    (any::<bool>(), 0u16..5).prop_map(|(full, key)| if full { 0x8000 | key } else { key })
}

fn qkey() -> impl Strategy<Value = u32> {
    prop_oneof![Just(GSI_QKEY), 0u32..4, any::<u32>()]
}

const GROUPS: [&str; 4] = ["ff12:401b::1", "ff0e::2", "239.1.1.1", "224.0.0.9"];

fn policy() -> impl Strategy<Value = Policy> {
    let table =
        proptest::collection::btree_set(pkey().prop_filter("valid", |p| p & 0x7fff != 0), 1..6)
            .prop_shuffle_vec();
    (table, any::<bool>(), 0usize..3)
        .prop_flat_map(|(pkeys, monitor, rule)| {
            let n = pkeys.len();
            let qps = proptest::collection::btree_map(2u32..24, (0usize..4, 0..n, qkey()), 0..12);
            let groups = proptest::collection::vec((0..GROUPS.len(), 0..n, qkey()), 0..4);
            (Just(pkeys), Just(monitor), Just(rule), qps, groups)
        })
        .prop_map(|(pkeys, monitor, rule, qps, groups)| {
            let qps: BTreeMap<u32, QpRule> = qps
                .into_iter()
                .map(|(qpn, (t, i, q))| {
                    let qp_type = QpType::ALL[t];
                    // Some UD QPs are bound with their own Q_Key and have
                    // set none yet: they accept no UD frame.
                    let unset = qp_type == QpType::Ud && q % 5 == 0;
                    let qkey = (qp_type == QpType::Ud && !unset).then_some(q);
                    let flags = if unset {
                        qp_flags::RULE | qp_flags::OWN_QKEY
                    } else {
                        0
                    };
                    (
                        qpn,
                        QpRule {
                            qp_type,
                            pkey: pkeys[i],
                            qkey,
                            flags,
                        },
                    )
                })
                .collect();
            let groups = groups
                .into_iter()
                .map(|(g, i, qkey)| {
                    let addr: IpAddr = GROUPS[g].parse().unwrap();
                    (
                        Group::key_addr(addr),
                        Group {
                            addr,
                            pkey: pkeys[i],
                            qkey,
                        },
                    )
                })
                .collect();
            Policy {
                monitor,
                unknown_qp: UnknownQp::ALL[rule],
                qps,
                groups,
                ..Policy::with_table(pkeys)
            }
        })
}

/// `btree_set` gives sorted keys; a real table is in any order.
trait ShuffleVec {
    fn prop_shuffle_vec(self) -> BoxedStrategy<Vec<u16>>;
}

impl<S: Strategy<Value = std::collections::BTreeSet<u16>> + 'static> ShuffleVec for S {
    fn prop_shuffle_vec(self) -> BoxedStrategy<Vec<u16>> {
        self.prop_map(|s| s.into_iter().collect::<Vec<_>>())
            .prop_shuffle()
            .boxed()
    }
}

fn ext() -> impl Strategy<Value = Ext> {
    prop_oneof![
        (prop::sample::select(vec![0u8, 43, 60]), 0u8..3)
            .prop_map(|(kind, units)| Ext::Options { kind, units }),
        (0u8..4).prop_map(|words| Ext::Ah { words }),
        (prop_oneof![Just(0u16), 0u16..4], any::<bool>())
            .prop_map(|(offset, more)| Ext::Fragment { offset, more }),
    ]
}

fn packet() -> impl Strategy<Value = Packet> {
    let opcode = prop_oneof![
        4 => prop::sample::select(vec![0x04u8, 0x00, 0x0a, 0x11, 0x24, 0x2a, 0x64, 0x65, 0x81, 0xa4, 0xb1]),
        1 => any::<u8>(),
    ];
    let dest_qp = prop_oneof![
        6 => 2u32..24,
        1 => Just(0u32),
        2 => Just(1u32),
        2 => Just(MULTICAST_QPN),
        1 => any::<u32>().prop_map(|q| q & 0xff_ffff),
    ];
    let net = prop_oneof![
        3 => (0u8..4, prop_oneof![4 => Just(0u16), 1 => 0u16..3], prop_oneof![4 => Just(false), 1 => Just(true)], 0..GROUPS.len(), any::<bool>())
            .prop_map(|(options, frag_offset, more_fragments, g, to_group)| Net::V4 {
                src: [192, 0, 2, 1].into(),
                dst: if to_group && GROUPS[g].contains('.') { GROUPS[g].parse().unwrap() } else { [192, 0, 2, 2].into() },
                options,
                frag_offset,
                more_fragments,
            }),
        2 => (proptest::collection::vec(ext(), 0..6), 0..GROUPS.len()).prop_map(|(ext, g)| Net::V6 {
            src: "2001:db8::1".parse().unwrap(),
            dst: GROUPS[g].parse().unwrap_or("2001:db8::2".parse().unwrap()),
            ext,
        }),
        1 => (prop_oneof![4 => Just(0x1bu8), 1 => any::<u8>()], 0..GROUPS.len()).prop_map(|(next_header, g)| Net::V1 {
            sgid: "fe80::1".parse().unwrap(),
            dgid: GROUPS[g].parse().unwrap_or("fe80::2".parse().unwrap()),
            next_header,
        }),
    ];
    let vlans = proptest::collection::vec(prop::sample::select(vec![0x8100u16, 0x88a8]), 0..4);
    let l4 = (
        prop_oneof![8 => Just(17u8), 1 => Just(6u8), 1 => any::<u8>()],
        prop_oneof![8 => Just(4791u16), 1 => any::<u16>()],
        prop_oneof![8 => Just(0u8), 1 => 1u8..16],
    );
    // Now and then about the longest RoCE packet, on either side of it.
    let payload = prop_oneof![16 => 0usize..64, 1 => 4100usize..4260];
    (vlans, net, l4, opcode, pkey(), dest_qp, qkey(), payload).prop_map(
        |(vlans, net, (ip_proto, udp_dport, tver), opcode, pkey, dest_qp, qkey, payload)| Packet {
            vlans,
            net,
            ip_proto,
            udp_dport,
            opcode,
            tver,
            pkey,
            dest_qp,
            qkey,
            src_qp: 7,
            payload: vec![0x5a; payload],
        },
    )
}

/// A built frame, maybe with a byte overwritten and maybe cut short.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    (
        packet(),
        prop::option::weighted(0.15, (any::<prop::sample::Index>(), any::<u8>())),
        prop::option::weighted(0.15, any::<prop::sample::Index>()),
    )
        .prop_map(|(p, flip, cut)| {
            let mut f = p.bytes();
            if let Some((at, byte)) = flip {
                let i = at.index(f.len());
                f[i] = byte;
            }
            if let Some(at) = cut {
                f.truncate(14 + at.index(f.len() - 14));
            }
            f
        })
}

#[test]
fn kernel_verdicts_equal_host_verdicts() {
    common::require_root();
    let filter = std::cell::RefCell::new(pkeyfw::loading::filter::Filter::load(64).expect("load"));
    let mut runner = TestRunner::new(Config {
        cases: 192,
        failure_persistence: None,
        ..Config::default()
    });
    let reasons_seen = std::cell::RefCell::new(std::collections::BTreeSet::new());
    runner
        .run(
            &(policy(), proptest::collection::vec(frame(), 48)),
            |(policy, frames)| {
                let mut filter = filter.borrow_mut();
                filter.apply(&policy).expect("apply");
                for f in &frames {
                    let host = judge(&f[..], &policy, &policy.config());
                    let (pass, reason) = filter.run_counted(f).expect("run");
                    prop_assert_eq!(
                        (reason, pass),
                        (host.reason, host.pass),
                        "frame {:02x?}\npolicy {:?}",
                        f,
                        policy
                    );
                    reasons_seen.borrow_mut().insert(reason);
                }
                Ok(())
            },
        )
        .unwrap();
    // The generators must reach every reason a host port gives, or the
    // property says little (unlisted_port is a switch port's).
    let seen = reasons_seen.into_inner();
    assert_eq!(
        seen.len(),
        pkeyfw_common::Reason::COUNT - 1,
        "reached only {seen:?}"
    );
}

/// The kernel's inline parse of plain frames (at most one VLAN tag, IPv6
/// without extension headers) answers as the full walk does wherever it
/// answers (RoCE, with the same headers, or not RoCE), and answers for
/// every plain frame the walk does not find malformed.
#[test]
fn the_plain_parse_agrees_with_the_full_walk() {
    use pkeyfw_common::parse::{Class, Parsed, Plain, classify, plain};
    let mut runner = parse_runner();
    let answered = std::cell::Cell::new(0);
    runner
        .run(&(packet(), frame()), |(p, mutated)| {
            for f in [p.bytes(), mutated] {
                let full = classify(&f[..]);
                let inline = match plain(&f[..]) {
                    Plain::Roce(roce) => Parsed::of(roce),
                    Plain::NotRoce => Parsed::NOT_ROCE,
                    Plain::Walk => continue,
                };
                prop_assert_eq!(inline, full, "frame {:02x?}", f);
                answered.set(answered.get() + 1);
            }
            // (An upper protocol with an extension header's number is
            // one too.)
            let extension = |proto: u8| matches!(proto, 0 | 43 | 44 | 51 | 60);
            let shape = p.vlans.len() <= 1
                && p.vlans.first().is_none_or(|&t| t == 0x8100)
                && !matches!(&p.net, Net::V6 { ext, .. } if !ext.is_empty() || extension(p.ip_proto));
            let f = p.bytes();
            prop_assert!(
                !shape || classify(&f[..]).class == Class::Malformed || plain(&f[..]) != Plain::Walk,
                "a plain frame the inline parse leaves to the walk: {:?}",
                p
            );
            Ok(())
        })
        .unwrap();
    // Enough plain frames came, of 8,192, to say so.
    assert!(answered.get() > 1024, "answered {} frames", answered.get());
}

/// The runner of the parses' properties: each case is a parse or two on
/// the host, so many.
fn parse_runner() -> TestRunner {
    TestRunner::new(Config {
        cases: 4096,
        failure_persistence: None,
        ..Config::default()
    })
}

/// A made-up length field: mostly about a RoCE frame's headers' lengths,
/// on either side of them.
fn length() -> impl Strategy<Value = u16> {
    prop_oneof![2 => 0u16..100, 1 => any::<u16>()]
}

/// The fixed-offset parse of the usual RoCE v2 frame (no VLAN tag, IPv4
/// without options or IPv6 without extension headers, not a fragment)
/// reads what the full walk reads wherever it answers, and answers for
/// every such frame the walk reads as RoCE.
#[test]
fn the_fixed_offset_parse_agrees_with_the_full_walk() {
    use pkeyfw_common::parse::{Class, Parsed, classify, fixed};
    let mut runner = parse_runner();
    let answered = std::cell::Cell::new(0);
    runner
        .run(
            &(packet(), frame(), length(), length()),
            |(p, mutated, ip_len, udp_len)| {
                // Its own checks are of lengths: the IP packet's and the UDP
                // datagram's, made up (the network header's length field, then
                // UDP's, where the usual frame has them).
                let mut lengths = p.bytes();
                let (ip_at, udp_at) = match p.net {
                    Net::V6 { .. } => (18, 58),
                    _ => (16, 38),
                };
                if lengths.len() >= udp_at + 2 {
                    lengths[ip_at..ip_at + 2].copy_from_slice(&ip_len.to_be_bytes());
                    lengths[udp_at..udp_at + 2].copy_from_slice(&udp_len.to_be_bytes());
                }
                for f in [p.bytes(), mutated, lengths] {
                    if let Some(roce) = fixed(&f[..]) {
                        prop_assert_eq!(Parsed::of(roce), classify(&f[..]), "frame {:02x?}", f);
                        answered.set(answered.get() + 1);
                    }
                }
                let usual = p.vlans.is_empty()
                    && match &p.net {
                        Net::V4 {
                            options,
                            frag_offset,
                            more_fragments,
                            ..
                        } => *options == 0 && *frag_offset == 0 && !more_fragments,
                        Net::V6 { ext, .. } => ext.is_empty(),
                        Net::V1 { .. } => false,
                    };
                let f = p.bytes();
                prop_assert!(
                    !usual || classify(&f[..]).class != Class::Roce || fixed(&f[..]).is_some(),
                    "a usual RoCE frame the fixed-offset parse leaves to the walk: {:?}",
                    p
                );
                Ok(())
            },
        )
        .unwrap();
    // Of 8,192 frames, most with tags, options or extension headers.
    assert!(answered.get() > 64, "answered {} frames", answered.get());
}
