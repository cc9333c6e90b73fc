//! The consumer's heartbeat on its provider: the Lease [`names::lease::CONSUMER`] in the
//! tenant namespace, renewed through the identity, saying whether this cluster's own API
//! server answers ([`names::annotation::HOME_API`], from [`probe_home`]): the provider takes
//! this cluster's endpoints as not ready while the Lease is silent or says it does not.
//!
//! At-most-once semantics (when the VirtualNode carries the terms the provider agreed to,
//! [`AtMostOnce`]) build on the same Lease: renewals then come several times per partition
//! time, and this side knows when the pods offloaded there may be declared stopped.
//!
//! The provider stops this cluster's pods once it has not seen the Lease change for
//! `partitionSeconds` of its own clock, deleting them with at most `graceSeconds`. This side
//! counts from its own last successful renewal (the provider saw it no earlier than it was
//! written, so no later than this process saw the answer, plus its watch's delay) and waits
//! the partition time, the grace period and [`margin`] (watch delay, the provider's reconcile,
//! clock rates) before it declares the pods Failed, so the provider's stop always comes
//! first. A process that has not renewed since it started declares nothing: its pods stay
//! not Ready until the provider answers again.
use std::time::{Duration, Instant};

use fabric_api::{
    names,
    offloading::v1alpha1::{AtMostOnce, VirtualNode},
};
use fabric_auth::identity;
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::Secret,
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{Api, api::ObjectMeta};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::FIELD_MANAGER;

/// What this side knows: the terms, and when (its monotonic clock) a renewal last succeeded
/// under them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heartbeat {
    pub terms: Option<AtMostOnce>,
    pub renewed: Option<Instant>,
}

/// Time the provider may need beyond the partition time and the grace period to have
/// stopped the pods: its watch's delay and reconcile, plus a tenth of the partition time for
/// the two clocks' rates.
pub fn margin(terms: AtMostOnce) -> Duration {
    Duration::from_secs(5) + Duration::from_secs(terms.partition_seconds.into()) / 10
}

/// How often the Lease is renewed: five times per partition time, within 1 to 10 seconds.
pub fn renew_every(terms: AtMostOnce) -> Duration {
    (Duration::from_secs(terms.partition_seconds.into()) / 5)
        .clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// How often the Lease is renewed without at-most-once terms (the provider takes it as silent
/// after three missed renewals, `SILENT_AFTER` in fabric-offloading's endpoint slices).
pub const RENEW_WITHOUT_TERMS: Duration = Duration::from_secs(10);

/// How often this cluster's API server is asked whether it is ready, and how long an answer
/// may take.
pub const HOME_PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long this cluster's API server may go without a good answer before the heartbeat says
/// it is out of reach (a moment's hiccup is not an outage: four probes).
pub const HOME_SILENT_LIMIT: Duration = Duration::from_secs(20);

/// Whether this cluster's API server counts as reachable at `now`: it answered within
/// `limit`, counting from `since` (when probing began) if it never has.
pub fn home_reachable(
    last_ok: Option<Instant>,
    since: Instant,
    now: Instant,
    limit: Duration,
) -> bool {
    now.saturating_duration_since(last_ok.unwrap_or(since)) < limit
}

/// Asks this cluster's API server whether it is ready every [`HOME_PROBE_EVERY`] and
/// publishes whether it is reachable ([`home_reachable`]). Its own task, so that a server
/// that hangs (rather than refuses) delays nothing else.
pub async fn probe_home(local: kube::Client, out: watch::Sender<bool>) {
    let since = Instant::now();
    let mut last_ok: Option<Instant> = None;
    loop {
        let req = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("a static request");
        let answer = tokio::time::timeout(HOME_PROBE_EVERY, local.request_text(req)).await;
        match answer {
            Ok(Ok(text)) if text.trim() == "ok" => last_ok = Some(Instant::now()),
            Ok(Ok(text)) => debug!(answer = %text.trim(), "the home API server is not ready"),
            Ok(Err(e)) => debug!(error = %e, "probing the home API server"),
            Err(_) => debug!("probing the home API server: no answer in time"),
        }
        let reachable = home_reachable(last_ok, since, Instant::now(), HOME_SILENT_LIMIT);
        out.send_if_modified(|r| {
            let changed = *r != reachable;
            if changed {
                if reachable {
                    info!("the home API server answers again");
                } else {
                    warn!(limit = ?HOME_SILENT_LIMIT, "the home API server has not answered: the provider is told");
                }
            }
            *r = reachable;
            changed
        });
        tokio::time::sleep(HOME_PROBE_EVERY).await;
    }
}

/// From when the pods may be declared stopped by the provider (None: never, as things are).
pub fn deadline(hb: &Heartbeat) -> Option<Instant> {
    let (terms, renewed) = (hb.terms?, hb.renewed?);
    Some(
        renewed
            + Duration::from_secs(terms.partition_seconds.into())
            + Duration::from_secs(terms.grace_seconds.into())
            + margin(terms),
    )
}

/// Why, at `now`, no new pod is to be made on the provider (None: it may be). Under
/// at-most-once the provider stops a pod made while it has not seen this cluster's heartbeat
/// for the partition time, for good; so after a partition (or before the first renewal under
/// new terms) pods wait until a renewal has gone through, and while renewals keep failing.
pub fn offload_waits(hb: &Heartbeat, now: Instant) -> Option<String> {
    let terms = hb.terms?;
    let fresh_for = Duration::from_secs(terms.partition_seconds.into()) / 2;
    match hb.renewed {
        Some(r) if now.saturating_duration_since(r) < fresh_for => None,
        Some(r) => Some(format!(
            "the heartbeat on the provider was last renewed {}s ago: under at-most-once \
             semantics (partition time {}s) pods are made there only once it is renewed again",
            now.saturating_duration_since(r).as_secs(),
            terms.partition_seconds
        )),
        None => Some(format!(
            "the heartbeat on the provider has not been renewed under the at-most-once terms \
             yet (partition time {}s): pods are made there once it is",
            terms.partition_seconds
        )),
    }
}

/// Whether, at `now`, the provider has stopped the pods for sure: the message saying so.
pub fn declared(hb: &Heartbeat, now: Instant) -> Option<String> {
    let at = deadline(hb)?;
    let terms = hb.terms?;
    (now >= at).then(|| {
        format!(
            "the provider has not been reached for {}s: under at-most-once semantics it has \
             stopped this pod (after {}s without heartbeat, {}s grace)",
            hb.renewed
                .map_or(0, |r| now.saturating_duration_since(r).as_secs()),
            terms.partition_seconds,
            terms.grace_seconds
        )
    })
}

/// The heartbeat Lease in `namespace` (the tenant namespace), renewed at `now` (this
/// cluster's clock: the provider only looks at whether it changes), with what this side
/// knows of its own API server.
pub fn lease(
    namespace: &str,
    holder: &str,
    terms: Option<AtMostOnce>,
    home_reachable: bool,
    now: Timestamp,
) -> Lease {
    let duration = terms.map_or(3 * RENEW_WITHOUT_TERMS.as_secs(), |t| {
        t.partition_seconds.into()
    });
    let home = if home_reachable {
        names::annotation::HOME_API_REACHABLE
    } else {
        names::annotation::HOME_API_UNREACHABLE
    };
    Lease {
        metadata: ObjectMeta {
            name: Some(names::lease::CONSUMER.to_owned()),
            namespace: Some(namespace.to_owned()),
            annotations: Some([(names::annotation::HOME_API.to_owned(), home.to_owned())].into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(i32::try_from(duration).unwrap_or(i32::MAX)),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// Renews the Lease through the identity the Secret holds (a new client when it changes), at
/// once when `home` (whether this cluster's API server answers) changes, and publishes the
/// [`Heartbeat`].
pub async fn run(
    mut secret: watch::Receiver<Option<Secret>>,
    mut vn: watch::Receiver<Option<VirtualNode>>,
    mut home: watch::Receiver<bool>,
    out: watch::Sender<Heartbeat>,
) {
    let mut client: Option<kube::Client> = None;
    let mut rebuild = true;
    let mut hb = Heartbeat::default();
    loop {
        if rebuild {
            let current = secret.borrow_and_update().clone();
            client = match current.as_ref().and_then(identity::kubeconfig_of) {
                Some(text) => identity::client_from_kubeconfig(&text).await.ok(),
                None => None,
            };
            rebuild = false;
        }
        let current = vn.borrow_and_update().clone();
        let terms = current.as_ref().and_then(|v| v.spec.at_most_once);
        if terms != hb.terms {
            // New terms count from a renewal under them.
            info!(?terms, "at-most-once terms");
            hb = Heartbeat {
                terms,
                renewed: None,
            };
        }
        let every = terms.map_or(RENEW_WITHOUT_TERMS, renew_every);
        if let (Some(c), Some(v)) = (client.as_ref(), current.as_ref()) {
            let api: Api<Lease> = Api::default_namespaced(c.clone());
            let lease = lease(
                c.default_namespace(),
                &v.spec.node_name,
                terms,
                *home.borrow_and_update(),
                Timestamp::now(),
            );
            let attempt = tokio::time::timeout(every, FIELD_MANAGER.apply(&api, &lease));
            match attempt.await {
                Ok(Ok(_)) => {
                    if hb.renewed.is_none() {
                        info!("heartbeat Lease renewed on the provider");
                    }
                    hb.renewed = Some(Instant::now());
                    debug!("heartbeat renewed");
                }
                Ok(Err(e)) => warn!(error = %e, "renewing the heartbeat Lease on the provider"),
                Err(_) => warn!("renewing the heartbeat Lease on the provider: no answer in time"),
            }
        }
        out.send_if_modified(|h| {
            let changed = *h != hb;
            *h = hb;
            changed
        });
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            r = secret.changed() => {
                if r.is_err() {
                    return;
                }
                rebuild = true;
            }
            r = vn.changed() => {
                if r.is_err() {
                    return;
                }
            }
            r = home.changed() => {
                if r.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt as _;

    use super::*;

    const TERMS: AtMostOnce = AtMostOnce {
        partition_seconds: 10,
        grace_seconds: 3,
    };

    #[test]
    fn the_pods_are_declared_stopped_only_after_the_provider_stopped_them() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let hb = Heartbeat {
            terms: Some(TERMS),
            renewed: Some(t0),
        };
        // 10 s partition + 3 s grace + 5 s + 1 s margin.
        assert_eq!(deadline(&hb), Some(t0 + s(19)));
        assert_eq!(declared(&hb, t0 + s(18)), None);
        let msg = declared(&hb, t0 + s(19)).unwrap();
        assert!(msg.contains("19s"), "{msg}");
        // Never renewed (a restart mid-partition), or off: never declared.
        let fresh = Heartbeat {
            terms: Some(TERMS),
            renewed: None,
        };
        assert_eq!(declared(&fresh, t0 + s(1000)), None);
        let off = Heartbeat {
            terms: None,
            renewed: Some(t0),
        };
        assert_eq!(declared(&off, t0 + s(1000)), None);
    }

    #[test]
    fn new_pods_wait_for_a_recent_renewal_under_terms() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let off = Heartbeat {
            terms: None,
            renewed: None,
        };
        assert_eq!(offload_waits(&off, t0), None);
        let fresh = Heartbeat {
            terms: Some(TERMS),
            renewed: None,
        };
        assert!(
            offload_waits(&fresh, t0)
                .unwrap()
                .contains("not been renewed")
        );
        let hb = Heartbeat {
            terms: Some(TERMS),
            renewed: Some(t0),
        };
        // Half the partition time (10 s): the provider still hears this cluster.
        assert_eq!(offload_waits(&hb, t0 + s(4)), None);
        let why = offload_waits(&hb, t0 + s(5)).unwrap();
        assert!(why.contains("5s ago"), "{why}");
    }

    #[test]
    fn renewals_come_several_times_per_partition_time() {
        let t = |p| AtMostOnce {
            partition_seconds: p,
            grace_seconds: 0,
        };
        assert_eq!(renew_every(t(5)), Duration::from_secs(1));
        assert_eq!(renew_every(t(20)), Duration::from_secs(4));
        assert_eq!(renew_every(t(600)), Duration::from_secs(10));
        assert_eq!(margin(t(100)), Duration::from_secs(15));
    }

    #[test]
    fn the_lease_changes_on_every_renewal_and_says_whether_home_answers() {
        let at = |s| Timestamp::from_second(s).unwrap();
        let a = lease("fabric-tenant-a", "fabric-b", Some(TERMS), true, at(1));
        let b = lease("fabric-tenant-a", "fabric-b", Some(TERMS), true, at(2));
        assert_eq!(a.metadata.name.as_deref(), Some(names::lease::CONSUMER));
        assert_eq!(a.metadata.namespace.as_deref(), Some("fabric-tenant-a"));
        assert_eq!(a.spec.as_ref().unwrap().lease_duration_seconds, Some(10));
        assert_ne!(a, b);
        let home = |l: &Lease| l.annotations()[names::annotation::HOME_API].clone();
        assert_eq!(home(&a), names::annotation::HOME_API_REACHABLE);
        let down = lease("fabric-tenant-a", "fabric-b", None, false, at(3));
        assert_eq!(home(&down), names::annotation::HOME_API_UNREACHABLE);
        // Without terms: three renewals' worth.
        assert_eq!(down.spec.as_ref().unwrap().lease_duration_seconds, Some(30));
    }

    #[test]
    fn home_is_out_of_reach_only_after_the_limit_without_an_answer() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let limit = s(20);
        // Never answered: counted from when probing began.
        assert!(home_reachable(None, t0, t0 + s(19), limit));
        assert!(!home_reachable(None, t0, t0 + s(20), limit));
        assert!(home_reachable(Some(t0 + s(30)), t0, t0 + s(49), limit));
        assert!(!home_reachable(Some(t0 + s(30)), t0, t0 + s(50), limit));
        // A clock that went backwards is no outage.
        assert!(home_reachable(Some(t0 + s(30)), t0, t0 + s(10), limit));
    }
}
