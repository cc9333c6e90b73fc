//! What the manifests in `deploy/` give each container — user, group, supplementary groups,
//! capabilities, `no_new_privs`, volumes — worked out as a container runtime applies them, and
//! the `setpriv` command line that starts a process with exactly those credentials. The
//! two-cluster fixture ([`crate::clusters`]) starts every fabric component through it, so the
//! end-to-end tests prove the manifests work as written, not only as root.
//!
//! The runtime's rules this follows (containerd/runc, as Kubernetes uses them):
//! - the user and group are `runAsUser`/`runAsGroup` of the container, else of the pod. The
//!   image's `USER` would apply otherwise; it is not visible here, so the manifests must name
//!   both (an error says so);
//! - supplementary groups: the pod's `fsGroup` and `supplementalGroups`;
//! - the bounding set is the runtime's default set, less `drop` (`ALL`: everything), plus
//!   `add`. A process of uid 0 has the bounding set as its effective capabilities; any other
//!   user has none (Kubernetes sets no ambient capabilities, and `no_new_privs` makes the
//!   kernel ignore file capabilities);
//! - `allowPrivilegeEscalation: false` is `no_new_privs`.
//!
//! Not reproduced: seccomp profiles, `readOnlyRootFilesystem` (the components write only to
//! their volumes, which the fixture provides) and AppArmor.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::{
    Resource as _,
    api::{
        apps::v1::{DaemonSet, Deployment},
        core::v1::PodSpec,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde_json::Value;

use crate::apiserver::ApiServer;

/// Capability names (lower case, without `CAP_`) by their bit number.
const CAPS: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// What containerd gives a container that neither adds nor drops capabilities.
const RUNTIME_DEFAULT_CAPS: [&str; 14] = [
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
];

/// A capability name from a manifest (`NET_ADMIN`, `CAP_NET_ADMIN`) as in [`CAPS`].
fn cap_name(s: &str) -> Result<String> {
    let n = s.to_ascii_lowercase();
    let n = n.strip_prefix("cap_").unwrap_or(&n).to_owned();
    ensure!(CAPS.contains(&n.as_str()), "unknown capability {s}");
    Ok(n)
}

/// The first line of a component's log where the kernel refused it something for lack of a
/// capability (EPERM) or of file permissions (EACCES), without its terminal colours.
pub fn first_denial(log: &str) -> Option<String> {
    let line = log.lines().find(|l| {
        l.contains("Operation not permitted (os error 1)")
            || l.contains("Permission denied (os error 13)")
    })?;
    // tracing's ANSI colours: ESC [ ... m
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// The workloads of `deploy/` as `kubectl apply -k deploy/` sends them.
pub struct Manifests {
    deployments: Vec<Deployment>,
    daemon_sets: Vec<DaemonSet>,
}

/// Set to a copy of `deploy/` to run the fixtures with its manifests instead (e.g. one that
/// takes a capability from a container, to see which component fails for the lack of it).
pub const DEPLOY_DIR_ENV: &str = "FABRIC_TEST_DEPLOY_DIR";

impl Manifests {
    /// The `deploy/` directory the fixtures follow: the repository's, or [`DEPLOY_DIR_ENV`].
    pub fn dir() -> PathBuf {
        std::env::var_os(DEPLOY_DIR_ENV).map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy"),
            PathBuf::from,
        )
    }

    /// Renders [`Manifests::dir`] (kustomize, then JSON through the API server's discovery: a
    /// client-side dry run, which needs a server to map the kinds).
    pub fn render(api: &ApiServer) -> Result<Self> {
        Self::from_objects(Self::rendered(api)?)
    }

    /// Every object of [`Manifests::dir`], as [`Manifests::render`] renders them. Rendered
    /// once per machine for the same `deploy/` and kubectl, kept in /var/tmp for the tests
    /// after it (kubectl validates against the server's OpenAPI document, which takes seconds
    /// to fetch, and kustomize's build of the CRDs takes as long: seconds of CPU for every
    /// test that runs the manifests), and once per test process.
    pub fn rendered(api: &ApiServer) -> Result<Vec<Value>> {
        static RENDERED: std::sync::Mutex<Option<Vec<Value>>> = std::sync::Mutex::new(None);
        let mut cached = RENDERED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(objects) = cached.as_ref() {
            return Ok(objects.clone());
        }
        let kept =
            Path::new("/var/tmp").join(format!("fabric-manifests-{:016x}.json", Self::key()?));
        let objects = match std::fs::read(&kept)
            .ok()
            .and_then(|b| serde_json::from_slice::<Vec<Value>>(&b).ok())
        {
            Some(objects) => objects,
            None => {
                let objects = Self::render_now(api)?;
                // Written whole, then renamed: a test beside this one reads all or nothing.
                let tmp = kept.with_extension(format!("tmp.{}", std::process::id()));
                std::fs::write(&tmp, serde_json::to_vec(&objects)?)
                    .with_context(|| format!("writing {}", tmp.display()))?;
                std::fs::rename(&tmp, &kept)
                    .with_context(|| format!("placing {}", kept.display()))?;
                objects
            }
        };
        *cached = Some(objects.clone());
        Ok(objects)
    }

    /// What the rendering depends on: every file of [`Manifests::dir`] (name and content) and
    /// the kubectl that renders them (where it is, its size and modification time).
    fn key() -> Result<u64> {
        use std::hash::{Hash as _, Hasher as _};
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
            for e in std::fs::read_dir(dir)? {
                let path = e?.path();
                if path.is_dir() {
                    walk(&path, out)?;
                } else {
                    out.push(path);
                }
            }
            Ok(())
        }
        let deploy = Self::dir();
        let mut files = Vec::new();
        walk(&deploy, &mut files).with_context(|| format!("listing {}", deploy.display()))?;
        files.sort();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for f in &files {
            f.strip_prefix(&deploy).unwrap_or(f).hash(&mut h);
            std::fs::read(f)
                .with_context(|| format!("reading {}", f.display()))?
                .hash(&mut h);
        }
        let kubectl = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file());
        if let Some(k) = kubectl {
            let meta = std::fs::metadata(&k)?;
            (k, meta.len(), meta.modified().ok()).hash(&mut h);
        }
        Ok(h.finish())
    }

    fn render_now(api: &ApiServer) -> Result<Vec<Value>> {
        let deploy = Self::dir();
        let o = Command::new("kubectl")
            .env("KUBECONFIG", &api.kubeconfig)
            .args(["create", "--dry-run=client", "-o", "json", "-k"])
            .arg(&deploy)
            .output()
            .context("running kubectl")?;
        ensure!(
            o.status.success(),
            "rendering {}: {}",
            deploy.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::Deserializer::from_slice(&o.stdout)
            .into_iter::<Value>()
            .collect::<Result<Vec<_>, _>>()
            .context("parsing the rendered manifests")
    }

    /// The Deployments and DaemonSets among `objects` (the rest is not run by a container).
    pub fn from_objects(objects: Vec<Value>) -> Result<Self> {
        let mut me = Self {
            deployments: Vec::new(),
            daemon_sets: Vec::new(),
        };
        for o in objects {
            let kind = o.get("kind").and_then(Value::as_str).unwrap_or_default();
            if kind == Deployment::KIND {
                me.deployments
                    .push(serde_json::from_value(o).context("a Deployment of deploy/")?);
            } else if kind == DaemonSet::KIND {
                me.daemon_sets
                    .push(serde_json::from_value(o).context("a DaemonSet of deploy/")?);
            }
        }
        Ok(me)
    }

    /// The pod template of workload `name` (a Deployment or DaemonSet).
    fn pod(&self, name: &str) -> Result<&PodSpec> {
        let named = |m: &ObjectMeta| m.name.as_deref() == Some(name);
        self.deployments
            .iter()
            .filter(|d| named(&d.metadata))
            .find_map(|d| d.spec.template.spec.as_ref())
            .or_else(|| {
                self.daemon_sets
                    .iter()
                    .filter(|d| named(&d.metadata))
                    .find_map(|d| d.spec.template.spec.as_ref())
            })
            .with_context(|| format!("no Deployment or DaemonSet {name} in deploy/"))
    }

    /// What container `container` of workload `workload` runs with.
    pub fn container(&self, workload: &str, container: &str) -> Result<Container> {
        let pod = self.pod(workload)?;
        let c = pod
            .containers
            .iter()
            .find(|c| c.name == container)
            .with_context(|| format!("no container {container} in {workload}"))?;
        let psc = pod.security_context.clone().unwrap_or_default();
        let csc = c.security_context.clone().unwrap_or_default();
        let id = |field: &str, c: Option<i64>, p: Option<i64>| -> Result<u32> {
            let v = c.or(p).with_context(|| {
                format!(
                    "{workload}/{container} sets no {field}: the image's user would apply, which \
                     the manifest does not show; set it"
                )
            })?;
            u32::try_from(v).with_context(|| format!("{workload}/{container}: {field} {v}"))
        };
        let uid = id("runAsUser", csc.run_as_user, psc.run_as_user)?;
        let gid = id("runAsGroup", csc.run_as_group, psc.run_as_group)?;
        let run_as_non_root = csc.run_as_non_root.or(psc.run_as_non_root).unwrap_or(false);
        ensure!(
            !(run_as_non_root && uid == 0),
            "{workload}/{container}: runAsNonRoot with runAsUser 0 never starts"
        );
        let mut groups = BTreeSet::new();
        for g in psc
            .supplemental_groups
            .iter()
            .flatten()
            .chain(psc.fs_group.as_ref())
        {
            groups.insert(u32::try_from(*g).with_context(|| format!("group {g}"))?);
        }
        let caps = csc.capabilities.clone().unwrap_or_default();
        let names = |v: Option<Vec<String>>| -> Result<Vec<String>> {
            v.into_iter()
                .flatten()
                .map(|c| if c == "ALL" { Ok(c) } else { cap_name(&c) })
                .collect()
        };
        let (add, drop) = (names(caps.add)?, names(caps.drop)?);
        let mut bounding: BTreeSet<String> = if drop.iter().any(|d| d == "ALL") {
            BTreeSet::new()
        } else {
            RUNTIME_DEFAULT_CAPS
                .iter()
                .map(|c| (*c).to_owned())
                .filter(|c| !drop.contains(c))
                .collect()
        };
        bounding.extend(add);
        ensure!(
            csc.privileged != Some(true),
            "{workload}/{container} is privileged"
        );
        let no_new_privs = csc.allow_privilege_escalation == Some(false);
        let volumes = pod.volumes.as_deref().unwrap_or_default();
        let mounts = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| {
                let volume = volumes.iter().find(|v| v.name == m.name).with_context(|| {
                    format!("{workload}/{container} mounts no volume {}", m.name)
                })?;
                Ok(Mount {
                    name: m.name.clone(),
                    path: m.mount_path.clone(),
                    host_path: volume.host_path.as_ref().map(|h| h.path.clone()),
                    empty_dir: volume.empty_dir.is_some(),
                })
            })
            .collect::<Result<_>>()?;
        Ok(Container {
            service_account: pod
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            name: format!("{workload}/{container}"),
            uid,
            gid,
            groups,
            bounding,
            no_new_privs,
            mounts,
        })
    }
}

/// A volume as a container mounts it.
#[derive(Debug, Clone)]
pub struct Mount {
    pub name: String,
    pub path: String,
    /// The host's path of a `hostPath` volume.
    pub host_path: Option<String>,
    /// An `emptyDir` volume (shared by the pod's containers that mount it).
    pub empty_dir: bool,
}

/// The credentials of one container of `deploy/`.
#[derive(Debug, Clone)]
pub struct Container {
    /// `workload/container`.
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: BTreeSet<u32>,
    /// Capability bounding set (names as in `setpriv`: `net_admin`).
    pub bounding: BTreeSet<String>,
    pub no_new_privs: bool,
    pub mounts: Vec<Mount>,
    /// The pod's ServiceAccount (in fabric-system): the only Kubernetes rights it holds.
    pub service_account: String,
}

impl Container {
    /// The capabilities its process holds (see the module comment).
    pub fn effective(&self) -> BTreeSet<String> {
        if self.uid == 0 {
            self.bounding.clone()
        } else {
            BTreeSet::new()
        }
    }

    /// Who it runs as, for failure messages: which container, and what the manifest gives it.
    pub fn describe(&self) -> String {
        let caps: Vec<String> = self.effective().into_iter().collect();
        format!(
            "{}: uid {} gid {} groups {:?}, capabilities [{}]",
            self.name,
            self.uid,
            self.gid,
            self.groups,
            caps.join(" ")
        )
    }

    /// The emptyDir volumes it mounts, by name.
    pub fn empty_dirs(&self) -> BTreeSet<&str> {
        self.mounts
            .iter()
            .filter(|m| m.empty_dir)
            .map(|m| m.name.as_str())
            .collect()
    }

    /// `setpriv` and its options: put before a command line, it runs the command as this
    /// container would. The parent-death signal survives the change of user.
    pub fn setpriv(&self) -> Vec<String> {
        let caps = |set: &BTreeSet<String>| {
            std::iter::once("-all".to_owned())
                .chain(set.iter().map(|c| format!("+{c}")))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut v = vec![
            "setpriv".to_owned(),
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
        ];
        if self.groups.is_empty() {
            v.push("--clear-groups".into());
        } else {
            let g: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            v.push(format!("--groups={}", g.join(",")));
        }
        v.extend([
            "--inh-caps=-all".to_owned(),
            "--ambient-caps=-all".to_owned(),
            format!("--bounding-set={}", caps(&self.bounding)),
            "--pdeathsig=keep".to_owned(),
        ]);
        if self.no_new_privs {
            v.push("--no-new-privs".into());
        }
        v.push("--".into());
        v
    }

    /// `program` started as this container runs it, in the host's namespaces (for
    /// components a fixture runs on the host loopback). Its volumes must not be hostPaths:
    /// those would need [`Container::enter`].
    pub fn command(&self, program: &Path) -> Result<Command> {
        ensure!(
            self.mounts.iter().all(|m| m.host_path.is_none()),
            "{} mounts host paths: start it with Container::enter",
            self.name
        );
        let setpriv = self.setpriv();
        let mut c = Command::new(&setpriv[0]);
        c.args(&setpriv[1..]).arg(program);
        Ok(c)
    }

    /// A command line that enters network namespace `ns` as a container of the pod would: a
    /// mount namespace of its own with the namespace's sysfs on /sys (as `ip netns exec`
    /// and the container runtime make it) and the container's hostPath volumes under /sys
    /// (the node's BPF filesystem) mounted back over it, then [`Container::setpriv`].
    /// `keep` is an empty scratch directory (a mount point while the new /sys goes up).
    /// hostPath volumes elsewhere are the host's own paths already; a hostPath mounted at a
    /// path other than its own is not supported.
    pub fn enter(&self, ns: &str, keep: &Path) -> Result<Vec<String>> {
        let safe = |p: &str| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
        };
        let mut script = String::from("umount -l /sys\nmount -t sysfs sysfs /sys\n");
        let mut before = String::new();
        for (i, m) in self.mounts.iter().enumerate() {
            let Some(host) = m.host_path.as_deref() else {
                continue;
            };
            ensure!(
                host == m.path && safe(host),
                "{}: hostPath {host} mounted at {}: the fixture mounts host paths in place only",
                self.name,
                m.path
            );
            if !(host == "/sys" || host.starts_with("/sys/")) {
                continue;
            }
            let k = keep.join(i.to_string());
            std::fs::create_dir_all(&k)?;
            let k = k.display().to_string();
            ensure!(safe(&k), "scratch path {k}");
            before += &format!("mount --bind {host} {k}\n");
            script += &format!("mount --move {k} {host}\n");
        }
        let mut v: Vec<String> = [
            "nsenter".to_owned(),
            format!("--net=/run/netns/{ns}"),
            "--".into(),
            // A private copy of the mount table (unshare's default propagation is private).
            "unshare".into(),
            "--mount".into(),
            "--".into(),
            "sh".into(),
            "-ec".into(),
            before + &script + "exec \"$@\"",
            "sh".into(),
        ]
        .into();
        v.extend(self.setpriv());
        Ok(v)
    }

    /// Checks that process `pid` runs with these credentials (from `/proc/<pid>/status`).
    pub fn check_process(&self, pid: u32) -> Result<()> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("process {pid} of {} is gone", self.name))?;
        let field = |name: &str| -> Result<&str> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        let ids = |name: &str| -> Result<Vec<u32>> {
            field(name)?
                .split_whitespace()
                .map(|s| s.parse().context("a number"))
                .collect()
        };
        let caps = |name: &str| -> Result<BTreeSet<String>> {
            let bits = u64::from_str_radix(field(name)?, 16)?;
            Ok(CAPS
                .iter()
                .enumerate()
                .filter(|(i, _)| bits & (1 << i) != 0)
                .map(|(_, c)| (*c).to_owned())
                .collect())
        };
        let who = format!("{} (pid {pid})", self.name);
        ensure!(
            ids("Uid")?.iter().all(|u| *u == self.uid),
            "{who}: Uid {:?}, the manifest says {}",
            ids("Uid")?,
            self.uid
        );
        ensure!(
            ids("Gid")?.iter().all(|g| *g == self.gid),
            "{who}: Gid {:?}, the manifest says {}",
            ids("Gid")?,
            self.gid
        );
        let groups: BTreeSet<u32> = ids("Groups")?.into_iter().collect();
        ensure!(
            groups == self.groups,
            "{who}: groups {groups:?}, the manifest says {:?}",
            self.groups
        );
        for (name, want) in [
            ("CapBnd", self.bounding.clone()),
            ("CapEff", self.effective()),
        ] {
            let got = caps(name)?;
            ensure!(
                got == want,
                "{who}: {name} {got:?}, the manifest says {want:?}"
            );
        }
        ensure!(
            caps("CapAmb")?.is_empty(),
            "{who}: ambient capabilities {:?}",
            caps("CapAmb")?
        );
        let nnp = field("NoNewPrivs")? == "1";
        if nnp != self.no_new_privs {
            bail!(
                "{who}: NoNewPrivs {nnp}, the manifest says {}",
                self.no_new_privs
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn manifests(pod_sc: Value, sc: Value) -> Manifests {
        Manifests::from_objects(vec![json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": { "name": "w" },
            "spec": { "selector": {}, "template": { "spec": {
                "securityContext": pod_sc,
                "containers": [{ "name": "c", "image": "i", "securityContext": sc,
                                 "volumeMounts": [{ "name": "v", "mountPath": "/v" }] }],
                "volumes": [{ "name": "v", "emptyDir": {} }],
            } } },
        })])
        .unwrap()
    }

    #[test]
    fn capabilities_are_effective_for_root_only() {
        let m = manifests(
            json!({ "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 2000 }),
            json!({ "capabilities": { "add": ["NET_ADMIN"], "drop": ["ALL"] },
                    "allowPrivilegeEscalation": false }),
        );
        let c = m.container("w", "c").unwrap();
        assert_eq!((c.uid, c.gid), (65532, 65532));
        assert_eq!(c.groups, BTreeSet::from([2000]));
        assert_eq!(c.bounding, BTreeSet::from(["net_admin".to_owned()]));
        assert!(c.effective().is_empty(), "{c:?}");
        assert!(c.no_new_privs);
        assert_eq!(c.empty_dirs(), BTreeSet::from(["v"]));

        let m = manifests(
            json!({ "runAsUser": 65532, "runAsGroup": 65532 }),
            json!({ "runAsUser": 0, "runAsGroup": 0,
                    "capabilities": { "add": ["NET_ADMIN", "CAP_BPF"], "drop": ["ALL"] } }),
        );
        let c = m.container("w", "c").unwrap();
        assert_eq!(c.uid, 0);
        assert_eq!(
            c.effective(),
            BTreeSet::from(["net_admin".to_owned(), "bpf".to_owned()])
        );
        let argv = c.setpriv();
        assert!(
            argv.contains(&"--bounding-set=-all,+bpf,+net_admin".to_owned()),
            "{argv:?}"
        );
        assert!(argv.contains(&"--clear-groups".to_owned()), "{argv:?}");
        assert!(!argv.contains(&"--no-new-privs".to_owned()), "{argv:?}");
    }

    #[test]
    fn denials_are_found_without_colours() {
        let log = "\u{1b}[2mt\u{1b}[0m INFO ok\n\u{1b}[33m WARN\u{1b}[0m routes error=netlink: \
                   Operation not permitted (os error 1)\n";
        assert_eq!(
            first_denial(log).as_deref(),
            Some(" WARN routes error=netlink: Operation not permitted (os error 1)")
        );
        assert_eq!(first_denial("INFO all fine\n"), None);
    }

    #[test]
    fn runtime_defaults_and_missing_users() {
        let m = manifests(
            json!({ "runAsUser": 0, "runAsGroup": 0 }),
            json!({ "capabilities": { "drop": ["NET_RAW"] } }),
        );
        let c = m.container("w", "c").unwrap();
        assert!(c.bounding.contains("dac_override") && !c.bounding.contains("net_raw"));
        let m = manifests(json!({ "runAsUser": 1 }), json!({}));
        let e = m.container("w", "c").unwrap_err().to_string();
        assert!(e.contains("runAsGroup"), "{e}");
        let m = manifests(
            json!({ "runAsNonRoot": true }),
            json!({ "runAsUser": 0, "runAsGroup": 0 }),
        );
        assert!(m.container("w", "c").is_err());
    }
}
