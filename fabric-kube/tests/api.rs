//! The kit against a real API server: Lease election between two candidates (annotations
//! follow the holder, release hands over at once), and Events on an object.
use std::time::{Duration, Instant};

use fabric_kube::{
    Election,
    election::Observed,
    events::{Event, Events},
    lease,
};
use fabric_tests::apiserver::{ApiServer, require_tools};
use k8s_openapi::api::{
    coordination::v1::Lease, core::v1::ConfigMap, events::v1::Event as K8sEvent,
};
use kube::{
    Api,
    api::{ListParams, ObjectMeta, PostParams},
};

const IP: &str = "example.io/ip";

fn candidate(identity: &str, ip: &str) -> Election {
    let mut e = Election::new("kit-test", identity);
    e.annotations.insert(IP.into(), Some(ip.into()));
    e
}

async fn holder(api: &Api<Lease>) -> (Option<String>, Option<String>) {
    let l = api.get("kit-test").await.unwrap();
    (
        l.spec.and_then(|s| s.holder_identity),
        l.metadata.annotations.and_then(|a| a.get(IP).cloned()),
    )
}

#[tokio::test]
async fn one_holder_then_a_handover_on_release() {
    if !require_tools("one_holder_then_a_handover_on_release") {
        return;
    }
    let server = ApiServer::start("kit-election");
    let api: Api<Lease> = Api::namespaced(server.client().await, "default");
    let (a, b) = (candidate("a", "10.0.0.1"), candidate("b", "10.0.0.2"));
    let (mut seen_a, mut seen_b) = (Observed::default(), Observed::default());
    assert!(lease::contend(&api, &a, &mut seen_a).await.unwrap());
    assert!(!lease::contend(&api, &b, &mut seen_b).await.unwrap());
    assert!(
        lease::contend(&api, &a, &mut seen_a).await.unwrap(),
        "renewal"
    );
    assert_eq!(
        holder(&api).await,
        (Some("a".into()), Some("10.0.0.1".into()))
    );
    // Releasing by a non-holder changes nothing.
    lease::release(&api, &b).await.unwrap();
    assert_eq!(holder(&api).await.0.as_deref(), Some("a"));
    lease::release(&api, &a).await.unwrap();
    assert_eq!(holder(&api).await, (None, None));
    // Released: the standby takes it at once, without waiting out the duration.
    assert!(lease::contend(&api, &b, &mut seen_b).await.unwrap());
    assert_eq!(
        holder(&api).await,
        (Some("b".into()), Some("10.0.0.2".into()))
    );
    assert!(!lease::contend(&api, &a, &mut seen_a).await.unwrap());
}

#[tokio::test]
async fn a_silent_holder_is_replaced_after_the_lease_duration() {
    if !require_tools("a_silent_holder_is_replaced_after_the_lease_duration") {
        return;
    }
    let server = ApiServer::start("kit-takeover");
    let api: Api<Lease> = Api::namespaced(server.client().await, "default");
    let mut a = candidate("a", "10.0.0.1");
    a.duration = Duration::from_secs(1);
    let mut b = candidate("b", "10.0.0.2");
    b.retry = Duration::from_millis(100);
    let mut seen_a = Observed::default();
    assert!(lease::contend(&api, &a, &mut seen_a).await.unwrap());
    let (tx, mut leading) = tokio::sync::watch::channel(false);
    let elector = tokio::spawn(lease::elect(api.clone(), b, tx));
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l))
        .await
        .expect("b never took over")
        .unwrap();
    // Not before a's second of silence, by b's clock.
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(
        holder(&api).await,
        (Some("b".into()), Some("10.0.0.2".into()))
    );
    elector.abort();
}

#[tokio::test]
async fn events_land_on_the_object() {
    if !require_tools("events_land_on_the_object") {
        return;
    }
    let server = ApiServer::start("kit-events");
    let client = server.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("peer".into()),
                    namespace: Some("default".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let events = Events::new(client.clone(), "fabric-kit-test", Some("r-0".into()));
    events
        .publish(
            &cm,
            &Event::warning("Disconnected", "Report", "no handshake"),
        )
        .await;
    events
        .publish(&cm, &Event::normal("Connected", "Report", "tunnel up"))
        .await;
    let api: Api<K8sEvent> = Api::namespaced(client, "default");
    let got = api.list(&ListParams::default()).await.unwrap().items;
    let mut seen: Vec<(String, String, String)> = got
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("peer"))
        .map(|e| {
            (
                e.reason.clone().unwrap_or_default(),
                e.type_.clone().unwrap_or_default(),
                e.reporting_controller.clone().unwrap_or_default(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "Connected".into(),
                "Normal".into(),
                "fabric-kit-test".into()
            ),
            (
                "Disconnected".into(),
                "Warning".into(),
                "fabric-kit-test".into()
            ),
        ]
    );
}
