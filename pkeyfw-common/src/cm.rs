//! Connection management (IBA 12): the MADs ib_cm sends on QP1 to set up
//! and tear down connections — rdma_cm's, on RoCE — read as far as
//! partitions need them.
//!
//! On InfiniBand a CM MAD carries its connection's P_Key in its BTH, and a
//! request only ever meets listeners of its partition: ib_cm refuses a
//! PartitionKey its port lacks, and rdma_cm finds the listener through the
//! IPoIB interface of the request's P_Key. RoCE sets every path's P_Key to
//! 0xFFFF, so pkeyfw puts the partition back: egress stamps each CM MAD
//! with its connection's P_Key (the binding of the QP it names, which a
//! probe on the sending verb records by its [`Mad::sender`]'s ID), and
//! the verdict lets a REQ or
//! SIDR_REQ in only when its P_Key matches the partition of the listener
//! it names ([`Request::listener`]).

use crate::{
    abi::{ConnectionKind, ListenKey, connection_key, family, v4_mapped},
    frame::Frame,
    parse::{Bth, Deth, Roce},
};

/// The Communication Manager's management class (`IB_MGMT_CLASS_CM`).
pub const CLASS: u8 = 0x07;

/// CM attribute IDs (IBA 12.6.1).
pub mod attr {
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001a;
}

/// From a datagram's BTH to its MAD: the BTH and the DETH.
const MAD_AT: usize = Bth::LEN + Deth::LEN;
/// A MAD's common header (IBA 13.4.2); its class's data follows.
const MAD_HEADER: usize = 24;
/// Where the attribute ID is in the common header.
const ATTR_AT: usize = 16;

/// In a REQ's and a SIDR_REQ's CM data: the ServiceID, and where each one's
/// private data starts (rdma_cm opens it with a header of its own).
const SERVICE_ID_AT: usize = 8;
const REQ_PRIVATE_AT: usize = 140;
const SIDR_REQ_PRIVATE_AT: usize = 16;
/// In rdma_cm's header (`struct cma_hdr`): its version (0), the IP version
/// (the high nibble), the port, the source address and the destination
/// address (IPv4 in the last four bytes).
const CMA_VERSION: u8 = 0;
const CMA_DST_AT: usize = 20;

/// A CM MAD in a datagram to or from QP1: its attribute, where its CM
/// data (the attribute's message) starts, and where the datagram's payload
/// ends (its ICRC): a field past it is not there, whatever the frame holds
/// beyond.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Mad {
    pub attr: u16,
    pub data: usize,
    end: usize,
}

/// The CM MAD a datagram carries, if its header says so: the caller knows
/// it is to or from QP1. Not necessarily whole: a MAD is 256 bytes, but a
/// sender may send less, and the fields are read where they are (a field
/// cut off is none).
#[inline(always)]
pub fn mad<F: Frame + ?Sized>(frame: &F, roce: &Roce) -> Option<Mad> {
    if !roce.ud() {
        return None;
    }
    let at = roce.bth_at() + MAD_AT;
    let end = (roce.bth_at() + roce.packet_len()).checked_sub(ICRC)?;
    if at + MAD_HEADER > end {
        return None;
    }
    // Base version, class, class version, method.
    if frame.header::<[u8; 4]>(at)?[1] != CLASS {
        return None;
    }
    Some(Mad {
        attr: u16::from_be_bytes(frame.header(at + ATTR_AT)?),
        data: at + MAD_HEADER,
        end,
    })
}

/// The ICRC that ends a RoCE packet.
const ICRC: usize = 4;

impl Mad {
    /// Whether it asks for a connection (REQ) or a UD service (SIDR_REQ):
    /// what only a listener answers.
    #[inline(always)]
    pub const fn is_request(&self) -> bool {
        matches!(self.attr, attr::REQ | attr::SIDR_REQ)
    }

    /// The `CONNECTIONS` key of the side that sends it: its own
    /// communication ID, which every CM message but a SIDR_REP opens with
    /// (a REQ's and a SIDR_REQ's LocalCommID and RequestID, every later
    /// one's LocalCommID), or the request a SIDR_REP answers. None for a
    /// MAD of no connection (ClassPortInfo, an attribute ib_cm does not
    /// send).
    #[inline(always)]
    pub fn sender<F: Frame + ?Sized>(&self, frame: &F) -> Option<u64> {
        let kind = match self.attr {
            attr::REQ
            | attr::MRA
            | attr::REJ
            | attr::REP
            | attr::RTU
            | attr::DREQ
            | attr::DREP
            | attr::SIDR_REQ
            | attr::LAP
            | attr::APR => ConnectionKind::Own,
            attr::SIDR_REP => ConnectionKind::SidrRequest,
            _ => return None,
        };
        let id = u32::from_be_bytes(self.field(frame, 0)?);
        Some(connection_key(kind, id))
    }

    /// The `T` at offset `at` of the CM data, if the datagram holds it.
    #[inline(always)]
    fn field<F: Frame + ?Sized, T: Copy>(&self, frame: &F, at: usize) -> Option<T> {
        if self.data + at + size_of::<T>() > self.end {
            return None;
        }
        frame.header(self.data + at)
    }

    /// What a request names of its listener (None for any other message,
    /// or one cut short). A request whose private data holds no rdma_cm
    /// header of an IP address names no address: rdma_cm delivers it to
    /// no IP listener, and only the wildcard of both families is looked up.
    #[inline(always)]
    pub fn request<F: Frame + ?Sized>(&self, frame: &F) -> Option<Request> {
        let private = match self.attr {
            attr::REQ => REQ_PRIVATE_AT,
            attr::SIDR_REQ => SIDR_REQ_PRIVATE_AT,
            _ => return None,
        };
        let service_id = u64::from_be_bytes(self.field(frame, SERVICE_ID_AT)?);
        let head = self.field::<F, [u8; 2]>(frame, private)?;
        let dst = self.field::<F, [u8; 16]>(frame, private + CMA_DST_AT)?;
        let (family, addr) = match (head[0], head[1] >> 4) {
            (CMA_VERSION, 4) => (
                family::INET,
                v4_mapped([dst[12], dst[13], dst[14], dst[15]]),
            ),
            (CMA_VERSION, 6) => (family::INET6, dst),
            _ => (family::ANY, [0; 16]),
        };
        Some(Request {
            service_id,
            family,
            addr,
        })
    }
}

/// What a REQ or SIDR_REQ names: the service and the address it is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub service_id: u64,
    /// [`family`] of the address; [`family::ANY`] where it names none.
    pub family: u32,
    pub addr: [u8; 16],
}

impl Request {
    /// The listeners it could reach, as rdma_cm matches them
    /// (`cma_match_private_data`), most specific first ([`Specific`]).
    /// rdma_cm lets no two of them listen at once on a service.
    #[inline(always)]
    pub const fn listener(&self, which: Specific) -> ListenKey {
        let (family, addr) = match which {
            Specific::Address => (self.family, self.addr),
            Specific::Family => (self.family, [0; 16]),
            Specific::Any => (family::ANY, [0; 16]),
        };
        ListenKey {
            service_id: self.service_id,
            family,
            _pad: 0,
            addr,
        }
    }
}

/// How specific a listener a request could reach is ([`Request::listener`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Specific {
    /// Bound to the request's address.
    Address,
    /// Bound to the wildcard of the request's family only (`afonly`).
    Family,
    /// Bound to the wildcard of both families.
    Any,
}

/// The `LISTENERS` key of a listener bound to `addr` of address family
/// `af` (the kernel's `AF_INET` or `AF_INET6`) on ServiceID `service_id`,
/// a wildcard of both families unless `afonly`, as [`Request::listener`]
/// looks it up.
#[inline(always)]
pub const fn listen_key(service_id: u64, af: u32, addr: [u8; 16], afonly: bool) -> ListenKey {
    let wildcard = u128::from_ne_bytes(addr) == 0 || is_v4_any(&addr, af);
    let family = if wildcard && !afonly { family::ANY } else { af };
    ListenKey {
        service_id,
        family,
        _pad: 0,
        addr: if wildcard { [0; 16] } else { addr },
    }
}

/// 0.0.0.0, v4-mapped.
#[inline(always)]
const fn is_v4_any(addr: &[u8; 16], af: u32) -> bool {
    af == family::INET && u128::from_ne_bytes(*addr) == u128::from_ne_bytes(v4_mapped([0; 4]))
}

/// rdma_cm's ServiceID of port `port` in port space `ps`
/// (`rdma_get_service_id`).
#[inline(always)]
pub const fn service_id(ps: u32, port: u16) -> u64 {
    ((ps as u64) << 16) + port as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rdma_cm's TCP port space.
    const PS_TCP: u32 = 0x0106;

    #[test]
    fn a_wildcard_of_both_families_is_one_key() {
        let sid = service_id(PS_TCP, 7174);
        assert_eq!(sid, 0x0000_0000_0106_1c06);
        let any = listen_key(sid, family::INET, v4_mapped([0; 4]), false);
        assert_eq!(any, listen_key(sid, family::INET6, [0; 16], false));
        assert_eq!(any.family, family::ANY);
        // afonly: its family's wildcard alone.
        let only = listen_key(sid, family::INET, v4_mapped([0; 4]), true);
        assert_eq!((only.family, only.addr), (family::INET, [0; 16]));
        let bound = listen_key(sid, family::INET, v4_mapped([10, 0, 0, 1]), false);
        let req = Request {
            service_id: sid,
            family: family::INET,
            addr: v4_mapped([10, 0, 0, 1]),
        };
        assert_eq!(
            [Specific::Address, Specific::Family, Specific::Any].map(|s| req.listener(s)),
            [bound, only, any]
        );
    }
}
