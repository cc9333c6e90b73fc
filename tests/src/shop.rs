//! The application the demo and the end-to-end test offload as a user would: namespace
//! [`NAMESPACE`] with a web tier ([`web`], an echo pod that prints its configuration) reading a
//! ConfigMap and a Secret ([`config`]), and a database ([`db`]) that was running at home
//! before the namespace was offloaded, each behind a Service ([`service`]).
use serde_json::{Value, json};

use crate::workloads::{self, ECHO_PORT, echo_pod};

pub const NAMESPACE: &str = "shop";
/// What the web pod's GREETING says (from ConfigMap `settings`).
pub const GREETING: &str = "hello from shop";
/// What its PASSWORD says (from Secret `db`).
pub const PASSWORD: &str = "s3cret";

/// ConfigMap `settings` and Secret `db`, which the web pod reads, and ConfigMap `unused`,
/// which no pod references (so it stays home).
pub fn config() -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": NAMESPACE},
         "data": {"greeting": GREETING}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unused", "namespace": NAMESPACE},
         "data": {"x": "y"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": NAMESPACE},
         "stringData": {"password": PASSWORD}},
    ]})
}

/// An echo pod `web` (label `app: web`) with GREETING and PASSWORD in its environment from
/// [`config`], which it prints when it starts. Nothing about placement: in an offloaded
/// namespace the pod webhook adds it.
pub fn web() -> Value {
    let mut pod = echo_pod("web");
    pod["metadata"]["namespace"] = json!(NAMESPACE);
    let cmd = pod["spec"]["containers"][0]["command"]
        .as_array_mut()
        .expect("echo_pod has a command");
    cmd.extend([
        json!("--print-env"),
        json!("GREETING"),
        json!("--print-env"),
        json!("PASSWORD"),
    ]);
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
    ]);
    pod
}

/// The ServiceAccount [`web_calling_home`] runs as (the test API server makes no `default`).
pub const WEB_ACCOUNT: &str = "web";

/// [`web`] with a second container, `api`, that lists [`NAMESPACE`]'s ConfigMaps from the
/// home API server every second as an in-cluster client does, as ServiceAccount
/// [`WEB_ACCOUNT`], with the volume admission gives a pod (its token, the root CA, its
/// namespace): offloaded, the token is requested at home, bound to the home pod and delivered
/// into the twin. Its log says `status 403` until a RoleBinding allows it, then `status 200`.
pub fn web_calling_home() -> Value {
    let mut pod = web();
    pod["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/default-container": "app"});
    pod["spec"]["serviceAccountName"] = json!(WEB_ACCOUNT);
    pod["spec"]["containers"]
        .as_array_mut()
        .expect("web has containers")
        .push(json!({
            "name": "api", "image": "fabric-test-pod",
            "command": ["fabric-test-pod", "api",
                        format!("/api/v1/namespaces/{NAMESPACE}/configmaps"),
                        "--every", "1"],
            "volumeMounts": [{"name": "kube-api-access", "readOnly": true,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        }));
    pod["spec"]["volumes"] = json!([{"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt",
                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}]);
    pod
}

/// An echo pod `db` (label `app: db`).
pub fn db() -> Value {
    let mut pod = echo_pod("db");
    pod["metadata"]["namespace"] = json!(NAMESPACE);
    pod
}

/// A ClusterIP Service `name` in [`NAMESPACE`] selecting `app: name` on [`ECHO_PORT`].
pub fn service(name: &str) -> Value {
    workloads::service(name, NAMESPACE, &[("app", name)], ECHO_PORT)
}
