//! After `peer out-of-band` authenticated: ask for resources (a `ResourceSlice` the sharing
//! controllers replicate to the provider) and follow the peering's modules on the provider's
//! `ForeignCluster` until each is up, printing each as it completes. What to ask for and what
//! to print are pure ([`slice`], [`Progress`]); the API calls are [`request`] and [`follow`].
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    authentication::v1alpha1::{ResourceSlice, ResourceSliceSpec},
    core::v1alpha1::{ForeignCluster, condition},
    identity::is_dns_label,
    names,
    offloading::v1alpha1::AtMostOnce,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams},
};

/// What the consumer asks the provider for, from the command line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ask {
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub pods: Option<String>,
    /// Further resources, `NAME=QUANTITY` (`nvidia.com/gpu=1`, `ephemeral-storage=10Gi`).
    pub resources: Vec<String>,
    /// At-most-once semantics for the pods offloaded there (`--at-most-once`).
    pub at_most_once: Option<AtMostOnce>,
}

impl Ask {
    /// The resources asked for, checked: known quantity syntax, resource names as Kubernetes
    /// spells them, each at most once.
    pub fn resources(&self) -> Result<BTreeMap<String, Quantity>> {
        let mut out = BTreeMap::new();
        let named = [
            ("cpu", &self.cpu),
            ("memory", &self.memory),
            ("pods", &self.pods),
        ];
        let mut items: Vec<(String, String)> = named
            .iter()
            .filter_map(|(n, v)| v.as_ref().map(|v| ((*n).to_owned(), v.clone())))
            .collect();
        for r in &self.resources {
            let Some((name, q)) = r.split_once('=') else {
                bail!("--resource {r}: give NAME=QUANTITY, e.g. nvidia.com/gpu=1");
            };
            items.push((name.trim().to_owned(), q.trim().to_owned()));
        }
        for (name, q) in items {
            if !resource_name(&name) {
                bail!(
                    "{name:?} is not a resource name (cpu, memory, pods, ephemeral-storage, nvidia.com/gpu, ...)"
                );
            }
            let milli =
                fabric_api::quantity::milli(&q).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            if milli <= 0 {
                bail!("{name}: ask for more than {q}");
            }
            if out.insert(name.clone(), Quantity(q)).is_some() {
                bail!("{name} is asked for twice");
            }
        }
        if out.is_empty() && self.at_most_once.is_some() {
            bail!(
                "--at-most-once applies to the pods offloaded to what is asked for: ask for \
                 resources too (--cpu, --memory, --pods, --resource)"
            );
        }
        Ok(out)
    }
}

/// The grace period of `--at-most-once` when only the partition time is given: Kubernetes'
/// default for a pod (a pod's own shorter one still applies; the provider may lower it).
pub const DEFAULT_AT_MOST_ONCE_GRACE_SECONDS: u32 = 30;

/// `--at-most-once PARTITION[,GRACE]`: the partition time T after which the provider stops the
/// pods, and their deletion's grace period; each in seconds (`60`) or as a duration (`2m`,
/// `90s`), in the ranges the ResourceSlice accepts (T 1 s to 1 day, grace at most 1 hour).
pub fn parse_at_most_once(s: &str) -> Result<AtMostOnce, String> {
    fn seconds(what: &str, v: &str) -> Result<u32, String> {
        let v = v.trim();
        if let Ok(n) = v.parse::<u32>() {
            return Ok(n);
        }
        let d = humantime::parse_duration(v)
            .map_err(|e| format!("{what} {v:?}: give seconds (60) or a duration (2m, 90s): {e}"))?;
        if d.subsec_nanos() != 0 {
            return Err(format!("{what} {v:?}: give whole seconds"));
        }
        u32::try_from(d.as_secs()).map_err(|_| format!("{what} {v:?} is too long"))
    }
    let (partition, grace) = match s.split_once(',') {
        Some((p, g)) => (p, Some(g)),
        None => (s, None),
    };
    let partition_seconds = seconds("the partition time", partition)?;
    if !(AtMostOnce::MIN_PARTITION_SECONDS..=AtMostOnce::MAX_PARTITION_SECONDS)
        .contains(&partition_seconds)
    {
        return Err(format!(
            "the partition time must be 1 s to 1 day, not {partition_seconds} s"
        ));
    }
    let grace_seconds = match grace {
        Some(g) => seconds("the grace period", g)?,
        None => DEFAULT_AT_MOST_ONCE_GRACE_SECONDS,
    };
    if grace_seconds > AtMostOnce::MAX_GRACE_SECONDS {
        return Err(format!(
            "the grace period must be at most 1 hour, not {grace_seconds} s"
        ));
    }
    Ok(AtMostOnce {
        partition_seconds,
        grace_seconds,
    })
}

/// `[prefix/]name`, the prefix a DNS subdomain and the name a DNS label (as `cpu`,
/// `ephemeral-storage`, `nvidia.com/gpu`).
fn resource_name(s: &str) -> bool {
    let (prefix, name) = s.rsplit_once('/').unwrap_or(("", s));
    is_dns_label(name)
        && (prefix.is_empty() || (prefix.len() <= 253 && prefix.split('.').all(is_dns_label)))
}

/// The consumer's ResourceSlice for `provider`, named after it.
pub fn slice(
    ns: &str,
    me: &str,
    provider: &str,
    resources: BTreeMap<String, Quantity>,
    at_most_once: Option<AtMostOnce>,
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(provider.to_owned()),
            namespace: Some(ns.to_owned()),
            labels: Some(BTreeMap::from([(
                names::label::REMOTE_CLUSTER.to_owned(),
                provider.to_owned(),
            )])),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            consumer_cluster_id: me.to_owned(),
            provider_cluster_id: provider.to_owned(),
            resources,
            at_most_once,
        },
        status: None,
    }
}

/// Creates (or updates) the slice; the sharing controllers take it from there.
pub async fn request(local: &Client, slice: &ResourceSlice) -> Result<()> {
    let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    Api::<ResourceSlice>::namespaced(local.clone(), ns)
        .patch(
            name,
            &PatchParams::apply(names::field_manager::PEERING).force(),
            &Patch::Apply(slice),
        )
        .await
        .with_context(|| format!("creating ResourceSlice {ns}/{name}"))?;
    Ok(())
}

/// The modules followed, in the order they usually complete, and how each is named.
pub fn modules(asked: bool) -> Vec<(&'static str, &'static str)> {
    let mut m = vec![(condition::NETWORK, "network")];
    if asked {
        m.push((condition::RESOURCES, "resources"));
        m.push((condition::VIRTUAL_NODE, "virtual node"));
    }
    m
}

/// Which modules are up, reported once each.
pub struct Progress {
    modules: Vec<(&'static str, &'static str)>,
    done: Vec<bool>,
}

impl Progress {
    pub fn new(modules: Vec<(&'static str, &'static str)>) -> Self {
        let done = vec![false; modules.len()];
        Self { modules, done }
    }

    /// Lines to print for the modules that came up since the last look at `fc`.
    pub fn observe(&mut self, fc: &ForeignCluster) -> Vec<String> {
        let conditions = fc
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let mut lines = Vec::new();
        for (i, (kind, what)) in self.modules.iter().enumerate() {
            let Some(c) = conditions.iter().find(|c| c.type_ == *kind) else {
                continue;
            };
            if c.status == "True" && !self.done[i] {
                self.done[i] = true;
                let detail = if c.message.is_empty() {
                    c.reason.clone()
                } else {
                    c.message.clone()
                };
                lines.push(format!("✓ {what}: {detail}"));
            }
        }
        lines
    }

    pub fn finished(&self) -> bool {
        self.done.iter().all(|d| *d)
    }

    /// What is still missing and why, for the timeout error.
    pub fn pending(&self, fc: Option<&ForeignCluster>) -> String {
        let conditions = fc
            .and_then(|f| f.status.as_ref())
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        self.modules
            .iter()
            .zip(&self.done)
            .filter(|(_, done)| !**done)
            .map(
                |((kind, what), _)| match conditions.iter().find(|c| c.type_ == *kind) {
                    Some(c) => format!("{what}: {} ({})", c.reason, c.message),
                    None => format!("{what}: not started"),
                },
            )
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Follows the provider's ForeignCluster until every module is up, or `timeout`.
pub async fn follow(
    local: &Client,
    provider: &str,
    mut progress: Progress,
    timeout: Duration,
) -> Result<()> {
    let api = Api::<ForeignCluster>::all(local.clone());
    let t0 = Instant::now();
    let mut last = None;
    loop {
        let fc = api
            .get_opt(provider)
            .await
            .with_context(|| format!("reading ForeignCluster {provider}"))?;
        if let Some(fc) = &fc {
            for line in progress.observe(fc) {
                println!("{line}");
            }
        }
        if progress.finished() {
            return Ok(());
        }
        last = fc.or(last);
        if t0.elapsed() >= timeout {
            bail!(
                "not all of the peering came up within {}s: {}. The controllers keep trying; \
                 `fabricctl info peer {provider}` shows each module and why it waits",
                timeout.as_secs(),
                progress.pending(last.as_ref())
            );
        }
        // A local GET: cheap, and each module's line shows up soon after it is up.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use fabric_api::core::v1alpha1::{ForeignClusterSpec, ForeignClusterStatus};

    use super::*;

    fn ask(cpu: &str, resources: &[&str]) -> Ask {
        Ask {
            cpu: Some(cpu.into()),
            memory: Some("4Gi".into()),
            pods: None,
            resources: resources.iter().map(|s| (*s).to_owned()).collect(),
            at_most_once: None,
        }
    }

    #[test]
    fn what_is_asked_is_checked() {
        let r = ask("2", &["nvidia.com/gpu=1", "ephemeral-storage=10Gi"])
            .resources()
            .unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(r["nvidia.com/gpu"].0, "1");
        for (bad, why) in [
            (ask("two", &[]), "not a quantity"),
            (ask("0", &[]), "ask for more than"),
            (ask("1", &["gpu"]), "NAME=QUANTITY"),
            (ask("1", &["Nvidia.com/GPU=1"]), "not a resource name"),
            (ask("1", &["cpu=2"]), "asked for twice"),
        ] {
            let e = bad.resources().unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(Ask::default().resources().unwrap().is_empty());
        let s = slice("fabric-system", "a", "b", r, None);
        assert_eq!(
            s.metadata.labels.unwrap()[names::label::REMOTE_CLUSTER],
            "b"
        );
        assert_eq!(s.spec.provider_cluster_id, "b");
        assert_eq!(s.spec.at_most_once, None);
    }

    #[test]
    fn at_most_once_goes_into_the_slice() {
        let t = |p, g| AtMostOnce {
            partition_seconds: p,
            grace_seconds: g,
        };
        for (arg, want) in [
            ("60,10", t(60, 10)),
            ("60", t(60, DEFAULT_AT_MOST_ONCE_GRACE_SECONDS)),
            ("2m,0", t(120, 0)),
            ("90s, 15s", t(90, 15)),
            ("1d,1h", t(86_400, 3600)),
        ] {
            assert_eq!(parse_at_most_once(arg), Ok(want), "{arg}");
        }
        for (bad, why) in [
            ("0", "1 s to 1 day"),
            ("2d", "1 s to 1 day"),
            ("60,2h", "at most 1 hour"),
            ("soon", "give seconds"),
            ("60,", "the grace period"),
            ("1500ms", "whole seconds"),
            ("-5", "give seconds"),
        ] {
            let e = parse_at_most_once(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let mut a = ask("1", &[]);
        a.at_most_once = Some(parse_at_most_once("60,10").unwrap());
        let spec = slice(
            "fabric-system",
            "a",
            "b",
            a.resources().unwrap(),
            a.at_most_once,
        )
        .spec;
        assert_eq!(spec.at_most_once, Some(t(60, 10)));
        // Without resources there is no slice to carry it.
        let a = Ask {
            at_most_once: Some(t(60, 10)),
            ..Ask::default()
        };
        let e = a.resources().unwrap_err().to_string();
        assert!(e.contains("ask for resources too"), "{e}");
    }

    fn fc(conditions: &[(&str, &str, &str, &str)]) -> ForeignCluster {
        ForeignCluster {
            metadata: ObjectMeta::default(),
            spec: ForeignClusterSpec {
                cluster_id: "b".into(),
                discovered_by: Default::default(),
                role: Default::default(),
                auth_url: None,
            },
            status: Some(ForeignClusterStatus {
                conditions: conditions
                    .iter()
                    .map(|(t, s, r, m)| {
                        let mut c = fabric_kube::status::condition(
                            t,
                            *s == "True",
                            r,
                            (*m).into(),
                            None,
                            Default::default(),
                        );
                        c.status = (*s).into();
                        c
                    })
                    .collect(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn each_module_is_reported_once_and_what_waits_says_why() {
        let mut p = Progress::new(modules(true));
        assert!(p.observe(&fc(&[])).is_empty());
        let lines = p.observe(&fc(&[(
            condition::NETWORK,
            "True",
            "Connected",
            "tunnel up, 0.4ms",
        )]));
        assert_eq!(lines, ["✓ network: tunnel up, 0.4ms"]);
        let now = fc(&[
            (condition::NETWORK, "True", "Connected", "tunnel up, 0.4ms"),
            (condition::RESOURCES, "False", "Refused", "tenant drained"),
        ]);
        assert!(p.observe(&now).is_empty(), "reported once");
        assert!(!p.finished());
        let pending = p.pending(Some(&now));
        assert!(
            pending.contains("resources: Refused (tenant drained)"),
            "{pending}"
        );
        assert!(pending.contains("virtual node: not started"), "{pending}");
        p.observe(&fc(&[
            (condition::RESOURCES, "True", "Granted", ""),
            (condition::VIRTUAL_NODE, "True", "Ready", ""),
        ]));
        assert!(p.finished());
        assert_eq!(
            modules(false).len(),
            1,
            "without a request only the network is followed"
        );
    }
}
