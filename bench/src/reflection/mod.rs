//! `fabric-bench reflection`: how long an EndpointSlice change at home takes to be visible,
//! translated, on the provider, and what the reflectors weigh with 10,000 reflected objects.
//!
//! On the offload bench's two clusters ([`crate::offload`]: two test API servers with
//! RBAC, the consumer's virtual kubelet and the provider's `fabric-controller sharing` each
//! with its deployed rights), a namespace is offloaded to the provider: its
//! NamespaceOffloading at home, the NamespaceMap written with the consumer's own identity, the
//! twin made by the provider, the consumer's network configured there (pod CIDR seen remapped).
//!
//! Latency: Services with one EndpointSlice each at home, written as Kubernetes' endpoint
//! controller would (its managed-by, addresses in the consumer's pod CIDR); then changes
//! (add an endpoint, flip the readiness of one, remove one: [`changes`]) at a steady rate,
//! round-robin over the slices. Each is timed from its write at home until a watch on the
//! provider shows its slice's real EndpointSlice (`<name>-fabric`, written by the provider from
//! the virtual kubelet's ShadowEndpointSlice) with exactly the endpoint set the change made,
//! translated: the state itself is the marker, each being one the slice never had before.
//!
//! Memory: more Services and slices, and ConfigMaps referenced by two pods bound to the
//! virtual node, until the virtual kubelet reflects the asked number of objects into the twin
//! (Services, ShadowEndpointSlices, ConfigMaps); timed until all are on the provider (and the
//! slices translated), then, settled, the resident memory of the virtual kubelet and of the
//! provider's `sharing`. Nothing is asserted about time or size: figures are printed beside
//! their targets, with the API requests each server served.
use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    names::endpoint_slice::{CONTROLLER, MANAGED_BY, REFLECTED, SERVICE_NAME},
    offloading::{
        namespaces::twin_name,
        v1alpha1::{NamespaceOffloadingSpec, ShadowEndpointSlice},
    },
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Pod, Service},
    discovery::v1::EndpointSlice,
    events::v1::Event,
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub mod changes;

use changes::{Change, Endpoint, Kind, Tracker};

use crate::offload::{Stack, start, watch::first_seen};
use fabric_tests::{
    check_interrupt,
    figures::{cpu_secs, mib, percentile, rss_kib, secs},
    offload_fixture::{self as fixture, CONSUMER, CONSUMER_CIDRS, CONSUMER_SEEN, NODE, NS},
    wait::until_done,
};

/// The offloaded namespace.
const HOME_NS: &str = "store";
/// API calls the bench itself makes at once (creating objects).
const CONCURRENCY: usize = 32;
/// Endpoints each slice starts with.
const INITIAL: usize = 2;
/// The target the latency is printed against.
const P99_TARGET: Duration = Duration::from_secs(1);
/// The target the reflectors' memory is printed against, MiB.
const MEMORY_TARGET_MIB: f64 = 200.0;
/// Pods bound to the virtual node that reference the ConfigMaps (between them).
const REFERRING_PODS: usize = 2;

#[derive(Debug, Clone)]
pub struct Options {
    /// Services (one slice each) the changes go round.
    pub services: usize,
    /// Changes made.
    pub changes: usize,
    /// Changes written per second.
    pub rate: f64,
    /// Objects the virtual kubelet reflects into the twin when weighed.
    pub objects: usize,
    /// Of those, ConfigMaps (referenced by pods on the virtual node).
    pub config_maps: usize,
    /// How long the changes, or the objects, may take to arrive before the bench gives up.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            services: 50,
            changes: 1000,
            rate: 20.0,
            objects: 10_000,
            config_maps: 1000,
            timeout: Duration::from_secs(600),
        }
    }
}

impl Options {
    /// A small run: a tenth of everything.
    pub fn quick() -> Self {
        Self {
            services: 10,
            changes: 100,
            objects: 1000,
            config_maps: 100,
            ..Self::default()
        }
    }
}

fn service_name(i: usize) -> String {
    format!("s{i:05}")
}

/// The Service index of a slice by its Service label.
fn index_of(slice: &EndpointSlice) -> Option<usize> {
    slice
        .labels()
        .get(SERVICE_NAME)?
        .strip_prefix('s')?
        .parse()
        .ok()
}

fn twin() -> String {
    twin_name(&NamespaceOffloadingSpec::default(), HOME_NS, CONSUMER)
        .expect("DefaultName always names the twin")
}

fn net(cidr: &str) -> Result<(Ipv4Addr, u8)> {
    let (a, p) = cidr.split_once('/').context("a CIDR")?;
    Ok((a.parse()?, p.parse()?))
}

fn endpoints_json(endpoints: &[Endpoint]) -> Value {
    endpoints
        .iter()
        .map(|e| {
            json!({"addresses": [e.address.to_string()], "nodeName": "home-1",
                   "conditions": {"ready": e.ready, "serving": e.ready, "terminating": false}})
        })
        .collect()
}

/// Service `i` and its slice as the home cluster's endpoint controller writes it.
fn service(i: usize) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": service_name(i), "namespace": HOME_NS},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))?)
}

fn slice(i: usize, endpoints: &[Endpoint]) -> Result<EndpointSlice> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("{}-bench", service_name(i)), "namespace": HOME_NS,
                     "labels": {SERVICE_NAME: service_name(i), MANAGED_BY: CONTROLLER}},
        "addressType": "IPv4",
        "endpoints": endpoints_json(endpoints),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))?)
}

/// The endpoints of a real slice on the provider (an unset `ready` is ready, as upstream).
fn shown(s: &EndpointSlice) -> Vec<Endpoint> {
    s.endpoints
        .iter()
        .flatten()
        .filter_map(|e| {
            Some(Endpoint {
                address: e.addresses.first()?.parse().ok()?,
                ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
            })
        })
        .collect()
}

/// Creates `objects` at once, `CONCURRENCY` at a time.
async fn create_all<K>(api: &Api<K>, objects: Vec<K>) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    futures::stream::iter(objects)
        .map(|o| {
            let api = api.clone();
            async move {
                let name = o.name_any();
                api.create(&PostParams::default(), &o)
                    .await
                    .with_context(|| format!("creating {name}"))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// What the changes measured.
struct Latency {
    /// Per change, from its write at home until seen translated on the provider, sorted.
    all: Vec<Duration>,
    /// The same per kind of change.
    by_kind: Vec<(Kind, Vec<Duration>)>,
    /// Changes never seen on the provider.
    missing: usize,
    /// From the first write to the last.
    writing: Duration,
    cpu: Vec<(&'static str, f64)>,
}

fn spread(d: &[Duration]) -> String {
    if d.is_empty() {
        return "none".into();
    }
    format!(
        "p50 {}, p90 {}, p99 {}, max {}",
        secs(percentile(d, 0.5)),
        secs(percentile(d, 0.9)),
        secs(percentile(d, 0.99)),
        secs(percentile(d, 1.0))
    )
}

/// Offloads [`HOME_NS`] to the provider: its twin made there, the consumer's network
/// configured there.
async fn offload(stack: &Stack) -> Result<()> {
    fixture::provider_network(&stack.provider, "Connected")?;
    let namespaces: Api<Namespace> = Api::all(stack.c.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": HOME_NS}}))?,
        )
        .await?;
    fixture::apply(
        &stack.consumer,
        &json!({"apiVersion": "offloading.fabric.io/v1alpha1", "kind": "NamespaceOffloading",
                "metadata": {"name": "offloading", "namespace": HOME_NS}, "spec": {}}),
    )?;
    let twin = twin();
    fixture::namespace_map(&stack.creds, &[(HOME_NS, &twin)]).await?;
    let remote: Api<Namespace> = Api::all(stack.p.clone());
    until_done(
        "the twin made by the provider",
        Duration::from_secs(60),
        || async { Ok(remote.get_opt(&twin).await?.is_some()) },
    )
    .await
}

/// The changes, written at `opts.rate` after the slices they change were seen on the
/// provider in their start state.
async fn latency(stack: &Stack, opts: &Options) -> Result<Latency> {
    let (pod_cidr, pod_prefix) = net(CONSUMER_CIDRS.0)?;
    let (seen_cidr, prefix) = net(CONSUMER_SEEN.0)?;
    let (start, script) =
        changes::script(pod_cidr, pod_prefix, opts.services, INITIAL, opts.changes);
    let tracker = Tracker::new(&start, &script, |e| {
        changes::seen(e, pod_cidr, seen_cidr, prefix)
    });

    // Watching the provider's real slices before anything is written.
    struct Seen {
        tracker: Tracker,
        started: HashSet<usize>,
        arrived: HashMap<usize, Instant>,
    }
    let seen = Arc::new(Mutex::new(Seen {
        tracker,
        started: HashSet::new(),
        arrived: HashMap::new(),
    }));
    let real: Api<EndpointSlice> = Api::namespaced(stack.p.clone(), &twin());
    let watch = {
        let (seen, n) = (seen.clone(), opts.services);
        let cfg = watcher::Config::default().labels(&format!("{MANAGED_BY}={REFLECTED}"));
        tokio::spawn(async move {
            let mut s = std::pin::pin!(watcher(real, cfg).default_backoff().applied_objects());
            while let Some(ev) = s.next().await {
                let at = Instant::now();
                let Ok(slice) = ev else { continue };
                let Some(i) = index_of(&slice).filter(|i| *i < n) else {
                    continue;
                };
                let endpoints = shown(&slice);
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                if seen.tracker.started(i, &endpoints) {
                    seen.started.insert(i);
                }
                for c in seen.tracker.observe(i, &endpoints) {
                    seen.arrived.entry(c).or_insert(at);
                }
            }
        })
    };
    let result = async {
        let services: Api<Service> = Api::namespaced(stack.c.clone(), HOME_NS);
        let slices: Api<EndpointSlice> = Api::namespaced(stack.c.clone(), HOME_NS);
        create_all(
            &services,
            (0..opts.services).map(service).collect::<Result<_>>()?,
        )
        .await?;
        let start_slices = start
            .iter()
            .enumerate()
            .map(|(i, e)| slice(i, e))
            .collect::<Result<_>>()?;
        create_all(&slices, start_slices).await?;
        until_done(
            &format!("the {} slices translated on the provider", opts.services),
            opts.timeout,
            || async {
                Ok(seen.lock().unwrap_or_else(|e| e.into_inner()).started.len() >= opts.services)
            },
        )
        .await?;

        let components = stack.components();
        let cpu0: Vec<f64> = components.iter().map(|(_, p)| cpu_secs(p)).collect();
        let requests0 = stack.requests()?;
        // One writer per slice at a time, so that a slice's changes land in their order.
        let locks: Vec<Arc<tokio::sync::Mutex<()>>> =
            (0..opts.services).map(|_| Arc::default()).collect();
        let written: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / opts.rate));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let t0 = Instant::now();
        let mut writes = Vec::with_capacity(script.len());
        for (
            c,
            Change {
                slice: i,
                endpoints,
                ..
            },
        ) in script.iter().enumerate()
        {
            tick.tick().await;
            check_interrupt()?;
            let (lock, written, slices) = (locks[*i].clone(), written.clone(), slices.clone());
            let patch = json!({ "endpoints": endpoints_json(endpoints) });
            let name = format!("{}-bench", service_name(*i));
            writes.push(tokio::spawn(async move {
                let _one = lock.lock().await;
                written
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(c, Instant::now());
                slices
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("change {c} of {name}"))
            }));
        }
        for w in writes {
            w.await??;
        }
        let writing = t0.elapsed();
        let arrived = until_done(
            &format!("{} changes seen on the provider", script.len()),
            opts.timeout,
            || async {
                let n = seen.lock().unwrap_or_else(|e| e.into_inner()).arrived.len();
                Ok(n >= script.len())
            },
        )
        .await;
        if let Err(e) = arrived {
            println!("  not all changes arrived: {e:#}");
        }
        let cpu = components
            .iter()
            .zip(cpu0)
            .map(|((label, pids), before)| (*label, cpu_secs(pids) - before))
            .collect();
        stack.print_requests(&requests0, script.len(), "change")?;
        let written = written.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let arrived = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .arrived
            .clone();
        let mut all = Vec::new();
        let mut by_kind: Vec<(Kind, Vec<Duration>)> = [Kind::Add, Kind::Flip, Kind::Remove]
            .map(|k| (k, Vec::new()))
            .into();
        for (c, at) in &arrived {
            let d = at.saturating_duration_since(written[c]);
            all.push(d);
            if let Some((_, v)) = by_kind.iter_mut().find(|(k, _)| *k == script[*c].kind) {
                v.push(d);
            }
        }
        all.sort();
        for (_, v) in &mut by_kind {
            v.sort();
        }
        anyhow::Ok(Latency {
            missing: script.len() - arrived.len(),
            all,
            by_kind,
            writing,
            cpu,
        })
    }
    .await;
    watch.abort();
    result
}

/// What weighing the reflectors measured.
struct Weight {
    /// Objects the virtual kubelet reflected into the twin, by kind.
    reflected: Vec<(&'static str, usize)>,
    /// From the first creation at home until each kind was all on the provider.
    all_after: Vec<(&'static str, Duration)>,
    /// From the first creation at home to the last.
    writing: Duration,
    /// Resident memory, KiB, settled.
    rss: Vec<(&'static str, Option<u64>)>,
}

/// Watches `api` on the provider, keyed by name when `keep` says so.
async fn count<K>(
    api: Api<K>,
    keep: impl Fn(&K) -> bool + Send + 'static,
) -> crate::offload::watch::Seen
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    first_seen(api, move |o: &K| keep(o).then(|| o.name_any())).await
}

async fn weigh(stack: &Stack, opts: &Options) -> Result<Weight> {
    let config_maps = opts.config_maps.min(opts.objects);
    let services = (opts.objects - config_maps) / 2;
    let twin = twin();
    let p = &stack.p;
    let is_ours = |name: &str| name.starts_with('s') && name[1..].starts_with(char::is_numeric);
    let watches = [
        (
            "Services",
            services,
            count(Api::<Service>::namespaced(p.clone(), &twin), move |s| {
                is_ours(&s.name_any())
            })
            .await,
        ),
        (
            "ShadowEndpointSlices",
            services,
            count(
                Api::<ShadowEndpointSlice>::namespaced(p.clone(), &twin),
                |_| true,
            )
            .await,
        ),
        (
            "ConfigMaps",
            config_maps,
            count(Api::<ConfigMap>::namespaced(p.clone(), &twin), |c| {
                c.name_any().starts_with("cm-")
            })
            .await,
        ),
        (
            "EndpointSlices translated (by the provider)",
            services,
            count(Api::<EndpointSlice>::namespaced(p.clone(), &twin), |s| {
                s.labels().get(MANAGED_BY).map(String::as_str) == Some(REFLECTED)
            })
            .await,
        ),
    ];
    let (pod_cidr, prefix) = net(CONSUMER_CIDRS.0)?;
    // More of the latency's Services and slices (theirs counted), each slice its start state.
    let (start, _) = changes::script(pod_cidr, prefix, services, INITIAL, 0);
    let c = &stack.c;
    let t0 = Instant::now();
    let cms: Vec<ConfigMap> = (0..config_maps)
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("cm-{i:05}"), "namespace": HOME_NS},
                "data": {"key": format!("value {i}")},
            }))
        })
        .collect::<Result<_, _>>()?;
    create_all(&Api::namespaced(c.clone(), HOME_NS), cms).await?;
    let pods: Vec<Pod> = (0..REFERRING_PODS)
        .map(|k| {
            let env_from: Vec<Value> = (0..config_maps)
                .filter(|i| i % REFERRING_PODS == k)
                .map(|i| json!({"configMapRef": {"name": format!("cm-{i:05}")}}))
                .collect();
            serde_json::from_value(json!({
                "metadata": {"name": format!("refers-{k}"), "namespace": HOME_NS},
                "spec": {
                    "nodeName": NODE,
                    "tolerations": [{"key": fabric_api::names::taint::VIRTUAL_NODE, "operator": "Exists"}],
                    "containers": [{"name": "main", "image": "echo", "envFrom": env_from,
                                    "command": ["fabric-test-pod", "echo", "--port", "8080"]}],
                },
            }))
        })
        .collect::<Result<_, _>>()?;
    create_all(&Api::namespaced(c.clone(), HOME_NS), pods).await?;
    let more = opts.services..services;
    create_all(
        &Api::namespaced(c.clone(), HOME_NS),
        more.clone().map(service).collect::<Result<_>>()?,
    )
    .await?;
    create_all(
        &Api::namespaced(c.clone(), HOME_NS),
        more.map(|i| slice(i, &start[i])).collect::<Result<_>>()?,
    )
    .await?;
    let writing = t0.elapsed();
    let r = until_done(
        &format!("{} objects reflected", opts.objects),
        opts.timeout,
        || async {
            Ok(watches.iter().all(|(_, n, (seen, _))| {
                seen.lock().unwrap_or_else(|e| e.into_inner()).len() >= *n
            }))
        },
    )
    .await;
    let mut reflected = Vec::new();
    let mut all_after = Vec::new();
    for (label, _, (seen, task)) in &watches {
        task.abort();
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        reflected.push((*label, seen.len()));
        let last = seen.values().max().copied().unwrap_or(t0);
        all_after.push((*label, last.saturating_duration_since(t0)));
    }
    r.with_context(|| format!("reflected so far: {reflected:?}\n{}", stack.logs()))?;
    // Settled: what the reflectors hold, not what they allocated on the way.
    println!("          (settling 20 s before weighing)");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let vk = stack
        .deployments
        .pid(NS, &crate::offload::vk_name())
        .and_then(rss_kib);
    let sharing = rss_kib(stack.children[0].0.id());
    Ok(Weight {
        reflected,
        all_after,
        writing,
        rss: vec![
            ("virtual kubelet (consumer)", vk),
            ("sharing (provider)", sharing),
        ],
    })
}

/// The Events `events` grouped by who said what about which kind, most first: an Event series
/// counts as many as it folds.
fn events_by_reason(events: &[Event]) -> String {
    let mut counts: HashMap<String, i64> = HashMap::new();
    for e in events {
        let key = format!(
            "{} {} {} {}",
            e.reporting_controller.as_deref().unwrap_or("-"),
            e.type_.as_deref().unwrap_or("-"),
            e.reason.as_deref().unwrap_or("-"),
            e.regarding
                .as_ref()
                .and_then(|r| r.kind.as_deref())
                .unwrap_or("-"),
        );
        *counts.entry(key).or_default() += e.series.as_ref().map_or(1, |s| i64::from(s.count));
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if counts.is_empty() {
        return "none".to_owned();
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "MISSED" }
}

pub fn run(opts: &Options) -> Result<()> {
    if opts.services == 0 || opts.changes == 0 || opts.rate <= 0.0 {
        bail!("the bench wants services, changes and a rate above 0");
    }
    if opts.objects < opts.config_maps + 2 * opts.services {
        bail!(
            "{} objects cannot hold {} ConfigMaps and the {} Services with their slices",
            opts.objects,
            opts.config_maps,
            opts.services
        );
    }
    let rt = tokio::runtime::Runtime::new()?;
    let profile = fabric_tests::figures::profile();
    println!(
        "reflection: EndpointSlice changes at home until translated on the provider, and the \
         reflectors' memory (binaries: {profile} build)"
    );
    let t0 = Instant::now();
    let stack = start(&rt, "bench-reflection", false, 1000)?;
    stack.wait_ready(&rt)?;
    rt.block_on(offload(&stack)).with_context(|| stack.logs())?;
    println!(
        "  stack up, namespace {HOME_NS} offloaded to twin {} in {}",
        twin(),
        secs(t0.elapsed())
    );

    let l = rt
        .block_on(latency(&stack, opts))
        .with_context(|| stack.logs())?;
    println!(
        "  {} changes over {} slices at {:.1}/s (written in {}), write at home to translated \
         on the provider:",
        opts.changes,
        opts.services,
        opts.rate,
        secs(l.writing)
    );
    for (kind, d) in &l.by_kind {
        println!("          {:<8} {}", format!("{kind:?}"), spread(d));
    }
    let cpu: Vec<String> = l.cpu.iter().map(|(c, s)| format!("{c} {s:.1}")).collect();
    println!("          CPU seconds meanwhile: {}", cpu.join(", "));
    let p99 = (!l.all.is_empty()).then(|| percentile(&l.all, 0.99));
    let missing = if l.missing > 0 {
        format!(", {} never seen", l.missing)
    } else {
        String::new()
    };
    println!(
        "  all      {}{missing} (target p99 < {}: {})",
        spread(&l.all),
        secs(P99_TARGET),
        verdict(l.missing == 0 && p99.is_some_and(|p| p < P99_TARGET))
    );

    check_interrupt()?;
    let requests0 = stack.requests()?;
    let w = rt.block_on(weigh(&stack, opts))?;
    println!(
        "  {} objects reflected into the twin (written at home in {}):",
        opts.objects,
        secs(w.writing)
    );
    for ((label, n), (_, after)) in w.reflected.iter().zip(&w.all_after) {
        println!(
            "          {n:>6} {label}, all on the provider after {}",
            secs(*after)
        );
    }
    stack.print_requests(&requests0, opts.objects, "reflected object")?;
    let events = rt.block_on(Api::<Event>::all(stack.p.clone()).list(&Default::default()))?;
    println!(
        "          Events on the provider (reporting controller, type, reason, kind: count): {}",
        events_by_reason(&events.items)
    );
    for (label, kib) in &w.rss {
        match kib {
            Some(k) => println!(
                "  RSS {label}: {} (target < {MEMORY_TARGET_MIB:.0} MiB: {})",
                mib(*k),
                verdict((*k as f64 / 1024.0) < MEMORY_TARGET_MIB)
            ),
            None => println!("  RSS {label}: not found"),
        }
    }
    println!("  (logs in {})", stack.dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(controller: &str, reason: &str, kind: &str, series: Option<i32>) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": "e", "namespace": "n"},
            "eventTime": "2026-11-29T00:00:00.000000Z",
            "reportingController": controller,
            "type": "Warning",
            "reason": reason,
            "regarding": {"kind": kind, "name": "x"},
            "series": series.map(|c| json!({"count": c, "lastObservedTime": "2026-11-29T00:00:00.000000Z"})),
        }))
        .unwrap()
    }

    #[test]
    fn events_are_counted_by_who_said_what_about_which_kind_series_folded() {
        let events = [
            event("sharing", "ConsumerSilent", "ShadowEndpointSlice", None),
            event("sharing", "ConsumerSilent", "ShadowEndpointSlice", Some(3)),
            event("sharing", "ConsumerSilent", "Tenant", None),
        ];
        assert_eq!(
            events_by_reason(&events),
            "sharing Warning ConsumerSilent ShadowEndpointSlice: 4, \
             sharing Warning ConsumerSilent Tenant: 1"
        );
        assert_eq!(events_by_reason(&[]), "none");
    }
}
