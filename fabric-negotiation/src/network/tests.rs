use fabric_api::{
    authentication::v1alpha1::{TenantSpec, TenantState},
    networking::v1alpha1::{ClusterCidrs, Endpoint},
};
use fabric_peering::plan::GatewayRole;

use fabric_kube::status::Reason;

use super::*;

fn params(id: &str, endpoint: Option<(&str, i32)>) -> PeerNetworkParams {
    PeerNetworkParams {
        cluster_id: id.into(),
        cidrs: ClusterCidrs {
            pod: "10.244.0.0/16".parse().unwrap(),
            external: "10.70.0.0/16".parse().unwrap(),
        },
        public_key: format!("{}=", "K".repeat(43)),
        endpoint: endpoint.map(|(a, p)| Endpoint {
            addresses: vec![a.into()],
            port: p,
        }),
    }
}

fn tenant(id: &str) -> Tenant {
    Tenant::new(
        id,
        TenantSpec {
            cluster_id: id.into(),
            state: TenantState::Active,
            caps: Default::default(),
            pod_security: None,
            mode: Default::default(),
        },
    )
}

#[test]
fn a_consumer_speaks_only_for_itself_in_its_own_namespace() {
    let ns = names::namespace::tenant("alpha");
    let own = peering_network(params("alpha", None), &ns);
    assert_eq!(check(&own, &ns, &[tenant("alpha")]), Ok(()));
    let liar = peering_network(params("beta", None), &ns);
    assert!(matches!(
        check(&liar, &ns, &[tenant("alpha")]),
        Err(Refusal::Impersonation { claimed, tenant, .. }) if claimed == "beta" && tenant == "alpha"
    ));
    // A Tenant that does not own the namespace it sits in does not make it a tenant namespace.
    assert!(matches!(
        check(&own, "default", &[tenant("alpha")]),
        Err(Refusal::NoTenant { .. })
    ));
    assert!(matches!(
        check(&own, &ns, &[]),
        Err(Refusal::NoTenant { .. })
    ));
    let mut renamed = own.clone();
    renamed.metadata.name = Some("second".into());
    assert!(matches!(
        check(&renamed, &ns, &[tenant("alpha")]),
        Err(Refusal::Name { .. })
    ));
}

#[test]
fn the_consumer_dials_the_provider_and_the_provider_listens() {
    let answer = params("prov", Some(("192.168.77.12", 51820)));
    let objs = consumer_objects(&answer, "prov").unwrap();
    let GatewayRole::Client(c) = &objs.gateway else {
        panic!("the consumer dials")
    };
    assert_eq!(c.spec.endpoint.addresses, ["192.168.77.12"]);
    assert_eq!(objs.configuration.metadata.name.as_deref(), Some("prov"));
    let objs = provider_objects(&params("alpha", None), 51820);
    let GatewayRole::Server(s) = &objs.gateway else {
        panic!("the provider listens")
    };
    assert_eq!(s.spec.port, 51820);
    assert_eq!(objs.public_key.spec.cluster_id, "alpha");
}

#[test]
fn an_answer_without_endpoint_or_from_another_cluster_is_unusable() {
    assert_eq!(
        consumer_objects(&params("prov", None), "prov").err(),
        Some(Unusable::NoEndpoint)
    );
    assert_eq!(
        consumer_objects(&params("prov", Some(("not-an-ip", 1))), "prov").err(),
        Some(Unusable::NoEndpoint)
    );
    assert!(matches!(
        consumer_objects(&params("other", Some(("192.0.2.1", 1))), "prov"),
        Err(Unusable::WrongCluster { .. })
    ));
}

#[test]
fn network_readiness_follows_the_connection() {
    assert_eq!(network_ready(None).reason.as_str(), "NoTunnel");
    let mut s = ConnectionStatus {
        value: ConnectionState::Connected,
        latency: Some("1ms".into()),
        ..Default::default()
    };
    let v = network_ready(Some(&s));
    let (ok, reason, msg) = (v.ok, v.reason.as_str(), v.message);
    assert!(ok && reason == "Connected" && msg.contains("1ms"));
    s.value = ConnectionState::Error;
    s.message = Some("handshake timed out".into());
    let v = network_ready(Some(&s));
    assert_eq!(
        (v.ok, v.reason.as_str(), v.message),
        (false, "TunnelError", "handshake timed out".into())
    );
}

#[test]
fn an_unreachable_provider_is_given_up_after_the_grace() {
    assert!(!give_up_remote(Duration::from_secs(5), REMOTE_GRACE));
    assert!(give_up_remote(REMOTE_GRACE, REMOTE_GRACE));
}

#[test]
fn a_pair_of_clusters_has_one_network_whichever_way_they_peered_first() {
    // Nothing yet: negotiate.
    assert_eq!(route(false, false), Route::Negotiate);
    // The provider peered with this cluster first (it dials here): its tunnel serves both.
    assert_eq!(route(true, false), Route::OtherWay);
    // This side dials already: it keeps its own negotiation going.
    assert_eq!(route(false, true), Route::Negotiate);
    assert_eq!(route(true, true), Route::Negotiate);
}
