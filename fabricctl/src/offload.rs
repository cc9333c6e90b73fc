//! `fabricctl offload namespace` and `fabricctl unoffload namespace`: a NamespaceOffloading
//! per namespace (the consumer's sharing controllers make the twins on the providers), and
//! its progress per provider until the twins are ready, or gone. What to write, what to print
//! and when it is done are pure ([`term`], [`offloading`], [`Progress`], [`outcome`],
//! [`removal`]); the API calls are [`offload`] and [`unoffload`].
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    names::{self, field_manager, label},
    offloading::{
        namespaces::{self, twin_name},
        v1alpha1::{
            ClusterOffloading, MappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec,
            OffloadingPhase, PodOffloadingStrategy, StorageRetention, TwinPhase, VirtualNode,
        },
    },
};
use fabric_kube::meta::GoneOk;
use fabric_negotiation::namespaces::offloading;
use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};

/// What `fabricctl offload namespace` asks for, from the command line.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub names: Vec<String>,
    pub mapping: Option<MappingStrategy>,
    pub remote_name: Option<String>,
    pub pods: PodOffloadingStrategy,
    /// `--selector`, one term each.
    pub selectors: Vec<String>,
    pub retention: StorageRetention,
}

/// The field manager of what `fabricctl offload` applies.
const FIELD_MANAGER: &str = "fabricctl";

/// One `--selector` term: comma-separated requirements, ANDed: `k=v` (In), `k!=v` (NotIn),
/// `k` (Exists), `!k` (DoesNotExist), `k in (a,b)`, `k notin (a,b)`.
pub fn term(s: &str) -> Result<NodeSelectorTerm, String> {
    let mut exprs = Vec::new();
    for part in split_top(s)? {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("--selector {s:?}: an empty requirement"));
        }
        exprs.push(requirement(part).map_err(|e| format!("--selector {s:?}: {part:?}: {e}"))?);
    }
    Ok(NodeSelectorTerm {
        match_expressions: Some(exprs),
        match_fields: None,
    })
}

/// `s` split at the commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("--selector {s:?}: unbalanced parentheses"));
        }
    }
    if depth != 0 {
        return Err(format!("--selector {s:?}: unbalanced parentheses"));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn requirement(part: &str) -> Result<NodeSelectorRequirement, String> {
    let req = |key: &str, op: &str, values: Vec<String>| -> Result<_, String> {
        label_key(key)?;
        for v in &values {
            label_value(v)?;
        }
        Ok(NodeSelectorRequirement {
            key: key.to_owned(),
            operator: op.to_owned(),
            values: (!values.is_empty()).then_some(values),
        })
    };
    if let Some((k, v)) = part.split_once("!=") {
        return req(k.trim(), "NotIn", vec![v.trim().to_owned()]);
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return req(k.trim(), "In", vec![v.trim().to_owned()]);
    }
    if let Some(k) = part.strip_prefix('!') {
        return req(k.trim(), "DoesNotExist", vec![]);
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words.as_slice() {
        let rest = rest.trim();
        let (op, list) = if let Some(l) = rest.strip_prefix("notin") {
            ("NotIn", l)
        } else if let Some(l) = rest.strip_prefix("in") {
            ("In", l)
        } else {
            return Err("give k=v, k!=v, k, !k, k in (a,b) or k notin (a,b)".to_owned());
        };
        let list = list.trim();
        let Some(inner) = list.strip_prefix('(').and_then(|l| l.strip_suffix(')')) else {
            return Err(format!("{op} wants a list in parentheses: {key} in (a,b)"));
        };
        let values: Vec<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
        if values.iter().any(String::is_empty) {
            return Err("an empty value in the list".to_owned());
        }
        return req(key, op, values);
    }
    req(part, "Exists", vec![])
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric).
fn label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            });
        if !ok {
            return Err(format!(
                "{p:?} is not a DNS subdomain (a label key's prefix)"
            ));
        }
    }
    if name.is_empty() || !label_name(name) {
        return Err(format!("{k:?} is not a label key"));
    }
    Ok(())
}

fn label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || label_name(v) {
        Ok(())
    } else {
        Err(format!("{v:?} is not a label value"))
    }
}

fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The NamespaceOffloading of each name of `req`, checked: `--remote-namespace-name` with one
/// namespace only (and SelectedName, which it implies), selectors that parse.
pub fn offloadings(req: &Request) -> Result<Vec<NamespaceOffloading>> {
    if req.names.is_empty() {
        bail!("name at least one namespace to offload");
    }
    let mapping = match (req.mapping, &req.remote_name) {
        (None | Some(MappingStrategy::SelectedName), Some(_)) => MappingStrategy::SelectedName,
        (Some(m), Some(_)) => bail!(
            "--remote-namespace-name goes with --namespace-mapping-strategy SelectedName, not {m:?}"
        ),
        (Some(MappingStrategy::SelectedName), None) => {
            bail!("--namespace-mapping-strategy SelectedName needs --remote-namespace-name")
        }
        (m, None) => m.unwrap_or_default(),
    };
    if req.remote_name.is_some() && req.names.len() > 1 {
        bail!(
            "--remote-namespace-name names the twin of one namespace: offload {} one at a time",
            req.names.join(", ")
        );
    }
    if let Some(n) = &req.remote_name
        && !fabric_api::identity::is_dns_label(n)
    {
        bail!("--remote-namespace-name {n:?} is not a namespace name (a DNS label)");
    }
    let terms = req
        .selectors
        .iter()
        .map(|s| term(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let spec = NamespaceOffloadingSpec {
        namespace_mapping_strategy: mapping,
        remote_namespace_name: req.remote_name.clone(),
        pod_offloading_strategy: req.pods,
        cluster_selector: (!terms.is_empty()).then_some(NodeSelector {
            node_selector_terms: terms,
        }),
        storage_retention: req.retention,
    };
    let mut out = Vec::new();
    for name in &req.names {
        if !fabric_api::identity::is_dns_label(name) {
            bail!("{name:?} is not a namespace name");
        }
        out.push(offloading(name, spec.clone()));
    }
    Ok(out)
}

/// The NamespaceOffloading of namespace `ns`.
pub fn offloading(ns: &str, spec: NamespaceOffloadingSpec) -> NamespaceOffloading {
    let mut nso = NamespaceOffloading::new(namespaces::NAME, spec);
    nso.metadata.namespace = Some(ns.to_owned());
    nso
}

/// The objects as `-o yaml` prints them: each a YAML document ending with `---`.
pub fn to_yaml(objects: &[NamespaceOffloading]) -> Result<String> {
    let mut out = String::new();
    for o in objects {
        out.push_str(&serde_saphyr::to_string(o)?);
        out.push_str("---\n");
    }
    Ok(out)
}

/// What changed of each provider since the last look, said once per change.
#[derive(Debug, Default)]
pub struct Progress {
    seen: BTreeMap<String, (bool, Option<TwinPhase>, Option<String>)>,
}

impl Progress {
    /// Lines for the providers of `nso` whose selection or twin changed.
    pub fn observe(&mut self, nso: &NamespaceOffloading) -> Vec<String> {
        let ns = nso.namespace().unwrap_or_default();
        let mut lines = Vec::new();
        for c in clusters(nso) {
            let now = (c.selected, c.twin, c.reason.clone());
            if self.seen.get(&c.cluster_id) == Some(&now) {
                continue;
            }
            self.seen.insert(c.cluster_id.clone(), now);
            lines.push(format!("{ns}: {}", describe(c)));
        }
        lines
    }
}

fn clusters(nso: &NamespaceOffloading) -> &[ClusterOffloading] {
    nso.status
        .as_ref()
        .map(|s| s.clusters.as_slice())
        .unwrap_or_default()
}

/// One provider as a line: its twin's state and why.
pub fn describe(c: &ClusterOffloading) -> String {
    let why = match (&c.reason, &c.message) {
        (Some(r), Some(m)) => format!(": {r} ({m})"),
        (Some(r), None) => format!(": {r}"),
        (None, Some(m)) => format!(" ({m})"),
        (None, None) => String::new(),
    };
    let mark = match c.twin {
        Some(TwinPhase::Ready) => "✓",
        Some(TwinPhase::Refused) => "✗",
        _ => "…",
    };
    let state = match (c.selected, c.twin) {
        (false, None) => "not selected".to_owned(),
        (false, Some(t)) => format!("not selected, twin {t:?}"),
        (true, Some(t)) => format!("twin {t:?}"),
        (true, None) => "selected".to_owned(),
    };
    format!("{mark} provider {} {state}{why}", c.cluster_id)
}

/// Where an offload stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not answered for the current generation yet, or twins still being made.
    Waiting,
    /// Done (the line to print).
    Ready(String),
    /// Done, but something to warn about.
    Warn(String),
    /// The providers refused (each one's reason).
    Failed(String),
}

/// Where `nso` stands, as the controller last said for its current generation.
pub fn outcome(nso: &NamespaceOffloading) -> Outcome {
    let ns = nso.namespace().unwrap_or_default();
    let Some(st) = nso.status.as_ref() else {
        return Outcome::Waiting;
    };
    if st.observed_generation != nso.metadata.generation {
        return Outcome::Waiting;
    }
    let twin = st.remote_namespace_name.as_deref().unwrap_or_default();
    let selected: Vec<&ClusterOffloading> = st.clusters.iter().filter(|c| c.selected).collect();
    let refusals = || {
        selected
            .iter()
            .filter(|c| c.twin == Some(TwinPhase::Refused))
            .map(|c| describe(c))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let note = st
        .message
        .as_deref()
        .map(|m| format!(" ({m})"))
        .unwrap_or_default();
    match st.phase {
        Some(OffloadingPhase::Ready) => {
            let to: Vec<&str> = selected.iter().map(|c| c.cluster_id.as_str()).collect();
            Outcome::Ready(format!(
                "✓ {ns} offloaded to {} as {twin}{note}",
                to.join(", ")
            ))
        }
        Some(OffloadingPhase::NoClusterSelected) => Outcome::Warn(format!(
            "! {ns}: the selector selects no provider: nothing is offloaded until one matches{note}"
        )),
        Some(OffloadingPhase::AllFailed) => Outcome::Failed(format!(
            "{ns}: every selected provider refused the twin {twin}: {}",
            refusals()
        )),
        Some(OffloadingPhase::SomeFailed) => Outcome::Failed(format!(
            "{ns}: some providers refused the twin {twin}: {}",
            refusals()
        )),
        _ => Outcome::Waiting,
    }
}

/// What an unoffload of `nso` removes on each provider with a twin: the twin with its content,
/// and the namespace's pods running on its virtual node (`pods` by provider id), which end
/// Failed.
pub fn removal(nso: &NamespaceOffloading, pods: &BTreeMap<String, usize>) -> Vec<String> {
    let ns = nso.namespace().unwrap_or_default();
    let twin = nso
        .status
        .as_ref()
        .and_then(|s| s.remote_namespace_name.clone())
        .or_else(|| twin_name(&nso.spec, &ns, "<this cluster>"))
        .unwrap_or_default();
    let mut lines = Vec::new();
    for c in clusters(nso).iter().filter(|c| c.twin.is_some()) {
        let n = pods.get(&c.cluster_id).copied().unwrap_or_default();
        lines.push(offloading::removal(nso, &twin, &c.cluster_id, Some(n)));
    }
    if lines.is_empty() {
        lines.push(format!(
            "{ns} has no twin on any provider: nothing is removed there"
        ));
    }
    lines
}

async fn set_label(local: &Client, ns: &str, enabled: bool) -> Result<()> {
    let api: Api<Namespace> = Api::all(local.clone());
    let patch = serde_json::json!({
        "metadata": { "labels": { label::SCHEDULING_ENABLED: enabled.then_some("true") } }
    });
    let params = PatchParams {
        field_manager: Some(field_manager::NAMESPACE_OFFLOADING.to_owned()),
        ..Default::default()
    };
    api.patch(ns, &params, &Patch::Merge(&patch))
        .await
        .with_context(|| format!("labelling namespace {ns}"))?;
    Ok(())
}

/// This cluster's providers as selectors see them (their virtual nodes' labels), and the
/// provider of each virtual node, by node name.
async fn providers(
    local: &Client,
    fabric_ns: &str,
) -> Result<(offloading::Providers, BTreeMap<String, String>)> {
    let vns = Api::<VirtualNode>::namespaced(local.clone(), fabric_ns)
        .list(&ListParams::default())
        .await
        .context("listing the virtual nodes")?
        .items;
    let virtual_only = format!("{}={}", label::NODE_TYPE, label::VIRTUAL_NODE_TYPE);
    let nodes: BTreeMap<String, BTreeMap<String, String>> = Api::<Node>::all(local.clone())
        .list(&ListParams::default().labels(&virtual_only))
        .await
        .context("listing the virtual nodes' Nodes")?
        .items
        .into_iter()
        .map(|n| (n.name_any(), n.labels().clone()))
        .collect();
    let all = offloading::providers(&vns, |name| nodes.get(name).cloned());
    let by_node = vns
        .into_iter()
        .map(|v| (v.spec.node_name, v.spec.cluster_id))
        .collect();
    Ok((all, by_node))
}

/// How many pods of `ns` run on each provider's virtual node (`nodes`: the provider of each,
/// by node name; else as `nso`'s status names them).
async fn pods_by_provider(
    local: &Client,
    ns: &str,
    nodes: &BTreeMap<String, String>,
    nso: &NamespaceOffloading,
) -> Result<BTreeMap<String, usize>> {
    let pods: Api<Pod> = Api::namespaced(local.clone(), ns);
    let mut count = BTreeMap::new();
    for p in pods.list(&ListParams::default()).await?.items {
        let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
        let provider = nodes.get(&node).cloned().or_else(|| {
            clusters(nso)
                .iter()
                .find(|c| names::node::virtual_node(&c.cluster_id) == node)
                .map(|c| c.cluster_id.clone())
        });
        if let Some(provider) = provider {
            *count.entry(provider).or_insert(0usize) += 1;
        }
    }
    Ok(count)
}

/// What applying `new` over `old` (the NamespaceOffloading there) removes: a line for each
/// provider the new selector drops, saying what goes there.
async fn dropped(
    local: &Client,
    (all, nodes): &(offloading::Providers, BTreeMap<String, String>),
    old: &NamespaceOffloading,
    new: &NamespaceOffloading,
) -> Result<Vec<String>> {
    let before = clusters(old);
    if before.iter().all(|c| c.twin.is_none()) {
        return Ok(Vec::new());
    }
    // A selector the controller cannot evaluate keeps what the status says: as it will.
    let mut judged = new.clone();
    judged.status = old.status.clone();
    let (chosen, _) = offloading::selected(&judged, all);
    let gone = offloading::deselected(before, &chosen, all);
    if gone.is_empty() {
        return Ok(Vec::new());
    }
    let ns = old.namespace().unwrap_or_default();
    let pods = pods_by_provider(local, &ns, nodes, old).await?;
    let twin = old
        .status
        .as_ref()
        .and_then(|s| s.remote_namespace_name.clone())
        .unwrap_or_default();
    Ok(gone
        .iter()
        .map(|id| {
            let n = pods.get(id).copied().unwrap_or_default();
            format!(
                "the new selector drops {id}: {}",
                offloading::removal(new, &twin, id, Some(n))
            )
        })
        .collect())
}

/// `fabricctl offload namespace`: labels each namespace first (pods created meanwhile go
/// through the webhook), applies its NamespaceOffloading, then follows each until Ready. A
/// selector that drops a provider with a twin is said first, with what goes there.
pub async fn offload(
    local: Client,
    fabric_ns: &str,
    req: Request,
    yaml: bool,
    timeout: Duration,
) -> Result<()> {
    let objects = offloadings(&req)?;
    if yaml {
        print!("{}", to_yaml(&objects)?);
        return Ok(());
    }
    let nss: Api<Namespace> = Api::all(local.clone());
    for o in &objects {
        let ns = o.namespace().unwrap_or_default();
        if nss.get_opt(&ns).await?.is_none() {
            bail!("namespace {ns} does not exist: create it first (nothing was offloaded)");
        }
    }
    // Read once: what a new selector drops, and which pods run on virtual nodes already.
    let seen = providers(&local, fabric_ns).await?;
    for o in &objects {
        let ns = o.namespace().unwrap_or_default();
        let api: Api<NamespaceOffloading> = Api::namespaced(local.clone(), &ns);
        let old = api.get_opt(namespaces::NAME).await?;
        let existed = old.is_some();
        if let Some(old) = &old {
            for line in dropped(&local, &seen, old, o).await? {
                println!("{ns}: {line}");
            }
        }
        let enabled = offloading::scheduling_enabled(o.spec.pod_offloading_strategy);
        if enabled {
            set_label(&local, &ns, true).await?;
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if let Err(e) = api.patch(namespaces::NAME, &params, &Patch::Apply(o)).await {
            if enabled && !existed {
                // No NamespaceOffloading: the label alone would have the webhook refuse pods.
                set_label(&local, &ns, false).await?;
            }
            bail!("offloading {ns}: {e}");
        }
        if enabled {
            let nodes = &seen.1;
            let pods = Api::<Pod>::namespaced(local.clone(), &ns)
                .list(&ListParams::default())
                .await
                .with_context(|| format!("listing the pods of {ns}"))?
                .items;
            let left: Vec<String> = offloading::not_placed(&pods, |n| nodes.contains_key(n))
                .iter()
                .map(|p| p.name_any())
                .collect();
            if !left.is_empty() {
                println!(
                    "! {ns}: {} pod(s) created before it was offloaded stay where they run \
                     ({}): create them again (for a Deployment: kubectl rollout restart) for \
                     the strategy to place them",
                    left.len(),
                    left.join(", ")
                );
            }
        }
        println!("… {ns}: NamespaceOffloading applied, waiting for the providers");
    }
    follow(&local, &objects, timeout).await
}

async fn follow(local: &Client, objects: &[NamespaceOffloading], timeout: Duration) -> Result<()> {
    let t0 = Instant::now();
    let mut progress: Vec<Progress> = objects.iter().map(|_| Progress::default()).collect();
    let mut done = vec![false; objects.len()];
    let mut failures = Vec::new();
    loop {
        for (i, o) in objects.iter().enumerate() {
            if done[i] {
                continue;
            }
            let ns = o.namespace().unwrap_or_default();
            let api: Api<NamespaceOffloading> = Api::namespaced(local.clone(), &ns);
            let Some(now) = api.get_opt(namespaces::NAME).await? else {
                bail!("the NamespaceOffloading of {ns} was deleted meanwhile");
            };
            for line in progress[i].observe(&now) {
                println!("{line}");
            }
            match outcome(&now) {
                Outcome::Waiting => {
                    if t0.elapsed() >= timeout {
                        let phase = now.status.as_ref().and_then(|s| s.phase);
                        bail!(
                            "{ns} is not offloaded within {}s (phase {phase:?}); the controllers \
                             keep trying: `kubectl get nsoff -n {ns} -o yaml` shows each provider",
                            timeout.as_secs()
                        );
                    }
                }
                Outcome::Ready(line) | Outcome::Warn(line) => {
                    println!("{line}");
                    done[i] = true;
                }
                Outcome::Failed(why) => {
                    failures.push(why);
                    done[i] = true;
                }
            }
        }
        if done.iter().all(|d| *d) {
            if failures.is_empty() {
                return Ok(());
            }
            bail!("{}", failures.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `fabricctl unoffload namespace`: says what goes on each provider, deletes each
/// NamespaceOffloading and waits until they are gone (the twins removed).
pub async fn unoffload(
    local: Client,
    fabric_ns: &str,
    names: &[String],
    timeout: Duration,
) -> Result<()> {
    let (_, nodes) = providers(&local, fabric_ns).await?;
    let mut found = Vec::new();
    for ns in names {
        let api: Api<NamespaceOffloading> = Api::namespaced(local.clone(), ns);
        let Some(nso) = api.get_opt(namespaces::NAME).await? else {
            bail!("namespace {ns} is not offloaded (no NamespaceOffloading there)");
        };
        let count = pods_by_provider(&local, ns, &nodes, &nso).await?;
        for line in removal(&nso, &count) {
            println!("{ns}: {line}");
        }
        found.push((ns.clone(), api));
    }
    for (ns, api) in &found {
        api.delete(namespaces::NAME, &DeleteParams::default())
            .await
            .gone_ok()
            .with_context(|| format!("deleting the NamespaceOffloading of {ns}"))?;
    }
    let t0 = Instant::now();
    for (ns, api) in &found {
        let mut progress = Progress::default();
        loop {
            let Some(now) = api.get_opt(namespaces::NAME).await? else {
                println!("✓ {ns} unoffloaded");
                break;
            };
            for line in progress.observe(&now) {
                println!("{line}");
            }
            if t0.elapsed() >= timeout {
                let left: Vec<String> = clusters(&now).iter().map(describe).collect();
                bail!(
                    "{ns} is not unoffloaded within {}s; still waiting for: {}",
                    timeout.as_secs(),
                    left.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
