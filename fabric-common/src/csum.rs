//! Internet checksum arithmetic (RFC 1071/1624), the one implementation of the workspace.
//!
//! Two flavours share the module:
//! - The eBPF programs' incremental updates ([`add`], [`fold`], [`diff32`], [`replace16`], …)
//!   work on 16/32-bit words loaded from the packet with the host's native loads, exactly as
//!   the kernel's `csum_partial` family treats them, so results can be mixed with the kernel's
//!   checksum helpers and stored back as they are. They are branch-free and loop-free, as the
//!   verifier likes them.
//! - User space's bulk sums ([`wide_add`], [`wide_fold`]) read network-order (big-endian) words
//!   into a 64-bit accumulator that needs no end-around carry until the fold, for the gateway's
//!   segmentation offload where a checksum covers up to 64 KiB per segment batch. Their results
//!   are numbers: store them with `to_be_bytes`. Integers such as the pseudo-header's protocol
//!   and length can be added to the accumulator as they are.
//!
//! The one's-complement sum does not depend on byte order (RFC 1071, section 2(B)), so both
//! agree: `checksum(d).to_ne_bytes() == (!wide_fold(wide_add(0, d))).to_be_bytes()`.

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

/// Adds `data`, read as big-endian 16-bit words (an odd last byte as the high half of a word),
/// to the wide partial sum `sum`: the result is congruent, modulo 0xffff, to `sum` plus those
/// words (the data's part is folded to at most 16 bits), so sums can go on being added and
/// integers added to them before the one [`wide_fold`].
#[inline]
pub fn wide_add(sum: u64, data: &[u8]) -> u64 {
    // The bulk is summed as native-endian 32-bit words into four 64-bit lanes: no byte swap
    // per word and independent additions, which the compiler turns into vector adds (about
    // twice the speed of a big-endian word at a time, where the gateway's per-segment
    // checksums showed in its profile). The one's-complement sum does not depend on byte
    // order (RFC 1071, section 2(B)): the native sum, folded to 16 bits and byte-swapped on
    // a little-endian host, is the big-endian one. Folding early keeps the value congruent
    // modulo 0xffff and non-zero exactly when the data is, so `wide_fold` of any total
    // gives what summing every big-endian word would have given.
    let mut lanes = [0u64; 4];
    let mut chunks = data.chunks_exact(16);
    for c in &mut chunks {
        for (k, lane) in lanes.iter_mut().enumerate() {
            let w = [c[4 * k], c[4 * k + 1], c[4 * k + 2], c[4 * k + 3]];
            *lane += u64::from(u32::from_ne_bytes(w));
        }
    }
    let mut native = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    let mut words = chunks.remainder().chunks_exact(2);
    for c in &mut words {
        native += u64::from(u16::from_ne_bytes([c[0], c[1]]));
    }
    if let [last] = words.remainder() {
        // An odd last byte is the high half of a big-endian word.
        native += u64::from(u16::from_ne_bytes([*last, 0]));
    }
    let folded = wide_fold(native);
    sum + u64::from(if cfg!(target_endian = "little") {
        folded.swap_bytes()
    } else {
        folded
    })
}

/// Folds a wide partial sum (from [`wide_add`]) to 16 bits with end-around carries; not
/// complemented (a checksum field takes `!wide_fold(..)`, and a packet whose sum including its
/// checksum field folds to `0xffff` verifies).
#[inline]
pub const fn wide_fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

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

        #[test]
        fn wide_sum_agrees_with_native_checksum(data in proptest::collection::vec(any::<u8>(), 0..1600)) {
            let wide = !wide_fold(wide_add(0, &data));
            prop_assert_eq!(wide.to_be_bytes(), checksum(&data).to_ne_bytes());
        }

        #[test]
        fn wide_sum_equals_big_endian_words_one_by_one(
            start in 0u64..(1 << 40),
            data in proptest::collection::vec(any::<u8>(), 0..200),
            skip in 0usize..16,
        ) {
            // Reference: every big-endian word added as a number (odd last byte as the high
            // half), the definition the native-lane sum must agree with at any length and
            // any alignment of the slice.
            let d = &data[skip.min(data.len())..];
            let mut r = start;
            for w in d.chunks(2) {
                r += u64::from(w[0]) << 8 | w.get(1).map_or(0, |&b| u64::from(b));
            }
            prop_assert_eq!(wide_fold(wide_add(start, d)), wide_fold(r));
        }

        #[test]
        fn wide_sum_is_additive_over_even_splits(
            data in proptest::collection::vec(any::<u8>(), 0..1600),
            at: proptest::sample::Index,
        ) {
            // Splitting at an even offset keeps every word whole: sums of the parts add up,
            // as the segmentation offload relies on (pseudo-header, then each segment).
            let cut = at.index(data.len() / 2 + 1) * 2;
            let parts = wide_add(wide_add(0, &data[..cut]), &data[cut..]);
            prop_assert_eq!(wide_fold(parts), wide_fold(wide_add(0, &data)));
        }

        #[test]
        fn wide_fold_is_the_ones_complement_sum(words in proptest::collection::vec(any::<u16>(), 0..64)) {
            // Reference: 16-bit one's-complement addition one word at a time.
            let mut r = 0u16;
            for w in &words {
                let (s, c) = r.overflowing_add(*w);
                r = s.wrapping_add(u16::from(c));
            }
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
            let folded = wide_fold(wide_add(0, &bytes));
            // 0x0000 and 0xffff are the same number in one's complement.
            prop_assert!(folded == r || (folded == 0xffff && r == 0) || (folded == 0 && r == 0xffff));
        }

        #[test]
        fn integers_add_to_the_wide_sum_as_words(proto: u8, len: u16, data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut with_bytes = data.clone();
            if with_bytes.len() % 2 == 1 {
                with_bytes.push(0);
            }
            with_bytes.extend_from_slice(&[0, proto]);
            with_bytes.extend_from_slice(&len.to_be_bytes());
            let as_ints = wide_add(0, &data) + u64::from(proto) + u64::from(len);
            prop_assert_eq!(wide_fold(as_ints), wide_fold(wide_add(0, &with_bytes)));
        }
    }

    #[test]
    fn wide_verifies_a_known_header() {
        let h = ipv4_header([10, 244, 1, 10], [10, 71, 2, 7]);
        assert_eq!(wide_fold(wide_add(0, &h)), 0xffff);
    }
}
