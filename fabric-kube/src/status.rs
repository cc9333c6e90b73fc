//! Writing what a controller owns: server-side apply of objects and of status subresources,
//! under one field manager per controller, and `Ready`-style conditions.
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};

/// The field manager a controller writes under: the API server records which fields each
/// one owns, and a controller's apply only touches (and, forced, takes over) its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldManager(pub &'static str);

impl FieldManager {
    fn params(&self) -> PatchParams {
        PatchParams::apply(self.0).force()
    }

    /// Server-side applies `obj` (named by its metadata) and returns the object as stored.
    pub async fn apply<K>(&self, api: &Api<K>, obj: &K) -> kube::Result<K>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    {
        let name = obj.meta().name.clone().unwrap_or_default();
        api.patch(&name, &self.params(), &Patch::Apply(obj)).await
    }

    /// Server-side applies `status` to the status subresource of object `name`.
    pub async fn apply_status<K>(
        &self,
        api: &Api<K>,
        name: &str,
        status: impl Serialize,
    ) -> kube::Result<()>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        api.patch_status(name, &self.params(), &Patch::Apply(&patch))
            .await?;
        Ok(())
    }

    /// As [`FieldManager::apply_status`], returning the object as written; with
    /// `resource_version`, refused with a 409 Conflict unless the object is still at that
    /// version (a status computed from a copy that may lag behind, e.g. a watch cache's, is
    /// only written over the version it was computed from).
    pub async fn apply_status_at<K>(
        &self,
        api: &Api<K>,
        name: &str,
        resource_version: Option<&str>,
        status: impl Serialize,
    ) -> kube::Result<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let mut patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        if let Some(rv) = resource_version {
            patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
        }
        api.patch_status(name, &self.params(), &Patch::Apply(&patch))
            .await
    }
}

/// A condition of type `type_` observed at `now`.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(now),
        observed_generation: generation,
    }
}

/// Puts `new` into `conditions` in place of the one of its type. As Kubernetes' own
/// `meta.SetStatusCondition`: the lastTransitionTime stays the old one while the status does
/// not change, so re-applying the same state writes the same object (no new resourceVersion,
/// no watch event, no reconcile loop).
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            *old = new;
        }
        None => conditions.push(new),
    }
}

/// `conditions` with `new` set in them (see [`set_condition`]).
pub fn with_condition(conditions: &[Condition], new: Condition) -> Vec<Condition> {
    let mut out = conditions.to_vec();
    set_condition(&mut out, new);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let t0 = at("2026-01-01T00:00:00Z");
        let t1 = at("2026-01-01T00:05:00Z");
        let mut c = vec![condition("Other", true, "X", "x".into(), None, t0)];
        set_condition(
            &mut c,
            condition("Ready", true, "Allocated", "a".into(), Some(1), t0),
        );
        assert_eq!(c.len(), 2);
        // Same status, new message and generation: the transition time stays.
        set_condition(
            &mut c,
            condition("Ready", true, "Allocated", "b".into(), Some(2), t1),
        );
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].last_transition_time, Time(t0));
        assert_eq!(
            (c[1].message.as_str(), c[1].observed_generation),
            ("b", Some(2))
        );
        // A new status: a transition.
        set_condition(
            &mut c,
            condition("Ready", false, "IPAMFailed", "full".into(), Some(2), t1),
        );
        assert_eq!(c[1].last_transition_time, Time(t1));
        assert_eq!(c[1].status, "False");
        assert_eq!(c[0].type_, "Other");
        let same = with_condition(
            &c,
            condition(
                "Ready",
                false,
                "IPAMFailed",
                "full".into(),
                Some(2),
                at("2027-01-01T00:00:00Z"),
            ),
        );
        assert_eq!(same, c);
    }
}
