//! Sharing-layer fixtures: a consumer's identity on a provider without the authentication
//! service, and the objects each side holds about the other.
//!
//! [`consumer_credentials`] mints the consumer's client certificate (user
//! `names::user::consumer(C)`, groups `names::user::CONSUMERS_GROUP` and [`peering_group`]) with the provider's CA key
//! from its run dir, as the provider's CSR signer would sign it; [`peer_as_consumer`] creates
//! what the authentication service creates on the provider (tenant namespace, `Tenant`, the
//! consumer's Role and RoleBinding, a ForeignCluster) and what `peer out-of-band` keeps on the
//! consumer (the Identity, its kubeconfig Secret, a ForeignCluster).
//!
//! Cross-cluster API access: the sharing controllers run in the host namespace (in-process in
//! the tests) and reach both API servers at the host-side addresses of their kubeconfigs
//! (loopback, or the loopback forwarders of [`crate::clusters`]); the identity's kubeconfig
//! names the provider's API server at that address, which its serving certificate covers.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use base64::{Engine, engine::general_purpose::STANDARD};
use fabric_api::{
    authentication::v1alpha1::{Identity, IdentitySpec, Tenant, TenantSpec, TenantState},
    core::v1alpha1::{DiscoveryMethod, ForeignCluster, ForeignClusterSpec, PeerRole},
    identity::{cluster_key, gateway_key},
    names,
};
use fabric_auth::identity::Credentials;
use fabric_kube::FieldManager;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};

use crate::apiserver::ApiServer;

/// What the fixtures write with.
const FM: FieldManager = FieldManager("fabric-tests");

fn run_dir(api: &ApiServer) -> Result<PathBuf> {
    Ok(api
        .kubeconfig
        .parent()
        .context("the kubeconfig lives in the server's run dir")?
        .to_owned())
}

/// The provider's API server as a host-side client reaches it: URL and the CA (PEM) its
/// kubeconfig trusts.
pub fn api_endpoint(api: &ApiServer) -> Result<(String, String)> {
    let kc = kube::config::Kubeconfig::read_from(&api.kubeconfig)?;
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("the kubeconfig has no cluster")?;
    let url = cluster.server.context("no server")?;
    let ca = match (
        cluster.certificate_authority_data,
        cluster.certificate_authority,
    ) {
        (Some(data), _) => String::from_utf8(STANDARD.decode(data)?)?,
        (None, Some(file)) => {
            std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?
        }
        (None, None) => bail!("the kubeconfig names no CA"),
    };
    Ok((url, ca))
}

/// A client certificate and key (PEM) for `user` in `group`, signed by the CA of `api`.
pub fn mint_client_cert(api: &ApiServer, user: &str, group: &str) -> Result<(String, String)> {
    mint_client_cert_in(api, user, &[group])
}

/// A client certificate and key (PEM) for `user` in `groups`, signed by the CA of `api`.
pub fn mint_client_cert_in(
    api: &ApiServer,
    user: &str,
    groups: &[&str],
) -> Result<(String, String)> {
    let certs = run_dir(api)?.join("certs");
    let dir = tempdir(&format!("mint-{}", std::process::id()))?;
    let (key, csr, crt, ext) = (
        dir.join("u.key"),
        dir.join("u.csr"),
        dir.join("u.crt"),
        dir.join("ext"),
    );
    std::fs::write(&ext, "extendedKeyUsage=clientAuth\n")?;
    client_csr_in(user, groups, &key, &csr)?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p(&csr),
        "-CA",
        &p(&certs.join("ca.crt")),
        "-CAkey",
        &p(&certs.join("ca.key")),
        "-CAcreateserial",
        "-CAserial",
        &p(&dir.join("ca.srl")),
        "-days",
        "1",
        "-extfile",
        &p(&ext),
        "-out",
        &p(&crt),
    ])?;
    let out = (
        std::fs::read_to_string(&crt)?,
        std::fs::read_to_string(&key)?,
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

/// A new key (to `key`) and a PKCS#10 request (PEM, to `csr`) for user `user` in `group`.
pub fn client_csr(user: &str, group: &str, key: &Path, csr: &Path) -> Result<()> {
    client_csr_in(user, &[group], key, csr)
}

/// [`client_csr`] for `user` in `groups`.
pub fn client_csr_in(user: &str, groups: &[&str], key: &Path, csr: &Path) -> Result<()> {
    let subj = std::iter::once(format!("/CN={user}"))
        .chain(groups.iter().map(|g| format!("/O={g}")))
        .collect::<String>();
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        &p(key),
        "-subj",
        &subj,
        "-out",
        &p(csr),
    ])
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

fn tempdir(tag: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "fabric-sharing-{tag}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn openssl(args: &[&str]) -> Result<()> {
    let o = Command::new("openssl").args(args).output()?;
    if !o.status.success() {
        bail!(
            "openssl {}: {}",
            args[0],
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

/// The consumer `consumer`'s credentials on `provider`: what its authentication service
/// would hand out.
pub fn consumer_credentials(provider: &ApiServer, consumer: &str) -> Result<Credentials> {
    let (url, ca) = api_endpoint(provider)?;
    let (cert, key) = mint_client_cert_in(
        provider,
        &names::user::consumer(consumer),
        &[names::user::CONSUMERS_GROUP, &peering_group(consumer)],
    )?;
    Ok(Credentials {
        api_server_url: url,
        ca_pem: ca,
        certificate_pem: cert,
        key_pem: key.into(),
        namespace: names::namespace::tenant(consumer),
    })
}

/// The peering group of the fixtures' consumer `consumer` (in [`consumer_credentials`] and
/// bound by [`admit_tenant`]).
pub fn peering_group(consumer: &str) -> String {
    names::user::peering(consumer, "fixture")
}

fn foreign_cluster(id: &str, role: PeerRole) -> ForeignCluster {
    ForeignCluster::new(
        id,
        ForeignClusterSpec {
            cluster_id: id.to_owned(),
            discovered_by: DiscoveryMethod::Manual,
            role,
            auth_url: None,
        },
    )
}

/// On the provider, what its authentication service creates for `consumer`: the tenant
/// namespace, the Tenant (Active), the consumer's Role and RoleBinding, the sharing
/// controllers' RoleBinding, its ForeignCluster.
pub async fn admit_tenant(provider: &Client, consumer: &str) -> Result<()> {
    let ns = names::namespace::tenant(consumer);
    FM.apply(
        &Api::<Namespace>::all(provider.clone()),
        &fabric_auth::tenant::namespace(consumer),
    )
    .await?;
    let mut tenant = Tenant::new(
        consumer,
        TenantSpec {
            cluster_id: consumer.to_owned(),
            state: TenantState::Active,
            caps: Default::default(),
            pod_security: None,
            mode: Default::default(),
        },
    );
    tenant.metadata.namespace = Some(ns.clone());
    FM.apply(&Api::<Tenant>::namespaced(provider.clone(), &ns), &tenant)
        .await?;
    FM.apply(
        &Api::namespaced(provider.clone(), &ns),
        &fabric_auth::tenant::role(consumer),
    )
    .await?;
    FM.apply(
        &Api::namespaced(provider.clone(), &ns),
        &fabric_auth::tenant::role_binding(consumer, &peering_group(consumer)),
    )
    .await?;
    FM.apply(
        &Api::namespaced(provider.clone(), &ns),
        &fabric_auth::tenant::sharing_binding(consumer, names::DEFAULT_NAMESPACE),
    )
    .await?;
    FM.apply(
        &Api::<ForeignCluster>::all(provider.clone()),
        &foreign_cluster(consumer, PeerRole::Consumer),
    )
    .await?;
    Ok(())
}

/// On the consumer, what `peer out-of-band` keeps about `provider`: the Identity (in
/// `namespace`) with its kubeconfig Secret (in [`names::namespace::IDENTITIES`]), and the
/// ForeignCluster (role Provider).
pub async fn keep_identity(
    consumer: &Client,
    namespace: &str,
    provider: &str,
    credentials: &Credentials,
) -> Result<()> {
    // Made by deploy/ (or by `fabricctl peer`, when missing).
    FM.apply(
        &Api::<Namespace>::all(consumer.clone()),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(names::namespace::IDENTITIES.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await?;
    FM.apply(
        &Api::<Secret>::namespaced(consumer.clone(), names::namespace::IDENTITIES),
        &fabric_auth::identity::secret(provider, credentials),
    )
    .await?;
    let mut identity = Identity::new(
        provider,
        IdentitySpec {
            cluster_id: provider.to_owned(),
            api_server_url: credentials.api_server_url.clone(),
            auth_url: format!("https://auth.{provider}.invalid"),
            tenant_namespace: credentials.namespace.clone(),
            secret_name: names::secret::identity(provider),
        },
    );
    identity.metadata.namespace = Some(namespace.to_owned());
    FM.apply(
        &Api::<Identity>::namespaced(consumer.clone(), namespace),
        &identity,
    )
    .await?;
    FM.apply(
        &Api::<ForeignCluster>::all(consumer.clone()),
        &foreign_cluster(provider, PeerRole::Provider),
    )
    .await?;
    Ok(())
}

/// A cluster's fabric namespace and identity (`fabric-cluster`), and when `gateway` is given
/// (public key, endpoint), the identity its gateway operator would publish.
pub async fn install_identity(
    client: &Client,
    namespace: &str,
    id: &str,
    pod_cidr: &str,
    gateway: Option<(&str, &str)>,
) -> Result<()> {
    FM.apply(
        &Api::<Namespace>::all(client.clone()),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = |name: &str, data: &[(&str, &str)]| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    };
    FM.apply(
        &cms,
        &cm(
            names::config_map::CLUSTER,
            &[
                (cluster_key::CLUSTER_ID, id),
                (cluster_key::POD_CIDR, pod_cidr),
                (cluster_key::SERVICE_CIDR, "10.96.0.0/12"),
                (cluster_key::EXTERNAL_CIDR, "10.70.0.0/16"),
            ],
        ),
    )
    .await?;
    if let Some((key, endpoint)) = gateway {
        FM.apply(
            &cms,
            &cm(
                names::config_map::GATEWAY_IDENTITY,
                &[
                    (gateway_key::PUBLIC_KEY, key),
                    (gateway_key::ENDPOINT, endpoint),
                ],
            ),
        )
        .await?;
    }
    Ok(())
}

/// The negotiation controllers' settings the sharing test beds run them with: in
/// `namespace`, the remote polled every 500 ms (so tests need not wait), the usual 90% share,
/// `instance` naming them in logs and leases.
pub fn negotiation_settings(namespace: &str, instance: &str) -> fabric_negotiation::Settings {
    fabric_negotiation::Settings {
        namespace: namespace.into(),
        remote_poll: std::time::Duration::from_millis(500),
        percent: 90,
        labels: Default::default(),
        instance: Some(instance.into()),
        at_most_once: Default::default(),
        reserved_namespaces: Vec::new(),
        max_namespaces_per_tenant: fabric_negotiation::namespaces::twins::DEFAULT_MAX_PER_TENANT,
    }
}

/// kubelite deletes a namespace at once and its content after (a stand-in for the namespace
/// controller, which on a real cluster empties a Terminating namespace before it goes, and
/// refuses its re-creation meanwhile): a tenant namespace provisioned again in that window (a
/// re-peer right after an unpeer) would lose its new Role, bindings and Tenant to that late
/// purge. An Identity (nothing on the provider acts on one) planted in the tenant namespace is
/// purged after the Tenants and the RBAC objects (discovery order: the Identity is the last of
/// their group), so once it is gone, or being deleted, nothing provisioned afterwards is at
/// risk. Tests that re-peer at once plant one before unpeering and wait for it after.
pub struct PurgeProbe {
    namespace: String,
    name: String,
}

impl PurgeProbe {
    /// Plants the probe in `consumer`'s tenant namespace on the provider (`p`, an admin).
    pub async fn plant(p: &Client, consumer: &str) -> Result<Self> {
        let namespace = names::namespace::tenant(consumer);
        let name = "purge-probe".to_owned();
        let probe: Identity = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.fabric.io/v1alpha1",
            "kind": "Identity",
            "metadata": {"name": name},
            "spec": {
                "clusterId": "probe",
                "apiServerUrl": "https://127.0.0.1:9",
                "authUrl": "https://127.0.0.1:9",
                "tenantNamespace": namespace,
                "secretName": "probe",
            },
        }))?;
        Api::<Identity>::namespaced(p.clone(), &namespace)
            .create(&kube::api::PostParams::default(), &probe)
            .await
            .with_context(|| format!("planting the purge probe in {namespace}"))?;
        Ok(Self { namespace, name })
    }

    /// Waits until the tenant namespace's late purge has passed the probe.
    pub async fn purged(&self, p: &Client) -> Result<()> {
        let api = Api::<Identity>::namespaced(p.clone(), &self.namespace);
        crate::wait::until_done(
            "the deleted tenant namespace's content purged",
            std::time::Duration::from_secs(20),
            || async {
                Ok(api
                    .get_opt(&self.name)
                    .await?
                    .is_none_or(|i| i.metadata.deletion_timestamp.is_some()))
            },
        )
        .await
    }
}

/// The kubeconfig of the identity `consumer` (an admin's view of it) holds on provider
/// `provider_id` (from its identity Secret in fabric-identities), written to `out`: what the
/// consumer itself can do on its provider, for tests that attack the provider with it.
pub fn identity_kubeconfig(consumer: &ApiServer, provider_id: &str, out: &Path) -> Result<()> {
    let o = consumer.kubectl(&[
        "get",
        "secret",
        &names::secret::identity(provider_id),
        "-n",
        names::namespace::IDENTITIES,
        "-o",
        "json",
    ]);
    anyhow::ensure!(
        o.status.success(),
        "the identity Secret for {provider_id}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let secret: Secret = serde_json::from_slice(&o.stdout)?;
    let text = fabric_auth::identity::kubeconfig_of(&secret)
        .with_context(|| format!("no kubeconfig in the identity Secret for {provider_id}"))?;
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))
}

/// A ShadowPod whose pod would be root on a node of its provider (host PID namespace, a
/// privileged container), written by consumer `consumer_id` for a home pod of its own: what a
/// provider's policy must refuse.
pub fn root_shadowpod(consumer_id: &str, name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": name, "namespace": names::namespace::tenant(consumer_id)},
        "spec": {
            "clusterId": consumer_id,
            "home": {"namespace": "default", "name": name, "uid": format!("home-{name}")},
            "pod": {"spec": {
                "hostPID": true,
                "containers": [{"name": "main", "image": "echo",
                                "securityContext": {"privileged": true},
                                "resources": {"requests": {"cpu": "10m"}}}],
            }},
        },
    })
}

/// A real Node `name` of a provider with `alloc` (capacity and allocatable: what its policy
/// offers from), as a kubelet would register it.
pub async fn add_node(client: &Client, name: &str, alloc: serde_json::Value) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let status = serde_json::json!({ "status": { "allocatable": alloc, "capacity": alloc } });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}
