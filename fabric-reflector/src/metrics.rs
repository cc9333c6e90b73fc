//! Metrics per reflected kind (label `kind`), in the Prometheus text format: syncs, failed
//! syncs, retries of failed syncs, orphans deleted, keys queued and running, pairs running, and
//! how long syncs take. One [`Metrics`] per process, shared by every reflector; whoever runs
//! them serves [`Metrics::render`] (the virtual kubelet: `/metrics` of its kubelet API).
use prometheus_client::{
    encoding::prometheus_text,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// The `Content-Type` of [`Metrics::render`].
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

type Labels = [(&'static str, String); 1];

fn latency_histogram() -> Histogram {
    // 5 ms to ~41 s: a sync is a few API calls; the slow end is a remote that times out.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// The reflectors' metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    syncs: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    retries: Family<Labels, Counter>,
    orphans: Family<Labels, Counter>,
    queued: Family<Labels, Gauge>,
    running: Family<Labels, Gauge>,
    pairs: Family<Labels, Gauge>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fabric_reflector");
        let m = Self {
            registry: Registry::default(),
            syncs: Family::default(),
            errors: Family::default(),
            retries: Family::default(),
            orphans: Family::default(),
            queued: Family::default(),
            running: Family::default(),
            pairs: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        };
        registry.register(
            "syncs",
            "Syncs of a key done (whatever their outcome)",
            m.syncs.clone(),
        );
        registry.register(
            "sync_errors",
            "Syncs of a key that failed (retried with back-off)",
            m.errors.clone(),
        );
        registry.register(
            "retries",
            "Syncs of a key whose last sync failed",
            m.retries.clone(),
        );
        registry.register(
            "orphans_deleted",
            "Remote objects deleted because their home object is gone",
            m.orphans.clone(),
        );
        registry.register("queue_depth", "Keys waiting to be synced", m.queued.clone());
        registry.register("syncs_running", "Syncs under way", m.running.clone());
        registry.register("pairs", "Namespace pairs being reflected", m.pairs.clone());
        registry.register(
            "sync_duration_seconds",
            "How long a sync of a key takes",
            m.latency.clone(),
        );
        Self { registry, ..m }
    }

    /// The metrics in the Prometheus text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }

    /// The metrics of kind `kind` (created at zero the first time).
    pub(crate) fn of(&self, kind: &str) -> KindMetrics {
        let l = [("kind", kind.to_owned())];
        KindMetrics {
            syncs: self.syncs.get_or_create_owned(&l),
            errors: self.errors.get_or_create_owned(&l),
            retries: self.retries.get_or_create_owned(&l),
            orphans: self.orphans.get_or_create_owned(&l),
            queued: self.queued.get_or_create_owned(&l),
            running: self.running.get_or_create_owned(&l),
            pairs: self.pairs.get_or_create_owned(&l),
            latency: self.latency.get_or_create_owned(&l),
        }
    }
}

/// One kind's metrics (shared by its pairs: gauges move by what each pair adds or removes).
#[derive(Debug, Clone)]
pub(crate) struct KindMetrics {
    pub syncs: Counter,
    pub errors: Counter,
    pub retries: Counter,
    pub orphans: Counter,
    pub queued: Gauge,
    pub running: Gauge,
    pub pairs: Gauge,
    pub latency: Histogram,
}

/// A pair's share of a kind's gauges, taken back when the pair stops.
#[derive(Debug)]
pub(crate) struct Share {
    metrics: KindMetrics,
    queued: i64,
    running: i64,
}

impl Share {
    pub fn new(metrics: KindMetrics) -> Self {
        metrics.pairs.inc();
        Self {
            metrics,
            queued: 0,
            running: 0,
        }
    }

    pub fn metrics(&self) -> &KindMetrics {
        &self.metrics
    }

    /// This pair now has `queued` keys waiting and `running` syncs under way.
    pub fn set(&mut self, queued: usize, running: usize) {
        let (q, r) = (
            i64::try_from(queued).unwrap_or(i64::MAX),
            i64::try_from(running).unwrap_or(i64::MAX),
        );
        self.metrics.queued.inc_by(q - self.queued);
        self.metrics.running.inc_by(r - self.running);
        (self.queued, self.running) = (q, r);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.set(0, 0);
        self.metrics.pairs.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn per_kind_counters_in_prometheus_text() {
        let m = Metrics::new();
        let pods = m.of("pods");
        pods.syncs.inc();
        pods.syncs.inc();
        pods.errors.inc();
        pods.latency.observe(0.02);
        m.of("configmaps").syncs.inc();
        let text = m.render();
        assert_eq!(
            line(&text, "fabric_reflector_syncs_total{kind=\"pods\"}"),
            Some("fabric_reflector_syncs_total{kind=\"pods\"} 2")
        );
        assert_eq!(
            line(&text, "fabric_reflector_syncs_total{kind=\"configmaps\"}"),
            Some("fabric_reflector_syncs_total{kind=\"configmaps\"} 1")
        );
        assert_eq!(
            line(&text, "fabric_reflector_sync_errors_total{kind=\"pods\"}"),
            Some("fabric_reflector_sync_errors_total{kind=\"pods\"} 1")
        );
        assert!(text.contains("# TYPE fabric_reflector_sync_duration_seconds histogram"));
        assert_eq!(
            line(
                &text,
                "fabric_reflector_sync_duration_seconds_count{kind=\"pods\"}"
            ),
            Some("fabric_reflector_sync_duration_seconds_count{kind=\"pods\"} 1")
        );
        // The same kind's handles count together.
        m.of("pods").syncs.inc();
        assert_eq!(pods.syncs.get(), 3);
    }

    #[test]
    fn the_gauges_are_the_sum_of_the_running_pairs() {
        let m = Metrics::new();
        let mut a = Share::new(m.of("configmaps"));
        let mut b = Share::new(m.of("configmaps"));
        a.set(5, 2);
        b.set(1, 1);
        a.set(3, 2);
        let k = m.of("configmaps");
        assert_eq!((k.queued.get(), k.running.get(), k.pairs.get()), (4, 3, 2));
        drop(a);
        assert_eq!((k.queued.get(), k.running.get(), k.pairs.get()), (1, 1, 1));
        drop(b);
        assert_eq!((k.queued.get(), k.running.get(), k.pairs.get()), (0, 0, 0));
    }
}
