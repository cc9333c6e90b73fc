//! The pod kind of the reflection framework: home pods bound to this node (watched with the
//! field selector `spec.nodeName=<node>`) and the ShadowPods of the tenant namespace on the
//! provider, keyed by the home pod they were made for (`spec.home`), named
//! `<namespace>.<name>`. Its decisions are [`decide`]'s; its writes are [`super::act`]'s.
use fabric_api::{names::label, offloading::v1alpha1::ShadowPod};
use fabric_offloading::shadowpod::forge;
use fabric_reflector::{Cx, Key, Kind, Marks, Next, Pair, Remote, View};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::conditions::Readiness;

use super::{
    act,
    decide::{self, Step},
    translate::{Remap, Untranslatable},
};

/// The pods bound to one virtual node.
pub struct Pods {
    pub node_name: String,
    /// The node's address: every offloaded pod's hostIP.
    pub node_ip: String,
    /// Whether the node is Ready, and why not (for the pods' status).
    pub ready: watch::Receiver<Option<Readiness>>,
    /// The remap of the peer's pod CIDR, or why there is none, as of the peer's last
    /// Configuration ([`super::run::follow_remap`]).
    pub remap: watch::Receiver<Result<Remap, Untranslatable>>,
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
        forge::name(&key.namespace, &key.name)
    }

    fn key_of(&self, _: &Pair, s: &ShadowPod) -> Option<Key> {
        Some(Key::new(&s.spec.home.namespace, &s.spec.home.name))
    }

    fn orphaned(&self, s: &ShadowPod, home: Option<&Pod>) -> bool {
        decide::orphaned(s, home)
    }

    /// A ShadowPod made by a virtual kubelet of before the reflection marks: it names this
    /// cluster as its consumer (label and spec) and carries no reflector's marks. Only this
    /// cluster's identity can have made it: the provider's webhook admits into the tenant
    /// namespace only ShadowPods whose `clusterId` is the tenant's.
    fn adopts(&self, s: &ShadowPod, marks: &Marks) -> bool {
        let labels = s.metadata.labels.as_ref();
        s.spec.cluster_id == marks.origin()
            && labels.and_then(|l| l.get(label::REMOTE_CLUSTER)) == Some(&s.spec.cluster_id)
            && !labels.is_some_and(|l| l.contains_key(label::REFLECTED_FROM))
    }

    fn decide(&self, view: &View<'_, Self>) -> Step {
        let step = decide::decide(view.home, remote(view.remote), view.reachable);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pods::decide::tests::{pod, shadow};

    fn pods() -> Pods {
        Pods {
            node_name: "fabric-b".into(),
            node_ip: "10.0.0.9".into(),
            ready: watch::channel(None).1,
            remap: watch::channel(Err(Untranslatable::NoRemap)).1,
        }
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
