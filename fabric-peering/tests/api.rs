//! The peering library against a real API server. Two namespaces stand for the two clusters;
//! a stand-in for each cluster's components (gateway operator, IPAM, gateway) does what they
//! would: publish the gateway identity once the key exists, grant the real CIDRs, report the
//! tunnel connected, drop the Connection when the peer goes.
use std::{collections::BTreeMap, time::Duration};

use fabric_api::{
    identity::{ClusterIdentity, IdentityError},
    names::{config_map, secret},
    networking::v1alpha1::{
        Configuration, Connection, ConnectionSpec, GatewayClient, GatewayServer, PublicKey,
    },
};
use fabric_peering::{Cluster, Error, Event, PeerOptions, Side, Step, Wait, plan::peer_selector};
use fabric_tests::apiserver::{ApiServer, require_tools};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::json;

const A: &str = "peer-a";
const B: &str = "peer-b";

fn identity(id: &str, pod: &str) -> ClusterIdentity {
    ClusterIdentity::from_data(&BTreeMap::from(
        [
            ("FABRIC_CLUSTER_ID", id),
            ("FABRIC_POD_CIDR", pod),
            ("FABRIC_SERVICE_CIDR", "10.96.0.0/12"),
            ("FABRIC_EXTERNAL_CIDR", "10.70.0.0/16"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    ))
    .unwrap()
}

async fn install(client: &Client, ns: &str, data: BTreeMap<String, String>) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_map::CLUSTER.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    cms.create(&PostParams::default(), &cm).await.unwrap();
}

/// One pass of what a cluster's components would do in namespace `ns`.
async fn components(client: &Client, ns: &str, key: &str, endpoint: &str) -> kube::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    if secrets.get_opt(secret::GATEWAY_KEY).await?.is_some()
        && cms.get_opt(config_map::GATEWAY_IDENTITY).await?.is_none()
    {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(config_map::GATEWAY_IDENTITY.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                ("publicKey".into(), key.into()),
                ("endpoint".into(), endpoint.into()),
            ])),
            ..Default::default()
        };
        cms.create(&PostParams::default(), &cm).await?;
    }
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), ns);
    let conns: Api<Connection> = Api::namespaced(client.clone(), ns);
    let cfg_list = cfgs.list(&ListParams::default()).await?.items;
    for cfg in &cfg_list {
        let name = cfg.name_any();
        if cfg
            .status
            .as_ref()
            .and_then(|s| s.remote.as_ref())
            .is_none()
        {
            let st = json!({"status": {"remote": cfg.spec.remote}});
            cfgs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&st))
                .await?;
        }
        if conns.get_opt(&name).await?.is_none() {
            let c = Connection {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                spec: ConnectionSpec {
                    cluster_id: name.clone(),
                },
                status: None,
            };
            conns.create(&PostParams::default(), &c).await?;
            let st = json!({"status": {"value": "Connected", "latency": "0.10ms"}});
            conns
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&st))
                .await?;
        }
    }
    for c in conns.list(&ListParams::default()).await?.items {
        if !cfg_list.iter().any(|cfg| cfg.name_any() == c.name_any()) {
            conns.delete(&c.name_any(), &Default::default()).await?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn peering_against_an_api_server() {
    if !require_tools("peering_against_an_api_server") {
        return;
    }
    let server = ApiServer::start("peering");
    server.install_crds();
    for ns in [A, B, "bare", "broken", "twin"] {
        server.kubectl_ok(&["create", "namespace", ns]);
    }
    let client = server.client().await;
    install(&client, A, identity("cluster-a", "10.244.0.0/16").to_data()).await;
    install(&client, B, identity("cluster-b", "10.245.0.0/16").to_data()).await;

    // What is wrong before anything happens.
    let read = |ns: &'static str| Cluster::read(Side::Remote, client.clone(), ns);
    match read("bare").await {
        Err(e @ Error::NotInstalled { .. }) => {
            assert!(
                e.to_string().contains("is the fabric installed there?"),
                "{e}"
            )
        }
        other => panic!("{:?}", other.map(|c| c.identity)),
    }
    let mut bad = identity("cluster-x", "10.244.0.0/16").to_data();
    bad.insert("FABRIC_POD_CIDR".into(), "10.244.0.0".into());
    bad.insert("FABRIC_SERVICE_CIDR".into(), "ten".into());
    install(&client, "broken", bad).await;
    match read("broken").await {
        Err(Error::BadIdentity {
            side: Side::Remote,
            source: IdentityError::BadCidr { key, .. },
            ..
        }) => assert_eq!(key, "FABRIC_SERVICE_CIDR"),
        other => panic!("{:?}", other.map(|c| c.identity)),
    }
    install(
        &client,
        "twin",
        identity("cluster-a", "10.246.0.0/16").to_data(),
    )
    .await;
    let local = Cluster::read(Side::Local, client.clone(), A).await.unwrap();
    let twin = read("twin").await.unwrap();
    let mut events = Vec::new();
    let r = fabric_peering::peer(&local, &twin, &PeerOptions::default(), &mut |e: &Event| {
        events.push(e.clone())
    })
    .await;
    assert!(matches!(r, Err(Error::SameClusterId { .. })), "{r:?}");
    assert!(events.is_empty(), "nothing started: {events:?}");

    // No gateway operator answers: the wait names the gateway.
    let remote = Cluster::read(Side::Remote, client.clone(), B)
        .await
        .unwrap();
    let quick = PeerOptions {
        timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let r = fabric_peering::peer(&local, &remote, &quick, &mut fabric_peering::Quiet).await;
    match r {
        Err(Error::Timeout(Wait::GatewayIdentity { side, namespace })) => {
            assert_eq!((side, namespace.as_str()), (Side::Local, A))
        }
        other => panic!("{other:?}"),
    }
    // ... but both keys exist now, valid and kept from here on.
    let key = |ns| {
        let secrets = Api::<Secret>::namespaced(client.clone(), ns);
        async move {
            let s = secrets.get(secret::GATEWAY_KEY).await.unwrap();
            let k = &s.data.unwrap()[secret::GATEWAY_KEY_FIELD];
            String::from_utf8(k.0.clone()).unwrap()
        }
    };
    let (ka, kb) = (key(A).await, key(B).await);
    assert!(fabric_api::identity::is_wireguard_key(&ka));
    assert_ne!(ka, kb);

    // The components come up: the peering goes through.
    let (ga, gb) = (
        format!("{}A=", "a".repeat(42)),
        format!("{}A=", "b".repeat(42)),
    );
    let stand_in = {
        let (client, ga, gb) = (client.clone(), ga.clone(), gb.clone());
        tokio::spawn(async move {
            loop {
                for (ns, key, ep) in [(A, &ga, "192.0.2.10:31820"), (B, &gb, "198.51.100.7:32001")]
                {
                    if let Err(e) = components(&client, ns, key, ep).await {
                        eprintln!("stand-in components in {ns}: {e}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut events = Vec::new();
    let peered = fabric_peering::peer(
        &local,
        &remote,
        &PeerOptions::default(),
        &mut |e: &Event| events.push(e.clone()),
    )
    .await
    .unwrap();
    assert_eq!(peered.views.local.pod.to_string(), "10.245.0.0/16");
    assert_eq!(peered.views.remote.pod.to_string(), "10.244.0.0/16");
    assert_eq!(peered.local_latency.as_deref(), Some("0.10ms"));
    let steps: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Started(s) => Some(*s),
            _ => None,
        })
        .collect();
    assert_eq!(
        steps,
        [
            Step::GatewayKeys,
            Step::CreatingObjects,
            Step::WaitingForIpam,
            Step::WaitingForTunnel
        ]
    );
    assert!(
        matches!(events.last(), Some(Event::Connected { .. })),
        "{events:?}"
    );
    assert!(events.iter().any(|e| matches!(e,
        Event::GatewaysKnown { local, remote } if local.public_key == ga && remote.public_key == gb)));

    // What each side holds: the local one dials, the remote one listens on its own port.
    let gwc = Api::<GatewayClient>::namespaced(client.clone(), A)
        .get("cluster-b")
        .await
        .unwrap();
    assert_eq!(gwc.spec.endpoint.addresses, ["198.51.100.7"]);
    assert_eq!(gwc.spec.endpoint.port, 32001);
    let gws = Api::<GatewayServer>::namespaced(client.clone(), B)
        .get("cluster-a")
        .await
        .unwrap();
    assert_eq!(gws.spec.port, 32001);
    let pk = Api::<PublicKey>::namespaced(client.clone(), B)
        .get("cluster-a")
        .await
        .unwrap();
    assert_eq!(pk.spec.public_key, ga);
    assert_eq!(
        Api::<PublicKey>::namespaced(client.clone(), A)
            .list(&ListParams::default().labels(&peer_selector("cluster-b")))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert!(
        Api::<GatewayServer>::namespaced(client.clone(), A)
            .get_opt("cluster-b")
            .await
            .unwrap()
            .is_none()
    );

    // Peering again converges to the same objects.
    let again = fabric_peering::peer(
        &local,
        &remote,
        &PeerOptions::default(),
        &mut fabric_peering::Quiet,
    )
    .await
    .unwrap();
    assert_eq!(again.views, peered.views);

    // Unpeer leaves nothing on either side.
    let mut events = Vec::new();
    fabric_peering::unpeer(
        &local,
        &remote,
        Duration::from_secs(30),
        &mut |e: &Event| events.push(e.clone()),
    )
    .await
    .unwrap();
    assert!(events.contains(&Event::Released(Side::Local)), "{events:?}");
    assert!(
        events.contains(&Event::Released(Side::Remote)),
        "{events:?}"
    );
    for ns in [A, B] {
        assert!(
            Api::<Configuration>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        assert!(
            Api::<GatewayClient>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        assert!(
            Api::<Connection>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }
    stand_in.abort();
}
