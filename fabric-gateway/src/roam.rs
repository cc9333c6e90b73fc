//! Which datagrams prove that they come from the peer, so that the peer's endpoint may move to
//! their source (WireGuard roaming). Pure: a function of what the datagram was and what the
//! noise state machine made of it.
//!
//! Only proof of the peer's keys counts: transport data that decrypted, or a handshake message
//! that the state machine accepted. A cookie reply never does (it answers a rate limiter and
//! costs nothing to replay from elsewhere), and neither does anything that failed, such as a
//! replayed or forged initiation (refused for its old timestamp or its bad static key).
use boringtun::noise::{Packet, TunnResult};

/// The kind of a WireGuard message, as parsed before it reaches a peer's state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    HandshakeInit,
    HandshakeResponse,
    CookieReply,
    Data,
}

impl Kind {
    pub fn of(p: &Packet<'_>) -> Self {
        match p {
            Packet::HandshakeInit(_) => Self::HandshakeInit,
            Packet::HandshakeResponse(_) => Self::HandshakeResponse,
            Packet::PacketCookieReply(_) => Self::CookieReply,
            Packet::PacketData(_) => Self::Data,
        }
    }
}

/// WireGuard message type of a handshake response (the first byte, little-endian u32).
const HANDSHAKE_RESPONSE: u8 = 2;

/// True when a datagram of `kind` that the peer's state machine answered with `res` proves
/// that it was sent by the peer.
pub fn proves_peer(kind: Kind, res: &TunnResult<'_>) -> bool {
    match (kind, res) {
        (_, TunnResult::Err(_)) | (Kind::CookieReply, _) => false,
        // An accepted initiation is answered with a handshake response; anything else written
        // back (a cookie from a limiter) proves nothing.
        (Kind::HandshakeInit, TunnResult::WriteToNetwork(p)) => {
            p.first() == Some(&HANDSHAKE_RESPONSE)
        }
        (Kind::HandshakeInit, _) => false,
        (Kind::HandshakeResponse | Kind::Data, _) => true,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use boringtun::{
        noise::{Tunn, rate_limiter::RateLimiter},
        x25519::{PublicKey, StaticSecret},
    };

    use super::*;

    struct Pair {
        a: Tunn,
        b: Tunn,
        b_public: PublicKey,
    }

    /// Two state machines as the gateway builds them: a private, never-limiting limiter each.
    fn pair() -> Pair {
        let (ka, kb) = (StaticSecret::from([1u8; 32]), StaticSecret::from([2u8; 32]));
        let (pa, pb) = (PublicKey::from(&ka), PublicKey::from(&kb));
        let unlimited = |p: &PublicKey| Some(std::sync::Arc::new(RateLimiter::new(p, u64::MAX)));
        Pair {
            a: Tunn::new(ka, pb, None, None, 1 << 8, unlimited(&pa)),
            b: Tunn::new(kb, pa, None, None, 2 << 8, unlimited(&pb)),
            b_public: pb,
        }
    }

    fn kind(datagram: &[u8]) -> Kind {
        Kind::of(&Tunn::parse_incoming_packet(datagram).unwrap())
    }

    fn initiation(t: &mut Tunn) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        match t.format_handshake_initiation(&mut buf, true) {
            TunnResult::WriteToNetwork(p) => p.to_vec(),
            other => panic!("no initiation: {other:?}"),
        }
    }

    fn ipv4_packet() -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&28u16.to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p
    }

    #[test]
    fn handshake_and_data_prove_the_peer_replays_do_not() {
        let mut p = pair();
        let mut out = vec![0u8; 2048];
        let init = initiation(&mut p.a);
        let res = p.b.decapsulate(None, &init, &mut out);
        assert!(proves_peer(kind(&init), &res), "fresh initiation: {res:?}");
        let response = match res {
            TunnResult::WriteToNetwork(r) => r.to_vec(),
            other => panic!("{other:?}"),
        };
        // The same initiation again (captured and replayed from another address): refused.
        let res = p.b.decapsulate(None, &init, &mut out);
        assert!(!proves_peer(kind(&init), &res), "replay: {res:?}");

        let mut out_a = vec![0u8; 2048];
        let res = p.a.decapsulate(None, &response, &mut out_a);
        assert!(proves_peer(kind(&response), &res), "response: {res:?}");

        let mut enc = vec![0u8; 2048];
        let data = match p.a.encapsulate(&ipv4_packet(), &mut enc) {
            TunnResult::WriteToNetwork(d) => d.to_vec(),
            other => panic!("{other:?}"),
        };
        let res = p.b.decapsulate(None, &data, &mut out);
        assert!(
            matches!(res, TunnResult::WriteToTunnelV4(_, a) if a == Ipv4Addr::new(10, 0, 0, 1))
        );
        assert!(proves_peer(kind(&data), &res));
        // Replayed transport data is refused by the replay window.
        let res = p.b.decapsulate(None, &data, &mut out);
        assert!(!proves_peer(kind(&data), &res), "replayed data: {res:?}");
    }

    /// The gateway's shared limiter answers initiations with cookie replies when under load;
    /// the initiator's state machine accepts them, but they never prove anything.
    #[test]
    fn cookie_replies_never_prove_the_peer() {
        let mut p = pair();
        let under_load = RateLimiter::new(&p.b_public, 0);
        let init = initiation(&mut p.a);
        let mut cookie_buf = vec![0u8; 256];
        let from = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9));
        let cookie = match under_load.verify_packet(Some(from), &init, &mut cookie_buf) {
            Err(TunnResult::WriteToNetwork(c)) => c.to_vec(),
            other => panic!("no cookie under load: {other:?}"),
        };
        let mut out = vec![0u8; 2048];
        let res = p.a.decapsulate(None, &cookie, &mut out);
        assert!(
            !matches!(res, TunnResult::Err(_)),
            "the cookie is valid: {res:?}"
        );
        assert_eq!(kind(&cookie), Kind::CookieReply);
        assert!(!proves_peer(kind(&cookie), &res));
        // A limiter's cookie written back for an initiation is no handshake response either.
        let mut c = cookie.clone();
        assert!(!proves_peer(
            Kind::HandshakeInit,
            &TunnResult::WriteToNetwork(&mut c)
        ));
    }
}
