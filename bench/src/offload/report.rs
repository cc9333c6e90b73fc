//! What a burst and its deletion measured, and how it is printed.
use super::*;

/// What one burst measured.
pub(super) struct Burst {
    /// Per pod, from its binding to Running, sorted.
    pub(super) latencies: Vec<Duration>,
    /// From the first binding to the last pod Running.
    pub(super) all: Duration,
    /// Per stage on the way, from each pod's binding to that stage, sorted.
    pub(super) stages: Vec<(&'static str, Vec<Duration>)>,
    /// CPU seconds each component used meanwhile.
    pub(super) cpu: Vec<(&'static str, f64)>,
}

impl Burst {
    pub(super) fn line(&self) -> String {
        format!(
            "p50 {}, p99 {}, all {} Running after {}",
            secs(percentile(&self.latencies, 0.5)),
            secs(percentile(&self.latencies, 0.99)),
            self.latencies.len(),
            secs(self.all)
        )
    }

    pub(super) fn details(&self) -> String {
        let mut s = String::new();
        for (label, d) in &self.stages {
            if !d.is_empty() {
                s.push_str(&format!(
                    "          {label:<34} p50 {}, p99 {}\n",
                    secs(percentile(d, 0.5)),
                    secs(percentile(d, 0.99))
                ));
            }
        }
        let cpu: Vec<String> = self
            .cpu
            .iter()
            .map(|(label, s)| format!("{label} {s:.1}"))
            .collect();
        s.push_str(&format!(
            "          CPU seconds meanwhile: {}",
            cpu.join(", ")
        ));
        s
    }
}

/// What deleting a burst measured.
pub(super) struct Deletion {
    /// From the first delete until every pod (and ShadowPod) is gone.
    pub(super) all: Duration,
    /// Per pod, from its delete at home until it is gone there and, offloaded, its
    /// ShadowPod on the provider too, sorted.
    pub(super) per_pod: Vec<Duration>,
    /// Per stage on the way, from each pod's delete to that stage, sorted.
    pub(super) stages: Vec<(&'static str, Vec<Duration>)>,
    /// From the first delete until the home pods, the provider's real pods and its
    /// ShadowPods were each all gone (as listed).
    pub(super) empty_after: [Duration; 3],
}

impl Deletion {
    pub(super) fn line(&self) -> String {
        format!(
            "per pod p50 {}, p99 {}, all {} gone after {}",
            secs(percentile(&self.per_pod, 0.5)),
            secs(percentile(&self.per_pod, 0.99)),
            self.per_pod.len(),
            secs(self.all)
        )
    }

    pub(super) fn details(&self) -> String {
        let [home, real, shadows] = self.empty_after.map(secs);
        let empty = format!(
            "          home pods all gone after {home}, real pods {real}, ShadowPods {shadows}\n"
        );
        let stages: String = self
            .stages
            .iter()
            .filter(|(_, d)| !d.is_empty())
            .map(|(label, d)| {
                format!(
                    "          {label:<34} p50 {}, p99 {}\n",
                    secs(percentile(d, 0.5)),
                    secs(percentile(d, 0.99))
                )
            })
            .collect();
        empty + &stages
    }
}
