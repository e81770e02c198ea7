//! The one list of reasons a frame is passed or dropped: it indexes the
//! per-reason counters, names the CLI's columns and keys the JSON output.

crate::named_enum! {
    /// Why a frame got its verdict. The value indexes the per-reason
    /// counters (with a [`Verdict`]), so the order is part of the ABI.
    pub enum Reason: u32 as counter {
        /// RoCE frame accepted by its QP, group or QP1.
        Ok = 0 => "ok",
        /// Not RoCE (or a non-first fragment): never touched.
        NotRoce = 1 => "not_roce",
        /// Destination QP0: the SMI is a member of every partition.
        Smi = 2 => "smi",
        /// Destination QP not in the table (or an unknown multicast group);
        /// always refused for a QP in quarantine.
        UnknownQp = 3 => "unknown_qp",
        /// The frame's P_Key does not match the receiver's.
        PkeyViolation = 4 => "pkey_violation",
        /// A datagram's Q_Key differs from the receiver's.
        QkeyViolation = 5 => "qkey_violation",
        /// The opcode's transport does not fit the receiving QP.
        OpcodeMismatch = 6 => "opcode_mismatch",
        /// A header cut short or invalid, in a frame that is or could be RoCE.
        Malformed = 7 => "malformed",
        /// A GSO/GRO super-packet (several RoCE packets in one skb, which
        /// the UDP stack segments after the filter), or a datagram longer
        /// than any one RoCE packet, which only such an aggregate can be:
        /// refused whole.
        Gso = 8 => "gso",
        /// Leaving a switch port after entering the switch through an
        /// interface its policy does not list (a bridge port it forgot, or
        /// one that joined since): refused whatever it is, as long as it is
        /// or could be RoCE.
        UnlistedPort = 9 => "unlisted_port",
    }
}

crate::named_enum! {
    /// What was done with a frame: with its [`Reason`], the key of the
    /// kernel's frame counters (as Cilium keys drops by reason and
    /// direction), so that what the counters say was done is what was done.
    pub enum Verdict: u32 as counter {
        /// Allowed by the partition rules, and passed.
        Pass = 0 => "pass",
        /// Refused, and dropped.
        Drop = 1 => "drop",
        /// Refused, but passed: the policy only monitors.
        Monitor = 2 => "monitor",
        /// Refused by a switch port, and passed on with its ICRC broken,
        /// for the receiving HCA to discard (seed 001).
        Corrupt = 3 => "corrupt",
    }
}

crate::named_enum! {
    /// Where a switch port judged a frame: received on it (XDP), or
    /// forwarded out of it (TC egress). A host port judges inbound only.
    pub enum Direction: u8 {
        Inbound = 0 => "inbound",
        Outbound = 1 => "outbound",
    }
}

impl Verdict {
    /// What was done with a frame the rules `allowed` or not, that was let
    /// through (`pass`) or not, `corrupt`ed or not (see [`Outcome`]).
    #[inline(always)]
    pub const fn of(allowed: bool, pass: bool, corrupt: bool) -> Verdict {
        match (allowed, pass, corrupt) {
            (true, _, _) => Verdict::Pass,
            (false, false, _) => Verdict::Drop,
            (false, true, false) => Verdict::Monitor,
            (false, true, true) => Verdict::Corrupt,
        }
    }

    /// Whether the partition rules refused the frame.
    pub const fn refused(self) -> bool {
        !matches!(self, Verdict::Pass)
    }
}

/// Slots of the frame counters (`REASONS`): one per (reason, verdict).
pub const REASON_SLOTS: usize = Reason::COUNT * Verdict::COUNT;

/// The frame counter of a reason and verdict.
#[inline(always)]
pub const fn reason_slot(reason: Reason, verdict: Verdict) -> u32 {
    reason.index() * Verdict::COUNT as u32 + verdict.index()
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
    /// Counter slot of the QP-table entry that judged the frame, if any.
    pub qp_slot: Option<u32>,
    /// The RoCE headers, when the frame is RoCE.
    pub roce: Option<crate::parse::Roce>,
}

impl Outcome {
    /// What was done with the frame.
    #[inline(always)]
    pub const fn verdict(&self) -> Verdict {
        Verdict::of(self.allowed, self.pass, self.corrupt)
    }
}
