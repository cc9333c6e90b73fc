//! Unicast DNS-SD: the clusters published under a domain (`hickory-resolver` does the DNS).
//!
//! A domain's clusters are the PTR records of `_fabric-peering._tcp.<domain>`, each naming an
//! instance `<cluster id>._fabric-peering._tcp.<domain>` with an SRV record (where its
//! authentication service listens) and a TXT record (the [`Announcement`]). A [`DnsBrowser`]
//! resolves them all every interval and yields the [`Change`]s, through the configured
//! nameserver or the system's. An instance without SRV is not published; a TXT record that
//! is not a valid announcement is logged (once) and never yielded. A resolution that fails
//! (the nameserver unreachable, a timeout) changes nothing: clusters expire only when the
//! domain stops publishing them.
use std::{net::SocketAddr, time::Duration};

use hickory_resolver::{
    TokioResolver,
    config::{NameServerConfig, ResolverConfig},
    net::{NetError, runtime::TokioRuntimeProvider},
    proto::rr::{Name, RData, RecordType},
};

use crate::{
    announcement::{Announcement, ClusterId, SERVICE},
    tracker::{Change, Tracker, instance_of},
};

/// The most instances one resolution looks at: a domain publishing more is cut short.
pub const MAX_INSTANCES: usize = 256;
/// How often a [`DnsBrowser`] resolves its domain by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("{domain:?} is not a domain name")]
    BadDomain { domain: String },
    #[error("reading the system's DNS configuration: {0}")]
    SystemConfig(#[source] NetError),
    #[error("looking up {record_type} {name}: {source}")]
    Lookup {
        name: String,
        record_type: RecordType,
        #[source]
        source: NetError,
    },
}

/// Where a [`DnsBrowser`] looks.
#[derive(Clone, Debug)]
pub struct DnsConfig {
    /// The search domain: clusters are published under `_fabric-peering._tcp.<domain>`.
    pub domain: String,
    /// The nameserver to ask (UDP, then TCP); the system's (`/etc/resolv.conf`) when `None`.
    pub nameserver: Option<SocketAddr>,
    /// How often the domain is resolved again.
    pub interval: Duration,
}

/// One resolution of a domain: each instance's name and TXT strings.
pub type Published = Vec<(String, Vec<Vec<u8>>)>;

/// The clusters published under a domain, as a stream of changes.
pub struct DnsBrowser {
    resolver: TokioResolver,
    domain: Name,
    interval: Duration,
    tracker: Tracker,
    /// Changes of the last resolution not yielded yet, last first.
    pending: Vec<Change>,
    resolved_once: bool,
}

impl DnsBrowser {
    /// A browser of `config.domain`; `own` (this cluster) is left out.
    pub fn new(config: &DnsConfig, own: Option<ClusterId>) -> Result<Self, DnsError> {
        let bad = || DnsError::BadDomain {
            domain: config.domain.clone(),
        };
        let mut domain = Name::from_ascii(&config.domain).map_err(|_| bad())?;
        domain.set_fqdn(true);
        if domain.is_root() {
            return Err(bad());
        }
        let provider = TokioRuntimeProvider::default();
        let mut builder = match config.nameserver {
            Some(addr) => {
                let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                for c in &mut ns.connections {
                    c.port = addr.port();
                }
                TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![ns]),
                    provider,
                )
            }
            None => TokioResolver::builder(provider).map_err(DnsError::SystemConfig)?,
        };
        let opts = builder.options_mut();
        opts.timeout = Duration::from_secs(2);
        opts.attempts = 2;
        // Every resolution asks again: a changed or withdrawn record shows at the next one.
        opts.cache_size = 0;
        let resolver = builder.build().map_err(DnsError::SystemConfig)?;
        Ok(Self {
            resolver,
            domain,
            interval: config.interval,
            tracker: Tracker::new(own),
            pending: Vec::new(),
            resolved_once: false,
        })
    }

    /// The next change: resolves the domain every interval until something changes. Failed
    /// resolutions are logged and change nothing.
    pub async fn next(&mut self) -> Change {
        loop {
            if let Some(c) = self.pending.pop() {
                return c;
            }
            if self.resolved_once {
                tokio::time::sleep(self.interval).await;
            }
            self.resolved_once = true;
            match self.poll().await {
                Ok(mut changes) => {
                    changes.reverse();
                    self.pending = changes;
                }
                Err(e) => tracing::warn!(domain = %self.domain, "DNS-SD resolution failed: {e}"),
            }
        }
    }

    /// Resolves the domain once and returns what changed since the last resolution.
    pub async fn poll(&mut self) -> Result<Vec<Change>, DnsError> {
        let published = self.resolve().await?;
        let events = self.tracker.snapshot(&published);
        Ok(crate::changes_logged(events, "DNS"))
    }

    /// The clusters currently published (as far as the last resolution said).
    pub fn announced(&self) -> impl Iterator<Item = &Announcement> {
        self.tracker.announced()
    }

    /// The instances published under the domain now, with their TXT strings.
    pub async fn resolve(&self) -> Result<Published, DnsError> {
        let service = Name::from_ascii(SERVICE)
            .and_then(|s| s.append_domain(&self.domain))
            .map_err(|_| DnsError::BadDomain {
                domain: self.domain.to_ascii(),
            })?;
        let domain = self.domain.to_ascii();
        let mut published = Published::new();
        let ptrs = self.lookup(&service, RecordType::PTR).await?;
        for rdata in ptrs.into_iter().take(MAX_INSTANCES) {
            let RData::PTR(target) = rdata else { continue };
            let target = target.0;
            let fullname = target.to_ascii();
            let Some(instance) = instance_of(&fullname, &domain) else {
                tracing::debug!(%fullname, "PTR outside {service}: ignored");
                continue;
            };
            if published.iter().any(|(i, _)| i == instance) {
                continue;
            }
            let srv = self.lookup(&target, RecordType::SRV).await?;
            if !srv.iter().any(|r| matches!(r, RData::SRV(_))) {
                tracing::debug!(%fullname, "no SRV record: not published");
                continue;
            }
            let txt = self
                .lookup(&target, RecordType::TXT)
                .await?
                .into_iter()
                .filter_map(|r| match r {
                    RData::TXT(t) => Some(t.txt_data.into_vec()),
                    _ => None,
                })
                .flatten()
                .map(Vec::from)
                .collect();
            published.push((instance.to_owned(), txt));
        }
        Ok(published)
    }

    /// The records of `name`, none when it has none (NXDOMAIN or an empty answer).
    async fn lookup(&self, name: &Name, record_type: RecordType) -> Result<Vec<RData>, DnsError> {
        match self.resolver.lookup(name.clone(), record_type).await {
            Ok(lookup) => Ok(lookup
                .answers()
                .iter()
                .filter(|r| &r.name == name)
                .map(|r| r.data.clone())
                .collect()),
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => Ok(Vec::new()),
            Err(source) => Err(DnsError::Lookup {
                name: name.to_ascii(),
                record_type,
                source,
            }),
        }
    }
}
