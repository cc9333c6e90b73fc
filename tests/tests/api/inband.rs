//! `fabricctl peer` in-band and `fabricctl unpeer` (issue 10): two API servers with RBAC and
//! client certificates enforced, the provider's authentication service, and both clusters'
//! sharing controllers in-process (as `fabric-controller sharing` runs them). No gateways:
//! the network objects are checked, not the tunnel. One pair of API servers for the file:
//!
//! 1. out-of-band peering (the peer command) ends in a state S;
//! 2. `unpeer` (provider reachable) leaves nothing on either side;
//! 3. in-band `peer` ends in the same state S, and the consumer keeps none of the provider's
//!    admin credentials (nor the one-time token on the provider);
//! 4. with the provider's API server stopped, `unpeer --force` finishes within a bound and
//!    leaves nothing on the consumer.
use std::{
    collections::BTreeMap,
    process::Output,
    time::{Duration, Instant},
};

use fabric_api::{
    authentication::v1alpha1::{Identity, ResourceSlice, Tenant},
    core::v1alpha1::ForeignCluster,
    names,
    networking::v1alpha1::{
        Configuration, GatewayClient, GatewayServer, PeeringNetwork, PublicKey,
    },
    offloading::v1alpha1::VirtualNode,
};
use fabric_negotiation::run;
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    auth_service::AuthService,
    rights,
    sharing::{PurgeProbe, install_identity},
    wait::eventually,
};
use k8s_openapi::api::{
    certificates::v1::CertificateSigningRequest,
    core::v1::{Namespace, Secret},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client, Resource,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams},
};
use serde_json::{Value, json};

const NS: &str = names::DEFAULT_NAMESPACE;
const CONSUMER: &str = "cons";
const PROVIDER: &str = "prov";
const KEY_C: &str = "CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCA=";
const KEY_P: &str = "PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPA=";

fn fabricctl(api: &ApiServer, args: &[&str]) -> Output {
    fabric_tests::process::fabricctl(&api.kubeconfig, args)
}

fn text(o: &Output) -> String {
    fabric_tests::process::output_text(o)
}

fn controllers(client: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = run(
            client,
            fabric_tests::sharing::negotiation_settings(NS, "test"),
        )
        .await
        {
            panic!("sharing controllers: {e}");
        }
    })
}

/// An object as a `DynamicObject` (absent: None).
async fn get<K: Resource<DynamicType = ()>>(
    client: &Client,
    ns: Option<&str>,
    name: &str,
) -> Option<Value> {
    let ar = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.get_opt(name)
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

/// The parts of `v` at `pointers` (what a peering decides, not when or by whom it was written;
/// finalizers as a set: controllers add theirs in any order).
fn pick(v: &Value, pointers: &[&str]) -> Value {
    Value::Object(
        pointers
            .iter()
            .map(|p| {
                let mut part = v.pointer(p).cloned().unwrap_or(Value::Null);
                if let (true, Value::Array(items)) = (p.ends_with("finalizers"), &mut part) {
                    items.sort_by_key(ToString::to_string);
                }
                ((*p).to_owned(), part)
            })
            .collect(),
    )
}

/// What a peering of `cons` with `prov` consists of, on both sides.
async fn state(c: &Client, p: &Client) -> BTreeMap<String, Value> {
    let tenant_ns = names::namespace::tenant(CONSUMER);
    let meta = ["/metadata/labels", "/metadata/finalizers"];
    let spec = ["/spec", "/metadata/labels", "/metadata/finalizers"];
    let mut s = BTreeMap::new();
    let mut put = |k: &str, v: Option<Value>, ptrs: &[&str]| {
        s.insert(
            k.to_owned(),
            v.map(|v| pick(&v, ptrs)).unwrap_or(Value::Null),
        );
    };
    // The consumer.
    put(
        "c/ForeignCluster",
        get::<ForeignCluster>(c, None, PROVIDER).await,
        &["/spec", "/metadata/finalizers", "/status/tenantNamespace"],
    );
    put(
        "c/Identity",
        get::<Identity>(c, Some(NS), PROVIDER).await,
        &["/spec", "/metadata/labels", "/metadata/annotations"],
    );
    let secret = get::<Secret>(c, Some(names::namespace::IDENTITIES), &names::secret::identity(PROVIDER))
        .await
        .map(|v| json!({ "type": v["type"], "keys": v["data"].as_object().map(|d| d.keys().cloned().collect::<Vec<_>>()) }));
    put("c/Secret", secret, &["/type", "/keys"]);
    put(
        "c/ResourceSlice",
        get::<ResourceSlice>(c, Some(NS), PROVIDER).await,
        &[
            "/spec",
            "/metadata/labels",
            "/metadata/finalizers",
            "/status/granted",
        ],
    );
    put(
        "c/VirtualNode",
        get::<VirtualNode>(c, Some(NS), PROVIDER).await,
        &spec,
    );
    put(
        "c/Configuration",
        get::<Configuration>(c, Some(NS), PROVIDER).await,
        &spec,
    );
    put(
        "c/PublicKey",
        get::<PublicKey>(c, Some(NS), PROVIDER).await,
        &spec,
    );
    put(
        "c/GatewayClient",
        get::<GatewayClient>(c, Some(NS), PROVIDER).await,
        &spec,
    );
    // The provider.
    put(
        "p/Namespace",
        get::<Namespace>(p, None, &tenant_ns).await,
        &meta,
    );
    put(
        "p/Tenant",
        get::<Tenant>(p, Some(&tenant_ns), CONSUMER).await,
        &["/spec", "/metadata/finalizers", "/status/user"],
    );
    put(
        "p/Role",
        get::<Role>(p, Some(&tenant_ns), fabric_auth::tenant::ROLE).await,
        &["/rules"],
    );
    put(
        "p/RoleBinding",
        get::<RoleBinding>(p, Some(&tenant_ns), fabric_auth::tenant::ROLE).await,
        // The subject is the peering's own group: a new one each time.
        &["/subjects/0/kind", "/roleRef"],
    );
    put(
        "p/PeeringNetwork",
        get::<PeeringNetwork>(p, Some(&tenant_ns), CONSUMER).await,
        &["/spec", "/metadata/finalizers", "/status/provider"],
    );
    put(
        "p/ResourceSlice",
        get::<ResourceSlice>(p, Some(&tenant_ns), PROVIDER).await,
        &["/spec", "/metadata/labels", "/status/granted"],
    );
    put(
        "p/ForeignCluster",
        get::<ForeignCluster>(p, None, CONSUMER).await,
        &["/spec", "/status/tenantNamespace"],
    );
    put(
        "p/Configuration",
        get::<Configuration>(p, Some(NS), CONSUMER).await,
        &spec,
    );
    put(
        "p/GatewayServer",
        get::<GatewayServer>(p, Some(NS), CONSUMER).await,
        &spec,
    );
    s
}

/// Waits until the peering is complete as far as it goes without gateways: identity,
/// answered network, local network objects, granted slice and virtual node.
async fn peered(c: &Client, p: &Client) -> BTreeMap<String, Value> {
    eventually(
        "the peering to come up",
        Duration::from_secs(60),
        || async {
            let s = state(c, p).await;
            let done = s.values().all(|v| !v.is_null())
                && !s["c/VirtualNode"]["/spec"].is_null()
                && !s["p/PeeringNetwork"]["/status/provider"].is_null()
                && !s["c/ResourceSlice"]["/status/granted"].is_null()
                && s["c/ForeignCluster"]["/metadata/finalizers"]
                    .as_array()
                    .is_some_and(|f| f.len() == 2)
                && !s["p/Tenant"]["/metadata/finalizers"].is_null();
            done.then_some(s)
        },
    )
    .await
}

/// Nothing of the peering is left on the consumer.
async fn nothing_on_consumer(c: &Client) -> Result<(), String> {
    let s = state(c, c).await;
    for (k, v) in &s {
        if k.starts_with("c/") && !v.is_null() {
            return Err(format!("{k} is left: {v}"));
        }
    }
    let slices = Api::<ResourceSlice>::namespaced(c.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    if !slices.items.is_empty() {
        return Err(format!("{} ResourceSlice(s) left", slices.items.len()));
    }
    Ok(())
}

/// Nothing of the peering is left on the provider (its standing token aside).
async fn nothing_on_provider(p: &Client) -> Result<(), String> {
    let s = state(p, p).await;
    for (k, v) in &s {
        if k.starts_with("p/") && !v.is_null() {
            return Err(format!("{k} is left: {v}"));
        }
    }
    let csrs = Api::<CertificateSigningRequest>::all(p.clone())
        .list(
            &ListParams::default().labels(&format!("{}={CONSUMER}", names::label::REMOTE_CLUSTER)),
        )
        .await
        .unwrap();
    if !csrs.items.is_empty() {
        return Err(format!("{} CSR(s) left", csrs.items.len()));
    }
    Ok(())
}

/// The peering tokens on the provider with an expiry (minted for one command).
async fn minted_tokens(p: &Client) -> Vec<String> {
    Api::<Secret>::namespaced(p.clone(), names::namespace::PEERING_TOKENS)
        .list(&ListParams::default().labels(&fabric_auth::token::selector()))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .filter(|n| n != names::secret::PEERING_TOKEN)
        .collect()
}

/// The secret parts of a kubeconfig's users (tokens, client keys and certificates), as
/// written there (kubelite's start.sh writes flow mappings: `user: {token: "..."}`).
fn credentials_of(kubeconfig: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let mut out = Vec::new();
    for key in ["token", "client-key-data", "client-certificate-data"] {
        for part in text.split(&format!("{key}:")).skip(1) {
            let v = part
                .trim_start()
                .split([',', '}', '\n'])
                .next()
                .unwrap_or_default()
                .trim()
                .trim_matches('"');
            if v.len() >= 16 {
                out.push(v.to_owned());
            }
        }
    }
    assert!(
        !out.is_empty(),
        "the admin kubeconfig has credentials:\n{text}"
    );
    out
}

async fn add_node(client: &Client) {
    let alloc = json!({ "cpu": "8", "memory": "16Gi", "pods": "110" });
    fabric_tests::sharing::add_node(client, "n1", alloc)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_band_peer_and_unpeer() {
    if !require_tools("in_band_peer_and_unpeer") {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            "fabric_negotiation=info,fabric_auth=info,fabric_kube=warn,kube_runtime=warn",
        )
        .with_test_writer()
        .try_init();
    let consumer_api = ApiServer::start_with_auth("inband-c");
    let provider_api = ApiServer::start_with_auth("inband-p");
    consumer_api.install_crds();
    provider_api.install_crds();
    let (c, p) = (consumer_api.client().await, provider_api.client().await);
    let gw_c = Some((KEY_C, "192.0.2.1:51820"));
    install_identity(&c, NS, CONSUMER, "10.244.0.0/16", gw_c)
        .await
        .unwrap();
    let gw_p = Some((KEY_P, "198.51.100.2:51821"));
    install_identity(&p, NS, PROVIDER, "10.245.0.0/16", gw_p)
        .await
        .unwrap();
    add_node(&p).await;
    let svc = AuthService::start(&provider_api, PROVIDER).await.unwrap();
    // The sharing controllers as their pods run them: each cluster's fabric-sharing
    // ServiceAccount, with the rights deploy/ gives it.
    let mut own = Vec::new();
    for api in [&consumer_api, &provider_api] {
        let out = api.kubeconfig.with_file_name("fabric-sharing.kubeconfig");
        own.push(
            rights::component_client(api, "fabric-sharing", out)
                .await
                .unwrap(),
        );
    }
    let (own_p, own_c) = (own.pop().unwrap(), own.pop().unwrap());
    let ctl = [controllers(own_c), controllers(own_p)];
    let provider_kubeconfig = provider_api.kubeconfig.to_str().unwrap().to_owned();

    // 1. Out of band, with the command the provider's admin prints.
    let o = fabricctl(
        &provider_api,
        &["generate", "peer-command", "--auth-url", &svc.url],
    );
    assert!(o.status.success(), "{}", text(&o));
    let line = String::from_utf8(o.stdout).unwrap();
    let mut args: Vec<&str> = line.split_whitespace().skip(1).collect();
    let word_after = |flag: &str| {
        let i = args.iter().position(|a| *a == flag).unwrap();
        args[i + 1].to_owned()
    };
    // The printed command (the standing token), kept by whoever saw it.
    let (printed_token, printed_pin) = (word_after("--token"), word_after("--auth-pin"));
    // No gateways run: the network never connects, so the command returns once it asked.
    args.extend([
        "--cpu",
        "1",
        "--memory",
        "1Gi",
        "--at-most-once",
        "60,10",
        "--timeout-secs",
        "0",
    ]);
    let o = fabricctl(&consumer_api, &args);
    assert!(o.status.success(), "{}\n{}", text(&o), svc.logs());
    let out_of_band = peered(&c, &p).await;
    // The at-most-once terms asked for, in the consumer's slice and its provider replica.
    let terms = json!({ "partitionSeconds": 60, "graceSeconds": 10 });
    for side in ["c/ResourceSlice", "p/ResourceSlice"] {
        assert_eq!(
            out_of_band[side]["/spec"]["atMostOnce"], terms,
            "{side}: {:?}",
            out_of_band[side]
        );
    }

    // 2. Unpeer with the provider reachable: nothing is left on either side.
    let probe = PurgeProbe::plant(&p, CONSUMER).await.unwrap();
    let o = fabricctl(
        &consumer_api,
        &["unpeer", "--remote-kubeconfig", &provider_kubeconfig],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for step in [
        "✓ deleted ForeignCluster prov",
        "… waiting for ResourceSlice(s) prov",
        "✓ nothing of the peering with prov is left on this cluster",
        "removed the tenant area",
    ] {
        assert!(out.contains(step), "{step:?} missing in:\n{out}");
    }
    nothing_on_consumer(&c).await.unwrap();
    nothing_on_provider(&p).await.unwrap();
    probe.purged(&p).await.unwrap();

    // 3. In band: the same steps, the same end state. A bad --at-most-once is refused
    // before anything is done.
    let peer_in_band = |more: &[&str]| {
        let mut args = vec![
            "peer",
            "--remote-kubeconfig",
            &provider_kubeconfig,
            "--auth-url",
            &svc.url,
            "--cpu",
            "1",
        ];
        args.extend_from_slice(more);
        fabricctl(&consumer_api, &args)
    };
    let o = peer_in_band(&["--at-most-once", "0,10"]);
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("the partition time must be 1 s to 1 day"),
        "{out}"
    );
    assert!(minted_tokens(&p).await.is_empty(), "{out}");
    let o = peer_in_band(&[
        "--memory",
        "1Gi",
        "--at-most-once",
        "60,10",
        "--timeout-secs",
        "0",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}\n{}", svc.logs());
    for step in [
        "✓ minted a one-time token on prov",
        "✓ generated a key pair",
        "✓ authenticated",
        "✓ stored Secret",
        "✓ the identity works",
        "✓ revoked the one-time token",
        "✓ asked prov for resources",
    ] {
        assert!(out.contains(step), "{step:?} missing in:\n{out}");
    }
    let in_band = peered(&c, &p).await;
    assert_eq!(
        in_band, out_of_band,
        "in-band and out-of-band peering end in different states"
    );
    assert!(
        minted_tokens(&p).await.is_empty(),
        "the one-time token is gone"
    );
    // None of the provider's admin credentials on the consumer, in any Secret or ConfigMap.
    let admin = credentials_of(&provider_api.kubeconfig);
    let secrets = Api::<Secret>::all(c.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut stored = String::new();
    for s in &secrets.items {
        for v in s.data.iter().flat_map(|d| d.values()) {
            let raw = String::from_utf8_lossy(&v.0).into_owned();
            stored += &raw;
            stored += "\n";
        }
    }
    let cms = Api::<k8s_openapi::api::core::v1::ConfigMap>::all(c.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    for cm in &cms.items {
        for v in cm.data.iter().flat_map(|d| d.values()) {
            stored += v;
        }
    }
    assert!(!stored.is_empty());
    for cred in &admin {
        assert!(
            !stored.contains(cred.as_str()),
            "a credential of the provider's admin kubeconfig is stored on the consumer"
        );
    }

    // 3b. The provider's admin deletes the consumer's ForeignCluster there: the consumer is
    // revoked as by `kubectl delete tenant` (its Tenant, access and tenant area go), and the
    // ForeignCluster goes last.
    Api::<ForeignCluster>::all(p.clone())
        .delete(CONSUMER, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "nothing left on the provider after deleting the consumer's ForeignCluster",
        Duration::from_secs(30),
        || async { nothing_on_provider(&p).await.ok() },
    )
    .await;
    let as_consumer = fabric_auth::identity::remote_client(&c, PROVIDER)
        .await
        .unwrap();
    let denied = Api::<ResourceSlice>::namespaced(as_consumer, &names::namespace::tenant(CONSUMER))
        .list(&ListParams::default())
        .await;
    assert!(
        matches!(denied, Err(kube::Error::Api(ref e)) if e.code == 403 || e.code == 401),
        "the revoked consumer still reaches the provider: {denied:?}"
    );
    // The revocation rotated the standing token: the command printed before (which the
    // revoked consumer saw) gets no new identity, under any id.
    let (_, csr_pem) = fabric_auth::consumer::key_and_csr("latecomer").unwrap();
    let replay = fabric_auth::consumer::send(
        &svc.url,
        &fabric_auth::tls::Trust::Pin(fabric_auth::tls::parse_pin(&printed_pin).unwrap()),
        &fabric_auth::protocol::AuthRequest {
            cluster_id: "latecomer".to_owned(),
            token: printed_token,
            csr_pem,
            provider_cluster_id: None,
        },
    )
    .await;
    assert!(
        matches!(&replay, Err(fabric_auth::consumer::ClientError::Refused(r))
            if r.reason == fabric_auth::protocol::Reason::InvalidToken),
        "the peer command printed before the revocation: {:?}",
        replay.map(|r| r.tenant_namespace)
    );

    // 4. The provider's API dies: `unpeer --force` still finishes, quickly, and leaves
    // nothing here; it says what may be left there.
    drop(svc);
    drop(provider_api);
    assert!(
        tokio::time::timeout(Duration::from_secs(3), p.apiserver_version())
            .await
            .map_or(true, |r| r.is_err()),
        "the provider's API is down"
    );
    let t0 = Instant::now();
    let o = fabricctl(
        &consumer_api,
        &["unpeer", PROVIDER, "--force", "--timeout-secs", "40"],
    );
    let took = t0.elapsed();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        took < Duration::from_secs(25),
        "a forced unpeer took {took:?}:\n{out}"
    );
    for step in [
        "forced",
        "✓ nothing of the peering with prov is left on this cluster",
        "kubectl delete tenant cons -n fabric-tenant-cons",
    ] {
        assert!(out.contains(step), "{step:?} missing in:\n{out}");
    }
    nothing_on_consumer(&c).await.unwrap();
    for h in ctl {
        h.abort();
    }
}
