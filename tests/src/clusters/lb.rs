//! Cluster B's gateway Service as kube-proxy makes it for a LoadBalancer: a namespace on the
//! underlay that forwards WireGuard's port to the replica the Service's EndpointSlice names.
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::*;

/// The address B's gateway Service has on the underlay.
pub const LB_VIP: &str = "192.168.77.200";

/// Cluster B's gateway Service as kube-proxy makes it for a LoadBalancer or NodePort: a
/// namespace on the underlay with the Service's address, which forwards WireGuard's port to
/// the replica the Service's EndpointSlice names (written by the replica holding the Lease),
/// with SNAT so that replies come back through it, and which drops the UDP
/// conntrack entries of a replica that is no longer selected, as kube-proxy does.
pub struct LoadBalancer {
    pub ns: String,
    /// The replica identity it forwards to now.
    pub backend: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LoadBalancer {
    pub(super) fn start(tb: &mut Testbed, ul: &str, b: &Cluster) -> Result<Self> {
        use std::sync::{
            Arc, Mutex,
            atomic::{AtomicBool, Ordering},
        };
        let ns = tb.add_netns("lb")?;
        tb.veth(&ns, "ul", ul, "lb")?;
        tb.ip(ul, &["link", "set", "lb", "master", "br0"])?;
        tb.ip(&ns, &["addr", "add", &format!("{LB_VIP}/24"), "dev", "ul"])?;
        tb.sysctl(&ns, "net.ipv4.ip_forward", "1")?;
        tb.sysctl(&ns, "net.ipv4.conf.all.send_redirects", "0")?;
        tb.sysctl(&ns, "net.ipv4.conf.ul.send_redirects", "0")?;
        let rules = "table ip lb {\n chain pre { type nat hook prerouting priority dstnat; }\n \
             chain post { type nat hook postrouting priority srcnat; ct status dnat masquerade; }\n}\n";
        nft_script(&ns, rules)?;
        let backends: Vec<(String, String)> = b
            .replicas
            .iter()
            .map(|r| (r.identity.clone(), r.underlay_ip.clone()))
            .collect();
        // One client, not a kubectl process per round (about 70 ms of CPU each, five times a
        // second for as long as the test runs).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let kubeconfig = b.api.kubeconfig.clone();
        let (stop, backend) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(None)));
        let thread = std::thread::spawn({
            let (stop, backend, ns) = (stop.clone(), backend.clone(), ns.clone());
            move || {
                // (In this thread's runtime: `start` may be called from within another.)
                let client = rt
                    .block_on(crate::apiserver::client_for(&kubeconfig))
                    .expect("a client of cluster B's API server");
                let slices: kube::Api<EndpointSlice> = kube::Api::namespaced(client, NAMESPACE);
                while !stop.load(Ordering::Relaxed) {
                    // The first endpoint's replica; none while the slice does not exist.
                    let selected = rt
                        .block_on(slices.get_opt(names::endpoint_slice::GATEWAY))
                        .ok()
                        .map(|s| {
                            s.and_then(|s| s.endpoints.into_iter().flatten().next())
                                .and_then(|e| e.target_ref)
                                .and_then(|r| r.name)
                        });
                    if let Some(want) = selected {
                        let mut cur = backend.lock().unwrap();
                        if *cur != want {
                            let ip = want
                                .as_ref()
                                .and_then(|w| backends.iter().find(|(id, _)| id == w))
                                .map(|(_, ip)| ip.clone());
                            let mut script = "flush chain ip lb pre\n".to_owned();
                            if let Some(ip) = &ip {
                                script += &format!(
                                    "add rule ip lb pre ip daddr {LB_VIP} udp dport 51820 dnat to {ip}\n"
                                );
                            }
                            let ok = nft_script(&ns, &script).is_ok();
                            // Flows pinned to the old backend would keep going there.
                            let _ = Command::new("ip")
                                .args(["netns", "exec", &ns, "conntrack", "-D", "-p", "udp"])
                                .stdout(Stdio::null())
                                .stderr(Stdio::null())
                                .status();
                            if ok {
                                *cur = want;
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        });
        Ok(Self {
            ns,
            backend,
            stop,
            thread: Some(thread),
        })
    }
}

/// Runs an nft script in namespace `ns`.
fn nft_script(ns: &str, script: &str) -> Result<()> {
    use std::io::Write;
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    c.stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())?;
    let o = c.wait_with_output()?;
    anyhow::ensure!(
        o.status.success(),
        "nft: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
