//! The one list of reasons a frame is passed or dropped: it indexes the
//! per-reason counters, names the CLI's columns and keys the JSON output.

/// Why a frame got its verdict. The discriminant is the index into the
/// per-reason counter map, so the order is part of the kernel/user ABI.
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// RoCE frame accepted by its QP, group or QP1.
    Ok = 0,
    /// Not RoCE (or a non-first fragment): never touched.
    NotRoce = 1,
    /// Destination QP0: the SMI is a member of every partition.
    Smi = 2,
    /// Destination QP not in the table (or an unknown multicast group).
    UnknownQp = 3,
    /// The frame's P_Key does not match the receiver's.
    PkeyViolation = 4,
    /// A datagram's Q_Key differs from the receiver's.
    QkeyViolation = 5,
    /// The opcode's transport does not fit the receiving QP.
    OpcodeMismatch = 6,
    /// A header cut short or invalid, in a frame that is or could be RoCE.
    Malformed = 7,
}

impl Reason {
    /// Number of reasons: the size of the per-reason counter map.
    pub const COUNT: usize = 8;

    /// Every reason, in counter order.
    pub const ALL: [Reason; Self::COUNT] = [
        Reason::Ok,
        Reason::NotRoce,
        Reason::Smi,
        Reason::UnknownQp,
        Reason::PkeyViolation,
        Reason::QkeyViolation,
        Reason::OpcodeMismatch,
        Reason::Malformed,
    ];

    /// The name used by the CLI, the JSON output and the policy tests.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Ok => "ok",
            Reason::NotRoce => "not_roce",
            Reason::Smi => "smi",
            Reason::UnknownQp => "unknown_qp",
            Reason::PkeyViolation => "pkey_violation",
            Reason::QkeyViolation => "qkey_violation",
            Reason::OpcodeMismatch => "opcode_mismatch",
            Reason::Malformed => "malformed",
        }
    }

    /// The reason with this [`name`](Self::name).
    pub fn from_name(name: &str) -> Option<Reason> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Counter index of this reason.
    pub const fn index(self) -> u32 {
        self as u32
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
    /// Counter slot of the QP-table entry that judged the frame, if any.
    pub qp_slot: Option<u32>,
    /// The RoCE headers, when the frame is RoCE.
    pub roce: Option<crate::parse::Roce>,
}
