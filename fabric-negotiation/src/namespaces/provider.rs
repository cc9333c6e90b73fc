//! The provider's NamespaceMap controller (the I/O edge of [`super::twins`]): reads a map, its
//! Tenant, its consumer's RoleBinding and the namespaces its mappings name, and makes, keeps
//! and removes twins as [`twins::plan`] says; answers in the map's status and with Events.
//! A finalizer on each map removes its twins before it goes.
//!
//! A namespace is never written but created: twins are created (a POST fails on a name taken
//! meanwhile), with their labels then (the tenant's Pod Security level when it was made), and
//! deleted with the UID seen carrying this map's annotations as precondition.
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use fabric_api::{
    authentication::v1alpha1::Tenant,
    names::{self, annotation, label},
    offloading::v1alpha1::{
        ClaimRef, MappingPhase, NamespaceMap, RetainedClaim, ShadowPod, TwinStatus, twin_reason,
    },
};
use fabric_kube::{
    FieldManager,
    controller::Runner,
    events::Event,
    meta::{add_finalizer, delete, delete_gone_ok, only_uid, remove_finalizer},
};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolumeClaim},
    rbac::v1::{RoleBinding, Subject},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use tracing::{info, warn};

use super::{
    retention::{self, Claim, Fate},
    twins::{self, Change, Existing, Limits},
};
use crate::kit::{Error, Shared};

const FINALIZER: &str = names::finalizer::NAMESPACE_MAP;
const MANAGER: FieldManager = FieldManager(names::field_manager::NAMESPACE_MAP);
/// How soon a map with twins being removed is looked at again.
const WAIT: Duration = Duration::from_millis(500);
/// How soon a map refused a name taken by someone else is looked at again (that namespace
/// may go): its removal is not watched.
const RETRY_TAKEN: Duration = Duration::from_secs(30);
/// How often a map is looked at again when nothing happens.
const RESYNC: Duration = Duration::from_secs(300);
/// How often a map with retained claims is looked at again besides the claims' own events
/// (watched: one deleted by the provider's admin lets its twin go at once): a missed event
/// costs at most this.
const RETAINED_POLL: Duration = Duration::from_secs(60);

struct Ctx {
    base: Shared,
    limits: Limits,
}

/// The twins map `key` made, by name.
async fn twins_of(client: &Client, key: &str) -> Result<BTreeMap<String, Namespace>, Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let listed = api
        .list(&ListParams::default().labels(&format!("{}=true", label::TWIN_NAMESPACE)))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|n| Existing::of(n).twin_of.as_deref() == Some(key))
        .map(|n| (n.name_any(), n))
        .collect())
}

/// Deletes `ns`, only the object seen (a namespace made since under its name stays).
async fn delete_twin(client: &Client, ns: &Namespace) -> Result<(), Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    delete(&api, &ns.name_any(), &only_uid(ns.uid(), None)).await?;
    Ok(())
}

/// The claims the fabric made for `consumer` in twin `twin`.
async fn fabric_claims(client: &Client, twin: &str, consumer: &str) -> Result<Vec<Claim>, Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), twin);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| retention::fabric_made(c, consumer))
        .map(Claim::of)
        .collect())
}

/// Twin `twin` is kept for its claims: the consumer's rights there go (it can no longer read,
/// change or delete them) and so do its ShadowPods (the consumer no longer runs anything
/// there; their pods end with them). The ShadowPod controller's own binding stays, for
/// those pods' removal.
async fn release(client: &Client, twin: &str) -> Result<(), Error> {
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), twin);
    delete_gone_ok(&bindings, fabric_auth::tenant::ROLE).await?;
    delete_gone_ok(&bindings, twins::REFLECTION_ROLE).await?;
    let shadows: Api<ShadowPod> = Api::namespaced(client.clone(), twin);
    for s in shadows.list(&ListParams::default()).await?.items {
        if s.metadata.deletion_timestamp.is_none() {
            delete_gone_ok(&shadows, &s.name_any()).await?;
        }
    }
    Ok(())
}

/// Deletes the retained claims `forget` names, each only as the object seen (its UID).
async fn forget_claims(client: &Client, forget: &[ClaimRef]) -> Result<(), Error> {
    for c in forget {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &c.namespace);
        delete(&api, &c.name, &only_uid(Some(c.uid.clone()), None)).await?;
        info!(
            twin = c.namespace,
            claim = c.name,
            "retained claim forgotten: deleted"
        );
    }
    Ok(())
}

/// Removes every twin of map `key` (the map or its tenant going), but those kept for the
/// fabric's claims in them (`Retain`: released, as when a mapping is withdrawn); how many are
/// left being deleted.
pub async fn remove_twins(client: &Client, key: &str) -> Result<usize, Error> {
    // Only the map named after its consumer is served: its name is the consumer's id.
    let consumer = key.split_once('/').map(|(_, n)| n).unwrap_or_default();
    let twins = twins_of(client, key).await?;
    let mut kept = Vec::new();
    for (name, ns) in &twins {
        if ns.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let e = Existing::of(ns);
        let home = e.home.clone().unwrap_or_default();
        let claims = fabric_claims(client, name, consumer).await?;
        match retention::fate(name, &home, e.retention, &claims) {
            Fate::Delete => delete_twin(client, ns).await?,
            Fate::Retain { claims } => {
                release(client, name).await?;
                let listed: Vec<String> = claims.iter().map(retention::describe).collect();
                warn!(
                    map = key,
                    twin = name,
                    claims = listed.join(", "),
                    "twin kept for the fabric's claims in it (storageRetention Retain): delete them (or the namespace) to let it go"
                );
                kept.push(name.clone());
            }
        }
    }
    Ok(twins_of(client, key)
        .await?
        .keys()
        .filter(|n| !kept.contains(n))
        .count())
}

/// The subjects of the consumer's RoleBinding in its tenant namespace `ns`: its current
/// peering group, none while it has no binding.
async fn consumer_subjects(ctx: &Ctx, ns: &str) -> Result<Vec<Subject>, Error> {
    let api: Api<RoleBinding> = Api::namespaced(ctx.base.client.clone(), ns);
    Ok(api
        .get_opt(fabric_auth::tenant::ROLE)
        .await?
        .and_then(|b| b.subjects)
        .unwrap_or_default())
}

/// The tenant's rights in twin `name`, as in its tenant namespace.
async fn bind(ctx: &Ctx, consumer: &str, name: &str, subjects: &[Subject]) -> Result<(), Error> {
    let api: Api<RoleBinding> = Api::namespaced(ctx.base.client.clone(), name);
    MANAGER
        .apply(
            &api,
            &twins::consumer_binding(consumer, name, subjects.to_vec()),
        )
        .await?;
    MANAGER
        .apply(
            &api,
            &twins::reflection_binding(consumer, name, subjects.to_vec()),
        )
        .await?;
    MANAGER
        .apply(
            &api,
            &twins::sharing_binding(consumer, name, &ctx.base.namespace),
        )
        .await?;
    Ok(())
}

async fn write_status(
    ctx: &Ctx,
    map: &NamespaceMap,
    namespaces: Vec<TwinStatus>,
    retained: Vec<RetainedClaim>,
) -> Result<(), Error> {
    let old = map
        .status
        .as_ref()
        .map(|s| s.namespaces.clone())
        .unwrap_or_default();
    let old_retained = map
        .status
        .as_ref()
        .map(|s| s.retained.clone())
        .unwrap_or_default();
    let observed = map.metadata.generation;
    if old == namespaces
        && old_retained == retained
        && map.status.as_ref().and_then(|s| s.observed_generation) == observed
    {
        return Ok(());
    }
    for change in twins::changes(&old, &namespaces) {
        ctx.base.events.publish(map, &event(&change)).await;
    }
    let newly: Vec<String> = retained
        .iter()
        .filter(|c| !old_retained.iter().any(|o| o.uid == c.uid))
        .map(retention::describe)
        .collect();
    if !newly.is_empty() {
        let note = format!(
            "claims kept after their twin was given up (storageRetention Retain), no longer the consumer's to reach: {}",
            newly.join(", ")
        );
        ctx.base
            .events
            .publish(map, &Event::warning("RetainedVolumes", "Retain", note))
            .await;
    }
    let api: Api<NamespaceMap> = Api::namespaced(
        ctx.base.client.clone(),
        &map.namespace().unwrap_or_default(),
    );
    let status = fabric_api::offloading::v1alpha1::NamespaceMapStatus {
        observed_generation: observed,
        namespaces,
        retained,
    };
    MANAGER.apply_status(&api, &map.name_any(), &status).await?;
    Ok(())
}

fn event(change: &Change) -> Event {
    match change {
        Change::Created { home, remote } => Event::normal(
            "TwinCreated",
            "Create",
            format!(
                "namespace {remote} made as the twin of {home}, the tenant's rights bound there"
            ),
        ),
        Change::Refused {
            home,
            remote,
            message,
        } => Event::warning(
            "TwinRefused",
            "Create",
            format!("no twin {remote} for {home}: {message}"),
        ),
        Change::Removed { home, remote } => Event::normal(
            "TwinRemoved",
            "Delete",
            format!("twin {remote} of {home} removed with everything in it"),
        ),
    }
}

/// The map is going: its twins first, then the finalizer.
async fn finalize(
    ctx: &Ctx,
    api: &Api<NamespaceMap>,
    map: &NamespaceMap,
    key: &str,
) -> Result<Action, Error> {
    let left = remove_twins(&ctx.base.client, key).await?;
    if left > 0 {
        info!(map = key, left, "removing the map's twins");
        return Ok(Action::requeue(WAIT));
    }
    for s in map.status.iter().flat_map(|s| &s.namespaces) {
        if s.phase != MappingPhase::Refused {
            let gone = Change::Removed {
                home: s.home.clone(),
                remote: s.remote.clone(),
            };
            ctx.base.events.publish(map, &event(&gone)).await;
        }
    }
    remove_finalizer(api, map, FINALIZER).await?;
    info!(map = key, "map removed with its twins");
    Ok(Action::await_change())
}

async fn reconcile(map: Arc<NamespaceMap>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = map.namespace().unwrap_or_default();
    let api: Api<NamespaceMap> = Api::namespaced(ctx.base.client.clone(), &ns);
    let Some(map) = api.get_opt(&map.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let key = twins::map_key(&ns, &map.name_any());
    let ours = map.finalizers().iter().any(|f| f == FINALIZER);
    if map.metadata.deletion_timestamp.is_some() {
        return match ours {
            true => finalize(&ctx, &api, &map, &key).await,
            false => Ok(Action::await_change()),
        };
    }
    if !ours {
        add_finalizer(&api, &map, FINALIZER).await?;
    }
    let consumer = map.spec.cluster_id.clone();
    let tenant = Api::<Tenant>::namespaced(ctx.base.client.clone(), &ns)
        .get_opt(&consumer)
        .await?;
    let active = tenant
        .as_ref()
        .is_some_and(|t| t.metadata.deletion_timestamp.is_none());
    if let Some(why) = twins::not_served(&ns, &map.name_any(), &consumer, active) {
        let refused = twins::refused_all(&map.spec.namespaces, &why);
        write_status(&ctx, &map, refused, Vec::new()).await?;
        return Ok(Action::requeue(RESYNC));
    }
    let level = tenant.and_then(|t| t.spec.pod_security).unwrap_or_default();

    let mut seen = twins_of(&ctx.base.client, &key).await?;
    let namespaces: Api<Namespace> = Api::all(ctx.base.client.clone());
    for m in &map.spec.namespaces {
        if !seen.contains_key(&m.remote)
            && !ctx.limits.reserved(&m.remote)
            && let Some(n) = namespaces.get_opt(&m.remote).await?
        {
            seen.insert(m.remote.clone(), n);
        }
    }
    let mut existing: BTreeMap<String, Existing> = seen
        .iter()
        .map(|(k, n)| (k.clone(), Existing::of(n)))
        .collect();
    for name in twins::given_up(&key, &map.spec.namespaces, &existing) {
        let claims = fabric_claims(&ctx.base.client, &name, &consumer).await?;
        if let Some(e) = existing.get_mut(&name) {
            e.claims = claims;
        }
    }
    let plan = twins::plan(
        &key,
        &map.spec.namespaces,
        &map.spec.forget,
        &existing,
        &ctx.limits,
    );

    let subjects = consumer_subjects(&ctx, &ns).await?;
    for m in &plan.create {
        let twin = twins::namespace(&consumer, &key, m, level);
        // A create, never an apply: a namespace made meanwhile under that name is not ours
        // (409, and the next pass refuses it).
        namespaces.create(&PostParams::default(), &twin).await?;
        bind(&ctx, &consumer, &m.remote, &subjects).await?;
        info!(map = key, twin = m.remote, home = m.home, "twin made");
    }
    for m in &plan.keep {
        bind(&ctx, &consumer, &m.remote, &subjects).await?;
    }
    for name in &plan.retain {
        release(&ctx.base.client, name).await?;
    }
    forget_claims(&ctx.base.client, &plan.forget).await?;
    for name in &plan.delete {
        delete_twin(&ctx.base.client, &seen[name]).await?;
        info!(
            map = key,
            twin = name,
            "twin no longer asked for: removing it"
        );
    }
    let terminating = plan
        .status
        .iter()
        .any(|s| s.phase == MappingPhase::Terminating);
    let taken = plan
        .status
        .iter()
        .any(|s| s.reason.as_deref() == Some(twin_reason::NOT_OURS));
    write_status(&ctx, &map, plan.status, plan.retained).await?;
    Ok(if terminating || !plan.forget.is_empty() {
        Action::requeue(WAIT)
    } else if !plan.retain.is_empty() {
        Action::requeue(RETAINED_POLL)
    } else if taken {
        Action::requeue(RETRY_TAKEN)
    } else {
        Action::requeue(RESYNC)
    })
}

/// Runs until the watches end.
pub async fn run(base: Shared, limits: Limits) {
    let client = base.client.clone();
    let maps: Api<NamespaceMap> = Api::all(client.clone());
    // Its twins changing (or going), its Tenant, its consumer's RoleBinding (a re-peer names
    // another group) move a map on.
    let of_key = |key: &str| {
        let (ns, name) = key.split_once('/')?;
        Some(ObjectRef::new(name).within(ns))
    };
    let of_consumer = |id: &str| Some(ObjectRef::new(id).within(&names::namespace::tenant(id)));
    let controller = Controller::new(maps, watcher::Config::default())
        .watches(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default().labels(&format!("{}=true", label::TWIN_NAMESPACE)),
            move |n| of_key(n.annotations().get(annotation::TWIN_OF_MAP)?),
        )
        .watches(
            Api::<Tenant>::all(client.clone()),
            watcher::Config::default(),
            move |t| of_consumer(&t.spec.cluster_id),
        )
        // The fabric's claims (by its reflection mark, naming the consumer): a retained one
        // deleted lets its twin go, and the map's report follows.
        .watches(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            watcher::Config::default().labels(label::REFLECTED_FROM),
            move |c| of_consumer(c.labels().get(label::REFLECTED_FROM)?),
        )
        .watches(
            Api::<RoleBinding>::all(client),
            watcher::Config::default()
                .fields(&format!("metadata.name={}", fabric_auth::tenant::ROLE)),
            move |b| {
                let consumer = b.labels().get(label::REMOTE_CLUSTER)?;
                (b.namespace()? == names::namespace::tenant(consumer))
                    .then(|| of_consumer(consumer))
                    .flatten()
            },
        );
    let backoff = base.backoff();
    Runner::new("namespace maps (provider)", backoff)
        .run(controller, reconcile, Arc::new(Ctx { base, limits }))
        .await;
}
