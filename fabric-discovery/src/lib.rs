//! Cluster discovery: how a cluster tells others where to authenticate for peering, and how it
//! finds them, on the LAN (mDNS) or under a DNS domain (DNS-SD).
//!
//! - [`announcement`] (pure): the typed [`Announcement`] (cluster id, authentication URL,
//!   roles) and its DNS-SD TXT encoding; malformed or hostile records are typed errors.
//! - [`tracker`] (pure): which clusters are announced, from records resolved and removed (or
//!   snapshots), without the local cluster's own; bad records are reported once.
//! - [`mdns`]: announce and browse on the LAN (`mdns-sd`).
//! - [`dns`]: resolve `_fabric-peering._tcp.<domain>` (PTR, then SRV and TXT) through a
//!   nameserver (`hickory-resolver`), again and again.
//!
//! Discovery only finds clusters: peering them is someone else's decision.
pub mod announcement;
pub mod dns;
pub mod mdns;
pub mod tracker;

pub use announcement::{Announcement, AuthUrl, ClusterId, Role, TxtError};
pub use tracker::{Change, Event, Tracker};

/// Logs the rejected records among `events` (the one place hostile input is reported) and
/// returns the changes.
fn changes_logged(events: Vec<Event>, via: &str) -> Vec<Change> {
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::Change(c) => Some(c),
            Event::Rejected { instance, error } => {
                tracing::warn!(via, instance = ?instance, "ignoring a cluster announcement: {error}");
                None
            }
            Event::Full { instance } => {
                tracing::warn!(
                    via,
                    instance = ?instance,
                    "ignoring new cluster announcements: already tracking {} clusters",
                    tracker::MAX_CLUSTERS
                );
                None
            }
        })
        .collect()
}
