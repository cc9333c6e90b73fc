//! The LAN: announcing a cluster and browsing for others with mDNS / DNS-SD (the `mdns-sd`
//! crate does the packets), as service `_fabric-peering._tcp.local.`.
//!
//! A [`Lan`] is one mDNS responder and querier (a thread of `mdns-sd`, with its sockets in the
//! network namespace of the thread that made it). [`Lan::announce`] publishes this cluster's
//! [`Announcement`] (again with new contents when it changes), [`Lan::withdraw`] says goodbye;
//! [`Lan::browse`] returns a [`LanBrowser`] whose [`LanBrowser::next`] yields the [`Change`]s
//! in the set of announced clusters, without this cluster's own. Records that are not valid
//! announcements are logged (once) and never yielded.
use std::time::Duration;

use mdns_sd::{ServiceDaemon, ServiceEvent, ServiceInfo};

use crate::{
    announcement::{Announcement, ClusterId, SERVICE},
    tracker::{Change, Tracker, instance_of},
};

/// The mDNS domain.
pub const DOMAIN: &str = "local.";

/// How long [`Lan::withdraw`] waits for the goodbye to be sent.
const GOODBYE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum LanError {
    #[error("starting the mDNS responder: {0}")]
    Start(#[source] mdns_sd::Error),
    #[error("announcing {cluster_id} over mDNS: {source}")]
    Announce {
        cluster_id: ClusterId,
        #[source]
        source: mdns_sd::Error,
    },
    #[error("withdrawing the announcement of {cluster_id}: {source}")]
    Withdraw {
        cluster_id: ClusterId,
        #[source]
        source: mdns_sd::Error,
    },
    #[error("browsing for {SERVICE}.{DOMAIN}: {0}")]
    Browse(#[source] mdns_sd::Error),
}

/// The service type with its domain, as mDNS names it.
fn service_type() -> String {
    format!("{SERVICE}.{DOMAIN}")
}

/// One mDNS responder and querier. Dropping it stops it (without goodbyes: see
/// [`Lan::withdraw`]).
pub struct Lan {
    daemon: ServiceDaemon,
}

impl Lan {
    /// Starts the responder on every multicast-capable interface of the calling thread's
    /// network namespace (IPv4 and IPv6).
    pub fn new() -> Result<Self, LanError> {
        let daemon = ServiceDaemon::new().map_err(LanError::Start)?;
        Ok(Self { daemon })
    }

    /// Announces `a` (replacing an earlier announcement of the same cluster): instance
    /// `<cluster id>`, host `<cluster id>.local.` on this host's addresses, port the
    /// authentication service's.
    pub fn announce(&self, a: &Announcement) -> Result<(), LanError> {
        let id = a.cluster_id.as_str();
        let (_, port) = a.auth_url.host_port();
        let txt = a.to_txt();
        let err = |source| LanError::Announce {
            cluster_id: a.cluster_id.clone(),
            source,
        };
        let info = ServiceInfo::new(
            &service_type(),
            id,
            &format!("{id}.{DOMAIN}"),
            "",
            port,
            txt.as_slice(),
        )
        .map_err(err)?
        .enable_addr_auto();
        self.daemon.register(info).map_err(err)
    }

    /// Withdraws the announcement of `cluster_id` (a goodbye: browsers forget it at once).
    pub async fn withdraw(&self, cluster_id: &ClusterId) -> Result<(), LanError> {
        let fullname = format!("{cluster_id}.{}", service_type());
        let err = |source| LanError::Withdraw {
            cluster_id: cluster_id.clone(),
            source,
        };
        let done = self.daemon.unregister(&fullname).map_err(err)?;
        // The status says whether it was registered; either way nothing is announced now.
        let _ = tokio::time::timeout(GOODBYE_TIMEOUT, done.recv_async()).await;
        Ok(())
    }

    /// Browses for announcements; `own` (this cluster) is left out.
    pub fn browse(&self, own: Option<ClusterId>) -> Result<LanBrowser, LanError> {
        let events = self
            .daemon
            .browse(&service_type())
            .map_err(LanError::Browse)?;
        Ok(LanBrowser {
            events,
            tracker: Tracker::new(own),
            pending: Vec::new(),
        })
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        let _ = self.daemon.shutdown();
    }
}

/// The announcements seen on the LAN, as a stream of changes.
pub struct LanBrowser {
    events: mdns_sd::Receiver<ServiceEvent>,
    tracker: Tracker,
    /// Changes of the last event not yielded yet, last first.
    pending: Vec<Change>,
}

impl LanBrowser {
    /// The next change; `None` once the responder has stopped.
    pub async fn next(&mut self) -> Option<Change> {
        loop {
            if let Some(c) = self.pending.pop() {
                return Some(c);
            }
            let event = self.events.recv_async().await.ok()?;
            let mut events = self.observe(event);
            events.reverse();
            self.pending = events;
        }
    }

    /// The clusters currently announced (as far as the changes yielded so far say).
    pub fn announced(&self) -> impl Iterator<Item = &Announcement> {
        self.tracker.announced()
    }

    fn observe(&mut self, event: ServiceEvent) -> Vec<Change> {
        let events = match event {
            ServiceEvent::ServiceResolved(r) => {
                let Some(instance) = instance_of(&r.fullname, DOMAIN) else {
                    return Vec::new();
                };
                let txt: Vec<Vec<u8>> = r
                    .txt_properties
                    .iter()
                    .map(|p| match p.val() {
                        Some(v) => [p.key().as_bytes(), b"=", v].concat(),
                        None => p.key().as_bytes().to_vec(),
                    })
                    .collect();
                let instance = instance.to_owned();
                self.tracker
                    .resolved(&instance, txt.iter().map(Vec::as_slice))
            }
            ServiceEvent::ServiceRemoved(_, fullname) => match instance_of(&fullname, DOMAIN) {
                Some(instance) => self.tracker.removed(instance),
                None => Vec::new(),
            },
            _ => Vec::new(),
        };
        crate::changes_logged(events, "mDNS")
    }
}
