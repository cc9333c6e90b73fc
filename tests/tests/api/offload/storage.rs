//! The storage fabric's virtual-node path (issue 21), on a bed of its own: a claim of the
//! virtual class `fabric` in an offloaded namespace, its first consumer placed on the virtual
//! node (the scheduler played: `volume.kubernetes.io/selected-node` set by hand), provisioned
//! in the twin (the class the provider lends by default, our marks) with a placeholder volume
//! at home pinned to the virtual node and the claim bound to it; the pod mounting it waits
//! for the remote claim, then runs in the twin mounting it there; a provider lending no
//! storage sends the claim back to the scheduler; someone else's claim in the twin is left
//! alone; the claim deleted, both sides go. The storage comes from the negotiation: the
//! provider's admin lends classes by amount (ConfigMap `fabric-storage`), the consumer's
//! ResourceSlice asks for some, the provider's policy grants it, and the VirtualNode's
//! `spec.storage` is what the consumer's negotiation makes of that grant. Then the attacks,
//! with the attacker's own credentials: the consumer's identity on the provider (claims
//! taking the provider's volumes, data of another namespace, a class not lent, more than was
//! granted of a class; a ShadowPod mounting a claim of another namespace) and the virtual
//! kubelet's own ServiceAccount at home (a volume that is not a placeholder of its node,
//! deleting another volume). Phases `Bound` are not relied on: no PV binder runs here.
use fabric_api::{
    authentication::v1alpha1::ResourceSlice,
    offloading::{
        lent,
        v1alpha1::{NamespaceMap, Storage},
    },
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use super::*;

const LENT: &str = "standard";

/// The consumer's own identity on the provider, in namespace `ns`.
async fn as_consumer_in<K>(bed: &Bed, ns: &str) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    let kubeconfig = identity::to_yaml(&identity::kubeconfig(PROVIDER, &bed.identity));
    let client = identity::client_from_kubeconfig(&kubeconfig).await.unwrap();
    Api::namespaced(client, ns)
}

/// A home claim of the virtual class in `namespace`, its first consumer placed on
/// `selected` (by the scheduler), with `annotations`.
fn claim_in(namespace: &str, name: &str, selected: Option<&str>, annotations: Value) -> Value {
    let mut c = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "db"},
                     "annotations": annotations},
        "spec": {"storageClassName": "fabric", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}});
    if let Some(node) = selected {
        c["metadata"]["annotations"][names::storage::SELECTED_NODE] = json!(node);
    }
    c
}

fn claim(name: &str, selected: Option<&str>, annotations: Value) -> Value {
    claim_in(STORE, name, selected, annotations)
}

/// Sets the selected node of home claim `name`, as the scheduler does.
fn select(bed: &Bed, name: &str) {
    let patch = json!({"metadata": {"annotations": {names::storage::SELECTED_NODE: NODE}}});
    bed.consumer.kubectl_ok(&[
        "patch",
        "pvc",
        name,
        "-n",
        STORE,
        "--type=merge",
        "-p",
        &patch.to_string(),
    ]);
}

fn home_claim(bed: &Bed, name: &str) -> Option<Value> {
    bed.consumer
        .get_json("persistentvolumeclaims", Some(STORE), name)
}

fn volume(bed: &Bed, name: &str) -> Option<Value> {
    bed.consumer.get_json("persistentvolumes", None, name)
}

/// The consumer's own identity on the provider, in the twin.
async fn as_consumer<K>(bed: &Bed) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    as_consumer_in(bed, &store_twin()).await
}

#[tokio::test]
async fn a_claim_s_first_consumer_on_the_virtual_node_takes_it_to_the_provider() {
    let Some(bed) = phase_async("the bed", setup("twin-storage", &[])).await else {
        return;
    };
    phase_async("the virtual node Ready", virtual_node_ready(&bed)).await;
    let twin = store_twin();
    phase_async(
        "the namespace offloaded; the provider lends a class",
        async {
            offload_store(&bed, &twin).await;
            bed.eventually("the twin made by the provider", || async {
                bed.provider
                    .kubectl(&["get", "namespace", &twin])
                    .status
                    .success()
                    .then_some(())
            })
            .await;
            // The provider's admin: what it lends, and a claim of its own in the twin.
            // (deploy/ ships it, lending nothing.)
            bed.provider.kubectl_ok(&[
                "patch",
                "configmap",
                "fabric-storage",
                "-n",
                NS,
                "--type=merge",
                "-p",
                &json!({"data": {"lent": format!("{LENT}=8Gi, fast=1Gi")}}).to_string(),
            ]);
            apply(
                &bed.provider,
                &json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "theirs", "namespace": twin, "labels": {"owner": "admin"}},
                    "spec": {"storageClassName": LENT, "accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "5Gi"}}}}),
            );
        },
    )
    .await;
    phase_async(
        "a provider lending no storage: back to the scheduler",
        async {
            apply(&bed.consumer, &claim("early", Some(NODE), json!({})));
            bed.eventually("early's selected node dropped", || async {
                let c = home_claim(&bed, "early")?;
                c["metadata"]["annotations"][names::storage::SELECTED_NODE]
                    .is_null()
                    .then_some(())
            })
            .await;
            bed.event(&bed.consumer, STORE, "ReschedulingRequired on early", |e| {
                e["reason"] == names::storage::RESCHEDULING_REQUIRED
                    && e["type"] == "Warning"
                    && e["regarding"]["name"] == "early"
            })
            .await;
            let early = home_claim(&bed, "early").unwrap();
            assert!(early["spec"]["volumeName"].is_null(), "{early}");
        },
    )
    .await;
    phase_async(
        "storage asked for and granted: the VirtualNode's storage from the grant",
        async { storage_negotiated(&bed).await },
    )
    .await;
    let uid = phase_async(
        "the pod waits for its claim, then runs with it in the twin",
        async {
            apply(&bed.consumer, &claim("data", None, json!({})));
            let mut pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "db", "namespace": STORE},
                "spec": {
                    "nodeName": NODE,
                    "terminationGracePeriodSeconds": 5,
                    "tolerations": [{"key": names::taint::VIRTUAL_NODE, "operator": "Exists"}],
                    "containers": [{"name": "main", "image": "echo",
                        "command": ["fabric-test-pod", "echo"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                },
            });
            pod["spec"]["terminationGracePeriodSeconds"] = json!(5);
            apply(&bed.consumer, &pod);
            bed.eventually("db waiting for its claim, saying so", || async {
                let p = Api::<Pod>::namespaced(bed.c.clone(), STORE)
                    .get_opt("db")
                    .await
                    .ok()??;
                let v = serde_json::to_value(&p).unwrap();
                cond_is(&v, OFFLOADED, "False", Some("RemoteVolumePending")).then_some(())
            })
            .await;
            assert!(
                in_store_twin(&bed, "shadowpod", "db").is_none(),
                "no ShadowPod before its claim is on the provider"
            );
            // The scheduler places db's claim with it.
            select(&bed, "data");
            let home = bed
                .eventually("data bound to its placeholder", || async {
                    let c = home_claim(&bed, "data")?;
                    c["spec"]["volumeName"].is_string().then_some(c)
                })
                .await;
            let uid = home["metadata"]["uid"].as_str().unwrap().to_owned();
            assert_eq!(home["spec"]["volumeName"], format!("pvc-{uid}"), "{home}");
            assert_eq!(
                home["metadata"]["finalizers"],
                json!([names::storage::FINALIZER]),
                "{home}"
            );
            let remote = bed
                .eventually("data in the twin", || async {
                    in_store_twin(&bed, "persistentvolumeclaim", "data")
                })
                .await;
            assert_eq!(
                remote["spec"]["storageClassName"], LENT,
                "the lent default: {remote}"
            );
            assert_eq!(remote["spec"]["resources"]["requests"]["storage"], "1Gi");
            assert_eq!(
                remote["metadata"]["labels"][REFLECTED_FROM], CONSUMER,
                "{remote}"
            );
            assert_eq!(remote["metadata"]["labels"]["app"], "db", "{remote}");
            assert!(remote["spec"]["volumeName"].is_null(), "{remote}");
            let pv = volume(&bed, &format!("pvc-{uid}")).expect("the placeholder");
            assert_eq!(pv["spec"]["storageClassName"], "fabric", "{pv}");
            assert_eq!(pv["spec"]["claimRef"]["uid"], uid.as_str(), "{pv}");
            assert_eq!(pv["spec"]["claimRef"]["name"], "data", "{pv}");
            assert_eq!(pv["spec"]["capacity"]["storage"], "1Gi", "{pv}");
            assert_eq!(
                pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"],
                json!([{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]),
                "every later consumer lands on the virtual node: {pv}"
            );
            assert_eq!(
                pv["spec"]["csi"]["driver"],
                names::storage::PROVISIONER,
                "{pv}"
            );
            assert_eq!(
                pv["metadata"]["annotations"][names::storage::PROVISIONED_BY],
                names::storage::PROVISIONER
            );
            let shadow = bed
                .eventually("db's ShadowPod in the twin", || async {
                    in_store_twin(&bed, "shadowpod", "db")
                })
                .await;
            assert_eq!(
                shadow["spec"]["pod"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
                "data",
                "{shadow}"
            );
            bed.eventually("db's real pod in the twin, admitted", || async {
                in_store_twin(&bed, "pod", "db")
            })
            .await;
            uid
        },
    )
    .await;
    phase_async(
        "fabricctl move volume: refused while db uses it, or to no provider",
        async { move_refused(&bed).await },
    )
    .await;
    phase_async(
        "a class of the claim's choosing, refused when not lent",
        async {
            apply(
                &bed.consumer,
                &claim(
                    "gold",
                    Some(NODE),
                    json!({names::storage::REMOTE_CLASS: "gold"}),
                ),
            );
            bed.event(
                &bed.consumer,
                STORE,
                "the provider's refusal said at home",
                |e| {
                    e["reason"] == "ReflectionRefused"
                        && e["regarding"]["name"] == "gold"
                        && e["note"]
                            .as_str()
                            .is_some_and(|n| n.contains("does not lend"))
                },
            )
            .await;
            let gold = home_claim(&bed, "gold").unwrap();
            assert!(gold["spec"]["volumeName"].is_null(), "not bound: {gold}");
            apply(
                &bed.consumer,
                &claim(
                    "quick",
                    Some(NODE),
                    json!({names::storage::REMOTE_CLASS: "fast"}),
                ),
            );
            let quick = bed
                .eventually("quick in the twin", || async {
                    in_store_twin(&bed, "persistentvolumeclaim", "quick")
                })
                .await;
            assert_eq!(quick["spec"]["storageClassName"], "fast", "{quick}");
        },
    )
    .await;
    phase_async("someone else's claim in the twin: left alone", async {
        apply(&bed.consumer, &claim("theirs", Some(NODE), json!({})));
        bed.event(&bed.consumer, STORE, "the Warning on theirs at home", |e| {
            e["reason"] == "FailedReflection" && e["regarding"]["name"] == "theirs"
        })
        .await;
        let remote = in_store_twin(&bed, "persistentvolumeclaim", "theirs").unwrap();
        assert_eq!(
            remote["metadata"]["labels"],
            json!({"owner": "admin"}),
            "{remote}"
        );
        assert_eq!(remote["spec"]["resources"]["requests"]["storage"], "5Gi");
        let home = home_claim(&bed, "theirs").unwrap();
        assert!(home["spec"]["volumeName"].is_null(), "{home}");
    })
    .await;
    phase_async("the claim deleted: both sides gone", async {
        bed.consumer
            .kubectl_ok(&["delete", "pod", "db", "-n", STORE, "--wait=false"]);
        // Unused now, its data on the provider: a move home whose sender fails there changes
        // nothing and leaves nothing (the way home that succeeds: the netns bed's).
        bed.eventually("db gone at home", || async {
            let pods: Api<Pod> = Api::namespaced(bed.c.clone(), STORE);
            pods.get_opt("db").await.ok()?.is_none().then_some(())
        })
        .await;
        let before = home_claim(&bed, "data").unwrap();
        let kubeconfig = bed.consumer.kubeconfig.clone();
        let target = format!("{STORE}/data");
        let home_move = tokio::task::spawn_blocking(move || {
            let o = fabric_tests::process::fabricctl(
                &kubeconfig,
                &["move", "volume", &target, "--to", "local"],
            );
            (o.status.success(), fabric_tests::process::output_text(&o))
        });
        bed.eventually(
            "the move's landing claim and its sender in the twin",
            || async {
                home_claim(&bed, "data-landing")?;
                in_store_twin(&bed, "pod", "move-data-send")
            },
        )
        .await;
        // The provider's kubelet, played: the sender exits 1.
        Api::<Pod>::namespaced(bed.p.clone(), &store_twin())
            .patch_status(
                "move-data-send",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Failed",
                    "containerStatuses": [{"name": "transfer", "image": "fabric-controller",
                        "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}})),
            )
            .await
            .unwrap();
        let (ok, out) = home_move.await.unwrap();
        assert!(
            !ok && out.contains("move-data-send")
                && out.contains(&format!(
                    "failed: nothing was changed, the data stays on {PROVIDER}"
                )),
            "a move home whose sender failed: {out}"
        );
        let after = home_claim(&bed, "data").unwrap();
        assert_eq!(
            after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
            "the claim untouched"
        );
        assert!(
            home_claim(&bed, "data-landing").is_none(),
            "the landing claim left"
        );
        let pods: Api<Pod> = Api::namespaced(bed.c.clone(), STORE);
        let left = pods.list(&Default::default()).await.unwrap().items;
        assert!(
            !left
                .iter()
                .any(|p| kube::ResourceExt::name_any(p).starts_with("move-data")),
            "transfer pods left"
        );
        bed.consumer
            .kubectl_ok(&["delete", "pvc", "data", "-n", STORE, "--wait=false"]);
        bed.eventually("data gone from the twin", || async {
            in_store_twin(&bed, "persistentvolumeclaim", "data")
                .is_none()
                .then_some(())
        })
        .await;
        bed.eventually("the placeholder gone", || async {
            volume(&bed, &format!("pvc-{uid}")).is_none().then_some(())
        })
        .await;
        bed.eventually("data gone at home", || async {
            home_claim(&bed, "data").is_none().then_some(())
        })
        .await;
    })
    .await;
    phase_async(
        "the consumer's identity takes nothing of the provider's",
        async { consumer_claims_attack(&bed).await },
    )
    .await;
    phase_async(
        "the consumer's claims charged against its grant of their class",
        async { consumer_claims_charged(&bed).await },
    )
    .await;
    phase_async(
        "the virtual kubelet's identity makes only its placeholders",
        async { virtual_kubelet_volumes_attack(&bed).await },
    )
    .await;
    let kept = phase_async(
        "unoffloaded under Retain: the claims stay, out of the consumer's reach, reported",
        async { unoffloaded_under_retain(&bed).await },
    )
    .await;
    phase_async(
        "fabricctl forget volumes deletes them, then the twin goes",
        async { forget_volumes(&bed, &kept).await },
    )
    .await;
    phase_async(
        "unoffloaded under Delete: the twin goes with its claims",
        async { unoffloaded_under_delete(&bed).await },
    )
    .await;
    phase_async(
        "unpeer --leave-volumes: not refused, the retained claim named and left on the provider",
        async { unpeer_leaving_volumes(&bed).await },
    )
    .await;
}

/// `fabricctl unpeer --leave-volumes` while the provider retains a claim of this cluster: the
/// unpeer is not refused (see [`forget_volumes`] for the refusal without the flag); it names
/// the claim it leaves to the provider's admin before it touches anything, and the claim stays
/// on the provider with its data. (The unpeer itself then needs this cluster's sharing
/// controllers, which this bed does not run: it stops at the missing cluster identity. The
/// peering tests run the rest of it.)
async fn unpeer_leaving_volumes(bed: &Bed) {
    const LEFT: &str = "left";
    let twin = format!("{LEFT}-{CONSUMER}");
    bed.consumer.kubectl_ok(&["create", "namespace", LEFT]);
    apply(
        &bed.consumer,
        &json!({"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": "offloading", "namespace": LEFT}, "spec": {}}),
    );
    set_mappings(bed, json!([{"home": LEFT, "remote": twin}])).await;
    bed.eventually("the left twin made", || async {
        provider_namespace(bed, &twin).filter(|d| !d).map(|_| ())
    })
    .await;
    apply(
        &bed.consumer,
        &claim_in(LEFT, "data", Some(NODE), json!({})),
    );
    let uid = bed
        .eventually("data in the left twin", || async {
            let o = bed.provider.kubectl(&[
                "get",
                "pvc",
                "data",
                "-n",
                &twin,
                "-o",
                "jsonpath={.metadata.uid}",
            ]);
            o.status
                .success()
                .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
        })
        .await;
    set_mappings(bed, json!([])).await;
    bed.eventually("data retained", || async {
        (retained(bed) == [format!("{twin}/data")]).then_some(())
    })
    .await;
    let o = fabric_tests::process::fabricctl(
        &bed.consumer.kubeconfig,
        &[
            "unpeer",
            PROVIDER,
            "--leave-volumes",
            "--timeout-secs",
            "60",
        ],
    );
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("left to its admin (--leave-volumes)")
            && out.contains(&format!("{twin}/data (1Gi, {LENT}) (of {LEFT})"))
            && !out.contains("Delete them first"),
        "{out}"
    );
    let left = in_twin(bed, &twin, "persistentvolumeclaim", "data").expect("data stays");
    assert!(
        left["metadata"]["uid"] == uid.as_str() && left["metadata"]["deletionTimestamp"].is_null(),
        "{left}"
    );
}

/// The NamespaceMap on the provider as the consumer's controller writes it (its identity, its
/// field manager): `mappings` whole.
async fn set_mappings(bed: &Bed, mappings: Value) {
    let maps: Api<NamespaceMap> = as_consumer_in(bed, &names::namespace::tenant(CONSUMER)).await;
    let map = json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceMap",
        "metadata": {"name": CONSUMER},
        "spec": {"clusterId": CONSUMER, "namespaces": mappings},
    });
    maps.patch(
        CONSUMER,
        &PatchParams::apply(names::field_manager::NAMESPACE_OFFLOADING).force(),
        &Patch::Apply(&map),
    )
    .await
    .unwrap();
}

/// The provider's NamespaceMap of the consumer, as its admin reads it.
fn provider_map(bed: &Bed) -> Value {
    let o = bed.provider.kubectl_ok(&[
        "get",
        "namespacemap",
        CONSUMER,
        "-n",
        &names::namespace::tenant(CONSUMER),
        "-o",
        "json",
    ]);
    serde_json::from_str(&o).unwrap()
}

/// The retained claims the provider reports, as `namespace/name`.
fn retained(bed: &Bed) -> Vec<String> {
    let map = provider_map(bed);
    map["status"]["retained"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}/{}",
                c["namespace"].as_str().unwrap(),
                c["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Namespace `name` on the provider: None when gone, else whether it is being deleted.
fn provider_namespace(bed: &Bed, name: &str) -> Option<bool> {
    let o = bed
        .provider
        .kubectl(&["get", "namespace", name, "-o", "json"]);
    let ns: Value = o
        .status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).ok())
        .flatten()?;
    Some(!ns["metadata"]["deletionTimestamp"].is_null())
}

const SCRATCH: &str = "scratch";

fn scratch_twin() -> String {
    format!("{SCRATCH}-{CONSUMER}")
}

/// A namespace offloaded with `storageRetention: Delete` (the provider marks its twin so): a
/// claim made there by the virtual kubelet goes with the twin once the mapping is withdrawn.
async fn unoffloaded_under_delete(bed: &Bed) {
    let twin = scratch_twin();
    bed.consumer.kubectl_ok(&["create", "namespace", SCRATCH]);
    apply(
        &bed.consumer,
        &json!({"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": "offloading", "namespace": SCRATCH},
                "spec": {"storageRetention": "Delete"}}),
    );
    set_mappings(
        bed,
        json!([{"home": SCRATCH, "remote": twin, "storageRetention": "Delete"}]),
    )
    .await;
    bed.eventually("the scratch twin made", || async {
        provider_namespace(bed, &twin).filter(|d| !d).map(|_| ())
    })
    .await;
    let ns = bed
        .provider
        .kubectl_ok(&["get", "namespace", &twin, "-o", "json"]);
    let ns: Value = serde_json::from_str(&ns).unwrap();
    assert_eq!(
        ns["metadata"]["annotations"][names::annotation::STORAGE_RETENTION],
        "Delete",
        "{ns}"
    );
    apply(
        &bed.consumer,
        &claim_in(SCRATCH, "tmp", Some(NODE), json!({})),
    );
    bed.eventually("tmp in the scratch twin", || async {
        let o = bed.provider.kubectl(&["get", "pvc", "tmp", "-n", &twin]);
        o.status.success().then_some(())
    })
    .await;
    set_mappings(bed, json!([])).await;
    bed.eventually("the scratch twin removed with its claim", || async {
        provider_namespace(bed, &twin)
            .is_none_or(|deleting| deleting)
            .then_some(())
    })
    .await;
    assert!(
        !retained(bed).iter().any(|c| c.starts_with(&twin)),
        "nothing kept under Delete: {}",
        provider_map(bed)
    );
}

/// The store (its twin made before the mark existed in this test: no mark is `Retain`, the
/// default) unoffloaded: the twin stays for the claims the fabric made there, which the
/// consumer's own identity can no longer read, change or delete; the provider reports them,
/// and not the admin's claim beside them. Returns the retained claim `kept`'s UID.
async fn unoffloaded_under_retain(bed: &Bed) -> String {
    let twin = store_twin();
    apply(&bed.consumer, &claim("kept", Some(NODE), json!({})));
    // (Refused, and retried with back-off, while a charge of the phases before holds the
    // grant: one whose claim was refused further down lapses only after --pending-ttl.)
    let remote = bed
        .within("kept in the twin", Duration::from_secs(90), || async {
            in_store_twin(bed, "persistentvolumeclaim", "kept")
        })
        .await;
    let uid = remote["metadata"]["uid"].as_str().unwrap().to_owned();
    let claims: Api<PersistentVolumeClaim> = as_consumer(bed).await;
    claims
        .get("kept")
        .await
        .expect("the consumer reads its claim while offloaded");
    set_mappings(bed, json!([])).await;
    bed.eventually("the provider done with the store's mapping", || async {
        let map = provider_map(bed);
        let listed = map["status"]["namespaces"]
            .as_array()
            .is_some_and(|l| l.iter().any(|t| t["home"] == STORE));
        (!listed).then_some(())
    })
    .await;
    assert_eq!(
        provider_namespace(bed, &twin),
        Some(false),
        "the twin removed (or being removed) with the claims in it: their data is gone"
    );
    let still = in_store_twin(bed, "persistentvolumeclaim", "kept");
    assert!(
        still
            .as_ref()
            .is_some_and(|c| c["metadata"]["uid"] == uid.as_str()
                && c["metadata"]["deletionTimestamp"].is_null()),
        "kept deleted with the twin, its data gone: {still:?}"
    );
    bed.eventually("the claims retained, reported on the map", || async {
        let mut kept = retained(bed);
        kept.sort();
        (kept == [format!("{twin}/kept"), format!("{twin}/quick")]).then_some(())
    })
    .await;
    let map = provider_map(bed);
    let entry = map["status"]["retained"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "kept")
        .unwrap()
        .clone();
    assert_eq!(
        entry,
        json!({"namespace": twin, "home": STORE, "name": "kept", "uid": uid,
               "size": "1Gi", "class": LENT}),
        "{map}"
    );
    assert!(
        map["status"]["namespaces"]
            .as_array()
            .is_none_or(|l| l.is_empty()),
        "the twin is no longer the consumer's: {map}"
    );
    assert_eq!(
        provider_namespace(bed, &twin),
        Some(false),
        "the twin stays for its claims"
    );
    let still = in_store_twin(bed, "persistentvolumeclaim", "kept").expect("kept stays");
    assert_eq!(still["metadata"]["uid"], uid.as_str());
    assert!(
        in_store_twin(bed, "persistentvolumeclaim", "theirs").is_some(),
        "the admin's claim untouched"
    );
    // With the consumer's own identity: nothing of them any more.
    bed.eventually("the consumer's rights in the twin gone", || async {
        in_store_twin(bed, "rolebinding", fabric_auth::tenant::ROLE)
            .is_none()
            .then_some(())
    })
    .await;
    let forbidden = |what: &str, r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("the consumer's identity {what} a retained claim: {other:?}"),
    };
    bed.within(
        "the consumer's identity refused",
        Duration::from_secs(10),
        || async {
            claims
                .get("kept")
                .await
                .err()
                .filter(|e| matches!(e, kube::Error::Api(a) if a.code == 403))
                .map(|_| ())
        },
    )
    .await;
    forbidden("read", claims.get("kept").await.map(|_| ()));
    let label = json!({"metadata": {"labels": {"taken": "yes"}}});
    forbidden(
        "changed",
        claims
            .patch("kept", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .map(|_| ()),
    );
    forbidden(
        "deleted",
        claims.delete("kept", &Default::default()).await.map(|_| ()),
    );
    forbidden("listed", claims.list(&Default::default()).await.map(|_| ()));
    let again = in_store_twin(bed, "persistentvolumeclaim", "kept").expect("kept stays");
    assert!(again["metadata"]["labels"]["taken"].is_null(), "{again}");
    uid
}

/// `fabricctl move volume` (issue 21) checks before it writes anything: a destination that
/// is neither `local` nor a provider is refused naming the providers; a claim a running pod
/// mounts (db, on the provider) is refused naming the pod (a volume moves offline). Neither
/// touches the claim.
async fn move_refused(bed: &Bed) {
    let run = |args: &[&str]| fabricctl_at_home(bed, args);
    let before = home_claim(bed, "data").unwrap();
    let target = format!("{STORE}/data");
    let (ok, out) = run(&["move", "volume", &target, "--to", "nowhere"]);
    assert!(
        !ok && out.contains("--to nowhere") && out.contains(&format!("providers: {PROVIDER}")),
        "an unknown cluster refused: {out}"
    );
    let (ok, out) = run(&["move", "volume", &target, "--to", "local"]);
    assert!(
        !ok && out.contains("in use by pod(s) db") && out.contains("scale"),
        "a claim in use refused naming the pod: {out}"
    );
    let after = home_claim(bed, "data").unwrap();
    assert_eq!(
        (&after["spec"], &after["metadata"]["resourceVersion"]),
        (&before["spec"], &before["metadata"]["resourceVersion"]),
        "the claim untouched"
    );
}

/// `fabricctl ARGS` at home as its admin: whether it succeeded, and what it said.
fn fabricctl_at_home(bed: &Bed, args: &[&str]) -> (bool, String) {
    let o = fabric_tests::process::fabricctl(&bed.consumer.kubeconfig, args);
    (o.status.success(), fabric_tests::process::output_text(&o))
}

/// `fabricctl forget volumes` at home, with the consumer's identity: one claim by name (said
/// first), then the rest; the twin goes once it holds none.
async fn forget_volumes(bed: &Bed, kept_uid: &str) {
    let twin = store_twin();
    let run = |args: &[&str]| fabricctl_at_home(bed, args);
    // Unpeering now would leave them where nobody here could see or forget them: refused,
    // naming them, and nothing of the peering touched.
    let (ok, out) = run(&["unpeer", PROVIDER, "--timeout-secs", "20"]);
    assert!(
        !ok && out.contains(&format!("{twin}/kept (1Gi, {LENT}) (of {STORE})"))
            && out.contains(&format!("{twin}/quick"))
            && out.contains("--leave-volumes"),
        "{out}"
    );
    assert!(
        bed.consumer
            .kubectl(&["get", "foreigncluster", PROVIDER])
            .status
            .success(),
        "the refused unpeer deleted nothing: {out}"
    );
    let (ok, out) = run(&[
        "forget",
        "volumes",
        "--peer",
        PROVIDER,
        "--claim",
        "store/nothing",
    ]);
    assert!(!ok && out.contains("no such retained claim"), "{out}");
    let (ok, out) = run(&[
        "forget",
        "volumes",
        "--peer",
        PROVIDER,
        "--claim",
        "store/kept",
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("{twin}/kept (1Gi, {LENT}) (of {STORE})")),
        "said before: {out}"
    );
    assert!(
        in_store_twin(bed, "persistentvolumeclaim", "kept")
            .is_none_or(|c| c["metadata"]["uid"] != kept_uid
                || !c["metadata"]["deletionTimestamp"].is_null()),
        "kept deleted"
    );
    assert_eq!(retained(bed), [format!("{twin}/quick")]);
    assert_eq!(
        provider_namespace(bed, &twin),
        Some(false),
        "quick still holds the twin"
    );
    // The provider's admin deletes the other one: its claims are watched, so the report and
    // the twin follow at once (they were polled every 10 s before; the poll is now a minute).
    bed.provider
        .kubectl_ok(&["delete", "pvc", "quick", "-n", &twin, "--wait=false"]);
    bed.within(
        "the twin gone once empty",
        Duration::from_secs(5),
        || async {
            (provider_namespace(bed, &twin).is_none_or(|deleting| deleting)
                && retained(bed).is_empty())
            .then_some(())
        },
    )
    .await;
    let (ok, out) = run(&["forget", "volumes", "--peer", PROVIDER]);
    assert!(ok && out.contains("keeps no claims"), "{out}");
}

/// The consumer's ResourceSlice (its replica on the provider, written with the consumer's own
/// identity as its negotiation writes it) asks for storage, lent and not; the provider's
/// policy grants what is lent, naming the default class; the VirtualNode the consumer's
/// negotiation makes of that grant ([`fabric_negotiation::slices::virtual_node`]) lends those
/// classes, and goes to the virtual kubelet.
async fn storage_negotiated(bed: &Bed) {
    let tenant = names::namespace::tenant(CONSUMER);
    let slices: Api<ResourceSlice> = as_consumer_in(bed, &tenant).await;
    let ask = json!({"spec": {"resources": {
        lent::resource(LENT): "8Gi", lent::resource("fast"): "1Gi", lent::resource("gold"): "1Gi"}}});
    slices
        .patch(CONSUMER, &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .expect("the consumer asks for storage");
    let slice = bed
        .eventually("the provider grants the storage it lends", || async {
            let s = slices.get(CONSUMER).await.ok()?;
            let st = s.status.as_ref()?;
            (st.granted.get(&lent::resource(LENT)).map(|q| q.0.as_str()) == Some("8Gi"))
                .then_some(s)
        })
        .await;
    let st = slice.status.as_ref().unwrap();
    assert_eq!(st.granted[&lent::resource("fast")].0, "1Gi", "{st:?}");
    assert!(!st.granted.contains_key(&lent::resource("gold")), "{st:?}");
    assert_eq!(st.granted["cpu"].0, "1", "the rest as before: {st:?}");
    assert_eq!(st.default_storage_class.as_deref(), Some(LENT), "{st:?}");
    let accepted = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .unwrap();
    assert!(
        accepted.message.contains(
            "storage.fabric.io/gold: 0 of 1Gi (this cluster does not lend that StorageClass)"
        ),
        "{accepted:?}"
    );
    let vn = fabric_negotiation::slices::virtual_node(PROVIDER, NS, [&slice]).unwrap();
    let storage = vn.spec.storage.clone().expect("storage granted");
    assert_eq!(
        storage,
        Storage {
            classes: vec!["fast".into(), LENT.into()],
            default: Some(LENT.into()),
        }
    );
    assert!(
        !vn.spec
            .resources
            .keys()
            .any(|r| r.starts_with(lent::RESOURCE_PREFIX)),
        "storage is no resource of the Node: {:?}",
        vn.spec.resources
    );
    apply(
        &bed.consumer,
        &fixture::virtual_node(json!({"storage": storage})),
    );
}

/// With the consumer's own identity, in its twin, where the admin's claim `theirs` (5Gi of
/// the class) stands: a claim past what is left of the 8Gi granted of the class is refused,
/// saying the class, the size asked and what is left; what is left fits; past it, nothing.
async fn consumer_claims_charged(bed: &Bed) {
    let claims: Api<PersistentVolumeClaim> = as_consumer(bed).await;
    let twin = store_twin();
    let sized = |name: &str, size: &str| {
        serde_json::from_value::<PersistentVolumeClaim>(json!({"metadata": {"name": name},
            "spec": {"storageClassName": LENT, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}}}))
        .unwrap()
    };
    let err = claims
        .create(&Default::default(), &sized("big", "4Gi"))
        .await
        .expect_err("a claim past the grant of its class");
    let says = format!(
        "claim {twin}/big: 4Gi of StorageClass {LENT} asked; consumer \"{CONSUMER}\" was granted 8Gi of it"
    );
    assert!(err.to_string().contains(&says), "{err}");
    assert!(err.to_string().contains("is left"), "{err}");
    // What is left (8Gi - theirs' 5Gi) fits, once charges of claims gone have lapsed.
    bed.within("what is left taken", Duration::from_secs(60), || async {
        claims
            .create(&Default::default(), &sized("fits", "3Gi"))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    let err = claims
        .create(&Default::default(), &sized("more", "1Mi"))
        .await
        .expect_err("nothing is left");
    assert!(
        err.to_string().contains(&format!(
            "claim {twin}/more: 1Mi of StorageClass {LENT} asked; consumer \"{CONSUMER}\" was granted 8Gi of it, 8Gi is claimed, 0 is left"
        )),
        "{err}"
    );
    // The other class is its own grant.
    claims
        .create(&Default::default(), &{
            let mut c = sized("other-class", "1Mi");
            c.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
            c
        })
        .await
        .expect_err("fast's 1Gi is taken by quick");
    // A claim deleted gives its share back.
    claims.delete("fits", &Default::default()).await.unwrap();
    bed.within(
        "the share of a deleted claim back",
        Duration::from_secs(60),
        || async {
            claims
                .create(&Default::default(), &sized("again", "3Gi"))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
    claims.delete("again", &Default::default()).await.unwrap();
}

/// With the consumer's own identity, in its twin: claims naming a provider's volume (another
/// tenant's, a hostPath one), selecting volumes, taking data of another namespace, of a class
/// not lent; a ShadowPod mounting a claim of another namespace.
async fn consumer_claims_attack(bed: &Bed) {
    apply(
        &bed.provider,
        &json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": "provider-disk"},
                "spec": {"storageClassName": LENT, "accessModes": ["ReadWriteOnce"],
                         "capacity": {"storage": "1Gi"}, "hostPath": {"path": "/var/lib"}}}),
    );
    let claims: Api<PersistentVolumeClaim> = as_consumer(bed).await;
    let attempt = |name: &str, spec: Value| {
        let mut s = json!({"storageClassName": LENT, "accessModes": ["ReadWriteOnce"],
                           "resources": {"requests": {"storage": "1Gi"}}});
        merge(&mut s, spec);
        serde_json::from_value::<PersistentVolumeClaim>(
            json!({"metadata": {"name": name}, "spec": s}),
        )
        .unwrap()
    };
    for (name, spec, says) in [
        (
            "steal",
            json!({"volumeName": "provider-disk"}),
            "names no PersistentVolume",
        ),
        (
            "pick",
            json!({"selector": {"matchLabels": {"tenant": "other"}}}),
            "selects no existing",
        ),
        (
            "gold",
            json!({"storageClassName": "gold"}),
            "does not lend StorageClass gold",
        ),
        (
            "classless",
            json!({"storageClassName": null}),
            "does not lend",
        ),
    ] {
        let err = claims
            .create(&Default::default(), &attempt(name, spec))
            .await
            .expect_err(name);
        assert!(err.to_string().contains(says), "{name}: {err}");
    }
    // Data of another namespace: refused, or not taken at all (the API server drops the
    // field while cross-namespace data sources are off).
    let other = attempt(
        "copy",
        json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "secret-data",
                                 "namespace": "fabric-tenant-other"}}),
    );
    match claims.create(&Default::default(), &other).await {
        Err(e) => assert!(e.to_string().contains("another namespace"), "{e}"),
        Ok(c) => {
            let r = c.spec.and_then(|s| s.data_source_ref);
            assert!(
                r.and_then(|r| r.namespace).is_none(),
                "another namespace's data taken"
            );
            claims.delete("copy", &Default::default()).await.unwrap();
        }
    }
    // A plain one of a lent class: the consumer's to make.
    claims
        .create(&Default::default(), &attempt("plain", json!({})))
        .await
        .unwrap();
    claims.delete("plain", &Default::default()).await.unwrap();
    // A ShadowPod mounting a claim that is not one of its own namespace.
    let shadows: Api<ShadowPod> = as_consumer(bed).await;
    let mut evil = raw_shadow("evil", "100m");
    evil.metadata.namespace = None;
    evil.spec.home.namespace = STORE.into();
    let spec = &mut evil.spec.pod.spec;
    spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "d",
            "persistentVolumeClaim": {"claimName": "fabric-tenant-other/data"}}))
        .unwrap(),
    ]);
    let err = shadows
        .create(&Default::default(), &evil)
        .await
        .expect_err("a ShadowPod mounting another namespace's claim");
    assert!(err.to_string().contains("claimName"), "{err}");
}

/// With the virtual kubelet's own ServiceAccount at home: a volume that is not a placeholder
/// (a hostPath one), one pinned to another node, one bound to a claim of a namespace not
/// offloaded; deleting a volume that is not one of its placeholders.
async fn virtual_kubelet_volumes_attack(bed: &Bed) {
    let kubeconfig = rights::component_kubeconfig(
        &bed.consumer,
        &fixture::virtual_kubelet_name(),
        bed.dir.join("vk-attacker.kubeconfig"),
    )
    .unwrap();
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(cfg).unwrap();
    let volumes: Api<PersistentVolume> = Api::all(client);
    bed.consumer
        .kubectl_ok(&["create", "namespace", "elsewhere"]);
    apply(
        &bed.consumer,
        &claim_in("elsewhere", "loot", Some(NODE), json!({})),
    );
    let placeholder = |name: &str, extra: Value| {
        let mut pv = json!({"metadata": {"name": name,
                "annotations": {names::storage::PROVISIONED_BY: names::storage::PROVISIONER}},
            "spec": {"storageClassName": "fabric", "accessModes": ["ReadWriteOnce"],
                     "capacity": {"storage": "1Gi"},
                     "claimRef": {"namespace": STORE, "name": "theirs", "uid": "u"},
                     "csi": {"driver": names::storage::PROVISIONER, "volumeHandle": "u"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}});
        merge(&mut pv["spec"], extra);
        serde_json::from_value::<PersistentVolume>(pv).unwrap()
    };
    for (name, extra, says) in [
        (
            "host",
            json!({"csi": null, "hostPath": {"path": "/etc"}}),
            "writes only placeholder volumes",
        ),
        (
            "pinned-elsewhere",
            json!({"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["worker-1"]}]}]}}}),
            "pinned to its own node",
        ),
        (
            "no-pin",
            json!({"nodeAffinity": null}),
            "pinned to its own node",
        ),
        (
            "not-offloaded",
            json!({"claimRef": {"namespace": "elsewhere", "name": "loot", "uid": "u"}}),
            "namespace offloaded to its provider",
        ),
        (
            "other-class",
            json!({"storageClassName": LENT}),
            "writes only placeholder",
        ),
    ] {
        let mut pv = placeholder(name, json!({}));
        let mut v = serde_json::to_value(&pv).unwrap();
        merge(&mut v["spec"], extra);
        if let Some(spec) = v["spec"].as_object_mut() {
            spec.retain(|_, x| !x.is_null());
        }
        pv = serde_json::from_value(v).unwrap();
        let err = volumes
            .create(&Default::default(), &pv)
            .await
            .expect_err(name);
        assert!(err.to_string().contains(says), "{name}: {err}");
    }
    // What it may make: a placeholder of a claim of the offloaded namespace, on its node.
    volumes
        .create(&Default::default(), &placeholder("fine", json!({})))
        .await
        .unwrap();
    volumes.delete("fine", &Default::default()).await.unwrap();
    // Someone else's volume: not its to delete.
    apply(
        &bed.consumer,
        &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "local-disk"},
                "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
                         "capacity": {"storage": "1Gi"}, "hostPath": {"path": "/srv"}}}),
    );
    let err = volumes
        .delete("local-disk", &Default::default())
        .await
        .expect_err("deleting a volume not its own");
    assert!(err.to_string().contains("placeholder"), "{err}");
    assert!(volume(bed, "local-disk").is_some());
}
