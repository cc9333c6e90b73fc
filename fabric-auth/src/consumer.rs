//! The consumer side of out-of-band authentication (`fabricctl peer out-of-band`): make a key
//! that never leaves this process, ask the provider's authentication service to sign it, and
//! keep the identity it issues (Secret, `Identity`, `ForeignCluster`) in the local cluster.
use std::time::Duration;

use bytes::Bytes;
use fabric_api::{
    authentication::v1alpha1::{Identity, IdentitySpec},
    core::v1alpha1::{ForeignCluster, ForeignClusterSpec, PeerRole, condition},
    names,
};
use fabric_kube::{FieldManager, status};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Uri, header};
use hyper_util::rt::TokioIo;
use k8s_openapi::{
    api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp,
};
use kube::{Api, Client};
use rcgen::PublicKeyData;
use rustls::pki_types::ServerName;
use secrecy::SecretString;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::{
    identity::{self, Credentials},
    protocol::{
        AuthRequest, AuthResponse, CONTENT_TYPE, MAX_BODY, PATH, RENEW_PATH, Reason, Refusal,
        RenewRequest,
    },
    tls::{self, TlsError, Trust},
    validate,
};

const MANAGER: FieldManager = FieldManager(names::field_manager::AUTH);
/// The whole exchange with the service, signing included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--auth-url {0:?} is not an https:// URL with a host")]
    BadUrl(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("generating a key and CSR: {0}")]
    Key(#[from] rcgen::Error),
    #[error(
        "cannot reach the authentication service at {url}: {source} (check --auth-url and \
         that the provider's service is reachable from here)"
    )]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the TLS handshake with {url} failed: {source}. If the message is about the \
         certificate, the service is not the one the peer command names (check --auth-pin), \
         or its certificate was replaced: ask the provider admin for a new peer command"
    )]
    Handshake {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the authentication service: {0}")]
    Http(#[from] hyper::Error),
    #[error("the authentication service did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the provider refused: {0}")]
    Refused(Refusal),
    #[error("the authentication service answered HTTP {status} without a readable reason: {body}")]
    Unexpected { status: u16, body: String },
    #[error(
        "the service answered for cluster {answered:?}, but the peer command names {expected:?}: \
         check --cluster-id"
    )]
    WrongProvider { expected: String, answered: String },
    #[error("the issued certificate is not for this cluster's key")]
    WrongCertificate,
    #[error("storing the identity in this cluster: {0}")]
    Store(#[from] kube::Error),
    #[error(
        "the Identity records no pin of the authentication service: peer again with a new peer command"
    )]
    NoPin,
    #[error(
        "the identity's Secret holds no usable kubeconfig of a consumer: peer again with a new peer command"
    )]
    NoIdentity,
    #[error("the issued identity does not work on the provider's API server: {0}")]
    Verify(String),
}

impl ClientError {
    /// The provider's reason, when it refused.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            ClientError::Refused(r) => Some(r.reason),
            _ => None,
        }
    }
}

/// A key pair and a CSR for it naming `consumer` in the consumers' group and in the group of
/// a new peering (a fresh random nonce).
pub fn key_and_csr(consumer: &str) -> Result<(rcgen::KeyPair, String), rcgen::Error> {
    let mut nonce = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
        .map_err(|_| rcgen::Error::RingUnspecified)?;
    key_and_csr_in(
        consumer,
        &names::user::peering(consumer, &hex::encode(nonce)),
    )
}

/// A key pair and a CSR for it naming `consumer` in the consumers' group and in peering group
/// `peering` (a renewal keeps its peering's).
pub fn key_and_csr_in(
    consumer: &str,
    peering: &str,
) -> Result<(rcgen::KeyPair, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, names::user::consumer(consumer));
    params.distinguished_name.push(
        rcgen::DnType::OrganizationName,
        names::user::CONSUMERS_GROUP,
    );
    // rcgen keeps one value per attribute type: the second group under O's OID.
    params
        .distinguished_name
        .push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 10]), peering);
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((key, csr))
}

/// Sends `request` to the service at `auth_url`, trusting it as `trust` says.
pub async fn send(
    auth_url: &str,
    trust: &Trust,
    request: &AuthRequest,
) -> Result<AuthResponse, ClientError> {
    let config = tls::client_config(trust)?;
    let fut = post(auth_url, config, PATH, serde_json::to_vec(request));
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .map_err(|_| ClientError::Timeout(REQUEST_TIMEOUT))?
}

/// Where a request goes: the TLS connection to the service, the URL's path prefix (the
/// endpoints' paths follow it) and `Host`.
pub struct Connection {
    pub stream: tokio_rustls::client::TlsStream<TcpStream>,
    pub path: String,
    pub host: String,
}

/// Connects to the service at `auth_url` (`https://host[:port][/prefix]`), trusting it as
/// `trust` says.
pub async fn connect(auth_url: &str, trust: &Trust) -> Result<Connection, ClientError> {
    connect_with(auth_url, tls::client_config(trust)?).await
}

async fn connect_with(
    auth_url: &str,
    config: rustls::ClientConfig,
) -> Result<Connection, ClientError> {
    let bad_url = || ClientError::BadUrl(auth_url.to_owned());
    let uri: Uri = auth_url.parse().map_err(|_| bad_url())?;
    if uri.scheme_str() != Some("https") {
        return Err(bad_url());
    }
    let authority = uri.authority().ok_or_else(bad_url)?.to_string();
    let host = uri.host().ok_or_else(bad_url)?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let server_name = ServerName::try_from(host.clone()).map_err(|_| bad_url())?;
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|source| ClientError::Connect {
            url: auth_url.to_owned(),
            source,
        })?;
    let connector = TlsConnector::from(std::sync::Arc::new(config));
    let stream = connector
        .connect(server_name, tcp)
        .await
        .map_err(|source| ClientError::Handshake {
            url: auth_url.to_owned(),
            source,
        })?;
    Ok(Connection {
        stream,
        path: uri.path().trim_end_matches('/').to_owned(),
        host: authority,
    })
}

async fn post(
    auth_url: &str,
    config: rustls::ClientConfig,
    endpoint: &str,
    body: serde_json::Result<Vec<u8>>,
) -> Result<AuthResponse, ClientError> {
    let Connection { stream, path, host } = connect_with(auth_url, config).await?;
    let path = format!("{path}{endpoint}");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let body = body.expect("a request serializes");
    let req = Request::post(path)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, CONTENT_TYPE)
        .body(Full::new(Bytes::from(body)))
        .expect("a request builds");
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let bytes = Limited::new(resp.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| ClientError::Unexpected {
            status,
            body: format!("(unreadable: {e})"),
        })?
        .to_bytes();
    conn.abort();
    if status == 200 {
        return serde_json::from_slice(&bytes).map_err(|e| ClientError::Unexpected {
            status,
            body: format!("(not an answer: {e})"),
        });
    }
    match serde_json::from_slice::<Refusal>(&bytes) {
        Ok(r) => Err(ClientError::Refused(r)),
        Err(_) => Err(ClientError::Unexpected {
            status,
            body: String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned(),
        }),
    }
}

/// What `fabricctl peer out-of-band` is given (the provider's peer command).
#[derive(Clone, Debug)]
pub struct OutOfBand {
    pub auth_url: String,
    /// The provider's cluster id.
    pub provider_id: String,
    pub token: SecretString,
    pub trust: Trust,
}

/// Progress of [`authenticate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    KeyGenerated,
    Signed {
        tenant_namespace: String,
        api_server_url: String,
        expiry: Option<Timestamp>,
    },
    Stored {
        /// Where the Identity is (the fabric's namespace).
        namespace: String,
        /// Where its Secret is ([`names::namespace::IDENTITIES`]).
        secret_namespace: String,
        secret: String,
        identity: String,
        foreign_cluster: String,
    },
    Verified,
}

/// Authenticates this cluster (`consumer`, local API `local`, fabric namespace `namespace`)
/// to the provider of `command`, and keeps the identity; then checks that the identity works
/// by reading its own `Tenant` on the provider.
pub async fn authenticate(
    local: &Client,
    namespace: &str,
    consumer: &str,
    command: &OutOfBand,
    mut progress: impl FnMut(Step),
) -> Result<Credentials, ClientError> {
    use secrecy::ExposeSecret;
    let (key, csr_pem) = key_and_csr(consumer)?;
    progress(Step::KeyGenerated);
    let answer = send(
        &command.auth_url,
        &command.trust,
        &AuthRequest {
            cluster_id: consumer.to_owned(),
            token: command.token.expose_secret().to_owned(),
            csr_pem,
            provider_cluster_id: Some(command.provider_id.clone()),
        },
    )
    .await?;
    if answer.provider_cluster_id != command.provider_id {
        return Err(ClientError::WrongProvider {
            expected: command.provider_id.clone(),
            answered: answer.provider_cluster_id,
        });
    }
    if !certificate_is_for(&answer.certificate_pem, &key.subject_public_key_info()) {
        return Err(ClientError::WrongCertificate);
    }
    let expiry = validate::certificate_expiry(&answer.certificate_pem);
    progress(Step::Signed {
        tenant_namespace: answer.tenant_namespace.clone(),
        api_server_url: answer.api_server_url.clone(),
        expiry,
    });
    let credentials = Credentials {
        api_server_url: answer.api_server_url,
        ca_pem: answer.ca_pem,
        certificate_pem: answer.certificate_pem,
        key_pem: key.serialize_pem().into(),
        namespace: answer.tenant_namespace,
    };
    store(local, namespace, command, &credentials, expiry).await?;
    progress(Step::Stored {
        namespace: namespace.to_owned(),
        secret_namespace: names::namespace::IDENTITIES.to_owned(),
        secret: names::secret::identity(&command.provider_id),
        identity: command.provider_id.clone(),
        foreign_cluster: command.provider_id.clone(),
    });
    verify(&command.provider_id, &credentials).await?;
    progress(Step::Verified);
    Ok(credentials)
}

fn certificate_is_for(cert_pem: &str, spki_der: &[u8]) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&pem.contents) else {
        return false;
    };
    cert.tbs_certificate.subject_pki.raw == spki_der
}

/// Keeps the identity: the kubeconfig Secret (in [`names::namespace::IDENTITIES`]), the
/// `Identity` (in `namespace`) and the provider's `ForeignCluster` (role Provider added to
/// what it was), all server-side applied.
pub async fn store(
    local: &Client,
    namespace: &str,
    command: &OutOfBand,
    credentials: &Credentials,
    expiry: Option<Timestamp>,
) -> kube::Result<()> {
    let provider = &command.provider_id;
    MANAGER
        .apply(
            &Api::<Secret>::namespaced(local.clone(), names::namespace::IDENTITIES),
            &identity::secret(provider, credentials),
        )
        .await?;
    let identities = Api::<Identity>::namespaced(local.clone(), namespace);
    let mut id = Identity::new(
        provider,
        IdentitySpec {
            cluster_id: provider.clone(),
            api_server_url: credentials.api_server_url.clone(),
            auth_url: command.auth_url.clone(),
            tenant_namespace: credentials.namespace.clone(),
            secret_name: names::secret::identity(provider),
        },
    );
    id.metadata.namespace = Some(namespace.to_owned());
    id.metadata.labels = Some([(names::label::REMOTE_CLUSTER.to_owned(), provider.clone())].into());
    // Renewals verify the service as the first authentication did.
    if let Trust::Pin(pin) = &command.trust {
        id.metadata.annotations = Some(
            [(
                names::annotation::AUTH_PIN.to_owned(),
                format!("sha256:{}", hex::encode(pin)),
            )]
            .into(),
        );
    }
    MANAGER.apply(&identities, &id).await?;
    MANAGER
        .apply_status(
            &identities,
            provider,
            serde_json::json!({
                "certificateExpiry": expiry.map(Time),
                "renewedAt": Time(Timestamp::now()),
            }),
        )
        .await?;

    let fcs = Api::<ForeignCluster>::all(local.clone());
    let existing = fcs.get_opt(provider).await?;
    let spec = ForeignClusterSpec {
        auth_url: Some(command.auth_url.clone()),
        ..ForeignClusterSpec::playing(
            existing.as_ref().map(|f| &f.spec),
            provider,
            PeerRole::Provider,
        )
    };
    MANAGER
        .apply(&fcs, &ForeignCluster::new(provider, spec))
        .await?;
    let until = expiry.map_or_else(|| "an unknown date".to_owned(), |t| t.to_string());
    let cond = status::condition(
        condition::AUTHENTICATED,
        true,
        "Authenticated",
        format!("identity issued by {provider}; certificate valid until {until}"),
        None,
        Timestamp::now(),
    );
    MANAGER
        .apply_status(
            &fcs,
            provider,
            serde_json::json!({
                "tenantNamespace": credentials.namespace,
                "apiServerUrl": credentials.api_server_url,
                "conditions": [cond],
            }),
        )
        .await
}

/// Renews the identity issued by `provider` (its Identity kept in `namespace`) before it expires: a new
/// key and CSR, sent to the provider's authentication service over TLS authenticated by the
/// current certificate, and the new identity stored as the first one was. The service is
/// verified with the pin recorded at the first authentication.
pub async fn renew(
    local: &Client,
    namespace: &str,
    provider: &str,
) -> Result<Credentials, ClientError> {
    let identity = Api::<Identity>::namespaced(local.clone(), namespace)
        .get(provider)
        .await?;
    let pin = identity
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::annotation::AUTH_PIN))
        .ok_or(ClientError::NoPin)?;
    let trust = Trust::Pin(tls::parse_pin(pin)?);
    let secret = Api::<Secret>::namespaced(local.clone(), names::namespace::IDENTITIES)
        .get(&identity.spec.secret_name)
        .await?;
    let current = identity::kubeconfig_of(&secret)
        .ok_or(ClientError::NoIdentity)
        .and_then(|k| identity::parse(&k).map_err(|_| ClientError::NoIdentity))?;
    let consumer =
        validate::consumer_of_pem(&current.certificate_pem).ok_or(ClientError::NoIdentity)?;
    let peering = validate::peering_of_pem(&current.certificate_pem, &consumer)
        .ok_or(ClientError::NoIdentity)?;
    let (key, csr_pem) = key_and_csr_in(&consumer, &peering)?;
    let config = {
        use secrecy::ExposeSecret;
        tls::client_config_with(
            &trust,
            Some((&current.certificate_pem, current.key_pem.expose_secret())),
        )?
    };
    let fut = post(
        &identity.spec.auth_url,
        config,
        RENEW_PATH,
        serde_json::to_vec(&RenewRequest { csr_pem }),
    );
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .map_err(|_| ClientError::Timeout(REQUEST_TIMEOUT))??;
    if answer.provider_cluster_id != provider {
        return Err(ClientError::WrongProvider {
            expected: provider.to_owned(),
            answered: answer.provider_cluster_id,
        });
    }
    if !certificate_is_for(&answer.certificate_pem, &key.subject_public_key_info()) {
        return Err(ClientError::WrongCertificate);
    }
    let expiry = validate::certificate_expiry(&answer.certificate_pem);
    let credentials = Credentials {
        api_server_url: answer.api_server_url,
        ca_pem: answer.ca_pem,
        certificate_pem: answer.certificate_pem,
        key_pem: key.serialize_pem().into(),
        namespace: answer.tenant_namespace,
    };
    let command = OutOfBand {
        auth_url: identity.spec.auth_url.clone(),
        provider_id: provider.to_owned(),
        token: String::new().into(),
        trust,
    };
    store(local, namespace, &command, &credentials, expiry).await?;
    Ok(credentials)
}

/// Reads this cluster's own `Tenant` on the provider with the issued identity.
pub async fn verify(provider: &str, credentials: &Credentials) -> Result<(), ClientError> {
    let text = identity::to_yaml(&identity::kubeconfig(provider, credentials));
    let remote = identity::client_from_kubeconfig(&text)
        .await
        .map_err(|e| ClientError::Verify(e.to_string()))?;
    let tenants = Api::<fabric_api::authentication::v1alpha1::Tenant>::namespaced(
        remote,
        &credentials.namespace,
    );
    // The API server authorizes from a cache of RBAC objects: the tenant's RoleBinding, just
    // created by the service, may take a moment to count (more so when a tenant of the same
    // name was just removed). A refusal is only final after that.
    let t0 = std::time::Instant::now();
    loop {
        match tenants.list(&Default::default()).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 403 && t0.elapsed() < RBAC_SETTLE => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => return Err(ClientError::Verify(e.to_string())),
        }
    }
}

/// How long a fresh identity's refusals are put down to RBAC not having caught up yet.
const RBAC_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_csr_passes_the_providers_check() {
        let (key, csr) = key_and_csr("alpha").unwrap();
        validate::check_csr(&csr, "alpha").unwrap();
        assert!(!csr.contains("PRIVATE KEY"));
        // A certificate for another key is not ours.
        let other = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![])
            .unwrap()
            .self_signed(&other)
            .unwrap()
            .pem();
        assert!(!certificate_is_for(&cert, &key.subject_public_key_info()));
        let ours = rcgen::CertificateParams::new(vec![])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        assert!(certificate_is_for(&ours, &key.subject_public_key_info()));
    }
}
