//! Approving consumers' certificate requests, away from the authentication service: the
//! service faces the internet, so it only creates CSRs and waits for their certificates; this
//! controller (run by `fabric-controller sharing`, or `csr-approver` alone) approves a CSR only
//! when it is what a peering or a renewal asks for, and denies, saying why, every other CSR
//! the service made. A compromised service thus gets no subject signed but a tenant's own.
//!
//! [`judge`] is the whole decision, a pure function of the CSR and of what the provider holds
//! for the consumer it names (its Tenant and its RoleBinding); [`run`] is the thin edge.
use std::{sync::Arc, time::Duration};

use fabric_api::{authentication::v1alpha1::Tenant, names};
use fabric_kube::{
    controller::{Backoff, Runner},
    events::{Event, Events},
};
use k8s_openapi::{
    api::{certificates::v1::CertificateSigningRequest, rbac::v1::RoleBinding},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{Controller, controller::Action, watcher},
};
use tracing::{info, warn};
use x509_parser::prelude::{FromDer, X509CertificationRequest};

use crate::{
    provider::{SIGNER, csr_name},
    tenant, validate,
};

/// What the approver accepts.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The authentication service's user (`system:serviceaccount:NS:fabric-auth`): the only
    /// requester whose CSRs are judged; other users' CSRs are not this approver's.
    pub requester: String,
    /// The longest validity approved (`expirationSeconds`).
    pub max_ttl: Duration,
}

impl Settings {
    /// The authentication service's ServiceAccount in `namespace`, certificates of at most
    /// `max_ttl`.
    pub fn new(namespace: &str, max_ttl: Duration) -> Self {
        Self {
            requester: format!("system:serviceaccount:{namespace}:{AUTH_SERVICE_ACCOUNT}"),
            max_ttl,
        }
    }
}

/// The authentication service's ServiceAccount (deploy/base/auth.yaml).
pub const AUTH_SERVICE_ACCOUNT: &str = "fabric-auth";

/// The only usages a consumer's certificate is approved with.
const USAGES: [&str; 2] = ["digital signature", "client auth"];

/// What the approver does with a CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not the authentication service's request for a client certificate, or already
    /// decided: left alone.
    NotOurs,
    /// A consumer's request, as a peering or renewal of `consumer` makes it.
    Approve { consumer: String },
    /// The service asked for something it must not get.
    Deny(String),
}

/// The consumer a CSR's subject names (CN [`names::user::consumer`]), whatever else it says:
/// [`validate::check_csr`] then checks the rest against that consumer.
fn named_consumer(pem: &str) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents).ok()?;
    let cn = csr
        .certification_request_info
        .subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    cn.strip_prefix(&names::user::consumer(""))
        .filter(|id| fabric_api::identity::is_dns_label(id))
        .map(str::to_owned)
}

fn decided(csr: &CertificateSigningRequest) -> bool {
    csr.status.as_ref().is_some_and(|s| {
        s.certificate.is_some()
            || s.conditions.iter().flatten().any(|c| {
                matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed") && c.status == "True"
            })
    })
}

/// The first part of the decision, from the CSR alone: its requester, signer, usages,
/// validity and request. `Ok` is the consumer and peering group it asks for.
pub fn claim(
    csr: &CertificateSigningRequest,
    settings: &Settings,
) -> Result<(String, String), Verdict> {
    let spec = &csr.spec;
    if spec.signer_name != SIGNER
        || spec.username.as_deref() != Some(settings.requester.as_str())
        || decided(csr)
    {
        return Err(Verdict::NotOurs);
    }
    let deny = |why: String| Err(Verdict::Deny(why));
    let usages = spec.usages.clone().unwrap_or_default();
    if !usages.iter().any(|u| u == "client auth")
        || usages.iter().any(|u| !USAGES.contains(&u.as_str()))
    {
        return deny(format!(
            "usages {usages:?}: a consumer's certificate is for client auth only ({USAGES:?})"
        ));
    }
    let max = settings.max_ttl.as_secs();
    match spec.expiration_seconds {
        Some(s) if s > 0 && (s as u64) <= max.max(600) => {}
        other => {
            return deny(format!(
                "expirationSeconds {other:?}: a consumer's certificate is valid {max} s at most"
            ));
        }
    }
    let Ok(pem) = std::str::from_utf8(&spec.request.0) else {
        return deny("the request is not PEM".to_owned());
    };
    let Some(consumer) = named_consumer(pem) else {
        return deny(format!(
            "the request names no consumer (CN {}<cluster id>)",
            names::user::consumer("")
        ));
    };
    let peering = validate::check_csr(pem, &consumer).map_err(|r| Verdict::Deny(r.message))?;
    if csr.metadata.name.as_deref() != Some(csr_name(&consumer, pem).as_str()) {
        return deny(format!(
            "named {:?}, not {} as the authentication service names a request of {consumer}",
            csr.metadata.name.as_deref().unwrap_or_default(),
            csr_name(&consumer, pem)
        ));
    }
    Ok((consumer, peering))
}

/// The decision on `csr`, given `consumer`'s Tenant and RoleBinding (of the consumer
/// [`claim`] reads from it): approved only for the peering group the RoleBinding binds now.
pub fn judge(
    csr: &CertificateSigningRequest,
    settings: &Settings,
    tenant: Option<&Tenant>,
    binding: Option<&RoleBinding>,
) -> Verdict {
    let (consumer, peering) = match claim(csr, settings) {
        Ok(c) => c,
        Err(v) => return v,
    };
    if tenant.is_none_or(|t| t.metadata.deletion_timestamp.is_some()) {
        return Verdict::Deny(format!("consumer {consumer} has no Tenant here"));
    }
    let bound: Vec<&str> = binding
        .and_then(|b| b.subjects.as_ref())
        .into_iter()
        .flatten()
        .filter(|s| s.kind == "Group")
        .map(|s| s.name.as_str())
        .collect();
    if bound != [peering.as_str()] {
        return Verdict::Deny(format!(
            "the request is for peering group {peering}; tenant {consumer}'s RoleBinding binds \
             {bound:?}"
        ));
    }
    Verdict::Approve { consumer }
}

struct Ctx {
    client: Client,
    settings: Settings,
    events: Events,
}

#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct Error {
    what: &'static str,
    #[source]
    source: kube::Error,
}

fn err(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error { what, source }
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let (tenant, binding) = match claim(&csr, &ctx.settings) {
        Err(Verdict::NotOurs) => return Ok(Action::await_change()),
        Err(_) => (None, None),
        Ok((consumer, _)) => {
            let ns = names::namespace::tenant(&consumer);
            let tenant = Api::<Tenant>::namespaced(ctx.client.clone(), &ns)
                .get_opt(&consumer)
                .await
                .map_err(err("reading the Tenant"))?;
            let binding = Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns)
                .get_opt(tenant::ROLE)
                .await
                .map_err(err("reading the tenant's RoleBinding"))?;
            (tenant, binding)
        }
    };
    let verdict = judge(&csr, &ctx.settings, tenant.as_ref(), binding.as_ref());
    let (kind, reason, message, event) = match &verdict {
        Verdict::NotOurs => return Ok(Action::await_change()),
        Verdict::Approve { consumer } => {
            let m = format!("the request of consumer {consumer}'s current peering");
            let e = Event::normal("Approved", "Approve", m.clone());
            ("Approved", "FabricConsumer", m, e)
        }
        Verdict::Deny(why) => {
            let m = format!("not a consumer's request: {why}");
            let e = Event::warning("Denied", "Approve", m.clone());
            ("Denied", "NotAConsumerRequest", m, e)
        }
    };
    let name = csr.name_any();
    let condition = serde_json::json!({"status": {"conditions": [{
        "type": kind, "status": "True", "reason": reason, "message": message,
        "lastUpdateTime": Time(Timestamp::now()),
    }]}});
    Api::<CertificateSigningRequest>::all(ctx.client.clone())
        .patch_approval(&name, &PatchParams::default(), &Patch::Merge(&condition))
        .await
        .map_err(err("writing the CSR's approval"))?;
    match verdict {
        Verdict::Deny(_) => {
            warn!(csr = %name, %message, "denied a CSR of the authentication service")
        }
        _ => info!(csr = %name, %message, "approved a consumer's CSR"),
    }
    ctx.events.publish(csr.as_ref(), &event).await;
    Ok(Action::await_change())
}

/// Judges the authentication service's CSRs until the task is dropped.
pub async fn run(client: Client, settings: Settings) {
    let ctx = Arc::new(Ctx {
        events: Events::new(client.clone(), "fabric-csr-approver", None),
        client: client.clone(),
        settings,
    });
    let controller = Controller::new(
        Api::<CertificateSigningRequest>::all(client),
        watcher::Config::default(),
    );
    Runner::new("csr-approver", Backoff::STANDARD)
        .until_dropped()
        .run(controller, reconcile, ctx)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{consumer, provider::csr_object};

    const AUTH: &str = "system:serviceaccount:fabric-system:fabric-auth";

    fn settings() -> Settings {
        Settings::new("fabric-system", Duration::from_secs(24 * 3600))
    }

    fn tenant_of(id: &str) -> Tenant {
        let mut t: Tenant = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.fabric.io/v1alpha1", "kind": "Tenant",
            "metadata": { "name": id }, "spec": { "clusterId": id },
        }))
        .unwrap();
        t.metadata.namespace = Some(names::namespace::tenant(id));
        t
    }

    fn binding(group: &str) -> RoleBinding {
        tenant::role_binding("alpha", group)
    }

    /// A CSR as the service writes it for `id` in peering `group`, requested by `user`.
    fn request(id: &str, group: &str, user: &str) -> CertificateSigningRequest {
        let (_, pem) = consumer::key_and_csr_in(id, group).unwrap();
        let mut csr = csr_object(id, &pem, Duration::from_secs(3600));
        csr.spec.username = Some(user.into());
        csr
    }

    #[test]
    fn the_services_request_for_the_bound_peering_is_approved() {
        let group = names::user::peering("alpha", "n1");
        let csr = request("alpha", &group, AUTH);
        assert_eq!(
            judge(
                &csr,
                &settings(),
                Some(&tenant_of("alpha")),
                Some(&binding(&group))
            ),
            Verdict::Approve {
                consumer: "alpha".into()
            }
        );
    }

    #[test]
    fn others_requests_and_decided_ones_are_left_alone() {
        let group = names::user::peering("alpha", "n1");
        let (t, b) = (tenant_of("alpha"), binding(&group));
        let mut csr = request("alpha", &group, "mallory");
        assert_eq!(
            judge(&csr, &settings(), Some(&t), Some(&b)),
            Verdict::NotOurs
        );
        csr.spec.username = Some(AUTH.into());
        csr.spec.signer_name = "kubernetes.io/kubelet-serving".into();
        assert_eq!(
            judge(&csr, &settings(), Some(&t), Some(&b)),
            Verdict::NotOurs
        );
    }

    #[test]
    fn anything_else_the_service_asks_is_denied_with_why() {
        let group = names::user::peering("alpha", "n1");
        let (t, b) = (tenant_of("alpha"), binding(&group));
        let denied =
            |csr: &CertificateSigningRequest, t: Option<&Tenant>, b: Option<&RoleBinding>| {
                match judge(csr, &settings(), t, b) {
                    Verdict::Deny(why) => why,
                    v => panic!("{v:?} for {csr:?}"),
                }
            };
        // Another peering of the same consumer (stale, or the attacker's).
        let stale = request("alpha", &names::user::peering("alpha", "n0"), AUTH);
        assert!(denied(&stale, Some(&t), Some(&b)).contains("binds"));
        // A consumer without a tenant, or one being removed.
        let ours = request("alpha", &group, AUTH);
        assert!(denied(&ours, None, Some(&b)).contains("no Tenant"));
        let mut leaving = t.clone();
        leaving.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert!(denied(&ours, Some(&leaving), Some(&b)).contains("no Tenant"));
        assert!(denied(&ours, Some(&t), None).contains("binds"));
        // Longer than the bound, other usages, another name.
        let mut long = ours.clone();
        long.spec.expiration_seconds = Some(7 * 24 * 3600);
        assert!(denied(&long, Some(&t), Some(&b)).contains("expirationSeconds"));
        let mut server = ours.clone();
        server.spec.usages = Some(vec!["client auth".into(), "server auth".into()]);
        assert!(denied(&server, Some(&t), Some(&b)).contains("usages"));
        let mut renamed = ours.clone();
        renamed.metadata.name = Some("fabric-consumer-alpha-x".into());
        assert!(denied(&renamed, Some(&t), Some(&b)).contains("named"));
        // Not a consumer's subject at all.
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:node0");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        let mut node = csr_object("alpha", &pem, Duration::from_secs(3600));
        node.spec.username = Some(AUTH.into());
        assert!(denied(&node, Some(&t), Some(&b)).contains("names no consumer"));
    }
}
