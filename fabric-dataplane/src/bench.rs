//! Per-packet cost of the programs, measured in the kernel with BPF_PROG_TEST_RUN.
//!
//! The programs run on loopback's ifindex (what test_run gives the skb) configured as a peer
//! device, in a private, unpinned copy of the maps. Each case is timed by the kernel over
//! `repeat` runs; the pass-through case (ARP, which leaves at the first check) is the baseline
//! that the other rows are compared against, measured in the same run.
use aya::programs::{TestRun, TestRunOptions};
use fabric_common::csum;
use serde::Serialize;

use crate::{Dataplane, DataplaneConfig, Error, state};

const BENCH_CONFIG: &str = r#"
local_cidrs = ["10.244.0.0/16"]
[[peers]]
name = "bench-peer"
id = 1
interface = "lo"
mss = 1360
# test_run reuses one skb for every repeat, so each rewrite must set up the next: two remaps
# that swap 10.71/16 and 10.72/16 make every run a full rewrite in both directions.
remaps = [
  { local = "10.71.0.0/16", remote = "10.72.0.0/16" },
  { local = "10.72.0.0/16", remote = "10.71.0.0/16" },
]
"#;

#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub case: &'static str,
    pub egress: bool,
    pub ns_per_packet: f64,
}

fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, proto, 0, 0];
    h[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    let c = csum::checksum(&h);
    h[10..12].copy_from_slice(&c.to_ne_bytes());
    h.extend_from_slice(l4);
    h
}

fn pseudo_sum(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(12 + l4.len());
    buf.extend_from_slice(&src);
    buf.extend_from_slice(&dst);
    buf.extend_from_slice(&[0, proto]);
    buf.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    buf.extend_from_slice(l4);
    csum::checksum(&buf)
}

fn tcp(src: [u8; 4], dst: [u8; 4], syn: bool) -> Vec<u8> {
    let mut t = vec![0x9c, 0x40, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0];
    if syn {
        t.extend_from_slice(&[0x60, 0x02, 0xfa, 0xf0, 0, 0, 0, 0, 2, 4, 0x05, 0xb4]);
    } else {
        t.extend_from_slice(&[0x50, 0x10, 0xfa, 0xf0, 0, 0, 0, 0]);
        t.extend_from_slice(&[0xab; 64]);
    }
    let c = pseudo_sum(src, dst, 6, &t);
    t[16..18].copy_from_slice(&c.to_ne_bytes());
    t
}

fn eth(ethertype: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

/// The empty program: what the harness itself costs per run.
pub const NOOP_CASE: &str = "empty program (baseline)";

/// The benchmark frames: (case, egress?, frame).
pub fn cases() -> Vec<(&'static str, bool, Vec<u8>)> {
    let a = [10, 244, 1, 10];
    let b_view = [10, 71, 2, 7];
    let b_real = [10, 72, 2, 7];
    let unmapped = [10, 50, 0, 1];
    let inner_l4 = tcp(a, b_real, false);
    let inner = ipv4(a, b_real, 6, &inner_l4[..28]);
    let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0x78];
    icmp.extend_from_slice(&inner);
    let c = csum::checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_ne_bytes());
    vec![
        (NOOP_CASE, true, eth(0x0806, &[0u8; 28])),
        ("non-ip pass", true, eth(0x0806, &[0u8; 28])),
        (
            "ipv4 unmapped",
            true,
            eth(0x0800, &ipv4(a, unmapped, 6, &tcp(a, unmapped, false))),
        ),
        (
            "tcp remap egress",
            true,
            eth(0x0800, &ipv4(a, b_view, 6, &tcp(a, b_view, false))),
        ),
        (
            "tcp remap ingress",
            false,
            eth(0x0800, &ipv4(b_real, a, 6, &tcp(b_real, a, false))),
        ),
        (
            "tcp syn remap+mss option",
            true,
            eth(0x0800, &ipv4(a, b_view, 6, &tcp(a, b_view, true))),
        ),
        (
            "icmp frag-needed ingress",
            false,
            eth(0x0800, &ipv4([10, 72, 1, 1], a, 1, &icmp)),
        ),
    ]
}

/// Runs every case `repeat` times in the kernel and reports the mean cost per packet.
pub fn run(repeat: u32) -> Result<Vec<BenchRow>, Error> {
    let cfg = DataplaneConfig::from_toml(BENCH_CONFIG)?;
    let mut dp = Dataplane::load(None)?;
    let links = [("lo".to_string(), crate::sys::link_facts("lo")?)].into();
    dp.maps()
        .reconcile(&state::desired(&cfg, &links, &Default::default()))?;
    let mut rows = Vec::new();
    dp.noop_program()?;
    for (case, egress, frame) in cases() {
        let mut out = vec![0u8; frame.len() + 64];
        let prog = if case == NOOP_CASE {
            dp.noop_program()?
        } else {
            dp.program(egress)
        };
        let r = prog
            .test_run(TestRunOptions {
                data_in: Some(&frame),
                data_out: Some(&mut out),
                repeat,
                ..Default::default()
            })
            .map_err(|e| Error::Program {
                what: format!("BPF_PROG_TEST_RUN of {case}"),
                source: e,
            })?;
        if r.return_value != 0 {
            return Err(Error::Config(format!(
                "bench case {case} returned {} instead of TC_ACT_OK",
                r.return_value
            )));
        }
        rows.push(BenchRow {
            case,
            egress,
            // The kernel reports the mean over the repeats.
            ns_per_packet: r.duration.as_nanos() as f64,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_valid_checksums() {
        for (case, _, f) in cases() {
            if f[12..14] != [0x08, 0x00] {
                continue;
            }
            let ihl = ((f[14] & 0xf) * 4) as usize;
            assert_eq!(csum::checksum(&f[14..14 + ihl]), 0, "{case}: ip");
            let l4 = &f[14 + ihl..];
            let (src, dst) = (&f[26..30], &f[30..34]);
            if f[23] == 6 {
                let mut p = src.to_vec();
                p.extend_from_slice(dst);
                p.extend_from_slice(&[0, 6]);
                p.extend_from_slice(&(l4.len() as u16).to_be_bytes());
                p.extend_from_slice(l4);
                assert_eq!(csum::checksum(&p), 0, "{case}: tcp");
            } else {
                assert_eq!(csum::checksum(l4), 0, "{case}: icmp");
            }
        }
    }
}
