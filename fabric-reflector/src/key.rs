//! What a reflector works on: [`Key`]s of home objects, and the [`Pair`] of namespaces it
//! reflects between.
use std::fmt;

use kube::{Client, Resource};

/// A home object: its namespace and name at home. Every sync is of one key, whichever side
/// changed: an event on a remote object is looked at as the key of the home object it stands
/// for ([`crate::Kind::key_of`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of home object `obj` (a namespaced object has both).
    pub fn of<K: Resource>(obj: &K) -> Self {
        let meta = obj.meta();
        Self::new(
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where a reflector works: the home namespace it watches and the remote namespace its
/// objects go to. Started and stopped as a whole ([`crate::Reflection::start`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pair {
    /// The home namespace; `None`: every namespace (narrowed by the kind's
    /// [`crate::Kind::watch_home`], as the pods bound to one node are).
    pub home: Option<String>,
    /// The remote namespace; `None`: the remote client's default namespace (the tenant
    /// namespace its kubeconfig names).
    pub remote: Option<String>,
}

impl Pair {
    /// Home namespace `home` and its twin `remote`.
    pub fn namespaces(home: impl Into<String>, remote: impl Into<String>) -> Self {
        Self {
            home: Some(home.into()),
            remote: Some(remote.into()),
        }
    }

    /// Every home namespace, into the remote client's default namespace.
    pub fn everywhere_to_tenant() -> Self {
        Self {
            home: None,
            remote: None,
        }
    }

    /// The remote namespace as reached through `client`.
    pub fn remote_namespace<'a>(&'a self, client: &'a Client) -> &'a str {
        self.remote
            .as_deref()
            .unwrap_or_else(|| client.default_namespace())
    }
}

impl fmt::Display for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {}",
            self.home.as_deref().unwrap_or("*"),
            self.remote.as_deref().unwrap_or("(tenant)")
        )
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    #[test]
    fn a_key_is_the_home_namespace_and_name() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("settings".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let k = Key::of(&cm);
        assert_eq!(k, Key::new("shop", "settings"));
        assert_eq!(k.to_string(), "shop/settings");
    }

    #[test]
    fn pairs_name_both_sides() {
        assert_eq!(
            Pair::namespaces("shop", "shop-alpha").to_string(),
            "shop -> shop-alpha"
        );
        assert_eq!(Pair::everywhere_to_tenant().to_string(), "* -> (tenant)");
    }
}
