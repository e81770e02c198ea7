//! The verdict case table: every rule and every reason, with the outcome the
//! InfiniBand specification gives, written out by hand (not computed).
//!
//! As data: each case's policy is TOML text, which pkeyfw's tests parse (the
//! kit does not depend on pkeyfw, so that pkeyfw can depend on the kit).

use std::net::Ipv6Addr;

use pkeyfw_common::{Reason, parse::opcode, verdict::GSI_QKEY};

use crate::wire::{Ext, Net, Packet};

/// The port of the four-QP partition example: QPA 0x8001, QPB and QPC 0x0001, QPD 0x8002,
/// plus UD, XRC and limited-only QPs and two multicast groups.
pub const BASE: &str = r#"
[port]
pkeys = [0xffff, 0x8001, 0x0001, 0x8002, 0x0003]

[enforcement]
mode = "enforce"
unknown_qp = "default-pkey"

[[qp]]
qpn = 0x10
type = "rc"
pkey = 0x8001      # QPA

[[qp]]
qpn = 0x11
type = "rc"
pkey = 0x0001      # QPB

[[qp]]
qpn = 0x12
type = "uc"
pkey_index = 2     # QPC, 0x0001

[[qp]]
qpn = 0x13
type = "rc"
pkey = 0x8002      # QPD

[[qp]]
qpn = 0x20
type = "ud"
pkey = 0x8001
qkey = 0x11111111

[[qp]]
qpn = 0x21
type = "xrc"
pkey = 0x8001

[[qp]]
qpn = 0x22
type = "ud"
pkey = 0x0003
qkey = 0x22222222

[[group]]
addr = "ff12:401b::1"
pkey = 0x8001
qkey = 0x00000b1b

[[group]]
addr = "239.1.1.1"
pkey = 0x0001
qkey = 0x1234

[[group]]
addr = "ff0e::2"
pkey = 0xffff
qkey = 0x5
"#;

pub const QPA: u32 = 0x10;
pub const QPB: u32 = 0x11;
pub const QPC: u32 = 0x12;
pub const QPD: u32 = 0x13;
pub const UD: u32 = 0x20;
pub const XRC: u32 = 0x21;
pub const UD_LIMITED: u32 = 0x22;
pub const UNKNOWN: u32 = 0x99;
pub const MCAST: u32 = 0x00ff_ffff;

/// BASE's first multicast group, its P_Key and its Q_Key (as the TOML says);
/// the bench's policies hold it too.
pub const GROUP: Ipv6Addr = Ipv6Addr::new(0xff12, 0x401b, 0, 0, 0, 0, 0, 1);
pub const GROUP_PKEY: u16 = 0x8001;
pub const GROUP_QKEY: u32 = 0x0b1b;

const RC_SEND: u8 = 0x04;
const UC_SEND: u8 = 0x24;
const XRC_SEND: u8 = 0xa4;

/// One frame under one policy, and what must happen to it.
pub struct Case {
    pub name: String,
    /// The policy, as TOML text.
    pub policy: String,
    pub frame: Vec<u8>,
    pub reason: Reason,
    pub pass: bool,
}

fn base_with(enforcement: &str) -> String {
    BASE.replace(
        "mode = \"enforce\"\nunknown_qp = \"default-pkey\"",
        enforcement,
    )
}

fn mcast_v6(mut p: Packet, dst: Ipv6Addr) -> Packet {
    p.dest_qp = MCAST;
    p = p.over_v6(vec![]);
    if let Net::V6 { dst: d, .. } = &mut p.net {
        *d = dst;
    }
    p
}

fn mcast_v4(mut p: Packet, dst: [u8; 4]) -> Packet {
    p.dest_qp = MCAST;
    if let Net::V4 { dst: d, .. } = &mut p.net {
        *d = dst.into();
    }
    p
}

fn with(mut p: Packet, f: impl FnOnce(&mut Packet)) -> Packet {
    f(&mut p);
    p
}

/// Cases whose verdict path reads no QP entry, so that any policy holding
/// the default P_Key 0xFFFF and [`GROUP`] judges them as the table does: the
/// bench (pkeyfw/benches/kernel/main.rs) times these very frames.
pub mod frames {
    use super::*;

    /// "tcp": not RoCE.
    pub fn tcp() -> Packet {
        with(Packet::rc(0x1234, QPA), |p| p.ip_proto = 6)
    }

    /// "tver 1": malformed.
    pub fn tver_1() -> Packet {
        with(Packet::rc(0x0001, QPA), |p| p.tver = 1)
    }

    /// "smi any pkey": a datagram to QP0, whose P_Key is never checked.
    pub fn smi() -> Packet {
        Packet::ud(0x0004, 0, 0)
    }

    /// "gsi default": to QP1 with the default P_Key and the GSI Q_Key.
    pub fn gsi() -> Packet {
        Packet::ud(0xffff, 1, GSI_QKEY)
    }

    /// "mcast v6": a limited member's UD frame to [`GROUP`], with its Q_Key.
    pub fn group() -> Packet {
        mcast_v6(Packet::ud(0x0001, MCAST, GROUP_QKEY), GROUP)
    }
}

/// Every case.
pub fn all() -> Vec<Case> {
    use Reason::*;
    let base = BASE.to_string();
    let mut cases = Vec::new();
    let mut add = |name: &str, policy: &str, frame: Vec<u8>, reason: Reason, pass: bool| {
        cases.push(Case {
            name: name.to_string(),
            policy: policy.to_string(),
            frame,
            reason,
            pass,
        })
    };

    // Not RoCE.
    let mut arp = Packet::rc(0xffff, QPA).bytes();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    add("arp", &base, arp, NotRoce, true);
    add("tcp", &base, frames::tcp().bytes(), NotRoce, true);
    add(
        "udp 4790",
        &base,
        with(Packet::rc(0x1234, QPA), |p| p.udp_dport = 4790).bytes(),
        NotRoce,
        true,
    );
    add(
        "ipv6 icmp",
        &base,
        with(Packet::rc(0, QPA).over_v6(vec![]), |p| p.ip_proto = 58).bytes(),
        NotRoce,
        true,
    );

    // The four-QP example, sender P_Key to receiving QP.
    let who = [
        ("A", 0x8001, QPA),
        ("B", 0x0001, QPB),
        ("C", 0x0001, QPC),
        ("D", 0x8002, QPD),
    ];
    // Rows: sender; columns: receiver. A↔B, A↔C talk; B↔C do not (both
    // limited); D talks to nobody but itself (another partition).
    let allowed = [
        [true, true, true, false],
        [true, false, false, false],
        [true, false, false, false],
        [false, false, false, true],
    ];
    for (i, (from, pkey, _)) in who.iter().enumerate() {
        for (j, (to, _, qpn)) in who.iter().enumerate() {
            let op = if *qpn == QPC { UC_SEND } else { RC_SEND };
            let ok = allowed[i][j];
            add(
                &format!("four-qp example {from}->{to}"),
                &base,
                Packet::v4(op, *pkey, *qpn, 0).bytes(),
                if ok { Ok } else { PkeyViolation },
                ok,
            );
        }
    }

    // QP0: datagrams only, with no P_Key or Q_Key check.
    add("smi any pkey", &base, frames::smi().bytes(), Smi, true);
    add(
        "smi invalid pkey",
        &base,
        Packet::ud(0x0000, 0, 0x1234).bytes(),
        Smi,
        true,
    );
    add(
        "smi rc",
        &base,
        Packet::rc(0xffff, 0).bytes(),
        OpcodeMismatch,
        false,
    );
    add(
        "smi uc",
        &base,
        Packet::v4(UC_SEND, 0xffff, 0, 0).bytes(),
        OpcodeMismatch,
        false,
    );

    // QP1: any table entry, GSI Q_Key, UD only.
    add("gsi default", &base, frames::gsi().bytes(), Ok, true);
    add(
        "gsi limited vs full entry",
        &base,
        Packet::ud(0x0001, 1, GSI_QKEY).bytes(),
        Ok,
        true,
    );
    add(
        "gsi full vs limited entry",
        &base,
        Packet::ud(0x8003, 1, GSI_QKEY).bytes(),
        Ok,
        true,
    );
    add(
        "gsi limited vs limited entry",
        &base,
        Packet::ud(0x0003, 1, GSI_QKEY).bytes(),
        PkeyViolation,
        false,
    );
    add(
        "gsi no such partition",
        &base,
        Packet::ud(0x8004, 1, GSI_QKEY).bytes(),
        PkeyViolation,
        false,
    );
    add(
        "gsi wrong qkey",
        &base,
        Packet::ud(0xffff, 1, 0x11111111).bytes(),
        QkeyViolation,
        false,
    );
    add(
        "gsi rc opcode",
        &base,
        Packet::rc(0xffff, 1).bytes(),
        OpcodeMismatch,
        false,
    );
    add(
        "gsi cnp",
        &base,
        Packet::v4(opcode::CNP, 0xffff, 1, 0).bytes(),
        OpcodeMismatch,
        false,
    );
    add(
        "gsi pkey before qkey",
        &base,
        Packet::ud(0x8004, 1, 7).bytes(),
        PkeyViolation,
        false,
    );

    // Known QPs: transport, then P_Key, then Q_Key.
    add(
        "uc to rc qp",
        &base,
        Packet::v4(UC_SEND, 0x8001, QPA, 0).bytes(),
        OpcodeMismatch,
        false,
    );
    add(
        "ud to rc qp",
        &base,
        Packet::ud(0x8001, QPA, 0).bytes(),
        OpcodeMismatch,
        false,
    );
    add(
        "rc to xrc qp",
        &base,
        Packet::rc(0x8001, XRC).bytes(),
        OpcodeMismatch,
        false,
    );
    add(
        "xrc to xrc qp",
        &base,
        Packet::v4(XRC_SEND, 0x0001, XRC, 0).bytes(),
        Ok,
        true,
    );
    add(
        "cnp to rc qp",
        &base,
        Packet::v4(opcode::CNP, 0x0001, QPA, 0).bytes(),
        Ok,
        true,
    );
    add(
        "cnp to ud qp",
        &base,
        Packet::v4(opcode::CNP, 0x8001, UD, 0).bytes(),
        Ok,
        true,
    );
    add(
        "cnp wrong pkey",
        &base,
        Packet::v4(opcode::CNP, 0x8002, QPA, 0).bytes(),
        PkeyViolation,
        false,
    );
    add(
        "ud ok",
        &base,
        Packet::ud(0x0001, UD, 0x11111111).bytes(),
        Ok,
        true,
    );
    add(
        "ud imm ok",
        &base,
        Packet::v4(opcode::UD_SEND_ONLY_IMM, 0x8001, UD, 0x11111111).bytes(),
        Ok,
        true,
    );
    add(
        "ud wrong qkey",
        &base,
        Packet::ud(0x8001, UD, 0x11111112).bytes(),
        QkeyViolation,
        false,
    );
    add(
        "ud pkey before qkey",
        &base,
        Packet::ud(0x8002, UD, 0).bytes(),
        PkeyViolation,
        false,
    );
    add(
        "ud limited to limited",
        &base,
        Packet::ud(0x0003, UD_LIMITED, 0x22222222).bytes(),
        PkeyViolation,
        false,
    );
    add(
        "ud full to limited",
        &base,
        Packet::ud(0x8003, UD_LIMITED, 0x22222222).bytes(),
        Ok,
        true,
    );
    add(
        "invalid pkey to qp",
        &base,
        Packet::rc(0x8000, QPA).bytes(),
        PkeyViolation,
        false,
    );

    // Unknown QPs.
    add(
        "unknown default pkey",
        &base,
        Packet::rc(0xffff, UNKNOWN).bytes(),
        UnknownQp,
        true,
    );
    add(
        "unknown limited default",
        &base,
        Packet::rc(0x7fff, UNKNOWN).bytes(),
        UnknownQp,
        true,
    );
    add(
        "unknown other partition",
        &base,
        Packet::rc(0x8001, UNKNOWN).bytes(),
        PkeyViolation,
        false,
    );
    let drop = base_with("unknown_qp = \"drop\"");
    add(
        "unknown rule drop",
        &drop,
        Packet::rc(0xffff, UNKNOWN).bytes(),
        UnknownQp,
        false,
    );
    add(
        "known under drop rule",
        &drop,
        Packet::rc(0x0001, QPA).bytes(),
        Ok,
        true,
    );
    let pass = base_with("unknown_qp = \"pass\"");
    add(
        "unknown rule pass",
        &pass,
        Packet::rc(0x8005, UNKNOWN).bytes(),
        UnknownQp,
        true,
    );
    let limited_default = "[port]\npkeys = [0x7fff]\n".to_string();
    add(
        "unknown limited vs limited default",
        &limited_default,
        Packet::rc(0x7fff, UNKNOWN).bytes(),
        PkeyViolation,
        false,
    );
    add(
        "unknown full vs limited default",
        &limited_default,
        Packet::rc(0xffff, UNKNOWN).bytes(),
        UnknownQp,
        true,
    );

    // Multicast groups.
    let ud = |pkey, qkey| Packet::ud(pkey, MCAST, qkey);
    add("mcast v6", &base, frames::group().bytes(), Ok, true);
    add(
        "mcast v6 wrong qkey",
        &base,
        mcast_v6(ud(0x8001, GROUP_QKEY + 1), GROUP).bytes(),
        QkeyViolation,
        false,
    );
    add(
        "mcast v6 wrong pkey",
        &base,
        mcast_v6(ud(0x8002, GROUP_QKEY), GROUP).bytes(),
        PkeyViolation,
        false,
    );
    add(
        "mcast rc opcode",
        &base,
        mcast_v6(Packet::rc(0x8001, MCAST), GROUP).bytes(),
        OpcodeMismatch,
        false,
    );
    add(
        "mcast v4",
        &base,
        mcast_v4(ud(0x8001, 0x1234), [239, 1, 1, 1]).bytes(),
        Ok,
        true,
    );
    add(
        "mcast v4 limited to limited",
        &base,
        mcast_v4(ud(0x0001, 0x1234), [239, 1, 1, 1]).bytes(),
        PkeyViolation,
        false,
    );
    add(
        "mcast unknown group",
        &base,
        mcast_v6(ud(0xffff, 0), "ff12::99".parse().unwrap()).bytes(),
        UnknownQp,
        true,
    );
    add(
        "mcast unknown group wrong pkey",
        &base,
        mcast_v4(ud(0x8001, 0), [239, 9, 9, 9]).bytes(),
        PkeyViolation,
        false,
    );
    let v1 = with(ud(0xffff, 5).as_v1(), |p| {
        if let Net::V1 { dgid, .. } = &mut p.net {
            *dgid = "ff0e::2".parse().unwrap();
        }
    });
    add("mcast roce v1 dgid", &base, v1.bytes(), Ok, true);
    add(
        "mcast unknown drop rule",
        &drop,
        mcast_v6(ud(0xffff, 0), "ff12::99".parse().unwrap()).bytes(),
        UnknownQp,
        false,
    );

    // Encapsulations that are still RoCE.
    let rc_ok = || Packet::rc(0x0001, QPA);
    add(
        "vlan",
        &base,
        with(rc_ok(), |p| p.vlans = vec![0x8100]).bytes(),
        Ok,
        true,
    );
    add(
        "qinq",
        &base,
        with(rc_ok(), |p| p.vlans = vec![0x88a8, 0x8100]).bytes(),
        Ok,
        true,
    );
    add(
        "double 802.1q",
        &base,
        with(rc_ok(), |p| p.vlans = vec![0x8100, 0x8100]).bytes(),
        Ok,
        true,
    );
    add(
        "ipv4 options",
        &base,
        with(rc_ok(), |p| {
            if let Net::V4 { options, .. } = &mut p.net {
                *options = 10;
            }
        })
        .bytes(),
        Ok,
        true,
    );
    add("ipv6", &base, rc_ok().over_v6(vec![]).bytes(), Ok, true);
    let four = vec![
        Ext::Options { kind: 0, units: 0 },
        Ext::Options { kind: 60, units: 1 },
        Ext::Options { kind: 43, units: 2 },
        Ext::Ah { words: 4 },
    ];
    add(
        "ipv6 four ext headers",
        &base,
        rc_ok().over_v6(four.clone()).bytes(),
        Ok,
        true,
    );
    add("roce v1", &base, rc_ok().as_v1().bytes(), Ok, true);
    let payload = |n: usize| with(rc_ok(), |p| p.payload = vec![0x5a; n]);
    add(
        "the longest roce packet",
        &base,
        payload(4096 + 64).bytes(),
        Ok,
        true,
    );

    // Longer than one RoCE packet can be: an aggregate of several, whose
    // later BTHs would go unjudged.
    add(
        "a datagram longer than any roce packet",
        &base,
        payload(4096 + 65).bytes(),
        Gso,
        false,
    );
    add(
        "ipv6, longer than any roce packet",
        &base,
        payload(8000).over_v6(vec![]).bytes(),
        Gso,
        false,
    );
    add(
        "roce v1, longer than any roce packet",
        &base,
        payload(8000).as_v1().bytes(),
        Gso,
        false,
    );
    add(
        "roce v1 violation",
        &base,
        Packet::rc(0x0001, QPB).as_v1().bytes(),
        PkeyViolation,
        false,
    );

    // Fail closed.
    add(
        "three vlan tags",
        &base,
        with(rc_ok(), |p| p.vlans = vec![0x88a8, 0x8100, 0x8100]).bytes(),
        Malformed,
        false,
    );
    add(
        "three tags hide tcp",
        &base,
        with(rc_ok(), |p| {
            p.vlans = vec![0x8100, 0x8100, 0x8100];
            p.ip_proto = 6;
        })
        .bytes(),
        Malformed,
        false,
    );
    add("tver 1", &base, frames::tver_1().bytes(), Malformed, false);
    for op in [0x40u8, 0x5f, 0x60, 0x66, 0x7f, 0x80, 0x82, 0x9f, 0xc0, 0xff] {
        add(
            &format!("opcode {op:#04x}"),
            &base,
            Packet::v4(op, 0x0001, QPA, 0).bytes(),
            Malformed,
            false,
        );
    }
    let mut no_deth = Packet::ud(0x8001, UD, 0x11111111).bytes();
    no_deth.truncate(no_deth.len() - 16 - 4 - 4); // payload, ICRC, half the DETH
    add("ud without deth", &base, no_deth, Malformed, false);
    add(
        "ipv4 ihl 4",
        &base,
        {
            let mut f = rc_ok().bytes();
            f[14] = 0x44;
            f
        },
        Malformed,
        false,
    );
    let frag = |offset, more| {
        with(rc_ok(), |p| {
            if let Net::V4 {
                frag_offset,
                more_fragments,
                ..
            } = &mut p.net
            {
                *frag_offset = offset;
                *more_fragments = more;
            }
        })
    };
    add(
        "ipv4 first fragment",
        &base,
        frag(0, true).bytes(),
        Malformed,
        false,
    );
    add(
        "ipv4 later fragment",
        &base,
        frag(10, true).bytes(),
        NotRoce,
        true,
    );
    add(
        "ipv4 last fragment",
        &base,
        frag(10, false).bytes(),
        NotRoce,
        true,
    );
    add(
        "ipv4 first fragment other port",
        &base,
        with(frag(0, true), |p| p.udp_dport = 53).bytes(),
        NotRoce,
        true,
    );
    add(
        "ipv6 first fragment",
        &base,
        rc_ok()
            .over_v6(vec![Ext::Fragment {
                offset: 0,
                more: true,
            }])
            .bytes(),
        Malformed,
        false,
    );
    add(
        "ipv6 atomic fragment",
        &base,
        rc_ok()
            .over_v6(vec![Ext::Fragment {
                offset: 0,
                more: false,
            }])
            .bytes(),
        Malformed,
        false,
    );
    add(
        "ipv6 later fragment",
        &base,
        rc_ok()
            .over_v6(vec![Ext::Fragment {
                offset: 3,
                more: false,
            }])
            .bytes(),
        NotRoce,
        true,
    );
    let mut five = four;
    five.push(Ext::Options { kind: 60, units: 0 });
    add(
        "ipv6 five ext headers",
        &base,
        rc_ok().over_v6(five).bytes(),
        Malformed,
        false,
    );
    add(
        "roce v1 wrong next header",
        &base,
        with(rc_ok().as_v1(), |p| {
            if let Net::V1 { next_header, .. } = &mut p.net {
                *next_header = 17;
            }
        })
        .bytes(),
        Malformed,
        false,
    );

    // Monitor mode: the same reason, but passed.
    let monitor = base_with("mode = \"monitor\"");
    add(
        "monitor pkey violation",
        &monitor,
        Packet::rc(0x0001, QPB).bytes(),
        PkeyViolation,
        true,
    );
    add(
        "monitor malformed",
        &monitor,
        with(rc_ok(), |p| p.tver = 3).bytes(),
        Malformed,
        true,
    );
    add("monitor ok", &monitor, rc_ok().bytes(), Ok, true);

    // Headers are read only within the IP and UDP lengths: bytes past them
    // are padding, or what a sender appended, and never reach UDP.
    let set16 = |mut f: Vec<u8>, at: usize, v: usize| {
        f[at..at + 2].copy_from_slice(&(v as u16).to_be_bytes());
        f
    };
    const V4_TOT_LEN: usize = 14 + 2;
    const V4_UDP_LEN: usize = 14 + 20 + 4;
    const V6_PAYLOAD_LEN: usize = 14 + 4;
    let rc = Packet::rc(0x8001, QPA).bytes();
    let mut padded = rc.clone();
    padded.extend([0; 32]);
    add("ipv4 ethernet padding", &base, padded, Ok, true);
    add(
        "ipv4 total length ends inside the bth",
        &base,
        set16(rc.clone(), V4_TOT_LEN, 20 + 8 + 4),
        Malformed,
        false,
    );
    add(
        "ipv4 total length ends before the udp header",
        &base,
        set16(rc.clone(), V4_TOT_LEN, 20 + 4),
        Malformed,
        false,
    );
    add(
        "ipv4 total length shorter than its header",
        &base,
        set16(rc.clone(), V4_TOT_LEN, 12),
        Malformed,
        false,
    );
    add(
        "udp length ends inside the bth",
        &base,
        set16(rc.clone(), V4_UDP_LEN, 8 + 4),
        Malformed,
        false,
    );
    add(
        "udp length shorter than its header",
        &base,
        set16(rc, V4_UDP_LEN, 4),
        Malformed,
        false,
    );
    let ud6 = Packet::ud(0x8001, UD, 0x11111111).over_v6(vec![]).bytes();
    add(
        "ipv6 payload length ends inside the deth",
        &base,
        set16(ud6.clone(), V6_PAYLOAD_LEN, 8 + 12 + 4),
        Malformed,
        false,
    );
    add(
        "ipv6 jumbogram length",
        &base,
        set16(ud6, V6_PAYLOAD_LEN, 0),
        Malformed,
        false,
    );

    cases
}

/// Valid frames of every encapsulation, for truncation tests.
pub fn valid_frames() -> Vec<(&'static str, Packet)> {
    vec![
        ("v4 rc", Packet::rc(0x0001, QPA)),
        ("v4 ud", Packet::ud(0x8001, UD, 0x11111111)),
        ("v4 gsi", Packet::ud(0xffff, 1, GSI_QKEY)),
        (
            "qinq v4 rc",
            with(Packet::rc(0x0001, QPA), |p| p.vlans = vec![0x88a8, 0x8100]),
        ),
        (
            "v6 ud ext",
            Packet::ud(0x8001, UD, 0x11111111).over_v6(vec![
                Ext::Options { kind: 0, units: 1 },
                Ext::Ah { words: 2 },
            ]),
        ),
        ("v1 ud", Packet::ud(0x8001, UD, 0x11111111).as_v1()),
        (
            "v4 options cnp",
            with(Packet::v4(opcode::CNP, 0x8001, QPA, 0), |p| {
                if let Net::V4 { options, .. } = &mut p.net {
                    *options = 3;
                }
            }),
        ),
    ]
}
