//! What the RDMA-core probes (pkeyfw-probes) make of the verbs a QP's
//! program calls: bindings at creation, the Q_Key a UD QP sets, and a QP
//! that joins a multicast group of a partition it is not in ([`joined`]):
//! rxe delivers a group's frames to every QP of the device attached to it,
//! after the filter has judged them once.

use crate::{abi::QpEntry, pkey};

crate::named_enum! {
    /// What the probes made of a verb. The value indexes the per-outcome
    /// counters (`CAPTURES`), so the order is part of the ABI.
    pub enum Capture: u32 as counter {
        /// No stats slot or QP-table room left for a QP a rule binds at
        /// its creation: quarantined (every frame to it or from it refused)
        /// until something binds it or it is destroyed.
        Quarantined = 0 => "quarantined",
        /// A QP joined a multicast group of its own partition, or one the
        /// policy does not list.
        Joined = 1 => "joined",
        /// A QP joined a group of a partition it is not in: it receives the
        /// group's frames. Reported; a probe cannot refuse the verb.
        ForeignJoin = 2 => "foreign_join",
        /// A QP a `[[bind]]` rule matched was bound as it was created.
        Bound = 3 => "bound",
        /// A UD QP bound with its own Q_Key set it: its frames are checked
        /// against it from now on.
        QkeyCaptured = 4 => "qkey_captured",
        /// A UD QP whose Q_Key the policy pins set another one: reported,
        /// and its frames are still checked against the policy's.
        QkeyMismatch = 5 => "qkey_mismatch",
    }
}

/// Local QP `qp` (its live entry, if bound) joined a group whose live entry
/// is `group` (if the policy lists it) with P_Key `group_pkey`.
#[inline(always)]
pub const fn joined(qp: Option<QpEntry>, group_pkey: Option<u16>) -> Capture {
    match (qp, group_pkey) {
        (_, None) => Capture::Joined,
        (Some(qp), Some(g)) if pkey::matches(qp.pkey, g) => Capture::Joined,
        _ => Capture::ForeignJoin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::QpType;

    fn entry(pkey: u16) -> QpEntry {
        QpEntry {
            qkey: 0,
            slot: 0,
            pkey,
            qp_type: QpType::Ud as u8,
            flags: 0,
        }
    }

    #[test]
    fn joins_are_judged_by_the_partition_rules() {
        let full_a = Some(entry(0x8001));
        let limited_a = Some(entry(0x0001));
        assert_eq!(joined(full_a, Some(0x8001)), Capture::Joined);
        assert_eq!(joined(limited_a, Some(0x8001)), Capture::Joined);
        assert_eq!(joined(limited_a, Some(0x0001)), Capture::ForeignJoin);
        assert_eq!(joined(full_a, Some(0x8002)), Capture::ForeignJoin);
        assert_eq!(joined(None, Some(0x8001)), Capture::ForeignJoin);
        assert_eq!(joined(None, None), Capture::Joined);
    }
}
