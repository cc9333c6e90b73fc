//! Reflection: objects of this ("home") cluster kept as objects of another ("remote")
//! cluster, and what the remote makes of them brought home. Pods bound to a virtual node
//! become ShadowPods on the provider this way (`fabric-virtual-kubelet/src/pods`); so will
//! the Services, EndpointSlices, ConfigMaps, Secrets, tokens and Events of offloaded
//! namespaces. Anchors: Liqo's `reflection/generic` (reflector, namespaced reflector,
//! per-namespace start and stop, readiness gate) and virtual-kubelet's provider split.
//!
//! # Parts
//! - A **kind** ([`Kind`]) says how home and remote objects correspond ([`Kind::remote_name`],
//!   [`Kind::key_of`]), when a remote object stands for nothing at home
//!   ([`Kind::orphaned`]), what to do about one home object ([`Kind::decide`], pure) and how
//!   ([`Kind::act`], through the [`Cx`] the edge hands it). Most kinds copy a home object into
//!   a remote one: they provide a [`mirror::Forge`] (pure) and register
//!   [`mirror::Mirror`]`(forge)`, which decides and writes for them.
//! - A **pair** ([`Pair`]) is where a kind works: a home namespace (or all of them, narrowed
//!   by [`Kind::watch_home`]) and a remote namespace (or the remote client's default one, the
//!   tenant namespace).
//! - The **edge** (one loop per kind and pair, [`edge`]) keeps a watch cache of each side,
//!   a work queue of [`Key`]s, retries, and runs the syncs.
//! - [`Reflection`] holds the kinds registered in a process and starts and stops pairs; it is
//!   fed the remote cluster as an [`Endpoint`] (a client and our [`Marks`] there, replaced
//!   when the identity rotates) and its [`Reachability`].
//!
//! # Adding a kind
//! A ConfigMap mirrored into a twin namespace is all of this:
//!
//! ```
//! use fabric_reflector::{Options, Reflection, mirror::{Forge, Mirror}};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! struct ConfigMaps;
//!
//! impl Forge for ConfigMaps {
//!     type Home = ConfigMap;
//!     type Remote = ConfigMap;
//!     const NAME: &'static str = "configmaps";
//!
//!     fn forge(&self, home: &ConfigMap) -> Option<ConfigMap> {
//!         Some(ConfigMap {
//!             metadata: kube::api::ObjectMeta {
//!                 labels: home.metadata.labels.clone(),
//!                 ..Default::default()
//!             },
//!             data: home.data.clone(),
//!             binary_data: home.binary_data.clone(),
//!             immutable: home.immutable,
//!         })
//!     }
//! }
//!
//! fn register(reflection: &mut Reflection) {
//!     let every = std::time::Duration::from_secs(30);
//!     reflection.register(Mirror(ConfigMaps), Options::new(3, every));
//! }
//! ```
//!
//! then `reflection.start(Pair::namespaces("shop", "shop-alpha"))`. Its forge is unit-tested
//! as any pure function; what it gets from the edge is below. A kind that does more than
//! copy (the pod kind: status home, resizes, deletion through the remote) implements
//! [`Kind`] itself, its decision still pure and its writes in [`Kind::act`].
//!
//! # Kinds known at run time
//! An [`Object`] is a static type (its `DynamicType` is `()`) or a
//! [`kube::api::DynamicObject`], whose [`kube::api::ApiResource`] the kind says
//! ([`Kind::home_type`], [`Kind::remote_type`]; a forge: [`mirror::Forge::home_type`]). The
//! edge builds every `Api`, cache and lookup with it. [`custom::Customs`] is such a kind: the
//! custom resources a consumer's admin chooses, spec out and status back.
//!
//! # What the edge guarantees
//! - **Keys.** Everything is synced per key, the home object's (namespace, name), whichever
//!   side changed: a remote object's event is synced as [`Kind::key_of`] it.
//! - **One sync per key at a time**, up to [`Options::workers`] keys at a time per pair, in
//!   the order they were marked. A key marked while its sync runs is synced again after it:
//!   every sync starts from caches at least as fresh as the event that queued it. There is
//!   no order between keys.
//! - **Readiness gating.** No key is synced before the home cache has listed (an object
//!   missing from an unlisted cache may exist) and before whether the remote answers is
//!   known. Until the remote cache has listed, or while there is no remote client, the kind
//!   sees [`Remote::Unknown`]: it must create and delete nothing then (a restarted process
//!   would otherwise duplicate what exists). When the remote cache lists, reachability
//!   changes or a trigger ([`Options::resync_on`]) fires, every key is looked at again.
//! - **Our own writes.** A kind that writes the home object records what the write returned
//!   ([`Cx::wrote_home`]); later syncs decide from it until the cache shows it
//!   ([`fabric_kube::written`]).
//! - **Failures.** An act that fails is retried for that key after 0.5 s, doubling up to
//!   30 s, until one goes through; [`Next::After`] looks at a key again after a while (a
//!   token to refresh).
//! - **An unreachable remote.** The kinds are told ([`View::reachable`]) and do what still
//!   makes sense (the pod kind: mark pods not Ready; a mirror: nothing). The edge deletes
//!   nothing then; the remote watch retries with back-off.
//! - **Ownership.** Everything reflected carries our [`Marks`] (origin and destination
//!   cluster). A remote object of a key's name without them is [`Remote::Foreign`]: the edge
//!   says so once with a Warning Event on the home object (reason
//!   [`sync::NOT_OURS`]), never deletes it ([`Cx::delete_remote`] refuses), and a mirror
//!   never writes it. A home object that carries marks is a reflection itself and is not
//!   mirrored back: two clusters peered both ways do not loop. A kind may adopt objects of
//!   its own made before marks existed ([`Kind::adopts`]: the pod kind adopts the
//!   ShadowPods an older virtual kubelet made) and stamps the marks on them.
//! - **Deletes** are conditioned on the UID of the object seen (a replacement of the same
//!   name is never deleted by mistake); gone already is fine.
//! - **Orphans.** A remote object of ours whose home object is gone ([`Kind::orphaned`]) is
//!   deleted once a fresh read at home confirms it: on the sync of its key, and by the
//!   periodic look over the remote cache; only while both caches have listed and the remote
//!   answers.
//! - **Periodic resync** ([`Options::resync`]): every key of both caches is looked at again.
//! - **A new remote client** (the identity rotated): the remote watch and cache are made
//!   again on it, syncs under way finish with the old one, every key is looked at again.
//! - **Start and stop per pair** ([`Reflection::start`], [`Reflection::stop`]): stopping ends
//!   the pair's watches, lets syncs under way finish and reflects nothing more for it; what it
//!   reflected stays (a twin namespace goes as a whole).
//! - **Metrics** per kind ([`Metrics`]): syncs, failures, retries, orphans deleted, keys
//!   queued and running, pairs, sync latency.
//!
//! # Not there yet (for the kinds of issue 20)
//! - The home client is fixed. Reflecting from the provider back home (Events) is a
//!   [`Reflection`] whose home is the provider and whose remote is this cluster; the
//!   provider's client changes with the identity, so the home side must then follow an
//!   [`Endpoint`] as the remote side does.
//! - [`Options::resync_on`] looks at every key again. A change that concerns some keys of
//!   another kind (a Service's EndpointSlices, the ConfigMaps a pod references) would rather
//!   queue just those.
//! - Every virtual kubelet of a provider runs every kind. Kinds of a namespace, not of a node
//!   (Services, ConfigMaps), should run in one of them only (Liqo's leader mode;
//!   `fabric_kube::Election` is there).
pub mod custom;
pub mod edge;
pub mod gate;
pub mod key;
pub mod kind;
pub mod manager;
pub mod marks;
pub mod metrics;
pub mod mirror;
pub mod queue;
pub mod sync;

pub use edge::{Ended, Options};
pub use gate::{Reachability, Remote};
pub use key::{Key, Pair};
pub use kind::{Cx, Deleted, Endpoint, Kind, Next, Object, View};
pub use manager::Reflection;
pub use marks::Marks;
pub use metrics::Metrics;
