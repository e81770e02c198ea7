//! What the RDMA-core probes (pkeyfw-probes) make of the verbs a QP's
//! program calls: bindings at creation, the Q_Key a UD QP sets, and a QP
//! that joins a multicast group of a partition it is not in ([`joined`]):
//! rxe delivers a group's frames to every QP of the device attached to it,
//! after the filter has judged them once.

use crate::{
    abi::{Config, JoinAction, OnForeignJoin, QpEntry, UnknownQp, counters::Capture},
    pkey,
};

/// Local QP `qp` (its live entry, if bound; else taken as `unbound`
/// says) joined a group with P_Key `group_pkey` (if the policy lists it).
#[inline(always)]
pub const fn joined(qp: Option<QpEntry>, unbound: Unbound, group_pkey: Option<u16>) -> Capture {
    let Some(g) = group_pkey else {
        return Capture::Joined;
    };
    let member = match (qp, unbound) {
        (Some(qp), _) => pkey::matches(qp.pkey, g),
        (None, Unbound::As(key)) => pkey::matches(key, g),
        (None, Unbound::Anywhere) => true,
        (None, Unbound::Nowhere) => false,
    };
    if member {
        Capture::Joined
    } else {
        Capture::ForeignJoin
    }
}

/// What a QP with no binding is a member of, at a join: what the
/// unknown-QP rule lets it receive.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Unbound {
    /// The partition of this key (`default-pkey`: the port's default).
    As(u16),
    /// Every partition (`pass`).
    Anywhere,
    /// None (`drop`, or a QP in quarantine, whose frames are refused
    /// whatever the rule).
    Nowhere,
}

/// How `config`'s unknown-QP rule takes an unbound QP, `quarantined` or not.
#[inline(always)]
pub const fn unbound(config: &Config, quarantined: bool) -> Unbound {
    if quarantined {
        return Unbound::Nowhere;
    }
    match UnknownQp::from_u8(config.unknown_qp) {
        UnknownQp::DefaultPkey => Unbound::As(config.default_pkey),
        UnknownQp::Pass => Unbound::Anywhere,
        UnknownQp::Drop => Unbound::Nowhere,
    }
}

/// Whether the process making outcome `joined` of a join with a QP
/// (`bound` by the policy, or not) is SIGKILLed under the live
/// `JOIN_ACTION`: a bound QP's foreign join, where the policy kills. An
/// unbound QP's (in quarantine, or under `unknown_qp = "drop"`) is
/// foreign to every group, its own partition's too: reported, never
/// killed for.
#[inline(always)]
pub const fn kills(joined: Capture, action: JoinAction, bound: bool) -> bool {
    bound && matches!(joined, Capture::ForeignJoin) && action == OnForeignJoin::Kill as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::QpType;

    fn entry(pkey: u16) -> QpEntry {
        QpEntry {
            qkey: 0,
            pkey,
            qp_type: QpType::Ud as u8,
            flags: 0,
        }
    }

    #[test]
    fn joins_are_judged_by_the_partition_rules() {
        let full_a = Some(entry(0x8001));
        let limited_a = Some(entry(0x0001));
        let nowhere = Unbound::Nowhere;
        assert_eq!(joined(full_a, nowhere, Some(0x8001)), Capture::Joined);
        assert_eq!(joined(limited_a, nowhere, Some(0x8001)), Capture::Joined);
        assert_eq!(
            joined(limited_a, nowhere, Some(0x0001)),
            Capture::ForeignJoin
        );
        assert_eq!(joined(full_a, nowhere, Some(0x8002)), Capture::ForeignJoin);
        // A binding decides, whatever the unknown-QP rule.
        assert_eq!(
            joined(full_a, Unbound::Anywhere, Some(0x8002)),
            Capture::ForeignJoin
        );
        assert_eq!(joined(None, nowhere, Some(0x8001)), Capture::ForeignJoin);
        assert_eq!(joined(None, nowhere, None), Capture::Joined);
    }

    /// An unbound QP is a member of what the unknown-QP rule lets it
    /// receive; one in quarantine of nothing.
    #[test]
    fn an_unbound_qp_joins_as_the_unknown_qp_rule_takes_it() {
        let rule = |unknown_qp: UnknownQp| Config {
            default_pkey: 0xffff,
            unknown_qp: unknown_qp as u8,
            ..Config::default()
        };
        let default = unbound(&rule(UnknownQp::DefaultPkey), false);
        assert_eq!(default, Unbound::As(0xffff));
        assert_eq!(joined(None, default, Some(0xffff)), Capture::Joined);
        assert_eq!(joined(None, default, Some(0x8002)), Capture::ForeignJoin);
        let pass = unbound(&rule(UnknownQp::Pass), false);
        assert_eq!(joined(None, pass, Some(0x8002)), Capture::Joined);
        let drop = unbound(&rule(UnknownQp::Drop), false);
        assert_eq!(joined(None, drop, Some(0xffff)), Capture::ForeignJoin);
        for r in [UnknownQp::DefaultPkey, UnknownQp::Pass, UnknownQp::Drop] {
            assert_eq!(unbound(&rule(r), true), Unbound::Nowhere, "{r:?}");
        }
    }

    #[test]
    fn only_a_kill_action_kills_and_only_foreign_joins() {
        let kill = OnForeignJoin::Kill as u8;
        assert!(kills(Capture::ForeignJoin, kill, true));
        assert!(!kills(Capture::Joined, kill, true));
        assert!(!kills(
            Capture::ForeignJoin,
            OnForeignJoin::Report as u8,
            true
        ));
        assert!(
            !kills(Capture::ForeignJoin, 0x7f, true),
            "an unknown action kills no one"
        );
        assert!(
            !kills(Capture::ForeignJoin, kill, false),
            "an unbound QP's join is reported, not killed for"
        );
    }
}
