//! Which clusters are announced, from what a browser sees: the same logic for mDNS (records
//! resolved and removed one at a time) and unicast DNS (a full snapshot per resolution).
//!
//! A [`Tracker`] turns raw DNS-SD instances into [`Event`]s: a cluster discovered, its
//! announcement changed, its announcement gone; the local cluster's own announcement is
//! ignored. A record that is not a valid announcement is [`Event::Rejected`] once (not at each
//! re-announcement) and never becomes a cluster; a known cluster whose record turns invalid
//! expires. A tracker holds at most [`MAX_CLUSTERS`] clusters (and as many bad records), so a
//! flood of announcements costs bounded memory: past that, new clusters are left out
//! ([`Event::Full`], once) until some go. Pure: no I/O here.
use std::collections::BTreeMap;

use crate::announcement::{Announcement, ClusterId, SERVICE, TxtError};

/// What changed in the set of announced clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A cluster seen for the first time (or again after it expired).
    Discovered(Announcement),
    /// A known cluster's announcement changed.
    Updated(Announcement),
    /// A cluster's announcement was withdrawn, expired, or turned invalid.
    Expired(ClusterId),
}

/// What a tracker makes of what it was shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Change(Change),
    /// Instance `instance` announces something that is not an announcement (reported again
    /// only when the error changes).
    Rejected {
        instance: String,
        error: TxtError,
    },
    /// A new cluster was left out: the tracker already holds [`MAX_CLUSTERS`] (reported again
    /// only after it had room).
    Full {
        instance: String,
    },
}

/// The most clusters a tracker holds, and the most bad records it remembers.
pub const MAX_CLUSTERS: usize = 512;

/// The instance name of a DNS-SD service instance's full name: `cluster-a` for
/// `cluster-a._fabric-peering._tcp.local.` in domain `local` (a trailing dot on either is
/// optional). `None` for a name of another service or domain, or without an instance.
pub fn instance_of<'a>(fullname: &'a str, domain: &str) -> Option<&'a str> {
    let name = fullname.strip_suffix('.').unwrap_or(fullname);
    let domain = domain.strip_suffix('.').unwrap_or(domain);
    let rest = name.strip_suffix(domain)?.strip_suffix('.')?;
    let instance = rest.strip_suffix(SERVICE)?.strip_suffix('.')?;
    (!instance.is_empty()).then_some(instance)
}

/// The announcements seen so far, keyed by instance name.
#[derive(Debug, Default)]
pub struct Tracker {
    own: Option<ClusterId>,
    known: BTreeMap<String, Announcement>,
    rejected: BTreeMap<String, TxtError>,
    /// Whether [`Event::Full`] was reported since the tracker was last below the bound.
    full_reported: bool,
}

impl Tracker {
    /// A tracker that ignores the announcement of cluster `own` (the local one), if any.
    pub fn new(own: Option<ClusterId>) -> Self {
        Self {
            own,
            ..Self::default()
        }
    }

    /// The clusters currently announced.
    pub fn announced(&self) -> impl Iterator<Item = &Announcement> {
        self.known.values()
    }

    /// Instance `instance` was resolved with these TXT strings.
    pub fn resolved<'a>(
        &mut self,
        instance: &str,
        txt: impl IntoIterator<Item = &'a [u8]>,
    ) -> Vec<Event> {
        if self.own.as_ref().is_some_and(|o| o.as_str() == instance) {
            return Vec::new();
        }
        let mut events = Vec::new();
        match Announcement::from_instance(instance, txt) {
            Err(error) => {
                if let Some(gone) = self.known.remove(instance) {
                    events.push(Event::Change(Change::Expired(gone.cluster_id)));
                }
                let room =
                    self.rejected.len() < MAX_CLUSTERS || self.rejected.contains_key(instance);
                if room && self.rejected.get(instance) != Some(&error) {
                    self.rejected.insert(instance.to_owned(), error.clone());
                    events.push(Event::Rejected {
                        instance: instance.to_owned(),
                        error,
                    });
                }
            }
            Ok(a) => {
                self.rejected.remove(instance);
                if self.known.len() >= MAX_CLUSTERS && !self.known.contains_key(instance) {
                    if !self.full_reported {
                        self.full_reported = true;
                        events.push(Event::Full {
                            instance: instance.to_owned(),
                        });
                    }
                    return events;
                }
                match self.known.insert(instance.to_owned(), a.clone()) {
                    None => events.push(Event::Change(Change::Discovered(a))),
                    Some(old) if old != a => events.push(Event::Change(Change::Updated(a))),
                    Some(_) => {}
                }
            }
        }
        events
    }

    /// Instance `instance` is gone (a goodbye, or its records expired).
    pub fn removed(&mut self, instance: &str) -> Vec<Event> {
        self.rejected.remove(instance);
        self.full_reported &= self.known.len() > MAX_CLUSTERS;
        match self.known.remove(instance) {
            Some(a) => vec![Event::Change(Change::Expired(a.cluster_id))],
            None => Vec::new(),
        }
    }

    /// Everything announced now (one resolution of a domain): instances not in it are gone.
    pub fn snapshot<S: AsRef<[u8]>>(&mut self, instances: &[(String, Vec<S>)]) -> Vec<Event> {
        let mut events = Vec::new();
        for (instance, txt) in instances {
            events.extend(self.resolved(instance, txt.iter().map(AsRef::as_ref)));
        }
        let present = |i: &String| instances.iter().any(|(n, _)| n == i);
        let gone: Vec<String> = self.known.keys().filter(|i| !present(i)).cloned().collect();
        for instance in gone {
            events.extend(self.removed(&instance));
        }
        self.rejected.retain(|i, _| present(i));
        events
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::announcement::Role;

    fn ann(id: &str, url: &str) -> Announcement {
        Announcement {
            cluster_id: id.parse().unwrap(),
            auth_url: url.parse().unwrap(),
            roles: BTreeSet::from([Role::Provider]),
        }
    }

    fn txt(a: &Announcement) -> Vec<Vec<u8>> {
        a.to_txt_strings()
    }

    fn resolved(t: &mut Tracker, instance: &str, txt: &[Vec<u8>]) -> Vec<Event> {
        t.resolved(instance, txt.iter().map(Vec::as_slice))
    }

    fn change(c: Change) -> Vec<Event> {
        vec![Event::Change(c)]
    }

    #[test]
    fn instance_names_under_the_service_and_domain() {
        let of = instance_of;
        assert_eq!(of("a._fabric-peering._tcp.local.", "local."), Some("a"));
        assert_eq!(of("a._fabric-peering._tcp.local", "local"), Some("a"));
        assert_eq!(
            of("b-2._fabric-peering._tcp.example.test.", "example.test"),
            Some("b-2")
        );
        assert_eq!(of("x.y._fabric-peering._tcp.local.", "local."), Some("x.y"));
        assert_eq!(of("_fabric-peering._tcp.local.", "local."), None);
        assert_eq!(of("a._http._tcp.local.", "local."), None);
        assert_eq!(of("a._fabric-peering._tcp.other.", "local."), None);
        assert_eq!(of("a._fabric-peering._tcp.notlocal.", "local."), None);
    }

    #[test]
    fn discovers_updates_and_expires() {
        let mut t = Tracker::new(None);
        let a = ann("a", "https://a.example");
        assert_eq!(
            resolved(&mut t, "a", &txt(&a)),
            change(Change::Discovered(a.clone()))
        );
        assert_eq!(resolved(&mut t, "a", &txt(&a)), vec![], "re-announced");
        let a2 = ann("a", "https://a.example:8443");
        assert_eq!(
            resolved(&mut t, "a", &txt(&a2)),
            change(Change::Updated(a2.clone()))
        );
        assert_eq!(t.announced().collect::<Vec<_>>(), vec![&a2]);
        assert_eq!(
            t.removed("a"),
            change(Change::Expired("a".parse().unwrap()))
        );
        assert_eq!(t.removed("a"), vec![]);
        assert_eq!(
            resolved(&mut t, "a", &txt(&a)),
            change(Change::Discovered(a)),
            "back after it expired"
        );
    }

    #[test]
    fn ignores_its_own_announcement() {
        let mut t = Tracker::new(Some("a".parse().unwrap()));
        let a = ann("a", "https://a.example");
        assert_eq!(resolved(&mut t, "a", &txt(&a)), vec![]);
        assert_eq!(t.removed("a"), vec![]);
        assert_eq!(t.announced().count(), 0);
    }

    #[test]
    fn rejects_bad_records_once_and_never_tracks_them() {
        let mut t = Tracker::new(None);
        let mut bad = txt(&ann("evil", "https://evil.example"));
        bad[2] = b"auth=http://evil.example".to_vec();
        let events = resolved(&mut t, "evil", &bad);
        assert!(
            matches!(
                &events[..],
                [Event::Rejected {
                    instance,
                    error: TxtError::BadAuthUrl { .. }
                }] if instance == "evil"
            ),
            "{events:?}"
        );
        assert_eq!(resolved(&mut t, "evil", &bad), vec![], "logged once");
        assert_eq!(t.announced().count(), 0);
        assert_eq!(t.removed("evil"), vec![]);
        assert_eq!(
            resolved(&mut t, "evil", &bad).len(),
            1,
            "new after a removal"
        );
        // Someone else's name.
        let events = resolved(&mut t, "b", &txt(&ann("a", "https://a.example")));
        assert!(matches!(
            &events[..],
            [Event::Rejected {
                error: TxtError::InstanceMismatch { .. },
                ..
            }]
        ));
        assert_eq!(t.announced().count(), 0);
    }

    #[test]
    fn a_known_cluster_whose_record_turns_bad_expires() {
        let mut t = Tracker::new(None);
        let a = ann("a", "https://a.example");
        resolved(&mut t, "a", &txt(&a));
        let mut bad = txt(&a);
        bad[0] = b"txtvers=2".to_vec();
        let events = resolved(&mut t, "a", &bad);
        assert_eq!(
            events[0],
            Event::Change(Change::Expired("a".parse().unwrap()))
        );
        assert!(matches!(
            events[1],
            Event::Rejected {
                error: TxtError::UnsupportedVersion { version: 2 },
                ..
            }
        ));
        assert_eq!(
            resolved(&mut t, "a", &txt(&a)),
            change(Change::Discovered(a)),
            "good again"
        );
    }

    #[test]
    fn holds_a_bounded_number_of_clusters() {
        let mut t = Tracker::new(None);
        let name = |i: usize| format!("c{i}");
        for i in 0..MAX_CLUSTERS {
            let a = ann(&name(i), "https://c.example");
            assert_eq!(resolved(&mut t, &name(i), &txt(&a)).len(), 1);
        }
        let extra = |i: usize| ann(&name(i), "https://c.example");
        let n = MAX_CLUSTERS;
        assert_eq!(
            resolved(&mut t, &name(n), &txt(&extra(n))),
            vec![Event::Full { instance: name(n) }]
        );
        assert_eq!(
            resolved(&mut t, &name(n + 1), &txt(&extra(n + 1))),
            vec![],
            "once"
        );
        assert_eq!(t.announced().count(), MAX_CLUSTERS);
        // A known one still updates.
        let moved = ann(&name(0), "https://moved.example");
        assert_eq!(
            resolved(&mut t, &name(0), &txt(&moved)),
            change(Change::Updated(moved))
        );
        // Room again: the next newcomer gets in.
        t.removed(&name(1));
        assert_eq!(
            resolved(&mut t, &name(n + 1), &txt(&extra(n + 1))),
            change(Change::Discovered(extra(n + 1)))
        );
        assert_eq!(
            resolved(&mut t, &name(n + 2), &txt(&extra(n + 2))),
            vec![Event::Full {
                instance: name(n + 2)
            }],
            "reported again after there was room"
        );
        // Bad records are remembered (and reported) up to the same bound.
        let mut bad = txt(&extra(0));
        bad[0] = b"txtvers=9".to_vec();
        let reported: usize = (0..MAX_CLUSTERS + 10)
            .map(|i| resolved(&mut t, &format!("bad{i}"), &bad).len())
            .sum();
        assert_eq!(reported, MAX_CLUSTERS);
    }

    #[test]
    fn snapshots_expire_what_they_no_longer_hold() {
        let mut t = Tracker::new(Some("me".parse().unwrap()));
        let a = ann("a", "https://a.example");
        let b = ann("b", "https://b.example");
        let me = ann("me", "https://me.example");
        let mut bad = txt(&ann("c", "https://c.example"));
        bad.push(b"ID=c".to_vec());
        let snap = vec![
            ("a".to_owned(), txt(&a)),
            ("b".to_owned(), txt(&b)),
            ("me".to_owned(), txt(&me)),
            ("c".to_owned(), bad.clone()),
        ];
        let events = t.snapshot(&snap);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0], Event::Change(Change::Discovered(a.clone())));
        assert_eq!(events[1], Event::Change(Change::Discovered(b.clone())));
        assert!(matches!(events[2], Event::Rejected { .. }));
        assert_eq!(t.snapshot(&snap), vec![], "nothing new");
        let events = t.snapshot(&[("a".to_owned(), txt(&a))]);
        assert_eq!(events, change(Change::Expired("b".parse().unwrap())));
        assert_eq!(
            t.snapshot(&[("a".to_owned(), txt(&a)), ("c".to_owned(), bad)])
                .len(),
            1,
            "c left the snapshot, so it is reported again when it comes back"
        );
    }
}
