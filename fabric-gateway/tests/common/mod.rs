//! Network-namespace lab for integration tests. Everything it creates is
//! removed in `Drop`, also when a test panics.
#![allow(dead_code)]

use std::{
    fs,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use fabric_netns::{
    process::die_with_parent,
    testbed::{Testbed, scratch_dir},
};

pub use fabric_gateway::config::{Config, PeerConfig};
use ipnetwork::IpNetwork;

pub const BIN: &str = env!("CARGO_BIN_EXE_fabric-gateway");

/// Prefixes written as in a configuration file.
pub fn net(nets: &[&str]) -> Vec<IpNetwork> {
    nets.iter().map(|n| n.parse().unwrap()).collect()
}

/// Returns false (and says why) when the test cannot run here.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED {test}: needs root for network namespaces and TUN devices");
        return false;
    }
    if !Path::new("/dev/net/tun").exists() {
        eprintln!("SKIPPED {test}: /dev/net/tun is missing");
        return false;
    }
    true
}

pub fn sh(args: &[&str]) -> Output {
    die_with_parent(&mut Command::new(args[0]))
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("spawning {args:?}: {e}"))
}

#[track_caller]
pub fn run(args: &[&str]) -> String {
    let out = sh(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A gateway test's namespaces (a [`Testbed`]), scratch directory and processes.
pub struct Lab {
    /// Short and unique per test: gateway names (and so TUN and UAPI socket names) start with it.
    pub tag: String,
    pub dir: PathBuf,
    children: Vec<(String, Child)>,
    extra_files: Vec<PathBuf>,
    // Last: the namespaces go after the processes in them. Only tests that run as root have it.
    bed: Option<Testbed>,
}

impl Lab {
    /// `tag` must be unique per test (it becomes part of gateway and socket names).
    pub fn new(tag: &str) -> Self {
        // The whole pid: the reaper (fabric_netns::testbed) finds a killed run's gateway pins
        // and UAPI sockets by it. At most 7 digits: names stay within IFNAMSIZ.
        let tag = format!("fgw{}{tag}", std::process::id());
        // A test-bed scratch name, so that a killed run's keys and logs are reaped.
        let dir = scratch_dir(&tag);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self {
            tag,
            dir,
            children: vec![],
            extra_files: vec![],
            bed: None,
        }
    }

    fn bed(&mut self) -> &mut Testbed {
        self.bed
            .get_or_insert_with(|| Testbed::new().expect("a namespace test bed (root)"))
    }

    /// Creates namespace `<bed>-<suffix>` with loopback up, forwarding on and no reverse-path
    /// filter; returns its name.
    pub fn add_ns(&mut self, suffix: &str) -> String {
        let name = self.bed().add_netns(suffix).unwrap();
        self.exec(&name, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        self.exec(&name, &["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"]);
        name
    }

    pub fn exec(&self, ns: &str, cmd: &[&str]) -> String {
        let mut v = vec!["ip", "netns", "exec", ns];
        v.extend_from_slice(cmd);
        run(&v)
    }

    pub fn try_exec(&self, ns: &str, cmd: &[&str]) -> Output {
        let mut v = vec!["ip", "netns", "exec", ns];
        v.extend_from_slice(cmd);
        sh(&v)
    }

    /// veth pair between two namespaces with an address on each side.
    pub fn link(&self, a: &str, a_if: &str, a_addr: &str, b: &str, b_if: &str, b_addr: &str) {
        run(&[
            "ip", "link", "add", a_if, "netns", a, "type", "veth", "peer", "name", b_if, "netns", b,
        ]);
        self.exec(a, &["ip", "addr", "add", a_addr, "dev", a_if]);
        self.exec(b, &["ip", "addr", "add", b_addr, "dev", b_if]);
        self.exec(a, &["ip", "link", "set", a_if, "up"]);
        self.exec(b, &["ip", "link", "set", b_if, "up"]);
    }

    pub fn remember_file(&mut self, p: PathBuf) {
        self.extra_files.push(p);
    }

    /// Starts a long-running process in `ns`; stdout/stderr go to `<dir>/<name>.log`.
    pub fn spawn(&mut self, name: &str, ns: &str, cmd: &[&str], env: &[(&str, &str)]) {
        let log = fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).args(cmd);
        for (k, v) in env {
            c.env(k, v);
        }
        c.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // Dies with the test process, even when that is SIGKILLed.
        let child = fabric_netns::process::spawn(c).unwrap();
        self.children.push((name.to_string(), child));
    }

    /// Sends `sig` to the named child and waits for it (`ip netns exec` execs, so the pid is the program's).
    pub fn stop(&mut self, name: &str, sig: i32) -> Option<std::process::ExitStatus> {
        let i = self.children.iter().position(|(n, _)| n == name)?;
        let (_, mut c) = self.children.remove(i);
        // SAFETY: pid of our own, not yet reaped child.
        unsafe { libc::kill(c.id() as i32, sig) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self, name: &str) -> Option<i32> {
        self.children
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.id() as i32)
    }

    pub fn is_running(&mut self, name: &str) -> bool {
        self.children
            .iter_mut()
            .find(|(n, _)| n == name)
            .is_some_and(|(_, c)| c.try_wait().unwrap().is_none())
    }

    pub fn log(&self, name: &str) -> String {
        fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    pub fn write_key(&self, name: &str) -> (PathBuf, String) {
        let p = self.dir.join(format!("{name}.key"));
        let _ = fs::remove_file(&p);
        let pubkey = run(&[BIN, "genkey", "--out", p.to_str().unwrap()]);
        (p, pubkey.trim().to_string())
    }

    /// Writes `cfg` as the gateway reads it (its TOML).
    pub fn write_config(&self, name: &str, cfg: &fabric_gateway::config::Config) -> PathBuf {
        self.write(name, &cfg.to_toml().unwrap())
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        fs::write(&p, text).unwrap();
        p
    }

    /// Runs `f` on a thread inside `ns` (setns affects only that thread).
    pub fn in_ns<T: Send + 'static>(&self, ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        fabric_netns::run_in(ns, f).unwrap()
    }

    pub fn ping(&self, ns: &str, dst: &str, count: u32) -> bool {
        self.try_exec(
            ns,
            &[
                "ping",
                "-c",
                &count.to_string(),
                "-i",
                "0.2",
                "-W",
                "2",
                dst,
            ],
        )
        .status
        .success()
    }

    /// Waits until `dst` answers pings from `ns`, up to `timeout`. Returns the time it took.
    pub fn wait_ping(&self, ns: &str, dst: &str, timeout: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self
                .try_exec(ns, &["ping", "-c", "1", "-W", "1", dst])
                .status
                .success()
            {
                return Some(t0.elapsed());
            }
        }
        None
    }

    /// Sends `len` bytes over TCP from `client_ns` to `server_ns` and checks they arrive intact.
    pub fn tcp_transfer(&self, server_ns: &str, bind: &str, client_ns: &str, len: usize) {
        let bind: SocketAddr = bind.parse().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let server = fabric_netns::spawn_in(server_ns, move || {
            let l = TcpListener::bind(bind).unwrap();
            tx.send(()).unwrap();
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&(got.len() as u64).to_be_bytes()).unwrap();
            Ok::<_, fabric_netns::Error>(got)
        });
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let sent = data.clone();
        let reply = self.in_ns(client_ns, move || {
            let mut s =
                TcpStream::connect_timeout(&bind, Duration::from_secs(5)).expect("tcp connect");
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(&sent).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut n = [0u8; 8];
            s.read_exact(&mut n).unwrap();
            u64::from_be_bytes(n)
        });
        let got = server.join().unwrap().unwrap();
        assert_eq!(reply as usize, len);
        assert!(got == data, "TCP payload corrupted");
    }

    /// Polls `fabric-gateway status` until `pred` holds.
    pub fn wait_status(
        &self,
        name: &str,
        timeout: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let t0 = Instant::now();
        let mut last = None;
        while t0.elapsed() < timeout {
            let out = sh(&[
                BIN,
                "status",
                "--name",
                name,
                "--control-dir",
                self.dir.to_str().unwrap(),
            ]);
            if out.status.success()
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            {
                if pred(&v) {
                    return Some(v);
                }
                last = Some(v);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("last status: {last:#?}");
        None
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            // SAFETY: our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, c) in &mut self.children {
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // The namespaces, now that nothing runs in them.
        drop(self.bed.take());
        for f in &self.extra_files {
            let _ = fs::remove_file(f);
        }
        if std::env::var_os("FGW_KEEP_LOGS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}
