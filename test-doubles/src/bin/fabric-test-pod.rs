//! The test node's built-in pod program (the image is ignored; a pod runs a command):
//! - `echo --port P [--print-env NAME]...`: a TCP server that answers each connection with the
//!   client address it sees (`10.72.1.10:41234\n`) and closes; what the fabric tests care
//!   about is which source address arrives. It first prints `NAME=value` for each variable
//!   asked for (what its ConfigMaps and Secrets gave it).
//! - `http --port P`: the same over HTTP/1.0 (`GET /` answers the client address).
//! - `connect ADDR:PORT`: connects, prints what the server answered, exits 0 (1 on failure).
//! - `exit CODE [--after SECONDS]`: prints a line and exits with CODE.
//! - `write PATH TEXT`: writes TEXT to the file PATH (synced to disk), prints a line, exits 0.
//! - `read PATH [--wait SECONDS]`: prints the file's contents and exits 0; with `--wait`, waits
//!   that long for the file to appear; exits 1 when it cannot be read. With a claim's volume,
//!   these show data outliving the pod that wrote it.
//! - `api PATH`: calls the API server as an in-cluster client does (`https://` +
//!   `KUBERNETES_SERVICE_HOST`:`KUBERNETES_SERVICE_PORT`, its certificate verified with the
//!   CA of the service account directory, the bearer token there if there is one), prints
//!   `status N` and the body, exits 0 once answered (1 on failure); with `--every SECONDS`,
//!   again and again (a failure printed as `error: ...`), for ever.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Built-in test pod programs of fabric-test-node")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// TCP echo of the client's address.
    Echo {
        #[arg(long, default_value_t = 8080)]
        port: u16,
        #[arg(long = "print-env", value_name = "NAME")]
        print_env: Vec<String>,
    },
    /// HTTP server answering the client's address.
    Http {
        #[arg(long, default_value_t = 8080)]
        port: u16,
    },
    /// Connects and prints the answer.
    Connect {
        addr: SocketAddr,
        #[arg(long, default_value_t = 3)]
        timeout_secs: u64,
    },
    /// GETs PATH of the in-cluster API server and prints the status and body.
    Api {
        path: String,
        /// The service account directory (ca.crt, token).
        #[arg(long, default_value = "/var/run/secrets/kubernetes.io/serviceaccount")]
        dir: std::path::PathBuf,
        #[arg(long, default_value_t = 5)]
        timeout_secs: u64,
        /// Call again after this many seconds, for ever.
        #[arg(long)]
        every: Option<f64>,
    },
    /// Writes TEXT to the file PATH.
    Write {
        path: std::path::PathBuf,
        text: String,
    },
    /// Prints the contents of the file PATH.
    Read {
        path: std::path::PathBuf,
        /// Wait this many seconds for the file to appear.
        #[arg(long, default_value_t = 0.0)]
        wait: f64,
    },
    /// Prints a line and exits with CODE.
    Exit {
        code: i32,
        #[arg(long, default_value_t = 0.0)]
        after: f64,
    },
}

fn write_file(path: &std::path::Path, text: &str) -> Result<()> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    println!("wrote {} bytes to {}", text.len(), path.display());
    Ok(())
}

fn read_file(path: &std::path::Path, wait: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match std::fs::read_to_string(path) {
            Ok(s) => {
                println!("{s}");
                return Ok(());
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}

fn serve(port: u16, http: bool) -> Result<()> {
    let l = TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("binding port {port}"))?;
    println!("listening on {}", l.local_addr()?);
    for conn in l.incoming() {
        let Ok(mut s) = conn else { continue };
        let Ok(peer) = s.peer_addr() else { continue };
        println!("connection from {peer}");
        std::thread::spawn(move || {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let answer = if http {
                // The request head is read (and ignored) before answering.
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let body = format!("{peer}\n");
                format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
            } else {
                format!("{peer}\n")
            };
            let _ = s.write_all(answer.as_bytes());
        });
    }
    Ok(())
}

/// GET `path` of the in-cluster API server: (status, body).
fn call_api(path: &str, dir: &std::path::Path, timeout: Duration) -> Result<(u16, String)> {
    use std::net::ToSocketAddrs as _;

    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};

    let var = |n: &str| std::env::var(n).with_context(|| format!("${n} is not set"));
    let (host, port) = (
        var("KUBERNETES_SERVICE_HOST")?,
        var("KUBERNETES_SERVICE_PORT")?,
    );
    let ca = dir.join("ca.crt");
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(&ca).with_context(|| format!("reading {}", ca.display()))?
    {
        roots.add(cert.context("a certificate of ca.crt")?)?;
    }
    let token = std::fs::read_to_string(dir.join("token")).ok();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from(host.clone()).context("the API server's name")?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    // Resolved as the pod resolves it (its /etc/hosts: the host aliases).
    let addr = (
        host.as_str(),
        port.parse::<u16>().context("$KUBERNETES_SERVICE_PORT")?,
    )
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("no address for {host}"))?;
    let tcp = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("connecting to {host} ({addr})"))?;
    tcp.set_read_timeout(Some(timeout))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let auth = token
        .map(|t| format!("Authorization: Bearer {}\r\n", t.trim()))
        .unwrap_or_default();
    write!(
        tls,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\n{auth}Accept: application/json\r\n\r\n"
    )
    .context("sending the request")?;
    // HTTP/1.0: the answer is not chunked, and ends when the server closes.
    let mut raw = Vec::new();
    // A server that closes without close_notify still said all it had to.
    if let Err(e) = tls.read_to_end(&mut raw)
        && raw.is_empty()
    {
        return Err(e).context("reading the answer");
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP answer")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

fn main() -> std::process::ExitCode {
    let r = match Cli::parse().cmd {
        Cmd::Echo { port, print_env } => {
            for name in print_env {
                println!("{name}={}", std::env::var(&name).unwrap_or_default());
            }
            serve(port, false)
        }
        Cmd::Http { port } => serve(port, true),
        Cmd::Connect { addr, timeout_secs } => (|| {
            let t = Duration::from_secs(timeout_secs);
            let mut s = TcpStream::connect_timeout(&addr, t)
                .with_context(|| format!("connecting to {addr}"))?;
            s.set_read_timeout(Some(t))?;
            let mut out = String::new();
            s.read_to_string(&mut out).context("reading the answer")?;
            print!("{out}");
            Ok(())
        })(),
        Cmd::Api {
            path,
            dir,
            timeout_secs,
            every,
        } => {
            let call = || call_api(&path, &dir, Duration::from_secs(timeout_secs));
            let print = |(status, body): (u16, String)| {
                println!("status {status}");
                println!("{}", body.trim_end());
            };
            match every {
                None => call().map(print),
                Some(every) => loop {
                    match call() {
                        Ok(answer) => print(answer),
                        Err(e) => println!("error: {e:#}"),
                    }
                    std::thread::sleep(Duration::from_secs_f64(every));
                },
            }
        }
        Cmd::Write { path, text } => write_file(&path, &text),
        Cmd::Read { path, wait } => read_file(&path, Duration::from_secs_f64(wait)),
        Cmd::Exit { code, after } => {
            println!("exiting with {code}");
            std::thread::sleep(Duration::from_secs_f64(after));
            return std::process::ExitCode::from(code as u8);
        }
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
