//! The lab's policy and cases: the four-QP partition example (QPA 0x8001, QPB and QPC
//! 0x0001, QPD 0x8002) on one port, plus UD Q_Keys, QP1, QP0, a multicast
//! group, unknown QPs and frames that are not RoCE. Every expectation is
//! written out from the partition rules (IBA 10.9), with the rule that decides it.

use std::net::Ipv6Addr;

use pkeyfw_common::{Reason, verdict::GSI_QKEY};
use pkeyfw_testkit::wire::{Net, Packet};

/// The port's policy.
pub const POLICY: &str = r#"# The pkeyfw lab: the receiving host's port.
[port]
pkeys = [0xffff, 0x8001, 0x0001, 0x8002]

[enforcement]
mode = "enforce"
unknown_qp = "default-pkey"

[[qp]]            # QPA: full member of partition 0x0001
qpn = 0x10
type = "rc"
pkey = 0x8001

[[qp]]            # QPB: limited member of partition 0x0001
qpn = 0x11
type = "rc"
pkey = 0x0001

[[qp]]            # QPC: limited member of partition 0x0001
qpn = 0x12
type = "rc"
pkey = 0x0001

[[qp]]            # QPD: full member of partition 0x0002
qpn = 0x13
type = "rc"
pkey = 0x8002

[[qp]]            # a UD service in partition 0x0001
qpn = 0x20
type = "ud"
pkey = 0x8001
qkey = 0x11111111

[[group]]         # a multicast group in partition 0x0001
addr = "ff12:401b::1"
pkey = 0x8001
qkey = 0x00000b1b
"#;

/// One frame of the lab and what the rules say of it.
pub struct Case {
    /// Who sends, as the example names QPs.
    pub from: &'static str,
    /// Who receives.
    pub to: &'static str,
    /// The receiver's P_Key and Q_Key, as the policy binds them.
    pub receiver: &'static str,
    pub packet: Packet,
    pub pass: bool,
    pub reason: Reason,
    /// The rule that decides it.
    pub why: &'static str,
}

const RC_SEND: u8 = 0x04;

fn rc(pkey: u16, qpn: u32) -> Packet {
    Packet::v4(RC_SEND, pkey, qpn, 0)
}

pub fn cases() -> Vec<Case> {
    use Reason::*;
    let case = |from, to, receiver, packet, pass, reason, why| Case {
        from,
        to,
        receiver,
        packet,
        pass,
        reason,
        why,
    };
    let mut mcast = Packet::ud(0x0001, 0x00ff_ffff, 0xb1b).over_v6(vec![]);
    if let Net::V6 { dst, .. } = &mut mcast.net {
        *dst = "ff12:401b::1".parse::<Ipv6Addr>().expect("literal");
    }
    let mut mcast_bad = mcast.clone();
    mcast_bad.qkey = 0xb1c;
    let mut fragment = rc(0x8001, 0x11);
    if let Net::V4 { more_fragments, .. } = &mut fragment.net {
        *more_fragments = true;
    }
    let mut dns = rc(0xffff, 0x10);
    dns.udp_dport = 53;
    vec![
        case(
            "QPA 0x8001",
            "QPB",
            "0x0001",
            rc(0x8001, 0x11),
            true,
            Ok,
            "same partition, sender full",
        ),
        case(
            "QPB 0x0001",
            "QPA",
            "0x8001",
            rc(0x0001, 0x10),
            true,
            Ok,
            "same partition, receiver full",
        ),
        case(
            "QPA 0x8001",
            "QPC",
            "0x0001",
            rc(0x8001, 0x12),
            true,
            Ok,
            "same partition, sender full",
        ),
        case(
            "QPB 0x0001",
            "QPC",
            "0x0001",
            rc(0x0001, 0x12),
            false,
            PkeyViolation,
            "limited to limited: refused",
        ),
        case(
            "QPC 0x0001",
            "QPB",
            "0x0001",
            rc(0x0001, 0x11),
            false,
            PkeyViolation,
            "limited to limited: refused",
        ),
        case(
            "QPD 0x8002",
            "QPA",
            "0x8001",
            rc(0x8002, 0x10),
            false,
            PkeyViolation,
            "different partitions",
        ),
        case(
            "QPA 0x8001",
            "QPD",
            "0x8002",
            rc(0x8001, 0x13),
            false,
            PkeyViolation,
            "different partitions",
        ),
        case(
            "QPD 0x8002",
            "QPD",
            "0x8002",
            rc(0x8002, 0x13),
            true,
            Ok,
            "same partition, both full",
        ),
        case(
            "UD 0x0001 Q_Key 0x11111111",
            "UD QP 0x20",
            "0x8001 Q_Key 0x11111111",
            Packet::ud(0x0001, 0x20, 0x1111_1111),
            true,
            Ok,
            "P_Key matches, Q_Key equal",
        ),
        case(
            "UD 0x0001 Q_Key 0x22222222",
            "UD QP 0x20",
            "0x8001 Q_Key 0x11111111",
            Packet::ud(0x0001, 0x20, 0x2222_2222),
            false,
            QkeyViolation,
            "Q_Key differs",
        ),
        case(
            "UD 0x8002 Q_Key 0x11111111",
            "UD QP 0x20",
            "0x8001 Q_Key 0x11111111",
            Packet::ud(0x8002, 0x20, 0x1111_1111),
            false,
            PkeyViolation,
            "P_Key is checked before Q_Key",
        ),
        case(
            "RC 0x8001",
            "UD QP 0x20",
            "0x8001 (UD)",
            rc(0x8001, 0x20),
            false,
            OpcodeMismatch,
            "an RC opcode to a UD QP",
        ),
        case(
            "GSI 0x0001 Q_Key 0x80010000",
            "QP1",
            "any table entry",
            Packet::ud(0x0001, 1, GSI_QKEY),
            true,
            Ok,
            "QP1: matches entry 0x8001",
        ),
        case(
            "GSI 0x0003 Q_Key 0x80010000",
            "QP1",
            "any table entry",
            Packet::ud(0x0003, 1, GSI_QKEY),
            false,
            PkeyViolation,
            "QP1: no entry for partition 0x0003",
        ),
        case(
            "GSI 0xffff Q_Key 0x00000001",
            "QP1",
            "Q_Key 0x80010000",
            Packet::ud(0xffff, 1, 1),
            false,
            QkeyViolation,
            "QP1 needs the GSI Q_Key",
        ),
        case(
            "SMP 0x0005",
            "QP0",
            "none",
            Packet::ud(0x0005, 0, 0),
            true,
            Smi,
            "QP0 is in every partition",
        ),
        case(
            "UD 0x0001 Q_Key 0xb1b",
            "group ff12:401b::1",
            "0x8001 Q_Key 0xb1b",
            mcast,
            true,
            Ok,
            "group's P_Key full, Q_Key equal",
        ),
        case(
            "UD 0x0001 Q_Key 0xb1c",
            "group ff12:401b::1",
            "0x8001 Q_Key 0xb1b",
            mcast_bad,
            false,
            QkeyViolation,
            "group's Q_Key differs",
        ),
        case(
            "RC 0xffff",
            "QP 0x99 (unbound)",
            "default 0xffff",
            rc(0xffff, 0x99),
            true,
            UnknownQp,
            "unbound QP: default P_Key matches",
        ),
        case(
            "RC 0x8001",
            "QP 0x99 (unbound)",
            "default 0xffff",
            rc(0x8001, 0x99),
            false,
            PkeyViolation,
            "unbound QP: not the default partition",
        ),
        case(
            "RC 0x8001, first fragment",
            "QPB",
            "0x0001",
            fragment,
            false,
            Malformed,
            "RoCE is never fragmented",
        ),
        case(
            "UDP to port 53",
            "-",
            "-",
            dns,
            true,
            NotRoce,
            "not RoCE: untouched",
        ),
    ]
}
