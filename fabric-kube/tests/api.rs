//! The kit against a real API server: Lease election between two candidates (annotations
//! follow the holder, release hands over at once, a holder cut off from the API steps down
//! before the standby takes over, an unfit holder hands over), Events on an object,
//! "gone is fine" (404s, UID-preconditioned deletes) as the API server answers it, and a
//! controller's burst reconciled a bounded number at once.
use std::time::{Duration, Instant};

use fabric_kube::{
    Election,
    events::{Event, Events},
    lease,
    meta::{self, Deleted, GoneOk},
};
use fabric_tests::apiserver::{ApiServer, require_tools};
use k8s_openapi::api::{
    coordination::v1::Lease, core::v1::ConfigMap, events::v1::Event as K8sEvent,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
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
    let server = ApiServer::start_bare("kit-election");
    let api: Api<Lease> = Api::namespaced(server.client().await, "default");
    let (a, b) = (candidate("a", "10.0.0.1"), candidate("b", "10.0.0.2"));
    let (mut seen_a, mut seen_b) = (lease::Seen::default(), lease::Seen::default());
    assert!(lease::contend(&api, &a, &mut seen_a).await.unwrap());
    assert!(!lease::contend(&api, &b, &mut seen_b).await.unwrap());
    assert!(
        lease::contend(&api, &a, &mut seen_a).await.unwrap(),
        "renewal"
    );
    // A holder renews from its copy of the Lease without reading it; when someone wrote the
    // Lease since (here by hand, for c), that write is refused and a reads and stands by.
    let rewrite = |to: &'static str| {
        let api = api.clone();
        async move {
            let mut l = api.get("kit-test").await.unwrap();
            l.spec.as_mut().unwrap().holder_identity = Some(to.into());
            api.replace("kit-test", &PostParams::default(), &l)
                .await
                .unwrap();
        }
    };
    rewrite("c").await;
    assert!(
        !lease::contend(&api, &a, &mut seen_a).await.unwrap(),
        "renewed over c"
    );
    assert_eq!(holder(&api).await.0.as_deref(), Some("c"));
    rewrite("a").await;
    assert!(
        lease::contend(&api, &a, &mut seen_a).await.unwrap(),
        "renewal after a read"
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
    let server = ApiServer::start_bare("kit-takeover");
    let api: Api<Lease> = Api::namespaced(server.client().await, "default");
    let mut a = candidate("a", "10.0.0.1");
    a.duration = Duration::from_secs(1);
    let mut b = candidate("b", "10.0.0.2");
    b.retry = Duration::from_millis(100);
    let mut seen_a = lease::Seen::default();
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

/// A TCP relay to the API server that can be cut: from then on, what was sent is never
/// answered and new connections hang, as behind a partition.
struct Cuttable {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Cuttable {
    async fn start(upstream: String) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                let (upstream, mut cut) = (upstream.clone(), cut_rx.clone());
                tokio::spawn(async move {
                    let is_cut = *cut.borrow();
                    if is_cut {
                        // Held open, never answered.
                        std::future::pending::<()>().await;
                    }
                    let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let cut_now = async {
                        let _ = cut.wait_for(|c| *c).await;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                        () = cut_now => std::future::pending::<()>().await,
                    }
                });
            }
        });
        Self { addr, cut }
    }
}

/// A client of `server` through `relay`.
async fn client_via(server: &ApiServer, relay: &Cuttable) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(&server.kubeconfig).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.cluster_url = format!("https://127.0.0.1:{}", relay.addr.port())
        .parse()
        .unwrap();
    cfg.read_timeout = Some(Duration::from_secs(30));
    kube::Client::try_from(cfg).unwrap()
}

/// The API server's `host:port`, from its kubeconfig.
async fn upstream_of(server: &ApiServer) -> String {
    let kc = kube::config::Kubeconfig::read_from(&server.kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.cluster_url
        .authority()
        .unwrap()
        .as_str()
        .replace("localhost", "127.0.0.1")
}

#[tokio::test]
async fn a_holder_cut_off_from_the_api_steps_down_before_the_standby_takes_over() {
    if !require_tools("a_holder_cut_off_from_the_api_steps_down_before_the_standby_takes_over") {
        return;
    }
    let server = ApiServer::start_bare("kit-cut");
    let relay = Cuttable::start(upstream_of(&server).await).await;
    let cut_off: Api<Lease> = Api::namespaced(client_via(&server, &relay).await, "default");
    let api: Api<Lease> = Api::namespaced(server.client().await, "default");
    let a = candidate("a", "10.0.0.1");
    let b = candidate("b", "10.0.0.2");
    let (tx_a, mut a_leads) = tokio::sync::watch::channel(false);
    let elector_a = tokio::spawn(lease::elect(cut_off, a.clone(), tx_a));
    tokio::time::timeout(Duration::from_secs(10), a_leads.wait_for(|l| *l))
        .await
        .expect("a never led")
        .unwrap();
    let (tx_b, mut b_leads) = tokio::sync::watch::channel(false);
    let elector_b = tokio::spawn(lease::elect(api.clone(), b, tx_b));
    // b stands by while a renews.
    tokio::time::sleep(a.duration + Duration::from_secs(1)).await;
    assert!(!*b_leads.borrow(), "b took over from a renewing holder");

    let t0 = Instant::now();
    relay.cut.send(true).unwrap();
    let stepped_down = async {
        a_leads.wait_for(|l| !*l).await.unwrap();
        Instant::now()
    };
    let took_over = async {
        b_leads.wait_for(|l| *l).await.unwrap();
        Instant::now()
    };
    let (stepped_down, took_over) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(stepped_down, took_over)
    })
    .await
    .expect("a kept leading, or b never took over");
    assert!(
        stepped_down < took_over,
        "a led until {:?} after the cut, b led from {:?}",
        stepped_down - t0,
        took_over - t0
    );
    assert!(
        stepped_down - t0 <= a.renew_deadline + Duration::from_millis(500),
        "a stepped down only {:?} after the cut",
        stepped_down - t0
    );
    assert_eq!(
        holder(&api).await,
        (Some("b".into()), Some("10.0.0.2".into()))
    );
    // The API back, a finds b holding the Lease and stays a standby.
    relay.cut.send(false).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!*a_leads.borrow());
    assert_eq!(holder(&api).await.0.as_deref(), Some("b"));
    elector_a.abort();
    elector_b.abort();
}

#[tokio::test]
async fn an_unfit_holder_hands_over_at_once_and_takes_nothing() {
    if !require_tools("an_unfit_holder_hands_over_at_once_and_takes_nothing") {
        return;
    }
    let server = ApiServer::start_bare("kit-unfit");
    let api: Api<Lease> = Api::namespaced(server.client().await, "default");
    let (a, mut b) = (candidate("a", "10.0.0.1"), candidate("b", "10.0.0.2"));
    b.retry = Duration::from_millis(100);
    let (fit_a, fit_a_rx) = tokio::sync::watch::channel(true);
    let (fit_b, fit_b_rx) = tokio::sync::watch::channel(false);
    let (tx_a, mut a_leads) = tokio::sync::watch::channel(false);
    let (tx_b, mut b_leads) = tokio::sync::watch::channel(false);
    let ea = tokio::spawn(lease::elect_fit(api.clone(), a.clone(), tx_a, fit_a_rx));
    tokio::time::timeout(Duration::from_secs(10), a_leads.wait_for(|l| *l))
        .await
        .expect("a never led")
        .unwrap();
    let eb = tokio::spawn(lease::elect_fit(api.clone(), b, tx_b, fit_b_rx));
    // a turns unfit: it hands over, but b, unfit too, takes nothing.
    fit_a.send(false).unwrap();
    tokio::time::timeout(Duration::from_secs(2), a_leads.wait_for(|l| !*l))
        .await
        .expect("an unfit holder kept leading")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(holder(&api).await, (None, None));
    assert!(!*b_leads.borrow(), "an unfit standby took the Lease");
    // b turns fit: it takes the free Lease at once, not after a's duration.
    let t0 = Instant::now();
    fit_b.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(2), b_leads.wait_for(|l| *l))
        .await
        .expect("b never took the free Lease")
        .unwrap();
    assert!(t0.elapsed() < a.duration, "{:?}", t0.elapsed());
    assert_eq!(
        holder(&api).await,
        (Some("b".into()), Some("10.0.0.2".into()))
    );
    // a, fit again, stays a standby behind a renewing holder.
    fit_a.send(true).unwrap();
    tokio::time::sleep(a.duration + Duration::from_secs(1)).await;
    assert!(!*a_leads.borrow());
    ea.abort();
    eb.abort();
}

#[tokio::test]
async fn events_land_on_the_object() {
    if !require_tools("events_land_on_the_object") {
        return;
    }
    let server = ApiServer::start_bare("kit-events");
    let client = server.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = cms
        .create(&PostParams::default(), &config_map("peer"))
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

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn gone_is_fine_and_a_uid_precondition_spares_a_successor() {
    if !require_tools("gone_is_fine_and_a_uid_precondition_spares_a_successor") {
        return;
    }
    let server = ApiServer::start_bare("kit-gone");
    let cms: Api<ConfigMap> = Api::namespaced(server.client().await, "default");
    let pp = PostParams::default();
    // Nothing there: a delete is done, a read or a patch finds nothing.
    assert_eq!(
        meta::delete(&cms, "nope", &DeleteParams::default())
            .await
            .unwrap(),
        Deleted::Gone
    );
    meta::delete_gone_ok(&cms, "nope").await.unwrap();
    assert!(cms.get("nope").await.gone_ok().unwrap().is_none());
    let merge = serde_json::json!({"data": {"k": "v"}});
    let patched = cms
        .patch("nope", &PatchParams::default(), &Patch::Merge(&merge))
        .await
        .gone_ok()
        .unwrap();
    assert!(patched.is_none());
    // Other refusals stay errors.
    let invalid = cms.create(&pp, &config_map("Not_A_Name")).await;
    assert!(invalid.gone_ok().is_err());
    let first = cms.create(&pp, &config_map("web")).await.unwrap();
    let again = cms.create(&pp, &config_map("web")).await;
    assert!(again.as_ref().is_err_and(meta::is_conflict), "{again:?}");

    // The object a UID names was replaced by another of its name: that one is gone (a
    // failed precondition), and its successor stays.
    assert_eq!(
        meta::delete(&cms, "web", &DeleteParams::default())
            .await
            .unwrap(),
        Deleted::Asked
    );
    let mut second = cms.create(&pp, &config_map("web")).await.unwrap();
    let only_first = meta::only_uid(first.metadata.uid.clone(), None);
    assert_eq!(
        meta::delete(&cms, "web", &only_first).await.unwrap(),
        Deleted::Gone
    );
    assert!(cms.get_opt("web").await.unwrap().is_some(), "the successor");
    let only_second = meta::only_uid(second.metadata.uid.clone(), Some(0));
    assert_eq!(
        meta::delete(&cms, "web", &only_second).await.unwrap(),
        Deleted::Asked
    );
    assert!(cms.get_opt("web").await.unwrap().is_none());
    // A finalizer taken off an object already gone: nothing to do.
    second.metadata.finalizers = Some(vec!["example.io/kept".into()]);
    meta::remove_finalizer(&cms, &second, "example.io/kept")
        .await
        .unwrap();
}

/// The objects of a burst are reconciled at most [`controller::CONCURRENCY`] at once (or what
/// the controller asks for), never all together as kube-runtime's default would: each
/// reconcile holds its slot a while, and the most held at once is counted.
#[tokio::test]
async fn a_burst_is_reconciled_a_bounded_number_at_once() {
    if !require_tools("a_burst_is_reconciled_a_bounded_number_at_once") {
        return;
    }
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use fabric_kube::controller::{self, Backoff, Runner};
    use kube::runtime::{Controller, controller::Action, watcher};

    #[derive(Default)]
    struct Seen {
        now: AtomicUsize,
        most: AtomicUsize,
        done: AtomicUsize,
    }
    #[derive(Debug, thiserror::Error)]
    #[error("never")]
    struct Never;

    let server = ApiServer::start_bare("kit-burst");
    let client = server.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    const N: usize = 40;
    for i in 0..N {
        cms.create(&PostParams::default(), &config_map(&format!("burst-{i}")))
            .await
            .unwrap();
    }
    for (limit, runner) in [
        (
            controller::CONCURRENCY,
            Runner::<Never>::new("burst", Backoff::STANDARD),
        ),
        (
            4,
            Runner::<Never>::new("burst-4", Backoff::STANDARD).concurrency(4),
        ),
    ] {
        let seen = Arc::new(Seen::default());
        let c = Controller::new(cms.clone(), watcher::Config::default());
        let task = tokio::spawn(runner.until_dropped().run(
            c,
            |cm: Arc<ConfigMap>, seen: Arc<Seen>| async move {
                if !cm
                    .metadata
                    .name
                    .as_deref()
                    .unwrap_or_default()
                    .starts_with("burst-")
                {
                    return Ok(Action::await_change());
                }
                let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                seen.now.fetch_sub(1, Ordering::SeqCst);
                seen.done.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Never>(Action::await_change())
            },
            seen.clone(),
        ));
        let t0 = Instant::now();
        while seen.done.load(Ordering::SeqCst) < N {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{} of {N} reconciled",
                seen.done.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        task.abort();
        let most = seen.most.load(Ordering::SeqCst);
        assert!(
            (2..=usize::from(limit)).contains(&most),
            "{most} reconciles at once, the limit {limit}"
        );
    }
}
