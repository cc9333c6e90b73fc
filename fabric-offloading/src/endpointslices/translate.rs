//! The real EndpointSlice of a consumer's ShadowEndpointSlice, pure: who the consumer is
//! comes from the namespace (its [`label::REMOTE_CLUSTER`], on twins and tenant namespaces
//! only), never from anything the consumer writes; each address is remapped with the
//! consumer's `Configuration` here (its pod CIDR to the one it is seen under, its external
//! CIDR likewise) and **anything else is refused**: a consumer must not point a Service at
//! an address of this cluster (its API server, another tenant's pod). While the consumer is
//! not alive (its tunnel down, its heartbeat silent, or its heartbeat saying its own API
//! server is out of its reach: [`liveness`]), every endpoint is neither ready nor serving
//! here.
use std::{collections::BTreeMap, time::Duration};

use fabric_api::{
    names::{
        annotation::{self, REFLECTED_HASH},
        endpoint_slice::{self, MANAGED_BY, REFLECTED},
        label,
    },
    networking::{
        remap::{Remaps, Unmapped},
        v1alpha1::{Connection, ConnectionState},
    },
    offloading::v1alpha1::ShadowEndpointSlice,
};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Namespace, ObjectReference},
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{Resource, ResourceExt, api::ObjectMeta};

/// The consumer a namespace belongs to, if it is one of a consumer's: a twin or a tenant
/// namespace, by the labels the provider put on it.
pub fn consumer_of(ns: &Namespace) -> Option<String> {
    let labels = ns.metadata.labels.as_ref()?;
    let marked = |k: &str| labels.get(k).is_some_and(|v| v == "true");
    if !(marked(label::TWIN_NAMESPACE) || marked(label::TENANT_NAMESPACE)) {
        return None;
    }
    labels.get(label::REMOTE_CLUSTER).cloned()
}

/// Whether consumer `cluster_id` is reachable as far as this cluster knows: its tunnel's
/// Connection, if the gateway reports one, says Connected (none reported: the network is
/// not the fabric's to judge, the consumer's own conditions stand).
pub fn alive<'a>(cluster_id: &str, connections: impl IntoIterator<Item = &'a Connection>) -> bool {
    let mut of = connections
        .into_iter()
        .filter(|c| c.spec.cluster_id == cluster_id)
        .peekable();
    of.peek().is_none()
        || of.any(|c| c.status.as_ref().map(|s| s.value) == Some(ConnectionState::Connected))
}

/// How long a consumer's heartbeat Lease may stay unchanged before its endpoints are taken
/// as not ready: three of the virtual kubelet's renewals (every 10 s without at-most-once
/// terms, more often with them).
pub const SILENT_AFTER: Duration = Duration::from_secs(30);

/// What a consumer's heartbeat Lease ([`fabric_api::names::lease::CONSUMER`]) says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// No Lease seen: a virtual kubelet that does not renew one (older) or has not yet; the
    /// tunnel alone judges.
    Unknown,
    /// Renewed within [`SILENT_AFTER`]; silent unless renewed again within `silent_in`.
    Fresh { silent_in: Duration },
    /// Unchanged for this long (at least [`SILENT_AFTER`]).
    Silent(Duration),
    /// Renewed, saying the consumer's own API server does not answer it: what it reflected
    /// is not kept up to date.
    HomeApiDown,
}

/// The heartbeat of a consumer whose Lease is `lease` and has not changed for `still` (by
/// this cluster's clock, never the consumer's).
pub fn heartbeat(lease: Option<&Lease>, still: Option<Duration>) -> Heartbeat {
    let (Some(lease), Some(still)) = (lease, still) else {
        return Heartbeat::Unknown;
    };
    if still >= SILENT_AFTER {
        return Heartbeat::Silent(still);
    }
    let says = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotation::HOME_API));
    if says.is_some_and(|v| v == annotation::HOME_API_UNREACHABLE) {
        Heartbeat::HomeApiDown
    } else {
        Heartbeat::Fresh {
            silent_in: SILENT_AFTER - still,
        }
    }
}

/// Whether a consumer's slices are to be translated again now that its heartbeat reads
/// `after`, having read `before` when they last were (`None`: not yet): only when what the
/// heartbeat vouches for changes. A renewal that changes nothing re-translates nothing: with
/// thousands of slices a consumer renewing every few seconds would otherwise cost thousands
/// of reconciles (and, while it is not vouched for, as many Events) each time.
pub fn vouches_differently(before: Option<Heartbeat>, after: Heartbeat) -> bool {
    fn says(h: Heartbeat) -> u8 {
        match h {
            Heartbeat::Unknown | Heartbeat::Fresh { .. } => 0,
            Heartbeat::Silent(_) => 1,
            Heartbeat::HomeApiDown => 2,
        }
    }
    before.is_none_or(|b| says(b) != says(after))
}

/// Why a consumer's endpoints are taken as not ready here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotVouched {
    #[error("its tunnel to this cluster is not connected")]
    TunnelDown,
    #[error("its heartbeat has not changed for {}s (its virtual kubelet is not renewing it)", .0.as_secs())]
    Silent(Duration),
    #[error("its virtual kubelet says its own API server does not answer")]
    HomeApiDown,
}

impl NotVouched {
    /// The Event reason saying it (one per cause: an Event series keeps its first note).
    pub fn reason(self) -> &'static str {
        match self {
            NotVouched::TunnelDown => "ConsumerTunnelDown",
            NotVouched::Silent(_) => "ConsumerSilent",
            NotVouched::HomeApiDown => "ConsumerApiDown",
        }
    }
}

/// Whether the consumer's endpoints are taken as they are (`Ok`) or as not ready, and why.
pub fn liveness(tunnel_up: bool, heartbeat: Heartbeat) -> Result<(), NotVouched> {
    if !tunnel_up {
        return Err(NotVouched::TunnelDown);
    }
    match heartbeat {
        Heartbeat::Unknown | Heartbeat::Fresh { .. } => Ok(()),
        Heartbeat::Silent(d) => Err(NotVouched::Silent(d)),
        Heartbeat::HomeApiDown => Err(NotVouched::HomeApiDown),
    }
}

/// An address left out of the real slice, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub address: String,
    pub why: Unmapped,
}

/// The real slice, and the addresses refused on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub slice: EndpointSlice,
    pub refused: Vec<Refused>,
}

/// The real EndpointSlice of `shadow` (named [`endpoint_slice::reflected`], in its
/// namespace): its labels and
/// annotations with our managed-by (an endpoint controller leaves it alone, a peer's
/// virtual kubelet never reflects it back), owned by the shadow, each address through
/// `remaps` (refused ones dropped, an endpoint left without one dropped), not ready nor
/// serving while the consumer is not `alive`.
pub fn real_slice(shadow: &ShadowEndpointSlice, remaps: &Remaps, alive: bool) -> Translated {
    let mut labels = shadow.labels().clone();
    labels.insert(MANAGED_BY.to_owned(), REFLECTED.to_owned());
    let annotations: BTreeMap<String, String> = shadow
        .annotations()
        .iter()
        .filter(|(k, _)| k.as_str() != REFLECTED_HASH)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut refused = Vec::new();
    let template = &shadow.spec.template;
    let endpoints: Vec<Endpoint> = template
        .endpoints
        .iter()
        .filter_map(|e| {
            let addresses: Vec<String> = e
                .addresses
                .iter()
                .filter_map(|a| match remaps.map(a) {
                    Ok(seen) => Some(seen.to_string()),
                    Err(why) => {
                        refused.push(Refused {
                            address: a.clone(),
                            why,
                        });
                        None
                    }
                })
                .collect();
            let gated = |c: Option<bool>| if alive { c } else { Some(false) };
            (!addresses.is_empty()).then(|| Endpoint {
                addresses,
                conditions: Some(EndpointConditions {
                    ready: gated(e.conditions.ready),
                    serving: gated(e.conditions.serving),
                    terminating: e.conditions.terminating,
                }),
                hostname: e.hostname.clone(),
                zone: e.zone.clone(),
                target_ref: e.target_ref.as_ref().map(|t| ObjectReference {
                    kind: Some(t.kind.clone()),
                    namespace: t.namespace.clone(),
                    name: Some(t.name.clone()),
                    uid: t.uid.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        })
        .collect();
    let owner = OwnerReference {
        api_version: ShadowEndpointSlice::api_version(&()).into_owned(),
        kind: ShadowEndpointSlice::kind(&()).into_owned(),
        name: shadow.name_any(),
        uid: shadow.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let slice = EndpointSlice {
        metadata: ObjectMeta {
            name: Some(endpoint_slice::reflected(&shadow.name_any())),
            namespace: shadow.namespace(),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        address_type: template.address_type.clone(),
        endpoints: Some(endpoints),
        ports: Some(
            template
                .ports
                .iter()
                .map(|p| EndpointPort {
                    name: p.name.clone(),
                    port: p.port,
                    protocol: p.protocol.clone(),
                    app_protocol: p.app_protocol.clone(),
                })
                .collect(),
        ),
    };
    Translated { slice, refused }
}

/// Whether `current` (the cluster's copy, from the watch cache) already says all that
/// `desired` says, so that writing it again would change nothing: what the server defaults
/// (a port's protocol) is taken as defaulted, what others add besides our labels is not ours
/// to compare.
pub fn written(current: &EndpointSlice, desired: &EndpointSlice) -> bool {
    let ports = |s: &EndpointSlice| -> Vec<EndpointPort> {
        s.ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                ..p.clone()
            })
            .collect()
    };
    let owners = |s: &EndpointSlice| -> Vec<(String, String)> {
        s.owner_references()
            .iter()
            .map(|o| (o.name.clone(), o.uid.clone()))
            .collect()
    };
    current.labels() == desired.labels()
        && current.annotations() == desired.annotations()
        && owners(current) == owners(desired)
        && current.address_type == desired.address_type
        && current.endpoints.as_deref().unwrap_or_default()
            == desired.endpoints.as_deref().unwrap_or_default()
        && ports(current) == ports(desired)
}

/// Whether `slice` is one this controller writes (ours to update or delete).
pub fn ours(slice: &EndpointSlice) -> bool {
    slice.labels().get(MANAGED_BY).map(String::as_str) == Some(REFLECTED)
}

#[cfg(test)]
mod tests {
    use fabric_api::{
        networking::v1alpha1::{
            ClusterCidrs, ConfigurationSpec, ConfigurationStatus, ConnectionSpec, ConnectionStatus,
        },
        offloading::v1alpha1::{
            EndpointConditions as Conds, EndpointSliceTemplate, EndpointTarget, ShadowEndpoint,
            ShadowEndpointPort, ShadowEndpointSliceSpec,
        },
    };

    use super::*;

    fn remaps() -> Remaps {
        let cidrs = |pod: &str, external: &str| ClusterCidrs {
            pod: pod.parse().unwrap(),
            external: external.parse().unwrap(),
        };
        let mut c = fabric_api::networking::v1alpha1::Configuration::new(
            "alpha",
            ConfigurationSpec {
                cluster_id: "alpha".into(),
                remote: cidrs("10.244.0.0/16", "10.70.0.0/16"),
            },
        );
        c.status = Some(ConfigurationStatus {
            remote: Some(cidrs("10.245.0.0/16", "10.90.0.0/16")),
            ..Default::default()
        });
        Remaps::of(&c).unwrap()
    }

    fn endpoint(addresses: &[&str], ready: bool, terminating: bool) -> ShadowEndpoint {
        ShadowEndpoint {
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
            conditions: Conds {
                ready: Some(ready),
                serving: Some(ready || terminating),
                terminating: Some(terminating),
            },
            hostname: Some("db-0".into()),
            zone: Some("home-a".into()),
            target_ref: Some(EndpointTarget {
                kind: "RemotePod".into(),
                namespace: Some("shop".into()),
                name: "db-0".into(),
                uid: Some("u1".into()),
            }),
        }
    }

    fn shadow(endpoints: Vec<ShadowEndpoint>) -> ShadowEndpointSlice {
        let mut s = ShadowEndpointSlice::new(
            "db-abcde",
            ShadowEndpointSliceSpec {
                template: EndpointSliceTemplate {
                    address_type: "IPv4".into(),
                    endpoints,
                    ports: vec![ShadowEndpointPort {
                        name: Some("sql".into()),
                        port: Some(5432),
                        protocol: Some("TCP".into()),
                        app_protocol: None,
                    }],
                },
            },
        );
        s.metadata.namespace = Some("shop".into());
        s.metadata.uid = Some("shadow-uid".into());
        s.metadata.labels = Some(BTreeMap::from([
            ("kubernetes.io/service-name".to_owned(), "db".to_owned()),
            (
                MANAGED_BY.to_owned(),
                "endpointslice-controller.k8s.io".to_owned(),
            ),
        ]));
        s
    }

    #[test]
    fn pod_and_external_addresses_are_remapped_and_the_rest_refused() {
        let s = shadow(vec![
            endpoint(&["10.244.1.5"], true, false),
            endpoint(&["10.70.0.9"], true, false),
            // The provider's API server, another tenant's pod as seen here: refused.
            endpoint(&["10.96.0.1"], true, false),
            endpoint(&["10.245.7.7", "10.244.7.7"], true, false),
        ]);
        let t = real_slice(&s, &remaps(), true);
        let addrs: Vec<_> = t
            .slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.addresses.clone())
            .collect();
        assert_eq!(
            addrs,
            vec![
                vec!["10.245.1.5".to_owned()],
                vec!["10.90.0.9".to_owned()],
                vec!["10.245.7.7".to_owned()],
            ]
        );
        let refused: Vec<_> = t.refused.iter().map(|r| r.address.as_str()).collect();
        assert_eq!(refused, ["10.96.0.1", "10.245.7.7"]);
        assert!(t.refused[0].why.to_string().contains("10.244.0.0/16"));
    }

    #[test]
    fn the_slice_is_named_labelled_owned_and_keeps_what_the_consumer_said() {
        let s = shadow(vec![endpoint(&["10.244.1.5"], false, true)]);
        let t = real_slice(&s, &remaps(), true);
        assert_eq!(t.slice.metadata.name.as_deref(), Some("db-abcde-fabric"));
        assert_eq!(t.slice.metadata.namespace.as_deref(), Some("shop"));
        assert!(ours(&t.slice), "our managed-by, not the consumer's");
        assert_eq!(t.slice.labels()["kubernetes.io/service-name"], "db");
        let owner = &t.slice.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ShadowEndpointSlice", "shadow-uid")
        );
        let e = &t.slice.endpoints.as_ref().unwrap()[0];
        let c = e.conditions.as_ref().unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true))
        );
        assert_eq!(e.hostname.as_deref(), Some("db-0"));
        assert_eq!(e.zone.as_deref(), Some("home-a"));
        assert_eq!(
            e.target_ref.as_ref().unwrap().kind.as_deref(),
            Some("RemotePod")
        );
        assert_eq!(t.slice.address_type, "IPv4");
        assert_eq!(t.slice.ports.as_ref().unwrap()[0].port, Some(5432));
    }

    #[test]
    fn nothing_is_ready_nor_serving_while_the_consumer_is_not_alive() {
        let s = shadow(vec![endpoint(&["10.244.1.5"], true, false)]);
        let t = real_slice(&s, &remaps(), false);
        let c = t.slice.endpoints.as_ref().unwrap()[0]
            .conditions
            .clone()
            .unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(false), Some(false))
        );
        let back = real_slice(&s, &remaps(), true);
        assert_eq!(
            back.slice.endpoints.as_ref().unwrap()[0]
                .conditions
                .as_ref()
                .unwrap()
                .ready,
            Some(true)
        );
    }

    #[test]
    fn alive_as_the_tunnel_says_when_there_is_one() {
        let conn = |id: &str, state| {
            let mut c = Connection::new(
                id,
                ConnectionSpec {
                    cluster_id: id.into(),
                },
            );
            c.status = Some(ConnectionStatus {
                value: state,
                ..Default::default()
            });
            c
        };
        assert!(alive("alpha", &[]));
        assert!(alive("alpha", &[conn("beta", ConnectionState::Error)]));
        assert!(!alive("alpha", &[conn("alpha", ConnectionState::Error)]));
        assert!(!alive(
            "alpha",
            &[conn("alpha", ConnectionState::Connecting)]
        ));
        assert!(alive("alpha", &[conn("alpha", ConnectionState::Connected)]));
    }

    #[test]
    fn only_a_change_of_what_the_heartbeat_vouches_for_translates_again() {
        let fresh = |s| Heartbeat::Fresh {
            silent_in: Duration::from_secs(s),
        };
        let silent = |s| Heartbeat::Silent(Duration::from_secs(s));
        assert!(vouches_differently(None, fresh(30)));
        assert!(!vouches_differently(Some(fresh(30)), fresh(20)));
        assert!(!vouches_differently(Some(Heartbeat::Unknown), fresh(30)));
        assert!(!vouches_differently(Some(silent(30)), silent(45)));
        assert!(vouches_differently(Some(fresh(1)), silent(30)));
        assert!(vouches_differently(Some(silent(30)), fresh(30)));
        assert!(vouches_differently(Some(fresh(30)), Heartbeat::HomeApiDown));
        assert!(vouches_differently(
            Some(Heartbeat::HomeApiDown),
            silent(30)
        ));
    }

    #[test]
    fn the_heartbeat_vouches_while_it_changes_and_home_answers() {
        let s = Duration::from_secs;
        let lease = |home: Option<&str>| Lease {
            metadata: ObjectMeta {
                annotations: home.map(|h| [(annotation::HOME_API.to_owned(), h.to_owned())].into()),
                ..Default::default()
            },
            spec: None,
        };
        let up = lease(Some(annotation::HOME_API_REACHABLE));
        let down = lease(Some(annotation::HOME_API_UNREACHABLE));
        // Never seen: the tunnel alone judges.
        assert_eq!(heartbeat(None, None), Heartbeat::Unknown);
        assert_eq!(heartbeat(Some(&up), None), Heartbeat::Unknown);
        assert_eq!(
            heartbeat(Some(&up), Some(s(10))),
            Heartbeat::Fresh { silent_in: s(20) }
        );
        // Older virtual kubelets say nothing of home: fresh is fresh.
        assert_eq!(
            heartbeat(Some(&lease(None)), Some(s(0))),
            Heartbeat::Fresh { silent_in: s(30) }
        );
        assert_eq!(heartbeat(Some(&up), Some(s(30))), Heartbeat::Silent(s(30)));
        assert_eq!(heartbeat(Some(&down), Some(s(1))), Heartbeat::HomeApiDown);
        // Silent wins over what it last said.
        assert_eq!(
            heartbeat(Some(&down), Some(s(31))),
            Heartbeat::Silent(s(31))
        );

        assert_eq!(liveness(true, Heartbeat::Unknown), Ok(()));
        assert_eq!(liveness(true, Heartbeat::Fresh { silent_in: s(1) }), Ok(()));
        // The tunnel first: a cut consumer cannot renew anything either.
        assert_eq!(
            liveness(false, Heartbeat::HomeApiDown),
            Err(NotVouched::TunnelDown)
        );
        let silent = liveness(true, Heartbeat::Silent(s(45))).unwrap_err();
        assert!(silent.to_string().contains("45s"), "{silent}");
        assert_eq!(
            liveness(true, Heartbeat::HomeApiDown),
            Err(NotVouched::HomeApiDown)
        );
        assert_ne!(silent.reason(), NotVouched::HomeApiDown.reason());
    }

    #[test]
    fn a_slice_that_already_says_it_is_not_written_again() {
        let s = shadow(vec![endpoint(&["10.244.1.5"], true, false)]);
        let desired = real_slice(&s, &remaps(), true).slice;
        let mut current = desired.clone();
        // What the server adds: its own metadata, a defaulted protocol.
        current.metadata.resource_version = Some("7".into());
        current.metadata.uid = Some("slice-uid".into());
        for p in current.ports.iter_mut().flatten() {
            p.protocol = None;
        }
        assert!(written(&current, &desired));
        // Any change the shadow or the consumer's liveness makes is a write.
        let not_ready = real_slice(&s, &remaps(), false).slice;
        assert!(!written(&current, &not_ready));
        let moved = real_slice(
            &shadow(vec![endpoint(&["10.244.1.6"], true, false)]),
            &remaps(),
            true,
        )
        .slice;
        assert!(!written(&current, &moved));
        let mut relabelled = current.clone();
        relabelled
            .labels_mut()
            .insert("kubernetes.io/service-name".into(), "other".into());
        assert!(!written(&relabelled, &desired));
        let mut reowned = current.clone();
        reowned.owner_references_mut()[0].uid = "older-shadow".into();
        assert!(!written(&reowned, &desired));
    }

    #[test]
    fn only_twins_and_tenant_namespaces_name_a_consumer() {
        let ns = |labels: &[(&str, &str)]| Namespace {
            metadata: ObjectMeta {
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let twin = ns(&[
            (label::TWIN_NAMESPACE, "true"),
            (label::REMOTE_CLUSTER, "alpha"),
        ]);
        assert_eq!(consumer_of(&twin).as_deref(), Some("alpha"));
        let tenant = ns(&[
            (label::TENANT_NAMESPACE, "true"),
            (label::REMOTE_CLUSTER, "alpha"),
        ]);
        assert_eq!(consumer_of(&tenant).as_deref(), Some("alpha"));
        assert_eq!(consumer_of(&ns(&[(label::REMOTE_CLUSTER, "alpha")])), None);
        assert_eq!(consumer_of(&ns(&[(label::TWIN_NAMESPACE, "true")])), None);
    }
}
