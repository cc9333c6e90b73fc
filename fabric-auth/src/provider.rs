//! The provider side of the authentication service, behind the HTTPS edge
//! ([`crate::server`]): check the request, then create the consumer's tenant area and have its
//! CSR signed through the Kubernetes CSR API.
//!
//! Order matters: the token and the CSR are checked before anything is written, so a refused
//! request creates nothing. Every write is a server-side apply or a create-or-get under a name
//! derived from the request, so a consumer that retries the same request (lost answer,
//! timeout) gets the same certificate and nothing twice.
use std::time::Duration;

use fabric_api::{
    authentication::v1alpha1::Tenant,
    core::v1alpha1::{ForeignCluster, ForeignClusterSpec, PeerRole, condition},
    names,
};
use fabric_kube::{FieldManager, status};
use k8s_openapi::{
    ByteString,
    api::{
        certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
        core::v1::{Namespace, Secret},
        rbac::v1::{Role, RoleBinding},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use tracing::{info, warn};

use crate::{
    protocol::{AuthRequest, AuthResponse, Reason, Refusal, RenewRequest},
    server::Call,
    tenant, token,
    validate::{self, TokenRecord},
};

/// The signer that issues client certificates the API server accepts.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
const MANAGER: FieldManager = FieldManager(names::field_manager::AUTH);

/// What the service hands out and where it keeps what it checks.
#[derive(Clone)]
pub struct Service {
    pub client: Client,
    /// Where the token Secrets are (the fabric's namespace).
    pub namespace: String,
    /// This (provider) cluster's id.
    pub cluster_id: String,
    /// The API server as consumers reach it (not the in-cluster address).
    pub api_server_url: String,
    /// The CA (PEM) of the API server's serving certificate.
    pub ca_pem: String,
    /// Validity of issued certificates (`expirationSeconds`; the signer may cap it).
    pub certificate_ttl: Duration,
    /// How long to wait for the signer.
    pub sign_timeout: Duration,
}

/// How long an authentication waits for the consumer's previous tenant to be removed.
const PREVIOUS_TENANT_WAIT: Duration = Duration::from_secs(20);

fn internal(what: &str, e: impl std::fmt::Display) -> Refusal {
    warn!(error = %e, "{what}");
    Refusal::new(
        Reason::Internal,
        format!("the provider failed while {what}: {e}; retrying the same command is safe"),
    )
}

/// The CSR object's name for `csr_pem` of `consumer`: the same request gets the same object.
pub fn csr_name(consumer: &str, csr_pem: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, csr_pem.as_bytes());
    format!(
        "fabric-consumer-{consumer}-{}",
        &hex::encode(d.as_ref())[..16]
    )
}

/// The CertificateSigningRequest for a checked CSR.
pub fn csr_object(consumer: &str, csr_pem: &str, ttl: Duration) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(csr_name(consumer, csr_pem)),
            labels: Some([(names::label::REMOTE_CLUSTER.to_owned(), consumer.to_owned())].into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: SIGNER.to_owned(),
            usages: Some(vec![
                "digital signature".to_owned(),
                "client auth".to_owned(),
            ]),
            // The API's floor is 600 s.
            expiration_seconds: Some(ttl.as_secs().clamp(600, i32::MAX as u64) as i32),
            ..Default::default()
        },
        status: None,
    }
}

/// The outcome of a CSR's status: signed (certificate PEM), refused (why), or pending.
pub fn csr_outcome(csr: &CertificateSigningRequest) -> Option<Result<String, String>> {
    let status = csr.status.as_ref()?;
    for c in status.conditions.iter().flatten() {
        if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
            return Some(Err(format!(
                "{} ({}): {}",
                c.type_,
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("")
            )));
        }
    }
    let cert = status.certificate.as_ref()?;
    Some(String::from_utf8(cert.0.clone()).map_err(|_| "the certificate is not PEM".to_owned()))
}

fn approved(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Approved" && c.status == "True")
        })
}

impl Service {
    /// Answers one request; see the module's doc for the order of things.
    pub async fn authenticate(&self, req: &AuthRequest) -> Result<AuthResponse, Refusal> {
        let consumer = &req.cluster_id;
        if *consumer == self.cluster_id {
            return Err(Refusal::new(
                Reason::SameCluster,
                format!(
                    "{consumer} is this provider's own cluster id: a cluster does not peer with itself"
                ),
            ));
        }
        let tokens = self
            .tokens()
            .await
            .map_err(|e| internal("reading the peering tokens", e))?;
        let token =
            validate::check_token(&req.token, &tokens, Timestamp::now()).inspect_err(|r| {
                info!(consumer = %consumer, reason = ?r.reason, "refused a token");
            })?;
        validate::check_csr(&req.csr_pem, consumer).inspect_err(|r| {
            info!(consumer = %consumer, why = %r.message, "refused a CSR");
        })?;
        info!(consumer = %consumer, token = %token.name, "consumer authenticated; provisioning its tenant");

        self.previous_tenant_gone(consumer).await?;
        self.provision(consumer)
            .await
            .map_err(|e| internal("creating the tenant", e))?;
        let certificate_pem = self.sign(consumer, &req.csr_pem).await?;
        let expiry = validate::certificate_expiry(&certificate_pem);
        self.record(consumer, &format!("peering token {}", token.name), expiry)
            .await
            .map_err(|e| internal("recording the tenant's status", e))?;
        Ok(AuthResponse {
            certificate_pem,
            api_server_url: self.api_server_url.clone(),
            ca_pem: self.ca_pem.clone(),
            tenant_namespace: names::namespace::tenant(consumer),
            provider_cluster_id: self.cluster_id.clone(),
        })
    }

    /// Answers a call of the HTTPS edge.
    pub async fn answer(&self, call: Call) -> Result<AuthResponse, Refusal> {
        match call {
            Call::Authenticate(req) => self.authenticate(&req).await,
            Call::Renew {
                client_cert,
                request,
            } => self.renew(client_cert.as_deref(), &request).await,
        }
    }

    /// Renews the certificate of the consumer that `client_cert` (verified by TLS against
    /// the client CA) names, while its tenant is there: removing the Tenant or its
    /// RoleBinding revokes renewal as it revokes access.
    pub async fn renew(
        &self,
        client_cert: Option<&[u8]>,
        req: &RenewRequest,
    ) -> Result<AuthResponse, Refusal> {
        let consumer = client_cert
            .and_then(validate::consumer_of)
            .ok_or_else(|| {
                Refusal::new(
                    Reason::Unauthenticated,
                    "a renewal is authenticated by the consumer's current, unexpired client \
                     certificate from this provider; without one, peer again with a new peer command",
                )
            })?;
        let ns = names::namespace::tenant(&consumer);
        let tenant = Api::<Tenant>::namespaced(self.client.clone(), &ns)
            .get_opt(&consumer)
            .await
            .map_err(|e| internal("reading the tenant", e))?;
        let binding = Api::<RoleBinding>::namespaced(self.client.clone(), &ns)
            .get_opt(tenant::ROLE)
            .await
            .map_err(|e| internal("reading the tenant's RoleBinding", e))?;
        if tenant.is_none() || binding.is_none() {
            return Err(Refusal::new(
                Reason::Revoked,
                format!(
                    "the provider removed tenant {consumer}: ask its admin for a new peer command"
                ),
            ));
        }
        validate::check_csr(&req.csr_pem, &consumer)?;
        info!(consumer = %consumer, "renewing the consumer's certificate");
        let certificate_pem = self.sign(&consumer, &req.csr_pem).await?;
        let expiry = validate::certificate_expiry(&certificate_pem);
        self.record(&consumer, "(renewal by certificate)", expiry)
            .await
            .map_err(|e| internal("recording the tenant's status", e))?;
        Ok(AuthResponse {
            certificate_pem,
            api_server_url: self.api_server_url.clone(),
            ca_pem: self.ca_pem.clone(),
            tenant_namespace: ns,
            provider_cluster_id: self.cluster_id.clone(),
        })
    }

    async fn tokens(&self) -> kube::Result<Vec<TokenRecord>> {
        let secrets = Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(&token::selector()))
            .await?;
        Ok(secrets
            .items
            .iter()
            .filter_map(TokenRecord::from_secret)
            .collect())
    }

    /// Waits until a Tenant of `consumer` that is being removed (an unpeer whose cleanup still
    /// runs here) is gone, and its ForeignCluster being deleted too: provisioning over either
    /// would be undone, and the consumer left with an identity that is refused everything
    /// (seen on a re-peer right after an unpeer). The Tenant's cleanup deletes the Role, the
    /// bindings and the namespace after us; a ForeignCluster still being deleted (its
    /// revocation finalizer not yet off once the old Tenant is gone) reads as the admin
    /// revoking the consumer, and the new Tenant would be deleted with it; a Terminating
    /// namespace refuses the new Role.
    async fn previous_tenant_gone(&self, consumer: &str) -> Result<(), Refusal> {
        let tenants =
            Api::<Tenant>::namespaced(self.client.clone(), &names::namespace::tenant(consumer));
        let deadline = tokio::time::Instant::now() + PREVIOUS_TENANT_WAIT;
        let fcs = Api::<ForeignCluster>::all(self.client.clone());
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let ns = names::namespace::tenant(consumer);
        loop {
            let tenant_removing = tenants
                .get_opt(consumer)
                .await
                .map_err(|e| internal("reading the tenant", e))?
                .is_some_and(|t| t.metadata.deletion_timestamp.is_some());
            let peer_removing = fcs
                .get_opt(consumer)
                .await
                .map_err(|e| internal("reading the ForeignCluster", e))?
                .is_some_and(|fc| fc.metadata.deletion_timestamp.is_some());
            // Terminating: nothing can be created in it until it is gone.
            let namespace_removing = namespaces
                .get_opt(&ns)
                .await
                .map_err(|e| internal("reading the tenant namespace", e))?
                .is_some_and(|n| n.metadata.deletion_timestamp.is_some());
            if !tenant_removing && !peer_removing && !namespace_removing {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(internal(
                    "waiting for the removal of this consumer's previous tenant",
                    format!("still being removed after {PREVIOUS_TENANT_WAIT:?}"),
                ));
            }
            info!(consumer = %consumer, "the previous tenant is still being removed; waiting");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The tenant namespace, its Role and RoleBinding, the sharing controllers' RoleBinding
    /// there (they run the consumer's pods), the Tenant and the consumer's ForeignCluster.
    async fn provision(&self, consumer: &str) -> kube::Result<()> {
        let c = &self.client;
        let ns = names::namespace::tenant(consumer);
        MANAGER
            .apply(
                &Api::<Namespace>::all(c.clone()),
                &tenant::namespace(consumer),
            )
            .await?;
        MANAGER
            .apply(
                &Api::<Role>::namespaced(c.clone(), &ns),
                &tenant::role(consumer),
            )
            .await?;
        MANAGER
            .apply(
                &Api::<RoleBinding>::namespaced(c.clone(), &ns),
                &tenant::role_binding(consumer),
            )
            .await?;
        MANAGER
            .apply(
                &Api::<RoleBinding>::namespaced(c.clone(), &ns),
                &tenant::sharing_binding(consumer, &self.namespace),
            )
            .await?;
        // Only the cluster id: the state and caps are the provider admin's to set.
        let tenant = serde_json::json!({
            "apiVersion": "authentication.fabric.io/v1alpha1",
            "kind": "Tenant",
            "metadata": {
                "name": consumer,
                "namespace": ns,
                "labels": { names::label::REMOTE_CLUSTER: consumer },
            },
            "spec": { "clusterId": consumer },
        });
        Api::<Tenant>::namespaced(c.clone(), &ns)
            .patch(
                consumer,
                &PatchParams::apply(names::field_manager::AUTH).force(),
                &Patch::Apply(&tenant),
            )
            .await?;

        let fcs = Api::<ForeignCluster>::all(c.clone());
        let existing = fcs.get_opt(consumer).await?;
        let spec = ForeignClusterSpec::playing(
            existing.as_ref().map(|f| &f.spec),
            consumer,
            PeerRole::Consumer,
        );
        MANAGER
            .apply(&fcs, &ForeignCluster::new(consumer, spec))
            .await?;
        Ok(())
    }

    /// Creates (or finds) the CSR, approves it and waits for the certificate.
    async fn sign(&self, consumer: &str, csr_pem: &str) -> Result<String, Refusal> {
        let api = Api::<CertificateSigningRequest>::all(self.client.clone());
        let obj = csr_object(consumer, csr_pem, self.certificate_ttl);
        let name = obj.metadata.name.clone().unwrap_or_default();
        let csr = match api.create(&PostParams::default(), &obj).await {
            Ok(c) => c,
            Err(kube::Error::Api(e)) if e.code == 409 => api
                .get(&name)
                .await
                .map_err(|e| internal("reading the CSR", e))?,
            Err(e) => return Err(internal("creating the CSR", e)),
        };
        if let Some(outcome) = csr_outcome(&csr) {
            return outcome.map_err(|why| internal("signing", why));
        }
        if !approved(&csr) {
            let approval = serde_json::json!({"status": {"conditions": [{
                "type": "Approved",
                "status": "True",
                "reason": "FabricPeeringToken",
                "message": format!("consumer {consumer} presented a valid peering token"),
                "lastUpdateTime": Time(Timestamp::now()),
            }]}});
            api.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&approval))
                .await
                .map_err(|e| internal("approving the CSR", e))?;
        }
        let done = kube::runtime::wait::await_condition(
            api,
            &name,
            |c: Option<&CertificateSigningRequest>| c.is_some_and(|c| csr_outcome(c).is_some()),
        );
        match tokio::time::timeout(self.sign_timeout, done).await {
            Ok(Ok(Some(csr))) => csr_outcome(&csr)
                .unwrap_or_else(|| Err("no outcome".to_owned()))
                .map_err(|why| internal("signing", why)),
            Ok(Ok(None)) => Err(internal("signing", "the CSR was deleted")),
            Ok(Err(e)) => Err(internal("waiting for the signer", e)),
            Err(_) => Err(Refusal::new(
                Reason::Unavailable,
                format!(
                    "the provider's CSR signer did not sign within {:?}; retrying the same command is safe",
                    self.sign_timeout
                ),
            )),
        }
    }

    /// The Tenant's user and expiry, and the ForeignCluster's condition.
    async fn record(
        &self,
        consumer: &str,
        token: &str,
        expiry: Option<Timestamp>,
    ) -> kube::Result<()> {
        let ns = names::namespace::tenant(consumer);
        MANAGER
            .apply_status(
                &Api::<Tenant>::namespaced(self.client.clone(), &ns),
                consumer,
                serde_json::json!({
                    "user": names::user::consumer(consumer),
                    "certificateExpiry": expiry.map(Time),
                }),
            )
            .await?;
        let until = expiry.map_or_else(|| "an unknown date".to_owned(), |t| t.to_string());
        let cond = status::condition(
            condition::AUTHENTICATED,
            true,
            "Authenticated",
            format!("authenticated with {token}; certificate valid until {until}"),
            None,
            Timestamp::now(),
        );
        MANAGER
            .apply_status(
                &Api::<ForeignCluster>::all(self.client.clone()),
                consumer,
                serde_json::json!({ "tenantNamespace": ns, "conditions": [cond] }),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };

    use super::*;

    #[test]
    fn the_same_request_names_the_same_csr() {
        assert_eq!(csr_name("a", "x"), csr_name("a", "x"));
        assert_ne!(csr_name("a", "x"), csr_name("a", "y"));
        assert_ne!(csr_name("a", "x"), csr_name("b", "x"));
        let o = csr_object("a", "x", Duration::from_secs(10));
        assert_eq!(o.spec.expiration_seconds, Some(600));
        assert_eq!(o.spec.signer_name, SIGNER);
        assert!(!o.spec.usages.unwrap().iter().any(|u| u == "server auth"));
    }

    #[test]
    fn a_csr_is_signed_refused_or_pending() {
        let mut csr = csr_object("a", "x", Duration::from_secs(3600));
        assert_eq!(csr_outcome(&csr), None);
        let cond = |t: &str| CertificateSigningRequestCondition {
            type_: t.to_owned(),
            status: "True".to_owned(),
            reason: Some("R".to_owned()),
            message: Some("m".to_owned()),
            ..Default::default()
        };
        csr.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![cond("Approved")]),
            certificate: None,
        });
        assert!(approved(&csr));
        assert_eq!(csr_outcome(&csr), None);
        csr.status.as_mut().unwrap().certificate = Some(ByteString(b"PEM".to_vec()));
        assert_eq!(csr_outcome(&csr), Some(Ok("PEM".to_owned())));
        csr.status.as_mut().unwrap().conditions = Some(vec![cond("Approved"), cond("Failed")]);
        assert!(matches!(csr_outcome(&csr), Some(Err(m)) if m.contains("Failed (R): m")));
    }
}
