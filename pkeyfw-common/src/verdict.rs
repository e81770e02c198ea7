//! The partition verdict (IBA 10.9 partitioning, 10.2.4 Q_Keys) for a classified frame.

use crate::{
    abi::{
        Config, GroupEntry, QpEntry, UnknownQp,
        counters::{Reason, Verdict},
        qp_flags,
    },
    frame::Frame,
    parse::{self, Class, Parsed, Roce, Transport},
    pkey,
};

/// QP0: the Subnet Management Interface.
pub const SMI_QPN: u32 = 0;
/// QP1: the General Services Interface.
pub const GSI_QPN: u32 = 1;
/// The multicast destination QPN.
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// No QP-table entry judged the frame ([`Outcome::qp`]): no QPN is that
/// large.
pub const NO_QP: u32 = u32::MAX;
/// The well-known Q_Key of QP1, the GSI (IBA 13.4: privileged Q_Keys have bit 31 set).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The policy as the verdict reads it: BPF maps in the kernel, in-memory
/// tables on the host. Lookups are in the generation the caller chose.
pub trait Tables {
    /// The QP-table entry for a destination QPN.
    fn qp(&self, qpn: u32) -> Option<QpEntry>;
    /// The multicast group with this destination (IPv4 as v4-mapped IPv6).
    fn group(&self, addr: &[u8; 16]) -> Option<GroupEntry>;
    /// The port-table membership flags ([`pkey::port`]) of a partition.
    fn port_flags(&self, key: u16) -> u8;
    /// Whether QPN `qpn` is a QP the QP-creation probe had no room to bind
    /// (asked only of a QPN the table does not hold).
    fn quarantined(&self, qpn: u32) -> bool;
    /// Whether a switch port's policy lists interface `ifindex` as a port
    /// of its switch (asked only of a frame that entered through one; the
    /// host's tables know no interfaces).
    #[inline(always)]
    fn listed(&self, _ifindex: u32) -> bool {
        false
    }
}

/// Judges one frame: classification, then the partition rules, then monitor mode.
#[inline(always)]
pub fn judge<F: Frame + ?Sized, T: Tables>(frame: &F, tables: &T, config: &Config) -> Outcome {
    judge_parsed(frame, parse::classify(frame), tables, config)
}

/// [`judge`] of a frame already classified as `parsed`.
#[inline(always)]
pub fn judge_parsed<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    parsed: Parsed,
    tables: &T,
    config: &Config,
) -> Outcome {
    let roce = parsed.roce;
    let (roce, (reason, allowed, qp)) = match parsed.class {
        Class::NotRoce => (None, (Reason::NotRoce, true, NO_QP)),
        Class::Malformed => (None, (Reason::Malformed, false, NO_QP)),
        // A super-packet is refused whole: its later segments go unjudged.
        Class::Roce if roce.aggregate(frame) => (Some(roce), (Reason::Gso, false, NO_QP)),
        Class::Roce => (Some(roce), decide(frame, &roce, tables, config)),
    };
    Outcome {
        reason,
        allowed,
        pass: allowed || config.monitor != 0,
        corrupt: false,
        qp,
        roce,
    }
}

/// Verdict on a RoCE frame: reason, pass, and the QPN whose QP-table entry
/// judged it ([`NO_QP`] if none did).
#[inline(always)]
fn decide<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    roce: &Roce,
    tables: &T,
    config: &Config,
) -> (Reason, bool, u32) {
    let ud = roce.transport() == Transport::Ud;
    let reason = match roce.dest_qp() {
        // QP0, the SMI, checks no P_Key or Q_Key, but takes only SMPs, which
        // are datagrams (IBA 13.5: MADs on UD). RoCE has no SMI at all (rxe
        // drops QP0 frames): anything else to QP0 is refused.
        SMI_QPN if ud => return (Reason::Smi, true, NO_QP),
        SMI_QPN => return (Reason::OpcodeMismatch, false, NO_QP),
        // QP1 accepts a P_Key matching any entry of the port's table.
        GSI_QPN => check(
            ud,
            pkey::port::matches(roce.pkey(), tables.port_flags(pkey::key(roce.pkey()))),
            roce.qkey() == GSI_QKEY,
        ),
        MULTICAST_QPN => match roce
            .addrs()
            .read(frame, true)
            .and_then(|a| tables.group(&a))
        {
            Some(g) => check(
                ud,
                pkey::matches(roce.pkey(), g.pkey),
                roce.qkey() == g.qkey,
            ),
            None => return unknown(roce.pkey(), config),
        },
        qpn => match tables.qp(qpn) {
            Some(qp) => {
                let reason = check(
                    match roce.transport().qp_type() {
                        Some(t) => t == qp.qp_type,
                        None => true, // CNP: any QP type
                    },
                    pkey::matches(roce.pkey(), qp.pkey),
                    // A CNP carries no DETH: only UD frames have a Q_Key to
                    // check; a UD QP that has set none yet accepts no frame.
                    !ud || (qp.flags & qp_flags::UNSET_QKEY == 0 && roce.qkey() == qp.qkey),
                );
                return (reason, reason == Reason::Ok, qpn);
            }
            // A QP a rule would bind is never let in as one no rule binds:
            // refused whatever the unknown-QP rule (as `drop` refuses it,
            // so the verifier meets a state it has seen).
            None if tables.quarantined(qpn) => return (Reason::UnknownQp, false, NO_QP),
            None => return unknown(roce.pkey(), config),
        },
    };
    (reason, reason == Reason::Ok, NO_QP)
}

/// The receive checks in IBA order: transport, then P_Key, then Q_Key.
#[inline(always)]
fn check(transport_ok: bool, pkey_ok: bool, qkey_ok: bool) -> Reason {
    if !transport_ok {
        Reason::OpcodeMismatch
    } else if !pkey_ok {
        Reason::PkeyViolation
    } else if !qkey_ok {
        Reason::QkeyViolation
    } else {
        Reason::Ok
    }
}

/// The policy's rule for a QP or group it does not know.
#[inline(always)]
fn unknown(frame_pkey: u16, config: &Config) -> (Reason, bool, u32) {
    match UnknownQp::from_u8(config.unknown_qp) {
        UnknownQp::DefaultPkey if pkey::matches(frame_pkey, config.default_pkey) => {
            (Reason::UnknownQp, true, NO_QP)
        }
        UnknownQp::DefaultPkey => (Reason::PkeyViolation, false, NO_QP),
        UnknownQp::Drop => (Reason::UnknownQp, false, NO_QP),
        UnknownQp::Pass => (Reason::UnknownQp, true, NO_QP),
    }
}

/// What the filter does with a frame, and why.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub reason: Reason,
    /// Whether the partition rules let the frame in.
    pub allowed: bool,
    /// `false` means XDP_DROP: not allowed, and not in monitor mode.
    pub pass: bool,
    /// Refused, and to be passed with its ICRC broken (a switch port's
    /// `corrupt`); `pass` is then true.
    pub corrupt: bool,
    /// The QPN whose QP-table entry judged the frame (its counters count
    /// it), or [`NO_QP`]. (A number, not an `Option`: a `None` made on some paths
    /// leaves the kernel's register undefined, which its verifier refuses
    /// to read.)
    pub qp: u32,
    /// The RoCE headers, when the frame is RoCE.
    pub roce: Option<Roce>,
}

/// [`Outcome::pack`]'s fields above the QPN (bits 0-31).
const HAS_QP: u64 = 1 << 32;
pub const PACKED_ALLOWED: u64 = 1 << 33;
pub const PACKED_PASS: u64 = 1 << 34;
const CORRUPT: u64 = 1 << 35;
/// Not the outcome's: free for a stage to tell the program that called it
/// to restore the frame's P_Key (see `stamp::restores`); [`Outcome::unpack`]
/// ignores it.
pub const PACKED_RESTORE: u64 = 1 << 36;
const REASON_SHIFT: u32 = 40;
const PKEY_SHIFT: u32 = 48;

impl Outcome {
    /// All but the RoCE headers, as one u64: what a BPF function returns in
    /// a register. Of the headers, which are read again where they are
    /// needed, it keeps the P_Key, which a rewrite may change meanwhile.
    #[inline(always)]
    pub const fn pack(&self) -> u64 {
        let qp = if self.qp == NO_QP {
            0
        } else {
            self.qp as u64 | HAS_QP
        };
        let pkey = match self.roce {
            Some(roce) => roce.pkey() as u64,
            None => 0,
        };
        qp | if self.allowed { PACKED_ALLOWED } else { 0 }
            | if self.pass { PACKED_PASS } else { 0 }
            | if self.corrupt { CORRUPT } else { 0 }
            | (self.reason as u64) << REASON_SHIFT
            | pkey << PKEY_SHIFT
    }

    /// The inverse of [`pack`](Self::pack), with the frame's headers read
    /// again (their P_Key the packed one); an unknown reason is a malformed
    /// frame's.
    #[inline(always)]
    pub const fn unpack(bits: u64, roce: Option<Roce>) -> Outcome {
        let roce = match roce {
            Some(roce) => Some(roce.with_pkey((bits >> PKEY_SHIFT) as u16)),
            None => None,
        };
        Outcome {
            reason: match Reason::from_repr((bits >> REASON_SHIFT & 0xff) as u32) {
                Some(reason) => reason,
                None => Reason::Malformed,
            },
            allowed: bits & PACKED_ALLOWED != 0,
            pass: bits & PACKED_PASS != 0,
            corrupt: bits & CORRUPT != 0,
            qp: if bits & HAS_QP != 0 {
                bits as u32
            } else {
                NO_QP
            },
            roce,
        }
    }

    /// The P_Key a packed outcome ([`pack`](Self::pack)) keeps.
    #[inline(always)]
    pub const fn packed_pkey(bits: u64) -> u16 {
        (bits >> PKEY_SHIFT) as u16
    }

    /// What was done with the frame.
    #[inline(always)]
    pub const fn verdict(&self) -> Verdict {
        Verdict::of(self.allowed, self.pass, self.corrupt)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The verdict handed on in a register, the headers read again.
        #[test]
        fn an_outcome_survives_its_packing(
            reason in 0..Reason::COUNT,
            allowed: bool,
            pass: bool,
            corrupt: bool,
            qp in prop_oneof![Just(NO_QP), 0..NO_QP],
            pkey: u16,
        ) {
            let roce = Roce::of(0x04, pkey, 0x11, 0, 0);
            let outcome = Outcome {
                reason: Reason::ALL[reason],
                allowed,
                pass,
                corrupt,
                qp,
                roce: Some(roce),
            };
            // Read again after a rewrite changed its P_Key.
            let reread = roce.with_pkey(!pkey);
            prop_assert_eq!(Outcome::unpack(outcome.pack(), Some(reread)), outcome);
        }
    }
}
