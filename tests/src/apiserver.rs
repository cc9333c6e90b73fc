//! API-server fixture (shared by the crates' API-server tests). By default it starts a kubelite (../shared/kubelite/start.sh) per
//! test on a free loopback port; `FABRIC_TEST_APISERVER` names another start script with the
//! same contract (`start.sh DIR PORT` printing `export KUBECONFIG=...`), and
//! `FABRIC_TEST_KUBECONFIG` points the tests at an existing cluster instead.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
};

pub struct ApiServer {
    pub kubeconfig: PathBuf,
    run_dir: Option<PathBuf>,
}

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
        Self::start_inner(tag, true)
    }

    pub fn start(tag: &str) -> Self {
        Self::start_inner(tag, false)
    }

    fn start_inner(tag: &str, auth: bool) -> Self {
        if let Some(kc) = std::env::var_os("FABRIC_TEST_KUBECONFIG") {
            return Self {
                kubeconfig: kc.into(),
                run_dir: None,
            };
        }
        let script = std::env::var_os("FABRIC_TEST_APISERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/kubelite/start.sh")
            });
        let dir = std::env::temp_dir().join(format!("fabric-api-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let port = free_port();
        let out = Command::new("bash")
            .env("KUBELITE_AUTH", if auth { "1" } else { "0" })
            .arg(&script)
            .arg(&dir)
            .arg(port.to_string())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        let server = Self {
            kubeconfig: dir.join("kubeconfig"),
            run_dir: Some(dir),
        };
        assert!(
            out.status.success(),
            "API server did not start: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        server
    }

    /// Installs the fabric's CRDs (deploy/crds) and waits until the server serves them.
    pub fn install_crds(&self) {
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        self.kubectl_ok(&["apply", "-k", &crds.display().to_string()]);
        self.kubectl_ok(&[
            "wait",
            "--for",
            "condition=established",
            "crd",
            "--all",
            "--timeout=30s",
        ]);
    }

    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
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
        use std::io::Write;
        let mut c = Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl");
        c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        c.wait_with_output().unwrap()
    }

    pub async fn client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(cfg).unwrap()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let Some(dir) = &self.run_dir else { return };
        for f in ["kubelite.pid", "etcd.pid"] {
            if let Ok(pid) = std::fs::read_to_string(dir.join(f))
                && let Ok(pid) = pid.trim().parse::<i32>()
            {
                // SAFETY: signalling a process we started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
