//! TCP/IP facts established with etherparse, independently of the gateway's own parsing and
//! checksum code, for the offload targets to check against.

use etherparse::{IpNumber, Ipv4HeaderSlice, Ipv6HeaderSlice, TcpHeaderSlice, checksum};

/// A TCP packet over IPv4 or IPv6 (no extension headers), split into its parts.
pub struct Tcp<'a> {
    pub ip: &'a [u8],
    pub tcp: &'a [u8],
    pub payload: &'a [u8],
}

impl Tcp<'_> {
    pub fn seq(&self) -> u32 {
        u32::from_be_bytes([self.tcp[4], self.tcp[5], self.tcp[6], self.tcp[7]])
    }

    pub fn flags(&self) -> u8 {
        self.tcp[13]
    }
}

/// Ones-complement sum of `data` folded to 16 bits, complemented: 0 when `data` holds a
/// correct Internet checksum.
fn csum(data: &[u8]) -> u16 {
    checksum::Sum16BitWords::new()
        .add_slice(data)
        .ones_complement()
}

/// Header lengths (IP, TCP) and family of something shaped like a TCP packet: version, header
/// lengths and protocol fit, nothing else is checked.
pub fn tcp_shape(p: &[u8]) -> Option<(usize, usize, bool)> {
    let (iphl, v6) = match p.first()? >> 4 {
        4 if p.len() >= 20 && p[9] == 6 => (usize::from(p[0] & 0x0f) * 4, false),
        6 if p.len() >= 40 && p[6] == 6 => (40, true),
        _ => return None,
    };
    if iphl < 20 || p.len() < iphl + 20 {
        return None;
    }
    let thl = usize::from(p[iphl + 12] >> 4) * 4;
    (thl >= 20 && p.len() >= iphl + thl).then_some((iphl, thl, v6))
}

/// The packet as a receiver would accept it: lengths that match the buffer, a correct IPv4
/// header checksum and a correct TCP checksum (verified by summing, so 0 and 0xffff are the
/// same checksum, as for a receiver). None otherwise.
pub fn valid_tcp(p: &[u8]) -> Option<Tcp<'_>> {
    let (iphl, pseudo) = match p.first()? >> 4 {
        4 => {
            let ip = Ipv4HeaderSlice::from_slice(p).ok()?;
            let iphl = ip.slice().len();
            if usize::from(ip.total_len()) != p.len()
                || ip.protocol() != IpNumber::TCP
                || csum(ip.slice()) != 0
            {
                return None;
            }
            let pseudo = checksum::Sum16BitWords::new()
                .add_4bytes(ip.source())
                .add_4bytes(ip.destination())
                .add_2bytes([0, 6])
                .add_2bytes(u16::try_from(p.len() - iphl).ok()?.to_be_bytes());
            (iphl, pseudo)
        }
        6 => {
            let ip = Ipv6HeaderSlice::from_slice(p).ok()?;
            if usize::from(ip.payload_length()) + 40 != p.len() || ip.next_header() != IpNumber::TCP
            {
                return None;
            }
            let pseudo = checksum::Sum16BitWords::new()
                .add_16bytes(ip.source())
                .add_16bytes(ip.destination())
                .add_4bytes(u32::from(ip.payload_length()).to_be_bytes())
                .add_4bytes([0, 0, 0, 6]);
            (40, pseudo)
        }
        _ => return None,
    };
    let tcp = TcpHeaderSlice::from_slice(&p[iphl..]).ok()?;
    let thl = tcp.slice().len();
    (pseudo.add_slice(&p[iphl..]).ones_complement() == 0).then(|| Tcp {
        ip: &p[..iphl],
        tcp: &p[iphl..iphl + thl],
        payload: &p[iphl + thl..],
    })
}

/// Makes a TCP-shaped packet valid: IP length field, IPv4 header checksum, TCP checksum.
/// Leaves anything else (or a packet too long for its length field) alone.
pub fn make_valid(p: &mut [u8]) {
    let Some((iphl, _, v6)) = tcp_shape(p) else {
        return;
    };
    let len = p.len();
    if v6 {
        let Ok(l) = u16::try_from(len - 40) else {
            return;
        };
        p[4..6].copy_from_slice(&l.to_be_bytes());
    } else {
        let Ok(l) = u16::try_from(len) else {
            return;
        };
        p[2..4].copy_from_slice(&l.to_be_bytes());
        p[10..12].fill(0);
        let c = csum(&p[..iphl]);
        p[10..12].copy_from_slice(&c.to_ne_bytes());
    }
    let c = if v6 {
        let Ok(ip) = Ipv6HeaderSlice::from_slice(p) else {
            return;
        };
        let Ok(tcp) = TcpHeaderSlice::from_slice(&p[40..]) else {
            return;
        };
        tcp.calc_checksum_ipv6(&ip, &p[40 + tcp.slice().len()..])
    } else {
        let Ok(ip) = Ipv4HeaderSlice::from_slice(p) else {
            return;
        };
        let Ok(tcp) = TcpHeaderSlice::from_slice(&p[iphl..]) else {
            return;
        };
        tcp.calc_checksum_ipv4(&ip, &p[iphl + tcp.slice().len()..])
    };
    if let Ok(c) = c {
        p[iphl + 16..iphl + 18].copy_from_slice(&c.to_be_bytes());
    }
}

/// What the kernel does with a NEEDS_CSUM packet: the field at `start + offset` holds a seed
/// (the pseudo-header sum); the checksum of everything from `start` on replaces it.
pub fn complete_partial(p: &mut [u8], start: usize, offset: usize) {
    let c = csum(&p[start..]);
    p[start + offset..start + offset + 2].copy_from_slice(&c.to_ne_bytes());
}

/// Whether `data` carries a correct Internet checksum when `seed` is added to its sum.
pub fn sums_to_zero_with(seed: u16, data: &[u8]) -> bool {
    checksum::Sum16BitWords::new()
        .add_2bytes(seed.to_be_bytes())
        .add_slice(data)
        .ones_complement()
        == 0
}
