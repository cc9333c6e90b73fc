//! The provider side of the authentication service, behind the HTTPS edge
//! ([`crate::server`]): check the request, then create the consumer's tenant area and have its
//! CSR signed through the Kubernetes CSR API (approved by [`crate::approver`], in another
//! process: this one faces the internet and holds no approval right).
//!
//! Order matters: everything that can be checked is checked before anything is written, so a
//! refused request creates nothing: the token (first, so that a caller without one learns
//! nothing else), the provider the request is meant for, the CSR, what a one-time token may
//! still be used for, and what this provider already holds under the cluster id (a tenant is
//! never re-issued to a token holder; ids of its own providers and namespaces of others are
//! refused). A one-time token's use is then recorded on it before the tenant is made. Every
//! write is a server-side apply or a create-or-get under a name derived from the request, so
//! a consumer that retries the same request (lost answer, timeout) gets the same certificate
//! and nothing twice; a CSR found under that name is used only if it is the very request the
//! service writes.
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
    validate::{self, Holdings, TokenRecord, TokenUse},
};

/// The signer that issues client certificates the API server accepts.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
const MANAGER: FieldManager = FieldManager(names::field_manager::AUTH);

/// What the service hands out and where it keeps what it checks.
#[derive(Clone)]
pub struct Service {
    pub client: Client,
    /// The fabric's namespace (the service's serving certificate).
    pub namespace: String,
    /// Where the token Secrets are, and nothing else
    /// ([`names::namespace::PEERING_TOKENS`]).
    pub token_namespace: String,
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

/// Whether `existing` asks exactly what `ours` (made by [`csr_object`]) asks: the request
/// bytes, signer, usages, validity, and the consumer it is labelled for.
pub fn same_request(
    existing: &CertificateSigningRequest,
    ours: &CertificateSigningRequest,
) -> bool {
    let label = |c: &CertificateSigningRequest| {
        c.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(names::label::REMOTE_CLUSTER))
            .cloned()
    };
    let (a, b) = (&existing.spec, &ours.spec);
    a.request == b.request
        && a.signer_name == b.signer_name
        && a.usages == b.usages
        && a.expiration_seconds == b.expiration_seconds
        && label(existing) == label(ours)
}

impl Service {
    /// Answers one request; see the module's doc for the order of things.
    pub async fn authenticate(&self, req: &AuthRequest) -> Result<AuthResponse, Refusal> {
        let consumer = &req.cluster_id;
        let secrets = self.token_secrets().await.map_err(|e| {
            warn!(error = %e, "reading the peering tokens");
            // Nothing of the API's error to a caller not yet authenticated.
            Refusal::new(
                Reason::Internal,
                "the provider failed while reading its peering tokens; retrying later is safe",
            )
        })?;
        let tokens: Vec<_> = secrets
            .iter()
            .filter_map(TokenRecord::from_secret)
            .collect();
        let token =
            validate::check_token(&req.token, &tokens, Timestamp::now()).inspect_err(|r| {
                info!(consumer = %consumer, reason = ?r.reason, "refused a token");
            })?;
        if let Some(named) = &req.provider_cluster_id
            && *named != self.cluster_id
        {
            return Err(Refusal::new(
                Reason::WrongProvider,
                format!(
                    "this is the authentication service of cluster {}, not {named}: check the \
                     peer command's --cluster-id",
                    self.cluster_id
                ),
            ));
        }
        if *consumer == self.cluster_id {
            return Err(Refusal::new(
                Reason::SameCluster,
                format!(
                    "{consumer} is this provider's own cluster id: a cluster does not peer with itself"
                ),
            ));
        }
        let peering = validate::check_csr(&req.csr_pem, consumer).inspect_err(|r| {
            info!(consumer = %consumer, why = %r.message, "refused a CSR");
        })?;
        let request = validate::request_digest(&req.csr_pem);
        let token_use = validate::check_use(token, consumer, &request).inspect_err(|r| {
            info!(consumer = %consumer, token = %token.name, reason = ?r.reason, "refused a token's use");
        })?;
        let held = self.previous_tenant_gone(consumer).await?;
        let bound = token.cluster_id.as_deref() == Some(consumer.as_str());
        validate::check_id(consumer, &held, &request, bound).inspect_err(|r| {
            info!(consumer = %consumer, reason = ?r.reason, "refused a cluster id");
        })?;
        if token_use == TokenUse::First {
            self.use_token(&secrets, token, consumer, &request).await?;
        }
        info!(consumer = %consumer, token = %token.name, "consumer authenticated; provisioning its tenant");

        self.provision(consumer, &request, &peering)
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

    /// Records the one use of one-time token `token` (for `consumer`'s request `request`) on
    /// its Secret, conditionally on the version read: of two requests racing with one
    /// token, one wins.
    async fn use_token(
        &self,
        secrets: &[Secret],
        token: &TokenRecord,
        consumer: &str,
        request: &str,
    ) -> Result<(), Refusal> {
        let Some(secret) = secrets
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(token.name.as_str()))
        else {
            return Err(internal("recording the token's use", "its Secret is gone"));
        };
        let mut used = secret.clone();
        let annotations = used.metadata.annotations.get_or_insert_default();
        annotations.insert(
            names::annotation::TOKEN_CLUSTER_ID.to_owned(),
            consumer.to_owned(),
        );
        annotations.insert(
            names::annotation::TOKEN_USED_BY.to_owned(),
            request.to_owned(),
        );
        match Api::<Secret>::namespaced(self.client.clone(), &self.token_namespace)
            .replace(&token.name, &PostParams::default(), &used)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Err(Refusal::new(
                Reason::TokenUsed,
                "this one-time token was used by another request at the same time: ask the \
                 provider admin for a new peer command",
            )),
            Err(e) => Err(internal("recording the token's use", e)),
        }
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
        // The certificate's peering must be the one the tenant's binding names: a
        // certificate of an earlier, revoked peering of the same id renews nothing.
        let peering = client_cert.and_then(|c| validate::peering_of(c, &consumer));
        let bound = binding.as_ref().is_some_and(|b| {
            b.subjects
                .iter()
                .flatten()
                .any(|s| s.kind == "Group" && Some(s.name.as_str()) == peering.as_deref())
        });
        if tenant.is_none() || !bound {
            return Err(Refusal::new(
                Reason::Revoked,
                format!(
                    "the provider removed tenant {consumer} (or this certificate's peering): ask \
                     its admin for a new peer command"
                ),
            ));
        }
        if validate::check_csr(&req.csr_pem, &consumer)? != peering.unwrap_or_default() {
            return Err(Refusal::new(
                Reason::InvalidCsr,
                "a renewal's CSR names the peering group of the certificate it renews",
            ));
        }
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

    async fn token_secrets(&self) -> kube::Result<Vec<Secret>> {
        Ok(
            Api::<Secret>::namespaced(self.client.clone(), &self.token_namespace)
                .list(&ListParams::default().labels(&token::selector()))
                .await?
                .items,
        )
    }

    /// Waits until a Tenant of `consumer` that is being removed (an unpeer whose cleanup still
    /// runs here) is gone, and its ForeignCluster being deleted too: provisioning over either
    /// would be undone, and the consumer left with an identity that is refused everything
    /// (seen on a re-peer right after an unpeer). The Tenant's cleanup deletes the Role, the
    /// bindings and the namespace after us; a ForeignCluster still being deleted (its
    /// revocation finalizer not yet off once the old Tenant is gone) reads as the admin
    /// revoking the consumer, and the new Tenant would be deleted with it; a Terminating
    /// namespace refuses the new Role. Then: what the provider holds under `consumer`.
    async fn previous_tenant_gone(&self, consumer: &str) -> Result<Holdings, Refusal> {
        let tenants =
            Api::<Tenant>::namespaced(self.client.clone(), &names::namespace::tenant(consumer));
        let deadline = tokio::time::Instant::now() + PREVIOUS_TENANT_WAIT;
        let fcs = Api::<ForeignCluster>::all(self.client.clone());
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let ns = names::namespace::tenant(consumer);
        loop {
            let tenant = tenants
                .get_opt(consumer)
                .await
                .map_err(|e| internal("reading the tenant", e))?;
            let tenant_removing = tenant
                .as_ref()
                .is_some_and(|t| t.metadata.deletion_timestamp.is_some());
            let peer = fcs
                .get_opt(consumer)
                .await
                .map_err(|e| internal("reading the ForeignCluster", e))?;
            let peer_removing = peer
                .as_ref()
                .is_some_and(|fc| fc.metadata.deletion_timestamp.is_some());
            // Terminating: nothing can be created in it until it is gone.
            let namespace = namespaces
                .get_opt(&ns)
                .await
                .map_err(|e| internal("reading the tenant namespace", e))?;
            let namespace_removing = namespace
                .as_ref()
                .is_some_and(|n| n.metadata.deletion_timestamp.is_some());
            if !tenant_removing && !peer_removing && !namespace_removing {
                return Ok(Holdings {
                    tenant: tenant.map(|t| {
                        t.metadata
                            .annotations
                            .and_then(|a| a.get(names::annotation::PEERING_REQUEST).cloned())
                    }),
                    peer_role: peer.map(|p| p.spec.role),
                    namespace_ours: namespace
                        .map(|n| validate::namespace_is_ours(n.metadata.labels.as_ref(), consumer)),
                });
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
    /// there (they run the consumer's pods), the Tenant (marked with the `request` that made
    /// it) and the consumer's ForeignCluster. The consumer's RoleBinding binds `peering`, the
    /// group of this peering's certificates only.
    async fn provision(&self, consumer: &str, request: &str, peering: &str) -> kube::Result<()> {
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
                &tenant::role_binding(consumer, peering),
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
                "annotations": { names::annotation::PEERING_REQUEST: request },
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

    /// Creates (or finds) the CSR and waits for the approver and the signer.
    async fn sign(&self, consumer: &str, csr_pem: &str) -> Result<String, Refusal> {
        let api = Api::<CertificateSigningRequest>::all(self.client.clone());
        let obj = csr_object(consumer, csr_pem, self.certificate_ttl);
        let name = obj.metadata.name.clone().unwrap_or_default();
        let csr = match api.create(&PostParams::default(), &obj).await {
            Ok(c) => c,
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = api
                    .get(&name)
                    .await
                    .map_err(|e| internal("reading the CSR", e))?;
                // Anyone allowed to create CSRs could have made one under this name: only
                // the very request this service writes is approved.
                if !same_request(&existing, &obj) {
                    warn!(consumer = %consumer, csr = %name, "a CSR under the service's name holds another request; not approving it");
                    return Err(Refusal::new(
                        Reason::Conflict,
                        format!(
                            "CertificateSigningRequest {name} exists on the provider with content \
                             its authentication service did not write: the provider admin \
                             should find out who created it and delete it"
                        ),
                    ));
                }
                existing
            }
            Err(e) => return Err(internal("creating the CSR", e)),
        };
        if let Some(outcome) = csr_outcome(&csr) {
            return outcome.map_err(|why| internal("signing", why));
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
                    "the provider's CSR approver and signer did not sign within {:?}; retrying the same command is safe",
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
    fn only_the_request_the_service_writes_is_the_same() {
        let ttl = Duration::from_secs(3600);
        let ours = csr_object("a", "x", ttl);
        assert!(same_request(&ours, &ours.clone()));
        let changed: [fn(&mut CertificateSigningRequest); 5] = [
            |c| c.spec.request = ByteString(b"y".to_vec()),
            |c| c.spec.signer_name = "kubernetes.io/kubelet-serving".to_owned(),
            |c| c.spec.usages = Some(vec!["client auth".to_owned(), "server auth".to_owned()]),
            |c| c.spec.expiration_seconds = Some(864_000),
            |c| c.metadata.labels = None,
        ];
        for change in changed {
            let mut planted = ours.clone();
            change(&mut planted);
            assert!(!same_request(&planted, &ours), "{planted:?}");
        }
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
        assert_eq!(csr_outcome(&csr), None);
        csr.status.as_mut().unwrap().certificate = Some(ByteString(b"PEM".to_vec()));
        assert_eq!(csr_outcome(&csr), Some(Ok("PEM".to_owned())));
        csr.status.as_mut().unwrap().conditions = Some(vec![cond("Approved"), cond("Failed")]);
        assert!(matches!(csr_outcome(&csr), Some(Err(m)) if m.contains("Failed (R): m")));
    }
}
