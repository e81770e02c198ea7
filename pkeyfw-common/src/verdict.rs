//! The partition verdict (IBA 10.9 partitioning, 10.2.4 Q_Keys) for a classified frame.

use crate::{
    abi::{
        Config, Creation, GroupEntry, ListenKey, MAX_RULES, QpEntry, QpType, UnknownQp,
        cm::cm_state::RECORDS_LISTENERS,
        counters::{Reason, Verdict},
        qp_flags,
    },
    cm::{self, Specific},
    frame::Frame,
    parse::{self, Class, Parsed, Roce},
    pkey,
    tenant::{self, Rules, Step},
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
/// tables on the host. Lookups are in the generation the caller chose;
/// its `[[bind]]` rules ([`Rules`]) bind the listeners a CM request names.
pub trait Tables: Rules {
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
    /// Which records of connection setup the probes keep
    /// (`abi::cm_state::RECORDS` bits): none where they do not run (a
    /// kernel before 6.1, rdma_cm not loaded at attach, the host's tables).
    #[inline(always)]
    fn cm_records(&self) -> u64 {
        0
    }
    /// Whether a listener found no room in the probe's table: then a
    /// request no recorded listener answers is refused.
    #[inline(always)]
    fn listeners_unrecorded(&self) -> bool {
        false
    }
    /// Who made the rdma_cm listener `key` names, as the probe recorded it.
    #[inline(always)]
    fn listener(&self, _key: &ListenKey) -> Option<&Creation> {
        None
    }
    /// The P_Key of the connection the CM MAD of `CONNECTIONS` key `key`
    /// (see [`cm::Mad::sender`]) belongs to: its QP's, as the probe on the
    /// sending verb found it bound.
    #[inline(always)]
    fn connection(&self, _key: u64) -> Option<u16> {
        None
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
    match judge_but_requests(frame, parsed, tables, config) {
        (outcome, true) => match outcome.roce {
            Some(roce) => {
                let listening = listener(frame, &roce, tables)
                    .map_or_else(|why| why, |creator| listening(creator, tables));
                request(&roce, listening, tables, config)
            }
            None => outcome,
        },
        (outcome, false) => outcome,
    }
}

/// [`judge_parsed`] but for a CM request QP1 takes, which only its
/// listener decides: that comes back with `true`, for [`listener`],
/// [`listening`] and [`request`] to judge. (The kernel runs each of those in a function of
/// its own, which its verifier checks once, not on every path through the
/// rest: a request's listener is bound by a walk of the rules.)
#[inline(always)]
pub fn judge_but_requests<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    parsed: Parsed,
    tables: &T,
    config: &Config,
) -> (Outcome, bool) {
    let roce = parsed.roce;
    let (roce, (reason, allowed, qp)) = match parsed.class {
        Class::NotRoce => (None, (Reason::NotRoce, true, NO_QP)),
        Class::Malformed => (None, (Reason::Malformed, false, NO_QP)),
        // A super-packet is refused whole: its later segments go unjudged.
        Class::Roce if roce.aggregate(frame) => (Some(roce), (Reason::Gso, false, NO_QP)),
        Class::Roce => (Some(roce), decide(frame, &roce, tables, config)),
    };
    let outcome = Outcome {
        reason,
        allowed,
        pass: allowed || config.monitor != 0,
        corrupt: false,
        qp: if qp == REQUEST_QP { NO_QP } else { qp },
        roce,
    };
    (outcome, qp == REQUEST_QP)
}

/// Who made the listener a CM request to QP1 (REQ, SIDR_REQ) names: the
/// most specific one the probes recorded for it (rdma_cm lets one listen
/// for a request; see [`cm::Request::listener`]), else why none decides
/// ([`Listening::Nobody`], [`Listening::Unreadable`]).
#[inline(always)]
pub fn listener<'t, F: Frame + ?Sized, T: Tables>(
    frame: &F,
    roce: &Roce,
    tables: &'t T,
) -> Result<&'t Creation, Listening> {
    let Some(req) = cm::mad(frame, roce).and_then(|mad| mad.request(frame)) else {
        return Err(Listening::Unreadable);
    };
    [Specific::Address, Specific::Family, Specific::Any]
        .into_iter()
        .find_map(|which| tables.listener(&req.listener(which)))
        .ok_or(Listening::Nobody)
}

/// What binds a listener `creator` made: the first live `[[bind]]` rule
/// that matches it, as a QP it made then would be.
#[inline(always)]
pub fn listening<T: Tables>(creator: &Creation, tables: &T) -> Listening {
    listening_by(|index| listener_rule(tables, creator, index))
}

/// [`listening`], given what each rule makes of the listener
/// ([`listener_rule`]; the kernel checks one rule in a function of its
/// own, which its verifier walks once, not once per rule).
#[inline(always)]
pub fn listening_by(step: impl FnMut(u32) -> Step) -> Listening {
    match tenant::first(step) {
        MAX_RULES.. => Listening::Unbound,
        rule => Listening::Rule(rule),
    }
}

/// What rule `index` of `rules` makes of the listener `creator` made.
#[inline(always)]
pub fn listener_rule<R: Rules + ?Sized>(rules: &R, creator: &Creation, index: u32) -> Step {
    // A listener takes no QPN: rules by QPN never bind it.
    let transport = QpType::of_ib(creator.ib_qp_type.into()).unwrap_or(QpType::Rc);
    tenant::step(rules, creator, u32::MAX, transport, index)
}

/// What binds the listener a CM request names ([`listening`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Listening {
    /// The generation's `[[bind]]` rule of this index.
    Rule(u32),
    /// No rule: the unknown-QP rule decides.
    Unbound,
    /// No listener is recorded for it.
    Nobody,
    /// The request cannot be read whole.
    Unreadable,
}

impl Listening {
    /// As one u64: what a BPF function returns in a register.
    #[inline(always)]
    pub const fn pack(self) -> u64 {
        match self {
            Listening::Rule(i) => i as u64,
            Listening::Unbound => 1 << 32,
            Listening::Nobody => 2 << 32,
            Listening::Unreadable => 3 << 32,
        }
    }

    /// The inverse of [`pack`](Self::pack).
    #[inline(always)]
    pub const fn unpack(bits: u64) -> Listening {
        match bits >> 32 {
            0 => Listening::Rule(bits as u32),
            1 => Listening::Unbound,
            2 => Listening::Nobody,
            _ => Listening::Unreadable,
        }
    }
}

/// The verdict on a CM request to QP1 that QP1's own rule took (see
/// [`judge_but_requests`]), given what binds its listener: its P_Key must
/// match the rule's, or pass the unknown-QP rule where none binds it. Where
/// no listener is recorded, the unknown-QP rule decides, unless one found
/// no room: then it is refused.
#[inline(always)]
pub fn request<T: Tables>(
    roce: &Roce,
    listening: Listening,
    tables: &T,
    config: &Config,
) -> Outcome {
    let (reason, allowed, _) = match listening {
        Listening::Rule(i) => match tables.rule(i) {
            Some(rule) if pkey::matches(roce.pkey(), rule.pkey) => (Reason::Ok, true, NO_QP),
            Some(_) => (Reason::PkeyViolation, false, NO_QP),
            // The rules changed meanwhile: as the next request will be.
            None => unknown(roce.pkey(), config),
        },
        Listening::Nobody if tables.listeners_unrecorded() => (Reason::UnknownQp, false, NO_QP),
        Listening::Unbound | Listening::Nobody => unknown(roce.pkey(), config),
        Listening::Unreadable => (Reason::Malformed, false, NO_QP),
    };
    Outcome {
        reason,
        allowed,
        pass: allowed || config.monitor != 0,
        corrupt: false,
        qp: NO_QP,
        roce: Some(*roce),
    }
}

/// [`decide`]'s QPN for a CM request that only its listener decides (see
/// [`judge_but_requests`]): no entry judged it (no QPN is that large).
const REQUEST_QP: u32 = NO_QP - 1;

/// Verdict on a RoCE frame: reason, pass, and the QPN whose QP-table entry
/// judged it ([`NO_QP`] if none did).
#[inline(always)]
fn decide<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    roce: &Roce,
    tables: &T,
    config: &Config,
) -> (Reason, bool, u32) {
    let ud = roce.ud();
    let reason = match roce.dest_qp() {
        // QP0, the SMI, checks no P_Key or Q_Key, but takes only SMPs, which
        // are datagrams (IBA 13.5: MADs on UD). RoCE has no SMI at all (rxe
        // drops QP0 frames): anything else to QP0 is refused.
        SMI_QPN if ud => return (Reason::Smi, true, NO_QP),
        SMI_QPN => return (Reason::OpcodeMismatch, false, NO_QP),
        // QP1 accepts a P_Key matching any entry of the port's table; a
        // connection request, only its listener's.
        GSI_QPN => match check(
            ud,
            pkey::port::matches(roce.pkey(), tables.port_flags(pkey::key(roce.pkey()))),
            roce.qkey() == GSI_QKEY,
        ) {
            Reason::Ok
                if tables.cm_records() & RECORDS_LISTENERS != 0
                    && cm::mad(frame, roce).is_some_and(|mad| mad.is_request()) =>
            {
                return (Reason::Ok, true, REQUEST_QP);
            }
            reason => reason,
        },
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
/// Not the outcome's either: free for a stage to tell the program that
/// called it that the frame is a CM request for its listener to decide
/// (see [`judge_but_requests`]), and nothing was counted yet.
pub const PACKED_REQUEST: u64 = 1 << 37;
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
