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
