//! The operator loop: the thin edge that reads the watch caches, renders, talks to the
//! gateway and writes to the API only what changed.
//!
//! Passes run on every watch event, on a change of leadership, and every `interval` (the
//! gateway's own state, read over its control socket, is not in the API). A pass writes the
//! identity ConfigMap when it changed, the Connections whose state changed (their counters at
//! most every [`COUNTER_REFRESH`]), and Events on state changes. Every [`RESYNC`] it forgets
//! what it wrote, so the caches decide again what is current.
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use fabric_api::{
    identity::{ClusterIdentity, GatewayIdentity},
    names::{annotation, config_map, label, secret},
    networking::v1alpha1::{Configuration, Connection, ConnectionSpec, ConnectionStatus, IP},
};
use fabric_kube::{
    events::{Event, Events},
    lease,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod},
    discovery::v1::EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Api, Client, ResourceExt, api::ObjectMeta, runtime::watcher};
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use super::{
    ExternalView, FIELD_MANAGER, Opts, RenderError, Rendered, Subject,
    caches::Caches,
    config_file, control, externals,
    key_file::{self, KeyFile},
    peers, render,
    report::{self, Tunnel},
    write_private,
};

/// How often latency and byte counters alone are written to a Connection.
pub const COUNTER_REFRESH: Duration = Duration::from_secs(10);
/// How often the operator forgets what it wrote and lets the caches decide again.
pub const RESYNC: Duration = Duration::from_secs(60);
/// How often the operator asks its gateway whether it serves (the Lease follows the answer).
const HEALTH_EVERY: Duration = Duration::from_millis(500);
/// The `reportingController` of the operator's Events.
const REPORTER: &str = "fabric-gateway-operator";

/// What this replica wrote last, to write nothing twice.
#[derive(Default)]
struct Written {
    config: Option<fabric_gateway_api::Config>,
    identity: Option<BTreeMap<String, String>>,
    /// Per peer: the Connection status written, and when.
    conns: BTreeMap<String, (ConnectionStatus, Instant)>,
    /// Per peer and IP: the [`report::ACCEPTED`] condition written.
    accepted: BTreeMap<Subject, Condition>,
    since: Option<Instant>,
}

impl Written {
    /// Forgets what went to the API (not the gateway's configuration file, which is ours).
    fn forget_api(&mut self) {
        self.identity = None;
        self.conns.clear();
        self.accepted.clear();
    }
}

struct Operator {
    client: Client,
    o: Opts,
    key_file: KeyFile,
    caches: Caches,
    events: Events,
    written: Written,
}

impl Operator {
    /// The private key from the Secret, written to the gateway's key file when it is not the
    /// one written last; returns its public key. A rotated key makes the next configuration
    /// write ask the gateway to reload, which takes the new key up.
    fn key(&mut self) -> anyhow::Result<fabric_gateway_api::PublicKey> {
        let secret = self
            .caches
            .secret
            .find(|s| s.name_any() == secret::GATEWAY_KEY)
            .ok_or_else(|| anyhow::anyhow!("secret {} not found", secret::GATEWAY_KEY))?;
        let bad = |why: &dyn std::fmt::Display| {
            anyhow::anyhow!(
                "secret {}: {}: {why}",
                secret::GATEWAY_KEY,
                secret::GATEWAY_KEY_FIELD
            )
        };
        let field = secret
            .data
            .as_ref()
            .and_then(|d| d.get(secret::GATEWAY_KEY_FIELD))
            .ok_or_else(|| bad(&"missing"))?;
        // Borrowed from the cache, decoded straight into the key (wiped when dropped).
        let text = std::str::from_utf8(&field.0).map_err(|e| bad(&e))?;
        let key = fabric_gateway_api::PrivateKey::from_base64(text).map_err(|e| bad(&e))?;
        let synced = self.key_file.sync(&key).map_err(|e| {
            anyhow::anyhow!("writing the key file {}: {e}", self.o.key_path.display())
        })?;
        if synced == key_file::Synced::Rotated {
            info!(public_key = %key.public_key(), "gateway key rotated: asking the gateway to take it up");
            self.written.config = None;
        }
        Ok(key.public_key())
    }

    /// Writes the configuration when it changed and asks the gateway to reload. One the API
    /// cannot make is reported, and the gateway keeps the last one.
    async fn apply_config(
        &mut self,
        config: Result<Rendered, RenderError>,
        what: &str,
    ) -> anyhow::Result<()> {
        let config = match config {
            Ok(c) => c.config,
            Err(e) => {
                warn!(error = %e, "gateway configuration not rendered; the gateway keeps its last one");
                return Ok(());
            }
        };
        if self.written.config.as_ref() == Some(&config) {
            return Ok(());
        }
        write_private(&self.o.config_path, config_file(&config)?.as_bytes())?;
        match control(&self.o).reload().await {
            Ok(()) => {
                info!("{what}: gateway configuration applied");
                self.written.config = Some(config);
            }
            // It read the file and applied what it could: asking again would not do better.
            Err(e @ fabric_gateway_api::control::ClientError::Refused { .. }) => {
                warn!(error = %e, "gateway reload");
                self.written.config = Some(config);
            }
            // Not running yet (it reads the file when it starts), or hung: asked again at the
            // next pass, so a gateway that hung while this replica gave the Lease up does not
            // go on with the active configuration once it wakes.
            Err(e) => warn!(error = %e, "gateway reload"),
        }
        Ok(())
    }

    /// Takes the configuration the gateway runs as the one written last, when the gateway
    /// runs all of it and the file says the same (see [`adoptable`]): a restarted operator
    /// whose rendering equals it then neither rewrites the file nor reloads the gateway.
    /// Otherwise the first pass writes and reloads, as on a first start.
    async fn adopt_running(&mut self) {
        let running = match control(&self.o).config().await {
            Ok(c) => c,
            Err(e) => {
                info!(error = %e, "not asking the gateway what it runs: the first pass writes and reloads");
                None
            }
        };
        let file = match fabric_gateway_api::Config::load(&self.o.config_path) {
            Ok(c) => Some(c),
            Err(e) => {
                info!(error = %e, "no usable configuration file: the first pass writes one");
                None
            }
        };
        self.written.config = adoptable(running, file);
        if self.written.config.is_some() {
            info!(
                "the gateway runs the configuration file in full: adopted, reloaded only once it changes"
            );
        }
    }

    /// Publishes this gateway's public key and endpoint for `fabricctl peer`.
    async fn publish_identity(
        &mut self,
        public_key: fabric_gateway_api::PublicKey,
    ) -> anyhow::Result<()> {
        let data = GatewayIdentity {
            public_key: public_key.to_base64(),
            endpoint: self.o.advertise,
        }
        .to_data();
        if self.written.identity.as_ref() == Some(&data) {
            return Ok(());
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(config_map::GATEWAY_IDENTITY.into()),
                ..Default::default()
            },
            data: Some(data.clone()),
            ..Default::default()
        };
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.o.namespace);
        FIELD_MANAGER.apply(&cms, &cm).await?;
        self.written.identity = Some(data);
        Ok(())
    }

    /// This cluster's identity, from the watched `fabric-cluster` ConfigMap.
    fn cluster(&self) -> anyhow::Result<ClusterIdentity> {
        let (ns, name) = (&self.o.namespace, config_map::CLUSTER);
        let cm = self
            .caches
            .cluster
            .find(|c| c.name_any() == name)
            .ok_or_else(|| anyhow::anyhow!("no ConfigMap {ns}/{name}"))?;
        ClusterIdentity::from_data(cm.data.as_ref().unwrap_or(&BTreeMap::new()))
            .map_err(|e| anyhow::anyhow!("{ns}/{name}: {e}"))
    }

    /// One pass. A standby replica (`active` false) only keeps its key file current and gives
    /// its gateway a configuration without peers; the identity and the Connections are the
    /// active replica's to write.
    async fn pass(&mut self, active: bool) -> anyhow::Result<()> {
        let public_key = self.key()?;
        if !active {
            return self
                .apply_config(render(&self.o, "", &[], &[], &[]), "standby")
                .await;
        }
        self.publish_identity(public_key).await?;
        let peers = peers(
            &self.caches.configs.state(),
            &self.caches.keys.state(),
            &self.caches.clients.state(),
        );
        let me = self.cluster()?;
        let ips = self.caches.ips.state();
        let exposed = externals(&ips);
        let rendered = render(
            &self.o,
            &me.cluster_id,
            &[me.pod_cidr],
            &peers.views,
            &exposed,
        );
        let n = peers.views.len() + peers.malformed.len();
        let skipped: BTreeMap<Subject, String> = match &rendered {
            Ok(r) => r
                .skipped
                .iter()
                .chain(&peers.malformed)
                .map(|s| (s.subject.clone(), s.reason.to_string()))
                .collect(),
            Err(_) => BTreeMap::new(),
        };
        for (subject, why) in &skipped {
            warn!(?subject, reason = %why, "left out of the gateway configuration");
        }
        let rendered_ok = rendered.is_ok();
        self.apply_config(rendered, &format!("active, {n} peers"))
            .await?;
        // Telling a resource it was left out must not keep the Connections from being reported.
        if rendered_ok && let Err(e) = self.report_accepted(&peers, &exposed, &skipped).await {
            warn!(error = %e, "setting GatewayAccepted conditions");
        }

        let status = match control(&self.o).status().await {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "gateway status");
                None
            }
        };
        let conns: Api<Connection> = Api::namespaced(self.client.clone(), &self.o.namespace);
        let now = Instant::now();
        for id in peers.ids() {
            let tunnel = status
                .as_ref()
                .and_then(|s| s.peers.iter().find(|x| x.name == id))
                .map(|g| Tunnel {
                    up: g.up,
                    rtt_seconds: g.probe_rtt_seconds,
                    rx_bytes: g.rx_bytes,
                    tx_bytes: g.tx_bytes,
                });
            let mut want = report::connection_status(tunnel);
            if let Some(why) = skipped.get(&Subject::Peer(id.to_owned())) {
                want.message = Some(format!("left out of the gateway's configuration: {why}"));
            }
            let stored = self.caches.conns.find(|c| c.name_any() == id);
            let object_ok = stored.as_ref().is_some_and(|c| {
                c.spec.cluster_id == id
                    && c.labels().get(label::PEER).map(String::as_str) == Some(id)
            });
            if !object_ok {
                let conn = Connection {
                    metadata: ObjectMeta {
                        name: Some(id.to_owned()),
                        labels: Some(BTreeMap::from([(label::PEER.to_owned(), id.to_owned())])),
                        ..Default::default()
                    },
                    spec: ConnectionSpec {
                        cluster_id: id.to_owned(),
                    },
                    status: None,
                };
                FIELD_MANAGER.apply(&conns, &conn).await?;
            }
            // What we wrote ourselves is newer than the cache until its watch event arrives.
            let mine = self.written.conns.get(id);
            let current = match (mine, stored.as_ref().filter(|_| object_ok)) {
                (Some((s, _)), Some(_)) => Some(s.clone()),
                (_, stored) => stored.and_then(|c| c.status.clone()),
            };
            let written_at = mine.map(|(_, t)| *t);
            if !report::due(current.as_ref(), &want, written_at, now, COUNTER_REFRESH) {
                continue;
            }
            FIELD_MANAGER.apply_status(&conns, id, &want).await?;
            let before = current.as_ref().map(|s| s.value);
            if let Some(ev) = report::transition(id, before, &want) {
                self.event_on_peer(id, &ev).await;
            }
            self.written.conns.insert(id.to_owned(), (want, now));
        }
        // Connections of peers that are gone.
        for c in self.caches.conns.state() {
            if !peers.ids().any(|id| id == c.spec.cluster_id) {
                let _ = conns.delete(&c.name_any(), &Default::default()).await;
                self.written.conns.remove(&c.name_any());
            }
        }
        Ok(())
    }

    /// Sets the [`report::ACCEPTED`] condition on each peer's Configuration and each exposed
    /// `IP` where it changed, with an Event when one is left out or back in.
    async fn report_accepted(
        &mut self,
        peers: &super::Peers,
        exposed: &[ExternalView],
        skipped: &BTreeMap<Subject, String>,
    ) -> anyhow::Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now();
        for id in peers.ids() {
            let subject = Subject::Peer(id.to_owned());
            let Some(cfg) = self
                .caches
                .configs
                .find(|c| c.spec.cluster_id == id && c.metadata.deletion_timestamp.is_none())
            else {
                continue;
            };
            let current = self.current(&subject, cfg.status.as_ref().map(|s| &s.conditions));
            let what = format!("peer {id}");
            let why = skipped.get(&subject).map(String::as_str);
            let Some((cond, ev)) =
                report::accepted(&what, why, &current, cfg.metadata.generation, now)
            else {
                continue;
            };
            let api: Api<Configuration> =
                Api::namespaced(self.client.clone(), &cfg.namespace().unwrap_or_default());
            FIELD_MANAGER
                .apply_status(
                    &api,
                    &cfg.name_any(),
                    serde_json::json!({ "conditions": [&cond] }),
                )
                .await?;
            if let Some(ev) = ev {
                self.events.publish(&*cfg, &ev).await;
            }
            self.written.accepted.insert(subject, cond);
        }
        for e in exposed {
            let subject = Subject::Ip(e.name.clone());
            let Some(ip) = self.caches.ips.find(|i| i.name_any() == e.name) else {
                continue;
            };
            let current = self.current(&subject, ip.status.as_ref().map(|s| &s.conditions));
            let what = format!("IP {} ({} as {})", e.name, e.internal, e.external);
            let why = skipped.get(&subject).map(String::as_str);
            let Some((cond, ev)) =
                report::accepted(&what, why, &current, ip.metadata.generation, now)
            else {
                continue;
            };
            let api: Api<IP> =
                Api::namespaced(self.client.clone(), &ip.namespace().unwrap_or_default());
            FIELD_MANAGER
                .apply_status(&api, &e.name, serde_json::json!({ "conditions": [&cond] }))
                .await?;
            if let Some(ev) = ev {
                self.events.publish(&*ip, &ev).await;
            }
            self.written.accepted.insert(subject, cond);
        }
        Ok(())
    }

    /// A resource's conditions as the cache has them, with what this replica wrote last in
    /// place of the cache's (newer until its watch event arrives).
    fn current(&self, subject: &Subject, cached: Option<&Vec<Condition>>) -> Vec<Condition> {
        let mut out = cached.cloned().unwrap_or_default();
        if let Some(mine) = self.written.accepted.get(subject) {
            fabric_kube::status::set_condition(&mut out, mine.clone());
        }
        out
    }

    /// An Event on the peer's Configuration (where `kubectl describe` of the peer shows it).
    async fn event_on_peer(&self, cluster_id: &str, ev: &Event) {
        let cfg = self
            .caches
            .configs
            .find(|c| c.spec.cluster_id == cluster_id);
        match cfg {
            Some(cfg) => self.events.publish(&*cfg, ev).await,
            None => warn!(
                peer = cluster_id,
                reason = ev.reason,
                "no Configuration for an Event"
            ),
        }
        if ev.warning {
            warn!(peer = cluster_id, reason = ev.reason, note = %ev.note, "peer");
        } else {
            info!(peer = cluster_id, reason = ev.reason, note = %ev.note, "peer");
        }
    }
}

/// What a starting operator may take as written and applied: the configuration the gateway
/// runs in full (None: a part of its last reload failed, or it does not say), when the file
/// holds the same. A file that differs (written by an operator that died before it asked for
/// the reload) or is missing would be what a restarted gateway reads: it is written again.
fn adoptable(
    running: Option<fabric_gateway_api::Config>,
    file: Option<fabric_gateway_api::Config>,
) -> Option<fabric_gateway_api::Config> {
    running.filter(|r| file.as_ref() == Some(r))
}

/// Points the gateway Service's EndpointSlice at this replica.
async fn claim_service(client: &Client, ns: &str, slice: &EndpointSlice) -> kube::Result<()> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    FIELD_MANAGER.apply(&api, slice).await?;
    Ok(())
}

/// The gateway's end of the overlay, with the Node and Pod watches that feed it.
struct OverlayFeed {
    overlay: crate::overlay::GatewayOverlay,
    nodes: kube::runtime::reflector::Store<Node>,
    ready: Arc<AtomicBool>,
    pods: Arc<std::sync::Mutex<crate::overlay::PodPlaces>>,
}

fn start_overlay(
    client: &Client,
    ov: &fabric_routing::overlay::Overlay,
    local: std::net::Ipv4Addr,
    guard_pin_dir: Option<std::path::PathBuf>,
    changed: &Arc<Notify>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<OverlayFeed> {
    let (conn, handle, _) =
        rtnetlink::new_connection().map_err(|e| anyhow::anyhow!("netlink socket: {e}"))?;
    tokio::spawn(conn);
    let (nodes, task) = fabric_kube::cache::notifying(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        changed.clone(),
    );
    tasks.push(task);
    // An empty cache would remove the routes to every node's pods after a restart, so the
    // overlay is only synced once the Nodes have been listed.
    let ready = Arc::new(AtomicBool::new(false));
    tokio::spawn({
        let (nodes, ready) = (nodes.clone(), ready.clone());
        let notify = changed.clone();
        async move {
            if nodes.wait_until_ready().await.is_ok() {
                ready.store(true, Ordering::Relaxed);
                notify.notify_one();
            }
        }
    });
    // Pods, for nodes without spec.podCIDRs: only where each runs is kept.
    let pods = Arc::new(std::sync::Mutex::new(crate::overlay::PodPlaces::default()));
    tasks.push(tokio::spawn({
        let (pods, notify) = (pods.clone(), changed.clone());
        let api = Api::<Pod>::all(client.clone());
        async move {
            use futures::StreamExt;
            use kube::runtime::WatchStreamExt;
            let mut s = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => {
                        if pods.lock().unwrap().apply(ev) {
                            notify.notify_one();
                        }
                    }
                    Err(e) => warn!(error = %e, "watching Pods"),
                }
            }
        }
    }));
    Ok(OverlayFeed {
        overlay: crate::overlay::GatewayOverlay::new(ov.clone(), local, handle, guard_pin_dir),
        nodes,
        ready,
        pods,
    })
}

pub async fn run(client: Client, o: Opts) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &o.namespace);
    let (tx, mut leading) = watch::channel(false);
    let mut election = o.election.clone();
    // The node agents route to whatever address the holder publishes here.
    election.annotations.insert(
        annotation::GATEWAY_IP.to_owned(),
        o.gateway_ip.map(|ip| ip.to_string()),
    );
    let mut tasks = Vec::new();
    let elector = match o.gateway_grace {
        Some(grace) => {
            let (fit_tx, fit) = watch::channel(false);
            tasks.push(tokio::spawn(super::health::watch(
                control(&o),
                HEALTH_EVERY,
                grace,
                fit_tx,
            )));
            // A restarted operator whose gateway runs on would otherwise hand the Lease over
            // in its first round, only because it has not asked its gateway yet: the nodes
            // would lose their next hop and the gateway its tunnels for a moment. The first
            // answer comes within milliseconds; a gateway not running (yet) costs `grace`.
            let mut first = fit.clone();
            let _ = tokio::time::timeout(grace, first.wait_for(|fit| *fit)).await;
            tokio::spawn(lease::elect_fit(leases.clone(), election.clone(), tx, fit))
        }
        None => tokio::spawn(lease::elect(leases.clone(), election.clone(), tx)),
    };
    let mut stop = std::pin::pin!(fabric_kube::controller::shutdown_signal());
    // Every change to what the configuration and the reports are made of triggers a pass at
    // once; the interval pass reads the gateway's own state.
    let changed = Arc::new(Notify::new());
    let caches = Caches::start(
        &client,
        &o.namespace,
        secret::GATEWAY_KEY,
        config_map::CLUSTER,
        &changed,
        &mut tasks,
    );
    let mut overlay = match &o.overlay {
        None => None,
        Some(ov) => {
            let local = o.gateway_ip.ok_or_else(|| {
                anyhow::anyhow!("--overlay needs --gateway-ip: the nodes' overlay endpoint")
            })?;
            Some(start_overlay(
                &client,
                ov,
                local,
                o.guard_pin_dir.clone(),
                &changed,
                &mut tasks,
            )?)
        }
    };
    let mut stopped = false;
    tokio::select! {
        r = caches.ready() => r?,
        () = &mut stop => stopped = true,
    }
    // Nothing is decided before the election has: a restarted active replica would give its
    // gateway the standby configuration (no peers) until its first renewal, and take every
    // tunnel down with it. The elector says its first outcome even when it is "standby".
    if !stopped {
        tokio::select! {
            r = leading.changed() => r?,
            () = &mut stop => stopped = true,
        }
    }
    let events = Events::new(client.clone(), REPORTER, Some(o.election.identity.clone()));
    let mut op = Operator {
        client: client.clone(),
        key_file: KeyFile::new(o.key_path.clone()),
        o,
        caches,
        events,
        written: Written::default(),
    };
    // The holder points the gateway Service (it has no selector) at itself, so peers'
    // handshakes reach the replica with the tunnels and not the standby.
    let pod = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty());
    let slice =
        op.o.gateway_ip
            .map(|ip| super::service_endpoints(ip, pod.as_deref(), op.o.listen_port));
    if !stopped {
        op.adopt_running().await;
    }
    let mut claimed = false;
    let mut was_active = false;
    while !stopped {
        let active = *leading.borrow_and_update();
        if active != was_active {
            // Another replica wrote in between: the caches know better than our memory.
            op.written.forget_api();
            was_active = active;
        }
        let now = Instant::now();
        if op
            .written
            .since
            .is_none_or(|t| now.duration_since(t) >= RESYNC)
        {
            op.written.forget_api();
            op.written.since = Some(now);
        }
        // A replica that lost the Lease leaves the slice alone: the new holder takes it over.
        claimed &= active;
        if let Some(slice) = slice.as_ref().filter(|_| active && !claimed) {
            match claim_service(&client, &op.o.namespace, slice).await {
                Ok(()) => claimed = true,
                Err(e) => warn!(error = %e, "pointing the gateway Service at this replica"),
            }
        }
        // Both replicas keep their end of the overlay: a takeover then only moves the nodes'
        // next hop.
        if let Some(f) = overlay
            .as_mut()
            .filter(|f| f.ready.load(Ordering::Relaxed) && f.pods.lock().unwrap().ready)
        {
            let list = f.nodes.state();
            let peered = !op.caches.configs.is_empty();
            // A snapshot: the lock is not held across the netlink calls.
            let places = f.pods.lock().unwrap().clone();
            if let Err(e) = f
                .overlay
                .sync(list.iter().map(|n| n.as_ref()), &places, peered)
                .await
            {
                warn!(error = %format!("{e:#}"), "gateway overlay");
            }
        }
        if let Err(e) = op.pass(active).await {
            warn!(error = %format!("{e:#}"), "gateway operator pass");
        }
        tokio::select! {
            _ = tokio::time::sleep(op.o.interval) => {}
            _ = changed.notified() => {}
            // A takeover is applied at once, not at the next interval.
            Ok(()) = leading.changed() => {}
            () = &mut stop => stopped = true,
        }
    }
    elector.abort();
    for t in tasks {
        t.abort();
    }
    if *leading.borrow() {
        match lease::release(&leases, &election).await {
            Ok(()) => info!("released the gateway Lease"),
            Err(e) => warn!(error = %e, "releasing the gateway Lease"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(port: u16) -> fabric_gateway_api::Config {
        fabric_gateway_api::Config::parse(&format!(
            "[interface]\nname = \"gw\"\nprivate_key_file = \"/run/gw.key\"\nlisten_port = {port}\n"
        ))
        .unwrap()
    }

    #[test]
    fn only_what_runs_in_full_and_is_on_file_is_adopted() {
        let (a, b) = (config(51820), config(51821));
        assert_eq!(adoptable(Some(a.clone()), Some(a.clone())), Some(a.clone()));
        // The file was written after the gateway last reloaded (its operator died first).
        assert_eq!(adoptable(Some(a.clone()), Some(b.clone())), None);
        // No file: a restarted gateway would have nothing to read.
        assert_eq!(adoptable(Some(a.clone()), None), None);
        // The gateway's last reload failed in part, or it does not say what it runs.
        assert_eq!(adoptable(None, Some(a)), None);
    }
}
