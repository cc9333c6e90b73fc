//! The WireGuard cross-platform userspace API (https://www.wireguard.com/xplatform/),
//! as pure parsing/serialisation and the semantics of `set` ([`plan_set`]), so it is
//! testable without sockets.
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

use crate::{config::PeerConfig, key::PublicKey, reconfig::PeerUpdate};

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
    /// The key was present; we refuse to change it at runtime (see [`plan_set`]).
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
        Some(other) => {
            // Only the name: a request that lost its `set=1` may start with a key's line.
            let op = other.split_once('=').map_or(other, |(op, _)| op);
            Err(UapiError::new(EPROTO, format!("unknown operation {op:?}")))
        }
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

/// A running peer as a `set` sees it: its configuration and its live endpoint (which
/// roaming may have moved away from the configured one).
#[derive(Debug, Clone, PartialEq)]
pub struct LivePeer {
    pub config: PeerConfig,
    pub endpoint: Option<SocketAddr>,
}

/// One step of a `set`, applied in order; the first that fails ends the `set` (EINVAL).
#[derive(Debug, Clone, PartialEq)]
pub enum PeerChange {
    Remove(PublicKey),
    /// Add the peer, or update the running one with this key to this configuration.
    Apply(Box<PeerConfig>),
}

/// What a `set` does to the `running` peers (in the order `replace_peers` removes them).
/// Refused (EOPNOTSUPP) for what the gateway does not change at runtime: the private key
/// (it comes from `private_key_file`), the listen port, a fwmark, preshared keys. Changes
/// are live only: a reload restores the configuration file's state.
pub fn plan_set(
    req: SetRequest,
    listen_port: u16,
    running: Vec<LivePeer>,
) -> Result<Vec<PeerChange>, UapiError> {
    if req.private_key_given {
        return Err(UapiError::new(
            EOPNOTSUPP,
            "the private key comes from private_key_file; change it there and restart",
        ));
    }
    if req.listen_port.is_some_and(|p| p != listen_port) {
        return Err(UapiError::new(
            EOPNOTSUPP,
            "listen port changes need a restart",
        ));
    }
    if req.fwmark.is_some_and(|m| m != 0) {
        return Err(UapiError::new(EOPNOTSUPP, "fwmark is not supported"));
    }
    if req.peers.iter().any(|p| p.preshared_key_given) {
        return Err(UapiError::new(
            EOPNOTSUPP,
            "preshared keys are not supported",
        ));
    }
    // The peers as each step leaves them, so that a key named twice sees the first change.
    let mut live = running;
    let mut changes = Vec::new();
    if req.replace_peers {
        live.retain(|p| {
            let keep = req
                .peers
                .iter()
                .any(|s| s.public_key == p.config.public_key);
            if !keep {
                changes.push(PeerChange::Remove(p.config.public_key));
            }
            keep
        });
    }
    for ps in req.peers {
        let at = live
            .iter()
            .position(|p| p.config.public_key == ps.public_key);
        if ps.remove {
            if let Some(i) = at {
                live.remove(i);
                changes.push(PeerChange::Remove(ps.public_key));
            }
            continue;
        }
        let existing = at.map(|i| &live[i]);
        let mut cfg = match existing {
            Some(p) => p.config.clone(),
            None if ps.update_only => continue,
            None => uapi_peer(ps.public_key),
        };
        if let Some(e) = ps.endpoint {
            cfg.endpoint = Some(e);
        } else if let Some(p) = existing {
            // Keep the roamed endpoint rather than the configured one.
            cfg.endpoint = p.endpoint;
        }
        if let Some(k) = ps.persistent_keepalive {
            cfg.persistent_keepalive = (k != 0).then_some(k);
        }
        if ps.replace_allowed_ips {
            cfg.allowed_ips.clear();
        }
        for n in ps.allowed_ips {
            let n = IpNetwork::new(n.network(), n.prefix()).expect("valid prefix");
            if !cfg.allowed_ips.contains(&n) {
                cfg.allowed_ips.push(n);
            }
        }
        let after = LivePeer {
            endpoint: match existing {
                Some(p) => PeerUpdate::between(&p.config, &cfg)
                    .map_or(p.endpoint, |u| u.endpoint_after(p.endpoint)),
                None => cfg.endpoint,
            },
            config: cfg.clone(),
        };
        match at {
            Some(i) => live[i] = after,
            None => live.push(after),
        }
        changes.push(PeerChange::Apply(Box::new(cfg)));
    }
    Ok(changes)
}

/// A peer created over UAPI: named, and its device too, after its key.
fn uapi_peer(public_key: PublicKey) -> PeerConfig {
    let hex = public_key.to_hex();
    PeerConfig {
        name: format!("uapi-{}", &hex[..8]),
        public_key,
        endpoint: None,
        allowed_ips: vec![],
        persistent_keepalive: None,
        device: Some(format!("fab-{}", &hex[..8])),
        addresses: vec![],
        routes: vec![],
        probe_address: None,
        id: None,
        remaps: vec![],
        mss: None,
    }
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
        // Found by the uapi fuzz target: a request without its `set=1` line.
        let e = parse_request("private_key=e_key=pubtie\n").unwrap_err();
        assert_eq!(e.errno, EPROTO);
        assert!(!e.message.contains("pubtie"), "{}", e.message);
        assert!(e.message.contains("private_key"), "{}", e.message);
    }

    fn set(peers: Vec<PeerSet>) -> SetRequest {
        SetRequest {
            peers,
            ..SetRequest::default()
        }
    }

    fn live(name: &str, key: u8, endpoint: Option<&str>) -> LivePeer {
        let mut config = crate::reconfig::tests::peer(name, key);
        config.endpoint = Some("192.0.2.1:51820".parse().unwrap());
        config.allowed_ips = vec!["10.1.0.0/16".parse().unwrap()];
        LivePeer {
            config,
            endpoint: endpoint.map(|e| e.parse().unwrap()),
        }
    }

    #[test]
    fn set_refuses_what_needs_a_restart_or_is_unsupported() {
        let cases = [
            SetRequest {
                private_key_given: true,
                ..SetRequest::default()
            },
            SetRequest {
                listen_port: Some(5),
                ..SetRequest::default()
            },
            SetRequest {
                fwmark: Some(1),
                ..SetRequest::default()
            },
            set(vec![PeerSet {
                preshared_key_given: true,
                ..PeerSet::new(pk(1))
            }]),
        ];
        for req in cases {
            let e = plan_set(req.clone(), 51820, vec![]).unwrap_err();
            assert_eq!(e.errno, EOPNOTSUPP, "{req:?}");
        }
        let same = SetRequest {
            listen_port: Some(51820),
            fwmark: Some(0),
            ..SetRequest::default()
        };
        assert_eq!(plan_set(same, 51820, vec![]), Ok(vec![]));
    }

    #[test]
    fn set_creates_a_peer_named_after_its_key() {
        let req = set(vec![PeerSet {
            endpoint: Some("192.0.2.9:51820".parse().unwrap()),
            persistent_keepalive: Some(25),
            allowed_ips: vec![
                "10.9.1.2/16".parse().unwrap(),
                "10.9.0.0/16".parse().unwrap(),
            ],
            ..PeerSet::new(pk(0xab))
        }]);
        let [PeerChange::Apply(c)] = &plan_set(req, 1, vec![]).unwrap()[..] else {
            panic!("one peer applied")
        };
        assert_eq!(c.name, "uapi-abababab");
        assert_eq!(c.device_name(), "fab-abababab");
        assert_eq!(c.endpoint, Some("192.0.2.9:51820".parse().unwrap()));
        assert_eq!(c.persistent_keepalive, Some(25));
        // Normalised to the network address, once.
        assert_eq!(c.allowed_ips, ["10.9.0.0/16".parse().unwrap()]);
    }

    #[test]
    fn set_updates_keep_the_roamed_endpoint_and_merge_allowed_ips() {
        let running = vec![live("a", 1, Some("198.51.100.7:4000"))];
        let req = set(vec![PeerSet {
            persistent_keepalive: Some(0),
            allowed_ips: vec!["10.2.0.0/16".parse().unwrap()],
            ..PeerSet::new(pk(1))
        }]);
        let [PeerChange::Apply(c)] = &plan_set(req, 1, running.clone()).unwrap()[..] else {
            panic!("one peer applied")
        };
        assert_eq!(c.name, "a");
        assert_eq!(c.endpoint, Some("198.51.100.7:4000".parse().unwrap()));
        assert_eq!(c.persistent_keepalive, None);
        assert_eq!(
            c.allowed_ips,
            [
                "10.1.0.0/16".parse().unwrap(),
                "10.2.0.0/16".parse().unwrap()
            ]
        );
        let req = set(vec![PeerSet {
            replace_allowed_ips: true,
            ..PeerSet::new(pk(1))
        }]);
        let [PeerChange::Apply(c)] = &plan_set(req, 1, running).unwrap()[..] else {
            panic!("one peer applied")
        };
        assert!(c.allowed_ips.is_empty());
    }

    #[test]
    fn set_replace_remove_and_update_only() {
        let ep = Some("192.0.2.1:51820");
        let running = vec![live("a", 1, ep), live("b", 2, ep), live("c", 3, ep)];
        let req = SetRequest {
            replace_peers: true,
            peers: vec![
                PeerSet::new(pk(2)),
                PeerSet {
                    remove: true,
                    ..PeerSet::new(pk(9))
                },
                PeerSet {
                    update_only: true,
                    ..PeerSet::new(pk(8))
                },
            ],
            ..SetRequest::default()
        };
        let changes = plan_set(req, 1, running.clone()).unwrap();
        assert_eq!(
            changes,
            [
                PeerChange::Remove(pk(1)),
                PeerChange::Remove(pk(3)),
                PeerChange::Apply(Box::new(running[1].config.clone())),
            ]
        );
    }

    #[test]
    fn set_naming_a_key_twice_sees_the_first_change() {
        let req = set(vec![
            PeerSet {
                endpoint: Some("192.0.2.5:1".parse().unwrap()),
                ..PeerSet::new(pk(5))
            },
            PeerSet {
                allowed_ips: vec!["10.5.0.0/16".parse().unwrap()],
                ..PeerSet::new(pk(5))
            },
            PeerSet {
                remove: true,
                ..PeerSet::new(pk(5))
            },
            PeerSet {
                update_only: true,
                ..PeerSet::new(pk(5))
            },
        ]);
        let changes = plan_set(req, 1, vec![]).unwrap();
        assert_eq!(changes.len(), 3);
        let PeerChange::Apply(second) = &changes[1] else {
            panic!("second change applies")
        };
        assert_eq!(second.endpoint, Some("192.0.2.5:1".parse().unwrap()));
        assert_eq!(second.allowed_ips.len(), 1);
        assert_eq!(changes[2], PeerChange::Remove(pk(5)));
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
