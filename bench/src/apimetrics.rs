//! What a test API server was asked: `apiserver_request_total` from its `/metrics`, by verb,
//! resource and (when not a success) status code, so that a bench can say how many requests
//! of each kind a unit of work cost.
use std::collections::BTreeMap;

use anyhow::{Result, bail};

use fabric_tests::apiserver::ApiServer;

/// Requests served so far, keyed `VERB resource[/subresource][ code]` (the code only when it
/// is not a 2xx).
pub type Counts = BTreeMap<String, f64>;

/// The value of label `name` in a Prometheus sample's label set `{a="x",b="y"}`.
fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or("")
}

/// Parses the text exposition format's `apiserver_request_total` samples.
pub fn parse(metrics: &str) -> Counts {
    let mut counts = Counts::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let resource = label(labels, "resource");
        if resource.is_empty() {
            // /readyz, /metrics and the like: not the API's work.
            continue;
        }
        let mut key = format!("{} {resource}", label(labels, "verb"));
        let sub = label(labels, "subresource");
        if !sub.is_empty() {
            key.push('/');
            key.push_str(sub);
        }
        let code = label(labels, "code");
        if !code.starts_with('2') {
            key.push(' ');
            key.push_str(code);
        }
        *counts.entry(key).or_default() += value;
    }
    counts
}

/// The server's counts now.
pub fn snapshot(api: &ApiServer) -> Result<Counts> {
    let o = api.kubectl(&["get", "--raw", "/metrics"]);
    if !o.status.success() {
        bail!("GET /metrics: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(parse(&String::from_utf8_lossy(&o.stdout)))
}

/// What was served between two snapshots.
pub fn delta(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Two servers' counts added up, kind by kind (e.g. both clusters' work for one pod).
pub fn merge(a: &Counts, b: &Counts) -> Counts {
    let mut sum = a.clone();
    for (k, v) in b {
        *sum.entry(k.clone()).or_default() += v;
    }
    sum
}

/// The requests answered with anything but a success (their keys carry the code).
pub fn errors(d: &Counts) -> Counts {
    d.iter()
        .filter(|(k, _)| {
            k.rsplit_once(' ')
                .is_some_and(|(_, code)| code.parse::<u16>().is_ok())
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// `total`, then the kinds by count, each divided by `per` (e.g. requests per pod).
pub fn summary(d: &Counts, per: usize) -> String {
    let per = per.max(1) as f64;
    let total: f64 = d.values().sum();
    let mut kinds: Vec<(&String, &f64)> = d.iter().collect();
    kinds.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    // Kinds that print as 0.0 (a watch, a lease renewal over a burst of thousands) are
    // counted in the total, listed only by their number.
    let (shown, small): (Vec<_>, Vec<_>) = kinds.iter().partition(|(_, v)| **v / per >= 0.05);
    let mut kinds: Vec<String> = shown
        .iter()
        .map(|(k, v)| format!("{k} {:.1}", *v / per))
        .collect();
    if !small.is_empty() {
        kinds.push(format!("{} kinds under 0.05", small.len()));
    }
    format!("{:.1} ({})", total / per, kinds.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counts_by_kind_and_failure() {
        let text = r#"# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/readyz",verb="GET",version=""} 7
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 1
"#;
        let c = parse(text);
        assert_eq!(c.len(), 3);
        assert_eq!(c["POST pods"], 3.0);
        assert_eq!(c["PATCH pods/status"], 2.0);
        assert_eq!(c["PATCH pods/status 409"], 1.0);
        let mut after = c.clone();
        *after.get_mut("POST pods").unwrap() += 4.0;
        let d = delta(&c, &after);
        assert_eq!(d.len(), 1);
        assert_eq!(summary(&d, 2), "2.0 (POST pods 2.0)");
        let both = merge(&c, &after);
        assert_eq!(both["POST pods"], 10.0);
        assert_eq!(both["PATCH pods/status 409"], 2.0);
        let e = errors(&both);
        assert_eq!(e.len(), 1);
        assert_eq!(e["PATCH pods/status 409"], 2.0);
    }
}
