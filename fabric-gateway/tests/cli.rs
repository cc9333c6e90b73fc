//! Command-line behaviour that needs no privileges: clear errors, never panics.

mod common;

use std::{net::UdpSocket, process::Command};

use common::*;

fn fails_with(args: &[&str], needles: &[&str]) {
    // People get messages; backtraces are for bugs, even with RUST_BACKTRACE set.
    let out = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(
        !err.contains("acktrace"),
        "{args:?} printed a backtrace: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "{args:?}: expected {n:?} in:\n{err}");
    }
}

fn good_config(lab: &Lab, key: &std::path::Path, port: u16) -> String {
    let _ = std::fs::remove_file(lab.dir.join("peer.key"));
    let peer = run(&[
        BIN,
        "genkey",
        "--out",
        lab.dir.join("peer.key").to_str().unwrap(),
    ]);
    Config::builder(key)
        .name(&lab.tag)
        .listen_address(std::net::Ipv4Addr::LOCALHOST)
        .listen_port(port)
        .peer(
            PeerConfig::builder("b", peer.trim().parse().unwrap())
                .allowed_ips(net(&["10.20.0.0/24"]))
                .build(),
        )
        .build()
        .unwrap()
        .to_toml()
        .unwrap()
}

#[test]
fn genkey_pubkey_and_check() {
    let lab = Lab::new("c");
    let (key, public) = lab.write_key("k");
    let mode = std::fs::metadata(&key).unwrap().permissions();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.mode() & 0o777, 0o600);
    assert_eq!(
        run(&[BIN, "pubkey", "--key-file", key.to_str().unwrap()]).trim(),
        public
    );
    if sh(&["which", "wg"]).status.success() {
        let via_wg = sh(&["sh", "-c", &format!("wg pubkey < {}", key.display())]);
        assert_eq!(
            String::from_utf8_lossy(&via_wg.stdout).trim(),
            public,
            "disagrees with wg pubkey"
        );
    }
    fails_with(
        &["genkey", "--out", key.to_str().unwrap()],
        &["must not exist"],
    );

    let cfg = lab.write("ok.toml", &good_config(&lab, &key, 51999));
    assert!(run(&[BIN, "check", "--config", cfg.to_str().unwrap()]).contains("ok: 1 peer"));

    chmod(&key, 0o644);
    fails_with(
        &["check", "--config", cfg.to_str().unwrap()],
        &["0644", "chmod 600"],
    );
    chmod(&key, 0o600);

    let text = good_config(&lab, &key, 51999);
    let bad_key = lab.write(
        "badkey.toml",
        &text.replace("public_key = \"", "public_key = \"x"),
    );
    fails_with(
        &["check", "--config", bad_key.to_str().unwrap()],
        &["public_key", "base64"],
    );
    let bad_cidr = lab.write(
        "badcidr.toml",
        &text.replace("10.20.0.0/24", "10.20.0.0/99"),
    );
    fails_with(
        &["check", "--config", bad_cidr.to_str().unwrap()],
        &["badcidr.toml"],
    );
    fails_with(
        &["check", "--config", "/nonexistent/x.toml"],
        &["/nonexistent/x.toml"],
    );
}

#[test]
fn check_warns_about_data_plane_peers_without_local_cidrs() {
    let lab = Lab::new("w");
    let (key, _) = lab.write_key("k");
    let (_, peer) = lab.write_key("peer");
    let config = |local: Option<&str>| {
        let mut c = Config::builder(&key).peer(
            PeerConfig::builder("b", peer.parse().unwrap())
                .allowed_ips(net(&["10.244.0.0/16"]))
                .id(1)
                .remap(
                    "10.71.0.0/16".parse().unwrap(),
                    "10.244.0.0/16".parse().unwrap(),
                )
                .build(),
        );
        if let Some(l) = local {
            c = c.local_cidr(l.parse().unwrap());
        }
        c.build().unwrap().to_toml().unwrap()
    };
    let check = |file: &std::path::Path| {
        let out = sh(&[BIN, "check", "--config", file.to_str().unwrap()]);
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("ok: 1 peer"));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Valid, so it runs; but every packet to a local pod would be refused: say so, and how.
    let without = lab.write("without.toml", &config(None));
    let err = check(&without);
    for needle in [
        "warning: ",
        "without.toml",
        "no local_cidrs",
        "peers (b)",
        "dst-refused",
        "local_cidrs = [",
    ] {
        assert!(err.contains(needle), "expected {needle:?} in:\n{err}");
    }
    let with = lab.write("with.toml", &config(Some("10.99.0.0/16")));
    let err = check(&with);
    assert!(!err.contains("warning"), "{err}");
    // Without data-plane peers there is nothing to refuse.
    let plain = lab.write("plain.toml", &good_config(&lab, &key, 51999));
    let err = check(&plain);
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn port_in_use_is_a_clear_error() {
    let lab = Lab::new("p");
    let (key, _) = lab.write_key("k");
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = lab.write("a.toml", &good_config(&lab, &key, port));
    let d = lab.dir.to_str().unwrap();
    fails_with(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--uapi-dir",
            d,
            "--control-dir",
            d,
        ],
        &["cannot listen on UDP", "another gateway"],
    );
    // Failing start leaves no sockets behind.
    assert!(!lab.dir.join(format!("{}.sock", lab.tag)).exists());
    assert!(!lab.dir.join(format!("{}.ctl", lab.tag)).exists());
}
