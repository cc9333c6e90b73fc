//! The provider's ShadowPod webhook (`fabric-controller shadowpod-webhook`) registered with a
//! real API server (RBAC and client certificates on), as deploy/ registers it: kubelite calls
//! it through its Service and an EndpointSlice pointing at 127.0.0.1, verifying it against the
//! caBundle the webhook wrote itself. Consumers' identities are client certificates as their
//! authentication service would have them signed. A ShadowPod outside the consumer's tenant
//! namespace, for another consumer, or over the grant is refused with a clear message; within
//! the grant it is admitted; a finished one releases its share; the provider's admin is not
//! limited; garbage gets a 400.
use fabric_tests::wait::eventually;
use std::{
    net::TcpListener,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, ResourceSliceSpec},
    names,
    offloading::v1alpha1::ShadowPod,
};
use fabric_tests::{
    ChildGuard,
    apiserver::{ApiServer, require_tools},
    sharing::{admit_tenant, consumer_credentials},
};
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_fabric-controller");
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

async fn consumer_client(api: &ApiServer, consumer: &str) -> Client {
    let creds = consumer_credentials(api, consumer).unwrap();
    let kc = fabric_sharing::identity::to_yaml(&fabric_sharing::identity::kubeconfig(
        "provider", &creds,
    ));
    fabric_sharing::identity::client_from_kubeconfig(&kc)
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

/// curl's HTTP status for POSTing `body` to the webhook by its Service name, trusting `ca`.
fn post(dir: &Path, port: u16, ca: &str, body: &[u8]) -> String {
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, ca).unwrap();
    let body_file = dir.join("body");
    std::fs::write(&body_file, body).unwrap();
    let host = format!("{}.{NS}.svc", names::webhook::SHADOWPODS_SERVICE);
    let o = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
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

#[tokio::test]
async fn the_webhook_keeps_consumers_in_their_namespaces_and_grants() {
    if !require_tools("the_webhook_keeps_consumers_in_their_namespaces_and_grants") {
        return;
    }
    let api = ApiServer::start_with_auth("webhook");
    api.install_crds();
    let admin = api.client().await;
    let dir = std::env::temp_dir().join(format!("fabric-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    api.kubectl_ok(&["create", "namespace", NS]);

    // The webhook on 127.0.0.1, reached as the Service of deploy/ through an EndpointSlice.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
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

    let log = std::fs::File::create(dir.join("webhook.log")).unwrap();
    let _webhook = ChildGuard(
        fabric_tests::die_with_parent(&mut Command::new(BIN))
            .env("KUBECONFIG", &api.kubeconfig)
            .env("RUST_LOG", "info,fabric_sharing=debug")
            .args([
                "shadowpod-webhook",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );

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
    let slices = Api::<ResourceSlice>::namespaced(admin.clone(), &alpha_ns);
    let mut slice = ResourceSlice::new(
        "alpha",
        ResourceSliceSpec {
            consumer_cluster_id: "alpha".into(),
            provider_cluster_id: "provider".into(),
            resources: Default::default(),
        },
    );
    slice.metadata.namespace = Some(alpha_ns.clone());
    slices.create(&PostParams::default(), &slice).await.unwrap();
    slices
        .patch_status(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"granted": {"cpu": "1", "pods": "10"}}})),
        )
        .await
        .unwrap();
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
    eventually("the first ShadowPod admitted", T, || async {
        create(&alpha, &shadow("web", &alpha_ns, "alpha", "600m"))
            .await
            .inspect_err(|e| eprintln!("not yet: {e}"))
            .ok()
    })
    .await;

    // Over the grant: refused at once, with the numbers (the creation just admitted counts
    // even before the webhook's cache shows it).
    let e = create(&alpha, &shadow("db", &alpha_ns, "alpha", "500m"))
        .await
        .unwrap_err();
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
    eventually("the finished ShadowPod's share released", T, || async {
        create(&alpha, &shadow("db", &alpha_ns, "alpha", "1"))
            .await
            .inspect_err(|e| eprintln!("not yet: {e}"))
            .ok()
    })
    .await;

    // Garbage: 400, and an oversized body 413 before it is read; a real review answered.
    assert_eq!(post(&dir, port, &ca, b"garbage"), "400");
    assert_eq!(post(&dir, port, &ca, &vec![b' '; 5 << 20]), "413");
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
    assert_eq!(post(&dir, port, &ca, review.to_string().as_bytes()), "200");
    let _ = std::fs::remove_dir_all(&dir);
}
