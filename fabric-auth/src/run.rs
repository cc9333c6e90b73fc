//! Running the service (`fabric-controller auth`): the serving certificate from its Secret
//! (created self-signed when absent), the listener, and [`crate::server::serve`] in front of
//! [`crate::provider::Service`].
use std::{net::SocketAddr, sync::Arc};

use fabric_api::names;
use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tracing::info;

use crate::{
    provider::Service,
    server::{self, Limits},
    tls::{self, TlsError},
};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("reading or creating Secret {0}: {1}")]
    Secret(String, #[source] kube::Error),
    #[error("Secret {0} has no {1}")]
    MissingField(String, &'static str),
    #[error("the serving certificate: {0}")]
    Tls(#[from] TlsError),
    #[error("listening on {0}: {1}")]
    Listen(SocketAddr, #[source] std::io::Error),
}

const CERT_FIELD: &str = "tls.crt";
const KEY_FIELD: &str = "tls.key";

fn field(secret: &Secret, key: &'static str, name: &str) -> Result<String, RunError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .ok_or_else(|| RunError::MissingField(name.to_owned(), key))
}

/// The serving certificate and key (PEM) kept in Secret `name` of `namespace`; when absent, a
/// self-signed one for `hosts` is created there (a concurrent replica's wins).
pub async fn serving_certificate(
    client: &Client,
    namespace: &str,
    name: &str,
    hosts: &[String],
) -> Result<(String, String), RunError> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let err = |e| RunError::Secret(format!("{namespace}/{name}"), e);
    let secret = match api.get_opt(name).await.map_err(err)? {
        Some(s) => s,
        None => {
            let (cert, key) = tls::self_signed(hosts)?;
            let new = Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".to_owned()),
                data: Some(
                    [
                        (CERT_FIELD.to_owned(), ByteString(cert.into_bytes())),
                        (KEY_FIELD.to_owned(), ByteString(key.into_bytes())),
                    ]
                    .into(),
                ),
                ..Default::default()
            };
            match api.create(&PostParams::default(), &new).await {
                Ok(s) => {
                    info!(
                        secret = name,
                        ?hosts,
                        "created a self-signed serving certificate"
                    );
                    s
                }
                Err(kube::Error::Api(e)) if e.code == 409 => api.get(name).await.map_err(err)?,
                Err(e) => return Err(err(e)),
            }
        }
    };
    Ok((
        field(&secret, CERT_FIELD, name)?,
        field(&secret, KEY_FIELD, name)?,
    ))
}

/// The pin of the service's certificate in Secret [`names::secret::AUTH_TLS`] (what
/// `fabricctl generate peer-command` prints), `None` while the service has not created it.
pub async fn published_pin(client: &Client, namespace: &str) -> Result<Option<String>, RunError> {
    let name = names::secret::AUTH_TLS;
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| RunError::Secret(format!("{namespace}/{name}"), e))?;
    secret
        .map(|s| Ok(tls::pin_of_pem(&field(&s, CERT_FIELD, name)?)?))
        .transpose()
}

/// Serves `service` on `listen` with the certificate of Secret `tls_secret` until the task is
/// dropped. With `client_ca` (the CA consumers' client certificates chain to: the cluster's
/// client CA), consumers renew their certificates with them.
pub async fn run(
    service: Service,
    listen: SocketAddr,
    tls_secret: &str,
    tls_hosts: &[String],
    client_ca: Option<&str>,
    limits: Limits,
) -> Result<(), RunError> {
    let (cert, key) =
        serving_certificate(&service.client, &service.namespace, tls_secret, tls_hosts).await?;
    let pin = tls::pin_of_pem(&cert)?;
    let config = Arc::new(
        fabric_http::https::server_config(&cert, &key, client_ca).map_err(TlsError::from)?,
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| RunError::Listen(listen, e))?;
    info!(%listen, %pin, "authentication service listening");
    let service = Arc::new(service);
    server::serve(listener, config, limits, move |call| {
        let service = service.clone();
        async move { service.answer(call).await }
    })
    .await;
    Ok(())
}
