//! What the RDMA-core probes (pkeyfw-probes) learn from the verbs a QP's
//! program calls, and the rules that keep a local tenant from poisoning it.
//!
//! Stamping must know which local QP sends a connected frame, and a frame
//! names only its destination (BTH DestQP, IP destination). The probes watch
//! `ib_modify_qp_with_udata` and record, per local QP, the peer it was
//! connected to (`PEERS`: peer → QP, `OWNERS`: QP → peer). Any local user can
//! call that verb, as often as it likes, with any destination; so
//! [`connected`] records only a modify that succeeded, only for a QP the
//! policy binds, one peer per QP (a new one replaces its old one), and never
//! takes a peer that another live bound QP holds. When the tables are full,
//! nothing is recorded and the QP's frames are stamped as unbound: applying
//! a policy never waits on them.
//!
//! The same probes report a QP that joins a multicast group of a partition
//! it is not in ([`joined`]): rxe delivers a group's frames to every QP of
//! the device attached to it, after the filter has judged them once.

use crate::{abi::QpEntry, pkey};

crate::named_enum! {
    /// What the probes made of a verb. The value indexes the per-outcome
    /// counters (`CAPTURES`), so the order is part of the ABI.
    pub enum Capture: u32 as counter {
        /// A bound QP was connected to a peer: recorded for stamping.
        Recorded = 0 => "recorded",
        /// A modify that gave a peer failed: nothing recorded.
        Failed = 1 => "failed",
        /// The QP is not bound by the policy: nothing recorded.
        Unbound = 2 => "unbound",
        /// Another live bound QP holds the peer: refused, as two local QPs
        /// cannot be connected to one remote QP.
        Taken = 3 => "taken",
        /// No room left: nothing recorded, the QP's frames are stamped as
        /// unbound (the port's default P_Key); or no stats slot left for a
        /// QP a rule binds at its creation: left to userspace's binding.
        Full = 4 => "full",
        /// A destroyed QP's peer, removed.
        Released = 5 => "released",
        /// A QP joined a multicast group of its own partition, or one the
        /// policy does not list.
        Joined = 6 => "joined",
        /// A QP joined a group of a partition it is not in: it receives the
        /// group's frames. Reported; a probe cannot refuse the verb.
        ForeignJoin = 7 => "foreign_join",
        /// A QP a `[[bind]]` rule matched was bound as it was created.
        Bound = 8 => "bound",
        /// A UD QP bound with its own Q_Key set it: its frames are checked
        /// against it from now on.
        QkeyCaptured = 9 => "qkey_captured",
        /// A UD QP whose Q_Key the policy pins set another one: reported,
        /// and its frames are still checked against the policy's.
        QkeyMismatch = 10 => "qkey_mismatch",
    }
}

/// A connected QP's peer as its outgoing frames name it: the remote QPN and
/// the remote address (IPv4 as v4-mapped IPv6; all zeros when the verb gave
/// no address vector).
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PeerKey {
    pub remote_qpn: u32,
    pub addr: [u8; 16],
}

/// The probes' view of the maps: `PEERS`, `OWNERS` and the live policy.
pub trait Peers {
    /// The local QP recorded as connected to `peer`.
    fn owner(&self, peer: &PeerKey) -> Option<u32>;
    /// The peer recorded for local QP `qpn`.
    fn peer_of(&self, qpn: u32) -> Option<PeerKey>;
    /// The live policy's entry for local QP `qpn`.
    fn bound(&self, qpn: u32) -> Option<QpEntry>;
    /// Records `qpn` ↔ `peer`; `false` when a table is full (then nothing
    /// is recorded).
    fn record(&mut self, qpn: u32, peer: &PeerKey) -> bool;
    /// Forgets `qpn`'s peer, and the peer's owner if it is `qpn`.
    fn forget(&mut self, qpn: u32, peer: &PeerKey);
}

/// A modify of local QP `qpn` that gave it `peer` returned; `succeeded`:
/// it returned 0.
#[inline(always)]
pub fn connected<T: Peers>(t: &mut T, qpn: u32, peer: &PeerKey, succeeded: bool) -> Capture {
    if !succeeded {
        return Capture::Failed;
    }
    if t.bound(qpn).is_none() {
        return Capture::Unbound;
    }
    if let Some(owner) = t.owner(peer)
        && owner != qpn
        && t.peer_of(owner).as_ref() == Some(peer)
        && t.bound(owner).is_some()
    {
        return Capture::Taken;
    }
    if let Some(old) = t.peer_of(qpn) {
        t.forget(qpn, &old);
    }
    if t.record(qpn, peer) {
        Capture::Recorded
    } else {
        Capture::Full
    }
}

/// Local QP `qpn` is being destroyed: its peer goes with it.
#[inline(always)]
pub fn destroyed<T: Peers>(t: &mut T, qpn: u32) -> Option<Capture> {
    let peer = t.peer_of(qpn)?;
    t.forget(qpn, &peer);
    Some(Capture::Released)
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
    extern crate std;
    use std::collections::BTreeMap;

    use super::*;
    use crate::abi::QpType;

    /// The maps, in memory, with room for `room` QPs.
    struct Mem {
        peers: BTreeMap<PeerKey, u32>,
        owners: BTreeMap<u32, PeerKey>,
        bound: BTreeMap<u32, QpEntry>,
        room: usize,
    }

    impl Peers for Mem {
        fn owner(&self, peer: &PeerKey) -> Option<u32> {
            self.peers.get(peer).copied()
        }
        fn peer_of(&self, qpn: u32) -> Option<PeerKey> {
            self.owners.get(&qpn).copied()
        }
        fn bound(&self, qpn: u32) -> Option<QpEntry> {
            self.bound.get(&qpn).copied()
        }
        fn record(&mut self, qpn: u32, peer: &PeerKey) -> bool {
            if self.owners.len() >= self.room && !self.owners.contains_key(&qpn) {
                return false;
            }
            self.owners.insert(qpn, *peer);
            self.peers.insert(*peer, qpn);
            true
        }
        fn forget(&mut self, qpn: u32, peer: &PeerKey) {
            self.owners.remove(&qpn);
            if self.peers.get(peer) == Some(&qpn) {
                self.peers.remove(peer);
            }
        }
    }

    fn entry(pkey: u16) -> QpEntry {
        QpEntry {
            qkey: 0,
            slot: 0,
            pkey,
            qp_type: QpType::Rc as u8,
            flags: 0,
        }
    }

    fn mem(bound: &[u32], room: usize) -> Mem {
        Mem {
            peers: BTreeMap::new(),
            owners: BTreeMap::new(),
            bound: bound.iter().map(|&q| (q, entry(0x8001))).collect(),
            room,
        }
    }

    fn peer(remote_qpn: u32, last: u8) -> PeerKey {
        let mut addr = [0; 16];
        addr[10] = 0xff;
        addr[11] = 0xff;
        addr[15] = last;
        PeerKey { remote_qpn, addr }
    }

    #[test]
    fn failed_and_unbound_modifies_record_nothing() {
        let mut t = mem(&[0x11], 8);
        assert_eq!(
            connected(&mut t, 0x11, &peer(0x20, 1), false),
            Capture::Failed
        );
        assert_eq!(
            connected(&mut t, 0x12, &peer(0x20, 1), true),
            Capture::Unbound
        );
        assert!(t.peers.is_empty() && t.owners.is_empty());
    }

    #[test]
    fn a_live_bound_owner_keeps_its_peer() {
        let mut t = mem(&[0x11, 0x12], 8);
        assert_eq!(
            connected(&mut t, 0x11, &peer(0x20, 1), true),
            Capture::Recorded
        );
        assert_eq!(
            connected(&mut t, 0x12, &peer(0x20, 1), true),
            Capture::Taken
        );
        assert_eq!(t.owner(&peer(0x20, 1)), Some(0x11));
        // The same remote QPN on another host is another peer.
        assert_eq!(
            connected(&mut t, 0x12, &peer(0x20, 2), true),
            Capture::Recorded
        );
        assert_eq!(t.owner(&peer(0x20, 1)), Some(0x11));
        assert_eq!(t.owner(&peer(0x20, 2)), Some(0x12));
    }

    #[test]
    fn a_stale_owner_gives_way() {
        let mut t = mem(&[0x11, 0x12], 8);
        connected(&mut t, 0x11, &peer(0x20, 1), true);
        // 0x11 is no longer bound (its rule went, or it is gone).
        t.bound.remove(&0x11);
        assert_eq!(
            connected(&mut t, 0x12, &peer(0x20, 1), true),
            Capture::Recorded
        );
        assert_eq!(t.owner(&peer(0x20, 1)), Some(0x12));
    }

    #[test]
    fn one_peer_per_qp_however_often_it_is_modified() {
        let mut t = mem(&[0x11], 8);
        for r in 0..1000 {
            connected(&mut t, 0x11, &peer(r, 1), true);
        }
        assert_eq!(t.peers.len(), 1);
        assert_eq!(t.owner(&peer(999, 1)), Some(0x11));
        assert_eq!(destroyed(&mut t, 0x11), Some(Capture::Released));
        assert!(t.peers.is_empty() && t.owners.is_empty());
        assert_eq!(destroyed(&mut t, 0x11), None);
    }

    #[test]
    fn full_tables_record_nothing() {
        let mut t = mem(&[0x11, 0x12], 1);
        assert_eq!(
            connected(&mut t, 0x11, &peer(0x20, 1), true),
            Capture::Recorded
        );
        assert_eq!(connected(&mut t, 0x12, &peer(0x21, 1), true), Capture::Full);
        assert_eq!(t.owner(&peer(0x21, 1)), None);
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
