//! The test clusters' storage controllers: the PV binder and the hostpath provisioner of
//! `fabric_test_doubles::storage` (which says what they do, as upstream). This is the I/O around
//! [`storage::plan`]: watches of PVCs, PVs and StorageClasses (reflector stores), a pass after
//! each burst of changes, the PV directories made and removed under `--root`; with
//! `--default-class`, the class `standard` made at start.
use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use clap::Parser;
use fabric_kube::cache::notifying;
use fabric_test_doubles::storage::{self, Action};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::watcher,
};
use tokio::sync::Notify;
use tracing::{info, warn};

#[derive(Parser)]
#[command(about = "Test storage: PV binder and hostpath provisioner")]
struct Cli {
    /// The provisioner's volumes are directories `ROOT/<pv name>`.
    #[arg(long)]
    root: PathBuf,
    /// Make the default class `standard` at start when it is missing (the fixture's clusters
    /// have it; doing it here keeps a kubectl call off the fixture's start).
    #[arg(long)]
    default_class: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    std::fs::create_dir_all(&cli.root)
        .with_context(|| format!("creating {}", cli.root.display()))?;
    let root = std::fs::canonicalize(&cli.root)?;
    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG)")?;
    if cli.default_class {
        let class: StorageClass = serde_json::from_value(storage::default_class())?;
        match Api::<StorageClass>::all(client.clone())
            .create(&PostParams::default(), &class)
            .await
        {
            Ok(_) => info!(class = storage::DEFAULT_CLASS, "default class made"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("making the default class"),
        }
    }
    let changed = Arc::new(Notify::new());
    let all = watcher::Config::default;
    let claims = notifying(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        all(),
        changed.clone(),
    )
    .0;
    let volumes = notifying(
        Api::<PersistentVolume>::all(client.clone()),
        all(),
        changed.clone(),
    )
    .0;
    let classes = notifying(
        Api::<StorageClass>::all(client.clone()),
        all(),
        changed.clone(),
    )
    .0;
    claims.wait_until_ready().await.context("PVC watch")?;
    volumes.wait_until_ready().await.context("PV watch")?;
    classes
        .wait_until_ready()
        .await
        .context("StorageClass watch")?;
    info!(root = %root.display(), "watching claims, volumes and classes");
    loop {
        let (c, v, k) = (claims.state(), volumes.state(), classes.state());
        let plan = storage::plan(
            &c.iter().map(|x| &**x).collect::<Vec<_>>(),
            &v.iter().map(|x| &**x).collect::<Vec<_>>(),
            &k.iter().map(|x| &**x).collect::<Vec<_>>(),
            &root,
        );
        for a in plan {
            let what = format!("{a:?}");
            if let Err(e) = carry_out(&client, &root, a).await {
                warn!(action = what, error = %format!("{e:#}"), "storage");
            }
        }
        // Coalesce bursts of events into one pass; look again now and then, so a write that
        // failed is retried without a watch event.
        let _ = tokio::time::timeout(Duration::from_secs(5), changed.notified()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn carry_out(client: &Client, root: &std::path::Path, a: Action) -> Result<()> {
    let pp = PatchParams::default();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    match a {
        Action::PatchClaim {
            namespace,
            name,
            patch,
        } => {
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), &namespace)
                .patch(&name, &pp, &Patch::Merge(&patch))
                .await
                .context("patching the claim")?;
            info!(claim = %format!("{namespace}/{name}"), %patch, "claim");
        }
        Action::ClaimStatus {
            namespace,
            name,
            status,
        } => {
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), &namespace)
                .patch_status(
                    &name,
                    &pp,
                    &Patch::Merge(&serde_json::json!({ "status": status })),
                )
                .await
                .context("the claim's status")?;
            info!(claim = %format!("{namespace}/{name}"), %status, "claim status");
        }
        Action::CreateVolume { pv, dir } => {
            if let Some(dir) = &dir {
                // Only under the root: a PV of ours never names another host directory.
                anyhow::ensure!(
                    dir.starts_with(root),
                    "{} is outside the root",
                    dir.display()
                );
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            match pvs.create(&PostParams::default(), &pv).await {
                Ok(v) => info!(volume = v.metadata.name, "provisioned"),
                // Made in an earlier pass the store did not show yet.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e).context("creating the volume"),
            }
        }
        Action::PatchVolume { name, patch } => {
            pvs.patch(&name, &pp, &Patch::Merge(&patch))
                .await
                .context("patching the volume")?;
            info!(volume = name, %patch, "volume");
        }
        Action::VolumePhase { name, phase } => {
            pvs.patch_status(
                &name,
                &pp,
                &Patch::Merge(&serde_json::json!({ "status": { "phase": phase } })),
            )
            .await
            .context("the volume's status")?;
            info!(volume = name, phase, "volume phase");
        }
        Action::DeleteVolume { name, uid, dir } => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match pvs.delete(&name, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e).context("deleting the volume"),
            }
            if let Some(dir) = dir.filter(|d| d.starts_with(root)) {
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e).with_context(|| format!("removing {}", dir.display())),
                }
            }
            info!(volume = name, "deleted");
        }
    }
    Ok(())
}
