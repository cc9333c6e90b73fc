//! The agent's health, as `/healthz` reports it to the kubelet's liveness probe: each thing the
//! agent depends on (its watches of the API, the routes, the overlay) records whether its last
//! attempt worked; the agent is unhealthy once one of them has kept failing for longer than
//! the grace period. A single failure is not enough (the API server restarts, a route write
//! races the kernel): a restart would not help then, and would drop the agent's caches.
//!
//! The verdict is a pure function of the recorded state and the clock; the loop and the
//! watches record, the HTTP handler asks.
use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// What the agent depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// The watch of the cluster's Configurations (the routes' source).
    ConfigurationWatch,
    /// The watch of the gateway Lease (the next hop), with `--gateway-from-lease`.
    LeaseWatch,
    /// Reading the node's addresses and writing the routes to the gateway.
    Routes,
    /// The overlay device towards the gateway, with `--overlay`.
    Overlay,
}

impl Part {
    fn what(self) -> &'static str {
        match self {
            Part::ConfigurationWatch => "watch of Configurations",
            Part::LeaseWatch => "watch of the gateway Lease",
            Part::Routes => "routes to the gateway",
            Part::Overlay => "overlay to the gateway",
        }
    }
}

#[derive(Debug, Clone)]
struct Failing {
    since: Instant,
    error: String,
}

/// The recorded state (shared between the loop, the watches and the HTTP handler).
#[derive(Debug, Default)]
pub struct Health {
    failing: Mutex<BTreeMap<Part, Failing>>,
}

impl Health {
    /// `part` just worked.
    pub fn ok(&self, part: Part) {
        self.failing.lock().unwrap().remove(&part);
    }

    /// `part` just failed with `error` at `now`; it has been failing since the first failure
    /// after its last success.
    pub fn failed(&self, part: Part, error: impl std::fmt::Display, now: Instant) {
        let mut f = self.failing.lock().unwrap();
        let e = f.entry(part).or_insert_with(|| Failing {
            since: now,
            error: String::new(),
        });
        e.error = error.to_string();
    }

    /// `Ok` when healthy; else one line per part that has failed for longer than `grace`.
    pub fn verdict(&self, now: Instant, grace: Duration) -> Result<(), Vec<String>> {
        let problems: Vec<String> = self
            .failing
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, f)| now.saturating_duration_since(f.since) > grace)
            .map(|(p, f)| {
                format!(
                    "{}: failing for {}s: {}",
                    p.what(),
                    now.saturating_duration_since(f.since).as_secs(),
                    f.error
                )
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(30);

    #[test]
    fn healthy_until_a_failure_outlasts_the_grace() {
        let h = Health::default();
        let t0 = Instant::now();
        assert!(h.verdict(t0, GRACE).is_ok());
        h.failed(Part::ConfigurationWatch, "connection refused", t0);
        assert!(h.verdict(t0 + Duration::from_secs(10), GRACE).is_ok());
        // Failing again does not restart the clock: it counts from the first failure.
        h.failed(
            Part::ConfigurationWatch,
            "401 Unauthorized",
            t0 + Duration::from_secs(20),
        );
        let e = h.verdict(t0 + Duration::from_secs(31), GRACE).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("Configurations") && e[0].contains("401 Unauthorized"),
            "{e:?}"
        );
        // One success clears it.
        h.ok(Part::ConfigurationWatch);
        assert!(h.verdict(t0 + Duration::from_secs(60), GRACE).is_ok());
    }

    #[test]
    fn every_failing_part_is_named() {
        let h = Health::default();
        let t0 = Instant::now();
        h.failed(Part::Routes, "EPERM", t0);
        h.failed(Part::Overlay, "no such device", t0);
        h.failed(Part::LeaseWatch, "timeout", t0 + Duration::from_secs(40));
        let e = h.verdict(t0 + Duration::from_secs(45), GRACE).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e.iter().any(|l| l.starts_with("routes")), "{e:?}");
        assert!(e.iter().any(|l| l.starts_with("overlay")), "{e:?}");
    }
}
