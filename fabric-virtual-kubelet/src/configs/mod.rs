//! ConfigMaps and Secrets of offloaded namespaces, reflected into their twins (issue 20): by
//! default only those the pods bound to this node reference ([`refs`]), and the namespace's
//! root CA bundle under a name of its own ([`ROOT_CA`] → [`REMOTE_ROOT_CA`]: the provider
//! publishes its own `kube-root-ca.crt` in every namespace). An object's annotation
//! [`REFLECT`] overrides that: `always` reflects it whether referenced or not, `never` keeps
//! it home even when referenced. Service-account token Secrets are never reflected (a token
//! controller on the provider would fill one in with a token of the provider's); the twin's
//! token Secrets of offloaded pods are [`crate::tokens`]', under a reserved name
//! ([`SECRET_PREFIX`]) this reflection neither writes nor sweeps.
use std::collections::BTreeMap;

use fabric_api::names::service_account_token::SECRET_PREFIX;
use fabric_reflector::mirror::Forge;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{ResourceExt, api::ObjectMeta};
use tokio::sync::watch;

pub mod refs;

use refs::Refs;

/// The annotation that says whether a ConfigMap or Secret is reflected: `always`, `never`;
/// absent (or anything else): when referenced.
pub const REFLECT: &str = "reflection.fabric.io/reflect";
/// The root CA bundle every namespace has.
pub const ROOT_CA: &str = "kube-root-ca.crt";
/// Its name in the twins.
pub const REMOTE_ROOT_CA: &str = "fabric-home.kube-root-ca.crt";

/// Whether an object is reflected, by its annotation and whether pods reference it.
pub fn reflected(meta: &ObjectMeta, referenced: bool) -> bool {
    match meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(REFLECT))
        .map(String::as_str)
    {
        Some("always") => true,
        Some("never") => false,
        _ => referenced,
    }
}

/// The labels and annotations a reflected copy carries: the home object's, without the
/// reflection annotation and what `kubectl apply` records.
pub(crate) fn meta_of(home: &ObjectMeta) -> ObjectMeta {
    let annotations: BTreeMap<String, String> = home
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| {
            k.as_str() != REFLECT
                && k.as_str() != "kubectl.kubernetes.io/last-applied-configuration"
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ObjectMeta {
        labels: home.labels.clone(),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..Default::default()
    }
}

/// What is referenced where, as [`refs::follow`] says.
pub type Referenced = watch::Receiver<Option<BTreeMap<String, Refs>>>;

fn referenced(r: &Referenced, ns: &str, pick: impl Fn(&Refs) -> bool) -> bool {
    r.borrow()
        .as_ref()
        .and_then(|m| m.get(ns))
        .is_some_and(pick)
}

/// The ConfigMaps of an offloaded namespace.
pub struct ConfigMaps(pub Referenced);

impl Forge for ConfigMaps {
    type Home = ConfigMap;
    type Remote = ConfigMap;
    const NAME: &'static str = "configmaps";

    fn forge(&self, home: &ConfigMap) -> Option<ConfigMap> {
        let (ns, name) = (home.namespace()?, home.name_any());
        let used = name == ROOT_CA || referenced(&self.0, &ns, |r| r.config_maps.contains(&name));
        reflected(&home.metadata, used).then(|| ConfigMap {
            metadata: meta_of(&home.metadata),
            data: home.data.clone(),
            binary_data: home.binary_data.clone(),
            immutable: home.immutable,
        })
    }

    fn remote_name(&self, name: &str) -> String {
        if name == ROOT_CA {
            REMOTE_ROOT_CA
        } else {
            name
        }
        .to_owned()
    }

    fn home_name(&self, name: &str) -> Option<String> {
        match name {
            // The provider's own.
            ROOT_CA => None,
            REMOTE_ROOT_CA => Some(ROOT_CA.to_owned()),
            n => Some(n.to_owned()),
        }
    }
}

/// The Secrets of an offloaded namespace.
pub struct Secrets(pub Referenced);

/// Where a home Secret under [`SECRET_PREFIX`] would be looked for in the twin: a name no
/// one writes.
const RESERVED: &str = "fabric-home.";

/// The Secret type a token controller fills in.
const TOKEN_TYPE: &str = "kubernetes.io/service-account-token";

impl Forge for Secrets {
    type Home = Secret;
    type Remote = Secret;
    const NAME: &'static str = "secrets";

    fn forge(&self, home: &Secret) -> Option<Secret> {
        if home.type_.as_deref() == Some(TOKEN_TYPE) || home.name_any().starts_with(SECRET_PREFIX) {
            return None;
        }
        let (ns, name) = (home.namespace()?, home.name_any());
        let used = referenced(&self.0, &ns, |r| r.secrets.contains(&name));
        reflected(&home.metadata, used).then(|| Secret {
            metadata: meta_of(&home.metadata),
            data: home.data.clone(),
            // Only `data`: the API server folds stringData into it.
            string_data: None,
            type_: home.type_.clone(),
            immutable: home.immutable,
        })
    }

    fn remote_name(&self, name: &str) -> String {
        // A home Secret under the reserved prefix is not reflected, and its name must not
        // lead this kind to a token Secret of the same name ("not reflected: delete ours").
        if name.starts_with(SECRET_PREFIX) {
            format!("{RESERVED}{name}")
        } else {
            name.to_owned()
        }
    }

    fn home_name(&self, name: &str) -> Option<String> {
        // The twin's token Secrets stand for no home Secret: never orphans of this kind.
        (!name.starts_with(SECRET_PREFIX) && !name.starts_with(RESERVED)).then(|| name.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    fn referencing(ns: &str, cms: &[&str], secrets: &[&str]) -> Referenced {
        let r = Refs {
            config_maps: cms.iter().map(|s| (*s).to_owned()).collect(),
            secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
        };
        watch::channel(Some(BTreeMap::from([(ns.to_owned(), r)]))).1
    }

    fn cm(name: &str, annotation: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                annotations: annotation
                    .map(|a| BTreeMap::from([(REFLECT.to_owned(), a.to_owned())])),
                labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("k".to_owned(), "v".to_owned())])),
            ..Default::default()
        }
    }

    #[test]
    fn only_what_pods_reference_is_reflected_unless_the_object_says_otherwise() {
        let f = ConfigMaps(referencing("shop", &["used"], &[]));
        let copy = f.forge(&cm("used", None)).expect("referenced");
        assert_eq!(copy.data, cm("used", None).data);
        assert_eq!(copy.metadata.labels, cm("used", None).metadata.labels);
        assert!(copy.metadata.name.is_none(), "the mirror names it");
        assert!(f.forge(&cm("unused", None)).is_none());
        assert!(f.forge(&cm("unused", Some("always"))).is_some());
        let kept = f.forge(&cm("used", Some("never")));
        assert!(kept.is_none(), "never, even referenced");
        assert!(
            f.forge(&cm(ROOT_CA, None)).is_some(),
            "the root CA bundle always"
        );
        // Another namespace's references do not count; none known yet: nothing reflected.
        let mut other = cm("used", None);
        other.metadata.namespace = Some("db".into());
        assert!(f.forge(&other).is_none());
        assert!(
            ConfigMaps(watch::channel(None).1)
                .forge(&cm("used", None))
                .is_none()
        );
    }

    #[test]
    fn the_root_ca_is_renamed_and_the_provider_s_own_is_not_ours() {
        let f = ConfigMaps(referencing("shop", &[], &[]));
        assert_eq!(f.remote_name(ROOT_CA), REMOTE_ROOT_CA);
        assert_eq!(f.home_name(REMOTE_ROOT_CA).as_deref(), Some(ROOT_CA));
        assert_eq!(f.home_name(ROOT_CA), None);
        assert_eq!(f.remote_name("x"), "x");
        assert_eq!(f.home_name("x").as_deref(), Some("x"));
    }

    #[test]
    fn referenced_secrets_are_reflected_but_never_token_secrets() {
        let f = Secrets(referencing("shop", &[], &["db", "tok"]));
        let secret = |name: &str, type_: &str| Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "password".to_owned(),
                ByteString(b"s3cret".to_vec()),
            )])),
            type_: Some(type_.into()),
            ..Default::default()
        };
        let copy = f.forge(&secret("db", "Opaque")).expect("referenced");
        assert_eq!(copy.data, secret("db", "Opaque").data);
        assert_eq!(copy.type_.as_deref(), Some("Opaque"));
        assert!(f.forge(&secret("other", "Opaque")).is_none());
        assert!(f.forge(&secret("tok", TOKEN_TYPE)).is_none());
        let reserved = format!("{SECRET_PREFIX}web.0123456789");
        assert!(f.forge(&secret(&reserved, "Opaque")).is_none());
        assert_eq!(
            f.home_name(&reserved),
            None,
            "a token Secret is not an orphan"
        );
        assert_ne!(
            f.remote_name(&reserved),
            reserved,
            "nor a copy of a home Secret"
        );
        assert_eq!(f.home_name(&f.remote_name(&reserved)), None);
        assert_eq!(f.home_name("db").as_deref(), Some("db"));
    }
}
