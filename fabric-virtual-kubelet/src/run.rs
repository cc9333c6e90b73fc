//! The virtual kubelet's loop: watches its VirtualNode, the tunnel's Connection and the
//! identity Secret, registers the Node, keeps its status and conditions current and renews
//! its Lease. The decisions are [`crate::conditions`] and [`crate::node`]; this is their edge.
//!
//! Pod offloading and the kubelet API (issue 11) are further tasks beside this one, fed by
//! the same watches; the Node registration here is what they hang off.
use std::time::Duration;

use anyhow::{Context as _, Result};
use fabric_api::{
    names,
    networking::v1alpha1::{Connection, ConnectionState},
    offloading::v1alpha1::VirtualNode,
};
use fabric_kube::{cache::follow, meta::GoneOk};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, NodeStatus, Secret},
    },
    jiff::Timestamp,
};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::{
    FIELD_MANAGER,
    conditions::{self, Observed, Policy, Tunnel},
    heartbeat,
    node::{self, Settings},
    pods, provider,
};

#[derive(Debug, Clone)]
pub struct Opts {
    /// The VirtualNode this process stands for, and its namespace (the identity Secret is in
    /// [`names::namespace::IDENTITIES`]).
    pub virtual_node: String,
    pub namespace: String,
    /// Where the gateway operator reports Connections.
    pub fabric_namespace: String,
    pub settings: Settings,
    pub probe_interval: Duration,
    pub probe_timeout: Duration,
    /// leaseDurationSeconds of the node Lease, and how often it is renewed.
    pub lease_duration: Duration,
    pub lease_renew: Duration,
    /// How often the node status is written when nothing changed (its heartbeat times).
    pub status_refresh: Duration,
    pub policy: Policy,
    /// How often the pod loop looks at every pod bound to the node again.
    pub pod_resync: Duration,
    /// The reflectors' metrics (served by the kubelet API).
    pub metrics: std::sync::Arc<fabric_reflector::Metrics>,
    /// Where the home API server listens on this cluster's network, if offloaded pods are to
    /// reach it.
    pub home_api_address: Option<std::net::SocketAddrV4>,
    /// The virtual StorageClass ([`crate::storage`]).
    pub storage_class: String,
    /// The custom kinds reflected into twins, resolved ([`crate::custom`]).
    pub reflect: Vec<kube::discovery::ApiResource>,
    /// The `--reflect-custom-resource` kinds this cluster does not serve (yet), with why.
    pub unserved_kinds: std::collections::BTreeMap<String, String>,
}

/// Whether the node status must be written: it says something new, or the last write is
/// older than `refresh` (heartbeat times aside, nothing else changes by itself).
pub fn status_due(
    last: Option<&(NodeStatus, Timestamp)>,
    new: &NodeStatus,
    now: Timestamp,
    refresh: Duration,
) -> bool {
    let Some((old, at)) = last else { return true };
    let strip = |s: &NodeStatus| NodeStatus {
        conditions: None,
        ..s.clone()
    };
    strip(old) != strip(new)
        || !conditions::same_state(
            old.conditions.as_deref().unwrap_or_default(),
            new.conditions.as_deref().unwrap_or_default(),
        )
        || now.duration_since(*at).unsigned_abs() >= refresh
}

fn tunnel_of(conn: Option<&Connection>) -> Tunnel {
    match conn.and_then(|c| c.status.as_ref()) {
        Some(s) => Tunnel::Reported {
            state: s.value,
            message: s.message.clone(),
        },
        // A Connection without a status yet: its gateway has not reported.
        None if conn.is_some() => Tunnel::Reported {
            state: ConnectionState::Connecting,
            message: Some("no status reported yet".to_owned()),
        },
        None => Tunnel::Missing,
    }
}

struct Heart {
    nodes: Api<Node>,
    leases: Api<Lease>,
    opts: Opts,
    /// The Node as last applied (metadata and spec) and as the API returned it (its uid).
    registered: Option<(Node, Node)>,
    /// The status last written and when.
    written: Option<(NodeStatus, Timestamp)>,
    lease_renewed: Option<std::time::Instant>,
}

impl Heart {
    async fn register(&mut self, vn: &VirtualNode) -> kube::Result<()> {
        let want = node::node(vn);
        if self.registered.as_ref().is_some_and(|(w, _)| *w == want) {
            return Ok(());
        }
        let stored = FIELD_MANAGER.apply(&self.nodes, &want).await?;
        info!(node = %vn.spec.node_name, "Node registered");
        if self.written.is_none() {
            // The conditions as they are stored, so that a restart keeps their transition
            // times (no flap).
            self.written = stored.status.clone().map(|s| {
                (
                    NodeStatus {
                        conditions: Some(node::stored_conditions(Some(&stored))),
                        ..s
                    },
                    Timestamp::UNIX_EPOCH,
                )
            });
        }
        self.registered = Some((want, stored));
        Ok(())
    }

    async fn sync(&mut self, vn: &VirtualNode, observed: &Observed) -> kube::Result<()> {
        self.register(vn).await?;
        let now = Timestamp::now();
        if observed.last_probe.is_some() {
            let previous = self
                .written
                .as_ref()
                .and_then(|(s, _)| s.conditions.clone())
                .unwrap_or_default();
            let conds = conditions::node_conditions(observed, &previous, now, self.opts.policy);
            let status = node::status(vn, &self.opts.settings, conds);
            if status_due(
                self.written.as_ref(),
                &status,
                now,
                self.opts.status_refresh,
            ) {
                let name = &vn.spec.node_name;
                let applied = FIELD_MANAGER.apply_status(&self.nodes, name, &status).await;
                if applied.gone_ok()?.is_none() {
                    // Deleted under us while the VirtualNode stays: register again.
                    warn!(node = %name, "the Node was deleted; registering it again");
                    self.registered = None;
                    return Ok(());
                }
                let ready = status
                    .conditions
                    .as_ref()
                    .and_then(|c| c.iter().find(|c| c.type_ == conditions::READY));
                let before = self
                    .written
                    .as_ref()
                    .and_then(|(s, _)| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == conditions::READY));
                if let Some(r) = ready.filter(|r| before.map(|b| &b.reason) != Some(&r.reason)) {
                    info!(
                        node = %name,
                        ready = %r.status,
                        reason = r.reason.as_deref().unwrap_or_default(),
                        message = r.message.as_deref().unwrap_or_default(),
                        "node condition"
                    );
                }
                self.written = Some((status, now));
            }
        }
        let renew_due = self
            .lease_renewed
            .is_none_or(|t| t.elapsed() >= self.opts.lease_renew);
        if renew_due && let Some((_, stored)) = &self.registered {
            let secs = i32::try_from(self.opts.lease_duration.as_secs()).unwrap_or(i32::MAX);
            FIELD_MANAGER
                .apply(&self.leases, &node::lease(stored, secs, now))
                .await?;
            self.lease_renewed = Some(std::time::Instant::now());
        }
        Ok(())
    }
}

/// Runs until the watches end (they do not) or registration fails for good.
pub async fn run(local: Client, opts: Opts) -> Result<()> {
    let mut vn_rx = follow(
        Api::<VirtualNode>::namespaced(local.clone(), &opts.namespace),
        &opts.virtual_node,
    );
    info!(virtual_node = %opts.virtual_node, namespace = %opts.namespace, "waiting for the VirtualNode");
    let vn = loop {
        if let Some(vn) = vn_rx.borrow_and_update().clone() {
            break vn;
        }
        vn_rx
            .changed()
            .await
            .context("the VirtualNode watch ended")?;
    };
    let provider_id = vn.spec.cluster_id.clone();
    let mut conn_rx = follow(
        Api::<Connection>::namespaced(local.clone(), &opts.fabric_namespace),
        &provider_id,
    );
    let mut secret_rx = follow(
        Api::<Secret>::namespaced(local.clone(), names::namespace::IDENTITIES),
        &names::secret::identity(&provider_id),
    );
    // Nothing is decided before each watch has said whether its object exists: after a
    // restart, an empty channel taken for a missing Secret or Connection would flap the node.
    conn_rx
        .changed()
        .await
        .context("the Connection watch ended")?;
    secret_rx
        .changed()
        .await
        .context("the identity Secret watch ended")?;
    let (ready_tx, ready_rx) = watch::channel(None);
    let refusals = fabric_reflector::custom::Refusals::default();
    let pod_opts = pods::run::Opts {
        node_name: vn.spec.node_name.clone(),
        node_ip: opts.settings.address.clone(),
        provider_id: provider_id.clone(),
        fabric_namespace: opts.fabric_namespace.clone(),
        resync: opts.pod_resync,
        home_api_address: opts.home_api_address,
        storage_class: opts.storage_class.clone(),
        reflect: opts.reflect.clone(),
        refusals: refusals.clone(),
    };
    let pod_loop = tokio::spawn(pods::run::run(
        local.clone(),
        pod_opts,
        secret_rx.clone(),
        ready_rx,
        crate::storage::follow(vn_rx.clone()),
        opts.metrics.clone(),
    ));
    let (home_tx, home_rx) = watch::channel(true);
    tokio::spawn(heartbeat::probe_home(local.clone(), home_tx));
    let (heartbeat_tx, heartbeat_rx) = watch::channel(heartbeat::Heartbeat::default());
    tokio::spawn(heartbeat::run(
        secret_rx.clone(),
        vn_rx.clone(),
        home_rx,
        heartbeat_tx,
    ));
    let (probe_tx, mut probe_rx) = mpsc::channel(4);
    tokio::spawn(provider::prober(
        secret_rx,
        opts.probe_interval,
        opts.probe_timeout,
        probe_tx,
    ));
    let mut observed = Observed::new(provider_id);
    let mut heart = Heart {
        nodes: Api::all(local.clone()),
        leases: Api::namespaced(local, node::LEASE_NAMESPACE),
        opts: opts.clone(),
        registered: None,
        written: None,
        lease_renewed: None,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = vn_rx.changed() => r.context("the VirtualNode watch ended")?,
            r = conn_rx.changed() => r.context("the Connection watch ended")?,
            p = probe_rx.recv() => {
                observed.probed(Timestamp::now(), p.context("the prober ended")?);
            }
        }
        observed.tunnel = tunnel_of(conn_rx.borrow_and_update().as_ref());
        observed.refused_kinds = (!opts.reflect.is_empty()).then(|| refusals.now());
        observed.unserved_kinds = opts.unserved_kinds.clone();
        let vn = vn_rx.borrow_and_update().clone();
        // Gone or going: the VirtualNode controller removes the Node and this Deployment, and
        // a write from here could bring the Node back after it.
        let Some(vn) = vn.filter(|v| v.metadata.deletion_timestamp.is_none()) else {
            continue;
        };
        if let Err(e) = heart.sync(&vn, &observed).await {
            warn!(error = %e, node = %vn.spec.node_name, "updating the Node");
        }
        // The pod loop marks offloaded pods not Ready while the node is not.
        let ready = heart
            .written
            .as_ref()
            .and_then(|(s, _)| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == conditions::READY))
            .map(|c| conditions::Readiness {
                ready: c.status == "True",
                message: c.message.clone().unwrap_or_default(),
                partitioned: heartbeat::declared(&heartbeat_rx.borrow(), std::time::Instant::now()),
                offload_waits: heartbeat::offload_waits(
                    &heartbeat_rx.borrow(),
                    std::time::Instant::now(),
                ),
            });
        if ready.is_some() {
            ready_tx.send_if_modified(|r| {
                let changed = *r != ready;
                *r = ready;
                changed
            });
        }
        if pod_loop.is_finished() {
            return match pod_loop.await {
                Ok(r) => r.context("the pod loop ended"),
                Err(e) => Err(e).context("the pod loop panicked"),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeCondition;

    use super::*;

    fn status(ready: &str, heartbeat: i64) -> NodeStatus {
        NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_heartbeat_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::from_second(heartbeat).unwrap(),
                )),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn the_status_is_written_on_change_or_when_stale() {
        let refresh = Duration::from_secs(60);
        let t = |s| Timestamp::from_second(s).unwrap();
        assert!(status_due(None, &status("True", 0), t(0), refresh));
        let last = (status("True", 0), t(0));
        // Only the heartbeat moved: not yet.
        assert!(!status_due(
            Some(&last),
            &status("True", 10),
            t(10),
            refresh
        ));
        assert!(status_due(Some(&last), &status("True", 60), t(60), refresh));
        assert!(status_due(
            Some(&last),
            &status("False", 10),
            t(10),
            refresh
        ));
        let mut more = status("True", 10);
        more.capacity = Some(
            [(
                "cpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
            )]
            .into(),
        );
        assert!(status_due(Some(&last), &more, t(10), refresh));
    }

    #[test]
    fn a_connection_without_status_is_not_connected() {
        assert_eq!(tunnel_of(None), Tunnel::Missing);
        let c = Connection::new(
            "b",
            fabric_api::networking::v1alpha1::ConnectionSpec {
                cluster_id: "b".into(),
            },
        );
        assert!(matches!(
            tunnel_of(Some(&c)),
            Tunnel::Reported {
                state: ConnectionState::Connecting,
                ..
            }
        ));
    }
}
