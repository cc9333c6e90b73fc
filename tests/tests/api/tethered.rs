//! Working modes (issue 21, docs/modes.md): a provider tethered to its one consumer and set
//! autonomous again. Two API servers with RBAC and client certificates enforced, peered as a
//! user does it (`fabricctl generate peer-command` on the provider, the command run on the
//! consumer, with the provider's authentication service); the provider runs
//! `fabric-controller sharing` (offer policy, ShadowPod controller) and the ShadowPod webhook
//! (which also judges pod creations by the mode) as their ServiceAccounts with the rights
//! deploy/ gives them, registered as deploy/ registers the webhook; the consumer's sharing
//! controllers run in-process as its `fabric-sharing` ServiceAccount. No gateways: the
//! network never connects, the resource negotiation does not need it.
//!
//! Checked: `mode tethered` refused for an unknown peer and while another consumer is
//! peered (naming it); tethered, the consumer's grant grows from 90% to all of what is free,
//! both ForeignClusters and `fabricctl status`/`info` say Tethered, a local pod is refused
//! naming the mode and the peer (one in an exempt namespace is not), `--drain-local` evicts
//! the local pods that ran before, a ShadowPod of the consumer's still gets its pod, a
//! consumer peering meanwhile is refused saying why, and the consumer's own identity cannot
//! change the mode; autonomous again, the grant is back to 90%, local pods are accepted, and
//! after the drain grace the consumer's ShadowPod beyond the grant (one that only fit the
//! tethered grant) is deleted, the one within it kept.
use std::{process::Output, time::Duration};

use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, Tenant},
    core::v1alpha1::ForeignCluster,
    names,
    offloading::v1alpha1::ShadowPod,
};
use fabric_negotiation::run;
use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    auth_service::AuthService,
    offload_fixture as fixture,
    phase::phase_async,
    process::Bin,
    rights,
    sharing::install_identity,
    wait::{eventually, try_eventually},
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::{Value, json};

const NS: &str = names::DEFAULT_NAMESPACE;
const CONSUMER: &str = "cons";
const PROVIDER: &str = "prov";
/// A consumer the fixture admits on the provider beside the peered one.
const OTHER: &str = "other";
/// One that peers while the provider is tethered.
const LATE: &str = "late";
const KEY_C: &str = "CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCA=";
const KEY_P: &str = "PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPA=";
const T: Duration = Duration::from_secs(40);
/// The provider's namespace of local workloads.
const LOCAL: &str = "shop";

fn fabricctl(api: &ApiServer, args: &[&str]) -> Output {
    fabric_tests::process::fabricctl(&api.kubeconfig, args)
}

fn text(o: &Output) -> String {
    fabric_tests::process::output_text(o)
}

/// The provider's answer to `consumer`'s slice `name`: (granted cpu, pods, Accepted reason,
/// its message, mode).
async fn answer(
    p: &Client,
    consumer: &str,
    name: &str,
) -> Option<(String, String, String, String, String)> {
    let s = Api::<ResourceSlice>::namespaced(p.clone(), &names::namespace::tenant(consumer))
        .get_opt(name)
        .await
        .ok()??;
    let v = serde_json::to_value(s.status?).ok()?;
    let accepted = v["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")?
        .clone();
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Some((
        s(&v["granted"]["cpu"]),
        s(&v["granted"]["pods"]),
        s(&accepted["reason"]),
        s(&accepted["message"]),
        s(&v["mode"]),
    ))
}

/// Waits until the provider grants `consumer` `cpu` and `pods`.
async fn granted(p: &Client, cpu: &str, pods: &str) {
    let what = format!("{CONSUMER} granted cpu {cpu}, pods {pods}");
    eventually(&what, T, || async {
        let (c, n, ..) = answer(p, CONSUMER, PROVIDER).await?;
        (c == cpu && n == pods).then_some(())
    })
    .await;
}

/// The Tethered condition's reason on ForeignCluster `name`.
async fn fc_mode(c: &Client, name: &str) -> Option<String> {
    let fc = Api::<ForeignCluster>::all(c.clone())
        .get_opt(name)
        .await
        .ok()??;
    fc.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Tethered")
        .map(|c| c.reason)
}

async fn both_say(c: &Client, p: &Client, mode: &str) {
    eventually(&format!("both ForeignClusters say {mode}"), T, || async {
        (fc_mode(c, PROVIDER).await.as_deref() == Some(mode)
            && fc_mode(p, CONSUMER).await.as_deref() == Some(mode))
        .then_some(())
    })
    .await;
}

fn local_pod(ns: &str, name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
           "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}})
    .to_string()
}

fn create_pod(api: &ApiServer, ns: &str, name: &str) -> Output {
    api.kubectl_stdin(&["create", "-f", "-"], &local_pod(ns, name))
}

/// A ShadowPod as the consumer's identity can write one, asking for `cpu`.
fn shadow(name: &str, cpu: &str) -> ShadowPod {
    serde_json::from_value(json!({
        "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": name, "namespace": names::namespace::tenant(CONSUMER)},
        "spec": {
            "clusterId": CONSUMER,
            "home": {"namespace": "default", "name": name, "uid": format!("home-{name}")},
            "pod": {"spec": {"containers": [{"name": "main", "image": "echo",
                "resources": {"requests": {"cpu": cpu}}}]}},
        },
    }))
    .unwrap()
}

/// The identity the provider issued to the consumer, as the consumer keeps it: the
/// attacker's own credentials.
async fn consumer_identity(c: &Client) -> Client {
    let secret = Api::<Secret>::namespaced(c.clone(), names::namespace::IDENTITIES)
        .get(&names::secret::identity(PROVIDER))
        .await
        .unwrap();
    let kubeconfig = secret.data.unwrap()[names::secret::KUBECONFIG_FIELD]
        .0
        .clone();
    fabric_auth::identity::client_from_kubeconfig(&String::from_utf8(kubeconfig).unwrap())
        .await
        .unwrap()
}

/// A consumer admitted on the provider as its authentication service would, with the slice
/// its replicator would make (1Gi of memory).
async fn admit(p: &Client, provider_api: &ApiServer, consumer: &str) {
    fabric_tests::sharing::admit_tenant(p, consumer)
        .await
        .unwrap();
    fixture::apply(
        provider_api,
        &json!({ "apiVersion": "authentication.fabric.io/v1alpha1", "kind": "ResourceSlice",
                 "metadata": { "name": consumer, "namespace": names::namespace::tenant(consumer) },
                 "spec": { "consumerClusterId": consumer, "providerClusterId": PROVIDER,
                           "resources": { "memory": "1Gi" } } }),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_tethered_to_its_one_consumer_and_back() {
    let tag = "tethered";
    if !require_tools(tag) {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter("fabric_negotiation=info,fabric_kube=warn,kube_runtime=warn")
        .with_test_writer()
        .try_init();
    let dir = fixture::scratch_dir(tag).unwrap();
    let caller = fabric_tests::webhook::Caller::new(&dir.join("webhook-caller")).unwrap();
    let consumer_api = ApiServer::start_with_auth(&format!("{tag}-c"));
    let provider_api =
        ApiServer::start_with_auth_args(&format!("{tag}-p"), &caller.kubelite_args());
    consumer_api.install_crds();
    provider_api.install_crds();
    let (c, p) = (consumer_api.client().await, provider_api.client().await);
    install_identity(
        &c,
        NS,
        CONSUMER,
        "10.244.0.0/16",
        Some((KEY_C, "192.0.2.1:51820")),
    )
    .await
    .unwrap();
    install_identity(
        &p,
        NS,
        PROVIDER,
        "10.245.0.0/16",
        Some((KEY_P, "198.51.100.2:51821")),
    )
    .await
    .unwrap();
    let alloc = json!({ "cpu": "8", "memory": "16Gi", "pods": "110" });
    fabric_tests::sharing::add_node(&p, "n1", alloc)
        .await
        .unwrap();
    // The provider's sharing controller approves the service's CSRs.
    let svc = AuthService::start_as(&provider_api, PROVIDER, None, false)
        .await
        .unwrap();
    let sharing_kubeconfig = rights::component_kubeconfig(
        &provider_api,
        "fabric-sharing",
        dir.join("sharing.kubeconfig"),
    )
    .unwrap();
    let _sharing = Bin::new("fabric-controller")
        .unwrap()
        .arg("sharing")
        // Leaving tethered mode, the pods beyond the grant go after this.
        .args(["--drain-grace", "3s"])
        .kubeconfig(&sharing_kubeconfig)
        .pod_name("controller-0")
        .log(dir.join("provider-sharing.log"))
        .spawn()
        .unwrap();
    let _webhook =
        fabric_tests::webhook::start(&provider_api, &caller, &dir.join("webhook.log")).unwrap();
    let own_c = rights::component_client(
        &consumer_api,
        "fabric-sharing",
        consumer_api
            .kubeconfig
            .with_file_name("fabric-sharing.kubeconfig"),
    )
    .await
    .unwrap();
    let consumer_controllers = tokio::spawn(async move {
        if let Err(e) = run(
            own_c,
            fabric_tests::sharing::negotiation_settings(NS, "test"),
        )
        .await
        {
            panic!("sharing controllers: {e}");
        }
    });
    let logs = || {
        format!(
            "--- provider's sharing controller ---\n{}\n--- webhook ---\n{}",
            fixture::tail(&dir.join("provider-sharing.log"), 30),
            fixture::tail(&dir.join("webhook.log"), 30)
        )
    };
    provider_api.kubectl_ok(&["create", "namespace", LOCAL]);

    phase_async("peered as a user does it: 90% of what is free", async {
        let o = fabricctl(
            &provider_api,
            &["generate", "peer-command", "--auth-url", &svc.url],
        );
        assert!(o.status.success(), "{}", text(&o));
        let line = String::from_utf8(o.stdout).unwrap();
        let mut args: Vec<&str> = line.split_whitespace().skip(1).collect();
        // More than there is: the grant shows the share.
        args.extend([
            "--cpu",
            "100",
            "--pods",
            "1000",
            "--memory",
            "1Gi",
            "--timeout-secs",
            "0",
        ]);
        let o = fabricctl(&consumer_api, &args);
        assert!(o.status.success(), "{}\n{}", text(&o), svc.logs());
        granted(&p, "7200m", "99").await;
        both_say(&c, &p, "Autonomous").await;
    })
    .await;

    phase_async(
        "mode tethered refused: an unknown peer, another consumer peered",
        async {
            let o = fabricctl(&provider_api, &["mode", "tethered", "--peer", "nobody"]);
            assert!(!o.status.success(), "{}", text(&o));
            assert!(
                text(&o).contains("\"nobody\" is unknown here"),
                "{}",
                text(&o)
            );
            admit(&p, &provider_api, OTHER).await;
            let o = fabricctl(&provider_api, &["mode", "tethered", "--peer", CONSUMER]);
            let out = text(&o);
            assert!(!o.status.success(), "{out}");
            assert!(
                out.contains("other consumers besides \"cons\" (other)")
                    && out.contains("at most one peering"),
                "{out}"
            );
            // Nothing changed.
            let t = Api::<Tenant>::namespaced(p.clone(), &names::namespace::tenant(CONSUMER))
                .get(CONSUMER)
                .await
                .unwrap();
            assert_eq!(t.spec.mode.as_str(), "autonomous");
            // The other consumer leaves (its Tenant being removed counts no more).
            Api::<Tenant>::namespaced(p.clone(), &names::namespace::tenant(OTHER))
                .delete(OTHER, &DeleteParams::default())
                .await
                .unwrap();
        },
    )
    .await;

    phase_async(
        "tethered (--drain-local): all of what is free to the peer, said on both sides",
        async {
            // A local pod from before: evicted by --drain-local.
            let o = create_pod(&provider_api, LOCAL, "old");
            assert!(o.status.success(), "{}", text(&o));
            let o = fabricctl(
                &provider_api,
                &["mode", "tethered", "--peer", CONSUMER, "--drain-local"],
            );
            let out = text(&o);
            assert!(o.status.success(), "{out}\n{}", logs());
            assert!(out.contains("tethered to cons"), "{out}");
            assert!(out.contains("evicting shop/old"), "{out}");
            eventually("the old local pod evicted", T, || async {
                let pod = Api::<Pod>::namespaced(p.clone(), LOCAL)
                    .get_opt("old")
                    .await
                    .ok()?;
                pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
                    .then_some(())
            })
            .await;
            if try_eventually("all of what is free granted", T, || async {
                let (c, n, _, _, mode) = answer(&p, CONSUMER, PROVIDER).await?;
                (c == "8" && n == "110" && mode == "Tethered").then_some(())
            })
            .await
            .is_err()
            {
                panic!(
                    "the grant did not grow to all of what is free: {:?}\n{}",
                    answer(&p, CONSUMER, PROVIDER).await,
                    logs()
                );
            }
            both_say(&c, &p, "Tethered").await;
            let o = fabricctl(&provider_api, &["status"]);
            assert!(
                text(&o).contains("this cluster: tethered to cons"),
                "{}",
                text(&o)
            );
            let o = fabricctl(&consumer_api, &["info", "peer", PROVIDER]);
            let out = text(&o);
            assert!(
                out.lines()
                    .any(|l| l.contains("mode") && l.contains("Tethered")),
                "{out}"
            );
        },
    )
    .await;

    phase_async(
        "tethered: local pods refused naming the mode, the peer's ShadowPods run",
        async {
            let o = create_pod(&provider_api, LOCAL, "new");
            let out = text(&o);
            assert!(
                !o.status.success(),
                "a local pod was accepted while tethered"
            );
            assert!(
                out.contains("tethered mode") && out.contains("\"cons\""),
                "{out}"
            );
            // A namespace the admin exempts.
            provider_api.kubectl_ok(&["create", "namespace", "ops"]);
            provider_api.kubectl_ok(&[
                "label",
                "namespace",
                "ops",
                "fabric.io/tethered-exempt=true",
            ]);
            let o = create_pod(&provider_api, "ops", "repair");
            assert!(o.status.success(), "{}", text(&o));
            // The consumer's ShadowPod gets its pod (made by the sharing controller).
            let identity = consumer_identity(&c).await;
            Api::<ShadowPod>::namespaced(identity.clone(), &names::namespace::tenant(CONSUMER))
                .create(&Default::default(), &shadow("x-web", "100m"))
                .await
                .unwrap();
            // Room only a tethered provider gives: 7.6 CPU of the 8, beyond the 7.2 of 90%.
            Api::<ShadowPod>::namespaced(identity.clone(), &names::namespace::tenant(CONSUMER))
                .create(&Default::default(), &shadow("x-big", "7500m"))
                .await
                .unwrap();
            if try_eventually("the ShadowPod's pod", T, || async {
                Api::<Pod>::namespaced(p.clone(), &names::namespace::tenant(CONSUMER))
                    .get_opt("x-web")
                    .await
                    .ok()?
            })
            .await
            .is_err()
            {
                panic!("no pod for the ShadowPod\n{}", logs());
            }
        },
    )
    .await;

    phase_async(
        "tethered: a consumer peering meanwhile is refused; the consumer cannot switch the mode",
        async {
            admit(&p, &provider_api, LATE).await;
            let (_, _, reason, message, _) =
                eventually("the late consumer's answer", T, || async {
                    answer(&p, LATE, LATE).await.filter(|a| !a.2.is_empty())
                })
                .await;
            assert_eq!(reason, "Refused", "{message}");
            assert!(message.contains("tethered to \"cons\""), "{message}");
            // The consumer's own identity: its Tenant is read-only to it.
            let identity = consumer_identity(&c).await;
            let tenants: Api<Tenant> =
                Api::namespaced(identity, &names::namespace::tenant(CONSUMER));
            let e = tenants
                .patch(
                    CONSUMER,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"mode": null}})),
                )
                .await
                .expect_err("the consumer set its provider autonomous");
            assert!(matches!(&e, kube::Error::Api(s) if s.code == 403), "{e}");
            let t = Api::<Tenant>::namespaced(p.clone(), &names::namespace::tenant(CONSUMER))
                .get(CONSUMER)
                .await
                .unwrap();
            assert_eq!(t.spec.mode.as_str(), "tethered");
        },
    )
    .await;

    phase_async(
        "autonomous: back to 90%, local pods accepted again",
        async {
            let o = fabricctl(&provider_api, &["mode", "autonomous"]);
            assert!(o.status.success(), "{}", text(&o));
            assert!(text(&o).contains("autonomous: cons"), "{}", text(&o));
            granted(&p, "7200m", "99").await;
            both_say(&c, &p, "Autonomous").await;
            let o = create_pod(&provider_api, LOCAL, "after");
            assert!(o.status.success(), "{}", text(&o));
            // The consumer's pods beyond the smaller grant go after the drain grace, the
            // newest first: x-big (7.6 CPU on 7.2), not x-web.
            let shadows: Api<ShadowPod> =
                Api::namespaced(p.clone(), &names::namespace::tenant(CONSUMER));
            let tenants: Api<Tenant> =
                Api::namespaced(p.clone(), &names::namespace::tenant(CONSUMER));
            let settled = try_eventually("the pods beyond the grant stopped", T, || async {
                let t = tenants.get(CONSUMER).await.ok()?;
                let c = t
                    .status?
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "Tethered")?;
                (c.reason == "Autonomous" && c.message.contains("1 ShadowPods")).then_some(())
            })
            .await;
            if settled.is_err() {
                panic!(
                    "the excess was not stopped: {:?}\n{}",
                    tenants.get(CONSUMER).await.map(|t| t.status),
                    logs()
                );
            }
            let big = shadows.get_opt("x-big").await.unwrap();
            assert!(
                big.is_none_or(|b| b.metadata.deletion_timestamp.is_some()),
                "x-big stays beyond the grant"
            );
            let web = shadows
                .get_opt("x-web")
                .await
                .unwrap()
                .expect("x-web stays");
            assert!(web.metadata.deletion_timestamp.is_none());
        },
    )
    .await;
    consumer_controllers.abort();
}
