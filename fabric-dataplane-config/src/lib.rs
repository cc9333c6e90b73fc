//! The desired data-plane configuration: what an operator (or later the controllers) asks for.
//! Parsing and validation are pure; nothing here touches the kernel.
//!
//! A crate of its own, not a part of `fabric-dataplane`, so that the gateway's contract
//! (`fabric-gateway-api`) and everything kube-side built on it carry these plain types without
//! linking aya or building the eBPF programs (nightly, build-std, bpf-linker). Not a feature of
//! `fabric-common` either: that crate is the `no_std` layout shared with the programs, built for
//! the bpf target; this one is user-space policy (serde, TOML, validation) and only reads the
//! programs' limits from it.
use std::{collections::BTreeMap, net::Ipv4Addr, path::Path};

use ipnetwork::Ipv4Network;
use serde::{Deserialize, Serialize};

/// A configuration that cannot be read or would not be accepted, saying what is wrong and,
/// where it can, what would fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct Error(pub String);

/// Data-plane configuration of one gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataplaneConfig {
    /// What peers may reach in this cluster besides the exposed local IPs (`externals`) and
    /// their own tunnel addresses: the local pod CIDRs. The host's own addresses inside them
    /// (the gateway's pod IP, broadcast addresses) stay out of reach. Empty: nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_cidrs: Vec<Ipv4Network>,
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    #[serde(default)]
    pub externals: Vec<ExternalMapping>,
}

/// One peered cluster, reached through its own device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub name: String,
    /// Stable small id (1..MAX_PEERS): keys the remap tries and the counters.
    pub id: u32,
    /// The device towards the peer (its tunnel); the programs are attached to it.
    pub interface: String,
    /// Clamp the MSS of TCP SYNs crossing the device to this value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mss: Option<u16>,
    /// This side's addresses on the peer's device (the in-tunnel probes'): the peer may reach
    /// them, and only them of the host's own addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tunnel_addresses: Vec<Ipv4Addr>,
    #[serde(default)]
    pub remaps: Vec<Remap>,
}

/// How this cluster sees one of the peer's prefixes: `local` (unique here) stands for `remote`
/// (the peer's real prefix). Equal prefixes mean no rewrite, and need no entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Remap {
    pub local: Ipv4Network,
    pub remote: Ipv4Network,
}

/// An address (or prefix) of the local external CIDR that stands for a local IP, so peers can
/// reach a non-pod address of this cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalMapping {
    pub external: Ipv4Network,
    pub internal: Ipv4Network,
}

/// Something a valid configuration says that is probably not what was meant: it runs as
/// written, and whoever runs it says so (`check` and at start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// Peers but no `local_cidrs`: they may reach only the exposed externals and their own
    /// tunnel addresses, so every packet to a local pod is refused.
    NoLocalCidrs { peers: Vec<String> },
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::NoLocalCidrs { peers } => write!(
                f,
                "no local_cidrs, so peers ({}) may reach no local pod: the data plane drops \
                 every packet to one (drop reason dst-refused); set local_cidrs = \
                 [\"<pod CIDR>\", ...] to this cluster's pod CIDRs (a top-level key, before \
                 the first [section])",
                peers.join(", ")
            ),
        }
    }
}

impl DataplaneConfig {
    pub fn from_toml(text: &str) -> Result<Self, Error> {
        let cfg: Self = toml::from_str(text).map_err(|e| Error(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error(format!("reading {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|Error(m)| Error(format!("{}: {m}", path.display())))
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }

    /// Checks everything that can be checked without the kernel. Errors name the offending
    /// peer or mapping and say what would fix it.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error(m));
        let mut ids = BTreeMap::new();
        let mut names = BTreeMap::new();
        let mut ifaces = BTreeMap::new();
        let mut locals: Vec<(Ipv4Network, &str)> = Vec::new();
        for n in &self.local_cidrs {
            check_prefix("local_cidrs", "local", *n)?;
        }
        for p in &self.peers {
            if p.name.is_empty() || p.name.len() > 63 {
                return bad(format!("peer name {:?} must be 1 to 63 bytes", p.name));
            }
            if p.id == 0 || p.id >= fabric_common::MAX_PEERS {
                return bad(format!(
                    "peer {}: id {} out of range 1..{}",
                    p.name,
                    p.id,
                    fabric_common::MAX_PEERS
                ));
            }
            if let Some(other) = ids.insert(p.id, &p.name) {
                return bad(format!("peers {other} and {} share id {}", p.name, p.id));
            }
            if names.insert(&p.name, ()).is_some() {
                return bad(format!("peer name {} appears twice", p.name));
            }
            if p.interface.is_empty() || p.interface.len() > 15 {
                return bad(format!(
                    "peer {}: interface name {:?} must be 1 to 15 bytes",
                    p.name, p.interface
                ));
            }
            if let Some(other) = ifaces.insert(&p.interface, &p.name) {
                return bad(format!(
                    "peers {other} and {} both use interface {}: each peer needs its own device",
                    p.name, p.interface
                ));
            }
            if let Some(mss) = p.mss
                && !(88..=65495).contains(&mss)
            {
                return bad(format!("peer {}: mss {mss} out of range 88..65495", p.name));
            }
            if let Some(a) = p
                .tunnel_addresses
                .iter()
                .find(|a| a.is_unspecified() || a.is_broadcast() || a.is_multicast())
            {
                return bad(format!(
                    "peer {}: tunnel address {a} is not a unicast address",
                    p.name
                ));
            }
            let mut remotes: Vec<Ipv4Network> = Vec::new();
            for r in &p.remaps {
                for (what, n) in [("local", r.local), ("remote", r.remote)] {
                    check_prefix(&p.name, what, n)?;
                }
                if r.local.prefix() != r.remote.prefix() {
                    return bad(format!(
                        "peer {}: remap {} -> {} changes the prefix length; host bits are kept, so both sides need the same length",
                        p.name, r.local, r.remote
                    ));
                }
                if let Some(o) = remotes.iter().find(|o| o.overlaps(r.remote)) {
                    return bad(format!(
                        "peer {}: remote prefixes {o} and {} overlap",
                        p.name, r.remote
                    ));
                }
                remotes.push(r.remote);
                // Local views must be unique in the cluster, across all peers: the route decision
                // (and the egress lookup) picks the peer by them.
                if let Some((o, owner)) = locals.iter().find(|(o, _)| o.overlaps(r.local)) {
                    return bad(format!(
                        "peer {}: local prefix {} overlaps {o} of peer {owner}",
                        p.name, r.local
                    ));
                }
                locals.push((r.local, &p.name));
            }
        }
        let mut exts: Vec<Ipv4Network> = Vec::new();
        let mut ints: Vec<Ipv4Network> = Vec::new();
        for e in &self.externals {
            check_prefix("externals", "external", e.external)?;
            check_prefix("externals", "internal", e.internal)?;
            if e.external.prefix() != e.internal.prefix() {
                return bad(format!(
                    "external mapping {} -> {} changes the prefix length",
                    e.external, e.internal
                ));
            }
            if let Some(o) = exts.iter().find(|o| o.overlaps(e.external)) {
                return bad(format!("external prefixes {o} and {} overlap", e.external));
            }
            if let Some(o) = ints.iter().find(|o| o.overlaps(e.internal)) {
                return bad(format!("internal prefixes {o} and {} overlap", e.internal));
            }
            exts.push(e.external);
            ints.push(e.internal);
        }
        if self.externals.len() > fabric_common::MAX_EXTERNALS as usize {
            return bad(format!(
                "{} external mappings, at most {}",
                self.externals.len(),
                fabric_common::MAX_EXTERNALS
            ));
        }
        Ok(())
    }

    /// What this configuration runs as written but probably does not mean (usually nothing).
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out = Vec::new();
        if self.local_cidrs.is_empty() && !self.peers.is_empty() {
            out.push(Warning::NoLocalCidrs {
                peers: self.peers.iter().map(|p| p.name.clone()).collect(),
            });
        }
        out
    }
}

fn check_prefix(owner: &str, what: &str, n: Ipv4Network) -> Result<(), Error> {
    if n.prefix() == 0 {
        return Err(Error(format!("{owner}: {what} prefix {n} has length 0")));
    }
    if n.ip() != n.network() {
        return Err(Error(format!(
            "{owner}: {what} prefix {n} has host bits set; did you mean {}/{}?",
            n.network(),
            n.prefix()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        local_cidrs = ["10.244.0.0/16"]
        [[peers]]
        name = "cluster-b"
        id = 1
        interface = "fab-b"
        mss = 1360
        tunnel_addresses = ["169.254.3.1"]
        remaps = [
          { local = "10.71.0.0/16", remote = "10.244.0.0/16" },
          { local = "10.81.0.0/16", remote = "10.70.0.0/16" },
        ]
        [[peers]]
        name = "cluster-c"
        id = 2
        interface = "fab-c"
        remaps = [ { local = "10.72.0.0/16", remote = "10.244.0.0/16" } ]
        [[externals]]
        external = "10.70.0.5/32"
        internal = "192.168.1.5/32"
    "#;

    #[test]
    fn parses_and_round_trips() {
        let c = DataplaneConfig::from_toml(GOOD).unwrap();
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.local_cidrs, ["10.244.0.0/16".parse().unwrap()]);
        assert_eq!(c.peers[0].tunnel_addresses, [Ipv4Addr::new(169, 254, 3, 1)]);
        assert_eq!(c.peers[0].remaps[1].remote.to_string(), "10.70.0.0/16");
        assert_eq!(DataplaneConfig::from_toml(&c.to_toml()).unwrap(), c);
    }

    fn err(text: &str) -> String {
        DataplaneConfig::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn peers_without_local_cidrs_are_warned_about() {
        let c = DataplaneConfig::from_toml(GOOD).unwrap();
        assert_eq!(c.warnings(), []);
        let no_local = DataplaneConfig {
            local_cidrs: Vec::new(),
            ..c.clone()
        };
        let w = no_local.warnings();
        assert_eq!(
            w,
            [Warning::NoLocalCidrs {
                peers: vec!["cluster-b".into(), "cluster-c".into()]
            }]
        );
        let text = w[0].to_string();
        for needle in ["(cluster-b, cluster-c)", "dst-refused", "local_cidrs = ["] {
            assert!(text.contains(needle), "{needle:?} in {text}");
        }
        // Nothing to reach and nobody to reach it: nothing is lost.
        assert_eq!(DataplaneConfig::default().warnings(), []);
    }

    #[test]
    fn rejects_bad_input_with_reasons() {
        let e = err(&GOOD.replace("10.71.0.0/16", "10.71.0.0/20"));
        assert!(e.contains("same length"), "{e}");
        let e = err(&GOOD.replace("10.72.0.0/16", "10.71.0.0/16"));
        assert!(e.contains("overlaps 10.71.0.0/16 of peer cluster-b"), "{e}");
        let e = err(&GOOD.replace("10.71.0.0/16", "10.71.3.0/16"));
        assert!(e.contains("did you mean 10.71.0.0/16"), "{e}");
        let e = err(&GOOD.replace("id = 2", "id = 1"));
        assert!(e.contains("share id 1"), "{e}");
        let e = err(&GOOD.replace("id = 2", "id = 4096"));
        assert!(e.contains("out of range"), "{e}");
        let e = err(&GOOD.replace("fab-c", "fab-b"));
        assert!(e.contains("own device"), "{e}");
        let e = err(&GOOD.replace("mss = 1360", "mss = 20"));
        assert!(e.contains("mss 20"), "{e}");
        let e = err(&GOOD.replace("10.244.0.0/16\" },\n", "10.70.0.0/16\" },\n"));
        assert!(e.contains("overlap"), "{e}");
        let e = err(&GOOD.replace("10.71.0.0/16", "fe80::/64"));
        assert!(e.contains("local"), "{e}");
        let e = err(&GOOD.replace("10.244.0.0/16\"]", "10.244.1.0/16\"]"));
        assert!(e.contains("local_cidrs") && e.contains("host bits"), "{e}");
        let e = err(&GOOD.replace("169.254.3.1", "224.0.0.1"));
        assert!(e.contains("not a unicast"), "{e}");
        let e = err(&GOOD.replace("mss = 1360", "msss = 1360"));
        assert!(e.contains("unknown field"), "{e}");
        let e = err(&format!(
            "{GOOD}\n[[externals]]\nexternal = \"10.70.0.4/30\"\ninternal = \"192.168.2.4/30\"\n"
        ));
        assert!(e.contains("external prefixes"), "{e}");
    }
}
