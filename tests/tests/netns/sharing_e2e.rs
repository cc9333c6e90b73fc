//! End to end over the two-cluster network fixture, *without* `fabricctl peer`: cluster A
//! (consumer) holds an identity on cluster B (provider), and the sharing controllers alone
//! negotiate the network over it; the tunnel comes up and pods talk. Deleting B's
//! ForeignCluster on A (unpeer) removes both sides' network objects.
//!
//! The sharing controllers run in-process in the host namespace against both API servers'
//! host-side forwarders (see `fabric_tests::sharing`); everything else is the fixture's.
use std::time::Duration;

use fabric_api::{
    core::v1alpha1::{ForeignCluster, condition},
    names,
    networking::v1alpha1::{Configuration, GatewayClient, GatewayServer, PeeringNetwork},
};
use fabric_negotiation::run;
use fabric_tests::{
    apiserver::require_tools,
    clusters::{Cluster, NAMESPACE, PeeredClusters},
    sharing::{admit_tenant, consumer_credentials, keep_identity},
    skip_unless_root, traffic,
    wait::try_eventually,
};
use kube::{Api, Client, api::DeleteParams};

/// How A sees pod `k` of B (IPAM's first block of the pool, host bits kept).
fn remote_pod(k: usize) -> String {
    Cluster::pod_ip(k).replacen("10.244.", "10.64.", 1)
}

fn wait<T, F, Fut>(rt: &tokio::runtime::Runtime, what: &str, cl: &PeeredClusters, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match rt.block_on(try_eventually(what, Duration::from_secs(60), f)) {
        Ok(v) => v,
        Err(e) => panic!("{e}\n{}", cl.log_tails()),
    }
}

#[test]
fn negotiation_alone_brings_the_tunnel_up_and_unpeer_removes_it() {
    if skip_unless_root("negotiation_alone_brings_the_tunnel_up_and_unpeer_removes_it")
        || !require_tools("negotiation_alone_brings_the_tunnel_up_and_unpeer_removes_it")
    {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut cl = PeeredClusters::new(1).unwrap();
    let (a, b): (Client, Client) =
        rt.block_on(async { (cl.a.api.client().await, cl.b.api.client().await) });
    let (consumer, provider) = (cl.a.id.clone(), cl.b.id.clone());
    let creds = consumer_credentials(&cl.b.api, &consumer).unwrap();
    rt.block_on(async {
        admit_tenant(&b, &consumer).await.unwrap();
        keep_identity(&a, NAMESPACE, &provider, &creds)
            .await
            .unwrap();
    });
    let controllers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|c| {
            rt.spawn(async move {
                if let Err(e) = run(
                    c,
                    fabric_tests::sharing::negotiation_settings(NAMESPACE, "e2e"),
                )
                .await
                {
                    panic!("sharing controllers: {e}");
                }
            })
        })
        .collect();
    // The controllers create the gateway keys; the operators then write configurations.
    cl.start_gateways().unwrap();

    let fc_ready = |client: Client, name: String| async move {
        let fc = Api::<ForeignCluster>::all(client)
            .get_opt(&name)
            .await
            .ok()??;
        fc.status?
            .conditions
            .iter()
            .any(|c| c.type_ == condition::NETWORK && c.status == "True")
            .then_some(())
    };
    wait(&rt, "NetworkReady on the consumer", &cl, || {
        fc_ready(a.clone(), provider.clone())
    });
    wait(&rt, "NetworkReady on the provider", &cl, || {
        fc_ready(b.clone(), consumer.clone())
    });
    cl.wait_reachable(&cl.a.pods[0], &remote_pod(0), Duration::from_secs(20))
        .unwrap();
    let probe = traffic::tcp_probe(&cl.a.pods[0], &cl.b.pods[0], &remote_pod(0), 7100)
        .unwrap_or_else(|e| panic!("TCP across: {e:#}\n{}", cl.log_tails()));
    assert_eq!(
        probe.server_saw.ip().to_string(),
        remote_pod(0),
        "B sees A's pod remapped"
    );

    // Unpeer: both sides' network objects go (IPAM releases its grants first).
    rt.block_on(async {
        Api::<ForeignCluster>::all(a.clone())
            .delete(&provider, &DeleteParams::default())
            .await
            .unwrap();
    });
    wait(&rt, "both sides' network objects gone", &cl, || {
        let (a, b) = (a.clone(), b.clone());
        let (consumer, provider) = (consumer.clone(), provider.clone());
        async move {
            let gone_a = Api::<Configuration>::namespaced(a.clone(), NAMESPACE)
                .get_opt(&provider)
                .await
                .ok()?
                .is_none()
                && Api::<GatewayClient>::namespaced(a, NAMESPACE)
                    .get_opt(&provider)
                    .await
                    .ok()?
                    .is_none();
            let gone_b = Api::<Configuration>::namespaced(b.clone(), NAMESPACE)
                .get_opt(&consumer)
                .await
                .ok()?
                .is_none()
                && Api::<GatewayServer>::namespaced(b.clone(), NAMESPACE)
                    .get_opt(&consumer)
                    .await
                    .ok()?
                    .is_none()
                && Api::<PeeringNetwork>::namespaced(b, &names::namespace::tenant(&consumer))
                    .get_opt(&consumer)
                    .await
                    .ok()?
                    .is_none();
            (gone_a && gone_b).then_some(())
        }
    });
    for c in controllers {
        c.abort();
    }
}
