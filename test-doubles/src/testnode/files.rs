//! What a kubelet puts in a pod's filesystem, for the test node's pod processes: `/etc/hosts`
//! (the pod's name and address, then its `hostAliases`, as the kubelet writes it) and the
//! contents of its `configMap`, `secret`, `downwardAPI` and `projected` (configMap, secret,
//! downwardAPI) volumes (downward fields: name, namespace, uid, labels, annotations, one label
//! or annotation), as files under a directory per volume,
//! rewritten atomically (write aside, rename) when the objects change, as a kubelet's atomic
//! writer does. Each container process runs in a mount namespace of its own where these are
//! bind-mounted read-only ([`mount_script`]). Resolution is pure; [`write`] is the edge.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use k8s_openapi::api::core::v1::{KeyToPath, Pod, PodSpec};
use kube::ResourceExt;

use super::config::{Loaded, Source};

/// A volume's files: path in the volume → contents.
pub type Files = BTreeMap<String, String>;

/// The test node mounts volumes only where making the mount point touches no host directory
/// but this one (made empty once), which it shadows with a tmpfs in each pod's mount
/// namespace.
pub const SECRETS_ROOT: &str = "/var/run/secrets";

/// `/etc/hosts` of `pod` at `ip`, as a kubelet writes it.
pub fn hosts(pod: &Pod, ip: &str) -> String {
    let mut s = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    s += &format!("{ip}\t{}\n", pod.name_any());
    let aliases = pod.spec.as_ref().and_then(|s| s.host_aliases.as_ref());
    if let Some(aliases) = aliases.filter(|a| !a.is_empty()) {
        s += "\n# Entries added by HostAliases.\n";
        for a in aliases {
            s += &format!(
                "{}\t{}\n",
                a.ip,
                a.hostnames.clone().unwrap_or_default().join("\t")
            );
        }
    }
    s
}

/// The ConfigMaps and Secrets `spec`'s volumes take files from.
pub fn wanted(spec: &PodSpec) -> BTreeSet<(Source, String)> {
    let mut out = BTreeSet::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            out.insert((Source::ConfigMap, c.name.clone()));
        }
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            out.insert((Source::Secret, s));
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &p.config_map {
                out.insert((Source::ConfigMap, c.name.clone()));
            }
            if let Some(s) = &p.secret {
                out.insert((Source::Secret, s.name.clone()));
            }
        }
    }
    out
}

/// The files of object `name`'s keys as `loaded` has it (`items`: those only, at their
/// paths), added to `out`.
fn take(
    loaded: &Loaded,
    source: Source,
    name: &str,
    items: Option<&Vec<KeyToPath>>,
    optional: Option<bool>,
    out: &mut Files,
) -> Result<(), String> {
    let optional = optional == Some(true);
    let what = format!("{} \"{name}\"", source.word());
    let Some(data) = loaded.get(&(source, name.to_owned())).cloned().flatten() else {
        return if optional {
            Ok(())
        } else {
            Err(format!("{what} not found"))
        };
    };
    match items {
        Some(items) => {
            for i in items {
                match data.get(&i.key) {
                    Some(v) => {
                        out.insert(i.path.clone(), v.clone());
                    }
                    None if optional => {}
                    None => return Err(format!("couldn't find key {} in {what}", i.key)),
                }
            }
        }
        None => out.extend(data),
    }
    Ok(())
}

/// A downward API field of `pod`.
fn field(pod: &Pod, path: &str) -> Option<String> {
    let pairs = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    Some(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace()?,
        "metadata.uid" => pod.uid()?,
        "metadata.labels" => pairs(pod.labels()),
        "metadata.annotations" => pairs(pod.annotations()),
        _ => {
            // One annotation or label, as `metadata.annotations['key']`.
            let (map, rest) = if let Some(r) = path.strip_prefix("metadata.annotations[") {
                (pod.annotations(), r)
            } else {
                (pod.labels(), path.strip_prefix("metadata.labels[")?)
            };
            let key = rest.strip_suffix(']')?.trim_matches(['\'', '"']);
            // As the kubelet: a missing key reads empty.
            map.get(key).cloned().unwrap_or_default()
        }
    })
}

/// Every volume of `pod` the test node materializes, by name, from the objects `loaded`;
/// `Err`: what is missing, as a kubelet says it.
pub fn volumes(pod: &Pod, loaded: &Loaded) -> Result<BTreeMap<String, Files>, String> {
    let mut out = BTreeMap::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let mut files = Files::new();
        if let Some(c) = &v.config_map {
            let (items, optional) = (c.items.as_ref(), c.optional);
            take(
                loaded,
                Source::ConfigMap,
                &c.name,
                items,
                optional,
                &mut files,
            )?;
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.as_deref().unwrap_or_default();
            take(
                loaded,
                Source::Secret,
                name,
                s.items.as_ref(),
                s.optional,
                &mut files,
            )?;
        } else if let Some(d) = &v.downward_api {
            for i in d.items.iter().flatten() {
                if let Some(value) = i.field_ref.as_ref().and_then(|f| field(pod, &f.field_path)) {
                    files.insert(i.path.clone(), value);
                }
            }
        } else if let Some(p) = &v.projected {
            for src in p.sources.iter().flatten() {
                if let Some(c) = &src.config_map {
                    let (items, optional) = (c.items.as_ref(), c.optional);
                    take(
                        loaded,
                        Source::ConfigMap,
                        &c.name,
                        items,
                        optional,
                        &mut files,
                    )?;
                }
                if let Some(s) = &src.secret {
                    let (items, optional) = (s.items.as_ref(), s.optional);
                    take(loaded, Source::Secret, &s.name, items, optional, &mut files)?;
                }
                let downward = src
                    .downward_api
                    .iter()
                    .flat_map(|d| d.items.iter().flatten());
                for i in downward {
                    if let Some(value) =
                        i.field_ref.as_ref().and_then(|f| field(pod, &f.field_path))
                    {
                        files.insert(i.path.clone(), value);
                    }
                }
            }
        } else {
            continue;
        }
        out.insert(v.name.clone(), files);
    }
    Ok(out)
}

/// Makes `dir` hold exactly `files`, each replaced atomically (written aside, renamed), so a
/// reader never sees half a file; read-only, as a kubelet's are.
pub fn write(dir: &Path, files: &Files) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    for (path, content) in files {
        let target = dir.join(path);
        if std::fs::read_to_string(&target).is_ok_and(|c| &c == content) {
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let aside = target.with_extension("fabric-tmp");
        std::fs::write(&aside, content)?;
        std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o444))?;
        std::fs::rename(&aside, &target)?;
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_file() && !files.contains_key(&name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// A bind mount into a container's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The host directory.
    pub from: String,
    /// The mount path in the container.
    pub at: String,
    /// Volumes of files are; a claim's volume is not (unless the pod says so).
    pub read_only: bool,
}

/// The shell script a container's process is started through (`sh -c SCRIPT sh CMD ARGS...`
/// inside `ip netns exec`, which gives it a mount namespace of its own whose changes do not
/// reach the host): `/etc/hosts` bound from `hosts`, a tmpfs over [`SECRETS_ROOT`], each
/// [`Mount`] bound (and remounted read-only when it is); then the command. A mount path
/// outside [`SECRETS_ROOT`] must exist on the host.
pub fn mount_script(hosts: &Path, mounts: &[Mount]) -> String {
    let q = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut s = format!(
        "set -e\nmount --bind {} /etc/hosts\n",
        q(&hosts.display().to_string())
    );
    if mounts.iter().any(|m| m.at.starts_with(SECRETS_ROOT)) {
        // The one directory made on the host (empty there: the tmpfs is the pod's).
        s += &format!("mkdir -p {SECRETS_ROOT}\nmount -t tmpfs tmpfs {SECRETS_ROOT}\n");
    }
    for Mount {
        from,
        at,
        read_only,
    } in mounts
    {
        if at.starts_with(SECRETS_ROOT) {
            s += &format!("mkdir -p {}\n", q(at));
        }
        s += &format!("mount --bind {} {}\n", q(from), q(at));
        if *read_only {
            s += &format!("mount -o remount,bind,ro {}\n", q(at));
        }
    }
    s + "exec \"$@\"\n"
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "labels": {"app": "web"}},
            "spec": {
                "hostAliases": [{"ip": "10.96.0.9", "hostnames": ["kubernetes", "kubernetes.default.svc"]}],
                "containers": [{"name": "c"}],
                "volumes": [
                    {"name": "settings", "configMap": {"name": "settings", "items": [{"key": "a", "path": "a.txt"}]}},
                    {"name": "db", "secret": {"secretName": "db"}},
                    {"name": "sa", "projected": {"sources": [
                        {"configMap": {"name": "root-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"secret": {"name": "token", "optional": true}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                    ]}},
                    {"name": "scratch", "emptyDir": {}},
                ],
            },
        }))
        .unwrap()
    }

    fn data(kv: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(kv.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect())
    }

    #[test]
    fn hosts_carry_the_pod_and_its_aliases() {
        let h = hosts(&pod(), "10.244.1.7");
        assert!(h.contains("10.244.1.7\tweb\n"), "{h}");
        assert!(
            h.contains("10.96.0.9\tkubernetes\tkubernetes.default.svc\n"),
            "{h}"
        );
    }

    #[test]
    fn volumes_are_their_objects_keys_and_missing_ones_are_said() {
        let p = pod();
        let w = wanted(p.spec.as_ref().unwrap());
        assert_eq!(w.len(), 4, "{w:?}");
        let mut loaded = Loaded::new();
        loaded.insert(
            (Source::ConfigMap, "settings".into()),
            data(&[("a", "1"), ("b", "2")]),
        );
        loaded.insert((Source::Secret, "db".into()), data(&[("password", "s3")]));
        loaded.insert((Source::Secret, "token".into()), None);
        loaded.insert((Source::ConfigMap, "root-ca".into()), None);
        let e = volumes(&p, &loaded).unwrap_err();
        assert!(e.contains("configmap \"root-ca\""), "{e}");
        loaded.insert(
            (Source::ConfigMap, "root-ca".into()),
            data(&[("ca.crt", "PEM")]),
        );
        let v = volumes(&p, &loaded).unwrap();
        assert_eq!(v.len(), 3, "no emptyDir");
        assert_eq!(v["settings"], data(&[("a.txt", "1")]).unwrap());
        assert_eq!(v["db"], data(&[("password", "s3")]).unwrap());
        assert_eq!(
            v["sa"],
            data(&[("ca.crt", "PEM"), ("namespace", "shop")]).unwrap()
        );
    }

    #[test]
    fn files_are_replaced_whole_and_stale_ones_removed() {
        let dir = std::env::temp_dir().join(format!("fabric-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write(&dir, &data(&[("a", "1"), ("b", "2")]).unwrap()).unwrap();
        write(&dir, &data(&[("a", "3")]).unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "3");
        assert!(!dir.join("b").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_script_binds_read_only_under_a_private_secrets_root() {
        let s = mount_script(
            Path::new("/run/x/hosts"),
            &[
                Mount {
                    from: "/run/x/v/sa".into(),
                    at: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
                    read_only: true,
                },
                Mount {
                    from: "/tmp/v/pvc-1".into(),
                    at: "/srv".into(),
                    read_only: false,
                },
            ],
        );
        assert!(s.contains("mount --bind '/tmp/v/pvc-1' '/srv'\n"), "{s}");
        assert!(!s.contains("remount,bind,ro '/srv'"), "{s}");
        assert!(s.contains("mount --bind '/run/x/hosts' /etc/hosts"), "{s}");
        assert!(s.contains("mount -t tmpfs tmpfs /var/run/secrets"), "{s}");
        assert!(
            s.contains("remount,bind,ro '/var/run/secrets/kubernetes.io/serviceaccount'"),
            "{s}"
        );
        assert!(s.ends_with("exec \"$@\"\n"));
    }

    #[test]
    fn a_downward_volume_reads_fields_and_single_annotations() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop-x", "annotations": {"home": "shop"},
                         "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "ns", "fieldRef": {"fieldPath": "metadata.annotations['home']"}},
                    {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "none", "fieldRef": {"fieldPath": "metadata.annotations['absent']"}},
                ]}},
            ]},
        }))
        .unwrap();
        let v = volumes(&p, &Loaded::new()).unwrap();
        let files: Vec<_> = v["info"]
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            files,
            [
                ("app", "web"),
                ("name", "web"),
                ("none", ""),
                ("ns", "shop")
            ]
        );
    }
}
