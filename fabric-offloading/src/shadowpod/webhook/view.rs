//! What the webhook decides, from watch caches of who may do what where and the Tenants
//! read afresh: each review's verdict ([`View`]), the I/O around the pure decisions of
//! [`super::super::admission`], [`super::super::policy`], [`super::super::quota`] and
//! [`super::super::claims`].
use std::time::Duration;

use fabric_api::authentication::mode::{TenantRef, Tether};
use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, Tenant, TenantState},
    names::{self, label},
    offloading::{
        namespaces,
        v1alpha1::{NamespaceOffloading, ShadowPod},
    },
};
use k8s_openapi::{
    api::core::v1::{Namespace, PersistentVolumeClaim},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams},
    core::admission::{AdmissionRequest, Operation},
    runtime::reflector::{ObjectRef, Store},
};
use tracing::warn;

use super::{
    super::{
        admission::{self, Denial, Verdict},
        claims::{self, Claim},
        policy::Rules,
        quota,
    },
    charges::{self, Rewrite, Unwritten},
};
use crate::pod_placement::{self, Refusal};

/// What the decisions read: watch caches of who may do what where, and the Tenants.
pub(super) struct View {
    pub(super) client: Client,
    pub(super) slices: Store<ResourceSlice>,
    pub(super) namespaces: Store<Namespace>,
    pub(super) charger: charges::Charger,
    /// What the provider lets tenants' pods do and where they run (a Tenant may have a level
    /// of its own).
    pub(super) rules: Rules,
    pub(super) tenants: Store<Tenant>,
    /// The consumer's NamespaceOffloadings, for the pods of offloaded namespaces.
    pub(super) offloadings: Store<NamespaceOffloading>,
    /// How many ShadowPods (running or finished) a tenant may have.
    pub(super) max_shadow_pods: u32,
    /// How many of each other kind a tenant may have in a namespace.
    pub(super) max_objects: u32,
    /// How large one ShadowPod of a tenant may be, and all of them together (bytes).
    pub(super) max_shadow_pod_bytes: u64,
    pub(super) max_tenant_bytes: u64,
    /// How long a charge of another kind's creation counts before a listing shows it.
    pub(super) pending_ttl: Duration,
    /// How long a claim's charge keeps trying over concurrent ones.
    pub(super) charge_budget: Duration,
    /// What is accepted while the cluster is tethered.
    pub(super) tethered_exempt: crate::tethered::Exemptions,
}

/// The object a review asks about, when it is one the webhook judges: the object itself
/// (not a subresource) created or updated.
fn judged<K: kube::Resource>(req: &AdmissionRequest<K>) -> Option<&K> {
    match (&req.object, &req.operation) {
        (Some(o), Operation::Create | Operation::Update) if req.sub_resource.is_none() => Some(o),
        _ => None,
    }
}

impl View {
    pub(super) async fn decide(&self, req: &AdmissionRequest<ShadowPod>) -> Result<(), Denial> {
        let user = req.user_info.username.as_deref().unwrap_or_default();
        let Some(shadow) = judged(req) else {
            return Ok(());
        };
        let namespace = req.namespace.clone().unwrap_or_default();
        let name = if req.name.is_empty() {
            shadow.name_any()
        } else {
            req.name.clone()
        };
        let owner = self
            .namespaces
            .get(&ObjectRef::new(&namespace))
            .and_then(|n| n.labels().get(label::REMOTE_CLUSTER).cloned());
        let old = match req.operation {
            Operation::Update => req.old_object.as_ref(),
            _ => None,
        };
        // The level of the tenant the ShadowPod names; one naming another tenant than its
        // writer's is refused below whatever its pod.
        let consumer = &shadow.spec.cluster_id;
        let tenant = self
            .tenants
            .get(&ObjectRef::new(consumer).within(&names::namespace::tenant(consumer)));
        let level = tenant.as_ref().and_then(|t| t.spec.pod_security);
        let rules = self.rules.for_tenant(level);
        admission::conforms(&shadow.spec, old.map(|o| &o.spec), &rules)?;
        let verdict = admission::admit_change(
            user,
            &namespace,
            owner.as_deref(),
            &shadow.spec,
            old,
            &rules.default_requests,
        )?;
        // What it adds to the provider's store: charged as its requests are, so that a
        // tenant's ShadowPods stay within a size whatever their number.
        let bytes = quota::size(shadow);
        let grown = bytes.saturating_sub(old.map_or(0, quota::size));
        let (consumer, requests, more) = match verdict {
            Verdict::Unlimited => return Ok(()),
            Verdict::Within if grown == 0 => return Ok(()),
            Verdict::Within => (
                shadow.spec.cluster_id.clone(),
                admission::requested(&shadow.spec, &rules.default_requests)?,
                Default::default(),
            ),
            Verdict::Charge {
                consumer,
                requests,
                more,
            } => (consumer, requests, more),
        };
        if bytes > self.max_shadow_pod_bytes {
            return Err(Denial::TooLarge {
                bytes,
                max: self.max_shadow_pod_bytes,
            });
        }
        // Said plainly, whatever the grant still says (it is answered with zero in a while)
        // and whatever the pod asks for: nothing new, nothing larger.
        let drained = tenant.is_some_and(|t| t.spec.state == TenantState::Drained);
        if drained && (old.is_none() || more.values().any(|v| *v > 0)) {
            return Err(Denial::Drained { cluster: consumer });
        }
        let granted = admission::granted(&consumer, self.slices.state().iter().map(|s| &**s))?;
        let ask = quota::Ask {
            namespace,
            name,
            requests,
            more,
            granted,
            // Every new ShadowPod is an object more in the provider's store, whatever it asks.
            limit: old.is_none().then_some(self.max_shadow_pods),
            bytes: quota::Bytes {
                grown,
                max: self.max_tenant_bytes,
            },
        };
        self.charge(&consumer, ask, req.dry_run).await
    }

    /// Whether the creation in `req` of an object that is not a ShadowPod keeps its
    /// consumer within [`Self::max_objects`] of its kind in its namespace: counted on a fresh
    /// listing and the creations admitted since, charged on the consumer's Tenant
    /// ([`charges::Charger::charge_object`]) so that every replica sees the others'.
    pub(super) async fn decide_object(
        &self,
        req: &AdmissionRequest<DynamicObject>,
    ) -> Result<(), Denial> {
        let user = req.user_info.username.as_deref().unwrap_or_default();
        let Some(consumer) = admission::consumer_of(user) else {
            return Ok(());
        };
        if req.operation != Operation::Create || req.sub_resource.is_some() {
            return Ok(());
        }
        let namespace = req.namespace.clone().unwrap_or_default();
        let gvk = &req.kind;
        let resource = ApiResource {
            group: gvk.group.clone(),
            version: gvk.version.clone(),
            api_version: if gvk.group.is_empty() {
                gvk.version.clone()
            } else {
                format!("{}/{}", gvk.group, gvk.version)
            },
            kind: gvk.kind.clone(),
            plural: req.resource.resource.clone(),
        };
        let kind = format!("{}/{}", gvk.group, gvk.kind);
        // The name a listing will show; a generated one is set by the time a validating
        // webhook is called, the request's uid stands in should it not be.
        let name = [
            req.name.as_str(),
            req.object
                .as_ref()
                .and_then(|o| o.metadata.name.as_deref())
                .unwrap_or_default(),
            req.uid.as_str(),
        ]
        .into_iter()
        .find(|n| !n.is_empty())
        .unwrap_or_default()
        .to_owned();
        let ask = quota::ObjectAsk {
            user,
            kind: &kind,
            kind_name: &gvk.kind,
            namespace: &namespace,
            name: &name,
            max: self.max_objects,
        };
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &namespace, &resource);
        let list = || async {
            Ok(api
                .list_metadata(&ListParams::default())
                .await?
                .items
                .into_iter()
                .map(|o| o.name_any())
                .collect())
        };
        self.charger
            .charge_object(consumer, &ask, self.pending_ttl, req.dry_run, list)
            .await
    }

    /// Whether the claim created or updated in `req` keeps its consumer within the storage it
    /// was granted of its class ([`claims::charge`]). Not a consumer's request, a
    /// subresource, or an update that does not grow the claim: nothing to charge.
    pub(super) async fn decide_claim(
        &self,
        req: &AdmissionRequest<DynamicObject>,
    ) -> Result<(), Denial> {
        let user = req.user_info.username.as_deref().unwrap_or_default();
        let Some(consumer) = admission::consumer_of(user) else {
            return Ok(());
        };
        if req.operation == Operation::Delete {
            // A deletion is never refused here: it only gives the claim's share back.
            if !req.dry_run && req.sub_resource.is_none() {
                let namespace = req.namespace.clone().unwrap_or_default();
                if let Err(e) = self.release_claim(consumer, &namespace, &req.name).await {
                    warn!(consumer, claim = %req.name, namespace, error = %e, "the deleted claim's charge stays until it lapses");
                }
            }
            return Ok(());
        }
        let Some(object) = judged(req) else {
            return Ok(());
        };
        let namespace = req.namespace.clone().unwrap_or_default();
        let pvc = |o: &DynamicObject| {
            serde_json::to_value(o)
                .and_then(serde_json::from_value::<PersistentVolumeClaim>)
                .map_err(|e| Denial::Claim(format!("not a PersistentVolumeClaim: {e}")))
        };
        let ask = Claim::of(&pvc(object)?, &namespace)?;
        if req.operation == Operation::Update
            && let Some(old) = &req.old_object
            && Claim::of(&pvc(old)?, &namespace).is_ok_and(|o| o.size >= ask.size)
        {
            return Ok(());
        }
        // Its claims are counted in its namespaces: one elsewhere would escape the count.
        let owner = self
            .namespaces
            .get(&ObjectRef::new(&namespace))
            .and_then(|n| n.labels().get(label::REMOTE_CLUSTER).cloned());
        if owner.as_deref() != Some(consumer) {
            return Err(Denial::ForeignNamespace {
                namespace,
                cluster: consumer.to_owned(),
            });
        }
        let granted = admission::granted(consumer, self.slices.state().iter().map(|s| &**s))?;
        self.charge_claim(consumer, &ask, &granted, req.dry_run)
            .await
    }

    /// Claim `namespace/name` of `consumer` is being deleted: its pending charges dropped from
    /// the Tenant ([`claims::release`]), written over the version read, again on a conflict
    /// within the budget. A claim created and deleted between two listings of the usage
    /// reconciler would otherwise hold its share until the charge lapses.
    pub(super) async fn release_claim(
        &self,
        consumer: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), kube::Error> {
        let released = charges::rewrite_status::<_, std::convert::Infallible, _>(
            &self.client,
            consumer,
            self.charge_budget,
            |status| async move {
                Ok(match claims::release(&status, namespace, name) {
                    Some(released) => Rewrite::Write(released, ()),
                    None => Rewrite::Answer(()),
                })
            },
        )
        .await;
        match released {
            Ok(()) | Err(Unwritten::NoTenant) => Ok(()),
            Err(Unwritten::Kube(e)) => Err(e),
            Err(Unwritten::Denied(never)) => match never {},
        }
    }

    /// The consumer's claims as listed now, in the namespaces carrying its label; claims that
    /// cannot be read count as nothing (this webhook admitted none such).
    pub(super) async fn claims_of(&self, consumer: &str) -> Result<Vec<Claim>, kube::Error> {
        let mut out = Vec::new();
        for ns in self.namespaces.state() {
            if ns.labels().get(label::REMOTE_CLUSTER).map(String::as_str) != Some(consumer) {
                continue;
            }
            let name = ns.name_any();
            let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &name);
            for pvc in api.list(&ListParams::default()).await? {
                out.extend(Claim::of(&pvc, &name).ok());
            }
        }
        Ok(out)
    }

    /// Charges `ask` on the consumer's Tenant: read it, list the claims, decide, write over
    /// the version read; again on a conflict within the budget. A dry run writes nothing.
    pub(super) async fn charge_claim(
        &self,
        consumer: &str,
        ask: &Claim,
        granted: &fabric_api::authentication::v1alpha1::Resources,
        dry_run: bool,
    ) -> Result<(), Denial> {
        charges::rewrite_status(
            &self.client,
            consumer,
            self.charge_budget,
            |status| async move {
                // The Tenant first: a charge in it was admitted before this listing.
                let listed = self.claims_of(consumer).await.map_err(Unwritten::Kube)?;
                let status = claims::charge(
                    &status,
                    consumer,
                    ask,
                    &listed,
                    granted,
                    Timestamp::now(),
                    self.pending_ttl,
                )
                .map_err(Unwritten::Denied)?;
                Ok(Rewrite::unless_dry_run(dry_run, status))
            },
        )
        .await
        .map_err(|e| e.denial(consumer))
    }

    /// Whether the pod created in `req` may be, as the cluster's working mode (from the
    /// Tenants' cache) says ([`crate::tethered::verdict`]).
    pub(super) fn tethered_pod(
        &self,
        req: &AdmissionRequest<DynamicObject>,
    ) -> Result<(), crate::tethered::Refused> {
        if req.operation != Operation::Create || req.sub_resource.is_some() {
            return Ok(());
        }
        let tenants: Vec<TenantRef> = self
            .tenants
            .state()
            .iter()
            .map(|t| TenantRef::of(t))
            .collect();
        crate::tethered::verdict(
            &Tether::of(&tenants),
            req.namespace.as_deref().unwrap_or_default(),
            req.user_info.username.as_deref().unwrap_or_default(),
            &self.tethered_exempt,
        )
    }

    /// Where the pod created in `req` may run ([`pod_placement::mutate`]), from the namespace's
    /// NamespaceOffloading: the watch cache's, or a fresh read when the cache has none yet
    /// (one created a moment ago, by `fabricctl offload` right after the namespace's label).
    pub(super) async fn place(
        &self,
        req: &AdmissionRequest<DynamicObject>,
    ) -> Result<Option<json_patch::Patch>, Refusal> {
        let (Some(pod), Operation::Create) = (&req.object, &req.operation) else {
            return Ok(None);
        };
        if req.sub_resource.is_some() {
            return Ok(None);
        }
        let namespace = req.namespace.clone().unwrap_or_default();
        let key = ObjectRef::new(namespaces::NAME).within(&namespace);
        let offloading = match self.offloadings.get(&key) {
            Some(o) => Some((*o).clone()),
            None => Api::<NamespaceOffloading>::namespaced(self.client.clone(), &namespace)
                .get_opt(namespaces::NAME)
                .await
                .map_err(|e| Refusal::Unreadable {
                    namespace: namespace.clone(),
                    error: e.to_string(),
                })?,
        };
        let pod = serde_json::to_value(pod).map_err(|e| Refusal::Malformed(e.to_string()))?;
        pod_placement::mutate(&namespace, &pod, offloading.as_ref())
    }

    /// Charges `c` on the consumer's Tenant, batched with the other admissions of the moment
    /// for that consumer ([`charges::Charger`]); a dry run is decided on a fresh read of the
    /// Tenant and writes nothing.
    pub(super) async fn charge(
        &self,
        consumer: &str,
        ask: quota::Ask,
        dry_run: bool,
    ) -> Result<(), Denial> {
        if !dry_run {
            return self.charger.charge(consumer, ask).await;
        }
        let tenants: Api<Tenant> =
            Api::namespaced(self.client.clone(), &names::namespace::tenant(consumer));
        let Some(tenant) = tenants
            .get_opt(consumer)
            .await
            .map_err(|e| Denial::Unaccounted {
                cluster: consumer.to_owned(),
                error: e.to_string(),
            })?
        else {
            return Err(Denial::NoTenant {
                cluster: consumer.to_owned(),
            });
        };
        quota::charge(
            &tenant.status.unwrap_or_default(),
            consumer,
            &ask,
            Timestamp::now(),
        )?;
        Ok(())
    }
}
