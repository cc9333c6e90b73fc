//! Readiness gating, pure: what the edge may conclude from its caches and from whether the
//! remote cluster answers, and how a remote object found for a key is presented to the kind.
//!
//! Nothing is decided from a cache that has not listed: an object missing from it may exist.
//! Until the home cache has listed, no key is synced at all; until the remote cache has
//! listed (or while there is no remote client), the kind sees the remote as
//! [`Remote::Unknown`] and must not create anything; orphans are only deleted while both
//! caches have listed and the remote answers.
use kube::Resource;

/// Whether the remote cluster answers, as whoever runs the reflectors knows it (the virtual
/// kubelet: its node's Ready condition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reachability {
    /// Not known yet (just started): nothing is synced.
    #[default]
    Unknown,
    Reachable,
    /// The kinds are told ([`crate::View::reachable`]) and decide what still makes sense
    /// (report, wait); the edge deletes nothing remote.
    Unreachable,
}

/// The remote side as the edge has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteCache {
    /// No client for the remote cluster (no identity yet, or not usable).
    NoClient,
    /// A client, its cache still listing.
    Listing,
    Listed,
}

/// Everything the edge knows before it syncs a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    pub home_listed: bool,
    pub remote: RemoteCache,
    pub reachability: Reachability,
}

impl Gate {
    /// Whether keys may be synced: the home cache has listed (a key missing from it is gone)
    /// and whether the remote answers is known. Keys wait in the queue until then.
    pub fn open(&self) -> bool {
        self.home_listed && self.reachability != Reachability::Unknown
    }

    pub fn reachable(&self) -> bool {
        self.reachability == Reachability::Reachable
    }

    /// Whether the remote cache can say an object is absent.
    pub fn remote_listed(&self) -> bool {
        self.remote == RemoteCache::Listed
    }

    /// Whether remote objects whose home object is gone may be deleted now: both caches
    /// listed, and the remote answers.
    pub fn may_delete_orphans(&self) -> bool {
        self.open() && self.remote_listed() && self.reachable()
    }
}

/// What the remote cluster holds for a key, as far as the edge knows.
#[derive(Debug)]
pub enum Remote<'a, R> {
    /// No client, or its cache has not listed: nothing may be concluded from an absence.
    Unknown,
    /// Listed, and there is no remote object of that name.
    Absent,
    /// Ours (it carries our [`crate::Marks`], or its kind adopts it: [`crate::Kind::adopts`]).
    Ours(&'a R),
    /// An object of that name that someone else made: never overwritten or deleted.
    Foreign(&'a R),
}

// Derived Clone/Copy would require `R: Clone`; a reference is Copy whatever it points to.
impl<R> Clone for Remote<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R> Copy for Remote<'_, R> {}

impl<'a, R: Resource> Remote<'a, R> {
    /// From a lookup in the remote cache (`None`: not listed) and which objects are ours
    /// (`None`: no remote client; see [`crate::kind::owned`]).
    pub fn of(listed: Option<Option<&'a R>>, ours: Option<impl Fn(&R) -> bool>) -> Self {
        match (listed, ours) {
            (None, _) | (_, None) => Remote::Unknown,
            (Some(None), _) => Remote::Absent,
            (Some(Some(r)), Some(ours)) if ours(r) => Remote::Ours(r),
            (Some(Some(r)), _) => Remote::Foreign(r),
        }
    }

    /// The remote object if it is ours.
    pub fn ours(&self) -> Option<&'a R> {
        match self {
            Remote::Ours(r) => Some(r),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;
    use crate::marks::Marks;

    fn gate(home_listed: bool, remote: RemoteCache, reachability: Reachability) -> Gate {
        Gate {
            home_listed,
            remote,
            reachability,
        }
    }

    #[test]
    fn nothing_is_synced_before_the_home_cache_listed_and_reachability_is_known() {
        use Reachability::*;
        use RemoteCache::*;
        assert!(!gate(false, Listed, Reachable).open());
        assert!(!gate(true, Listed, Unknown).open());
        assert!(gate(true, NoClient, Unreachable).open());
        assert!(gate(true, Listing, Reachable).open());
    }

    #[test]
    fn orphans_go_only_from_two_listed_caches_of_a_remote_that_answers() {
        use Reachability::*;
        use RemoteCache::*;
        assert!(gate(true, Listed, Reachable).may_delete_orphans());
        assert!(!gate(true, Listed, Unreachable).may_delete_orphans());
        assert!(!gate(true, Listing, Reachable).may_delete_orphans());
        assert!(!gate(true, NoClient, Reachable).may_delete_orphans());
        assert!(!gate(false, Listed, Reachable).may_delete_orphans());
    }

    #[test]
    fn a_remote_object_is_ours_only_when_the_kind_says_so() {
        let m = Marks::new("alpha", "beta");
        let mut ours = ConfigMap::default();
        ours.metadata.labels = Some(m.labels());
        let theirs = ConfigMap::default();
        let by_marks = || Some(|c: &ConfigMap| m.on(&c.metadata));
        let no_client = None::<fn(&ConfigMap) -> bool>;
        assert!(matches!(
            Remote::of(Some(Some(&ours)), by_marks()),
            Remote::Ours(_)
        ));
        assert!(matches!(
            Remote::of(Some(Some(&theirs)), by_marks()),
            Remote::Foreign(_)
        ));
        assert!(matches!(Remote::of(Some(None), by_marks()), Remote::Absent));
        // Not listed, or no client: unknown, whatever the lookup said.
        assert!(matches!(Remote::of(None, by_marks()), Remote::Unknown));
        assert!(matches!(
            Remote::of(Some(Some(&ours)), no_client),
            Remote::Unknown
        ));
        assert!(Remote::of(Some(Some(&ours)), by_marks()).ours().is_some());
        assert!(Remote::of(Some(Some(&theirs)), by_marks()).ours().is_none());
        // An object the kind adopts (made before marks existed) is ours without them.
        assert!(matches!(
            Remote::of(Some(Some(&theirs)), Some(|_: &ConfigMap| true)),
            Remote::Ours(_)
        ));
    }
}
