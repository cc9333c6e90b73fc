//! Kubernetes resource quantities (`500m`, `2`, `128Mi`, `1G`, `1e3`) as integers in
//! thousandths of their unit, so that `cpu: 250m` and `memory: 1Ki` are both exact and sums and
//! percentages are integer arithmetic; and back to quantities for what the provider grants.
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Amounts of resources by name, each in thousandths of its unit: what a list of quantities
/// (requests, allocatable, a grant) is once parsed.
pub type Amounts = BTreeMap<String, i128>;

/// A quantity that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a quantity (such as 500m, 2, 128Mi, 1G)")]
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
            if exp > 18 {
                return Err(bad());
            }
            (1000 * 10i128.pow(exp), 1)
        }
        _ => return Err(bad()),
    };
    let (neg, num) = match num.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty())
        || !(int.chars().chain(frac.chars())).all(|c| c.is_ascii_digit())
        || int.len() + frac.len() > 24
    {
        return Err(bad());
    }
    let scale = 10i128.pow(frac.len() as u32);
    let digits: i128 = format!("{int}{frac}").parse().map_err(|_| bad())?;
    let top = digits.checked_mul(mul).ok_or_else(bad)?;
    let bottom = scale * div;
    let v = (top + bottom - 1) / bottom;
    Ok(if neg { -v } else { v })
}

/// Every quantity of `list` parsed; the first that is not one is the error.
pub fn amounts(list: &BTreeMap<String, Quantity>) -> Result<Amounts, BadQuantity> {
    list.iter()
        .map(|(k, q)| Ok((k.clone(), milli(&q.0)?)))
        .collect()
}

/// Resources counted in bytes, written with binary suffixes when they divide evenly.
fn is_bytes(resource: &str) -> bool {
    resource == "memory"
        || resource == "ephemeral-storage"
        || resource.starts_with("hugepages-")
        || resource.starts_with(crate::offloading::lent::RESOURCE_PREFIX)
}

/// `a` as quantities, the resources at zero left out.
pub fn quantities(a: &Amounts) -> BTreeMap<String, Quantity> {
    a.iter()
        .filter(|(_, v)| **v != 0)
        .map(|(k, v)| (k.clone(), quantity(k, *v)))
        .collect()
}

/// `milli` thousandths of `resource` as a quantity: `250m`, `4`, `8Gi`.
pub fn quantity(resource: &str, milli: i128) -> Quantity {
    if milli % 1000 != 0 {
        return Quantity(format!("{milli}m"));
    }
    let n = milli / 1000;
    if is_bytes(resource) && n != 0 {
        for (shift, suffix) in [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
            if n % (1i128 << shift) == 0 {
                return Quantity(format!("{}{suffix}", n >> shift));
            }
        }
    }
    Quantity(n.to_string())
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
        // Below a thousandth rounds up, as the API server does.
        assert_eq!(milli("1u"), Ok(1));
    }

    #[test]
    fn refuses_garbage() {
        for q in [
            "",
            "m",
            "1x",
            "1..2",
            "abc",
            "1 Gi",
            "1e99",
            &"9".repeat(40),
        ] {
            assert!(milli(q).is_err(), "{q}");
        }
    }

    #[test]
    fn lists_parse_whole_or_not_at_all() {
        let q = |s: &str| Quantity(s.into());
        let list = BTreeMap::from([
            ("cpu".to_owned(), q("1500m")),
            ("memory".to_owned(), q("1Ki")),
        ]);
        assert_eq!(
            amounts(&list),
            Ok(Amounts::from([
                ("cpu".to_owned(), 1500),
                ("memory".to_owned(), 1_024_000)
            ]))
        );
        let bad = BTreeMap::from([("cpu".to_owned(), q("1")), ("gpu".to_owned(), q("lots"))]);
        assert_eq!(amounts(&bad), Err(BadQuantity("lots".into())));
    }

    #[test]
    fn writes_back_what_it_reads() {
        assert_eq!(quantity("cpu", 3600).0, "3600m");
        assert_eq!(quantity("cpu", 4000).0, "4");
        assert_eq!(quantity("memory", 1000 << 30).0, "1Gi");
        assert_eq!(quantity("memory", 1000 * 1500).0, "1500");
        assert_eq!(quantity("pods", 1024 * 1000).0, "1024");
        assert_eq!(quantity("memory", 0).0, "0");
        for (r, q) in [("cpu", "1500m"), ("memory", "3Gi"), ("nvidia.com/gpu", "2")] {
            assert_eq!(quantity(r, milli(q).unwrap()).0, q);
        }
    }
}
