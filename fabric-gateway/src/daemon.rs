//! The `run` command: the gateway with its control, UAPI and metrics endpoints,
//! until SIGINT/SIGTERM. In the library so that the benchmark harness can run
//! exactly this code in a child process of its own binary.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};

use fabric_gateway_api::control::{ControlError, ErrorKind};

use crate::{
    config::{Config, ConfigError},
    control,
    device::Gateway,
};

/// How often the tunnel devices and the data plane are checked against their configuration.
const REPAIR_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs the gateway on its own tokio runtime until a termination signal.
pub fn run_blocking(
    config: PathBuf,
    uapi_dir: PathBuf,
    control_dir: PathBuf,
    metrics_addr: Option<SocketAddr>,
) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(config, uapi_dir, control_dir, metrics_addr))
}

pub async fn run(
    config: PathBuf,
    uapi_dir: PathBuf,
    control_dir: PathBuf,
    metrics_addr: Option<SocketAddr>,
) -> Result<()> {
    let cfg = load(&config)?;
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
    // Beside the control socket: on the pod's emptyDir, so it outlives a container restart.
    let endpoints = control_dir.join(format!("{name}.endpoints"));
    let gw = Gateway::start(cfg, handle, Some(endpoints))
        .await
        .context("starting gateway")?;

    let reload_fn = {
        let (gw, config) = (gw.clone(), config.clone());
        move || {
            let (gw, config) = (gw.clone(), config.clone());
            async move { reload(&gw, &config).await }
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
    tasks.push(tokio::spawn({
        let gw = gw.clone();
        async move {
            let mut tick = tokio::time::interval(REPAIR_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                gw.repair().await;
            }
        }
    }));
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

/// Reads the configuration, logging what it runs but probably does not mean.
fn load(config: &Path) -> Result<Config, ConfigError> {
    let cfg = Config::load(config)?;
    for w in cfg.warnings() {
        tracing::warn!(config = %config.display(), "{w}");
    }
    Ok(cfg)
}

async fn reload(gw: &Arc<Gateway>, config: &Path) -> Result<(), ControlError> {
    let cfg = load(config).map_err(|e| ControlError::from_error(ErrorKind::Config, &e))?;
    gw.reload(cfg)
        .await
        .map_err(|e| ControlError::from_error(ErrorKind::Apply, &e))
}

/// Makes any panic end the whole process, after the usual message. The gateway runs a thread
/// per tunnel device (or one polling thread) and a timer thread: a panicking one would otherwise
/// leave a half-alive gateway that answers its health checks while a tunnel is dead. Dead, it
/// is restarted by whatever supervises it (the pod's restart policy).
pub fn fail_fast_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!("fabric-gateway: a thread panicked; exiting so that the gateway is restarted");
        std::process::abort();
    }));
}
