//! Violation lines: what the kernel reported through the `EVENTS` ring
//! buffer, printed at a bounded rate.

use std::net::{IpAddr, Ipv6Addr};

use pkeyfw_common::{
    Direction, Reason, Verdict,
    abi::{Event, EventKind},
};

use crate::reporting::describe;

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Option<Event> {
    (bytes.len() >= size_of::<Event>()).then(|| {
        // SAFETY: long enough, and Event is plain data valid for any bytes.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) }
    })
}

/// `::ffff:a.b.c.d` back to IPv4; `::` for "unknown".
pub fn addr(a: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(a);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// One line per event: a refused frame, a QP that joined a group of
/// another partition, one that set a Q_Key the policy does not give it, one
/// quarantined, or one made on a tenant's device by someone else.
pub fn line(e: &Event) -> String {
    if e.kind == EventKind::QkeyMismatch as u8 {
        return format!(
            "violation qkey_mismatch: QP {:#08x} (P_Key {}) set Q_Key {:#010x}; the policy gives it {:#010x}, which its frames are checked against",
            e.dest_qp,
            describe::pkey(e.pkey),
            e.qkey,
            e.src_qp
        );
    }
    if e.kind == EventKind::Quarantined as u8 {
        return format!(
            "violation quarantined: QP {:#08x} (a rule gives it P_Key {}) found no room in the QP-creation probe's table: every frame to it or from it is refused until it is bound or destroyed",
            e.dest_qp,
            describe::pkey(e.pkey)
        );
    }
    if e.kind == EventKind::ForeignDevice as u8 {
        let who = match (e.src_qp, e.pkey) {
            (0, _) => "a kernel user".to_string(),
            (pid, 0) => format!("process {pid}, whom no rule binds"),
            (pid, k) => format!(
                "process {pid}, whose rule gives P_Key {}",
                describe::pkey(k)
            ),
        };
        return format!(
            "violation foreign_device: QP {:#08x} made on a tenant's own device by {who}: quarantined, every frame to it or from it refused until it is destroyed",
            e.dest_qp
        );
    }
    if e.kind == EventKind::ForeignJoin as u8 {
        let qp = match e.pkey {
            0 => "no partition".to_string(),
            k => format!("P_Key {}", describe::pkey(k)),
        };
        return format!(
            "violation foreign_join: QP {:#08x} ({qp}) joined group {} of P_Key {}: it receives the group's frames",
            e.dest_qp,
            addr(e.dst),
            describe::pkey(e.qkey as u16)
        );
    }
    let reason = Reason::from_repr(e.reason.into()).map_or("?", Reason::name);
    let verdict = match Verdict::from_repr(e.verdict.into()) {
        Some(Verdict::Corrupt) => "corrupt",
        _ if e.monitor != 0 => "would drop",
        _ => "drop",
    };
    let verdict = match Direction::from_repr(e.direction) {
        Some(d) if e.kind == EventKind::SwitchPort as u8 => format!("{} {verdict}", d.name()),
        _ => verdict.to_string(),
    };
    if e.src == [0; 16] && e.dst == [0; 16] {
        return format!("{verdict} {reason}");
    }
    let mut s = format!(
        "{verdict} {reason}: {} → {} QP {:#08x} opcode {:#04x} P_Key {}",
        addr(e.src),
        addr(e.dst),
        e.dest_qp,
        e.opcode,
        describe::pkey(e.pkey)
    );
    if e.opcode & 0xe0 == 0x60 {
        s += &format!(" Q_Key {:#010x}", e.qkey);
    }
    s
}

/// At most `per_second` lines a second; the rest are counted.
pub struct Limiter {
    per_second: u64,
    shown: u64,
}

impl Limiter {
    pub fn new(per_second: u64) -> Limiter {
        Limiter {
            per_second,
            shown: 0,
        }
    }

    /// Whether one more line may be shown in this second.
    pub fn allow(&mut self) -> bool {
        let ok = self.shown < self.per_second;
        self.shown += u64::from(ok);
        ok
    }

    /// Ends a second in which the counters saw `violations` refused frames:
    /// the number not shown, if any.
    pub fn tick(&mut self, violations: u64) -> Option<u64> {
        let hidden = violations.saturating_sub(self.shown);
        self.shown = 0;
        (hidden > 0).then_some(hidden)
    }
}
