//! The framework against a real API server, with the most trivial kind: the ConfigMaps of
//! namespace `home` mirrored into namespace `twin` of the same API server (standing for the
//! remote cluster). Nothing is reflected before whether the remote answers is known, nor
//! while it does not; changes follow; a remote object someone else made is left alone and
//! said at home, and so is a copy the remote refuses; an object of ours whose home object
//! is gone is deleted; a home object that
//! is a reflection itself is not reflected back; a new remote client takes over; a stopped
//! pair reflects nothing more; the metrics count it all.
use std::{sync::Arc, time::Duration};

use fabric_kube::events::Events;
use fabric_reflector::{
    Endpoint, Marks, Metrics, Options, Pair, Reachability, Reflection,
    mirror::{Forge, Mirror},
};
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    wait::eventually,
};
use k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event};
use kube::{
    Api, Client, ResourceExt as _,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::sync::watch;

const T: Duration = Duration::from_secs(30);
/// How long "nothing happens" is watched for: several resync periods and watch round trips.
const QUIET: Duration = Duration::from_secs(4);

/// Data and labels copied as they are.
struct ConfigMaps;

impl Forge for ConfigMaps {
    type Home = ConfigMap;
    type Remote = ConfigMap;
    const NAME: &'static str = "configmaps";

    fn forge(&self, home: &ConfigMap) -> Option<ConfigMap> {
        Some(ConfigMap {
            metadata: ObjectMeta {
                labels: home.metadata.labels.clone(),
                ..Default::default()
            },
            data: home.data.clone(),
            ..Default::default()
        })
    }
}

fn cm(name: &str, value: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "data": { "k": value },
    }))
    .unwrap()
}

async fn value_of(api: &Api<ConfigMap>, name: &str) -> Option<String> {
    let c = api.get_opt(name).await.ok()??;
    c.data?.get("k").cloned()
}

/// That `name` stays absent from `twin` for a while.
async fn stays_absent(twin: &Api<ConfigMap>, name: &str, why: &str) {
    let t0 = tokio::time::Instant::now();
    while t0.elapsed() < QUIET {
        assert!(
            twin.get_opt(name).await.unwrap().is_none(),
            "{name} reflected {why}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn metric(text: &str, name: &str) -> f64 {
    let prefix = format!("fabric_reflector_{name}{{kind=\"configmaps\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

#[tokio::test]
async fn configmaps_are_mirrored_into_their_twin_namespace() {
    if !require_tools("configmaps_are_mirrored_into_their_twin_namespace") {
        return;
    }
    let server = ApiServer::start("reflector-mirror");
    for ns in ["home", "twin"] {
        server.kubectl_ok(&["create", "namespace", ns]);
    }
    let client = server.client().await;
    let home: Api<ConfigMap> = Api::namespaced(client.clone(), "home");
    let twin: Api<ConfigMap> = Api::namespaced(client.clone(), "twin");
    let marks = Marks::new("alpha", "beta");
    let endpoint = |c: Client| {
        Some(Endpoint {
            client: c,
            marks: marks.clone(),
        })
    };
    let (endpoint_tx, endpoint_rx) = watch::channel(endpoint(client.clone()));
    let (reach_tx, reach_rx) = watch::channel(Reachability::Unknown);
    let metrics = Arc::new(Metrics::new());
    let mut reflection = Reflection::new(
        client.clone(),
        Events::new(client.clone(), "fabric-reflection-test", None),
        metrics.clone(),
        endpoint_rx,
        reach_rx,
    );
    reflection.register(Mirror(ConfigMaps), Options::new(3, Duration::from_secs(1)));
    let pp = PostParams::default();

    // An orphan of ours (its home object never existed here) and someone else's object.
    let mut orphan = cm("orphan", "x", json!({}));
    orphan.metadata.labels = Some(marks.labels());
    twin.create(&pp, &orphan).await.unwrap();
    twin.create(&pp, &cm("taken", "theirs", json!({})))
        .await
        .unwrap();

    home.create(
        &pp,
        &cm("settings", "1", json!({"app": "web", "tier": "front"})),
    )
    .await
    .unwrap();
    let pair = Pair::namespaces("home", "twin");
    assert!(reflection.start(pair.clone()));
    assert!(!reflection.start(pair.clone()), "started once");
    stays_absent(&twin, "settings", "before the remote was known to answer").await;
    assert!(twin.get_opt("orphan").await.unwrap().is_some());

    reach_tx.send_replace(Reachability::Reachable);
    let copy = eventually("settings in the twin namespace", T, || async {
        twin.get_opt("settings").await.ok()?
    })
    .await;
    assert_eq!(copy.data, Some([("k".to_owned(), "1".to_owned())].into()));
    assert!(marks.on(&copy.metadata), "{:?}", copy.metadata.labels);
    assert_eq!(copy.labels()["app"], "web");
    eventually("the orphan of ours deleted", T, || async {
        twin.get_opt("orphan")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // Changes follow: a value, a label removed.
    home.replace("settings", &pp, &{
        let mut c = home.get("settings").await.unwrap();
        c.data = Some([("k".to_owned(), "2".to_owned())].into());
        c.metadata.labels.as_mut().unwrap().remove("tier");
        c
    })
    .await
    .unwrap();
    eventually("the change in the twin namespace", T, || async {
        let c = twin.get_opt("settings").await.ok()??;
        (c.data.as_ref()?.get("k")? == "2" && !c.labels().contains_key("tier")).then_some(())
    })
    .await;
    // Edited there by hand: put back.
    twin.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "edited"}})),
    )
    .await
    .unwrap();
    eventually("the hand edit undone", T, || async {
        (value_of(&twin, "settings").await? == "2").then_some(())
    })
    .await;

    // Someone else's object of the name: left alone, and said at home.
    home.create(&pp, &cm("taken", "ours", json!({})))
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "home");
    let note = eventually("a Warning Event on the home object", T, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let about = e.regarding.as_ref()?.name.as_deref()? == "taken";
            (about && e.reason.as_deref() == Some("FailedReflection")).then_some(e.note?)
        })
    })
    .await;
    assert!(
        note.contains("twin/taken") && note.contains("not made by the fabric"),
        "{note}"
    );
    assert_eq!(value_of(&twin, "taken").await.as_deref(), Some("theirs"));
    assert!(!marks.on(&twin.get("taken").await.unwrap().metadata));

    // Refused there (its admission policy): said at home, with the remote's reason.
    let policy = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "no-refused"},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                      "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}]},
                  "validations": [{"expression": "request.namespace != 'twin' || !has(object.metadata.labels) || !('refuse' in object.metadata.labels)",
                                   "message": "this cluster takes no ConfigMap labelled refuse"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": "no-refused"},
         "spec": {"policyName": "no-refused", "validationActions": ["Deny"]}},
    ]});
    let o = server.kubectl_stdin(&["apply", "-f", "-"], &policy.to_string());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The API server takes a moment to enforce a new policy.
    eventually("the policy in force", T, || async {
        let probe = cm("probe", "1", json!({"refuse": "yes"}));
        match twin.create(&pp, &probe).await {
            Ok(_) => {
                twin.delete("probe", &DeleteParams::default()).await.ok();
                None
            }
            Err(_) => Some(()),
        }
    })
    .await;
    home.create(&pp, &cm("refused", "1", json!({"refuse": "yes"})))
        .await
        .unwrap();
    let note = eventually("a Warning Event on the refused home object", T, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let about = e.regarding.as_ref()?.name.as_deref()? == "refused";
            (about && e.reason.as_deref() == Some("ReflectionRefused")).then_some(e.note?)
        })
    })
    .await;
    assert!(
        note.contains("cluster beta refused") && note.contains("no ConfigMap labelled refuse"),
        "{note}"
    );
    assert!(twin.get_opt("refused").await.unwrap().is_none());

    // A reflection made here by a peer is not reflected back.
    home.create(
        &pp,
        &cm(
            "from-peer",
            "1",
            json!(Marks::new("beta", "alpha").labels()),
        ),
    )
    .await
    .unwrap();
    stays_absent(&twin, "from-peer", "back to where it came from").await;
    assert_eq!(value_of(&twin, "taken").await.as_deref(), Some("theirs"));

    // Deleted at home: deleted there.
    home.delete("settings", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the copy deleted", T, || async {
        twin.get_opt("settings")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // Unreachable: nothing is written; reachable again, it is.
    reach_tx.send_replace(Reachability::Unreachable);
    home.create(&pp, &cm("later", "1", json!({})))
        .await
        .unwrap();
    stays_absent(&twin, "later", "while the remote was said not to answer").await;
    reach_tx.send_replace(Reachability::Reachable);
    eventually("later reflected once reachable", T, || async {
        value_of(&twin, "later").await
    })
    .await;

    // A new remote client (the identity rotated) takes over.
    endpoint_tx.send_replace(endpoint(server.client().await));
    home.create(&pp, &cm("rotated", "1", json!({})))
        .await
        .unwrap();
    eventually("reflected through the new client", T, || async {
        value_of(&twin, "rotated").await
    })
    .await;

    // Stopped: nothing more is reflected; what was stays.
    assert!(reflection.stop(&pair).await);
    assert!(!reflection.stop(&pair).await);
    assert!(reflection.pairs().is_empty());
    home.create(&pp, &cm("after-stop", "1", json!({})))
        .await
        .unwrap();
    home.delete("later", &DeleteParams::default())
        .await
        .unwrap();
    stays_absent(&twin, "after-stop", "after the pair stopped").await;
    assert_eq!(value_of(&twin, "later").await.as_deref(), Some("1"));

    let text = metrics.render();
    assert!(metric(&text, "syncs_total") >= 6.0, "{text}");
    // The orphan, and the copy of the object deleted at home.
    assert_eq!(metric(&text, "orphans_deleted_total"), 2.0, "{text}");
    assert_eq!(metric(&text, "pairs"), 0.0, "{text}");
    assert_eq!(metric(&text, "queue_depth"), 0.0, "{text}");
    assert!(
        metric(&text, "sync_duration_seconds_count") >= 6.0,
        "{text}"
    );
}
