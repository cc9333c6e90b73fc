//! TCP option parsing for MSS clamping, written so the verifier can bound it: a fixed-size
//! buffer and a loop that advances by at least one byte per step.

/// Longest TCP option area (60-byte header minus the fixed 20).
pub const MAX_OPTIONS: usize = 40;
/// Options looked at before giving up (see `find_mss_with`).
pub const MAX_STEPS: usize = 12;
/// TCP flags (byte 13 of the header).
pub const FLAG_SYN: u8 = 0x02;

/// Finds the MSS option in the first `len` bytes of an option area read through `byte` and
/// returns the offset of its 2-byte value and the value. Malformed lists (length byte < 2, or
/// running past `len`) yield `None`.
///
/// The eBPF program passes a `byte` that loads from the skb with a helper: a loop over a stack
/// buffer or over packet pointers makes the verifier give up (variable stack offsets, or a
/// state explosion), while a helper load with a scalar offset verifies in a few states.
#[inline(always)]
pub fn find_mss_with(len: usize, byte: impl Fn(usize) -> Option<u8>) -> Option<(usize, u16)> {
    let len = if len > MAX_OPTIONS { MAX_OPTIONS } else { len };
    let mut i = 0usize;
    // The verifier walks every branch of every step, so the walk is capped: SYNs carry five or
    // six options (MSS usually first), and a list that hides the MSS behind more than
    // MAX_STEPS options is left unclamped rather than making the program unverifiable.
    for _ in 0..MAX_STEPS {
        if i >= len {
            return None;
        }
        let kind = byte(i)?;
        match kind {
            0 => return None,
            1 => {
                i += 1;
                continue;
            }
            _ => {}
        }
        if i + 1 >= len {
            return None;
        }
        let olen = byte(i + 1)? as usize;
        if olen < 2 || i + olen > len {
            return None;
        }
        if kind == 2 {
            if olen != 4 {
                return None;
            }
            let v = u16::from_be_bytes([byte(i + 2)?, byte(i + 3)?]);
            return Some((i + 2, v));
        }
        i += olen;
    }
    None
}

/// [`find_mss_with`] over a byte slice.
pub fn find_mss(opts: &[u8], len: usize) -> Option<(usize, u16)> {
    find_mss_with(len, |i| opts.get(i).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(b: &[u8]) -> [u8; MAX_OPTIONS] {
        let mut o = [0u8; MAX_OPTIONS];
        o[..b.len()].copy_from_slice(b);
        o
    }

    #[test]
    fn mss_first() {
        let o = buf(&[2, 4, 0x05, 0xb4, 4, 2, 8, 10]);
        assert_eq!(find_mss(&o, 8), Some((2, 1460)));
    }

    #[test]
    fn mss_after_nops_and_sack_permitted_and_timestamps() {
        // Linux SYN: mss, sackOK, TS, nop, wscale - here with the MSS moved to the end.
        let o = buf(&[
            4, 2, 8, 10, 1, 2, 3, 4, 5, 6, 7, 8, 1, 3, 3, 7, 1, 1, 2, 4, 0x23, 0x28,
        ]);
        assert_eq!(find_mss(&o, 22), Some((20, 9000)));
    }

    #[test]
    fn no_mss_or_malformed() {
        assert_eq!(find_mss(&buf(&[1, 1, 1, 0, 2, 4, 5, 180]), 8), None);
        assert_eq!(find_mss(&buf(&[8, 0, 2, 4, 5, 180]), 6), None);
        assert_eq!(find_mss(&buf(&[2, 4, 5]), 3), None);
        assert_eq!(find_mss(&buf(&[2, 3, 5, 180]), 4), None);
        assert_eq!(find_mss(&buf(&[8, 30, 2, 4, 5, 180]), 6), None);
        assert_eq!(find_mss(&buf(&[]), 0), None);
    }

    #[test]
    fn never_reads_past_len() {
        // An MSS option right after `len` must not be found.
        let o = buf(&[1, 1, 1, 1, 2, 4, 5, 180]);
        assert_eq!(find_mss(&o, 4), None);
        assert_eq!(find_mss(&o, 8), Some((6, 1460)));
    }
}
