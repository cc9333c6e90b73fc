//! An identity belongs to one consumer (issue 19 §2), tried from the attacker's side: a holder
//! of a peering token speaking the authentication protocol over raw HTTPS (JSON written here,
//! not through the consumer's client), and a user of the provider holding CSR-create rights.
//! One provider API server (RBAC and client certificates enforced, its CSR signer signing),
//! its authentication service, and a consumer API server for `fabricctl`. The checks run one
//! after the other and each one's failure is collected, so one run says which hold.
use std::{process::Output, sync::Arc, time::Duration};

use fabric_api::{
    authentication::v1alpha1::Tenant,
    core::v1alpha1::{DiscoveryMethod, ForeignCluster, ForeignClusterSpec, PeerRole},
    names,
};
use fabric_auth::{
    consumer,
    tls::{Trust, parse_pin},
    validate,
};
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    auth_service::{AuthService, nothing_made_for, prepare_cluster, read_answer},
    sharing::{api_endpoint, mint_client_cert},
    wait::eventually,
};
use k8s_openapi::api::{certificates::v1::CertificateSigningRequest, core::v1::Namespace};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

fn fabricctl(api: &ApiServer, args: &[&str]) -> Output {
    fabric_tests::process::fabricctl(&api.kubeconfig, args)
}

fn text(o: &Output) -> String {
    fabric_tests::process::output_text(o)
}

/// The peer command `generate peer-command` prints with `extra`, as words after `fabricctl`.
fn peer_command(provider: &ApiServer, url: &str, extra: &[&str]) -> Result<Vec<String>, String> {
    let mut args = vec!["generate", "peer-command", "--auth-url", url];
    args.extend(extra);
    let o = fabricctl(provider, &args);
    if !o.status.success() {
        return Err(text(&o));
    }
    Ok(String::from_utf8(o.stdout)
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(str::to_owned)
        .collect())
}

fn arg_of(args: &[String], flag: &str) -> String {
    let i = args.iter().position(|a| a == flag).unwrap();
    args[i + 1].clone()
}

/// The service as an attacker reaches it: TLS to the pinned certificate, then bytes.
#[derive(Clone)]
struct Attacker {
    url: String,
    pin: String,
}

/// An answer: HTTP status and the JSON body.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.certificate() {
            Some(pem) => write!(
                f,
                "{} with a certificate for {:?}",
                self.status,
                validate::consumer_of_pem(pem)
            ),
            None => write!(f, "{} {}", self.status, self.body),
        }
    }
}

impl Answer {
    fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or("")
    }

    fn certificate(&self) -> Option<&str> {
        self.body["certificatePem"].as_str()
    }
}

impl Attacker {
    /// POSTs `body` (JSON) to `path`.
    async fn post(&self, path: &str, body: &Value) -> Answer {
        let body = serde_json::to_vec(body).unwrap();
        let mut conn = consumer::connect(&self.url, &Trust::Pin(parse_pin(&self.pin).unwrap()))
            .await
            .unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            conn.host,
            body.len()
        );
        conn.stream.write_all(head.as_bytes()).await.unwrap();
        conn.stream.write_all(&body).await.unwrap();
        conn.stream.flush().await.unwrap();
        let (status, body) = read_answer(&mut conn.stream, Duration::from_secs(60)).await;
        let body = serde_json::from_str(&body).unwrap_or(Value::Null);
        Answer { status, body }
    }

    /// An authentication request for `id` with `token` and `csr_pem`.
    async fn authenticate(&self, id: &str, token: &str, csr_pem: &str) -> Answer {
        self.post(
            "/v1/authenticate",
            &json!({ "clusterId": id, "token": token, "csrPem": csr_pem }),
        )
        .await
    }

    /// The same, with a fresh key of the attacker's.
    async fn claim(&self, id: &str, token: &str) -> Answer {
        let (_, csr) = consumer::key_and_csr(id).unwrap();
        self.authenticate(id, token, &csr).await
    }
}

/// `answer` is a refusal with HTTP `status` and `reason`.
fn refused(what: &str, answer: &Answer, status: u16, reason: &str) {
    assert!(
        answer.status == status && answer.reason() == reason,
        "{what}: expected {status} {reason}, got {answer}"
    );
}

fn ok(what: &str, answer: &Answer) {
    assert_eq!(answer.status, 200, "{what}: {answer}");
}

/// A token holder cannot take over a consumer that already has a tenant here; the consumer
/// itself retrying its own request (lost answer) still gets its certificate.
async fn no_takeover_of_a_tenant(a: Attacker, p: Client, token: String) {
    let (_, csr) = consumer::key_and_csr("victim").unwrap();
    let first = a.authenticate("victim", &token, &csr).await;
    ok("the victim peers", &first);
    let again = a.authenticate("victim", &token, &csr).await;
    ok("the victim retries its own request", &again);
    assert_eq!(first.certificate(), again.certificate());
    let stolen = a.claim("victim", &token).await;
    refused("another key for victim's id", &stolen, 409, "AlreadyPeered");
    let csrs = Api::<CertificateSigningRequest>::all(p)
        .list(&ListParams::default().labels(&format!("{}=victim", names::label::REMOTE_CLUSTER)))
        .await
        .unwrap();
    assert_eq!(csrs.items.len(), 1, "one CSR for victim: its own");
}

/// An id that is a provider this cluster consumes from, or whose tenant namespace the
/// service did not create, is refused and nothing is created for it.
async fn no_ids_of_others(a: Attacker, p: Client, token: String) {
    let fcs = Api::<ForeignCluster>::all(p.clone());
    let upstream = ForeignCluster::new(
        "upstream",
        ForeignClusterSpec {
            cluster_id: "upstream".to_owned(),
            discovered_by: DiscoveryMethod::Manual,
            role: PeerRole::Provider,
            auth_url: Some("https://203.0.113.9:31443".to_owned()),
        },
    );
    fcs.create(&PostParams::default(), &upstream).await.unwrap();
    let r = a.claim("upstream", &token).await;
    refused("the id of a provider of this cluster", &r, 409, "IdTaken");
    assert_eq!(
        fcs.get("upstream").await.unwrap().spec.role,
        PeerRole::Provider
    );
    nothing_made_for(&p, "upstream", false).await;

    let squat: Namespace = serde_json::from_value(
        json!({ "metadata": { "name": names::namespace::tenant("squat") } }),
    )
    .unwrap();
    Api::<Namespace>::all(p.clone())
        .create(&PostParams::default(), &squat)
        .await
        .unwrap();
    let r = a.claim("squat", &token).await;
    refused("a namespace the service did not create", &r, 409, "IdTaken");
    nothing_made_for(&p, "squat", true).await;
    assert!(fcs.get_opt("squat").await.unwrap().is_none());
}

/// A `--ttl` token is one-time, in the out-of-band flow too (the printed command replayed),
/// and bound to the first id that used it, or to the one named when minted.
async fn tokens_are_bound_and_one_time(a: Attacker, provider: Arc<ApiServer>) {
    let args = peer_command(&provider, &a.url, &["--ttl", "1h"]).unwrap();
    let once = arg_of(&args, "--token");
    ok("the first use", &a.claim("once", &once).await);
    let replay = a.claim("once", &once).await;
    refused("the printed command replayed", &replay, 401, "TokenUsed");
    let other = a.claim("once-other", &once).await;
    refused("the used token for another id", &other, 401, "TokenBound");

    let args = peer_command(
        &provider,
        &a.url,
        &["--ttl", "1h", "--consumer-id", "named"],
    )
    .expect("--consumer-id binds the token when minted");
    let named = arg_of(&args, "--token");
    let r = a.claim("not-named", &named).await;
    refused("a token minted for another id", &r, 401, "TokenBound");
    ok("the named id", &a.claim("named", &named).await);

    let zero = peer_command(&provider, &a.url, &["--ttl", "0s"]);
    assert!(
        zero.as_ref().is_err_and(|e| e.contains("--ttl")),
        "--ttl 0s is refused: {zero:?}"
    );
}

/// A request naming the wrong provider (a mistyped `--cluster-id` in the peer command) is
/// refused before anything is written on the provider.
async fn wrong_provider_creates_nothing(
    a: Attacker,
    p: Client,
    provider: Arc<ApiServer>,
    consumer_api: Arc<ApiServer>,
) {
    let args = peer_command(&provider, &a.url, &[]).unwrap();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    let i = args.iter().position(|a| *a == "--cluster-id").unwrap();
    args[i + 1] = "elsewhere";
    args.extend(["--timeout-secs", "0"]);
    let o = fabricctl(&consumer_api, &args);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("elsewhere"), "{}", text(&o));
    nothing_made_for(&p, "wrongly", false).await;
    assert!(
        Api::<ForeignCluster>::all(p)
            .get_opt("wrongly")
            .await
            .unwrap()
            .is_none(),
        "ForeignCluster wrongly was created"
    );
}

/// A user allowed to create CSRs plants one under the name the service derives from a
/// request, with a subject of its choice (another consumer's user name): the service does
/// not approve it.
async fn a_planted_csr_is_not_approved(
    a: Attacker,
    p: Client,
    provider: Arc<ApiServer>,
    token: String,
) {
    let rbac = [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": "csr-maker" },
            "rules": [{ "apiGroups": ["certificates.k8s.io"],
                        "resources": ["certificatesigningrequests"],
                        "verbs": ["create", "get", "list", "watch"] }],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": "csr-maker" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "csr-maker" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                           "name": "csr-maker" }],
        }),
    ];
    for obj in rbac {
        let o = provider.kubectl_stdin(&["apply", "-f", "-"], &obj.to_string());
        assert!(o.status.success(), "{}", text(&o));
    }
    let (cert, key) = mint_client_cert(&provider, "csr-maker", "testers").unwrap();
    let maker = client_as(&provider, cert, key).await;

    // What the attacker will send the service, and what it plants under the derived name:
    // a request for the victim's user name, with the attacker's key.
    let (_, sent) = consumer::key_and_csr("planter").unwrap();
    let (_, planted) = consumer::key_and_csr("victim").unwrap();
    let name = fabric_auth::provider::csr_name("planter", &sent);
    let obj: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": { "name": name,
                      "labels": { names::label::REMOTE_CLUSTER: "planter" } },
        "spec": {
            "request": base64_of(planted.as_bytes()),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "usages": ["digital signature", "client auth"],
            "expirationSeconds": 864000,
        },
    }))
    .unwrap();
    Api::<CertificateSigningRequest>::all(maker)
        .create(&PostParams::default(), &obj)
        .await
        .expect("a user with CSR-create rights creates a CSR");

    let answer = a.authenticate("planter", &token, &sent).await;
    let issued_to = answer.certificate().and_then(validate::consumer_of_pem);
    let after = Api::<CertificateSigningRequest>::all(p)
        .get(&name)
        .await
        .unwrap();
    let approved = after
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Approved" && c.status == "True");
    assert!(
        !approved,
        "the service approved a CSR it did not write (answer {answer})"
    );
    assert!(
        answer.status != 200 || issued_to.as_deref() == Some("planter"),
        "certificate for {issued_to:?}"
    );
}

/// The authentication service compromised (it faces the internet): with its own
/// ServiceAccount's token, as deploy/ grants it, it asks for certificates of subjects of its
/// choice: another component's or a node's, a tenant's user with a peering group its
/// RoleBinding does not bind, a tenant's own subject for longer than the provider signs.
/// None is approved (it cannot approve; the approver denies them, saying why), none gets a
/// certificate.
async fn a_compromised_service_gets_no_subject_signed(
    a: Attacker,
    p: Client,
    provider: Arc<ApiServer>,
    token: String,
) {
    let id = "sheep";
    let _ = peer_as(&a, &provider, id, &token).await;
    let binding = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(
        p.clone(),
        &names::namespace::tenant(id),
    )
    .get(fabric_auth::tenant::ROLE)
    .await
    .unwrap();
    let current = binding.subjects.unwrap()[0].name.clone();
    let auth = fabric_tests::rights::component_client(
        &provider,
        "fabric-auth",
        provider
            .kubeconfig
            .with_file_name("compromised-auth.kubeconfig"),
    )
    .await
    .unwrap();
    let any_subject = |cn: &str, orgs: &[&str]| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for (i, o) in orgs.iter().enumerate() {
            let oid = if i == 0 {
                rcgen::DnType::OrganizationName
            } else {
                rcgen::DnType::CustomDnType(vec![2, 5, 4, 10])
            };
            params.distinguished_name.push(oid, *o);
        }
        params.serialize_request(&key).unwrap().pem().unwrap()
    };
    let (_, stale) =
        consumer::key_and_csr_in(id, &names::user::peering(id, "0123456789abcdef")).unwrap();
    let (_, own) = consumer::key_and_csr_in(id, &current).unwrap();
    let attempts = [
        ("masters", any_subject("mallory", &["system:masters"]), 3600),
        (
            "node",
            any_subject("system:node:node0", &["system:nodes"]),
            3600,
        ),
        ("stale-peering", stale, 3600),
        ("too-long", own, 7 * 24 * 3600),
    ];
    let csrs = Api::<CertificateSigningRequest>::all(auth);
    let mut made = Vec::new();
    for (what, pem, ttl) in attempts {
        let name = format!("fabric-consumer-{id}-{what}");
        let obj: CertificateSigningRequest = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": { names::label::REMOTE_CLUSTER: id } },
            "spec": {
                "request": base64_of(pem.as_bytes()),
                "signerName": "kubernetes.io/kube-apiserver-client",
                "usages": ["digital signature", "client auth"],
                "expirationSeconds": ttl,
            },
        }))
        .unwrap();
        match csrs.create(&PostParams::default(), &obj).await {
            Ok(_) => made.push((what, name)),
            // The API server refuses some subjects to everyone (system:masters).
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {
                eprintln!("{what}: the API server refused the CSR: {}", e.message);
                continue;
            }
            Err(e) => panic!("{what}: {e}"),
        }
        let approval = json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "Mine", "message": "mine",
        }]}});
        let approved = csrs
            .patch_approval(
                &obj.metadata.name.clone().unwrap(),
                &Default::default(),
                &kube::api::Patch::Merge(&approval),
            )
            .await;
        assert!(
            approved.is_err(),
            "the authentication service's own token approved its CSR {what}"
        );
    }
    let admin = Api::<CertificateSigningRequest>::all(p);
    for (what, name) in made {
        let csr = eventually(
            &format!("CSR {what} denied by the approver"),
            Duration::from_secs(30),
            || {
                let admin = admin.clone();
                let name = name.clone();
                async move {
                    let csr = admin.get(&name).await.unwrap();
                    fabric_auth::provider::csr_outcome(&csr)
                        .is_some()
                        .then_some(csr)
                }
            },
        )
        .await;
        let status = csr.status.clone().unwrap_or_default();
        assert!(status.certificate.is_none(), "CSR {what} got a certificate");
        let denied = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Denied" && c.status == "True");
        assert!(
            denied.is_some_and(|c| !c.message.as_deref().unwrap_or_default().is_empty()),
            "CSR {what} is not denied with a reason: {status:?}"
        );
    }
}

/// A client of `provider` with certificate `cert` and key `key` (PEM).
async fn client_as(provider: &ApiServer, cert: String, key: String) -> Client {
    let (url, ca) = api_endpoint(provider).unwrap();
    let creds = fabric_auth::identity::Credentials {
        api_server_url: url,
        ca_pem: ca,
        certificate_pem: cert,
        key_pem: key.into(),
        namespace: "default".to_owned(),
    };
    let kubeconfig = fabric_auth::identity::kubeconfig("provider", &creds);
    fabric_auth::identity::client_from_kubeconfig(&fabric_auth::identity::to_yaml(&kubeconfig))
        .await
        .unwrap()
}

/// Peers `id` with `token` through the service: a client with the issued identity.
async fn peer_as(a: &Attacker, provider: &ApiServer, id: &str, token: &str) -> Client {
    let (key, csr) = consumer::key_and_csr(id).unwrap();
    let answer = a.authenticate(id, token, &csr).await;
    ok(&format!("{id} peers"), &answer);
    let cert = answer.certificate().unwrap().to_owned();
    client_as(provider, cert, key.serialize_pem()).await
}

/// Whether `client` reads Tenant `id` in its tenant namespace (false: 403, or 404 while the
/// API server's RBAC has not yet seen a removed binding go).
async fn reads_its_tenant(client: &Client, id: &str) -> bool {
    match Api::<Tenant>::namespaced(client.clone(), &names::namespace::tenant(id))
        .get(id)
        .await
    {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => false,
        Err(e) => panic!("reading Tenant {id}: {e}"),
    }
}

/// A consumer revoked by the provider's admin keeps its old certificate (nothing revokes a
/// certificate); once the same id peers again (a new key, maybe a new owner), that old
/// certificate must not regain access.
async fn revocation_is_real(a: Attacker, p: Client, provider: Arc<ApiServer>, token: String) {
    let id = "phoenix";
    let old = peer_as(&a, &provider, id, &token).await;
    assert!(reads_its_tenant(&old, id).await);

    // What the provider's tenant cleanup removes when the admin deletes the Tenant.
    let ns = names::namespace::tenant(id);
    let rb = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(p.clone(), &ns);
    rb.delete(fabric_auth::tenant::ROLE, &Default::default())
        .await
        .unwrap();
    Api::<Tenant>::namespaced(p.clone(), &ns)
        .delete(id, &Default::default())
        .await
        .unwrap();
    Api::<ForeignCluster>::all(p.clone())
        .delete(id, &Default::default())
        .await
        .unwrap();
    // The namespace stays (the test API server removes a deleted namespace's content after
    // answering, which would race the re-peer): what matters is the binding.
    eventually(
        "the revoked tenant gone",
        Duration::from_secs(30),
        || async { (!reads_its_tenant(&old, id).await).then_some(()) },
    )
    .await;

    let new = peer_as(&a, &provider, id, &token).await;
    eventually(
        "the new identity works",
        Duration::from_secs(10),
        || async { reads_its_tenant(&new, id).await.then_some(()) },
    )
    .await;
    assert!(
        !reads_its_tenant(&old, id).await,
        "the certificate of the revoked peering reads the new tenant"
    );
}

/// Many clients that connect and say nothing (more than the service serves at once) delay a
/// consumer, they do not lock it out; a caller without a valid token learns nothing of the
/// provider (no API error, no cluster id).
async fn idle_crowds_are_cut(a: Attacker, token: String) {
    let host = a.url.trim_start_matches("https://").to_owned();
    let mut idle = Vec::new();
    for _ in 0..48 {
        idle.push(tokio::net::TcpStream::connect(&host).await.unwrap());
    }
    let t0 = std::time::Instant::now();
    let answer = a.claim("patient", &token).await;
    ok("a consumer behind an idle crowd", &answer);
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "served after {:?}",
        t0.elapsed()
    );
    drop(idle);
    let probe = a
        .post(
            "/v1/authenticate",
            &json!({ "clusterId": "probe", "token": "0".repeat(64), "csrPem": "x",
                     "providerClusterId": "guess" }),
        )
        .await;
    refused("an unauthenticated probe", &probe, 401, "InvalidToken");
    let said = probe.body.to_string();
    assert!(
        !said.contains("provider\"") && !said.contains("guess") && !said.contains("kube"),
        "{said}"
    );
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Runs `check`, turning its panic into a failure line.
async fn check(
    failures: &mut Vec<String>,
    name: &str,
    check: impl std::future::Future<Output = ()> + Send + 'static,
) {
    match tokio::spawn(check).await {
        Ok(()) => eprintln!("held: {name}"),
        Err(e) => {
            let why = e
                .try_into_panic()
                .ok()
                .and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                })
                .unwrap_or_else(|| "cancelled".to_owned());
            eprintln!("FAILED: {name}: {why}");
            failures.push(format!("{name}: {why}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_belongs_to_one_consumer() {
    if !require_tools("an_identity_belongs_to_one_consumer") {
        return;
    }
    let provider = Arc::new(ApiServer::start_with_auth("ident-p"));
    let consumer_api = Arc::new(ApiServer::start("ident-c"));
    provider.install_crds();
    consumer_api.install_crds();
    prepare_cluster(&provider, "provider");
    prepare_cluster(&consumer_api, "wrongly");
    let svc = AuthService::start(&provider, "provider").await.unwrap();
    let p = provider.client().await;
    let a = Attacker {
        url: svc.url.clone(),
        pin: svc.pin.clone(),
    };
    let standing = arg_of(&peer_command(&provider, &svc.url, &[]).unwrap(), "--token");

    let mut failures = Vec::new();
    check(
        &mut failures,
        "no takeover of a tenant",
        no_takeover_of_a_tenant(a.clone(), p.clone(), standing.clone()),
    )
    .await;
    check(
        &mut failures,
        "no ids of others",
        no_ids_of_others(a.clone(), p.clone(), standing.clone()),
    )
    .await;
    check(
        &mut failures,
        "wrong provider creates nothing",
        wrong_provider_creates_nothing(
            a.clone(),
            p.clone(),
            provider.clone(),
            consumer_api.clone(),
        ),
    )
    .await;
    check(
        &mut failures,
        "tokens are bound and one-time",
        tokens_are_bound_and_one_time(a.clone(), provider.clone()),
    )
    .await;
    check(
        &mut failures,
        "a planted CSR is not approved",
        a_planted_csr_is_not_approved(a.clone(), p.clone(), provider.clone(), standing.clone()),
    )
    .await;
    check(
        &mut failures,
        "a compromised service gets no subject signed",
        a_compromised_service_gets_no_subject_signed(
            a.clone(),
            p.clone(),
            provider.clone(),
            standing.clone(),
        ),
    )
    .await;
    check(
        &mut failures,
        "idle crowds are cut",
        idle_crowds_are_cut(a.clone(), standing.clone()),
    )
    .await;
    check(
        &mut failures,
        "revocation is real",
        revocation_is_real(a.clone(), p.clone(), provider.clone(), standing.clone()),
    )
    .await;
    assert!(
        failures.is_empty(),
        "{}\n--- service log ---\n{}",
        failures.join("\n"),
        svc.logs()
    );
}
