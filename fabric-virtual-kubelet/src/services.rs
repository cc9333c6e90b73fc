//! Services of offloaded namespaces, reflected into their twins (issue 20), so that an
//! offloaded pod finds a Service by the same name there. The spec is copied but for what the
//! provider allocates or does not grant a consumer: the cluster IP is the provider's (a
//! headless Service stays headless), and a `NodePort` or `LoadBalancer` Service is a
//! `ClusterIP` one there (the provider's node ports, load balancers and external IPs are not
//! a consumer's to take: its admission policy `fabric-consumer-twin-services` refuses them),
//! which a Warning Event says at home, unless its owner asks for node ports ([`NODE_PORTS`])
//! and the provider's admin grants them to the tenant ([`NODE_PORTS_ROLE`]): a `NodePort`
//! one there, its ports the provider's or the same numbers. The selector is kept: offloaded pods keep their labels,
//! so the provider's own endpoint controller covers those that run there. `default/kubernetes`
//! is never reflected, nor one named [`home_api::SERVICE`] (the twin's Service of that name
//! is the home API server's: [`crate::home_api`]); an object's [`REFLECT`] annotation
//! `never` keeps it home. The status
//! (load balancer addresses) is not reflected back.
use fabric_api::names::home_api;
use fabric_reflector::mirror::Forge;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::ResourceExt;

use crate::configs::{REFLECT, meta_of, reflected};

/// The cluster IP of a headless Service.
const HEADLESS: &str = "None";

/// The types a consumer's Service in a twin may not have.
const EXPOSED: [&str; 2] = ["NodePort", "LoadBalancer"];

/// The annotation by which a `NodePort` or `LoadBalancer` Service's owner asks for node ports
/// on the provider too: [`NodePorts::Provider`]'s value (the provider picks the numbers) or
/// [`NodePorts::Same`]'s (the home numbers, refused there if taken). The copy is then a
/// `NodePort` Service, which the provider admits only where its admin granted the consumer
/// [`NODE_PORTS_ROLE`]; otherwise its refusal is said at home (`ReflectionRefused`) and retried
/// with back-off, so a grant is taken up without a change at home. Absent (or another value):
/// a `ClusterIP` Service there.
pub const NODE_PORTS: &str = "reflection.fabric.io/node-ports";

/// The ClusterRole (deploy/base/sharing.yaml) a provider's admin binds to a consumer's user
/// (`fabric.io:consumer:<cluster id>`), cluster-wide or in one twin, to let its Services there
/// take node ports: policy `fabric-consumer-twin-services` asks the authorizer for verb `use`
/// of `nodeports.offloading.fabric.io`.
pub const NODE_PORTS_ROLE: &str = "fabric-consumer-node-ports";

/// What a Service's owner asked of its node ports on the provider ([`NODE_PORTS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePorts {
    /// None: a `ClusterIP` Service there.
    None,
    /// `provider`: node ports the provider picks.
    Provider,
    /// `same`: the home node ports' numbers.
    Same,
}

impl NodePorts {
    fn of(s: &Service) -> Self {
        match s.annotations().get(NODE_PORTS).map(String::as_str) {
            Some("provider") => Self::Provider,
            Some("same") => Self::Same,
            _ => Self::None,
        }
    }
}

/// The Services of an offloaded namespace.
pub struct Services;

fn is_headless(s: &Service) -> bool {
    s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some(HEADLESS)
}

fn type_of(s: &Service) -> Option<&str> {
    s.spec.as_ref().and_then(|s| s.type_.as_deref())
}

fn exposed(s: &Service) -> bool {
    type_of(s).is_some_and(|t| EXPOSED.contains(&t))
}

/// Whether `home`'s copy is a `NodePort` Service: it is exposed and its owner asked for
/// node ports.
fn node_ports(home: &Service) -> NodePorts {
    if exposed(home) {
        NodePorts::of(home)
    } else {
        NodePorts::None
    }
}

/// The port as the remote cluster gets it: its node port left to it unless the same number
/// is asked for.
fn port(p: &ServicePort, asked: NodePorts) -> ServicePort {
    ServicePort {
        name: p.name.clone(),
        port: p.port,
        target_port: p.target_port.clone(),
        protocol: p.protocol.clone(),
        app_protocol: p.app_protocol.clone(),
        node_port: p.node_port.filter(|_| asked == NodePorts::Same),
    }
}

impl Forge for Services {
    type Home = Service;
    type Remote = Service;
    const NAME: &'static str = "services";

    fn forge(&self, home: &Service) -> Option<Service> {
        if home.namespace().as_deref() == Some("default") && home.name_any() == "kubernetes" {
            return None;
        }
        if !reflected(&home.metadata, true) {
            return None;
        }
        let s = home.spec.as_ref()?;
        let asked = node_ports(home);
        // What only a Service exposed outside the cluster has (external traffic policy, load
        // balancer fields, node ports) goes with its type; a node port Service keeps its
        // external traffic policy (a load balancer's fields stay home).
        let spec = ServiceSpec {
            type_: match (exposed(home), asked) {
                (true, NodePorts::None) => Some("ClusterIP".to_owned()),
                (true, _) => Some("NodePort".to_owned()),
                (false, _) => s.type_.clone(),
            },
            cluster_ip: is_headless(home).then(|| HEADLESS.to_owned()),
            selector: s.selector.clone(),
            ports: s
                .ports
                .as_ref()
                .map(|ps| ps.iter().map(|p| port(p, asked)).collect()),
            external_traffic_policy: s
                .external_traffic_policy
                .clone()
                .filter(|_| asked != NodePorts::None),
            external_name: s.external_name.clone(),
            internal_traffic_policy: s.internal_traffic_policy.clone(),
            ip_family_policy: s.ip_family_policy.clone(),
            publish_not_ready_addresses: s.publish_not_ready_addresses,
            session_affinity: s.session_affinity.clone(),
            session_affinity_config: s.session_affinity_config.clone(),
            traffic_distribution: s.traffic_distribution.clone(),
            ..Default::default()
        };
        Some(Service {
            metadata: meta_of(&home.metadata),
            spec: Some(spec),
            status: None,
        })
    }

    /// The twins' [`home_api::SERVICE`] is the home API server's, never a home Service's.
    fn home_name(&self, name: &str) -> Option<String> {
        (name != home_api::SERVICE).then(|| name.to_owned())
    }

    fn caveat(&self, home: &Service) -> Option<String> {
        let t = type_of(home).filter(|_| exposed(home))?;
        match node_ports(home) {
            NodePorts::None => Some(format!(
                "type {t} reflected as ClusterIP: a provider gives consumers no node ports or \
                 load balancers unless its admin grants them (to ask for node ports, annotate \
                 it {NODE_PORTS}: provider|same; to keep it home, {REFLECT}: never)"
            )),
            _ if t == "LoadBalancer" => Some(format!(
                "type {t} reflected as NodePort: a provider gives consumers no load balancers"
            )),
            _ => None,
        }
    }

    /// A Service's cluster IP does not change once set: one that becomes headless, or stops
    /// being so, is made again (an ExternalName Service has none to keep).
    fn replaces(&self, have: &Service, want: &Service) -> bool {
        let allocated = have
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .is_some_and(|ip| !ip.is_empty());
        type_of(want) != Some("ExternalName") && allocated && is_headless(have) != is_headless(want)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use fabric_reflector::{
        Marks, Pair, Remote,
        mirror::{Plan, plan_of},
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use serde_json::{Value, json};

    use super::*;

    fn service(name: &str, spec: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                "resourceVersion": "1",
                "labels": {"app": "web"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "team": "shop",
                },
            },
            "spec": spec,
        }))
        .unwrap()
    }

    /// A ClusterIP Service as the home API server keeps it: allocated, defaulted.
    fn web() -> Service {
        service(
            "web",
            json!({
                "type": "ClusterIP", "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "internalTrafficPolicy": "Cluster", "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "selector": {"app": "web"}, "publishNotReadyAddresses": true,
                "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP",
                           "appProtocol": "http"}],
                "externalIPs": ["192.0.2.1"],
            }),
        )
    }

    fn marks() -> Marks {
        Marks::new("home", "provider")
    }

    fn plan_for(home: &Service, remote: Remote<'_, Service>) -> Plan<Service> {
        let pair = Pair::namespaces("shop", "shop-home");
        plan_of(&Services, &pair, home, remote, true, &marks())
    }

    /// What the provider's API server keeps of `p`'s Service: a cluster IP of its own when
    /// not headless, defaults and a node port where the type has them.
    fn served(p: Plan<Service>) -> Service {
        let Plan::Apply(s) = p else {
            panic!("expected an apply, got {p:?}")
        };
        let mut s = *s;
        s.metadata.uid = Some("remote-uid".into());
        s.metadata.namespace = Some("shop-home".into());
        let spec = s.spec.as_mut().unwrap();
        if spec.cluster_ip.is_none() && spec.type_.as_deref() != Some("ExternalName") {
            spec.cluster_ip = Some("10.96.7.7".into());
            spec.cluster_ips = Some(vec!["10.96.7.7".into()]);
        }
        spec.ip_families.get_or_insert_with(|| vec!["IPv4".into()]);
        s
    }

    #[test]
    fn the_spec_is_copied_but_what_the_provider_allocates() {
        let copy = Services.forge(&web()).unwrap();
        let (spec, home) = (copy.spec.unwrap(), web().spec.unwrap());
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.cluster_ip, None, "the provider allocates it");
        assert_eq!(spec.cluster_ips, None);
        assert_eq!(spec.ip_families, None);
        assert_eq!(spec.external_ips, None, "never sent");
        assert_eq!(spec.selector, home.selector);
        assert_eq!(spec.ports, home.ports);
        assert_eq!(
            spec.ports.unwrap()[0].target_port,
            Some(IntOrString::String("http".into()))
        );
        assert_eq!(spec.session_affinity.as_deref(), Some("ClientIP"));
        assert_eq!(spec.session_affinity_config, home.session_affinity_config);
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
        assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert!(copy.status.is_none());
        let meta = copy.metadata;
        assert_eq!(meta.labels, web().metadata.labels);
        assert_eq!(
            meta.annotations,
            Some(BTreeMap::from([("team".to_owned(), "shop".to_owned())]))
        );
        assert!(
            meta.name.is_none() && meta.uid.is_none(),
            "the mirror names it"
        );
        assert_eq!(Services.caveat(&web()), None);
    }

    #[test]
    fn headless_stays_headless_and_external_names_are_kept() {
        let db = service(
            "db",
            json!({"clusterIP": "None", "clusterIPs": ["None"], "selector": {"app": "db"},
                   "ports": [{"port": 5432}]}),
        );
        let spec = Services.forge(&db).unwrap().spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.cluster_ips, None);
        let ext = service(
            "search",
            json!({"type": "ExternalName", "externalName": "search.example.com"}),
        );
        let spec = Services.forge(&ext).unwrap().spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ExternalName"));
        assert_eq!(spec.external_name.as_deref(), Some("search.example.com"));
        assert_eq!(spec.cluster_ip, None);
    }

    #[test]
    fn node_ports_and_load_balancers_are_cluster_ips_there_with_a_warning() {
        for t in ["NodePort", "LoadBalancer"] {
            let mut s = web();
            let spec = s.spec.as_mut().unwrap();
            spec.type_ = Some(t.into());
            spec.ports.as_mut().unwrap()[0].node_port = Some(30080);
            spec.external_traffic_policy = Some("Local".into());
            spec.health_check_node_port = Some(31000);
            spec.allocate_load_balancer_node_ports = Some(true);
            spec.load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()]);
            spec.load_balancer_ip = Some("192.0.2.9".into());
            spec.load_balancer_class = Some("metal".into());
            let copy = Services.forge(&s).unwrap().spec.unwrap();
            assert_eq!(copy.type_.as_deref(), Some("ClusterIP"), "{t}");
            assert_eq!(copy.ports.unwrap()[0].node_port, None, "{t}");
            assert_eq!(copy.external_traffic_policy, None, "{t}");
            assert_eq!(copy.health_check_node_port, None, "{t}");
            assert_eq!(copy.allocate_load_balancer_node_ports, None, "{t}");
            assert_eq!(copy.load_balancer_source_ranges, None, "{t}");
            assert_eq!(copy.load_balancer_ip, None, "{t}");
            assert_eq!(copy.load_balancer_class, None, "{t}");
            let note = Services.caveat(&s).expect("a warning at home");
            assert!(note.contains(t) && note.contains("ClusterIP"), "{note}");
        }
    }

    #[test]
    fn node_ports_asked_for_are_node_ports_there() {
        for t in ["NodePort", "LoadBalancer"] {
            for (asked, port) in [("provider", None), ("same", Some(30080))] {
                let mut s = web();
                s.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(NODE_PORTS.into(), asked.into());
                let spec = s.spec.as_mut().unwrap();
                spec.type_ = Some(t.into());
                spec.ports.as_mut().unwrap()[0].node_port = Some(30080);
                spec.external_traffic_policy = Some("Local".into());
                spec.health_check_node_port = Some(31000);
                spec.load_balancer_ip = Some("192.0.2.9".into());
                let copy = Services.forge(&s).unwrap().spec.unwrap();
                assert_eq!(copy.type_.as_deref(), Some("NodePort"), "{t} {asked}");
                assert_eq!(copy.ports.unwrap()[0].node_port, port, "{t} {asked}");
                assert_eq!(copy.external_traffic_policy.as_deref(), Some("Local"));
                assert_eq!(copy.health_check_node_port, None, "{t} {asked}");
                assert_eq!(copy.load_balancer_ip, None, "{t} {asked}");
                let note = Services.caveat(&s);
                match t {
                    "NodePort" => assert_eq!(note, None, "{asked}"),
                    _ => assert!(note.unwrap().contains("as NodePort"), "{asked}"),
                }
            }
        }
        // Asked of a Service that has none at home: nothing changes.
        let mut s = web();
        s.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(NODE_PORTS.into(), "same".into());
        let copy = Services.forge(&s).unwrap().spec.unwrap();
        assert_eq!(copy.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(copy.external_traffic_policy, None);
        // Another value asks for nothing.
        let mut s = web();
        s.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(NODE_PORTS.into(), "yes".into());
        s.spec.as_mut().unwrap().type_ = Some("NodePort".into());
        let copy = Services.forge(&s).unwrap().spec.unwrap();
        assert_eq!(copy.type_.as_deref(), Some("ClusterIP"));
        assert!(Services.caveat(&s).unwrap().contains(NODE_PORTS));
    }

    #[test]
    fn the_api_servers_own_service_and_those_kept_home_are_not_reflected() {
        let mut k = web();
        k.metadata.name = Some("kubernetes".into());
        assert!(
            Services.forge(&k).is_some(),
            "kubernetes elsewhere is a name"
        );
        k.metadata.namespace = Some("default".into());
        assert!(Services.forge(&k).is_none());
        let mut kept = web();
        kept.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(REFLECT.into(), "never".into());
        assert!(Services.forge(&kept).is_none());
        // The twins' Service of the home API server is not one of a home Service.
        let mut clash = web();
        clash.metadata.name = Some(home_api::SERVICE.into());
        let ours = served(plan_for(&web(), Remote::Absent));
        assert_eq!(plan_for(&clash, Remote::Ours(&ours)), Plan::NotOurs);
        assert_eq!(Services.home_name(home_api::SERVICE), None);
    }

    #[test]
    fn the_providers_cluster_ip_is_kept_not_fought_over() {
        let ours = served(plan_for(&web(), Remote::Absent));
        assert_eq!(
            ours.spec.as_ref().unwrap().cluster_ip.as_deref(),
            Some("10.96.7.7")
        );
        assert_eq!(plan_for(&web(), Remote::Ours(&ours)), Plan::Nothing);
        // A port changed at home: applied, the cluster IP still not sent.
        let mut changed = web();
        changed.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8080;
        let Plan::Apply(again) = plan_for(&changed, Remote::Ours(&ours)) else {
            panic!("the port change not applied")
        };
        let spec = again.spec.unwrap();
        assert_eq!(spec.ports.unwrap()[0].port, 8080);
        assert_eq!(spec.cluster_ip, None);
        // Headless stays headless, and is not applied again either.
        let db = service(
            "db",
            json!({"clusterIP": "None", "ports": [{"port": 5432}]}),
        );
        let remote_db = served(plan_for(&db, Remote::Absent));
        assert_eq!(plan_for(&db, Remote::Ours(&remote_db)), Plan::Nothing);
    }

    #[test]
    fn becoming_headless_or_not_replaces_the_copy() {
        let ours = served(plan_for(&web(), Remote::Absent));
        let mut headless = web();
        headless.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        assert_eq!(plan_for(&headless, Remote::Ours(&ours)), Plan::Replace);
        let remote_headless = served(plan_for(&headless, Remote::Absent));
        assert_eq!(
            plan_for(&web(), Remote::Ours(&remote_headless)),
            Plan::Replace
        );
        // To an ExternalName (no cluster IP there), or from one: changed in place.
        let ext = service(
            "web",
            json!({"type": "ExternalName", "externalName": "web.example.com"}),
        );
        assert!(matches!(
            plan_for(&ext, Remote::Ours(&remote_headless)),
            Plan::Apply(_)
        ));
        let remote_ext = served(plan_for(&ext, Remote::Absent));
        assert!(matches!(
            plan_for(&headless, Remote::Ours(&remote_ext)),
            Plan::Apply(_)
        ));
    }

    #[test]
    fn someone_elses_service_is_left_alone() {
        let mut theirs = served(plan_for(&web(), Remote::Absent));
        theirs.metadata.labels = None;
        assert_eq!(plan_for(&web(), Remote::Foreign(&theirs)), Plan::NotOurs);
    }
}
