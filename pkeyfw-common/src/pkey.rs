//! P_Key arithmetic (IBA 10.9.1, Table 16-2).

/// Bit 15: full membership. Clear: limited membership.
pub const FULL: u16 = 0x8000;
/// The low 15 bits: the partition.
pub const KEY_MASK: u16 = 0x7fff;
/// The default P_Key: full member of the default partition.
pub const DEFAULT: u16 = 0xffff;
/// The invalid P_Key (key portion 0): matches nothing, anywhere.
pub const INVALID: u16 = 0x0000;

/// The partition (key portion) of a P_Key.
#[inline(always)]
pub const fn key(pkey: u16) -> u16 {
    pkey & KEY_MASK
}

/// Whether a P_Key is full member.
#[inline(always)]
pub const fn is_full(pkey: u16) -> bool {
    pkey & FULL != 0
}

/// A P_Key whose key portion is zero is the invalid P_Key; it matches nothing.
#[inline(always)]
pub const fn is_valid(pkey: u16) -> bool {
    key(pkey) != 0
}

/// Two P_Keys match when they name the same valid partition and at least one
/// of them is a full member: limited members cannot talk to each other.
#[inline(always)]
pub const fn matches(a: u16, b: u16) -> bool {
    key(a) == key(b) && is_valid(a) && (a | b) & FULL != 0
}

/// Port-table membership flags, per partition: which kinds of entry the port's
/// P_Key table holds for that key portion. QP1 accepts a P_Key that matches any
/// entry, which these flags answer with one lookup instead of a table scan.
pub mod port {
    /// The table has a limited-member entry for the partition.
    pub const LIMITED: u8 = 1;
    /// The table has a full-member entry for the partition.
    pub const FULL: u8 = 2;

    /// The flag an entry sets.
    #[inline(always)]
    pub const fn flag_of(pkey: u16) -> u8 {
        if super::is_full(pkey) { FULL } else { LIMITED }
    }

    /// Whether a table whose flags for `key(pkey)` are `flags` holds `pkey`
    /// itself: a key the port may send.
    #[inline(always)]
    pub const fn holds(pkey: u16, flags: u8) -> bool {
        super::is_valid(pkey) && flags & flag_of(pkey) != 0
    }

    /// Whether a member whose table's flags for `key(pkey)` are `flags` may
    /// send `pkey`: a partition the table holds, at no higher membership
    /// than it gives (a limited member cannot pose as a full one; a full
    /// one may send as limited). A switch port's inbound check, where the
    /// host behind the port stands in for the HCA that would send only its
    /// table's keys.
    #[inline(always)]
    pub const fn admits(pkey: u16, flags: u8) -> bool {
        super::is_valid(pkey)
            && if super::is_full(pkey) {
                flags & FULL != 0
            } else {
                flags != 0
            }
    }

    /// Whether `pkey` matches some entry of a table whose flags for
    /// `key(pkey)` are `flags`: a full P_Key matches any entry of its
    /// partition, a limited one only a full entry.
    #[inline(always)]
    pub const fn matches(pkey: u16, flags: u8) -> bool {
        super::is_valid(pkey)
            && if super::is_full(pkey) {
                flags != 0
            } else {
                flags & FULL != 0
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The four-QP example: QPA 0x8001, QPB and QPC 0x0001, QPD 0x8002.
    #[test]
    fn four_qp_example() {
        let (a, b, c, d) = (0x8001, 0x0001, 0x0001, 0x8002);
        assert!(matches(a, b) && matches(b, a));
        assert!(matches(a, c) && matches(c, a));
        assert!(!matches(b, c) && !matches(c, b));
        for other in [a, b, c] {
            assert!(!matches(d, other) && !matches(other, d));
        }
    }

    /// IBA Table 16-2: access is refused only limited-to-limited.
    #[test]
    fn table_16_2() {
        let limited = 0x0042;
        let full = 0x8042;
        assert!(!matches(limited, limited));
        assert!(matches(limited, full));
        assert!(matches(full, limited));
        assert!(matches(full, full));
    }

    #[test]
    fn invalid_key_matches_nothing() {
        for other in [0x0000, 0x8000, 0xffff, 0x7fff, 0x8001] {
            assert!(!matches(0x8000, other));
            assert!(!matches(0x0000, other));
            assert!(!matches(other, 0x8000));
        }
    }

    #[test]
    fn default_pkeys() {
        assert!(matches(DEFAULT, 0x7fff));
        assert!(!matches(0x7fff, 0x7fff));
        assert!(!matches(DEFAULT, 0x8001));
    }

    #[test]
    fn port_flags_agree_with_pairwise_match() {
        let tables: [&[u16]; 5] = [&[], &[0x0005], &[0x8005], &[0x0005, 0x8005], &[0x8006]];
        for table in tables {
            let flags = |k| {
                table
                    .iter()
                    .filter(|&&e| key(e) == k)
                    .fold(0, |f, &e| f | port::flag_of(e))
            };
            for p in [0x0005, 0x8005, 0x0006, 0x8006, 0x0000, 0x8000] {
                let want = table.iter().any(|&e| matches(p, e));
                assert_eq!(
                    port::matches(p, flags(key(p))),
                    want,
                    "{p:#x} vs {table:x?}"
                );
            }
        }
    }
}
