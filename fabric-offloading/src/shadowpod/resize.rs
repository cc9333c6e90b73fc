//! In-place resize of an offloaded pod, as pure functions of the pod specs: the consumer's
//! virtual kubelet carries a change of the home pod's container resources into the
//! ShadowPod (where the provider's webhook charges what it adds against the grant), and the
//! provider's ShadowPod controller carries it into the real pod (through the `resize`
//! subresource where the API server serves it, Kubernetes 1.33 on, else as a pod update).
//! Only the `resources` of the regular containers and the sidecars (init containers with
//! `restartPolicy: Always`) are carried: anything else in a pod's spec is fixed once the pod
//! exists.
use std::collections::BTreeMap;

use fabric_api::{quantity::milli, requests::sidecar};
use fabric_kube::status::{condition, with_condition};
use k8s_openapi::{
    api::core::v1::{Container, PodSpec, ResourceRequirements},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Condition},
    jiff::Timestamp,
};
use serde_json::{Value, json};

/// The condition a home pod carries while a resize is not carried out, as a kubelet sets it
/// (Kubernetes 1.33 on): reason [`INFEASIBLE`] when the provider refused it.
pub const RESIZE_PENDING: &str = "PodResizePending";
pub const INFEASIBLE: &str = "Infeasible";
/// The reason of [`RESIZE_PENDING`] when the resize may go through later (as a kubelet says
/// when the node lacks room for now).
pub const DEFERRED: &str = "Deferred";

/// How the provider's API server refusing the real pod's resize (HTTP `code`) shows: Deferred
/// when the same request may pass later (a quota, a conflict, throttling), Infeasible when it
/// cannot as asked (invalid, or beyond what the provider allows).
pub fn refusal_reason(code: u16) -> &'static str {
    match code {
        403 | 409 | 429 => DEFERRED,
        _ => INFEASIBLE,
    }
}

/// The ShadowPod's conditions with [`RESIZE_PENDING`] set to the provider's refusal of the
/// real pod's resize (reason, message), or gone when nothing is refused.
pub fn pending(
    conditions: &[Condition],
    refusal: Option<(&str, String)>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    match refusal {
        Some((reason, message)) => with_condition(
            conditions,
            condition(RESIZE_PENDING, true, reason, message, generation, now),
        ),
        None => conditions
            .iter()
            .filter(|c| c.type_ != RESIZE_PENDING)
            .cloned()
            .collect(),
    }
}

fn same_quantities(
    a: Option<&BTreeMap<String, Quantity>>,
    b: Option<&BTreeMap<String, Quantity>>,
) -> bool {
    let empty = BTreeMap::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    a.len() == b.len()
        && a.iter().all(|(k, q)| {
            b.get(k).is_some_and(|r| match (milli(&q.0), milli(&r.0)) {
                (Ok(x), Ok(y)) => x == y,
                _ => q == r,
            })
        })
}

/// Whether two containers ask for the same resources (`500m` and `0.5` alike).
pub fn same_resources(a: Option<&ResourceRequirements>, b: Option<&ResourceRequirements>) -> bool {
    same_quantities(
        a.and_then(|r| r.requests.as_ref()),
        b.and_then(|r| r.requests.as_ref()),
    ) && same_quantities(
        a.and_then(|r| r.limits.as_ref()),
        b.and_then(|r| r.limits.as_ref()),
    )
}

/// Containers whose resources change, by name, with the resources they get.
type Changed<'a> = Vec<(&'a str, Option<&'a ResourceRequirements>)>;

/// Of `want` and `have` (a list of containers each), the containers whose resources differ,
/// by name, with `want`'s resources.
fn changed_in<'a>(want: &[&'a Container], have: &[&'a Container]) -> Changed<'a> {
    want.iter()
        .filter_map(|w| {
            let h = have.iter().find(|h| h.name == w.name)?;
            (!same_resources(w.resources.as_ref(), h.resources.as_ref()))
                .then_some((w.name.as_str(), w.resources.as_ref()))
        })
        .collect()
}

/// The regular containers and the sidecars whose resources differ between `want` and
/// `have`; `None` when none does.
fn changes<'a>(want: &'a PodSpec, have: &'a PodSpec) -> Option<(Changed<'a>, Changed<'a>)> {
    let regular = |s: &'a PodSpec| s.containers.iter().collect::<Vec<_>>();
    let sidecars = |s: &'a PodSpec| {
        s.init_containers
            .iter()
            .flatten()
            .filter(|c| sidecar(c))
            .collect::<Vec<_>>()
    };
    let r = changed_in(&regular(want), &regular(have));
    let side = changed_in(&sidecars(want), &sidecars(have));
    (!r.is_empty() || !side.is_empty()).then_some((r, side))
}

/// `list` with the resources of `changed`.
fn with_resources(
    list: &[Container],
    changed: &[(&str, Option<&ResourceRequirements>)],
) -> Vec<Container> {
    list.iter()
        .map(|c| match changed.iter().find(|(n, _)| *n == c.name) {
            Some((_, r)) => Container {
                resources: r.cloned(),
                ..c.clone()
            },
            None => c.clone(),
        })
        .collect()
}

/// What the virtual kubelet writes into the ShadowPod's pod spec for a resize: whole
/// lists (a merge patch replaces lists), the init containers only when a sidecar changed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resized {
    pub containers: Vec<Container>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<Container>>,
}

/// `have`'s containers (and init containers) with the resources `want` gives its regular
/// containers and sidecars, if any changed: what the virtual kubelet writes into the
/// ShadowPod's spec. Other init containers have run by then: they are left as they are.
pub fn resized(want: &PodSpec, have: &PodSpec) -> Option<Resized> {
    let (regular, side) = changes(want, have)?;
    Some(Resized {
        containers: with_resources(&have.containers, &regular),
        init_containers: (!side.is_empty())
            .then(|| with_resources(have.init_containers.as_deref().unwrap_or_default(), &side)),
    })
}

/// The first field of `new` that differs from `old` beyond what [`patch`] carries to a
/// running pod (the resources of its regular containers and sidecars), as its path under
/// the pod's spec (`containers[0].name`, `initContainers`): a change the provider cannot
/// make to the pod that runs.
pub fn not_carried(new: &PodSpec, old: &PodSpec) -> Option<String> {
    let mut back = new.clone();
    if let Some(r) = resized(old, new) {
        back.containers = r.containers;
        if r.init_containers.is_some() {
            back.init_containers = r.init_containers;
        }
    }
    if back == *old {
        return None;
    }
    let (Ok(Value::Object(a)), Ok(Value::Object(b))) =
        (serde_json::to_value(&back), serde_json::to_value(old))
    else {
        return Some(String::new());
    };
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let key = keys.into_iter().find(|k| a.get(*k) != b.get(*k))?;
    // Within a list of containers, the first one that differs and how.
    if let (Some(Value::Array(x)), Some(Value::Array(y))) = (a.get(key), b.get(key))
        && let Some(i) = (0..x.len().max(y.len())).find(|i| x.get(*i) != y.get(*i))
    {
        if let (Some(Value::Object(c)), Some(Value::Object(d))) = (x.get(i), y.get(i)) {
            let fields: std::collections::BTreeSet<&String> = c.keys().chain(d.keys()).collect();
            if let Some(f) = fields.into_iter().find(|f| c.get(*f) != d.get(*f)) {
                return Some(format!("{key}[{i}].{f}"));
            }
        }
        return Some(format!("{key}[{i}]"));
    }
    Some(key.clone())
}

/// The strategic merge patch (containers merged by name) that brings a pod running `have`
/// to `want`'s container and sidecar resources, if any differ: for the `resize`
/// subresource, or the pod itself where that is not served.
pub fn patch(want: &PodSpec, have: &PodSpec) -> Option<Value> {
    let (regular, side) = changes(want, have)?;
    let entries = |changed: Changed<'_>| -> Vec<Value> {
        changed
            .into_iter()
            .map(|(name, r)| json!({ "name": name, "resources": r.cloned().unwrap_or_default() }))
            .collect()
    };
    let mut spec = serde_json::Map::new();
    if !regular.is_empty() {
        spec.insert("containers".into(), Value::Array(entries(regular)));
    }
    if !side.is_empty() {
        spec.insert("initContainers".into(), Value::Array(entries(side)));
    }
    Some(json!({ "spec": spec }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(main_cpu: &str, side_cpu: &str) -> PodSpec {
        serde_json::from_value(json!({"containers": [
            {"name": "main", "image": "echo", "command": ["x"],
             "resources": {"requests": {"cpu": main_cpu}, "limits": {"memory": "1Gi"}}},
            {"name": "side", "image": "echo", "resources": {"requests": {"cpu": side_cpu}}},
        ]}))
        .unwrap()
    }

    fn cpu_request(c: &k8s_openapi::api::core::v1::Container) -> &Quantity {
        &c.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"]
    }

    #[test]
    fn nothing_to_do_when_the_sizes_agree_however_written() {
        assert_eq!(resized(&spec("500m", "1"), &spec("0.5", "1000m")), None);
        assert_eq!(patch(&spec("500m", "1"), &spec("500m", "1")), None);
    }

    #[test]
    fn a_changed_container_gets_the_new_resources_and_keeps_the_rest() {
        let have = spec("500m", "1");
        let want = spec("800m", "1");
        let out = resized(&want, &have).unwrap();
        assert_eq!(out.init_containers, None);
        let out = out.containers;
        assert_eq!(out.len(), 2);
        assert_eq!(cpu_request(&out[0]), &Quantity("800m".into()));
        assert_eq!(out[0].command, Some(vec!["x".to_owned()]));
        assert_eq!(out[1], have.containers[1]);
        assert_eq!(
            patch(&want, &have).unwrap(),
            json!({"spec": {"containers": [{"name": "main",
                "resources": {"requests": {"cpu": "800m"}, "limits": {"memory": "1Gi"}}}]}})
        );
    }

    #[test]
    fn containers_only_on_one_side_are_left_alone() {
        let mut want = spec("800m", "1");
        want.containers[0].name = "other".into();
        assert_eq!(resized(&want, &spec("500m", "1")), None);
    }

    #[test]
    fn a_refused_resize_is_pending_on_the_shadowpod_until_it_is_not() {
        assert_eq!(refusal_reason(422), INFEASIBLE);
        assert_eq!(refusal_reason(400), INFEASIBLE);
        assert_eq!(refusal_reason(403), DEFERRED);
        assert_eq!(refusal_reason(409), DEFERRED);
        let now = Timestamp::UNIX_EPOCH;
        let created = condition("PodCreated", true, "Created", "x".into(), Some(1), now);
        let conds = pending(
            std::slice::from_ref(&created),
            Some((INFEASIBLE, "cpu: too much".into())),
            Some(2),
            now,
        );
        assert_eq!(conds.len(), 2);
        let p = conds.iter().find(|c| c.type_ == RESIZE_PENDING).unwrap();
        assert_eq!(
            (p.status.as_str(), p.reason.as_str(), p.message.as_str()),
            ("True", INFEASIBLE, "cpu: too much")
        );
        let again = pending(&conds, Some((DEFERRED, "quota".into())), Some(2), now);
        assert_eq!(again.len(), 2);
        assert!(again.iter().any(|c| c.reason == DEFERRED));
        assert_eq!(pending(&again, None, Some(3), now), vec![created]);
    }

    #[test]
    fn a_sidecar_is_resized_and_a_plain_init_container_is_not() {
        let with_init = |side: &str, init: &str| {
            let mut s = spec("500m", "1");
            s.init_containers = Some(
                serde_json::from_value(json!([
                    {"name": "setup", "image": "x", "resources": {"requests": {"cpu": init}}},
                    {"name": "proxy", "image": "x", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": side}}},
                ]))
                .unwrap(),
            );
            s
        };
        let have = with_init("100m", "1");
        // A plain init container has run: nothing to carry.
        assert_eq!(resized(&with_init("100m", "2"), &have), None);
        assert_eq!(patch(&with_init("100m", "2"), &have), None);
        let want = with_init("200m", "1");
        let out = resized(&want, &have).unwrap();
        assert_eq!(out.containers, have.containers);
        let init = out.init_containers.unwrap();
        assert_eq!(init[0], have.init_containers.as_ref().unwrap()[0]);
        assert_eq!(cpu_request(&init[1]), &Quantity("200m".into()));
        assert_eq!(
            patch(&want, &have).unwrap(),
            json!({"spec": {"initContainers": [{"name": "proxy",
                "resources": {"requests": {"cpu": "200m"}}}]}})
        );
        // Written into the ShadowPod as whole lists, the init containers only when needed.
        let v =
            serde_json::to_value(resized(&spec("800m", "1"), &spec("500m", "1")).unwrap()).unwrap();
        assert!(v.get("initContainers").is_none(), "{v}");
    }
}
