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

pub const BIN: &str = env!("CARGO_BIN_EXE_fabric-gateway");

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
    Command::new(args[0])
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

pub struct Lab {
    pub tag: String,
    pub dir: PathBuf,
    namespaces: Vec<String>,
    children: Vec<(String, Child)>,
    extra_files: Vec<PathBuf>,
}

impl Lab {
    /// `tag` must be unique per test (it becomes part of netns and socket names).
    pub fn new(tag: &str) -> Self {
        let tag = format!("fgw{}{tag}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(&tag);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self {
            tag,
            dir,
            namespaces: vec![],
            children: vec![],
            extra_files: vec![],
        }
    }

    pub fn ns(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.tag)
    }

    pub fn add_ns(&mut self, suffix: &str) -> String {
        let name = self.ns(suffix);
        let _ = sh(&["ip", "netns", "del", &name]);
        run(&["ip", "netns", "add", &name]);
        self.namespaces.push(name.clone());
        self.exec(&name, &["ip", "link", "set", "lo", "up"]);
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
        let child = c
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
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

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        fs::write(&p, text).unwrap();
        p
    }

    /// Runs `f` with the calling thread moved into `ns` (setns affects only this thread).
    pub fn in_ns<T: Send + 'static>(&self, ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{ns}");
        std::thread::spawn(move || {
            let fd = fs::File::open(&path).unwrap();
            use std::os::fd::AsRawFd;
            // SAFETY: valid netns fd; only this (fresh) thread changes namespace.
            let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap()
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
        let sp = format!("/var/run/netns/{server_ns}");
        let server = std::thread::spawn(move || {
            let fd = fs::File::open(&sp).unwrap();
            use std::os::fd::AsRawFd;
            // SAFETY: as in `in_ns`.
            assert_eq!(
                unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            let l = TcpListener::bind(bind).unwrap();
            tx.send(()).unwrap();
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&(got.len() as u64).to_be_bytes()).unwrap();
            got
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
        let got = server.join().unwrap();
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
        for ns in &self.namespaces {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
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
