//! The common kind: a home object copied into a remote one of the same kind or another,
//! kept as the home object changes and deleted with it. A kind of this sort provides only a
//! [`Forge`] (what the remote object is, pure); [`Mirror`] is its [`Kind`]: the decision
//! ([`plan`], pure) and the writes (server-side apply under
//! [`names::field_manager::REFLECTION`], UID-preconditioned deletes).
//!
//! What [`plan`] decides, in order:
//! - nothing while the remote cluster does not answer, or its cache has not listed;
//! - nothing to a remote object someone else made (the edge has said so at home);
//! - the home object going, carrying a reflector's marks itself (reflected here from a peer:
//!   never reflected back), or not reflected by the forge's policy: our remote copy, if any,
//!   is deleted;
//! - our remote copy cannot become the forged object in place (the forge says so: a field the
//!   remote API server does not change, such as a Service's headless cluster IP): it is
//!   deleted, UID-preconditioned, and made again on the next sync;
//! - otherwise the forged object, with our marks and a hash of itself, is applied when the
//!   remote copy is missing, was applied from something else (the hash differs: a label
//!   removed at home goes there too), or has drifted (a field we set has another value).
//!   What the forge says the copy leaves out of the home object ([`Forge::caveat`]) is said
//!   with a Warning Event at home when it is applied.
use fabric_api::names::{self, annotation::REFLECTED_HASH};
use fabric_kube::events::Event;
use kube::{
    Resource as _, ResourceExt as _,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use serde_json::Value;
use tracing::{debug, info};

use crate::{
    gate::Remote,
    key::{Key, Pair},
    kind::{Cx, Kind, Next, Object, View},
    marks::{self, Marks},
};

/// What a mirrored kind provides: pure functions of the home object.
pub trait Forge: Send + Sync + 'static {
    type Home: Object;
    type Remote: Object;
    /// The kind in logs and metrics (`kind="configmaps"`).
    const NAME: &'static str;

    /// The remote object standing for `home`: what it should hold, its labels and
    /// annotations included (of its metadata only those are kept: [`plan`] names it and adds
    /// our marks). `None`: `home` is not reflected (a policy says so); a copy of ours there
    /// is deleted.
    fn forge(&self, home: &Self::Home) -> Option<Self::Remote>;

    /// The run-time type of the home objects ([`Kind::home_type`]; default: a static type's).
    fn home_type(&self) -> <Self::Home as kube::Resource>::DynamicType {
        crate::kind::fixed::<Self::Home>()
    }

    /// The run-time type of the remote objects ([`Kind::remote_type`]).
    fn remote_type(&self) -> <Self::Remote as kube::Resource>::DynamicType {
        crate::kind::fixed::<Self::Remote>()
    }

    /// The name of the remote object of home object `name` (default: the same).
    fn remote_name(&self, name: &str) -> String {
        name.to_owned()
    }

    /// The home object's name of remote object `name` (`None`: not one of a home object),
    /// the inverse of [`Forge::remote_name`]. A remote name that stands for no home object
    /// is never the mirror's to write or delete, even if a home object of that name exists
    /// (a name the fabric keeps for an object of its own there).
    fn home_name(&self, name: &str) -> Option<String> {
        Some(name.to_owned())
    }

    /// How home objects are watched (default: all of the pair's home namespace).
    fn watch_home(&self) -> watcher::Config {
        watcher::Config::default()
    }

    /// What the remote copy of `home` leaves out or changes that its owner should know (a
    /// field the remote cluster does not grant), said with a Warning Event on `home`
    /// ([`CAVEAT`]) whenever the copy is applied. Default: nothing.
    fn caveat(&self, _home: &Self::Home) -> Option<String> {
        None
    }

    /// Whether our remote copy `have` cannot be made `want` in place (a field the remote API
    /// server refuses to change): it is then deleted and made again. Default: never.
    fn replaces(&self, _have: &Self::Remote, _want: &Self::Remote) -> bool {
        false
    }
}

/// The Event reason of a [`Forge::caveat`].
pub const CAVEAT: &str = "ReflectedWithChanges";
/// The Event reason of a copy the remote cluster refused (its admission policy, validation,
/// our rights there): said at home, where the object's owner looks, not only in our log.
pub const REFUSED: &str = "ReflectionRefused";

/// Whether the remote API server refused a write for what it is, rather than failing it for
/// a moment (conflicts, throttling and server errors are retried without a word).
fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 409 && s.code != 429)
}

/// The [`Kind`] of a [`Forge`].
pub struct Mirror<F>(pub F);

/// What to do about one mirrored key.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan<R> {
    /// Nothing to change, or nothing may be done now.
    Nothing,
    /// Create or update the remote object to this (server-side apply, forced: the fields we
    /// set are ours).
    Apply(Box<R>),
    /// Delete our remote copy.
    Delete,
    /// Delete our remote copy, to be made again ([`Forge::replaces`]).
    Replace,
    /// The remote object of that name is someone else's: left alone.
    NotOurs,
}

/// Why a mirror's write failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("applying {kind} {namespace}/{name} in the remote cluster: {source}")]
    Apply {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting {kind} {namespace}/{name} in the remote cluster: {source}")]
    Delete {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// FNV-1a of `v`'s JSON text: stable across releases (what is recorded in the remote object
/// must mean the same to the next version of the reflector).
fn hash(v: &Value) -> String {
    let h = v.to_string().bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}

/// Whether every field `want` sets has the same value in `have` (what an apply of `want`
/// would leave as it is); fields `have` has besides (set by the server, or by others) do not
/// count.
pub fn holds(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w.iter().all(|(k, wv)| match h.get(k) {
            Some(hv) => holds(hv, wv),
            None => wv.is_null(),
        }),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(hv, wv)| holds(hv, wv))
        }
        _ => have == want,
    }
}

/// `forged` as applied for key `name`: named, marked, and carrying the hash of itself.
fn stamped<R: Object>(mut forged: R, name: String, marks: &Marks) -> R {
    let meta = forged.meta_mut();
    // A forge may start from a copy of the home object: none of its identity goes along.
    *meta = kube::api::ObjectMeta {
        name: Some(name),
        labels: meta.labels.take(),
        annotations: meta.annotations.take(),
        ..Default::default()
    };
    marks.stamp(meta.labels.get_or_insert_with(Default::default));
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(REFLECTED_HASH);
    }
    let h = hash(&serde_json::to_value(&forged).unwrap_or_default());
    forged
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(REFLECTED_HASH.to_owned(), h);
    forged
}

/// Whether `have` is what applying `want` (stamped) would make of it.
fn current<R: Object>(have: &R, want: &R) -> bool {
    let recorded = |o: &R| {
        o.meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(REFLECTED_HASH))
            .cloned()
    };
    recorded(have).is_some()
        && recorded(have) == recorded(want)
        && match (serde_json::to_value(have), serde_json::to_value(want)) {
            (Ok(h), Ok(w)) => holds(&h, &w),
            _ => false,
        }
}

/// What to do about the key of `view` (see the module's documentation).
pub fn plan<F: Forge>(forge: &F, view: &View<'_, Mirror<F>>) -> Plan<F::Remote> {
    let (Some(marks), true) = (view.marks, view.reachable) else {
        return Plan::Nothing;
    };
    if forge
        .home_name(&forge.remote_name(&view.key.name))
        .is_none()
    {
        return Plan::NotOurs;
    }
    let home = view.home.as_ref();
    let wanted = (home.meta().deletion_timestamp.is_none() && !marks::reflected(home.meta()))
        .then(|| forge.forge(home))
        .flatten()
        .map(|f| stamped(f, forge.remote_name(&view.key.name), marks));
    match (view.remote, wanted) {
        (Remote::Unknown, _) => Plan::Nothing,
        (Remote::Foreign(_), _) => Plan::NotOurs,
        (Remote::Absent, Some(w)) => Plan::Apply(Box::new(w)),
        (Remote::Absent, None) => Plan::Nothing,
        (Remote::Ours(r), _) if r.meta().deletion_timestamp.is_some() => Plan::Nothing,
        (Remote::Ours(_), None) => Plan::Delete,
        (Remote::Ours(r), Some(w)) if forge.replaces(r, &w) => Plan::Replace,
        (Remote::Ours(r), Some(w)) if current(r, &w) => Plan::Nothing,
        (Remote::Ours(_), Some(w)) => Plan::Apply(Box::new(w)),
    }
}

/// [`plan`] for `home` (keyed by its namespace and name) of `pair` given `remote`, as the edge
/// would view it: for a forge's unit tests.
pub fn plan_of<F: Forge>(
    forge: &F,
    pair: &Pair,
    home: &F::Home,
    remote: Remote<'_, F::Remote>,
    reachable: bool,
    marks: &Marks,
) -> Plan<F::Remote> {
    let key = Key::new(home.namespace().unwrap_or_default(), home.name_any());
    let home = std::sync::Arc::new(home.clone());
    let view = View {
        key: &key,
        pair,
        home: &home,
        remote,
        reachable,
        marks: Some(marks),
    };
    plan(forge, &view)
}

impl<F: Forge> Kind for Mirror<F> {
    type Home = F::Home;
    type Remote = F::Remote;
    type Step = Plan<F::Remote>;
    type Error = Error;
    const NAME: &'static str = F::NAME;

    fn watch_home(&self) -> watcher::Config {
        self.0.watch_home()
    }

    fn home_type(&self) -> <F::Home as kube::Resource>::DynamicType {
        self.0.home_type()
    }

    fn remote_type(&self) -> <F::Remote as kube::Resource>::DynamicType {
        self.0.remote_type()
    }

    fn remote_name(&self, key: &Key) -> String {
        self.0.remote_name(&key.name)
    }

    fn key_of(&self, pair: &Pair, remote: &F::Remote) -> Option<Key> {
        Some(Key::new(
            pair.home.clone()?,
            self.0.home_name(&remote.name_any())?,
        ))
    }

    fn orphaned(&self, remote: &F::Remote, home: Option<&F::Home>) -> bool {
        remote.meta().deletion_timestamp.is_none() && home.is_none()
    }

    fn decide(&self, view: &View<'_, Self>) -> Plan<F::Remote> {
        plan(&self.0, view)
    }

    async fn act(&self, cx: &Cx<'_, Self>, step: Plan<F::Remote>) -> Result<Next, Error> {
        let (Some(api), Some(namespace)) = (cx.remote_api(), cx.remote_namespace()) else {
            return Ok(Next::Done);
        };
        let name = cx.remote_name();
        let step_replaces = matches!(step, Plan::Replace);
        match step {
            Plan::Nothing | Plan::NotOurs => {}
            Plan::Apply(mut obj) => {
                obj.meta_mut().namespace = Some(namespace.to_owned());
                let pp = PatchParams::apply(names::field_manager::REFLECTION).force();
                let applied = api.patch(&name, &pp, &Patch::Apply(&*obj)).await;
                if let Err(e @ kube::Error::Api(s)) = &applied
                    && refused(e)
                {
                    let note = format!(
                        "cluster {} refused our copy in {namespace}: {}",
                        cx.endpoint.map(|e| e.marks.destination()).unwrap_or("?"),
                        s.message
                    );
                    cx.event(&Event::warning(REFUSED, "Reflect", note)).await;
                }
                applied.map_err(|source| Error::Apply {
                    kind: F::NAME,
                    namespace: namespace.to_owned(),
                    name: name.clone(),
                    source,
                })?;
                // Thousands of objects are applied at start: not one line each.
                debug!(kind = F::NAME, key = %cx.view.key, remote = %format!("{namespace}/{name}"), "reflected");
                if let Some(note) = self.0.caveat(cx.view.home) {
                    cx.event(&Event::warning(CAVEAT, "Reflect", note)).await;
                }
            }
            Plan::Delete | Plan::Replace => {
                if let Some(r) = cx.view.remote.ours() {
                    cx.delete_remote(r, None)
                        .await
                        .map_err(|source| Error::Delete {
                            kind: F::NAME,
                            namespace: namespace.to_owned(),
                            name: name.clone(),
                            source,
                        })?;
                    if step_replaces {
                        info!(kind = F::NAME, key = %cx.view.key, "its remote copy cannot change in place: deleted, to be made again");
                    } else {
                        info!(kind = F::NAME, key = %cx.view.key, "no longer reflected: deleted its remote copy");
                    }
                }
            }
        }
        Ok(Next::Done)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp,
    };
    use serde_json::json;

    use super::*;

    /// ConfigMaps copied as they are, but for those labelled `skip`.
    pub struct ConfigMaps;

    impl Forge for ConfigMaps {
        type Home = ConfigMap;
        type Remote = ConfigMap;
        const NAME: &'static str = "configmaps";

        fn forge(&self, home: &ConfigMap) -> Option<ConfigMap> {
            if home.labels().contains_key("skip") {
                return None;
            }
            let mut c = home.clone();
            c.metadata.annotations = None;
            Some(c)
        }

        // As the API server has it: an immutable ConfigMap stays as it is.
        fn replaces(&self, have: &ConfigMap, want: &ConfigMap) -> bool {
            have.immutable == Some(true) && want.data != have.data
        }
    }

    pub fn cm(name: &str, data: &[(&str, &str)], labels: &[(&str, &str)]) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("shop".into());
        c.metadata.uid = Some(format!("uid-{name}"));
        c.metadata.resource_version = Some("1".into());
        c.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        );
        c.data = Some(
            data.iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect::<BTreeMap<_, _>>(),
        );
        c
    }

    fn marks() -> Marks {
        Marks::new("alpha", "beta")
    }

    /// The plan for `home` given `remote`, reachable or not.
    fn plan_for(
        home: &ConfigMap,
        remote: Remote<'_, ConfigMap>,
        reachable: bool,
    ) -> Plan<ConfigMap> {
        let pair = Pair::namespaces("shop", "shop-alpha");
        plan_of(&ConfigMaps, &pair, home, remote, reachable, &marks())
    }

    /// What the remote holds after `plan` applied `obj` (as the server keeps it: its own
    /// fields added).
    fn applied(obj: &ConfigMap) -> ConfigMap {
        let mut r = obj.clone();
        r.metadata.namespace = Some("shop-alpha".into());
        r.metadata.uid = Some("remote-uid".into());
        r.metadata.resource_version = Some("9".into());
        r
    }

    fn apply(p: Plan<ConfigMap>) -> ConfigMap {
        match p {
            Plan::Apply(obj) => applied(&obj),
            other => panic!("expected an apply, got {other:?}"),
        }
    }

    /// ConfigMaps as [`ConfigMaps`], but for name `kept`, which the fabric keeps there.
    struct Keeping;

    impl Forge for Keeping {
        type Home = ConfigMap;
        type Remote = ConfigMap;
        const NAME: &'static str = "configmaps";

        fn forge(&self, home: &ConfigMap) -> Option<ConfigMap> {
            ConfigMaps.forge(home)
        }

        fn home_name(&self, name: &str) -> Option<String> {
            (name != "kept").then(|| name.to_owned())
        }
    }

    #[test]
    fn a_name_kept_for_the_fabric_is_never_written_for_a_home_object() {
        let pair = Pair::namespaces("shop", "shop-alpha");
        let home = cm("kept", &[("k", "v")], &[]);
        let ours = apply(plan_for(&home, Remote::Absent, true));
        for remote in [Remote::Absent, Remote::Ours(&ours)] {
            assert_eq!(
                plan_of(&Keeping, &pair, &home, remote, true, &marks()),
                Plan::NotOurs,
                "neither made nor deleted"
            );
        }
        let other = cm("web", &[("k", "v")], &[]);
        assert!(matches!(
            plan_of(&Keeping, &pair, &other, Remote::Absent, true, &marks()),
            Plan::Apply(_)
        ));
    }

    #[test]
    fn a_home_object_is_copied_once_and_again_when_it_changes() {
        let home = cm("settings", &[("a", "1")], &[("app", "web")]);
        let first = apply(plan_for(&home, Remote::Absent, true));
        assert_eq!(first.name_any(), "settings");
        assert!(marks().on(&first.metadata), "marked");
        assert_eq!(first.data, home.data);
        // Nothing of the home object's identity goes along.
        assert_eq!(first.metadata.uid.as_deref(), Some("remote-uid"));
        assert_eq!(
            plan_for(&home, Remote::Ours(&first), true),
            Plan::Nothing,
            "up to date"
        );
        // A change at home, a label removed at home, a drift there: applied again.
        let changed = cm("settings", &[("a", "2")], &[("app", "web")]);
        assert_eq!(
            apply(plan_for(&changed, Remote::Ours(&first), true)).data,
            changed.data
        );
        let fewer = cm("settings", &[("a", "1")], &[]);
        let again = apply(plan_for(&fewer, Remote::Ours(&first), true));
        assert!(!again.labels().contains_key("app"));
        let mut drifted = first.clone();
        drifted.data = Some([("a".to_owned(), "edited there".to_owned())].into());
        assert!(matches!(
            plan_for(&home, Remote::Ours(&drifted), true),
            Plan::Apply(_)
        ));
        // What the server adds besides is not a drift.
        let mut served = first.clone();
        served.metadata.managed_fields = Some(vec![Default::default()]);
        served
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("other".into(), "theirs".into());
        assert_eq!(plan_for(&home, Remote::Ours(&served), true), Plan::Nothing);
    }

    #[test]
    fn nothing_is_done_blind_or_unreachable_or_to_someone_elses_object() {
        let home = cm("settings", &[("a", "1")], &[]);
        assert_eq!(plan_for(&home, Remote::Unknown, true), Plan::Nothing);
        assert_eq!(plan_for(&home, Remote::Absent, false), Plan::Nothing);
        let first = apply(plan_for(&home, Remote::Absent, true));
        let changed = cm("settings", &[("a", "2")], &[]);
        assert_eq!(
            plan_for(&changed, Remote::Ours(&first), false),
            Plan::Nothing
        );
        let theirs = cm("settings", &[("a", "mine")], &[]);
        assert_eq!(
            plan_for(&home, Remote::Foreign(&theirs), true),
            Plan::NotOurs
        );
    }

    #[test]
    fn our_copy_goes_when_the_home_object_goes_or_is_no_longer_reflected() {
        let home = cm("settings", &[("a", "1")], &[]);
        let ours = apply(plan_for(&home, Remote::Absent, true));
        let mut going = home.clone();
        going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(plan_for(&going, Remote::Ours(&ours), true), Plan::Delete);
        assert_eq!(plan_for(&going, Remote::Absent, true), Plan::Nothing);
        let skipped = cm("settings", &[("a", "1")], &[("skip", "")]);
        assert_eq!(plan_for(&skipped, Remote::Ours(&ours), true), Plan::Delete);
        // Already going there: nothing more.
        let mut ours_going = ours.clone();
        ours_going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(
            plan_for(&skipped, Remote::Ours(&ours_going), true),
            Plan::Nothing
        );
        assert_eq!(
            plan_for(&home, Remote::Ours(&ours_going), true),
            Plan::Nothing
        );
    }

    #[test]
    fn a_copy_that_cannot_change_in_place_is_replaced() {
        let mut home = cm("settings", &[("a", "1")], &[]);
        home.immutable = Some(true);
        let ours = apply(plan_for(&home, Remote::Absent, true));
        assert_eq!(plan_for(&home, Remote::Ours(&ours), true), Plan::Nothing);
        let mut changed = cm("settings", &[("a", "2")], &[]);
        changed.immutable = Some(true);
        assert_eq!(plan_for(&changed, Remote::Ours(&ours), true), Plan::Replace);
        // Deleted there: made again.
        assert!(matches!(
            plan_for(&changed, Remote::Absent, true),
            Plan::Apply(_)
        ));
    }

    #[test]
    fn a_reflection_from_a_peer_is_never_reflected_back() {
        let mut labels = marks().labels();
        labels.insert("app".into(), "web".into());
        let mut home = cm("settings", &[("a", "1")], &[]);
        home.metadata.labels = Some(labels);
        assert_eq!(plan_for(&home, Remote::Absent, true), Plan::Nothing);
    }

    #[test]
    fn keys_and_remote_names_map_both_ways() {
        let m = Mirror(ConfigMaps);
        let pair = Pair::namespaces("shop", "shop-alpha");
        let remote = applied(&stamped(
            cm("settings", &[], &[]),
            "settings".into(),
            &marks(),
        ));
        assert_eq!(m.key_of(&pair, &remote), Some(Key::new("shop", "settings")));
        assert_eq!(m.remote_name(&Key::new("shop", "settings")), "settings");
        // Without a home namespace there is no key to map to.
        assert_eq!(m.key_of(&Pair::everywhere_to_tenant(), &remote), None);
        assert!(m.orphaned(&remote, None));
        assert!(!m.orphaned(&remote, Some(&cm("settings", &[], &[]))));
    }

    #[test]
    fn holding_is_every_field_we_set_with_its_value() {
        let have = json!({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}, "x": true});
        assert!(holds(&have, &json!({"a": 1, "b": {"c": [1, {"d": 2}]}})));
        assert!(holds(&have, &json!({"z": null})));
        assert!(!holds(&have, &json!({"a": 2})));
        assert!(!holds(&have, &json!({"b": {"c": [1]}})), "a list is whole");
        assert!(!holds(&have, &json!({"y": 1})));
    }
}
