//! Who may call the kubelet API, as a kubelet decides it (`--authorization-mode=Webhook`),
//! free of I/O: the client certificate's user ([`user`]: CommonName and Organizations, as the
//! API server's x509 authenticator reads them), the request as the attributes of the Node
//! subresource it stands for ([`attributes`]), and the answers of the API server's
//! SubjectAccessReviews kept for a while ([`Cache`]), so that a `kubectl logs -f` or a
//! port-forward's connections do not ask again each time.
//!
//! The mapping is upstream's (`pkg/kubelet/server/auth.go`): the HTTP method gives the verb,
//! every path is `nodes/proxy` on this node except the ones a finer subresource stands for.
//! Container logs, exec, attach and port-forward are `nodes/proxy`, as upstream: who can
//! reach those can run commands in every pod of the node. `/healthz` is `nodes/healthz`,
//! falling back to `nodes/proxy` (upstream's fine-grained kubelet authorization).
use std::time::{Duration, Instant};

use x509_parser::prelude::{FromDer as _, X509Certificate};

use super::ttl_cache::TtlCache;

/// An authenticated client of the kubelet API.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// Why a client certificate names no user (it chained to the client CA: it was verified).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("the client certificate is not valid DER: {0}")]
    Parse(String),
    #[error("the client certificate has no CommonName (the user name)")]
    NoCommonName,
}

/// The user of a verified client certificate (DER): CommonName is the name, each
/// Organization a group, as the API server's x509 authenticator has it.
pub fn user(cert: &[u8]) -> Result<User, CertError> {
    let (_, c) = X509Certificate::from_der(cert).map_err(|e| CertError::Parse(e.to_string()))?;
    let subject = c.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .filter(|s| !s.is_empty())
        .ok_or(CertError::NoCommonName)?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .map(str::to_owned)
        .collect();
    Ok(User { name, groups })
}

/// What a request asks of the Node, as a SubjectAccessReview's resource attributes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub user: User,
    pub verb: &'static str,
    /// Of `nodes` (core group, v1).
    pub subresource: &'static str,
    /// The Node's name.
    pub node: String,
}

impl std::fmt::Display for Attributes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "user={}, verb={}, resource=nodes, subresource={}",
            self.user.name, self.verb, self.subresource
        )
    }
}

/// The API verb of an HTTP method, as the kubelet maps them; None for anything else.
pub fn verb(method: &str) -> Option<&'static str> {
    Some(match method {
        "GET" | "HEAD" => "get",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => return None,
    })
}

/// Whether `path` is `base` or below it.
fn under(path: &str, base: &str) -> bool {
    path == base
        || path
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The attributes a request of `user` with `method` on `path` to node `node` must be allowed,
/// in order: any one of them allowed lets it in. Empty: a method no verb stands for (refused).
pub fn attributes(user: &User, method: &str, path: &str, node: &str) -> Vec<Attributes> {
    let Some(verb) = verb(method) else {
        return vec![];
    };
    let subresources: &[&'static str] = if under(path, "/stats") {
        &["stats"]
    } else if under(path, "/metrics") {
        &["metrics"]
    } else if under(path, "/logs") {
        // The node's own log files (`/logs/`), not containers': those are /containerLogs.
        &["log"]
    } else if under(path, "/spec") {
        &["spec"]
    } else if under(path, "/checkpoint") {
        &["checkpoint"]
    } else if under(path, "/healthz") {
        &["healthz", "proxy"]
    } else if under(path, "/configz") {
        &["configz", "proxy"]
    } else if under(path, "/pods") || under(path, "/runningpods") {
        &["pods", "proxy"]
    } else {
        &["proxy"]
    };
    subresources
        .iter()
        .map(|s| Attributes {
            user: user.clone(),
            verb,
            subresource: s,
            node: node.to_owned(),
        })
        .collect()
}

/// The API server's answer to a SubjectAccessReview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub allowed: bool,
    /// The authorizer's reason, if it gave one.
    pub reason: String,
}

/// How long answers are kept: the kubelet's defaults are 5 minutes for an allowed request and
/// 30 seconds for a denied one (`--authorization-webhook-cache-{authorized,unauthorized}-ttl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl {
    pub allowed: Duration,
    pub denied: Duration,
}

impl Default for Ttl {
    fn default() -> Self {
        Ttl {
            allowed: Duration::from_secs(300),
            denied: Duration::from_secs(30),
        }
    }
}

/// Answers kept until their TTL passes, at most [`Cache::CAPACITY`] of them.
#[derive(Debug)]
pub struct Cache {
    ttl: Ttl,
    answers: TtlCache<Attributes, Answer>,
}

impl Cache {
    pub const CAPACITY: usize = TtlCache::<Attributes, Answer>::CAPACITY;

    pub fn new(ttl: Ttl) -> Self {
        Cache {
            ttl,
            answers: TtlCache::new(),
        }
    }

    /// The answer for `attrs` if one is still fresh at `now`.
    pub fn get(&self, attrs: &Attributes, now: Instant) -> Option<Answer> {
        self.answers.get(attrs, now)
    }

    /// Keeps `answer` for `attrs`, got at `now`.
    pub fn put(&mut self, attrs: Attributes, answer: Answer, now: Instant) {
        let ttl = if answer.allowed {
            self.ttl.allowed
        } else {
            self.ttl.denied
        };
        self.answers.put(attrs, answer, ttl, now);
    }

    pub fn len(&self) -> usize {
        self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

/// What happens to a request once its attributes' answers are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// 403, with the kubelet's message.
    Forbidden(String),
}

/// The verdict from the answers to `attrs` (same order; an answer may be missing where an
/// earlier one already allowed the request): allowed if any is. The message names the first
/// (the most specific) attributes, as the kubelet's does.
pub fn verdict(attrs: &[Attributes], answers: &[Answer]) -> Verdict {
    if answers.iter().any(|a| a.allowed) {
        return Verdict::Allowed;
    }
    let Some(first) = attrs.first() else {
        return Verdict::Forbidden("Forbidden (no verb for this method)".to_owned());
    };
    let reason = answers
        .iter()
        .map(|a| a.reason.as_str())
        .find(|r| !r.is_empty());
    Verdict::Forbidden(match reason {
        Some(r) => format!("Forbidden ({first}): {r}"),
        None => format!("Forbidden ({first})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> User {
        User {
            name: "alice".into(),
            groups: vec!["dev".into()],
        }
    }

    fn subresources(method: &str, path: &str) -> Vec<(&'static str, &'static str)> {
        attributes(&alice(), method, path, "vn-b")
            .into_iter()
            .map(|a| (a.verb, a.subresource))
            .collect()
    }

    #[test]
    fn streams_and_logs_are_node_proxy_as_upstream() {
        // What the API server sends for kubectl logs, exec (SPDY POST, WebSocket GET),
        // attach and port-forward.
        assert_eq!(
            subresources("GET", "/containerLogs/shop/web/app"),
            [("get", "proxy")]
        );
        assert_eq!(
            subresources("POST", "/exec/shop/web/app"),
            [("create", "proxy")]
        );
        assert_eq!(
            subresources("GET", "/exec/shop/web/app"),
            [("get", "proxy")]
        );
        assert_eq!(
            subresources("POST", "/attach/shop/web/app"),
            [("create", "proxy")]
        );
        assert_eq!(
            subresources("POST", "/portForward/shop/web"),
            [("create", "proxy")]
        );
        // Not served here, but authorized before anything says so.
        assert_eq!(subresources("GET", "/run/a/b/c"), [("get", "proxy")]);
        assert_eq!(subresources("DELETE", "/x"), [("delete", "proxy")]);
        let a = &attributes(&alice(), "GET", "/containerLogs/a/b/c", "vn-b")[0];
        assert_eq!((a.node.as_str(), &a.user), ("vn-b", &alice()));
    }

    #[test]
    fn finer_subresources_by_path() {
        assert_eq!(subresources("GET", "/stats/summary"), [("get", "stats")]);
        assert_eq!(subresources("GET", "/metrics"), [("get", "metrics")]);
        assert_eq!(
            subresources("GET", "/metrics/cadvisor"),
            [("get", "metrics")]
        );
        assert_eq!(subresources("GET", "/logs/syslog"), [("get", "log")]);
        assert_eq!(subresources("GET", "/spec/"), [("get", "spec")]);
        assert_eq!(
            subresources("POST", "/checkpoint/a/b/c"),
            [("create", "checkpoint")]
        );
        assert_eq!(
            subresources("GET", "/healthz"),
            [("get", "healthz"), ("get", "proxy")]
        );
        assert_eq!(
            subresources("GET", "/pods"),
            [("get", "pods"), ("get", "proxy")]
        );
        assert_eq!(
            subresources("GET", "/runningpods/"),
            [("get", "pods"), ("get", "proxy")]
        );
        // A prefix is a path segment, not a string prefix.
        assert_eq!(subresources("GET", "/statsx"), [("get", "proxy")]);
        assert_eq!(subresources("GET", "/logsfoo/x"), [("get", "proxy")]);
        // A method no verb stands for is never allowed.
        assert!(subresources("OPTIONS", "/healthz").is_empty());
        assert!(subresources("CONNECT", "/exec/a/b/c").is_empty());
    }

    fn yes() -> Answer {
        Answer {
            allowed: true,
            reason: String::new(),
        }
    }

    fn no(reason: &str) -> Answer {
        Answer {
            allowed: false,
            reason: reason.into(),
        }
    }

    #[test]
    fn any_allowed_alternative_lets_in_else_forbidden_naming_the_first() {
        let attrs = attributes(&alice(), "GET", "/healthz", "vn-b");
        assert_eq!(verdict(&attrs, &[no(""), yes()]), Verdict::Allowed);
        assert_eq!(verdict(&attrs, &[yes()]), Verdict::Allowed);
        assert_eq!(
            verdict(&attrs, &[no(""), no("")]),
            Verdict::Forbidden(
                "Forbidden (user=alice, verb=get, resource=nodes, subresource=healthz)".into()
            )
        );
        let attrs = attributes(&alice(), "POST", "/exec/a/b/c", "vn-b");
        assert_eq!(
            verdict(&attrs, &[no("no RBAC policy matched")]),
            Verdict::Forbidden(
                "Forbidden (user=alice, verb=create, resource=nodes, subresource=proxy): no RBAC \
                 policy matched"
                    .into()
            )
        );
        assert!(matches!(verdict(&[], &[]), Verdict::Forbidden(_)));
    }

    #[test]
    fn answers_are_kept_for_their_ttl() {
        let ttl = Ttl {
            allowed: Duration::from_secs(300),
            denied: Duration::from_secs(30),
        };
        let mut c = Cache::new(ttl);
        let t0 = Instant::now();
        let logs = attributes(&alice(), "GET", "/containerLogs/a/b/c", "vn-b").remove(0);
        let exec = attributes(&alice(), "POST", "/exec/a/b/c", "vn-b").remove(0);
        assert_eq!(c.get(&logs, t0), None);
        c.put(logs.clone(), yes(), t0);
        c.put(exec.clone(), no("nope"), t0);
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(c.get(&logs, at(29)), Some(yes()));
        assert_eq!(c.get(&exec, at(29)), Some(no("nope")));
        // A denial is asked again sooner than a grant.
        assert_eq!(c.get(&exec, at(30)), None);
        assert_eq!(c.get(&logs, at(299)), Some(yes()));
        assert_eq!(c.get(&logs, at(300)), None);
        // Another user, group or node is another question.
        let mut bob = logs.clone();
        bob.user.name = "bob".into();
        assert_eq!(c.get(&bob, at(1)), None);
        let mut other_group = logs.clone();
        other_group.user.groups = vec!["system:masters".into()];
        assert_eq!(c.get(&other_group, at(1)), None);
        let mut other_node = logs.clone();
        other_node.node = "vn-c".into();
        assert_eq!(c.get(&other_node, at(1)), None);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut c = Cache::new(Ttl::default());
        let t0 = Instant::now();
        for i in 0..Cache::CAPACITY {
            let mut u = alice();
            u.name = format!("u{i}");
            c.put(attributes(&u, "GET", "/", "n").remove(0), no(""), t0);
        }
        assert_eq!(c.len(), Cache::CAPACITY);
        // Past the denials' TTL, they make room.
        let later = t0 + Duration::from_secs(31);
        c.put(
            attributes(&alice(), "GET", "/", "n").remove(0),
            yes(),
            later,
        );
        assert_eq!(c.len(), 1);
        // Nothing expired: everything goes rather than growing.
        for i in 0..Cache::CAPACITY + 10 {
            let mut u = alice();
            u.name = format!("v{i}");
            c.put(attributes(&u, "GET", "/", "n").remove(0), yes(), later);
        }
        assert!(c.len() <= Cache::CAPACITY);
    }

    #[test]
    fn the_user_of_a_client_certificate() {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        assert_eq!(
            user(cert.der()).unwrap(),
            User {
                name: "kube-apiserver-kubelet-client".into(),
                groups: vec!["system:masters".into()],
            }
        );
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "dev");
        let cert = p.self_signed(&key).unwrap();
        assert_eq!(user(cert.der()), Err(CertError::NoCommonName));
        assert!(matches!(user(b"junk"), Err(CertError::Parse(_))));
    }
}
