//! Checks of the test bed itself, without the eBPF data plane: plain routing between distinct
//! CIDRs, and the nftables NAT the benchmark compares against. When these pass and the
//! datapath tests fail, the data plane is at fault, not the harness.
use anyhow::Result;
use fabric_tests::{Addressing, TwoClusters, addr, skip_unless_root, traffic};

#[test]
fn plain_routing_between_distinct_cidrs() -> Result<()> {
    if skip_unless_root("plain_routing_between_distinct_cidrs") {
        return Ok(());
    }
    let t = TwoClusters::new(Addressing::Distinct)?;
    let p = traffic::ping(&t.bed, &t.a_pod, addr::B_POD_DISTINCT, 2, "0.1", &[])?;
    assert!(p.all_replied(), "{}", p.output);
    let pr = traffic::tcp_probe(&t.a_pod, &t.b_pod, addr::B_POD_DISTINCT, 7100)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::A_POD, "{pr:?}");
    let pr = traffic::udp_probe(&t.b_pod, &t.a_pod, addr::A_POD, 7101)?;
    assert_eq!(
        pr.server_saw.ip().to_string(),
        addr::B_POD_DISTINCT,
        "{pr:?}"
    );
    let (n, _) = traffic::conn_rate(
        &t.a_pod,
        &t.b_pod,
        addr::B_POD_DISTINCT,
        7102,
        std::time::Duration::from_millis(300),
        200,
    )?;
    assert!(n > 0);
    Ok(())
}

#[test]
fn nftables_prefix_nat_baseline() -> Result<()> {
    if skip_unless_root("nftables_prefix_nat_baseline") {
        return Ok(());
    }
    let t = TwoClusters::new(Addressing::Overlapping)?;
    t.install_nft_nat()?;
    let p = traffic::ping(&t.bed, &t.a_pod, addr::B_POD_FROM_A, 2, "0.1", &[])?;
    assert!(p.all_replied(), "{}", p.output);
    let pr = traffic::tcp_probe(&t.a_pod, &t.b_pod, addr::B_POD_FROM_A, 7110)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::A_POD_FROM_B, "{pr:?}");
    let pr = traffic::tcp_probe(&t.b_pod, &t.a_pod, addr::A_POD_FROM_B, 7111)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::B_POD_FROM_A, "{pr:?}");
    let pr = traffic::udp_probe(&t.a_pod, &t.b_pod, addr::B_POD_FROM_A, 7112)?;
    assert_eq!(pr.server_saw.ip().to_string(), addr::A_POD_FROM_B, "{pr:?}");
    Ok(())
}
