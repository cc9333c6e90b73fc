//! The test clusters' EndpointSlice controller: one slice per Service with a selector, as
//! `fabric_test_doubles::endpoints` computes it, applied server-side; its slices of Services that
//! went deleted (`endpoints::stale`). Watches of Services, Pods and its own slices
//! (reflector stores) and a pass over every Service after each burst of changes. Slices
//! without its managed-by label are never read nor written.
//!
//! With `FABRIC_TEST_ROOT_CA` (a PEM file), also the root CA publisher: ConfigMap
//! `kube-root-ca.crt` (`ca.crt`) in every namespace, as the controller manager keeps it.
use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use fabric_kube::cache::notifying;
use fabric_test_doubles::endpoints::{self, FIELD_MANAGER, MANAGED_BY, MANAGED_BY_LABEL};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::{reflector::Store, watcher},
};
use tokio::sync::Notify;
use tracing::{info, warn};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG)")?;
    let changed = Arc::new(Notify::new());
    let all = watcher::Config::default;
    let services = notifying(Api::<Service>::all(client.clone()), all(), changed.clone()).0;
    let pods = notifying(Api::<Pod>::all(client.clone()), all(), changed.clone()).0;
    let slices = notifying(
        Api::<EndpointSlice>::all(client.clone()),
        all().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
        changed.clone(),
    )
    .0;
    if let Some(path) = std::env::var_os("FABRIC_TEST_ROOT_CA") {
        let ca = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.to_string_lossy()))?;
        tokio::spawn(publish_root_ca(client.clone(), ca));
    }
    services.wait_until_ready().await.context("service watch")?;
    pods.wait_until_ready().await.context("pod watch")?;
    slices.wait_until_ready().await.context("slice watch")?;
    info!("watching services, pods and endpoint slices");
    // Stale slices the API would not delete (their namespace went: this API server has no
    // namespace controller to take its content with it): asked once, not at every pass.
    let mut refused = std::collections::HashSet::new();
    loop {
        pass(&client, &services, &pods, &slices, &mut refused).await;
        // Coalesce bursts of events into one pass.
        changed.notified().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// ConfigMap `kube-root-ca.crt` with `ca` in every namespace, written once per namespace
/// (by uid: one made again gets it again).
async fn publish_root_ca(client: Client, ca: String) {
    const NAME: &str = "kube-root-ca.crt";
    let changed = Arc::new(Notify::new());
    let namespaces = notifying(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
        changed.clone(),
    )
    .0;
    let mut done = std::collections::HashSet::new();
    loop {
        for ns in namespaces.state() {
            let (name, uid) = (ns.name_any(), ns.uid().unwrap_or_default());
            if ns.metadata.deletion_timestamp.is_some() || done.contains(&uid) {
                continue;
            }
            let body = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": NAME, "namespace": name},
                "data": {"ca.crt": ca},
            });
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &name);
            match api
                .patch(
                    NAME,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
            {
                Ok(_) => {
                    done.insert(uid);
                }
                Err(e) => warn!(namespace = %name, error = %e, "publishing the root CA"),
            }
        }
        tokio::select! {
            () = changed.notified() => {}
            // A namespace that refused it (terminating, or the API away) is tried again.
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

async fn pass(
    client: &Client,
    services: &Store<Service>,
    pods: &Store<Pod>,
    slices: &Store<EndpointSlice>,
    refused: &mut std::collections::HashSet<String>,
) {
    let pods = pods.state();
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| &**p).collect();
    let existing = slices.state();
    let services = services.state();
    for svc in &services {
        let Some(d) = endpoints::desired_slice(svc, &pod_refs) else {
            continue;
        };
        let (ns, name) = (svc.namespace().unwrap_or_default(), d.slice.name_any());
        let current = existing
            .iter()
            .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == name);
        if current.is_some_and(|c| endpoints::up_to_date(c, &d.slice)) {
            continue;
        }
        for n in &d.notes {
            warn!(service = %format!("{ns}/{}", svc.name_any()), "{n}");
        }
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        let mut slice = d.slice;
        slice.metadata.managed_fields = None;
        let body = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": slice.metadata,
            "addressType": slice.address_type,
            "endpoints": slice.endpoints,
            "ports": slice.ports,
        });
        match api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            Ok(_) => info!(
                slice = %format!("{ns}/{name}"),
                endpoints = slice.endpoints.iter().flatten().count(),
                ready = slice
                    .endpoints
                    .iter()
                    .flatten()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                    .count(),
                "applied"
            ),
            Err(e) => warn!(slice = %format!("{ns}/{name}"), error = %e, "applying"),
        }
    }
    let svc_refs: Vec<&Service> = services.iter().map(|s| &**s).collect();
    let stale: Vec<_> = existing
        .iter()
        .filter(|s| {
            endpoints::stale(s, &svc_refs) && !refused.contains(&s.uid().unwrap_or_default())
        })
        .collect();
    for s in stale {
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: s.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => {
                info!(slice = %format!("{ns}/{name}"), "deleted: its Service is gone")
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                refused.insert(s.uid().unwrap_or_default());
            }
            Err(e) => warn!(slice = %format!("{ns}/{name}"), error = %e, "deleting"),
        }
    }
}
