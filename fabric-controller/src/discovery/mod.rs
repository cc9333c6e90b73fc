//! The discovery controller: announces this cluster on the LAN, browses the LAN (mDNS) and
//! DNS search domains (DNS-SD) with `fabric-discovery`, and keeps a ForeignCluster per
//! discovered cluster ([`plan`] says which, from what the browsers see and a watch of the
//! ForeignClusters). It never peers anything.
//!
//! Off unless a flag asks for it (`--discovery-mdns`, `--discovery-domain`,
//! `--announce-auth-url`); it runs in the elected replica of `fabric-controller ipam`, so one
//! replica announces and writes.
use std::{net::SocketAddr, time::Duration};

use fabric_api::{
    core::v1alpha1::{DiscoveryMethod, ForeignCluster},
    names::field_manager,
};
use fabric_discovery::{
    Announcement, AuthUrl, Change, ClusterId, Role,
    dns::{DnsBrowser, DnsConfig, DnsError},
    mdns::{Lan, LanError},
};
use futures::StreamExt as _;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::watcher,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

pub mod plan;

use plan::{Action, Seen};

/// The command-line flags of discovery (all off by default).
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Browse the LAN for clusters announced with mDNS (DNS-SD), and make ForeignClusters of
    /// them (`discoveredBy: Lan`).
    #[arg(long, env = "FABRIC_DISCOVERY_MDNS")]
    pub discovery_mdns: bool,
    /// Look up the clusters published as DNS-SD records under this domain
    /// (`_fabric-peering._tcp.<domain>`), and make ForeignClusters of them
    /// (`discoveredBy: Dns`); repeatable, or comma separated (empty items are ignored).
    #[arg(
        long = "discovery-domain",
        env = "FABRIC_DISCOVERY_DOMAINS",
        value_delimiter = ','
    )]
    pub discovery_domains: Vec<String>,
    /// The nameserver (address:port) for --discovery-domain; default: the system's.
    #[arg(long, env = "FABRIC_DISCOVERY_NAMESERVER")]
    pub discovery_nameserver: Option<SocketAddr>,
    /// How often the domains are looked up again.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub discovery_interval: Duration,
    /// Announce this cluster on the LAN (mDNS) with the URL of its authentication service
    /// (https).
    #[arg(long, env = "FABRIC_ANNOUNCE_AUTH_URL")]
    pub announce_auth_url: Option<AuthUrl>,
    /// The roles announced with --announce-auth-url: consumer, provider, or both (comma
    /// separated).
    #[arg(long, env = "FABRIC_ANNOUNCE_ROLES", value_delimiter = ',')]
    pub announce_roles: Vec<Role>,
}

impl Args {
    /// The settings for cluster `cluster_id`.
    pub fn settings(self, cluster_id: ClusterId) -> Settings {
        Settings {
            announce: self.announce_auth_url.map(|auth_url| Announcement {
                cluster_id: cluster_id.clone(),
                auth_url,
                roles: self.announce_roles.into_iter().collect(),
            }),
            cluster_id,
            mdns: self.discovery_mdns,
            domains: self
                .discovery_domains
                .into_iter()
                .filter(|d| !d.is_empty())
                .collect(),
            nameserver: self.discovery_nameserver,
            interval: self.discovery_interval,
        }
    }

    pub fn enabled(&self) -> bool {
        self.discovery_mdns
            || self.discovery_domains.iter().any(|d| !d.is_empty())
            || self.announce_auth_url.is_some()
    }
}

/// What discovery does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This cluster: announced, and never a ForeignCluster of its own.
    pub cluster_id: ClusterId,
    /// Browse the LAN.
    pub mdns: bool,
    /// DNS domains to browse.
    pub domains: Vec<String>,
    /// The nameserver for the domains (the system's when `None`).
    pub nameserver: Option<SocketAddr>,
    /// How often the domains are resolved again.
    pub interval: Duration,
    /// What to announce on the LAN, if anything.
    pub announce: Option<Announcement>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Lan(#[from] LanError),
    #[error(transparent)]
    Dns(#[from] DnsError),
}

/// Announces and browses as `settings` say, and keeps the ForeignClusters in line, until the
/// ForeignCluster watch ends.
pub async fn run(client: Client, settings: Settings) -> Result<(), Error> {
    let own = settings.cluster_id.clone();
    let lan = if settings.mdns || settings.announce.is_some() {
        Some(Lan::new()?)
    } else {
        None
    };
    if let (Some(lan), Some(a)) = (&lan, &settings.announce) {
        lan.announce(a)?;
        info!(cluster = %a.cluster_id, auth_url = %a.auth_url, "announcing this cluster on the LAN");
    }
    let (tx, mut changes) = mpsc::unbounded_channel::<(DiscoveryMethod, Change)>();
    let mut browsers = Vec::new();
    if let (Some(lan), true) = (&lan, settings.mdns) {
        let mut browser = lan.browse(Some(own.clone()))?;
        let tx = tx.clone();
        browsers.push(tokio::spawn(async move {
            while let Some(c) = browser.next().await {
                if tx.send((DiscoveryMethod::Lan, c)).is_err() {
                    break;
                }
            }
        }));
        info!("browsing the LAN for clusters");
    }
    for domain in &settings.domains {
        let config = DnsConfig {
            domain: domain.clone(),
            nameserver: settings.nameserver,
            interval: settings.interval,
        };
        let mut browser = DnsBrowser::new(&config, Some(own.clone()))?;
        let tx = tx.clone();
        browsers.push(tokio::spawn(async move {
            loop {
                let c = browser.next().await;
                if tx.send((DiscoveryMethod::Dns, c)).is_err() {
                    break;
                }
            }
        }));
        info!(%domain, "browsing DNS-SD records for clusters");
    }
    drop(tx);

    let api: Api<ForeignCluster> = Api::all(client);
    let (store, watch) = fabric_kube::cache::events(api.clone(), watcher::Config::default());
    let mut watch = watch.boxed();
    let mut seen = Seen::default();
    let mut synced = false;
    let mut browsing = !browsers.is_empty();
    loop {
        tokio::select! {
            c = changes.recv(), if browsing => match c {
                Some((method, change)) => {
                    info!(?method, ?change, "discovery");
                    seen.apply(method, &change);
                }
                None => browsing = false,
            },
            ev = watch.next() => match ev {
                Some(Ok(watcher::Event::InitDone)) => synced = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    warn!(error = %e, "watching ForeignClusters");
                    continue;
                }
                None => break,
            },
        }
        if !synced {
            continue;
        }
        let existing: Vec<ForeignCluster> = store.state().iter().map(|fc| (**fc).clone()).collect();
        for action in plan::plan(&seen, &existing, own.as_str()) {
            execute(&api, action).await;
        }
    }
    for b in browsers {
        b.abort();
    }
    Ok(())
}

/// Carries out one action; a failure is logged and retried at the next change (a conflict
/// means someone else changed the ForeignCluster: the watch brings it, and the plan decides
/// again).
async fn execute(api: &Api<ForeignCluster>, action: Action) {
    match action {
        Action::Apply { name, desired } => {
            let body = serde_json::json!({
                "apiVersion": "core.fabric.io/v1alpha1",
                "kind": "ForeignCluster",
                "metadata": { "name": name },
                "spec": {
                    "clusterId": desired.cluster_id,
                    "discoveredBy": desired.discovered_by,
                    "authUrl": desired.auth_url,
                },
            });
            let params = PatchParams::apply(field_manager::DISCOVERY).force();
            match api.patch(&name, &params, &Patch::Apply(&body)).await {
                Ok(_) => info!(
                    foreign_cluster = %name,
                    discovered_by = ?desired.discovered_by,
                    auth_url = %desired.auth_url,
                    "ForeignCluster applied"
                ),
                Err(e) => warn!(foreign_cluster = %name, error = %e, "applying ForeignCluster"),
            }
        }
        Action::Delete {
            name,
            resource_version,
        } => {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version,
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    info!(foreign_cluster = %name, "no longer announced: ForeignCluster deleted")
                }
                Err(e) => warn!(foreign_cluster = %name, error = %e, "deleting ForeignCluster"),
            }
        }
    }
}
