//! `uapi::parse_request`: what `wg set` / `wg show` (or anyone who can reach the UAPI
//! socket) sends the gateway.
//!
//! Input: the request text. Checked: errors carry EINVAL or EPROTO and never echo a private
//! or preshared key; a parsed `set` written back in the protocol parses to the same request.

use std::fmt::Write as _;

use fabric_gateway::uapi::{EINVAL, EPROTO, Request, SetRequest, parse_request};

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
                Ok(Request::Set(s)),
                "written back as {again:?}"
            );
        }
    }
}

/// Values of key lines that appear nowhere else in the request (so an error that shows
/// them can only have taken them from the key line).
fn secrets(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("private_key=")
                .or_else(|| l.strip_prefix("preshared_key="))
        })
        .filter(|v| v.len() >= 8 && text.matches(*v).count() == 1)
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
