//! A QP the QP-creation probe had no room to bind is quarantined (a bit
//! per QPN in `QUARANTINE`), never taken for one no rule binds: the real
//! XDP program refuses every frame to it, whatever the unknown-QP rule;
//! egress drops what rdma_rxe says it sends. (The probe setting the bit
//! needs rdma_rxe: the guest's `fill-table` scenario.)

use crate::common;

use common::cases::{QPA, UD};
use pkeyfw::{loading::filter::Filter, policy::Policy};
use pkeyfw_common::{
    Reason, Stamp,
    abi::{BindSpec, GroupEntry, QpEntry},
    stamp::{self, Action, Origin},
    tenant::Rules,
    verdict::Tables,
};
use pkeyfw_testkit::wire::Packet;

/// A QPN no policy entry names.
const NEW_QP: u32 = 0x40;

/// The base policy, passing frames to unknown QPs: the worst a full table
/// could fall to.
fn passing_policy() -> Policy {
    common::policy(
        &common::cases::BASE.replace("unknown_qp = \"default-pkey\"", "unknown_qp = \"pass\""),
    )
}

#[test]
fn a_quarantined_qp_takes_no_frame() {
    common::require_root();
    let policy = passing_policy();
    let mut filter = Filter::load(policy.qpns()).unwrap();
    filter.apply(&policy).unwrap();
    let to_new = Packet::rc(0x8001, NEW_QP).bytes();
    let to_bound = Packet::rc(0x8001, QPA).bytes();
    assert_eq!(
        filter.run_counted(&to_new).unwrap(),
        (true, Reason::UnknownQp)
    );
    assert!(filter.maps().quarantined().unwrap().is_empty());

    for qpn in [NEW_QP, QPA, 0x00ff_fffe] {
        filter.maps_mut().quarantine(qpn).unwrap();
    }
    assert_eq!(
        filter.run_counted(&to_new).unwrap(),
        (false, Reason::UnknownQp),
        "unknown_qp = \"pass\" must not pass a quarantined QP's frames"
    );
    // A binding made since (userspace's) judges the QP.
    assert_eq!(filter.run_counted(&to_bound).unwrap(), (true, Reason::Ok));
    assert_eq!(
        filter.maps().quarantined().unwrap(),
        vec![QPA, NEW_QP, 0x00ff_fffe]
    );
}

/// The policy's tables with some QPNs quarantined.
struct Quarantined<'a>(&'a Policy, &'a [u32]);

impl Tables for Quarantined<'_> {
    fn qp(&self, qpn: u32) -> Option<QpEntry> {
        self.0.qp(qpn)
    }
    fn group(&self, addr: &[u8; 16]) -> Option<GroupEntry> {
        self.0.group(addr)
    }
    fn port_flags(&self, key: u16) -> u8 {
        Tables::port_flags(self.0, key)
    }
    fn quarantined(&self, qpn: u32) -> bool {
        self.1.contains(&qpn)
    }
}

impl Rules for Quarantined<'_> {
    fn rule(&self, index: u32) -> Option<&BindSpec> {
        self.0.rule(index)
    }
}

/// What a quarantined QP sends is dropped; a process naming it is only a
/// process; a bound QP is judged by its binding.
#[test]
fn a_quarantined_qps_frames_do_not_leave() {
    let mut policy = passing_policy();
    policy.stamp = true;
    let tables = Quarantined(&policy, &[NEW_QP, UD]);
    let ud = |src_qp| {
        Packet {
            src_qp,
            ..Packet::ud(0xffff, 0x99, 0x1111_1111)
        }
        .bytes()
    };
    let outcome = |frame: &[u8], origin| {
        stamp::egress(frame, &tables, &policy.config(), || origin).map(|a| match a {
            Action::Rewrite(_, s) | Action::Leave(s) | Action::Drop(s) => s,
        })
    };
    assert_eq!(
        outcome(&ud(NEW_QP), Origin::Qp(NEW_QP)),
        Some(Stamp::Quarantined)
    );
    assert_eq!(
        outcome(&ud(NEW_QP), Origin::Other),
        Some(Stamp::Unbound),
        "a process's frame is a process's"
    );
    assert_eq!(outcome(&ud(UD), Origin::Qp(UD)), Some(Stamp::Stamped));
}
