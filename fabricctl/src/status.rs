//! `fabricctl status`: the local cluster's peers, from its Configurations and Connections.
use anyhow::Result;
use fabric_api::{
    authentication::{
        mode::{TenantRef, Tether},
        v1alpha1::Tenant,
    },
    core::v1alpha1::{ForeignCluster, condition},
    networking::v1alpha1::{Configuration, Connection},
};
use kube::{Api, Client, api::ListParams};
use serde::Serialize;

use crate::cli::Output;

#[derive(Serialize, Debug, PartialEq)]
struct PeerRow {
    peer: String,
    pod_cidr: String,
    pod_seen_as: Option<String>,
    external_cidr: String,
    external_seen_as: Option<String>,
    tunnel: String,
    latency: Option<String>,
    rx_bytes: i64,
    tx_bytes: i64,
    /// The working mode of a consumer–provider peering (its ForeignCluster's Tethered
    /// condition): `Tethered` or `Autonomous`; none for a network-only peering.
    mode: Option<String>,
}

/// The mode of each peer, from its ForeignCluster's Tethered condition.
fn modes(fcs: &[ForeignCluster]) -> Vec<(String, String)> {
    fcs.iter()
        .filter_map(|fc| {
            let c = fc
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == condition::TETHERED)?;
            Some((fc.spec.cluster_id.clone(), c.reason.clone()))
        })
        .collect()
}

pub async fn status(c: &Client, ns: &str, output: Output) -> Result<()> {
    let cfgs = Api::<Configuration>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| not_installed(e, "Configurations"))?;
    let conns = Api::<Connection>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| not_installed(e, "Connections"))?;
    // Best effort: a user who may read the network objects but not these still gets them.
    let fcs = Api::<ForeignCluster>::all(c.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let tenants: Vec<TenantRef> = Api::<Tenant>::all(c.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(TenantRef::of).collect())
        .unwrap_or_default();
    let mut rows = rows(&cfgs.items, &conns.items);
    for (peer, mode) in modes(&fcs) {
        if let Some(r) = rows.iter_mut().find(|r| r.peer == peer) {
            r.mode = Some(mode);
        }
    }
    let mode = match Tether::of(&tenants) {
        Tether::Autonomous => "autonomous".to_owned(),
        Tether::To(p) => format!("tethered to {p}"),
        Tether::Conflict(ps) => format!(
            "autonomous (Tenants {} all say Tethered: set all but one back)",
            ps.join(", ")
        ),
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&rows)?),
        Output::Table => print!("this cluster: {mode}\n{}", table(&rows)),
    }
    Ok(())
}

/// Listing a kind the API server does not know answers a bare "404 page not found": say that
/// the fabric is missing there and how to install it.
fn not_installed(e: kube::Error, what: &str) -> anyhow::Error {
    match &e {
        e if fabric_kube::meta::is_not_found(e) => anyhow::anyhow!(
            "the fabric is not installed in this cluster (its API server does not know \
             networking.fabric.io {what}): install it with `kubectl apply -k deploy/`, \
             or point --kubeconfig at a cluster that has it"
        ),
        _ => anyhow::Error::new(e).context(format!("listing {what}")),
    }
}

fn rows(cfgs: &[Configuration], conns: &[Connection]) -> Vec<PeerRow> {
    cfgs.iter()
        .map(|cfg| {
            let seen = cfg.status.as_ref().and_then(|s| s.remote.clone());
            let conn = conns
                .iter()
                .find(|x| x.spec.cluster_id == cfg.spec.cluster_id)
                .and_then(|x| x.status.clone());
            PeerRow {
                peer: cfg.spec.cluster_id.clone(),
                pod_cidr: cfg.spec.remote.pod.to_string(),
                pod_seen_as: seen.as_ref().map(|s| s.pod.to_string()),
                external_cidr: cfg.spec.remote.external.to_string(),
                external_seen_as: seen.map(|s| s.external.to_string()),
                tunnel: conn
                    .as_ref()
                    .map_or("NoGateway".into(), |s| format!("{:?}", s.value)),
                latency: conn.as_ref().and_then(|s| s.latency.clone()),
                rx_bytes: conn.as_ref().map_or(0, |s| s.rx_bytes),
                tx_bytes: conn.as_ref().map_or(0, |s| s.tx_bytes),
                mode: None,
            }
        })
        .collect()
}

fn table(rows: &[PeerRow]) -> String {
    let mut out = format!(
        "{:<16} {:<18} {:<18} {:<18} {:<18} {:<11} {:>9} {:>12} {:>12} {}\n",
        "PEER",
        "POD CIDR",
        "SEEN AS",
        "EXTERNAL CIDR",
        "SEEN AS",
        "TUNNEL",
        "LATENCY",
        "RX",
        "TX",
        "MODE"
    );
    for r in rows {
        out += &format!(
            "{:<16} {:<18} {:<18} {:<18} {:<18} {:<11} {:>9} {:>12} {:>12} {}\n",
            r.peer,
            r.pod_cidr,
            r.pod_seen_as.as_deref().unwrap_or("-"),
            r.external_cidr,
            r.external_seen_as.as_deref().unwrap_or("-"),
            r.tunnel,
            r.latency.as_deref().unwrap_or("-"),
            r.rx_bytes,
            r.tx_bytes,
            r.mode.as_deref().unwrap_or("-")
        );
    }
    if rows.is_empty() {
        out += "(no peers; connect one with `fabricctl peer --remote-kubeconfig ...`)\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use fabric_api::networking::v1alpha1::{
        ClusterCidrs, ConfigurationSpec, ConfigurationStatus, ConnectionSpec, ConnectionState,
        ConnectionStatus,
    };
    use kube::api::ObjectMeta;

    use super::*;

    fn cidrs(pod: &str, external: &str) -> ClusterCidrs {
        ClusterCidrs {
            pod: pod.parse().unwrap(),
            external: external.parse().unwrap(),
        }
    }

    fn cfg(peer: &str, seen: Option<ClusterCidrs>) -> Configuration {
        Configuration {
            metadata: ObjectMeta::default(),
            spec: ConfigurationSpec {
                cluster_id: peer.into(),
                remote: cidrs("10.244.0.0/16", "10.70.0.0/16"),
            },
            status: Some(ConfigurationStatus {
                remote: seen,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_row_per_peer_with_its_tunnel() {
        let conn = Connection {
            metadata: ObjectMeta::default(),
            spec: ConnectionSpec {
                cluster_id: "b".into(),
            },
            status: Some(ConnectionStatus {
                value: ConnectionState::Connected,
                latency: Some("0.42ms".into()),
                rx_bytes: 10,
                tx_bytes: 20,
                ..Default::default()
            }),
        };
        let rows = rows(
            &[
                cfg("b", Some(cidrs("10.64.0.0/16", "10.65.0.0/16"))),
                cfg("c", None),
            ],
            &[conn],
        );
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].pod_seen_as.as_deref(), Some("10.64.0.0/16"));
        assert_eq!(rows[0].external_seen_as.as_deref(), Some("10.65.0.0/16"));
        assert_eq!(rows[0].tunnel, "Connected");
        assert_eq!((rows[0].rx_bytes, rows[0].tx_bytes), (10, 20));
        assert_eq!(rows[1].tunnel, "NoGateway");
        assert_eq!(rows[1].pod_seen_as, None);
        let t = table(&rows);
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(t.lines().nth(1).unwrap().starts_with("b "), "{t}");
        assert!(t.contains("0.42ms"), "{t}");
        assert!(table(&[]).contains("no peers"));
    }
}
