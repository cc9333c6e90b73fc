//! The pod kind of the reflection framework: home pods bound to this node (watched with the
//! field selector `spec.nodeName=<node>`) and their ShadowPods on the provider, keyed by the
//! home pod they were made for (`spec.home`): in the twin of an offloaded namespace under the
//! pod's own name ([`Placement::Twin`]), or in the tenant namespace as `<namespace>.<name>`
//! ([`Placement::Tenant`]; which pods go where: [`super::twins`]). Its decisions are
//! [`decide`]'s; its writes are [`super::act`]'s.
use fabric_api::{
    names::{home_api, label, service_account_token},
    offloading::v1alpha1::ShadowPod,
};
use fabric_offloading::shadowpod::forge::{self, HomeApi};
use fabric_reflector::{Cx, Endpoint, Key, Kind, Marks, Next, Pair, Remote, View};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::{conditions::Readiness, home_api::HomeApis};

use super::{
    act,
    decide::{self, Step},
    made::Made,
    translate::{Remap, Untranslatable},
    twins::{Route, Twins},
};

/// Which ShadowPods a reflection of the pod kind keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// In the tenant namespace, `<namespace>.<name>`: the pods of namespaces not offloaded
    /// (and those offloaded so before their namespace was).
    Tenant,
    /// In the twin of the pair's home namespace, under the pod's own name.
    Twin,
}

/// The pods bound to one virtual node.
pub struct Pods {
    pub placement: Placement,
    /// The namespaces offloaded to the provider and its twins of them.
    pub twins: watch::Receiver<Twins>,
    pub node_name: String,
    /// The node's address: every offloaded pod's hostIP.
    pub node_ip: String,
    /// Whether the node is Ready, and why not (for the pods' status).
    pub ready: watch::Receiver<Option<Readiness>>,
    /// The remap of the peer's pod CIDR, or why there is none, as of the peer's last
    /// Configuration ([`super::run::follow_remap`]).
    pub remap: watch::Receiver<Result<Remap, Untranslatable>>,
    /// Where the pods of each twin find the home API server (`None`: not configured, pods
    /// get nothing of it).
    pub home_api: Option<watch::Receiver<HomeApis>>,
    /// The ShadowPods this process made lately (their watch may not show them yet).
    pub made: Made,
}

impl Pods {
    /// What `pod` is given of the home API server where it runs: nothing (`Some(None)`: not
    /// configured, the tenant placement, or opted out with
    /// [`service_account_token::OPT_OUT`]), or its twin's Service; `None`: that Service
    /// has no cluster IP yet, the pod waits.
    pub fn home_api_for(&self, pod: &Pod) -> Option<Option<HomeApi>> {
        let Some(apis) = self.home_api.as_ref() else {
            return Some(None);
        };
        if self.placement == Placement::Tenant || service_account_token::opted_out(&pod.metadata) {
            return Some(None);
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        apis.borrow().get(ns).cloned().map(Some)
    }
}

/// What [`decide`] knows of a pod's ShadowPod, from what the edge knows: one that is not
/// ours (made by someone else under that name) is not concluded from.
pub fn remote<'a>(r: Remote<'a, ShadowPod>) -> decide::Remote<'a> {
    match r {
        Remote::Unknown | Remote::Foreign(_) => decide::Remote::Unknown,
        Remote::Absent => decide::Remote::Absent,
        Remote::Ours(s) => decide::Remote::Present(s),
    }
}

impl Kind for Pods {
    type Home = Pod;
    type Remote = ShadowPod;
    type Step = Step;
    type Error = anyhow::Error;
    const NAME: &'static str = "pods";

    fn watch_home(&self) -> watcher::Config {
        watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name))
    }

    fn remote_name(&self, key: &Key) -> String {
        match self.placement {
            Placement::Tenant => forge::name(&key.namespace, &key.name),
            Placement::Twin => key.name.clone(),
        }
    }

    fn key_of(&self, pair: &Pair, s: &ShadowPod) -> Option<Key> {
        let home = &s.spec.home;
        match self.placement {
            Placement::Tenant => Some(Key::new(&home.namespace, &home.name)),
            // A twin holds one home namespace's pods, each under its own name.
            Placement::Twin => (pair.home.as_deref() == Some(home.namespace.as_str())
                && s.metadata.name.as_deref() == Some(home.name.as_str()))
            .then(|| Key::new(&home.namespace, &home.name)),
        }
    }

    fn orphaned(&self, s: &ShadowPod, home: Option<&Pod>) -> bool {
        decide::orphaned(s, home)
    }

    /// A pod deleted at home without its grace (`--force`) never reaches
    /// [`Step::FinishDeletion`]: the token Secrets its ShadowPod mounts go with the ShadowPod
    /// (only those made for that very pod, by UID).
    async fn home_gone(&self, endpoint: &Endpoint, s: &ShadowPod) -> Result<(), String> {
        if self.placement != Placement::Twin {
            return Ok(());
        }
        let secrets = crate::tokens::secrets_mounted(&s.spec.pod.spec);
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let twin = crate::tokens::edge::twin(&endpoint.client, &ns, &endpoint.marks);
        crate::tokens::edge::remove_named(&twin, &s.spec.home.uid, &secrets)
            .await
            .map_err(|e| {
                format!(
                    "removing the token Secrets of ShadowPod {ns}/{}: {e}",
                    s.spec.home.name
                )
            })
    }

    /// A ShadowPod made by a virtual kubelet of before the reflection marks: it names this
    /// cluster as its consumer (label and spec) and carries no reflector's marks. Only this
    /// cluster's identity can have made it: the provider's webhook admits into the tenant
    /// namespace only ShadowPods whose `clusterId` is the tenant's.
    fn adopts(&self, s: &ShadowPod, marks: &Marks) -> bool {
        if self.placement == Placement::Twin {
            return false;
        }
        let labels = s.metadata.labels.as_ref();
        s.spec.cluster_id == marks.origin()
            && labels.and_then(|l| l.get(label::REMOTE_CLUSTER)) == Some(&s.spec.cluster_id)
            && !labels.is_some_and(|l| l.contains_key(label::REFLECTED_FROM))
    }

    fn decide(&self, view: &View<'_, Self>) -> Step {
        if self.placement == Placement::Tenant {
            let route = self.twins.borrow().route(&view.key.namespace);
            if let Some(step) = tenant_route(route, view.home, view.remote) {
                return step;
            }
        }
        let step = decide::decide(view.home, remote(view.remote), view.reachable);
        if step == Step::Create {
            let waits = self
                .ready
                .borrow()
                .as_ref()
                .and_then(|r| r.offload_waits.clone());
            if let Some(why) = waits {
                return Step::AwaitHeartbeat(why);
            }
        }
        if step == Step::Create && self.home_api_for(view.home).is_none() {
            return Step::AwaitHomeApi(format!(
                "Service {} in the twin namespace on the provider has no cluster IP yet: the pod starts once it has one (its way to this cluster's API server)",
                home_api::SERVICE
            ));
        }
        // An adopted ShadowPod gets our marks with a metadata write once nothing else is due.
        match (&step, view.remote, view.marks) {
            (Step::Report, Remote::Ours(s), Some(m))
                if view.reachable
                    && s.metadata.deletion_timestamp.is_none()
                    && !m.on(&s.metadata) =>
            {
                Step::UpdateMetadata
            }
            _ => step,
        }
    }

    async fn act(&self, cx: &Cx<'_, Self>, step: Step) -> anyhow::Result<Next> {
        act::act(self, cx, step).await
    }
}

/// What the tenant reflection does about a pod of a namespace routed `route`, before its
/// usual decision (`None`: that decision). A pod whose ShadowPod is in the tenant namespace
/// is its own whatever its namespace became; the others of an offloaded namespace are the
/// twin's, or wait for one; nothing is decided before it is known.
fn tenant_route(route: Route, pod: &Pod, remote: Remote<'_, ShadowPod>) -> Option<Step> {
    if matches!(remote, Remote::Ours(s) if decide::owns(s, pod)) {
        return None;
    }
    match route {
        Route::Tenant => None,
        Route::Unknown | Route::Twin => Some(Step::Skip),
        // Being deleted or finished: decided as any pod whose ShadowPod is not here.
        Route::NoTwin(_) if pod.metadata.deletion_timestamp.is_some() || decide::terminal(pod) => {
            None
        }
        // Ran in a twin now gone: it failed. Not placed yet: it waits, saying why.
        Route::NoTwin(why) if decide::offloaded(pod) => Some(Step::Aborted(why)),
        Route::NoTwin(why) => Some(Step::AwaitTwin(why)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pods::decide::tests::{pod, shadow};

    fn pods() -> Pods {
        Pods {
            placement: Placement::Tenant,
            twins: watch::channel(Twins {
                offloaded: Some(Default::default()),
                mapped: None,
            })
            .1,
            node_name: "fabric-b".into(),
            node_ip: "10.0.0.9".into(),
            ready: watch::channel(None).1,
            remap: watch::channel(Err(Untranslatable::NoRemap)).1,
            home_api: None,
            made: Made::default(),
        }
    }

    #[test]
    fn a_pod_of_a_twin_waits_for_the_home_api_servers_service_unless_it_opted_out() {
        let (tx, rx) = watch::channel(HomeApis::new());
        let p = Pods {
            placement: Placement::Twin,
            home_api: Some(rx),
            ..pods()
        };
        let web = pod();
        assert_eq!(p.home_api_for(&web), None, "no cluster IP yet: waits");
        let at = HomeApi {
            cluster_ip: "10.96.0.9".into(),
        };
        tx.send_replace(HomeApis::from([("shop".to_owned(), at.clone())]));
        assert_eq!(p.home_api_for(&web), Some(Some(at)));
        let mut out = pod();
        out.metadata.annotations = Some(
            [(
                service_account_token::OPT_OUT.to_owned(),
                service_account_token::NEVER.to_owned(),
            )]
            .into(),
        );
        assert_eq!(p.home_api_for(&out), Some(None));
        tx.send_replace(HomeApis::new());
        assert_eq!(p.home_api_for(&out), Some(None), "opted out: never waits");
        // Not configured, or the tenant placement: nothing, no wait.
        let none = Pods {
            placement: Placement::Twin,
            ..pods()
        };
        assert_eq!(none.home_api_for(&web), Some(None));
        let tenant = Pods {
            home_api: p.home_api.clone(),
            ..pods()
        };
        assert_eq!(tenant.home_api_for(&web), Some(None));
    }

    #[test]
    fn a_shadow_pod_is_keyed_by_its_home_pod_and_named_after_it() {
        let (p, s) = (pods(), shadow("u-1"));
        let key = p.key_of(&Pair::everywhere_to_tenant(), &s).unwrap();
        assert_eq!(key, Key::new("shop", "web"));
        assert_eq!(p.remote_name(&key), "shop.web");
        assert_eq!(
            p.watch_home().field_selector.as_deref(),
            Some("spec.nodeName=fabric-b")
        );
    }

    #[test]
    fn in_a_twin_a_shadow_pod_is_named_as_its_pod_and_only_its_namespace_s_count() {
        let p = Pods {
            placement: Placement::Twin,
            ..pods()
        };
        let pair = Pair::namespaces("shop", "shop-a");
        let mut s = shadow("u-1");
        s.metadata.name = Some("web".into());
        let key = p.key_of(&pair, &s).unwrap();
        assert_eq!(key, Key::new("shop", "web"));
        assert_eq!(p.remote_name(&key), "web");
        // Another namespace's, or one not named as its pod: stands for nothing here.
        assert_eq!(p.key_of(&Pair::namespaces("db", "shop-a"), &s), None);
        s.metadata.name = Some("shop.web".into());
        assert_eq!(p.key_of(&pair, &s), None);
        assert!(!p.adopts(&shadow("u-1"), &Marks::new("a", "b")));
    }

    #[test]
    fn the_tenant_reflection_leaves_offloaded_namespaces_to_their_twins() {
        let (home, s) = (pod(), shadow("u-1"));
        let mine = Remote::Ours(&s);
        // Offloaded pod by pod before its namespace was: still the tenant reflection's.
        assert_eq!(tenant_route(Route::Twin, &home, mine), None);
        assert_eq!(tenant_route(Route::Unknown, &home, mine), None);
        // Otherwise the twin's, or nothing before it is known.
        assert_eq!(
            tenant_route(Route::Twin, &home, Remote::Absent),
            Some(Step::Skip)
        );
        assert_eq!(
            tenant_route(Route::Unknown, &home, Remote::Absent),
            Some(Step::Skip)
        );
        assert_eq!(tenant_route(Route::Tenant, &home, Remote::Absent), None);
        // No twin: a pod never offloaded waits; one that ran in a twin now gone failed; one
        // being deleted is decided as usual.
        assert_eq!(
            tenant_route(Route::NoTwin("why".into()), &home, Remote::Absent),
            Some(Step::AwaitTwin("why".into()))
        );
        let mut ran = home.clone();
        ran.status.get_or_insert_default().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: crate::pods::status::OFFLOADED.into(),
                status: "True".into(),
                reason: Some("Created".into()),
                ..Default::default()
            }]);
        assert_eq!(
            tenant_route(Route::NoTwin("why".into()), &ran, Remote::Absent),
            Some(Step::Aborted("why".into()))
        );
        let mut going = home.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(
            tenant_route(Route::NoTwin("why".into()), &going, Remote::Absent),
            None
        );
    }

    #[test]
    fn a_shadow_pod_someone_else_made_is_concluded_from_as_little_as_an_unlisted_one() {
        let s = shadow("u-1");
        assert!(matches!(
            remote(Remote::Foreign(&s)),
            decide::Remote::Unknown
        ));
        assert!(matches!(remote(Remote::Unknown), decide::Remote::Unknown));
        assert!(matches!(remote(Remote::Absent), decide::Remote::Absent));
        assert!(matches!(
            remote(Remote::Ours(&s)),
            decide::Remote::Present(_)
        ));
    }

    #[test]
    fn a_shadow_pod_of_before_the_marks_is_adopted_and_then_marked() {
        let p = pods();
        let marks = Marks::new("a", "b");
        let legacy = shadow("u-1");
        assert!(
            p.adopts(&legacy, &marks),
            "made by this cluster before the marks"
        );
        // Another cluster's, or one that carries some reflector's marks: not adopted.
        assert!(!p.adopts(&legacy, &Marks::new("c", "b")));
        let mut marked_by_another = legacy.clone();
        Marks::new("c", "b").stamp(marked_by_another.metadata.labels.as_mut().unwrap());
        assert!(!p.adopts(&marked_by_another, &marks));
        let mut unlabelled = legacy.clone();
        unlabelled.metadata.labels = None;
        assert!(!p.adopts(&unlabelled, &marks));

        // In step with its home pod, it gets our marks; once marked, nothing more is due.
        let (key, pair, home) = (
            Key::new("shop", "web"),
            Pair::everywhere_to_tenant(),
            Arc::new(pod()),
        );
        let view = |remote, reachable| View {
            key: &key,
            pair: &pair,
            home: &home,
            remote,
            reachable,
            marks: Some(&marks),
        };
        assert_eq!(
            p.decide(&view(Remote::Ours(&legacy), true)),
            Step::UpdateMetadata
        );
        assert_eq!(p.decide(&view(Remote::Ours(&legacy), false)), Step::Report);
        let mut marked = legacy.clone();
        marks.stamp(marked.metadata.labels.as_mut().unwrap());
        assert_eq!(p.decide(&view(Remote::Ours(&marked), true)), Step::Report);
    }
}
