//! Pods on the virtual node, end to end against two test API servers with RBAC enforced: the
//! consumer runs the VirtualNode controller and the virtual kubelet it deploys (as its
//! ServiceAccount, through the fixture's Deployment stand-in), with graceful pod deletion on;
//! the provider runs `fabric-controller sharing` (the ShadowPod controller) and is reached
//! through a real consumer identity bound only to the tenant Role. No kubelet runs on the
//! provider: the test plays it, writing the real pods' status through `pods/status`.
//!
//! One fixture for every check: lifecycle and status home (pod IP through the remap),
//! labels following, restart counts, a refusal surfaced, restart of the virtual kubelet
//! without duplicates, the provider's API cut (pods not Ready, nothing deleted) and healed,
//! a ShadowPod vanished (pod Failed), the provider's quota (its ShadowPod webhook, registered
//! as deploy/ does: a pod over the grant refused visibly at home, a finished pod not revived
//! and its share released to the next pod; an in-place resize of a home pod reaching the
//! ShadowPod and the real pod within the grant, and beyond it refused: the pod keeps its
//! size, `PodResizePending`/`Infeasible` at home), deletion at home through the provider, and
//! the opt-in at-most-once semantics: off, pods run through a long cut; on, the provider stops
//! them after the partition time and only then does the consumer fail them at home.
//!
//! A second fixture, the provider's lifetimes short: a finished pod's ShadowPod collected
//! after the retention (the home pod stays Succeeded), one whose end the consumer has not
//! recorded at home kept past it, a tenant drained and set back within
//! the grace losing nothing, and a drained tenant's ShadowPods (written by the consumer's
//! own identity, its virtual kubelet cut off) deleted by the provider after the grace.
//!
//! A third: a namespace offloaded (issue 20), the virtual kubelet's side: its pods and their
//! configuration in the twin the provider made, its Events home, a pod without a twin
//! waiting, the twin's removal failing the pod that ran there; and on a bed of its own, its
//! Services in the twin.
use std::{
    future::Future,
    path::PathBuf,
    time::{Duration, Instant},
};

use fabric_api::{
    names::{
        self,
        label::{REFLECTED_FROM, REFLECTED_TO},
    },
    offloading::v1alpha1::ShadowPod,
};
use fabric_auth::identity;
use fabric_offloading::shadowpod::forge;
use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
    deployments::Deployments,
    offload_fixture::{self as fixture, CONSUMER, NODE, NS, PROVIDER},
    phase::phase_async,
    process::Bin,
    rights,
    wait::try_eventually,
};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};

mod netpol;
mod reflection;
mod storage;

const HOME_NS: &str = "shop";
const T: Duration = Duration::from_secs(40);

struct Bed {
    consumer: ApiServer,
    provider: ApiServer,
    c: Client,
    p: Client,
    deployments: Deployments,
    _controllers: Vec<ChildGuard>,
    dir: PathBuf,
    identity: identity::Credentials,
}

impl Bed {
    fn logs(&self) -> String {
        let tail = |f: &str| {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        format!(
            "--- virtual-nodes controller ---\n{}\n--- provider's sharing controller ---\n{}\n{}",
            tail("consumer-controller.log"),
            tail("provider-controller.log"),
            self.deployments.report()
        )
    }

    async fn eventually<T, F, Fut>(&self, what: &str, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        self.within(what, T, f).await
    }

    /// [`try_eventually`], failing with the components' logs.
    async fn within<T, F, Fut>(&self, what: &str, limit: Duration, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        match try_eventually(what, limit, f).await {
            Ok(v) => v,
            Err(e) => panic!("{e}\n{}", self.logs()),
        }
    }

    /// Waits for an Event (events.k8s.io) in `ns` of `api` that `matches`.
    async fn event(&self, api: &ApiServer, ns: &str, what: &str, matches: impl Fn(&Value) -> bool) {
        self.eventually(what, || async {
            let v = api.list_json("events.events.k8s.io", Some(ns))?;
            v["items"].as_array()?.iter().any(&matches).then_some(())
        })
        .await;
    }

    fn home(&self) -> Api<Pod> {
        Api::namespaced(self.c.clone(), HOME_NS)
    }

    fn shadows(&self) -> Api<ShadowPod> {
        Api::namespaced(self.p.clone(), &names::namespace::tenant(CONSUMER))
    }

    fn remote_pods(&self) -> Api<Pod> {
        Api::namespaced(self.p.clone(), &names::namespace::tenant(CONSUMER))
    }

    /// The tenant namespace's ShadowPods as the consumer's own identity writes them, straight
    /// to the provider (no virtual kubelet, no forge): the attacker's view.
    async fn consumer_shadows(&self) -> Api<ShadowPod> {
        let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, &self.identity));
        let client = identity::client_from_kubeconfig(&kubeconfig).await.unwrap();
        Api::namespaced(client, &names::namespace::tenant(CONSUMER))
    }

    async fn home_pod_where(&self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        self.eventually(what, || async {
            let p = self.home().get_opt(name).await.ok()??;
            let v = serde_json::to_value(&p).unwrap();
            ok(&v).then_some(v)
        })
        .await
    }

    fn set_identity(&self, creds: &identity::Credentials) {
        fixture::set_identity(&self.consumer, creds).unwrap();
    }

    async fn create_home_pod(&self, name: &str, extra: Value) {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": HOME_NS, "labels": { "app": name } },
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 5,
                "tolerations": [{ "key": names::taint::VIRTUAL_NODE, "operator": "Exists" }],
                "containers": [{ "name": "main", "image": "echo",
                                 "command": ["fabric-test-pod", "echo", "--port", "8080"] }],
            },
        });
        merge(&mut pod["spec"], extra);
        apply(&self.consumer, &pod);
    }

    /// Home pod `name` (its spec with `extra`) offloaded: its real pod's name, once it exists.
    async fn offloaded(&self, name: &str, extra: Value) -> String {
        self.create_home_pod(name, extra).await;
        let remote = forge::name(HOME_NS, name);
        self.eventually(&format!("{name}'s real pod"), || async {
            self.remote_pods().get_opt(&remote).await.ok()?
        })
        .await;
        remote
    }

    /// [`Bed::offloaded`], its real pod run at `ip` and the home pod Running.
    async fn running(&self, name: &str, extra: Value, ip: &str) -> String {
        let remote = self.offloaded(name, extra).await;
        self.provider_runs(&remote, ip, 0).await;
        self.home_pod_where(name, &format!("{name} Running"), |p| {
            p["status"]["phase"] == "Running"
        })
        .await;
        remote
    }

    /// The provider's kubelet, played: the real pod runs with `restarts`.
    async fn provider_runs(&self, name: &str, ip: &str, restarts: i32) {
        let status = json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "startTime": "2026-11-26T12:00:00Z",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-26T12:00:01Z"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-26T12:00:01Z"},
            ],
            "containerStatuses": [{"name": "main", "image": "echo", "imageID": "", "ready": true,
                                   "restartCount": restarts,
                                   "state": {"running": {"startedAt": "2026-11-26T12:00:01Z"}}}],
        }});
        self.remote_pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }

    /// The provider's kubelet, played: the real pod's container exited 0.
    async fn provider_finishes(&self, name: &str) {
        let status = json!({"status": {
            "phase": "Succeeded",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodCompleted",
                 "lastTransitionTime": "2026-11-26T12:00:02Z"},
                {"type": "ContainersReady", "status": "False", "reason": "PodCompleted",
                 "lastTransitionTime": "2026-11-26T12:00:02Z"},
            ],
            "containerStatuses": [{"name": "main", "image": "echo", "imageID": "", "ready": false,
                                   "restartCount": 0,
                                   "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                       "startedAt": "2026-11-26T12:00:01Z",
                                       "finishedAt": "2026-11-26T12:00:02Z"}}}],
        }});
        self.remote_pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }

    /// The CPU the provider granted the consumer (its slice's status), in millicores.
    async fn granted_cpu_milli(&self) -> i128 {
        self.eventually("the provider's grant", || async {
            let o = self.provider.kubectl(&[
                "get",
                "resourceslice",
                CONSUMER,
                "-n",
                &names::namespace::tenant(CONSUMER),
                "-o",
                "jsonpath={.status.granted.cpu}",
            ]);
            let q = String::from_utf8(o.stdout).ok()?;
            fabric_tests::quantity::milli(q.trim())
                .ok()
                .filter(|m| *m > 0)
        })
        .await
    }

    async fn shadow_count(&self) -> usize {
        self.shadows()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
    }
}

fn merge(a: &mut Value, b: Value) {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        for (k, v) in b {
            a.insert(k, v);
        }
    }
}

#[track_caller]
fn apply(api: &ApiServer, obj: &Value) {
    fixture::apply(api, obj).unwrap();
}

fn condition<'a>(pod: &'a Value, type_: &str) -> Option<&'a Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn cond_is(pod: &Value, type_: &str, status: &str, reason: Option<&str>) -> bool {
    condition(pod, type_)
        .is_some_and(|c| c["status"] == status && reason.is_none_or(|r| c["reason"] == r))
}

const OFFLOADED: &str = "offloading.fabric.io/Offloaded";

/// The bed; `sharing_args`: flags of the provider's `fabric-controller sharing` beyond the
/// defaults.
async fn setup(tag: &str, sharing_args: &[&str]) -> Option<Bed> {
    setup_with(tag, sharing_args, &[], &[]).await
}

/// [`setup`], with `vn_args` for the consumer's VirtualNode controller and `home_crds`
/// installed (and served) at home before it starts.
async fn setup_with(
    tag: &str,
    sharing_args: &[&str],
    vn_args: &[&str],
    home_crds: &[Value],
) -> Option<Bed> {
    if !require_tools(tag) {
        return None;
    }
    let dir = fixture::scratch_dir(tag).unwrap();
    // The consumer's API server starts meanwhile (seconds, mostly waiting).
    let consumer_tag = format!("{tag}-c");
    let consumer = std::thread::spawn(move || fixture::start_consumer(&consumer_tag, true));

    // The provider: what its authentication service made for the consumer, and its
    // ShadowPod controller.
    // The API server presents its client certificate to the webhook, as the webhook requires.
    let caller = fabric_tests::webhook::Caller::new(&dir.join("webhook-caller")).unwrap();
    let provider = ApiServer::start_with_auth_args(&format!("{tag}-p"), &caller.kubelite_args());
    provider.install_crds();
    fabric_tests::auth_service::prepare_cluster(&provider, PROVIDER);
    let p = provider.client().await;
    let creds = fixture::admit_consumer(&provider).await.unwrap();
    // As its pod: its ServiceAccount's token, with the rights deploy/ gives it.
    let sharing_kubeconfig =
        rights::component_kubeconfig(&provider, "fabric-sharing", dir.join("sharing.kubeconfig"))
            .unwrap();
    let sharing_controller = Bin::new("fabric-controller")
        .unwrap()
        .arg("sharing")
        .args(sharing_args)
        .kubeconfig(&sharing_kubeconfig)
        .pod_name("controller-0")
        .log(dir.join("provider-controller.log"))
        .spawn()
        .unwrap();
    // Its quota: the ShadowPod webhook, and a grant the sharing controller's policy answers
    // (from a Node of the provider) to the slice the consumer's replicator would have made.
    let webhook =
        fabric_tests::webhook::start(&provider, &caller, &dir.join("webhook.log")).unwrap();
    fixture::grant(&provider, CONSUMER).unwrap();

    // The consumer: what the sharing and network layers have made by the time a
    // VirtualNode exists, including the remap of the provider's pod CIDR.
    let consumer = consumer.join().expect("starting the consumer").unwrap();
    consumer.kubectl_ok(&["create", "namespace", HOME_NS]);
    for crd in home_crds {
        apply(&consumer, crd);
        let name = format!("crd/{}", crd["metadata"]["name"].as_str().unwrap());
        consumer.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            &name,
            "--timeout=60s",
        ]);
    }
    let fixture::VirtualNodes {
        controller: vn_controller,
        deployments,
        ..
    } = fixture::start_virtual_nodes(&consumer, &dir, vn_args).unwrap();
    let c = consumer.client().await;
    let bed = Bed {
        consumer,
        provider,
        c,
        p,
        deployments,
        _controllers: vec![sharing_controller, vn_controller, webhook],
        dir,
        identity: creds,
    };
    bed.set_identity(&bed.identity);
    apply(&bed.consumer, &fixture::virtual_node(json!({})));
    Some(bed)
}

/// Sets the CPU request of a home pod's container (an in-place resize).
fn resize_home(bed: &Bed, name: &str, cpu: &str) {
    let patch = json!([{"op": "add", "path": "/spec/containers/0/resources",
                        "value": {"requests": {"cpu": cpu}}}]);
    bed.consumer.kubectl_ok(&[
        "patch",
        "pod",
        name,
        "-n",
        HOME_NS,
        "--type=json",
        "-p",
        &patch.to_string(),
    ]);
}

/// A ShadowPod as a consumer can write one by hand, asking for `cpu`; no labels, so no
/// virtual kubelet takes it for one of its own.
fn raw_shadow(name: &str, cpu: &str) -> ShadowPod {
    serde_json::from_value(json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": name, "namespace": names::namespace::tenant(CONSUMER)},
        "spec": {
            "clusterId": CONSUMER,
            "home": {"namespace": HOME_NS, "name": name, "uid": format!("home-{name}")},
            "pod": {"spec": {"containers": [{"name": "main", "image": "echo",
                "resources": {"requests": {"cpu": cpu}}}]}},
        },
    }))
    .unwrap()
}

fn cpu_of(spec: &Value) -> Option<&str> {
    spec["containers"][0]["resources"]["requests"]["cpu"].as_str()
}

#[tokio::test]
async fn pods_on_the_virtual_node_run_on_the_provider_and_come_home() {
    let Some(bed) = phase_async(
        "the bed: both API servers, the controllers, the webhook",
        setup("offload", &[]),
    )
    .await
    else {
        return;
    };
    phase_async("the virtual node Ready", virtual_node_ready(&bed)).await;
    let shadow = phase_async(
        "web offloaded; the provider's scheduling said at home",
        web_offloaded(&bed),
    )
    .await;
    phase_async("web's status home", web_status_home(&bed)).await;
    phase_async(
        "labels and restarts follow",
        labels_and_restarts_follow(&bed),
    )
    .await;
    phase_async(
        "a hostile provider's status comes home bounded, its foreign address unreported",
        a_hostile_provider_s_status_is_bounded(&bed),
    )
    .await;
    phase_async(
        "resized in place within the grant, refused beyond it",
        resized_within_the_grant(&bed),
    )
    .await;
    phase_async("refused by the forge's policy", refused_by_the_policy(&bed)).await;
    let uid = shadow.metadata.uid;
    phase_async(
        "the virtual kubelet killed and restarted",
        virtual_kubelet_restarted(&bed, &uid),
    )
    .await;
    phase_async(
        "the provider's API cut and healed",
        provider_cut_and_healed(&bed, &uid),
    )
    .await;
    phase_async(
        "a vanished ShadowPod fails its pod",
        vanished_shadow_pod(&bed),
    )
    .await;
    phase_async("the provider's quota", provider_quota(&bed)).await;
    phase_async(
        "the consumer's identity cannot shrink its way past the quota",
        quota_holds_while_pods_hold(&bed),
    )
    .await;
    phase_async(
        "a tenant held to restricted by the provider's admin",
        a_tenant_held_to_restricted(&bed),
    )
    .await;
    phase_async("a container that cannot start", image_pull_failure(&bed)).await;
    phase_async("deleted at home", deleted_at_home(&bed)).await;
    phase_async("at-most-once", at_most_once(&bed)).await;
    let _ = &bed.provider;
}

/// The virtual kubelet has registered its Node, Ready.
async fn virtual_node_ready(bed: &Bed) {
    bed.eventually("the virtual node Ready", || async {
        let n = bed.consumer.get_json("node", None, NODE)?;
        cond_is(&n, "Ready", "True", None).then_some(())
    })
    .await;
}

/// Bound to the virtual node: a ShadowPod, then its real pod on the provider; the provider's
/// scheduler finds no room for it (played): said at home, and told once.
async fn web_offloaded(bed: &Bed) -> ShadowPod {
    let web = forge::name(HOME_NS, "web");
    // Bound to the virtual node: a ShadowPod, then its real pod on the provider.
    bed.create_home_pod("web", json!({})).await;
    let shadow = bed
        .eventually("the ShadowPod", || async {
            bed.shadows().get_opt(&web).await.ok()?
        })
        .await;
    assert_eq!(shadow.spec.cluster_id, CONSUMER);
    assert_eq!(shadow.spec.home.name, "web");
    // Its namespace is not offloaded: it went alone, and the pod is told what does not follow.
    bed.event(&bed.consumer, HOME_NS, "the Offloaded Event", |e| {
        e["reason"] == "Offloaded"
            && e["regarding"]["name"] == "web"
            && e["note"]
                .as_str()
                .is_some_and(|n| n.contains(&format!("namespace {HOME_NS} is not offloaded")))
    })
    .await;
    bed.eventually("the real pod", || async {
        bed.remote_pods().get_opt(&web).await.ok()?
    })
    .await;
    // The provider's scheduler finds no room for it (played): said at home, and told once.
    let no_room = "0/1 nodes are available: 1 Insufficient cpu.";
    let unschedulable = json!({"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": no_room, "lastTransitionTime": "2026-11-26T12:00:00Z"},
    ]}});
    bed.remote_pods()
        .patch_status(&web, &PatchParams::default(), &Patch::Merge(&unschedulable))
        .await
        .unwrap();
    let home = bed
        .home_pod_where("web", "the provider's unschedulable at home", |p| {
            cond_is(p, OFFLOADED, "False", Some("ProviderUnschedulable"))
        })
        .await;
    let message = condition(&home, OFFLOADED).unwrap()["message"].to_string();
    assert!(message.contains(no_room), "{message}");
    bed.event(&bed.consumer, HOME_NS, "the FailedScheduling Event", |e| {
        e["reason"] == "FailedScheduling"
            && e["regarding"]["name"] == "web"
            && e["note"].as_str().is_some_and(|n| n.contains(no_room))
    })
    .await;
    bed.provider_runs(&web, "10.244.2.7", 0).await;
    shadow
}

/// Status home: Running, Ready, at the remapped address, on the node's address.
async fn web_status_home(bed: &Bed) {
    // Status home: Running, Ready, at the remapped address, on the node's address.
    let home = bed
        .home_pod_where("web", "web Running and Ready at home", |p| {
            p["status"]["phase"] == "Running" && cond_is(p, "Ready", "True", None)
        })
        .await;
    assert_eq!(home["status"]["podIP"], "10.71.2.7", "{home}");
    assert_eq!(home["status"]["hostIP"], "127.0.0.1");
    assert!(cond_is(&home, OFFLOADED, "True", Some("Created")), "{home}");
    // (kubelite prints only NAME and CREATED AT for built-in types: no `-o wide` here.)
    let ip = bed.consumer.kubectl_ok(&[
        "get",
        "pod",
        "web",
        "-n",
        HOME_NS,
        "-o",
        "jsonpath={.status.podIP}",
    ]);
    assert_eq!(ip.trim(), "10.71.2.7");
}

/// Labels follow; restarts show.
async fn labels_and_restarts_follow(bed: &Bed) {
    let web = forge::name(HOME_NS, "web");
    // Labels follow; restarts show.
    bed.consumer
        .kubectl_ok(&["label", "pod", "web", "-n", HOME_NS, "tier=front"]);
    bed.eventually("the label on the ShadowPod", || async {
        let s = bed.shadows().get(&web).await.ok()?;
        (s.metadata.labels?.get("tier")? == "front" && s.spec.pod.labels.get("tier")? == "front")
            .then_some(())
    })
    .await;
    bed.eventually("the label on the real pod", || async {
        let p = bed.remote_pods().get(&web).await.ok()?;
        (p.metadata.labels?.get("tier")? == "front").then_some(())
    })
    .await;
    bed.provider_runs(&web, "10.244.2.7", 2).await;
    bed.home_pod_where("web", "the restart count at home", |p| {
        p["status"]["containerStatuses"][0]["restartCount"] == 2
    })
    .await;
}

/// A provider writes what it likes into its pods' status (here as its kubelet would, through
/// `pods/status`; its controller copies that into the ShadowPod): at home each string comes cut,
/// the lists capped, the whole under half a MiB, and an address outside the provider's pod
/// CIDR (its node's network, say) is not reported as the pod's.
async fn a_hostile_provider_s_status_is_bounded(bed: &Bed) {
    const MARKER: &str = "… [truncated]";
    let web = forge::name(HOME_NS, "web");
    let at = "2026-11-26T12:00:01Z";
    let mut conditions = vec![
        json!({"type": "Ready", "status": "True", "lastTransitionTime": at}),
        json!({"type": "ContainersReady", "status": "True", "lastTransitionTime": at}),
    ];
    conditions.extend((0..40).map(|i| {
        json!({"type": format!("example.com/flood-{i}"), "status": "True",
               "reason": "r".repeat(1000), "message": "m".repeat(8 * 1024),
               "lastTransitionTime": at})
    }));
    let containers: Vec<Value> = std::iter::once("main".to_owned())
        .chain((0..40).map(|i| format!("ghost-{i}")))
        .map(|name| {
            json!({"name": name, "image": "i".repeat(4096), "imageID": "", "ready": true,
                   "restartCount": 2,
                   "state": {"waiting": {"reason": "w".repeat(1000), "message": "m".repeat(8 * 1024)}}})
        })
        .collect();
    let hostile = json!({"status": {
        "phase": "Running", "podIP": "192.0.2.7", "podIPs": [{"ip": "192.0.2.7"}],
        "reason": "r".repeat(4096), "message": "m".repeat(256 * 1024),
        "conditions": conditions, "containerStatuses": containers,
    }});
    bed.remote_pods()
        .patch_status(&web, &PatchParams::default(), &Patch::Merge(&hostile))
        .await
        .unwrap();
    let home = bed
        .home_pod_where("web", "the provider's flood at home", |p| {
            p["status"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("mmmm"))
        })
        .await;
    let status = &home["status"];
    let size = serde_json::to_vec(status).unwrap().len();
    assert!(size <= 512 * 1024, "{size} bytes of status came home");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.len() <= 1024 && message.ends_with(MARKER),
        "{}",
        message.len()
    );
    let reason = status["reason"].as_str().unwrap();
    assert!(reason.len() <= 128 && reason.ends_with(MARKER), "{reason}");
    let conds = status["conditions"].as_array().unwrap();
    let floods = conds
        .iter()
        .filter(|c| c["type"].as_str().unwrap().starts_with("example.com/"))
        .count();
    assert!(
        floods <= 16,
        "{floods} of the provider's 40 conditions came home"
    );
    for c in conds {
        assert!(
            c["message"].as_str().unwrap_or_default().len() <= 1024,
            "{c}"
        );
    }
    let statuses = status["containerStatuses"].as_array().unwrap();
    assert!(
        statuses.len() <= 16,
        "{} container statuses",
        statuses.len()
    );
    for c in statuses {
        assert!(c["image"].as_str().unwrap().len() <= 512, "{}", c["name"]);
    }
    // The address is not the pod's in the provider's pod CIDR: none is reported, rather than
    // one that would lead the consumer's traffic anywhere.
    assert!(status["podIP"].is_null(), "{}", status["podIP"]);
    assert!(status["podIPs"].is_null(), "{}", status["podIPs"]);

    // The provider behaves again: the pod is whole at home again.
    let healed = json!({"status": {"reason": null, "message": null}});
    bed.remote_pods()
        .patch_status(&web, &PatchParams::default(), &Patch::Merge(&healed))
        .await
        .unwrap();
    bed.provider_runs(&web, "10.244.2.7", 2).await;
    bed.home_pod_where("web", "web healed at home", |p| {
        p["status"]["podIP"] == "10.71.2.7"
            && p["status"]["message"].is_null()
            && p["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|c| c.len() == 1)
    })
    .await;
}

/// Resized in place within the grant: the ShadowPod, then the real pod, follow; beyond it,
/// refused at home.
async fn resized_within_the_grant(bed: &Bed) {
    let web = forge::name(HOME_NS, "web");
    // Resized in place within the grant: the ShadowPod, then the real pod, follow.
    let granted = bed.granted_cpu_milli().await;
    let within = format!("{}m", granted * 3 / 10);
    resize_home(bed, "web", &within);
    bed.eventually("the real pod resized", || async {
        let p = bed.remote_pods().get(&web).await.ok()?;
        let spec = serde_json::to_value(p.spec?).ok()?;
        (cpu_of(&spec) == Some(within.as_str())).then_some(())
    })
    .await;
    let s = bed.shadows().get(&web).await.unwrap();
    assert_eq!(
        cpu_of(&serde_json::to_value(&s.spec.pod.spec).unwrap()),
        Some(within.as_str())
    );
    // Beyond the grant: refused; the pod keeps its size and says so at home.
    resize_home(bed, "web", &format!("{}m", granted * 2));
    let home = bed
        .home_pod_where("web", "the resize refused at home", |p| {
            cond_is(p, "PodResizePending", "True", Some("Infeasible"))
        })
        .await;
    let message = condition(&home, "PodResizePending").unwrap()["message"].to_string();
    assert!(message.contains("granted to consumer"), "{message}");
    assert!(cond_is(&home, "Ready", "True", None), "{home}");
    let s = bed.shadows().get(&web).await.unwrap();
    assert_eq!(
        cpu_of(&serde_json::to_value(&s.spec.pod.spec).unwrap()),
        Some(within.as_str())
    );
    let real = bed.remote_pods().get(&web).await.unwrap();
    assert_eq!(
        cpu_of(&serde_json::to_value(real.spec.unwrap()).unwrap()),
        Some(within.as_str())
    );
    // Back within the grant (smaller: the quota checks below count on the rest): carried
    // out, and the condition goes.
    let small = format!("{}m", granted / 10);
    resize_home(bed, "web", &small);
    bed.home_pod_where("web", "the resize done", |p| {
        condition(p, "PodResizePending").is_none()
    })
    .await;
    bed.eventually("the real pod at its new size", || async {
        let p = bed.remote_pods().get(&web).await.ok()?;
        let spec = serde_json::to_value(p.spec?).ok()?;
        (cpu_of(&spec) == Some(small.as_str())).then_some(())
    })
    .await;
}

/// Refused by the forge's policy: a condition and an Event at home, nothing remote.
async fn refused_by_the_policy(bed: &Bed) {
    // Refused by the forge's policy: a condition and an Event at home, nothing remote.
    bed.create_home_pod("root", json!({ "hostNetwork": true }))
        .await;
    let root = bed
        .home_pod_where("root", "root refused", |p| p["status"]["phase"] == "Failed")
        .await;
    assert!(
        cond_is(&root, OFFLOADED, "False", Some("OffloadingRefused")),
        "{root}"
    );
    bed.event(&bed.consumer, HOME_NS, "the refusal's Event", |e| {
        e["reason"] == "OffloadingRefused" && e["regarding"]["name"] == "root"
    })
    .await;
    assert!(
        bed.shadows()
            .get_opt(&forge::name(HOME_NS, "root"))
            .await
            .unwrap()
            .is_none()
    );
}

/// SIGKILLed and restarted: nothing created twice, nothing lost, the pod stays Ready.
async fn virtual_kubelet_restarted(bed: &Bed, uid: &Option<String>) {
    let web = forge::name(HOME_NS, "web");
    // Made before reflected objects carried ownership marks, as a virtual kubelet of an older
    // fabric left it: adopted (marks stamped on the same object), not left alone as someone
    // else's nor made twice.
    let unmarked = json!({"metadata": {"labels": {REFLECTED_FROM: null, REFLECTED_TO: null}}});
    bed.shadows()
        .patch(&web, &PatchParams::default(), &Patch::Merge(&unmarked))
        .await
        .unwrap();
    // SIGKILLed and restarted: nothing created twice, nothing lost, the pod stays Ready.
    let vk = fixture::virtual_kubelet_name();
    bed.deployments.kill(NS, &vk).unwrap();
    let t0 = Instant::now();
    let mut restarted_at = None;
    while t0.elapsed() < T {
        if restarted_at.is_none()
            && bed.deployments.restarts(NS, &vk) > 0
            && bed.deployments.pid(NS, &vk).is_some()
        {
            restarted_at = Some(Instant::now());
        }
        if restarted_at.is_some_and(|t| t.elapsed() > Duration::from_secs(8)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(restarted_at.is_some(), "not restarted\n{}", bed.logs());
    bed.eventually("web's ShadowPod adopted: its marks back", || async {
        let s = bed.shadows().get_opt(&web).await.ok()??;
        let labels = s.metadata.labels.unwrap_or_default();
        (labels.get(REFLECTED_FROM).map(String::as_str) == Some(CONSUMER)
            && labels.get(REFLECTED_TO).map(String::as_str) == Some(PROVIDER))
        .then_some(())
    })
    .await;
    assert_eq!(bed.shadow_count().await, 1, "{}", bed.logs());
    assert_eq!(bed.shadows().get(&web).await.unwrap().metadata.uid, *uid);
    let home = bed.home().get("web").await.unwrap();
    let home = serde_json::to_value(&home).unwrap();
    assert!(cond_is(&home, "Ready", "True", None), "{home}");
}

/// The provider's API cut: the node goes NotReady and the pod not Ready at home; nothing is
/// deleted on the provider. Healed: Ready again, nothing duplicated.
async fn provider_cut_and_healed(bed: &Bed, uid: &Option<String>) {
    let web = forge::name(HOME_NS, "web");
    // The provider's API cut: the node goes NotReady and the pod not Ready at home; nothing
    // is deleted on the provider. Healed: Ready again, nothing duplicated.
    let dead = identity::Credentials {
        api_server_url: "https://127.0.0.1:9".into(),
        ..bed.identity.clone()
    };
    let cut = Instant::now();
    bed.set_identity(&dead);
    let home = bed
        .home_pod_where("web", "web not Ready while the provider is cut off", |p| {
            cond_is(p, "Ready", "False", Some("ProviderUnreachable"))
        })
        .await;
    assert_eq!(home["status"]["phase"], "Running");
    assert_eq!(bed.shadows().get(&web).await.unwrap().metadata.uid, *uid);
    // At-most-once is off (the default): however long the cut (longer than the partition
    // time and the consumer's deadline of the at-most-once phase below, both counted from the
    // last contact, which was before the cut), nothing stops.
    loop {
        let home = serde_json::to_value(bed.home().get("web").await.unwrap()).unwrap();
        assert_eq!(home["status"]["phase"], "Running", "{home}");
        let real = bed.remote_pods().get_opt(&web).await.unwrap();
        assert!(real.is_some_and(|p| p.metadata.deletion_timestamp.is_none()));
        let shadow = bed.shadows().get(&web).await.unwrap();
        assert_eq!(shadow.status.unwrap().phase.as_deref(), Some("Running"));
        if cut.elapsed() >= AT_MOST_ONCE_DEADLINE + Duration::from_secs(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bed.set_identity(&bed.identity);
    bed.home_pod_where("web", "web Ready again", |p| {
        cond_is(p, "Ready", "True", None)
    })
    .await;
    assert_eq!(bed.shadow_count().await, 1);
    assert_eq!(bed.shadows().get(&web).await.unwrap().metadata.uid, *uid);
}

/// A ShadowPod that vanishes on the provider: its pod fails at home, never stays Running.
async fn vanished_shadow_pod(bed: &Bed) {
    // A ShadowPod that vanishes on the provider: its pod fails at home, never stays Running.
    let job = bed.running("job", json!({}), "10.244.2.8").await;
    bed.shadows()
        .delete(&job, &DeleteParams::default())
        .await
        .unwrap();
    let gone = bed
        .home_pod_where("job", "job Failed at home", |p| {
            p["status"]["phase"] == "Failed"
        })
        .await;
    assert_eq!(gone["status"]["reason"], "ProviderPodVanished", "{gone}");
    assert!(cond_is(&gone, "Ready", "False", None));
}

/// The provider's quota: a pod within it runs, one over it is refused visibly at home, a
/// finished pod's share goes to the next.
async fn provider_quota(bed: &Bed) {
    // The provider's quota. A pod within what is left runs...
    let granted = bed.granted_cpu_milli().await;
    let share = json!({
        "restartPolicy": "Never",
        "containers": [{ "name": "main", "image": "echo",
                         "command": ["fabric-test-pod", "echo", "--port", "8080"],
                         "resources": { "requests": { "cpu": format!("{}m", granted * 6 / 10) } } }],
    });
    let batch = bed.running("batch", share.clone(), "10.244.2.9").await;
    // ... one over it is refused by the webhook, visibly at home (a condition, an Event),
    // and nothing of it runs there.
    bed.create_home_pod("big", share.clone()).await;
    let big = bed
        .home_pod_where("big", "big refused by the provider's quota", |p| {
            cond_is(p, OFFLOADED, "False", Some("ProviderForbidden"))
        })
        .await;
    let why = condition(&big, OFFLOADED).unwrap()["message"].to_string();
    assert!(why.contains("granted to consumer"), "{big}");
    assert_eq!(big["status"]["phase"], "Pending", "{big}");
    bed.event(&bed.consumer, HOME_NS, "the quota refusal's Event", |e| {
        e["reason"] == "ProviderForbidden" && e["regarding"]["name"] == "big"
    })
    .await;
    assert!(
        bed.shadows()
            .get_opt(&forge::name(HOME_NS, "big"))
            .await
            .unwrap()
            .is_none()
    );
    bed.consumer
        .kubectl_ok(&["delete", "pod", "big", "-n", HOME_NS, "--wait=false"]);
    bed.eventually("big gone", || async {
        bed.home()
            .get_opt("big")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    // The batch pod finishes: Succeeded at home, never revived on the provider, and its
    // share goes to the next pod that needs it.
    let batch_uid = bed.remote_pods().get(&batch).await.unwrap().metadata.uid;
    bed.provider_finishes(&batch).await;
    bed.home_pod_where("batch", "batch Succeeded at home", |p| {
        p["status"]["phase"] == "Succeeded"
    })
    .await;
    bed.eventually("batch's ShadowPod Succeeded", || async {
        let s = bed.shadows().get(&batch).await.ok()?;
        (s.status?.phase.as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    bed.create_home_pod("next", share).await;
    let next = forge::name(HOME_NS, "next");
    bed.eventually("next's real pod (the share released)", || async {
        bed.remote_pods().get_opt(&next).await.ok()?
    })
    .await;
    let real = bed.remote_pods().get(&batch).await.unwrap();
    assert_eq!(real.metadata.uid, batch_uid, "batch was revived");
    assert_eq!(
        real.status.and_then(|s| s.phase).as_deref(),
        Some("Succeeded")
    );
    let s = bed.shadows().get(&batch).await.unwrap();
    assert_eq!(s.status.map(|s| s.recreations), Some(0));
    let home = bed.home().get("batch").await.unwrap();
    assert_eq!(
        home.status.and_then(|s| s.phase).as_deref(),
        Some("Succeeded")
    );
}

/// The consumer's own identity, writing ShadowPods straight to the provider (no virtual
/// kubelet, no forge), cannot free the share a running pod still holds: a change the pod
/// cannot take (a renamed container) is refused, and a shrink frees its share only once the
/// provider's kubelet reports the pod shrunk.
async fn quota_holds_while_pods_hold(bed: &Bed) {
    let ns = names::namespace::tenant(CONSUMER);
    let theirs = bed.consumer_shadows().await;
    let tenant = || async {
        bed.provider
            .get_json("tenant", Some(&ns), CONSUMER)
            .expect("the consumer's Tenant")["status"]
            .clone()
    };
    let shadow = |name: &str, cpu: String| raw_shadow(name, &cpu);
    let milli_of = |v: &Value| fabric_tests::quantity::milli(v.as_str().unwrap_or("0")).unwrap();
    // All the CPU left of the grant, taken by one pod that runs.
    let granted = bed.granted_cpu_milli().await;
    let free = bed
        .eventually("a settled usage", || async {
            let st = tenant().await;
            let pending = st["pending"].as_array().is_some_and(|p| !p.is_empty());
            (!pending).then(|| granted - milli_of(&st["used"]["cpu"]))
        })
        .await;
    // Room for one more tiny pod, to see the usage recounted below.
    assert!(free > 20, "{free}m left");
    let all = format!("{}m", free - 10);
    bed.eventually("hoard admitted", || async {
        theirs
            .create(&Default::default(), &shadow("hoard", all.clone()))
            .await
            .ok()
    })
    .await;
    bed.eventually("hoard's real pod", || async {
        bed.remote_pods().get_opt("hoard").await.ok()?
    })
    .await;
    let kubelet_holds = |cpu: String| async move {
        let status = json!({"status": {"phase": "Running",
            "containerStatuses": [{"name": "main", "image": "echo", "imageID": "", "ready": true,
                "restartCount": 0, "allocatedResources": {"cpu": cpu},
                "state": {"running": {"startedAt": "2026-11-26T12:00:01Z"}}}]}});
        bed.remote_pods()
            .patch_status("hoard", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    };
    kubelet_holds(all.clone()).await;

    // A renamed container the running pod cannot take: refused, nothing freed.
    let renamed = json!({"spec": {"pod": {"spec": {"containers": [
        {"name": "other", "image": "echo", "resources": {"requests": {"cpu": "1m"}}}]}}}});
    let e = theirs
        .patch("hoard", &PatchParams::default(), &Patch::Merge(renamed))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("spec.pod.spec.containers[0].name: the pod runs"),
        "{e}"
    );

    // Shrunk to 1m: admitted and carried to the real pod, whose kubelet still holds all.
    theirs
        .patch(
            "hoard",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pod": {"spec": {"containers": [
                {"name": "main", "image": "echo", "resources": {"requests": {"cpu": "1m"}}}]}}}})),
        )
        .await
        .unwrap();
    bed.eventually("the real pod resized, the hold recorded", || async {
        let pod = bed.remote_pods().get("hoard").await.ok()?;
        let spec = serde_json::to_value(pod.spec?).ok()?;
        let s = bed.shadows().get("hoard").await.ok()?;
        let held = s.status?.reserved.get("cpu").map(|q| q.0.clone())?;
        let held = fabric_tests::quantity::milli(&held).ok()?;
        (cpu_of(&spec) == Some("1m") && held == free - 10).then_some(())
    })
    .await;
    // Once the usage is recounted after the shrink (a later creation's pending charge
    // cleared), what is free is still nothing.
    bed.eventually("probe admitted", || async {
        theirs
            .create(&Default::default(), &shadow("probe", "1m".into()))
            .await
            .ok()
    })
    .await;
    bed.eventually("the usage recounted", || async {
        let st = tenant().await;
        st["pending"]
            .as_array()
            .is_none_or(|p| p.is_empty())
            .then_some(())
    })
    .await;
    let e = theirs
        .create(
            &Default::default(),
            &shadow("more", format!("{}m", free / 2)),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("granted to consumer"), "{e}");

    // The kubelet reports the shrink: the share is free again.
    kubelet_holds("1m".into()).await;
    bed.eventually("more admitted once the pod has shrunk", || async {
        theirs
            .create(
                &Default::default(),
                &shadow("more", format!("{}m", free / 2)),
            )
            .await
            .ok()
    })
    .await;
    for name in ["hoard", "probe", "more"] {
        bed.shadows()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    bed.eventually("the hoard gone", || async {
        let left = bed.shadows().list(&ListParams::default()).await.ok()?;
        (!left.items.iter().any(|s| {
            ["hoard", "probe", "more"].contains(&s.metadata.name.as_deref().unwrap_or_default())
        }))
        .then_some(())
    })
    .await;
}

/// The provider's admin holds this tenant to `restricted` (its Tenant's `podSecurity`, which
/// the consumer can read but not write): a pod baseline allows is refused to the consumer's
/// own identity by the webhook, and never made by the controller even when stored past the
/// webhook (by the admin, whom the webhook does not see).
async fn a_tenant_held_to_restricted(bed: &Bed) {
    let ns = names::namespace::tenant(CONSUMER);
    let set = |level: Value| {
        bed.provider.kubectl_ok(&[
            "patch",
            "tenant",
            CONSUMER,
            "-n",
            &ns,
            "--type=merge",
            "-p",
            &json!({"spec": {"podSecurity": level}}).to_string(),
        ]);
    };
    let theirs = bed.consumer_shadows().await;
    // The consumer cannot lower it.
    let e = Api::<fabric_api::authentication::v1alpha1::Tenant>::namespaced(
        theirs.clone().into_client(),
        &ns,
    )
    .patch(
        CONSUMER,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"podSecurity": "baseline"}})),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("forbidden"), "{e}");
    set(json!("restricted"));
    // Root, as baseline allows and restricted does not.
    let root = |name: &str| raw_shadow(name, "1m");
    let e = bed
        .eventually("the webhook holds the tenant to restricted", || async {
            match theirs.create(&Default::default(), &root("rooted")).await {
                Err(kube::Error::Api(e)) if e.message.contains("restricted") => Some(e.message),
                Err(_) => None,
                Ok(_) => panic!("a root pod admitted for a restricted tenant"),
            }
        })
        .await;
    assert!(
        e.contains("spec.pod.spec.containers[0]") && e.contains("(provider policy restricted)"),
        "{e}"
    );
    bed.shadows()
        .create(&Default::default(), &root("admin-rooted"))
        .await
        .unwrap();
    let s = bed
        .eventually("the controller refuses it too", || async {
            let s = bed.shadows().get("admin-rooted").await.ok()?;
            let st = s.status?;
            st.conditions
                .iter()
                .find(|c| c.reason == "Disallowed")
                .map(|c| c.message.clone())
        })
        .await;
    assert!(s.contains("(provider policy restricted)"), "{s}");
    assert!(
        bed.remote_pods()
            .get_opt("admin-rooted")
            .await
            .unwrap()
            .is_none()
    );
    bed.shadows()
        .delete("admin-rooted", &DeleteParams::default())
        .await
        .unwrap();
    set(Value::Null);
}

/// A remote container that cannot start: its state comes home, with a Warning Event.
async fn image_pull_failure(bed: &Bed) {
    // A remote container that cannot start (its image does not pull on the provider): its
    // state comes home, and a Warning Event says so where `kubectl describe pod` shows it.
    let bad = bed.offloaded("badimage", json!({})).await;
    let pull = json!({"status": {
        "phase": "Pending",
        "containerStatuses": [{"name": "main", "image": "registry.invalid/web:1", "imageID": "",
                               "ready": false, "restartCount": 0,
                               "state": {"waiting": {"reason": "ErrImagePull",
                                   "message": "lookup registry.invalid: no such host"}}}],
    }});
    bed.remote_pods()
        .patch_status(&bad, &PatchParams::default(), &Patch::Merge(&pull))
        .await
        .unwrap();
    bed.home_pod_where("badimage", "ErrImagePull at home", |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
    })
    .await;
    bed.event(
        &bed.consumer,
        HOME_NS,
        "the failed pull's Event at home",
        |e| {
            e["reason"] == "Failed"
                && e["type"] == "Warning"
                && e["regarding"]["name"] == "badimage"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("ErrImagePull: lookup registry.invalid"))
        },
    )
    .await;
}

/// Deleted at home: gracefully through the provider; forced, at once, its ShadowPod following.
async fn deleted_at_home(bed: &Bed) {
    let web = forge::name(HOME_NS, "web");
    let bad = forge::name(HOME_NS, "badimage");
    // Deleted at home: gracefully through the provider, and the home pod goes once the
    // remote one is gone. Forced (no grace period), the home pod is gone at once: its
    // ShadowPod follows on that event, well before the virtual kubelet's periodic collection
    // of orphans (30 s) would find it.
    bed.consumer
        .kubectl_ok(&["delete", "pod", "web", "-n", HOME_NS, "--wait=false"]);
    bed.consumer.kubectl_ok(&[
        "delete",
        "pod",
        "badimage",
        "-n",
        HOME_NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    for (name, remote, limit) in [
        ("badimage", &bad, Duration::from_secs(10)),
        ("web", &web, T),
    ] {
        bed.within(
            "the pod, its ShadowPod and real pod gone",
            limit,
            || async {
                let home = bed.home().get_opt(name).await.ok()?;
                let shadow = bed.shadows().get_opt(remote).await.ok()?;
                let real = bed.remote_pods().get_opt(remote).await.ok()?;
                (home.is_none() && shadow.is_none() && real.is_none()).then_some(())
            },
        )
        .await;
    }
}

/// The partition time asked for, and when the consumer fails its pods after its last
/// renewal: partition + grace (0) + the virtual kubelet's margin (5 s + a tenth).
const PARTITION: Duration = Duration::from_secs(5);
const AT_MOST_ONCE_DEADLINE: Duration = Duration::from_millis(10_500);

/// At-most-once on: asked in a slice, agreed by the provider, carried by the VirtualNode.
/// The provider's API cut: the provider stops the pod after the partition time (ShadowPod
/// Failed/Partitioned, an Event, not re-created); the consumer fails it at home only later;
/// healed, nothing comes back or runs twice, and new pods run again.
async fn at_most_once(bed: &Bed) {
    let tenant_ns = names::namespace::tenant(CONSUMER);
    // A pod running before at-most-once is agreed: not stopped for a silence from before the
    // terms. Without them the heartbeat is renewed every 10 s; the terms are agreed while it
    // is older than their partition time.
    let steady = bed.running("steady", json!({}), "10.244.2.12").await;
    bed.eventually("the heartbeat older than the partition time", || async {
        let l = bed
            .provider
            .get_json("lease", Some(&tenant_ns), names::lease::CONSUMER)?;
        let renewed: k8s_openapi::jiff::Timestamp =
            l["spec"]["renewTime"].as_str()?.parse().ok()?;
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed);
        let age = Duration::try_from(age).ok()?;
        (age > PARTITION + Duration::from_millis(500) && age < Duration::from_millis(8_500))
            .then_some(())
    })
    .await;
    apply(
        &bed.provider,
        &json!({ "apiVersion": "authentication.fabric.io/v1alpha1", "kind": "ResourceSlice",
                 "metadata": { "name": "fenced", "namespace": tenant_ns },
                 "spec": { "consumerClusterId": CONSUMER, "providerClusterId": PROVIDER,
                           "resources": { "cpu": "1" },
                           "atMostOnce": { "partitionSeconds": 1, "graceSeconds": 60 } } }),
    );
    // The provider agrees within its bounds (at least 5 s, at most 30 s of grace).
    let agreed = bed
        .eventually("the provider's at-most-once terms", || async {
            let o = bed.provider.kubectl(&[
                "get",
                "resourceslice",
                "fenced",
                "-n",
                &tenant_ns,
                "-o",
                "jsonpath={.status.atMostOnce}",
            ]);
            let v: Value = serde_json::from_slice(&o.stdout).ok()?;
            v.is_object().then_some(v)
        })
        .await;
    assert_eq!(agreed, json!({ "partitionSeconds": 5, "graceSeconds": 30 }));
    // What the consumer's slice controller carries to the VirtualNode; 0 s of grace here (as
    // if a second slice agreed to that: the provider enforces the strictest terms).
    apply(
        &bed.provider,
        &json!({ "apiVersion": "authentication.fabric.io/v1alpha1", "kind": "ResourceSlice",
                 "metadata": { "name": "fenced", "namespace": tenant_ns },
                 "spec": { "consumerClusterId": CONSUMER, "providerClusterId": PROVIDER,
                           "resources": { "cpu": "1" },
                           "atMostOnce": { "partitionSeconds": 5, "graceSeconds": 0 } } }),
    );
    bed.eventually("the provider's terms with no grace", || async {
        let o = bed.provider.kubectl(&[
            "get",
            "resourceslice",
            "fenced",
            "-n",
            &tenant_ns,
            "-o",
            "jsonpath={.status.atMostOnce.graceSeconds}",
        ]);
        (String::from_utf8_lossy(&o.stdout).trim() == "0").then_some(())
    })
    .await;
    bed.consumer.kubectl_ok(&[
        "patch",
        "virtualnode",
        PROVIDER,
        "-n",
        NS,
        "--type=merge",
        "-p",
        r#"{"spec":{"atMostOnce":{"partitionSeconds":5,"graceSeconds":0}}}"#,
    ]);
    // The heartbeat, through the consumer's identity (the tenant Role allows that Lease).
    bed.eventually("the consumer's heartbeat Lease on the provider", || async {
        let o = bed
            .provider
            .kubectl(&["get", "lease", names::lease::CONSUMER, "-n", &tenant_ns]);
        o.status.success().then_some(())
    })
    .await;

    let solo = bed.offloaded("solo", json!({})).await;
    bed.provider_runs(&solo, "10.244.2.9", 0).await;
    bed.home_pod_where("solo", "solo Running and Ready", |p| {
        p["status"]["phase"] == "Running" && cond_is(p, "Ready", "True", None)
    })
    .await;
    let st = bed.shadows().get(&steady).await.unwrap().status;
    assert_ne!(
        st.unwrap_or_default().reason.as_deref(),
        Some("Partitioned"),
        "{}",
        bed.logs()
    );
    assert!(bed.remote_pods().get_opt(&steady).await.unwrap().is_some());
    // Heartbeats keep it running past the partition time.
    tokio::time::sleep(PARTITION + Duration::from_secs(2)).await;
    assert!(
        bed.remote_pods().get_opt(&solo).await.unwrap().is_some(),
        "{}",
        bed.logs()
    );
    let shadow_uid = bed.shadows().get(&solo).await.unwrap().metadata.uid;
    let shadows_before = bed.shadow_count().await;

    // Cut: the provider stops the pod first, then (and only then) the consumer fails it.
    let dead = identity::Credentials {
        api_server_url: "https://127.0.0.1:9".into(),
        ..bed.identity.clone()
    };
    bed.set_identity(&dead);
    let cut = Instant::now();
    let mut stopped_at = None;
    let failed_at = loop {
        assert!(
            cut.elapsed() < T,
            "not stopped and failed within {T:?}
{}",
            bed.logs()
        );
        let home = serde_json::to_value(bed.home().get("solo").await.unwrap()).unwrap();
        let shadow = bed.shadows().get(&solo).await.unwrap();
        let real = bed.remote_pods().get_opt(&solo).await.unwrap();
        let st = shadow.status.clone().unwrap_or_default();
        if stopped_at.is_none() && real.is_none() && st.reason.as_deref() == Some("Partitioned") {
            assert_eq!(st.phase.as_deref(), Some("Failed"));
            stopped_at = Some(cut.elapsed());
        }
        if home["status"]["phase"] == "Failed" {
            assert!(
                stopped_at.is_some(),
                "failed at home before the provider stopped it: {home}
{shadow:?}"
            );
            assert_eq!(home["status"]["reason"], "ProviderPartitioned", "{home}");
            break cut.elapsed();
        }
        assert_eq!(home["status"]["phase"], "Running", "{home}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let stopped_at = stopped_at.unwrap();
    // The provider counts from the last renewal it saw (at most a second before the cut).
    assert!(
        stopped_at >= PARTITION - Duration::from_secs(2),
        "stopped after {stopped_at:?}"
    );
    assert!(
        failed_at >= AT_MOST_ONCE_DEADLINE - Duration::from_secs(2),
        "{failed_at:?}"
    );
    bed.event(
        &bed.provider,
        &tenant_ns,
        "the Partitioned Event on the ShadowPod",
        |e| e["reason"] == "Partitioned" && e["regarding"]["name"] == solo.as_str(),
    )
    .await;

    // Healed: nothing revived on either side, nothing duplicated; a new pod runs.
    bed.set_identity(&bed.identity);
    bed.eventually("the virtual node Ready again", || async {
        let n = bed.consumer.get_json("node", None, NODE)?;
        cond_is(&n, "Ready", "True", None).then_some(())
    })
    .await;
    // Running once healed.
    bed.running("after", json!({}), "10.244.2.10").await;
    let home = serde_json::to_value(bed.home().get("solo").await.unwrap()).unwrap();
    assert_eq!(home["status"]["phase"], "Failed", "{home}");
    assert_eq!(home["status"]["reason"], "ProviderPartitioned", "{home}");
    let shadow = bed.shadows().get(&solo).await.unwrap();
    assert_eq!(shadow.metadata.uid, shadow_uid);
    assert_eq!(
        shadow.status.unwrap().reason.as_deref(),
        Some("Partitioned")
    );
    assert!(bed.remote_pods().get_opt(&solo).await.unwrap().is_none());
    assert_eq!(bed.shadow_count().await, shadows_before + 1);
}

/// The provider's `--finished-retention` and `--drain-grace` in [`what_a_consumer_leaves`].
const RETENTION: Duration = Duration::from_secs(5);
const DRAIN_GRACE: Duration = Duration::from_secs(8);

/// What a consumer leaves on the provider, the provider removes by itself: finished ShadowPods
/// after the retention (the home pod keeps the status it ended with), and a drained tenant's
/// ShadowPods after the drain grace, written by the consumer's own identity and never deleted
/// by it (no virtual kubelet takes them).
#[tokio::test]
async fn what_a_consumer_leaves_the_provider_removes() {
    let retention = format!("{}s", RETENTION.as_secs());
    let grace = format!("{}s", DRAIN_GRACE.as_secs());
    let Some(bed) = phase_async(
        "the bed, the provider's lifetimes short",
        setup(
            "leaves",
            &["--finished-retention", &retention, "--drain-grace", &grace],
        ),
    )
    .await
    else {
        return;
    };
    phase_async("the virtual node Ready", virtual_node_ready(&bed)).await;
    phase_async(
        "a finished pod's ShadowPod collected, its home pod as it ended",
        finished_collected(&bed),
    )
    .await;
    phase_async(
        "a finished pod whose end the consumer has not recorded is kept",
        unrecorded_end_kept(&bed),
    )
    .await;
    phase_async(
        "a tenant set back before the drain grace loses nothing",
        undrained_within_the_grace(&bed),
    )
    .await;
    phase_async(
        "a drained tenant's ShadowPods stopped by the provider",
        drained_tenant_stopped(&bed),
    )
    .await;
}

/// The Tenant as the provider's admin sees it.
fn tenant(bed: &Bed) -> Value {
    let o = bed.provider.kubectl(&[
        "get",
        "tenant",
        CONSUMER,
        "-n",
        &names::namespace::tenant(CONSUMER),
        "-o",
        "json",
    ]);
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

/// The provider's admin sets the tenant's state.
fn set_tenant_state(bed: &Bed, state: &str) {
    bed.provider.kubectl_ok(&[
        "patch",
        "tenant",
        CONSUMER,
        "-n",
        &names::namespace::tenant(CONSUMER),
        "--type=merge",
        "-p",
        &json!({ "spec": { "state": state } }).to_string(),
    ]);
}

/// The tenant's Drained condition once it says `status` (and `reason`).
async fn drained_condition(bed: &Bed, status: &str, reason: Option<&str>) -> Value {
    bed.within("the Tenant's Drained condition", T * 2, || async {
        let t = tenant(bed);
        cond_is(&t, "Drained", status, reason).then(|| condition(&t, "Drained").unwrap().clone())
    })
    .await
}

/// Checks that `period` has passed since `start` (less a second: the provider records its
/// start in whole seconds).
#[track_caller]
fn not_before(start: k8s_openapi::jiff::Timestamp, period: Duration, what: &str) {
    let after = k8s_openapi::jiff::Timestamp::now()
        .duration_since(start)
        .unsigned_abs();
    assert!(
        after + Duration::from_secs(1) >= period,
        "{what} {after:?} later, before {period:?}"
    );
}

fn since(c: &Value) -> k8s_openapi::jiff::Timestamp {
    c["lastTransitionTime"].as_str().unwrap().parse().unwrap()
}

/// A home pod runs to completion; its ShadowPod goes `RETENTION` after that (and the real
/// pod with it, and its count on the Tenant), while the home pod stays Succeeded, not failed
/// for a vanished ShadowPod, not offloaded again.
async fn finished_collected(bed: &Bed) {
    let once = bed
        .running("once", json!({ "restartPolicy": "Never" }), "10.244.2.11")
        .await;
    // The pod's end is recorded when the provider's controller sees it, not before this.
    let finishing = k8s_openapi::jiff::Timestamp::now();
    bed.provider_finishes(&once).await;
    let done = bed
        .home_pod_where("once", "once Succeeded at home", |p| {
            p["status"]["phase"] == "Succeeded"
        })
        .await;
    let counted = bed
        .eventually("the finished ShadowPod counted on the Tenant", || async {
            let n = tenant(bed)["status"]["shadowPods"].as_u64()?;
            (n >= 1).then_some(n)
        })
        .await;
    bed.within("the finished ShadowPod collected", T * 2, || async {
        bed.shadows()
            .get_opt(&once)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    not_before(finishing, RETENTION, "collected after the pod finished");
    bed.eventually("the real pod gone with it", || async {
        bed.remote_pods()
            .get_opt(&once)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    bed.eventually("the Tenant's count down", || async {
        let n = tenant(bed)["status"]["shadowPods"].as_u64()?;
        (n < counted).then_some(())
    })
    .await;
    // At home, the pod stays as it ended, and nothing offloads it again.
    for _ in 0..10 {
        let home = serde_json::to_value(bed.home().get("once").await.unwrap()).unwrap();
        assert_eq!(
            home["status"]["phase"],
            "Succeeded",
            "{home}\n{}",
            bed.logs()
        );
        assert_eq!(home["status"]["reason"], done["status"]["reason"], "{home}");
        assert!(
            bed.shadows().get_opt(&once).await.unwrap().is_none(),
            "offloaded again\n{}",
            bed.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A ShadowPod whose pod finished while its consumer was away (no virtual kubelet wrote it,
/// none records its end) outlives the retention, so that the consumer can still learn how
/// it ended; recorded (the annotation the virtual kubelet writes), it goes.
async fn unrecorded_end_kept(bed: &Bed) {
    squat(bed, "away").await;
    let real = bed
        .eventually("away's real pod", || async {
            bed.remote_pods().get_opt("away").await.ok()?
        })
        .await;
    assert_eq!(real.metadata.name.as_deref(), Some("away"));
    bed.provider_finishes("away").await;
    let shadows = bed.consumer_shadows().await;
    bed.eventually("away's end recorded by the provider", || async {
        let s = shadows.get_opt("away").await.ok()??;
        s.status?.finished_at.map(|_| ())
    })
    .await;
    tokio::time::sleep(RETENTION + Duration::from_secs(3)).await;
    let kept = shadows.get_opt("away").await.unwrap();
    assert!(
        kept.is_some(),
        "collected before its consumer recorded how it ended\n{}",
        bed.logs()
    );
    let patch =
        json!({"metadata": {"annotations": {names::annotation::HOME_RECORDED: "Succeeded"}}});
    shadows
        .patch("away", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    bed.within("away collected once recorded", T, || async {
        shadows.get_opt("away").await.ok()?.is_none().then_some(())
    })
    .await;
}

/// A ShadowPod as the consumer's identity writes it straight to the provider, asking for
/// little, admitted (the grant may take a moment to come back after a drain).
async fn squat(bed: &Bed, name: &str) {
    let theirs = bed.consumer_shadows().await;
    bed.within(&format!("{name} admitted"), T * 2, || async {
        theirs
            .create(&Default::default(), &raw_shadow(name, "1m"))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

/// Drained, then set back to Active within the grace: the tenant's ShadowPods stay.
async fn undrained_within_the_grace(bed: &Bed) {
    squat(bed, "kept").await;
    set_tenant_state(bed, "Drained");
    let drained = drained_condition(bed, "True", Some("Draining")).await;
    set_tenant_state(bed, "Active");
    let back = drained_condition(bed, "False", Some("NotDrained")).await;
    let start = since(&drained);
    let undrained = since(&back).duration_since(start).unsigned_abs();
    if undrained >= DRAIN_GRACE {
        eprintln!("set back {undrained:?} after the drain, past the grace: nothing to check");
        return;
    }
    tokio::time::sleep(DRAIN_GRACE + Duration::from_secs(3)).await;
    let kept = bed.shadows().get_opt("kept").await.unwrap();
    assert!(
        kept.is_some_and(|k| k.metadata.deletion_timestamp.is_none()),
        "deleted although the tenant was set back within the grace\n{}",
        bed.logs()
    );
}

/// Drained: the consumer's identity writes nothing new, and the provider deletes the
/// tenant's ShadowPods after the grace (their pods with them), says so on the Tenant, and
/// nothing of the consumer's is needed for it.
async fn drained_tenant_stopped(bed: &Bed) {
    squat(bed, "squatter").await;
    bed.offloaded("late", json!({})).await;
    // The consumer's virtual kubelet cannot reach the provider: nothing at home deletes
    // anything there.
    bed.set_identity(&identity::Credentials {
        api_server_url: "https://127.0.0.1:9".into(),
        ..bed.identity.clone()
    });
    // The drain is recorded when the provider's controller sees it, not before this.
    let drained_at = k8s_openapi::jiff::Timestamp::now();
    set_tenant_state(bed, "Drained");
    bed.within(
        "the drained tenant's ShadowPods deleted by the provider",
        T * 2,
        || async {
            let left = bed.shadows().list(&ListParams::default()).await.ok()?;
            left.items.is_empty().then_some(())
        },
    )
    .await;
    not_before(drained_at, DRAIN_GRACE, "deleted after the drain");
    bed.eventually("their pods gone", || async {
        let left = bed.remote_pods().list(&ListParams::default()).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    drained_condition(bed, "True", Some("Stopped")).await;
    bed.event(
        &bed.provider,
        &names::namespace::tenant(CONSUMER),
        "the PodsStopped Event on the Tenant",
        |e| e["reason"] == "PodsStopped" && e["regarding"]["kind"] == "Tenant",
    )
    .await;
    // A new ShadowPod of a drained tenant is refused, saying why.
    let theirs = bed.consumer_shadows().await;
    let refused = theirs
        .create(&Default::default(), &raw_shadow("again", "1m"))
        .await
        .expect_err("a drained tenant's new ShadowPod admitted");
    assert!(refused.to_string().contains("is drained"), "{refused}");
}

/// The offloaded namespace of the third fixture.
const STORE: &str = "store";

/// Its twin on the provider, as the consumer's controller names it (`DefaultName`).
fn store_twin() -> String {
    format!("{STORE}-{CONSUMER}")
}

/// Namespace offloading, the virtual kubelet's side (issue 20), on the first fixture's bed: the
/// consumer's NamespaceOffloading controller is stood in for by writing what it writes (the
/// NamespaceOffloading at home, by the user; the NamespaceMap on the provider, with the
/// consumer's own identity); the provider's twin controller (in `fabric-controller sharing`)
/// makes the twin. A pod of the offloaded namespace runs in the twin under its own name, its
/// referenced ConfigMap and Secret (and the root CA bundle, renamed) reflected there and
/// nothing else, kept as they change; the virtual kubelet reads the ConfigMaps and Secrets of
/// offloaded namespaces only; a pod of an offloaded namespace without a twin waits saying why;
/// the twin removed, the pod that ran there fails (`OffloadingAborted`).
#[tokio::test]
async fn an_offloaded_namespace_runs_in_its_twin_with_its_configuration() {
    let Some(bed) = phase_async("the bed", setup("twin-pods", &[])).await else {
        return;
    };
    phase_async("the virtual node Ready", virtual_node_ready(&bed)).await;
    phase_async("a pod and its configuration in the twin", async {
        bed.consumer.kubectl_ok(&["create", "namespace", STORE]);
        apply(
            &bed.consumer,
            &json!({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceOffloading",
                 "metadata": {"name": "offloading", "namespace": STORE}, "spec": {}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "settings", "namespace": STORE}, "data": {"greeting": "hello"}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "unused", "namespace": STORE}, "data": {"x": "y"}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "kube-root-ca.crt", "namespace": STORE}, "data": {"ca.crt": "home CA"}},
                {"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "db", "namespace": STORE}, "stringData": {"password": "s3cret"}},
            ]}),
        );
        set_map(&bed, &[(STORE, &store_twin())]).await;
        let twin = store_twin();
        bed.eventually("the twin made by the provider", || async {
            let o = bed.provider.kubectl(&["get", "namespace", &twin]);
            o.status.success().then_some(())
        })
        .await;
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "web", "namespace": STORE },
            "spec": {
                "nodeName": NODE,
                "tolerations": [{ "key": names::taint::VIRTUAL_NODE, "operator": "Exists" }],
                "containers": [{ "name": "main", "image": "echo",
                    "command": ["fabric-test-pod", "echo"],
                    "env": [{"name": "G", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                    "envFrom": [{"secretRef": {"name": "db"}}],
                    "volumeMounts": [{"name": "info", "mountPath": "/info"}] }],
                "volumes": [{"name": "info", "downwardAPI": {"items": [
                    {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}],
            },
        });
        pod["spec"]["terminationGracePeriodSeconds"] = json!(5);
        apply(&bed.consumer, &pod);
        let in_twin = |kind: &'static str, name: &'static str| {
            let twin = twin.clone();
            let provider = &bed.provider;
            async move { provider.get_json(kind, Some(&twin), name) }
        };
        let shadow = bed
            .eventually("web's ShadowPod in the twin, under its own name", || {
                in_twin("shadowpod", "web")
            })
            .await;
        assert_eq!(shadow["spec"]["home"]["namespace"], STORE, "{shadow}");
        let real = bed
            .eventually("web's real pod in the twin", || in_twin("pod", "web"))
            .await;
        // The downward API's namespace is the home one, not the twin's: a literal in the
        // environment, the pod's own annotation in volumes.
        let env = &real["spec"]["containers"][0]["env"];
        assert_eq!(env[1], json!({"name": "NS", "value": STORE}), "{env}");
        let home = names::annotation::POD_HOME_NAMESPACE;
        assert_eq!(real["metadata"]["annotations"][home], STORE, "{real}");
        assert_eq!(
            real["spec"]["volumes"][0]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            format!("metadata.annotations['{home}']"),
            "{real}"
        );
        let settings = bed
            .eventually("the referenced ConfigMap in the twin", || {
                in_twin("configmap", "settings")
            })
            .await;
        assert_eq!(settings["data"]["greeting"], "hello");
        assert_eq!(settings["metadata"]["labels"][REFLECTED_FROM], CONSUMER, "{settings}");
        let db = bed
            .eventually("the referenced Secret in the twin", || in_twin("secret", "db"))
            .await;
        assert_eq!(db["data"]["password"], "czNjcmV0", "{db}");
        let ca = bed
            .eventually("the root CA bundle, renamed", || {
                in_twin("configmap", "fabric-home.kube-root-ca.crt")
            })
            .await;
        assert_eq!(ca["data"]["ca.crt"], "home CA");
        assert!(in_twin("configmap", "unused").await.is_none(), "not referenced: stays home");
        assert!(
            in_twin("configmap", "kube-root-ca.crt").await.is_none(),
            "the provider's own name is not ours to write"
        );
        // Kept as it changes at home.
        bed.consumer.kubectl_ok(&[
            "patch", "configmap", "settings", "-n", STORE, "--type=merge",
            "-p", r#"{"data":{"greeting":"hello again"}}"#,
        ]);
        bed.eventually("the change in the twin", || async {
            let s = in_twin("configmap", "settings").await?;
            (s["data"]["greeting"] == "hello again").then_some(())
        })
        .await;
        // Its status comes home from the twin.
        let twin_pods: Api<Pod> = Api::namespaced(bed.p.clone(), &twin);
        let ip = "10.244.3.30";
        let status = json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }});
        twin_pods
            .patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        bed.eventually("web Running at home", || async {
            let p = Api::<Pod>::namespaced(bed.c.clone(), STORE).get_opt("web").await.ok()??;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
    })
    .await;
    phase_async(
        "a pod's service-account token, from home, in the twin",
        async { service_account_tokens(&bed).await },
    )
    .await;
    phase_async("the consumer writes no token Secret in its twin", async {
        let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, &bed.identity));
        let client = identity::client_from_kubeconfig(&kubeconfig).await.unwrap();
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(client, &store_twin());
        let token: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {"name": "mint", "annotations": {"kubernetes.io/service-account.name": "default"}},
            "type": "kubernetes.io/service-account-token",
        }))
        .unwrap();
        let err = secrets
            .create(&Default::default(), &token)
            .await
            .expect_err("a token Secret written by the consumer on its provider");
        assert!(
            err.to_string().contains("no service-account token Secret"),
            "{err}"
        );
    })
    .await;
    phase_async("the twin's Events come home, updates included", async {
        // The provider's kubelet, played: a repeated Warning about the real pod.
        let event = |count: i32| {
            json!({
                "apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "web.backoff", "namespace": store_twin()},
                "eventTime": "2026-11-27T12:00:00.000000Z",
                "reportingController": "kubelet", "reportingInstance": "n1",
                "action": "Restarting", "reason": "BackOff", "type": "Warning",
                "note": "Back-off restarting failed container main",
                "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": store_twin()},
                "series": {"count": count, "lastObservedTime": "2026-11-27T12:00:05.000000Z"},
            })
        };
        apply(&bed.provider, &event(2));
        let home_uid = Api::<Pod>::namespaced(bed.c.clone(), STORE)
            .get("web")
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap();
        let seen = |count: i64| {
            let consumer = &bed.consumer;
            let uid = home_uid.clone();
            async move {
                let o = consumer.kubectl(&[
                    "get", "events.events.k8s.io", "web.backoff", "-n", STORE, "-o", "json",
                ]);
                let v: Value = serde_json::from_slice(&o.stdout).ok()?;
                (v["regarding"]["uid"] == uid.as_str() && v["series"]["count"] == count)
                    .then_some(v)
            }
        };
        let home = bed.eventually("the Event on the home pod", || seen(2)).await;
        assert_eq!(home["reason"], "BackOff", "{home}");
        apply(&bed.provider, &event(5));
        bed.eventually("the Event's series at home", || seen(5)).await;
    })
    .await;
    phase_async("the Services' endpoints in the twin, translated", async {
        services_endpoints_translated(&bed).await
    })
    .await;
    phase_async(
        "a consumer cannot point a Service in its twin at the provider's addresses",
        async { endpoints_attack(&bed).await },
    )
    .await;
    phase_async("a slice deleted at home goes from the provider", async {
        bed.consumer
            .kubectl_ok(&["delete", "endpointslice", "db-abcde", "-n", STORE]);
        let twin = store_twin();
        for (kind, name) in [
            ("shadowendpointslice", "db-abcde"),
            ("endpointslice", "db-abcde-fabric"),
        ] {
            bed.eventually(&format!("the {kind} gone from the twin"), || async {
                let o = bed.provider.kubectl(&["get", kind, name, "-n", &twin]);
                (!o.status.success()).then_some(())
            })
            .await;
        }
    })
    .await;
    phase_async(
        "the virtual kubelet reads configuration of offloaded namespaces only",
        async {
            let vk = format!(
                "system:serviceaccount:{NS}:{}",
                fixture::virtual_kubelet_name()
            );
            let can = |ns: &str| {
                ["secrets", "services"].map(|what| {
                    let o = bed
                        .consumer
                        .kubectl(&["auth", "can-i", "list", what, "-n", ns, "--as", &vk]);
                    String::from_utf8_lossy(&o.stdout).trim() == "yes"
                })
            };
            assert_eq!(
                can(STORE),
                [true; 2],
                "{vk} reads the Secrets and Services of {STORE}"
            );
            let o = bed.consumer.kubectl(&[
                "auth",
                "can-i",
                "watch",
                "endpointslices.discovery.k8s.io",
                "-n",
                STORE,
                "--as",
                &vk,
            ]);
            assert_eq!(
                String::from_utf8_lossy(&o.stdout).trim(),
                "yes",
                "{vk} watches the EndpointSlices of {STORE}"
            );
            assert_eq!(
                can(HOME_NS),
                [false; 2],
                "{vk} reads the Secrets or Services of {HOME_NS}, not offloaded"
            );
            assert_eq!(can("default"), [false; 2]);
        },
    )
    .await;
    phase_async("a pod of an offloaded namespace without a twin waits, saying why", async {
        bed.consumer.kubectl_ok(&["create", "namespace", "later"]);
        apply(
            &bed.consumer,
            &json!({"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceOffloading",
                    "metadata": {"name": "offloading", "namespace": "later"}, "spec": {}}),
        );
        apply(
            &bed.consumer,
            &json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "waiting", "namespace": "later"},
                    "spec": {"nodeName": NODE,
                             "tolerations": [{"key": names::taint::VIRTUAL_NODE, "operator": "Exists"}],
                             "containers": [{"name": "main", "image": "echo"}]}}),
        );
        let pod = bed
            .eventually("waiting says why", || async {
                let p = Api::<Pod>::namespaced(bed.c.clone(), "later").get_opt("waiting").await.ok()??;
                let v = serde_json::to_value(&p).unwrap();
                cond_is(&v, OFFLOADED, "False", Some("NoTwinNamespace")).then_some(v)
            })
            .await;
        assert_eq!(pod["status"]["phase"], "Pending", "{pod}");
        let tenant: Api<ShadowPod> = bed.shadows();
        assert!(
            tenant.get_opt(&forge::name("later", "waiting")).await.unwrap().is_none(),
            "not offloaded pod by pod instead"
        );
    })
    .await;
    phase_async("the twin removed: its pod fails at home", async {
        set_map(&bed, &[]).await;
        let twin = store_twin();
        bed.eventually("the twin gone", || async {
            let o = bed.provider.kubectl(&["get", "namespace", &twin]);
            (!o.status.success()).then_some(())
        })
        .await;
        let pod = bed
            .eventually("web failed", || async {
                let p = Api::<Pod>::namespaced(bed.c.clone(), STORE)
                    .get_opt("web")
                    .await
                    .ok()??;
                let v = serde_json::to_value(&p).unwrap();
                (v["status"]["phase"] == "Failed").then_some(v)
            })
            .await;
        assert_eq!(pod["status"]["reason"], "OffloadingAborted", "{pod}");
    })
    .await;
}

/// A Service of the twin as the provider's admin reads it (None: not there).
fn service_in_twin(bed: &Bed, name: &str) -> Option<Value> {
    bed.provider.get_json("service", Some(&store_twin()), name)
}

/// Services of an offloaded namespace in its twin (issue 20), on the third fixture's bed: each
/// with the provider's own cluster IP (headless stays headless, an ExternalName stays one, a
/// NodePort is a ClusterIP there with a Warning at home), following a port change, deleted
/// with the home Service; one of that name the fabric did not make left alone with a Warning at
/// home; what the consumer's own identity may not do with Services on its provider (external
/// IPs, node ports, load balancers, their status); and the
/// Services gone with the twin when the namespace is no longer offloaded there.
#[tokio::test]
async fn an_offloaded_namespace_s_services_are_in_its_twin() {
    let Some(bed) = phase_async("the bed", setup("twin-services", &[])).await else {
        return;
    };
    phase_async("the virtual node Ready", virtual_node_ready(&bed)).await;
    let twin = store_twin();
    phase_async(
        "the namespace offloaded, a Service in the way in its twin",
        async {
            offload_store(&bed, &twin).await;
            bed.eventually("the twin made by the provider", || async {
                let o = bed.provider.kubectl(&["get", "namespace", &twin]);
                o.status.success().then_some(())
            })
            .await;
            // The provider's admin's own Service, of a name the consumer uses too.
            apply(
                &bed.provider,
                &json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "theirs", "namespace": twin, "labels": {"owner": "admin"}},
                    "spec": {"ports": [{"port": 9999}]}}),
            );
        },
    )
    .await;
    let web_ip = phase_async(
        "Services in the twin, with the provider's cluster IPs",
        async {
            let service = |name: &str, spec: Value| {
                json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": name, "namespace": STORE, "labels": {"app": name}},
                   "spec": spec})
            };
            apply(
                &bed.consumer,
                &json!({"apiVersion": "v1", "kind": "List", "items": [
                    service("web", json!({"clusterIP": "10.96.200.1", "selector": {"app": "web"},
                        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]})),
                    service("db", json!({"clusterIP": "None", "selector": {"app": "db"},
                        "ports": [{"port": 5432}]})),
                    service("search", json!({"type": "ExternalName",
                        "externalName": "search.example.com"})),
                    service("front", json!({"type": "NodePort", "selector": {"app": "web"},
                        "ports": [{"port": 80, "nodePort": 30080}]})),
                    service("theirs", json!({"ports": [{"port": 80}]})),
                ]}),
            );
            let web = bed
                .eventually("web in the twin", || async { service_in_twin(&bed, "web") })
                .await;
            assert_eq!(web["metadata"]["labels"][REFLECTED_FROM], CONSUMER, "{web}");
            assert_eq!(web["metadata"]["labels"][REFLECTED_TO], PROVIDER, "{web}");
            assert_eq!(web["spec"]["selector"]["app"], "web", "{web}");
            assert_eq!(web["spec"]["ports"][0]["port"], 80, "{web}");
            assert_eq!(web["spec"]["ports"][0]["targetPort"], 8080, "{web}");
            let ip = web["spec"]["clusterIP"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                !ip.is_empty() && ip != "None" && ip != "10.96.200.1",
                "the provider's own cluster IP: {web}"
            );
            let db = bed
                .eventually("db in the twin", || async { service_in_twin(&bed, "db") })
                .await;
            assert_eq!(
                db["spec"]["clusterIP"], "None",
                "headless stays headless: {db}"
            );
            let search = bed
                .eventually("search in the twin", || async {
                    service_in_twin(&bed, "search")
                })
                .await;
            assert_eq!(search["spec"]["type"], "ExternalName", "{search}");
            assert_eq!(search["spec"]["externalName"], "search.example.com");
            let front = bed
                .eventually("front in the twin", || async {
                    service_in_twin(&bed, "front")
                })
                .await;
            assert_eq!(front["spec"]["type"], "ClusterIP", "{front}");
            assert!(front["spec"]["ports"][0]["nodePort"].is_null(), "{front}");
            bed.event(&bed.consumer, STORE, "the Warning on front at home", |e| {
                e["reason"] == "ReflectedWithChanges"
                    && e["type"] == "Warning"
                    && e["regarding"]["name"] == "front"
            })
            .await;
            // Someone else's: left alone, said at home.
            bed.event(&bed.consumer, STORE, "the Warning on theirs at home", |e| {
                e["reason"] == "FailedReflection" && e["regarding"]["name"] == "theirs"
            })
            .await;
            let theirs = service_in_twin(&bed, "theirs").unwrap();
            assert_eq!(theirs["spec"]["ports"][0]["port"], 9999, "{theirs}");
            assert!(
                theirs["metadata"]["labels"][REFLECTED_FROM].is_null(),
                "{theirs}"
            );
            ip
        },
    )
    .await;
    phase_async(
        "a port change follows, the provider's cluster IP kept",
        async {
            bed.consumer.kubectl_ok(&[
                "patch",
                "service",
                "web",
                "-n",
                STORE,
                "--type=json",
                "-p",
                r#"[{"op":"replace","path":"/spec/ports/0/port","value":81}]"#,
            ]);
            let web = bed
                .eventually("the new port in the twin", || async {
                    let w = service_in_twin(&bed, "web")?;
                    (w["spec"]["ports"][0]["port"] == 81).then_some(w)
                })
                .await;
            assert_eq!(web["spec"]["clusterIP"], web_ip.as_str(), "{web}");
            assert_eq!(
                web["spec"]["ports"].as_array().map(Vec::len),
                Some(1),
                "{web}"
            );
        },
    )
    .await;
    phase_async(
        "the consumer's Services on its provider: attacks refused",
        async {
            let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, &bed.identity));
            let client = identity::client_from_kubeconfig(&kubeconfig).await.unwrap();
            let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client, &twin);
            let svc = |name: &str, spec: Value| -> k8s_openapi::api::core::v1::Service {
                serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
            };
            let port = json!([{"port": 443}]);
            for (name, spec, why) in [
                // CVE-2020-8554: the provider's nodes would send it traffic for that address.
                (
                    "mitm",
                    json!({"ports": port, "externalIPs": ["8.8.8.8"]}),
                    "no externalIPs",
                ),
                (
                    "np",
                    json!({"type": "NodePort", "ports": port}),
                    "of type ClusterIP or ExternalName",
                ),
                (
                    "lb",
                    json!({"type": "LoadBalancer", "ports": port}),
                    "of type ClusterIP or ExternalName",
                ),
            ] {
                let err = services
                    .create(&Default::default(), &svc(name, spec))
                    .await
                    .expect_err(&format!(
                        "the consumer's Service {name} admitted on its provider"
                    ));
                assert!(err.to_string().contains(why), "{name}: {err}");
            }
            // Ours, made by the provider's allocation: an external IP added to it afterwards.
            let err = services
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"externalIPs": ["8.8.8.8"]}})),
                )
                .await
                .expect_err("external IPs patched onto a reflected Service");
            assert!(err.to_string().contains("no externalIPs"), "{err}");
            // Load balancer addresses are the provider's to write.
            let err = services
                .patch_status(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"status": {"loadBalancer": {"ingress": [{"ip": "8.8.8.8"}]}}}),
                    ),
                )
                .await
                .expect_err("a Service status written by the consumer");
            assert!(err.to_string().contains("forbidden"), "{err}");
        },
    )
    .await;
    phase_async(
        "node ports asked for: refused until the provider's admin grants them",
        async {
            let annotate = |value: &str| {
                bed.consumer.kubectl_ok(&[
                    "annotate",
                    "--overwrite",
                    "service",
                    "front",
                    "-n",
                    STORE,
                    &format!("reflection.fabric.io/node-ports{value}"),
                ]);
            };
            annotate("=same");
            bed.event(&bed.consumer, STORE, "the refusal on front at home", |e| {
                e["reason"] == "ReflectionRefused"
                    && e["regarding"]["name"] == "front"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("fabric-consumer-node-ports"))
            })
            .await;
            let front = service_in_twin(&bed, "front").unwrap();
            assert_eq!(front["spec"]["type"], "ClusterIP", "{front}");
            // The admin lets this consumer take node ports (refused retries back off to 30 s).
            bed.provider.kubectl_ok(&[
                "create",
                "clusterrolebinding",
                "fabric-node-ports-consumer",
                "--clusterrole=fabric-consumer-node-ports",
                &format!("--user={}", names::user::consumer(CONSUMER)),
            ]);
            let front = bed
                .within(
                    "front a NodePort in the twin",
                    Duration::from_secs(60),
                    || async {
                        let f = service_in_twin(&bed, "front")?;
                        (f["spec"]["type"] == "NodePort").then_some(f)
                    },
                )
                .await;
            assert_eq!(front["spec"]["ports"][0]["nodePort"], 30080, "{front}");
            // Asked no more: a ClusterIP Service again, its node port released.
            annotate("-");
            let front = bed
                .eventually("front a ClusterIP again", || async {
                    let f = service_in_twin(&bed, "front")?;
                    (f["spec"]["type"] == "ClusterIP").then_some(f)
                })
                .await;
            assert!(front["spec"]["ports"][0]["nodePort"].is_null(), "{front}");
        },
    )
    .await;
    phase_async(
        "what a run with --home-api-address left, one without withdraws",
        async {
            use fabric_api::networking::v1alpha1::{IP, IPSpec};
            let name = names::home_api::SERVICE;
            // As a virtual kubelet with the option left them: the IP exposing the home API
            // server to peers (its field manager), the Service and slice in the twin (its marks).
            let ips: Api<IP> = Api::namespaced(bed.c.clone(), NS);
            ips.patch(
                name,
                &PatchParams::apply(names::field_manager::VIRTUAL_KUBELET),
                &Patch::Apply(IP::new(
                    name,
                    IPSpec {
                        ip: "10.0.1.100".into(),
                    },
                )),
            )
            .await
            .unwrap();
            let marks = json!({REFLECTED_FROM: CONSUMER, REFLECTED_TO: PROVIDER});
            apply(
                &bed.provider,
                &json!({"apiVersion": "v1", "kind": "List", "items": [
                    {"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": name, "namespace": twin, "labels": marks},
                     "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 6443}]}},
                    {"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowEndpointSlice",
                     "metadata": {"name": name, "namespace": twin, "labels": marks},
                     "spec": {"template": {"addressType": "IPv4",
                        "endpoints": [{"addresses": ["10.70.0.1"], "conditions": {"ready": true}}],
                        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}}},
                ]}),
            );
            // This bed's virtual kubelet runs without the option: restarted, it withdraws them.
            bed.deployments
                .kill(NS, &fixture::virtual_kubelet_name())
                .unwrap();
            bed.eventually("the IP gone at home", || async {
                ips.get_opt(name).await.unwrap().is_none().then_some(())
            })
            .await;
            bed.eventually("the Service and slice gone from the twin", || async {
                (in_twin(&bed, &twin, "service", name).is_none()
                    && in_twin(&bed, &twin, "shadowendpointslice", name).is_none())
                .then_some(())
            })
            .await;
            // The twin's reflected Services are left as they were.
            assert!(service_in_twin(&bed, "web").is_some(), "{}", bed.logs());
        },
    )
    .await;
    phase_async("deleted at home: gone from the twin; theirs stays", async {
        bed.consumer
            .kubectl_ok(&["delete", "service", "db", "theirs", "-n", STORE]);
        bed.eventually("db gone from the twin", || async {
            service_in_twin(&bed, "db").is_none().then_some(())
        })
        .await;
        assert!(
            service_in_twin(&bed, "theirs").is_some(),
            "someone else's deleted"
        );
        assert!(service_in_twin(&bed, "web").is_some());
    })
    .await;
    phase_async(
        "no longer offloaded there: the Services go with the twin",
        async {
            set_map(&bed, &[]).await;
            bed.eventually("the twin gone", || async {
                let o = bed.provider.kubectl(&["get", "namespace", &twin]);
                (!o.status.success()).then_some(())
            })
            .await;
            // (The test API server removes a namespace's content after the namespace.)
            bed.eventually("no reflected Service left on the provider", || async {
                let left = bed.provider.kubectl_ok(&[
                    "get",
                    "services",
                    "-A",
                    "-l",
                    &format!("{REFLECTED_FROM}={CONSUMER}"),
                    "-o",
                    "name",
                ]);
                left.trim().is_empty().then_some(())
            })
            .await;
        },
    )
    .await;
}

/// The home slice of Service `db` as the consumer's endpoint controller writes it: one
/// endpoint on a home node, one on the virtual node (its pod runs on the provider).
fn home_slice(ready: bool) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "db-abcde", "namespace": STORE,
                        "labels": {names::endpoint_slice::SERVICE_NAME: "db",
                                   names::endpoint_slice::MANAGED_BY: names::endpoint_slice::CONTROLLER}},
           "addressType": "IPv4",
           "endpoints": [
               {"addresses": ["10.244.1.5"], "nodeName": "home-1",
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
                "targetRef": {"kind": "Pod", "namespace": STORE, "name": "db-0"}},
               {"addresses": ["10.244.9.9"], "nodeName": NODE,
                "conditions": {"ready": true, "serving": true, "terminating": false}},
           ],
           "ports": [{"name": "sql", "port": 5432, "protocol": "TCP"}]})
}

/// Object `kind/name` in the store's twin on the provider, if it is there.
fn in_store_twin(bed: &Bed, kind: &str, name: &str) -> Option<Value> {
    in_twin(bed, &store_twin(), kind, name)
}

/// Object `kind`/`name` in twin namespace `twin` on the provider, as its admin reads it.
fn in_twin(bed: &Bed, twin: &str, kind: &str, name: &str) -> Option<Value> {
    bed.provider.get_json(kind, Some(twin), name)
}

/// The addresses and readiness of each endpoint of `slice`.
fn endpoints_of(slice: &Value) -> Vec<(String, Value, Value)> {
    slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["addresses"][0].as_str().unwrap_or_default().to_owned(),
                e["conditions"]["ready"].clone(),
                e["conditions"]["serving"].clone(),
            )
        })
        .collect()
}

/// A home pod of the offloaded namespace with a token volume as admission injects it: its
/// token comes from the home API server (bound to it, its account's RBAC enforced there) in a
/// Secret of the twin its ShadowPod's volume reads, refreshed when due, gone with the pod;
/// the virtual kubelet's token right mints only pod-bound tokens; a pod that opts out gets
/// none, one whose account is missing waits saying why.
async fn service_account_tokens(bed: &Bed) {
    use base64::Engine as _;
    use fabric_api::names::service_account_token::{EXPIRES, ISSUED, OPT_OUT};
    let twin = store_twin();
    bed.consumer
        .kubectl_ok(&["create", "serviceaccount", "reader", "-n", STORE]);
    let pod = |name: &str, account: &str, annotations: Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": STORE, "annotations": annotations},
            "spec": {
                "nodeName": NODE,
                "serviceAccountName": account,
                "terminationGracePeriodSeconds": 5,
                "tolerations": [{"key": names::taint::VIRTUAL_NODE, "operator": "Exists"}],
                "containers": [{"name": "main", "image": "echo", "volumeMounts": [{
                    "name": "kube-api-access-x",
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                "volumes": [{"name": "kube-api-access-x", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ]}}],
            },
        })
    };
    apply(&bed.consumer, &pod("api-client", "reader", json!({})));
    apply(
        &bed.consumer,
        &pod("quiet", "reader", json!({OPT_OUT: "never"})),
    );
    apply(&bed.consumer, &pod("lost", "missing", json!({})));
    let get = |kind: &'static str, name: String| {
        let (twin, provider) = (twin.clone(), &bed.provider);
        async move { provider.get_json(kind, Some(&twin), &name) }
    };
    let shadow = bed
        .eventually("api-client's ShadowPod in the twin", || {
            get("shadowpod", "api-client".into())
        })
        .await;
    let sources = &shadow["spec"]["pod"]["spec"]["volumes"][0]["projected"]["sources"];
    let name = sources[0]["secret"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(name.starts_with("fabric-token.api-client."), "{shadow}");
    assert_eq!(
        sources[0]["secret"]["items"],
        json!([{"key": "token", "path": "token"}, {"key": "namespace", "path": "namespace"}]),
        "{shadow}"
    );
    assert_eq!(
        sources[1]["configMap"]["name"],
        "fabric-home.kube-root-ca.crt"
    );
    assert_eq!(sources.as_array().map(Vec::len), Some(2), "{shadow}");
    assert_eq!(
        shadow["spec"]["pod"]["spec"]["automountServiceAccountToken"], false,
        "no token of the provider's"
    );
    // Written before the ShadowPod: there as soon as it is.
    let secret = get("secret", name.clone()).await.expect("the token Secret");
    assert_eq!(secret["type"], "Opaque", "{secret}");
    assert_eq!(
        secret["metadata"]["labels"][REFLECTED_FROM], CONSUMER,
        "{secret}"
    );
    let decode = |v: &Value| {
        let b = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap();
        String::from_utf8(b).unwrap()
    };
    assert_eq!(
        decode(&secret["data"]["namespace"]),
        STORE,
        "the home namespace"
    );
    let token = decode(&secret["data"]["token"]);
    // The home API server takes it as the pod's account, with its RBAC.
    let as_token = |token: &str, args: &[&str]| {
        let mut all = vec!["--token", token];
        all.extend(args);
        bed.consumer.kubectl(&all)
    };
    let whoami = as_token(&token, &["auth", "whoami", "-o", "json"]);
    let me: Value = serde_json::from_slice(&whoami.stdout).unwrap_or_default();
    assert_eq!(
        me["status"]["userInfo"]["username"],
        format!("system:serviceaccount:{STORE}:reader"),
        "{me} {}",
        String::from_utf8_lossy(&whoami.stderr)
    );
    let list = as_token(&token, &["get", "configmaps", "-n", STORE]);
    assert!(
        !list.status.success() && String::from_utf8_lossy(&list.stderr).contains("forbidden"),
        "{list:?}"
    );
    bed.consumer.kubectl_ok(&[
        "create",
        "role",
        "read-config",
        "-n",
        STORE,
        "--verb=list",
        "--resource=configmaps",
    ]);
    bed.consumer.kubectl_ok(&[
        "create",
        "rolebinding",
        "read-config",
        "-n",
        STORE,
        "--role=read-config",
        &format!("--serviceaccount={STORE}:reader"),
    ]);
    bed.eventually("the token allowed what RBAC now grants", || async {
        as_token(&token, &["get", "configmaps", "-n", STORE])
            .status
            .success()
            .then_some(())
    })
    .await;
    // Refreshed when due: the Secret's record made old, then the pod looked at again.
    bed.provider.kubectl_ok(&[
        "annotate",
        "secret",
        &name,
        "-n",
        &twin,
        "--overwrite",
        &format!("{ISSUED}=2026-01-01T00:00:00Z"),
        &format!("{EXPIRES}=2026-01-01T01:00:00Z"),
    ]);
    bed.consumer
        .kubectl_ok(&["label", "pod", "api-client", "-n", STORE, "poke=1"]);
    let refreshed = bed
        .eventually("a new token in the Secret", || async {
            let s = get("secret", name.clone()).await?;
            let t = decode(&s["data"]["token"]);
            (t != token && s["metadata"]["annotations"][ISSUED] != "2026-01-01T00:00:00Z")
                .then_some(t)
        })
        .await;
    assert!(as_token(&refreshed, &["auth", "whoami"]).status.success());
    // Opted out: no token, its volume dropped as before.
    let quiet = bed
        .eventually("quiet's ShadowPod", || get("shadowpod", "quiet".into()))
        .await;
    assert!(quiet["spec"]["pod"]["spec"]["volumes"].is_null(), "{quiet}");
    let secrets = bed
        .provider
        .kubectl_ok(&["get", "secrets", "-n", &twin, "-o", "name"]);
    assert!(!secrets.contains("fabric-token.quiet."), "{secrets}");
    // Its account missing at home: it waits, saying why, never started without its token.
    bed.eventually("lost says why it waits", || async {
        let p = Api::<Pod>::namespaced(bed.c.clone(), STORE)
            .get_opt("lost")
            .await
            .ok()??;
        let v = serde_json::to_value(&p).unwrap();
        cond_is(&v, OFFLOADED, "False", Some("ServiceAccountTokenFailed")).then_some(())
    })
    .await;
    assert!(
        get("shadowpod", "lost".into()).await.is_none(),
        "not created"
    );
    // The virtual kubelet's right mints only tokens bound to a pod.
    let vk = format!(
        "system:serviceaccount:{NS}:{}",
        fixture::virtual_kubelet_name()
    );
    let unbound = bed
        .consumer
        .kubectl(&["create", "token", "reader", "-n", STORE, "--as", &vk]);
    assert!(
        !unbound.status.success()
            && String::from_utf8_lossy(&unbound.stderr).contains("only for tokens bound to a pod"),
        "{unbound:?}"
    );
    let uid = Api::<Pod>::namespaced(bed.c.clone(), STORE)
        .get("api-client")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    bed.consumer.kubectl_ok(&[
        "create",
        "token",
        "reader",
        "-n",
        STORE,
        "--as",
        &vk,
        "--bound-object-kind=Pod",
        "--bound-object-name=api-client",
        &format!("--bound-object-uid={uid}"),
    ]);
    let elsewhere = bed
        .consumer
        .kubectl(&["create", "token", "default", "-n", "default", "--as", &vk]);
    assert!(
        !elsewhere.status.success()
            && String::from_utf8_lossy(&elsewhere.stderr).contains("forbidden"),
        "outside offloaded namespaces: {elsewhere:?}"
    );
    // Deleted at home: the token stops working, its Secret goes.
    bed.consumer
        .kubectl_ok(&["delete", "pod", "api-client", "-n", STORE, "--wait=false"]);
    bed.eventually("api-client gone at home", || async {
        let p = Api::<Pod>::namespaced(bed.c.clone(), STORE)
            .get_opt("api-client")
            .await
            .ok()?;
        p.is_none().then_some(())
    })
    .await;
    let o = as_token(&refreshed, &["auth", "whoami"]);
    assert!(!o.status.success(), "a token of a deleted pod: {o:?}");
    assert!(
        get("secret", name.clone()).await.is_none(),
        "its Secret gone first"
    );
    // Deleted without its grace: its ShadowPod is an orphan, its token Secret goes with it.
    apply(&bed.consumer, &pod("forced", "reader", json!({})));
    let forced = bed
        .eventually("forced's ShadowPod in the twin", || {
            get("shadowpod", "forced".into())
        })
        .await;
    let secret =
        forced["spec"]["pod"]["spec"]["volumes"][0]["projected"]["sources"][0]["secret"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
    assert!(get("secret", secret.clone()).await.is_some(), "{forced}");
    bed.consumer.kubectl_ok(&[
        "delete",
        "pod",
        "forced",
        "-n",
        STORE,
        "--grace-period=0",
        "--force",
    ]);
    bed.eventually("forced's token Secret gone from the twin", || async {
        get("secret", secret.clone()).await.is_none().then_some(())
    })
    .await;
    for p in ["quiet", "lost"] {
        bed.consumer
            .kubectl_ok(&["delete", "pod", p, "-n", STORE, "--wait=false"]);
    }
}

async fn services_endpoints_translated(bed: &Bed) {
    apply(&bed.consumer, &home_slice(true));
    let shadow = bed
        .eventually("the shadow slice in the twin", || async {
            in_store_twin(bed, "shadowendpointslice", "db-abcde")
        })
        .await;
    // The consumer's network not configured on the provider yet: said on the shadow.
    let note = bed
        .eventually(
            "the shadow waiting for the consumer's network, said",
            || async {
                let list = serde_json::from_str::<Value>(&bed.provider.kubectl_ok(&[
                    "get",
                    "events.events.k8s.io",
                    "-n",
                    &store_twin(),
                    "-o",
                    "json",
                ]))
                .ok()?;
                list["items"].as_array()?.iter().find_map(|e| {
                    (e["regarding"]["name"] == "db-abcde"
                        && e["reason"]
                            == fabric_offloading::endpointslices::controller::WAITING_FOR_NETWORK)
                        .then(|| e["note"].as_str().unwrap_or_default().to_owned())
                })
            },
        )
        .await;
    assert!(note.contains(CONSUMER), "{note}");
    // ... and at home, on the EndpointSlice the shadow carries.
    bed.event(
        &bed.consumer,
        STORE,
        "the shadow's Event on the home slice",
        |e| {
            e["reason"] == fabric_offloading::endpointslices::controller::WAITING_FOR_NETWORK
                && e["regarding"]["kind"] == "EndpointSlice"
                && e["regarding"]["name"] == "db-abcde"
        },
    )
    .await;
    assert!(in_store_twin(bed, "endpointslice", "db-abcde-fabric").is_none());
    fixture::provider_network(&bed.provider, "Connected").unwrap();
    let endpoints = &shadow["spec"]["template"]["endpoints"];
    assert_eq!(
        endpoints.as_array().map(Vec::len),
        Some(1),
        "the virtual node's endpoint left out: {shadow}"
    );
    assert_eq!(endpoints[0]["addresses"][0], "10.244.1.5", "{shadow}");
    assert_eq!(endpoints[0]["targetRef"]["kind"], "RemotePod", "{shadow}");
    let real = bed
        .eventually("the real slice in the twin, translated", || async {
            let s = in_store_twin(bed, "endpointslice", "db-abcde-fabric")?;
            (endpoints_of(&s) == [("10.245.1.5".to_owned(), json!(true), json!(true))]).then_some(s)
        })
        .await;
    let labels = &real["metadata"]["labels"];
    assert_eq!(
        labels[names::endpoint_slice::MANAGED_BY],
        names::endpoint_slice::REFLECTED,
        "{real}"
    );
    assert_eq!(labels[names::endpoint_slice::SERVICE_NAME], "db", "{real}");
    assert_eq!(real["ports"][0]["port"], 5432, "{real}");
    // The consumer's tunnel down: not ready nor serving there; back after.
    fixture::set_provider_tunnel(&bed.provider, "Error").unwrap();
    bed.eventually("not ready while the consumer's network is down", || async {
        let s = in_store_twin(bed, "endpointslice", "db-abcde-fabric")?;
        (endpoints_of(&s) == [("10.245.1.5".to_owned(), json!(false), json!(false))]).then_some(())
    })
    .await;
    fixture::set_provider_tunnel(&bed.provider, "Connected").unwrap();
    bed.eventually("ready again once it is back", || async {
        let s = in_store_twin(bed, "endpointslice", "db-abcde-fabric")?;
        (endpoints_of(&s) == [("10.245.1.5".to_owned(), json!(true), json!(true))]).then_some(())
    })
    .await;
    // The consumer's API server down (hanging, its network up): its virtual kubelet says so
    // in its heartbeat, and what it reflected is no longer taken as ready; back after.
    {
        let _paused = bed.consumer.pause();
        bed.eventually(
            "not ready while the consumer's API server is down",
            || async {
                let s = in_store_twin(bed, "endpointslice", "db-abcde-fabric")?;
                (endpoints_of(&s) == [("10.245.1.5".to_owned(), json!(false), json!(false))])
                    .then_some(())
            },
        )
        .await;
        bed.eventually("the reason said on the shadow", || async {
            let o = bed.provider.kubectl(&[
                "get",
                "events.events.k8s.io",
                "-n",
                &store_twin(),
                "-o",
                "json",
            ]);
            let v: Value = serde_json::from_slice(&o.stdout).ok()?;
            v["items"].as_array()?.iter().find_map(|e| {
                (e["regarding"]["name"] == "db-abcde"
                    && e["reason"] == "ConsumerApiDown"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("own API server")))
                .then_some(())
            })
        })
        .await;
    }
    bed.eventually(
        "ready again once the consumer's API server is back",
        || async {
            let s = in_store_twin(bed, "endpointslice", "db-abcde-fabric")?;
            (endpoints_of(&s) == [("10.245.1.5".to_owned(), json!(true), json!(true))])
                .then_some(())
        },
    )
    .await;
    // Not ready at home: not ready there.
    apply(&bed.consumer, &home_slice(false));
    bed.eventually("not ready there as at home", || async {
        let s = in_store_twin(bed, "endpointslice", "db-abcde-fabric")?;
        (endpoints_of(&s) == [("10.245.1.5".to_owned(), json!(false), json!(false))]).then_some(())
    })
    .await;
    // Terminating but still serving at home (a pod draining its connections): so there, for
    // the provider's proxies that fall back to serving terminating endpoints.
    let mut draining = home_slice(false);
    draining["endpoints"][0]["conditions"] =
        json!({"ready": false, "serving": true, "terminating": true});
    apply(&bed.consumer, &draining);
    let real = bed
        .eventually("terminating and serving there as at home", || async {
            let s = in_store_twin(bed, "endpointslice", "db-abcde-fabric")?;
            (endpoints_of(&s) == [("10.245.1.5".to_owned(), json!(false), json!(true))])
                .then_some(s)
        })
        .await;
    assert_eq!(
        real["endpoints"][0]["conditions"]["terminating"], true,
        "{real}"
    );
    // A slice as the fabric writes one in a twin of a peer's (this cluster its provider too,
    // same-named namespaces): never reflected back. A plain slice applied after it shows the
    // virtual kubelet has seen both.
    let mut from_peer = home_slice(true);
    from_peer["metadata"]["name"] = json!("db-peer-fabric");
    from_peer["metadata"]["labels"][names::endpoint_slice::MANAGED_BY] =
        json!(names::endpoint_slice::REFLECTED);
    from_peer["metadata"]["labels"][REFLECTED_FROM] = json!(PROVIDER);
    from_peer["metadata"]["labels"][REFLECTED_TO] = json!(CONSUMER);
    apply(&bed.consumer, &from_peer);
    let mut after = home_slice(true);
    after["metadata"]["name"] = json!("db-after");
    apply(&bed.consumer, &after);
    bed.eventually("the later slice's shadow in the twin", || async {
        in_store_twin(bed, "shadowendpointslice", "db-after")
    })
    .await;
    assert!(
        in_store_twin(bed, "shadowendpointslice", "db-peer-fabric").is_none(),
        "a slice reflected from the peer was reflected back"
    );
    bed.consumer.kubectl_ok(&[
        "delete",
        "endpointslice",
        "db-peer-fabric",
        "db-after",
        "-n",
        STORE,
    ]);
    bed.eventually("the later slice's shadow gone with it", || async {
        in_store_twin(bed, "shadowendpointslice", "db-after")
            .is_none()
            .then_some(())
    })
    .await;
}

/// With the consumer's own identity: a shadow slice pointing at the provider's API server's
/// Service address and at an address already in the provider's own view (another tenant's
/// pod, say), beside one of its own pods; and a real EndpointSlice written directly.
async fn endpoints_attack(bed: &Bed) {
    let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, &bed.identity));
    let client = identity::client_from_kubeconfig(&kubeconfig).await.unwrap();
    let twin = store_twin();
    let shadows: Api<fabric_api::offloading::v1alpha1::ShadowEndpointSlice> =
        Api::namespaced(client.clone(), &twin);
    let evil = serde_json::from_value(json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowEndpointSlice",
        "metadata": {"name": "evil", "labels": {names::endpoint_slice::SERVICE_NAME: "db"}},
        "spec": {"template": {"addressType": "IPv4", "ports": [{"port": 443}], "endpoints": [
            {"addresses": ["10.96.0.1"], "conditions": {"ready": true}},
            {"addresses": ["10.245.3.3"], "conditions": {"ready": true}},
            {"addresses": ["10.244.1.7"], "conditions": {"ready": true}},
        ]}},
    }))
    .unwrap();
    shadows.create(&Default::default(), &evil).await.unwrap();
    let real = bed
        .eventually("the attacker's slice written, its own pod only", || async {
            let s = in_store_twin(bed, "endpointslice", "evil-fabric")?;
            (!endpoints_of(&s).is_empty()).then_some(s)
        })
        .await;
    let addrs: Vec<String> = endpoints_of(&real).into_iter().map(|(a, ..)| a).collect();
    assert_eq!(
        addrs,
        ["10.245.1.7"],
        "only the consumer's own pod, translated: {real}"
    );
    bed.eventually("a Warning naming the refused addresses", || async {
        let v = bed
            .provider
            .list_json("events.events.k8s.io", Some(&twin))?;
        v["items"]
            .as_array()?
            .iter()
            .find(|e| {
                let note = e["note"].as_str().unwrap_or_default();
                e["regarding"]["name"] == "evil"
                    && e["reason"] == "AddressRefused"
                    && note.contains("10.96.0.1")
                    && note.contains("10.245.3.3")
            })
            .map(|_| ())
    })
    .await;
    // Nor may it write an EndpointSlice there itself, nor another family.
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client, &twin);
    let direct = serde_json::from_value(json!({
        "metadata": {"name": "direct"}, "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.96.0.1"]}],
    }))
    .unwrap();
    let err = slices
        .create(&Default::default(), &direct)
        .await
        .expect_err("an EndpointSlice written by the consumer");
    assert!(err.to_string().contains("forbidden"), "{err}");
    let mut v6 = serde_json::to_value(&evil).unwrap();
    v6["metadata"]["name"] = json!("evil6");
    v6["spec"]["template"]["addressType"] = json!("IPv6");
    let err = shadows
        .create(&Default::default(), &serde_json::from_value(v6).unwrap())
        .await
        .expect_err("an IPv6 shadow");
    assert!(err.to_string().contains("only IPv4"), "{err}");
    shadows.delete("evil", &Default::default()).await.unwrap();
    bed.eventually("the attacker's slice gone with its shadow", || async {
        in_store_twin(bed, "endpointslice", "evil-fabric")
            .is_none()
            .then_some(())
    })
    .await;
}

/// Namespace STORE made at home and offloaded (its NamespaceOffloading, and the map its
/// controller would write) to `twin` on the provider.
async fn offload_store(bed: &Bed, twin: &str) {
    bed.consumer.kubectl_ok(&["create", "namespace", STORE]);
    apply(
        &bed.consumer,
        &json!({"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": "offloading", "namespace": STORE}, "spec": {}}),
    );
    set_map(bed, &[(STORE, twin)]).await;
}

/// The NamespaceMap the consumer's controller would write on the provider, written with the
/// consumer's own identity: `mappings` of (home, twin).
async fn set_map(bed: &Bed, mappings: &[(&str, &str)]) {
    fixture::namespace_map(&bed.identity, mappings)
        .await
        .unwrap();
}
