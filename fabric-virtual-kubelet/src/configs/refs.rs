//! Which ConfigMaps and Secrets the pods bound to this node reference (volumes, projected
//! volumes, `env`, `envFrom`, `imagePullSecrets`), per namespace: by default only those are
//! reflected into the twins (issue 20 ★: an offloaded namespace's other configuration, its
//! other credentials above all, stays home). Pure, and the watch that keeps it.
use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, PodSpec};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;
use tracing::warn;

/// What the pods of one namespace reference.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refs {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
}

impl Refs {
    fn env(
        &mut self,
        env: &Option<Vec<k8s_openapi::api::core::v1::EnvVar>>,
        from: &Option<Vec<k8s_openapi::api::core::v1::EnvFromSource>>,
    ) {
        for e in env.iter().flatten() {
            let Some(v) = &e.value_from else { continue };
            if let Some(r) = &v.config_map_key_ref {
                self.config_maps.insert(r.name.clone());
            }
            if let Some(r) = &v.secret_key_ref {
                self.secrets.insert(r.name.clone());
            }
        }
        for f in from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                self.config_maps.insert(r.name.clone());
            }
            if let Some(r) = &f.secret_ref {
                self.secrets.insert(r.name.clone());
            }
        }
    }

    fn container(&mut self, c: &Container) {
        self.env(&c.env, &c.env_from);
    }

    fn ephemeral(&mut self, c: &EphemeralContainer) {
        self.env(&c.env, &c.env_from);
    }

    /// Adds what `spec` references.
    pub fn add(&mut self, spec: &PodSpec) {
        for v in spec.volumes.iter().flatten() {
            if let Some(cm) = &v.config_map {
                self.config_maps.insert(cm.name.clone());
            }
            if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
                self.secrets.insert(s);
            }
            for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
                if let Some(cm) = &p.config_map {
                    self.config_maps.insert(cm.name.clone());
                }
                if let Some(s) = &p.secret {
                    self.secrets.insert(s.name.clone());
                }
            }
        }
        spec.containers.iter().for_each(|c| self.container(c));
        spec.init_containers
            .iter()
            .flatten()
            .for_each(|c| self.container(c));
        spec.ephemeral_containers
            .iter()
            .flatten()
            .for_each(|c| self.ephemeral(c));
        for s in spec.image_pull_secrets.iter().flatten() {
            self.secrets.insert(s.name.clone());
        }
    }
}

/// What `pods` (of one namespace) reference together.
pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Refs {
    let mut r = Refs::default();
    for p in pods {
        if let Some(spec) = &p.spec {
            r.add(spec);
        }
    }
    r
}

/// What the pods bound to node `node` reference, per namespace, as their watch sees them
/// (`None` until it has listed: nothing is concluded from an unlisted cache). Each event
/// recounts only its pod's namespace.
pub fn follow(local: Client, node: &str) -> watch::Receiver<Option<BTreeMap<String, Refs>>> {
    let (tx, rx) = watch::channel(None);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let stream = watcher(Api::<Pod>::all(local), config).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // Per namespace, what each pod references.
        type Pods = BTreeMap<String, BTreeMap<String, Refs>>;
        let (mut pods, mut listing): (Pods, Option<Pods>) = (Pods::new(), None);
        let total = |of: &BTreeMap<String, Refs>| {
            let mut r = Refs::default();
            for p in of.values() {
                r.config_maps.extend(p.config_maps.iter().cloned());
                r.secrets.extend(p.secrets.iter().cloned());
            }
            r
        };
        let key = |p: &Pod| (p.namespace().unwrap_or_default(), p.name_any());
        while let Some(ev) = stream.next().await {
            let touched = match ev {
                Err(e) => {
                    warn!(error = %e, "watching the node's pods for their references");
                    continue;
                }
                Ok(watcher::Event::Init) => {
                    listing = Some(Pods::new());
                    continue;
                }
                Ok(watcher::Event::InitApply(p)) => {
                    let (ns, name) = key(&p);
                    if let Some(l) = listing.as_mut() {
                        l.entry(ns).or_default().insert(name, of([&p]));
                    }
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    pods = listing.take().unwrap_or_default();
                    None
                }
                Ok(watcher::Event::Apply(p)) => {
                    let (ns, name) = key(&p);
                    pods.entry(ns.clone()).or_default().insert(name, of([&p]));
                    Some(ns)
                }
                Ok(watcher::Event::Delete(p)) => {
                    let (ns, name) = key(&p);
                    if let Some(m) = pods.get_mut(&ns) {
                        m.remove(&name);
                        if m.is_empty() {
                            pods.remove(&ns);
                        }
                    }
                    Some(ns)
                }
            };
            tx.send_if_modified(|v: &mut Option<BTreeMap<String, Refs>>| {
                match (touched, v.as_mut()) {
                    // One namespace changed.
                    (Some(ns), Some(all)) => {
                        let now = pods.get(&ns).map(total);
                        let changed = all.get(&ns) != now.as_ref();
                        match now {
                            Some(r) => all.insert(ns, r),
                            None => all.remove(&ns),
                        };
                        changed
                    }
                    // Listed (again): everything.
                    _ => {
                        let now: BTreeMap<String, Refs> =
                            pods.iter().map(|(ns, m)| (ns.clone(), total(m))).collect();
                        let changed = v.as_ref() != Some(&now);
                        *v = Some(now);
                        changed
                    }
                }
            });
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_way_a_pod_references_configuration_counts() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-vol"}},
                    {"name": "b", "secret": {"secretName": "s-vol"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "cm-proj"}}, {"secret": {"name": "s-proj"}},
                        {"serviceAccountToken": {"path": "t"}}]}},
                    {"name": "d", "emptyDir": {}},
                ],
                "imagePullSecrets": [{"name": "s-pull"}],
                "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "cm-init"}}]}],
                "containers": [{"name": "m",
                    "env": [
                        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "k"}}},
                        {"name": "C", "value": "plain"}],
                    "envFrom": [{"secretRef": {"name": "s-from"}}]}],
            }
        }))
        .unwrap();
        let r = of([&pod]);
        let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
        assert_eq!(
            r.config_maps,
            set(&["cm-env", "cm-init", "cm-proj", "cm-vol"])
        );
        assert_eq!(
            r.secrets,
            set(&["s-env", "s-from", "s-proj", "s-pull", "s-vol"])
        );
        assert_eq!(of([]), Refs::default());
    }
}
