//! The test node's pods: a watch of the pods bound to the node and one worker task per pod,
//! which sets up the pod's network (namespace, veth, address, routes), runs its containers as
//! processes inside it, writes their output as CRI logs, restarts them as the policy says,
//! reports status, and tears everything down on deletion. The decisions are [`super::status`]'s.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    io::{BufRead as _, BufReader, Read, Write as _},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result};
use futures::StreamExt;
use ipnetwork::Ipv4Network;
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tracing::{info, warn};

use super::{
    HOLLOW_ANNOTATION, MIRROR_ANNOTATION, claims, config, files,
    logs::{Entry, Stream},
    pick_address,
    podnet::{build_net, remove_net},
    status::{self, AfterExit, Exit, Run},
};

/// Where the logs of one container are, for the kubelet API.
#[derive(Debug, Clone)]
pub struct LogRef {
    pub dir: PathBuf,
    /// The current run (0 for the first, = restartCount).
    pub run: i32,
    /// Whether that run's process is still alive (a follow ends when it is not).
    pub running: bool,
    /// The pod's network namespace (where exec and port-forward go).
    pub netns: String,
}

/// Why `image` cannot be pulled, as a kubelet would say it, when its registry is under
/// `.invalid` (RFC 6761: never resolves): the one way a test pod asks for an image pull
/// failure. Images are otherwise ignored.
pub fn unpullable(image: &str) -> Option<String> {
    let (host, _) = image.split_once('/')?;
    let name = host.split(':').next().unwrap_or(host);
    name.ends_with(".invalid").then(|| {
        format!(
            "failed to pull and unpack image \"{image}\": failed to resolve reference: dial \
             tcp: lookup {name}: no such host"
        )
    })
}

impl LogRef {
    pub fn file(&self, run: i32) -> PathBuf {
        self.dir.join(format!("{run}.log"))
    }
}

/// (namespace, pod, container) → its logs.
pub type LogIndex = Arc<Mutex<HashMap<(String, String, String), LogRef>>>;

/// The node's settings every worker needs.
pub struct Node {
    pub client: Client,
    pub name: String,
    pub ip: String,
    pub pod_cidr: Ipv4Network,
    /// The pods' next hop (put on every host-side veth).
    pub pod_gateway: Ipv4Addr,
    pub hollow: bool,
    pub root: PathBuf,
    pub backoff: Duration,
    pub logs: LogIndex,
    /// Addresses in use or reserved.
    pub taken: Mutex<BTreeSet<Ipv4Addr>>,
    /// Where commands without a slash are looked for first (the test node's own directory,
    /// which holds `fabric-test-pod`), before PATH.
    pub bin_dir: Option<PathBuf>,
    pub seq: std::sync::atomic::AtomicU32,
}

/// How often the volumes' objects are read again while the pod runs.
const VOLUME_SYNC: Duration = Duration::from_secs(1);

enum Msg {
    Update(Box<Pod>),
    Gone,
    Exited { idx: usize, run: i32, code: i32 },
    RestartDue { idx: usize },
    GraceOver,
}

/// Watches the pods bound to the node and runs a worker per pod, for ever.
pub async fn run(node: Arc<Node>) {
    let api: Api<Pod> = Api::all(node.client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", node.name));
    let mut events = watcher(api, cfg).default_backoff().boxed();
    let mut workers: HashMap<String, UnboundedSender<Msg>> = HashMap::new();
    let mut seen_in_init: HashSet<String> = HashSet::new();
    // Pods whose worker ended (deleted by us): late events must not start them again.
    let mut finished: HashSet<String> = HashSet::new();
    let (done_tx, mut done_rx) = unbounded_channel::<String>();
    loop {
        let ev = tokio::select! {
            Some(uid) = done_rx.recv() => {
                workers.remove(&uid);
                finished.insert(uid);
                continue;
            }
            ev = events.next() => ev,
        };
        let Some(ev) = ev else { break };
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                warn!(error = %e, "pod watch");
                continue;
            }
        };
        let apply = |pod: Pod,
                     workers: &mut HashMap<String, UnboundedSender<Msg>>,
                     finished: &HashSet<String>| {
            let Some(uid) = pod.uid() else { return };
            if is_mirror(&pod) || finished.contains(&uid) {
                return;
            }
            if let Some(tx) = workers.get(&uid) {
                let _ = tx.send(Msg::Update(Box::new(pod)));
                return;
            }
            let (tx, rx) = unbounded_channel();
            workers.insert(uid.clone(), tx.clone());
            let (node, done) = (node.clone(), done_tx.clone());
            tokio::spawn(async move {
                let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                if let Err(e) = worker(node, pod, tx, rx).await {
                    warn!(pod = name, error = %format!("{e:#}"), "pod worker");
                }
                let _ = done.send(uid);
            });
        };
        match ev {
            watcher::Event::Init => seen_in_init.clear(),
            watcher::Event::InitApply(pod) => {
                if let Some(uid) = pod.uid() {
                    seen_in_init.insert(uid);
                }
                apply(pod, &mut workers, &finished);
            }
            watcher::Event::InitDone => {
                // Pods deleted while the watch was down.
                for (uid, tx) in &workers {
                    if !seen_in_init.contains(uid) {
                        let _ = tx.send(Msg::Gone);
                    }
                }
            }
            watcher::Event::Apply(pod) => apply(pod, &mut workers, &finished),
            watcher::Event::Delete(pod) => {
                if let Some(tx) = pod.uid().and_then(|u| workers.get(&u)) {
                    let _ = tx.send(Msg::Gone);
                }
            }
        }
    }
}

fn is_mirror(p: &Pod) -> bool {
    p.annotations().contains_key(MIRROR_ANNOTATION)
}

fn is_hollow(node: &Node, p: &Pod) -> bool {
    node.hollow
        || p.annotations()
            .get(HOLLOW_ANNOTATION)
            .is_some_and(|v| v == "true")
}

/// One container of the worker's pod.
struct Ctr {
    spec: k8s_openapi::api::core::v1::Container,
    state: status::Container,
    /// Process group of the current run.
    pid: Option<i32>,
    log_dir: PathBuf,
}

/// The pod's network: its namespace and the host side of its veth.
struct Net {
    ns: String,
}

struct Worker {
    node: Arc<Node>,
    pod: Pod,
    api: Api<Pod>,
    tx: UnboundedSender<Msg>,
    ip: Option<Ipv4Addr>,
    net: Option<Net>,
    hollow: bool,
    ctrs: Vec<Ctr>,
    start_time: Timestamp,
    terminating: bool,
    last_status: Option<serde_json::Value>,
    /// The ConfigMaps and Secrets the containers' environment takes values from, as read
    /// when the pod started, and those its volumes show (read again while it runs).
    config: config::Loaded,
    /// Its directory: the containers' logs, its `/etc/hosts` and volumes.
    dir: PathBuf,
    /// The volumes the test node materializes (configMap, secret, projected).
    volumes: BTreeSet<String>,
    /// The claims' volumes: volume name → the bound PV's host directory.
    claims: BTreeMap<String, PathBuf>,
}

async fn worker(
    node: Arc<Node>,
    pod: Pod,
    tx: UnboundedSender<Msg>,
    mut rx: UnboundedReceiver<Msg>,
) -> Result<()> {
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(node.client.clone(), &ns);
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
    if matches!(phase.as_deref(), Some("Succeeded" | "Failed")) {
        // Finished before this process started: nothing to run, only deletion to complete.
        let mut pod = pod;
        loop {
            if pod.metadata.deletion_timestamp.is_some() {
                return delete_now(&api, &pod).await;
            }
            match rx.recv().await {
                Some(Msg::Update(p)) => pod = *p,
                Some(Msg::Gone) | None => return Ok(()),
                Some(_) => {}
            }
        }
    }
    let hollow = is_hollow(&node, &pod);
    let uid = pod.uid().unwrap_or_default();
    let pod_dir = node.root.join(format!("{ns}_{}_{uid}", pod.name_any()));
    let ctrs = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|spec| Ctr {
            log_dir: pod_dir.join(&spec.name),
            state: status::Container {
                name: spec.name.clone(),
                image: spec.image.clone().unwrap_or_default(),
                run: Run::Waiting {
                    reason: "ContainerCreating".into(),
                    message: None,
                },
                last: None,
                restart_count: 0,
            },
            spec,
            pid: None,
        })
        .collect();
    let mut w = Worker {
        node,
        pod,
        api,
        tx,
        ip: None,
        net: None,
        hollow,
        ctrs,
        start_time: Timestamp::now(),
        terminating: false,
        last_status: None,
        config: config::Loaded::new(),
        dir: pod_dir,
        volumes: BTreeSet::new(),
        claims: BTreeMap::new(),
    };
    let r = w.live(&mut rx).await;
    w.teardown();
    r
}

impl Worker {
    fn key(&self, ctr: &str) -> (String, String, String) {
        (
            self.pod.namespace().unwrap_or_default(),
            self.pod.name_any(),
            ctr.to_owned(),
        )
    }

    /// Reads what the containers' environment takes from ConfigMaps and Secrets, and holds
    /// them in `CreateContainerConfigError` (saying what is missing) until it is all there,
    /// as a kubelet does. `false`: the pod went meanwhile.
    async fn await_config(&mut self, rx: &mut UnboundedReceiver<Msg>) -> bool {
        let specs: Vec<_> = self.ctrs.iter().map(|c| c.spec.clone()).collect();
        let mut wanted = config::wanted(&specs);
        wanted.extend(
            self.pod
                .spec
                .as_ref()
                .map(files::wanted)
                .unwrap_or_default(),
        );
        if wanted.is_empty() || self.hollow {
            return true;
        }
        let ns = self.pod.namespace().unwrap_or_default();
        loop {
            let missing = match config::load(&self.node.client, &ns, &wanted).await {
                Ok(loaded) => {
                    let missing = specs
                        .iter()
                        .find_map(|c| config::env(c, &ns, &loaded).err())
                        .or_else(|| self.write_volumes(&loaded).err());
                    self.config = loaded;
                    missing
                }
                Err(e) => Some(format!("reading the pod's configuration: {e}")),
            };
            let Some(message) = missing else {
                return true;
            };
            for c in &mut self.ctrs {
                c.state.run = Run::Waiting {
                    reason: "CreateContainerConfigError".into(),
                    message: Some(message.clone()),
                };
            }
            self.report().await;
            if !self.pause(rx).await {
                return false;
            }
        }
    }

    /// Waits a second for another look, following the pod's updates. `false`: the pod went or
    /// is being deleted.
    async fn pause(&mut self, rx: &mut UnboundedReceiver<Msg>) -> bool {
        let wait = tokio::time::sleep(std::time::Duration::from_secs(1));
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => return true,
                msg = rx.recv() => match msg {
                    None | Some(Msg::Gone) => return false,
                    Some(Msg::Update(p)) => {
                        self.pod = *p;
                        if self.pod.metadata.deletion_timestamp.is_some() {
                            return false;
                        }
                    }
                    Some(_) => {}
                },
            }
        }
    }

    /// Waits until every claim the pod mounts is bound to a PV with a host directory, in
    /// `ContainerCreating` with the kubelet's message meanwhile (and a `FailedMount` Warning
    /// Event each time the message changes). `false`: the pod went.
    async fn await_claims(&mut self, rx: &mut UnboundedReceiver<Msg>) -> bool {
        if self.hollow || claims::wanted(&self.pod).is_empty() {
            return true;
        }
        let events = fabric_kube::events::Events::new(
            self.node.client.clone(),
            "kubelet",
            Some(self.node.name.clone()),
        );
        let mut said: Option<String> = None;
        loop {
            match claims::load(&self.node.client, &self.pod).await {
                Ok(dirs) => {
                    self.claims = dirs;
                    return true;
                }
                Err(message) => {
                    if said.as_ref() != Some(&message) {
                        let ev = fabric_kube::events::Event::warning(
                            "FailedMount",
                            "Mount",
                            format!("Unable to attach or mount volumes: {message}"),
                        );
                        events.publish(&self.pod, &ev).await;
                        said = Some(message.clone());
                    }
                    for c in &mut self.ctrs {
                        c.state.run = Run::Waiting {
                            reason: "ContainerCreating".into(),
                            message: Some(message.clone()),
                        };
                    }
                    self.report().await;
                }
            }
            if !self.pause(rx).await {
                return false;
            }
        }
    }

    /// Writes the volumes' files from `loaded`; `Err`: what is missing, or why they could
    /// not be written.
    fn write_volumes(&mut self, loaded: &config::Loaded) -> Result<(), String> {
        let volumes = files::volumes(&self.pod, loaded)?;
        for (name, content) in &volumes {
            files::write(&self.dir.join("volumes").join(name), content)
                .map_err(|e| format!("writing volume {name}: {e}"))?;
        }
        self.volumes = volumes.into_keys().collect();
        Ok(())
    }

    /// Reads the volumes' objects again and rewrites what changed, as a kubelet's periodic
    /// sync does (a missing object leaves the files as they were).
    async fn refresh_volumes(&mut self) {
        let Some(spec) = self.pod.spec.as_ref() else {
            return;
        };
        let wanted = files::wanted(spec);
        if wanted.is_empty() || self.hollow {
            return;
        }
        let ns = self.pod.namespace().unwrap_or_default();
        if let Ok(loaded) = config::load(&self.node.client, &ns, &wanted).await
            && let Err(e) = self.write_volumes(&loaded)
        {
            warn!(
                pod = self.pod.name_any(),
                error = e,
                "volumes not refreshed"
            );
        }
    }

    async fn live(&mut self, rx: &mut UnboundedReceiver<Msg>) -> Result<()> {
        if self.pod.metadata.deletion_timestamp.is_none()
            && !(self.await_config(rx).await && self.await_claims(rx).await)
        {
            if self.pod.metadata.deletion_timestamp.is_some() {
                return delete_now(&self.api, &self.pod).await;
            }
            return Ok(());
        }
        if self.pod.metadata.deletion_timestamp.is_none() {
            self.setup().await;
            for idx in 0..self.ctrs.len() {
                self.start(idx);
            }
            self.report().await;
        }
        loop {
            if self.pod.metadata.deletion_timestamp.is_some() && !self.terminating {
                self.terminate();
            }
            if self.terminating && self.ctrs.iter().all(|c| c.pid.is_none()) {
                self.teardown();
                return delete_now(&self.api, &self.pod).await;
            }
            let msg = tokio::select! {
                m = rx.recv() => m,
                () = tokio::time::sleep(VOLUME_SYNC), if !self.volumes.is_empty() => {
                    self.refresh_volumes().await;
                    continue;
                }
            };
            let Some(msg) = msg else {
                return Ok(());
            };
            match msg {
                Msg::Update(p) => {
                    self.pod = *p;
                    continue;
                }
                Msg::Gone => {
                    info!(pod = self.pod.name_any(), "deleted");
                    return Ok(());
                }
                Msg::Exited { idx, run, code } => self.exited(idx, run, code),
                Msg::RestartDue { idx } => {
                    if !self.terminating
                        && matches!(
                            self.ctrs[idx].state.run,
                            Run::Exited {
                                restarting: true,
                                ..
                            }
                        )
                    {
                        self.start(idx);
                    }
                }
                Msg::GraceOver => {
                    for c in &self.ctrs {
                        if let Some(pid) = c.pid {
                            // SAFETY: plain syscall on the process group this worker started.
                            unsafe { libc::kill(-pid, libc::SIGKILL) };
                        }
                    }
                }
            }
            if !self.terminating {
                self.report().await;
            }
        }
    }

    /// Allocates the address and, unless hollow, builds the namespace and veth.
    async fn setup(&mut self) {
        let ip = {
            let mut taken = self.node.taken.lock().unwrap_or_else(|e| e.into_inner());
            let ip = pick_address(self.node.pod_cidr, self.node.pod_gateway, &taken);
            if let Some(ip) = ip {
                taken.insert(ip);
            }
            ip
        };
        let Some(ip) = ip else {
            self.fail_all(
                "NetworkNotReady",
                format!("no free address in {}", self.node.pod_cidr),
            );
            return;
        };
        self.ip = Some(ip);
        if self.hollow {
            return;
        }
        let hosts = files::hosts(&self.pod, &ip.to_string());
        if let Err(e) = std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::write(self.dir.join("hosts"), hosts))
        {
            self.fail_all("NetworkSetupError", format!("writing /etc/hosts: {e}"));
            return;
        }
        let uid = self.pod.uid().unwrap_or_default();
        let ns = format!("fabt-{}-pod-{uid}", std::process::id());
        let seq = self
            .node
            .seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let host = format!("tp{seq:x}");
        let gw = self.node.pod_gateway;
        self.net = Some(Net { ns: ns.clone() });
        let r = tokio::task::spawn_blocking(move || build_net(&ns, &host, ip, gw)).await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail_all("NetworkSetupError", format!("{e:#}")),
            Err(e) => self.fail_all("NetworkSetupError", e.to_string()),
        }
    }

    fn fail_all(&mut self, reason: &str, message: String) {
        warn!(pod = self.pod.name_any(), reason, message, "cannot start");
        for c in &mut self.ctrs {
            c.state.run = Run::Waiting {
                reason: reason.into(),
                message: Some(message.clone()),
            };
        }
    }

    fn network_ok(&self) -> bool {
        self.ip.is_some() && (self.hollow || self.net.is_some())
            && !self.ctrs.iter().any(|c| {
                matches!(&c.state.run, Run::Waiting { reason, .. } if reason.starts_with("Network"))
            })
    }

    fn start(&mut self, idx: usize) {
        if !self.network_ok() {
            return;
        }
        let now = Timestamp::now();
        let run = self.ctrs[idx].state.restart_count;
        if self.hollow {
            self.ctrs[idx].state.run = Run::Running { started: now };
            return;
        }
        if let Some(why) = unpullable(self.ctrs[idx].spec.image.as_deref().unwrap_or_default()) {
            self.ctrs[idx].state.run = Run::Waiting {
                reason: "ErrImagePull".into(),
                message: Some(why),
            };
            return;
        }
        let argv: Vec<String> = {
            let s = &self.ctrs[idx].spec;
            s.command
                .clone()
                .unwrap_or_default()
                .into_iter()
                .chain(s.args.clone().unwrap_or_default())
                .collect()
        };
        if argv.is_empty() {
            self.ctrs[idx].state.run = Run::Waiting {
                reason: "CreateContainerError".into(),
                message: Some("no command: the test node ignores images, give command/args".into()),
            };
            return;
        }
        let key = self.key(&self.ctrs[idx].spec.name);
        let log_dir = self.ctrs[idx].log_dir.clone();
        let env = self.env(idx);
        let ns = self.net.as_ref().map(|n| n.ns.clone()).unwrap_or_default();
        let mounts: Vec<files::Mount> = self.ctrs[idx]
            .spec
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| {
                let (from, read_only) = if self.volumes.contains(&m.name) {
                    (self.dir.join("volumes").join(&m.name), true)
                } else {
                    (self.claims.get(&m.name)?.clone(), m.read_only == Some(true))
                };
                let from = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                    Some(sub) => from.join(sub),
                    None => from,
                };
                Some(files::Mount {
                    from: from.display().to_string(),
                    at: m.mount_path.clone(),
                    read_only,
                })
            })
            .collect();
        let script = files::mount_script(&self.dir.join("hosts"), &mounts);
        match spawn_container(
            &ns,
            &script,
            &self.resolve(&argv[0]),
            &argv[1..],
            &env,
            &log_dir,
            run,
            idx,
            self.tx.clone(),
        ) {
            Ok(pid) => {
                self.ctrs[idx].pid = Some(pid);
                self.ctrs[idx].state.run = Run::Running { started: now };
                self.node
                    .logs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(
                        key,
                        LogRef {
                            dir: log_dir,
                            run,
                            running: true,
                            netns: ns,
                        },
                    );
            }
            Err(e) => {
                self.ctrs[idx].state.run = Run::Waiting {
                    reason: "RunContainerError".into(),
                    message: Some(format!("{e:#}")),
                }
            }
        }
    }

    fn resolve(&self, cmd: &str) -> String {
        if !cmd.contains('/')
            && let Some(p) = self.node.bin_dir.as_ref().map(|d| d.join(cmd))
            && p.is_file()
        {
            return p.display().to_string();
        }
        cmd.to_owned()
    }

    /// The container's environment: literal values and the downward API's common fields.
    fn env(&self, idx: usize) -> Vec<(String, String)> {
        let mut out = vec![("HOSTNAME".to_owned(), self.pod.name_any())];
        for e in self.ctrs[idx].spec.env.clone().unwrap_or_default() {
            let field = e
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str());
            let value = match field {
                Some("metadata.name") => Some(self.pod.name_any()),
                Some("metadata.namespace") => self.pod.namespace(),
                Some("spec.nodeName") => Some(self.node.name.clone()),
                Some("status.podIP") => self.ip.map(|i| i.to_string()),
                Some("status.hostIP") => Some(self.node.ip.clone()),
                Some(_) => None,
                None => e.value.clone(),
            };
            if e.value_from
                .as_ref()
                .is_some_and(|v| v.config_map_key_ref.is_some() || v.secret_key_ref.is_some())
            {
                continue;
            }
            out.push((e.name, value.unwrap_or_default()));
        }
        // Resolved before the pod started ([`Self::await_config`]), after the literal ones.
        let ns = self.pod.namespace().unwrap_or_default();
        out.extend(config::env(&self.ctrs[idx].spec, &ns, &self.config).unwrap_or_default());
        out
    }

    fn exited(&mut self, idx: usize, run: i32, code: i32) {
        let c = &mut self.ctrs[idx];
        if c.state.restart_count != run || c.pid.is_none() {
            return;
        }
        c.pid = None;
        let started = match &c.state.run {
            Run::Running { started } => *started,
            _ => Timestamp::now(),
        };
        let exit = Exit {
            code,
            started,
            finished: Timestamp::now(),
        };
        let key = self.key(&self.ctrs[idx].spec.name);
        if let Some(l) = self
            .node
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&key)
        {
            l.running = false;
        }
        let c = &mut self.ctrs[idx];
        info!(
            pod = self.pod.name_any(),
            container = c.spec.name,
            code,
            "exited"
        );
        let policy = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref());
        match status::after_exit(policy, code, c.state.restart_count, self.node.backoff) {
            AfterExit::Restart(delay) if !self.terminating => {
                c.state.run = Run::Exited {
                    exit: exit.clone(),
                    restarting: true,
                };
                c.state.last = Some(exit);
                c.state.restart_count += 1;
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = tx.send(Msg::RestartDue { idx });
                });
            }
            _ => {
                c.state.run = Run::Exited {
                    exit,
                    restarting: false,
                }
            }
        }
    }

    /// Graceful deletion: SIGTERM now, SIGKILL when the grace period is over.
    fn terminate(&mut self) {
        self.terminating = true;
        let grace = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0) as u64;
        info!(pod = self.pod.name_any(), grace, "terminating");
        for c in &self.ctrs {
            if let Some(pid) = c.pid {
                // SAFETY: plain syscall on the process group this worker started.
                unsafe { libc::kill(-pid, libc::SIGTERM) };
            }
        }
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(grace)).await;
            let _ = tx.send(Msg::GraceOver);
        });
    }

    /// Writes the status when it changed.
    async fn report(&mut self) {
        let states: Vec<status::Container> = self.ctrs.iter().map(|c| c.state.clone()).collect();
        let previous = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let ip = self.ip.map(|i| i.to_string());
        let st = status::pod_status(&status::Observed {
            host_ip: &self.node.ip,
            pod_ip: ip.as_deref(),
            start_time: self.start_time,
            containers: &states,
            previous: &previous,
            now: Timestamp::now(),
        });
        let body = serde_json::json!({ "status": st });
        if self.last_status.as_ref() == Some(&body) {
            return;
        }
        match self
            .api
            .patch_status(
                &self.pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&body),
            )
            .await
        {
            Ok(p) => {
                self.pod = p;
                self.last_status = Some(body);
            }
            Err(e) => warn!(pod = self.pod.name_any(), error = %e, "writing status"),
        }
    }

    /// Kills what is left, removes the namespace (and with it the veth) and frees the address.
    fn teardown(&mut self) {
        for c in &mut self.ctrs {
            if let Some(pid) = c.pid.take() {
                // SAFETY: plain syscall on the process group this worker started.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        }
        if let Some(net) = self.net.take() {
            remove_net(&net.ns);
        }
        if let Some(ip) = self.ip.take() {
            self.node
                .taken
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&ip);
        }
        let mut logs = self.node.logs.lock().unwrap_or_else(|e| e.into_inner());
        for c in &self.ctrs {
            logs.remove(&self.key(&c.spec.name));
        }
    }
}

/// The final delete a kubelet sends once the pod's containers are gone.
async fn delete_now(api: &Api<Pod>, pod: &Pod) -> Result<()> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&pod.name_any(), &dp).await {
        Ok(_) => {
            info!(pod = pod.name_any(), "removed");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e).context("deleting the pod"),
    }
}

/// Starts one run of a container in `ns` (its own process group) through `script`
/// ([`files::mount_script`]), its output written as CRI log lines to `log_dir/<run>.log`;
/// its exit is sent to the worker. Returns its pid.
#[allow(clippy::too_many_arguments)]
fn spawn_container(
    ns: &str,
    script: &str,
    cmd: &str,
    args: &[String],
    env: &[(String, String)],
    log_dir: &Path,
    run: i32,
    idx: usize,
    tx: UnboundedSender<Msg>,
) -> Result<i32> {
    std::fs::create_dir_all(log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir.join(format!("{run}.log")))?;
    let file = Arc::new(Mutex::new(file));
    let mut c = Command::new("ip");
    // `ip netns exec` gives the process a mount namespace of its own: the script's mounts
    // (its /etc/hosts, volumes) are the pod's only, then it becomes the command.
    c.args(["netns", "exec", ns, "sh", "-c", script, "sh", cmd])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    // Dies with the test node, which dies with the test.
    let mut child = fabric_netns::process::spawn(c).context("spawning")?;
    let pid = child.id() as i32;
    let copy = |r: Box<dyn Read + Send>, stream: Stream| {
        let file = file.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(r);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let partial = !buf.ends_with(b"\n");
                let content = buf.strip_suffix(b"\n").unwrap_or(&buf).to_vec();
                let line = Entry {
                    time: Timestamp::now(),
                    stream,
                    partial,
                    content,
                }
                .encode();
                let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
                let _ = f.write_all(&line);
            }
        })
    };
    let out = copy(
        Box::new(child.stdout.take().expect("piped stdout")),
        Stream::Stdout,
    );
    let err = copy(
        Box::new(child.stderr.take().expect("piped stderr")),
        Stream::Stderr,
    );
    std::thread::spawn(move || {
        let code = match child.wait() {
            Ok(st) => st
                .code()
                .or_else(|| std::os::unix::process::ExitStatusExt::signal(&st).map(|s| 128 + s))
                .unwrap_or(255),
            Err(_) => 255,
        };
        // The whole output is in the log before the exit is reported.
        let _ = out.join();
        let _ = err.join();
        let _ = tx.send(Msg::Exited { idx, run, code });
    });
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::unpullable;

    #[test]
    fn only_images_of_an_invalid_registry_fail_to_pull() {
        let why = unpullable("registry.invalid/shop/web:1.2").unwrap();
        assert!(why.contains("registry.invalid/shop/web:1.2"), "{why}");
        assert!(
            why.contains("lookup registry.invalid: no such host"),
            "{why}"
        );
        assert!(unpullable("registry.invalid:5000/web").is_some());
        assert_eq!(unpullable("busybox"), None);
        assert_eq!(unpullable("docker.io/library/busybox:1.36"), None);
        assert_eq!(unpullable("example.com/invalid/web"), None);
        assert_eq!(unpullable(""), None);
    }
}
