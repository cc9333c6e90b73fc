//! `fabricctl info` (this cluster and every cluster it knows) and `fabricctl info peer ID`
//! (one peer: authentication, network, resources and virtual node in one view). What is
//! shown is a pure function of the objects read ([`Overview::build`], [`PeerInfo::build`]);
//! the API reads are [`fetch_overview`] and [`fetch_peer`].
use std::collections::BTreeMap;

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    authentication::v1alpha1::{Identity, ResourceSlice, Resources, Tenant},
    core::v1alpha1::{ForeignCluster, condition},
    identity::{ClusterIdentity, GatewayIdentity},
    names,
    networking::v1alpha1::{Configuration, Connection},
    offloading::v1alpha1::VirtualNode,
};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Node},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{Api, Client, api::ListParams};
use serde::Serialize;

use crate::cli::Output;

/// One condition as an operator reads it: up or not, and why.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// "True", "False" or "Unknown" (absent conditions are "Unknown", reason "NotStarted").
    pub status: String,
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl State {
    fn of(conditions: &[Condition], kind: &str) -> State {
        Self::find(
            conditions.iter().map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.reason.as_str(),
                    c.message.as_str(),
                )
            }),
            kind,
        )
    }

    /// The condition `kind` among (type, status, reason, message) tuples: the fabric's own
    /// conditions and a Node's have different types but read the same.
    fn find<'a>(
        mut conditions: impl Iterator<Item = (&'a str, &'a str, &'a str, &'a str)>,
        kind: &str,
    ) -> State {
        conditions.find(|c| c.0 == kind).map_or_else(
            || State {
                status: "Unknown".into(),
                reason: "NotStarted".into(),
                message: String::new(),
            },
            |(_, status, reason, message)| State {
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
            },
        )
    }

    fn short(&self) -> String {
        match self.status.as_str() {
            "True" => self.reason.clone(),
            _ => format!("{} ({})", self.reason, self.status),
        }
    }
}

/// A known cluster in one line.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct PeerLine {
    pub cluster_id: String,
    pub role: String,
    pub discovered_by: String,
    pub authentication: State,
    pub network: State,
    pub resources: State,
    pub virtual_node: State,
    /// The working mode between the two (docs/modes.md): `Tethered` or `Autonomous`.
    pub mode: State,
}

impl PeerLine {
    fn of(fc: &ForeignCluster) -> PeerLine {
        let conditions = fc
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        PeerLine {
            cluster_id: fc.spec.cluster_id.clone(),
            role: format!("{:?}", fc.spec.role),
            discovered_by: format!("{:?}", fc.spec.discovered_by),
            authentication: State::of(conditions, condition::AUTHENTICATED),
            network: State::of(conditions, condition::NETWORK),
            resources: State::of(conditions, condition::RESOURCES),
            virtual_node: State::of(conditions, condition::VIRTUAL_NODE),
            mode: State::of(conditions, condition::TETHERED),
        }
    }
}

/// `fabricctl info`: who this cluster is and the clusters it knows.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct Overview {
    pub cluster_id: String,
    pub pod_cidr: String,
    pub external_cidr: String,
    /// Where peers reach the gateway, once its operator published it.
    pub gateway: Option<String>,
    pub peers: Vec<PeerLine>,
}

impl Overview {
    pub fn build(
        me: &ClusterIdentity,
        gateway: Option<&GatewayIdentity>,
        known: &[ForeignCluster],
    ) -> Overview {
        let mut peers: Vec<PeerLine> = known.iter().map(PeerLine::of).collect();
        peers.sort_by(|a, b| a.cluster_id.cmp(&b.cluster_id));
        Overview {
            cluster_id: me.cluster_id.clone(),
            pod_cidr: me.pod_cidr.to_string(),
            external_cidr: me.external_cidr.to_string(),
            gateway: gateway.map(|g| g.endpoint.to_string()),
            peers,
        }
    }

    fn table(&self) -> String {
        let mut out = format!(
            "cluster {}  pods {}  external {}  gateway {}\n\n",
            self.cluster_id,
            self.pod_cidr,
            self.external_cidr,
            self.gateway.as_deref().unwrap_or("(not published yet)")
        );
        if self.peers.is_empty() {
            out += "no known clusters: peer with one (`fabricctl peer out-of-band ...`, as \
                    printed by `fabricctl generate peer-command` on the provider)\n";
            return out;
        }
        let row = |c: [&str; 8]| {
            format!(
                "{:<20} {:<20} {:<7} {:<24} {:<24} {:<24} {:<24} {}\n",
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
            )
        };
        out += &row([
            "PEER",
            "ROLE",
            "FOUND",
            "AUTHENTICATION",
            "NETWORK",
            "RESOURCES",
            "VIRTUAL NODE",
            "MODE",
        ]);
        for p in &self.peers {
            out += &row([
                &p.cluster_id,
                &p.role,
                &p.discovered_by,
                &p.authentication.short(),
                &p.network.short(),
                &p.resources.short(),
                &p.virtual_node.short(),
                if p.mode.status == "Unknown" {
                    "-"
                } else {
                    &p.mode.reason
                },
            ]);
        }
        out
    }
}

/// The network half of a peering as this cluster sees it.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct NetworkInfo {
    pub pod_cidr: String,
    pub pod_seen_as: Option<String>,
    pub external_cidr: String,
    pub external_seen_as: Option<String>,
    /// Connecting, Connected or Error; "NoGateway" before the gateway reported.
    pub tunnel: String,
    pub latency: Option<String>,
    pub message: Option<String>,
}

/// One ResourceSlice: asked, granted, and the provider's answer.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    pub name: String,
    pub requested: BTreeMap<String, String>,
    pub granted: BTreeMap<String, String>,
    pub accepted: State,
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct VirtualNodeInfo {
    pub node: String,
    pub resources: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    /// The StorageClasses the provider lends (granted), the default marked `(default)`;
    /// empty: none (claims landing there go back to the scheduler).
    pub storage: Vec<String>,
    /// The Node's own Ready condition (what the scheduler and controllers act on).
    pub node_ready: State,
}

/// `fabricctl info peer ID`.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    #[serde(flatten)]
    pub summary: PeerLine,
    pub auth_url: Option<String>,
    /// Consumer side: this cluster's namespace on the provider; provider side: the tenant's
    /// namespace here.
    pub tenant_namespace: Option<String>,
    pub api_server_url: Option<String>,
    /// Provider side: the tenant's state (Active, Cordoned, Drained).
    pub tenant_state: Option<String>,
    /// Consumer side: when the identity the provider issued expires.
    pub identity_expires: Option<String>,
    /// Beside the summary's `network` state (flattened, same level): a key of its own.
    #[serde(rename = "network_detail")]
    pub network: Option<NetworkInfo>,
    pub slices: Vec<SliceInfo>,
    /// Beside the summary's `virtual_node` state: a key of its own.
    #[serde(rename = "virtual_node_detail")]
    pub virtual_node: Option<VirtualNodeInfo>,
    /// Consumer side: what the provider keeps of this cluster's claims after their twins were
    /// given up (the ForeignCluster's `RetainedVolumes` condition, when True).
    pub retained_volumes: Option<String>,
}

/// What [`fetch_peer`] read about one peer.
#[derive(Default)]
pub struct PeerObjects {
    pub foreign_cluster: Option<ForeignCluster>,
    pub configuration: Option<Configuration>,
    pub connection: Option<Connection>,
    pub identity: Option<Identity>,
    pub tenant: Option<Tenant>,
    pub slices: Vec<ResourceSlice>,
    pub virtual_node: Option<VirtualNode>,
    pub node: Option<Node>,
}

fn quantities(r: &Resources) -> BTreeMap<String, String> {
    r.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

impl PeerInfo {
    pub fn build(id: &str, o: &PeerObjects) -> Option<PeerInfo> {
        let fc = o.foreign_cluster.as_ref()?;
        let status = fc.status.clone().unwrap_or_default();
        let network = o.configuration.as_ref().map(|cfg| {
            let seen = cfg.status.as_ref().and_then(|s| s.remote.clone());
            let conn = o.connection.as_ref().and_then(|c| c.status.clone());
            NetworkInfo {
                pod_cidr: cfg.spec.remote.pod.to_string(),
                pod_seen_as: seen.as_ref().map(|s| s.pod.to_string()),
                external_cidr: cfg.spec.remote.external.to_string(),
                external_seen_as: seen.map(|s| s.external.to_string()),
                tunnel: conn
                    .as_ref()
                    .map_or("NoGateway".into(), |s| format!("{:?}", s.value)),
                latency: conn.as_ref().and_then(|s| s.latency.clone()),
                message: conn.and_then(|s| s.message),
            }
        });
        let mut slices: Vec<SliceInfo> = o
            .slices
            .iter()
            .map(|s| {
                let st = s.status.clone().unwrap_or_default();
                SliceInfo {
                    name: s.metadata.name.clone().unwrap_or_default(),
                    requested: quantities(&s.spec.resources),
                    granted: quantities(&st.granted),
                    accepted: State::of(
                        &st.conditions,
                        fabric_api::authentication::v1alpha1::slice_condition::ACCEPTED,
                    ),
                }
            })
            .collect();
        slices.sort_by(|a, b| a.name.cmp(&b.name));
        let virtual_node = o.virtual_node.as_ref().map(|vn| VirtualNodeInfo {
            node: vn.spec.node_name.clone(),
            resources: quantities(&vn.spec.resources),
            labels: vn.spec.labels.clone(),
            storage: vn
                .spec
                .storage
                .iter()
                .flat_map(|s| {
                    s.classes.iter().map(|c| {
                        if s.default.as_ref() == Some(c) {
                            format!("{c} (default)")
                        } else {
                            c.clone()
                        }
                    })
                })
                .collect(),
            node_ready: State::find(
                o.node
                    .iter()
                    .filter_map(|n| n.status.as_ref()?.conditions.as_ref())
                    .flatten()
                    .map(|c| {
                        (
                            c.type_.as_str(),
                            c.status.as_str(),
                            c.reason.as_deref().unwrap_or_default(),
                            c.message.as_deref().unwrap_or_default(),
                        )
                    }),
                "Ready",
            ),
        });
        let retained_volumes = status
            .conditions
            .iter()
            .find(|c| {
                c.type_ == fabric_api::core::v1alpha1::condition::RETAINED_VOLUMES
                    && c.status == "True"
            })
            .map(|c| c.message.clone());
        debug_assert_eq!(fc.spec.cluster_id, id);
        Some(PeerInfo {
            summary: PeerLine::of(fc),
            auth_url: fc.spec.auth_url.clone(),
            tenant_namespace: status.tenant_namespace,
            api_server_url: status.api_server_url,
            tenant_state: o.tenant.as_ref().map(|t| format!("{:?}", t.spec.state)),
            identity_expires: o
                .identity
                .as_ref()
                .and_then(|i| i.status.as_ref())
                .and_then(|s| s.certificate_expiry.as_ref())
                .map(|t| t.0.to_string()),
            network,
            slices,
            virtual_node,
            retained_volumes,
        })
    }

    fn table(&self) -> String {
        let s = &self.summary;
        let line = |what: &str, st: &State| {
            let mut l = format!("  {what:<15} {:<8} {}", st.status, st.reason);
            if !st.message.is_empty() {
                l += &format!(": {}", st.message);
            }
            l + "\n"
        };
        let mut out = format!(
            "peer {} ({}, found: {})\n",
            s.cluster_id, s.role, s.discovered_by
        );
        out += &line("authentication", &s.authentication);
        out += &line("network", &s.network);
        out += &line("resources", &s.resources);
        out += &line("virtual node", &s.virtual_node);
        out += &line("mode", &s.mode);
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        out += &format!(
            "\nauthentication\n  auth service    {}\n  API server      {}\n  tenant ns       {}\n",
            opt(&self.auth_url),
            opt(&self.api_server_url),
            opt(&self.tenant_namespace)
        );
        if let Some(t) = &self.tenant_state {
            out += &format!("  tenant state    {t}\n");
        }
        if let Some(e) = &self.identity_expires {
            out += &format!("  identity until  {e}\n");
        }
        out += "\nnetwork\n";
        match &self.network {
            None => out += "  (no network configured for this peer)\n",
            Some(n) => {
                out += &format!(
                    "  pods            {} seen as {}\n  external        {} seen as {}\n  tunnel          {}{}{}\n",
                    n.pod_cidr,
                    opt(&n.pod_seen_as),
                    n.external_cidr,
                    opt(&n.external_seen_as),
                    n.tunnel,
                    n.latency
                        .as_ref()
                        .map(|l| format!(", latency {l}"))
                        .unwrap_or_default(),
                    n.message
                        .as_ref()
                        .map(|m| format!(" ({m})"))
                        .unwrap_or_default(),
                );
            }
        }
        let list = |m: &BTreeMap<String, String>| {
            if m.is_empty() {
                "-".to_owned()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        };
        out += "\nresources\n";
        if self.slices.is_empty() {
            out += "  (no ResourceSlices)\n";
        }
        for sl in &self.slices {
            out += &format!(
                "  slice {}: asked {}; granted {}; {} {}{}\n",
                sl.name,
                list(&sl.requested),
                list(&sl.granted),
                sl.accepted.status,
                sl.accepted.reason,
                if sl.accepted.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", sl.accepted.message)
                }
            );
        }
        out += "\nvirtual node\n";
        match &self.virtual_node {
            None => out += "  (none)\n",
            Some(v) => {
                out += &format!(
                    "  node            {}\n  capacity        {}\n  labels          {}\n  storage         {}\n",
                    v.node,
                    list(&v.resources),
                    list(&v.labels),
                    if v.storage.is_empty() {
                        "- (claims landing there go back to the scheduler)".to_owned()
                    } else {
                        v.storage.join(", ")
                    }
                );
                out += &line("node Ready", &v.node_ready);
            }
        }
        if let Some(kept) = &self.retained_volumes {
            out += &format!("\nretained volumes\n  {kept}\n");
        }
        out
    }
}

fn print<T: Serialize>(value: &T, output: Output, table: impl FnOnce() -> String) -> Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(value)?),
        Output::Table => print!("{}", table()),
    }
    Ok(())
}

async fn config_map(c: &Client, ns: &str, name: &str) -> Result<Option<ConfigMap>> {
    Api::<ConfigMap>::namespaced(c.clone(), ns)
        .get_opt(name)
        .await
        .with_context(|| format!("reading ConfigMap {ns}/{name}"))
}

async fn fetch_overview(c: &Client, ns: &str) -> Result<Overview> {
    let Some(cm) = config_map(c, ns, names::config_map::CLUSTER).await? else {
        bail!(
            "ConfigMap {ns}/{} is missing: the fabric is not installed here (`kubectl apply -k deploy/`), or it runs in another namespace (-n)",
            names::config_map::CLUSTER
        );
    };
    let me = ClusterIdentity::from_data(&cm.data.unwrap_or_default())
        .with_context(|| format!("ConfigMap {ns}/{}", names::config_map::CLUSTER))?;
    let gateway = config_map(c, ns, names::config_map::GATEWAY_IDENTITY)
        .await?
        .and_then(|cm| GatewayIdentity::from_data(&cm.data.unwrap_or_default()).ok());
    let known = Api::<ForeignCluster>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing ForeignClusters (is the fabric's sharing API installed? `kubectl apply -k deploy/`)")?;
    Ok(Overview::build(&me, gateway.as_ref(), &known.items))
}

async fn fetch_peer(c: &Client, ns: &str, id: &str) -> Result<PeerObjects> {
    let by_peer = ListParams::default().labels(&format!("{}={id}", names::label::REMOTE_CLUSTER));
    let foreign_cluster = Api::<ForeignCluster>::all(c.clone())
        .get_opt(id)
        .await
        .context("reading the ForeignCluster")?;
    let configuration = Api::<Configuration>::namespaced(c.clone(), ns)
        .get_opt(id)
        .await
        .context("reading the Configuration")?;
    let connection = Api::<Connection>::namespaced(c.clone(), ns)
        .get_opt(id)
        .await
        .context("reading the Connection")?;
    let identity = Api::<Identity>::namespaced(c.clone(), ns)
        .get_opt(id)
        .await
        .context("reading the Identity")?;
    let tenant_ns = names::namespace::tenant(id);
    let tenant = Api::<Tenant>::namespaced(c.clone(), &tenant_ns)
        .get_opt(id)
        .await
        .context("reading the Tenant")?;
    // Consumer side: the slices this cluster asked that provider for (labelled with it);
    // provider side: the replicas in the consumer's tenant namespace.
    let mut slices = Api::<ResourceSlice>::namespaced(c.clone(), ns)
        .list(&by_peer)
        .await
        .context("listing ResourceSlices")?
        .items;
    if tenant.is_some() {
        slices.extend(
            Api::<ResourceSlice>::namespaced(c.clone(), &tenant_ns)
                .list(&ListParams::default())
                .await
                .context("listing the tenant's ResourceSlices")?
                .items,
        );
    }
    let virtual_node = Api::<VirtualNode>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
        .context("listing VirtualNodes")?
        .items
        .into_iter()
        .find(|v| v.spec.cluster_id == id);
    let node = match &virtual_node {
        Some(v) => Api::<Node>::all(c.clone())
            .get_opt(&v.spec.node_name)
            .await
            .context("reading the virtual node")?,
        None => None,
    };
    Ok(PeerObjects {
        foreign_cluster,
        configuration,
        connection,
        identity,
        tenant,
        slices,
        virtual_node,
        node,
    })
}

pub async fn info(c: &Client, ns: &str, output: Output) -> Result<()> {
    let overview = fetch_overview(c, ns).await?;
    print(&overview, output, || overview.table())
}

/// One peer, or every known one when `id` is None.
pub async fn info_peer(c: &Client, ns: &str, id: Option<&str>, output: Output) -> Result<()> {
    let ids: Vec<String> = match id {
        Some(id) => vec![id.to_owned()],
        None => Api::<ForeignCluster>::all(c.clone())
            .list(&ListParams::default())
            .await
            .context("listing ForeignClusters")?
            .items
            .into_iter()
            .map(|f| f.spec.cluster_id)
            .collect(),
    };
    let mut infos = Vec::new();
    for id in &ids {
        let objects = fetch_peer(c, ns, id).await?;
        match PeerInfo::build(id, &objects) {
            Some(i) => infos.push(i),
            None => bail!(
                "no ForeignCluster {id}: this cluster does not know that peer (`fabricctl info` lists the known ones)"
            ),
        }
    }
    if id.is_some() {
        let one = &infos[0];
        return print(one, output, || one.table());
    }
    print(&infos, output, || {
        infos
            .iter()
            .map(PeerInfo::table)
            .collect::<Vec<_>>()
            .join("\n")
    })
}

#[cfg(test)]
mod tests {
    use fabric_api::{
        authentication::v1alpha1::{ResourceSliceSpec, ResourceSliceStatus},
        core::v1alpha1::{DiscoveryMethod, ForeignClusterSpec, ForeignClusterStatus, PeerRole},
        offloading::v1alpha1::VirtualNodeSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::ObjectMeta;

    use super::*;

    fn cond(kind: &str, status: &str, reason: &str, message: &str) -> Condition {
        let mut c = fabric_kube::status::condition(
            kind,
            status == "True",
            reason,
            message.into(),
            None,
            Default::default(),
        );
        c.status = status.into();
        c
    }

    fn fc(id: &str, conditions: Vec<Condition>) -> ForeignCluster {
        ForeignCluster {
            metadata: ObjectMeta {
                name: Some(id.into()),
                ..Default::default()
            },
            spec: ForeignClusterSpec {
                cluster_id: id.into(),
                discovered_by: DiscoveryMethod::Manual,
                role: PeerRole::Provider,
                auth_url: Some("https://auth.b.example:8443".into()),
            },
            status: Some(ForeignClusterStatus {
                tenant_namespace: Some("fabric-tenant-a".into()),
                api_server_url: None,
                conditions,
            }),
        }
    }

    #[test]
    fn every_module_says_what_is_up_and_why_not() {
        let known = [
            fc(
                "b",
                vec![
                    cond(condition::AUTHENTICATED, "True", "IdentityIssued", ""),
                    cond(
                        condition::NETWORK,
                        "False",
                        "TunnelDown",
                        "no handshake for 30s",
                    ),
                ],
            ),
            fc("a", vec![]),
        ];
        let me = ClusterIdentity::from_lookup(|k| {
            Some(
                match k {
                    "FABRIC_CLUSTER_ID" => "home",
                    "FABRIC_POD_CIDR" => "10.244.0.0/16",
                    "FABRIC_SERVICE_CIDR" => "10.96.0.0/12",
                    "FABRIC_EXTERNAL_CIDR" => "10.70.0.0/16",
                    _ => return None,
                }
                .into(),
            )
        })
        .unwrap();
        let o = Overview::build(&me, None, &known);
        assert_eq!(o.peers[0].cluster_id, "a", "sorted");
        assert_eq!(o.peers[0].network.reason, "NotStarted");
        let t = o.table();
        assert!(t.contains("IdentityIssued"), "{t}");
        assert!(t.contains("TunnelDown (False)"), "{t}");
        assert!(t.contains("(not published yet)"), "{t}");
        let empty = Overview::build(&me, None, &[]).table();
        assert!(empty.contains("fabricctl generate peer-command"), "{empty}");
    }

    #[test]
    fn one_peer_in_one_view() {
        let q = |s: &str| Quantity(s.into());
        let slice = ResourceSlice {
            metadata: ObjectMeta {
                name: Some("b".into()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                consumer_cluster_id: "a".into(),
                provider_cluster_id: "b".into(),
                resources: [("cpu".into(), q("8")), ("memory".into(), q("16Gi"))].into(),
                at_most_once: None,
            },
            status: Some(ResourceSliceStatus {
                granted: [("cpu".into(), q("4")), ("memory".into(), q("16Gi"))].into(),
                conditions: vec![cond(
                    "Accepted",
                    "True",
                    "PartiallyGranted",
                    "cpu: 4 of 8 (90% of what is free)",
                )],
                ..Default::default()
            }),
        };
        let vn = VirtualNode::new(
            "b",
            VirtualNodeSpec {
                cluster_id: "b".into(),
                node_name: "fabric-b".into(),
                identity: "b".into(),
                resources: [("cpu".into(), q("4"))].into(),
                labels: [("node-type".into(), "gpu".into())].into(),
                at_most_once: None,
                storage: Some(fabric_api::offloading::v1alpha1::Storage {
                    classes: vec!["fast".into(), "standard".into()],
                    default: Some("standard".into()),
                }),
            },
        );
        let objects = PeerObjects {
            foreign_cluster: Some(fc("b", vec![])),
            slices: vec![slice],
            virtual_node: Some(vn),
            ..Default::default()
        };
        let info = PeerInfo::build("b", &objects).unwrap();
        assert_eq!(info.slices[0].granted["cpu"], "4");
        assert_eq!(
            info.virtual_node.as_ref().unwrap().node_ready.reason,
            "NotStarted"
        );
        let t = info.table();
        assert!(t.contains("PartiallyGranted: cpu: 4 of 8"), "{t}");
        assert!(t.contains("node-type=gpu"), "{t}");
        assert!(
            t.contains("storage         fast, standard (default)"),
            "{t}"
        );
        assert!(t.contains("(no network configured for this peer)"), "{t}");
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["cluster_id"], "b", "summary flattened: {json}");
        // The modules' states and their details do not share (and overwrite) a key.
        assert_eq!(json["virtual_node"]["reason"], "NotStarted", "{json}");
        assert_eq!(json["virtual_node_detail"]["node"], "fabric-b", "{json}");
        assert_eq!(json["network"]["reason"], "NotStarted", "{json}");
        assert!(PeerInfo::build("c", &PeerObjects::default()).is_none());
    }
}
