//! Building RoCE frames byte by byte: for the tests, the lab and the bench.
//! Every field the parser looks at can be set, including wrong ones. Also
//! the full ICRC recomputation that checks captured frames.

use std::net::{Ipv4Addr, Ipv6Addr};

use pkeyfw_common::{
    icrc,
    parse::{self, Bth, Deth, ROCE_V2_PORT, ethertype, opcode, proto},
};

/// An IPv6 extension header in front of the UDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    /// Hop-by-hop (0), routing (43) or destination options (60), of
    /// `8 * (units + 1)` bytes.
    Options { kind: u8, units: u8 },
    /// Authentication header (51), `4 * (words + 2)` bytes.
    Ah { words: u8 },
    /// Fragment header (44).
    Fragment { offset: u16, more: bool },
}

impl Ext {
    fn kind(self) -> u8 {
        match self {
            Ext::Options { kind, .. } => kind,
            Ext::Ah { .. } => proto::AH,
            Ext::Fragment { .. } => proto::FRAGMENT,
        }
    }
}

/// The network layer under the BTH.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Net {
    /// RoCE v2 over IPv4, with `options` 32-bit words of IP options.
    V4 {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        options: u8,
        frag_offset: u16,
        more_fragments: bool,
    },
    /// RoCE v2 over IPv6.
    V6 {
        src: Ipv6Addr,
        dst: Ipv6Addr,
        ext: Vec<Ext>,
    },
    /// RoCE v1: GRH directly over Ethernet.
    V1 {
        sgid: Ipv6Addr,
        dgid: Ipv6Addr,
        next_header: u8,
    },
}

/// A RoCE frame (or a near miss of one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// VLAN tag protocol identifiers, outermost first.
    pub vlans: Vec<u16>,
    pub net: Net,
    /// IP protocol (or last next header) in front of the "UDP" header.
    pub ip_proto: u8,
    pub udp_dport: u16,
    pub opcode: u8,
    pub tver: u8,
    pub pkey: u16,
    pub dest_qp: u32,
    /// DETH, written for UD opcodes.
    pub qkey: u32,
    pub src_qp: u32,
    pub payload: Vec<u8>,
}

/// MACs of the lab's two ends (locally administered).
pub const SRC_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];
pub const DST_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];

impl Packet {
    /// A RoCE v2 over IPv4 frame to `dest_qp` with `opcode`; UD opcodes
    /// carry a DETH with `qkey`.
    pub fn v4(opcode: u8, pkey: u16, dest_qp: u32, qkey: u32) -> Packet {
        Packet {
            vlans: Vec::new(),
            net: Net::V4 {
                src: Ipv4Addr::new(192, 0, 2, 1),
                dst: Ipv4Addr::new(192, 0, 2, 2),
                options: 0,
                frag_offset: 0,
                more_fragments: false,
            },
            ip_proto: proto::UDP,
            udp_dport: ROCE_V2_PORT,
            opcode,
            tver: 0,
            pkey,
            dest_qp,
            qkey,
            src_qp: 0x42,
            payload: vec![0xab; 16],
        }
    }

    /// UD SEND_ONLY to `dest_qp`.
    pub fn ud(pkey: u16, dest_qp: u32, qkey: u32) -> Packet {
        Packet::v4(opcode::UD_SEND_ONLY, pkey, dest_qp, qkey)
    }

    /// RC SEND_ONLY (0x04) to `dest_qp`.
    pub fn rc(pkey: u16, dest_qp: u32) -> Packet {
        Packet::v4(0x04, pkey, dest_qp, 0)
    }

    /// The same frame over IPv6.
    pub fn over_v6(mut self, ext: Vec<Ext>) -> Packet {
        self.net = Net::V6 {
            src: "2001:db8::1".parse().expect("literal"),
            dst: "2001:db8::2".parse().expect("literal"),
            ext,
        };
        self
    }

    /// The same frame as RoCE v1.
    pub fn as_v1(mut self) -> Packet {
        self.net = Net::V1 {
            sgid: "fe80::1".parse().expect("literal"),
            dgid: "fe80::2".parse().expect("literal"),
            next_header: proto::IBA_BTH,
        };
        self
    }

    /// Whether the opcode carries a DETH.
    pub fn has_deth(&self) -> bool {
        self.opcode & opcode::CLASS_MASK == opcode::UD
    }

    /// The frame's bytes, with a correct ICRC for RoCE v2.
    pub fn bytes(&self) -> Vec<u8> {
        self.encode().0
    }

    /// Offset where the headers the verdict reads end (BTH, plus DETH for UD):
    /// a frame cut anywhere before it is malformed.
    pub fn headers_end(&self) -> usize {
        self.encode().1
    }

    /// Offset of the BTH, the last header before the DETH.
    pub fn bth_at(&self) -> usize {
        self.headers_end() - Bth::LEN - if self.has_deth() { Deth::LEN } else { 0 }
    }

    fn encode(&self) -> (Vec<u8>, usize) {
        let mut f = Vec::with_capacity(128 + self.payload.len());
        f.extend_from_slice(&DST_MAC);
        f.extend_from_slice(&SRC_MAC);
        for (i, &tpid) in self.vlans.iter().enumerate() {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&(100 + i as u16).to_be_bytes()); // TCI: VID
        }
        let transport_len = 12 + if self.has_deth() { 8 } else { 0 } + self.payload.len() + 4;
        let l3 = f.len() + 2;
        match &self.net {
            Net::V4 {
                src,
                dst,
                options,
                frag_offset,
                more_fragments,
            } => {
                f.extend_from_slice(&ethertype::IPV4.to_be_bytes());
                let ihl = 5 + *options as usize;
                let total = ihl * 4 + 8 + transport_len;
                let frag = (u16::from(*more_fragments) << 13) | (frag_offset & 0x1fff);
                f.push(0x40 | ihl as u8);
                f.push(0);
                f.extend_from_slice(&(total as u16).to_be_bytes());
                f.extend_from_slice(&[0x12, 0x34]);
                f.extend_from_slice(&frag.to_be_bytes());
                f.extend_from_slice(&[64, self.ip_proto, 0, 0]);
                f.extend_from_slice(&src.octets());
                f.extend_from_slice(&dst.octets());
                f.extend(std::iter::repeat_n(1u8, *options as usize * 4)); // NOPs
                let sum = ip_checksum(&f[l3..l3 + ihl * 4]);
                f[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
            }
            Net::V6 { src, dst, ext } => {
                f.extend_from_slice(&ethertype::IPV6.to_be_bytes());
                let ext_len: usize = ext.iter().map(|e| ext_len(*e)).sum();
                let payload = ext_len + 8 + transport_len;
                f.extend_from_slice(&[0x60, 0, 0, 0]);
                f.extend_from_slice(&(payload as u16).to_be_bytes());
                f.push(ext.first().map_or(self.ip_proto, |e| e.kind()));
                f.push(64);
                f.extend_from_slice(&src.octets());
                f.extend_from_slice(&dst.octets());
                for (i, e) in ext.iter().enumerate() {
                    let next = ext.get(i + 1).map_or(self.ip_proto, |n| n.kind());
                    push_ext(&mut f, *e, next);
                }
            }
            Net::V1 {
                sgid,
                dgid,
                next_header,
            } => {
                f.extend_from_slice(&ethertype::ROCE_V1.to_be_bytes());
                f.extend_from_slice(&[0x60, 0, 0, 0]);
                f.extend_from_slice(&(transport_len as u16).to_be_bytes());
                f.push(*next_header);
                f.push(64);
                f.extend_from_slice(&sgid.octets());
                f.extend_from_slice(&dgid.octets());
            }
        }
        let udp_at = f.len();
        let v2 = !matches!(self.net, Net::V1 { .. });
        if v2 {
            f.extend_from_slice(&0xc000u16.to_be_bytes());
            f.extend_from_slice(&self.udp_dport.to_be_bytes());
            f.extend_from_slice(&((8 + transport_len) as u16).to_be_bytes());
            f.extend_from_slice(&[0, 0]);
        }
        let bth_at = f.len();
        f.push(self.opcode);
        f.push(self.tver & 0x0f);
        f.extend_from_slice(&self.pkey.to_be_bytes());
        f.push(0);
        f.extend_from_slice(&self.dest_qp.to_be_bytes()[1..]);
        f.extend_from_slice(&[0, 0, 0, 1]); // PSN 1
        if self.has_deth() {
            f.extend_from_slice(&self.qkey.to_be_bytes());
            f.push(0);
            f.extend_from_slice(&self.src_qp.to_be_bytes()[1..]);
        }
        let headers_end = f.len();
        f.extend_from_slice(&self.payload);
        let crc = if v2 {
            icrc_of(&f, l3, udp_at, bth_at)
        } else {
            0
        };
        f.extend_from_slice(&crc.to_le_bytes());
        (f, headers_end)
    }
}

fn ext_len(e: Ext) -> usize {
    match e {
        Ext::Options { units, .. } => 8 * (units as usize + 1),
        Ext::Ah { words } => 4 * (words as usize + 2),
        Ext::Fragment { .. } => 8,
    }
}

fn push_ext(f: &mut Vec<u8>, e: Ext, next: u8) {
    let start = f.len();
    match e {
        Ext::Options { units, .. } => f.extend_from_slice(&[next, units]),
        Ext::Ah { words } => f.extend_from_slice(&[next, words]),
        Ext::Fragment { offset, more } => {
            f.extend_from_slice(&[next, 0]);
            f.extend_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
        }
    }
    f.resize(start + ext_len(e), 0);
}

/// The Internet checksum of an IPv4 header (checksum field zero).
fn ip_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The ICRC of a RoCE v2 frame whose IP header starts at `l3`, UDP header at
/// `udp` and BTH at `bth`, over everything up to the end of `f`. IPv6
/// extension headers are not covered here: RoCE v2 never sends them.
pub fn icrc_of(f: &[u8], l3: usize, udp: usize, bth: usize) -> u32 {
    let mut masked = f[l3..].to_vec();
    let (udp, bth) = (udp - l3, bth - l3);
    if masked[0] >> 4 == 4 {
        masked[1] = 0xff; // TOS
        masked[8] = 0xff; // TTL
        masked[10..12].fill(0xff); // header checksum
    } else {
        masked[0] |= 0x0f; // traffic class and flow label
        masked[1..4].fill(0xff);
        masked[7] = 0xff; // hop limit
    }
    masked[udp + 6..udp + 8].fill(0xff); // UDP checksum
    masked[bth + 4] = 0xff; // BTH reserved/FECN/BECN
    !icrc::update(icrc::SEED, &masked)
}

/// Whether a captured RoCE v2 frame's ICRC is right (recomputed over the
/// whole frame); `None` for a frame that is not RoCE v2 or was cut short.
pub fn icrc_holds(f: &[u8]) -> Option<bool> {
    let r = parse::classify(f).roce()?;
    let udp = r.udp_at()?;
    let l3 = if f.get(12..14)? == [0x81, 0x00] {
        18
    } else {
        14
    };
    let end = udp + usize::from(u16::from_be_bytes([*f.get(udp + 4)?, *f.get(udp + 5)?]));
    let f = f.get(..end)?;
    let stored = u32::from_le_bytes(f.get(end.checked_sub(4)?..)?.try_into().ok()?);
    Some(icrc_of(&f[..end - 4], l3, udp, r.bth_at()) == stored)
}
