use std::io::{IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use fabric_gateway::config::{Config, DEFAULT_NAME};
use fabric_gateway::control;
use fabric_gateway::gateway::Gateway;
use fabric_gateway::key::PrivateKey;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(
    version,
    about = "Userspace WireGuard gateway for the fabric multi-cluster network"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the gateway in the foreground.
    Run {
        #[arg(short, long, env = "FABRIC_GATEWAY_CONFIG")]
        config: PathBuf,
        /// Directory of the WireGuard UAPI socket (`wg` looks in /var/run/wireguard).
        #[arg(long, default_value = "/var/run/wireguard")]
        uapi_dir: PathBuf,
        #[arg(long, default_value = "/var/run/fabric-gateway")]
        control_dir: PathBuf,
        /// Prometheus endpoint, e.g. 127.0.0.1:9586. Disabled when absent.
        #[arg(long)]
        metrics_addr: Option<SocketAddr>,
    },
    /// Write a new private key to FILE (mode 0600) and print its public key.
    Genkey {
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the public key of a private key read from stdin or --key-file.
    Pubkey {
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Print the running gateway's status as JSON (devices, ifindexes, health).
    Status {
        #[arg(long, default_value = DEFAULT_NAME)]
        name: String,
        #[arg(long, default_value = "/var/run/fabric-gateway")]
        control_dir: PathBuf,
    },
    /// Ask the running gateway to re-read its config file.
    Reload {
        #[arg(long, default_value = DEFAULT_NAME)]
        name: String,
        #[arg(long, default_value = "/var/run/fabric-gateway")]
        control_dir: PathBuf,
    },
    /// Validate a config file and exit.
    Check {
        #[arg(short, long)]
        config: PathBuf,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Genkey { out } => genkey(&out),
        Cmd::Pubkey { key_file } => pubkey(key_file.as_deref()),
        Cmd::Check { config } => {
            let cfg = Config::load(&config)?;
            PrivateKey::read_file(&cfg.interface.private_key_file)?;
            println!("ok: {} peer(s)", cfg.peers.len());
            Ok(())
        }
        Cmd::Status { name, control_dir } => client(&control_dir, &name, "status"),
        Cmd::Reload { name, control_dir } => client(&control_dir, &name, "reload"),
        Cmd::Run {
            config,
            uapi_dir,
            control_dir,
            metrics_addr,
        } => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(run(config, uapi_dir, control_dir, metrics_addr)),
    }
}

fn genkey(out: &Path) -> Result<()> {
    let key = PrivateKey::generate()?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("creating {} (it must not exist yet)", out.display()))?;
    writeln!(f, "{}", key.to_base64())?;
    println!("{}", key.public_key());
    Ok(())
}

fn pubkey(file: Option<&Path>) -> Result<()> {
    let key = match file {
        Some(p) => PrivateKey::read_file(p)?,
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            PrivateKey::from_base64(s.trim())
                .context("stdin is not a base64 WireGuard private key")?
        }
    };
    println!("{}", key.public_key());
    Ok(())
}

fn client(dir: &Path, name: &str, cmd: &str) -> Result<()> {
    let path = dir.join(format!("{name}.ctl"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt
        .block_on(control::control_request(&path, cmd))
        .with_context(|| format!("talking to {} (is the gateway running?)", path.display()))?;
    print!("{out}");
    if out.starts_with("error:") {
        bail!("gateway refused {cmd}");
    }
    Ok(())
}

async fn run(
    config: PathBuf,
    uapi_dir: PathBuf,
    control_dir: PathBuf,
    metrics_addr: Option<SocketAddr>,
) -> Result<()> {
    let cfg = Config::load(&config)?;
    let name = cfg.interface.name.clone();
    // Bind sockets before creating devices so a second instance fails without side effects.
    let uapi_sock = control::bind_socket(&uapi_dir, &format!("{name}.sock"))
        .await
        .with_context(|| format!("UAPI socket in {}", uapi_dir.display()))?;
    let ctl_sock = control::bind_socket(&control_dir, &format!("{name}.ctl"))
        .await
        .with_context(|| format!("control socket in {}", control_dir.display()))?;
    let metrics = match metrics_addr {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("metrics listener on {a}"))?,
        ),
        None => None,
    };
    let (conn, handle, _) = rtnetlink::new_connection().context("opening rtnetlink socket")?;
    tokio::spawn(conn);
    let gw = Gateway::start(cfg, handle)
        .await
        .context("starting gateway")?;

    let reload_fn = {
        let (gw, config) = (gw.clone(), config.clone());
        move || {
            let (gw, config) = (gw.clone(), config.clone());
            async move { reload(&gw, &config).await.map_err(|e| format!("{e:#}")) }
        }
    };
    let mut tasks = vec![
        tokio::spawn(control::serve_uapi(gw.clone(), uapi_sock)),
        tokio::spawn(control::serve_control(
            gw.clone(),
            ctl_sock,
            reload_fn.clone(),
        )),
    ];
    if let Some(l) = metrics {
        tracing::info!(addr = %l.local_addr()?, "metrics listening");
        tasks.push(tokio::spawn(control::serve_metrics(gw.clone(), l)));
    }

    let mut hup = signal(SignalKind::hangup())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading configuration");
                if let Err(e) = reload_fn().await {
                    tracing::error!(error = %e, "reload failed; keeping previous configuration where not applied");
                }
            }
            _ = int.recv() => break,
            _ = term.recv() => break,
        }
    }
    tracing::info!("shutting down");
    // Aborting the listener tasks drops their SocketFile guards, unlinking the sockets.
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    gw.shutdown().await;
    Ok(())
}

async fn reload(gw: &Arc<Gateway>, config: &Path) -> Result<()> {
    let cfg = Config::load(config)?;
    gw.reload(cfg).await?;
    Ok(())
}
