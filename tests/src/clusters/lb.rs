//! Cluster B's gateway Service as kube-proxy makes it for a LoadBalancer: a namespace on the
//! underlay that forwards WireGuard's port to the replica the Service's EndpointSlice names.
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
        let kubeconfig = b.api.kubeconfig.clone();
        let (stop, backend) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(None)));
        let thread = std::thread::spawn({
            let (stop, backend, ns) = (stop.clone(), backend.clone(), ns.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let o = Command::new("kubectl")
                        .env("KUBECONFIG", &kubeconfig)
                        .args([
                            "get",
                            "endpointslice",
                            names::endpoint_slice::GATEWAY,
                            "-n",
                            NAMESPACE,
                            "-o",
                            "jsonpath={.endpoints[*].targetRef.name}",
                        ])
                        .output();
                    let selected = o
                        .ok()
                        .filter(|o| o.status.success())
                        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
                    if let Some(sel) = selected {
                        let want = sel.split_whitespace().next().map(str::to_owned);
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
