//! Host only: the ICRC patched in O(1) for a rewritten BTH P_Key, as the TC
//! and XDP programs will do, equals the ICRC recomputed over the whole
//! rewritten frame, and patching back restores the frame byte for byte.

use pkeyfw_common::{icrc, parse::opcode};
use pkeyfw_testkit::wire::{Packet, icrc_of};
use proptest::{collection::vec, prelude::*};

/// Rewrites `p`'s P_Key to `new`, patching the ICRC, checks it against
/// recomputation, then rewrites it back.
fn rewrite_and_back(p: &Packet, new: u16) {
    let frame = p.bytes();
    let bth = p.bth_at();
    let pkey = bth + 2..bth + 4;
    assert_eq!(frame[pkey.clone()], p.pkey.to_be_bytes());
    let end = frame.len() - 4;
    let stored = u32::from_le_bytes(frame[end..].try_into().unwrap());
    let bytes_after = end - pkey.end;
    let what = format!(
        "opcode {:#04x}, {} payload bytes, {:?}, P_Key {:#06x} to {new:#06x}",
        p.opcode,
        p.payload.len(),
        p.net,
        p.pkey
    );

    let mut f = frame.clone();
    f[pkey.clone()].copy_from_slice(&new.to_be_bytes());
    let patched = icrc::patch_u16(stored, p.pkey, new, bytes_after).expect("within the table");
    assert_eq!(patched, icrc_of(&f[..end], 14, bth - 8, bth), "{what}");

    f[pkey].copy_from_slice(&p.pkey.to_be_bytes());
    let back = icrc::patch_u16(patched, new, p.pkey, bytes_after).expect("within the table");
    f[end..].copy_from_slice(&back.to_le_bytes());
    assert!(f == frame, "{what}: not restored");
}

/// RoCE v2 over IPv4 or IPv6, RC or UD (with DETH), payloads of 0..=4096
/// bytes with the edges drawn often.
fn packet() -> impl Strategy<Value = Packet> {
    let op = prop_oneof![
        0x00u8..=0x17,
        Just(opcode::UD_SEND_ONLY),
        Just(opcode::UD_SEND_ONLY_IMM)
    ];
    let len = prop_oneof![
        1 => Just(0),
        1 => Just(1),
        1 => Just(4095),
        1 => Just(4096),
        6 => 0usize..=4096,
    ];
    let payload = len.prop_flat_map(|n| vec(any::<u8>(), n));
    (
        any::<bool>(),
        op,
        any::<u16>(),
        0u32..1 << 24,
        any::<u32>(),
        payload,
    )
        .prop_map(|(v6, op, pkey, qp, qkey, payload)| {
            let p = Packet {
                payload,
                ..Packet::v4(op, pkey, qp, qkey)
            };
            if v6 { p.over_v6(Vec::new()) } else { p }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn patched_icrc_equals_recomputed(p in packet(), new: u16) {
        rewrite_and_back(&p, new);
    }
}

/// Every payload size up to 4096, over IPv4 (UD) and IPv6 (RC).
#[test]
fn every_payload_size() {
    let templates = [
        Packet::ud(0xffff, 0x1234, 0x8001_0000),
        Packet::rc(0x8001, 0x45).over_v6(Vec::new()),
    ];
    for template in templates {
        for len in 0..=4096usize {
            let p = Packet {
                payload: (0..len).map(|i| (i * 31 + len) as u8).collect(),
                ..template.clone()
            };
            rewrite_and_back(&p, 0x8000 | len as u16);
        }
    }
}
