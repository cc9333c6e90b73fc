//! Network and resource negotiation between a consumer and a provider, each its own API
//! server with RBAC and client certificates enforced (`KUBELITE_AUTH=1`): the consumer acts on
//! the provider only through its identity (a client certificate the provider's CA signed),
//! both sides run the sharing controllers (in-process, as `fabric-controller sharing` runs
//! them). No gateways run: the network objects are checked, not the tunnel (the end-to-end
//! test in sharing_e2e.rs does that).
use std::{collections::BTreeMap, time::Duration};

use fabric_api::{
    authentication::v1alpha1::{
        ResourceSlice, ResourceSliceSpec, ResourceSliceStatus, Tenant, TenantState,
    },
    core::v1alpha1::{ForeignCluster, condition},
    names,
    networking::v1alpha1::{
        Configuration, GatewayClient, GatewayServer, PeeringNetwork, PublicKey,
    },
    offloading::v1alpha1::VirtualNode,
};
use fabric_negotiation::{Settings, run};
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    rights,
    sharing::{admit_tenant, consumer_credentials, install_identity, keep_identity},
    wait::eventually,
};
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

const NS: &str = names::DEFAULT_NAMESPACE;
const CONSUMER: &str = "cons";
const PROVIDER: &str = "prov";
const KEY_C: &str = "CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCA=";
const KEY_P: &str = "PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPA=";

fn settings() -> Settings {
    Settings {
        labels: BTreeMap::from([("example.io/zone".to_owned(), "z1".to_owned())]),
        ..fabric_tests::sharing::negotiation_settings(NS, "test")
    }
}

struct Pair {
    // Kept alive for the test's duration.
    _servers: (ApiServer, ApiServer),
    c: Client,
    p: Client,
    /// The consumer's own client on the provider (its identity).
    as_consumer: Client,
    controllers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for c in &self.controllers {
            c.abort();
        }
    }
}

async fn pair(tag: &str) -> Pair {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("fabric_negotiation=debug,fabric_auth=debug,kube_runtime=warn")
        .with_test_writer()
        .try_init();
    let cs = ApiServer::start_with_auth(&format!("{tag}-c"));
    let ps = ApiServer::start_with_auth(&format!("{tag}-p"));
    cs.install_crds();
    ps.install_crds();
    let (c, p) = (cs.client().await, ps.client().await);
    install_identity(
        &c,
        NS,
        CONSUMER,
        "10.244.0.0/16",
        Some((KEY_C, "192.0.2.1:51820")),
    )
    .await
    .unwrap();
    install_identity(
        &p,
        NS,
        PROVIDER,
        "10.244.0.0/16",
        Some((KEY_P, "198.51.100.2:51821")),
    )
    .await
    .unwrap();
    admit_tenant(&p, CONSUMER).await.unwrap();
    let creds = consumer_credentials(&ps, CONSUMER).unwrap();
    keep_identity(&c, NS, PROVIDER, &creds).await.unwrap();
    let as_consumer = fabric_auth::identity::remote_client(&c, PROVIDER)
        .await
        .unwrap();
    // Each cluster's controllers as `fabric-controller sharing` runs them: a token of its
    // ServiceAccount, with the rights deploy/ gives it.
    let mut own = Vec::new();
    for api in [&cs, &ps] {
        let path = api.kubeconfig.with_file_name("sharing.kubeconfig");
        own.push(
            rights::component_client(api, "fabric-sharing", path)
                .await
                .unwrap(),
        );
    }
    let controllers = own
        .into_iter()
        .map(|client| {
            tokio::spawn(async move {
                if let Err(e) = run(client, settings()).await {
                    panic!("sharing controllers: {e}");
                }
            })
        })
        .collect();
    Pair {
        _servers: (cs, ps),
        c,
        p,
        as_consumer,
        controllers,
    }
}

fn condition_of(fc: &ForeignCluster, type_: &str) -> Option<(String, String)> {
    fc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn fc_condition(client: &Client, name: &str, type_: &str) -> Option<(String, String)> {
    let fc = Api::<ForeignCluster>::all(client.clone())
        .get_opt(name)
        .await
        .ok()??;
    condition_of(&fc, type_)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_network_is_negotiated_over_the_identity_and_removed_on_unpeer() {
    if !require_tools("the_network_is_negotiated_over_the_identity_and_removed_on_unpeer") {
        return;
    }
    let pair = pair("neg-net").await;
    let tenant_ns = names::namespace::tenant(CONSUMER);

    // The consumer's PeeringNetwork, answered by the provider.
    let pns: Api<PeeringNetwork> = Api::namespaced(pair.p.clone(), &tenant_ns);
    let pn = eventually("the provider's answer", Duration::from_secs(30), || async {
        pns.get_opt(CONSUMER)
            .await
            .ok()?
            .filter(|pn| pn.status.as_ref().is_some_and(|s| s.provider.is_some()))
    })
    .await;
    assert_eq!(pn.spec.consumer.public_key, KEY_C);
    let answer = pn.status.unwrap().provider.unwrap();
    assert_eq!(
        (answer.cluster_id.as_str(), answer.public_key.as_str()),
        (PROVIDER, KEY_P)
    );

    // Each side's network objects, as fabricctl peer makes them: the provider listens, the
    // consumer dials the provider's gateway.
    let server = eventually(
        "the provider's GatewayServer",
        Duration::from_secs(30),
        || async {
            Api::<GatewayServer>::namespaced(pair.p.clone(), NS)
                .get_opt(CONSUMER)
                .await
                .ok()?
        },
    )
    .await;
    assert_eq!(server.spec.port, 51821);
    let key = Api::<PublicKey>::namespaced(pair.p.clone(), NS)
        .get(CONSUMER)
        .await
        .unwrap();
    assert_eq!(key.spec.public_key, KEY_C);
    let client = eventually(
        "the consumer's GatewayClient",
        Duration::from_secs(30),
        || async {
            Api::<GatewayClient>::namespaced(pair.c.clone(), NS)
                .get_opt(PROVIDER)
                .await
                .ok()?
        },
    )
    .await;
    assert_eq!(client.spec.endpoint.addresses, ["198.51.100.2"]);
    assert_eq!(client.spec.endpoint.port, 51821);
    let cfg = Api::<Configuration>::namespaced(pair.c.clone(), NS)
        .get(PROVIDER)
        .await
        .unwrap();
    assert_eq!(cfg.spec.remote.pod.to_string(), "10.244.0.0/16");

    // A gateway key rotated on either side (the gateway operator publishes the new one) is
    // negotiated again without anyone touching the peer's PublicKey: the provider re-answers
    // when its own key changes (nothing else would make it answer again), the consumer
    // re-applies its PeeringNetwork when its own does.
    const KEY_C2: &str = "DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDA=";
    const KEY_P2: &str = "QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQA=";
    let key_of = |client: &Client, name: &'static str| {
        let keys = Api::<PublicKey>::namespaced(client.clone(), NS);
        async move { Some(keys.get_opt(name).await.ok()??.spec.public_key) }
    };
    install_identity(
        &pair.p,
        NS,
        PROVIDER,
        "10.244.0.0/16",
        Some((KEY_P2, "198.51.100.2:51821")),
    )
    .await
    .unwrap();
    eventually(
        "the provider's rotated key on the consumer",
        Duration::from_secs(30),
        || async { (key_of(&pair.c, PROVIDER).await? == KEY_P2).then_some(()) },
    )
    .await;
    install_identity(
        &pair.c,
        NS,
        CONSUMER,
        "10.244.0.0/16",
        Some((KEY_C2, "192.0.2.1:51820")),
    )
    .await
    .unwrap();
    eventually(
        "the consumer's rotated key on the provider",
        Duration::from_secs(30),
        || async { (key_of(&pair.p, CONSUMER).await? == KEY_C2).then_some(()) },
    )
    .await;

    // No gateway runs: both ForeignClusters say the tunnel is not up, and why.
    for (client, name) in [(&pair.c, PROVIDER), (&pair.p, CONSUMER)] {
        let c = eventually("NetworkReady", Duration::from_secs(30), || async {
            fc_condition(client, name, condition::NETWORK).await
        })
        .await;
        assert_eq!(c, ("False".to_owned(), "NoTunnel".to_owned()), "{name}");
    }

    // A consumer cannot speak for another: a PeeringNetwork in its namespace naming someone
    // else is refused and gets nothing.
    let liar = json!({
        "apiVersion": "networking.fabric.io/v1alpha1",
        "kind": "PeeringNetwork",
        "metadata": { "name": "victim", "namespace": tenant_ns },
        "spec": { "consumer": {
            "clusterId": "victim",
            "cidrs": { "pod": "10.9.0.0/16", "external": "10.8.0.0/16" },
            "publicKey": KEY_C,
        } },
    });
    let mine: Api<PeeringNetwork> = Api::namespaced(pair.as_consumer.clone(), &tenant_ns);
    mine.create(
        &PostParams::default(),
        &serde_json::from_value(liar).unwrap(),
    )
    .await
    .unwrap();
    let refused = eventually("the refusal", Duration::from_secs(30), || async {
        let pn = pns.get_opt("victim").await.ok()??;
        let st = pn.status?;
        st.conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "False")
            .map(|c| (c.reason.clone(), c.message.clone(), st.provider.is_none()))
    })
    .await;
    assert_eq!(refused.0, "Refused");
    assert!(refused.1.contains("only speak for itself"), "{}", refused.1);
    assert!(refused.2, "no answer for a liar");
    assert!(
        Api::<GatewayServer>::namespaced(pair.p.clone(), NS)
            .get_opt("victim")
            .await
            .unwrap()
            .is_none()
    );
    // The consumer cannot write the answer itself.
    let forged = mine
        .patch_status(
            CONSUMER,
            &PatchParams::apply("forger").force(),
            &Patch::Apply(json!({
                "apiVersion": "networking.fabric.io/v1alpha1",
                "kind": "PeeringNetwork",
                "status": { "conditions": [] },
            })),
        )
        .await;
    assert!(
        matches!(forged, Err(kube::Error::Api(ref e)) if e.code == 403),
        "{forged:?}"
    );

    // Unpeer: deleting the provider's ForeignCluster on the consumer removes both sides'
    // network objects.
    Api::<ForeignCluster>::all(pair.c.clone())
        .delete(PROVIDER, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "both sides' network objects gone",
        Duration::from_secs(30),
        || async {
            let c_gone = Api::<GatewayClient>::namespaced(pair.c.clone(), NS)
                .get_opt(PROVIDER)
                .await
                .ok()?
                .is_none()
                && Api::<Configuration>::namespaced(pair.c.clone(), NS)
                    .get_opt(PROVIDER)
                    .await
                    .ok()?
                    .is_none();
            let p_gone = Api::<GatewayServer>::namespaced(pair.p.clone(), NS)
                .get_opt(CONSUMER)
                .await
                .ok()?
                .is_none()
                && pns.get_opt(CONSUMER).await.ok()?.is_none()
                && Api::<PublicKey>::namespaced(pair.p.clone(), NS)
                    .get_opt(CONSUMER)
                    .await
                    .ok()?
                    .is_none();
            (c_gone && p_gone).then_some(())
        },
    )
    .await;
    // The network finalizer is only the first of the ForeignCluster's: the unpeer one goes
    // after it, once the provider has been told, so the object goes a moment later.
    eventually(
        "the finalizers let the ForeignCluster go",
        Duration::from_secs(30),
        || async {
            Api::<ForeignCluster>::all(pair.c.clone())
                .get_opt(PROVIDER)
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
}

async fn add_node(client: &Client, name: &str, alloc: serde_json::Value) {
    fabric_tests::sharing::add_node(client, name, alloc)
        .await
        .unwrap();
}

async fn add_pod(client: &Client, name: &str, node: &str, cpu: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = json!({
        "metadata": { "name": name },
        "spec": { "nodeName": node, "containers": [{
            "name": "c", "image": "x", "resources": { "requests": { "cpu": cpu } } }] },
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
}

fn slice(name: &str, consumer: &str, cpu: &str) -> ResourceSlice {
    let mut s = ResourceSlice::new(
        name,
        ResourceSliceSpec {
            consumer_cluster_id: consumer.into(),
            provider_cluster_id: PROVIDER.into(),
            resources: BTreeMap::from([
                ("cpu".to_owned(), Quantity(cpu.into())),
                ("memory".to_owned(), Quantity("1Gi".into())),
            ]),
            at_most_once: None,
        },
    );
    s.metadata.namespace = Some(NS.into());
    s
}

fn granted_cpu(st: &ResourceSliceStatus) -> Option<String> {
    st.granted.get("cpu").map(|q| q.0.clone())
}

fn accepted(st: &ResourceSliceStatus) -> Option<String> {
    st.conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .map(|c| c.reason.clone())
}

async fn set_tenant(p: &Client, patch: serde_json::Value) {
    Api::<Tenant>::namespaced(p.clone(), &names::namespace::tenant(CONSUMER))
        .patch(CONSUMER, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_are_negotiated_by_the_provider_policy() {
    if !require_tools("resources_are_negotiated_by_the_provider_policy") {
        return;
    }
    let pair = pair("neg-res").await;
    add_node(
        &pair.p,
        "n1",
        json!({ "cpu": "8", "memory": "16Gi", "pods": "110" }),
    )
    .await;
    // A virtual node on the provider lends nothing of it.
    let vk = json!({ "metadata": { "name": "vk", "labels": {
        names::label::NODE_TYPE: names::label::VIRTUAL_NODE_TYPE } } });
    Api::<Node>::all(pair.p.clone())
        .create(&PostParams::default(), &serde_json::from_value(vk).unwrap())
        .await
        .unwrap();
    Api::<Node>::all(pair.p.clone())
        .patch_status(
            "vk",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "allocatable": { "cpu": "100" } } })),
        )
        .await
        .unwrap();

    let local: Api<ResourceSlice> = Api::namespaced(pair.c.clone(), NS);
    local
        .create(&PostParams::default(), &slice("s1", CONSUMER, "20"))
        .await
        .unwrap();
    let answered = |cpu: &'static str| {
        let local = local.clone();
        async move {
            eventually(
                &format!("a grant of {cpu} cpu"),
                Duration::from_secs(30),
                || async {
                    let st = local.get("s1").await.ok()?.status?;
                    (granted_cpu(&st).as_deref() == Some(cpu)).then_some(st)
                },
            )
            .await
        }
    };
    // 90% of the 8 real cpus; the request caps nothing here.
    let st = answered("7200m").await;
    assert_eq!(accepted(&st).as_deref(), Some("PartiallyGranted"));
    assert_eq!(
        st.node_labels.get("example.io/zone").map(String::as_str),
        Some("z1")
    );
    let replica =
        Api::<ResourceSlice>::namespaced(pair.p.clone(), &names::namespace::tenant(CONSUMER))
            .get("s1")
            .await
            .unwrap();
    assert_eq!(replica.spec, slice("s1", CONSUMER, "20").spec);

    // The virtual node stands for the grant.
    let vns: Api<VirtualNode> = Api::namespaced(pair.c.clone(), NS);
    let vn = eventually("the VirtualNode", Duration::from_secs(30), || async {
        vns.get_opt(PROVIDER).await.ok()?
    })
    .await;
    assert_eq!(vn.spec.identity, PROVIDER);
    assert_eq!(
        vn.spec.labels.get("example.io/zone").map(String::as_str),
        Some("z1")
    );
    for (client, name) in [(&pair.c, PROVIDER), (&pair.p, CONSUMER)] {
        let c = eventually(
            &format!("ResourcesGranted on {name}"),
            Duration::from_secs(30),
            || async {
                fc_condition(client, name, condition::RESOURCES)
                    .await
                    .filter(|c| c.0 == "True")
            },
        )
        .await;
        assert_eq!(c.1, "PartiallyGranted", "{name}");
    }

    // The offer follows capacity: a pod takes 6 cpus, a node brings 4 more.
    add_pod(&pair.p, "busy", "n1", "6").await;
    answered("1800m").await;
    eventually(
        "the VirtualNode to shrink",
        Duration::from_secs(30),
        || async {
            let vn = vns.get_opt(PROVIDER).await.ok()??;
            (vn.spec.resources.get("cpu")?.0 == "1800m").then_some(())
        },
    )
    .await;
    add_node(
        &pair.p,
        "n2",
        json!({ "cpu": "4", "memory": "16Gi", "pods": "110" }),
    )
    .await;
    answered("5400m").await;

    // A second consumer never gets what the first holds: together they stay within 90% of
    // what is free (6 cpus free -> 5.4).
    admit_tenant(&pair.p, "other").await.unwrap();
    let theirs: Api<ResourceSlice> =
        Api::namespaced(pair.p.clone(), &names::namespace::tenant("other"));
    let mut other = slice("s2", "other", "2");
    other.metadata.namespace = None;
    theirs.create(&PostParams::default(), &other).await.unwrap();
    let st2 = eventually(
        "the second consumer's answer",
        Duration::from_secs(30),
        || async {
            theirs
                .get("s2")
                .await
                .ok()?
                .status
                .filter(|s| accepted(s).is_some())
        },
    )
    .await;
    // Memory is there, cpu is not.
    assert_eq!(
        accepted(&st2).as_deref(),
        Some("PartiallyGranted"),
        "{st2:?}"
    );
    assert_eq!(granted_cpu(&st2), None);
    assert!(
        st2.conditions[0].message.contains("cpu: 0 of 2 (capacity"),
        "{:?}",
        st2.conditions
    );
    // The first consumer asks for less: the second gets what it frees.
    local
        .patch(
            "s1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "resources": { "cpu": "3" } } })),
        )
        .await
        .unwrap();
    answered("3").await;
    let st2 = eventually(
        "the second consumer's grant",
        Duration::from_secs(30),
        || async {
            let st = theirs.get("s2").await.ok()?.status?;
            (granted_cpu(&st).as_deref() == Some("2")).then_some(st)
        },
    )
    .await;
    assert_eq!(accepted(&st2).as_deref(), Some("Granted"));

    // Caps, cordon, drain.
    set_tenant(&pair.p, json!({ "spec": { "caps": { "cpu": "1" } } })).await;
    answered("1").await;
    set_tenant(
        &pair.p,
        json!({ "spec": { "caps": null, "state": TenantState::Cordoned } }),
    )
    .await;
    // Cordoned: keeps its 1 cpu even though more is free now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = local.get("s1").await.unwrap().status.unwrap();
    assert_eq!(granted_cpu(&st).as_deref(), Some("1"), "{st:?}");
    set_tenant(
        &pair.p,
        json!({ "spec": { "state": TenantState::Drained } }),
    )
    .await;
    let st = eventually("a drained answer", Duration::from_secs(30), || async {
        let st = local.get("s1").await.ok()?.status?;
        (accepted(&st).as_deref() == Some("Refused")).then_some(st)
    })
    .await;
    assert!(st.granted.is_empty(), "{st:?}");
    eventually("the VirtualNode gone", Duration::from_secs(30), || async {
        vns.get_opt(PROVIDER).await.ok()?.is_none().then_some(())
    })
    .await;
    let c = eventually(
        "ResourcesGranted False",
        Duration::from_secs(30),
        || async {
            fc_condition(&pair.c, PROVIDER, condition::RESOURCES)
                .await
                .filter(|c| c.0 == "False")
        },
    )
    .await;
    assert_eq!(c.1, "Refused");

    // Deleting the slice deletes its replica.
    local.delete("s1", &DeleteParams::default()).await.unwrap();
    eventually("the replica gone", Duration::from_secs(30), || async {
        Api::<ResourceSlice>::namespaced(pair.p.clone(), &names::namespace::tenant(CONSUMER))
            .get_opt("s1")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}
