//! Classification of an ingress frame: is it RoCE, and if so, what the
//! partition check needs from it (BTH, DETH, destination address).
//!
//! Anything that is or could be RoCE but cannot be read safely is
//! [`Parsed::MALFORMED`]: the filter fails closed.

use crate::frame::{Frame, MAX_OFFSET, Window};

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
}

/// Transport of a BTH opcode (its top three bits), as far as RoCE uses it;
/// numbered as those bits (and as [`QpType`](crate::abi::QpType)), so that
/// the verdict compares a frame's with its QP's without a mapping.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Transport {
    Rc = crate::abi::QpType::Rc as u8,
    Uc = crate::abi::QpType::Uc as u8,
    Ud = crate::abi::QpType::Ud as u8,
    /// RoCE v2 Congestion Notification Packet (opcode 0x81).
    Cnp = 4,
    Xrc = crate::abi::QpType::Xrc as u8,
}

const _: () = {
    assert!(Transport::Rc as u8 == opcode::RC >> 5 && Transport::Uc as u8 == opcode::UC >> 5);
    assert!(Transport::Ud as u8 == opcode::UD >> 5 && Transport::Xrc as u8 == opcode::XRC >> 5);
    assert!(Transport::Cnp as u8 == opcode::CNP_CLASS >> 5);
};

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
            Transport::Cnp => None,
            // Numbered alike (see `Transport`).
            transport => Some(transport as u8),
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

/// A RoCE frame's headers as the filter reads them, in three words, so
/// that they ride in registers through the verdict rather than spill to
/// the stack field by field: where its transport headers are ([`Located`]'s
/// bits), the BTH's first eight bytes (opcode, flags, P_Key, reserved,
/// DestQP) and, for a datagram, its DETH (Q_Key, reserved, SrcQP; 0 for any
/// other frame).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Roce {
    at: u64,
    bth: u64,
    deth: u64,
}

impl Roce {
    /// No RoCE headers: what a frame that is not RoCE carries.
    pub const NONE: Roce = Roce {
        at: 0,
        bth: 0,
        deth: 0,
    };

    /// The headers of a frame whose BTH, at `bth_at`, starts with the eight
    /// bytes `bth` (big-endian), and whose DETH (for UD) is `deth`; its UDP
    /// header at `udp` (0 for RoCE v1), its addresses at `addrs`, `len`
    /// bytes from the BTH on.
    #[inline(always)]
    pub const fn new(
        bth: u64,
        deth: u64,
        bth_at: usize,
        udp: usize,
        addrs: Addrs,
        len: usize,
    ) -> Roce {
        Roce {
            at: Located::Roce {
                bth_at,
                udp,
                addrs,
                len,
            }
            .pack(),
            bth,
            deth,
        }
    }

    /// A RoCE v2 frame over IPv4 with these fields, as tests and tools make
    /// them.
    pub const fn of(opcode: u8, pkey: u16, dest_qp: u32, qkey: u32, src_qp: u32) -> Roce {
        Roce::new(
            (opcode as u64) << 56 | (pkey as u64) << 32 | (dest_qp & QPN_BITS) as u64,
            (qkey as u64) << 32 | (src_qp & QPN_BITS) as u64,
            42,
            34,
            Addrs::V4At(26),
            MAX_ROCE_LEN,
        )
    }

    pub const fn opcode(&self) -> u8 {
        (self.bth >> 56) as u8
    }

    /// Whether it is a datagram's (`transport() == Transport::Ud`): one
    /// test of the opcode, the two UD opcodes RoCE sends differing in
    /// their lowest bit only.
    #[inline(always)]
    pub const fn ud(&self) -> bool {
        const { assert!(opcode::UD_SEND_ONLY_IMM == opcode::UD_SEND_ONLY | 1) };
        self.opcode() & !1 == opcode::UD_SEND_ONLY
    }

    /// The transport of its opcode (valid: the parse refuses any other).
    pub const fn transport(&self) -> Transport {
        match Transport::of(self.opcode()) {
            Some(t) => t,
            None => Transport::Rc,
        }
    }

    pub const fn pkey(&self) -> u16 {
        (self.bth >> 32) as u16
    }

    /// The same headers with P_Key `pkey` (a rewrite's).
    pub const fn with_pkey(self, pkey: u16) -> Roce {
        Roce {
            bth: self.bth & !(0xffff << 32) | (pkey as u64) << 32,
            ..self
        }
    }

    pub const fn dest_qp(&self) -> u32 {
        self.bth as u32 & QPN_BITS
    }

    /// The DETH Q_Key, for UD.
    pub const fn qkey(&self) -> u32 {
        (self.deth >> 32) as u32
    }

    /// The DETH source QP, for UD: the sending QP.
    pub const fn src_qp(&self) -> u32 {
        self.deth as u32 & QPN_BITS
    }

    /// Where its transport headers are.
    #[inline(always)]
    pub fn located(&self) -> Located {
        Located::unpack(self.at)
    }

    /// The same, packed ([`Located::pack`]).
    #[inline(always)]
    pub const fn located_bits(&self) -> u64 {
        self.at
    }

    /// Where its addresses are.
    #[inline(always)]
    pub fn addrs(&self) -> Addrs {
        match self.located() {
            Located::Roce { addrs, .. } => addrs,
            _ => Addrs::V4At(0),
        }
    }

    /// Offset of the BTH.
    #[inline(always)]
    pub const fn bth_at(&self) -> usize {
        (self.at >> 2 & OFFSET_MASK) as usize
    }

    /// Bytes from the BTH to the end of the packet (ICRC included), as the
    /// UDP length (GRH payload length for RoCE v1) gives them.
    #[inline(always)]
    pub const fn packet_len(&self) -> usize {
        (self.at >> (3 + 3 * OFFSET_BITS) & 0xffff) as usize
    }
}

/// The longest RoCE packet from its BTH on: the BTH, the extension headers
/// of the longest opcode (RD atomic: RDETH, DETH, AtomicETH, 40 bytes; 64
/// allowed), the largest payload (a 4096-byte IB MTU) and the ICRC. A
/// longer one can only be several packets in one (a GSO/GRO super-packet).
pub const MAX_ROCE_LEN: usize = Bth::LEN + 64 + 4096 + 4;

/// What a frame is, to the filter.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Class {
    NotRoce,
    Malformed,
    Roce,
}

/// A classified frame: what it is and, for RoCE, its headers. A struct,
/// every header field 0 unless the frame is RoCE, not an enum whose payload
/// the compiler leaves undefined on the other paths: a value read where
/// paths meet (as `select` after speculation) is then a register never
/// set, which the kernel's verifier refuses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub class: Class,
    pub roce: Roce,
}

impl Parsed {
    pub const NOT_ROCE: Parsed = Parsed {
        class: Class::NotRoce,
        roce: Roce::NONE,
    };
    pub const MALFORMED: Parsed = Parsed {
        class: Class::Malformed,
        roce: Roce::NONE,
    };

    /// A RoCE frame with these headers.
    #[inline(always)]
    pub const fn of(roce: Roce) -> Parsed {
        Parsed {
            class: Class::Roce,
            roce,
        }
    }

    /// Where its transport headers are, packed ([`Located::pack`]).
    #[inline(always)]
    pub const fn located(&self) -> u64 {
        match self.class {
            Class::NotRoce => Located::NotRoce.pack(),
            Class::Malformed => Located::Malformed.pack(),
            Class::Roce => self.roce.located_bits(),
        }
    }

    /// The headers of a RoCE frame; none for any other.
    #[inline(always)]
    pub const fn roce(&self) -> Option<Roce> {
        match self.class {
            Class::Roce => Some(self.roce),
            _ => None,
        }
    }
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
    /// Where a classified frame's transport headers are.
    #[inline(always)]
    pub fn of(parsed: &Parsed) -> Located {
        Located::unpack(parsed.located())
    }

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
        match self {
            Located::NotRoce => Parsed::NOT_ROCE,
            Located::Malformed => Parsed::MALFORMED,
            Located::Roce {
                bth_at,
                udp,
                addrs,
                len,
            } => bth(frame, bth_at, len, addrs, udp),
        }
    }
}

/// Classifies a frame that starts with its Ethernet header: every header
/// walked, and the transport headers read.
#[inline(always)]
pub fn classify<F: Frame + ?Sized>(frame: &F) -> Parsed {
    match ethernet(frame) {
        Some((ether_type, off)) => network(frame, ether_type, off),
        None => Parsed::MALFORMED,
    }
}

/// Finds a frame's transport headers (see [`Located`]): [`classify`], with
/// only where it found them kept.
#[inline(always)]
pub fn locate<F: Frame + ?Sized>(frame: &F) -> Located {
    Located::of(&classify(frame))
}

/// What [`plain`] makes of a frame.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Plain {
    /// RoCE, as [`classify`] reads it.
    Roce(Roce),
    /// Not RoCE, as [`classify`] says.
    NotRoce,
    /// Anything else (malformed, or not plain): for [`classify`] to walk.
    Walk,
}

/// [`classify`] for the frames nearly all traffic is: at most one 802.1Q
/// tag, and IPv6 without extension headers (IPv4, with or without options,
/// and RoCE v1 have no variable chain to walk). Where it answers, its
/// answer is [`classify`]'s; a malformed frame, rare and often an attack's,
/// it leaves to [`classify`] too. The kernel runs it inline, with no call
/// and few verifier states, and calls its own [`locate`] for the rest: its
/// answer carries the headers of a RoCE frame alone, so that none of them
/// is kept on any other frame's way. The usual RoCE v2 frame it reads at
/// fixed offsets first ([`fixed`]), in a third of the instructions.
#[inline(always)]
pub fn plain<F: Frame + ?Sized>(frame: &F) -> Plain {
    if let Some(roce) = fixed(frame) {
        return Plain::Roce(roce);
    }
    let Some(eth) = frame.window::<ETH_LEN>(0) else {
        return Plain::Walk;
    };
    let mut ether_type = eth.be::<12, 2>() as u16;
    let mut off = ETH_LEN;
    if ether_type == ethertype::VLAN && frame.stripped_vlan_tags() < MAX_VLAN_TAGS {
        let Some(tag) = frame.window::<VLAN_LEN>(off) else {
            return Plain::Walk;
        };
        ether_type = tag.be::<2, 2>() as u16;
        off += VLAN_LEN;
    }
    let parsed = match ether_type {
        ethertype::VLAN | ethertype::QINQ => return Plain::Walk,
        ethertype::IPV6 => match ipv6_header(frame, off) {
            Ipv6::Extension { .. } => return Plain::Walk,
            Ipv6::Udp { payload } => ipv6_udp(frame, off, payload),
            Ipv6::Other(parsed) => parsed,
        },
        _ => network(frame, ether_type, off),
    };
    match parsed.class {
        Class::Roce => Plain::Roce(parsed.roce),
        Class::NotRoce => Plain::NotRoce,
        Class::Malformed => Plain::Walk,
    }
}

/// The RoCE v2 frame nearly all traffic is, read at fixed offsets: no VLAN
/// tag, IPv4 without options (or IPv6 without extension headers), not a
/// fragment, its BTH (and a datagram's DETH) within the IP packet and the
/// UDP datagram. One bounds check for the headers up to the BTH (a second
/// for IPv6's longer header), one more for a DETH, where the walk checks
/// each header at an offset it computed. Its answer is [`classify`]'s; any
/// other frame, RoCE or not, gets `None`, for the walk.
#[inline(always)]
pub fn fixed<F: Frame + ?Sized>(frame: &F) -> Option<Roce> {
    const V4_BTH: usize = ETH_LEN + IPV4_LEN + UDP_LEN;
    const V6_BTH: usize = ETH_LEN + IPV6_LEN + UDP_LEN;
    const DETH_END: usize = Bth::LEN + Deth::LEN;
    let w = frame.window::<{ V4_BTH + Bth::LEN }>(0)?;
    match w.be::<12, 2>() as u16 {
        ethertype::IPV4 => {
            // Version and IHL, TOS, total length; ID, flags, fragment
            // offset (More Fragments, or an offset: a fragment).
            let ip = w.be::<ETH_LEN, 8>();
            if ip >> 56 != 0x45
                || ip & 0x3fff != 0
                || w.be::<{ ETH_LEN + 9 }, 1>() != proto::UDP as u64
            {
                return None;
            }
            fixed_bth::<V4_BTH>(
                ETH_LEN + (ip >> 32 & 0xffff) as usize,
                w.be::<{ V4_BTH - UDP_LEN }, 8>(),
                w.be::<V4_BTH, 8>(),
                Addrs::V4At(ETH_LEN + 12),
                || {
                    Some(
                        frame
                            .window::<{ V4_BTH + DETH_END }>(0)?
                            .be::<{ V4_BTH + Bth::LEN }, 8>(),
                    )
                },
            )
        }
        ethertype::IPV6 => {
            let w = frame.window::<{ V6_BTH + Bth::LEN }>(0)?;
            // Version, traffic class, flow label; payload length, next
            // header, hop limit.
            let ip = w.be::<ETH_LEN, 8>();
            if ip >> 60 != 6 || ip >> 8 & 0xff != proto::UDP as u64 {
                return None;
            }
            fixed_bth::<V6_BTH>(
                ETH_LEN + IPV6_LEN + (ip >> 16 & 0xffff) as usize,
                w.be::<{ V6_BTH - UDP_LEN }, 8>(),
                w.be::<V6_BTH, 8>(),
                Addrs::V6At(ETH_LEN + 8),
                || {
                    Some(
                        frame
                            .window::<{ V6_BTH + DETH_END }>(0)?
                            .be::<{ V6_BTH + Bth::LEN }, 8>(),
                    )
                },
            )
        }
        _ => None,
    }
}

/// [`fixed`]'s UDP header (`udp`'s eight bytes) and BTH (`bth`'s first
/// eight, at `BTH_AT`) of an IP packet that ends at `ip_end`; `deth`
/// reads a datagram's DETH.
#[inline(always)]
fn fixed_bth<const BTH_AT: usize>(
    ip_end: usize,
    udp: u64,
    bth: u64,
    addrs: Addrs,
    deth: impl FnOnce() -> Option<u64>,
) -> Option<Roce> {
    // Destination port; length.
    let len = (udp >> 16 & 0xffff) as usize;
    if (udp >> 32) as u16 != ROCE_V2_PORT || bth >> 48 & 0x0f != 0 {
        return None;
    }
    let (end, deth) = match Transport::of((bth >> 56) as u8)? {
        Transport::Ud => (BTH_AT + Bth::LEN + Deth::LEN, deth()?),
        _ => (BTH_AT + Bth::LEN, 0),
    };
    // The packet and the datagram hold the headers.
    let udp_at = BTH_AT - UDP_LEN;
    if end > ip_end || end > udp_at + len {
        return None;
    }
    Some(Roce::new(bth, deth, BTH_AT, udp_at, addrs, len - UDP_LEN))
}

/// Lengths of the headers below the BTH.
const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;

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

    type Bytes<const LEN: usize> = F::Bytes<LEN>;

    #[inline(always)]
    fn window<const LEN: usize>(&self, off: usize) -> Option<Window<'_, F::Bytes<LEN>, LEN>> {
        if off + LEN > self.end {
            return None;
        }
        self.frame.window::<LEN>(off)
    }

    #[inline(always)]
    fn wire_len(&self) -> usize {
        self.end.min(self.frame.wire_len())
    }
}

/// The Ethernet header and its VLAN tags: the EtherType they end with and
/// where the network header starts; none for a frame cut short in them, or
/// with more tags than allowed.
#[inline(always)]
fn ethernet<F: Frame + ?Sized>(frame: &F) -> Option<(u16, usize)> {
    let mut ether_type = frame.window::<ETH_LEN>(0)?.be::<12, 2>() as u16;
    let mut off = ETH_LEN;
    let mut tags = 0;
    while ether_type == ethertype::VLAN || ether_type == ethertype::QINQ {
        if tags == MAX_VLAN_TAGS {
            return None;
        }
        ether_type = frame.window::<VLAN_LEN>(off)?.be::<2, 2>() as u16;
        off += VLAN_LEN;
        tags += 1;
    }
    // Tags the kernel took into metadata count too.
    if tags + frame.stripped_vlan_tags() > MAX_VLAN_TAGS {
        return None;
    }
    Some((ether_type, off))
}

/// The network header at `off`, of EtherType `ether_type`, and what is
/// below it.
#[inline(always)]
fn network<F: Frame + ?Sized>(frame: &F, ether_type: u16, off: usize) -> Parsed {
    match ether_type {
        ethertype::IPV4 => ipv4(frame, off),
        ethertype::IPV6 => match ipv6_header(frame, off) {
            Ipv6::Udp { payload } => ipv6_udp(frame, off, payload),
            Ipv6::Extension { next, payload } => ipv6_extensions(frame, off, next, payload),
            Ipv6::Other(parsed) => parsed,
        },
        ethertype::ROCE_V1 => roce_v1(frame, off),
        _ => Parsed::NOT_ROCE,
    }
}

#[inline(always)]
fn ipv4<F: Frame + ?Sized>(frame: &F, off: usize) -> Parsed {
    let Some(ip) = frame.window::<IPV4_LEN>(off) else {
        return Parsed::MALFORMED;
    };
    // Version and IHL, TOS, total length; ID, flags and fragment offset.
    let head = ip.be::<0, 8>();
    let ihl = (head >> 56 & 0x0f) as usize * 4;
    let total = (head >> 32 & 0xffff) as usize;
    if head >> 60 != 4 || ihl < IPV4_LEN || total < ihl {
        return Parsed::MALFORMED;
    }
    let frag = head as u16;
    if frag & 0x1fff != 0 || ip.be::<9, 1>() as u8 != proto::UDP {
        return Parsed::NOT_ROCE;
    }
    // More Fragments: a first fragment, which the kernel would reassemble.
    let first_fragment = frag & 0x2000 != 0;
    let packet = Within {
        frame,
        end: off + total,
    };
    udp(&packet, off + ihl, first_fragment, Addrs::V4At(off + 12))
}

/// What an IPv6 header (or a GRH) says of what follows it.
enum Ipv6 {
    /// A UDP header, within a payload of this length.
    Udp { payload: usize },
    /// An extension header of kind `next`.
    Extension { next: u8, payload: usize },
    /// Neither: a classification already.
    Other(Parsed),
}

#[inline(always)]
fn ipv6_header<F: Frame + ?Sized>(frame: &F, off: usize) -> Ipv6 {
    let Some(ip) = frame.window::<IPV6_LEN>(off) else {
        return Ipv6::Other(Parsed::MALFORMED);
    };
    // Version, traffic class, flow label; payload length, next header, hops.
    let head = ip.be::<0, 8>();
    let payload = (head >> 16 & 0xffff) as usize;
    let next = (head >> 8) as u8;
    if head >> 60 != 6 {
        return Ipv6::Other(Parsed::MALFORMED);
    }
    match next {
        proto::UDP => Ipv6::Udp { payload },
        proto::HOP_BY_HOP | proto::ROUTING | proto::DEST_OPTS | proto::AH | proto::FRAGMENT => {
            Ipv6::Extension { next, payload }
        }
        _ => Ipv6::Other(Parsed::NOT_ROCE),
    }
}

/// An IPv6 packet at `off`, of payload length `payload`, whose next header
/// is UDP.
#[inline(always)]
fn ipv6_udp<F: Frame + ?Sized>(frame: &F, off: usize, payload: usize) -> Parsed {
    let packet = Within {
        frame,
        end: off + IPV6_LEN + payload,
    };
    udp(&packet, off + IPV6_LEN, false, Addrs::V6At(off + 8))
}

/// An IPv6 packet at `off` whose next header is the extension header
/// `next`: the chain walked to UDP, at most [`MAX_IPV6_EXT`] long.
#[inline(always)]
fn ipv6_extensions<F: Frame + ?Sized>(frame: &F, off: usize, next: u8, payload: usize) -> Parsed {
    let addrs = Addrs::V6At(off + 8);
    // A jumbogram's payload length is zero: nothing fits, so it is malformed.
    let frame = &Within {
        frame,
        end: off + IPV6_LEN + payload,
    };
    let mut next = next;
    let mut off = off + IPV6_LEN;
    let mut fragment = false;
    let mut seen = 0;
    loop {
        let len = match next {
            proto::UDP => return udp(frame, off, fragment, addrs),
            proto::HOP_BY_HOP | proto::ROUTING | proto::DEST_OPTS | proto::AH | proto::FRAGMENT => {
                if seen == MAX_IPV6_EXT {
                    return Parsed::MALFORMED;
                }
                seen += 1;
                // Next header, length, and (for a fragment header) the offset.
                let Some(ext) = frame.window::<4>(off) else {
                    return Parsed::MALFORMED;
                };
                let ext = ext.be::<0, 4>();
                let len = match next {
                    proto::FRAGMENT => {
                        if ext as u16 >> 3 != 0 {
                            // Not the first fragment: no UDP header to see.
                            return Parsed::NOT_ROCE;
                        }
                        fragment = true;
                        8
                    }
                    proto::AH => ((ext >> 16 & 0xff) as usize + 2) * 4,
                    _ => ((ext >> 16 & 0xff) as usize + 1) * 8,
                };
                next = (ext >> 24) as u8;
                len
            }
            _ => return Parsed::NOT_ROCE,
        };
        off += len;
    }
}

#[inline(always)]
fn udp<F: Frame + ?Sized>(frame: &F, off: usize, fragment: bool, addrs: Addrs) -> Parsed {
    let Some(udp) = frame.window::<UDP_LEN>(off) else {
        return Parsed::MALFORMED;
    };
    // Source and destination ports, length, checksum.
    let head = udp.be::<0, 8>();
    if (head >> 32) as u16 != ROCE_V2_PORT {
        return Parsed::NOT_ROCE;
    }
    let len = (head >> 16 & 0xffff) as usize;
    if fragment || len < UDP_LEN {
        // RoCE is never fragmented; reassembly would happen after XDP.
        return Parsed::MALFORMED;
    }
    let datagram = Within {
        frame,
        end: off + len,
    };
    bth(&datagram, off + UDP_LEN, len - UDP_LEN, addrs, off)
}

#[inline(always)]
fn roce_v1<F: Frame + ?Sized>(frame: &F, off: usize) -> Parsed {
    // The GRH has the IPv6 header's layout.
    let Some(grh) = frame.window::<IPV6_LEN>(off) else {
        return Parsed::MALFORMED;
    };
    let head = grh.be::<0, 8>();
    if (head >> 8) as u8 != proto::IBA_BTH {
        return Parsed::MALFORMED;
    }
    let len = (head >> 16 & 0xffff) as usize;
    let packet = Within {
        frame,
        end: off + IPV6_LEN + len,
    };
    // An Ethernet header always comes first: 0 is never a UDP offset.
    bth(&packet, off + IPV6_LEN, len, Addrs::V6At(off + 8), 0)
}

/// The BTH at `off`, there and valid, with its DETH if a datagram's.
#[inline(always)]
fn bth<F: Frame + ?Sized>(frame: &F, off: usize, len: usize, addrs: Addrs, udp: usize) -> Parsed {
    let Some(bth) = frame.window::<{ Bth::LEN }>(off) else {
        return Parsed::MALFORMED;
    };
    // Opcode, flags (TVer their low four bits), P_Key; reserved, DestQP.
    let head = bth.be::<0, 8>();
    let opcode = (head >> 56) as u8;
    let Some(transport) = Transport::of(opcode) else {
        return Parsed::MALFORMED;
    };
    if head >> 48 & 0x0f != 0 {
        return Parsed::MALFORMED;
    }
    let deth = match transport {
        // Q_Key; reserved, SrcQP.
        Transport::Ud => match frame.window::<{ Deth::LEN }>(off + Bth::LEN) {
            Some(deth) => deth.be::<0, 8>(),
            None => return Parsed::MALFORMED,
        },
        _ => 0,
    };
    Parsed::of(Roce::new(head, deth, off, udp, addrs, len))
}

/// A QPN's 24 bits, as the BTH and DETH carry them.
const QPN_BITS: u32 = 0x00ff_ffff;

impl Roce {
    /// Offset of the UDP header; `None` for RoCE v1, which has none.
    #[inline(always)]
    pub const fn udp_at(&self) -> Option<usize> {
        match (self.at >> (2 + OFFSET_BITS) & OFFSET_MASK) as usize {
            0 => None,
            udp => Some(udp),
        }
    }

    /// Whether `frame`, which this BTH starts, holds several RoCE packets
    /// (a GSO/GRO super-packet): the skb says so (`gso_size`), or only its
    /// length does (an aggregate XDP sees as one multi-buffer frame). Its
    /// later BTHs are never parsed, yet the UDP stack delivers each of them.
    #[inline(always)]
    pub fn aggregate<F: Frame + ?Sized>(&self, frame: &F) -> bool {
        frame.gso_size() != 0 || self.packet_len() > MAX_ROCE_LEN
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
