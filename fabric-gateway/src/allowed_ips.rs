//! Cryptokey-routing source check: the set of networks a peer may send from.
//!
//! Per-peer TUN devices make the outbound direction trivial (the device *is*
//! the peer), so only the inbound check "is this decrypted source inside the
//! sender's allowed IPs" remains. Peers have a handful of CIDRs, so a flat
//! array of masks beats a trie on cache behaviour and needs no allocation per lookup.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedIps {
    nets: Vec<IpNetwork>,
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl AllowedIps {
    pub fn new(nets: impl IntoIterator<Item = IpNetwork>) -> Self {
        let mut s = Self::default();
        for n in nets {
            s.insert(n);
        }
        s
    }

    /// Adds a network; host bits are cleared like the kernel does for `wg set allowed-ips`.
    pub fn insert(&mut self, net: IpNetwork) {
        let net = IpNetwork::new(net.network(), net.prefix()).expect("prefix already validated");
        if self.nets.contains(&net) {
            return;
        }
        self.nets.push(net);
        match net {
            IpNetwork::V4(n) => {
                let mask = mask32(n.prefix());
                self.v4.push((u32::from(n.network()) & mask, mask));
            }
            IpNetwork::V6(n) => {
                let mask = mask128(n.prefix());
                self.v6.push((u128::from(n.network()) & mask, mask));
            }
        }
    }

    pub fn remove(&mut self, net: &IpNetwork) {
        let keep: Vec<_> = self.nets.iter().copied().filter(|n| n != net).collect();
        *self = Self::new(keep);
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }

    pub fn nets(&self) -> &[IpNetwork] {
        &self.nets
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    pub fn contains_v4(&self, a: Ipv4Addr) -> bool {
        let a = u32::from(a);
        self.v4.iter().any(|&(n, m)| a & m == n)
    }

    pub fn contains_v6(&self, a: Ipv6Addr) -> bool {
        let a = u128::from(a);
        self.v6.iter().any(|&(n, m)| a & m == n)
    }

    pub fn contains(&self, a: IpAddr) -> bool {
        match a {
            IpAddr::V4(a) => self.contains_v4(a),
            IpAddr::V6(a) => self.contains_v6(a),
        }
    }
}

fn mask32(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    }
}

fn mask128(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[&str]) -> AllowedIps {
        AllowedIps::new(v.iter().map(|s| s.parse().unwrap()))
    }

    #[test]
    fn v4_lookup_edges() {
        let a = set(&["10.244.0.0/16", "192.168.1.7/32"]);
        assert!(a.contains("10.244.0.0".parse().unwrap()));
        assert!(a.contains("10.244.255.255".parse().unwrap()));
        assert!(!a.contains("10.245.0.0".parse().unwrap()));
        assert!(!a.contains("10.243.255.255".parse().unwrap()));
        assert!(a.contains("192.168.1.7".parse().unwrap()));
        assert!(!a.contains("192.168.1.8".parse().unwrap()));
        assert!(!a.contains("::1".parse().unwrap()));
    }

    #[test]
    fn default_routes_and_v6() {
        let a = set(&["0.0.0.0/0", "fd00:1::/64"]);
        assert!(a.contains("1.2.3.4".parse().unwrap()));
        assert!(a.contains("fd00:1::abcd".parse().unwrap()));
        assert!(!a.contains("fd00:2::1".parse().unwrap()));
        let all6 = set(&["::/0"]);
        assert!(all6.contains("2001:db8::1".parse().unwrap()));
        assert!(!all6.contains("1.1.1.1".parse().unwrap()));
    }

    #[test]
    fn host_bits_cleared_dedup_and_remove() {
        let mut a = set(&["10.1.2.3/16", "10.1.0.0/16"]);
        assert_eq!(a.nets().len(), 1);
        assert_eq!(a.nets()[0].to_string(), "10.1.0.0/16");
        a.insert("10.2.0.0/16".parse().unwrap());
        a.remove(&"10.1.0.0/16".parse().unwrap());
        assert!(!a.contains("10.1.0.1".parse().unwrap()));
        assert!(a.contains("10.2.0.1".parse().unwrap()));
        a.clear();
        assert!(a.is_empty());
        assert!(!a.contains("10.2.0.1".parse().unwrap()));
    }
}
