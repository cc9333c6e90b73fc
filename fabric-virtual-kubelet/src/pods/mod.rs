//! Pods bound to the virtual node run on the provider (issue 11, consumer side).
//!
//! Each pod the home scheduler binds to this node becomes a `ShadowPod` in the consumer's
//! tenant namespace on the provider, created once with this cluster's identity under a
//! deterministic name ([`fabric_offloading::shadowpod::forge::name`]); the provider's ShadowPod
//! controller runs the real pod and copies its status into the ShadowPod, from where it comes
//! home through `pods/status`, the pod IP translated into this cluster's view of the
//! provider's pod CIDR.
//!
//! - [`decide`]: what to do about one pod (create, update labels, delete, finish a deletion,
//!   report a vanished pod, wait), pure;
//! - [`bounds`]: what the provider wrote in a ShadowPod's status, bounded in size, pure;
//! - [`status`]: the home pod's status (phase, conditions, containers, addresses, the
//!   `offloading.fabric.io/Offloaded` condition), pure;
//! - [`translate`]: provider pod IPs through the remapped pod CIDR, pure;
//! - [`failures`]: remote container failures (image pulls, crash loops) as home Events, pure;
//! - [`kind`]: the pod kind of the reflection framework (`fabric-reflector`): which ShadowPod
//!   stands for which home pod, and when one is an orphan;
//! - [`act`]: its writes: the ShadowPod created, updated, resized or deleted, the home
//!   status and Events; in a twin, the pod's service-account tokens first
//!   ([`crate::tokens`]), refreshed when due, removed with it;
//! - [`run`]: its registration (the pods bound to the node, 32 at a time, into the tenant
//!   namespace), resynced when the node's readiness or the peer's Configuration changes.
//!
//! The framework's edge does the rest: the watches (home pods by `spec.nodeName`, the
//! provider's ShadowPods through the identity), the work queue and retries, the periodic
//! resync and the collection of ShadowPods whose pod is gone. ShadowPods carry the
//! reflection's ownership marks; one without them is never changed or deleted.
//!
//! Failures: while the provider does not answer (the node is not Ready), offloaded pods are
//! marked not Ready at home and nothing is created or deleted; the provider keeps running
//! them. Nothing is decided from a cache that could be stale when it cannot be undone: a
//! vanished ShadowPod is confirmed by a fresh read before its pod is failed, and a restarted
//! process waits for the provider's listing before it creates anything.
pub mod act;
pub mod bounds;
pub mod decide;
pub mod failures;
pub mod kind;
pub mod made;
pub mod run;
pub mod status;
pub mod translate;
pub mod twins;
