//! Whether this replica's gateway can serve, as its operator sees it. The gateway Lease
//! follows it (`fabric_kube::lease::elect_fit`): a replica whose gateway cannot serve hands
//! the Lease over and does not take it, so a standby takes over from a replica that is alive
//! in the API but dead on the wire.
//!
//! The verdict ([`Health`]) is pure, with the clock passed in; [`watch`] asks the gateway over
//! its control socket and feeds it.
use std::time::{Duration, Instant};

use fabric_gateway_api::{control::Client, status::Problem};
use tokio::sync::watch;
use tracing::{info, warn};

/// What one question to the gateway found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It answered and reports nothing wrong.
    Serving,
    /// It answered with what keeps it from serving.
    Problems(Vec<Problem>),
    /// No answer (not running, hung, its control socket gone): why.
    Silent(String),
}

/// The verdict: fit while the gateway has answered [`Answer::Serving`] within `grace`, so
/// one slow answer under load does not move the Lease, and a dead gateway does within
/// `grace` plus one question.
#[derive(Debug)]
pub struct Health {
    grace: Duration,
    serving: Option<Instant>,
}

impl Health {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            serving: None,
        }
    }

    /// Notes an answer got at `now`.
    pub fn observe(&mut self, answer: &Answer, now: Instant) {
        if *answer == Answer::Serving {
            self.serving = Some(now);
        }
    }

    /// Whether the gateway counts as able to serve at `now` (never before it first did).
    pub fn fit(&self, now: Instant) -> bool {
        self.serving
            .is_some_and(|t| now.saturating_duration_since(t) < self.grace)
    }
}

/// Asks the gateway every `every` and keeps `fit` current until the receivers are gone.
pub async fn watch(gateway: Client, every: Duration, grace: Duration, fit: watch::Sender<bool>) {
    let gateway = gateway.with_timeout(every.max(Duration::from_millis(500)));
    let mut health = Health::new(grace);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        tick.tick().await;
        let answer = match gateway.status().await {
            Ok(s) if s.problems.is_empty() => Answer::Serving,
            Ok(s) => Answer::Problems(s.problems),
            Err(e) => Answer::Silent(e.to_string()),
        };
        let now = Instant::now();
        health.observe(&answer, now);
        let ok = health.fit(now);
        if last != Some(ok) {
            match (&answer, ok) {
                (_, true) => info!("the gateway serves: this replica may hold the gateway Lease"),
                (Answer::Problems(p), false) => {
                    let p: Vec<String> = p.iter().map(ToString::to_string).collect();
                    warn!(problems = ?p, "the gateway cannot serve: this replica gives the gateway Lease up")
                }
                (Answer::Silent(why), false) => {
                    warn!(error = %why, "the gateway does not answer: this replica gives the gateway Lease up")
                }
                (Answer::Serving, false) => {}
            }
            last = Some(ok);
        }
        // Only a change wakes the election up (each wake-up is a round of Lease requests).
        fit.send_if_modified(|was| std::mem::replace(was, ok) != ok);
        if fit.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_only_within_grace_of_a_serving_answer() {
        let grace = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut h = Health::new(grace);
        // Not before the gateway has answered once: a replica starting up takes nothing.
        assert!(!h.fit(t0));
        h.observe(&Answer::Silent("connection refused".into()), t0);
        assert!(!h.fit(t0));
        h.observe(&Answer::Serving, t0);
        assert!(h.fit(t0));
        // One silent answer (a slow moment) changes nothing within the grace...
        let t1 = t0 + Duration::from_millis(1500);
        h.observe(&Answer::Silent("timed out".into()), t1);
        assert!(h.fit(t1));
        // ...silence for the whole grace does.
        assert!(!h.fit(t0 + grace));
        // A gateway that answers but reports a dead packet thread counts as silent.
        h.observe(&Answer::Serving, t0 + grace);
        let problem = Answer::Problems(vec![Problem::ThreadStopped {
            thread: "fgw-udp".into(),
        }]);
        for k in 1..=4 {
            h.observe(&problem, t0 + grace + Duration::from_secs(k));
        }
        assert!(!h.fit(t0 + grace * 2));
        h.observe(&Answer::Serving, t0 + grace * 3);
        assert!(h.fit(t0 + grace * 3));
    }
}
