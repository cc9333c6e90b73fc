//! The provider's ShadowPod controller (part of `fabric-controller sharing`) against a real
//! API server. There is no kubelet here: the test plays it, writing the pods' status through
//! `pods/status` as a kubelet does. A forged ShadowPod gets its real pod (owned, labelled, its
//! status copied back); a pod deleted while running is created again and counted; a finished
//! pod that goes is never revived; deleting a ShadowPod deletes its pod. A ShadowPod whose pod
//! breaks the provider's policy, stored past the webhook (none runs here, as before one is
//! installed), never becomes a pod: its status says why, until its pod is made to comply.
//! The API server enforces RBAC and the controller runs with a token of its own
//! ServiceAccount (`fabric-sharing`) holding exactly the rights `deploy/` gives it.
use std::time::Duration;

use fabric_api::{names, offloading::v1alpha1::ShadowPod};
use fabric_offloading::shadowpod::forge::{Offer, Policy, forge};
use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
    process::Bin,
    rights,
    wait::eventually,
};
use k8s_openapi::{
    api::core::v1::{Namespace, Pod},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

const T: Duration = Duration::from_secs(30);
const CONSUMER: &str = "alpha";

fn start_controller(api: &ApiServer, log: &std::path::Path) -> ChildGuard {
    // As its pod: its ServiceAccount's token, with the rights deploy/ gives it.
    let kubeconfig =
        rights::component_kubeconfig(api, "fabric-sharing", log.with_extension("kubeconfig"))
            .unwrap();
    // `fabric-controller`, built by `cargo build --workspace --bins`.
    Bin::new("fabric-controller")
        .unwrap()
        .kubeconfig(&kubeconfig)
        .pod_name("sharing-0")
        .args([
            "sharing",
            // The provider admin lends its nodes of one pool, tainted for tenants.
            "--tenant-node-selector",
            "pool=tenants",
            "--tenant-toleration",
            "dedicated=tenants:NoSchedule",
            "--tenant-priority-class",
            "tenant-pods",
        ])
        .log(log)
        .spawn()
        .unwrap()
}

/// A ShadowPod as the consumer's virtual kubelet makes it.
fn shadow(name: &str) -> ShadowPod {
    let home: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "uid": format!("home-{name}"),
                     "labels": {"app": name}},
        "spec": {
            "nodeName": "fabric-provider",
            "serviceAccountName": "default",
            "containers": [{"name": "main", "image": "echo",
                            "command": ["fabric-test-pod", "echo", "--port", "7"]}],
        },
    }))
    .unwrap();
    let spec = forge(&home, CONSUMER, &Offer::default(), &Policy::default()).unwrap();
    let mut s = ShadowPod::new(name, spec);
    s.metadata.namespace = Some(names::namespace::tenant(CONSUMER));
    s
}

/// Writes the pod's status as a kubelet would.
async fn kubelet_reports(pods: &Api<Pod>, name: &str, phase: &str, restarts: i32) {
    let status = json!({"status": {
        "phase": phase, "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}],
        "conditions": [{"type": "Ready", "status": if phase == "Running" { "True" } else { "False" }}],
        "containerStatuses": [{"name": "main", "image": "echo", "imageID": "", "ready": phase == "Running",
                               "restartCount": restarts, "state": {"running": {}}}],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

async fn status_where(
    shadows: &Api<ShadowPod>,
    name: &str,
    what: &str,
    ok: impl Fn(&fabric_api::offloading::v1alpha1::ShadowPodStatus) -> bool,
) -> fabric_api::offloading::v1alpha1::ShadowPodStatus {
    eventually(what, T, || async {
        let s = shadows.get(name).await.ok()?.status?;
        ok(&s).then_some(s)
    })
    .await
}

async fn pod_with_uid_other_than(pods: &Api<Pod>, name: &str, old: Option<&str>) -> Pod {
    eventually("the real pod", T, || async {
        let p = pods.get_opt(name).await.unwrap()?;
        (p.metadata.uid.as_deref() != old).then_some(p)
    })
    .await
}

/// An API server with the fabric's CRDs and the consumer's tenant namespace, a scratch
/// directory for logs, and the ShadowPods and pods of that namespace.
async fn bed(tag: &str) -> (ApiServer, std::path::PathBuf, Api<ShadowPod>, Api<Pod>) {
    let api = ApiServer::start_with_auth(tag);
    api.install_crds();
    fabric_tests::auth_service::prepare_cluster(&api, "provider");
    let dir = std::env::temp_dir().join(format!("fabric-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client: Client = api.client().await;
    let ns = names::namespace::tenant(CONSUMER);
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &fabric_auth::tenant::namespace(CONSUMER),
        )
        .await
        .unwrap();
    // What the authentication service binds there for the sharing controller: its rights on
    // this tenant's pods (fabric-sharing-tenant), in this namespace only.
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &fabric_auth::tenant::sharing_binding(CONSUMER, names::DEFAULT_NAMESPACE),
        )
        .await
        .unwrap();
    let shadows = Api::namespaced(client.clone(), &ns);
    let pods = Api::namespaced(client, &ns);
    (api, dir, shadows, pods)
}

#[tokio::test]
async fn shadowpods_run_are_recreated_never_revived_and_deleted() {
    if !require_tools("shadowpods_run_are_recreated_never_revived_and_deleted") {
        return;
    }
    let (api, dir, shadows, pods) = bed("shadowpods").await;
    let _controller = start_controller(&api, &dir.join("controller.log"));

    // Created, owned, forged, status copied.
    let created = shadows
        .create(&PostParams::default(), &shadow("web"))
        .await
        .unwrap();
    let pod = pod_with_uid_other_than(&pods, "web", None).await;
    let owner = &pod.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(owner.uid, created.metadata.uid.clone().unwrap());
    assert_eq!(owner.kind, "ShadowPod");
    assert_eq!(
        pod.metadata.labels.clone().unwrap()[names::label::REMOTE_CLUSTER],
        CONSUMER
    );
    let spec = pod.spec.clone().unwrap();
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.node_name, None);
    // Placed where the provider admin lends nodes, though the consumer said nothing of it.
    assert_eq!(
        spec.node_selector,
        Some([("pool".to_owned(), "tenants".to_owned())].into())
    );
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    assert_eq!(
        (tolerations.len(), tolerations[0].key.as_deref()),
        (1, Some("dedicated"))
    );
    assert_eq!(spec.priority_class_name.as_deref(), Some("tenant-pods"));
    // Its container asks for nothing: it gets the provider's default requests (what the
    // tenant is charged), so the provider's scheduler counts it too.
    let requests = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.requests.clone());
    assert_eq!(
        requests,
        Some(
            [
                ("cpu".to_owned(), Quantity("100m".into())),
                ("memory".to_owned(), Quantity("128Mi".into())),
            ]
            .into()
        ),
        "a request-less pod runs for free"
    );
    kubelet_reports(&pods, "web", "Running", 1).await;
    let st = status_where(&shadows, "web", "Running copied", |s| {
        s.phase.as_deref() == Some("Running")
    })
    .await;
    // The defaults are not a resize the consumer asked for: none is tried, none pending.
    assert!(
        st.conditions.iter().all(|c| c.type_ != "PodResizePending"),
        "{:?}",
        st.conditions
    );
    assert_eq!(
        pods.get("web").await.unwrap().spec.unwrap().containers[0].resources,
        spec.containers[0].resources
    );
    assert_eq!(st.pod_ip.as_deref(), Some("10.244.1.7"));
    assert_eq!(st.container_statuses[0].restart_count, 1);
    assert_eq!(st.pod_conditions[0].type_, "Ready");
    assert_eq!(st.recreations, 0);
    assert_eq!(st.conditions[0].reason, "Created");

    // Deleted while running: created again, counted.
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    let again = pod_with_uid_other_than(&pods, "web", pod.metadata.uid.as_deref()).await;
    let st = status_where(&shadows, "web", "the re-creation counted", |s| {
        s.recreations == 1
    })
    .await;
    assert_eq!(st.pod_uid, again.metadata.uid);
    assert_eq!(st.conditions[0].reason, "Recreated");

    // Finished, then gone: never revived.
    kubelet_reports(&pods, "web", "Succeeded", 1).await;
    status_where(&shadows, "web", "Succeeded copied", |s| {
        s.phase.as_deref() == Some("Succeeded") && s.conditions[0].reason == "Finished"
    })
    .await;
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        pods.get_opt("web").await.unwrap().is_none(),
        "a finished pod was revived"
    );
    let st = shadows.get("web").await.unwrap().status.unwrap();
    assert_eq!(
        (st.phase.as_deref(), st.recreations),
        (Some("Succeeded"), 1)
    );

    // Deleting a ShadowPod deletes its pod, then the ShadowPod goes.
    shadows
        .create(&PostParams::default(), &shadow("db"))
        .await
        .unwrap();
    pod_with_uid_other_than(&pods, "db", None).await;
    shadows
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the pod and its ShadowPod gone", T, || async {
        let pod = pods.get_opt("db").await.unwrap();
        let shadow = shadows.get_opt("db").await.unwrap();
        (pod.is_none() && shadow.is_none()).then_some(())
    })
    .await;

    // Stored past the webhook with a pod that would own the node: never made, and said.
    let mut root = shadow("root");
    root.spec.pod.spec.host_pid = Some(true);
    root.spec.pod.spec.containers[0].security_context =
        Some(serde_json::from_value(json!({"privileged": true})).unwrap());
    shadows.create(&PostParams::default(), &root).await.unwrap();
    let st = status_where(&shadows, "root", "the refusal said", |s| {
        s.conditions.iter().any(|c| c.reason == "Disallowed")
    })
    .await;
    let c = &st.conditions[0];
    assert_eq!(c.status, "False");
    assert!(
        c.message.starts_with("spec.pod.spec.hostPID: "),
        "{}",
        c.message
    );
    assert_eq!(st.pod_uid, None);
    assert!(pods.get_opt("root").await.unwrap().is_none());
    // Made once its pod complies (the hostPID gone, privileged still there: not yet).
    shadows
        .patch(
            "root",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pod": {"spec": {"hostPID": null}}}})),
        )
        .await
        .unwrap();
    refused_unmade(&shadows, &pods, "the next refusal said", "privileged").await;
    // Scheduled beside the provider's control plane: never made either.
    shadows
        .patch(
            "root",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pod": {"spec": {"tolerations": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                 "effect": "NoSchedule"}]}}}})),
        )
        .await
        .unwrap();
    let mut fixed = shadows.get("root").await.unwrap();
    fixed.spec.pod.spec.containers[0].security_context = None;
    fix_pod(&shadows, &fixed).await;
    refused_unmade(
        &shadows,
        &pods,
        "the toleration refused",
        "spec.pod.spec.tolerations[0]: ",
    )
    .await;
    let mut fixed = shadows.get("root").await.unwrap();
    fixed.spec.pod.spec.tolerations = None;
    fix_pod(&shadows, &fixed).await;
    pod_with_uid_other_than(&pods, "root", None).await;
}

/// Writes `fixed`'s pod spec over ShadowPod `root`'s with a merge patch, whatever its
/// version: the controller writes its status meanwhile, which a replace of the copy read
/// would conflict with. Fields `fixed` leaves out are removed (nulled in the patch).
async fn fix_pod(shadows: &Api<ShadowPod>, fixed: &ShadowPod) {
    let mut spec = serde_json::to_value(&fixed.spec.pod.spec).unwrap();
    let stored = shadows.get("root").await.unwrap();
    let stored = serde_json::to_value(&stored.spec.pod.spec).unwrap();
    for k in stored.as_object().unwrap().keys() {
        spec.as_object_mut()
            .unwrap()
            .entry(k.clone())
            .or_insert(serde_json::Value::Null);
    }
    shadows
        .patch(
            "root",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pod": {"spec": spec}}})),
        )
        .await
        .unwrap();
}

/// Waits until ShadowPod `root`'s refusal names `field` (its message contains it), and checks
/// that no pod was made for it.
async fn refused_unmade(shadows: &Api<ShadowPod>, pods: &Api<Pod>, what: &str, field: &str) {
    let st = status_where(shadows, "root", what, |s| {
        s.conditions.iter().any(|c| c.message.contains(field))
    })
    .await;
    assert_eq!(st.pod_uid, None);
    assert!(pods.get_opt("root").await.unwrap().is_none());
}

/// Writes a finished pod's status as a kubelet would: the container exited 0.
async fn kubelet_reports_done(pods: &Api<Pod>, name: &str) {
    let status = json!({"status": {
        "phase": "Succeeded",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
        "containerStatuses": [{"name": "main", "image": "echo", "imageID": "", "ready": false,
                               "restartCount": 0,
                               "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                   "startedAt": "2026-11-26T12:00:01Z",
                                   "finishedAt": "2026-11-26T12:00:02Z"}}}],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Issue 19 §3: a pod that finished while the controller was down, whose real pod was then
/// removed (as the provider's terminated-pod collector or an admin does) before the controller
/// came back, is never run again: its completion is recorded before the pod can go.
#[tokio::test]
async fn a_pod_finished_and_removed_while_the_controller_is_down_never_runs_again() {
    if !require_tools("finished_pod_removed_while_controller_down") {
        return;
    }
    let (api, dir, shadows, pods) = bed("shadowpods-down").await;
    let controller = start_controller(&api, &dir.join("controller-1.log"));
    shadows
        .create(&PostParams::default(), &shadow("job"))
        .await
        .unwrap();
    let first = pod_with_uid_other_than(&pods, "job", None).await;
    kubelet_reports(&pods, "job", "Running", 0).await;
    status_where(&shadows, "job", "Running copied", |s| {
        s.phase.as_deref() == Some("Running")
    })
    .await;

    // Down: the pod finishes, and its real pod is removed.
    drop(controller);
    kubelet_reports_done(&pods, "job").await;
    pods.delete("job", &DeleteParams::default()).await.unwrap();

    // Back: the completion is seen, the pod is gone, and none is made again.
    let _controller = start_controller(&api, &dir.join("controller-2.log"));
    let st = status_where(&shadows, "job", "Succeeded recorded", |s| {
        s.phase.as_deref() == Some("Succeeded") || s.recreations > 0
    })
    .await;
    assert_eq!(
        (st.phase.as_deref(), st.recreations),
        (Some("Succeeded"), 0),
        "the finished pod was made again: {st:?}"
    );
    eventually("the finished pod gone", T, || async {
        pods.get_opt("job").await.unwrap().is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = pods.get_opt("job").await.unwrap();
    assert!(
        now.is_none(),
        "a finished pod runs again (the first was {:?}): {now:?}",
        first.metadata.uid
    );
    assert_eq!(
        shadows
            .get("job")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Succeeded")
    );
}

/// The provider's admin tightens a tenant's level (baseline to restricted on its Tenant): the
/// pod made under baseline runs on, as Pod Security admission evicts none, but its ShadowPod
/// says it breaks the current policy (condition and one Warning Event, naming field and rule).
#[tokio::test]
async fn a_running_pod_is_flagged_when_its_tenant_s_policy_is_tightened() {
    if !require_tools("a_running_pod_is_flagged_when_its_tenant_s_policy_is_tightened") {
        return;
    }
    use fabric_api::{
        authentication::v1alpha1::Tenant, offloading::v1alpha1::shadow_pod_condition,
    };
    let (api, dir, shadows, pods) = bed("shadowpods-tighten").await;
    let client = api.client().await;
    let tenants: Api<Tenant> = Api::namespaced(client.clone(), &names::namespace::tenant(CONSUMER));
    let tenant: Tenant = serde_json::from_value(json!({
        "apiVersion": "authentication.fabric.io/v1alpha1", "kind": "Tenant",
        "metadata": {"name": CONSUMER},
        "spec": {"clusterId": CONSUMER},
    }))
    .unwrap();
    tenants
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let _controller = start_controller(&api, &dir.join("controller.log"));
    shadows
        .create(&PostParams::default(), &shadow("web"))
        .await
        .unwrap();
    let pod = pod_with_uid_other_than(&pods, "web", None).await;
    kubelet_reports(&pods, "web", "Running", 0).await;
    let compliant = |s: &fabric_api::offloading::v1alpha1::ShadowPodStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == shadow_pod_condition::POLICY_COMPLIANT)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    status_where(&shadows, "web", "compliant under baseline", |s| {
        compliant(s).is_some_and(|c| c.0 == "True")
    })
    .await;

    tenants
        .patch(
            CONSUMER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podSecurity": "restricted"}})),
        )
        .await
        .unwrap();
    let st = status_where(&shadows, "web", "flagged under restricted", |s| {
        compliant(s).is_some_and(|c| c.0 == "False")
    })
    .await;
    let (_, reason, message) = compliant(&st).unwrap();
    assert_eq!(reason, "BreaksCurrentPolicy", "{st:?}");
    assert!(message.contains("restricted"), "names the rule: {message}");
    let now = pods.get("web").await.unwrap();
    assert_eq!(now.metadata.uid, pod.metadata.uid, "the pod runs on");
    assert!(now.metadata.deletion_timestamp.is_none(), "the pod runs on");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client, &names::namespace::tenant(CONSUMER));
    eventually("the Warning Event", T, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("BreaksCurrentPolicy")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
            })
    })
    .await;
}
