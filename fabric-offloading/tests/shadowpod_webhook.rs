//! The provider's ShadowPod webhook (`fabric-controller shadowpod-webhook`) registered with a
//! real API server (RBAC and client certificates on), as deploy/ registers it: kubelite calls
//! it through its Service and an EndpointSlice pointing at 127.0.0.1, verifying it against the
//! caBundle the webhook wrote itself. Consumers' identities are client certificates as their
//! authentication service would have them signed. A ShadowPod outside the consumer's tenant
//! namespace, for another consumer, or over the grant is refused with a clear message; so is
//! one whose pod breaks the provider's policy (the consumer's own credentials writing it
//! directly: `nodeName`, privileged, `hostPID`, a `hostPath: /`), created or updated, the
//! refusal naming the field; within the grant a plain pod is admitted; a finished one releases its share; the provider's admin is not
//! limited; garbage gets a 400. Only the API server may call it (its client certificate, as
//! its AdmissionConfiguration presents it): a raw client without one, or with another name's
//! or another CA's, is refused before any decision. Two replicas run behind the Service (a round-robin proxy
//! spreads the API server's connections over them, as a Service does): creations racing for
//! the last share, through the API server and straight at both replicas, admit exactly one;
//! the usage charged on the Tenant converges to what the ShadowPods request (a charge whose
//! creation never happened lapses, deleted ShadowPods release theirs).
use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, ResourceSliceSpec, Tenant},
    names,
    offloading::v1alpha1::ShadowPod,
};
use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
    process::Bin,
    sharing::{admit_tenant, consumer_credentials},
    wait::eventually,
    webhook::Caller,
};
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
const NS: &str = names::DEFAULT_NAMESPACE;

fn shadow(name: &str, namespace: &str, cluster: &str, cpu: &str) -> ShadowPod {
    let mut s: ShadowPod = serde_json::from_value(json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": name},
        "spec": {
            "clusterId": cluster,
            "home": {"namespace": "shop", "name": name, "uid": format!("home-{name}")},
            "pod": {"spec": {"containers": [{"name": "main", "image": "echo",
                "resources": {"requests": {"cpu": cpu}}}]}},
        },
    }))
    .unwrap();
    s.metadata.namespace = Some(namespace.to_owned());
    s
}

/// Creates a ShadowPod as `client`; the API server's refusal message if refused.
async fn create(client: &Client, s: &ShadowPod) -> Result<(), String> {
    let ns = s.metadata.namespace.clone().unwrap();
    Api::<ShadowPod>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), s)
        .await
        .map(|_| ())
        .map_err(|e| match e {
            kube::Error::Api(e) => format!("{} ({})", e.message, e.code),
            e => e.to_string(),
        })
}

/// Creates `s` as `client` once the webhook admits it (its caches may not show the grant
/// yet).
async fn create_admitted(client: &Client, s: &ShadowPod) {
    let what = format!(
        "{} admitted",
        s.metadata.name.as_deref().unwrap_or_default()
    );
    eventually(&what, T, || async {
        create(client, s)
            .await
            .inspect_err(|e| eprintln!("not yet: {e}"))
            .ok()
    })
    .await;
}

async fn consumer_client(api: &ApiServer, consumer: &str) -> Client {
    let creds = consumer_credentials(api, consumer).unwrap();
    let kc = fabric_auth::identity::to_yaml(&fabric_auth::identity::kubeconfig("provider", &creds));
    fabric_auth::identity::client_from_kubeconfig(&kc)
        .await
        .unwrap()
}

/// The ValidatingWebhookConfiguration of deploy/, as `kubectl apply -k deploy/` installs it.
fn deployed_config() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/shadowpod-webhook.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---\n")
        .find(|d| d.contains("kind: ValidatingWebhookConfiguration"))
        .expect("deploy/ registers the webhook")
        .to_owned()
}

/// A Service's spreading of connections: each one accepted on `listener` goes to the next
/// of `backends` (on 127.0.0.1), bytes relayed as they are (TLS ends at the webhook).
async fn round_robin(listener: tokio::net::TcpListener, backends: Vec<u16>) {
    let mut next = 0;
    while let Ok((mut inbound, _)) = listener.accept().await {
        let port = backends[next % backends.len()];
        next += 1;
        tokio::spawn(async move {
            if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The CPU a Tenant's status says its ShadowPods use, if any.
async fn used_cpu(admin: &Client, consumer: &str) -> Option<String> {
    let t = Api::<Tenant>::namespaced(admin.clone(), &names::namespace::tenant(consumer))
        .get(consumer)
        .await
        .unwrap();
    t.status?.used.get("cpu").map(|q| q.0.clone())
}

/// An AdmissionReview of consumer `cluster` creating ShadowPod `name` in its tenant namespace.
fn review_of(cluster: &str, name: &str, cpu: &str) -> Value {
    let ns = names::namespace::tenant(cluster);
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{name}"), "operation": "CREATE", "name": name, "namespace": ns,
            "kind": {"group": "offloading.fabric.io", "version": "v1alpha1", "kind": "ShadowPod"},
            "resource": {"group": "offloading.fabric.io", "version": "v1alpha1", "resource": "shadowpods"},
            "userInfo": {"username": names::user::consumer(cluster)},
            "object": shadow(name, &ns, cluster, cpu),
        },
    })
}

/// curl's HTTP status for POSTing `body` to the webhook by its Service name, trusting `ca`,
/// presenting `client` (certificate and key files) if any: `000` when TLS fails.
fn post(
    dir: &Path,
    port: u16,
    ca: &str,
    client: Option<(PathBuf, PathBuf)>,
    body: &[u8],
) -> String {
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, ca).unwrap();
    let body_file = dir.join("body");
    std::fs::write(&body_file, body).unwrap();
    let host = format!("{}.{NS}.svc", names::webhook::SHADOWPODS_SERVICE);
    let mut curl = Command::new("curl");
    if let Some((cert, key)) = client {
        curl.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let o = curl
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(&ca_file)
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", body_file.display()))
        .arg(format!(
            "https://{host}:{port}{}",
            names::webhook::SHADOWPODS_PATH
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether the webhook at `port` admits each of `bodies` (AdmissionReviews), all posted at
/// once, each by its own curl presenting the API server's certificate.
fn post_all(dir: &Path, ca: &str, caller: &Caller, bodies: &[(u16, Value)]) -> Vec<bool> {
    let (cert, key) = caller.cert_and_key();
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, ca).unwrap();
    let host = format!("{}.{NS}.svc", names::webhook::SHADOWPODS_SERVICE);
    let children: Vec<_> = bodies
        .iter()
        .enumerate()
        .map(|(i, (port, body))| {
            let body_file = dir.join(format!("race-{i}"));
            std::fs::write(&body_file, body.to_string()).unwrap();
            Command::new("curl")
                .arg("--cert")
                .arg(&cert)
                .arg("--key")
                .arg(&key)
                .args(["-sS", "--cacert"])
                .arg(&ca_file)
                .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
                .args(["-H", "Content-Type: application/json", "--data-binary"])
                .arg(format!("@{}", body_file.display()))
                .arg(format!(
                    "https://{host}:{port}{}",
                    names::webhook::SHADOWPODS_PATH
                ))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            let v: Value = serde_json::from_slice(&o.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
            v["response"]["allowed"] == true
        })
        .collect()
}

/// Grants `consumer` 1 CPU, 1 GiB and 10 pods through a ResourceSlice in its tenant namespace.
async fn grant(admin: &Client, consumer: &str) {
    let ns = names::namespace::tenant(consumer);
    let slices = Api::<ResourceSlice>::namespaced(admin.clone(), &ns);
    let mut slice = ResourceSlice::new(
        consumer,
        ResourceSliceSpec {
            consumer_cluster_id: consumer.into(),
            provider_cluster_id: "provider".into(),
            resources: Default::default(),
            at_most_once: None,
        },
    );
    slice.metadata.namespace = Some(ns);
    slices.create(&PostParams::default(), &slice).await.unwrap();
    slices
        .patch_status(
            consumer,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"granted": {"cpu": "1", "memory": "1Gi", "pods": "10"}}}),
            ),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_keeps_consumers_in_their_namespaces_and_grants() {
    if !require_tools("the_webhook_keeps_consumers_in_their_namespaces_and_grants") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("fabric-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The API server presents its client certificate to the webhook.
    let caller = Caller::new(&dir.join("caller")).unwrap();
    let api = ApiServer::start_with_auth_args("webhook", &caller.kubelite_args());
    api.install_crds();
    let admin = api.client().await;
    api.kubectl_ok(&["create", "namespace", NS]);

    // Two replicas of the webhook on 127.0.0.1, reached as the Service of deploy/ through an
    // EndpointSlice pointing at a proxy that spreads connections over them.
    let port = free_port();
    let replicas = [free_port(), free_port()];
    let proxy = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(round_robin(proxy, replicas.to_vec()));
    let service = names::webhook::SHADOWPODS_SERVICE;
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": service, "namespace": NS},
         "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": service, "namespace": NS,
                      "labels": {"kubernetes.io/service-name": service}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    ]});
    let o = api.kubectl_stdin(&["apply", "-f", "-"], &objects.to_string());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = api.kubectl_stdin(&["apply", "-f", "-"], &deployed_config());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // As its pods: the webhook's ServiceAccount's token, with the rights deploy/ gives it.
    let kubeconfig = fabric_tests::rights::component_kubeconfig(
        &api,
        "fabric-shadowpod-webhook",
        dir.join("webhook.kubeconfig"),
    )
    .unwrap();
    let _webhooks: Vec<ChildGuard> = replicas
        .iter()
        .enumerate()
        .map(|(i, port)| {
            // `fabric-controller`, built by `cargo build --workspace --bins`.
            Bin::new("fabric-controller")
                .unwrap()
                .kubeconfig(&kubeconfig)
                .rust_log("info,fabric_offloading=debug")
                .args([
                    "shadowpod-webhook",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--pending-ttl",
                    "5s",
                    // Three ShadowPods per tenant at most: what one consumer puts into the
                    // provider's store is bounded, finished ones included.
                    "--max-shadowpods-per-tenant",
                    "3",
                    // And 1 MiB of them per tenant.
                    "--max-shadowpod-bytes-per-tenant",
                    "1Mi",
                    // The one runtime class the provider lends tenants.
                    "--tenant-runtime-class",
                    "gvisor",
                    "--client-ca",
                    &caller.ca().display().to_string(),
                ])
                .log(dir.join(format!("webhook-{i}.log")))
                .spawn()
                .unwrap()
        })
        .collect();

    // It made its CA and put it into caBundle.
    let configs = Api::<ValidatingWebhookConfiguration>::all(admin.clone());
    let bundle = eventually("caBundle written", T, || async {
        let c = configs.get(names::webhook::SHADOWPODS_CONFIG).await.ok()?;
        c.webhooks?[0].client_config.ca_bundle.clone()
    })
    .await;
    let secret = Api::<Secret>::namespaced(admin.clone(), NS)
        .get(names::secret::SHADOWPOD_WEBHOOK_TLS)
        .await
        .unwrap();
    let ca = String::from_utf8(secret.data.unwrap()["ca.crt"].0.clone()).unwrap();
    assert_eq!(bundle.0, ca.as_bytes());

    // Two tenants; alpha granted 1 CPU. Alpha's user also gets (by an admin's mistake)
    // ShadowPods everywhere: the webhook, not RBAC, must keep it in its namespace.
    admit_tenant(&admin, "alpha").await.unwrap();
    admit_tenant(&admin, "beta").await.unwrap();
    let alpha_ns = names::namespace::tenant("alpha");
    let beta_ns = names::namespace::tenant("beta");
    grant(&admin, "alpha").await;
    let too_broad = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "too-broad"},
         "rules": [{"apiGroups": ["offloading.fabric.io"], "resources": ["shadowpods"],
                    "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "too-broad"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "too-broad"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": names::user::consumer("alpha")}]},
    ]});
    let o = api.kubectl_stdin(&["apply", "-f", "-"], &too_broad.to_string());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let alpha = consumer_client(&api, "alpha").await;
    let beta = consumer_client(&api, "beta").await;

    // Within the grant: admitted (once the webhook's caches show the grant).
    create_admitted(&alpha, &shadow("web", &alpha_ns, "alpha", "600m")).await;

    // Over the grant: refused at once, with the numbers (the creation just admitted counts
    // even before the webhook's cache shows it). Once the other replica's cache shows the
    // grant too: until then it measures against none, refusing all the same.
    let e = eventually("both replicas see the grant", T, || async {
        let e = create(&alpha, &shadow("db", &alpha_ns, "alpha", "500m"))
            .await
            .unwrap_err();
        (!e.contains(" 0 granted")).then_some(e)
    })
    .await;
    assert!(
        e.contains(
            "cpu: 500m requested, 600m in use by live ShadowPods, 1 granted to consumer \"alpha\""
        ) && e.contains("(403)"),
        "{e}"
    );

    // Outside its tenant namespace: refused, even where RBAC lets it through.
    for ns in ["default", beta_ns.as_str()] {
        let e = create(&alpha, &shadow("stray", ns, "alpha", "100m"))
            .await
            .unwrap_err();
        assert!(
            e.contains(&format!(
                "namespace \"{ns}\" does not belong to consumer \"alpha\""
            )),
            "{e}"
        );
    }
    // Another consumer's identity: refused.
    let e = create(&beta, &shadow("imposter", &beta_ns, "alpha", "100m"))
        .await
        .unwrap_err();
    assert!(
        e.contains(
            "user \"fabric.io:consumer:beta\" may not create ShadowPods for consumer \"alpha\""
        ),
        "{e}"
    );
    // The provider decides what runs on it: the consumer's own identity writing a ShadowPod
    // straight to the API server (no virtual kubelet, no forge) to be root on a node.
    let mut attack = shadow("root", &alpha_ns, "alpha", "100m");
    attack.spec.pod.spec = serde_json::from_value(json!({
        "nodeName": "control-plane-0",
        "hostPID": true,
        "containers": [{"name": "main", "image": "echo",
                        "securityContext": {"privileged": true},
                        "volumeMounts": [{"name": "root", "mountPath": "/host"}]}],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    }))
    .unwrap();
    let e = create(&alpha, &attack).await.unwrap_err();
    assert!(
        e.contains("spec.pod.spec.nodeName: the provider's scheduler places tenants' pods")
            && e.contains("(403)"),
        "{e}"
    );
    // Each part alone is refused too, naming its field.
    let parts = [
        (
            "hostPID",
            "spec.pod.spec.hostPID: sharing the host's namespaces",
        ),
        (
            "privileged",
            "spec.pod.spec.containers[0].securityContext.privileged",
        ),
        (
            "hostPath",
            "spec.pod.spec.volumes[0].hostPath: hostPath volumes are not allowed",
        ),
    ];
    for (part, field) in parts {
        let mut one = shadow("root", &alpha_ns, "alpha", "100m");
        let spec = &mut one.spec.pod.spec;
        match part {
            "hostPID" => spec.host_pid = Some(true),
            "privileged" => {
                spec.containers[0].security_context =
                    attack.spec.pod.spec.containers[0].security_context.clone()
            }
            _ => spec.volumes = attack.spec.pod.spec.volumes.clone(),
        }
        let e = create(&alpha, &one).await.unwrap_err();
        assert!(e.contains(field), "{part}: {e}");
    }
    // Where it runs is the provider's too: beside the control plane by a toleration of its
    // taint, on one node by a selector or an affinity, over the provider's own pods by a
    // priority class.
    let placed = [
        (
            json!({"tolerations": [{"key": "node-role.kubernetes.io/control-plane",
                                    "operator": "Exists", "effect": "NoSchedule"}]}),
            "spec.pod.spec.tolerations[0]: the provider chooses which taints tenants' pods tolerate",
        ),
        (
            json!({"tolerations": [{"operator": "Exists"}]}),
            "spec.pod.spec.tolerations[0]: ",
        ),
        (
            json!({"nodeSelector": {"kubernetes.io/hostname": "control-plane-0"}}),
            "spec.pod.spec.nodeSelector[\"kubernetes.io/hostname\"]: the provider chooses the nodes",
        ),
        (
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name",
                 "operator": "In", "values": ["control-plane-0"]}]}]}}}}),
            "spec.pod.spec.affinity.nodeAffinity: ",
        ),
        (
            json!({"priorityClassName": "system-node-critical"}),
            "spec.pod.spec.priorityClassName: the provider sets the priority",
        ),
        (
            json!({"schedulerName": "my-scheduler"}),
            "spec.pod.spec.schedulerName: ",
        ),
        // A runtime class the provider did not lend (one running pods as host processes,
        // say): its handler is the provider's node's, not the tenant's to pick.
        (
            json!({"runtimeClassName": "runc-host"}),
            "spec.pod.spec.runtimeClassName: this runtime class is not lent to tenants",
        ),
    ];
    for (extra, field) in placed {
        let mut one = shadow("placed", &alpha_ns, "alpha", "100m");
        let mut spec = serde_json::to_value(&one.spec.pod.spec).unwrap();
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        one.spec.pod.spec = serde_json::from_value(spec).unwrap();
        let e = create(&alpha, &one).await.unwrap_err();
        assert!(e.contains(field) && e.contains("(403)"), "{extra}: {e}");
    }
    // A pod spec of the wrong types (the schema keeps the pod spec open, as the pod's own
    // API version decides it): refused, saying where and why, and nothing stored.
    let resource = kube::discovery::ApiResource::erase::<ShadowPod>(&());
    let raw: Api<kube::core::DynamicObject> =
        Api::namespaced_with(alpha.clone(), &alpha_ns, &resource);
    let mistyped: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": "mistyped", "namespace": alpha_ns},
        "spec": {"clusterId": "alpha",
                 "home": {"namespace": "default", "name": "mistyped", "uid": "home-mistyped"},
                 "pod": {"spec": {"hostPID": "yes",
                                  "containers": [{"name": "main", "image": "echo",
                                                  "resources": {"requests": {"cpu": "1m"}}}]}}},
    }))
    .unwrap();
    let e = match raw.create(&PostParams::default(), &mistyped).await {
        Err(kube::Error::Api(e)) => e,
        other => panic!("a mistyped ShadowPod: {other:?}"),
    };
    assert!(
        e.code == 400 && e.message.contains("spec.pod.spec") && e.message.contains("hostPID"),
        "{e:?}"
    );
    assert!(raw.get_opt("mistyped").await.unwrap().is_none());
    // The runtime class it lends is admitted (dry run: the tenant's three pods stay free).
    let mut sandboxed = shadow("sandboxed", &alpha_ns, "alpha", "100m");
    sandboxed.spec.pod.spec.runtime_class_name = Some("gvisor".into());
    Api::<ShadowPod>::namespaced(alpha.clone(), &alpha_ns)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &sandboxed,
        )
        .await
        .unwrap();
    // An admitted plain pod made privileged by an UPDATE: refused, the pod left as it was.
    let alpha_shadows = Api::<ShadowPod>::namespaced(alpha.clone(), &alpha_ns);
    let mut web = alpha_shadows.get("web").await.unwrap();
    web.spec.pod.spec.containers[0].security_context =
        Some(serde_json::from_value(json!({"privileged": true})).unwrap());
    let e = alpha_shadows
        .replace("web", &PostParams::default(), &web)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "spec.pod.spec.containers[0].securityContext.privileged: privileged containers are \
             not allowed"
        ),
        "{e}"
    );
    let stored = alpha_shadows.get("web").await.unwrap();
    assert_eq!(stored.spec.pod.spec.containers[0].security_context, None);
    // An update that leaves the pod alone still goes through.
    alpha_shadows
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pod": {"labels": {"tier": "web"}}}})),
        )
        .await
        .unwrap();

    // The provider's admin is not limited (the webhook does not even see its requests).
    create(&admin, &shadow("admin-made", "default", "gamma", "8"))
        .await
        .unwrap();

    // Finished: its share is released.
    Api::<ShadowPod>::namespaced(admin.clone(), &alpha_ns)
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();
    create_admitted(&alpha, &shadow("db", &alpha_ns, "alpha", "1")).await;

    // Only the API server may send reviews: straight at a replica, a review admitting alpha
    // (within its grant, were it charged) gets a bare 401 without a client certificate, 403
    // with one from the same CA for another name (a consumer's), and no TLS at all with one
    // from another CA; none is charged.
    let port = replicas[0];
    let used = used_cpu(&admin, "alpha").await;
    let within = review_of("alpha", "sneaked", "1m").to_string();
    assert_eq!(post(&dir, port, &ca, None, within.as_bytes()), "401");
    assert_eq!(
        post(&dir, port, &ca, Some(caller.stranger()), within.as_bytes()),
        "403"
    );
    let other_ca = Caller::new(&dir.join("other-ca")).unwrap();
    assert_eq!(
        post(
            &dir,
            port,
            &ca,
            Some(other_ca.cert_and_key()),
            within.as_bytes()
        ),
        "000"
    );
    assert_eq!(
        used_cpu(&admin, "alpha").await,
        used,
        "a refused caller's review was charged"
    );

    // Garbage: 400, and an oversized body 413 before it is read; a real review answered.
    let api_server = || Some(caller.cert_and_key());
    assert_eq!(post(&dir, port, &ca, api_server(), b"garbage"), "400");
    assert_eq!(
        post(&dir, port, &ca, api_server(), &vec![b' '; 5 << 20]),
        "413"
    );
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "1", "operation": "CREATE", "name": "x", "namespace": "default",
            "kind": {"group": "offloading.fabric.io", "version": "v1alpha1", "kind": "ShadowPod"},
            "resource": {"group": "offloading.fabric.io", "version": "v1alpha1", "resource": "shadowpods"},
            "userInfo": {"username": "fabric.io:consumer:alpha"},
            "object": shadow("x", "default", "alpha", "1"),
        },
    });
    assert_eq!(
        post(&dir, port, &ca, api_server(), review.to_string().as_bytes()),
        "200"
    );

    // Exact across replicas: delta has half of its CPU in use, and creations of the other
    // half race through both replicas at once.
    admit_tenant(&admin, "delta").await.unwrap();
    grant(&admin, "delta").await;
    let delta_ns = names::namespace::tenant("delta");
    let delta = consumer_client(&api, "delta").await;
    create_admitted(&delta, &shadow("d0", &delta_ns, "delta", "500m")).await;
    eventually("delta's usage recounted", T, || async {
        let t = Api::<Tenant>::namespaced(admin.clone(), &delta_ns)
            .get("delta")
            .await
            .ok()?;
        t.status?.pending.is_empty().then_some(())
    })
    .await;
    assert_eq!(used_cpu(&admin, "delta").await.as_deref(), Some("500m"));
    // Straight at the replicas, four each: one is admitted.
    let reviews: Vec<(u16, Value)> = (0..8)
        .map(|i| {
            (
                replicas[i % 2],
                review_of("delta", &format!("r{i}"), "500m"),
            )
        })
        .collect();
    let admitted = post_all(&dir, &ca, &caller, &reviews);
    assert_eq!(
        admitted.iter().filter(|a| **a).count(),
        1,
        "exactly one of the racing creations admitted: {admitted:?}"
    );
    assert_eq!(used_cpu(&admin, "delta").await.as_deref(), Some("1"));
    // That creation never reached storage: its charge lapses and the share is back.
    eventually(
        "the charge of a creation never stored released",
        T,
        || async { (used_cpu(&admin, "delta").await.as_deref() == Some("500m")).then_some(()) },
    )
    .await;
    // Through the API server and the Service's spreading: one is created.
    let racing: Vec<ShadowPod> = (0..6)
        .map(|i| shadow(&format!("a{i}"), &delta_ns, "delta", "500m"))
        .collect();
    let results = futures::future::join_all(racing.iter().map(|s| create(&delta, s))).await;
    let created = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(created, 1, "exactly one created: {results:?}");
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            e.contains("granted to consumer \"delta\"") && e.contains("(403)"),
            "{e}"
        );
    }
    let delta_shadows = Api::<ShadowPod>::namespaced(admin.clone(), &delta_ns);
    assert_eq!(
        delta_shadows
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    eventually("delta's usage settled on its two ShadowPods", T, || async {
        let t = Api::<Tenant>::namespaced(admin.clone(), &delta_ns)
            .get("delta")
            .await
            .ok()?;
        let st = t.status?;
        (st.pending.is_empty() && st.used.get("cpu")?.0 == "1").then_some(())
    })
    .await;
    // Deleted: their share is released.
    delta_shadows
        .delete_collection(&Default::default(), &Default::default())
        .await
        .unwrap();
    eventually("deleted ShadowPods' share released", T, || async {
        used_cpu(&admin, "delta").await.is_none().then_some(())
    })
    .await;

    // Bounded in number: omega's finished ShadowPods release their share of the grant but
    // stay objects in the provider's store, so a fourth is refused until one goes.
    admit_tenant(&admin, "omega").await.unwrap();
    grant(&admin, "omega").await;
    let omega_ns = names::namespace::tenant("omega");
    let omega = consumer_client(&api, "omega").await;
    let omega_shadows = Api::<ShadowPod>::namespaced(admin.clone(), &omega_ns);
    for i in 0..3 {
        let name = format!("o{i}");
        create_admitted(&omega, &shadow(&name, &omega_ns, "omega", "1m")).await;
        omega_shadows
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
            )
            .await
            .unwrap();
    }
    eventually("omega's usage recounted", T, || async {
        let t = Api::<Tenant>::namespaced(admin.clone(), &omega_ns)
            .get("omega")
            .await
            .ok()?;
        let st = t.status?;
        (st.pending.is_empty() && st.shadow_pods == 3).then_some(())
    })
    .await;
    let e = create(&omega, &shadow("o3", &omega_ns, "omega", "1m"))
        .await
        .unwrap_err();
    assert!(
        e.contains("consumer \"omega\" has 3 ShadowPods here, as many as a tenant may have")
            && e.contains("(403)"),
        "{e}"
    );
    omega_shadows
        .delete("o0", &Default::default())
        .await
        .unwrap();
    create_admitted(&omega, &shadow("o3", &omega_ns, "omega", "1m")).await;

    // Every other kind a consumer's Role lets it create is bounded too (32 of each in its
    // namespace by default): eta's own identity creating ResourceSlices and PeeringNetworks
    // straight at the API server is refused at the 33rd of each, naming the bound.
    admit_tenant(&admin, "eta").await.unwrap();
    let eta_ns = names::namespace::tenant("eta");
    let eta = consumer_client(&api, "eta").await;
    let kinds = [
        (
            "ResourceSlice",
            "authentication.fabric.io/v1alpha1",
            "resourceslices",
            json!({"consumerClusterId": "eta", "providerClusterId": "provider",
                   "resources": {"cpu": "1"}}),
        ),
        (
            "PeeringNetwork",
            "networking.fabric.io/v1alpha1",
            "peeringnetworks",
            json!({"consumer": {"clusterId": "eta",
                   "cidrs": {"pod": "10.244.0.0/16", "external": "10.70.0.0/16"},
                   "publicKey": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}}),
        ),
    ];
    for (kind, api_version, plural, spec) in kinds {
        let (group, version) = api_version.split_once('/').unwrap();
        let resource = kube::discovery::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let objects: Api<kube::core::DynamicObject> =
            Api::namespaced_with(eta.clone(), &eta_ns, &resource);
        let mut refused = None;
        for i in 0..40 {
            let object: kube::core::DynamicObject = serde_json::from_value(json!({
                "apiVersion": api_version, "kind": kind,
                "metadata": {"name": format!("x{i}"), "namespace": eta_ns},
                "spec": spec,
            }))
            .unwrap();
            if let Err(e) = objects.create(&PostParams::default(), &object).await {
                refused = Some((i, e.to_string()));
                break;
            }
        }
        let (at, e) = refused.unwrap_or_else(|| panic!("eta created 40 {kind}s: no bound"));
        assert_eq!(at, 32, "{kind}: {e}");
        assert!(
            e.contains(&format!(
                "consumer \"eta\" has 32 {kind}s in namespace \"{eta_ns}\", as many as a \
                 tenant may have"
            )),
            "{e}"
        );
    }

    // The last place, raced for across the two replicas: eta's own identity fires 16
    // creations at once when one ResourceSlice of the 32 is deleted, round after round. Each
    // replica admitting on what it saw alone would let one through each (33); charged on the
    // Tenant, exactly one is admitted, the others refused naming the bound.
    let slices = Api::<ResourceSlice>::namespaced(eta.clone(), &eta_ns);
    let bound = format!(
        "consumer \"eta\" has 32 ResourceSlices in namespace \"{eta_ns}\", as many as a \
         tenant may have"
    );
    for round in 0..6 {
        Api::<ResourceSlice>::namespaced(admin.clone(), &eta_ns)
            .delete(&format!("x{round}"), &Default::default())
            .await
            .unwrap();
        let racing = (0..16).map(|i| {
            let slices = slices.clone();
            let mut slice = ResourceSlice::new(
                &format!("r{round}-{i}"),
                ResourceSliceSpec {
                    consumer_cluster_id: "eta".into(),
                    provider_cluster_id: "provider".into(),
                    resources: Default::default(),
                    at_most_once: None,
                },
            );
            slice.metadata.namespace = Some(eta_ns.clone());
            async move { slices.create(&PostParams::default(), &slice).await }
        });
        let results = futures::future::join_all(racing).await;
        let admitted = results.iter().filter(|r| r.is_ok()).count();
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(e.to_string().contains(&bound), "round {round}: {e}");
        }
        let stored = Api::<ResourceSlice>::namespaced(admin.clone(), &eta_ns)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len();
        assert_eq!(
            (admitted, stored),
            (1, 32),
            "round {round}: creations admitted for the last place, ResourceSlices stored"
        );
    }

    // Every pod is charged: a container that asks for nothing is charged the provider's
    // default requests (100m CPU, 128Mi by default), as its real pod gets them, so a consumer
    // granted 1 CPU cannot run request-less pods without end. zeta fills its grant but 50m,
    // then its own identity writes a ShadowPod with no requests at all straight to the API
    // server.
    admit_tenant(&admin, "zeta").await.unwrap();
    grant(&admin, "zeta").await;
    let zeta_ns = names::namespace::tenant("zeta");
    let zeta = consumer_client(&api, "zeta").await;
    create_admitted(&zeta, &shadow("big", &zeta_ns, "zeta", "950m")).await;
    let mut free = shadow("free", &zeta_ns, "zeta", "0");
    free.spec.pod.spec.containers[0].resources = None;
    let e = create(&zeta, &free)
        .await
        .expect_err("a request-less pod ran for free");
    assert!(
        e.contains(
            "cpu: 100m requested, 950m in use by live ShadowPods, 1 granted to consumer \"zeta\""
        ) && e.contains("(403)"),
        "{e}"
    );
    // Pod-level requests stand for the pod's: charged as they are, the containers' defaults
    // only for what they leave out (memory here).
    let zeta_shadows = Api::<ShadowPod>::namespaced(admin.clone(), &zeta_ns);
    zeta_shadows
        .delete("big", &Default::default())
        .await
        .unwrap();
    let mut pod_level = free.clone();
    pod_level.metadata.name = Some("pod-level".into());
    pod_level.spec.pod.spec.resources =
        Some(serde_json::from_value(json!({"requests": {"cpu": "300m"}})).unwrap());
    create_admitted(&zeta, &pod_level).await;
    eventually(
        "zeta charged the pod-level CPU and the default memory",
        T,
        || async {
            let t = Api::<Tenant>::namespaced(admin.clone(), &zeta_ns)
                .get("zeta")
                .await
                .ok()?;
            let st = t.status?;
            (st.pending.is_empty()
                && st.used.get("cpu")?.0 == "300m"
                && st.used.get("memory")?.0 == "128Mi")
                .then_some(())
        },
    )
    .await;

    // Bounded in bytes: one ShadowPod at most 512 KiB (the default), a tenant's together at
    // most 1 MiB (set above), whatever their number: theta's own identity writing large ones
    // straight at the API server is refused past either.
    admit_tenant(&admin, "theta").await.unwrap();
    grant(&admin, "theta").await;
    let theta_ns = names::namespace::tenant("theta");
    let theta = consumer_client(&api, "theta").await;
    let large = |name: &str, kib: usize| {
        let mut s = shadow(name, &theta_ns, "theta", "1m");
        s.spec.pod.spec.containers[0].args = Some(vec!["x".repeat(kib << 10)]);
        s
    };
    let e = eventually("theta's grant seen", T, || async {
        let e = create(&theta, &large("huge", 600))
            .await
            .expect_err("a 600 KiB ShadowPod admitted");
        (!e.contains(" 0 granted")).then_some(e)
    })
    .await;
    assert!(
        e.contains("bytes, more than the 524288 a tenant's ShadowPod may be")
            && e.contains("(403)"),
        "{e}"
    );
    for name in ["a", "b"] {
        create_admitted(&theta, &large(name, 400)).await;
    }
    let e = create(&theta, &large("c", 400)).await.unwrap_err();
    assert!(
        e.contains("the ShadowPods of consumer \"theta\" take ")
            && e.contains("more would pass the 1048576 a tenant may store")
            && e.contains("(403)"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
