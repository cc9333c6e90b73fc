//! A stand-in for the Deployment controller and the kubelet, for the Deployments the fabric's
//! controllers create (the test API server runs neither): each selected Deployment's first
//! container runs as a process of this workspace's binary of the same name as the
//! container's command, with the template's args and env, restarted when it dies (restart
//! policy Always), replaced when the template changes, stopped (SIGTERM, then SIGKILL) when
//! the Deployment goes.
//!
//! As a pod would, the process talks to the API server as the template's ServiceAccount: a
//! token requested for it (TokenRequest, `kubectl create token`) in a copy of the component
//! kubeconfig. So with RBAC enforced (`KUBELITE_AUTH=1`) it can only do what the Roles the
//! controller made allow. `valueFrom.fieldRef` env (`status.podIP`, `metadata.name`,
//! `metadata.namespace`) resolves to the pod address given here, the Deployment's name with a
//! replica suffix and its namespace; other sources are not supported and fail the start.
//! The process runs as the template's container would (`runAsUser`, `runAsGroup`,
//! capabilities, ... through `setpriv`, see [`crate::manifests`]): a template that names no
//! user and group fails the start. Production code never knows it runs under this.
use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;

use crate::{
    locate_bin,
    manifests::{Container, Manifests},
};

/// Where and how the selected Deployments' processes run.
#[derive(Debug, Clone)]
pub struct Options {
    /// For reading Deployments and requesting ServiceAccount tokens (the host's admin one).
    pub admin_kubeconfig: PathBuf,
    /// What the processes' kubeconfigs are made from (server and CA; its credentials are
    /// replaced by the ServiceAccount's token): for a process in a cluster network, that
    /// network's in-cluster kubeconfig.
    pub component_kubeconfig: PathBuf,
    /// Label selector of the Deployments to run.
    pub selector: String,
    /// The network namespace the processes run in (None: this one), and their address there
    /// (`status.podIP`).
    pub netns: Option<String>,
    pub pod_ip: String,
    /// Logs (`<namespace>.<deployment>.log`, appended across restarts) and kubeconfigs.
    pub dir: PathBuf,
}

struct Running {
    /// The Deployment's uid: one deleted and created again between two rounds (same name,
    /// generation 1 again) is another Deployment, whose pod a kubelet would start afresh.
    uid: String,
    generation: i64,
    child: Child,
    restarts: u32,
    /// What the template gives its container, which the process runs as.
    container: Container,
}

#[derive(Default)]
struct State {
    running: BTreeMap<String, Running>,
    /// The last start failure per Deployment, for test failure messages.
    errors: BTreeMap<String, String>,
}

pub struct Deployments {
    opts: Options,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What is run of one Deployment.
#[derive(Debug, Clone, PartialEq)]
struct Template {
    key: String,
    namespace: String,
    name: String,
    uid: String,
    generation: i64,
    service_account: String,
    command: Vec<String>,
    args: Vec<String>,
    env: Vec<serde_json::Value>,
    /// The Deployment as listed (for its container's credentials).
    object: serde_json::Value,
}

fn templates(list: &serde_json::Value) -> Vec<Template> {
    let mut out = Vec::new();
    for d in list["items"].as_array().into_iter().flatten() {
        let meta = &d["metadata"];
        let (ns, name) = (
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
        );
        if d["spec"]["replicas"].as_i64() == Some(0) || meta["deletionTimestamp"].is_string() {
            continue;
        }
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        out.push(Template {
            key: format!("{ns}.{name}"),
            namespace: ns.to_owned(),
            name: name.to_owned(),
            uid: meta["uid"].as_str().unwrap_or_default().to_owned(),
            generation: meta["generation"].as_i64().unwrap_or_default(),
            service_account: pod["serviceAccountName"]
                .as_str()
                .unwrap_or("default")
                .to_owned(),
            command: strings(&c["command"]),
            args: strings(&c["args"]),
            env: c["env"].as_array().cloned().unwrap_or_default(),
            object: d.clone(),
        });
    }
    out
}

impl Deployments {
    pub fn start(opts: Options) -> Result<Self> {
        std::fs::create_dir_all(&opts.dir)?;
        let state: Arc<Mutex<State>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        // The Deployments come from a watch, not a listing per round: this round runs about
        // three times a second for as long as a test does, and the API server serving a list
        // each time is much of what an idle test bed costs it.
        // (Its runtime is the thread's own: this may be called from within another. One
        // worker drives the watch between rounds.)
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let thread = std::thread::spawn({
            let (opts, state, stop) = (opts.clone(), state.clone(), stop.clone());
            move || {
                let watched = rt.block_on(async {
                    use futures::StreamExt as _;
                    use kube::runtime::{WatchStreamExt as _, reflector, watcher};
                    let client = crate::apiserver::client_for(&opts.admin_kubeconfig).await?;
                    let (reader, writer) = reflector::store::<Deployment>();
                    let config = watcher::Config::default().labels(&opts.selector);
                    let watch = reflector(writer, watcher(kube::Api::all(client), config))
                        .default_backoff()
                        .for_each(|_| std::future::ready(()));
                    tokio::spawn(watch);
                    reader
                        .wait_until_ready()
                        .await
                        .context("watching Deployments")?;
                    anyhow::Ok(reader)
                });
                let deployments = match watched {
                    Ok(d) => d,
                    Err(e) => {
                        let mut st = state.lock().unwrap();
                        st.errors.insert("(client)".into(), format!("{e:#}"));
                        return;
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = round(&deployments, &opts, &state) {
                        state
                            .lock()
                            .unwrap()
                            .errors
                            .insert("(listing)".into(), format!("{e:#}"));
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
                rt.shutdown_background();
            }
        });
        Ok(Self {
            opts,
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// The pid of the process running Deployment `namespace/name`, if one runs.
    pub fn pid(&self, namespace: &str, name: &str) -> Option<u32> {
        let mut st = self.state.lock().unwrap();
        let r = st.running.get_mut(&format!("{namespace}.{name}"))?;
        match r.child.try_wait() {
            Ok(None) => Some(r.child.id()),
            _ => None,
        }
    }

    /// How often the process of `namespace/name` was restarted after dying.
    pub fn restarts(&self, namespace: &str, name: &str) -> u32 {
        let st = self.state.lock().unwrap();
        st.running
            .get(&format!("{namespace}.{name}"))
            .map_or(0, |r| r.restarts)
    }

    /// SIGKILLs the process of `namespace/name` (as when its container is killed); it is
    /// restarted by the next round.
    pub fn kill(&self, namespace: &str, name: &str) -> Result<()> {
        let pid = self
            .pid(namespace, name)
            .with_context(|| format!("no process runs {namespace}/{name}"))?;
        // SAFETY: signalling a child this fixture started and has not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        Ok(())
    }

    /// Checks that every running process has the user, groups and capabilities its
    /// Deployment's container gives it; returns how many were checked.
    pub fn check_credentials(&self) -> Result<usize> {
        let mut st = self.state.lock().unwrap();
        let mut checked = 0;
        for (k, r) in &mut st.running {
            if let Ok(None) = r.child.try_wait() {
                r.container
                    .check_process(r.child.id())
                    .with_context(|| format!("Deployment {k}"))?;
                checked += 1;
            }
        }
        Ok(checked)
    }

    /// Every process's pid, for memory measurements.
    pub fn pids(&self) -> Vec<u32> {
        let mut st = self.state.lock().unwrap();
        st.running
            .values_mut()
            .filter_map(|r| matches!(r.child.try_wait(), Ok(None)).then(|| r.child.id()))
            .collect()
    }

    /// Start failures and the last lines of every process's log, for failure messages.
    pub fn report(&self) -> String {
        let st = self.state.lock().unwrap();
        let mut s = String::new();
        for (k, e) in &st.errors {
            s += &format!("--- {k}: start failed: {e}\n");
        }
        for k in st.running.keys() {
            let text =
                std::fs::read_to_string(self.opts.dir.join(format!("{k}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            s += &format!(
                "--- {k} ---\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        s
    }
}

fn round(
    deployments: &kube::runtime::reflector::Store<Deployment>,
    opts: &Options,
    state: &Mutex<State>,
) -> Result<()> {
    let items = deployments.state();
    let items: Vec<&Deployment> = items.iter().map(|d| d.as_ref()).collect();
    let list = serde_json::json!({ "items": items });
    let wanted = templates(&list);
    let mut st = state.lock().unwrap();
    // Gone, or changed: stop the old process.
    let stale: Vec<String> = st
        .running
        .iter()
        .filter(|(k, r)| {
            !wanted
                .iter()
                .any(|t| &t.key == *k && t.uid == r.uid && t.generation == r.generation)
        })
        .map(|(k, _)| k.clone())
        .collect();
    for k in stale {
        if let Some(mut r) = st.running.remove(&k) {
            terminate(&mut r.child);
        }
    }
    for t in &wanted {
        let restarts = match st.running.get_mut(&t.key) {
            Some(r) => match r.child.try_wait() {
                Ok(None) => continue,
                _ => r.restarts + 1,
            },
            None => 0,
        };
        match spawn(opts, t) {
            Ok((child, container)) => {
                st.errors.remove(&t.key);
                st.running.insert(
                    t.key.clone(),
                    Running {
                        uid: t.uid.clone(),
                        generation: t.generation,
                        child,
                        restarts,
                        container,
                    },
                );
            }
            Err(e) => {
                st.errors.insert(t.key.clone(), format!("{e:#}"));
            }
        }
    }
    Ok(())
}

/// As the kubelet stops a container: SIGTERM, then SIGKILL after a grace period.
fn terminate(child: &mut Child) {
    // SAFETY: signalling a child this fixture started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The component kubeconfig with the ServiceAccount's token as its only credential.
fn service_account_kubeconfig(opts: &Options, t: &Template) -> Result<PathBuf> {
    let path = opts.dir.join(format!("{}.kubeconfig", t.key));
    crate::rights::token_kubeconfig(
        &opts.admin_kubeconfig,
        &opts.component_kubeconfig,
        &t.namespace,
        &t.service_account,
        &path,
    )?;
    Ok(path)
}

fn spawn(opts: &Options, t: &Template) -> Result<(Child, Container)> {
    let c_name = t.object["spec"]["template"]["spec"]["containers"][0]["name"]
        .as_str()
        .with_context(|| format!("{}: the template's container has no name", t.key))?;
    // Listed by `get deployments`: a Deployment, whether or not the list item says so.
    let mut object = t.object.clone();
    object["apiVersion"] = "apps/v1".into();
    object["kind"] = "Deployment".into();
    let container = Manifests::from_objects(vec![object])?.container(&t.name, c_name)?;
    let program = t
        .command
        .first()
        .with_context(|| format!("{}: the template has no command", t.key))?;
    // The image's entry point, as this workspace builds it.
    let bin = locate_bin(program.rsplit('/').next().unwrap_or(program))?;
    let kubeconfig = service_account_kubeconfig(opts, t)?;
    let mut env = vec![("KUBECONFIG".to_owned(), kubeconfig.display().to_string())];
    for e in &t.env {
        let name = e["name"].as_str().unwrap_or_default().to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("status.podIP") => opts.pod_ip.clone(),
                Some("metadata.name") => format!("{}-0", t.name),
                Some("metadata.namespace") => t.namespace.clone(),
                _ => bail!("{}: env {name}: unsupported source {e}", t.key),
            }
        };
        env.push((name, value));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(opts.dir.join(format!("{}.log", t.key)))?;
    let mut c = match &opts.netns {
        Some(ns) => {
            let keep = opts.dir.join(format!("{}.mnt", t.key));
            let argv = container.enter(ns, &keep)?;
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]).arg(&bin);
            c
        }
        None => container.command(&bin)?,
    };
    c.args(&t.args)
        .env_remove("KUBECONFIG")
        .envs(env)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let child =
        fabric_netns::process::spawn(c).with_context(|| format!("starting {}", bin.display()))?;
    Ok((child, container))
}

impl Drop for Deployments {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut st = self.state.lock().unwrap();
        for r in st.running.values_mut() {
            terminate(&mut r.child);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_list_yields_what_to_run() {
        let list = serde_json::json!({ "items": [
            { "metadata": { "namespace": "ns", "name": "d", "generation": 2 },
              "spec": { "replicas": 1, "template": { "spec": {
                  "serviceAccountName": "sa",
                  "containers": [{ "name": "c", "command": ["fabric-virtual-kubelet"],
                                   "args": ["--x", "1"],
                                   "env": [{ "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }] }] } } } },
            { "metadata": { "namespace": "ns", "name": "scaled-down" }, "spec": { "replicas": 0 } },
        ]});
        let t = templates(&list);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].key, "ns.d");
        assert_eq!(t[0].generation, 2);
        assert_eq!(t[0].service_account, "sa");
        assert_eq!(t[0].command, ["fabric-virtual-kubelet"]);
        assert_eq!(t[0].args, ["--x", "1"]);
        assert_eq!(t[0].env.len(), 1);
    }
}
