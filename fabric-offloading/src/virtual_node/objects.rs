//! What the VirtualNode controller runs for one VirtualNode (pure): the virtual kubelet's
//! Deployment, its ServiceAccount and the least privilege it needs — its own Node (and its
//! status), its Lease in `kube-node-lease`, its VirtualNode, the identity Secret and the
//! tunnel's Connection, each by name; for its kubelet API, the API server's client CA
//! (ConfigMap kube-system/extension-apiserver-authentication, by name) and
//! SubjectAccessReviews. Nothing else: no other Node, no other Secret.
use std::collections::BTreeMap;

use fabric_api::{names, offloading::v1alpha1::VirtualNode};
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy},
        core::v1::{
            Capabilities, Container, EnvVar, EnvVarSource, ObjectFieldSelector, PodSecurityContext,
            PodSpec, PodTemplateSpec, ResourceRequirements, SeccompProfile, SecurityContext,
            ServiceAccount,
        },
        rbac::v1::{
            ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
        },
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::LabelSelector},
};
use kube::{Resource, ResourceExt, api::ObjectMeta};

/// The binary the Deployment runs (on the image's PATH).
pub const COMMAND: &str = "fabric-virtual-kubelet";
/// `app.kubernetes.io/name` of everything the controller creates for a VirtualNode.
pub const APP: &str = "fabric-virtual-kubelet";
pub const APP_LABEL: &str = "app.kubernetes.io/name";
/// On those objects: the VirtualNode they belong to (its name; its namespace is theirs, or
/// in the annotation below for cluster-scoped and other-namespace objects).
pub const VIRTUAL_NODE_LABEL: &str = "offloading.fabric.io/virtual-node";
pub const VIRTUAL_NODE_NAMESPACE_LABEL: &str = "offloading.fabric.io/virtual-node-namespace";
/// The port of the virtual kubelet's API (the Node's kubelet endpoint), as every kubelet's.
pub const KUBELET_PORT: u16 = 10250;
/// Where the API server publishes its client CA (`client-ca-file`), as kube-apiserver does:
/// the virtual kubelet lets in the client certificates it signed (the API server's own).
pub use fabric_kube::client_ca::{
    CONFIGMAP as CLIENT_CA_CONFIGMAP, NAMESPACE as CLIENT_CA_CONFIGMAP_NAMESPACE,
};

/// Where the controller's output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The virtual kubelet's image.
    pub image: String,
    /// Where the gateway operator reports Connections.
    pub fabric_namespace: String,
    /// The port of the virtual kubelets' API: [`KUBELET_PORT`] where each runs in a pod of
    /// its own; 0 where several share a host network (each takes a free port and publishes
    /// it in its Node).
    pub kubelet_port: u16,
    /// Where this cluster's API server listens on the cluster network (`IP:PORT`), passed to
    /// every virtual kubelet (`--home-api-address`): offloaded pods reach it there.
    pub home_api_address: Option<String>,
    /// The custom kinds every virtual kubelet reflects into its twins
    /// (`--reflect-custom-resource`); its rights on them at home are the admin's
    /// ClusterRole [`REFLECTION_ROLE`].
    pub reflect: Vec<fabric_api::reflection::CustomResource>,
    /// How every virtual kubelet watches its provider's API (unset: the virtual kubelet's
    /// own defaults).
    pub health: Health,
}

/// How a virtual kubelet tells that its provider's API is out of reach: it asks every
/// `probe_interval`, gives each probe `probe_timeout`, and keeps its Node Ready through failed
/// probes for `grace` after the last answer. Shorter notices a lost provider sooner (its pods
/// are rescheduled sooner); longer rides out a slow or flaky link. Unset: the virtual
/// kubelet's defaults (5 s, 5 s, 10 s).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    pub probe_interval: Option<std::time::Duration>,
    pub probe_timeout: Option<std::time::Duration>,
    pub grace: Option<std::time::Duration>,
}

impl Health {
    /// The virtual kubelet's flags for what is set, and only that: a controller started
    /// without them leaves the virtual kubelets' Deployments as they were.
    pub fn args(&self) -> Vec<String> {
        [
            ("--probe-interval", self.probe_interval),
            ("--probe-timeout", self.probe_timeout),
            ("--grace", self.grace),
        ]
        .into_iter()
        .filter_map(|(flag, d)| Some([flag.to_owned(), format!("{}ms", d?.as_millis())]))
        .flatten()
        .collect()
    }
}

/// The ClusterRole (deploy/base/rbac.yaml, shipped with no rules) holding what every virtual
/// kubelet may do with the custom kinds the admin has it reflect: read them, write their
/// status. Bound to each virtual kubelet by [`reflection_binding`].
pub const REFLECTION_ROLE: &str = "fabric-virtual-kubelet-reflection";

/// The binding of [`REFLECTION_ROLE`] to `vn`'s virtual kubelet.
pub fn reflection_binding(vn: &VirtualNode) -> ClusterRoleBinding {
    let mut metadata = meta(vn, None);
    // The ServiceAccount's name and a suffix (the admission policy
    // fabric-virtual-nodes-rbac checks it so); a ClusterRoleBinding's name is not bounded
    // to 63 characters as the ServiceAccount's is.
    metadata.name = Some(format!("{}-reflection", name(vn)));
    ClusterRoleBinding {
        metadata,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: REFLECTION_ROLE.to_owned(),
        },
        subjects: Some(vec![subject(vn)]),
    }
}

/// The name of every object of a VirtualNode's virtual kubelet: derived from its Node's
/// name, which is unique in the cluster (so cluster-scoped names cannot collide either).
pub fn name(vn: &VirtualNode) -> String {
    names::namespace::bounded(&format!("fabric-vk-{}", vn.spec.node_name))
}

fn labels(vn: &VirtualNode) -> BTreeMap<String, String> {
    BTreeMap::from([
        (APP_LABEL.to_owned(), APP.to_owned()),
        (VIRTUAL_NODE_LABEL.to_owned(), vn.name_any()),
        (
            VIRTUAL_NODE_NAMESPACE_LABEL.to_owned(),
            vn.namespace().unwrap_or_default(),
        ),
        (
            names::label::REMOTE_CLUSTER.to_owned(),
            vn.spec.cluster_id.clone(),
        ),
    ])
}

fn meta(vn: &VirtualNode, namespace: Option<&str>) -> ObjectMeta {
    // Namespaced objects beside the VirtualNode are owned by it (garbage-collected with
    // it); the finalizer deletes the rest, and these too where no collector runs.
    let owned = namespace.is_some() && namespace == vn.namespace().as_deref();
    ObjectMeta {
        name: Some(name(vn)),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels(vn)),
        owner_references: if owned {
            vn.controller_owner_ref(&()).map(|o| vec![o])
        } else {
            None
        },
        ..Default::default()
    }
}

fn rule(group: &str, resources: &[&str], names: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(strings(resources)),
        resource_names: (!names.is_empty()).then(|| strings(names)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

const READ: &[&str] = &["get", "list", "watch"];

pub fn service_account(vn: &VirtualNode) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(vn, vn.namespace().as_deref()),
        ..Default::default()
    }
}

/// The pods of every namespace, as any kubelet has them (RBAC cannot limit a grant to the
/// pods bound to one node; upstream's Node authorizer does, which is not RBAC): read them
/// (watched with a `spec.nodeName` field selector), write their status, and complete their
/// graceful deletion; Events about them.
pub const POD_RULES: &[(&str, &[&str], &[&str])] = &[
    ("", &["pods"], &["get", "list", "watch", "delete"]),
    ("", &["pods/status"], &["get", "patch", "update"]),
    ("events.k8s.io", &["events"], &["create", "patch"]),
    ("", &["events"], &["create", "patch"]),
];

/// The placeholder PersistentVolumes of the claims it provisions on the provider
/// (`fabric_virtual_kubelet::storage`): made, read back and deleted by name, never listed.
/// RBAC cannot narrow them to its own; the admission policy `fabric-virtual-kubelet-volumes`
/// does (the virtual class, our provisioner, pinned to its own node).
pub const VOLUME_RULES: &[(&str, &[&str], &[&str])] =
    &[("", &["persistentvolumes"], &["get", "create", "delete"])];

/// Its Node, by name. `create` cannot be limited to a name (the object has none yet when
/// RBAC decides), so it is granted alone, as every kubelet has it; so are TokenReviews and
/// SubjectAccessReviews (who calls its kubelet API, and whether they may). Pods:
/// [`POD_RULES`].
pub fn cluster_role(vn: &VirtualNode) -> ClusterRole {
    let node = vn.spec.node_name.as_str();
    ClusterRole {
        metadata: meta(vn, None),
        rules: Some(
            vec![
                rule("", &["nodes"], &[], &["create"]),
                rule(
                    "",
                    &["nodes"],
                    &[node],
                    &["get", "list", "watch", "patch", "update"],
                ),
                rule("", &["nodes/status"], &[node], &["get", "patch", "update"]),
                rule("authentication.k8s.io", &["tokenreviews"], &[], &["create"]),
                rule(
                    "authorization.k8s.io",
                    &["subjectaccessreviews"],
                    &[],
                    &["create"],
                ),
                // Which namespaces are offloaded: their pods go to twin namespaces.
                rule(
                    fabric_api::offloading::GROUP,
                    &["namespaceoffloadings"],
                    &[],
                    &["get", "list", "watch"],
                ),
                // The namespaces' labels: what NetworkPolicies' namespaceSelectors select.
                rule("", &["namespaces"], &[], &["get", "list", "watch"]),
            ]
            .into_iter()
            .chain(VOLUME_RULES.iter().map(|(g, r, v)| rule(g, r, &[], v)))
            .chain(POD_RULES.iter().map(|(g, r, v)| rule(g, r, &[], v)))
            .collect(),
        ),
        ..Default::default()
    }
}

fn subject(vn: &VirtualNode) -> Subject {
    Subject {
        kind: "ServiceAccount".to_owned(),
        name: name(vn),
        namespace: vn.namespace(),
        api_group: None,
    }
}

pub fn cluster_role_binding(vn: &VirtualNode) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(vn, None),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: name(vn),
        },
        subjects: Some(vec![subject(vn)]),
    }
}

/// The namespaced permissions, by namespace: its VirtualNode (the VirtualNode's namespace)
/// and identity Secret ([`names::namespace::IDENTITIES`]), both watched with a
/// `metadata.name` field selector, which RBAC checks against the names; its Lease, the
/// tunnel's Connection, and the API server's client CA.
fn namespaced_rules(vn: &VirtualNode, s: &Settings) -> BTreeMap<String, Vec<PolicyRule>> {
    let vn_name = vn.name_any();
    let secret = names::secret::identity(&vn.spec.cluster_id);
    let mut rules: BTreeMap<String, Vec<PolicyRule>> = BTreeMap::new();
    let ns = vn.namespace().unwrap_or_default();
    rules.entry(ns.clone()).or_default().push(rule(
        fabric_api::offloading::GROUP,
        &["virtualnodes"],
        &[&vn_name],
        READ,
    ));
    rules
        .entry(names::namespace::IDENTITIES.to_owned())
        .or_default()
        .push(rule("", &["secrets"], &[&secret], READ));
    // The tunnel's Connection, and the Configuration whose remapped pod CIDR translates
    // the offloaded pods' addresses.
    rules
        .entry(s.fabric_namespace.clone())
        .or_default()
        .push(rule(
            fabric_api::networking::GROUP,
            &["connections", "configurations"],
            &[&vn.spec.cluster_id],
            READ,
        ));
    let ips = rules.entry(s.fabric_namespace.clone()).or_default();
    if s.home_api_address.is_some() {
        // The IP exposing the home API server to peers, which it makes and reads.
        ips.push(rule(
            fabric_api::networking::GROUP,
            &["ips"],
            &[],
            &["create"],
        ));
        ips.push(rule(
            fabric_api::networking::GROUP,
            &["ips"],
            &[names::home_api::SERVICE],
            &["get", "list", "watch", "patch"],
        ));
    } else {
        // ... or, without an address, withdraws what a run with one left.
        ips.push(rule(
            fabric_api::networking::GROUP,
            &["ips"],
            &[names::home_api::SERVICE],
            &["get", "delete"],
        ));
    }
    rules
        .entry(CLIENT_CA_CONFIGMAP_NAMESPACE.to_owned())
        .or_default()
        .push(rule("", &["configmaps"], &[CLIENT_CA_CONFIGMAP], &["get"]));
    rules
        .entry(LEASE_NAMESPACE.to_owned())
        .or_default()
        .extend([
            rule("coordination.k8s.io", &["leases"], &[], &["create"]),
            rule(
                "coordination.k8s.io",
                &["leases"],
                &[&vn.spec.node_name],
                &["get", "patch", "update"],
            ),
        ]);
    rules
}

/// Where node Leases live.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// A Role and its RoleBinding per namespace the virtual kubelet reads or writes in.
pub fn roles(vn: &VirtualNode, s: &Settings) -> Vec<(Role, RoleBinding)> {
    namespaced_rules(vn, s)
        .into_iter()
        .map(|(ns, rules)| {
            let role = Role {
                metadata: meta(vn, Some(&ns)),
                rules: Some(rules),
            };
            let binding = RoleBinding {
                metadata: meta(vn, Some(&ns)),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".to_owned()),
                    kind: "Role".to_owned(),
                    name: name(vn),
                },
                subjects: Some(vec![subject(vn)]),
            };
            (role, binding)
        })
        .collect()
}

/// The ClusterRole (deploy/base/rbac.yaml) with what a virtual kubelet reads in an offloaded
/// namespace (its ConfigMaps and Secrets, reflected into the twins): bound in each offloaded
/// namespace only ([`offloaded_binding`]), never cluster-wide.
pub const OFFLOADED_ROLE: &str = "fabric-offloaded-namespace";

/// Binds [`OFFLOADED_ROLE`] to the virtual kubelet of `vn` in offloaded namespace `ns`.
pub fn offloaded_binding(vn: &VirtualNode, ns: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta(vn, Some(ns)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: OFFLOADED_ROLE.to_owned(),
        },
        subjects: Some(vec![subject(vn)]),
    }
}

/// The label selector of every object made for `vn` (its [`offloaded_binding`]s among them).
pub fn selector(vn: &VirtualNode) -> String {
    format!(
        "{VIRTUAL_NODE_LABEL}={},{VIRTUAL_NODE_NAMESPACE_LABEL}={}",
        vn.name_any(),
        vn.namespace().unwrap_or_default()
    )
}

/// The namespaces [`roles`] puts Roles in.
pub fn role_namespaces(vn: &VirtualNode, s: &Settings) -> Vec<String> {
    namespaced_rules(vn, s).into_keys().collect()
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                api_version: None,
            }),
            ..Default::default()
        }),
        value: None,
    }
}

/// One replica (Recreate: two virtual kubelets must not write the same Node at once).
pub fn deployment(vn: &VirtualNode, s: &Settings) -> Deployment {
    let labels = labels(vn);
    let selector = BTreeMap::from([
        (APP_LABEL.to_owned(), APP.to_owned()),
        (VIRTUAL_NODE_LABEL.to_owned(), vn.name_any()),
    ]);
    let mut pod_labels = labels.clone();
    pod_labels.extend(selector.clone());
    let quantity = |q: &str| Quantity(q.to_owned());
    Deployment {
        metadata: meta(vn, vn.namespace().as_deref()),
        spec: DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".to_owned()),
                rolling_update: None,
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(name(vn)),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        run_as_group: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_owned(),
                            localhost_profile: None,
                        }),
                        ..Default::default()
                    }),
                    containers: vec![Container {
                        name: "virtual-kubelet".to_owned(),
                        image: Some(s.image.clone()),
                        command: Some(vec![COMMAND.to_owned()]),
                        args: Some(
                            vec![
                                "--virtual-node".to_owned(),
                                vn.name_any(),
                                "--namespace".to_owned(),
                                vn.namespace().unwrap_or_default(),
                                "--fabric-namespace".to_owned(),
                                s.fabric_namespace.clone(),
                                "--kubelet-port".to_owned(),
                                s.kubelet_port.to_string(),
                            ]
                            .into_iter()
                            .chain(
                                s.home_api_address
                                    .iter()
                                    .flat_map(|a| ["--home-api-address".to_owned(), a.clone()]),
                            )
                            .chain(s.reflect.iter().flat_map(|r| {
                                ["--reflect-custom-resource".to_owned(), r.to_string()]
                            }))
                            .chain(s.health.args())
                            .collect(),
                        ),
                        env: Some(vec![
                            env_field("POD_IP", "status.podIP"),
                            env_field("POD_NAME", "metadata.name"),
                        ]),
                        resources: Some(ResourceRequirements {
                            requests: Some(BTreeMap::from([
                                ("cpu".to_owned(), quantity("10m")),
                                ("memory".to_owned(), quantity("32Mi")),
                            ])),
                            limits: Some(BTreeMap::from([(
                                "memory".to_owned(),
                                quantity("128Mi"),
                            )])),
                            ..Default::default()
                        }),
                        security_context: Some(SecurityContext {
                            allow_privilege_escalation: Some(false),
                            read_only_root_filesystem: Some(true),
                            capabilities: Some(Capabilities {
                                drop: Some(vec!["ALL".to_owned()]),
                                add: None,
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use fabric_api::offloading::v1alpha1::VirtualNodeSpec;

    use super::*;

    fn vn() -> VirtualNode {
        let mut vn = VirtualNode::new(
            "cluster-b",
            VirtualNodeSpec {
                cluster_id: "cluster-b".into(),
                node_name: "fabric-cluster-b".into(),
                identity: "cluster-b".into(),
                resources: Default::default(),
                labels: Default::default(),
                at_most_once: None,
                storage: None,
            },
        );
        vn.metadata.namespace = Some("fabric-system".into());
        vn.metadata.uid = Some("uid-vn".into());
        vn
    }

    fn settings() -> Settings {
        Settings {
            image: "fabric-virtual-kubelet:test".into(),
            fabric_namespace: "fabric-system".into(),
            kubelet_port: KUBELET_PORT,
            home_api_address: None,
            reflect: Vec::new(),
            health: Health::default(),
        }
    }

    #[test]
    fn every_grant_names_its_object_except_create() {
        let v = vn();
        let mut rules = cluster_role(&v).rules.unwrap();
        for (role, binding) in roles(&v, &settings()) {
            assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
            assert_eq!(binding.subjects.unwrap()[0].name, name(&v));
            rules.extend(role.rules.unwrap());
        }
        let pod_rule = |r: &PolicyRule| {
            POD_RULES.iter().any(|(g, res, verbs)| {
                r.api_groups.as_deref() == Some(&[g.to_string()][..])
                    && r.resources.as_deref().unwrap_or_default() == *res
                    && r.verbs == *verbs
            })
        };
        // Which namespaces are offloaded: read only, nothing secret in them.
        let offloadings = |r: &PolicyRule| {
            r.resources.as_deref() == Some(&["namespaceoffloadings".to_owned()][..])
                && r.verbs == ["get", "list", "watch"]
        };
        // Namespaces' labels (NetworkPolicies' namespaceSelectors): read only.
        let namespaces = |r: &PolicyRule| {
            r.resources.as_deref() == Some(&["namespaces".to_owned()][..])
                && r.verbs == ["get", "list", "watch"]
        };
        // Placeholder volumes: confined by an admission policy, never listed.
        let volumes = |r: &PolicyRule| {
            r.resources.as_deref() == Some(&["persistentvolumes".to_owned()][..])
                && r.verbs == ["get", "create", "delete"]
        };
        for r in rules
            .iter()
            .filter(|r| !pod_rule(r) && !offloadings(r) && !namespaces(r) && !volumes(r))
        {
            let named = r.resource_names.as_ref().is_some_and(|n| !n.is_empty());
            assert!(
                named || r.verbs == ["create"],
                "an unnamed grant beyond create: {r:?}"
            );
            let resources = r.resources.as_ref().unwrap();
            // Deleting: the home API server's IP alone, which a run without the option
            // withdraws.
            let home_ip = resources == &["ips".to_owned()]
                && r.resource_names.as_deref() == Some(&[names::home_api::SERVICE.to_owned()][..]);
            assert!(
                !r.verbs
                    .iter()
                    .any(|v| v == "*" || (v == "delete" && !home_ip))
            );
            if resources.contains(&"configmaps".to_owned()) {
                assert_eq!(
                    r.resource_names.as_deref(),
                    Some(&[CLIENT_CA_CONFIGMAP.to_owned()][..])
                );
            }
            if resources.contains(&"secrets".to_owned()) {
                assert_eq!(
                    r.resource_names.as_deref(),
                    Some(&[names::secret::identity("cluster-b")][..])
                );
            }
            if resources.contains(&"nodes".to_owned()) && named {
                assert_eq!(
                    r.resource_names.as_deref(),
                    Some(&["fabric-cluster-b".to_owned()][..])
                );
            }
        }
        // Same namespace for the VirtualNode and the Connections: one Role there, one for
        // the identity Secret, one for the Lease, one for the client CA.
        assert_eq!(
            role_namespaces(&v, &settings()),
            vec![
                "fabric-identities".to_owned(),
                "fabric-system".to_owned(),
                LEASE_NAMESPACE.to_owned(),
                CLIENT_CA_CONFIGMAP_NAMESPACE.to_owned()
            ]
        );
    }

    #[test]
    fn the_deployment_runs_the_virtual_kubelet_for_this_virtual_node() {
        let v = vn();
        let d = deployment(&v, &settings());
        assert_eq!(d.metadata.owner_references.unwrap()[0].uid, "uid-vn");
        let spec = d.spec;
        assert_eq!(spec.replicas, Some(1));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name, Some(name(&v)));
        let c = &pod.containers[0];
        assert_eq!(c.command.as_deref(), Some(&[COMMAND.to_owned()][..]));
        let args = c.args.clone().unwrap();
        assert!(
            args.windows(2)
                .any(|w| w == ["--virtual-node", "cluster-b"])
        );
        assert!(
            args.windows(2)
                .any(|w| w == ["--namespace", "fabric-system"])
        );
        assert!(args.windows(2).any(|w| w == ["--kubelet-port", "10250"]));
        let shared = Settings {
            kubelet_port: 0,
            ..settings()
        };
        let d = deployment(&v, &shared);
        let args = d.spec.template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(args.windows(2).any(|w| w == ["--kubelet-port", "0"]));
        assert!(!args.iter().any(|a| a == "--home-api-address"));
        assert!(!args.iter().any(|a| a == "--reflect-custom-resource"));
        assert!(
            !args
                .iter()
                .any(|a| a == "--grace" || a.starts_with("--probe")),
            "the virtual kubelet's own defaults unless set: {args:?}"
        );
        let watchful = Settings {
            health: Health {
                probe_interval: Some(std::time::Duration::from_secs(1)),
                probe_timeout: None,
                grace: Some(std::time::Duration::from_millis(2500)),
            },
            ..settings()
        };
        let args = deployment(&v, &watchful)
            .spec
            .template
            .spec
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap();
        assert!(args.windows(2).any(|w| w == ["--probe-interval", "1000ms"]));
        assert!(args.windows(2).any(|w| w == ["--grace", "2500ms"]));
        assert!(!args.iter().any(|a| a == "--probe-timeout"));
        let home = Settings {
            home_api_address: Some("10.0.1.100:6443".into()),
            reflect: vec!["widgets.example.com/v1".parse().unwrap()],
            ..settings()
        };
        let args = deployment(&v, &home).spec.template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(
            args.windows(2)
                .any(|w| w == ["--home-api-address", "10.0.1.100:6443"])
        );
        assert!(
            args.windows(2)
                .any(|w| w == ["--reflect-custom-resource", "widgets.example.com/v1"])
        );
        let b = reflection_binding(&v);
        assert_eq!(b.role_ref.name, REFLECTION_ROLE);
        assert_eq!(
            b.subjects,
            cluster_role_binding(&v).subjects,
            "to the virtual kubelet alone"
        );
        let ip_rules: Vec<_> = roles(&v, &home)
            .into_iter()
            .flat_map(|(r, _)| r.rules.unwrap_or_default())
            .filter(|r| r.resources.as_deref() == Some(&["ips".to_owned()][..]))
            .collect();
        assert_eq!(ip_rules.len(), 2, "{ip_rules:?}");
        let withdraw: Vec<_> = roles(&v, &settings())
            .into_iter()
            .flat_map(|(r, _)| r.rules.unwrap_or_default())
            .filter(|r| r.resources.as_deref() == Some(&["ips".to_owned()][..]))
            .collect();
        assert_eq!(withdraw.len(), 1, "{withdraw:?}");
        assert_eq!(
            withdraw[0].resource_names.as_deref(),
            Some(&[names::home_api::SERVICE.to_owned()][..]),
            "without a home API address: its IP alone"
        );
        assert_eq!(withdraw[0].verbs, ["get", "delete"], "to withdraw it");
        let env = c.env.clone().unwrap();
        assert_eq!(env[0].name, "POD_IP");
        // The selector picks the template's pods.
        let tl = spec.template.metadata.unwrap().labels.unwrap();
        for (k, val) in spec.selector.match_labels.unwrap() {
            assert_eq!(tl.get(&k), Some(&val));
        }
        // Cluster-scoped objects cannot be owned by a namespaced one.
        assert!(cluster_role(&v).metadata.owner_references.is_none());
    }

    #[test]
    fn names_stay_dns_labels() {
        let mut v = vn();
        v.spec.node_name = "n".repeat(63);
        assert!(name(&v).len() <= 63);
    }
}
