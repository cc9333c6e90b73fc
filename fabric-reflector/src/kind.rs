//! What a reflected kind provides ([`Kind`]), what it decides from ([`View`]) and what it acts
//! through ([`Cx`]).
use std::{fmt, future::Future, sync::Arc, time::Duration};

use fabric_kube::{
    events::{Event, Events},
    meta,
    written::Writes,
};
use kube::{Api, Client, Resource, api::ApiResource, core::NamespaceScope, runtime::watcher};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    gate::Remote,
    key::{Key, Pair},
    marks::Marks,
};

/// A namespaced Kubernetes object type a reflector watches and writes: a static type (its
/// `DynamicType` is `()`), or [`DynamicObject`](kube::api::DynamicObject), whose type (an [`ApiResource`]) the kind
/// carries at run time ([`Kind::home_type`], [`Kind::remote_type`]).
pub trait Object:
    Resource<DynamicType: Dyn, Scope: NamespaceScope>
    + Clone
    + fmt::Debug
    + DeserializeOwned
    + Serialize
    + Send
    + Sync
    + 'static
{
}

impl<T> Object for T where
    T: Resource<DynamicType: Dyn, Scope: NamespaceScope>
        + Clone
        + fmt::Debug
        + DeserializeOwned
        + Serialize
        + Send
        + Sync
        + 'static
{
}

/// The run-time type of an [`Object`]: `()` for a static type, an [`ApiResource`] for a
/// [`DynamicObject`](kube::api::DynamicObject) (a custom kind chosen by configuration).
pub trait Dyn: Clone + Eq + std::hash::Hash + fmt::Debug + Send + Sync + 'static {
    /// The type when it is known at compile time (`()`); `None`: the kind must say it.
    fn fixed() -> Option<Self>;
}

impl Dyn for () {
    fn fixed() -> Option<Self> {
        Some(())
    }
}

impl Dyn for ApiResource {
    fn fixed() -> Option<Self> {
        None
    }
}

/// The type of `O` when the kind does not say it: known for static types only.
pub(crate) fn fixed<O: Object>() -> O::DynamicType {
    <O::DynamicType as Dyn>::fixed().unwrap_or_else(|| {
        panic!(
            "a kind of {} objects must say their type (Kind::home_type, Kind::remote_type)",
            std::any::type_name::<O>()
        )
    })
}

/// The `O` objects of namespace `ns` through `client`, of run-time type `dt`.
pub fn namespaced<O: Object>(client: Client, ns: &str, dt: &O::DynamicType) -> Api<O> {
    Api::all_with(client, dt).constrain(ns)
}

/// The `O` objects of every namespace (list and watch only).
pub fn everywhere<O: Object>(client: Client, dt: &O::DynamicType) -> Api<O> {
    Api::all_with(client, dt)
}

/// One reflected kind: how its home objects and remote objects correspond, and what to do
/// about one key. Everything but [`Kind::act`] is pure; `act` carries out one step with the
/// I/O the edge hands it ([`Cx`]). Kinds that copy a home object into a remote one need not
/// implement this: [`crate::mirror::Mirror`] does, from a [`crate::mirror::Forge`].
pub trait Kind: Send + Sync + Sized + 'static {
    /// The object at home (this cluster), watched per [`Pair`].
    type Home: Object;
    /// The object the kind keeps in the remote cluster for a home object.
    type Remote: Object;
    /// What [`Kind::decide`] returns and [`Kind::act`] carries out.
    type Step: fmt::Debug + Send;
    /// Why an act failed (logged with `{:#}`; the key is retried with back-off).
    type Error: fmt::Display + Send + 'static;

    /// The kind in logs and metrics (`kind="pods"`): the home resource's plural.
    const NAME: &'static str;

    /// The kind's label in metrics. Default: [`Kind::NAME`]; a kind of a type known only at
    /// run time names itself, so that two such kinds are told apart.
    fn label(&self) -> std::borrow::Cow<'static, str> {
        Self::NAME.into()
    }

    /// The run-time type of the home objects. Default: that of a static type; a kind of
    /// [`DynamicObject`](kube::api::DynamicObject)s says its [`ApiResource`].
    fn home_type(&self) -> <Self::Home as Resource>::DynamicType {
        fixed::<Self::Home>()
    }

    /// The run-time type of the remote objects (default as [`Kind::home_type`]).
    fn remote_type(&self) -> <Self::Remote as Resource>::DynamicType {
        fixed::<Self::Remote>()
    }

    /// How home objects are watched in the pair's home namespace (a field or label
    /// selector: the pods bound to one node). Default: all of them.
    fn watch_home(&self) -> watcher::Config {
        watcher::Config::default()
    }

    /// How remote objects are watched in the pair's remote namespace. Default: all of them,
    /// so that an object of ours someone else took over, or someone else's in our way, is
    /// seen (and left alone).
    fn watch_remote(&self) -> watcher::Config {
        watcher::Config::default()
    }

    /// The name of the remote object standing for `key` in the pair's remote namespace.
    fn remote_name(&self, key: &Key) -> String;

    /// The key of the home object `remote` stands for (`None`: none; its events are
    /// ignored). The inverse of [`Kind::remote_name`].
    fn key_of(&self, pair: &Pair, remote: &Self::Remote) -> Option<Key>;

    /// Whether `remote` (one of ours) stands for no home object any more; `home` is the home
    /// object of its key as known (`None`: there is none). The edge deletes such an object
    /// once a fresh read of the home object confirms it (a UID-preconditioned delete).
    fn orphaned(&self, remote: &Self::Remote, home: Option<&Self::Home>) -> bool;

    /// Whether `remote`, which lacks our marks, is ours all the same: made by this cluster
    /// before reflected objects carried marks (a cluster upgraded with objects in place).
    /// It is then handled as ours (written, deleted, swept as an orphan), and the kind should
    /// stamp the marks on it with its next write. Pure. Default: never; a kind that answers
    /// yes must be sure no one else can have made such an object.
    fn adopts(&self, _remote: &Self::Remote, _marks: &Marks) -> bool {
        false
    }

    /// What else goes with remote object `remote` (ours) once its home object is gone: the
    /// remote objects `act` would have removed with it, through `endpoint`. Called when the
    /// edge deleted it as an orphan, and on each sync of a key whose home object is gone while
    /// `remote` is already going (deleted by `act` before the home object went). Must be
    /// idempotent; an error is logged. Default: nothing.
    fn home_gone(
        &self,
        _endpoint: &Endpoint,
        _remote: &Self::Remote,
    ) -> impl Future<Output = Result<(), String>> + Send {
        async { Ok(()) }
    }

    /// What to do about one home object, from what the edge knows: pure.
    fn decide(&self, view: &View<'_, Self>) -> Self::Step;

    /// Carries out `step`; `Ok(Next::After(d))` to be looked at again after `d` even if
    /// nothing changes (a token to refresh), an error to be retried with back-off.
    fn act(
        &self,
        cx: &Cx<'_, Self>,
        step: Self::Step,
    ) -> impl Future<Output = Result<Next, Self::Error>> + Send;
}

/// What a sync asks of the edge once it is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing: the key is looked at again on the next change, or the periodic resync.
    Done,
    /// Look at the key again after this long.
    After(Duration),
}

/// What a kind decides from: one home object and what the remote holds for it.
pub struct View<'a, K: Kind> {
    pub key: &'a Key,
    pub pair: &'a Pair,
    /// The home object: the watch cache's copy, or the one our last write of it returned
    /// while the cache has not caught up ([`Cx::wrote_home`]).
    pub home: &'a Arc<K::Home>,
    /// The remote object of [`Kind::remote_name`] in the pair's remote namespace.
    pub remote: Remote<'a, K::Remote>,
    /// Whether the remote cluster answers. While it does not, nothing should be created or
    /// deleted there (the edge deletes nothing itself).
    pub reachable: bool,
    /// The marks of ours in the remote cluster; `None`: no remote client.
    pub marks: Option<&'a Marks>,
}

/// The remote cluster as a reflector reaches it: a client and the marks this cluster puts
/// on what it makes there. Replaced whole when the identity changes (the remote watches are
/// made again on the new client).
#[derive(Clone)]
pub struct Endpoint {
    pub client: Client,
    pub marks: Marks,
}

/// What [`Kind::act`] carries out a step with: the [`View`] it was decided from, and the
/// clients, Events and write records of the edge.
pub struct Cx<'a, K: Kind> {
    pub view: View<'a, K>,
    pub(crate) kind: &'a K,
    pub(crate) home_client: &'a Client,
    pub(crate) endpoint: Option<&'a Endpoint>,
    pub(crate) events: &'a Events,
    pub(crate) writes: &'a Writes<Key, K::Home>,
}

/// How a [`Cx::delete_remote`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// Asked (the object may still be finishing: finalizers, a grace period).
    Asked,
    /// Gone already, or replaced by another object of that name since it was seen.
    Gone,
    /// It does not carry our marks (or there is no remote client): left alone.
    NotOurs,
}

impl<K: Kind> Cx<'_, K> {
    /// The home objects of the key's namespace.
    pub fn home_api(&self) -> Api<K::Home> {
        namespaced(
            self.home_client.clone(),
            &self.view.key.namespace,
            &self.kind.home_type(),
        )
    }

    /// The remote objects of the pair's remote namespace; `None`: no remote client.
    pub fn remote_api(&self) -> Option<Api<K::Remote>> {
        let e = self.endpoint?;
        Some(namespaced(
            e.client.clone(),
            self.view.pair.remote_namespace(&e.client),
            &self.kind.remote_type(),
        ))
    }

    /// The remote client (its default namespace the tenant namespace); `None`: none. For a
    /// kind that must look outside the pair's remote namespace (the pod kind, for a pod
    /// offloaded pod by pod before its namespace was).
    pub fn remote_client(&self) -> Option<&Client> {
        self.endpoint.map(|e| &e.client)
    }

    /// The pair's remote namespace; `None`: no remote client.
    pub fn remote_namespace(&self) -> Option<&str> {
        let e = self.endpoint?;
        Some(self.view.pair.remote_namespace(&e.client))
    }

    /// The name of the key's remote object.
    pub fn remote_name(&self) -> String {
        self.kind.remote_name(self.view.key)
    }

    /// Records a write of the home object that returned `after`: until the watch cache shows
    /// it, later syncs decide from `after` ([`fabric_kube::written`]).
    pub fn wrote_home(&self, after: K::Home) {
        let over = self.view.home.meta().resource_version.clone();
        self.writes.wrote(self.view.key.clone(), over, after);
    }

    /// Publishes `ev` on the home object (a failure is logged, never fails the sync).
    pub async fn event(&self, ev: &Event) {
        let home = self.view.home.object_ref(&self.kind.home_type());
        self.events.publish_ref(&home, ev).await;
    }

    /// The Events publisher of the home cluster (for Events on other objects).
    pub fn events(&self) -> &Events {
        self.events
    }

    /// Whether remote object `obj` is ours ([`owned`]); `false` without a remote client.
    pub fn ours(&self, obj: &K::Remote) -> bool {
        self.view.marks.is_some_and(|m| owned(self.kind, m, obj))
    }

    /// Deletes remote object `obj` if it is ours ([`owned`]), on the condition that it is
    /// still that very object (its UID), with `grace_seconds` if given.
    pub async fn delete_remote(
        &self,
        obj: &K::Remote,
        grace_seconds: Option<u32>,
    ) -> kube::Result<Deleted> {
        let Some(api) = self.remote_api() else {
            return Ok(Deleted::NotOurs);
        };
        if !self.ours(obj) {
            return Ok(Deleted::NotOurs);
        }
        delete_preconditioned(&api, obj, grace_seconds).await
    }
}

/// Whether remote object `obj` is ours: it carries our `marks`, or the kind adopts it
/// ([`Kind::adopts`]).
pub fn owned<K: Kind>(kind: &K, marks: &Marks, obj: &K::Remote) -> bool {
    marks.on(obj.meta()) || kind.adopts(obj, marks)
}

/// Deletes `obj` (one of ours: the caller checked) through `api`, preconditioned on its UID.
pub(crate) async fn delete_preconditioned<R: Object>(
    api: &Api<R>,
    obj: &R,
    grace_seconds: Option<u32>,
) -> kube::Result<Deleted> {
    let dp = meta::only_uid(obj.meta().uid.clone(), grace_seconds);
    let name = obj.meta().name.clone().unwrap_or_default();
    Ok(match meta::delete(api, &name, &dp).await? {
        meta::Deleted::Asked => Deleted::Asked,
        meta::Deleted::Gone => Deleted::Gone,
    })
}
