//! The way from an API server in its cluster's network namespace to the kubelet API of the
//! virtual kubelets, which the sharing fixture runs on the host ([`crate::peering_stack`]):
//! their Node address is 127.0.0.1 and their port a free one of the host's loopback, but the
//! API server dials `127.0.0.1:<port>` in its own namespace for `kubectl logs`, `exec`,
//! `attach` and `port-forward`. For every Node at 127.0.0.1 as it appears, this listens on
//! that port on the API server's loopback and carries each connection to the host's.
use std::{
    collections::BTreeSet,
    io::ErrorKind,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    runtime::{WatchStreamExt as _, watcher},
};

const LOOPBACK: [u8; 4] = [127, 0, 0, 1];

pub struct HostKubelets {
    stop: Arc<AtomicBool>,
    watch: Option<JoinHandle<()>>,
}

/// The kubelet port of a Node whose InternalIP is the loopback (a virtual kubelet of the
/// fixture), if it has one yet.
fn loopback_kubelet(node: &Node) -> Option<u16> {
    let status = node.status.as_ref()?;
    let on_loopback = status
        .addresses
        .iter()
        .flatten()
        .any(|a| a.type_ == "InternalIP" && a.address == "127.0.0.1");
    let port = status
        .daemon_endpoints
        .as_ref()?
        .kubelet_endpoint
        .as_ref()?
        .port;
    (on_loopback && port > 0).then(|| u16::try_from(port).ok())?
}

/// Joins two connections byte for byte until both directions end.
pub(crate) fn splice(a: TcpStream, b: TcpStream) {
    let (Ok(mut a_rd), Ok(mut b_wr)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a_rd, &mut b_wr);
        let _ = b_wr.shutdown(Shutdown::Write);
    });
    let (mut b_rd, mut a_wr) = (b, a);
    let _ = std::io::copy(&mut b_rd, &mut a_wr);
    let _ = a_wr.shutdown(Shutdown::Write);
    let _ = up.join();
}

/// A listener on `port` of the loopback of namespace `ns` (bound by a thread that enters it;
/// the socket stays there whichever thread accepts).
fn listen_in(ns: &str, port: u16) -> Result<TcpListener> {
    let ns = ns.to_owned();
    std::thread::spawn(move || -> Result<TcpListener> {
        fabric_netns::enter(&ns)?;
        let l = TcpListener::bind(SocketAddr::from((LOOPBACK, port)))
            .with_context(|| format!("binding 127.0.0.1:{port} in {ns}"))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the binding thread panicked"))?
}

/// Accepts on `listener` (in the API server's namespace) until `stop`, carrying each
/// connection to the host's `127.0.0.1:port` (this thread stays in the host's namespace).
fn relay(listener: TcpListener, port: u16, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let _ = client.set_nonblocking(false);
                std::thread::spawn(move || {
                    let host = SocketAddr::from((LOOPBACK, port));
                    if let Ok(upstream) = TcpStream::connect_timeout(&host, Duration::from_secs(5))
                    {
                        splice(client, upstream);
                    }
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

impl HostKubelets {
    /// Follows the Nodes of the API server `kubeconfig` reaches (from the host) and relays
    /// the kubelet port of each at 127.0.0.1 from namespace `api_ns` (the API server's).
    pub fn start(api_ns: &str, kubeconfig: &Path) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, kubeconfig, flag) = (api_ns.to_owned(), kubeconfig.to_path_buf(), stop.clone());
        let watch = std::thread::Builder::new()
            .name(format!("host-kubelets-{api_ns}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                rt.block_on(follow(ns, kubeconfig, flag));
            })?;
        Ok(Self {
            stop,
            watch: Some(watch),
        })
    }
}

async fn follow(ns: String, kubeconfig: PathBuf, stop: Arc<AtomicBool>) {
    let client = async {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        anyhow::Ok(kube::Client::try_from(cfg)?)
    };
    let client = match client.await {
        Ok(c) => c,
        Err(e) => return eprintln!("fabric-tests: host kubelets of {ns}: {e:#}"),
    };
    let mut relayed = BTreeSet::new();
    let nodes = watcher(Api::<Node>::all(client), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut nodes = std::pin::pin!(nodes);
    loop {
        let next = tokio::time::timeout(Duration::from_millis(200), nodes.next()).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(Some(Ok(node))) = next else { continue };
        let Some(port) = loopback_kubelet(&node) else {
            continue;
        };
        if !relayed.insert(port) {
            continue;
        }
        match listen_in(&ns, port) {
            Ok(l) => {
                let stop = stop.clone();
                std::thread::spawn(move || relay(l, port, stop));
            }
            Err(e) => {
                relayed.remove(&port);
                eprintln!("fabric-tests: host kubelets of {ns}: {e:#}");
            }
        }
    }
}

impl Drop for HostKubelets {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.watch.take() {
            let _ = t.join();
        }
    }
}
