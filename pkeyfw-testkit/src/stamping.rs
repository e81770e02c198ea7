//! Stamping fixtures: QPs outgoing frames name, frames with a chosen UDP
//! checksum, and the checks every rewritten frame must pass.

use pkeyfw_common::csum;

use crate::wire::{Net, Packet, icrc_of};

/// Remote QPs an RC frame may name; none of them says who sends it.
pub const TO_QPD_AT_PEER: u32 = 0x77;
pub const TO_QPB_ANYWHERE: u32 = 0x78;
/// A UD QP the policy does not bind.
pub const UNBOUND_QP: u32 = 0x55;

/// Offsets of a v2 frame without VLANs: (IP header, UDP header, BTH).
pub fn offsets(p: &Packet) -> (usize, usize, usize) {
    let bth = p.bth_at();
    (14, bth - 8, bth)
}

/// `p`'s bytes, with a valid UDP checksum when `checksum`, else zero.
pub fn frame(p: &Packet, checksum: bool) -> Vec<u8> {
    let mut f = p.bytes();
    if checksum && !matches!(p.net, Net::V1 { .. }) {
        let (_, udp, _) = offsets(p);
        let c = match !udp_sum(&f, p) {
            0 => 0xffff,
            c => c,
        };
        f[udp + 6..udp + 8].copy_from_slice(&c.to_be_bytes());
    }
    f
}

/// The one's-complement sum of the pseudo-header and UDP datagram of `f`
/// (checksum field included): 0xFFFF when the checksum is valid.
pub fn udp_sum(f: &[u8], p: &Packet) -> u16 {
    let (l3, udp, _) = offsets(p);
    let len = u16::from_be_bytes([f[udp + 4], f[udp + 5]]);
    let mut pseudo = Vec::new();
    if f[l3] >> 4 == 4 {
        pseudo.extend_from_slice(&f[l3 + 12..l3 + 20]);
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&len.to_be_bytes());
    } else {
        pseudo.extend_from_slice(&f[l3 + 8..l3 + 40]);
        pseudo.extend_from_slice(&u32::from(len).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 17]);
    }
    let mut datagram = f[udp..udp + len as usize].to_vec();
    if datagram.len() % 2 == 1 {
        datagram.push(0);
    }
    csum::add(csum::sum(&pseudo), csum::sum(&datagram))
}

/// Checks `out`, the frame `input` (built from `p`) became: P_Key `pkey`, an
/// ICRC that is the recomputed one, a UDP checksum still valid (or still
/// zero), and no other byte changed.
pub fn check_rewritten(what: &str, p: &Packet, input: &[u8], out: &[u8], pkey: u16) {
    let (l3, udp, bth) = offsets(p);
    assert_eq!(out.len(), input.len(), "{what}: length");
    assert_eq!(
        u16::from_be_bytes([out[bth + 2], out[bth + 3]]),
        pkey,
        "{what}: P_Key"
    );
    let end = out.len() - 4;
    let icrc = u32::from_le_bytes(out[end..].try_into().unwrap());
    assert_eq!(icrc, icrc_of(&out[..end], l3, udp, bth), "{what}: ICRC");
    if input[udp + 6..udp + 8] == [0, 0] {
        assert_eq!(out[udp + 6..udp + 8], [0, 0], "{what}: zero checksum");
    } else {
        assert_eq!(udp_sum(out, p), 0xffff, "{what}: UDP checksum");
    }
    let rewritten =
        |i: usize| (bth + 2..bth + 4).contains(&i) || i >= end || (udp + 6..udp + 8).contains(&i);
    for (i, (a, b)) in input.iter().zip(out).enumerate() {
        assert!(rewritten(i) || a == b, "{what}: byte {i} changed");
    }
}
