//! When the VirtualNode controller applies a virtual kubelet's objects again. Node events
//! (every status write of the virtual kubelet) wake the controller up to report the Node; the
//! ServiceAccount, RBAC and Deployment are only written again when what would be written
//! differs from what was last applied, when the Deployment is gone or was changed by someone
//! else (its generation moved), and every [`REFRESH`] (which repairs RBAC removed by hand).
use std::{
    hash::{DefaultHasher, Hash, Hasher},
    time::{Duration, Instant},
};

use serde::Serialize;

/// How long a successful apply is trusted before everything is applied again.
pub const REFRESH: Duration = Duration::from_secs(300);

/// The Deployment as the API server has it: its uid and generation.
pub type DeploymentVersion = (String, i64);

/// The last successful apply for one VirtualNode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub fingerprint: u64,
    /// The Deployment as the apply left it.
    pub deployment: DeploymentVersion,
    pub at: Instant,
}

/// A digest of the objects to apply (their serialized form; within one process only).
pub fn fingerprint<T: Serialize>(objects: &T) -> u64 {
    let mut h = DefaultHasher::new();
    serde_json::to_string(objects)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// Whether the objects must be applied: nothing applied yet, other objects, the Deployment
/// gone or not as left, or the last apply older than [`REFRESH`].
pub fn needs_apply(
    last: Option<&Applied>,
    fingerprint: u64,
    deployment: Option<&DeploymentVersion>,
    now: Instant,
) -> bool {
    let Some(last) = last else { return true };
    last.fingerprint != fingerprint
        || deployment != Some(&last.deployment)
        || now.duration_since(last.at) >= REFRESH
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_differs_is_applied_again() {
        let t0 = Instant::now();
        let fp = fingerprint(&("sa", 1));
        let dep: DeploymentVersion = ("u-1".into(), 2);
        assert!(needs_apply(None, fp, Some(&dep), t0));
        let last = Applied {
            fingerprint: fp,
            deployment: dep.clone(),
            at: t0,
        };
        // A Node status event: the same objects, the Deployment as left.
        assert!(!needs_apply(
            Some(&last),
            fp,
            Some(&dep),
            t0 + Duration::from_secs(5)
        ));
        // A new grant or image: other objects.
        assert!(needs_apply(
            Some(&last),
            fingerprint(&("sa", 2)),
            Some(&dep),
            t0
        ));
        // The Deployment deleted, re-created by someone else, or its spec edited.
        assert!(needs_apply(Some(&last), fp, None, t0));
        assert!(needs_apply(Some(&last), fp, Some(&("u-2".into(), 2)), t0));
        assert!(needs_apply(Some(&last), fp, Some(&("u-1".into(), 3)), t0));
        // Now and then everything again (RBAC removed by hand is not watched).
        assert!(needs_apply(Some(&last), fp, Some(&dep), t0 + REFRESH));
    }
}
