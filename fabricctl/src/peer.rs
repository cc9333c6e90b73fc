//! `fabricctl peer` and `unpeer`: the peering library, with its progress printed.
use std::{
    io::{IsTerminal, Write},
    time::{Duration, Instant},
};

use anyhow::Result;
use fabric_peering::{Cluster, Event, PeerOptions, Progress, Step};
use kube::Client;

use crate::cli::Side;

pub async fn peer(
    local: Client,
    remote: Client,
    namespace: &str,
    server: Side,
    timeout: Duration,
) -> Result<()> {
    let (l, r) = clusters(local, remote, namespace).await?;
    println!("Peering {} (local) with {} (remote)", l.id(), r.id());
    let opts = PeerOptions {
        server: server.into(),
        timeout,
        ..Default::default()
    };
    fabric_peering::peer(&l, &r, &opts, &mut Printer::new(&l, &r)).await?;
    Ok(())
}

pub async fn unpeer(
    local: Client,
    remote: Client,
    namespace: &str,
    timeout: Duration,
) -> Result<()> {
    let (l, r) = clusters(local, remote, namespace).await?;
    fabric_peering::unpeer(&l, &r, timeout, &mut Printer::new(&l, &r)).await?;
    println!(
        "unpeered {} and {}: no peering resources left on either side",
        l.id(),
        r.id()
    );
    Ok(())
}

async fn clusters(local: Client, remote: Client, ns: &str) -> Result<(Cluster, Cluster)> {
    Ok((
        Cluster::read(fabric_peering::Side::Local, local, ns).await?,
        Cluster::read(fabric_peering::Side::Remote, remote, ns).await?,
    ))
}

/// Prints each step on a terminal while it runs ("…", overwritten) and each result once done
/// ("✓", with the time since the start).
struct Printer<'a> {
    local: &'a Cluster,
    remote: &'a Cluster,
    t0: Instant,
    tty: bool,
}

impl<'a> Printer<'a> {
    fn new(local: &'a Cluster, remote: &'a Cluster) -> Self {
        Self {
            local,
            remote,
            t0: Instant::now(),
            tty: std::io::stdout().is_terminal(),
        }
    }

    fn step(&self, step: Step) -> Option<String> {
        self.tty.then(|| match step {
            Step::GatewayKeys => "gateway keys".into(),
            Step::CreatingObjects => "creating the peering on both sides".into(),
            Step::WaitingForIpam => "waiting for IPAM".into(),
            Step::WaitingForTunnel => "waiting for the tunnel".into(),
            Step::Releasing(side) => format!("removing the peering from the {side} cluster"),
        })
    }

    fn done(&self, event: &Event) -> Option<String> {
        let (l, r) = (self.local.id(), self.remote.id());
        Some(match event {
            Event::Started(_) => return None,
            Event::GatewaysKnown { local, remote } => {
                format!(
                    "gateways: {l} at {}, {r} at {}",
                    local.endpoint, remote.endpoint
                )
            }
            Event::ObjectsCreated => {
                "Configuration, PublicKey and gateway endpoint created on both sides".into()
            }
            Event::Granted(v) => format!(
                "{l} sees {r}'s pods {} as {}; {r} sees {l}'s pods {} as {}",
                self.remote.identity.pod_cidr,
                v.local.pod,
                self.local.identity.pod_cidr,
                v.remote.pod
            ),
            Event::Connected {
                local_latency,
                remote_latency,
            } => format!(
                "connected (latency {} / {})",
                local_latency.as_deref().unwrap_or("n/a"),
                remote_latency.as_deref().unwrap_or("n/a")
            ),
            Event::Released(side) => format!("nothing left about the peer in the {side} cluster"),
        })
    }
}

impl Progress for Printer<'_> {
    fn event(&mut self, event: &Event) {
        if let Event::Started(step) = event {
            if let Some(msg) = self.step(*step) {
                print!("  \u{2026} {msg}\r");
                let _ = std::io::stdout().flush();
            }
        } else if let Some(msg) = self.done(event) {
            println!("  \u{2713} {msg} ({:.1}s)", self.t0.elapsed().as_secs_f64());
        }
    }
}
