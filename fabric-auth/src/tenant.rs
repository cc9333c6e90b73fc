//! A consumer's area on its provider: the tenant namespace and what the consumer's identity
//! may do there. Pure: the authentication service creates these objects, tests check them.
//!
//! The consumer's certificate names user [`names::user::consumer`] in groups
//! [`names::user::CONSUMERS_GROUP`] and [`names::user::peering`] (this peering's); the only
//! permissions it gets are the Role below, bound to that peering's group in its own tenant
//! namespace. Nothing cluster-wide, no Secrets, no Nodes, no pods but the
//! logs and streams of those its ShadowPods run, no Lease but its heartbeat: removing the
//! RoleBinding (or the namespace) revokes everything.
use std::collections::BTreeMap;

use fabric_api::names::{self, label};
use k8s_openapi::api::{
    core::v1::Namespace,
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::api::ObjectMeta;

/// The Role (and RoleBinding) name in every tenant namespace.
pub const ROLE: &str = "fabric-consumer";

/// The ClusterRole (deploy/base/sharing.yaml) with what the provider's ShadowPod controller
/// does to pods: bound by [`sharing_binding`] in each tenant namespace only, because a
/// ClusterRoleBinding would let it create pods in every namespace of the cluster.
pub const SHARING_ROLE: &str = "fabric-sharing-tenant";
/// The sharing controllers' ServiceAccount (in the fabric's namespace).
pub const SHARING_SERVICE_ACCOUNT: &str = "fabric-sharing";

fn labels(consumer: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (label::REMOTE_CLUSTER.to_owned(), consumer.to_owned()),
        (label::TENANT_NAMESPACE.to_owned(), "true".to_owned()),
    ])
}

/// Pod Security admission's labels on every tenant namespace: defense in depth where the
/// provider's API server enforces Pod Security Standards. `baseline`, the least the
/// provider's own policy (`fabric_offloading::shadowpod::policy`, which is stricter at each
/// level and is the guard) allows, so the label never refuses a pod the policy admits.
pub const POD_SECURITY_LABELS: [(&str, &str); 2] = [
    ("pod-security.kubernetes.io/enforce", "baseline"),
    ("pod-security.kubernetes.io/enforce-version", "latest"),
];

/// The tenant namespace of `consumer`.
pub fn namespace(consumer: &str) -> Namespace {
    let mut labels = labels(consumer);
    labels.extend(
        POD_SECURITY_LABELS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    Namespace {
        metadata: ObjectMeta {
            name: Some(names::namespace::tenant(consumer)),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}

const MANAGE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];
const READ: &[&str] = &["get", "list", "watch"];

/// What the consumer may do in its tenant namespace: write the spec of what crosses from it
/// (its network parameters, its resource requests, its ShadowPods) and read the provider's
/// answers (their status) and its own Tenant.
pub fn role(consumer: &str) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(ROLE.to_owned()),
            namespace: Some(names::namespace::tenant(consumer)),
            labels: Some(labels(consumer)),
            ..Default::default()
        },
        rules: Some(vec![
            rule(fabric_api::networking::GROUP, &["peeringnetworks"], MANAGE),
            rule(
                fabric_api::networking::GROUP,
                &["peeringnetworks/status"],
                READ,
            ),
            rule(
                fabric_api::authentication::GROUP,
                &["resourceslices"],
                MANAGE,
            ),
            rule(
                fabric_api::authentication::GROUP,
                &["resourceslices/status"],
                READ,
            ),
            rule(fabric_api::authentication::GROUP, &["tenants"], READ),
            // Leaving: deleting its own Tenant tells the provider to remove the tenant area.
            PolicyRule {
                resource_names: Some(vec![consumer.to_owned()]),
                ..rule(fabric_api::authentication::GROUP, &["tenants"], &["delete"])
            },
            // Its pods to run here; the provider's controller writes their status.
            rule(fabric_api::offloading::GROUP, &["shadowpods"], MANAGE),
            rule(fabric_api::offloading::GROUP, &["shadowpods/status"], READ),
            // The namespaces it offloads here (the provider makes their twins and answers).
            rule(fabric_api::offloading::GROUP, &["namespacemaps"], MANAGE),
            rule(
                fabric_api::offloading::GROUP,
                &["namespacemaps/status"],
                READ,
            ),
            // The virtual kubelet's `kubectl logs`, `exec`, `attach` and `port-forward` on
            // those pods. Not the pods themselves: they are made, changed and deleted through
            // ShadowPods only (the webhook counts them against the grant).
            rule("", &["pods/log"], &["get"]),
            rule(
                "",
                &["pods/exec", "pods/attach", "pods/portforward"],
                &["get", "create"],
            ),
            // Its heartbeat when it asked for at-most-once semantics: that one Lease, written
            // with server-side apply (a patch, authorized as a create of that name when it
            // makes it).
            PolicyRule {
                resource_names: Some(vec![names::lease::CONSUMER.to_owned()]),
                ..rule(
                    "coordination.k8s.io",
                    &["leases"],
                    &["get", "create", "patch"],
                )
            },
        ]),
    }
}

/// Binds [`role`] to the consumer's current peering (group [`names::user::peering`]) in its
/// tenant namespace.
pub fn role_binding(consumer: &str, peering: &str) -> RoleBinding {
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(ROLE.to_owned()),
            namespace: Some(names::namespace::tenant(consumer)),
            labels: Some(labels(consumer)),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: ROLE.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "Group".to_owned(),
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            name: peering.to_owned(),
            namespace: None,
        }]),
    }
}

/// Binds [`SHARING_ROLE`] to the sharing controllers' ServiceAccount (in
/// `fabric_namespace`) in `consumer`'s tenant namespace: the ShadowPod controller runs that
/// consumer's pods there and nowhere else. Goes with the namespace.
pub fn sharing_binding(consumer: &str, fabric_namespace: &str) -> RoleBinding {
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(SHARING_ROLE.to_owned()),
            namespace: Some(names::namespace::tenant(consumer)),
            labels: Some(labels(consumer)),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: SHARING_ROLE.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            api_group: None,
            name: SHARING_SERVICE_ACCOUNT.to_owned(),
            namespace: Some(fabric_namespace.to_owned()),
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_enforces_baseline_pod_security_where_the_api_server_does() {
        let labels = namespace("alpha").metadata.labels.unwrap();
        assert_eq!(labels["pod-security.kubernetes.io/enforce"], "baseline");
        assert_eq!(labels[label::REMOTE_CLUSTER], "alpha");
    }

    #[test]
    fn the_binding_names_only_the_consumer_in_its_namespace() {
        let b = role_binding("alpha", &names::user::peering("alpha", "n1"));
        assert_eq!(b.metadata.namespace.as_deref(), Some("fabric-tenant-alpha"));
        let subjects = b.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "Group");
        assert_eq!(subjects[0].name, "fabric.io:peering:alpha:n1");
        assert_eq!(b.role_ref.kind, "Role", "never a ClusterRole");
    }

    #[test]
    fn the_sharing_controllers_get_pods_in_the_tenant_namespace_only() {
        let b = sharing_binding("alpha", "fabric-system");
        assert_eq!(b.metadata.namespace.as_deref(), Some("fabric-tenant-alpha"));
        assert_eq!(b.role_ref.name, SHARING_ROLE);
        let subjects = b.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert_eq!(subjects[0].name, "fabric-sharing");
        assert_eq!(subjects[0].namespace.as_deref(), Some("fabric-system"));
    }

    #[test]
    fn the_role_grants_nothing_core_but_streams_and_no_wildcards() {
        let r = role("alpha");
        for rule in r.rules.unwrap() {
            let groups = rule.api_groups.unwrap();
            let resources = rule.resources.clone().unwrap();
            let heartbeat = groups == ["coordination.k8s.io"]
                && resources == ["leases"]
                && rule.resource_names.as_deref() == Some(&[names::lease::CONSUMER.to_owned()]);
            assert!(
                heartbeat
                    || groups.iter().all(|g| g.ends_with(".fabric.io"))
                    || (groups == [""]
                        && resources.iter().all(|r| {
                            ["pods/log", "pods/exec", "pods/attach", "pods/portforward"]
                                .contains(&r.as_str())
                        })),
                "{groups:?} {resources:?}"
            );
            assert!(!resources.iter().any(|r| r.contains('*') || r == "secrets"));
            assert!(
                !rule
                    .verbs
                    .iter()
                    .any(|v| v == "*" || v == "escalate" || v == "bind")
            );
        }
    }

    #[test]
    fn the_consumer_writes_shadowpods_but_only_reads_their_status() {
        let rules = role("alpha").rules.unwrap();
        let verbs = |resource: &str| -> Vec<String> {
            rules
                .iter()
                .filter(|r| {
                    r.api_groups.as_deref() == Some(&[fabric_api::offloading::GROUP.to_owned()])
                })
                .filter(|r| r.resources.as_ref().unwrap().iter().any(|x| x == resource))
                .flat_map(|r| r.verbs.clone())
                .collect()
        };
        assert!(verbs("shadowpods").contains(&"create".to_owned()));
        assert!(verbs("shadowpods").contains(&"delete".to_owned()));
        assert_eq!(verbs("shadowpods/status"), READ);
    }
}
