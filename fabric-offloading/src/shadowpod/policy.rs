//! What the provider lets a consumer's pod do on its nodes, as a pure function of the pod's
//! spec: the provider's own guard, run by its ShadowPod webhook on every change of a
//! ShadowPod's pod and again by its controller before it makes the real pod (the consumer's
//! [`super::forge`] check is early feedback at home, never the guard).
//!
//! [`Level::Baseline`] is the Pod Security Standards *baseline* profile, field by field as
//! upstream's `k8s.io/pod-security-admission` checks it (host namespaces, privileged,
//! capabilities, hostPath, hostPort, AppArmor, SELinux, `/proc` mount, seccomp, sysctls,
//! Windows hostProcess), narrowed where a tenant's pod must not reach the provider itself:
//! volumes only of the types on [`VOLUME_TYPES`] (no `serviceAccountToken` projection: the
//! provider issues no tokens to tenants; a `persistentVolumeClaim` only by a plain claim name,
//! which Kubernetes resolves in the pod's own namespace, the tenant's twin or tenant
//! namespace: what the claims there may bind is the tenant's own, policed where they are
//! written, `fabric-consumer-twin-claims`), and no scheduling of its own (`nodeName` and a
//! service account other than `default` are refused; node selectors, affinity, tolerations,
//! priority, runtime class and scheduler only as the admin's [`Placement`] allows;
//! `automountServiceAccountToken` is not refused but forced to false on the real pod,
//! [`super::decide::real_pod`]). A refusal names the field (its path in the pod) and the
//! rule.
use std::{collections::BTreeMap, fmt};

use k8s_openapi::api::core::v1::{ContainerPort, PodSpec, SecurityContext, Volume};

mod placement;
pub use placement::{DEFAULT_SCHEDULER, DEFAULT_TOLERATIONS, Placement, parse_toleration};

/// How much a provider lets tenants' pods do ([`PodSecurity`] of the Tenant API).
pub use fabric_api::authentication::v1alpha1::PodSecurity as Level;

/// The capabilities baseline lets a container add (upstream's `capabilities_allowed_1_0`).
pub const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The namespaced sysctls baseline allows (upstream's safe list, up to Kubernetes 1.32).
pub const SAFE_SYSCTLS: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The SELinux types baseline allows besides none.
pub const SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The volume types a tenant's pod may use; `projected` only of [`PROJECTED_SOURCES`].
pub const VOLUME_TYPES: [&str; 6] = [
    "configMap",
    "secret",
    "downwardAPI",
    "emptyDir",
    "projected",
    "persistentVolumeClaim",
];

/// What a projected volume may gather.
pub const PROJECTED_SOURCES: [&str; 3] = ["configMap", "secret", "downwardAPI"];

/// The rule a field breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    HostNamespace,
    Privileged,
    Capability(String),
    HostPath,
    HostPort(i32),
    AppArmor(String),
    SeLinuxType(String),
    SeLinuxUserRole,
    ProcMount(String),
    Seccomp,
    Sysctl(String),
    HostProcess,
    VolumeType(String),
    Projection(String),
    ClaimName(String),
    NodeName,
    Priority,
    RuntimeClass,
    Scheduler,
    NodeSelector,
    OtherNamespaces,
    Toleration,
    ServiceAccount,
    PrivilegeEscalation,
    RunAsRoot,
    SeccompRequired,
    DropAll,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::HostNamespace => f.write_str("sharing the host's namespaces is not allowed"),
            Rule::Privileged => f.write_str("privileged containers are not allowed"),
            Rule::Capability(c) => write!(
                f,
                "capability {c:?} is not allowed (only {})",
                BASELINE_CAPABILITIES.join(", ")
            ),
            Rule::HostPath => f.write_str("hostPath volumes are not allowed"),
            Rule::HostPort(p) => write!(f, "host port {p} is not allowed"),
            Rule::AppArmor(t) => write!(f, "AppArmor profile {t:?} is not allowed"),
            Rule::SeLinuxType(t) => write!(
                f,
                "SELinux type {t:?} is not allowed (only {})",
                SELINUX_TYPES.join(", ")
            ),
            Rule::SeLinuxUserRole => f.write_str("setting an SELinux user or role is not allowed"),
            Rule::ProcMount(m) => write!(f, "procMount {m:?} is not allowed (only Default)"),
            Rule::Seccomp => f.write_str("seccomp profile Unconfined is not allowed"),
            Rule::Sysctl(s) => write!(f, "sysctl {s:?} is not on the safe list"),
            Rule::HostProcess => f.write_str("Windows host processes are not allowed"),
            Rule::VolumeType(t) => write!(
                f,
                "{t} volumes are not allowed (only {})",
                VOLUME_TYPES.join(", ")
            ),
            Rule::ClaimName(n) => write!(
                f,
                "claim {n:?} is not a claim name of the pod's own namespace (a DNS subdomain)"
            ),
            Rule::Projection(t) => write!(
                f,
                "projected {t} sources are not allowed (only {})",
                PROJECTED_SOURCES.join(", ")
            ),
            Rule::NodeName => f.write_str("the provider's scheduler places tenants' pods"),
            Rule::Priority => f.write_str("the provider sets the priority of tenants' pods"),
            Rule::RuntimeClass => f.write_str("this runtime class is not lent to tenants"),
            Rule::Scheduler => f.write_str("the provider's default scheduler places tenants' pods"),
            Rule::NodeSelector => f.write_str("the provider chooses the nodes of tenants' pods"),
            Rule::OtherNamespaces => {
                f.write_str("terms may only match pods of the pod's own namespace")
            }
            Rule::Toleration => {
                f.write_str("the provider chooses which taints tenants' pods tolerate")
            }
            Rule::ServiceAccount => {
                f.write_str("the provider gives tenants' pods no service account")
            }
            Rule::PrivilegeEscalation => f.write_str("must be false"),
            Rule::RunAsRoot => f.write_str("containers must run as a non-root user"),
            Rule::SeccompRequired => {
                f.write_str("must be RuntimeDefault or Localhost (here or on the pod)")
            }
            Rule::DropAll => f.write_str("must drop ALL"),
        }
    }
}

/// Why the provider does not run a pod: the field (its path in the pod template, as under a
/// ShadowPod's `spec.pod`: `spec.containers[0].securityContext.privileged`,
/// `annotations[…]`) and the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {rule} (provider policy {level})")]
pub struct Refusal {
    pub field: String,
    pub rule: Rule,
    pub level: Level,
}

/// What the provider admin sets for tenants' pods: how much they may do, where they run,
/// what a container that asks for nothing is given (and charged).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    pub level: Level,
    pub placement: Placement,
    /// The requests of a container that names none of a resource
    /// ([`fabric_api::requests::with_defaults`]): on the real pod, and in what the webhook
    /// charges. None by default here; the controller's flags give cpu and memory.
    pub default_requests: fabric_api::requests::Defaults,
}

impl Rules {
    /// These rules with the level a tenant was given, if any.
    pub fn for_tenant(&self, level: Option<Level>) -> Rules {
        Rules {
            level: level.unwrap_or(self.level),
            ..self.clone()
        }
    }
}

impl From<Level> for Rules {
    fn from(level: Level) -> Self {
        Rules {
            level,
            ..Rules::default()
        }
    }
}

/// The first field of `spec` that `rules` do not allow, if any.
pub fn check(spec: &PodSpec, rules: &Rules) -> Result<(), Refusal> {
    let level = rules.level;
    let refuse = |field: String, rule: Rule| Refusal { field, rule, level };
    let at = |field: &str, rule: Rule| refuse(format!("spec.{field}"), rule);
    let on = |flag: Option<bool>| flag == Some(true);
    // Scheduling and identity: the provider's.
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Err(at("nodeName", Rule::NodeName));
    }
    if let Some((field, rule)) = rules.placement.check(spec) {
        return Err(at(&field, rule));
    }
    let named = |n: Option<&str>| n.is_some_and(|n| !n.is_empty() && n != "default");
    if named(spec.service_account_name.as_deref()) {
        return Err(at("serviceAccountName", Rule::ServiceAccount));
    }
    #[allow(deprecated)]
    if named(spec.service_account.as_deref()) {
        return Err(at("serviceAccount", Rule::ServiceAccount));
    }

    // Host namespaces.
    for (field, flag) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if on(flag) {
            return Err(at(field, Rule::HostNamespace));
        }
    }

    // The pod's security context.
    if let Some(sc) = &spec.security_context {
        let field = |f: &str| format!("securityContext.{f}");
        if on(sc.windows_options.as_ref().and_then(|w| w.host_process)) {
            return Err(at(&field("windowsOptions.hostProcess"), Rule::HostProcess));
        }
        if let Some(t) = sc.app_armor_profile.as_ref().map(|p| &p.type_)
            && !apparmor_allowed(t)
        {
            return Err(at(
                &field("appArmorProfile.type"),
                Rule::AppArmor(t.clone()),
            ));
        }
        if let Some(r) = selinux(sc.se_linux_options.as_ref()) {
            return Err(at(&field(&r.0), r.1));
        }
        if sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()) == Some("Unconfined") {
            return Err(at(&field("seccompProfile.type"), Rule::Seccomp));
        }
        for (i, s) in sc.sysctls.iter().flatten().enumerate() {
            if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
                return Err(at(
                    &field(&format!("sysctls[{i}].name")),
                    Rule::Sysctl(s.name.clone()),
                ));
            }
        }
    }

    // Every container, of each kind.
    let all = containers(spec);
    for c in &all {
        if let Some((f, rule)) = container(c.security, c.ports) {
            return Err(at(&format!("{}.{f}", c.path), rule));
        }
    }

    // Volumes.
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if let Some((f, rule)) = volume(v) {
            return Err(at(&format!("volumes[{i}]{f}"), rule));
        }
    }
    if level == Level::Restricted
        && let Some((f, rule)) = restricted(spec, &all)
    {
        return Err(at(&f, rule));
    }
    Ok(())
}

/// A container of any kind, as the policy sees it.
struct Seen<'a> {
    /// Its path under `spec`: `containers[0]`, `initContainers[1]`, `ephemeralContainers[0]`.
    path: String,
    security: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
}

fn containers(spec: &PodSpec) -> Vec<Seen<'_>> {
    fn seen<'a>(
        kind: &str,
        i: usize,
        security: Option<&'a SecurityContext>,
        ports: Option<&'a Vec<ContainerPort>>,
    ) -> Seen<'a> {
        Seen {
            path: format!("{kind}[{i}]"),
            security,
            ports: ports.map(Vec::as_slice).unwrap_or_default(),
        }
    }
    let main = spec.containers.iter().enumerate().map(|(i, c)| {
        seen(
            "containers",
            i,
            c.security_context.as_ref(),
            c.ports.as_ref(),
        )
    });
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            seen(
                "initContainers",
                i,
                c.security_context.as_ref(),
                c.ports.as_ref(),
            )
        });
    let ephemeral = spec.ephemeral_containers.iter().flatten().enumerate();
    let ephemeral = ephemeral.map(|(i, c)| {
        seen(
            "ephemeralContainers",
            i,
            c.security_context.as_ref(),
            c.ports.as_ref(),
        )
    });
    main.chain(init).chain(ephemeral).collect()
}

/// What `restricted` adds to baseline (upstream's restricted checks): no privilege
/// escalation, non-root, a seccomp profile, every capability dropped but NET_BIND_SERVICE.
fn restricted(spec: &PodSpec, all: &[Seen<'_>]) -> Option<(String, Rule)> {
    let pod = spec.security_context.as_ref();
    let pod_non_root = pod.and_then(|p| p.run_as_non_root);
    if pod_non_root == Some(false) {
        return Some(("securityContext.runAsNonRoot".into(), Rule::RunAsRoot));
    }
    if pod.and_then(|p| p.run_as_user) == Some(0) {
        return Some(("securityContext.runAsUser".into(), Rule::RunAsRoot));
    }
    let pod_seccomp = pod
        .and_then(|p| p.seccomp_profile.as_ref())
        .is_some_and(|p| seccomp_confined(&p.type_));
    for c in all {
        let sc = c.security;
        let field = |f: &str| format!("{}.securityContext.{f}", c.path);
        if sc.and_then(|s| s.allow_privilege_escalation) != Some(false) {
            return Some((field("allowPrivilegeEscalation"), Rule::PrivilegeEscalation));
        }
        match sc.and_then(|s| s.run_as_non_root) {
            Some(false) => return Some((field("runAsNonRoot"), Rule::RunAsRoot)),
            None if pod_non_root != Some(true) => {
                return Some((field("runAsNonRoot"), Rule::RunAsRoot));
            }
            _ => {}
        }
        if sc.and_then(|s| s.run_as_user) == Some(0) {
            return Some((field("runAsUser"), Rule::RunAsRoot));
        }
        let own_seccomp = sc.and_then(|s| s.seccomp_profile.as_ref());
        if !pod_seccomp && !own_seccomp.is_some_and(|p| seccomp_confined(&p.type_)) {
            return Some((field("seccompProfile.type"), Rule::SeccompRequired));
        }
        let caps = sc.and_then(|s| s.capabilities.as_ref());
        if !caps
            .and_then(|c| c.drop.as_ref())
            .is_some_and(|d| d.iter().any(|d| d == "ALL"))
        {
            return Some((field("capabilities.drop"), Rule::DropAll));
        }
        for (k, add) in caps.iter().flat_map(|c| c.add.iter().flatten()).enumerate() {
            if add != "NET_BIND_SERVICE" {
                return Some((
                    field(&format!("capabilities.add[{k}]")),
                    Rule::Capability(add.clone()),
                ));
            }
        }
    }
    None
}

fn seccomp_confined(t: &str) -> bool {
    matches!(t, "RuntimeDefault" | "Localhost")
}

/// The annotations' prefix of a container's AppArmor profile (the field's older form, still
/// applied by the API server and the kubelet).
pub const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The first of a pod's annotations that `level` does not allow, if any: an AppArmor profile
/// other than `runtime/default` or `localhost/*`.
pub fn check_annotations(
    annotations: &BTreeMap<String, String>,
    level: Level,
) -> Result<(), Refusal> {
    for (k, v) in annotations {
        if k.starts_with(APPARMOR_ANNOTATION)
            && !(v.is_empty() || v == "runtime/default" || v.starts_with("localhost/"))
        {
            return Err(Refusal {
                field: format!("annotations[{k}]"),
                rule: Rule::AppArmor(v.clone()),
                level,
            });
        }
    }
    Ok(())
}

fn apparmor_allowed(t: &str) -> bool {
    matches!(t, "RuntimeDefault" | "Localhost")
}

/// What an SELinux option breaks: its field below the security context, and the rule.
fn selinux(o: Option<&k8s_openapi::api::core::v1::SELinuxOptions>) -> Option<(String, Rule)> {
    let o = o?;
    if let Some(t) = o.type_.as_deref()
        && !t.is_empty()
        && !SELINUX_TYPES.contains(&t)
    {
        return Some((
            "seLinuxOptions.type".into(),
            Rule::SeLinuxType(t.to_owned()),
        ));
    }
    for (f, v) in [("user", &o.user), ("role", &o.role)] {
        if v.as_deref().is_some_and(|v| !v.is_empty()) {
            return Some((format!("seLinuxOptions.{f}"), Rule::SeLinuxUserRole));
        }
    }
    None
}

/// What a container breaks: its field below the container, and the rule.
fn container(sc: Option<&SecurityContext>, ports: &[ContainerPort]) -> Option<(String, Rule)> {
    for (j, p) in ports.iter().enumerate() {
        if let Some(h) = p.host_port.filter(|h| *h != 0) {
            return Some((format!("ports[{j}].hostPort"), Rule::HostPort(h)));
        }
    }
    let sc = sc?;
    let field = |f: &str| format!("securityContext.{f}");
    if sc.privileged == Some(true) {
        return Some((field("privileged"), Rule::Privileged));
    }
    if sc.windows_options.as_ref().and_then(|w| w.host_process) == Some(true) {
        return Some((field("windowsOptions.hostProcess"), Rule::HostProcess));
    }
    for (k, c) in sc
        .capabilities
        .iter()
        .flat_map(|c| c.add.iter().flatten())
        .enumerate()
    {
        if !BASELINE_CAPABILITIES.contains(&c.as_str()) {
            return Some((
                field(&format!("capabilities.add[{k}]")),
                Rule::Capability(c.clone()),
            ));
        }
    }
    if let Some(m) = sc.proc_mount.as_deref()
        && m != "Default"
    {
        return Some((field("procMount"), Rule::ProcMount(m.to_owned())));
    }
    if let Some(t) = sc.app_armor_profile.as_ref().map(|p| &p.type_)
        && !apparmor_allowed(t)
    {
        return Some((field("appArmorProfile.type"), Rule::AppArmor(t.clone())));
    }
    if let Some((f, rule)) = selinux(sc.se_linux_options.as_ref()) {
        return Some((field(&f), rule));
    }
    if sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()) == Some("Unconfined") {
        return Some((field("seccompProfile.type"), Rule::Seccomp));
    }
    None
}

/// The types a volume (or a projection) is of: its fields besides its name, as the API
/// names them, so that a type added to Kubernetes later is refused until allowed here.
fn types_of<T: serde::Serialize>(v: &T) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter(|(k, v)| k != "name" && !v.is_null())
            .map(|(k, _)| k)
            .collect(),
        // A volume always serializes to an object; anything else is refused as unknown.
        _ => vec!["unknown".to_owned()],
    }
}

/// Whether `name` is a DNS-1123 subdomain (an object name: no `/`, no `..`).
fn dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// What a volume breaks: its field below `volumes[i]`, and the rule.
fn volume(v: &Volume) -> Option<(String, Rule)> {
    if v.host_path.is_some() {
        return Some((".hostPath".into(), Rule::HostPath));
    }
    if let Some(t) = types_of(v)
        .into_iter()
        .find(|t| !VOLUME_TYPES.contains(&t.as_str()))
    {
        return Some((format!(".{t}"), Rule::VolumeType(t)));
    }
    if let Some(c) = &v.persistent_volume_claim
        && !dns_subdomain(&c.claim_name)
    {
        return Some((
            ".persistentVolumeClaim.claimName".into(),
            Rule::ClaimName(c.claim_name.clone()),
        ));
    }
    for (k, s) in v
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .enumerate()
    {
        if let Some(t) = types_of(s)
            .into_iter()
            .find(|t| !PROJECTED_SOURCES.contains(&t.as_str()))
        {
            return Some((format!(".projected.sources[{k}].{t}"), Rule::Projection(t)));
        }
    }
    None
}

#[cfg(test)]
mod tests;
