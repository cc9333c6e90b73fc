//! The webhook's serving material kept in its Secret (created or renewed as
//! [`super::certs::plan`] says) and its CA published in the `caBundle` of the webhook
//! configurations that call it.
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
        },
        core::v1::Secret,
    },
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ObjectMeta, PostParams},
};
use tracing::info;

use super::{
    Error, Settings,
    certs::{self, Material, Plan},
};

const FIELDS: [&str; 4] = ["ca.crt", "ca.key", "tls.crt", "tls.key"];

fn material_of(secret: &Secret) -> Option<Material> {
    let data = secret.data.as_ref()?;
    let field = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    Some(Material {
        ca_cert: field(FIELDS[0])?,
        ca_key: field(FIELDS[1])?,
        cert: field(FIELDS[2])?,
        key: field(FIELDS[3])?,
    })
}

fn secret_of(
    namespace: &str,
    name: &str,
    m: &Material,
    resource_version: Option<String>,
) -> Secret {
    let values = [&m.ca_cert, &m.ca_key, &m.cert, &m.key];
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            resource_version,
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(
            FIELDS
                .iter()
                .zip(values)
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.clone().into_bytes())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// The material in the Secret, created or renewed as [`certs::plan`] says. Replicas racing
/// to write it settle on whichever write the API server took first.
pub async fn ensure_material(client: &Client, s: &Settings) -> Result<Material, Error> {
    let api = Api::<Secret>::namespaced(client.clone(), &s.namespace);
    let err = |e| Error::Secret(format!("{}/{}", s.namespace, s.tls_secret), e);
    for _ in 0..5 {
        let secret = api.get_opt(&s.tls_secret).await.map_err(err)?;
        let current = secret.as_ref().and_then(material_of);
        let now = time::OffsetDateTime::now_utc();
        let plan = certs::plan(now, current.as_ref(), &s.hosts);
        if plan == Plan::Keep {
            return Ok(current.expect("kept material exists"));
        }
        let new = certs::issue(plan, now, current.as_ref(), &s.hosts)?;
        let written = match &secret {
            None => {
                api.create(
                    &PostParams::default(),
                    &secret_of(&s.namespace, &s.tls_secret, &new, None),
                )
                .await
            }
            Some(old) => {
                api.replace(
                    &s.tls_secret,
                    &PostParams::default(),
                    &secret_of(&s.namespace, &s.tls_secret, &new, old.resource_version()),
                )
                .await
            }
        };
        match written {
            Ok(_) => {
                info!(secret = %s.tls_secret, ?plan, hosts = ?s.hosts, "wrote the webhook's certificates");
                return Ok(new);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(err(e)),
        }
    }
    Err(Error::Contended(s.tls_secret.clone()))
}

/// A webhook configuration (validating or mutating): its webhooks' client configurations.
pub trait WebhookConfiguration:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
{
    fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig>;
}

// The two kinds have the same shape but no common type.
macro_rules! webhook_configuration {
    ($($kind:ty),*) => {$(
        impl WebhookConfiguration for $kind {
            fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig> {
                self.webhooks
                    .iter_mut()
                    .flatten()
                    .map(|w| &mut w.client_config)
                    .collect()
            }
        }
    )*};
}
webhook_configuration!(ValidatingWebhookConfiguration, MutatingWebhookConfiguration);

/// Sets every webhook's `caBundle` in `config` to `ca` (PEM); whether anything changed.
pub fn with_ca_bundle<C: WebhookConfiguration>(config: &mut C, ca: &str) -> bool {
    let mut changed = false;
    for c in config.client_configs() {
        let bundle = Some(ByteString(ca.as_bytes().to_vec()));
        if c.ca_bundle != bundle {
            c.ca_bundle = bundle;
            changed = true;
        }
    }
    changed
}

/// Puts the CA into the `caBundle` of configuration `name` of kind `C`; `false` when the
/// configuration is not there (not installed yet, or not on this cluster: nothing calls the
/// webhook then).
pub async fn publish_ca<C: WebhookConfiguration>(
    client: &Client,
    name: &str,
    ca: &str,
) -> Result<bool, Error> {
    let api = Api::<C>::all(client.clone());
    let err = |e| Error::Config(name.to_owned(), e);
    for _ in 0..5 {
        let Some(mut config) = api.get_opt(name).await.map_err(err)? else {
            return Ok(false);
        };
        if !with_ca_bundle(&mut config, ca) {
            return Ok(true);
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => {
                info!(config = name, "put the webhook's CA into caBundle");
                return Ok(true);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(err(e)),
        }
    }
    Err(Error::Contended(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingWebhook, WebhookClientConfig};

    use super::*;

    #[test]
    fn ca_bundle_is_set_on_every_webhook_once() {
        let hook = |bundle: Option<&str>| ValidatingWebhook {
            name: "shadowpods.offloading.fabric.io".into(),
            client_config: WebhookClientConfig {
                ca_bundle: bundle.map(|b| ByteString(b.as_bytes().to_vec())),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut config = ValidatingWebhookConfiguration {
            webhooks: Some(vec![hook(None), hook(Some("old"))]),
            ..Default::default()
        };
        assert!(with_ca_bundle(&mut config, "ca"));
        assert!(
            config
                .webhooks
                .iter()
                .flatten()
                .all(|w| w.client_config.ca_bundle == Some(ByteString(b"ca".to_vec())))
        );
        assert!(!with_ca_bundle(&mut config, "ca"), "nothing to write twice");

        // The pods' mutating configuration alike.
        let mut pods = MutatingWebhookConfiguration {
            webhooks: Some(vec![
                k8s_openapi::api::admissionregistration::v1::MutatingWebhook {
                    name: "pods.offloading.fabric.io".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        assert!(with_ca_bundle(&mut pods, "ca"));
        assert_eq!(
            pods.webhooks.unwrap()[0].client_config.ca_bundle,
            Some(ByteString(b"ca".to_vec()))
        );
    }

    #[test]
    fn the_secret_holds_the_material() {
        let m = Material {
            ca_cert: "a".into(),
            ca_key: "b".into(),
            cert: "c".into(),
            key: "d".into(),
        };
        let s = secret_of("fabric-system", "x", &m, None);
        assert_eq!(material_of(&s), Some(m));
        assert_eq!(s.data.unwrap()["tls.crt"], ByteString(b"c".to_vec()));
    }
}
