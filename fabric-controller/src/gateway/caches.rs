//! The API objects the operator works from, each kept current by a watch (a kube-runtime
//! reflector store) instead of being listed on every pass. Every change wakes the operator.
use std::sync::Arc;

use fabric_api::networking::v1alpha1::{Configuration, Connection, GatewayClient, IP, PublicKey};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client,
    runtime::{reflector, reflector::Store, watcher},
};
use tokio::{sync::Notify, task::JoinHandle};

/// Everything a pass reads, in the operator's namespace.
pub struct Caches {
    pub configs: Store<Configuration>,
    pub keys: Store<PublicKey>,
    pub clients: Store<GatewayClient>,
    pub ips: Store<IP>,
    pub conns: Store<Connection>,
    /// The gateway's key Secret only.
    pub secret: Store<Secret>,
    /// The cluster identity ConfigMap only.
    pub cluster: Store<ConfigMap>,
}

fn store<K>(
    api: Api<K>,
    cfg: watcher::Config,
    changed: &Arc<Notify>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, task) = fabric_kube::cache::notifying(api, cfg, changed.clone());
    tasks.push(task);
    reader
}

impl Caches {
    /// Starts the watches; their tasks go into `tasks`.
    pub fn start(
        client: &Client,
        ns: &str,
        key_secret: &str,
        cluster_config: &str,
        changed: &Arc<Notify>,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> Self {
        let all = watcher::Config::default;
        // Only the one object: RBAC may grant the operator just these names.
        let named =
            |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        Self {
            configs: store(Api::namespaced(client.clone(), ns), all(), changed, tasks),
            keys: store(Api::namespaced(client.clone(), ns), all(), changed, tasks),
            clients: store(Api::namespaced(client.clone(), ns), all(), changed, tasks),
            ips: store(Api::namespaced(client.clone(), ns), all(), changed, tasks),
            conns: store(Api::namespaced(client.clone(), ns), all(), changed, tasks),
            secret: store(
                Api::namespaced(client.clone(), ns),
                named(key_secret),
                changed,
                tasks,
            ),
            cluster: store(
                Api::namespaced(client.clone(), ns),
                named(cluster_config),
                changed,
                tasks,
            ),
        }
    }

    /// Resolves once every store has seen its first complete list: before that, an empty
    /// store would look like "no peers" and tear down live tunnels after a restart.
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.configs.wait_until_ready().await?;
        self.keys.wait_until_ready().await?;
        self.clients.wait_until_ready().await?;
        self.ips.wait_until_ready().await?;
        self.conns.wait_until_ready().await?;
        self.secret.wait_until_ready().await?;
        self.cluster.wait_until_ready().await
    }
}
