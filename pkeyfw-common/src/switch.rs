//! Port-level partition enforcement on a switch (IBA 10.9.4; seed 001): a
//! Linux bridge or router between RoCE hosts playing the InfiniBand switch.
//!
//! A switch port's P_Key table is that of the host behind it (the
//! destination reached through it). It checks the frames it forwards out
//! (outbound) as that host's HCA would: the P_Key must match an entry (the
//! Table 16-2 rule, as QP1 checks), so two limited members never meet. It
//! checks the frames it receives (inbound) as the host's HCA would have sent
//! them: a partition the table holds, at no higher membership than it gives
//! (`pkey::port::admits`), so a tenant can neither enter a partition its
//! port is not in nor pose as a full member of one it is in; a limited
//! member's own frames pass, for the outbound check to judge. A refused
//! frame is dropped, or passed on corrupted so that the receiving HCA
//! discards it and counts it: its ICRC broken, as the seed says, and its
//! P_Key made the invalid 0. A sender that knows the switch breaks the ICRC
//! could send one broken beforehand, for the switch to mend; no HCA accepts
//! P_Key 0 whatever the ICRC, and a later port leaves it as it is. QP0 frames are exempt, as SMPs
//! on VL15 are. No QP, group or Q_Key rule applies: a switch sees
//! partitions, not receivers.
//!
//! Every port of the switch is judged: RoCE (or what could be) leaving a
//! port after entering the switch through an interface the port's policy
//! does not list — a bridge port it forgot, a VM's tap added since — is
//! refused whatever the port checks, for no port judged it on the way in.
//! The switch host's own frames entered through none.
//!
//! An access port (`access_pkey`) stands in for the HCA of a host that
//! cannot stamp (an unmodified rdma_rxe, whose every frame carries 0xFFFF):
//! every QP behind it is, in effect, in the port's partition and no other.
//! A RoCE v2 frame entering with 0xFFFF is judged with, and gets, the
//! port's key; one entering with any other key, or RoCE v1 (which cannot be
//! stamped), is refused: such a tenant has no other key to send, and one
//! that makes a frame by hand must not reach another partition its port's
//! table happens to hold (the default one, typically). A frame leaving must
//! match the port's key itself (Table 16-2), as the emulated HCA's QPs
//! would check it; a QP1 (GSI) frame, any entry of the port's table, as
//! QP1 does. It then gets 0xFFFF back.

use crate::{
    Direction, Outcome, Reason, Stamp, Tables,
    abi::{Config, switch_flags},
    frame::Frame,
    parse::{self, Class, Parsed, Roce},
    pkey,
    stamp::{self, Plan},
    verdict::{GSI_QPN, SMI_QPN},
};

/// What a switch port does with a frame in one direction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortAction {
    pub outcome: Outcome,
    /// The rewrite to make before the frame goes on: an access port's
    /// stamp or restore, or a refused frame's corruption.
    pub rewrite: Rewrite,
}

/// A rewrite to make, or not, with every field defined whatever the case:
/// an `Option<Result<Plan, Stamp>>` leaves the payloads of the cases it is
/// not in undefined, and the verifier refuses the spills of such registers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Rewrite {
    /// Whether there is one.
    pub wanted: bool,
    /// What it writes, unless it cannot be made (`failed`).
    pub plan: Plan,
    pub failed: bool,
    /// Why it cannot be made, when `failed`.
    pub why: Stamp,
}

impl Rewrite {
    const NONE: Rewrite = Rewrite {
        wanted: false,
        plan: Plan {
            pkey_at: 0,
            old: 0,
            new: 0,
            udp_at: 0,
            icrc_at: 0,
            corrupt: false,
        },
        failed: false,
        why: Stamp::NotRoce,
    };

    #[inline(always)]
    fn of(located: Result<Plan, Stamp>) -> Rewrite {
        match located {
            Ok(plan) => Rewrite {
                wanted: true,
                plan,
                ..Rewrite::NONE
            },
            Err(why) => Rewrite {
                wanted: true,
                failed: true,
                why,
                ..Rewrite::NONE
            },
        }
    }
}

/// What a switch port does with a frame received on it (`Inbound`) or
/// forwarded out of it (`Outbound`); `None` when it neither checks nor
/// stamps in that direction. Whatever a port checks, RoCE leaving it that
/// entered through an interface its policy does not list is refused
/// (`unlisted_port`): no port of the switch judged it on the way in.
#[inline(always)]
pub fn judge<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    tables: &T,
    config: &Config,
    direction: Direction,
) -> Option<PortAction> {
    judge_parsed(frame, parse::classify(frame), tables, config, direction)
}

/// Whether a port reads a frame in `direction` at all: it checks (or, an
/// access port, rewrites) that way, or the frame is leaving after entering
/// the switch elsewhere, whose way in is asked. [`judge`] says `None` of
/// any other frame, which the kernel therefore does not even locate.
#[inline(always)]
pub fn reads<F: Frame + ?Sized>(frame: &F, config: &Config, direction: Direction) -> bool {
    checks(config, direction) || came_from(frame, direction) != 0
}

/// Whether a port checks frames in `direction`. An access port always
/// checks both ways: unchecked, it would stamp or restore whatever came
/// (the policy refuses such a port too).
#[inline(always)]
fn checks(config: &Config, direction: Direction) -> bool {
    config.access_pkey != 0
        || config.switch
            & match direction {
                Direction::Inbound => switch_flags::INBOUND,
                Direction::Outbound => switch_flags::OUTBOUND,
            }
            != 0
}

/// Where a frame leaving came from (0: the switch host itself).
#[inline(always)]
fn came_from<F: Frame + ?Sized>(frame: &F, direction: Direction) -> u32 {
    match direction {
        Direction::Inbound => 0,
        Direction::Outbound => frame.ingress_ifindex(),
    }
}

/// [`judge`] of a frame already classified as `parsed`.
#[inline(always)]
pub fn judge_parsed<F: Frame + ?Sized, T: Tables>(
    frame: &F,
    parsed: Parsed,
    tables: &T,
    config: &Config,
    direction: Direction,
) -> Option<PortAction> {
    let access = config.access_pkey;
    let checks = checks(config, direction);
    let iif = came_from(frame, direction);
    // What `reads` says, from the values computed once.
    if !checks && iif == 0 {
        return None;
    }
    let unlisted = iif != 0 && parsed.class != Class::NotRoce && !tables.listed(iif);
    if !checks && access == 0 && !unlisted {
        return None;
    }
    let roce = parsed.roce;
    let (roce, reason, allowed) = match parsed.class {
        Class::NotRoce => (None, Reason::NotRoce, true),
        // No port judged it on the way in: whatever it says, it goes nowhere.
        Class::Malformed if unlisted => (None, Reason::UnlistedPort, false),
        Class::Roce if unlisted => (Some(roce), Reason::UnlistedPort, false),
        // Fail closed where the port checks, exactly as a host does.
        Class::Malformed => (None, Reason::Malformed, !checks),
        Class::Roce if roce.aggregate(frame) => (Some(roce), Reason::Gso, !checks),
        // The SMI is a member of every partition.
        Class::Roce if roce.dest_qp() == SMI_QPN => (Some(roce), Reason::Smi, true),
        Class::Roce => {
            let key = judged_key(&roce, direction, access);
            let flags = tables.port_flags(pkey::key(key));
            let ok = !checks
                || match direction {
                    Direction::Inbound if access != 0 => {
                        stamps(&roce) && pkey::port::admits(key, flags)
                    }
                    Direction::Inbound => pkey::port::admits(key, flags),
                    Direction::Outbound if access != 0 && roce.dest_qp() != GSI_QPN => {
                        pkey::matches(key, access)
                    }
                    Direction::Outbound => pkey::port::matches(key, flags),
                };
            let reason = if ok {
                Reason::Ok
            } else {
                Reason::PkeyViolation
            };
            (Some(roce), reason, ok)
        }
    };
    let monitor = config.monitor != 0;
    // Only a refused RoCE v2 frame can be corrupted (a corruption that
    // cannot be made drops it, see `settle`): there is a UDP checksum to
    // keep true, for the frame to reach the receiver. One whose P_Key is
    // already the invalid 0 was corrupted by a port before: it goes on as
    // it is.
    let corrupt = !allowed
        && !monitor
        && config.switch & switch_flags::CORRUPT != 0
        && reason == Reason::PkeyViolation;
    let rewrite = match roce {
        Some(r) if corrupt && r.pkey() != pkey::INVALID => {
            Rewrite::of(stamp::corruption(frame, &r))
        }
        Some(r) if allowed && access != 0 && r.dest_qp() != SMI_QPN => {
            access_rewrite(frame, &r, direction, access)
        }
        _ => Rewrite::NONE,
    };
    Some(PortAction {
        outcome: Outcome {
            reason,
            allowed,
            pass: allowed || monitor || corrupt,
            corrupt,
            qp: crate::verdict::NO_QP,
            roce,
        },
        rewrite,
    })
}

/// The P_Key a port judges: an access port's own for a frame entering
/// with the default one, which it is about to get.
#[inline(always)]
fn judged_key(roce: &Roce, direction: Direction, access: u16) -> u16 {
    if direction == Direction::Inbound && access != 0 && stamps(roce) {
        access
    } else {
        roce.pkey()
    }
}

/// Whether an access port stamps this frame on the way in: RoCE v2 (there
/// is a UDP checksum to keep) with the default P_Key.
#[inline(always)]
fn stamps(roce: &Roce) -> bool {
    roce.udp_at().is_some() && roce.pkey() == pkey::DEFAULT
}

/// An access port's rewrite of an allowed frame: in, 0xFFFF becomes the
/// port's key; out, any other key becomes 0xFFFF, which is all the host's
/// rdma_rxe accepts.
#[inline(always)]
fn access_rewrite<F: Frame + ?Sized>(
    frame: &F,
    roce: &Roce,
    direction: Direction,
    access: u16,
) -> Rewrite {
    match direction {
        Direction::Inbound if stamps(roce) => Rewrite::of(stamp::plan(frame, roce, access)),
        // Never a corrupted frame's invalid key: it stays refused.
        Direction::Outbound
            if roce.udp_at().is_some()
                && roce.pkey() != pkey::DEFAULT
                && pkey::is_valid(roce.pkey()) =>
        {
            Rewrite::of(stamp::plan(frame, roce, pkey::DEFAULT))
        }
        _ => Rewrite::NONE,
    }
}

impl PortAction {
    /// The frame's final outcome once its rewrite was made (`made`:
    /// whether it was, else `why` not); `count` gets the stamping outcome,
    /// if there is one. A rewrite that failed fails closed where it
    /// matters: a corruption not made, or a stamp not given on the way in
    /// (the frame would go on with 0xFFFF, which every unmodified host
    /// accepts), drops the frame; a restore not made on the way out leaves
    /// a key the host's rdma_rxe refuses by itself.
    #[inline(always)]
    pub fn settle(
        self,
        direction: Direction,
        made: bool,
        why: Stamp,
        count: impl FnOnce(Stamp),
    ) -> Outcome {
        let mut outcome = self.outcome;
        if outcome.corrupt {
            // A corruption not made is a drop, not a stamping outcome.
            outcome.corrupt = made;
            outcome.pass = made;
            return outcome;
        }
        count(match (made, direction) {
            (true, Direction::Inbound) => Stamp::Stamped,
            (true, Direction::Outbound) => Stamp::Restored,
            (false, _) => why,
        });
        if !made && direction == Direction::Inbound {
            outcome.reason = Reason::Malformed;
            outcome.allowed = false;
            outcome.pass = false;
        }
        outcome
    }
}
