//! CM MADs (IBA 12.6) as ib_cm sends them for rdma_cm over RoCE v2, byte
//! by byte: the tests' CM frames, and the REQs the lab's attacker crafts.
//! Fields as `cm_format_req` and rdma_cm's `cma_connect_ib` fill them.

use std::net::Ipv4Addr;

use pkeyfw_common::{
    cm::{CLASS, attr, service_id},
    verdict::{GSI_QKEY, GSI_QPN},
};

use crate::wire::Packet;

/// rdma_cm's port spaces (`enum rdma_ucm_port_space`).
pub const PS_TCP: u32 = 0x0106;
pub const PS_UDP: u32 = 0x0111;

/// A MAD, whole.
pub const MAD_LEN: usize = 256;
/// The MAD's common header; the CM data follows it.
const HEADER: usize = 24;

/// A CM MAD of attribute `attr` whose CM data opens with the sender's
/// communication ID `local` and the peer's `remote` (REQ and SIDR_REQ:
/// `remote` is not there; SIDR_REP: `local` is the request's).
pub fn mad(attr: u16, local: u32, remote: u32) -> Vec<u8> {
    let mut m = vec![0; MAD_LEN];
    // Base version 1, the CM class, class version 2, method Send.
    m[..4].copy_from_slice(&[1, CLASS, 2, 3]);
    m[8..16].copy_from_slice(&u64::from(local).to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[HEADER..HEADER + 4].copy_from_slice(&local.to_be_bytes());
    if attr != attr::REQ && attr != attr::SIDR_REQ && attr != attr::SIDR_REP {
        m[HEADER + 4..HEADER + 8].copy_from_slice(&remote.to_be_bytes());
    }
    m
}

/// What a REQ or SIDR_REQ of rdma_cm says.
#[derive(Clone, Debug)]
pub struct Request {
    /// The requester's communication ID (a REQ's LocalCommID, a
    /// SIDR_REQ's RequestID).
    pub comm_id: u32,
    /// rdma_cm's port space and the listener's port.
    pub ps: u32,
    pub port: u16,
    /// The requester's address and port, and the listener's address
    /// (rdma_cm's header in the private data: what it matches listeners
    /// by).
    pub src: Ipv4Addr,
    pub src_port: u16,
    pub dst: Ipv4Addr,
    /// The QP it connects (REQ).
    pub qpn: u32,
}

impl Request {
    /// A request from `src` to the listener at `dst`:`port` (TCP port space).
    pub fn to(src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> Request {
        Request {
            comm_id: 0x1234_5678,
            ps: PS_TCP,
            port,
            src,
            src_port: 40_000,
            dst,
            qpn: 0x11,
        }
    }

    /// A REQ for an RC connection, as ib_cm formats rdma_cm's: P_Key
    /// 0xFFFF in the message (RoCE's path), the primary path's GIDs the
    /// v4-mapped addresses, routed (permissive LIDs), rdma_cm's timeouts
    /// and retries.
    pub fn req(&self) -> Vec<u8> {
        let mut m = mad(attr::REQ, self.comm_id, 0);
        let d = &mut m[HEADER..];
        d[8..16].copy_from_slice(&service_id(self.ps, self.port).to_be_bytes());
        // LocalCA GUID: any.
        d[16..24].copy_from_slice(&0x0200_00ff_fe00_0001u64.to_be_bytes());
        // LocalQPN, then responder resources.
        d[32..35].copy_from_slice(&self.qpn.to_be_bytes()[1..]);
        d[35] = 1;
        d[39] = 1; // initiator depth
        // Remote CM response timeout 20, transport RC (0), no flow control.
        d[43] = 20 << 3;
        d[44..47].copy_from_slice(&[0x00, 0x12, 0x34]); // starting PSN
        // Local CM response timeout 20, retry count 7.
        d[47] = (20 << 3) | 7;
        d[48..50].copy_from_slice(&0xffffu16.to_be_bytes());
        // Path MTU 1024 (3), RNR retry 7; max CM retries 15.
        d[50] = (3 << 4) | 7;
        d[51] = 15 << 4;
        d[52..56].copy_from_slice(&[0xff; 4]); // permissive LIDs
        d[56..72].copy_from_slice(&self.src.to_ipv6_mapped().octets());
        d[72..88].copy_from_slice(&self.dst.to_ipv6_mapped().octets());
        d[91] = 0x3f; // packet rate: any
        d[93] = 64; // hop limit: routed
        d[95] = 19 << 3; // local ACK timeout
        d[140..176].copy_from_slice(&self.cma_header());
        m
    }

    /// A SIDR_REQ for a UD service (UDP port space).
    pub fn sidr_req(&self) -> Vec<u8> {
        let mut m = mad(attr::SIDR_REQ, self.comm_id, 0);
        let d = &mut m[HEADER..];
        d[4..6].copy_from_slice(&0xffffu16.to_be_bytes());
        d[8..16].copy_from_slice(&service_id(self.ps, self.port).to_be_bytes());
        d[16..52].copy_from_slice(&self.cma_header());
        m
    }

    /// rdma_cm's header (`struct cma_hdr`): version 0, IP version 4, the
    /// requester's port, its address and the listener's (IPv4 in each
    /// address's last four bytes).
    fn cma_header(&self) -> [u8; 36] {
        let mut h = [0; 36];
        h[1] = 4 << 4;
        h[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        h[16..20].copy_from_slice(&self.src.octets());
        h[32..36].copy_from_slice(&self.dst.octets());
        h
    }
}

/// A datagram from QP1 to QP1 (the GSI's Q_Key) carrying `mad`, with P_Key
/// `pkey`, from `src` to `dst`.
pub fn gsi(mad: Vec<u8>, pkey: u16, src: Ipv4Addr, dst: Ipv4Addr) -> Packet {
    let mut p = Packet {
        src_qp: GSI_QPN,
        payload: mad,
        ..Packet::ud(pkey, GSI_QPN, GSI_QKEY)
    };
    if let crate::wire::Net::V4 { src: s, dst: d, .. } = &mut p.net {
        (*s, *d) = (src, dst);
    }
    p
}
