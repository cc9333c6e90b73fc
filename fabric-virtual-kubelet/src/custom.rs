//! The custom kinds this virtual kubelet reflects into its twins (`--reflect-custom-resource`,
//! issue 20), resolved through the home cluster's discovery to the [`ApiResource`] the
//! reflector works with ([`fabric_reflector::custom`]). Namespaced kinds only: a twin is a
//! namespace.
use fabric_api::reflection::CustomResource;
use kube::{
    Client,
    core::GroupVersion,
    discovery::{self, ApiCapabilities, ApiResource, Scope},
};

/// Why a `--reflect-custom-resource` value cannot be reflected.
#[derive(Debug, thiserror::Error)]
pub enum Unresolved {
    #[error(
        "--reflect-custom-resource {0}: this cluster does not serve it (no such group, version or resource; is its CustomResourceDefinition installed?)"
    )]
    NotServed(CustomResource),
    #[error(
        "--reflect-custom-resource {0}: it is cluster-scoped; only namespaced kinds are reflected into twin namespaces"
    )]
    ClusterScoped(CustomResource),
    #[error("--reflect-custom-resource {flag}: asking this cluster's discovery: {source}")]
    Discovery {
        flag: CustomResource,
        #[source]
        source: Box<kube::Error>,
    },
}

/// The resource `cr` names among those its group version serves (pure).
pub fn pick(
    cr: &CustomResource,
    served: Vec<(ApiResource, ApiCapabilities)>,
) -> Result<ApiResource, Unresolved> {
    let (ar, caps) = served
        .into_iter()
        .find(|(ar, _)| ar.plural == cr.plural)
        .ok_or_else(|| Unresolved::NotServed(cr.clone()))?;
    match caps.scope {
        Scope::Namespaced => Ok(ar),
        Scope::Cluster => Err(Unresolved::ClusterScoped(cr.clone())),
    }
}

/// Resolves `cr` through `client`'s discovery.
pub async fn resolve(client: &Client, cr: &CustomResource) -> Result<ApiResource, Unresolved> {
    let gv = GroupVersion::gv(&cr.group, &cr.version);
    match discovery::oneshot::pinned_group(client, &gv).await {
        Ok(group) => pick(cr, group.versioned_resources(&cr.version)),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Unresolved::NotServed(cr.clone())),
        Err(source) => Err(Unresolved::Discovery {
            flag: cr.clone(),
            source: Box::new(source),
        }),
    }
}

impl Unresolved {
    /// The flag value it is about.
    pub fn flag(&self) -> &CustomResource {
        match self {
            Unresolved::NotServed(f) | Unresolved::ClusterScoped(f) => f,
            Unresolved::Discovery { flag, .. } => flag,
        }
    }
}

/// Each of `crs`, resolved or not and why. A kind that does not resolve (its CRD not
/// installed yet, discovery not answering) costs only that kind: the virtual node and the
/// other kinds go on, and [`served_at_last`] looks again.
pub async fn resolve_each(
    client: &Client,
    crs: &[CustomResource],
) -> (Vec<ApiResource>, Vec<Unresolved>) {
    let mut resolved = Vec::with_capacity(crs.len());
    let mut unresolved = Vec::new();
    for cr in crs {
        match resolve(client, cr).await {
            Ok(ar) => resolved.push(ar),
            Err(e) => unresolved.push(e),
        }
    }
    (resolved, unresolved)
}

/// How often the kinds that did not resolve at start are looked up again.
pub const LOOK_AGAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Returns the first of `pending` that resolves now, looking every [`LOOK_AGAIN`]; never
/// returns when `pending` is empty. The reflectors are set up at start, so the caller
/// restarts the process to take the kind up (as a rollout would; the Node stays as it is).
pub async fn served_at_last(client: Client, pending: Vec<CustomResource>) -> CustomResource {
    if pending.is_empty() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(LOOK_AGAIN).await;
        for cr in &pending {
            if resolve(&client, cr).await.is_ok() {
                return cr.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::GroupVersionKind;

    use super::*;

    fn served(plural: &str, scope: Scope) -> (ApiResource, ApiCapabilities) {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.com", "v1", "Widget"),
            plural,
        );
        let caps = ApiCapabilities {
            scope,
            subresources: vec![],
            operations: vec![],
        };
        (ar, caps)
    }

    #[test]
    fn a_namespaced_kind_resolves_and_others_say_why_naming_the_flag() {
        let cr: CustomResource = "widgets.example.com/v1".parse().unwrap();
        let ar = pick(
            &cr,
            vec![
                served("gadgets", Scope::Namespaced),
                served("widgets", Scope::Namespaced),
            ],
        )
        .unwrap();
        assert_eq!(
            (ar.plural.as_str(), ar.kind.as_str()),
            ("widgets", "Widget")
        );
        let e = pick(&cr, vec![served("gadgets", Scope::Namespaced)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("--reflect-custom-resource widgets.example.com/v1"),
            "{e}"
        );
        assert!(e.to_string().contains("does not serve it"), "{e}");
        let e = pick(&cr, vec![served("widgets", Scope::Cluster)]).unwrap_err();
        assert!(e.to_string().contains("only namespaced kinds"), "{e}");
    }
}
