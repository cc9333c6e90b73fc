//! fabricctl: peer clusters through the fabric and see how they are connected.
//!
//! `fabricctl peer --remote-kubeconfig B.yaml --auth-url URL` (with A's kubeconfig as usual)
//! makes A a consumer of B by the out-of-band flow, with a one-time token it mints on B;
//! `--network-only` instead exchanges what each side needs about the other (CIDRs, gateway key
//! and endpoint), creates the resources on both sides and waits until the tunnel is up in both
//! directions (the protocol is `fabric-peering`'s). `unpeer` undoes either.
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, Result};
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};

mod auth;
mod cli;
mod dump;
mod follow;
mod forget;
mod info;
mod mode;
mod movevol;
mod offload;
mod peer;
mod status;
mod unpeer;

use cli::{
    Cli, Cmd, ForgetCmd, GenerateCmd, InfoCmd, ModeCmd, MoveCmd, NetworkCmd, OffloadCmd, PeerFlow,
    TokenCmd, UnoffloadCmd,
};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    // Inspecting a host: switch namespace before any thread exists, then stay synchronous.
    let r = if let Cmd::Network(NetworkCmd::Dump {
        pin_dir,
        netns,
        output,
    }) = &cli.cmd
    {
        netns
            .as_deref()
            .map_or(Ok(()), fabric_dataplane::sys::enter_netns)
            .map_err(anyhow::Error::from)
            .and_then(|()| dump::network_dump(pin_dir.clone(), *output))
    } else {
        tokio::runtime::Runtime::new()
            .context("starting the runtime")
            .and_then(|rt| rt.block_on(run(cli)))
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let local = client(cli.kubeconfig.as_ref(), "local").await?;
    let ns = &cli.namespace;
    match cli.cmd {
        Cmd::Peer {
            flow:
                Some(PeerFlow::OutOfBand {
                    auth_url,
                    cluster_id,
                    token,
                    auth_pin,
                    auth_ca,
                    ask,
                    timeout_secs,
                }),
            ..
        } => {
            auth::peer_out_of_band(
                local,
                ns,
                auth::OutOfBandArgs {
                    auth_url,
                    cluster_id,
                    token,
                    auth_pin,
                    auth_ca,
                    ask: ask.into(),
                    timeout: Duration::from_secs(timeout_secs),
                },
            )
            .await
        }
        Cmd::Peer {
            flow: None,
            remote_kubeconfig,
            network_only,
            auth_url,
            ask,
            server,
            timeout_secs,
        } => {
            let remote_kubeconfig = remote_kubeconfig.context("--remote-kubeconfig is required")?;
            let remote = client(Some(&remote_kubeconfig), "remote").await?;
            let timeout = Duration::from_secs(timeout_secs);
            if network_only {
                peer::peer(local, remote, ns, server, timeout).await
            } else {
                let auth_url = auth_url.context(
                    "--auth-url is required: where this cluster reaches the provider's \
                     authentication service (or --network-only for a direct network peering)",
                )?;
                auth::peer_in_band(local, remote, ns, auth_url, ask.into(), timeout).await
            }
        }
        Cmd::Unpeer {
            peer: id,
            remote_kubeconfig,
            network_only,
            force,
            leave_volumes,
            timeout_secs,
        } => {
            let remote = match &remote_kubeconfig {
                Some(k) => Some(client(Some(k), "remote").await?),
                None => None,
            };
            let timeout = Duration::from_secs(timeout_secs);
            match (network_only, remote) {
                (true, Some(remote)) => peer::unpeer(local, remote, ns, timeout).await,
                (true, None) => anyhow::bail!("--network-only needs --remote-kubeconfig"),
                (false, remote) => {
                    let how = unpeer::How {
                        force,
                        leave_volumes,
                        timeout,
                    };
                    unpeer::unpeer(local, remote, ns, id, how).await
                }
            }
        }
        Cmd::Status { output } => status::status(&local, ns, output).await,
        Cmd::Info { what: None, output } => info::info(&local, ns, output).await,
        Cmd::Info {
            what: Some(InfoCmd::Peer { id }),
            output,
        } => info::info_peer(&local, ns, id.as_deref(), output).await,
        Cmd::Network(_) => unreachable!("handled before the runtime starts"),
        Cmd::Generate(GenerateCmd::PeerCommand {
            auth_url,
            ttl,
            consumer_id,
        }) => auth::generate_peer_command(local, ns, &auth_url, ttl, consumer_id.as_deref()).await,
        Cmd::Token(TokenCmd::Rotate) => auth::token_rotate(local).await,
        Cmd::Offload(OffloadCmd::Namespace {
            names,
            namespace_mapping_strategy,
            remote_namespace_name,
            pod_offloading_strategy,
            selectors,
            storage_retention,
            output,
            timeout,
        }) => {
            let req = offload::Request {
                names,
                mapping: namespace_mapping_strategy,
                remote_name: remote_namespace_name,
                pods: pod_offloading_strategy,
                selectors,
                retention: storage_retention,
            };
            offload::offload(local, ns, req, output.is_some(), timeout).await
        }
        Cmd::Unoffload(UnoffloadCmd::Namespace { names, timeout }) => {
            offload::unoffload(local, ns, &names, timeout).await
        }
        Cmd::Forget(ForgetCmd::Volumes {
            peer,
            claim,
            timeout,
        }) => forget::forget_volumes(&local, &peer, claim.as_deref(), timeout).await,
        Cmd::Mode(ModeCmd::Tethered { peer, drain_local }) => {
            mode::tethered(&local, ns, &peer, drain_local).await
        }
        Cmd::Mode(ModeCmd::Autonomous) => mode::autonomous(&local).await,
        Cmd::Move(MoveCmd::Volume { claim, to, image }) => {
            let Some((claim_ns, name)) = claim
                .split_once('/')
                .filter(|(n, m)| !n.is_empty() && !m.is_empty())
            else {
                anyhow::bail!("claim {claim:?}: must be NAMESPACE/NAME");
            };
            movevol::move_volume(&local, ns, claim_ns, name, &to, &image).await
        }
    }
}

async fn client(path: Option<&PathBuf>, what: &str) -> Result<Client> {
    let cfg = match path {
        Some(p) => {
            let kc = Kubeconfig::read_from(p)
                .with_context(|| format!("reading {what} kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("{what} kubeconfig {}", p.display()))?
        }
        None => kube::Config::infer()
            .await
            .with_context(|| format!("no {what} kubeconfig (set KUBECONFIG)"))?,
    };
    Client::try_from(cfg).with_context(|| format!("{what} cluster client"))
}
