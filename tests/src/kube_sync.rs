//! Blocking Kubernetes API calls for the tests' own steps, made in-process: what the tests
//! asked a `kubectl` process for. Measured over a whole CI run (BSD process accounting), 2,700
//! `kubectl` starts cost about 130 ms of CPU each, close to 40% of the test phase's CPU on a
//! 2-CPU machine, before their discovery requests on the API servers. The fixtures' bulk
//! steps (CRDs, the components' rights, tokens, applies) and the hot polls go through here.
//!
//! Every call runs on one runtime of this module and blocks its caller, as a `kubectl` process
//! did, so that it works from plain `#[test]`s and from async tests alike (`block_on` inside a
//! runtime would panic). Clients are kept per kubeconfig file and its content: a server
//! restarted in the same run directory gets a fresh one.
use std::{
    collections::HashMap,
    future::Future,
    path::{Path, PathBuf},
    sync::{LazyLock, Mutex},
};

use anyhow::{Context as _, Result, anyhow};
use futures::{StreamExt as _, stream};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::ServiceAccount,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    discovery::{Discovery, Scope, pinned_kind},
};
use serde_json::Value;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fabric-tests-kube")
        .enable_all()
        .build()
        .expect("the tests' client runtime")
});

/// Runs `fut` on this module's runtime until it is done, blocking the calling thread.
pub fn block<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    RUNTIME.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().expect("the tests' client runtime runs the call")
}

/// The client of kubeconfig `kc` (its credentials and server), made once per file content.
pub fn client(kc: &Path) -> Result<Client> {
    static CLIENTS: LazyLock<Mutex<HashMap<(PathBuf, String), Client>>> =
        LazyLock::new(Mutex::default);
    let text = std::fs::read_to_string(kc).with_context(|| format!("reading {}", kc.display()))?;
    let key = (kc.to_path_buf(), text);
    if let Some(c) = CLIENTS.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let path = kc.to_path_buf();
    // Made on the runtime: the client's service spawns its buffer task there.
    let c = block(async move { crate::apiserver::client_for(&path).await })?;
    CLIENTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, c.clone());
    Ok(c)
}

/// A resource name the server does not serve (a short name such as `pvc` among them: the
/// lookup takes plurals and kinds only).
#[derive(Debug, thiserror::Error)]
#[error("the server does not serve {0} (plural or kind, `.group` outside the core group)")]
pub struct NotServed(pub String);

/// The API of `resource` as `kubectl get` takes it: its plural or its kind in lower case,
/// then `.group` unless it is in the core group (`node`, `pods`, `events.events.k8s.io`).
/// Looked up once per server (a discovery of that group).
async fn resolve(client: &Client, key: &Path, resource: &str) -> Result<(ApiResource, Scope)> {
    type Found = HashMap<(PathBuf, String), (ApiResource, Scope)>;
    static FOUND: LazyLock<Mutex<Found>> = LazyLock::new(Mutex::default);
    let k = (key.to_path_buf(), resource.to_owned());
    if let Some(found) = FOUND.lock().unwrap_or_else(|e| e.into_inner()).get(&k) {
        return Ok(found.clone());
    }
    let (name, group) = resource.split_once('.').unwrap_or((resource, ""));
    let find = |discovery: &Discovery| {
        discovery
            .groups()
            .flat_map(|g| g.recommended_resources())
            .find(|(ar, _)| ar.plural == name || ar.kind.to_lowercase() == name)
            .map(|(ar, caps)| (ar, caps.scope))
    };
    let discover = |d: Discovery| async move {
        d.run()
            .await
            .with_context(|| format!("discovering the API of {resource}"))
    };
    // The core group, or the one named; a bare name outside the core group (`lease`) is
    // looked for in every group, as kubectl does.
    let mut found = find(&discover(Discovery::new(client.clone()).filter(&[group])).await?);
    if found.is_none() && group.is_empty() {
        found = find(&discover(Discovery::new(client.clone())).await?);
    }
    let found = found.ok_or_else(|| NotServed(resource.to_owned()))?;
    FOUND
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(k, found.clone());
    Ok(found)
}

/// The API of `resource` ([`resolve`]) in namespace `ns` (every namespace when `None`);
/// a cluster-scoped kind's whatever `ns`, as kubectl ignores `-n` for those.
async fn dynamic_api(
    client: Client,
    key: &Path,
    resource: &str,
    ns: Option<&str>,
) -> Result<Api<DynamicObject>> {
    let (ar, scope) = resolve(&client, key, resource).await?;
    Ok(match (scope, ns) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client, ns, &ar),
        _ => Api::all_with(client, &ar),
    })
}

/// `kubectl get RESOURCE NAME [-n NS] -o json`, in-process: the object, `None` when there is
/// none. `resource` as [`resolve`] takes it; `ns` defaults to `default` as with the fixtures'
/// kubeconfigs, and does not matter for a cluster-scoped kind.
pub fn get_json(kc: &Path, resource: &str, ns: Option<&str>, name: &str) -> Result<Option<Value>> {
    let client = client(kc)?;
    let (key, resource, ns, name) = (
        kc.to_path_buf(),
        resource.to_owned(),
        ns.unwrap_or("default").to_owned(),
        name.to_owned(),
    );
    block(async move {
        let api = dynamic_api(client, &key, &resource, Some(&ns)).await?;
        Ok(api
            .get_opt(&name)
            .await?
            .map(serde_json::to_value)
            .transpose()?)
    })
}

/// `kubectl get RESOURCE [-n NS | -A] [-l SELECTOR] -o json`'s items, in-process: in `ns`,
/// or in every namespace when `None`.
pub fn list(kc: &Path, resource: &str, ns: Option<&str>, selector: &str) -> Result<Vec<Value>> {
    let client = client(kc)?;
    let (key, resource, ns) = (kc.to_path_buf(), resource.to_owned(), ns.map(str::to_owned));
    let lp = kube::api::ListParams::default().labels(selector);
    block(async move {
        let api = dynamic_api(client, &key, &resource, ns.as_deref()).await?;
        let list = api.list(&lp).await?;
        list.items
            .into_iter()
            .map(|o| Ok(serde_json::to_value(o)?))
            .collect()
    })
}

/// The kinds' APIs already looked up by one call (each lookup is a discovery request).
pub(crate) type Kinds = HashMap<GroupVersionKind, (ApiResource, Scope)>;

/// Where `obj` goes: its kind's API, in its namespace (`default` when it names none, as
/// `kubectl` with the fixtures' kubeconfigs does) when the kind is namespaced.
async fn api_for(
    client: &Client,
    kinds: &mut Kinds,
    obj: &DynamicObject,
) -> Result<Api<DynamicObject>> {
    Ok(api_in(client, kinds, obj, "default").await?.0)
}

/// Where `obj` goes, as [`api_for`] says, with `default_ns` for a namespaced object that
/// names no namespace; and its kind's scope.
pub(crate) async fn api_in(
    client: &Client,
    kinds: &mut Kinds,
    obj: &DynamicObject,
    default_ns: &str,
) -> Result<(Api<DynamicObject>, Scope)> {
    let types = obj
        .types
        .as_ref()
        .ok_or_else(|| anyhow!("an object without apiVersion and kind"))?;
    let gvk = GroupVersionKind::try_from(types)?;
    if !kinds.contains_key(&gvk) {
        let (ar, caps) = pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("the server does not serve {}", types.kind))?;
        kinds.insert(gvk.clone(), (ar, caps.scope));
    }
    let (ar, scope) = &kinds[&gvk];
    let api = match scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            obj.metadata.namespace.as_deref().unwrap_or(default_ns),
            ar,
        ),
        Scope::Cluster => Api::all_with(client.clone(), ar),
    };
    Ok((api, scope.clone()))
}

fn dynamic(obj: &Value) -> Result<DynamicObject> {
    serde_json::from_value(obj.clone()).with_context(|| format!("not an object: {obj}"))
}

/// The objects of `objects`, each `kind: List` replaced by its items, as kubectl reads them.
pub(crate) fn flattened(objects: &[Value]) -> Result<Vec<DynamicObject>> {
    let mut out = Vec::new();
    for o in objects {
        if o["kind"] == "List" && o["apiVersion"] == "v1" {
            let items = o["items"].as_array().map(Vec::as_slice).unwrap_or_default();
            out.extend(flattened(items)?);
        } else {
            out.push(dynamic(o)?);
        }
    }
    Ok(out)
}

fn name_of(obj: &DynamicObject) -> Result<String> {
    obj.metadata
        .name
        .clone()
        .ok_or_else(|| anyhow!("an object without a name"))
}

/// Server-side apply of each of `objects` (the items of a `List`), in order, as `field_manager` (taking fields over
/// from other managers when `force`), as `kubectl apply --server-side` does.
pub fn apply(kc: &Path, field_manager: &str, force: bool, objects: &[Value]) -> Result<()> {
    let client = client(kc)?;
    let objects = flattened(objects)?;
    let mut pp = PatchParams::apply(field_manager);
    pp.force = force;
    block(async move {
        let mut kinds = Kinds::new();
        for obj in objects {
            let name = name_of(&obj)?;
            let api = api_for(&client, &mut kinds, &obj).await?;
            api.patch(&name, &pp, &Patch::Apply(&obj))
                .await
                .with_context(|| format!("applying {} {name}", kind_of(&obj)))?;
        }
        Ok(())
    })
}

fn kind_of(obj: &DynamicObject) -> &str {
    obj.types.as_ref().map_or("?", |t| t.kind.as_str())
}

/// Creates `obj` (each item of a `List`), as `kubectl create -f -` does; what the server
/// stored.
pub fn create(kc: &Path, obj: &Value) -> Result<Vec<Value>> {
    let client = client(kc)?;
    let objects = flattened(std::slice::from_ref(obj))?;
    block(async move {
        let mut kinds = Kinds::new();
        let mut made = Vec::new();
        for obj in objects {
            let api = api_for(&client, &mut kinds, &obj).await?;
            let stored = api
                .create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating {} {:?}", kind_of(&obj), obj.metadata.name))?;
            made.push(serde_json::to_value(stored)?);
        }
        Ok(made)
    })
}

/// A token of ServiceAccount `ns/name` valid for `seconds`, for the server's own audiences
/// (`kubectl create token`).
pub fn token(kc: &Path, ns: &str, name: &str, seconds: i64) -> Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client(kc)?, ns);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(seconds),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sa = name.to_owned();
    let made = block(async move {
        api.create_token_request(&sa, &PostParams::default(), &request)
            .await
    })
    .with_context(|| format!("a token of {ns}/{name}"))?;
    made.status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow!("a TokenRequest answered without a token"))
}

/// One question of [`can_i`]: may `user` (with `groups`) `verb` the `resource` (`plural` or
/// `plural.group`, with `/name` for one object, as `kubectl auth can-i` takes it) in
/// namespace `namespace`?
#[derive(Debug, Clone)]
pub struct Access {
    pub user: String,
    pub groups: Vec<String>,
    pub verb: String,
    pub resource: String,
    /// `kubectl auth can-i --subresource`.
    pub subresource: Option<String>,
    pub namespace: String,
}

impl Access {
    /// The question for ServiceAccount `sa_ns/sa`, with the groups the API server gives a
    /// ServiceAccount (and `kubectl auth can-i --as` its impersonation).
    pub fn service_account(sa_ns: &str, sa: &str, verb: &str, resource: &str, ns: &str) -> Self {
        Self::user(
            &format!("system:serviceaccount:{sa_ns}:{sa}"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{sa_ns}"),
            ],
            verb,
            resource,
            ns,
        )
    }

    /// The question for `user` in `groups` (and `system:authenticated`, which the API server
    /// adds to every user it authenticates, as to `kubectl auth can-i --as U --as-group G`).
    pub fn user(user: &str, groups: &[&str], verb: &str, resource: &str, ns: &str) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        groups.push("system:authenticated".into());
        Self {
            user: user.into(),
            groups,
            verb: verb.into(),
            resource: resource.into(),
            subresource: None,
            namespace: ns.into(),
        }
    }

    /// The same question about `subresource`.
    pub fn of(mut self, subresource: &str) -> Self {
        self.subresource = Some(subresource.into());
        self
    }

    fn review(&self) -> SubjectAccessReview {
        let (what, name) = match self.resource.split_once('/') {
            Some((what, name)) => (what, Some(name.to_owned())),
            None => (self.resource.as_str(), None),
        };
        let (plural, group) = what.split_once('.').unwrap_or((what, ""));
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(self.user.clone()),
                groups: Some(self.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.into()),
                    resource: Some(plural.into()),
                    name,
                    subresource: self.subresource.clone(),
                    namespace: Some(self.namespace.clone()),
                    verb: Some(self.verb.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

/// The server's answer to each question, in order (SubjectAccessReviews, a few at a time).
pub fn can_i(kc: &Path, questions: &[Access]) -> Result<Vec<bool>> {
    let api: Api<SubjectAccessReview> = Api::all(client(kc)?);
    let reviews: Vec<SubjectAccessReview> = questions.iter().map(Access::review).collect();
    let answers: Vec<Result<bool>> = block(async move {
        stream::iter(reviews)
            .map(|r| {
                let api = api.clone();
                async move {
                    let done = api.create(&PostParams::default(), &r).await?;
                    Ok(done.status.is_some_and(|s| s.allowed))
                }
            })
            .buffered(8)
            .collect()
            .await
    });
    answers.into_iter().collect()
}
