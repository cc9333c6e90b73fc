use serde_json::{Value, json};

use super::*;

/// A plain pod with `extra` merged into its spec (objects merged, the rest replaced).
fn pod(extra: Value) -> PodSpec {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "containers": [{"name": "main", "image": "echo"}],
    });
    merge(&mut spec, extra);
    serde_json::from_value(spec).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// A container's spec with `sc` as its security context.
fn with_sc(sc: Value) -> Value {
    json!({"containers": [{"name": "main", "image": "echo", "securityContext": sc}]})
}

/// Runs a table: each spec fragment either passes (`None`) or is refused on that field with
/// that rule.
fn table(cases: Vec<(Value, Option<(&str, Rule)>)>) {
    for (extra, want) in cases {
        let got = check(&pod(extra.clone()), &Rules::default());
        match want {
            None => assert_eq!(got, Ok(()), "{extra}"),
            Some((field, rule)) => assert_eq!(
                got,
                Err(Refusal {
                    field: field.to_owned(),
                    rule,
                    level: Level::Baseline,
                }),
                "{extra}"
            ),
        }
    }
}

#[test]
fn a_plain_pod_passes_and_a_refusal_names_field_and_rule() {
    assert_eq!(check(&pod(json!({})), &Rules::default()), Ok(()));
    let e = check(
        &pod(with_sc(json!({"privileged": true}))),
        &Rules::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "spec.containers[0].securityContext.privileged: privileged containers are not allowed \
         (provider policy baseline)"
    );
}

#[test]
fn scheduling_and_identity_are_the_providers() {
    table(vec![
        (
            json!({"nodeName": "cp-0"}),
            Some(("spec.nodeName", Rule::NodeName)),
        ),
        (json!({"nodeName": ""}), None),
        (
            json!({"priorityClassName": "system-node-critical"}),
            Some(("spec.priorityClassName", Rule::Priority)),
        ),
        (json!({"priorityClassName": ""}), None),
        (
            json!({"priority": 2000001000}),
            Some(("spec.priority", Rule::Priority)),
        ),
        (
            json!({"runtimeClassName": "unsandboxed"}),
            Some(("spec.runtimeClassName", Rule::RuntimeClass)),
        ),
        (json!({"runtimeClassName": ""}), None),
        (
            json!({"serviceAccountName": "cluster-admin"}),
            Some(("spec.serviceAccountName", Rule::ServiceAccount)),
        ),
        (
            json!({"serviceAccount": "cluster-admin"}),
            Some(("spec.serviceAccount", Rule::ServiceAccount)),
        ),
        (json!({"serviceAccountName": "default"}), None),
        (json!({"serviceAccountName": ""}), None),
        // Forced to false on the real pod, not refused.
        (json!({"automountServiceAccountToken": true}), None),
        (
            json!({"hostAliases": [{"ip": "10.0.0.1", "hostnames": ["db"]}]}),
            None,
        ),
    ]);
}

#[test]
fn host_namespaces_are_refused() {
    table(vec![
        (
            json!({"hostNetwork": true}),
            Some(("spec.hostNetwork", Rule::HostNamespace)),
        ),
        (
            json!({"hostPID": true}),
            Some(("spec.hostPID", Rule::HostNamespace)),
        ),
        (
            json!({"hostIPC": true}),
            Some(("spec.hostIPC", Rule::HostNamespace)),
        ),
        (
            json!({"hostNetwork": false, "hostPID": false, "hostIPC": false}),
            None,
        ),
    ]);
}

#[test]
fn privileged_containers_of_every_kind_are_refused() {
    let sc = json!({"securityContext": {"privileged": true}});
    let named = |name: &str| {
        let mut c = json!({"name": name, "image": "echo"});
        merge(&mut c, sc.clone());
        c
    };
    table(vec![
        (
            with_sc(json!({"privileged": true})),
            Some((
                "spec.containers[0].securityContext.privileged",
                Rule::Privileged,
            )),
        ),
        (with_sc(json!({"privileged": false})), None),
        (
            json!({"initContainers": [{"name": "ok", "image": "echo"}, named("init")]}),
            Some((
                "spec.initContainers[1].securityContext.privileged",
                Rule::Privileged,
            )),
        ),
        (
            json!({"ephemeralContainers": [named("debug")]}),
            Some((
                "spec.ephemeralContainers[0].securityContext.privileged",
                Rule::Privileged,
            )),
        ),
    ]);
}

#[test]
fn capabilities_beyond_baseline_are_refused() {
    let add = |caps: Value| with_sc(json!({"capabilities": {"add": caps}}));
    table(vec![
        (add(json!(BASELINE_CAPABILITIES)), None),
        (
            add(json!(["CHOWN", "SYS_ADMIN"])),
            Some((
                "spec.containers[0].securityContext.capabilities.add[1]",
                Rule::Capability("SYS_ADMIN".into()),
            )),
        ),
        (
            add(json!(["NET_ADMIN"])),
            Some((
                "spec.containers[0].securityContext.capabilities.add[0]",
                Rule::Capability("NET_ADMIN".into()),
            )),
        ),
        // Dropping is always fine.
        (with_sc(json!({"capabilities": {"drop": ["ALL"]}})), None),
    ]);
}

#[test]
fn host_ports_are_refused() {
    let ports = |p: Value| json!({"containers": [{"name": "main", "image": "echo", "ports": p}]});
    table(vec![
        (ports(json!([{"containerPort": 80}])), None),
        (ports(json!([{"containerPort": 80, "hostPort": 0}])), None),
        (
            ports(json!([{"containerPort": 80}, {"containerPort": 22, "hostPort": 22}])),
            Some(("spec.containers[0].ports[1].hostPort", Rule::HostPort(22))),
        ),
    ]);
}

#[test]
fn proc_mount_other_than_default_is_refused() {
    table(vec![
        (with_sc(json!({"procMount": "Default"})), None),
        (
            with_sc(json!({"procMount": "Unmasked"})),
            Some((
                "spec.containers[0].securityContext.procMount",
                Rule::ProcMount("Unmasked".into()),
            )),
        ),
    ]);
}

#[test]
fn only_safe_sysctls_pass() {
    let sysctl =
        |name: &str| json!({"securityContext": {"sysctls": [{"name": name, "value": "1"}]}});
    let mut cases: Vec<(Value, Option<(&str, Rule)>)> =
        SAFE_SYSCTLS.iter().map(|s| (sysctl(s), None)).collect();
    cases.push((
        sysctl("kernel.msgmax"),
        Some((
            "spec.securityContext.sysctls[0].name",
            Rule::Sysctl("kernel.msgmax".into()),
        )),
    ));
    cases.push((
        sysctl("net.core.somaxconn"),
        Some((
            "spec.securityContext.sysctls[0].name",
            Rule::Sysctl("net.core.somaxconn".into()),
        )),
    ));
    table(cases);
}

#[test]
fn unconfined_seccomp_and_apparmor_are_refused_on_pod_and_container() {
    let pod_sc = |sc: Value| json!({"securityContext": sc});
    table(vec![
        (
            pod_sc(json!({"seccompProfile": {"type": "RuntimeDefault"}})),
            None,
        ),
        (
            pod_sc(json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}})),
            None,
        ),
        (
            pod_sc(json!({"seccompProfile": {"type": "Unconfined"}})),
            Some(("spec.securityContext.seccompProfile.type", Rule::Seccomp)),
        ),
        (
            with_sc(json!({"seccompProfile": {"type": "Unconfined"}})),
            Some((
                "spec.containers[0].securityContext.seccompProfile.type",
                Rule::Seccomp,
            )),
        ),
        (
            pod_sc(json!({"appArmorProfile": {"type": "RuntimeDefault"}})),
            None,
        ),
        (
            with_sc(json!({"appArmorProfile": {"type": "Localhost", "localhostProfile": "p"}})),
            None,
        ),
        (
            pod_sc(json!({"appArmorProfile": {"type": "Unconfined"}})),
            Some((
                "spec.securityContext.appArmorProfile.type",
                Rule::AppArmor("Unconfined".into()),
            )),
        ),
        (
            with_sc(json!({"appArmorProfile": {"type": "Unconfined"}})),
            Some((
                "spec.containers[0].securityContext.appArmorProfile.type",
                Rule::AppArmor("Unconfined".into()),
            )),
        ),
    ]);
}

#[test]
fn windows_host_processes_are_refused() {
    let host = json!({"windowsOptions": {"hostProcess": true}});
    table(vec![
        (
            json!({"securityContext": host}),
            Some((
                "spec.securityContext.windowsOptions.hostProcess",
                Rule::HostProcess,
            )),
        ),
        (
            with_sc(host),
            Some((
                "spec.containers[0].securityContext.windowsOptions.hostProcess",
                Rule::HostProcess,
            )),
        ),
        (
            with_sc(json!({"windowsOptions": {"hostProcess": false}})),
            None,
        ),
    ]);
}

#[test]
fn selinux_only_with_container_types_and_no_user_or_role() {
    let se = |o: Value| with_sc(json!({"seLinuxOptions": o}));
    let mut cases: Vec<(Value, Option<(&str, Rule)>)> = SELINUX_TYPES
        .iter()
        .map(|t| (se(json!({"type": t})), None))
        .collect();
    cases.extend([
        (se(json!({"level": "s0:c123,c456"})), None),
        (
            se(json!({"type": "spc_t"})),
            Some((
                "spec.containers[0].securityContext.seLinuxOptions.type",
                Rule::SeLinuxType("spc_t".into()),
            )),
        ),
        (
            json!({"securityContext": {"seLinuxOptions": {"user": "system_u"}}}),
            Some((
                "spec.securityContext.seLinuxOptions.user",
                Rule::SeLinuxUserRole,
            )),
        ),
        (
            se(json!({"role": "sysadm_r"})),
            Some((
                "spec.containers[0].securityContext.seLinuxOptions.role",
                Rule::SeLinuxUserRole,
            )),
        ),
    ]);
    table(cases);
}

#[test]
fn volumes_only_of_allowed_types() {
    let vol = |v: Value| {
        let mut one = json!({"name": "v"});
        merge(&mut one, v);
        json!({"volumes": [{"name": "ok", "emptyDir": {}}, one]})
    };
    let projected = |sources: Value| vol(json!({"projected": {"sources": sources}}));
    table(vec![
        (vol(json!({"configMap": {"name": "c"}})), None),
        (vol(json!({"secret": {"secretName": "s"}})), None),
        (vol(json!({"downwardAPI": {"items": []}})), None),
        (vol(json!({"emptyDir": {"medium": "Memory"}})), None),
        (
            projected(json!([
                {"configMap": {"name": "c"}}, {"secret": {"name": "s"}},
                {"downwardAPI": {"items": []}},
            ])),
            None,
        ),
        (
            vol(json!({"hostPath": {"path": "/"}})),
            Some(("spec.volumes[1].hostPath", Rule::HostPath)),
        ),
        (
            vol(json!({"nfs": {"server": "10.0.0.1", "path": "/"}})),
            Some(("spec.volumes[1].nfs", Rule::VolumeType("nfs".into()))),
        ),
        // A claim of the pod's own namespace (the tenant's): allowed; a name that is no
        // claim's, refused; a claim made from a template (`ephemeral`), refused.
        (
            vol(json!({"persistentVolumeClaim": {"claimName": "data-0", "readOnly": true}})),
            None,
        ),
        (
            vol(json!({"persistentVolumeClaim": {"claimName": "other-tenant/data"}})),
            Some((
                "spec.volumes[1].persistentVolumeClaim.claimName",
                Rule::ClaimName("other-tenant/data".into()),
            )),
        ),
        (
            vol(json!({"persistentVolumeClaim": {"claimName": "../data"}})),
            Some((
                "spec.volumes[1].persistentVolumeClaim.claimName",
                Rule::ClaimName("../data".into()),
            )),
        ),
        (
            vol(json!({"ephemeral": {"volumeClaimTemplate": {"spec": {}}}})),
            Some((
                "spec.volumes[1].ephemeral",
                Rule::VolumeType("ephemeral".into()),
            )),
        ),
        (
            vol(json!({"csi": {"driver": "d"}})),
            Some(("spec.volumes[1].csi", Rule::VolumeType("csi".into()))),
        ),
        (
            projected(
                json!([{"configMap": {"name": "c"}}, {"serviceAccountToken": {"path": "t"}}]),
            ),
            Some((
                "spec.volumes[1].projected.sources[1].serviceAccountToken",
                Rule::Projection("serviceAccountToken".into()),
            )),
        ),
    ]);
}

#[test]
fn the_first_refusal_is_the_one_reported_and_any_refusal_is_one() {
    // What issue 19 calls root on the provider's node: every part of it is refused alone.
    let attack = json!({
        "nodeName": "control-plane-0",
        "hostPID": true,
        "containers": [{"name": "main", "image": "echo", "securityContext": {"privileged": true}}],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    });
    assert_eq!(
        check(&pod(attack.clone()), &Rules::default())
            .unwrap_err()
            .field,
        "spec.nodeName"
    );
    for drop in ["nodeName", "hostPID", "containers", "volumes"] {
        let mut rest = attack.clone();
        rest.as_object_mut().unwrap().remove(drop);
        assert!(
            check(&pod(rest.clone()), &Rules::default()).is_err(),
            "{rest}"
        );
    }
}

#[test]
fn apparmor_annotations_are_judged_as_the_field() {
    let key = |c: &str| format!("{APPARMOR_ANNOTATION}{c}");
    let of = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (key(k), (*v).to_owned()))
            .collect()
    };
    for ok in ["runtime/default", "localhost/my-profile"] {
        assert_eq!(
            check_annotations(&of(&[("main", ok)]), Level::Baseline),
            Ok(())
        );
    }
    let other = [("note".to_owned(), "unconfined".to_owned())].into();
    assert_eq!(check_annotations(&other, Level::Baseline), Ok(()));
    assert_eq!(
        check_annotations(&of(&[("main", "unconfined")]), Level::Baseline),
        Err(Refusal {
            field: format!("annotations[{}]", key("main")),
            rule: Rule::AppArmor("unconfined".into()),
            level: Level::Baseline,
        })
    );
}

#[test]
fn restricted_adds_non_root_no_escalation_seccomp_and_drop_all() {
    let good_container = json!({"name": "main", "image": "echo", "securityContext": {
        "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
    }});
    let good = json!({
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [good_container],
    });
    let with = |patch: Value| {
        let mut p = good.clone();
        merge(&mut p, patch);
        pod(p)
    };
    let container = |sc: Value| {
        let mut c = good_container.clone();
        merge(&mut c, json!({"securityContext": sc}));
        with(json!({"containers": [c]}))
    };
    let refused = |spec: PodSpec| {
        check(&spec, &Rules::from(Level::Restricted)).map_err(|r| (r.field, r.rule))
    };
    let at = |f: &str, rule: Rule| Err((format!("spec.{f}"), rule));
    let c0 = |f: &str| format!("containers[0].securityContext.{f}");
    assert_eq!(refused(pod(good.clone())), Ok(()));
    assert_eq!(check(&pod(json!({})), &Rules::default()), Ok(()));
    assert_eq!(
        refused(pod(json!({}))),
        at(&c0("allowPrivilegeEscalation"), Rule::PrivilegeEscalation),
        "a plain pod is baseline, not restricted"
    );
    assert_eq!(
        refused(container(json!({"allowPrivilegeEscalation": true}))),
        at(&c0("allowPrivilegeEscalation"), Rule::PrivilegeEscalation)
    );
    assert_eq!(
        refused(with(json!({"securityContext": {"runAsNonRoot": false}}))),
        at("securityContext.runAsNonRoot", Rule::RunAsRoot)
    );
    assert_eq!(
        refused(with(json!({"securityContext": {"runAsNonRoot": null}}))),
        at(&c0("runAsNonRoot"), Rule::RunAsRoot),
        "non-root said nowhere"
    );
    let mut own = container(json!({"runAsNonRoot": true}));
    own.security_context.as_mut().unwrap().run_as_non_root = None;
    assert_eq!(
        refused(own),
        Ok(()),
        "non-root said by the container itself"
    );
    assert_eq!(
        refused(container(json!({"runAsUser": 0}))),
        at(&c0("runAsUser"), Rule::RunAsRoot)
    );
    assert_eq!(
        refused(with(json!({"securityContext": {"runAsUser": 0}}))),
        at("securityContext.runAsUser", Rule::RunAsRoot)
    );
    assert_eq!(
        refused(with(json!({"securityContext": {"seccompProfile": null}}))),
        at(&c0("seccompProfile.type"), Rule::SeccompRequired)
    );
    assert_eq!(
        refused(with(
            json!({"securityContext": {"seccompProfile": null}, "containers": [{
            "name": "main", "image": "echo", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
            }}]})
        )),
        Ok(()),
        "the container's own profile"
    );
    assert_eq!(
        refused(container(json!({"capabilities": {"drop": ["NET_RAW"]}}))),
        at(&c0("capabilities.drop"), Rule::DropAll)
    );
    assert_eq!(
        refused(container(
            json!({"capabilities": {"add": ["NET_BIND_SERVICE"]}})
        )),
        Ok(())
    );
    assert_eq!(
        refused(container(json!({"capabilities": {"add": ["CHOWN"]}}))),
        at(&c0("capabilities.add[0]"), Rule::Capability("CHOWN".into())),
        "allowed by baseline, not by restricted"
    );
    assert_eq!(
        refused(with(
            json!({"initContainers": [{"name": "i", "image": "echo"}]})
        )),
        at(
            "initContainers[0].securityContext.allowPrivilegeEscalation",
            Rule::PrivilegeEscalation
        )
    );
    // Baseline's refusals stand in restricted.
    assert_eq!(
        refused(with(json!({"hostPID": true}))),
        at("hostPID", Rule::HostNamespace)
    );
}
