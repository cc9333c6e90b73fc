//! Internet checksum arithmetic (RFC 1071/1624) on values as they sit in memory.
//!
//! Values are 16/32-bit words loaded from the packet with the host's native loads, exactly as
//! the kernel's `csum_partial` family treats them, so results can be mixed with the kernel's
//! checksum helpers and stored back as they are.

/// One's-complement add with end-around carry.
#[inline(always)]
pub const fn add(a: u32, b: u32) -> u32 {
    let (s, c) = a.overflowing_add(b);
    s.wrapping_add(c as u32)
}

/// Folds a 32-bit partial sum to 16 bits and complements it (a checksum field value).
#[inline(always)]
pub const fn fold(sum: u32) -> u16 {
    let s = (sum & 0xffff) + (sum >> 16);
    let s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// The partial-sum difference of replacing the word `old` by `new` (what `bpf_csum_diff`
/// gives for one 4-byte word).
#[inline(always)]
pub const fn diff32(old: u32, new: u32) -> u32 {
    add(!old, new)
}

/// Updates a checksum field for a change whose partial-sum difference is `diff`
/// (the kernel's `csum_replace_by_diff`).
#[inline(always)]
pub const fn replace_by_diff(check: u16, diff: u32) -> u16 {
    fold(add(diff, !(check as u32)))
}

/// Updates a checksum field for a 16-bit word changing from `old` to `new` (RFC 1624 eqn. 3).
#[inline(always)]
pub const fn replace16(check: u16, old: u16, new: u16) -> u16 {
    replace_by_diff(check, add(!(old as u32) & 0xffff, new as u32))
}

/// Full checksum over a byte slice (for tests and user space; not for the packet path).
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum = add(sum, u16::from_ne_bytes([c[0], c[1]]) as u32);
    }
    if let [last] = chunks.remainder() {
        sum = add(sum, u16::from_ne_bytes([*last, 0]) as u32);
    }
    fold(sum)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ipv4_header(src: [u8; 4], dst: [u8; 4]) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&84u16.to_be_bytes());
        h[8] = 64;
        h[9] = 1;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_ne_bytes());
        h
    }

    #[test]
    fn known_header_checksum() {
        // A classic example header (RFC 1071 style check): checksum over a valid header is 0.
        let h = ipv4_header([10, 244, 1, 10], [10, 71, 2, 7]);
        assert_eq!(checksum(&h), 0);
    }

    proptest! {
        #[test]
        fn incremental_matches_full(src: [u8; 4], dst: [u8; 4], new_dst: [u8; 4]) {
            let mut h = ipv4_header(src, dst);
            let old = u32::from_ne_bytes(dst);
            let new = u32::from_ne_bytes(new_dst);
            let check = u16::from_ne_bytes([h[10], h[11]]);
            let updated = replace_by_diff(check, diff32(old, new));
            h[16..20].copy_from_slice(&new_dst);
            h[10..12].copy_from_slice(&updated.to_ne_bytes());
            prop_assert_eq!(checksum(&h), 0);
        }

        #[test]
        fn replace16_matches_full(words: [u16; 8], idx in 0usize..7, new: u16) {
            let mut data = [0u8; 18];
            for (i, w) in words.iter().enumerate() {
                data[2 * i..2 * i + 2].copy_from_slice(&w.to_ne_bytes());
            }
            // last word is the checksum field
            let c = checksum(&data[..16]);
            data[16..18].copy_from_slice(&c.to_ne_bytes());
            let old = u16::from_ne_bytes([data[2 * idx], data[2 * idx + 1]]);
            let updated = replace16(c, old, new);
            data[2 * idx..2 * idx + 2].copy_from_slice(&new.to_ne_bytes());
            data[16..18].copy_from_slice(&updated.to_ne_bytes());
            prop_assert_eq!(checksum(&data), 0);
        }
    }
}
