//! Out-of-band authentication between two clusters (issue 10): a provider API server with RBAC
//! and client certificates enforced (kubelite `KUBELITE_AUTH=1`, whose CSR signer signs), its
//! authentication service (`fabric-controller auth`), and a consumer cluster running
//! `fabricctl peer out-of-band` with the command `fabricctl generate peer-command` printed.
//! One API server pair and one service for the whole file: the checks run in sequence.
use std::{process::Output, time::Duration};

use fabric_api::{
    authentication::v1alpha1::{Identity, ResourceSlice, ResourceSliceSpec, Tenant},
    core::v1alpha1::{ForeignCluster, PeerRole, condition},
    names,
};
use fabric_auth::{
    consumer::{self, ClientError},
    protocol::{AuthRequest, AuthResponse, Reason},
    tls::{Trust, parse_pin},
    token,
};
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    auth_service::{AuthService, nothing_made_for, prepare_cluster},
    process::Bin,
    wait::{eventually, try_eventually},
};
use k8s_openapi::{
    api::{
        certificates::v1::CertificateSigningRequest,
        core::v1::{ConfigMap, Namespace, Node, Pod, Secret},
        rbac::v1::ClusterRole,
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = names::DEFAULT_NAMESPACE;

fn fabricctl(api: &ApiServer, args: &[&str]) -> Output {
    fabric_tests::process::fabricctl(&api.kubeconfig, args)
}

fn text(o: &Output) -> String {
    fabric_tests::process::output_text(o)
}

/// The arguments of the peer command `generate peer-command` printed.
fn peer_command(provider: &ApiServer, extra: &[&str], svc: &AuthService) -> Vec<String> {
    let mut args = vec!["generate", "peer-command", "--auth-url", &svc.url];
    args.extend(extra);
    let o = fabricctl(provider, &args);
    assert!(o.status.success(), "{}", text(&o));
    let line = String::from_utf8(o.stdout).unwrap();
    let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    assert_eq!(words[..3], ["fabricctl", "peer", "out-of-band"], "{line}");
    // Authentication only: no negotiation controllers run here, so the command returns once
    // authenticated instead of following the network coming up.
    let mut words = words[1..].to_vec();
    words.extend(["--timeout-secs".to_owned(), "0".to_owned()]);
    words
}

fn arg_of(args: &[String], flag: &str) -> String {
    let i = args.iter().position(|a| a == flag).unwrap();
    args[i + 1].clone()
}

async fn request(svc: &AuthService, id: &str, token: &str) -> Result<AuthResponse, ClientError> {
    let (_, csr_pem) = consumer::key_and_csr(id).unwrap();
    send(svc, id, token, csr_pem).await
}

async fn send(
    svc: &AuthService,
    id: &str,
    token: &str,
    csr_pem: String,
) -> Result<AuthResponse, ClientError> {
    let trust = Trust::Pin(parse_pin(&svc.pin).unwrap());
    let req = AuthRequest {
        cluster_id: id.to_owned(),
        token: token.to_owned(),
        csr_pem,
        provider_cluster_id: None,
    };
    consumer::send(&svc.url, &trust, &req).await
}

fn refused(r: Result<AuthResponse, ClientError>, reason: Reason) -> String {
    match r {
        Err(ClientError::Refused(refusal)) => {
            assert_eq!(refusal.reason, reason, "{refusal:?}");
            refusal.message
        }
        other => panic!("expected a refusal {reason:?}, got {other:?}"),
    }
}

/// Nothing of consumer `id` exists on the provider.
async fn nothing_for(p: &Client, id: &str) {
    nothing_made_for(p, id, false).await;
    assert!(
        Api::<ForeignCluster>::all(p.clone())
            .get_opt(id)
            .await
            .unwrap()
            .is_none(),
        "ForeignCluster {id}"
    );
}

fn forbidden<T: std::fmt::Debug>(r: kube::Result<T>, what: &str) {
    match r {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_authentication() {
    if !require_tools("out_of_band_authentication") {
        return;
    }
    let provider = ApiServer::start_with_auth("auth-p");
    let consumer_api = ApiServer::start("auth-c");
    provider.install_crds();
    consumer_api.install_crds();
    prepare_cluster(&provider, "provider");
    prepare_cluster(&consumer_api, "consumer");
    let svc = AuthService::start(&provider, "provider").await.unwrap();
    let p = provider.client().await;
    let c = consumer_api.client().await;

    // The provider admin prints the command; the consumer runs it.
    let args = peer_command(&provider, &[], &svc);
    assert_eq!(arg_of(&args, "--auth-pin"), svc.pin);
    assert_eq!(arg_of(&args, "--cluster-id"), "provider");
    let standing = arg_of(&args, "--token");
    let o = fabricctl(
        &consumer_api,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}\n{}", text(&o), svc.logs());
    let out = text(&o);
    for step in [
        "✓ generated a key pair",
        "✓ authenticated",
        "✓ stored Secret",
        "✓ the identity works",
        "fabricctl info peer provider",
    ] {
        assert!(out.contains(step), "{step:?} missing in:\n{out}");
    }

    // What the consumer keeps.
    let fc = Api::<ForeignCluster>::all(c.clone())
        .get("provider")
        .await
        .unwrap();
    assert_eq!(fc.spec.role, PeerRole::Provider);
    assert_eq!(fc.spec.auth_url.as_deref(), Some(svc.url.as_str()));
    let st = fc.status.unwrap();
    assert_eq!(
        st.tenant_namespace.as_deref(),
        Some("fabric-tenant-consumer")
    );
    assert!(st.api_server_url.unwrap().starts_with("https://127.0.0.1:"));
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == condition::AUTHENTICATED && c.status == "True")
    );
    let identity = Api::<Identity>::namespaced(c.clone(), NS)
        .get("provider")
        .await
        .unwrap();
    assert_eq!(
        identity.spec.secret_name,
        names::secret::identity("provider")
    );
    assert!(identity.status.unwrap().certificate_expiry.is_some());
    let secret = Api::<Secret>::namespaced(c.clone(), names::namespace::IDENTITIES)
        .get(&names::secret::identity("provider"))
        .await
        .unwrap();
    let kubeconfig = fabric_auth::identity::kubeconfig_of(&secret).unwrap();
    assert!(kubeconfig.contains("client-key-data"));

    // What the provider made of it.
    let tenant = Api::<Tenant>::namespaced(p.clone(), "fabric-tenant-consumer")
        .get("consumer")
        .await
        .unwrap();
    assert_eq!(
        tenant.status.unwrap().user.as_deref(),
        Some("fabric.io:consumer:consumer")
    );
    let fc = Api::<ForeignCluster>::all(p.clone())
        .get("consumer")
        .await
        .unwrap();
    assert_eq!(fc.spec.role, PeerRole::Consumer);
    assert!(
        fc.status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == condition::AUTHENTICATED && c.status == "True")
    );

    // The identity works in its tenant namespace, and nowhere else.
    let remote = fabric_auth::identity::remote_client(&c, "provider")
        .await
        .unwrap();
    let tenant_ns = "fabric-tenant-consumer";
    // Clients kept for the controllers follow the Secret: made again once it changes.
    let kept = fabric_auth::identity::RemoteClients::default();
    let client_ns = |k: &fabric_auth::identity::RemoteClients| {
        let (k, c) = (k.clone(), c.clone());
        async move {
            k.get(&c, "provider")
                .await
                .unwrap()
                .default_namespace()
                .to_owned()
        }
    };
    assert_eq!(client_ns(&kept).await, tenant_ns);
    let secrets = Api::<Secret>::namespaced(c.clone(), names::namespace::IDENTITIES);
    let mut creds = fabric_auth::identity::parse(&kubeconfig).unwrap();
    creds.namespace = "elsewhere".to_owned();
    let mut moved = secret.clone();
    moved.data = fabric_auth::identity::secret("provider", &creds).data;
    let moved = secrets
        .replace(
            &names::secret::identity("provider"),
            &PostParams::default(),
            &moved,
        )
        .await
        .unwrap();
    assert_eq!(client_ns(&kept).await, "elsewhere");
    let mut back = moved;
    back.data = secret.data.clone();
    secrets
        .replace(
            &names::secret::identity("provider"),
            &PostParams::default(),
            &back,
        )
        .await
        .unwrap();
    assert_eq!(client_ns(&kept).await, tenant_ns);
    Api::<Tenant>::namespaced(remote.clone(), tenant_ns)
        .get("consumer")
        .await
        .unwrap();
    let mut slice = ResourceSlice::new(
        "consumer",
        ResourceSliceSpec {
            consumer_cluster_id: "consumer".to_owned(),
            provider_cluster_id: "provider".to_owned(),
            resources: Default::default(),
            at_most_once: None,
        },
    );
    slice.metadata.namespace = Some(tenant_ns.to_owned());
    Api::<ResourceSlice>::namespaced(remote.clone(), tenant_ns)
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
    forbidden(
        Api::<Secret>::namespaced(remote.clone(), tenant_ns)
            .list(&Default::default())
            .await,
        "Secrets in its tenant namespace",
    );
    forbidden(
        Api::<ConfigMap>::namespaced(remote.clone(), tenant_ns)
            .list(&Default::default())
            .await,
        "ConfigMaps in its tenant namespace",
    );
    forbidden(
        Api::<Pod>::namespaced(remote.clone(), "default")
            .list(&Default::default())
            .await,
        "Pods in another namespace",
    );
    forbidden(
        Api::<Tenant>::namespaced(remote.clone(), NS)
            .list(&Default::default())
            .await,
        "Tenants in another namespace",
    );
    forbidden(
        Api::<Node>::all(remote.clone())
            .list(&Default::default())
            .await,
        "Nodes",
    );
    forbidden(
        Api::<Namespace>::all(remote.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": "mine"}})).unwrap(),
            )
            .await,
        "creating a namespace",
    );
    forbidden(
        Api::<ClusterRole>::all(remote.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": "mine"}})).unwrap(),
            )
            .await,
        "creating a ClusterRole",
    );
    forbidden(
        Api::<CertificateSigningRequest>::all(remote.clone())
            .list(&Default::default())
            .await,
        "CSRs",
    );
    forbidden(
        Api::<Tenant>::namespaced(remote.clone(), tenant_ns)
            .patch(
                "consumer",
                &PatchParams::default(),
                &Patch::Merge(
                    serde_json::json!({"spec": {"state": "Active", "caps": {"cpu": "1000"}}}),
                ),
            )
            .await,
        "changing its own Tenant",
    );

    // Retrying the same request (lost answer) gets the same certificate, nothing twice.
    let (_, csr_pem) = consumer::key_and_csr("retrier").unwrap();
    let first = send(&svc, "retrier", &standing, csr_pem.clone())
        .await
        .unwrap();
    let again = send(&svc, "retrier", &standing, csr_pem).await.unwrap();
    assert_eq!(first.certificate_pem, again.certificate_pem);
    assert_eq!(first.tenant_namespace, "fabric-tenant-retrier");

    // Wrong, expired and revoked tokens: refused, with what to do, and nothing created.
    let wrong = "0".repeat(64);
    let m = refused(
        request(&svc, "wrong-token", &wrong).await,
        Reason::InvalidToken,
    );
    assert!(
        m.contains("ask the provider admin for a new peer command"),
        "{m}"
    );
    let mut bad_args = args.clone();
    let i = bad_args.iter().position(|a| a == "--token").unwrap();
    bad_args[i + 1] = wrong.clone();
    let o = fabricctl(
        &consumer_api,
        &bad_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("ask the provider admin for a new peer command"),
        "{}",
        text(&o)
    );
    let expired = token::generate();
    let tokens = names::namespace::PEERING_TOKENS;
    Api::<Secret>::namespaced(p.clone(), tokens)
        .create(
            &PostParams::default(),
            &token::secret(
                tokens,
                &expired,
                true,
                Some(Timestamp::now() - Duration::from_secs(1)),
            ),
        )
        .await
        .unwrap();
    let m = refused(
        request(&svc, "expired", &expired).await,
        Reason::ExpiredToken,
    );
    assert!(m.contains("expired"), "{m}");

    let ttl_args = peer_command(&provider, &["--ttl", "1h"], &svc);
    let short = arg_of(&ttl_args, "--token");
    assert_ne!(short, standing);
    request(&svc, "short-lived", &short).await.unwrap();
    let o = fabricctl(&provider, &["token", "rotate"]);
    assert!(o.status.success(), "{}", text(&o));
    refused(
        request(&svc, "revoked", &standing).await,
        Reason::InvalidToken,
    );
    refused(request(&svc, "revoked", &short).await, Reason::InvalidToken);
    let fresh = arg_of(&peer_command(&provider, &[], &svc), "--token");
    assert_ne!(fresh, standing);
    for id in ["wrong-token", "expired", "revoked"] {
        nothing_for(&p, id).await;
    }

    garbage(&svc, &p, &fresh).await;
    again_while_removed(&svc, &p, &fresh).await;
    again_while_revoked(&svc, &p, &fresh).await;

    // A server that is not the pinned one is refused before anything is sent.
    let other_pin = format!("sha256:{}", "ab".repeat(32));
    let r = consumer::send(
        &svc.url,
        &Trust::Pin(parse_pin(&other_pin).unwrap()),
        &AuthRequest {
            cluster_id: "pinned".to_owned(),
            token: fresh.clone(),
            csr_pem: consumer::key_and_csr("pinned").unwrap().1,
            provider_cluster_id: None,
        },
    )
    .await;
    assert!(matches!(r, Err(ClientError::Handshake { .. })), "{r:?}");
    nothing_for(&p, "pinned").await;

    renewal(&svc, &p, &c, &consumer_api.kubeconfig).await;
}

/// A consumer that peers again while its previous tenant is still being removed here (an
/// unpeer whose cleanup still runs) gets its new tenant once the old one is gone, not one that
/// the old one's cleanup takes away after it (the re-peer then held an identity refused
/// everything).
async fn again_while_removed(svc: &AuthService, p: &Client, token: &str) {
    use k8s_openapi::api::rbac::v1::Role;
    let id = "again";
    request(svc, id, token).await.unwrap();
    let ns = names::namespace::tenant(id);
    let tenants: Api<Tenant> = Api::namespaced(p.clone(), &ns);
    // The provider's unpeer cleanup holds the Tenant while it runs; here the test holds it.
    let hold = serde_json::json!({ "metadata": { "finalizers": ["test.fabric.io/hold"] } });
    tenants
        .patch(id, &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();
    tenants.delete(id, &Default::default()).await.unwrap();
    let (answered, released) = answer_while(svc, id, token, async {
        // The cleanup ends: what it removes goes (the binding first, as
        // fabric-negotiation's unpeer does: the new peering's binding is a new one), then the
        // Tenant.
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(p.clone(), &ns)
            .delete(fabric_auth::tenant::ROLE, &Default::default())
            .await
            .unwrap();
        Api::<Role>::namespaced(p.clone(), &ns)
            .delete(fabric_auth::tenant::ROLE, &Default::default())
            .await
            .unwrap();
        let at = std::time::Instant::now();
        let free = serde_json::json!({ "metadata": { "finalizers": null } });
        tenants
            .patch(id, &PatchParams::default(), &Patch::Merge(&free))
            .await
            .unwrap();
        at
    })
    .await;
    assert!(
        answered > released,
        "answered before the previous tenant was gone"
    );
    let t = tenants.get(id).await.unwrap();
    assert!(t.metadata.deletion_timestamp.is_none(), "{t:?}");
    Api::<Role>::namespaced(p.clone(), &ns)
        .get(fabric_auth::tenant::ROLE)
        .await
        .expect("the new tenant's Role");
}

/// `id` asks again with `token` while `release` (run after 3 s) lets what held it go: when the
/// (successful) answer came, and when `release` let go.
async fn answer_while(
    svc: &AuthService,
    id: &str,
    token: &str,
    release: impl std::future::Future<Output = std::time::Instant>,
) -> (std::time::Instant, std::time::Instant) {
    let (answered, released) = tokio::join!(
        async {
            request(svc, id, token).await.unwrap();
            std::time::Instant::now()
        },
        async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            release.await
        }
    );
    (answered, released)
}

/// A consumer that peers again while its ForeignCluster here is still being deleted (the
/// previous Tenant gone, the revocation finalizer not yet off) gets its tenant once the
/// ForeignCluster is gone: made before, the new Tenant would read as revoked with it and be
/// removed.
async fn again_while_revoked(svc: &AuthService, p: &Client, token: &str) {
    let id = "again-revoked";
    request(svc, id, token).await.unwrap();
    let fcs: Api<ForeignCluster> = Api::all(p.clone());
    let hold = serde_json::json!({ "metadata": { "finalizers": ["test.fabric.io/hold"] } });
    fcs.patch(id, &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();
    fcs.delete(id, &Default::default()).await.unwrap();
    let tenants: Api<Tenant> = Api::namespaced(p.clone(), &names::namespace::tenant(id));
    // The Tenant's cleanup (fabric-negotiation's unpeer, not running here) took its binding.
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(
        p.clone(),
        &names::namespace::tenant(id),
    )
    .delete(fabric_auth::tenant::ROLE, &Default::default())
    .await
    .unwrap();
    tenants.delete(id, &Default::default()).await.unwrap();
    let (answered, released) = answer_while(svc, id, token, async {
        let at = std::time::Instant::now();
        let free = serde_json::json!({ "metadata": { "finalizers": null } });
        fcs.patch(id, &PatchParams::default(), &Patch::Merge(&free))
            .await
            .unwrap();
        at
    })
    .await;
    assert!(
        answered > released,
        "answered while the previous ForeignCluster was still being deleted"
    );
    let fc = fcs.get(id).await.unwrap();
    assert!(fc.metadata.deletion_timestamp.is_none(), "{fc:?}");
    tenants.get(id).await.expect("the new Tenant");
}

/// The consumer renews with its current certificate; without one, or once its tenant is
/// removed, it cannot, and removing the tenant's RoleBinding revokes its access.
async fn renewal(svc: &AuthService, p: &Client, c: &Client, consumer_kubeconfig: &std::path::Path) {
    let old = Api::<Secret>::namespaced(c.clone(), names::namespace::IDENTITIES)
        .get(&names::secret::identity("provider"))
        .await
        .unwrap();
    let renewed = consumer::renew(c, NS, "provider").await.unwrap();
    let old =
        fabric_auth::identity::parse(&fabric_auth::identity::kubeconfig_of(&old).unwrap()).unwrap();
    assert_ne!(renewed.certificate_pem, old.certificate_pem);
    let remote = fabric_auth::identity::remote_client(c, "provider")
        .await
        .unwrap();
    let tenants = Api::<Tenant>::namespaced(remote, "fabric-tenant-consumer");
    tenants.get("consumer").await.unwrap();

    // The renewal controller renews on its own when the policy says so (here: at once).
    let identities = Api::<Identity>::namespaced(c.clone(), NS);
    let before = identities
        .get("provider")
        .await
        .unwrap()
        .status
        .unwrap()
        .renewed_at;
    let renewer = Bin::new("fabric-controller")
        .unwrap()
        .kubeconfig(consumer_kubeconfig)
        .args(["identities", "--renew-before", "2h", "--min-interval", "1s"])
        .spawn()
        .unwrap();
    eventually(
        "a renewal by the controller",
        Duration::from_secs(30),
        || async {
            let now = identities
                .get("provider")
                .await
                .unwrap()
                .status
                .unwrap()
                .renewed_at;
            (now > before).then_some(())
        },
    )
    .await;
    drop(renewer);

    let csr = consumer::key_and_csr("consumer").unwrap().1;
    let body = serde_json::to_vec(&serde_json::json!({ "csrPem": csr })).unwrap();
    let (status, answer) = AuthServiceRef::of(svc)
        .raw(
            &format!(
                "POST /v1/renew HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
                body.len()
            ),
            &body,
        )
        .await;
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("Unauthenticated"), "{answer}");

    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(p.clone(), "fabric-tenant-consumer")
        .delete(fabric_auth::tenant::ROLE, &Default::default())
        .await
        .unwrap();
    // The API server's RBAC authorizer learns of the deletion through its own watch: access
    // ends within moments of the RoleBinding going, not in the same instant.
    let refused = try_eventually(
        "the tenant's access gone",
        Duration::from_secs(10),
        || async {
            matches!(tenants.get("consumer").await, Err(kube::Error::Api(e)) if e.code == 403)
                .then_some(())
        },
    )
    .await;
    if refused.is_err() {
        forbidden(tenants.get("consumer").await, "a removed tenant's identity");
    }
    match consumer::renew(c, NS, "provider").await {
        Err(ClientError::Refused(r)) => assert_eq!(r.reason, Reason::Revoked, "{r:?}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn read_answer(s: &mut (impl AsyncReadExt + Unpin)) -> (u16, String) {
    fabric_tests::auth_service::read_answer(s, Duration::from_secs(20)).await
}

fn post(len: usize) -> String {
    format!(
        "POST /v1/authenticate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {len}"
    )
}

/// Garbage gets a clear 4xx (a JSON refusal) and creates nothing.
async fn garbage(svc: &AuthService, p: &Client, token: &str) {
    let json = |id: &str, csr: &str| {
        serde_json::to_vec(&serde_json::json!({"clusterId": id, "token": token, "csrPem": csr}))
            .unwrap()
    };
    let bad_json = b"{\"clusterId\": \"garbage\", ".to_vec();
    let bad_csr = json(
        "bad-csr",
        "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
    );
    // A CSR for another consumer's name, sent with a good token.
    let thief = json("thief", &consumer::key_and_csr("consumer").unwrap().1);
    let huge = vec![b' '; 1 << 20];
    let cases: Vec<(&str, String, Vec<u8>, u16, &str)> = vec![
        ("malformed JSON", post(bad_json.len()), bad_json, 400, "MalformedRequest"),
        ("malformed CSR", post(bad_csr.len()), bad_csr, 400, "InvalidCsr"),
        ("someone else's CSR", post(thief.len()), thief, 400, "InvalidCsr"),
        ("huge body, declared", post(huge.len()), huge.clone(), 413, "PayloadTooLarge"),
        (
            "huge body, chunked",
            "POST /v1/authenticate HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
                .to_owned(),
            [format!("{:x}\r\n", huge.len()).into_bytes(), huge, b"\r\n0\r\n\r\n".to_vec()].concat(),
            413,
            "PayloadTooLarge",
        ),
        (
            "not JSON",
            "POST /v1/authenticate HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Length: 2".to_owned(),
            b"hi".to_vec(),
            415,
            "UnsupportedMediaType",
        ),
        ("GET", "GET /v1/authenticate HTTP/1.1".to_owned(), vec![], 405, "MethodNotAllowed"),
        ("elsewhere", "GET /admin HTTP/1.1".to_owned(), vec![], 404, "NotFound"),
    ];
    let mut tasks = Vec::new();
    for (what, head, body, status, reason) in cases {
        let svc_url = svc.url.clone();
        let pin = svc.pin.clone();
        tasks.push(tokio::spawn(async move {
            let svc = AuthServiceRef { url: svc_url, pin };
            let (got, answer) = svc.raw(&head, &body).await;
            assert_eq!(got, status, "{what}: {answer}");
            assert!(answer.contains(reason), "{what}: {answer}");
        }));
    }
    // A client dribbling its body is cut with 408; one dribbling its headers is cut too.
    let slow_body = {
        let svc = AuthServiceRef::of(svc);
        tokio::spawn(async move {
            let mut conn = svc.connect().await;
            let t0 = std::time::Instant::now();
            let head = format!("{}\r\nHost: x\r\n\r\n{{", post(200));
            conn.stream.write_all(head.as_bytes()).await.unwrap();
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if conn.stream.write_all(b" ").await.is_err() {
                    break;
                }
            }
            let (status, body) = read_answer(&mut conn.stream).await;
            assert_eq!(status, 408, "{body}");
            assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
        })
    };
    let slow_head = {
        let svc = AuthServiceRef::of(svc);
        tokio::spawn(async move {
            let mut conn = svc.connect().await;
            let t0 = std::time::Instant::now();
            let mut cut = false;
            for b in post(10).bytes().cycle().take(60) {
                if conn.stream.write_all(&[b]).await.is_err() {
                    cut = true;
                    break;
                }
                let _ = conn.stream.flush().await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let (status, _) = read_answer(&mut conn.stream).await;
            assert!(cut || status == 0 || status == 408, "status {status}");
            assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    slow_body.await.unwrap();
    slow_head.await.unwrap();
    for id in ["garbage", "bad-csr", "thief"] {
        nothing_for(p, id).await;
    }
}

/// What a spawned task needs of the service.
struct AuthServiceRef {
    url: String,
    pin: String,
}

impl AuthServiceRef {
    fn of(svc: &AuthService) -> Self {
        Self {
            url: svc.url.clone(),
            pin: svc.pin.clone(),
        }
    }

    async fn connect(&self) -> consumer::Connection {
        consumer::connect(&self.url, &Trust::Pin(parse_pin(&self.pin).unwrap()))
            .await
            .unwrap()
    }

    async fn raw(&self, head: &str, body: &[u8]) -> (u16, String) {
        let mut conn = self.connect().await;
        let _ = conn
            .stream
            .write_all(format!("{head}\r\nHost: {}\r\n\r\n", conn.host).as_bytes())
            .await;
        let _ = conn.stream.write_all(body).await;
        let _ = conn.stream.flush().await;
        read_answer(&mut conn.stream).await
    }
}
