//! Kubernetes resource quantities (`500m`, `2`, `128Mi`, `1G`, `1e3`) as integers in the unit
//! the scheduler and the test node compare them in: thousandths of the base unit, so that
//! `cpu: 250m` and `memory: 1Ki` are both exact.
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid quantity {0:?}")]
pub struct BadQuantity(pub String);

/// `q` in thousandths of its unit (`"250m"` → 250, `"1Ki"` → 1_024_000), rounded up as the API
/// server rounds requests.
pub fn milli(q: &str) -> Result<i128, BadQuantity> {
    let bad = || BadQuantity(q.to_owned());
    let s = q.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return Err(bad());
    }
    // (numerator, denominator) of the suffix's factor, applied to thousandths.
    let (mul, div): (i128, i128) = match suffix {
        "" => (1000, 1),
        "n" => (1, 1_000_000),
        "u" => (1, 1000),
        "m" => (1, 1),
        "k" => (1000 * 1000, 1),
        "M" => (1000 * 1_000_000, 1),
        "G" => (1000 * 1_000_000_000, 1),
        "T" => (1000 * 1_000_000_000_000, 1),
        "P" => (1000 * 1_000_000_000_000_000, 1),
        "E" => (1000 * 1_000_000_000_000_000_000, 1),
        "Ki" => (1000 << 10, 1),
        "Mi" => (1000 << 20, 1),
        "Gi" => (1000 << 30, 1),
        "Ti" => (1000 << 40, 1),
        "Pi" => (1000 << 50, 1),
        "Ei" => (1000 << 60, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..].parse().map_err(|_| bad())?;
            (1000 * 10i128.checked_pow(exp).ok_or_else(bad)?, 1)
        }
        _ => return Err(bad()),
    };
    let (neg, num) = match num.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty()
        || !(int.chars().chain(frac.chars())).all(|c| c.is_ascii_digit())
    {
        return Err(bad());
    }
    let scale = 10i128.checked_pow(frac.len() as u32).ok_or_else(bad)?;
    let digits: i128 = format!("{int}{frac}").parse().map_err(|_| bad())?;
    let top = digits.checked_mul(mul).ok_or_else(bad)?;
    let bottom = scale * div;
    let v = (top + bottom - 1) / bottom;
    Ok(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_common_forms() {
        assert_eq!(milli("250m"), Ok(250));
        assert_eq!(milli("2"), Ok(2000));
        assert_eq!(milli("0.5"), Ok(500));
        assert_eq!(milli("1Ki"), Ok(1_024_000));
        assert_eq!(milli("128Mi"), Ok(128 * 1024 * 1024 * 1000));
        assert_eq!(milli("1G"), Ok(1_000_000_000_000));
        assert_eq!(milli("1e3"), Ok(1_000_000));
        assert_eq!(milli("110"), Ok(110_000));
        // Below a thousandth rounds up, as the API server does.
        assert_eq!(milli("1u"), Ok(1));
    }

    #[test]
    fn refuses_garbage() {
        for q in ["", "m", "1x", "1..2", "abc", "1 Gi"] {
            assert!(milli(q).is_err(), "{q}");
        }
    }
}
