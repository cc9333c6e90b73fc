//! The test clusters' stand-in for kube-controller-manager's EndpointSlice controller (the test
//! API server runs no controllers), free of I/O: for a Service with a selector, the one
//! EndpointSlice (`<service>-fabt`) it should have — the pods of its namespace matching the
//! selector that have an address and have not finished, with upstream's conditions (`serving`
//! = the pod's Ready condition, `terminating` = being deleted, `ready` = serving and not
//! terminating, or always with `publishNotReadyAddresses`), and the Service's ports with
//! their target ports resolved (named ones from the pods' container ports). Only slices
//! carrying [`MANAGED_BY`] are this controller's: slices others write (the fabric's
//! translated slices) are never touched, and its slices of a Service without a selector are
//! left alone (as upstream's); they go when the Service goes ([`stale`]). `fabric-test-endpoints` feeds it from watches and
//! applies the result; [`start`] runs that binary against an API server.
//!
//! Not done, as tests do not need it: more than one slice per Service (endpoints with
//! different resolutions of a named port are left out, with a note), IPv6, topology hints,
//! zones, and mirroring of selector-less Services' Endpoints.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{ObjectReference, Pod, Service},
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::{apis::meta::v1::OwnerReference, util::intstr::IntOrString},
};
use kube::ResourceExt;

/// The labels and values upstream's controller writes, as the fabric names them.
pub use fabric_api::names::endpoint_slice::{
    CONTROLLER as MANAGED_BY, MANAGED_BY as MANAGED_BY_LABEL, SERVICE_NAME as SERVICE_NAME_LABEL,
};
/// Field manager of its server-side applies.
pub const FIELD_MANAGER: &str = "fabric-test-endpoints";

/// The name of a Service's slice.
pub fn slice_name(service: &str) -> String {
    format!("{service}-fabt")
}

/// Does the slice belong to this controller?
pub fn is_ours(slice: &EndpointSlice) -> bool {
    slice.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
}

/// The Service's selector, when it has a non-empty one (otherwise its slices are not ours
/// to make).
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
}

fn selects(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.labels();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A named port of the pod's containers (regular ones, as upstream looks them up).
fn container_port(pod: &Pod, name: &str, protocol: &str) -> Option<i32> {
    pod.spec.as_ref()?.containers.iter().find_map(|c| {
        c.ports.as_ref()?.iter().find_map(|p| {
            (p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == protocol)
                .then_some(p.container_port)
        })
    })
}

/// What a Service should have: its slice, and notes on the pods left out of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub slice: EndpointSlice,
    pub notes: Vec<String>,
}

/// The slice of `svc` over `pods` (any pods: those of other namespaces, not matching, without
/// an address or finished are left out); None for a Service without a selector.
pub fn desired_slice(svc: &Service, pods: &[&Pod]) -> Option<Desired> {
    let selector = selector(svc)?;
    let spec = svc.spec.as_ref()?;
    let ns = svc.namespace().unwrap_or_default();
    let mut members: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|p| {
            p.namespace().as_deref() == Some(ns.as_str())
                && selects(selector, p)
                && !terminal(p)
                && p.status
                    .as_ref()
                    .and_then(|s| s.pod_ip.as_deref())
                    .is_some_and(|ip| !ip.is_empty())
        })
        .collect();
    members.sort_by_key(|p| p.name_any());
    let mut notes = Vec::new();
    // Each Service port's number: a numeric target port (or the port itself), or a named one
    // as the first pod (by name) resolves it; pods resolving it otherwise are left out.
    let mut ports = Vec::new();
    let mut excluded = std::collections::BTreeSet::new();
    for sp in spec.ports.iter().flatten() {
        let protocol = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
        let number = match &sp.target_port {
            None => Some(sp.port),
            Some(IntOrString::Int(n)) => Some(*n),
            Some(IntOrString::String(name)) => {
                let mut chosen = None;
                for p in &members {
                    match (container_port(p, name, &protocol), chosen) {
                        (Some(n), None) => chosen = Some(n),
                        (Some(n), Some(c)) if n == c => {}
                        (found, _) => {
                            excluded.insert(p.name_any());
                            notes.push(format!(
                                "pod {}: port {name:?} {} (the slice has {})",
                                p.name_any(),
                                found.map_or("not found".to_owned(), |n| format!("is {n}")),
                                chosen.map_or("none".to_owned(), |c| c.to_string()),
                            ));
                        }
                    }
                }
                chosen
            }
        };
        let Some(number) = number else {
            notes.push(format!(
                "port {}: no pod resolves its target port",
                sp.name.as_deref().unwrap_or_default()
            ));
            continue;
        };
        ports.push(EndpointPort {
            name: Some(sp.name.clone().unwrap_or_default()),
            port: Some(number),
            protocol: Some(protocol),
            app_protocol: sp.app_protocol.clone(),
        });
    }
    let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
    let endpoints: Vec<Endpoint> = members
        .iter()
        .filter(|p| !excluded.contains(&p.name_any()))
        .map(|p| {
            let serving = pod_ready(p);
            let terminating = p.metadata.deletion_timestamp.is_some();
            Endpoint {
                addresses: vec![
                    p.status
                        .as_ref()
                        .and_then(|s| s.pod_ip.clone())
                        .unwrap_or_default(),
                ],
                conditions: Some(EndpointConditions {
                    ready: Some(publish_not_ready || (serving && !terminating)),
                    serving: Some(serving),
                    terminating: Some(terminating),
                }),
                node_name: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    name: Some(p.name_any()),
                    namespace: p.namespace(),
                    uid: p.uid(),
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect();
    let name = svc.name_any();
    let slice = EndpointSlice {
        metadata: kube::api::ObjectMeta {
            name: Some(slice_name(&name)),
            namespace: Some(ns),
            labels: Some(BTreeMap::from([
                (SERVICE_NAME_LABEL.to_owned(), name.clone()),
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
            ])),
            owner_references: svc.uid().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Service".into(),
                    name: name.clone(),
                    uid,
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(endpoints),
        ports: Some(ports),
    };
    Some(Desired { slice, notes })
}

/// Should this slice go? Only one of ours: when its Service is gone, or when the Service has
/// a selector and this is not the slice [`desired_slice`] names. Ours of a Service without a
/// selector are left alone, as upstream leaves them.
pub fn stale(slice: &EndpointSlice, services: &[&Service]) -> bool {
    if !is_ours(slice) {
        return false;
    }
    let ns = slice.namespace();
    let Some(svc_name) = slice.labels().get(SERVICE_NAME_LABEL) else {
        return true;
    };
    match services
        .iter()
        .find(|s| s.namespace() == ns && &s.name_any() == svc_name)
    {
        None => true,
        Some(svc) => selector(svc).is_some() && slice.name_any() != slice_name(svc_name),
    }
}

/// Does `existing` already say what `desired` says (so no write is needed)?
pub fn up_to_date(existing: &EndpointSlice, desired: &EndpointSlice) -> bool {
    let labels = existing.labels();
    existing.address_type == desired.address_type
        && existing.endpoints.clone().unwrap_or_default()
            == desired.endpoints.clone().unwrap_or_default()
        && existing.ports.clone().unwrap_or_default() == desired.ports.clone().unwrap_or_default()
        && desired
            .labels()
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        && existing.metadata.owner_references == desired.metadata.owner_references
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn svc(ports: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "namespace": "app", "uid": "svc-uid" },
            "spec": { "selector": { "app": "web" }, "clusterIP": "10.96.0.10", "ports": ports },
        }))
        .unwrap()
    }

    fn pod(name: &str, ns: &str, app: &str, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": ns, "uid": format!("{name}-uid"),
                          "labels": { "app": app } },
            "spec": { "nodeName": "node1", "containers": [{ "name": "c",
                      "ports": [{ "name": "http", "containerPort": 8080 }] }] },
            "status": { "phase": "Running", "podIP": ip,
                        "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
        }))
        .unwrap()
    }

    fn addrs(d: &Desired) -> Vec<String> {
        d.slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.addresses[0].clone())
            .collect()
    }

    #[test]
    fn selected_pods_with_addresses_become_endpoints() {
        let s = svc(json!([{ "name": "http", "port": 80, "targetPort": 8080 }]));
        let a = pod("a", "app", "web", "10.244.1.5", true);
        let b = pod("b", "app", "web", "10.244.2.5", false);
        let other_app = pod("c", "app", "db", "10.244.1.6", true);
        let other_ns = pod("d", "elsewhere", "web", "10.244.1.7", true);
        let no_ip = pod("e", "app", "web", "", true);
        let mut done = pod("f", "app", "web", "10.244.1.8", true);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let d = desired_slice(&s, &[&b, &a, &other_app, &other_ns, &no_ip, &done]).unwrap();
        assert_eq!(addrs(&d), ["10.244.1.5", "10.244.2.5"]);
        let e = d.slice.endpoints.as_ref().unwrap();
        assert_eq!(e[0].conditions.as_ref().unwrap().ready, Some(true));
        assert_eq!(e[1].conditions.as_ref().unwrap().ready, Some(false));
        assert_eq!(e[1].conditions.as_ref().unwrap().serving, Some(false));
        assert_eq!(e[0].node_name.as_deref(), Some("node1"));
        let r = e[0].target_ref.as_ref().unwrap();
        assert_eq!(
            (r.kind.as_deref(), r.name.as_deref(), r.uid.as_deref()),
            (Some("Pod"), Some("a"), Some("a-uid"))
        );
        assert_eq!(d.slice.metadata.name.as_deref(), Some("web-fabt"));
        assert_eq!(d.slice.metadata.namespace.as_deref(), Some("app"));
        assert_eq!(d.slice.labels()[SERVICE_NAME_LABEL], "web");
        assert_eq!(d.slice.labels()[MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(d.slice.address_type, "IPv4");
        let p = &d.slice.ports.as_ref().unwrap()[0];
        assert_eq!(
            (p.name.as_deref(), p.port, p.protocol.as_deref()),
            (Some("http"), Some(8080), Some("TCP"))
        );
        assert!(d.notes.is_empty(), "{:?}", d.notes);
    }

    #[test]
    fn terminating_pods_serve_but_are_not_ready() {
        let s = svc(json!([{ "port": 80 }]));
        let mut a = pod("a", "app", "web", "10.244.1.5", true);
        a.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let d = desired_slice(&s, &[&a]).unwrap();
        let c = d.slice.endpoints.as_ref().unwrap()[0]
            .conditions
            .clone()
            .unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true))
        );
        // No target port: the port itself.
        assert_eq!(d.slice.ports.unwrap()[0].port, Some(80));
        let mut publish = s.clone();
        publish.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let d = desired_slice(&publish, &[&a]).unwrap();
        assert_eq!(
            d.slice.endpoints.unwrap()[0]
                .conditions
                .as_ref()
                .unwrap()
                .ready,
            Some(true)
        );
    }

    #[test]
    fn named_target_ports_resolve_from_the_pods_and_mismatches_are_left_out() {
        let s = svc(json!([
            { "name": "web", "port": 80, "targetPort": "http" },
            { "name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353 },
        ]));
        let a = pod("a", "app", "web", "10.244.1.5", true);
        let mut b = pod("b", "app", "web", "10.244.1.6", true);
        b.spec.as_mut().unwrap().containers[0]
            .ports
            .as_mut()
            .unwrap()[0]
            .container_port = 9090;
        let mut c = pod("c", "app", "web", "10.244.1.7", true);
        c.spec.as_mut().unwrap().containers[0].ports = None;
        let d = desired_slice(&s, &[&c, &b, &a]).unwrap();
        assert_eq!(addrs(&d), ["10.244.1.5"]);
        let ports = d.slice.ports.unwrap();
        assert_eq!(
            ports
                .iter()
                .map(|p| (p.port, p.protocol.clone().unwrap()))
                .collect::<Vec<_>>(),
            [
                (Some(8080), "TCP".to_owned()),
                (Some(5353), "UDP".to_owned())
            ]
        );
        assert_eq!(d.notes.len(), 2, "{:?}", d.notes);
        assert!(d.notes[0].contains("pod b") && d.notes[0].contains("is 9090"));
        assert!(d.notes[1].contains("pod c") && d.notes[1].contains("not found"));
        // No pod to resolve it: the port is left out, said.
        let d = desired_slice(&s, &[]).unwrap();
        assert_eq!(d.slice.ports.unwrap().len(), 1);
        assert!(d.notes[0].contains("web"), "{:?}", d.notes);
        assert_eq!(d.slice.endpoints, Some(vec![]));
    }

    #[test]
    fn services_without_selector_are_not_ours_nor_are_others_slices() {
        let mut s = svc(json!([{ "port": 80 }]));
        s.spec.as_mut().unwrap().selector = None;
        assert!(desired_slice(&s, &[]).is_none());
        s.spec.as_mut().unwrap().selector = Some(BTreeMap::new());
        assert!(desired_slice(&s, &[]).is_none());
        let d = desired_slice(&svc(json!([{ "port": 80 }])), &[]).unwrap();
        assert!(is_ours(&d.slice));
        let mut theirs = d.slice.clone();
        theirs
            .labels_mut()
            .insert(MANAGED_BY_LABEL.into(), "reflection.fabric.io".into());
        assert!(!is_ours(&theirs));
    }

    #[test]
    fn only_our_slices_of_services_that_went_or_by_another_name_are_stale() {
        let web = svc(json!([{ "port": 80 }]));
        let ours = desired_slice(&web, &[]).unwrap().slice;
        assert!(!stale(&ours, &[&web]));
        assert!(stale(&ours, &[]), "its Service is gone");
        let mut renamed = ours.clone();
        renamed.metadata.name = Some("web-old".into());
        assert!(stale(&renamed, &[&web]));
        // Without a selector: left alone.
        let mut bare = web.clone();
        bare.spec.as_mut().unwrap().selector = None;
        assert!(!stale(&renamed, &[&bare]));
        // Someone else's, even of a Service that went: never ours to delete.
        let mut theirs = ours.clone();
        theirs
            .labels_mut()
            .insert(MANAGED_BY_LABEL.into(), "reflection.fabric.io".into());
        assert!(!stale(&theirs, &[]));
        // Same name in another namespace is another Service.
        let mut elsewhere = web.clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert!(stale(&ours, &[&elsewhere]));
    }

    #[test]
    fn an_applied_slice_is_up_to_date_until_an_endpoint_changes() {
        let s = svc(json!([{ "port": 80 }]));
        let a = pod("a", "app", "web", "10.244.1.5", true);
        let d = desired_slice(&s, &[&a]).unwrap().slice;
        // What the server returns: the same, with server fields and more labels.
        let mut existing = d.clone();
        existing.metadata.resource_version = Some("7".into());
        existing.labels_mut().insert("other".into(), "x".into());
        assert!(up_to_date(&existing, &d));
        let gone = desired_slice(&s, &[]).unwrap().slice;
        assert!(!up_to_date(&existing, &gone));
        let mut unready = a.clone();
        unready.status.as_mut().unwrap().conditions = None;
        let d2 = desired_slice(&s, &[&unready]).unwrap().slice;
        assert!(!up_to_date(&existing, &d2));
    }
}
