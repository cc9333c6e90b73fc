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
