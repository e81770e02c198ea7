//! The RoCEv2 Invariant CRC (IBA Annex A17; Linux rxe_icrc.c): CRC-32 over
//! eight 0xFF bytes standing for the LRH, the IP and UDP headers and the BTH
//! with their variant fields masked to ones, and the rest of the packet. It is
//! stored little-endian in the last four bytes.

/// CRC-32 (IEEE 802.3, reflected) lookup table.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// A running CRC-32 (no pre- or post-inversion: callers start at `!0` and
/// invert the result, as zlib's crc32 does).
pub const fn update(mut crc: u32, data: &[u8]) -> u32 {
    let mut i = 0;
    while i < data.len() {
        crc = TABLE[((crc ^ data[i] as u32) & 0xff) as usize] ^ (crc >> 8);
        i += 1;
    }
    crc
}

/// The CRC state after the eight 0xFF bytes of the masked LRH.
pub const SEED: u32 = update(!0, &[0xff; 8]);

/// How many covered bytes may follow a patched field: a 9000-byte jumbo frame,
/// rounded up to a power of two.
pub const MAX_PATCH_DISTANCE: usize = 16384;
const _: () = assert!(MAX_PATCH_DISTANCE.is_power_of_two());

/// `X8N[n]` is x^(8n) mod P, reflected like [`TABLE`]: the factor by which `n`
/// following bytes multiply a change's effect on the CRC (each entry is the one
/// before run through a zero byte). A `static`, so one copy in `.rodata`.
static X8N: [u32; MAX_PATCH_DISTANCE] = {
    let mut table = [0u32; MAX_PATCH_DISTANCE];
    table[0] = 1 << 31; // x^0
    let mut n = 1;
    while n < MAX_PATCH_DISTANCE {
        table[n] = update(table[n - 1], &[0]);
        n += 1;
    }
    table
};

/// The ICRC after a big-endian 16-bit field it covers unmasked (the BTH P_Key)
/// changes from `old` to `new`, in a fixed number of steps and without reading
/// the packet, for the XDP and TC programs. `icrc` is the ICRC as stored, the
/// frame's last four bytes read little-endian; `bytes_after` is the number of
/// covered bytes after the field, up to but excluding the ICRC. `None` if it
/// is not below [`MAX_PATCH_DISTANCE`].
///
/// CRC-32 is linear: the ICRC changes by the bare CRC (zero start, no
/// inversion) of the change D followed by n = `bytes_after` zero bytes, the
/// polynomial D·x^(8n). The 47-bit carry-less product D·`X8N[n]` leaves the
/// same remainder, so its six bytes have the same CRC.
#[inline(always)]
pub fn patch_u16(icrc: u32, old: u16, new: u16, bytes_after: usize) -> Option<u32> {
    if bytes_after >= MAX_PATCH_DISTANCE {
        return None;
    }
    // The verifier must see the index bounded where it is used: older ones
    // (Linux 6.1) do not carry the check above over to it once the compiler
    // has rewritten it. black_box hides the check from the compiler, so the
    // mask stays; it never changes the value.
    let n = core::hint::black_box(bytes_after) & (MAX_PATCH_DISTANCE - 1);
    let shift = u64::from(X8N[n]);
    // Reflected like the CRC: bit k is the change's k-th bit on the wire.
    let d = (old ^ new).swap_bytes();
    // Bit m of the product is then its m-th bit on the wire, of 47.
    let mut product = 0;
    for k in 0..16 {
        product ^= (shift << k) & u64::from((d >> k) & 1).wrapping_neg();
    }
    // One leading zero bit makes six whole bytes.
    Some(icrc ^ update(0, &(product << 1).to_le_bytes()[..6]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// zlib's crc32: pre- and post-inverted, like the ICRC.
    fn crc32(data: &[u8]) -> u32 {
        !update(!0, data)
    }

    fn be(pair: &[u8; 2]) -> u16 {
        u16::from_be_bytes(*pair)
    }

    #[test]
    fn check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn powers_of_x() {
        assert_eq!(X8N[0], 1 << 31); // x^0
        assert_eq!(X8N[1], 1 << 23); // x^8
        assert_eq!(X8N[4], 0xedb8_8320); // x^32 ≡ P - x^32
    }

    /// Expected values from Python's zlib.crc32 of the patched strings.
    #[test]
    fn known_vectors() {
        let crc = crc32(b"123456789");
        assert_eq!(patch_u16(crc, be(b"89"), be(b"ab"), 0), Some(0x5c34_5747));
        assert_eq!(patch_u16(crc, be(b"12"), be(b"ab"), 7), Some(0xec80_8b96));
        assert_eq!(patch_u16(crc, be(b"12"), 0xffff, 7), Some(0x5a52_b31a));
    }

    /// The definition, up to the end of the table: the bare CRC of the change
    /// followed by `n` zero bytes.
    #[test]
    fn bare_crc_of_the_change() {
        let mut message = [0u8; 2 + MAX_PATCH_DISTANCE];
        message[..2].copy_from_slice(&0xb00fu16.to_be_bytes());
        for n in [0, 1, 2, 3, 4, 5, 1000, 9000, MAX_PATCH_DISTANCE - 1] {
            assert_eq!(
                patch_u16(0, 0, 0xb00f, n),
                Some(update(0, &message[..2 + n])),
                "n = {n}"
            );
        }
    }

    #[test]
    fn linear() {
        let crc = 0x1234_5678;
        let keys = [0x0000, 0x0001, 0x8000, 0xffff, 0x7fff, 0x8001, 0x1234];
        for n in [0, 1, 8, 4107, MAX_PATCH_DISTANCE - 1] {
            for (a, b, c) in keys.iter().flat_map(|&a| keys.map(|b| (a, b, b ^ 0x5aa5))) {
                let patch = |crc, old, new| patch_u16(crc, old, new, n).unwrap();
                assert_eq!(patch(crc, a, a), crc);
                assert_eq!(patch(patch(crc, a, b), b, a), crc);
                assert_eq!(patch(patch(crc, a, b), b, c), patch(crc, a, c));
                // Only the difference matters.
                assert_eq!(patch(crc, a, b), patch(crc, a ^ c, b ^ c));
            }
        }
    }

    #[test]
    fn bounded() {
        assert!(patch_u16(0, 0, 1, MAX_PATCH_DISTANCE - 1).is_some());
        assert_eq!(patch_u16(0, 0, 1, MAX_PATCH_DISTANCE), None);
        assert_eq!(patch_u16(0, 0, 1, usize::MAX), None);
    }
}
