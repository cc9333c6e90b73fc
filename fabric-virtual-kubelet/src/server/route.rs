//! What a kubelet API request asks for and where it goes on the provider, as pure functions:
//! the kubelet's paths and queries ([`Route::parse`]), which home pods are served
//! ([`bound_here`]) and which provider pod runs one ([`target`]), the provider API request that stands for it ([`provider_path`]), and which
//! headers of an upgrade cross the relay ([`upgrade_request_headers`],
//! [`upgrade_response_headers`]).
use fabric_api::offloading::v1alpha1::ShadowPod;
use fabric_kubelet::remotecommand::{Options, OptionsError};
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{ResourceExt as _, api::LogParams};

/// A request of the kubelet API, as the API server sends it for `kubectl logs`, `exec`,
/// `attach` and `port-forward`.
#[derive(Debug, Clone)]
pub enum Route {
    Healthz,
    /// The reflectors' metrics.
    Metrics,
    Logs {
        pod: PodRef,
        container: String,
        params: LogParams,
    },
    Exec {
        pod: PodRef,
        container: String,
        options: Options,
    },
    Attach {
        pod: PodRef,
        container: String,
        options: Options,
    },
    PortForward {
        pod: PodRef,
    },
}

/// A pod of this (the consumer's) cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a request is not served (its HTTP status: [`Refused::status`]).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{0} is not served by the fabric's virtual kubelet")]
    NotServed(String),
    #[error("only GET (and POST for exec, attach and port-forward) is served")]
    Method,
    #[error("{0:?} is not a valid object name")]
    BadName(String),
    #[error("invalid query: {0}")]
    BadQuery(String),
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error("pod {pod} is not bound to virtual node {node} (it is on {actual:?})")]
    OtherNode {
        pod: PodRef,
        node: String,
        actual: Option<String>,
    },
    #[error("pod {0} does not exist")]
    NoPod(PodRef),
    #[error("pod {pod} has no ShadowPod on provider {provider} (not offloaded yet?)")]
    NotOffloaded { pod: PodRef, provider: String },
}

impl Refused {
    pub fn status(&self) -> u16 {
        match self {
            Refused::NotServed(_)
            | Refused::OtherNode { .. }
            | Refused::NoPod(_)
            | Refused::NotOffloaded { .. } => 404,
            Refused::Method => 405,
            Refused::BadName(_) | Refused::BadQuery(_) | Refused::Options(_) => 400,
        }
    }
}

/// A name or namespace as the API allows them (DNS-1123 subdomain): nothing that could move
/// a path elsewhere once it is put in one.
fn name(s: &str) -> Result<String, Refused> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
        && !s.contains("..");
    if ok {
        Ok(s.to_owned())
    } else {
        Err(Refused::BadName(s.to_owned()))
    }
}

fn pod(ns: &str, pod: &str) -> Result<PodRef, Refused> {
    Ok(PodRef {
        namespace: name(ns)?,
        name: name(pod)?,
    })
}

impl Route {
    /// The request for `method` on `path` with `query`.
    pub fn parse(method: &str, path: &str, query: &str) -> Result<Route, Refused> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let streaming = matches!(parts.first(), Some(&("exec" | "attach" | "portForward")));
        if !(method == "GET" || (streaming && method == "POST")) {
            return Err(Refused::Method);
        }
        Ok(match parts.as_slice() {
            ["healthz"] => Route::Healthz,
            ["metrics"] => Route::Metrics,
            ["containerLogs", ns, p, c] => Route::Logs {
                pod: pod(ns, p)?,
                container: name(c)?,
                params: log_params(query)?,
            },
            ["exec", ns, p, c] => Route::Exec {
                pod: pod(ns, p)?,
                container: name(c)?,
                options: Options::from_query(query, true)?,
            },
            ["attach", ns, p, c] => Route::Attach {
                pod: pod(ns, p)?,
                container: name(c)?,
                options: Options::from_query(query, false)?,
            },
            ["portForward", ns, p] => Route::PortForward { pod: pod(ns, p)? },
            _ => return Err(Refused::NotServed(path.to_owned())),
        })
    }

    pub fn pod(&self) -> Option<&PodRef> {
        match self {
            Route::Healthz | Route::Metrics => None,
            Route::Logs { pod, .. }
            | Route::Exec { pod, .. }
            | Route::Attach { pod, .. }
            | Route::PortForward { pod } => Some(pod),
        }
    }
}

fn flag(v: &str) -> bool {
    v == "1" || v.eq_ignore_ascii_case("true")
}

fn number(k: &str, v: &str) -> Result<i64, Refused> {
    v.parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
        .ok_or_else(|| Refused::BadQuery(format!("{k}={v:?} is not a non-negative integer")))
}

/// The kubelet's `containerLogs` query (what the API server puts there from `PodLogOptions`)
/// as the provider's `pods/log` parameters.
pub fn log_params(query: &str) -> Result<LogParams, Refused> {
    let mut p = LogParams::default();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "follow" => p.follow = flag(&v),
            "previous" => p.previous = flag(&v),
            "timestamps" => p.timestamps = flag(&v),
            "tailLines" => p.tail_lines = Some(number(&k, &v)?),
            "limitBytes" => p.limit_bytes = Some(number(&k, &v)?),
            "sinceSeconds" => p.since_seconds = Some(number(&k, &v)?),
            "sinceTime" => {
                let t: Timestamp = v
                    .parse()
                    .map_err(|e| Refused::BadQuery(format!("sinceTime={v:?}: {e}")))?;
                p.since_time = Some(t);
            }
            _ => {}
        }
    }
    if p.since_seconds.is_some() && p.since_time.is_some() {
        return Err(Refused::BadQuery(
            "at most one of sinceTime or sinceSeconds may be specified".to_owned(),
        ));
    }
    Ok(p)
}

/// The provider's pod that runs a home pod: its namespace (the tenant namespace) and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub name: String,
}

/// The uid of `home` (this cluster's pod `want`, None if it does not exist) if it is bound to
/// virtual node `node`: only those are served.
pub fn bound_here(want: &PodRef, home: Option<&Pod>, node: &str) -> Result<String, Refused> {
    let home = home.ok_or_else(|| Refused::NoPod(want.clone()))?;
    let bound = home.spec.as_ref().and_then(|s| s.node_name.clone());
    if bound.as_deref() != Some(node) {
        return Err(Refused::OtherNode {
            pod: want.clone(),
            node: node.to_owned(),
            actual: bound,
        });
    }
    home.metadata
        .uid
        .clone()
        .ok_or_else(|| Refused::NoPod(want.clone()))
}

/// The provider pod that runs home pod `want` (uid `uid`): the real pod of the ShadowPod,
/// among `shadows` (read from this consumer's tenant namespace `tenant_ns` on provider
/// `provider`), that was made for this very pod (same namespace, name and uid). Never a pod
/// outside `tenant_ns`.
pub fn target(
    want: &PodRef,
    uid: &str,
    provider: &str,
    tenant_ns: &str,
    shadows: &[ShadowPod],
) -> Result<Target, Refused> {
    shadows
        .iter()
        .find(|s| {
            let h = &s.spec.home;
            s.namespace().as_deref() == Some(tenant_ns)
                && h.namespace == want.namespace
                && h.name == want.name
                && h.uid == uid
        })
        .map(|s| Target {
            namespace: tenant_ns.to_owned(),
            name: s.name_any(),
        })
        .ok_or_else(|| Refused::NotOffloaded {
            pod: want.clone(),
            provider: provider.to_owned(),
        })
}

/// The provider API path (and query) of an exec, attach or port-forward on `t`; None for
/// other routes.
pub fn provider_path(route: &Route, t: &Target) -> Option<String> {
    let base = format!("/api/v1/namespaces/{}/pods/{}", t.namespace, t.name);
    let streams = |sub: &str, container: &str, o: &Options| {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("container", container);
        for (k, on) in [
            ("stdin", o.stdin),
            ("stdout", o.stdout),
            ("stderr", o.stderr),
            ("tty", o.tty),
        ] {
            if on {
                q.append_pair(k, "true");
            }
        }
        for c in &o.command {
            q.append_pair("command", c);
        }
        format!("{base}/{sub}?{}", q.finish())
    };
    match route {
        Route::Exec {
            container, options, ..
        } => Some(streams("exec", container, options)),
        Route::Attach {
            container, options, ..
        } => Some(streams("attach", container, options)),
        Route::PortForward { .. } => Some(format!("{base}/portforward")),
        Route::Healthz | Route::Metrics | Route::Logs { .. } => None,
    }
}

/// Headers of an upgrade request that go on to the provider: the upgrade itself and its
/// sub-protocol negotiation (SPDY's `X-Stream-Protocol-Version`, WebSocket's handshake), so
/// that the two ends agree on the protocol and the relay only carries bytes. Credentials and
/// everything else stay here.
pub fn upgrade_request_headers(name: &str) -> bool {
    const PASS: &[&str] = &[
        "connection",
        "upgrade",
        "x-stream-protocol-version",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-protocol",
        "sec-websocket-extensions",
    ];
    PASS.iter().any(|p| name.eq_ignore_ascii_case(p))
}

/// Headers of the provider's answer to an upgrade that go back to the client.
pub fn upgrade_response_headers(name: &str) -> bool {
    const PASS: &[&str] = &[
        "connection",
        "upgrade",
        "x-stream-protocol-version",
        "x-accepted-stream-protocol-versions",
        "sec-websocket-accept",
        "sec-websocket-protocol",
        "sec-websocket-extensions",
        "content-type",
    ];
    PASS.iter().any(|p| name.eq_ignore_ascii_case(p))
}

#[cfg(test)]
mod tests {
    use fabric_api::offloading::v1alpha1::{HomePod, PodTemplate, ShadowPodSpec};
    use k8s_openapi::api::core::v1::PodSpec;
    use kube::api::ObjectMeta;

    use super::*;

    fn pr(ns: &str, name: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn metrics_are_served_to_a_get() {
        assert!(matches!(
            Route::parse("GET", "/metrics", ""),
            Ok(Route::Metrics)
        ));
        assert_eq!(
            Route::parse("POST", "/metrics", "").unwrap_err(),
            Refused::Method
        );
        // Not the kubelet's other metrics paths: nothing of that sort is kept here.
        assert!(matches!(
            Route::parse("GET", "/metrics/cadvisor", ""),
            Err(Refused::NotServed(_))
        ));
        assert!(Route::Metrics.pod().is_none());
    }

    #[test]
    fn kubelet_paths_as_the_api_server_sends_them() {
        assert!(matches!(
            Route::parse("GET", "/healthz", ""),
            Ok(Route::Healthz)
        ));
        let r = Route::parse(
            "GET",
            "/containerLogs/shop/web/app",
            "follow=true&tailLines=10&timestamps=true",
        )
        .unwrap();
        let Route::Logs {
            pod,
            container,
            params,
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!((pod, container.as_str()), (pr("shop", "web"), "app"));
        assert!(params.follow && params.timestamps && !params.previous);
        assert_eq!(params.tail_lines, Some(10));

        let r = Route::parse(
            "POST",
            "/exec/shop/web/app",
            "command=sh&command=-c&command=exit+3&input=1&output=1&error=1",
        )
        .unwrap();
        let Route::Exec { options, .. } = &r else {
            panic!("{r:?}")
        };
        assert_eq!(options.command, ["sh", "-c", "exit 3"]);
        assert!(matches!(
            Route::parse("POST", "/attach/shop/web/app", "output=1").unwrap(),
            Route::Attach { .. }
        ));
        let r = Route::parse("GET", "/portForward/shop/web", "").unwrap();
        assert_eq!(r.pod(), Some(&pr("shop", "web")));
        assert!(matches!(r, Route::PortForward { .. }));
    }

    #[test]
    fn what_is_not_served_says_why() {
        fn err(m: &str, p: &str, q: &str) -> Refused {
            Route::parse(m, p, q).unwrap_err()
        }
        assert_eq!(err("GET", "/pods", "").status(), 404);
        assert_eq!(err("GET", "/stats/summary", "").status(), 404);
        assert_eq!(err("GET", "/containerLogs/a/b", "").status(), 404);
        assert_eq!(err("POST", "/containerLogs/a/b/c", "").status(), 405);
        assert_eq!(err("DELETE", "/exec/a/b/c", "command=x").status(), 405);
        // Names that could move the provider path elsewhere.
        for bad in ["..", "a..b", "A", "%2F", "a%2Fb", "-a", ""] {
            let e = err("GET", &format!("/containerLogs/{bad}/b/c"), "");
            assert_eq!(e, Refused::BadName(bad.to_owned()));
        }
        assert_eq!(
            err("POST", "/exec/a/b/c", "output=1"),
            Refused::Options(OptionsError::NoCommand)
        );
    }

    #[test]
    fn log_queries() {
        let p = log_params(
            "previous=true&sinceSeconds=30&limitBytes=100&container=ignored&pretty=true",
        )
        .unwrap();
        assert!(p.previous && !p.follow);
        assert_eq!((p.since_seconds, p.limit_bytes), (Some(30), Some(100)));
        let p = log_params("sinceTime=2026-11-26T12:00:00Z").unwrap();
        assert_eq!(
            p.since_time,
            Some("2026-11-26T12:00:00Z".parse::<Timestamp>().unwrap())
        );
        assert!(matches!(
            log_params("tailLines=-1"),
            Err(Refused::BadQuery(_))
        ));
        assert!(matches!(
            log_params("sinceTime=yesterday"),
            Err(Refused::BadQuery(_))
        ));
        assert!(matches!(
            log_params("sinceTime=2026-11-26T12:00:00Z&sinceSeconds=1"),
            Err(Refused::BadQuery(_))
        ));
        let p = log_params("").unwrap();
        assert!(!p.follow && !p.previous && !p.timestamps);
        assert_eq!(
            (p.tail_lines, p.since_seconds, p.since_time),
            (None, None, None)
        );
    }

    fn home(node: Option<&str>, uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_owned),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn shadow(ns: &str, name: &str, home_ns: &str, home_name: &str, uid: &str) -> ShadowPod {
        let mut s = ShadowPod::new(
            name,
            ShadowPodSpec {
                cluster_id: "consumer".into(),
                home: HomePod {
                    namespace: home_ns.into(),
                    name: home_name.into(),
                    uid: uid.into(),
                },
                pod: PodTemplate::default(),
            },
        );
        s.metadata.namespace = Some(ns.into());
        s
    }

    #[test]
    fn only_this_nodes_offloaded_pods_in_the_tenant_namespace() {
        let want = pr("shop", "web");
        let t = |home: Option<&Pod>, shadows: &[ShadowPod]| {
            let uid = bound_here(&want, home, "vnode")?;
            target(&want, &uid, "prov", "fabric-tenant-c", shadows)
        };
        let ours = shadow("fabric-tenant-c", "shop-web-x", "shop", "web", "u1");
        assert_eq!(
            t(
                Some(&home(Some("vnode"), "u1")),
                std::slice::from_ref(&ours)
            ),
            Ok(Target {
                namespace: "fabric-tenant-c".into(),
                name: "shop-web-x".into()
            })
        );
        assert_eq!(t(None, &[]), Err(Refused::NoPod(want.clone())));
        let other = t(
            Some(&home(Some("real-node"), "u1")),
            std::slice::from_ref(&ours),
        )
        .unwrap_err();
        assert_eq!(other.status(), 404);
        assert!(
            other
                .to_string()
                .contains("not bound to virtual node vnode")
        );
        assert!(t(Some(&home(None, "u1")), std::slice::from_ref(&ours)).is_err());
        // A ShadowPod of an earlier pod of the same name (another uid), or another pod's.
        for s in [
            shadow("fabric-tenant-c", "x", "shop", "web", "u0"),
            shadow("fabric-tenant-c", "x", "shop", "db", "u1"),
            shadow("fabric-tenant-c", "x", "other", "web", "u1"),
            // Outside the tenant namespace: never.
            shadow("kube-system", "x", "shop", "web", "u1"),
        ] {
            assert_eq!(
                t(Some(&home(Some("vnode"), "u1")), &[s]),
                Err(Refused::NotOffloaded {
                    pod: want.clone(),
                    provider: "prov".into()
                })
            );
        }
    }

    #[test]
    fn provider_requests() {
        let tgt = Target {
            namespace: "fabric-tenant-c".into(),
            name: "shop-web".into(),
        };
        let r = Route::parse(
            "POST",
            "/exec/shop/web/app",
            "command=sh&command=-c&command=echo+a%26b&input=1&output=1&tty=1",
        )
        .unwrap();
        assert_eq!(
            provider_path(&r, &tgt).unwrap(),
            "/api/v1/namespaces/fabric-tenant-c/pods/shop-web/exec?container=app&stdin=true&\
             stdout=true&tty=true&command=sh&command=-c&command=echo+a%26b"
        );
        let r = Route::parse("POST", "/attach/shop/web/app", "output=1&error=1").unwrap();
        assert_eq!(
            provider_path(&r, &tgt).unwrap(),
            "/api/v1/namespaces/fabric-tenant-c/pods/shop-web/attach?container=app&stdout=true&\
             stderr=true"
        );
        let r = Route::parse("POST", "/portForward/shop/web", "").unwrap();
        assert_eq!(
            provider_path(&r, &tgt).unwrap(),
            "/api/v1/namespaces/fabric-tenant-c/pods/shop-web/portforward"
        );
        assert_eq!(provider_path(&Route::Healthz, &tgt), None);
    }

    #[test]
    fn only_the_upgrade_crosses() {
        for h in [
            "Connection",
            "upgrade",
            "X-Stream-Protocol-Version",
            "Sec-WebSocket-Key",
        ] {
            assert!(upgrade_request_headers(h), "{h}");
        }
        for h in [
            "authorization",
            "x-remote-user",
            "impersonate-user",
            "cookie",
            "host",
        ] {
            assert!(!upgrade_request_headers(h), "{h}");
        }
        assert!(upgrade_response_headers("X-Stream-Protocol-Version"));
        assert!(!upgrade_response_headers("set-cookie"));
    }
}
