//! The manifests under deploy/ against a real API server with RBAC enforced: the kustomization
//! applies (server-side dry run, then for real), and each component's ServiceAccount can do
//! what its code does and nothing more.
use std::path::Path;

use fabric_tests::{
    apiserver::{ApiServer, require_tools},
    kube_sync::{self, Access},
    phase::phase,
};

/// The components' namespace.
const NS: &str = "fabric-system";

/// Whether component `who`'s ServiceAccount may `verb` the `what` (as `kubectl auth can-i`
/// takes it: `plural[.group][/name]`) in namespace `ns`.
fn can_in(api: &ApiServer, who: &str, verb: &str, what: &str, ns: &str) -> bool {
    can_all(api, std::iter::once((who, verb, what, ns)))[0]
}

/// [`can_in`] for each `(who, verb, what, namespace)`, in order: SubjectAccessReviews made
/// in-process, a few at a time (one `kubectl auth can-i` process each was most of this
/// test's CPU).
fn can_all<'a>(
    api: &ApiServer,
    checks: impl Iterator<Item = (&'a str, &'a str, &'a str, &'a str)>,
) -> Vec<bool> {
    let questions: Vec<Access> = checks
        .map(|(who, verb, what, ns)| Access::service_account(NS, who, verb, what, ns))
        .collect();
    kube_sync::can_i(&api.kubeconfig, &questions).expect("SubjectAccessReviews")
}

/// Whether ServiceAccount `who` may approve (or deny) CSRs of `signer`: the `approve` verb on
/// the synthetic resource `signers`, which `kubectl auth can-i` cannot name (it is not served):
/// a SubjectAccessReview.
fn may_approve(api: &ApiServer, who: &str, signer: &str) -> bool {
    let review = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:{NS}:{who}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NS}"),
                       "system:authenticated"],
            "resourceAttributes": { "group": "certificates.k8s.io", "resource": "signers",
                                    "verb": "approve", "name": signer },
        },
    });
    let o = api.kubectl_stdin(
        &["create", "-f", "-", "-o", "jsonpath={.status.allowed}"],
        &review.to_string(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim() == "true"
}

/// A kubeconfig that is component `who`'s ServiceAccount and nothing else: the attacker's
/// own credentials when that component is compromised (a token, as its pod holds one).
fn token_of(api: &ApiServer, who: &str) -> std::path::PathBuf {
    let out = api.kubeconfig.with_file_name(format!("{who}.kubeconfig"));
    fabric_tests::rights::token_kubeconfig(&api.kubeconfig, &api.kubeconfig, NS, who, &out)
        .unwrap();
    out
}

/// `kubectl` with kubeconfig `kc` (and `input` on stdin, if any): whether it succeeded, and
/// what it said.
fn kubectl_with(kc: &Path, args: &[&str], input: Option<&str>) -> (bool, String) {
    use std::io::Write as _;
    let mut c = std::process::Command::new("kubectl")
        .env("KUBECONFIG", kc)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = c.stdin.take().unwrap();
    stdin
        .write_all(input.unwrap_or_default().as_bytes())
        .unwrap();
    drop(stdin);
    let o = c.wait_with_output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// `obj` applied with kubeconfig `kc`, as the components write (server-side apply: the
/// name is in the request, which `escalate` and `bind` on named Roles need).
fn apply_with(kc: &Path, obj: &serde_json::Value) -> (bool, String) {
    kubectl_with(
        kc,
        &["apply", "--server-side", "-f", "-"],
        Some(&obj.to_string()),
    )
}

/// Attacks made with a compromised component's own credentials: each must be refused. All
/// are tried, and those that succeeded are listed at once.
#[derive(Default)]
struct Attacks(Vec<String>);

impl Attacks {
    /// `what` must have been refused (403, or a policy's denial).
    fn refused(&mut self, what: &str, (ok, out): (bool, String)) {
        if ok {
            self.0.push(format!("{what} was allowed: {}", out.trim()));
        } else if !(out.contains("forbidden") || out.contains("denied")) {
            self.0
                .push(format!("{what} failed, but not as refused: {}", out.trim()));
        }
    }

    #[track_caller]
    fn check(self) {
        assert!(self.0.is_empty(), "\n{}", self.0.join("\n"));
    }
}

/// Asserts that `what` succeeded.
#[track_caller]
fn allowed(what: &str, (ok, out): (bool, String)) {
    assert!(ok, "{what} was refused: {out}");
}

#[test]
fn manifests_apply_with_least_privilege() {
    if !require_tools("manifests_apply_with_least_privilege") {
        return;
    }
    let api = ApiServer::start_bare_with_auth("deploy");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let deploy = deploy.to_str().unwrap();
    phase(
        "the manifests applied: a server dry run, then for real",
        || {
            // A server-side dry run cannot create objects in a namespace that does not exist yet
            // (the namespace itself is only dry-run created), as on any cluster.
            api.kubectl_ok(&["create", "namespace", "fabric-system"]);
            api.kubectl_ok(&[
                "create",
                "namespace",
                fabric_api::names::namespace::PEERING_TOKENS,
            ]);
            api.kubectl_ok(&[
                "create",
                "namespace",
                fabric_api::names::namespace::IDENTITIES,
            ]);
            api.kubectl_ok(&["create", "namespace", fabric_api::names::namespace::STORAGE]);
            let out = api.kubectl_ok(&["apply", "--dry-run=server", "-k", deploy]);
            for kind in [
                "customresourcedefinition",
                "clusterrole",
                "role",
                "serviceaccount",
                "deployment",
                "daemonset",
                "service",
                "configmap",
                "validatingwebhookconfiguration",
                "mutatingwebhookconfiguration",
            ] {
                assert!(
                    out.contains(&format!("{kind}.")) || out.contains(&format!("{kind}/")),
                    "{kind} missing from:\n{out}"
                );
            }
            api.kubectl_ok(&["apply", "-k", deploy]);
            api.wait_crds_established();
        },
    );

    phase("what each component may do", || {
        let allowed = [
            (
                "fabric-agent",
                "watch",
                "configurations.networking.fabric.io",
            ),
            (
                "fabric-controller",
                "patch",
                "configurations.networking.fabric.io/status",
            ),
            (
                "fabric-controller",
                "update",
                "configurations.networking.fabric.io",
            ),
            (
                "fabric-controller",
                "delete",
                "networks.networking.fabric.io",
            ),
            // IPAM's ledger, and no other ConfigMap.
            (
                "fabric-controller",
                "update",
                "configmaps/fabric-ipam-ledger",
            ),
            // Discovery.
            (
                "fabric-controller",
                "patch",
                "foreignclusters.core.fabric.io",
            ),
            (
                "fabric-controller",
                "delete",
                "foreignclusters.core.fabric.io",
            ),
            ("fabric-gateway", "get", "secrets/fabric-gateway-key"),
            (
                "fabric-gateway",
                "update",
                "leases.coordination.k8s.io/fabric-gateway",
            ),
            ("fabric-gateway", "create", "leases.coordination.k8s.io"),
            (
                "fabric-agent",
                "watch",
                "leases.coordination.k8s.io/fabric-gateway",
            ),
            (
                "fabric-agent",
                "get",
                "leases.coordination.k8s.io/fabric-gateway",
            ),
            (
                "fabric-gateway",
                "patch",
                "connections.networking.fabric.io/status",
            ),
            ("fabric-gateway", "watch", "publickeys.networking.fabric.io"),
            ("fabric-gateway", "watch", "secrets/fabric-gateway-key"),
            ("fabric-gateway", "watch", "configmaps/fabric-cluster"),
            ("fabric-gateway", "create", "events.events.k8s.io"),
            ("fabric-gateway", "list", "nodes"),
            (
                "fabric-gateway",
                "patch",
                "endpointslices.discovery.k8s.io/fabric-gateway",
            ),
            (
                "fabric-gateway",
                "patch",
                "configmaps/fabric-gateway-identity",
            ),
            // The authentication service: its serving certificate by name (the peering
            // tokens, in a namespace of their own, are checked below).
            ("fabric-auth", "get", "secrets/fabric-auth-tls"),
            ("fabric-auth", "create", "secrets"),
            ("fabric-auth", "create", "namespaces"),
            (
                "fabric-auth",
                "patch",
                "rolebindings.rbac.authorization.k8s.io",
            ),
            (
                "fabric-auth",
                "bind",
                "roles.rbac.authorization.k8s.io/fabric-consumer",
            ),
            ("fabric-auth", "patch", "tenants.authentication.fabric.io"),
            (
                "fabric-auth",
                "patch",
                "foreignclusters.core.fabric.io/status",
            ),
            (
                "fabric-auth",
                "create",
                "certificatesigningrequests.certificates.k8s.io",
            ),
            (
                "fabric-auth",
                "watch",
                "certificatesigningrequests.certificates.k8s.io",
            ),
            // The negotiation (fabric-controller sharing).
            (
                "fabric-sharing",
                "patch",
                "peeringnetworks.networking.fabric.io/status",
            ),
            (
                "fabric-sharing",
                "patch",
                "resourceslices.authentication.fabric.io/status",
            ),
            (
                "fabric-sharing",
                "patch",
                "foreignclusters.core.fabric.io/status",
            ),
            ("fabric-sharing", "watch", "pods"),
            // The gateway key, by name (the identities are in fabric-identities, below).
            ("fabric-sharing", "get", "secrets/fabric-gateway-key"),
            (
                "fabric-sharing",
                "delete",
                "gatewayservers.networking.fabric.io",
            ),
            (
                "fabric-sharing",
                "patch",
                "virtualnodes.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "update",
                "leases.coordination.k8s.io/fabric-sharing",
            ),
            // Server-side apply of objects that do not exist yet (a provider's VirtualNode, a
            // peer's network objects) is a create; the gateway's identity is watched by name.
            (
                "fabric-sharing",
                "create",
                "virtualnodes.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "create",
                "configurations.networking.fabric.io",
            ),
            (
                "fabric-sharing",
                "watch",
                "configmaps/fabric-gateway-identity",
            ),
            ("fabric-sharing", "get", "configmaps/fabric-cluster"),
            // ... and what it grants each virtual kubelet: its Configuration, by name.
            (
                "fabric-virtual-nodes",
                "watch",
                "configurations.networking.fabric.io",
            ),
            // The renewal of the identities issued by providers (run by the sharing controllers;
            // their Secrets: below, in fabric-identities).
            (
                "fabric-sharing",
                "patch",
                "identities.authentication.fabric.io/status",
            ),
            // ... which the authentication service binds in each tenant namespace it creates.
            (
                "fabric-auth",
                "bind",
                "clusterroles.rbac.authorization.k8s.io/fabric-sharing-tenant",
            ),
            // The approver of the consumers' CSRs the authentication service makes.
            (
                "fabric-sharing",
                "watch",
                "certificatesigningrequests.certificates.k8s.io",
            ),
            (
                "fabric-sharing",
                "get",
                "rolebindings.rbac.authorization.k8s.io/fabric-consumer",
            ),
            // The NamespaceMap controller: consumers' maps, their twin namespaces (created,
            // deleted), the tenant's rights bound there, the tenant's binding followed.
            (
                "fabric-sharing",
                "patch",
                "namespacemaps.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "patch",
                "namespacemaps.offloading.fabric.io/status",
            ),
            (
                "fabric-sharing",
                "delete",
                "namespacemaps.offloading.fabric.io",
            ),
            ("fabric-sharing", "create", "namespaces"),
            ("fabric-sharing", "get", "namespaces"),
            ("fabric-sharing", "watch", "namespaces"),
            (
                "fabric-sharing",
                "create",
                "rolebindings.rbac.authorization.k8s.io",
            ),
            (
                "fabric-sharing",
                "patch",
                "rolebindings.rbac.authorization.k8s.io",
            ),
            (
                "fabric-sharing",
                "bind",
                "clusterroles.rbac.authorization.k8s.io/fabric-consumer-twin",
            ),
            (
                "fabric-sharing",
                "bind",
                "clusterroles.rbac.authorization.k8s.io/fabric-sharing-tenant",
            ),
            (
                "fabric-sharing",
                "bind",
                "clusterroles.rbac.authorization.k8s.io/fabric-consumer-reflection",
            ),
            (
                "fabric-sharing",
                "delete",
                "rolebindings.rbac.authorization.k8s.io/fabric-consumer-reflection",
            ),
            (
                "fabric-sharing",
                "watch",
                "rolebindings.rbac.authorization.k8s.io/fabric-consumer",
            ),
            // The ShadowEndpointSlice controller: consumers' shadows (its finalizer), the real
            // slices it wrote (written in tenant and twin namespaces only, checked below).
            (
                "fabric-sharing",
                "watch",
                "shadowendpointslices.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "patch",
                "shadowendpointslices.offloading.fabric.io",
            ),
            ("fabric-sharing", "watch", "endpointslices.discovery.k8s.io"),
            // The ShadowNetworkPolicy controller likewise.
            (
                "fabric-sharing",
                "watch",
                "shadownetworkpolicies.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "patch",
                "shadownetworkpolicies.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "watch",
                "networkpolicies.networking.k8s.io",
            ),
            (
                "fabric-sharing",
                "watch",
                "connections.networking.fabric.io",
            ),
            (
                "fabric-sharing",
                "watch",
                "configurations.networking.fabric.io",
            ),
            // The VirtualNode controller's election.
            (
                "fabric-virtual-nodes",
                "update",
                "leases.coordination.k8s.io/fabric-virtual-nodes",
            ),
            // Unpeering: the consumer's Identity (its Secret: below, in fabric-identities), the
            // provider's tenant area (the Tenant's finalizer, the consumer's ForeignCluster).
            ("fabric-sharing", "delete", "foreignclusters.core.fabric.io"),
            (
                "fabric-sharing",
                "delete",
                "identities.authentication.fabric.io",
            ),
            ("fabric-sharing", "delete", "namespaces"),
            (
                "fabric-sharing",
                "delete",
                "rolebindings.rbac.authorization.k8s.io/fabric-consumer",
            ),
            (
                "fabric-sharing",
                "patch",
                "tenants.authentication.fabric.io",
            ),
            // A consumer revoked: its ForeignCluster deleted on the provider deletes its Tenant.
            (
                "fabric-sharing",
                "delete",
                "tenants.authentication.fabric.io",
            ),
            // A drained tenant: its Drained condition, and its ShadowPods (in the namespaces
            // carrying its label) deleted after the grace.
            (
                "fabric-sharing",
                "patch",
                "tenants.authentication.fabric.io/status",
            ),
            ("fabric-sharing", "list", "namespaces"),
            // The consumer's namespace offloading: NamespaceOffloadings (finalizer, status)
            // and the scheduling label of their namespaces.
            (
                "fabric-sharing",
                "watch",
                "namespaceoffloadings.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "patch",
                "namespaceoffloadings.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "patch",
                "namespaceoffloadings.offloading.fabric.io/status",
            ),
            ("fabric-sharing", "patch", "namespaces"),
            (
                "fabric-sharing",
                "delete",
                "shadowpods.offloading.fabric.io",
            ),
            // The VirtualNode controller holds what it grants the virtual kubelets.
            (
                "fabric-virtual-nodes",
                "patch",
                "virtualnodes.offloading.fabric.io",
            ),
            // Their placeholder volumes (fabric-virtual-kubelet-volumes confines them).
            ("fabric-virtual-nodes", "create", "persistentvolumes"),
            ("fabric-virtual-nodes", "delete", "persistentvolumes"),
            ("fabric-virtual-nodes", "create", "deployments.apps"),
            (
                "fabric-virtual-nodes",
                "create",
                "clusterroles.rbac.authorization.k8s.io",
            ),
            ("fabric-virtual-nodes", "delete", "nodes"),
            ("fabric-virtual-nodes", "delete", "pods"),
            ("fabric-virtual-nodes", "list", "pods"),
            // ... for the virtual kubelets' API: who may call it, and the API server's client CA.
            (
                "fabric-virtual-nodes",
                "create",
                "subjectaccessreviews.authorization.k8s.io",
            ),
            (
                "fabric-virtual-nodes",
                "create",
                "tokenreviews.authentication.k8s.io",
            ),
            (
                "fabric-virtual-nodes",
                "get",
                "connections.networking.fabric.io",
            ),
            // ... and the IP exposing the home API server to peers (deleted by a virtual
            // kubelet started without `--home-api-address`).
            (
                "fabric-virtual-nodes",
                "patch",
                "ips.networking.fabric.io/fabric-home-apiserver",
            ),
            (
                "fabric-virtual-nodes",
                "delete",
                "ips.networking.fabric.io/fabric-home-apiserver",
            ),
            ("fabric-virtual-nodes", "create", "ips.networking.fabric.io"),
            // The ShadowPod webhook: its caches, the usage on Tenants, its Secret, its
            // configuration's caBundle.
            (
                "fabric-shadowpod-webhook",
                "watch",
                "shadowpods.offloading.fabric.io",
            ),
            (
                "fabric-shadowpod-webhook",
                "list",
                "resourceslices.authentication.fabric.io",
            ),
            ("fabric-shadowpod-webhook", "watch", "namespaces"),
            (
                "fabric-shadowpod-webhook",
                "list",
                "namespacemaps.offloading.fabric.io",
            ),
            (
                "fabric-shadowpod-webhook",
                "watch",
                "tenants.authentication.fabric.io",
            ),
            ("fabric-shadowpod-webhook", "create", "secrets"),
            (
                "fabric-shadowpod-webhook",
                "update",
                "secrets/fabric-shadowpod-webhook-tls",
            ),
            (
                "fabric-shadowpod-webhook",
                "update",
                "validatingwebhookconfigurations.admissionregistration.k8s.io/fabric-shadowpods",
            ),
            // ... and, for the pods of a consumer's offloaded namespaces, their
            // NamespaceOffloadings and its mutating configuration's caBundle.
            (
                "fabric-shadowpod-webhook",
                "watch",
                "namespaceoffloadings.offloading.fabric.io",
            ),
            (
                "fabric-shadowpod-webhook",
                "get",
                "namespaceoffloadings.offloading.fabric.io",
            ),
            (
                "fabric-shadowpod-webhook",
                "update",
                "mutatingwebhookconfigurations.admissionregistration.k8s.io/fabric-pods",
            ),
        ];
        let answers = can_all(&api, allowed.iter().map(|&(w, v, x)| (w, v, x, NS)));
        for ((who, verb, what), yes) in allowed.into_iter().zip(answers) {
            assert!(yes, "{who} should be allowed to {verb} {what}");
        }
        // The identities providers issued, where only they live: stored by the peering
        // (server-side apply of a new one is a create), rewritten by renewals, deleted by
        // unpeering; granted to each virtual kubelet by the VirtualNode controller, which holds
        // what it grants.
        let identities = fabric_api::names::namespace::IDENTITIES;
        let allowed = [
            ("fabric-sharing", "get", "secrets"),
            ("fabric-sharing", "create", "secrets"),
            ("fabric-sharing", "patch", "secrets"),
            ("fabric-sharing", "delete", "secrets"),
            ("fabric-virtual-nodes", "get", "secrets"),
            ("fabric-virtual-nodes", "watch", "secrets"),
        ];
        let answers = can_all(&api, allowed.iter().map(|&(w, v, x)| (w, v, x, identities)));
        for ((who, verb, what), yes) in allowed.into_iter().zip(answers) {
            assert!(
                yes,
                "{who} should be allowed to {verb} {what} in {identities}"
            );
        }
    });

    phase("and nothing more", || {
        let denied = [
            (
                "fabric-agent",
                "patch",
                "configurations.networking.fabric.io",
            ),
            ("fabric-agent", "get", "secrets"),
            ("fabric-virtual-nodes", "create", "secrets"),
            // No Secret of fabric-system but the gateway key, read (and created when missing,
            // confined by fabric-sharing-secrets): not the authentication service's TLS key,
            // not the webhook's CA, nothing by listing.
            ("fabric-sharing", "get", "secrets"),
            ("fabric-sharing", "get", "secrets/fabric-auth-tls"),
            (
                "fabric-sharing",
                "get",
                "secrets/fabric-shadowpod-webhook-tls",
            ),
            ("fabric-sharing", "patch", "secrets/fabric-gateway-key"),
            ("fabric-sharing", "delete", "secrets"),
            ("fabric-sharing", "watch", "secrets"),
            // The VirtualNode controller grants identities (in fabric-identities), nothing here.
            ("fabric-virtual-nodes", "get", "secrets"),
            ("fabric-virtual-nodes", "list", "secrets"),
            // Placeholder volumes are made and deleted by name, never listed nor changed.
            ("fabric-virtual-nodes", "list", "persistentvolumes"),
            ("fabric-virtual-nodes", "update", "persistentvolumes"),
            ("fabric-virtual-nodes", "patch", "persistentvolumeclaims"),
            // Its own election's Lease only.
            (
                "fabric-virtual-nodes",
                "update",
                "leases.coordination.k8s.io/fabric-gateway",
            ),
            (
                "fabric-virtual-nodes",
                "delete",
                "leases.coordination.k8s.io/fabric-virtual-nodes",
            ),
            ("fabric-virtual-nodes", "create", "pods"),
            // Of IPs, the home API server's only.
            (
                "fabric-virtual-nodes",
                "patch",
                "ips.networking.fabric.io/db",
            ),
            ("fabric-virtual-nodes", "get", "ips.networking.fabric.io/db"),
            ("fabric-virtual-nodes", "get", "configmaps"),
            ("fabric-virtual-nodes", "get", "configmaps/fabric-cluster"),
            (
                "fabric-virtual-nodes",
                "escalate",
                "roles.rbac.authorization.k8s.io",
            ),
            (
                "fabric-virtual-nodes",
                "patch",
                "foreignclusters.core.fabric.io",
            ),
            ("fabric-agent", "create", "pods"),
            ("fabric-controller", "get", "secrets"),
            (
                "fabric-controller",
                "update",
                "configmaps/fabric-gateway-identity",
            ),
            ("fabric-auth", "delete", "namespaces"),
            (
                "fabric-sharing",
                "delete",
                "rolebindings.rbac.authorization.k8s.io/admin",
            ),
            ("fabric-auth", "delete", "secrets"),
            // Other components' Secrets are not the service's to read: the tokens it reads
            // live in a namespace of their own.
            ("fabric-auth", "list", "secrets"),
            ("fabric-auth", "get", "secrets/fabric-gateway-key"),
            ("fabric-auth", "get", "secrets/fabric-shadowpod-webhook-tls"),
            ("fabric-auth", "update", "secrets"),
            ("fabric-auth", "list", "nodes"),
            ("fabric-auth", "create", "pods"),
            (
                "fabric-auth",
                "create",
                "clusterroles.rbac.authorization.k8s.io",
            ),
            (
                "fabric-auth",
                "bind",
                "roles.rbac.authorization.k8s.io/admin",
            ),
            (
                "fabric-auth",
                "escalate",
                "clusterroles.rbac.authorization.k8s.io",
            ),
            (
                "fabric-auth",
                "delete",
                "certificatesigningrequests.certificates.k8s.io",
            ),
            (
                "fabric-sharing",
                "create",
                "certificatesigningrequests.certificates.k8s.io",
            ),
            ("fabric-controller", "delete", "nodes"),
            (
                "fabric-controller",
                "update",
                "leases.coordination.k8s.io/fabric-gateway",
            ),
            ("fabric-gateway", "get", "secrets/some-other-secret"),
            (
                "fabric-gateway",
                "delete",
                "configurations.networking.fabric.io",
            ),
            ("fabric-gateway", "list", "secrets"),
            ("fabric-gateway", "delete", "pods"),
            // The active replica is published through the Service's EndpointSlice: no pod writes
            // (a pod patch could replace the agent's image and run code on every node).
            ("fabric-gateway", "patch", "pods"),
            ("fabric-gateway", "update", "pods"),
            (
                "fabric-gateway",
                "patch",
                "endpointslices.discovery.k8s.io/some-other-service",
            ),
            ("fabric-gateway", "patch", "nodes"),
            ("fabric-gateway", "create", "pods"),
            ("fabric-gateway", "patch", "configmaps/fabric-cluster"),
            // Only the gateway's own Lease, and the agent only reads it.
            (
                "fabric-gateway",
                "update",
                "leases.coordination.k8s.io/some-other-lease",
            ),
            ("fabric-gateway", "delete", "leases.coordination.k8s.io"),
            (
                "fabric-agent",
                "update",
                "leases.coordination.k8s.io/fabric-gateway",
            ),
            ("fabric-agent", "create", "leases.coordination.k8s.io"),
            ("fabric-agent", "list", "leases.coordination.k8s.io"),
            (
                "fabric-agent",
                "get",
                "leases.coordination.k8s.io/some-other-lease",
            ),
            ("fabric-sharing", "list", "secrets"),
            // The cluster's and the gateway's identity only, not the IPAM's ledger.
            ("fabric-sharing", "list", "configmaps"),
            ("fabric-sharing", "update", "configmaps/fabric-ipam-ledger"),
            ("fabric-sharing", "get", "configmaps/some-other-configmap"),
            ("fabric-sharing", "patch", "pods"),
            // Pods only in tenant namespaces, through their RoleBinding (checked below).
            ("fabric-sharing", "create", "pods"),
            ("fabric-sharing", "delete", "pods"),
            // EndpointSlices likewise; a consumer's shadows are the consumer's to write.
            (
                "fabric-sharing",
                "create",
                "endpointslices.discovery.k8s.io",
            ),
            (
                "fabric-sharing",
                "delete",
                "endpointslices.discovery.k8s.io",
            ),
            (
                "fabric-sharing",
                "create",
                "shadowendpointslices.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "delete",
                "shadowendpointslices.offloading.fabric.io",
            ),
            // NetworkPolicies only where fabric-sharing-tenant is bound; the shadows are the
            // consumer's.
            (
                "fabric-sharing",
                "create",
                "networkpolicies.networking.k8s.io",
            ),
            (
                "fabric-sharing",
                "delete",
                "networkpolicies.networking.k8s.io",
            ),
            (
                "fabric-sharing",
                "create",
                "shadownetworkpolicies.offloading.fabric.io",
            ),
            (
                "fabric-auth",
                "bind",
                "clusterroles.rbac.authorization.k8s.io/fabric-sharing",
            ),
            (
                "fabric-sharing",
                "create",
                "identities.authentication.fabric.io",
            ),
            ("fabric-sharing", "patch", "nodes"),
            // Namespaces are listed, patched (the scheduling label only, by the policy
            // fabric-sharing-namespace-label), created (twins, by fabric-sharing-twins) and
            // deleted (twins, a tenant's on unpeering); no role is bound but the two for twins.
            ("fabric-sharing", "update", "namespaces"),
            (
                "fabric-sharing",
                "delete",
                "namespaceoffloadings.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "create",
                "namespaceoffloadings.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "bind",
                "clusterroles.rbac.authorization.k8s.io/cluster-admin",
            ),
            (
                "fabric-sharing",
                "bind",
                "clusterroles.rbac.authorization.k8s.io/fabric-sharing",
            ),
            (
                "fabric-sharing",
                "bind",
                "roles.rbac.authorization.k8s.io/fabric-consumer",
            ),
            (
                "fabric-sharing",
                "escalate",
                "clusterroles.rbac.authorization.k8s.io",
            ),
            (
                "fabric-sharing",
                "delete",
                "rolebindings.rbac.authorization.k8s.io",
            ),
            (
                "fabric-sharing",
                "list",
                "rolebindings.rbac.authorization.k8s.io",
            ),
            (
                "fabric-sharing",
                "create",
                "namespacemaps.offloading.fabric.io",
            ),
            (
                "fabric-sharing",
                "update",
                "tenants.authentication.fabric.io/status",
            ),
            (
                "fabric-sharing",
                "update",
                "tenants.authentication.fabric.io",
            ),
            (
                "fabric-sharing",
                "delete",
                "roles.rbac.authorization.k8s.io/admin",
            ),
            (
                "fabric-sharing",
                "update",
                "leases.coordination.k8s.io/fabric-ipam",
            ),
            ("fabric-shadowpod-webhook", "get", "secrets/fabric-auth-tls"),
            ("fabric-shadowpod-webhook", "list", "secrets"),
            (
                "fabric-shadowpod-webhook",
                "update",
                "validatingwebhookconfigurations.admissionregistration.k8s.io/other",
            ),
            (
                "fabric-shadowpod-webhook",
                "patch",
                "shadowpods.offloading.fabric.io",
            ),
            ("fabric-shadowpod-webhook", "create", "pods"),
            // It reads the working mode (the Tenants' spec.mode) to judge pod creations while
            // tethered; setting it is the provider admin's alone (fabricctl mode).
            (
                "fabric-shadowpod-webhook",
                "patch",
                "tenants.authentication.fabric.io",
            ),
            (
                "fabric-shadowpod-webhook",
                "update",
                "tenants.authentication.fabric.io",
            ),
            (
                "fabric-shadowpod-webhook",
                "update",
                "mutatingwebhookconfigurations.admissionregistration.k8s.io/other",
            ),
            (
                "fabric-shadowpod-webhook",
                "create",
                "mutatingwebhookconfigurations.admissionregistration.k8s.io",
            ),
            (
                "fabric-shadowpod-webhook",
                "update",
                "namespaceoffloadings.offloading.fabric.io",
            ),
            (
                "fabric-shadowpod-webhook",
                "update",
                "namespaceoffloadings.offloading.fabric.io/status",
            ),
            ("fabric-shadowpod-webhook", "patch", "namespaces"),
        ];
        let answers = can_all(&api, denied.iter().map(|&(w, v, x)| (w, v, x, NS)));
        for ((who, verb, what), yes) in denied.into_iter().zip(answers) {
            assert!(!yes, "{who} must not be allowed to {verb} {what}");
        }
    });

    phase(
        "CSR approval: the approver's, of the client signer only",
        || {
            // The authentication service faces the internet: it creates CSRs, the approver in
            // fabric-sharing (which reads each request) approves them.
            for (who, signer, yes) in [
                (
                    "fabric-sharing",
                    "kubernetes.io/kube-apiserver-client",
                    true,
                ),
                ("fabric-sharing", "kubernetes.io/kubelet-serving", false),
                (
                    "fabric-sharing",
                    "kubernetes.io/kube-apiserver-client-kubelet",
                    false,
                ),
                ("fabric-sharing", "kubernetes.io/*", false),
                ("fabric-auth", "kubernetes.io/kube-apiserver-client", false),
                ("fabric-auth", "kubernetes.io/*", false),
            ] {
                assert_eq!(
                    may_approve(&api, who, signer),
                    yes,
                    "{who} approving CSRs of {signer}"
                );
            }
        },
    );

    phase(
        "a consumer's rights in a twin, a virtual kubelet's in an offloaded namespace",
        || {
            // As the NamespaceMap and VirtualNode controllers bind them.
            let ns = "twin-rights";
            let users = fabric_api::names::user::peering("beta", "n1");
            api.kubectl_ok(&["create", "namespace", ns]);
            api.kubectl_ok(&[
                "create",
                "rolebinding",
                "fabric-consumer",
                "-n",
                ns,
                "--clusterrole=fabric-consumer-twin",
                &format!("--group={users}"),
            ]);
            api.kubectl_ok(&[
                "create",
                "rolebinding",
                "vk",
                "-n",
                ns,
                "--clusterrole=fabric-offloaded-namespace",
                "--serviceaccount=fabric-system:vk",
            ]);
            let consumer = fabric_api::names::user::consumer("beta");
            let as_consumer: &dyn Fn(&str, &str) -> Access = &|verb, what| {
                let groups = [users.as_str(), fabric_api::names::user::CONSUMERS_GROUP];
                Access::user(&consumer, &groups, verb, what, ns)
            };
            let vk: &dyn Fn(&str, &str) -> Access =
                &|verb, what| Access::service_account(NS, "vk", verb, what, ns);
            for (who, verb, what, yes) in [
                (&as_consumer, "create", "services", true),
                (&as_consumer, "patch", "services", true),
                (&as_consumer, "delete", "services", true),
                (&as_consumer, "watch", "services", true),
                // Load balancer addresses are the provider's (CVE-2020-8554).
                (&as_consumer, "patch", "services/status", false),
                (&as_consumer, "update", "services/status", false),
                (&as_consumer, "create", "serviceaccounts", false),
                // Its provider's working mode (a Tenant's spec.mode) is not the consumer's.
                (
                    &as_consumer,
                    "patch",
                    "tenants.authentication.fabric.io",
                    false,
                ),
                (
                    &as_consumer,
                    "update",
                    "tenants.authentication.fabric.io",
                    false,
                ),
                (&vk, "watch", "services", true),
                (&vk, "create", "services", false),
                (&vk, "patch", "services", false),
                // The tokens of its offloaded pods, here only (below); the consumer mints
                // none on its provider.
                (&vk, "create", "serviceaccounts/token", true),
                (&vk, "get", "serviceaccounts", false),
                (&as_consumer, "create", "serviceaccounts/token", false),
                // The claims of its offloaded namespace's storage, never a volume.
                (&as_consumer, "create", "persistentvolumeclaims", true),
                (&as_consumer, "delete", "persistentvolumeclaims", true),
                (&as_consumer, "create", "persistentvolumes", false),
                // The claims it provisions: bound and finalized, never made or deleted.
                (&vk, "watch", "persistentvolumeclaims", true),
                (&vk, "patch", "persistentvolumeclaims", true),
                (&vk, "create", "persistentvolumeclaims", false),
                (&vk, "delete", "persistentvolumeclaims", false),
                // NetworkPolicies: the consumer writes shadows the provider translates, never
                // a real policy (one of its own could open what the provider's close); the
                // virtual kubelet reads the home ones.
                (
                    &as_consumer,
                    "create",
                    "shadownetworkpolicies.offloading.fabric.io",
                    true,
                ),
                (
                    &as_consumer,
                    "delete",
                    "shadownetworkpolicies.offloading.fabric.io",
                    true,
                ),
                (
                    &as_consumer,
                    "create",
                    "networkpolicies.networking.k8s.io",
                    false,
                ),
                (
                    &as_consumer,
                    "patch",
                    "networkpolicies.networking.k8s.io",
                    false,
                ),
                (&vk, "watch", "networkpolicies.networking.k8s.io", true),
                (&vk, "create", "networkpolicies.networking.k8s.io", false),
            ] {
                // `kubectl auth can-i VERB services/status` would ask about a Service named
                // status: `status` is the subresource.
                let q = match what.split_once('/') {
                    Some((what, sub)) => who(verb, what).of(sub),
                    None => who(verb, what),
                };
                let answer =
                    kube_sync::can_i(&api.kubeconfig, std::slice::from_ref(&q)).unwrap()[0];
                assert_eq!(answer, yes, "{q:?}");
            }
            // The virtual kubelet's token right is the offloaded namespace's binding's alone.
            for who in ["vk", "fabric-virtual-nodes"] {
                for elsewhere in ["default", NS, "kube-system"] {
                    let q =
                        Access::service_account(NS, who, "create", "serviceaccounts", elsewhere)
                            .of("token");
                    let answer = kube_sync::can_i(&api.kubeconfig, &[q]).unwrap()[0];
                    assert!(
                        !answer,
                        "{who} creating serviceaccounts/token in {elsewhere}"
                    );
                }
            }
        },
    );

    phase("nothing of other namespaces", || {
        // Components that serve fabric-system see nothing of other namespaces: their objects
        // there (a tenant's, or anyone's with write access to one namespace) are not theirs to
        // act on, and their Secrets are out of reach.
        let elsewhere = [
            (
                "fabric-agent",
                "list",
                "configurations.networking.fabric.io",
            ),
            (
                "fabric-agent",
                "watch",
                "configurations.networking.fabric.io",
            ),
            ("fabric-agent", "get", "secrets"),
            ("fabric-agent", "list", "secrets"),
            (
                "fabric-agent",
                "get",
                "leases.coordination.k8s.io/fabric-gateway",
            ),
            (
                "fabric-controller",
                "watch",
                "configurations.networking.fabric.io",
            ),
            (
                "fabric-controller",
                "patch",
                "configurations.networking.fabric.io/status",
            ),
            ("fabric-controller", "list", "networks.networking.fabric.io"),
            (
                "fabric-controller",
                "create",
                "networks.networking.fabric.io",
            ),
            ("fabric-controller", "watch", "ips.networking.fabric.io"),
            ("fabric-controller", "get", "secrets"),
            (
                "fabric-virtual-nodes",
                "watch",
                "virtualnodes.offloading.fabric.io",
            ),
            (
                "fabric-virtual-nodes",
                "patch",
                "virtualnodes.offloading.fabric.io",
            ),
            ("fabric-virtual-nodes", "create", "deployments.apps"),
            ("fabric-virtual-nodes", "list", "deployments.apps"),
            ("fabric-virtual-nodes", "get", "secrets"),
            (
                "fabric-virtual-nodes",
                "create",
                "leases.coordination.k8s.io",
            ),
            (
                "fabric-virtual-nodes",
                "update",
                "leases.coordination.k8s.io/vk-alpha",
            ),
            (
                "fabric-gateway",
                "list",
                "configurations.networking.fabric.io",
            ),
            ("fabric-gateway", "get", "secrets/fabric-gateway-key"),
        ];
        let checks: Vec<_> = ["default", "kube-system", "fabric-tenant-alpha"]
            .into_iter()
            .flat_map(|ns| elsewhere.iter().map(move |&(w, v, x)| (w, v, x, ns)))
            .collect();
        let answers = can_all(&api, checks.iter().copied());
        for ((who, verb, what, ns), yes) in checks.into_iter().zip(answers) {
            assert!(!yes, "{who} must not be allowed to {verb} {what} in {ns}");
        }
    });

    phase("the ShadowPod and pod webhooks fail closed", || {
        // The ShadowPod webhook fails closed and only sees consumers' requests.
        let hook: serde_json::Value = serde_json::from_str(&api.kubectl_ok(&[
            "get",
            "validatingwebhookconfiguration",
            "fabric-shadowpods",
            "-o",
            "json",
        ]))
        .unwrap();
        // The second bounds the other kinds a consumer's Role lets it create.
        let objects = &hook["webhooks"][1];
        assert_eq!(objects["failurePolicy"], "Fail", "{objects}");
        assert_eq!(
            objects["clientConfig"]["service"]["path"],
            fabric_api::names::webhook::TENANT_OBJECTS_PATH
        );
        let routed: Vec<(String, String)> = objects["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["resources"][0].to_string(), r["operations"].to_string()))
            .collect();
        assert_eq!(
            routed,
            [
                ("\"resourceslices\"".to_owned(), "[\"CREATE\"]".to_owned()),
                ("\"peeringnetworks\"".to_owned(), "[\"CREATE\"]".to_owned()),
                ("\"namespacemaps\"".to_owned(), "[\"CREATE\"]".to_owned()),
            ],
            "{objects}"
        );
        let hook = &hook["webhooks"][0];
        assert_eq!(hook["failurePolicy"], "Fail", "{hook}");
        assert_eq!(
            hook["clientConfig"]["service"]["namespace"],
            "fabric-system"
        );
        assert_eq!(
            hook["clientConfig"]["service"]["path"],
            fabric_api::names::webhook::SHADOWPODS_PATH
        );
        assert!(
            hook["matchConditions"][0]["expression"]
                .as_str()
                .unwrap()
                .contains(&fabric_api::names::user::consumer("")),
            "{hook}"
        );

        // The consumer's pod webhook: pod creations in labelled namespaces only, failing
        // closed, quickly.
        let pods: serde_json::Value = serde_json::from_str(&api.kubectl_ok(&[
            "get",
            "mutatingwebhookconfiguration",
            fabric_api::names::webhook::PODS_CONFIG,
            "-o",
            "json",
        ]))
        .unwrap();
        let hook = &pods["webhooks"][0];
        assert_eq!(pods["webhooks"].as_array().unwrap().len(), 1, "{pods}");
        assert_eq!(hook["failurePolicy"], "Fail", "{hook}");
        assert_eq!(hook["sideEffects"], "None", "{hook}");
        assert!(hook["timeoutSeconds"].as_i64().unwrap() <= 5, "{hook}");
        assert_eq!(
            hook["clientConfig"]["service"]["path"],
            fabric_api::names::webhook::PODS_PATH
        );
        assert_eq!(
            hook["clientConfig"]["service"]["name"],
            fabric_api::names::webhook::SHADOWPODS_SERVICE
        );
        assert_eq!(
            hook["rules"],
            serde_json::json!([{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}]),
            "{hook}"
        );
        assert_eq!(
            hook["namespaceSelector"],
            serde_json::json!({"matchLabels":
                {fabric_api::names::label::SCHEDULING_ENABLED: "true"}}),
            "{hook}"
        );
    });

    phase("a tenant's RoleBinding for the sharing controllers", || {
        // A tenant as the authentication service makes it: its own credentials create the
        // sharing controllers' RoleBinding there (bind, not escalate: it holds no pod writes),
        // which lets them write pods in that namespace and in no other.
        let tenant = "fabric-tenant-alpha";
        let namespace = serde_json::to_string(&fabric_auth::tenant::namespace("alpha")).unwrap();
        let o = api.kubectl_stdin(&["create", "-f", "-"], &namespace);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let binding = serde_json::to_string(&fabric_auth::tenant::sharing_binding(
            "alpha",
            "fabric-system",
        ))
        .unwrap();
        let o = api.kubectl_stdin(
            &[
                "create",
                "-f",
                "-",
                "--as",
                "system:serviceaccount:fabric-system:fabric-auth",
            ],
            &binding,
        );
        assert!(
            o.status.success(),
            "the authentication service cannot bind the sharing controllers in a tenant namespace: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let can_in = |verb: &str, ns: &str, resource: &str| {
            self::can_in(&api, "fabric-sharing", verb, resource, ns)
        };
        for resource in ["pods", "endpointslices.discovery.k8s.io"] {
            for verb in ["create", "delete", "get"] {
                assert!(
                    can_in(verb, tenant, resource),
                    "fabric-sharing cannot {verb} {resource} in {tenant}"
                );
                for ns in ["default", "kube-system", "fabric-system"] {
                    assert!(
                        !can_in(verb, ns, resource),
                        "fabric-sharing may {verb} {resource} in {ns}"
                    );
                }
            }
        }
    });

    phase("API credentials only where the API is used", || {
        // API credentials only where the API is used: the gateway container parses what peers
        // send and gets none; its operator mounts the token.
        let dep: serde_json::Value = serde_json::from_str(&api.kubectl_ok(&[
            "get",
            "deployment",
            "fabric-gateway",
            "-n",
            "fabric-system",
            "-o",
            "json",
        ]))
        .unwrap();
        let pod = &dep["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false, "{pod}");
        let token_mounted = |container: &str| {
            pod["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == container)
                .unwrap_or_else(|| panic!("no container {container}"))["volumeMounts"]
                .as_array()
                .is_some_and(|m| {
                    m.iter()
                        .any(|m| m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount")
                })
        };
        assert!(
            !token_mounted("gateway"),
            "the gateway container has API credentials"
        );
        assert!(
            token_mounted("operator"),
            "the operator has no API credentials"
        );
    });

    phase("the agent's Lease watch", || {
        // What the agent actually sends to follow the gateway Lease: list and watch narrowed to it
        // by a field selector, which the API server authorizes as that name. Without the selector
        // the same request is refused; and the agent reads no Lease in other namespaces.
        let agent = "system:serviceaccount:fabric-system:fabric-agent";
        let lease_list = |ns: &str, selector: bool, watch: bool| {
            let mut args = vec!["get", "leases", "-n", ns, "--as", agent];
            if selector {
                args.extend(["--field-selector", "metadata.name=fabric-gateway"]);
            }
            if watch {
                args.extend(["--watch", "--request-timeout=1s"]);
            }
            let o = api.kubectl(&args);
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        };
        let (ok, err) = lease_list("fabric-system", true, false);
        assert!(ok, "the agent cannot list its Lease by name: {err}");
        let (_, err) = lease_list("fabric-system", true, true);
        assert!(
            !err.contains("forbidden"),
            "the agent cannot watch its Lease by name: {err}"
        );
        for (ns, selector, watch) in [
            ("fabric-system", false, false),
            ("fabric-system", false, true),
            ("kube-system", true, false),
        ] {
            let (ok, err) = lease_list(ns, selector, watch);
            assert!(
                !ok && err.contains("forbidden"),
                "the agent may list/watch Leases in {ns} (selector: {selector}, watch: {watch}): {err}"
            );
        }
    });

    phase("the virtual kubelets' client CA and Leases", || {
        // The client CA the VirtualNode controller lets virtual kubelets read is the API
        // server's, in kube-system, and no other ConfigMap there.
        // The virtual kubelets' node Leases, in kube-node-lease only (the denied tables above:
        // no other Lease, anywhere else); no listing of the real kubelets' Leases there.
        for verb in ["create", "get", "update", "patch", "delete"] {
            assert!(
                self::can_in(
                    &api,
                    "fabric-virtual-nodes",
                    verb,
                    "leases.coordination.k8s.io/vk-alpha",
                    "kube-node-lease"
                ),
                "the VirtualNode controller cannot {verb} a virtual kubelet's Lease"
            );
        }
        assert!(!self::can_in(
            &api,
            "fabric-virtual-nodes",
            "list",
            "leases.coordination.k8s.io",
            "kube-node-lease"
        ));
        let can_cm =
            |what: &str| self::can_in(&api, "fabric-virtual-nodes", "get", what, "kube-system");
        assert!(can_cm("configmaps/extension-apiserver-authentication"));
        assert!(!can_cm("configmaps/kubeadm-config"));
        assert!(!can_cm("configmaps"));
        // The authentication service verifies renewals against the same client CA.
        for (what, yes) in [
            ("configmaps/extension-apiserver-authentication", true),
            ("configmaps/kubeadm-config", false),
            ("configmaps", false),
        ] {
            assert_eq!(
                self::can_in(&api, "fabric-auth", "get", what, "kube-system"),
                yes,
                "fabric-auth get {what} in kube-system"
            );
        }
    });

    phase(
        "the authentication service is confined to tenant areas",
        || {
            let mut attacks = Attacks::default();
            // What a compromised authentication service (it faces the internet) does with its own
            // token. RBAC cannot narrow these by name prefix or content; the ValidatingAdmission-
            // Policies of deploy/base/auth.yaml do.
            let auth = token_of(&api, "fabric-auth");
            // What it makes for a consumer, it still makes.
            let beta = "beta";
            let tenant_ns = fabric_api::names::namespace::tenant(beta);
            for obj in [
                serde_json::to_value(fabric_auth::tenant::namespace(beta)).unwrap(),
                serde_json::to_value(fabric_auth::tenant::role(beta)).unwrap(),
                serde_json::to_value(fabric_auth::tenant::role_binding(
                    beta,
                    &fabric_api::names::user::peering(beta, "n1"),
                ))
                .unwrap(),
                serde_json::to_value(fabric_auth::tenant::sharing_binding(beta, NS)).unwrap(),
            ] {
                allowed(
                    &format!("creating a tenant's {}", obj["kind"]),
                    apply_with(&auth, &obj),
                );
            }
            // Relabelling a namespace that is not a tenant's (e.g. to lift its Pod Security).
            attacks.refused(
                "the authentication service relabelling kube-system",
                kubectl_with(
                    &auth,
                    &[
                        "label",
                        "namespace",
                        "kube-system",
                        "pod-security.kubernetes.io/enforce=privileged",
                    ],
                    None,
                ),
            );
            // The consumer's Role with more than a consumer gets (it may escalate that Role).
            let mut wide = serde_json::to_value(fabric_auth::tenant::role(beta)).unwrap();
            wide["metadata"]["namespace"] = tenant_ns.clone().into();
            wide["rules"] = serde_json::json!([{ "apiGroups": [""], "resources": ["secrets", "pods"],
                                             "verbs": ["get", "list", "create"] }]);
            attacks.refused(
                "the authentication service widening a tenant's Role",
                apply_with(&auth, &wide),
            );
            // The same Role, outside tenant namespaces.
            let mut elsewhere = serde_json::to_value(fabric_auth::tenant::role(beta)).unwrap();
            elsewhere["metadata"]["namespace"] = "default".into();
            attacks.refused(
                "the authentication service writing a Role in default",
                apply_with(&auth, &elsewhere),
            );
            // Pod writes for the sharing controllers outside tenant namespaces.
            let mut pods =
                serde_json::to_value(fabric_auth::tenant::sharing_binding(beta, NS)).unwrap();
            pods["metadata"]["namespace"] = "kube-system".into();
            attacks.refused(
                "the authentication service binding fabric-sharing-tenant in kube-system",
                apply_with(&auth, &pods),
            );
            // The consumer's Role bound to someone else.
            let peering = fabric_api::names::user::peering(beta, "n1");
            let mut other =
                serde_json::to_value(fabric_auth::tenant::role_binding(beta, &peering)).unwrap();
            other["metadata"]["name"] = "mallory".into();
            other["subjects"][0]["name"] = "mallory".into();
            attacks.refused(
                "the authentication service binding a tenant's Role to another user",
                apply_with(&auth, &other),
            );
            // ... or to another consumer's peering.
            let mut alpha =
                serde_json::to_value(fabric_auth::tenant::role_binding(beta, &peering)).unwrap();
            alpha["metadata"]["namespace"] = tenant_ns.clone().into();
            alpha["subjects"][0]["name"] = fabric_api::names::user::peering("alpha", "n1").into();
            attacks.refused(
                "the authentication service binding a tenant's Role to another consumer's peering",
                apply_with(&auth, &alpha),
            );
            // ... or re-pointing an existing tenant's binding to a new peering of the same id:
            // the approver signs whatever group the binding names, so this would hand the
            // consumer's pods, exec and tunnel to whoever holds the new peering's key.
            let takeover = serde_json::to_value(fabric_auth::tenant::role_binding(
                beta,
                &fabric_api::names::user::peering(beta, "mallory"),
            ))
            .unwrap();
            attacks.refused(
                "the authentication service re-pointing an existing tenant's RoleBinding",
                apply_with(&auth, &takeover),
            );
            // A client CSR someone else asked for (any subject but system:masters would be
            // signed): not the service's to approve.
            let csr = api.kubeconfig.with_file_name("mallory.csr");
            fabric_tests::sharing::client_csr(
                "mallory",
                "system:nodes",
                &api.kubeconfig.with_file_name("mallory.key"),
                &csr,
            )
            .unwrap();
            let csr = std::fs::read(&csr).unwrap();
            api.kubectl_stdin(
                &["create", "-f", "-"],
                &serde_json::json!({
                    "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                    "metadata": { "name": "fabric-consumer-mallory" },
                    "spec": { "request": base64::Engine::encode(
                                  &base64::engine::general_purpose::STANDARD, &csr),
                              "signerName": "kubernetes.io/kube-apiserver-client",
                              "usages": ["digital signature", "client auth"] },
                })
                .to_string(),
            );
            attacks.refused(
                "the authentication service approving a CSR it did not ask for",
                kubectl_with(
                    &auth,
                    &["certificate", "approve", "fabric-consumer-mallory"],
                    None,
                ),
            );
            // Another component's Secret in fabric-system (the webhook's keys), and any
            // Secret but its serving certificate there.
            api.kubectl_ok(&[
                "create",
                "secret",
                "generic",
                "fabric-shadowpod-webhook-tls",
                "-n",
                NS,
                "--from-literal=tls.key=secret",
            ]);
            attacks.refused(
                "the authentication service reading the ShadowPod webhook's Secret",
                kubectl_with(
                    &auth,
                    &["get", "secret", "fabric-shadowpod-webhook-tls", "-n", NS],
                    None,
                ),
            );
            attacks.refused(
                "the authentication service listing Secrets in fabric-system",
                kubectl_with(&auth, &["get", "secrets", "-n", NS], None),
            );
            attacks.refused(
                "the authentication service creating a Secret other than its certificate",
                kubectl_with(
                    &auth,
                    &[
                        "create",
                        "secret",
                        "generic",
                        "mallory",
                        "-n",
                        NS,
                        "--from-literal=a=b",
                    ],
                    None,
                ),
            );
            // The peering tokens, where only they live: listed by label, a one-time token's
            // use recorded on its Secret.
            let tokens = fabric_api::names::namespace::PEERING_TOKENS;
            for (verb, yes) in [
                ("list", true),
                ("get", true),
                ("update", true),
                ("create", false),
                ("delete", false),
            ] {
                assert_eq!(
                    self::can_in(&api, "fabric-auth", verb, "secrets", tokens),
                    yes,
                    "fabric-auth {verb} secrets in {tokens}"
                );
            }
            // A consumer's revocation (fabric-sharing) deletes the standing token and the
            // consumer's own; it writes no token.
            for (verb, yes) in [
                ("list", true),
                ("delete", true),
                ("create", false),
                ("update", false),
            ] {
                assert_eq!(
                    self::can_in(&api, "fabric-sharing", verb, "secrets", tokens),
                    yes,
                    "fabric-sharing {verb} secrets in {tokens}"
                );
            }
            // ... nor one it asked for itself, whatever its subject: approval is the
            // approver's (fabric-sharing), which reads the request.
            let nodes = api.kubeconfig.with_file_name("nodes.csr");
            fabric_tests::sharing::client_csr(
                "system:node:node0",
                "system:nodes",
                &api.kubeconfig.with_file_name("nodes.key"),
                &nodes,
            )
            .unwrap();
            let nodes = std::fs::read(&nodes).unwrap();
            allowed(
                "the authentication service creating a CSR",
                kubectl_with(
                    &auth,
                    &["create", "-f", "-"],
                    Some(
                        &serde_json::json!({
                            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                            "metadata": { "name": "fabric-consumer-nodes" },
                            "spec": { "request": base64::Engine::encode(
                                          &base64::engine::general_purpose::STANDARD, &nodes),
                                      "signerName": "kubernetes.io/kube-apiserver-client",
                                      "expirationSeconds": 3600,
                                      "usages": ["digital signature", "client auth"] },
                        })
                        .to_string(),
                    ),
                ),
            );
            attacks.refused(
                "the authentication service approving its own CSR for system:nodes",
                kubectl_with(
                    &auth,
                    &["certificate", "approve", "fabric-consumer-nodes"],
                    None,
                ),
            );
            // The approver approves only what the authentication service asked for.
            let approver = token_of(&api, "fabric-sharing");
            attacks.refused(
                "the approver approving a CSR another user made",
                kubectl_with(
                    &approver,
                    &["certificate", "approve", "fabric-consumer-mallory"],
                    None,
                ),
            );
            attacks.check();
        },
    );

    phase(
        "the sharing controllers read and write only their own Secrets",
        || {
            let mut attacks = Attacks::default();
            let sharing = token_of(&api, "fabric-sharing");
            let identities = fabric_api::names::namespace::IDENTITIES;
            let secret = |ns: &str, name: &str| {
                serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": name, "namespace": ns},
                    "stringData": {"k": "v"}})
            };
            // What the peering, renewals and unpeering do with an identity, in fabric-identities.
            let identity = "fabric-identity-beta";
            allowed(
                "the sharing controllers writing an identity",
                apply_with(&sharing, &secret(identities, identity)),
            );
            allowed(
                "the sharing controllers reading an identity",
                kubectl_with(
                    &sharing,
                    &["get", "secret", identity, "-n", identities],
                    None,
                ),
            );
            allowed(
                "the sharing controllers deleting an identity",
                kubectl_with(
                    &sharing,
                    &["delete", "secret", identity, "-n", identities],
                    None,
                ),
            );
            // Nothing but identities there.
            attacks.refused(
                "the sharing controllers planting a Secret of another name in fabric-identities",
                apply_with(&sharing, &secret(identities, "planted")),
            );
            // An identity-named Secret in fabric-system is not where identities live.
            attacks.refused(
                "the sharing controllers writing an identity in fabric-system",
                apply_with(&sharing, &secret(NS, identity)),
            );
            let _ = api.kubectl(&["delete", "secret", "fabric-gateway-key", "-n", NS]);
            allowed(
                "the sharing controllers creating the missing gateway key",
                kubectl_with(
                    &sharing,
                    &["create", "-f", "-"],
                    Some(&secret(NS, "fabric-gateway-key").to_string()),
                ),
            );
            allowed(
                "the sharing controllers reading the gateway key",
                kubectl_with(
                    &sharing,
                    &["get", "secret", "fabric-gateway-key", "-n", NS],
                    None,
                ),
            );
            // Anything else of fabric-system's: another component's keys are not theirs to read
            // (the authentication service's TLS key, the webhook's CA), nor listed.
            api.kubectl_ok(&[
                "create",
                "secret",
                "generic",
                "fabric-auth-tls",
                "-n",
                NS,
                "--from-literal=tls.key=theirs",
            ]);
            let _ = api.kubectl(&[
                "create",
                "secret",
                "generic",
                "fabric-shadowpod-webhook-tls",
                "-n",
                NS,
                "--from-literal=ca.key=theirs",
            ]);
            for name in ["fabric-auth-tls", "fabric-shadowpod-webhook-tls"] {
                attacks.refused(
                    &format!("the sharing controllers reading {name}"),
                    kubectl_with(&sharing, &["get", "secret", name, "-n", NS], None),
                );
            }
            attacks.refused(
                "the sharing controllers listing Secrets in fabric-system",
                kubectl_with(&sharing, &["get", "secrets", "-n", NS], None),
            );
            // Nor written: another component's certificate, the gateway key once there.
            for name in ["fabric-auth-tls", "fabric-gateway-key"] {
                attacks.refused(
                    &format!("the sharing controllers rewriting {name}"),
                    kubectl_with(
                        &sharing,
                        &[
                            "patch",
                            "secret",
                            name,
                            "-n",
                            NS,
                            "--type=merge",
                            "-p",
                            r#"{"stringData":{"tls.key":"ours"}}"#,
                        ],
                        None,
                    ),
                );
                attacks.refused(
                    &format!("the sharing controllers deleting {name}"),
                    kubectl_with(&sharing, &["delete", "secret", name, "-n", NS], None),
                );
            }
            attacks.refused(
                "the sharing controllers creating a Secret of another name",
                kubectl_with(
                    &sharing,
                    &["create", "-f", "-"],
                    Some(&secret(NS, "planted").to_string()),
                ),
            );
            attacks.check();
        },
    );

    phase(
        "the sharing controllers make twins and bind there only what a twin needs",
        || {
            use fabric_api::offloading::v1alpha1::NamespaceMapping;
            use fabric_negotiation::namespaces::twins;
            let mut attacks = Attacks::default();
            // With its own token: what the NamespaceMap controller makes, it makes; RBAC cannot
            // narrow namespaces' creation nor where it binds its two ClusterRoles, the
            // ValidatingAdmissionPolicies of deploy/base/sharing.yaml do.
            let sharing = token_of(&api, "fabric-sharing");
            let consumer = "beta";
            let m = NamespaceMapping {
                home: "shop".into(),
                remote: "shop-beta".into(),
                storage_retention: None,
            };
            let key = twins::map_key(&fabric_api::names::namespace::tenant(consumer), consumer);
            let twin = twins::namespace(consumer, &key, &m, Default::default());
            let group = fabric_api::names::user::peering(consumer, "n1");
            let subjects = fabric_auth::tenant::role_binding(consumer, &group)
                .subjects
                .unwrap();
            fn value<T: serde::Serialize>(o: &T) -> serde_json::Value {
                serde_json::to_value(o).unwrap()
            }
            // A twin is created (a POST: never an apply over a namespace of that name).
            let create = |obj: &serde_json::Value| {
                kubectl_with(&sharing, &["create", "-f", "-"], Some(&obj.to_string()))
            };
            allowed(
                "the sharing controllers creating a twin",
                create(&value(&twin)),
            );
            // (Before the consumer's binding exists: its roleRef cannot change after.)
            let mut own = value(&twins::sharing_binding(consumer, &m.remote, NS));
            own["metadata"]["name"] = "fabric-consumer".into();
            attacks.refused(
                "the sharing controllers binding fabric-sharing-tenant under the consumer's name",
                apply_with(&sharing, &own),
            );
            for obj in [
                value(&twins::consumer_binding(
                    consumer,
                    &m.remote,
                    subjects.clone(),
                )),
                value(&twins::sharing_binding(consumer, &m.remote, NS)),
            ] {
                allowed(
                    &format!("the sharing controllers making a twin's {}", obj["kind"]),
                    apply_with(&sharing, &obj),
                );
            }
            // A namespace that is no twin, or a name the provider keeps.
            let mut plain = value(&twin);
            plain["metadata"]["name"] = "plain".into();
            plain["metadata"]["labels"] = serde_json::json!({});
            attacks.refused(
                "the sharing controllers creating a namespace that is no twin",
                create(&plain),
            );
            let mut kube = value(&twin);
            kube["metadata"]["name"] = "kube-evil".into();
            attacks.refused(
                "the sharing controllers creating a kube-* twin",
                create(&kube),
            );
            // Relabelling a namespace to make it a twin (e.g. kube-system).
            attacks.refused(
                "the sharing controllers relabelling kube-system",
                kubectl_with(
                    &sharing,
                    &[
                        "label",
                        "namespace",
                        "kube-system",
                        "offloading.fabric.io/twin-namespace=true",
                    ],
                    None,
                ),
            );
            // Pods for itself outside twins and tenant namespaces.
            let mut pods = value(&twins::sharing_binding(consumer, &m.remote, NS));
            pods["metadata"]["namespace"] = "kube-system".into();
            attacks.refused(
                "the sharing controllers binding fabric-sharing-tenant in kube-system",
                apply_with(&sharing, &pods),
            );
            // The twin's rights to someone else: another consumer's group, a user, itself.
            for (kind, name) in [
                ("Group", fabric_api::names::user::peering("alpha", "n1")),
                ("User", "mallory".to_owned()),
            ] {
                let mut other = value(&twins::consumer_binding(
                    consumer,
                    &m.remote,
                    subjects.clone(),
                ));
                other["subjects"][0]["kind"] = kind.into();
                other["subjects"][0]["name"] = name.clone().into();
                attacks.refused(
                    &format!("the sharing controllers binding a twin's rights to {kind} {name}"),
                    apply_with(&sharing, &other),
                );
            }
            // Any other role, even in a twin.
            let mut admin = value(&twins::sharing_binding(consumer, &m.remote, NS));
            admin["metadata"]["name"] = "admin".into();
            admin["roleRef"]["name"] = "admin".into();
            attacks.refused(
                "the sharing controllers binding admin in a twin",
                apply_with(&sharing, &admin),
            );
            // EndpointSlices in a twin: the fabric's own only, never those of the provider's
            // endpoint controller (fabric-sharing-endpointslices).
            use fabric_api::names::endpoint_slice::{CONTROLLER, MANAGED_BY, REFLECTED};
            let slice = |name: &str, managed_by: &str| {
                serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": name, "namespace": &m.remote,
                                 "labels": {MANAGED_BY: managed_by}},
                    "addressType": "IPv4", "endpoints": [{"addresses": ["10.245.1.5"]}]})
            };
            allowed(
                "the sharing controllers writing their own EndpointSlice in a twin",
                apply_with(&sharing, &slice("ours", REFLECTED)),
            );
            attacks.refused(
                "the sharing controllers writing an endpoint controller's EndpointSlice",
                apply_with(&sharing, &slice("theirs", CONTROLLER)),
            );
            let o = api.kubectl_stdin(
                &["create", "-f", "-"],
                &slice("provider-own", CONTROLLER).to_string(),
            );
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            attacks.refused(
                "the sharing controllers taking over the provider's own EndpointSlice",
                kubectl_with(
                    &sharing,
                    &[
                        "label",
                        "--overwrite",
                        "endpointslice",
                        "provider-own",
                        "-n",
                        &m.remote,
                        &format!("{MANAGED_BY}={REFLECTED}"),
                    ],
                    None,
                ),
            );
            attacks.refused(
                "the sharing controllers deleting the provider's own EndpointSlice",
                kubectl_with(
                    &sharing,
                    &["delete", "endpointslice", "provider-own", "-n", &m.remote],
                    None,
                ),
            );
            // NetworkPolicies in a twin likewise: the fabric's own only, never the provider's
            // admin's (fabric-sharing-networkpolicies).
            {
                use fabric_api::names::network_policy::{MANAGED_BY, REFLECTED};
                let policy = |name: &str, labels: serde_json::Value| {
                    serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": name, "namespace": &m.remote, "labels": labels},
                        "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}})
                };
                allowed(
                    "the sharing controllers writing their own NetworkPolicy in a twin",
                    apply_with(
                        &sharing,
                        &policy("ours", serde_json::json!({MANAGED_BY: REFLECTED})),
                    ),
                );
                attacks.refused(
                    "the sharing controllers writing a NetworkPolicy that is not theirs",
                    apply_with(
                        &sharing,
                        &policy("theirs", serde_json::json!({"owner": "admin"})),
                    ),
                );
                let o = api.kubectl_stdin(
                    &["create", "-f", "-"],
                    &policy("admin-own", serde_json::json!({"owner": "admin"})).to_string(),
                );
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                attacks.refused(
                    "the sharing controllers taking over the provider's admin's NetworkPolicy",
                    kubectl_with(
                        &sharing,
                        &[
                            "label",
                            "--overwrite",
                            "networkpolicy",
                            "admin-own",
                            "-n",
                            &m.remote,
                            &format!("{MANAGED_BY}={REFLECTED}"),
                        ],
                        None,
                    ),
                );
                attacks.refused(
                    "the sharing controllers deleting the provider's admin's NetworkPolicy",
                    kubectl_with(
                        &sharing,
                        &["delete", "networkpolicy", "admin-own", "-n", &m.remote],
                        None,
                    ),
                );
            }
            // Claims (a retained claim its consumer forgot): only the fabric's for the twin's
            // consumer, only in twins (fabric-sharing-twin-claims).
            use fabric_api::names::label::{REFLECTED_FROM, REFLECTED_TO};
            let pvc = |ns: &str, name: &str, labels: serde_json::Value| {
                let obj = serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": name, "namespace": ns, "labels": labels},
                    "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}});
                let o = api.kubectl_stdin(&["create", "-f", "-"], &obj.to_string());
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            };
            let ours = serde_json::json!({REFLECTED_FROM: consumer, REFLECTED_TO: "provider"});
            pvc(&m.remote, "retained", ours.clone());
            pvc(&m.remote, "admins", serde_json::json!({"owner": "admin"}));
            pvc(
                &m.remote,
                "alphas",
                serde_json::json!({REFLECTED_FROM: "alpha", REFLECTED_TO: "provider"}),
            );
            pvc(NS, "outside", ours.clone());
            pvc("default", "outside", ours);
            let delete_pvc = |ns: &str, name: &str| {
                kubectl_with(
                    &sharing,
                    &["delete", "pvc", name, "-n", ns, "--wait=false"],
                    None,
                )
            };
            attacks.refused(
                "the sharing controllers deleting the admin's claim in a twin",
                delete_pvc(&m.remote, "admins"),
            );
            attacks.refused(
                "the sharing controllers deleting another consumer's claim in a twin",
                delete_pvc(&m.remote, "alphas"),
            );
            attacks.refused(
                "the sharing controllers deleting a marked claim in fabric-system",
                delete_pvc(NS, "outside"),
            );
            attacks.refused(
                "the sharing controllers deleting a marked claim in default",
                delete_pvc("default", "outside"),
            );
            allowed(
                "the sharing controllers deleting a retained claim of the twin's consumer",
                delete_pvc(&m.remote, "retained"),
            );
            attacks.check();
        },
    );

    phase("a virtual kubelet writes only its own node's pods", || {
        let mut attacks = Attacks::default();
        // A virtual kubelet as the VirtualNode controller sets it up (its ServiceAccount and
        // ClusterRole: pod status cluster-wide, as RBAC cannot narrow it to a node), with
        // its own token: the pods of another node are out of its reach (deploy/'s
        // ValidatingAdmissionPolicy checks spec.nodeName against the Node it may write).
        use fabric_api::offloading::v1alpha1::{VirtualNode, VirtualNodeSpec};
        use fabric_offloading::virtual_node::objects;
        let mut vn = VirtualNode::new(
            "prov",
            VirtualNodeSpec {
                cluster_id: "prov".into(),
                node_name: "fabric-prov".into(),
                identity: "prov".into(),
                resources: Default::default(),
                labels: Default::default(),
                at_most_once: None,
                storage: None,
            },
        );
        vn.metadata.namespace = Some(NS.into());
        for obj in [
            serde_json::to_value(objects::service_account(&vn)).unwrap(),
            serde_json::to_value(objects::cluster_role(&vn)).unwrap(),
            serde_json::to_value(objects::cluster_role_binding(&vn)).unwrap(),
        ] {
            let o = api.kubectl_stdin(&["create", "-f", "-"], &obj.to_string());
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        for (pod, node) in [("offloaded", "fabric-prov"), ("local", "node0")] {
            let obj = serde_json::json!({ "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": pod, "namespace": "default" },
                "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "i" }] } });
            let o = api.kubectl_stdin(&["create", "-f", "-"], &obj.to_string());
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        let vk = api.kubeconfig.with_file_name("vk.kubeconfig");
        fabric_tests::rights::token_kubeconfig(
            &api.kubeconfig,
            &api.kubeconfig,
            NS,
            &objects::name(&vn),
            &vk,
        )
        .unwrap();
        let status = |pod: &str| {
            kubectl_with(
                &vk,
                &[
                    "patch",
                    "pod",
                    pod,
                    "-n",
                    "default",
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    r#"{"status":{"phase":"Failed","reason":"Evicted"}}"#,
                ],
                None,
            )
        };
        allowed("a virtual kubelet reporting its pod", status("offloaded"));
        attacks.refused(
            "a virtual kubelet failing a pod of another node",
            status("local"),
        );
        // Deleting is policed the same way (RBAC grants pods delete cluster-wide).
        let delete = |pod: &str| {
            kubectl_with(
                &vk,
                &["delete", "pod", pod, "-n", "default", "--wait=false"],
                None,
            )
        };
        attacks.refused(
            "a virtual kubelet deleting a pod of another node",
            delete("local"),
        );
        allowed(
            "a virtual kubelet deleting its own node's pod",
            delete("offloaded"),
        );
        // The VirtualNode controller drains virtual nodes only.
        let obj = serde_json::json!({ "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "local-too", "namespace": "default" },
            "spec": { "nodeName": "node0", "containers": [{ "name": "c", "image": "i" }] } });
        let o = api.kubectl_stdin(&["create", "-f", "-"], &obj.to_string());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let vnodes = token_of(&api, "fabric-virtual-nodes");
        attacks.refused(
            "the VirtualNode controller deleting a pod of a real node",
            kubectl_with(
                &vnodes,
                &[
                    "delete",
                    "pod",
                    "local-too",
                    "-n",
                    "default",
                    "--wait=false",
                ],
                None,
            ),
        );
        attacks.check();
    });

    phase(
        "the VirtualNode controller writes only its virtual kubelets' RBAC",
        || {
            let mut attacks = Attacks::default();
            // With its own token: another component's binding or ServiceAccount is not its to
            // change, even where RBAC lets it (it holds what fabric-gateway's ClusterRole grants).
            let vnodes = token_of(&api, "fabric-virtual-nodes");
            attacks.refused(
                "the VirtualNode controller deleting fabric-controller's ClusterRoleBinding",
                kubectl_with(
                    &vnodes,
                    &["delete", "clusterrolebinding", "fabric-controller"],
                    None,
                ),
            );
            attacks.refused(
            "the VirtualNode controller adding a subject to fabric-gateway's ClusterRoleBinding",
            kubectl_with(
                &vnodes,
                &["patch", "clusterrolebinding", "fabric-gateway", "--type=json", "-p",
                  r#"[{"op":"add","path":"/subjects/-","value":{"kind":"User","apiGroup":"rbac.authorization.k8s.io","name":"mallory"}}]"#],
                None,
            ),
        );
            // The admin's custom kinds (ClusterRole fabric-virtual-kubelet-reflection, which
            // it may bind): to a virtual kubelet's own ServiceAccount only, as
            // fabric-vk-NODE-reflection.
            attacks.refused(
                "the VirtualNode controller binding fabric-virtual-kubelet-reflection to another ServiceAccount",
                kubectl_with(
                    &vnodes,
                    &["create", "clusterrolebinding", "fabric-vk-n1-reflection",
                      "--clusterrole=fabric-virtual-kubelet-reflection",
                      "--serviceaccount=fabric-system:mallory"],
                    None,
                ),
            );
            attacks.refused(
                "the VirtualNode controller binding fabric-virtual-kubelet-reflection to a user",
                kubectl_with(
                    &vnodes,
                    &[
                        "create",
                        "clusterrolebinding",
                        "fabric-vk-n1-reflection",
                        "--clusterrole=fabric-virtual-kubelet-reflection",
                        "--user=mallory",
                    ],
                    None,
                ),
            );
            allowed(
                "the VirtualNode controller binding fabric-virtual-kubelet-reflection to a virtual kubelet",
                kubectl_with(
                    &vnodes,
                    &[
                        "create",
                        "clusterrolebinding",
                        "fabric-vk-n2-reflection",
                        "--clusterrole=fabric-virtual-kubelet-reflection",
                        "--serviceaccount=fabric-system:fabric-vk-n2",
                    ],
                    None,
                ),
            );
            allowed(
                "the VirtualNode controller deleting a virtual kubelet's reflection binding",
                kubectl_with(
                    &vnodes,
                    &["delete", "clusterrolebinding", "fabric-vk-n2-reflection"],
                    None,
                ),
            );
            attacks.refused(
                "the VirtualNode controller creating a ServiceAccount in kube-system",
                kubectl_with(
                    &vnodes,
                    &["create", "serviceaccount", "mallory", "-n", "kube-system"],
                    None,
                ),
            );
            // Namespaced deletions of what is not its virtual kubelets', and Nodes that are
            // not virtual nodes.
            api.kubectl_ok(&["create", "serviceaccount", "bystander", "-n", NS]);
            api.kubectl_ok(&[
                "create",
                "rolebinding",
                "bystander",
                "-n",
                NS,
                "--clusterrole=view",
                "--serviceaccount",
                &format!("{NS}:bystander"),
            ]);
            api.kubectl_ok(&[
                "create",
                "role",
                "bystander",
                "-n",
                NS,
                "--verb=get",
                "--resource=pods",
            ]);
            for (kind, name) in [
                ("rolebinding", "bystander"),
                ("role", "bystander"),
                ("serviceaccount", "bystander"),
            ] {
                attacks.refused(
                    &format!("the VirtualNode controller deleting {kind} {name} in {NS}"),
                    kubectl_with(&vnodes, &["delete", kind, name, "-n", NS], None),
                );
            }
            api.kubectl_stdin(
                &["create", "-f", "-"],
                &serde_json::json!({"apiVersion": "v1", "kind": "Node",
                                    "metadata": {"name": "node0"}})
                .to_string(),
            );
            attacks.refused(
                "the VirtualNode controller deleting a real Node",
                kubectl_with(&vnodes, &["delete", "node", "node0"], None),
            );
            attacks.check();
        },
    );

    phase(
        "the admins' choices of custom kinds survive re-applying the manifests",
        || {
            // The admin chooses the kinds tenants may write in their twins by creating the
            // ClusterRole the twins bind; an upgrade (`kubectl apply -k deploy/` again) must not
            // take that choice back.
            let role = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole", "metadata": {"name": "fabric-consumer-reflection"},
                "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"],
                           "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]});
            // The same for the consumer's admin's grant to its virtual kubelets.
            let vk_role = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole", "metadata": {"name": "fabric-virtual-kubelet-reflection"},
                "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"],
                           "verbs": ["get", "list", "watch"]}]});
            for r in [&role, &vk_role] {
                let o = api.kubectl_stdin(&["apply", "-f", "-"], &r.to_string());
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            }
            api.kubectl_ok(&["apply", "-k", deploy]);
            for name in [
                "fabric-consumer-reflection",
                "fabric-virtual-kubelet-reflection",
            ] {
                let rules = api.kubectl_ok(&[
                    "get",
                    "clusterrole",
                    name,
                    "-o",
                    "jsonpath={.rules[*].resources}",
                ]);
                assert_eq!(
                    rules.trim(),
                    r#"["widgets"]"#,
                    "the admin's kinds in {name} after re-applying deploy/"
                );
            }
        },
    );

    phase("removed with kubectl delete -k", || {
        // Removal: nothing the manifests create carries a finalizer, so every deletion
        // `kubectl delete -k` asks for completes. kubectl would wait for each in turn at its
        // client-side rate limit (about 25 s for this many objects, none of it ours): it is
        // told not to, and the test waits for what matters, everything gone. The finalizers
        // of the sharing layer's objects are released by the controllers this removes: peers
        // are unpeered first (README, "Removing the fabric").
        let t0 = std::time::Instant::now();
        // (Deleting the namespace takes its objects along: the later deletes of them find none.)
        let o = api.kubectl(&["delete", "-k", deploy, "--wait=false", "--ignore-not-found"]);
        assert!(
            o.status.success(),
            "kubectl delete -k deploy/ failed after {:?}: {}",
            t0.elapsed(),
            String::from_utf8_lossy(&o.stderr)
        );
        // What it deleted, as it says (`namespace "fabric-system" deleted`): the namespaces,
        // whose content goes with them, and the CRDs, whose objects go with them, are what
        // can take time, and what a hanging finalizer would keep.
        let said = String::from_utf8_lossy(&o.stdout);
        let deleted: Vec<(&str, &str)> = said
            .lines()
            .filter_map(|l| {
                let (kind, rest) = l.split_once(" \"")?;
                let (name, _) = rest.split_once('"')?;
                Some((kind, name))
            })
            .filter(|(kind, _)| {
                *kind == "namespace" || *kind == "customresourcedefinition.apiextensions.k8s.io"
            })
            .collect();
        assert!(
            deleted.iter().any(|(k, _)| *k == "namespace")
                && deleted
                    .iter()
                    .any(|(k, n)| k.starts_with("customresourcedefinition")
                        && n.ends_with("fabric.io")),
            "kubectl delete -k deploy/ named no namespace or CRD of ours: {said}"
        );
        fabric_tests::wait::until(
            "everything kubectl delete -k deleted gone",
            std::time::Duration::from_secs(60),
            || {
                deleted.iter().all(|(kind, name)| {
                    let kind = kind.split('.').next().unwrap_or(kind);
                    api.get_json(kind, None, name).is_none()
                })
            },
        );
    });
}
