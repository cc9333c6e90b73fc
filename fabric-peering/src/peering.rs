//! The peering protocol: the order of the steps and the waiting between them.
use std::time::Duration;

use fabric_api::names::field_manager;
use tokio::time::Instant;

use crate::{
    Cluster, Error, Event, Progress, Side, Step, Views, Wait,
    plan::{self, Member},
};

/// How often a wait asks again.
const POLL: Duration = Duration::from_millis(250);

#[derive(Clone, Debug)]
pub struct PeerOptions {
    /// Whose gateway listens (the other dials it).
    pub server: Side,
    /// How long the whole peering may take.
    pub timeout: Duration,
    /// The field manager of the objects created (server-side apply).
    pub field_manager: String,
}

impl Default for PeerOptions {
    fn default() -> Self {
        Self {
            server: Side::Remote,
            timeout: Duration::from_secs(120),
            field_manager: field_manager::PEERING.to_owned(),
        }
    }
}

/// A peering that is up.
#[derive(Clone, Debug, PartialEq)]
pub struct Peered {
    pub views: Views,
    /// Round-trip time of each side's in-tunnel probe, when it has one.
    pub local_latency: Option<String>,
    pub remote_latency: Option<String>,
}

/// Peers `local` with `remote` (both directions) and waits until the tunnel is up from both
/// sides. Safe to run again on a peering that exists: it converges to the same objects.
pub async fn peer(
    local: &Cluster,
    remote: &Cluster,
    opts: &PeerOptions,
    progress: &mut dyn Progress,
) -> Result<Peered, Error> {
    if local.id() == remote.id() {
        return Err(Error::SameClusterId {
            id: local.id().to_owned(),
            namespace: local.namespace.clone(),
        });
    }
    let deadline = Instant::now() + opts.timeout;
    let gateway_wait = |c: &Cluster| Wait::GatewayIdentity {
        side: c.side,
        namespace: c.namespace.clone(),
    };

    progress.event(&Event::Started(Step::GatewayKeys));
    local.ensure_gateway_key().await?;
    remote.ensure_gateway_key().await?;
    let lgw = wait_until(deadline, gateway_wait(local), || local.gateway_identity()).await?;
    let rgw = wait_until(deadline, gateway_wait(remote), || remote.gateway_identity()).await?;
    progress.event(&Event::GatewaysKnown {
        local: lgw.clone(),
        remote: rgw.clone(),
    });

    progress.event(&Event::Started(Step::CreatingObjects));
    let plan = plan::plan(
        Member {
            cluster: &local.identity,
            gateway: &lgw,
        },
        Member {
            cluster: &remote.identity,
            gateway: &rgw,
        },
        opts.server,
    );
    local.apply_peer(&plan.local, &opts.field_manager).await?;
    remote.apply_peer(&plan.remote, &opts.field_manager).await?;
    progress.event(&Event::ObjectsCreated);

    progress.event(&Event::Started(Step::WaitingForIpam));
    let (lid, rid) = (local.id(), remote.id());
    let ipam_wait = |c: &Cluster, peer: &str| Wait::Ipam {
        side: c.side,
        peer: peer.to_owned(),
    };
    let views = Views {
        local: wait_until(deadline, ipam_wait(local, rid), || local.seen_as(rid)).await?,
        remote: wait_until(deadline, ipam_wait(remote, lid), || remote.seen_as(lid)).await?,
    };
    progress.event(&Event::Granted(views.clone()));

    progress.event(&Event::Started(Step::WaitingForTunnel));
    let tunnel_wait = |c: &Cluster, peer: &str| Wait::Tunnel {
        side: c.side,
        peer: peer.to_owned(),
    };
    let local_latency =
        wait_until(deadline, tunnel_wait(local, rid), || local.connected(rid)).await?;
    let remote_latency =
        wait_until(deadline, tunnel_wait(remote, lid), || remote.connected(lid)).await?;
    progress.event(&Event::Connected {
        local_latency: local_latency.clone(),
        remote_latency: remote_latency.clone(),
    });
    Ok(Peered {
        views,
        local_latency,
        remote_latency,
    })
}

/// Removes the peering from both clusters and waits until every trace is gone (IPAM's
/// grants released, the gateways' Connections removed). Nothing to remove is no error.
pub async fn unpeer(
    local: &Cluster,
    remote: &Cluster,
    timeout: Duration,
    progress: &mut dyn Progress,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    for (here, there) in [(local, remote), (remote, local)] {
        progress.event(&Event::Started(Step::Releasing(here.side)));
        let peer = there.id();
        here.delete_peer(peer).await?;
        let wait = Wait::Release {
            side: here.side,
            peer: peer.to_owned(),
        };
        wait_until(deadline, wait, || async {
            Ok(here.released(peer).await?.then_some(()))
        })
        .await?;
        progress.event(&Event::Released(here.side));
    }
    Ok(())
}

/// Asks `f` until it yields a value or the deadline passes.
async fn wait_until<T, F, Fut>(deadline: Instant, what: Wait, f: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, Error>>,
{
    poll_until(deadline, POLL, what, f).await
}

/// [`wait_until`], asking every `every`.
async fn poll_until<T, F, Fut>(
    deadline: Instant,
    every: Duration,
    what: Wait,
    mut f: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, Error>>,
{
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(what));
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn wait() -> Wait {
        Wait::Tunnel {
            side: Side::Local,
            peer: "b".into(),
        }
    }

    // Real time with a short poll: a paused clock (tokio's `test-util`) would give every
    // test build of the workspace a tokio of other features, and so a second build of
    // everything above it.
    const EVERY: Duration = Duration::from_millis(5);

    #[tokio::test]
    async fn waits_until_a_value_comes() {
        let calls = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(10);
        let v = poll_until(deadline, EVERY, wait(), || async {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            Ok((n == 3).then_some(n))
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn gives_up_at_the_deadline_saying_on_what() {
        let t0 = Instant::now();
        let limit = Duration::from_millis(200);
        let r: Result<(), _> = poll_until(t0 + limit, EVERY, wait(), || async { Ok(None) }).await;
        match r {
            Err(Error::Timeout(w)) => assert_eq!(w, wait()),
            other => panic!("{other:?}"),
        }
        assert!(t0.elapsed() >= limit);
        // Not much after it (a loaded machine delays a timer by a few polls, not by seconds).
        assert!(
            t0.elapsed() < limit + Duration::from_secs(2),
            "{:?}",
            t0.elapsed()
        );
    }

    #[tokio::test]
    async fn an_error_stops_the_wait() {
        let r: Result<(), _> =
            wait_until(Instant::now() + Duration::from_secs(2), wait(), || async {
                Err(Error::SameClusterId {
                    id: "a".into(),
                    namespace: "ns".into(),
                })
            })
            .await;
        assert!(matches!(r, Err(Error::SameClusterId { .. })));
    }
}
