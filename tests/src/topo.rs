//! The two-cluster topology of docs/packet-path.md, built from network namespaces.
//!
//! ```text
//!   cluster A                                                        cluster B
//!  ┌──────────┐ eth0      a-pl ┌──────────┐ a-ul    b-ul ┌──────────┐ b-pl      eth0 ┌──────────┐
//!  │  a-pod   ├───────────────┤   a-gw   ├──────────────┤   b-gw   ├───────────────┤  b-pod   │
//!  │10.244.1.10│   10.244.1.1 │ eBPF on  │192.168.100.1 │ eBPF on  │ 10.244.1.1    │10.244.1.10│
//!  └──────────┘               │  a-ul    │     /30   .2 │  b-ul    │               └──────────┘
//!                             └──────────┘              └──────────┘
//!  A sees B's pods as 10.71.0.0/16              B sees A's pods as 10.72.0.0/16
//! ```
//!
//! Both clusters use 10.244.0.0/16 and even the same pod IP. The underlay veth stands in for
//! the WireGuard tunnel (the programs sit on the device towards the peer either way).
//! [`Addressing::Distinct`] builds the same shape with B on 10.245.0.0/16 and plain routing, as
//! the benchmark's baseline.
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::{
    agent::{Agent, PeerConfig, config_toml},
    netns::Testbed,
};

/// Addresses of the topology, as each side sees them.
pub mod addr {
    /// The pod in A (and, in the overlapping topology, the pod in B too).
    pub const A_POD: &str = "10.244.1.10";
    pub const B_POD: &str = "10.244.1.10";
    /// Gateways' pod-side addresses.
    pub const A_GW: &str = "10.244.1.1";
    pub const B_GW: &str = "10.244.1.1";
    /// B's pod as seen from A, and A's pod as seen from B.
    pub const B_POD_FROM_A: &str = "10.71.1.10";
    pub const A_POD_FROM_B: &str = "10.72.1.10";
    /// b-gw's pod-side address as seen from A (source of its ICMP errors).
    pub const B_GW_FROM_A: &str = "10.71.1.1";
    pub const A_GW_FROM_B: &str = "10.72.1.1";
    /// A's view of B's pod CIDR, B's view of A's, and the real one of both.
    pub const B_CIDR_IN_A: &str = "10.71.0.0/16";
    pub const A_CIDR_IN_B: &str = "10.72.0.0/16";
    pub const POD_CIDR: &str = "10.244.0.0/16";
    /// Underlay (tunnel stand-in) addresses.
    pub const A_UL: &str = "192.168.100.1";
    pub const B_UL: &str = "192.168.100.2";
    /// B's pod in the non-overlapping baseline topology.
    pub const B_POD_DISTINCT: &str = "10.245.1.10";
    pub const B_GW_DISTINCT: &str = "10.245.1.1";
    pub const B_CIDR_DISTINCT: &str = "10.245.0.0/16";
}

/// How the clusters are addressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressing {
    /// Both on 10.244.0.0/16; the data plane (or NAT) must remap.
    Overlapping,
    /// B on 10.245.0.0/16: plain routing works, no NAT anywhere.
    Distinct,
}

/// Interface names inside the namespaces (the same in every test bed: each bed has its own
/// namespaces, so they cannot clash).
pub const A_UL_IF: &str = "a-ul";
pub const B_UL_IF: &str = "b-ul";
pub const A_PL_IF: &str = "a-pl";
pub const B_PL_IF: &str = "b-pl";
pub const POD_IF: &str = "eth0";

/// The built topology. Dropping it removes everything (see [`Testbed`]).
pub struct TwoClusters {
    pub a_pod: String,
    pub a_gw: String,
    pub b_pod: String,
    pub b_gw: String,
    pub a_pin: PathBuf,
    pub b_pin: PathBuf,
    pub a_cfg: PathBuf,
    pub b_cfg: PathBuf,
    pub agent: Agent,
    pub addressing: Addressing,
    // Last: dropped after the fields above (which hold no resources anyway).
    pub bed: Testbed,
}

impl TwoClusters {
    /// Builds namespaces, links, addresses and routes. The data plane is not applied yet.
    pub fn new(addressing: Addressing) -> Result<Self> {
        let agent = Agent::locate()?;
        let mut bed = Testbed::new()?;
        {
            let agent = agent.clone();
            bed.on_pin_cleanup(move |ns, pin| agent.reset(ns, pin).map(drop));
        }
        let a_pod = bed.add_netns("a-pod")?;
        let a_gw = bed.add_netns("a-gw")?;
        let b_pod = bed.add_netns("b-pod")?;
        let b_gw = bed.add_netns("b-gw")?;
        let (b_pod_ip, b_gw_ip) = match addressing {
            Addressing::Overlapping => (addr::B_POD, addr::B_GW),
            Addressing::Distinct => (addr::B_POD_DISTINCT, addr::B_GW_DISTINCT),
        };
        bed.veth(&a_pod, POD_IF, &a_gw, A_PL_IF)?;
        bed.veth(&b_pod, POD_IF, &b_gw, B_PL_IF)?;
        bed.veth(&a_gw, A_UL_IF, &b_gw, B_UL_IF)?;
        // Pods.
        bed.ip(
            &a_pod,
            &["addr", "add", &format!("{}/24", addr::A_POD), "dev", POD_IF],
        )?;
        bed.ip(&a_pod, &["route", "add", "default", "via", addr::A_GW])?;
        bed.ip(
            &b_pod,
            &["addr", "add", &format!("{b_pod_ip}/24"), "dev", POD_IF],
        )?;
        bed.ip(&b_pod, &["route", "add", "default", "via", b_gw_ip])?;
        // Gateways.
        bed.ip(
            &a_gw,
            &["addr", "add", &format!("{}/24", addr::A_GW), "dev", A_PL_IF],
        )?;
        bed.ip(
            &a_gw,
            &["addr", "add", &format!("{}/30", addr::A_UL), "dev", A_UL_IF],
        )?;
        bed.ip(
            &b_gw,
            &["addr", "add", &format!("{b_gw_ip}/24"), "dev", B_PL_IF],
        )?;
        bed.ip(
            &b_gw,
            &["addr", "add", &format!("{}/30", addr::B_UL), "dev", B_UL_IF],
        )?;
        // Routes to the peer: on the remapped (unique) prefix in the overlapping case. `src`
        // makes each gateway's own packets towards the peer (ICMP errors above all) come from
        // a pod-CIDR address, which the peer then remaps like any pod address.
        let (b_in_a, a_in_b) = match addressing {
            Addressing::Overlapping => (addr::B_CIDR_IN_A, addr::A_CIDR_IN_B),
            Addressing::Distinct => (addr::B_CIDR_DISTINCT, addr::POD_CIDR),
        };
        bed.ip(
            &a_gw,
            &[
                "route",
                "add",
                b_in_a,
                "via",
                addr::B_UL,
                "dev",
                A_UL_IF,
                "src",
                addr::A_GW,
            ],
        )?;
        bed.ip(
            &b_gw,
            &[
                "route",
                "add",
                a_in_b,
                "via",
                addr::A_UL,
                "dev",
                B_UL_IF,
                "src",
                b_gw_ip,
            ],
        )?;
        for gw in [&a_gw, &b_gw] {
            bed.sysctl(gw, "net.ipv4.ip_forward", "1")?;
        }
        let b_pods = match addressing {
            Addressing::Overlapping => addr::POD_CIDR,
            Addressing::Distinct => addr::B_CIDR_DISTINCT,
        };
        let a_pin = bed.pin_dir(&a_gw, "a");
        let b_pin = bed.pin_dir(&b_gw, "b");
        let a_cfg = bed.write_file(
            "a-gw.toml",
            &config_toml(
                &[addr::POD_CIDR],
                &[PeerConfig {
                    name: "cluster-b".into(),
                    id: 1,
                    interface: A_UL_IF.into(),
                    mss: None,
                    remaps: vec![(addr::B_CIDR_IN_A.into(), addr::POD_CIDR.into())],
                }],
                &[],
            ),
        )?;
        let b_cfg = bed.write_file(
            "b-gw.toml",
            &config_toml(
                &[b_pods],
                &[PeerConfig {
                    name: "cluster-a".into(),
                    id: 1,
                    interface: B_UL_IF.into(),
                    mss: None,
                    remaps: vec![(addr::A_CIDR_IN_B.into(), addr::POD_CIDR.into())],
                }],
                &[],
            ),
        )?;
        Ok(Self {
            a_pod,
            a_gw,
            b_pod,
            b_gw,
            a_pin,
            b_pin,
            a_cfg,
            b_cfg,
            agent,
            addressing,
            bed,
        })
    }

    /// Applies the data plane on both gateways.
    pub fn apply(&self) -> Result<()> {
        self.agent
            .apply(&self.a_gw, &self.a_pin, &self.a_cfg)
            .context("applying the data plane on a-gw")?;
        self.agent
            .apply(&self.b_gw, &self.b_pin, &self.b_cfg)
            .context("applying the data plane on b-gw")?;
        Ok(())
    }

    /// `datapath show` (table) of a-gw and b-gw.
    pub fn show(&self) -> Result<(String, String)> {
        Ok((
            self.agent.show(&self.a_gw, &self.a_pin)?,
            self.agent.show(&self.b_gw, &self.b_pin)?,
        ))
    }

    /// Where a-pod sends to reach b-pod.
    pub fn b_pod_from_a(&self) -> &'static str {
        match self.addressing {
            Addressing::Overlapping => addr::B_POD_FROM_A,
            Addressing::Distinct => addr::B_POD_DISTINCT,
        }
    }

    /// Where b-pod sends to reach a-pod.
    pub fn a_pod_from_b(&self) -> &'static str {
        match self.addressing {
            Addressing::Overlapping => addr::A_POD_FROM_B,
            Addressing::Distinct => addr::A_POD,
        }
    }

    /// Installs nftables prefix NAT on both gateways instead of the eBPF data plane, with the
    /// rewrites in the same places (each gateway turns the destination from its view into the
    /// peer's real prefix on the way out, and the peer's real source into its view on the way
    /// in), as conntrack-based NAT does it (Liqo's approach):
    /// - the destination NAT happens in prerouting, i.e. before the route lookup, so the lookup
    ///   would see a local pod address; a mark set on the pre-NAT address steers the packet into
    ///   a routing table that only knows the tunnel (the same mark sends de-NATed replies back);
    /// - the source NAT of packets from the peer happens in postrouting.
    pub fn install_nft_nat(&self) -> Result<()> {
        for (gw, ul_if, peer_ul, view) in [
            (&self.a_gw, A_UL_IF, addr::B_UL, addr::B_CIDR_IN_A),
            (&self.b_gw, B_UL_IF, addr::A_UL, addr::A_CIDR_IN_B),
        ] {
            let mark = format!("{:#x}", crate::other_gateways::STEER_MARK);
            let rules = crate::other_gateways::nft_ruleset(
                "fabric_nat",
                ul_if,
                view,
                addr::POD_CIDR,
                false,
            )?;
            let f = self.bed.write_file(&format!("{gw}.nft"), &rules)?;
            self.bed
                .exec(gw, &["nft", "-f", &f.to_string_lossy()])
                .context("loading nftables NAT rules")?;
            self.bed
                .ip(gw, &["rule", "add", "fwmark", &mark, "lookup", "171"])?;
            self.bed.ip(
                gw,
                &[
                    "route", "add", "default", "via", peer_ul, "dev", ul_if, "table", "171",
                ],
            )?;
            // The peer's real source is also a local pod address: loose or no reverse-path check.
            for dev in ["all", "default", ul_if] {
                self.bed
                    .sysctl(gw, &format!("net.ipv4.conf.{dev}.rp_filter"), "0")?;
            }
        }
        Ok(())
    }
}
