use std::{
    io::{IsTerminal, Read, Write},
    net::SocketAddr,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use fabric_gateway::{
    config::{Config, DEFAULT_NAME},
    daemon,
    key::PrivateKey,
};
use fabric_gateway_api::control::{self, Reply, Request};

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
    /// Exit 0 when the running gateway answers and can serve, 1 with the reason otherwise (no
    /// answer within 5 s, a packet thread stopped or stuck): the container's liveness probe.
    Health {
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

fn main() -> ExitCode {
    // `{:#}` prints the chain of causes on one line; returning the error from main would print
    // its Debug form, which carries a backtrace whenever RUST_BACKTRACE is set.
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    daemon::fail_fast_on_panic();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Genkey { out } => genkey(&out),
        Cmd::Pubkey { key_file } => pubkey(key_file.as_deref()),
        Cmd::Check { config } => {
            let cfg = Config::load(&config)?;
            PrivateKey::read_file(&cfg.interface.private_key_file)?;
            for w in cfg.warnings() {
                eprintln!("warning: {}: {w}", config.display());
            }
            println!("ok: {} peer(s)", cfg.peers.len());
            Ok(())
        }
        Cmd::Status { name, control_dir } => client(&control_dir, &name, Request::Status),
        Cmd::Reload { name, control_dir } => client(&control_dir, &name, Request::Reload),
        Cmd::Health { name, control_dir } => health(&control_dir, &name),
        Cmd::Run {
            config,
            uapi_dir,
            control_dir,
            metrics_addr,
        } => {
            tracing::info!(config = %config.display(), "gateway starting");
            daemon::run_blocking(config, uapi_dir, control_dir, metrics_addr)
        }
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

fn health(dir: &Path, name: &str) -> Result<()> {
    let client = control::Client::for_gateway(dir, name).with_timeout(HEALTH_TIMEOUT);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let status = match rt.block_on(client.request(Request::Status))? {
        Reply::Status(s) => s,
        other => anyhow::bail!("the gateway answered a status request with {other:?}"),
    };
    if status.problems.is_empty() {
        println!("ok");
        return Ok(());
    }
    let why: Vec<String> = status.problems.iter().map(ToString::to_string).collect();
    anyhow::bail!("gateway {name} cannot serve: {}", why.join("; "))
}

/// Below the liveness probe's own timeout, so the probe reports why rather than a timeout.
const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn client(dir: &Path, name: &str, request: Request) -> Result<()> {
    let client = control::Client::for_gateway(dir, name);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match rt.block_on(client.request(request))? {
        Reply::Status(s) => println!("{}", serde_json::to_string_pretty(&s)?),
        Reply::Reloaded => println!("ok"),
        Reply::Config(c) => println!("{}", serde_json::to_string_pretty(&c)?),
    }
    Ok(())
}
