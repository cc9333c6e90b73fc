//! API-server fixture (shared by the crates' API-server tests). By default it starts a kubelite (../shared/kubelite/start.sh) per
//! test on a free loopback port; `FABRIC_TEST_APISERVER` names another start script with the
//! same contract (`start.sh DIR PORT` printing `export KUBECONFIG=...`), and
//! `FABRIC_TEST_KUBECONFIG` points the tests at an existing cluster instead.

use std::{
    collections::HashMap,
    io::ErrorKind,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub struct ApiServer {
    /// For clients in the host namespace (the tests, kubectl, fabricctl).
    pub kubeconfig: PathBuf,
    /// For components inside the API server's cluster network (see
    /// [`ApiServer::start_in_netns`]); the same file as `kubeconfig` otherwise.
    pub in_cluster_kubeconfig: PathBuf,
    run_dir: Option<PathBuf>,
    /// When the start script returned: a stopped server reports how long it lived.
    started: Instant,
    // Dropped after the server processes are killed (fields drop after `Drop::drop`).
    forwarder: Option<Forwarder>,
    /// Started on a copy of [`crate::etcd_seed`]'s data: the CRDs of this build are there.
    crds_in_etcd: bool,
}

/// Port of an API server inside its own namespace: nothing else listens there, so it can be
/// fixed, as a cluster's API server port would be.
pub const NETNS_API_PORT: u16 = 6443;
/// Concurrent forwarded connections (two threads each). Kube clients pool theirs, but every
/// watch holds one: a cluster's components, its virtual kubelets (a dozen watches each, more
/// per offloaded namespace) and its peers' controllers hold a few hundred together.
const MAX_FORWARDED: usize = 512;

fn free_port() -> u16 {
    // kubelite also takes PORT+1000 and PORT+1001 for etcd: all three must be free.
    for _ in 0..50 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p > 60000 {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", p + 1000)).is_ok()
            && TcpListener::bind(("127.0.0.1", p + 1001)).is_ok()
        {
            return p;
        }
    }
    panic!("no free port triple for the API server");
}

/// The server's state (etcd's data: about 100 MB), certificates and logs. The name is the test
/// beds' scratch prefix, so that the reaper of a later run finds the directory, and the etcd and
/// kubelite processes that name it, when this process was killed before its `Drop` ran: the
/// start script daemonizes both, so they do not die with us.
fn run_dir(tag: &str) -> PathBuf {
    fabric_netns::testbed::reap_stale();
    let dir = fabric_netns::testbed::scratch_dir(&format!("api-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

pub fn require_tools(test: &str) -> bool {
    for tool in ["kubectl", "etcd", "curl", "xz"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            assert!(
                std::env::var_os("CI").is_none(),
                "{test}: {tool} is missing in CI"
            );
            eprintln!("SKIPPED {test}: {tool} not installed (cargo xtask setup installs it)");
            return false;
        }
    }
    true
}

impl ApiServer {
    /// Like [`ApiServer::start`], with token authentication and RBAC enforced (kubelite's
    /// `KUBELITE_AUTH=1`); the kubeconfig is an admin's.
    pub fn start_with_auth(tag: &str) -> Self {
        Self::start_inner(tag, true, "", true)
    }

    /// Like [`ApiServer::start_with_auth`], with kubelite arguments (`KUBELITE_ARGS`), such
    /// as `--graceful-pod-deletion`.
    pub fn start_with_auth_args(tag: &str, args: &str) -> Self {
        Self::start_inner(tag, true, args, true)
    }

    /// An API server whose etcd holds the fabric's CRDs already (see [`crate::etcd_seed`]):
    /// [`ApiServer::install_crds`] finds them there.
    pub fn start(tag: &str) -> Self {
        Self::start_inner(tag, false, "", true)
    }

    /// An API server as a fresh cluster's: nothing of the fabric's in it, not even its CRDs
    /// (for what a cluster without the fabric says, and for installing it from nothing).
    pub fn start_bare(tag: &str) -> Self {
        Self::start_inner(tag, false, "", false)
    }

    /// [`ApiServer::start_bare`] with authentication and RBAC, as [`ApiServer::start_with_auth`].
    pub fn start_bare_with_auth(tag: &str) -> Self {
        Self::start_inner(tag, true, "", false)
    }

    /// The start script's `ETCD` when the server should start with the CRDs in etcd: only
    /// with our start script (another one may not take it).
    fn seeded_etcd() -> Option<PathBuf> {
        if std::env::var_os("FABRIC_TEST_APISERVER").is_some() {
            return None;
        }
        crate::etcd_seed::etcd_command()
    }

    /// The run directory (none against an existing cluster).
    pub(crate) fn run_dir(&self) -> Option<&Path> {
        self.run_dir.as_deref()
    }

    fn start_inner(tag: &str, auth: bool, args: &str, seeded: bool) -> Self {
        if let Some(kc) = std::env::var_os("FABRIC_TEST_KUBECONFIG") {
            let kc = PathBuf::from(kc);
            return Self {
                in_cluster_kubeconfig: kc.clone(),
                kubeconfig: kc,
                run_dir: None,
                started: Instant::now(),
                forwarder: None,
                crds_in_etcd: false,
            };
        }
        // Before the run directory: making the seed starts a server of its own.
        let etcd = seeded.then(Self::seeded_etcd).flatten();
        let dir = run_dir(tag);
        // The free ports are only free when looked at: a server of a test running beside
        // this one may take one (etcd's) in between. Then it starts again on others.
        let mut tries = 3;
        loop {
            let mut c = Command::new("bash");
            c.env("KUBELITE_AUTH", if auth { "1" } else { "0" });
            if let Some(etcd) = etcd.as_ref() {
                c.env("ETCD", etcd);
            }
            if !args.is_empty() {
                c.env("KUBELITE_ARGS", args);
            }
            match Self::try_start_script(c, dir.clone(), free_port()) {
                Ok(mut server) => {
                    server.crds_in_etcd = etcd.is_some();
                    return server;
                }
                Err(e) if tries > 1 => {
                    tries -= 1;
                    eprintln!("API server did not start, trying other ports: {e}");
                }
                Err(e) => panic!("API server did not start: {e}"),
            }
        }
    }

    /// Starts an API server inside network namespace `netns` (it must have loopback up and
    /// `cluster_ip` on an interface), listening on every address there, with etcd on that
    /// namespace's loopback. `in_cluster_kubeconfig` reaches it at `cluster_ip` from the cluster
    /// network; `kubeconfig` reaches it from the host namespace through a forwarder on the host
    /// loopback. The server certificate names only localhost and 127.0.0.1, so the in-cluster
    /// kubeconfig asks for `localhost` (`tls-server-name`) whatever address it dials.
    /// `FABRIC_TEST_KUBECONFIG` does not apply: an existing cluster is not in our namespace.
    pub fn start_in_netns(tag: &str, netns: &str, cluster_ip: &str) -> anyhow::Result<Self> {
        Self::start_in_netns_with(tag, netns, cluster_ip, false)
    }

    /// [`ApiServer::start_in_netns`], with client certificates, ServiceAccount tokens and
    /// RBAC enforced when `auth` (kubelite's `KUBELITE_AUTH=1`); both kubeconfigs are an
    /// admin's.
    pub fn start_in_netns_with(
        tag: &str,
        netns: &str,
        cluster_ip: &str,
        auth: bool,
    ) -> anyhow::Result<Self> {
        Self::start_in_netns_with_args(tag, netns, cluster_ip, auth, "")
    }

    /// [`ApiServer::start_in_netns_with`], with further kubelite arguments (`KUBELITE_ARGS`),
    /// such as a webhook caller's [`crate::webhook::Caller::kubelite_args`].
    pub fn start_in_netns_with_args(
        tag: &str,
        netns: &str,
        cluster_ip: &str,
        auth: bool,
        args: &str,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let etcd = Self::seeded_etcd();
        let seeded = etcd.is_some();
        let dir = run_dir(tag);
        let mut c = Command::new("ip");
        if let Some(etcd) = etcd {
            c.env("ETCD", etcd);
        }
        c.args(["netns", "exec", netns, "bash"])
            .env("KUBELITE_AUTH", if auth { "1" } else { "0" })
            // start.sh passes --bind-address=127.0.0.1 before KUBELITE_ARGS; the last one wins.
            // A cluster on its own network has test nodes (`fabric-test-node`) that complete
            // pod deletions as kubelets do, so deletion is graceful as in a real cluster.
            .env(
                "KUBELITE_ARGS",
                format!("--bind-address=0.0.0.0 --graceful-pod-deletion {args}"),
            );
        let mut server = Self::run_start_script(c, dir.clone(), NETNS_API_PORT);
        server.crds_in_etcd = seeded;
        let fwd = Forwarder::start(netns, NETNS_API_PORT).context("starting the API forwarder")?;
        let original = std::fs::read_to_string(&server.kubeconfig)
            .with_context(|| format!("reading {}", server.kubeconfig.display()))?;
        let loopback = format!("https://127.0.0.1:{NETNS_API_PORT}");
        // start.sh writes the server as a quoted value in a flow mapping; a sibling key there
        // is enough, no YAML round trip.
        let server_field = format!("server: \"{loopback}\"");
        anyhow::ensure!(
            original.contains(&server_field),
            "{} has no `{server_field}`",
            server.kubeconfig.display()
        );
        let in_cluster = dir.join("kubeconfig-in-cluster");
        std::fs::write(
            &in_cluster,
            original.replace(
                &server_field,
                &format!(
                    "server: \"https://{cluster_ip}:{NETNS_API_PORT}\", tls-server-name: localhost"
                ),
            ),
        )?;
        std::fs::write(
            &server.kubeconfig,
            original.replace(&loopback, &format!("https://{}", fwd.addr)),
        )?;
        server.in_cluster_kubeconfig = in_cluster;
        server.forwarder = Some(fwd);
        Ok(server)
    }

    fn run_start_script(c: Command, dir: PathBuf, port: u16) -> Self {
        Self::try_start_script(c, dir, port)
            .unwrap_or_else(|e| panic!("API server did not start: {e}"))
    }

    /// Runs the start script; on failure, what it said (and whatever it left running is
    /// stopped, as the server is dropped).
    fn try_start_script(mut c: Command, dir: PathBuf, port: u16) -> Result<Self, String> {
        let script = std::env::var_os("FABRIC_TEST_APISERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/kubelite/start.sh")
            });
        let out = fabric_netns::process::die_with_parent(&mut c)
            .arg(&script)
            .arg(&dir)
            .arg(port.to_string())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        let server = Self {
            kubeconfig: dir.join("kubeconfig"),
            in_cluster_kubeconfig: dir.join("kubeconfig"),
            run_dir: Some(dir.clone()),
            started: Instant::now(),
            forwarder: None,
            crds_in_etcd: false,
        };
        if !out.status.success() {
            return Err(format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(server)
    }

    /// The run directory's `certs/` (the cluster CA and its key, to mint client
    /// certificates), unless the tests run against an existing cluster.
    pub fn certs_dir(&self) -> Option<PathBuf> {
        self.run_dir.as_ref().map(|d| d.join("certs"))
    }

    /// Installs the fabric's CRDs and waits until the server serves them. They are the
    /// objects `fabric_api::crds()` makes, which `deploy/crds` holds (a test of fabric-api
    /// keeps the files current), applied server-side in-process.
    pub fn install_crds(&self) {
        // A server with them in etcd has exactly these (the seed's name is their hash).
        self.start_installing_crds();
        self.wait_crds_established();
    }

    /// Installs the fabric's CRDs as [`ApiServer::install_crds`] does, without waiting for
    /// them to be established ([`ApiServer::wait_crds_established`] does): a bed sets up the
    /// rest meanwhile. Nothing to do on a server that has them in etcd.
    pub fn start_installing_crds(&self) {
        if self.crds_in_etcd {
            return;
        }
        let crds: Vec<serde_json::Value> = fabric_api::crds()
            .iter()
            .map(|c| serde_json::to_value(c).expect("CRDs serialize"))
            .collect();
        crate::kube_sync::apply(&self.kubeconfig, "fabric-tests-crds", true, &crds)
            .unwrap_or_else(|e| panic!("installing the CRDs: {e:#}"));
    }

    /// Creates namespaces `names` in-process (as `kubectl create namespace`, without a
    /// kubectl process each); one that exists is left as it is.
    #[track_caller]
    pub fn create_namespaces(&self, names: &[&str]) {
        let objects: Vec<serde_json::Value> = names
            .iter()
            .map(|n| serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))
            .collect();
        crate::kube_sync::apply(&self.kubeconfig, "fabric-tests", true, &objects)
            .unwrap_or_else(|e| panic!("creating namespaces {names:?}: {e:#}"));
    }

    /// Creates ConfigMap `namespace/name` with `data` in-process (as `kubectl create configmap
    /// --from-literal`).
    #[track_caller]
    pub fn create_config_map(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        let data: serde_json::Map<String, serde_json::Value> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": data});
        crate::kube_sync::apply(&self.kubeconfig, "fabric-tests", true, &[cm])
            .unwrap_or_else(|e| panic!("creating ConfigMap {namespace}/{name}: {e:#}"));
    }

    /// Waits until every CRD on the server is Established.
    pub fn wait_crds_established(&self) {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let api: kube::Api<CustomResourceDefinition> = kube::Api::all(
            crate::kube_sync::client(&self.kubeconfig).expect("a client of the test API server"),
        );
        let seeded = self.crds_in_etcd;
        let pending = crate::kube_sync::block(async move {
            crate::wait::try_eventually(
                "every CRD Established",
                std::time::Duration::from_secs(30),
                || {
                    let api = api.clone();
                    async move {
                        let crds = api.list(&Default::default()).await.ok()?;
                        let established = crds.items.iter().all(|c| {
                            c.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|cs| {
                                    cs.iter()
                                        .any(|c| c.type_ == "Established" && c.status == "True")
                                })
                        });
                        if !established {
                            return None;
                        }
                        if seeded {
                            // A server that found them in etcd reports them Established as
                            // the seed's server left them: ready only once each one lists.
                            for crd in &crds.items {
                                let served = served_resource(crd)?;
                                let kind: kube::Api<kube::core::DynamicObject> =
                                    kube::Api::all_with(api.clone().into_client(), &served);
                                kind.list(&kube::api::ListParams::default().limit(1))
                                    .await
                                    .ok()?;
                            }
                        }
                        Some(())
                    }
                },
            )
            .await
        });
        if let Err(e) = pending {
            panic!("CRDs not established: {e}");
        }
    }

    /// `kubectl ARGS` as the server's admin; the forms [`crate::kubectl`] answers without a
    /// process, in-process.
    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        if let Some(o) = crate::kubectl::in_process(&self.kubeconfig, args, None) {
            return o;
        }
        Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .expect("kubectl")
    }

    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let o = self.kubectl(args);
        assert!(
            o.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> std::process::Output {
        crate::process::kubectl_stdin(&self.kubeconfig, args, input)
    }

    /// `kubectl get KIND NAME [-n NS] -o json`, in-process ([`crate::kube_sync`]): `None`
    /// when there is no such object (or the server did not answer). Panics on a kind the
    /// server does not serve: a mistake of the test, not a state to wait out.
    #[track_caller]
    pub fn get_json(&self, kind: &str, ns: Option<&str>, name: &str) -> Option<serde_json::Value> {
        served(crate::kube_sync::get_json(&self.kubeconfig, kind, ns, name)).flatten()
    }

    /// `kubectl get KIND [-n NS | -A] -o json`, in-process: `{"items": [...]}` of namespace
    /// `ns` (of every namespace when `None`), or `None` when the server did not answer.
    pub fn list_json(&self, kind: &str, ns: Option<&str>) -> Option<serde_json::Value> {
        let items = served(crate::kube_sync::list(&self.kubeconfig, kind, ns, ""))?;
        Some(serde_json::json!({ "items": items }))
    }

    /// [`ApiServer::get_json`] or [`ApiServer::list_json`] with the arguments of `kubectl get
    /// KIND [NAME] [-n NS | -A]`, for tests written with kubectl's.
    #[track_caller]
    pub fn get_args_json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let (kind, rest) = match args {
            ["get", kind, rest @ ..] => (*kind, rest),
            _ => panic!("get_args_json takes `get KIND [NAME] [-n NS]`, not {args:?}"),
        };
        match rest {
            [] => self.list_json(kind, Some("default")),
            ["-A"] => self.list_json(kind, None),
            ["-n", ns] => self.list_json(kind, Some(ns)),
            [name] => self.get_json(kind, None, name),
            [name, "-n", ns] => self.get_json(kind, Some(ns), name),
            _ => panic!("get_args_json takes `get KIND [NAME] [-n NS]`, not {args:?}"),
        }
    }

    pub async fn client(&self) -> kube::Client {
        client_for(&self.kubeconfig).await.unwrap()
    }
}

/// The answer, `None` on an error of the server or the way to it; panics on a kind it does
/// not serve.
#[track_caller]
fn served<T>(r: anyhow::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if e.is::<crate::kube_sync::NotServed>() => panic!("{e}"),
        Err(_) => None,
    }
}

/// A client with the credentials of a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}

impl ApiServer {
    /// The pids of this server's daemons (kubelite, etcd), when this process started them.
    pub fn daemon_pids(&self) -> Vec<i32> {
        self.run_dir.as_deref().map(daemon_pids).unwrap_or_default()
    }

    /// Stops the API server (SIGSTOP, etcd left running) until the guard goes: requests to
    /// it hang, as to a server that is down behind a network that drops, not one that
    /// refuses. Panics when this process did not start it.
    pub fn pause(&self) -> Paused {
        let dir = self
            .run_dir
            .as_deref()
            .expect("a server this process started");
        let pid = daemon_pids(dir)
            .first()
            .copied()
            .filter(|_| dir.join("kubelite.pid").exists())
            .expect("kubelite's pid");
        // SAFETY: signalling a process we started.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        Paused { pid }
    }
}

/// An API server stopped by [`ApiServer::pause`]; it goes on when this is dropped.
pub struct Paused {
    pid: i32,
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: signalling a process we started.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}

/// The pids of the daemons the start script left running in `dir`.
fn daemon_pids(dir: &Path) -> Vec<i32> {
    ["kubelite.pid", "etcd.pid"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let Some(dir) = &self.run_dir else { return };
        let pids = daemon_pids(dir);
        // Read before the kill: the daemons are not our children, their CPU is counted nowhere
        // else, and starting and feeding API servers is much of what the suite spends.
        crate::phase::record_api_server(
            crate::figures::cpu_secs(&pids),
            self.started.elapsed().as_secs_f64(),
        );
        for pid in pids {
            // SAFETY: signalling a process we started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A TCP listener on the host loopback whose connections are relayed to `127.0.0.1:port` inside
/// a network namespace, so that host-side clients reach a server that listens only there.
/// Connections beyond [`MAX_FORWARDED`] are closed at once; dropping it closes all of them.
struct Forwarder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    // Both sockets of every live connection, so that Drop can unblock their relay threads.
    conns: Arc<Mutex<HashMap<u64, [TcpStream; 2]>>>,
    accept: Option<JoinHandle<()>>,
}

impl Forwarder {
    fn start(netns: &str, port: u16) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<HashMap<u64, [TcpStream; 2]>>> = Arc::default();
        let ns_path = PathBuf::from("/run/netns").join(netns);
        let accept = {
            let (stop, conns) = (stop.clone(), conns.clone());
            std::thread::spawn(move || {
                let ids = Arc::new(AtomicU64::new(0));
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    if conns.lock().unwrap().len() >= MAX_FORWARDED {
                        // Said, so that a client's "Connect" errors are not a mystery.
                        eprintln!(
                            "fabric-tests: the API forwarder holds {MAX_FORWARDED} connections: \
                             closing a new one"
                        );
                        continue;
                    }
                    let id = ids.fetch_add(1, Ordering::Relaxed);
                    let (conns, ns_path) = (conns.clone(), ns_path.clone());
                    std::thread::spawn(move || {
                        let _ = relay(id, client, &ns_path, port, &conns);
                        conns.lock().unwrap().remove(&id);
                    });
                }
            })
        };
        Ok(Self {
            addr,
            stop,
            conns,
            accept: Some(accept),
        })
    }
}

fn relay(
    id: u64,
    client: TcpStream,
    ns_path: &Path,
    port: u16,
    conns: &Mutex<HashMap<u64, [TcpStream; 2]>>,
) -> anyhow::Result<()> {
    // Only this thread moves; the connect below is what has to happen inside the namespace.
    fabric_netns::enter(&ns_path.to_string_lossy())?;
    let upstream = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(5),
    )?;
    conns
        .lock()
        .unwrap()
        .insert(id, [client.try_clone()?, upstream.try_clone()?]);
    crate::host_kubelets::splice(client, upstream);
    Ok(())
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept so that it sees the flag.
        match TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)) {
            Err(e) if e.kind() != ErrorKind::ConnectionRefused => {
                eprintln!("fabric-tests: waking the API forwarder: {e}");
            }
            _ => {}
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        for [a, b] in self.conns.lock().unwrap().values() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        let t0 = Instant::now();
        while !self.conns.lock().unwrap().is_empty() && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The resource a CRD serves at its storage version.
fn served_resource(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Option<kube::core::ApiResource> {
    let version = crd.spec.versions.iter().find(|v| v.storage)?;
    Some(kube::core::ApiResource {
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", crd.spec.group, version.name),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    })
}
