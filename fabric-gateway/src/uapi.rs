//! The WireGuard cross-platform userspace API (https://www.wireguard.com/xplatform/),
//! as pure parsing/serialisation so it is testable without sockets.
//!
//! The interface private key is never emitted by `get`: `wg show` works without
//! it (it just omits the interface public/private key lines) and the gateway
//! promises never to print the key anywhere.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ipnetwork::IpNetwork;

use crate::key::PublicKey;

pub const EINVAL: i32 = 22;
pub const ENOENT: i32 = 2;
pub const EPROTO: i32 = 71;
pub const EOPNOTSUPP: i32 = 95;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UapiError {
    pub errno: i32,
    pub message: String,
}

impl UapiError {
    fn new(errno: i32, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get,
    Set(SetRequest),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetRequest {
    /// The key was present; we refuse to change it at runtime (see `Gateway::apply_uapi_set`).
    pub private_key_given: bool,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerSet>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSet {
    pub public_key: PublicKey,
    pub remove: bool,
    pub update_only: bool,
    pub preshared_key_given: bool,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    pub allowed_ips: Vec<IpNetwork>,
}

impl PeerSet {
    fn new(public_key: PublicKey) -> Self {
        Self {
            public_key,
            remove: false,
            update_only: false,
            preshared_key_given: false,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

/// Parses one request (without its terminating blank line).
pub fn parse_request(text: &str) -> Result<Request, UapiError> {
    let mut lines = text.lines().filter(|l| !l.is_empty());
    match lines.next() {
        Some("get=1") => {
            if lines.next().is_some() {
                return Err(UapiError::new(EPROTO, "get=1 takes no arguments"));
            }
            Ok(Request::Get)
        }
        Some("set=1") => parse_set(lines).map(Request::Set),
        Some(other) => Err(UapiError::new(
            EPROTO,
            format!("unknown operation {other:?}"),
        )),
        None => Err(UapiError::new(EPROTO, "empty request")),
    }
}

fn parse_set<'a>(lines: impl Iterator<Item = &'a str>) -> Result<SetRequest, UapiError> {
    let mut req = SetRequest::default();
    let inval = |k: &str, v: &str| UapiError::new(EINVAL, format!("invalid value for {k}: {v:?}"));
    for line in lines {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| UapiError::new(EPROTO, format!("malformed line {line:?}")))?;
        if k == "public_key" {
            let pk = PublicKey::from_hex(v).map_err(|_| inval(k, v))?;
            req.peers.push(PeerSet::new(pk));
            continue;
        }
        match req.peers.last_mut() {
            None => match k {
                "private_key" => {
                    crate::key::decode_hex_32(v).map_err(|_| inval(k, "<redacted>"))?;
                    req.private_key_given = true;
                }
                "listen_port" => req.listen_port = Some(v.parse().map_err(|_| inval(k, v))?),
                "fwmark" => req.fwmark = Some(v.parse().map_err(|_| inval(k, v))?),
                "replace_peers" => req.replace_peers = parse_true(k, v)?,
                _ => {
                    return Err(UapiError::new(
                        EINVAL,
                        format!("unknown interface key {k:?}"),
                    ));
                }
            },
            Some(p) => match k {
                "remove" => p.remove = parse_true(k, v)?,
                "update_only" => p.update_only = parse_true(k, v)?,
                "preshared_key" => {
                    crate::key::decode_hex_32(v).map_err(|_| inval(k, "<redacted>"))?;
                    // All-zero means "no PSK", which is what we support.
                    p.preshared_key_given = v.bytes().any(|b| b != b'0');
                }
                "endpoint" => p.endpoint = Some(parse_endpoint(v).ok_or_else(|| inval(k, v))?),
                "persistent_keepalive_interval" => {
                    p.persistent_keepalive = Some(v.parse().map_err(|_| inval(k, v))?)
                }
                "replace_allowed_ips" => p.replace_allowed_ips = parse_true(k, v)?,
                "allowed_ip" => p.allowed_ips.push(v.parse().map_err(|_| inval(k, v))?),
                "protocol_version" => {
                    if v != "1" {
                        return Err(inval(k, v));
                    }
                }
                _ => return Err(UapiError::new(EINVAL, format!("unknown peer key {k:?}"))),
            },
        }
    }
    Ok(req)
}

fn parse_true(k: &str, v: &str) -> Result<bool, UapiError> {
    if v == "true" {
        Ok(true)
    } else {
        Err(UapiError::new(
            EINVAL,
            format!("{k} only accepts \"true\", got {v:?}"),
        ))
    }
}

/// `1.2.3.4:5` or `[fd00::1]:5` (IPv6 may carry a %scope the std parser also accepts).
fn parse_endpoint(v: &str) -> Option<SocketAddr> {
    v.parse().ok()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSnapshot {
    pub listen_port: u16,
    pub peers: Vec<PeerSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSnapshot {
    pub public_key: PublicKey,
    pub endpoint: Option<SocketAddr>,
    pub last_handshake: Option<SystemTime>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub persistent_keepalive: Option<u16>,
    pub allowed_ips: Vec<IpNetwork>,
}

/// Serialises a `get` answer, including the trailing `errno=0` and blank line.
pub fn format_get(d: &DeviceSnapshot) -> String {
    let mut s = String::with_capacity(256 + d.peers.len() * 256);
    let _ = writeln!(s, "listen_port={}", d.listen_port);
    for p in &d.peers {
        let _ = writeln!(s, "public_key={}", p.public_key.to_hex());
        if let Some(e) = p.endpoint {
            let _ = writeln!(s, "endpoint={e}");
        }
        let hs = p
            .last_handshake
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .unwrap_or(Duration::ZERO);
        let _ = writeln!(s, "last_handshake_time_sec={}", hs.as_secs());
        let _ = writeln!(s, "last_handshake_time_nsec={}", hs.subsec_nanos());
        let _ = writeln!(s, "tx_bytes={}", p.tx_bytes);
        let _ = writeln!(s, "rx_bytes={}", p.rx_bytes);
        let _ = writeln!(
            s,
            "persistent_keepalive_interval={}",
            p.persistent_keepalive.unwrap_or(0)
        );
        for a in &p.allowed_ips {
            let _ = writeln!(s, "allowed_ip={a}");
        }
        let _ = writeln!(s, "protocol_version=1");
    }
    s.push_str("errno=0\n\n");
    s
}

pub fn format_errno(errno: i32) -> String {
    format!("errno={errno}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pk(b: u8) -> PublicKey {
        PublicKey::from_bytes([b; 32])
    }

    #[test]
    fn parses_get() {
        assert_eq!(parse_request("get=1\n"), Ok(Request::Get));
        assert_eq!(
            parse_request("get=1\nlisten_port=1\n").unwrap_err().errno,
            EPROTO
        );
        assert_eq!(parse_request("").unwrap_err().errno, EPROTO);
        assert_eq!(parse_request("frob=1\n").unwrap_err().errno, EPROTO);
    }

    #[test]
    fn parses_set_like_wg_sends_it() {
        // What `wg set fabric listen-port 5 peer <k> remove peer <k2> endpoint ... allowed-ips ...` sends.
        let text = format!(
            "set=1\nlisten_port=5\npublic_key={}\nremove=true\npublic_key={}\nendpoint=[fd00::1]:51820\n\
             persistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.0.0.0/8\n\
             allowed_ip=fd00::/64\nprotocol_version=1\n",
            pk(1).to_hex(),
            pk(2).to_hex()
        );
        let Request::Set(s) = parse_request(&text).unwrap() else {
            panic!("not a set")
        };
        assert_eq!(s.listen_port, Some(5));
        assert!(!s.private_key_given);
        assert_eq!(s.peers.len(), 2);
        assert!(s.peers[0].remove);
        assert_eq!(s.peers[0].public_key, pk(1));
        let p = &s.peers[1];
        assert!(!p.remove && p.replace_allowed_ips);
        assert_eq!(p.endpoint, Some("[fd00::1]:51820".parse().unwrap()));
        assert_eq!(p.persistent_keepalive, Some(25));
        assert_eq!(p.allowed_ips.len(), 2);
    }

    #[test]
    fn rejects_bad_values_with_einval() {
        let k = pk(1).to_hex();
        for bad in [
            format!("set=1\npublic_key={k}\nendpoint=nohost\n"),
            format!("set=1\npublic_key={k}\nallowed_ip=10.0.0.0/40\n"),
            format!("set=1\npublic_key={k}\nremove=false\n"),
            format!("set=1\npublic_key={k}\nprotocol_version=2\n"),
            "set=1\npublic_key=abcd\n".to_string(),
            "set=1\nlisten_port=70000\n".to_string(),
            "set=1\nendpoint=1.2.3.4:5\n".to_string(),
        ] {
            assert_eq!(parse_request(&bad).unwrap_err().errno, EINVAL, "{bad}");
        }
        assert_eq!(
            parse_request("set=1\nnoequals\n").unwrap_err().errno,
            EPROTO
        );
    }

    #[test]
    fn private_key_value_is_not_echoed_in_errors() {
        let e = parse_request("set=1\nprivate_key=secretsecret\n").unwrap_err();
        assert!(!e.message.contains("secretsecret"));
    }

    #[test]
    fn formats_get_for_wg_show() {
        let d = DeviceSnapshot {
            listen_port: 51820,
            peers: vec![PeerSnapshot {
                public_key: pk(3),
                endpoint: Some("192.0.2.1:51820".parse().unwrap()),
                last_handshake: Some(UNIX_EPOCH + Duration::new(1_700_000_000, 5)),
                tx_bytes: 10,
                rx_bytes: 20,
                persistent_keepalive: None,
                allowed_ips: vec!["10.244.0.0/16".parse().unwrap()],
            }],
        };
        let s = format_get(&d);
        let expect = format!(
            "listen_port=51820\npublic_key={}\nendpoint=192.0.2.1:51820\nlast_handshake_time_sec=1700000000\n\
             last_handshake_time_nsec=5\ntx_bytes=10\nrx_bytes=20\npersistent_keepalive_interval=0\n\
             allowed_ip=10.244.0.0/16\nprotocol_version=1\nerrno=0\n\n",
            pk(3).to_hex()
        );
        assert_eq!(s, expect);
        assert!(!s.contains("private_key"));
    }
}
