//! The Kubernetes rights `deploy/` gives each fabric component, on a test API server: its
//! ServiceAccounts, Roles, ClusterRoles, their bindings and the ValidatingAdmissionPolicies
//! that confine them, taken from the rendered kustomization itself (not a copy), and a
//! kubeconfig holding a token of one component's ServiceAccount and nothing else. A fixture
//! that starts a component with [`component_kubeconfig`] runs it with exactly what the
//! manifests grant (the test API server enforces RBAC and admission policies with
//! `KUBELITE_AUTH=1`), so a rule missing from `deploy/` fails a test.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, ensure};
use serde_json::{Value, json};

use crate::{apiserver::ApiServer, manifests::Manifests};

/// The kinds of `deploy/` that make up the components' rights.
const KINDS: [&str; 7] = [
    "ServiceAccount",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// What installs them.
const FIELD_MANAGER: &str = "fabric-tests-rights";

/// The objects of `deploy/` (rendered as [`Manifests::render`] does) that grant or confine
/// the components' rights, with the ConfigMaps those policies take as params.
pub fn objects(api: &ApiServer) -> Result<Vec<Value>> {
    let rendered = Manifests::rendered(api)?;
    // The ConfigMaps the policies read as their params: a binding whose params are missing
    // denies everything it matches.
    let params: Vec<&str> = rendered
        .iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
        .filter_map(|o| o["spec"]["paramRef"]["name"].as_str())
        .collect();
    let param = |o: &Value| {
        o["kind"] == "ConfigMap"
            && params.contains(&o["metadata"]["name"].as_str().unwrap_or_default())
    };
    Ok(rendered
        .iter()
        .filter(|o| KINDS.contains(&o["kind"].as_str().unwrap_or_default()) || param(o))
        .cloned()
        .collect())
}

/// Installs the rights of every component of `deploy/` on `api` (server-side apply, so again
/// is a no-op), with the namespaces they live in.
pub fn install(api: &ApiServer) -> Result<()> {
    // Once per running API server in a test process (each component's kubeconfig asks for
    // them): keyed by its daemons' pids, so a restarted server (its etcd data wiped) gets
    // them again.
    static DONE: std::sync::Mutex<Vec<(PathBuf, Vec<i32>)>> = std::sync::Mutex::new(Vec::new());
    let key = (api.kubeconfig.clone(), api.daemon_pids());
    let done = || DONE.lock().unwrap_or_else(|e| e.into_inner());
    if !key.1.is_empty() && done().contains(&key) {
        return Ok(());
    }
    // Not under the lock: several API servers take theirs at once (two installs on one
    // server would both apply the same objects, which is harmless).
    install_now(api)?;
    done().push(key);
    Ok(())
}

fn install_now(api: &ApiServer) -> Result<()> {
    let objects = objects(api)?;
    let mut namespaces: Vec<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let namespaces: Vec<Value> = namespaces
        .into_iter()
        .map(|ns| json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } }))
        .collect();
    for items in [namespaces, objects] {
        crate::kube_sync::apply(&api.kubeconfig, FIELD_MANAGER, true, &items)
            .context("installing the rights of deploy/")?;
    }
    Ok(())
}

/// A copy of `kubeconfig` whose only credential is a token of ServiceAccount `namespace/name`
/// (TokenRequest, requested with `admin`), written to `out`.
pub fn token_kubeconfig(
    admin: &Path,
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    out: &Path,
) -> Result<()> {
    let token = crate::kube_sync::token(admin, namespace, name, 24 * 3600)?;
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    // kubelite's start script writes the user as one flow mapping on one line.
    let mut found = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("user: {") {
                found = true;
                format!("  user: {{token: \"{token}\"}}")
            } else {
                l.to_owned()
            }
        })
        .collect();
    ensure!(found, "{} has no `user:` line", kubeconfig.display());
    std::fs::write(out, lines.join("\n") + "\n")
        .with_context(|| format!("writing {}", out.display()))
}

/// The rights of `deploy/` installed on `api`, and a kubeconfig at `out` (for the host
/// namespace) that is ServiceAccount `service_account` of `fabric-system` and nothing else:
/// what the component's pod would hold.
pub fn component_kubeconfig(
    api: &ApiServer,
    service_account: &str,
    out: impl Into<PathBuf>,
) -> Result<PathBuf> {
    install(api)?;
    let out = out.into();
    token_kubeconfig(
        &api.kubeconfig,
        &api.kubeconfig,
        fabric_api::names::DEFAULT_NAMESPACE,
        service_account,
        &out,
    )?;
    Ok(out)
}

/// A client of `api` that is ServiceAccount `service_account` of `fabric-system` and nothing
/// else ([`component_kubeconfig`], written to `out`), for components a test runs in-process.
pub async fn component_client(
    api: &ApiServer,
    service_account: &str,
    out: impl Into<PathBuf>,
) -> Result<kube::Client> {
    let path = component_kubeconfig(api, service_account, out)?;
    let kc = kube::config::Kubeconfig::read_from(&path)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}
