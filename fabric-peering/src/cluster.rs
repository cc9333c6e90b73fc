//! One cluster of a peering and the API calls a peering makes there. Each call does one
//! thing and returns at once; waiting is the caller's (see [`crate::peer`]).
use std::collections::BTreeMap;

use fabric_api::{
    identity::{ClusterIdentity, GatewayIdentity},
    names::{config_map, secret},
    networking::v1alpha1::{
        ClusterCidrs, Configuration, Connection, ConnectionState, GatewayClient, GatewayServer,
        Network, PublicKey,
    },
};
use fabric_kube::meta::{delete_gone_ok, is_conflict};
use k8s_openapi::{
    ByteString, NamespaceResourceScope,
    api::core::v1::{ConfigMap, Secret},
};
use kube::{
    Api, Client, Resource,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    Action, Error, Side,
    plan::{GatewayRole, PeerObjects, peer_selector},
};

/// A cluster taking part in a peering: how to reach its API, where the fabric runs there,
/// and its identity.
#[derive(Clone)]
pub struct Cluster {
    pub side: Side,
    pub client: Client,
    pub namespace: String,
    pub identity: ClusterIdentity,
}

impl Cluster {
    /// Reads and validates the cluster's identity from its `fabric-cluster` ConfigMap.
    pub async fn read(side: Side, client: Client, namespace: &str) -> Result<Self, Error> {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let cm = cms
            .get_opt(config_map::CLUSTER)
            .await
            .map_err(|source| Error::Unreachable { side, source })?
            .ok_or_else(|| Error::NotInstalled {
                side,
                namespace: namespace.to_owned(),
            })?;
        let identity =
            ClusterIdentity::from_data(&cm.data.unwrap_or_default()).map_err(|source| {
                Error::BadIdentity {
                    side,
                    namespace: namespace.to_owned(),
                    source,
                }
            })?;
        Ok(Self {
            side,
            client,
            namespace: namespace.to_owned(),
            identity,
        })
    }

    pub fn id(&self) -> &str {
        &self.identity.cluster_id
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn api_error<K>(&self, action: Action, name: &str) -> impl FnOnce(kube::Error) -> Error
    where
        K: Resource,
        K::DynamicType: Default,
    {
        let (side, name) = (self.side, name.to_owned());
        move |source| Error::Api {
            action,
            kind: K::kind(&Default::default()).into_owned(),
            name,
            side,
            source,
        }
    }

    /// Creates the gateway's key Secret unless it exists (the gateway replicas share it).
    pub async fn ensure_gateway_key(&self) -> Result<(), Error> {
        let secrets: Api<Secret> = self.api();
        let read = self.api_error::<Secret>(Action::Reading, secret::GATEWAY_KEY);
        if secrets
            .get_opt(secret::GATEWAY_KEY)
            .await
            .map_err(read)?
            .is_some()
        {
            return Ok(());
        }
        let key = fabric_gateway_api::PrivateKey::generate()
            .map_err(|source| Error::KeyGeneration {
                side: self.side,
                source,
            })?
            .to_base64();
        let s = Secret {
            metadata: ObjectMeta {
                name: Some(secret::GATEWAY_KEY.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                secret::GATEWAY_KEY_FIELD.into(),
                ByteString(key.into_bytes()),
            )])),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &s).await {
            Ok(_) => Ok(()),
            // Someone else (a second peering, an operator) created it meanwhile: theirs holds.
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(self
                .api_error::<Secret>(Action::Creating, secret::GATEWAY_KEY)(
                e
            )),
        }
    }

    /// The gateway's key and endpoint, once its operator has published them.
    pub async fn gateway_identity(&self) -> Result<Option<GatewayIdentity>, Error> {
        let name = config_map::GATEWAY_IDENTITY;
        let cm = self
            .api::<ConfigMap>()
            .get_opt(name)
            .await
            .map_err(self.api_error::<ConfigMap>(Action::Reading, name))?;
        let Some(data) = cm.and_then(|cm| cm.data) else {
            return Ok(None);
        };
        match GatewayIdentity::from_data(&data) {
            Ok(id) => Ok(Some(id)),
            // Not written yet.
            Err(fabric_api::identity::IdentityError::Missing { .. }) => Ok(None),
            Err(source) => Err(Error::BadGatewayIdentity {
                side: self.side,
                namespace: self.namespace.clone(),
                source,
            }),
        }
    }

    /// Creates or updates `obj` (server-side apply, taking over fields others set).
    pub async fn apply<K>(&self, obj: &K, field_manager: &str) -> Result<(), Error>
    where
        K: Resource<Scope = NamespaceResourceScope>
            + Clone
            + Serialize
            + DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let name = obj.meta().name.clone().unwrap_or_default();
        self.api::<K>()
            .patch(
                &name,
                &PatchParams::apply(field_manager).force(),
                &Patch::Apply(obj),
            )
            .await
            .map_err(self.api_error::<K>(Action::Creating, &name))?;
        Ok(())
    }

    /// Creates or updates everything this cluster holds about a peer.
    pub async fn apply_peer(&self, o: &PeerObjects, field_manager: &str) -> Result<(), Error> {
        self.apply(&o.configuration, field_manager).await?;
        self.apply(&o.public_key, field_manager).await?;
        match &o.gateway {
            GatewayRole::Client(c) => self.apply(c, field_manager).await,
            GatewayRole::Server(s) => self.apply(s, field_manager).await,
        }
    }

    /// The CIDRs IPAM granted for `peer`'s networks, once it has.
    pub async fn seen_as(&self, peer: &str) -> Result<Option<ClusterCidrs>, Error> {
        Ok(self
            .api::<Configuration>()
            .get_opt(peer)
            .await
            .map_err(self.api_error::<Configuration>(Action::Reading, peer))?
            .and_then(|c| c.status?.remote))
    }

    /// `Some(latency)` once the gateway reports the tunnel to `peer` as connected.
    pub async fn connected(&self, peer: &str) -> Result<Option<Option<String>>, Error> {
        Ok(self
            .api::<Connection>()
            .get_opt(peer)
            .await
            .map_err(self.api_error::<Connection>(Action::Reading, peer))?
            .and_then(|c| c.status)
            .filter(|s| s.value == ConnectionState::Connected)
            .map(|s| s.latency))
    }

    async fn delete<K>(&self, name: &str) -> Result<(), Error>
    where
        K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
        K::DynamicType: Default,
    {
        delete_gone_ok(&self.api::<K>(), name)
            .await
            .map_err(self.api_error::<K>(Action::Deleting, name))
    }

    /// Deletes what this cluster holds about `peer`; IPAM and the gateway then let go of it.
    pub async fn delete_peer(&self, peer: &str) -> Result<(), Error> {
        self.delete::<GatewayClient>(peer).await?;
        self.delete::<GatewayServer>(peer).await?;
        self.delete::<PublicKey>(peer).await?;
        self.delete::<Configuration>(peer).await
    }

    /// Whether nothing about `peer` is left: its Configuration (held by IPAM's finalizer until
    /// the grants are released), IPAM's Network records and the gateway's Connection.
    pub async fn released(&self, peer: &str) -> Result<bool, Error> {
        let cfg = self
            .api::<Configuration>()
            .get_opt(peer)
            .await
            .map_err(self.api_error::<Configuration>(Action::Reading, peer))?;
        if cfg.is_some() {
            return Ok(false);
        }
        let nets = self
            .api::<Network>()
            .list(&ListParams::default().labels(&peer_selector(peer)))
            .await
            .map_err(self.api_error::<Network>(Action::Reading, peer))?;
        if !nets.items.is_empty() {
            return Ok(false);
        }
        let conn = self
            .api::<Connection>()
            .get_opt(peer)
            .await
            .map_err(self.api_error::<Connection>(Action::Reading, peer))?;
        Ok(conn.is_none())
    }
}
