//! `uapi::parse_request`: what `wg set` / `wg show` (or anyone who can reach the UAPI
//! socket) sends the gateway.
//!
//! Input: the request text. Checked: errors carry EINVAL or EPROTO and never echo a private
//! or preshared key; a parsed `set` written back in the protocol parses to the same request;
//! what `plan_set` makes of it against a running peer removes only running peers, creates
//! none with `update_only`, leaves each key named as its last mention says, normalised
//! allowed IPs, and is refused only for what the gateway does not change at runtime.

use std::{collections::BTreeSet, fmt::Write as _};

use fabric_gateway::{
    config::Config,
    key::PublicKey,
    uapi::{
        EINVAL, EOPNOTSUPP, EPROTO, LivePeer, PeerChange, Request, SetRequest, parse_request,
        plan_set,
    },
};

/// The gateway's listen port in `plan_set`.
const LISTEN_PORT: u16 = 51821;

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        // The socket reads lines into a String: anything else never gets this far.
        return;
    };
    match parse_request(text) {
        Err(e) => {
            assert!(e.errno == EINVAL || e.errno == EPROTO, "errno {}", e.errno);
            for secret in secrets(text) {
                assert!(
                    !e.message.contains(secret),
                    "a key leaked into {:?}",
                    e.message
                );
            }
        }
        Ok(Request::Get) => {}
        Ok(Request::Set(s)) => {
            let again = write_set(&s);
            assert_eq!(
                parse_request(&again),
                Ok(Request::Set(s.clone())),
                "written back as {again:?}"
            );
            check_plan(s);
        }
    }
}

/// Keys (64 hex digits, as `wg` sends them) on key lines that appear nowhere else in the
/// request: an error can only show one by echoing its line. (Any other value could also be
/// put together by the error's own text and a quoted fragment of another line.)
fn secrets(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("private_key=")
                .or_else(|| l.strip_prefix("preshared_key="))
        })
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .filter(|v| text.matches(*v).count() == 1)
        .collect()
}

/// `s` in the UAPI's `set` format, as `wg` would send it.
fn write_set(s: &SetRequest) -> String {
    let mut t = String::from("set=1\n");
    if s.private_key_given {
        t.push_str(&format!("private_key={}\n", "0".repeat(64)));
    }
    if let Some(p) = s.listen_port {
        let _ = writeln!(t, "listen_port={p}");
    }
    if let Some(m) = s.fwmark {
        let _ = writeln!(t, "fwmark={m}");
    }
    if s.replace_peers {
        t.push_str("replace_peers=true\n");
    }
    for p in &s.peers {
        let _ = writeln!(t, "public_key={}", p.public_key.to_hex());
        if p.remove {
            t.push_str("remove=true\n");
        }
        if p.update_only {
            t.push_str("update_only=true\n");
        }
        if p.preshared_key_given {
            let _ = writeln!(t, "preshared_key={}", "01".repeat(32));
        }
        if let Some(e) = p.endpoint {
            let _ = writeln!(t, "endpoint={e}");
        }
        if let Some(k) = p.persistent_keepalive {
            let _ = writeln!(t, "persistent_keepalive_interval={k}");
        }
        if p.replace_allowed_ips {
            t.push_str("replace_allowed_ips=true\n");
        }
        for a in &p.allowed_ips {
            let _ = writeln!(t, "allowed_ip={a}");
        }
        t.push_str("protocol_version=1\n");
    }
    t
}

/// The peer running when the `set` arrives: the one the `set-peer` seed names.
fn running() -> Vec<LivePeer> {
    let cfg = Config::parse(
        r#"
[interface]
private_key_file = "key"
listen_port = 51821

[[peers]]
name = "cluster-b"
public_key = "0D1skRwzN8OXfltskJO3+OskyA3M897xY6GcI1O4hnY="
endpoint = "192.0.2.1:51820"
allowed_ips = ["10.244.0.0/16", "169.254.100.0/30"]
"#,
    )
    .expect("the running peer's configuration");
    cfg.peers
        .into_iter()
        .map(|p| LivePeer {
            endpoint: p.endpoint,
            config: p,
        })
        .collect()
}

fn check_plan(s: SetRequest) {
    let running = running();
    let refused = s.private_key_given
        || s.listen_port.is_some_and(|p| p != LISTEN_PORT)
        || s.fwmark.is_some_and(|m| m != 0)
        || s.peers.iter().any(|p| p.preshared_key_given);
    let changes = match plan_set(s.clone(), LISTEN_PORT, running.clone()) {
        Err(e) => {
            assert!(refused && e.errno == EOPNOTSUPP, "refused with {e:?}");
            return;
        }
        Ok(c) => c,
    };
    assert!(
        !refused,
        "accepted what the gateway cannot change at runtime"
    );
    let mut live: BTreeSet<PublicKey> = running.iter().map(|p| p.config.public_key).collect();
    let named: BTreeSet<PublicKey> = s.peers.iter().map(|p| p.public_key).collect();
    for c in &changes {
        match c {
            PeerChange::Remove(k) => assert!(live.remove(k), "removes a peer not running"),
            PeerChange::Apply(cfg) => {
                let k = cfg.public_key;
                assert!(
                    live.contains(&k)
                        || s.peers.iter().any(|p| p.public_key == k && !p.update_only),
                    "creates a peer no entry asked to create"
                );
                live.insert(k);
                let nets: BTreeSet<_> = cfg.allowed_ips.iter().collect();
                assert_eq!(nets.len(), cfg.allowed_ips.len(), "duplicate allowed IPs");
                assert!(
                    cfg.allowed_ips.iter().all(|n| n.ip() == n.network()),
                    "host bits"
                );
            }
        }
    }
    if s.replace_peers {
        for p in &running {
            let k = p.config.public_key;
            assert!(
                named.contains(&k) || !live.contains(&k),
                "replace_peers kept an unnamed peer"
            );
        }
    }
    for k in &named {
        let last = s.peers.iter().rev().find(|p| p.public_key == *k).unwrap();
        if last.remove {
            assert!(!live.contains(k), "a removed peer still runs");
        } else if !last.update_only {
            assert!(
                live.contains(k),
                "a peer set without update_only does not run"
            );
        }
    }
}
