//! `fabric_common::tcp::find_mss_with`: the MSS clamp's walk over the options of every TCP
//! SYN that crosses a tunnel device, shared by the eBPF program and user space.
//!
//! Input: one byte for the option area's length as the TCP header gives it, then the option
//! bytes (possibly fewer: reads past the packet fail, as the program's loads do). Checked: no
//! read outside the option area, and the result agrees with a plain walk of the option list
//! that stops after the same number of options.

use fabric_common::tcp::{MAX_OPTIONS, MAX_STEPS, find_mss_with};

pub fn check(data: &[u8]) {
    let Some((&len, opts)) = data.split_first() else {
        return;
    };
    let len = usize::from(len);
    let area = len.min(MAX_OPTIONS);
    let got = find_mss_with(len, |i| {
        assert!(i < area, "read byte {i} of a {area}-byte option area");
        opts.get(i).copied()
    });
    assert_eq!(got, walk(&opts[..area.min(opts.len())], area));
    if let Some((at, mss)) = got {
        assert_eq!(opts[at - 2..at + 2], [2, 4, (mss >> 8) as u8, mss as u8]);
    }
}

/// The options in `opts` (an option area of `area` bytes, of which `opts` is what could be
/// read) as a list: (kind, value) pairs, NOP and END handled per RFC 9293.
fn walk(opts: &[u8], area: usize) -> Option<(usize, u16)> {
    let mut rest = opts;
    for _ in 0..MAX_STEPS {
        let at = opts.len() - rest.len();
        match rest {
            [] | [0, ..] | [_] => return None,
            [1, tail @ ..] => rest = tail,
            [kind, len, tail @ ..] => {
                let len = usize::from(*len);
                if len < 2 || at + len > area {
                    return None;
                }
                if *kind == 2 {
                    return match (len, tail) {
                        (4, [a, b, ..]) => Some((at + 2, u16::from_be_bytes([*a, *b]))),
                        _ => None,
                    };
                }
                rest = tail.get(len - 2..)?;
            }
        }
    }
    None
}
