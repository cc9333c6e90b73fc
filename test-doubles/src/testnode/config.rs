//! A container's environment from ConfigMaps and Secrets (`env[].valueFrom.configMapKeyRef`,
//! `secretKeyRef`, `envFrom`), as a kubelet resolves it: read when the pod starts, and a
//! missing object or key (not `optional`) holds the container in `CreateContainerConfigError`
//! with the kubelet's message until it appears. Volumes of either kind are
//! [`super::files`]'s. Resolution is pure; [`load`] reads what it needs.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret};
use kube::{Api, Client};

/// Where values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    ConfigMap,
    Secret,
}

impl Source {
    /// As the kubelet's messages name it.
    pub fn word(self) -> &'static str {
        match self {
            Source::ConfigMap => "configmap",
            Source::Secret => "secret",
        }
    }
}

/// The objects read, by source and name; `None`: not found.
pub type Loaded = BTreeMap<(Source, String), Option<BTreeMap<String, String>>>;

/// The objects `containers` take values from.
pub fn wanted(containers: &[Container]) -> BTreeSet<(Source, String)> {
    let mut out = BTreeSet::new();
    for c in containers {
        for e in c.env.iter().flatten() {
            let Some(v) = &e.value_from else { continue };
            if let Some(r) = &v.config_map_key_ref {
                out.insert((Source::ConfigMap, r.name.clone()));
            }
            if let Some(r) = &v.secret_key_ref {
                out.insert((Source::Secret, r.name.clone()));
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                out.insert((Source::ConfigMap, r.name.clone()));
            }
            if let Some(r) = &f.secret_ref {
                out.insert((Source::Secret, r.name.clone()));
            }
        }
    }
    out
}

/// Reads `wanted` from namespace `ns`.
pub async fn load(
    client: &Client,
    ns: &str,
    wanted: &BTreeSet<(Source, String)>,
) -> kube::Result<Loaded> {
    let mut out = Loaded::new();
    for (source, name) in wanted {
        let data = match source {
            Source::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await?
                .map(|c| c.data.unwrap_or_default()),
            Source::Secret => Api::<Secret>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await?
                .map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect()
                }),
        };
        out.insert((*source, name.clone()), data);
    }
    Ok(out)
}

/// The variables `c` takes from `loaded` (`envFrom` first, then `env` in order, later ones
/// winning as in a kubelet), or the kubelet's message for what is missing.
pub fn env(c: &Container, ns: &str, loaded: &Loaded) -> Result<Vec<(String, String)>, String> {
    let object =
        |source: Source, name: &str| loaded.get(&(source, name.to_owned())).cloned().flatten();
    let mut out = Vec::new();
    for f in c.env_from.iter().flatten() {
        let (source, name, optional) = match (&f.config_map_ref, &f.secret_ref) {
            (Some(r), _) => (
                Source::ConfigMap,
                r.name.as_str(),
                r.optional.unwrap_or(false),
            ),
            (None, Some(r)) => (Source::Secret, r.name.as_str(), r.optional.unwrap_or(false)),
            (None, None) => continue,
        };
        match object(source, name) {
            Some(data) => {
                let prefix = f.prefix.clone().unwrap_or_default();
                out.extend(data.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
            }
            None if optional => {}
            None => return Err(format!("{} \"{name}\" not found", source.word())),
        }
    }
    for e in c.env.iter().flatten() {
        let Some(v) = &e.value_from else { continue };
        let (source, name, key, optional) = match (&v.config_map_key_ref, &v.secret_key_ref) {
            (Some(r), _) => (
                Source::ConfigMap,
                &r.name,
                &r.key,
                r.optional.unwrap_or(false),
            ),
            (None, Some(r)) => (Source::Secret, &r.name, &r.key, r.optional.unwrap_or(false)),
            (None, None) => continue,
        };
        match object(source, name).map(|d| d.get(key).cloned()) {
            Some(Some(value)) => out.push((e.name.clone(), value)),
            _ if optional => {}
            None => return Err(format!("{} \"{name}\" not found", source.word())),
            Some(None) => {
                let kind = match source {
                    Source::ConfigMap => "ConfigMap",
                    Source::Secret => "Secret",
                };
                return Err(format!("couldn't find key {key} in {kind} {ns}/{name}"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container() -> Container {
        serde_json::from_value(json!({
            "name": "c",
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "S_"}],
            "env": [
                {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                {"name": "MAYBE", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": true}}},
                {"name": "PLAIN", "value": "x"},
            ],
        }))
        .unwrap()
    }

    #[test]
    fn values_come_from_configmaps_and_secrets_and_what_is_missing_is_said_as_a_kubelet_does() {
        let c = container();
        let w = wanted(std::slice::from_ref(&c));
        assert_eq!(w.len(), 3);
        let mut loaded = Loaded::new();
        loaded.insert(
            (Source::ConfigMap, "settings".into()),
            Some(BTreeMap::from([("greeting".into(), "hello".into())])),
        );
        loaded.insert((Source::Secret, "gone".into()), None);
        assert_eq!(
            env(&c, "shop", &loaded).unwrap_err(),
            "secret \"db\" not found"
        );
        loaded.insert((Source::Secret, "db".into()), Some(BTreeMap::new()));
        assert_eq!(
            env(&c, "shop", &loaded).unwrap_err(),
            "couldn't find key password in Secret shop/db"
        );
        loaded.insert(
            (Source::Secret, "db".into()),
            Some(BTreeMap::from([("password".into(), "s3cret".into())])),
        );
        let got = env(&c, "shop", &loaded).unwrap();
        assert_eq!(
            got,
            vec![
                ("S_greeting".to_owned(), "hello".to_owned()),
                ("GREETING".to_owned(), "hello".to_owned()),
                ("PASSWORD".to_owned(), "s3cret".to_owned()),
            ]
        );
    }
}
