//! Custom resources reflected by choice of the consumer's admin (issue 20): objects of a kind
//! known only at run time (an [`ApiResource`], resolved from a flag through discovery) copied
//! into the remote namespace, spec out and status back.
//!
//! - **Spec out**: the remote copy holds the home object's `spec`, its labels and annotations
//!   (minus ours and kubectl's), with the usual marks; written, deleted and left alone as any
//!   [`Mirror`] does ([`mirror::plan`]).
//! - **Status back**: when our remote copy's `status` differs from the home object's, the
//!   home object's status subresource is made the same, fields the remote status dropped
//!   removed too ([`status_back`], pure). Never the other way: the remote status is the
//!   provider's operator's.
//! - **A kind the provider does not accept** (403: its admin did not grant it to tenants):
//!   a `ReflectionRefused` Warning Event at home naming the kind, and no retry storm: no key of
//!   that kind is applied again in that cluster until the provider's admin grants it. Whether
//!   it has is asked, not tried: one SelfSubjectAccessReview for the kind every [`ASK_EVERY`]
//!   (no write, no Event), and its keys go on at once when the answer is yes. A refusal the
//!   provider's RBAC does not explain (its admission refusing, or no answer to the review) is
//!   left for [`Customs::recheck`] ([`gate`], pure).
use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use fabric_api::names::{self, annotation::REFLECTED_HASH};
use fabric_kube::events::Event;
use kube::{
    Resource as _, ResourceExt as _,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
};
use serde_json::{Value, json};
use tracing::{debug, info};

use crate::{
    gate::Remote,
    key::{Key, Pair},
    kind::{Cx, Kind, Next, View},
    mirror::{self, Forge, Mirror, Plan, REFUSED},
};

/// How long a kind the remote cluster refused (403) for a reason its RBAC does not explain is
/// left before it is tried again.
pub const RECHECK: Duration = Duration::from_secs(300);

/// How often the remote cluster is asked whether a kind its RBAC refused is granted now.
pub const ASK_EVERY: Duration = Duration::from_secs(10);

/// kubectl's record of what it applied: the home side's business, not the copy's.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The forge of a custom kind: `spec`, labels and annotations (minus ours).
pub struct Spec {
    pub resource: ApiResource,
}

impl Forge for Spec {
    type Home = DynamicObject;
    type Remote = DynamicObject;
    const NAME: &'static str = "customresources";

    fn home_type(&self) -> ApiResource {
        self.resource.clone()
    }

    fn remote_type(&self) -> ApiResource {
        self.resource.clone()
    }

    fn forge(&self, home: &DynamicObject) -> Option<DynamicObject> {
        let mut o = DynamicObject::new(&home.name_any(), &self.resource);
        o.metadata.labels = home.metadata.labels.clone().map(|mut l| {
            l.remove(names::label::REFLECTED_FROM);
            l.remove(names::label::REFLECTED_TO);
            l
        });
        o.metadata.annotations = home.metadata.annotations.clone().map(|mut a| {
            a.remove(REFLECTED_HASH);
            a.remove(LAST_APPLIED);
            a
        });
        o.data = match home.data.get("spec") {
            Some(spec) => json!({ "spec": spec }),
            None => json!({}),
        };
        Some(o)
    }
}

/// The merge patch of `home`'s status that makes it our remote copy `remote`'s, when that one
/// has a status and it differs from home's; `None`: nothing to write. Fields the remote
/// status no longer has are removed at home (a plain merge of the remote status would leave
/// them there for ever).
pub fn status_back(home: &DynamicObject, remote: Option<&DynamicObject>) -> Option<Value> {
    let theirs = remote?.data.get("status").filter(|s| !s.is_null())?;
    let ours = home.data.get("status").unwrap_or(&Value::Null);
    (ours != theirs).then(|| merge_patch(ours, theirs))
}

/// The JSON merge patch (RFC 7386) that turns `from` into `to`: objects field by field, a
/// field `to` lacks set to null; anything else (arrays among them) replaced whole. A null in
/// `to` means absent, as merge patches cannot say otherwise.
fn merge_patch(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(from), Value::Object(to)) => {
            let mut patch = serde_json::Map::new();
            for (k, was) in from {
                match to.get(k) {
                    None => {
                        patch.insert(k.clone(), Value::Null);
                    }
                    Some(now) if now != was => {
                        patch.insert(k.clone(), merge_patch(was, now));
                    }
                    Some(_) => {}
                }
            }
            for (k, now) in to {
                if !from.contains_key(k) {
                    patch.insert(k.clone(), now.clone());
                }
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}

/// A kind the remote cluster refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// When an object of it was last refused.
    pub at: Instant,
    /// Whether the remote cluster's RBAC said so (a SelfSubjectAccessReview denied): then it is
    /// asked again until it allows, instead of waiting out the recheck.
    pub by_rbac: bool,
    /// When it was last asked.
    pub asked: Instant,
}

/// What a key of a kind does next, given its refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Not refused, or the recheck has passed: write.
    Go,
    /// Refused by RBAC, and time to ask again whether it is granted now.
    Ask,
    /// Refused: wait this long.
    Wait(Duration),
}

/// The gate of a kind refused as `refused` at `now`: one refused by RBAC is asked again every
/// `ask_every`, any other waits out `recheck`.
pub fn gate(
    refused: Option<Refused>,
    now: Instant,
    recheck: Duration,
    ask_every: Duration,
) -> Gate {
    let Some(r) = refused else {
        return Gate::Go;
    };
    let (until, then) = if r.by_rbac {
        (r.asked + ask_every, Gate::Ask)
    } else {
        (r.at + recheck, Gate::Go)
    };
    if now < until {
        Gate::Wait(until - now)
    } else {
        then
    }
}

/// The custom kinds a remote cluster refuses now, by kind (as the flag names it), with what
/// it said: shared by the [`Customs`] of one remote cluster and whoever reports them (the
/// virtual node's conditions). A kind leaves it once an object of it is accepted again.
#[derive(Debug, Clone, Default)]
pub struct Refusals(std::sync::Arc<Mutex<std::collections::BTreeMap<String, String>>>);

impl Refusals {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kinds refused now, and what the remote cluster said of each.
    pub fn now(&self) -> std::collections::BTreeMap<String, String> {
        self.lock().clone()
    }

    fn refused(&self, kind: &str, said: &str) {
        self.lock().insert(kind.to_owned(), said.to_owned());
    }

    fn accepted(&self, kind: &str) {
        self.lock().remove(kind);
    }
}

/// The [`Kind`] of one custom kind: a [`Mirror`] of [`Spec`], with status back and the
/// refused-kind gate.
pub struct Customs {
    mirror: Mirror<Spec>,
    /// The flag value it came from (`widgets.example.com/v1`), for Events and logs.
    name: String,
    /// Whether, when and why the remote cluster refused this kind (403).
    refused: Mutex<Option<Refused>>,
    /// How long a kind refused other than by RBAC is left alone ([`RECHECK`]).
    pub recheck: Duration,
    /// How often a kind refused by RBAC is asked about ([`ASK_EVERY`]).
    pub ask_every: Duration,
    /// Where its refusal is reported.
    refusals: Refusals,
}

impl Customs {
    pub fn new(resource: ApiResource) -> Self {
        let name = if resource.group.is_empty() {
            format!("{}/{}", resource.plural, resource.version)
        } else {
            format!(
                "{}.{}/{}",
                resource.plural, resource.group, resource.version
            )
        };
        Self {
            mirror: Mirror(Spec { resource }),
            name,
            refused: Mutex::new(None),
            recheck: RECHECK,
            ask_every: ASK_EVERY,
            refusals: Refusals::default(),
        }
    }

    /// The same kind, its refusals reported in `refusals`.
    pub fn reporting(self, refusals: Refusals) -> Self {
        Self { refusals, ..self }
    }

    fn refused(&self) -> std::sync::MutexGuard<'_, Option<Refused>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What to do about one custom object: the mirror's plan, and a status to bring home.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub plan: Plan<DynamicObject>,
    pub status: Option<Value>,
    /// The remote cache has not listed while the remote cluster answers: ask for the object
    /// once, to tell a kind still listing from one the remote cluster does not let us read
    /// (its watch is refused for ever, and the mirror would wait for ever without a word).
    pub probe: bool,
}

/// Why a custom object's sync failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Mirror(#[from] mirror::Error),
    #[error("applying {kind} {namespace}/{name} in the remote cluster: {source}")]
    Apply {
        kind: String,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the status of {kind} {key} at home: {source}")]
    Status {
        kind: String,
        key: Key,
        #[source]
        source: kube::Error,
    },
}

/// `view` as the mirror of `kind` sees it (the same objects).
fn as_mirror<'a>(view: &View<'a, Customs>) -> View<'a, Mirror<Spec>> {
    View {
        key: view.key,
        pair: view.pair,
        home: view.home,
        remote: view.remote,
        reachable: view.reachable,
        marks: view.marks,
    }
}

impl Kind for Customs {
    type Home = DynamicObject;
    type Remote = DynamicObject;
    type Step = Step;
    type Error = Error;
    const NAME: &'static str = Spec::NAME;

    fn home_type(&self) -> ApiResource {
        self.mirror.0.resource.clone()
    }

    fn remote_type(&self) -> ApiResource {
        self.mirror.0.resource.clone()
    }

    /// As the flag names it (`widgets.example.com/v1`): every custom kind is a `Customs`.
    fn label(&self) -> std::borrow::Cow<'static, str> {
        self.name.clone().into()
    }

    fn remote_name(&self, key: &Key) -> String {
        self.mirror.remote_name(key)
    }

    fn key_of(&self, pair: &Pair, remote: &DynamicObject) -> Option<Key> {
        self.mirror.key_of(pair, remote)
    }

    fn orphaned(&self, remote: &DynamicObject, home: Option<&DynamicObject>) -> bool {
        self.mirror.orphaned(remote, home)
    }

    fn decide(&self, view: &View<'_, Self>) -> Step {
        let plan = mirror::plan(&self.mirror.0, &as_mirror(view));
        let status = match view.remote {
            Remote::Ours(r) if view.reachable => status_back(view.home, Some(r)),
            _ => None,
        };
        let probe =
            matches!(view.remote, Remote::Unknown) && view.reachable && view.marks.is_some();
        Step {
            plan,
            status,
            probe,
        }
    }

    async fn act(&self, cx: &Cx<'_, Self>, step: Step) -> Result<Next, Error> {
        let mut next = Next::Done;
        if step.probe {
            return self.probe(cx).await;
        }
        match step.plan {
            Plan::Apply(obj) => next = self.apply(cx, *obj).await?,
            plan => {
                let mcx = Cx {
                    view: as_mirror(&cx.view),
                    kind: &self.mirror,
                    home_client: cx.home_client,
                    endpoint: cx.endpoint,
                    events: cx.events,
                    writes: cx.writes,
                };
                self.mirror.act(&mcx, plan).await?;
            }
        }
        if let Some(status) = step.status {
            let pp = PatchParams::default();
            let after = cx
                .home_api()
                .patch_status(
                    &cx.view.key.name,
                    &pp,
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .map_err(|source| Error::Status {
                    kind: self.name.clone(),
                    key: cx.view.key.clone(),
                    source,
                })?;
            debug!(kind = %self.name, key = %cx.view.key, "status brought home");
            cx.wrote_home(after);
        }
        Ok(next)
    }
}

impl Customs {
    /// The refusal of `verb` on this kind by the remote cluster, said at home; then the remote
    /// cluster is asked whether its RBAC is the reason ([`Gate`]).
    async fn refused_now(&self, cx: &Cx<'_, Self>, now: Instant, verb: &str, said: &str) -> Next {
        let cluster = cx.endpoint.map(|e| e.marks.destination()).unwrap_or("?");
        let by_rbac = self.allowed(cx, verb).await == Some(false);
        let when = if by_rbac {
            format!(
                "reflected as soon as its admin grants it (asked every {}s)",
                self.ask_every.as_secs()
            )
        } else {
            format!("tried again in {}s", self.recheck.as_secs())
        };
        let note = format!(
            "cluster {cluster} does not accept {} from this cluster (its admin grants tenants \
             the kinds they may write there): not reflected; {when}. It said: {said}",
            self.name,
        );
        info!(kind = %self.name, key = %cx.view.key, "{note}");
        *self.refused() = Some(Refused {
            at: now,
            by_rbac,
            asked: now,
        });
        self.refusals.refused(&self.name, said);
        cx.event(&Event::warning(REFUSED, "Reflect", note)).await;
        Next::After(if by_rbac {
            self.ask_every
        } else {
            self.recheck
        })
    }

    /// Whether the remote cluster's RBAC lets this cluster `verb` this kind in the key's
    /// remote namespace now (a SelfSubjectAccessReview); `None`: no answer.
    async fn allowed(&self, cx: &Cx<'_, Self>, verb: &str) -> Option<bool> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        let (client, namespace) = (cx.remote_client()?, cx.remote_namespace()?);
        let resource = &self.mirror.0.resource;
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(resource.group.clone()),
                    version: Some(resource.version.clone()),
                    resource: Some(resource.plural.clone()),
                    namespace: Some(namespace.to_owned()),
                    verb: Some(verb.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api = kube::Api::<SelfSubjectAccessReview>::all(client.clone());
        match api.create(&Default::default(), &review).await {
            Ok(r) => r.status.map(|s| s.allowed),
            Err(e) => {
                debug!(kind = %self.name, error = %e, "asking whether the kind is granted");
                None
            }
        }
    }

    /// Whether a key of this kind may write now (`None`), or what it does instead. A kind
    /// refused by RBAC is asked about at most once per [`Customs::ask_every`], whichever of
    /// its keys comes first; a yes lifts the refusal for all of them.
    async fn gate(&self, cx: &Cx<'_, Self>, verb: &str, now: Instant) -> Option<Next> {
        let decided = {
            // Decided and marked as asked under one lock: one question, whichever key asks.
            let mut refused = self.refused();
            let g = gate(*refused, now, self.recheck, self.ask_every);
            if let (Gate::Ask, Some(r)) = (g, refused.as_mut()) {
                r.asked = now;
            }
            g
        };
        match decided {
            Gate::Go => None,
            Gate::Wait(d) => Some(Next::After(d)),
            Gate::Ask => {
                if self.allowed(cx, verb).await == Some(true) {
                    info!(kind = %self.name, "granted by the remote cluster now: reflecting it");
                    *self.refused() = None;
                    None
                } else {
                    Some(Next::After(self.ask_every))
                }
            }
        }
    }

    /// Reads the key's remote object once while the remote cache has not listed: a 403 is
    /// this kind refused there.
    async fn probe(&self, cx: &Cx<'_, Self>) -> Result<Next, Error> {
        let Some(api) = cx.remote_api() else {
            return Ok(Next::Done);
        };
        let now = Instant::now();
        if let Some(next) = self.gate(cx, "get", now).await {
            return Ok(next);
        }
        match api.get_opt(&cx.remote_name()).await {
            Err(kube::Error::Api(s)) if s.code == 403 => {
                Ok(self.refused_now(cx, now, "get", &s.message).await)
            }
            // Still listing, or out of reach for a moment: the cache's listing syncs the key
            // again.
            _ => Ok(Next::Done),
        }
    }

    /// Applies `obj` in the remote namespace, unless the remote cluster refuses this kind
    /// ([`Customs::gate`]); a refusal is said at home.
    async fn apply(&self, cx: &Cx<'_, Self>, mut obj: DynamicObject) -> Result<Next, Error> {
        let (Some(api), Some(namespace)) = (cx.remote_api(), cx.remote_namespace()) else {
            return Ok(Next::Done);
        };
        let now = Instant::now();
        // A server-side apply of an object that is not there yet creates it.
        if let Some(next) = self.gate(cx, "create", now).await {
            return Ok(next);
        }
        let name = cx.remote_name();
        obj.meta_mut().namespace = Some(namespace.to_owned());
        let pp = PatchParams::apply(names::field_manager::REFLECTION).force();
        match api.patch(&name, &pp, &Patch::Apply(&obj)).await {
            Ok(_) => {
                *self.refused() = None;
                self.refusals.accepted(&self.name);
                debug!(kind = %self.name, key = %cx.view.key, "reflected");
                Ok(Next::Done)
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                Ok(self.refused_now(cx, now, "create", &s.message).await)
            }
            Err(source) => Err(Error::Apply {
                kind: self.name.clone(),
                namespace: namespace.to_owned(),
                name,
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::GroupVersionKind;

    use super::*;
    use crate::marks::Marks;

    fn widgets() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.com", "v1", "Widget"),
            "widgets",
        )
    }

    fn widget(name: &str, data: Value) -> DynamicObject {
        let mut o = DynamicObject::new(name, &widgets()).within("shop");
        o.metadata.uid = Some(format!("uid-{name}"));
        o.data = data;
        o
    }

    #[test]
    fn the_copy_holds_the_spec_and_labels_but_not_status_nor_our_marks() {
        let mut home = widget("w", json!({"spec": {"size": 3}, "status": {"ready": true}}));
        home.metadata.labels = Some(
            [("app", "web"), (names::label::REFLECTED_TO, "x")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
        );
        home.metadata.annotations = Some([(LAST_APPLIED.to_owned(), "{}".to_owned())].into());
        let copy = Spec {
            resource: widgets(),
        }
        .forge(&home)
        .unwrap();
        assert_eq!(copy.data, json!({"spec": {"size": 3}}));
        assert_eq!(copy.types.as_ref().unwrap().api_version, "example.com/v1");
        assert_eq!(copy.types.as_ref().unwrap().kind, "Widget");
        let labels = copy.metadata.labels.unwrap();
        assert_eq!(labels.get("app").map(String::as_str), Some("web"));
        assert!(!labels.contains_key(names::label::REFLECTED_TO));
        assert!(copy.metadata.annotations.unwrap().is_empty());
    }

    #[test]
    fn a_spec_change_is_applied_and_an_unchanged_one_is_not() {
        let marks = Marks::new("alpha", "beta");
        let pair = Pair::namespaces("shop", "shop-alpha");
        let spec = Spec {
            resource: widgets(),
        };
        let home = widget("w", json!({"spec": {"size": 3}}));
        let Plan::Apply(first) = mirror::plan_of(&spec, &pair, &home, Remote::Absent, true, &marks)
        else {
            panic!("expected an apply")
        };
        let mut there = *first;
        there.metadata.uid = Some("remote".into());
        // The operator's status there is no drift.
        there.data["status"] = json!({"ready": true});
        assert_eq!(
            mirror::plan_of(&spec, &pair, &home, Remote::Ours(&there), true, &marks),
            Plan::Nothing
        );
        let bigger = widget("w", json!({"spec": {"size": 4}}));
        assert!(matches!(
            mirror::plan_of(&spec, &pair, &bigger, Remote::Ours(&there), true, &marks),
            Plan::Apply(_)
        ));
    }

    #[test]
    fn the_remote_status_comes_home_when_it_differs() {
        let home = widget("w", json!({"spec": {"size": 3}}));
        let there = widget("w", json!({"spec": {"size": 3}, "status": {"ready": true}}));
        assert_eq!(
            status_back(&home, Some(&there)),
            Some(json!({"ready": true}))
        );
        let home_done = widget("w", json!({"spec": {"size": 3}, "status": {"ready": true}}));
        assert_eq!(status_back(&home_done, Some(&there)), None, "already home");
        // No status there (yet), or no copy: home's is left as it is.
        let bare = widget("w", json!({"spec": {"size": 3}}));
        assert_eq!(status_back(&home_done, Some(&bare)), None);
        assert_eq!(status_back(&home_done, None), None);
        let changed = widget("w", json!({"status": {"ready": false}}));
        assert_eq!(
            status_back(&home_done, Some(&changed)),
            Some(json!({"ready": false}))
        );
        // What the remote status dropped goes at home too, nested fields included; lists are
        // replaced whole.
        let home_more = widget(
            "w",
            json!({"status": {"ready": true, "phase": "Old", "at": {"a": 1, "b": 2}, "l": [1, 2]}}),
        );
        let there_less = widget(
            "w",
            json!({"status": {"ready": true, "at": {"a": 1}, "l": [2], "new": "x"}}),
        );
        assert_eq!(
            status_back(&home_more, Some(&there_less)),
            Some(json!({"phase": null, "at": {"b": null}, "l": [2], "new": "x"}))
        );
    }

    #[test]
    fn a_kind_refused_by_rbac_is_asked_about_and_any_other_waits_for_the_recheck() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let (recheck, ask) = (s(300), s(10));
        let at = |secs| t0 + s(secs);
        assert_eq!(gate(None, t0, recheck, ask), Gate::Go, "never refused");
        let rbac = Refused {
            at: t0,
            by_rbac: true,
            asked: t0,
        };
        assert_eq!(gate(Some(rbac), at(4), recheck, ask), Gate::Wait(s(6)));
        assert_eq!(gate(Some(rbac), at(10), recheck, ask), Gate::Ask);
        // Asked again at 25 s (and still refused): the next question 10 s after that one.
        let asked = Refused {
            asked: at(25),
            ..rbac
        };
        assert_eq!(gate(Some(asked), at(30), recheck, ask), Gate::Wait(s(5)));
        assert_eq!(gate(Some(asked), at(400), recheck, ask), Gate::Ask);
        let other = Refused {
            by_rbac: false,
            ..rbac
        };
        assert_eq!(gate(Some(other), at(100), recheck, ask), Gate::Wait(s(200)));
        assert_eq!(gate(Some(other), at(300), recheck, ask), Gate::Go);
        assert_eq!(gate(Some(other), at(301), recheck, ask), Gate::Go);
    }

    #[test]
    fn a_kind_whose_remote_cache_does_not_list_is_probed_while_reachable() {
        let kind = Customs::new(widgets());
        let marks = Marks::new("alpha", "beta");
        let pair = Pair::namespaces("shop", "shop-alpha");
        let key = Key::new("shop", "w");
        let home = std::sync::Arc::new(widget("w", json!({"spec": {"size": 1}})));
        let step = |remote, reachable| {
            kind.decide(&View {
                key: &key,
                pair: &pair,
                home: &home,
                remote,
                reachable,
                marks: Some(&marks),
            })
        };
        let unknown = step(Remote::Unknown, true);
        assert!(
            unknown.probe && unknown.plan == Plan::Nothing,
            "{unknown:?}"
        );
        assert!(
            !step(Remote::Unknown, false).probe,
            "not while out of reach"
        );
        let absent = step(Remote::Absent, true);
        assert!(
            !absent.probe && matches!(absent.plan, Plan::Apply(_)),
            "{absent:?}"
        );
    }

    #[test]
    fn a_refusal_is_reported_until_the_kind_is_accepted() {
        let r = Refusals::default();
        let reported = r.clone();
        r.refused("gadgets.example.com/v1", "forbidden");
        r.refused("widgets.example.com/v1", "forbidden too");
        r.accepted("widgets.example.com/v1");
        assert_eq!(
            reported.now().into_iter().collect::<Vec<_>>(),
            [("gadgets.example.com/v1".to_owned(), "forbidden".to_owned())]
        );
    }

    #[test]
    fn the_kind_is_named_as_the_flag_names_it() {
        let widgets = Customs::new(widgets());
        assert_eq!(widgets.name, "widgets.example.com/v1");
        // Its metrics too, apart from any other custom kind's.
        assert_eq!(widgets.label(), "widgets.example.com/v1");
    }
}
