//! The decision logic of pkeyfw-common, on the host: every case of the table.

use crate::common;

use pkeyfw_common::{Reason, judge};

#[test]
fn every_case_on_the_host() {
    let mut failures = Vec::new();
    for case in common::cases::all() {
        let got = judge(&case.frame[..], &case.policy, &case.policy.config());
        if (got.reason, got.pass) != (case.reason, case.pass) {
            failures.push(format!(
                "{}: want {:?}/{}, got {:?}/{}",
                case.name, case.reason, case.pass, got.reason, got.pass
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_table_covers_every_reason_both_ways_it_can_go() {
    let cases = common::cases::all();
    // A host port's reasons; a switch port's own is tested below.
    for reason in Reason::ALL
        .into_iter()
        .filter(|&r| r != Reason::UnlistedPort)
    {
        assert!(
            cases.iter().any(|c| c.reason == reason),
            "no case for {}",
            reason.name()
        );
    }
    assert!(
        cases
            .iter()
            .any(|c| c.reason == Reason::UnknownQp && c.pass)
    );
    assert!(
        cases
            .iter()
            .any(|c| c.reason == Reason::UnknownQp && !c.pass)
    );
}

#[test]
fn truncated_frames_are_malformed_on_the_host() {
    let policy = common::policy(common::cases::BASE);
    for (name, packet) in common::cases::valid_frames() {
        let frame = packet.bytes();
        let full = judge(&frame[..], &policy, &policy.config());
        assert_eq!(full.reason, Reason::Ok, "{name} is a valid frame");
        for len in 0..frame.len() {
            let got = judge(&frame[..len], &policy, &policy.config());
            if len < packet.headers_end() {
                assert_eq!(
                    (got.reason, got.pass),
                    (Reason::Malformed, false),
                    "{name} cut at {len}"
                );
            } else {
                assert_eq!(got, full, "{name} cut at {len}, after its headers");
            }
        }
    }
}

/// A GSO/GRO super-packet of RoCE is refused whole (Gso), whatever its
/// first segment; monitor mode passes it; one not to 4791 is not touched.
#[test]
fn a_super_packet_is_refused_whole() {
    use pkeyfw_common::{Frame, InPlace, Window};
    use pkeyfw_testkit::wire::Packet;
    struct Gso<'a>(&'a [u8]);
    impl Frame for Gso<'_> {
        type Bytes<const LEN: usize> = InPlace;
        fn header<T: Copy>(&self, off: usize) -> Option<T> {
            self.0.header(off)
        }
        fn window<const LEN: usize>(&self, off: usize) -> Option<Window<'_, InPlace, LEN>> {
            self.0.window(off)
        }
        fn wire_len(&self) -> usize {
            self.0.len()
        }
        fn gso_size(&self) -> u32 {
            64
        }
    }
    let mut policy = common::policy(common::cases::BASE);
    let smi = Packet::ud(0xffff, 0, 0x1234).bytes();
    assert!(judge(&smi[..], &policy, &policy.config()).pass);
    let o = judge(&Gso(&smi), &policy, &policy.config());
    assert_eq!((o.reason, o.allowed, o.pass), (Reason::Gso, false, false));
    let mut other = Packet::ud(0xffff, 0, 0x1234);
    other.udp_dport = 4792;
    let o = judge(&Gso(&other.bytes()), &policy, &policy.config());
    assert_eq!((o.reason, o.pass), (Reason::NotRoce, true));
    policy.monitor = true;
    let o = judge(&Gso(&smi), &policy, &policy.config());
    assert_eq!((o.reason, o.allowed, o.pass), (Reason::Gso, false, true));
}

/// A frame leaving a switch port after entering the switch through an
/// interface the port's policy does not list is refused (unlisted_port),
/// whatever it is as long as it is or could be RoCE, and whatever the port
/// checks; monitor mode passes it; one the switch host made (no ingress)
/// and one received on the port are judged as ever.
#[test]
fn what_entered_through_an_unlisted_port_leaves_through_none() {
    use pkeyfw::policy::SwitchRole;
    use pkeyfw_common::{Direction, Frame, InPlace, Window, switch};
    use pkeyfw_testkit::wire::Packet;
    struct Entered<'a>(&'a [u8], u32);
    impl Frame for Entered<'_> {
        type Bytes<const LEN: usize> = InPlace;
        fn header<T: Copy>(&self, off: usize) -> Option<T> {
            self.0.header(off)
        }
        fn window<const LEN: usize>(&self, off: usize) -> Option<Window<'_, InPlace, LEN>> {
            self.0.window(off)
        }
        fn wire_len(&self) -> usize {
            self.0.len()
        }
        fn ingress_ifindex(&self) -> u32 {
            self.1
        }
    }
    let mut policy = pkeyfw::policy::Policy::with_table(vec![0x8001]);
    policy.switch = Some(SwitchRole {
        inbound: true,
        outbound: false,
        corrupt: true,
        access: None,
    });
    let judged = |frame: &[u8], iif: u32, direction: Direction, policy: &pkeyfw::policy::Policy| {
        let o = switch::judge(&Entered(frame, iif), policy, &policy.config(), direction)
            .map(|a| a.outcome);
        o.map(|o| (o.reason, o.allowed, o.pass, o.corrupt))
    };
    let good = Packet::rc(0x8001, 0x100).bytes();
    let smi = Packet::ud(0x8002, 0, 0).bytes();
    let mut cut = good.clone();
    cut.truncate(Packet::rc(0x8001, 0x100).headers_end() - 1);
    let tcp = pkeyfw_testkit::cases::frames::tcp().bytes();
    let refused = Some((Reason::UnlistedPort, false, false, false));
    for frame in [&good, &smi, &cut] {
        assert_eq!(judged(frame, 7, Direction::Outbound, &policy), refused);
    }
    assert_eq!(judged(&tcp, 7, Direction::Outbound, &policy), None);
    // The port checks nothing outbound: the host's own and a received
    // frame are its business as before.
    assert_eq!(judged(&good, 0, Direction::Outbound, &policy), None);
    assert_eq!(
        judged(&good, 7, Direction::Inbound, &policy),
        Some((Reason::Ok, true, true, false))
    );
    policy.monitor = true;
    assert_eq!(
        judged(&good, 7, Direction::Outbound, &policy),
        Some((Reason::UnlistedPort, false, true, false))
    );
}
