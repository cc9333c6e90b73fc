//! The EndpointSlices of offloaded namespaces, reflected into their twins as
//! ShadowEndpointSlices (issue 20, the first of two stages): the provider's controller turns
//! each into a real EndpointSlice, its addresses remapped through its view of this cluster.
//! Endpoints on this virtual kubelet's node are left out (their pods run on the provider,
//! whose own endpoint controller has them); every other endpoint goes as it is, addresses
//! unchanged (the provider translates), `ready`, `serving` and `terminating` kept, its
//! target a `Remote<Kind>`. A slice the fabric wrote itself (reflected here from a peer:
//! our managed-by) is never reflected back, so two clusters peered both ways do not loop;
//! nor is `default/kubernetes`'s, nor one of another family than IPv4, nor one of a home
//! Service named [`home_api::SERVICE`] (that name is the home API server's in the twins).
use std::collections::BTreeMap;

use fabric_api::{
    names::{
        endpoint_slice::{MANAGED_BY, REFLECTED, SERVICE_NAME},
        home_api,
    },
    offloading::v1alpha1::{
        EndpointConditions, EndpointSliceTemplate, EndpointTarget, ShadowEndpoint,
        ShadowEndpointPort, ShadowEndpointSlice, ShadowEndpointSliceSpec,
    },
};
use fabric_reflector::mirror::Forge;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::{ResourceExt, api::ObjectMeta};

/// The EndpointSlices of an offloaded namespace, for the provider of node `node_name`.
pub struct EndpointSlices {
    pub node_name: String,
}

/// The one address family the fabric remaps.
const IPV4: &str = "IPv4";

impl EndpointSlices {
    fn endpoint(&self, e: &Endpoint) -> Option<ShadowEndpoint> {
        if e.node_name.as_deref() == Some(self.node_name.as_str()) || e.addresses.is_empty() {
            return None;
        }
        let c = e.conditions.clone().unwrap_or_default();
        Some(ShadowEndpoint {
            addresses: e.addresses.clone(),
            conditions: EndpointConditions {
                ready: c.ready,
                serving: c.serving,
                terminating: c.terminating,
            },
            hostname: e.hostname.clone(),
            zone: e.zone.clone(),
            target_ref: e.target_ref.as_ref().and_then(|t| {
                Some(EndpointTarget {
                    kind: format!("Remote{}", t.kind.as_deref()?),
                    namespace: t.namespace.clone(),
                    name: t.name.clone()?,
                    uid: t.uid.clone(),
                })
            }),
        })
    }
}

impl Forge for EndpointSlices {
    type Home = EndpointSlice;
    type Remote = ShadowEndpointSlice;
    const NAME: &'static str = "endpointslices";

    fn forge(&self, home: &EndpointSlice) -> Option<ShadowEndpointSlice> {
        let labels = home.labels();
        if labels.get(MANAGED_BY).map(String::as_str) == Some(REFLECTED)
            || (home.namespace().as_deref() == Some("default")
                && labels.get(SERVICE_NAME).map(String::as_str) == Some("kubernetes"))
            || home.address_type != IPV4
            || labels.get(SERVICE_NAME).map(String::as_str) == Some(home_api::SERVICE)
        {
            return None;
        }
        let endpoints = home
            .endpoints
            .iter()
            .flatten()
            .filter_map(|e| self.endpoint(e))
            .collect();
        let ports = home
            .ports
            .iter()
            .flatten()
            .map(|p| ShadowEndpointPort {
                name: p.name.clone(),
                port: p.port,
                protocol: p.protocol.clone(),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        // The home endpoint controller's managed-by means nothing there.
        let labels: BTreeMap<String, String> = labels
            .iter()
            .filter(|(k, _)| k.as_str() != MANAGED_BY)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let annotations: BTreeMap<String, String> = home
            .annotations()
            .iter()
            .filter(|(k, _)| k.as_str() != "kubectl.kubernetes.io/last-applied-configuration")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(ShadowEndpointSlice {
            metadata: ObjectMeta {
                labels: Some(labels),
                annotations: (!annotations.is_empty()).then_some(annotations),
                ..Default::default()
            },
            spec: ShadowEndpointSliceSpec {
                template: EndpointSliceTemplate {
                    address_type: home.address_type.clone(),
                    endpoints,
                    ports,
                },
            },
        })
    }

    /// The twins' [`home_api::SERVICE`] slice is the home API server's.
    fn home_name(&self, name: &str) -> Option<String> {
        (name != home_api::SERVICE).then(|| name.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::{
        core::v1::ObjectReference,
        discovery::v1::{EndpointConditions as Conds, EndpointPort},
    };

    use super::*;

    const NODE: &str = "fabric-beta";

    fn ep(ip: &str, node: Option<&str>, ready: bool, terminating: bool) -> Endpoint {
        Endpoint {
            addresses: vec![ip.to_owned()],
            node_name: node.map(str::to_owned),
            conditions: Some(Conds {
                ready: Some(ready),
                serving: Some(ready || terminating),
                terminating: Some(terminating),
            }),
            hostname: Some("db-0".into()),
            zone: Some("z1".into()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some("db-0".into()),
                namespace: Some("shop".into()),
                uid: Some("u1".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(ns: &str, service: &str, managed_by: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{service}-abcde")),
                namespace: Some(ns.into()),
                labels: Some(BTreeMap::from([
                    (SERVICE_NAME.to_owned(), service.to_owned()),
                    (MANAGED_BY.to_owned(), managed_by.to_owned()),
                ])),
                ..Default::default()
            },
            address_type: IPV4.into(),
            endpoints: Some(endpoints),
            ports: Some(vec![EndpointPort {
                name: Some("sql".into()),
                port: Some(5432),
                protocol: Some("TCP".into()),
                app_protocol: None,
            }]),
        }
    }

    fn forge() -> EndpointSlices {
        EndpointSlices {
            node_name: NODE.into(),
        }
    }

    #[test]
    fn endpoints_on_the_provider_are_left_out_the_rest_kept_as_they_are() {
        let home = slice(
            "shop",
            "db",
            "endpointslice-controller.k8s.io",
            vec![
                ep("10.244.1.5", Some("home-1"), true, false),
                ep("10.244.9.9", Some(NODE), true, false),
                ep("10.244.2.6", Some("fabric-gamma"), false, true),
                ep("192.0.2.10", None, true, false),
            ],
        );
        let s = forge().forge(&home).expect("reflected");
        let t = &s.spec.template;
        let addrs: Vec<&str> = t
            .endpoints
            .iter()
            .map(|e| e.addresses[0].as_str())
            .collect();
        assert_eq!(
            addrs,
            ["10.244.1.5", "10.244.2.6", "192.0.2.10"],
            "unchanged, the provider's own left out"
        );
        let c = &t.endpoints[1].conditions;
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true))
        );
        let target = t.endpoints[0].target_ref.as_ref().unwrap();
        assert_eq!(
            (target.kind.as_str(), target.name.as_str()),
            ("RemotePod", "db-0")
        );
        assert_eq!(t.endpoints[0].hostname.as_deref(), Some("db-0"));
        assert_eq!(t.endpoints[0].zone.as_deref(), Some("z1"));
        assert_eq!(t.address_type, "IPv4");
        assert_eq!(t.ports[0].port, Some(5432));
        let labels = s.metadata.labels.unwrap();
        assert_eq!(labels[SERVICE_NAME], "db");
        assert!(
            !labels.contains_key(MANAGED_BY),
            "the home controller's is not kept"
        );
        assert!(s.metadata.name.is_none(), "the mirror names it");
    }

    #[test]
    fn a_slice_reflected_from_a_peer_is_never_reflected_back() {
        let from_peer = slice(
            "shop",
            "db",
            REFLECTED,
            vec![ep("10.245.1.5", None, true, false)],
        );
        assert!(forge().forge(&from_peer).is_none());
    }

    #[test]
    fn the_api_server_s_own_and_other_families_stay_home() {
        let api = slice(
            "default",
            "kubernetes",
            "endpointslice-controller.k8s.io",
            vec![],
        );
        assert!(forge().forge(&api).is_none());
        let mut v6 = slice("shop", "db", "endpointslice-controller.k8s.io", vec![]);
        v6.address_type = "IPv6".into();
        assert!(forge().forge(&v6).is_none());
        // A Service named kubernetes elsewhere is an ordinary one.
        let other = slice(
            "shop",
            "kubernetes",
            "endpointslice-controller.k8s.io",
            vec![],
        );
        assert!(forge().forge(&other).is_some());
        // One of a Service named as the twins' home API server's: its endpoints stay home.
        let clash = slice(
            "shop",
            home_api::SERVICE,
            "endpointslice-controller.k8s.io",
            vec![ep("10.244.1.5", Some("home-1"), true, false)],
        );
        assert!(forge().forge(&clash).is_none());
        assert_eq!(forge().home_name(home_api::SERVICE), None);
    }
}
