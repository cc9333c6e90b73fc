//! The other gateways of `cargo xtask bench fabric` (issue 22 §1 (b), (c)): wireguard-go or
//! boringtun-cli in the fixture's gateway namespaces, in place of fabric-gateway, set up as a
//! user of a kernel-style stack would: the implementation's TUN device configured with `wg`,
//! and the same-pod-CIDR double NAT by nftables (prefix dnat/snat between the real pod CIDR
//! and the remapped one, conntrack remembering each flow), with a policy route steering the
//! remapped destinations into the tunnel (docs/packet-path.md "Traps": the route decision is
//! made on the remapped address, which the mark carries past the DNAT).
//!
//! Per gateway namespace, in the direction A's pod to B's pod (and mirrored):
//! - prerouting, mangle: `ip daddr VIEW` marks the packet; the mark selects a table whose
//!   default route is the tunnel device (the DNAT below would otherwise send the real
//!   address, a local pod's too, to the local pod);
//! - prerouting, dstnat: `ip daddr VIEW` becomes the peer's real pod address (prefix map,
//!   host bits kept);
//! - postrouting, srcnat: what comes out of the tunnel from the peer's real pod CIDR gets
//!   the remapped source (so the local pod answers to an address routed back to the gateway);
//! - forward: TCP SYNs' MSS clamped to the route's MTU (as wg-quick users add).
//!
//! Replies are conntrack's: the reverse translations of each flow's first packet.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::netns::Testbed;

/// Which implementation runs in the gateway namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    WireguardGo,
    Boringtun,
}

impl Kind {
    /// Its column's label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::WireguardGo => "wireguard-go",
            Kind::Boringtun => "boringtun-cli",
        }
    }

    /// Short tag for interface names.
    fn tag(self) -> &'static str {
        match self {
            Kind::WireguardGo => "go",
            Kind::Boringtun => "bt",
        }
    }

    /// The command line that runs it in the foreground on TUN device `ifname`, and its
    /// environment. Both create `/var/run/wireguard/IFNAME.sock`, the UAPI socket `wg` talks to.
    pub fn command(self, bin: &Path, ifname: &str) -> (Vec<String>, Vec<(String, String)>) {
        let bin = bin.display().to_string();
        match self {
            Kind::WireguardGo => (
                vec![bin, "-f".into(), ifname.into()],
                vec![
                    ("LOG_LEVEL".into(), "error".into()),
                    // Its "use the kernel module" banner is for daemonised runs only.
                    ("WG_PROCESS_FOREGROUND".into(), "1".into()),
                ],
            ),
            Kind::Boringtun => (
                vec![
                    bin,
                    "--foreground".into(),
                    // It runs as root in the namespace like wireguard-go does: equal footing.
                    "--disable-drop-privileges".into(),
                    "-v".into(),
                    "error".into(),
                    ifname.into(),
                ],
                vec![("WG_SUDO".into(), "true".into())],
            ),
        }
    }
}

/// An implementation and the binary to run.
#[derive(Debug, Clone)]
pub struct Implementation {
    pub kind: Kind,
    pub bin: PathBuf,
}

/// The UAPI socket of TUN device `ifname` (a path shared by all namespaces: names must be
/// unique on the machine).
pub fn uapi_socket(ifname: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"))
}

/// The tunnel device's name for cluster `side` (`a` or `b`): unique per process and kind,
/// and within IFNAMSIZ (15).
pub fn ifname(kind: Kind, pid: u32, side: char) -> String {
    let name = format!("{}{}{side}", kind.tag(), pid % 10_000_000);
    debug_assert!(name.len() <= 15);
    name
}

/// One end of the tunnel, as `wg setconf` takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct WgEnd {
    pub private_key: String,
    pub listen_port: u16,
    pub peer_public_key: String,
    /// The peer's real pod CIDR: what its packets carry inside the tunnel after the DNAT.
    pub allowed_ips: Vec<String>,
    /// `IP:PORT` to send to; None on a side that only answers.
    pub endpoint: Option<String>,
}

/// The configuration file of `wg setconf` for one end.
pub fn wg_config(e: &WgEnd) -> Result<String> {
    for (field, v) in [
        ("private key", &e.private_key),
        ("peer public key", &e.peer_public_key),
    ] {
        // WireGuard keys are 32 bytes, 44 characters of base64 with one `=` of padding.
        if v.len() != 44 || !v.ends_with('=') || v.contains(char::is_whitespace) {
            bail!("{field}: a WireGuard key is 44 characters of base64 ending in '=', got {v:?}");
        }
    }
    if e.allowed_ips.is_empty() {
        bail!("allowed_ips: the peer needs at least one CIDR it may send from");
    }
    let mut s = format!(
        "[Interface]\nPrivateKey = {}\nListenPort = {}\n\n[Peer]\nPublicKey = {}\nAllowedIPs = {}\n",
        e.private_key,
        e.listen_port,
        e.peer_public_key,
        e.allowed_ips.join(", ")
    );
    if let Some(ep) = &e.endpoint {
        s += &format!("Endpoint = {ep}\n");
    }
    Ok(s)
}

/// The mark and routing table that steer remapped destinations into the tunnel.
pub const STEER_MARK: u32 = 0x71;
pub const STEER_TABLE: u32 = 171;

/// The nftables ruleset of one gateway: `view` is how this cluster sees the peer's pods
/// (the remapped CIDR), `pod` the peer's real pod CIDR (the same length), `tunnel` the
/// device towards the peer.
pub fn nft_ruleset(
    table: &str,
    tunnel: &str,
    view: &str,
    pod: &str,
    clamp_mss: bool,
) -> Result<String> {
    let prefix = |field: &str, c: &str| -> Result<u8> {
        let (ip, len) = c
            .split_once('/')
            .with_context(|| format!("{field}: {c:?} is not a CIDR (ADDRESS/LENGTH)"))?;
        ip.parse::<std::net::Ipv4Addr>()
            .with_context(|| format!("{field}: {ip:?} is not an IPv4 address"))?;
        len.parse::<u8>()
            .ok()
            .filter(|l| *l <= 32)
            .with_context(|| format!("{field}: prefix length {len:?} is not 0 to 32"))
    };
    let (lv, lp) = (prefix("view", view)?, prefix("pod", pod)?);
    if lv != lp {
        bail!("view {view} and pod {pod}: a prefix map keeps host bits, so the lengths must match");
    }
    if tunnel.is_empty() || tunnel.len() > 15 || tunnel.contains(['"', ' ']) {
        bail!("tunnel: {tunnel:?} is not an interface name");
    }
    // Through a TUN device of a smaller MTU than the pods' (the other gateways), TCP's MSS is
    // clamped to the route's MTU on the way; a testbed gateway routes to the underlay itself.
    let clamp = if clamp_mss {
        "    chain clamp {\n        type filter hook forward priority mangle; policy accept;\n        \
         tcp flags syn tcp option maxseg size set rt mtu\n    }\n"
    } else {
        ""
    };
    Ok(format!(
        r#"table ip {table} {{
    chain steer {{
        type filter hook prerouting priority mangle; policy accept;
        ip daddr {view} meta mark set {STEER_MARK:#x}
    }}
    chain to_peer {{
        type nat hook prerouting priority dstnat; policy accept;
        ip daddr {view} dnat ip prefix to ip daddr map {{ {view} : {pod} }}
    }}
    chain from_peer {{
        type nat hook postrouting priority srcnat; policy accept;
        iifname "{tunnel}" ip saddr {pod} snat ip prefix to ip saddr map {{ {pod} : {view} }}
    }}
{clamp}}}
"#
    ))
}

/// One gateway namespace's other gateway.
pub struct End {
    pub ns: String,
    /// Its cluster (`a` or `b`), for names.
    pub side: char,
    pub underlay_ip: String,
}

/// The other implementation running in both gateway namespaces; stops them and undoes
/// their nftables table and policy rule when dropped.
pub struct Running {
    pub kind: Kind,
    /// (process name, child) per gateway namespace, in the order of the ends.
    children: Vec<(String, Child)>,
    /// (namespace, interface) per end, for the undo.
    ends: Vec<(String, String)>,
    table: String,
    dir: PathBuf,
}

impl Running {
    /// The gateway processes (name, pid), for their CPU time.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.children
            .iter()
            .map(|(n, c)| (n.clone(), c.id()))
            .collect()
    }

    /// The last lines of each implementation's log, for failure messages.
    pub fn log_tails(&self) -> String {
        self.children
            .iter()
            .map(|(n, _)| {
                let t =
                    std::fs::read_to_string(self.dir.join(format!("{n}.log"))).unwrap_or_default();
                let lines: Vec<&str> = t.lines().collect();
                format!(
                    "--- {n} ---\n{}\n",
                    lines[lines.len().saturating_sub(12)..].join("\n")
                )
            })
            .collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            // SIGTERM: both close their device and remove their socket on a clean exit.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for (_, c) in &mut self.children {
            crate::process::reap_by(c, deadline);
        }
        for (ns, ifname) in &self.ends {
            let _ = run(ns, &["nft", "delete", "table", "ip", &self.table]);
            let _ = run(
                ns,
                &[
                    "ip",
                    "rule",
                    "del",
                    "fwmark",
                    &format!("{STEER_MARK:#x}"),
                    "lookup",
                    &STEER_TABLE.to_string(),
                ],
            );
            let _ = std::fs::remove_file(uapi_socket(ifname));
        }
    }
}

/// Runs `argv` in namespace `ns`, failing with its output.
fn run(ns: &str, argv: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {argv:?} in {ns}"))?;
    if !out.status.success() {
        bail!(
            "{argv:?} in {ns} failed ({}): {}",
            out.status,
            crate::process::output_text(&out)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A fresh WireGuard key pair from `wg` (private, public).
fn key_pair() -> Result<(String, String)> {
    let private = Command::new("wg")
        .arg("genkey")
        .output()
        .context("running `wg genkey` (wireguard-tools)")?;
    anyhow::ensure!(private.status.success(), "wg genkey failed");
    let private = String::from_utf8(private.stdout)?.trim().to_owned();
    let mut c = Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running `wg pubkey`")?;
    std::io::Write::write_all(
        &mut c.stdin.take().context("wg pubkey's stdin")?,
        private.as_bytes(),
    )?;
    let out = c.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "wg pubkey failed");
    Ok((private, String::from_utf8(out.stdout)?.trim().to_owned()))
}

/// The WireGuard port on the underlay (fabric-gateway's too, which must be stopped first).
pub const PORT: u16 = 51820;
/// The tunnel device's MTU: fabric-gateway's (and `wg-quick`'s default).
pub const MTU: u32 = 1420;

/// Starts `imp` in both gateway namespaces (`a` dials `b`), configures it with `wg` and
/// loads the NAT: `view` is how each side sees the other's pods, `pod` their real CIDR
/// (both clusters use the same one).
pub fn start(
    tb: &Testbed,
    imp: &Implementation,
    a: &End,
    b: &End,
    view: &str,
    pod: &str,
    dir: &Path,
) -> Result<Running> {
    let table = format!("{}_nat", imp.kind.tag());
    let mut me = Running {
        kind: imp.kind,
        children: Vec::new(),
        ends: Vec::new(),
        table: table.clone(),
        dir: dir.to_owned(),
    };
    let (ka, kb) = (key_pair()?, key_pair()?);
    let me_pid = std::process::id();
    for (end, (key, _), (_, peer_pub), endpoint) in [
        (a, &ka, &kb, Some(format!("{}:{PORT}", b.underlay_ip))),
        (b, &kb, &ka, Some(format!("{}:{PORT}", a.underlay_ip))),
    ] {
        let ifname = ifname(imp.kind, me_pid, end.side);
        let name = format!("{}-{}", imp.kind.label(), end.side);
        let sock = uapi_socket(&ifname);
        // A leftover of a killed run of the same pid would make `wg` talk to nobody.
        let _ = std::fs::remove_file(&sock);
        me.ends.push((end.ns.clone(), ifname.clone()));
        let (argv, env) = imp.kind.command(&imp.bin, &ifname);
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &end.ns])
            .args(&argv)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // `ip netns exec` execs: the pid is the implementation's own, for its CPU time.
        let child = fabric_netns::process::spawn(c)
            .with_context(|| format!("starting {}", imp.bin.display()))?;
        me.children.push((name.clone(), child));
        let t0 = Instant::now();
        while !sock.exists() {
            let exited = me
                .children
                .last_mut()
                .and_then(|(_, c)| c.try_wait().ok().flatten());
            if exited.is_some() || t0.elapsed() > Duration::from_secs(10) {
                bail!(
                    "{name} did not create {} ({}):\n{}",
                    sock.display(),
                    exited.map_or("still running".into(), |s| s.to_string()),
                    me.log_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let conf = wg_config(&WgEnd {
            private_key: key.clone(),
            listen_port: PORT,
            peer_public_key: peer_pub.clone(),
            allowed_ips: vec![pod.to_owned()],
            endpoint,
        })?;
        let f = dir.join(format!("{name}.conf"));
        std::fs::write(&f, conf)?;
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        run(
            &end.ns,
            &["wg", "setconf", &ifname, &f.display().to_string()],
        )?;
        run(
            &end.ns,
            &["ip", "link", "set", &ifname, "mtu", &MTU.to_string(), "up"],
        )?;
        run(
            &end.ns,
            &[
                "ip",
                "route",
                "add",
                "default",
                "dev",
                &ifname,
                "table",
                &STEER_TABLE.to_string(),
            ],
        )?;
        run(
            &end.ns,
            &[
                "ip",
                "rule",
                "add",
                "fwmark",
                &format!("{STEER_MARK:#x}"),
                "lookup",
                &STEER_TABLE.to_string(),
            ],
        )?;
        let rules = dir.join(format!("{name}.nft"));
        std::fs::write(&rules, nft_ruleset(&table, &ifname, view, pod, true)?)?;
        run(&end.ns, &["nft", "-f", &rules.display().to_string()])
            .context("loading the nftables NAT")?;
        // The peer's real sources are also local pod addresses: no reverse-path check.
        for dev in ["all", "default", ifname.as_str()] {
            tb.sysctl(&end.ns, &format!("net.ipv4.conf.{dev}.rp_filter"), "0")?;
        }
    }
    Ok(me)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
    const K2: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

    fn end(endpoint: Option<&str>) -> WgEnd {
        WgEnd {
            private_key: K1.into(),
            listen_port: 51820,
            peer_public_key: K2.into(),
            allowed_ips: vec!["10.244.0.0/16".into()],
            endpoint: endpoint.map(Into::into),
        }
    }

    #[test]
    fn wg_config_has_the_interface_and_the_peer() {
        let c = wg_config(&end(Some("192.168.77.2:51820"))).unwrap();
        assert_eq!(
            c,
            format!(
                "[Interface]\nPrivateKey = {K1}\nListenPort = 51820\n\n[Peer]\nPublicKey = {K2}\n\
                 AllowedIPs = 10.244.0.0/16\nEndpoint = 192.168.77.2:51820\n"
            )
        );
        let c = wg_config(&end(None)).unwrap();
        assert!(!c.contains("Endpoint"), "{c}");
    }

    #[test]
    fn wg_config_refuses_bad_keys_and_no_allowed_ips() {
        let mut e = end(None);
        e.peer_public_key = "not-a-key".into();
        let err = wg_config(&e).unwrap_err().to_string();
        assert!(err.starts_with("peer public key:"), "{err}");
        let mut e = end(None);
        e.private_key = format!("{K1}\nListenPort = 1");
        let err = wg_config(&e).unwrap_err().to_string();
        assert!(err.starts_with("private key:"), "{err}");
        let mut e = end(None);
        e.allowed_ips.clear();
        assert!(
            wg_config(&e)
                .unwrap_err()
                .to_string()
                .starts_with("allowed_ips:")
        );
    }

    #[test]
    fn nft_ruleset_marks_maps_and_clamps() {
        let r = nft_ruleset("go_nat", "go123a", "10.64.0.0/16", "10.244.0.0/16", true).unwrap();
        assert!(r.starts_with("table ip go_nat {"), "{r}");
        // Steered before the DNAT (mangle runs before dstnat), on the remapped address.
        let steer = r.find("meta mark set 0x71").unwrap();
        let dnat = r.find("dnat ip prefix to").unwrap();
        assert!(steer < dnat, "{r}");
        assert!(r.contains("priority mangle"), "{r}");
        assert!(
            r.contains("ip daddr 10.64.0.0/16 meta mark set 0x71"),
            "{r}"
        );
        assert!(
            r.contains("ip daddr 10.64.0.0/16 dnat ip prefix to ip daddr map { 10.64.0.0/16 : 10.244.0.0/16 }"),
            "{r}"
        );
        // Only what came out of the tunnel gets the peer's remapped source.
        assert!(
            r.contains("iifname \"go123a\" ip saddr 10.244.0.0/16 snat ip prefix to ip saddr map { 10.244.0.0/16 : 10.64.0.0/16 }"),
            "{r}"
        );
        assert!(r.contains("tcp option maxseg size set rt mtu"), "{r}");
        let r = nft_ruleset("t", "ul0", "10.64.0.0/16", "10.244.0.0/16", false).unwrap();
        assert!(!r.contains("maxseg") && r.trim_end().ends_with('}'), "{r}");
    }

    #[test]
    fn nft_ruleset_refuses_what_a_prefix_map_cannot_do() {
        let e = nft_ruleset("t", "wg0", "10.64.0.0/12", "10.244.0.0/16", true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("lengths must match"), "{e}");
        let e = nft_ruleset("t", "wg0", "10.64.0.0", "10.244.0.0/16", true)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("view:"), "{e}");
        let e = nft_ruleset("t", "wg0", "10.64.0.0/16", "10.244.0.0/33", true)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("pod:"), "{e}");
        let e = nft_ruleset("t", "a\" accept", "10.64.0.0/16", "10.244.0.0/16", true)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("tunnel:"), "{e}");
    }

    #[test]
    fn names_fit_and_differ() {
        let a = ifname(Kind::WireguardGo, 4_194_304, 'a');
        let b = ifname(Kind::Boringtun, 4_194_304, 'a');
        assert!(a.len() <= 15 && a != b, "{a} {b}");
        assert_eq!(
            uapi_socket(&a),
            PathBuf::from(format!("/var/run/wireguard/{a}.sock"))
        );
        let (argv, env) = Kind::WireguardGo.command(Path::new("/x/wireguard-go"), &a);
        assert_eq!(
            argv,
            vec!["/x/wireguard-go".to_owned(), "-f".into(), a.clone()]
        );
        assert!(env.iter().any(|(k, _)| k == "WG_PROCESS_FOREGROUND"));
        let (argv, _) = Kind::Boringtun.command(Path::new("/x/bt"), &b);
        assert!(argv.contains(&"--foreground".to_owned()) && argv.last() == Some(&b));
    }
}
