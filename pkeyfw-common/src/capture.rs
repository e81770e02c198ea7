//! What the RDMA-core probes (pkeyfw-probes) make of the verbs a QP's
//! program calls: bindings at creation, the Q_Key a UD QP sets, and a QP
//! that joins a multicast group of a partition it is not in ([`joined`]):
//! rxe delivers a group's frames to every QP of the device attached to it,
//! after the filter has judged them once.

use crate::{
    abi::{JoinAction, OnForeignJoin, QpEntry, counters::Capture},
    pkey,
};

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

/// Whether the process making outcome `joined` of a join is SIGKILLed
/// under the live `JOIN_ACTION`: a foreign join, where the policy kills.
#[inline(always)]
pub const fn kills(joined: Capture, action: JoinAction) -> bool {
    matches!(joined, Capture::ForeignJoin) && action == OnForeignJoin::Kill as u8
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

    #[test]
    fn only_a_kill_action_kills_and_only_foreign_joins() {
        let kill = OnForeignJoin::Kill as u8;
        assert!(kills(Capture::ForeignJoin, kill));
        assert!(!kills(Capture::Joined, kill));
        assert!(!kills(Capture::ForeignJoin, OnForeignJoin::Report as u8));
        assert!(
            !kills(Capture::ForeignJoin, 0x7f),
            "an unknown action kills no one"
        );
    }
}
