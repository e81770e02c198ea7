//! Classification of an ingress frame: is it RoCE, and if so, what the
//! partition check needs from it (BTH, DETH, destination address).
//!
//! Anything that is or could be RoCE but cannot be read safely is
//! [`Parsed::Malformed`]: the filter fails closed.

use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    udp::UdpHdr,
    vlan::VlanHdr,
};

use crate::frame::{Frame, MAX_OFFSET};

/// EtherTypes, in host order.
pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const IPV6: u16 = 0x86dd;
    pub const VLAN: u16 = 0x8100;
    pub const QINQ: u16 = 0x88a8;
    /// RoCE v1: GRH + BTH directly over Ethernet.
    pub const ROCE_V1: u16 = 0x8915;
}

/// IP protocol / IPv6 next-header numbers the parser acts on.
pub mod proto {
    pub const HOP_BY_HOP: u8 = 0;
    pub const UDP: u8 = 17;
    /// The GRH's next header for a BTH (RoCE v1).
    pub const IBA_BTH: u8 = 0x1b;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const AH: u8 = 51;
    pub const DEST_OPTS: u8 = 60;
}

/// UDP destination port of RoCE v2.
pub const ROCE_V2_PORT: u16 = 4791;
/// VLAN tags accepted in front of the network header; one more is malformed.
pub const MAX_VLAN_TAGS: usize = 2;
/// IPv6 extension headers followed; a longer chain is malformed.
pub const MAX_IPV6_EXT: usize = 4;

/// Base Transport Header (IBA 9.2), 12 bytes.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct Bth {
    pub opcode: u8,
    /// SE, M, PadCnt(2), TVer(4).
    pub flags: u8,
    pub pkey: [u8; 2],
    /// FECN/BECN + reserved.
    pub resv: u8,
    pub dest_qp: [u8; 3],
    /// AckReq + reserved, then PSN.
    pub psn: [u8; 4],
}

impl Bth {
    pub const LEN: usize = 12;

    pub const fn tver(&self) -> u8 {
        self.flags & 0x0f
    }
    pub const fn pkey(&self) -> u16 {
        u16::from_be_bytes(self.pkey)
    }
    pub const fn dest_qp(&self) -> u32 {
        u32::from_be_bytes([0, self.dest_qp[0], self.dest_qp[1], self.dest_qp[2]])
    }
}

/// Datagram Extended Transport Header (UD), 8 bytes.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct Deth {
    pub qkey: [u8; 4],
    pub resv: u8,
    pub src_qp: [u8; 3],
}

impl Deth {
    pub const LEN: usize = 8;

    pub const fn qkey(&self) -> u32 {
        u32::from_be_bytes(self.qkey)
    }
    pub const fn src_qp(&self) -> u32 {
        u32::from_be_bytes([0, self.src_qp[0], self.src_qp[1], self.src_qp[2]])
    }
}

/// Transport of a BTH opcode (its top three bits), as far as RoCE uses it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    Rc,
    Uc,
    Ud,
    Xrc,
    /// RoCE v2 Congestion Notification Packet (opcode 0x81).
    Cnp,
}

/// Opcode class values (opcode & 0xE0).
pub mod opcode {
    pub const CLASS_MASK: u8 = 0xe0;
    pub const RC: u8 = 0x00;
    pub const UC: u8 = 0x20;
    pub const RD: u8 = 0x40;
    pub const UD: u8 = 0x60;
    pub const CNP_CLASS: u8 = 0x80;
    pub const XRC: u8 = 0xa0;
    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;
    pub const CNP: u8 = 0x81;
}

impl Transport {
    /// The transport of `op`, or `None` for opcodes no RoCE stack sends:
    /// RD, UD codes other than SEND_ONLY(_IMM), 0x80-0x9F but CNP, 0xC0-0xFF.
    #[inline(always)]
    pub const fn of(op: u8) -> Option<Transport> {
        match op & opcode::CLASS_MASK {
            opcode::RC => Some(Transport::Rc),
            opcode::UC => Some(Transport::Uc),
            opcode::XRC => Some(Transport::Xrc),
            opcode::UD if op == opcode::UD_SEND_ONLY || op == opcode::UD_SEND_ONLY_IMM => {
                Some(Transport::Ud)
            }
            opcode::CNP_CLASS if op == opcode::CNP => Some(Transport::Cnp),
            _ => None,
        }
    }

    /// The [`QpType`](crate::abi::QpType) code of a QP that receives this
    /// transport; CNP has none (every QP type accepts it).
    #[inline(always)]
    pub const fn qp_type(self) -> Option<u8> {
        match self {
            Transport::Rc => Some(crate::abi::QpType::Rc as u8),
            Transport::Uc => Some(crate::abi::QpType::Uc as u8),
            Transport::Ud => Some(crate::abi::QpType::Ud as u8),
            Transport::Xrc => Some(crate::abi::QpType::Xrc as u8),
            Transport::Cnp => None,
        }
    }
}

/// Where a RoCE frame's addresses are: read only when needed (a multicast
/// destination, an event), not on every frame.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Addrs {
    /// Offset of the IPv4 header's source address; the destination follows.
    V4At(usize),
    /// Offset of the IPv6 source address or RoCE v1 SGID; the destination
    /// (DGID) follows.
    V6At(usize),
}

impl Addrs {
    /// The source (`dst == false`) or destination address, IPv4 as v4-mapped
    /// IPv6.
    #[inline(always)]
    pub fn read<F: Frame + ?Sized>(self, frame: &F, dst: bool) -> Option<[u8; 16]> {
        match self {
            Addrs::V4At(off) => frame
                .header::<[u8; 4]>(off + if dst { 4 } else { 0 })
                .map(crate::abi::v4_mapped),
            Addrs::V6At(off) => frame.header::<[u8; 16]>(off + if dst { 16 } else { 0 }),
        }
    }
}

/// The fields of a RoCE frame the verdict needs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Roce {
    pub opcode: u8,
    pub transport: Transport,
    pub pkey: u16,
    pub dest_qp: u32,
    /// The DETH Q_Key, for UD.
    pub qkey: u32,
    /// The DETH source QP, for UD: the sending QP.
    pub src_qp: u32,
    pub addrs: Addrs,
    /// Offset of the BTH.
    pub bth_at: usize,
    /// Offset of the UDP header; 0 for RoCE v1, which has none (see
    /// [`Roce::udp_at`]). Not an `Option`: the verifier refuses the
    /// spill of an undefined `None` payload.
    pub udp: usize,
    /// Bytes from the BTH to the end of the packet (ICRC included), as the
    /// UDP length (GRH payload length for RoCE v1) gives them.
    pub len: usize,
}

/// The longest RoCE packet from its BTH on: the BTH, the extension headers
/// of the longest opcode (RD atomic: RDETH, DETH, AtomicETH, 40 bytes; 64
/// allowed), the largest payload (a 4096-byte IB MTU) and the ICRC. A
/// longer one can only be several packets in one (a GSO/GRO super-packet).
pub const MAX_ROCE_LEN: usize = Bth::LEN + 64 + 4096 + 4;

/// A classified frame.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    NotRoce,
    Malformed,
    Roce(Roce),
}

/// Where a frame's transport headers are, as [`locate`] found them: the
/// headers below the BTH walked and bounded, the BTH (and a datagram's
/// DETH) checked to be there and valid. [`Located::read`] then reads them.
///
/// The split lets the kernel walk the variable headers (VLAN tags, IPv6
/// extension headers) in a function of their own, which its verifier
/// checks once: what the function returns fits one register
/// ([`pack`](Self::pack)), so the verdict that follows is verified once
/// too, not once per way through the headers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Located {
    NotRoce,
    Malformed,
    Roce {
        /// Offset of the BTH.
        bth_at: usize,
        /// Offset of the UDP header; 0 for RoCE v1.
        udp: usize,
        addrs: Addrs,
        /// As [`Roce::len`].
        len: usize,
    },
}

/// [`Located::pack`]'s fields: tag (2 bits), BTH offset, UDP offset,
/// address family (1) and offset, length (16).
const OFFSET_BITS: u32 = 13;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
const _: () = assert!(MAX_OFFSET < 1 << OFFSET_BITS);

impl Located {
    /// As one u64: what a BPF function returns in a register.
    #[inline(always)]
    pub const fn pack(self) -> u64 {
        match self {
            Located::NotRoce => 0,
            Located::Malformed => 1,
            Located::Roce {
                bth_at,
                udp,
                addrs,
                len,
            } => {
                let (v6, at) = match addrs {
                    Addrs::V4At(at) => (0, at),
                    Addrs::V6At(at) => (1, at),
                };
                2 | (bth_at as u64 & OFFSET_MASK) << 2
                    | (udp as u64 & OFFSET_MASK) << (2 + OFFSET_BITS)
                    | v6 << (2 + 2 * OFFSET_BITS)
                    | (at as u64 & OFFSET_MASK) << (3 + 2 * OFFSET_BITS)
                    | (len as u64 & 0xffff) << (3 + 3 * OFFSET_BITS)
            }
        }
    }

    /// The inverse of [`pack`](Self::pack); any other value is malformed.
    #[inline(always)]
    pub fn unpack(bits: u64) -> Located {
        let field = |shift: u32| (bits >> shift & OFFSET_MASK) as usize;
        match bits & 3 {
            0 => Located::NotRoce,
            2 => Located::Roce {
                bth_at: field(2),
                udp: field(2 + OFFSET_BITS),
                addrs: if bits >> (2 + 2 * OFFSET_BITS) & 1 == 0 {
                    Addrs::V4At(field(3 + 2 * OFFSET_BITS))
                } else {
                    Addrs::V6At(field(3 + 2 * OFFSET_BITS))
                },
                len: (bits >> (3 + 3 * OFFSET_BITS) & 0xffff) as usize,
            },
            _ => Located::Malformed,
        }
    }

    /// The transport headers, read where [`locate`] found them.
    #[inline(always)]
    pub fn read<F: Frame + ?Sized>(self, frame: &F) -> Parsed {
        let Located::Roce {
            bth_at,
            udp,
            addrs,
            len,
        } = self
        else {
            return match self {
                Located::NotRoce => Parsed::NotRoce,
                _ => Parsed::Malformed,
            };
        };
        match transport_headers(frame, bth_at) {
            Some((bth, transport, qkey, src_qp)) => Parsed::Roce(Roce {
                opcode: bth.opcode,
                transport,
                pkey: bth.pkey(),
                dest_qp: bth.dest_qp(),
                qkey,
                src_qp,
                addrs,
                bth_at,
                udp,
                len,
            }),
            None => Parsed::Malformed,
        }
    }
}

/// Classifies a frame that starts with its Ethernet header.
#[inline(always)]
pub fn classify<F: Frame + ?Sized>(frame: &F) -> Parsed {
    locate(frame).read(frame)
}

/// Early exit from parsing with a final classification.
macro_rules! header_or {
    ($frame:expr, $ty:ty, $off:expr, $else:expr) => {
        match $frame.header::<$ty>($off) {
            Some(h) => h,
            None => return $else,
        }
    };
}

#[inline(always)]
const fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// A frame whose reads stop at `end`: the end of the IP packet (its total or
/// payload length) or of the UDP datagram, however far the frame goes on.
/// Bytes past those lengths (padding, or what a sender appended) are never
/// read as headers: the kernel trims them before UDP sees the datagram.
struct Within<'f, F: ?Sized> {
    frame: &'f F,
    end: usize,
}

impl<F: Frame + ?Sized> Frame for Within<'_, F> {
    #[inline(always)]
    fn header<T: Copy>(&self, off: usize) -> Option<T> {
        if off + size_of::<T>() > self.end {
            return None;
        }
        self.frame.header(off)
    }

    #[inline(always)]
    fn wire_len(&self) -> usize {
        self.end.min(self.frame.wire_len())
    }
}

/// Finds a frame's transport headers (see [`Located`]).
#[inline(always)]
pub fn locate<F: Frame + ?Sized>(frame: &F) -> Located {
    let eth = header_or!(frame, EthHdr, 0, Located::Malformed);
    let mut ether_type = u16::from_be(eth.ether_type);
    let mut off = EthHdr::LEN;
    let mut tags = 0;
    while ether_type == ethertype::VLAN || ether_type == ethertype::QINQ {
        if tags == MAX_VLAN_TAGS {
            return Located::Malformed;
        }
        let tag = header_or!(frame, VlanHdr, off, Located::Malformed);
        ether_type = u16::from_be(tag.ether_type);
        off += VlanHdr::LEN;
        tags += 1;
    }
    // Tags the kernel took into metadata count too.
    if tags + frame.stripped_vlan_tags() > MAX_VLAN_TAGS {
        return Located::Malformed;
    }
    match ether_type {
        ethertype::IPV4 => ipv4(frame, off),
        ethertype::IPV6 => ipv6(frame, off),
        ethertype::ROCE_V1 => roce_v1(frame, off),
        _ => Located::NotRoce,
    }
}

/// [`locate`] for the frames nearly all traffic is: at most one 802.1Q
/// tag, and IPv6 without extension headers (IPv4, with or without options,
/// and RoCE v1 have no variable chain to walk). `None` for any other frame,
/// which only [`locate`] walks; where it answers, its answer is
/// [`locate`]'s. The kernel runs it inline, with no call and few verifier
/// states, and calls its own [`locate`] for the rest.
#[inline(always)]
pub fn locate_plain<F: Frame + ?Sized>(frame: &F) -> Option<Located> {
    let eth = frame.header::<EthHdr>(0)?;
    let mut ether_type = u16::from_be(eth.ether_type);
    let mut off = EthHdr::LEN;
    if ether_type == ethertype::VLAN && frame.stripped_vlan_tags() < MAX_VLAN_TAGS {
        ether_type = u16::from_be(frame.header::<VlanHdr>(off)?.ether_type);
        off += VlanHdr::LEN;
    }
    Some(match ether_type {
        ethertype::VLAN | ethertype::QINQ => return None,
        ethertype::IPV4 => ipv4(frame, off),
        ethertype::IPV6 => {
            let ip = frame.header::<Ipv6Hdr>(off)?;
            match ip.next_hdr {
                _ if ip.version() != 6 => return None,
                proto::UDP => ipv6_udp(frame, off, &ip),
                proto::HOP_BY_HOP
                | proto::ROUTING
                | proto::DEST_OPTS
                | proto::AH
                | proto::FRAGMENT => return None,
                _ => Located::NotRoce,
            }
        }
        ethertype::ROCE_V1 => roce_v1(frame, off),
        _ => Located::NotRoce,
    })
}

#[inline(always)]
fn ipv4<F: Frame + ?Sized>(frame: &F, off: usize) -> Located {
    let ip = header_or!(frame, Ipv4Hdr, off, Located::Malformed);
    let ihl = ip.ihl() as usize;
    let total = ip.tot_len() as usize;
    if ip.version() != 4 || ihl < Ipv4Hdr::LEN || total < ihl {
        return Located::Malformed;
    }
    if ip.frag_offset() != 0 || ip.proto != proto::UDP {
        return Located::NotRoce;
    }
    // More Fragments: a first fragment, which the kernel would reassemble.
    let first_fragment = ip.frag_flags() & 0b001 != 0;
    let packet = Within {
        frame,
        end: off + total,
    };
    udp(&packet, off + ihl, first_fragment, Addrs::V4At(off + 12))
}

#[inline(always)]
fn ipv6<F: Frame + ?Sized>(frame: &F, off: usize) -> Located {
    let ip = header_or!(frame, Ipv6Hdr, off, Located::Malformed);
    if ip.version() != 6 {
        return Located::Malformed;
    }
    if ip.next_hdr == proto::UDP {
        return ipv6_udp(frame, off, &ip);
    }
    let addrs = Addrs::V6At(off + 8);
    // A jumbogram's payload length is zero: nothing fits, so it is malformed.
    let frame = &Within {
        frame,
        end: off + Ipv6Hdr::LEN + ip.payload_len() as usize,
    };
    let mut next = ip.next_hdr;
    let mut off = off + Ipv6Hdr::LEN;
    let mut fragment = false;
    let mut seen = 0;
    loop {
        let len = match next {
            proto::UDP => return udp(frame, off, fragment, addrs),
            proto::HOP_BY_HOP | proto::ROUTING | proto::DEST_OPTS | proto::AH | proto::FRAGMENT => {
                if seen == MAX_IPV6_EXT {
                    return Located::Malformed;
                }
                seen += 1;
                // Next header, length, and (for a fragment header) the offset.
                let ext = header_or!(frame, [u8; 4], off, Located::Malformed);
                let len = match next {
                    proto::FRAGMENT => {
                        if be16([ext[2], ext[3]]) >> 3 != 0 {
                            // Not the first fragment: no UDP header to see.
                            return Located::NotRoce;
                        }
                        fragment = true;
                        8
                    }
                    proto::AH => (ext[1] as usize + 2) * 4,
                    _ => (ext[1] as usize + 1) * 8,
                };
                next = ext[0];
                len
            }
            _ => return Located::NotRoce,
        };
        off += len;
    }
}

/// An IPv6 packet at `off` (its header `ip`) whose next header is UDP.
#[inline(always)]
fn ipv6_udp<F: Frame + ?Sized>(frame: &F, off: usize, ip: &Ipv6Hdr) -> Located {
    let packet = Within {
        frame,
        end: off + Ipv6Hdr::LEN + ip.payload_len() as usize,
    };
    udp(&packet, off + Ipv6Hdr::LEN, false, Addrs::V6At(off + 8))
}

#[inline(always)]
fn udp<F: Frame + ?Sized>(frame: &F, off: usize, fragment: bool, addrs: Addrs) -> Located {
    let udp = header_or!(frame, UdpHdr, off, Located::Malformed);
    if be16(udp.dst) != ROCE_V2_PORT {
        return Located::NotRoce;
    }
    let len = udp.len() as usize;
    if fragment || len < UdpHdr::LEN {
        // RoCE is never fragmented; reassembly would happen after XDP.
        return Located::Malformed;
    }
    let datagram = Within {
        frame,
        end: off + len,
    };
    bth(&datagram, off + UdpHdr::LEN, len - UdpHdr::LEN, addrs, off)
}

#[inline(always)]
fn roce_v1<F: Frame + ?Sized>(frame: &F, off: usize) -> Located {
    // The GRH has the IPv6 header's layout.
    let grh = header_or!(frame, Ipv6Hdr, off, Located::Malformed);
    if grh.next_hdr != proto::IBA_BTH {
        return Located::Malformed;
    }
    let len = grh.payload_len() as usize;
    let packet = Within {
        frame,
        end: off + Ipv6Hdr::LEN + len,
    };
    // An Ethernet header always comes first: 0 is never a UDP offset.
    bth(&packet, off + Ipv6Hdr::LEN, len, Addrs::V6At(off + 8), 0)
}

/// A BTH at `off` that is there and valid, with its DETH if a datagram's.
#[inline(always)]
fn bth<F: Frame + ?Sized>(frame: &F, off: usize, len: usize, addrs: Addrs, udp: usize) -> Located {
    match transport_headers(frame, off) {
        Some(_) => Located::Roce {
            bth_at: off,
            udp,
            addrs,
            len,
        },
        None => Located::Malformed,
    }
}

/// The BTH at `off`, its transport, and for a datagram its DETH's Q_Key
/// and source QP; None when either is cut short or the BTH is invalid.
#[inline(always)]
fn transport_headers<F: Frame + ?Sized>(
    frame: &F,
    off: usize,
) -> Option<(Bth, Transport, u32, u32)> {
    let bth = frame.header::<Bth>(off)?;
    if bth.tver() != 0 {
        return None;
    }
    let transport = Transport::of(bth.opcode)?;
    let (qkey, src_qp) = if transport == Transport::Ud {
        let deth = frame.header::<Deth>(off + Bth::LEN)?;
        (deth.qkey(), deth.src_qp())
    } else {
        (0, 0)
    };
    Some((bth, transport, qkey, src_qp))
}

impl Roce {
    /// Offset of the UDP header; `None` for RoCE v1, which has none.
    #[inline(always)]
    pub fn udp_at(&self) -> Option<usize> {
        (self.udp != 0).then_some(self.udp)
    }

    /// Whether `frame`, which this BTH starts, holds several RoCE packets
    /// (a GSO/GRO super-packet): the skb says so (`gso_size`), or only its
    /// length does (an aggregate XDP sees as one multi-buffer frame). Its
    /// later BTHs are never parsed, yet the UDP stack delivers each of them.
    #[inline(always)]
    pub fn aggregate<F: Frame + ?Sized>(&self, frame: &F) -> bool {
        frame.gso_size() != 0 || self.len > MAX_ROCE_LEN
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn located() -> impl Strategy<Value = Located> {
        prop_oneof![
            Just(Located::NotRoce),
            Just(Located::Malformed),
            (
                0..=MAX_OFFSET,
                0..=MAX_OFFSET,
                any::<bool>(),
                0..64usize,
                any::<u16>()
            )
                .prop_map(|(bth_at, udp, v6, at, len)| Located::Roce {
                    bth_at,
                    udp,
                    addrs: if v6 { Addrs::V6At(at) } else { Addrs::V4At(at) },
                    len: len as usize,
                }),
        ]
    }

    proptest! {
        /// What the kernel's parse hands the verdict in a register is what
        /// it found.
        #[test]
        fn a_location_survives_its_packing(l in located()) {
            prop_assert_eq!(Located::unpack(l.pack()), l);
        }
    }
}
