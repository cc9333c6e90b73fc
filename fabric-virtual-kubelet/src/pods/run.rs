//! The pod kind registered on the reflection framework: the home pods bound to this node
//! reflected into the tenant namespace on the provider (reached through the identity, a new
//! client whenever the identity Secret changes: [`crate::provider::endpoints`]), resynced
//! when the node's readiness or the peer's Configuration (the remap of its pod CIDR) changes.
use std::{sync::Arc, time::Duration};

use anyhow::Result;
use fabric_api::{names, networking::v1alpha1::Configuration};
use fabric_kube::events::Events;
use fabric_reflector::{Metrics, Options, Pair, Reachability, Reflection};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use tokio::sync::watch;

use super::kind::Pods;

/// Pods synced at the same time (each a few calls to either API).
const SYNCS: usize = 32;

/// Whether the node is Ready (the provider and the tunnel answer), and why not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Readiness {
    pub ready: bool,
    pub message: String,
    /// Under at-most-once semantics, once the provider has stopped the pods for sure: why
    /// they are Failed here ([`crate::heartbeat::declared`]).
    pub partitioned: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Opts {
    pub node_name: String,
    /// The node's address: every offloaded pod's hostIP.
    pub node_ip: String,
    /// The provider's cluster id: the name of its Configuration.
    pub provider_id: String,
    /// Where the peer's Configuration is.
    pub fabric_namespace: String,
    /// How often every pod is looked at again (a ShadowPod deleted while the provider's
    /// watch was down, a quota that freed up).
    pub resync: Duration,
}

/// Whether the provider answers, as the node's readiness says (not known before the node
/// loop has said it once).
fn reachability(ready: &Option<Readiness>) -> Reachability {
    match ready {
        None => Reachability::Unknown,
        Some(r) if r.ready => Reachability::Reachable,
        Some(_) => Reachability::Unreachable,
    }
}

/// [`reachability`] of every readiness `ready` says.
fn follow_reachability(
    mut ready: watch::Receiver<Option<Readiness>>,
) -> watch::Receiver<Reachability> {
    let (tx, rx) = watch::channel(reachability(&ready.borrow_and_update()));
    tokio::spawn(async move {
        while ready.changed().await.is_ok() {
            let now = reachability(&ready.borrow_and_update());
            tx.send_if_modified(|r| std::mem::replace(r, now) != now);
        }
    });
    rx
}

/// Reflects the pods bound to the node until a reflector ends (it does not).
pub async fn run(
    local: Client,
    opts: Opts,
    secret: watch::Receiver<Option<Secret>>,
    ready: watch::Receiver<Option<Readiness>>,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let endpoints = crate::provider::endpoints(secret, opts.provider_id.clone());
    let config = crate::run::follow(
        Api::<Configuration>::namespaced(local.clone(), &opts.fabric_namespace),
        &opts.provider_id,
    );
    let events = Events::new(
        local.clone(),
        names::field_manager::VIRTUAL_KUBELET,
        Some(opts.node_name.clone()),
    );
    let pods = Pods {
        node_name: opts.node_name,
        node_ip: opts.node_ip,
        ready: ready.clone(),
        config: config.clone(),
    };
    let options = Options::new(SYNCS, opts.resync)
        .resync_on(config)
        .resync_on(ready.clone());
    let mut reflection = Reflection::new(
        local,
        events,
        metrics,
        endpoints,
        follow_reachability(ready),
    );
    reflection.register(pods, options);
    reflection.start(Pair::everywhere_to_tenant());
    anyhow::bail!("{}", reflection.failure().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_answers_as_the_node_is_ready() {
        assert_eq!(reachability(&None), Reachability::Unknown);
        let r = |ready| {
            Some(Readiness {
                ready,
                ..Default::default()
            })
        };
        assert_eq!(reachability(&r(true)), Reachability::Reachable);
        assert_eq!(reachability(&r(false)), Reachability::Unreachable);
    }
}
