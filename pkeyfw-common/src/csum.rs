//! The Internet checksum (RFC 1071) updated for bytes rewritten in place
//! (RFC 1624), so that a rewrite costs the same whatever the frame's length.
//! Values are 16-bit words in network order.

/// One's-complement sum of two words.
#[inline(always)]
pub const fn add(a: u16, b: u16) -> u16 {
    let s = a as u32 + b as u32;
    ((s & 0xffff) + (s >> 16)) as u16
}

/// One's-complement sum of `bytes` (an even number of them) as aligned words.
#[inline(always)]
pub fn sum(bytes: &[u8]) -> u16 {
    let mut s = 0;
    let mut i = 0;
    while i + 1 < bytes.len() {
        s = add(s, u16::from_be_bytes([bytes[i], bytes[i + 1]]));
        i += 2;
    }
    s
}

/// What the checksummed sum gains when bytes summing to `old` become bytes
/// summing to `new` (RFC 1624's ~m + m'). `odd`: the bytes start at an odd
/// offset of the checksummed data, so each lands in the other half of its
/// word, which byte-swaps their contribution.
#[inline(always)]
pub const fn diff(old: u16, new: u16, odd: bool) -> u16 {
    let d = add(!old, new);
    if odd { d.swap_bytes() } else { d }
}

/// A UDP checksum after its data's sum changed by `diff` (RFC 1624 eq. 3).
/// Zero (IPv4: no checksum) stays zero; a result of zero is sent as 0xFFFF,
/// zero's other one's-complement form.
#[inline(always)]
pub const fn udp_update(check: u16, diff: u16) -> u16 {
    if check == 0 {
        return 0;
    }
    match !add(!check, diff) {
        0 => 0xffff,
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checksum over `data` (even length), as a sender computes it.
    fn checksum(data: &[u8]) -> u16 {
        match !sum(data) {
            0 => 0xffff,
            c => c,
        }
    }

    #[test]
    fn incremental_equals_recomputed_at_any_offset() {
        let mut data: [u8; 32] = core::array::from_fn(|i| (i * 37 + 11) as u8);
        let new = [0xde, 0xad, 0xbe, 0xef];
        for at in 0..=data.len() - new.len() {
            let check = checksum(&data);
            let mut old = [0; 4];
            old.copy_from_slice(&data[at..at + 4]);
            data[at..at + 4].copy_from_slice(&new);
            let d = diff(sum(&old), sum(&new), at % 2 == 1);
            // Both forms of zero are the same checksum.
            let want = checksum(&data);
            let got = udp_update(check, d);
            assert!(got == want || (got, want) == (0xffff, 0), "at {at}");
            data[at..at + 4].copy_from_slice(&old);
        }
    }

    #[test]
    fn zero_stays_zero() {
        assert_eq!(udp_update(0, 0x1234), 0);
    }

    #[test]
    fn never_zero() {
        // ~(~0x1234 + 0x1234) = 0 would read as "no checksum".
        assert_eq!(udp_update(0x1234, 0x1234), 0xffff);
    }
}
