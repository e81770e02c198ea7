//! What the kernel counts by, each list once: the reasons a frame is passed
//! or dropped with what was done with it (`REASONS`, `XMIT_REASONS`), what
//! stamping did (`STAMPS`) and what the probes made of a verb (`CAPTURES`).
//! A variant's value indexes its counter map, so the order is part of the
//! ABI; its name is the CLI's column and the JSON output's key.

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
    /// through (`pass`) or not, `corrupt`ed or not (see [`Outcome`](crate::Outcome)).
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

crate::named_enum! {
    /// What stamping did with a frame. The value indexes the per-outcome
    /// counters (`STAMPS`), so the order is part of the kernel/user ABI.
    pub enum Stamp: u32 as counter {
        /// Egress: the BTH now carries the sending QP's P_Key.
        Stamped = 0 => "stamped",
        /// Egress: the frame already carried the binding's P_Key.
        Unchanged = 1 => "unchanged",
        /// Egress: not from a bound QP, and already carrying the port's
        /// default P_Key; left as is.
        Unbound = 2 => "unbound",
        /// Egress: from QP0/QP1 and no CM MAD of a connection, keeping a
        /// P_Key of the port's table (one it lacks becomes the default).
        Management = 3 => "management",
        /// Not RoCE v2 (RoCE v1 included), or its UDP length does not fit
        /// it; left as is.
        NotRoce = 4 => "not_roce",
        /// The ICRC lies beyond
        /// [`MAX_PATCH_DISTANCE`](crate::icrc::MAX_PATCH_DISTANCE); left as
        /// is.
        TooLong = 5 => "too_long",
        /// Ingress: a passed frame's P_Key set back to 0xFFFF.
        Restored = 6 => "restored",
        /// A kernel helper refused to read or write the frame (it could
        /// not be made writable, say): dropped on egress, where the frame
        /// could leave with a P_Key the port may not send; left on ingress.
        HelperFailed = 7 => "helper_failed",
        /// Egress: not from a bound QP, so it leaves with the port's
        /// default P_Key (index 0) instead of the one it carried.
        Defaulted = 8 => "defaulted",
        /// Egress: a management frame (to or from QP0/QP1) from anything
        /// but a QP (a process's UDP socket); dropped, as only an HCA's QPs
        /// send, each with a key of its port's table.
        Forged = 9 => "forged",
        /// Egress: RoCE v2 in several packets at once (a GSO super-packet,
        /// or longer than one RoCE packet); dropped, as its later packets
        /// would leave with keys no one judged.
        Gso = 10 => "gso",
        /// Egress: what could be RoCE but cannot be read safely (a header
        /// cut short, a first IP fragment to UDP 4791, ...); dropped, as
        /// the far end may read it otherwise.
        Malformed = 11 => "malformed",
        /// Egress: from a QP the QP-creation probe had no room to bind
        /// (quarantined); dropped, as its key is not known.
        Quarantined = 12 => "quarantined",
        /// Egress: a CM MAD of QP1 leaves with the P_Key its connection
        /// was set up with: its QP's binding, as the probe on the sending
        /// verb saw its caller name a QP of its own.
        Cm = 13 => "cm",
        /// Egress: a CM MAD of QP1 that no recorded connection explains
        /// (none recorded, a QP its caller did not make, one no rule binds)
        /// leaves with the port's default P_Key.
        CmDefaulted = 14 => "cm_defaulted",
    }
}

crate::named_enum! {
    /// What the probes made of a verb. The value indexes the per-outcome
    /// counters (`CAPTURES`), so the order is part of the ABI.
    pub enum Capture: u32 as counter {
        /// No room, at its creation, to record who made a QP a rule binds,
        /// or its QPN beyond the QP table: quarantined (every frame to it
        /// or from it refused) until something binds it or it is destroyed.
        Quarantined = 0 => "quarantined",
        /// A QP joined a multicast group of its own partition, or one the
        /// policy does not list.
        Joined = 1 => "joined",
        /// A QP joined a group of a partition it is not in: it receives the
        /// group's frames. Reported; a probe cannot refuse the verb (see
        /// [`Killed`](Capture::Killed)).
        ForeignJoin = 2 => "foreign_join",
        /// A QP a `[[bind]]` rule matched was bound as it was created.
        Bound = 3 => "bound",
        /// A UD QP bound with its own Q_Key set it: its frames are checked
        /// against it from now on.
        QkeyCaptured = 4 => "qkey_captured",
        /// A UD QP whose Q_Key the policy pins set another one: reported,
        /// and its frames are still checked against the policy's.
        QkeyMismatch = 5 => "qkey_mismatch",
        /// A process set out to join a group of a partition its QP is not
        /// in, under `foreign_join = "kill"`: SIGKILLed before the verb
        /// returns, so that it never reads what the group receives (a
        /// process sharing the QP's uverbs file keeps it, joined).
        Killed = 6 => "killed",
        /// A QP made on a device pkeyfw made for one tenant, by a creator
        /// that tenant's rule does not match: quarantined, and reported.
        ForeignDevice = 7 => "foreign_device",
        /// An rdma_cm listener was recorded as it listened, with who made
        /// it: the live rules bind it at each request it is named by.
        Listener = 8 => "listener",
        /// A listener found no room in the probe's table: until the table
        /// is reconciled, a request no recorded listener answers is refused.
        ListenerUnrecorded = 9 => "listener_unrecorded",
        /// A CM request or reply was recorded as its caller sent it, with
        /// the P_Key of the QP it names: its connection's MADs leave with
        /// that key.
        CmSend = 10 => "cm_send",
        /// A CM request or reply named a QP its caller did not make (or
        /// that no probe saw made): its MADs leave with the default P_Key.
        CmForeignQp = 11 => "cm_foreign_qp",
    }
}
