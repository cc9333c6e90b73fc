//! Bearer tokens on the kubelet API, as a kubelet with `--authentication-token-webhook` takes
//! them (free of I/O; [`super::access::Authenticator`] asks): a client without a client
//! certificate (a Prometheus scraping nodes with its ServiceAccount token, a
//! metrics-server, a user's `curl -H "Authorization: Bearer ..."`) is whoever this cluster's
//! API server says the token belongs to (TokenReview), and is then authorized as a
//! certificate's user is ([`super::authz`]). Reviews are kept for a while, by the token's
//! digest: the tokens themselves are not kept.
use std::time::{Duration, Instant};

use super::{authz::User, ttl_cache::TtlCache};

/// The token of an `Authorization` header's value (`Bearer <token>`, the scheme in any case,
/// RFC 6750); None for anything else, which a token cannot authenticate.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

/// What the API server said of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reviewed {
    /// It authenticates this user.
    User(User),
    /// It does not (unknown, expired, revoked, for another audience), with the API server's
    /// reason if it gave one.
    Rejected(String),
}

type Digest = [u8; 32];

fn digest(token: &str) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Reviews kept until their TTL passes (`--authentication-token-webhook-cache-ttl`, 2 minutes
/// as the kubelet's, for both outcomes as upstream's token cache has it), by the token's SHA-256 (bounded as
/// [`TtlCache::CAPACITY`]).
#[derive(Debug)]
pub struct Tokens {
    ttl: Duration,
    reviews: TtlCache<Digest, Reviewed>,
}

impl Tokens {
    pub fn new(ttl: Duration) -> Self {
        Tokens {
            ttl,
            reviews: TtlCache::new(),
        }
    }

    /// The review of `token` if one is still fresh at `now`.
    pub fn get(&self, token: &str, now: Instant) -> Option<Reviewed> {
        self.reviews.get(&digest(token), now)
    }

    /// Keeps `review` of `token`, got at `now`.
    pub fn put(&mut self, token: &str, review: Reviewed, now: Instant) {
        self.reviews.put(digest(token), review, self.ttl, now);
    }

    pub fn len(&self) -> usize {
        self.reviews.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reviews.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_token_is_a_token() {
        assert_eq!(bearer_token("Bearer abc.def"), Some("abc.def"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER   abc  "), Some("abc"));
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Basic dXNlcjpwYXNz"), None);
        assert_eq!(bearer_token("Bearer a b"), None);
        assert_eq!(bearer_token(""), None);
    }

    #[test]
    fn reviews_are_kept_for_their_ttl_by_digest() {
        let mut t = Tokens::new(Duration::from_secs(120));
        let t0 = Instant::now();
        let alice = Reviewed::User(User {
            name: "system:serviceaccount:monitoring:prometheus".into(),
            groups: vec!["system:serviceaccounts".into()],
        });
        assert_eq!(t.get("tok-a", t0), None);
        t.put("tok-a", alice.clone(), t0);
        t.put("tok-b", Reviewed::Rejected("expired".into()), t0);
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(t.get("tok-a", at(119)), Some(alice));
        assert_eq!(
            t.get("tok-b", at(119)),
            Some(Reviewed::Rejected("expired".into()))
        );
        assert_eq!(t.get("tok-a", at(120)), None);
        assert_eq!(t.get("tok-c", at(1)), None);
        // Only digests are kept.
        assert!(
            !format!("{t:?}").contains("tok-a"),
            "a token in memory as text: {t:?}"
        );
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut t = Tokens::new(Duration::from_secs(120));
        let t0 = Instant::now();
        for i in 0..TtlCache::<Digest, Reviewed>::CAPACITY + 10 {
            t.put(&format!("t{i}"), Reviewed::Rejected(String::new()), t0);
        }
        assert!(t.len() <= TtlCache::<Digest, Reviewed>::CAPACITY);
    }
}
