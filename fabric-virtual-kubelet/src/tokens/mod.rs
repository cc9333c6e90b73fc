//! Service-account tokens of pods offloaded into a twin namespace (issue 20), pure; [`edge`]
//! requests them and keeps their Secrets.
//!
//! Each projected `serviceAccountToken` source of a home pod (the admission-injected
//! `kube-api-access-*` volume's included) becomes a token requested from the *home* API server
//! for the pod's service account, bound to the home pod, and delivered in the twin as an
//! Opaque Secret of its own ([`secret_name`]: the pod's name and a hash of the source); the
//! source becomes a projection of that Secret, its key `token` at the source's path. In the
//! same volume, the root CA bundle points at the home one reflected into the twin
//! ([`REMOTE_ROOT_CA`]), and a downward-API `metadata.namespace` item (which would read the
//! twin's name there) becomes the Secret's key `namespace`, the home namespace written out.
//!
//! Tokens are refreshed once 80% of their life has gone ([`refresh_at`]), from what the Secret
//! records (issue and expiry), so that a restarted virtual kubelet carries on from it. A pod
//! annotated [`service_account_token::OPT_OUT`] `never` gets none: its token volumes are dropped, as for a pod
//! offloaded pod by pod (the ShadowPod forge does that to every token volume left).
use std::collections::BTreeMap;

use fabric_api::names::{
    self,
    service_account_token::{self, EXPIRES, ISSUED, POD_UID, SECRET_PREFIX},
};
use k8s_openapi::{
    ByteString,
    api::core::v1::{
        KeyToPath, Pod, PodSpec, Secret, SecretProjection, ServiceAccountTokenProjection, Volume,
        VolumeProjection,
    },
    jiff::Timestamp,
};
use kube::api::ObjectMeta;

use crate::configs::{REMOTE_ROOT_CA, ROOT_CA};

pub mod edge;

/// The lifetime asked for a token when its source names none, as the API server's default.
pub const DEFAULT_EXPIRATION: i64 = 3600;
/// The shortest lifetime the API server grants.
pub const MIN_EXPIRATION: i64 = 600;
/// The share of a token's life after which it is refreshed (as kubelet and Liqo do).
pub const REFRESH_FRACTION: f64 = 0.8;
/// The Secret key holding the token.
pub const TOKEN_KEY: &str = "token";
/// The Secret key holding the home namespace, for a downward-API `metadata.namespace` item.
pub const NAMESPACE_KEY: &str = "namespace";
/// The service account of a pod that names none.
const DEFAULT_ACCOUNT: &str = "default";

/// One token a pod needs: what to ask the home API server, and where it goes in the twin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The Secret in the twin.
    pub secret: String,
    /// The home service account.
    pub account: String,
    /// The audiences asked (empty: the API server's own).
    pub audiences: Vec<String>,
    /// The lifetime asked, in seconds.
    pub expiration_seconds: i64,
    /// The home namespace, written out in the Secret (key [`NAMESPACE_KEY`]) when the volume
    /// read it through the downward API.
    pub namespace: Option<String>,
}

/// Whether the pod opted out of tokens (annotation [`service_account_token::OPT_OUT`] `never`).
pub fn opted_out(pod: &Pod) -> bool {
    service_account_token::opted_out(&pod.metadata)
}

/// The lifetime to ask for a source asking `requested` seconds: the API server's default and
/// minimum applied.
pub fn expiration(requested: Option<i64>) -> i64 {
    requested.unwrap_or(DEFAULT_EXPIRATION).max(MIN_EXPIRATION)
}

/// The twin Secret of token source `source` of volume `volume` of pod `pod`: the pod's name
/// and a hash of all of it, under [`SECRET_PREFIX`], at most 253 characters.
pub fn secret_name(pod: &str, volume: &str, source: &ServiceAccountTokenProjection) -> String {
    const MAX: usize = 253;
    let hash = names::fnv(&format!(
        "{pod}\0{volume}\0{}\0{}\0{}",
        source.audience.as_deref().unwrap_or(""),
        expiration(source.expiration_seconds),
        source.path
    ));
    let hash = format!("{:010x}", hash & 0xff_ffff_ffff);
    let room = MAX - SECRET_PREFIX.len() - 1 - hash.len();
    let pod = pod[..pod.len().min(room)].trim_end_matches(['-', '.']);
    format!("{SECRET_PREFIX}{pod}.{hash}")
}

/// The token Secrets (named under [`SECRET_PREFIX`]) that `spec`, a pod spec as it runs in a
/// twin ([`rewrite`]), mounts through its projected volumes.
pub fn secrets_mounted(spec: &PodSpec) -> Vec<String> {
    let mut out: Vec<String> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.secret.as_ref().map(|s| s.name.clone()))
        .filter(|n| n.starts_with(SECRET_PREFIX))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `spec` (of home pod `pod`) as it runs in a twin: every token source a projection of its
/// Secret, the root CA bundle the home one, and the tokens that takes. A pod that opted out,
/// or has no token source, keeps its token volumes as they are (the forge drops them) and
/// needs no token.
pub fn rewrite(pod: &Pod, spec: &mut PodSpec) -> Vec<Wanted> {
    let home_ns = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let account = spec
        .service_account_name
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| DEFAULT_ACCOUNT.to_owned());
    let out = opted_out(pod);
    let mut wanted = Vec::new();
    for v in spec.volumes.iter_mut().flatten() {
        root_ca_home(v);
        if out {
            continue;
        }
        let Some(sources) = v.projected.as_mut().and_then(|p| p.sources.as_mut()) else {
            continue;
        };
        if !sources.iter().any(|s| s.service_account_token.is_some()) {
            continue;
        }
        // The downward API's namespace items of this volume: read from the first token's
        // Secret instead.
        let mut namespace_items = Vec::new();
        for s in sources.iter_mut() {
            if let Some(d) = s.downward_api.as_mut() {
                let items = d.items.take().unwrap_or_default();
                let (ns, rest): (Vec<_>, Vec<_>) = items.into_iter().partition(|i| {
                    i.field_ref
                        .as_ref()
                        .is_some_and(|f| f.field_path == "metadata.namespace")
                });
                namespace_items.extend(ns);
                d.items = (!rest.is_empty()).then_some(rest);
            }
        }
        sources.retain(|s| s.downward_api.as_ref().is_none_or(|d| d.items.is_some()));
        let mut first = true;
        for s in sources.iter_mut() {
            let Some(t) = s.service_account_token.take() else {
                continue;
            };
            let secret = secret_name(&pod_name, &v.name, &t);
            let mut items = vec![KeyToPath {
                key: TOKEN_KEY.to_owned(),
                path: t.path.clone(),
                ..Default::default()
            }];
            let namespace = (first && !namespace_items.is_empty()).then(|| {
                items.extend(namespace_items.drain(..).map(|i| KeyToPath {
                    key: NAMESPACE_KEY.to_owned(),
                    path: i.path,
                    mode: i.mode,
                    ..Default::default()
                }));
                home_ns.clone()
            });
            first = false;
            *s = VolumeProjection {
                secret: Some(SecretProjection {
                    name: secret.clone(),
                    items: Some(items),
                    optional: Some(false),
                }),
                ..Default::default()
            };
            wanted.push(Wanted {
                secret,
                account: account.clone(),
                audiences: t.audience.into_iter().filter(|a| !a.is_empty()).collect(),
                expiration_seconds: expiration(t.expiration_seconds),
                namespace,
            });
        }
    }
    wanted
}

/// A volume's references to the root CA bundle, pointed at the home one in the twin (the
/// provider's own `kube-root-ca.crt` is there under the usual name).
fn root_ca_home(v: &mut Volume) {
    if let Some(cm) = v.config_map.as_mut().filter(|c| c.name == ROOT_CA) {
        cm.name = REMOTE_ROOT_CA.to_owned();
    }
    for s in v
        .projected
        .iter_mut()
        .flat_map(|p| p.sources.iter_mut().flatten())
    {
        if let Some(cm) = s.config_map.as_mut().filter(|c| c.name == ROOT_CA) {
            cm.name = REMOTE_ROOT_CA.to_owned();
        }
    }
}

/// When a token issued at `issued` (by our clock) and expiring at `expires` (the API
/// server's), asked for `requested` seconds, is refreshed: after [`REFRESH_FRACTION`] of its
/// life. The life is counted from our clock and capped at what was asked, so that a home API
/// server whose clock runs ahead or behind ours cannot make us wait past the token's end; a
/// token that expired at birth (a clock far behind) is due at once.
pub fn refresh_at(issued: Timestamp, expires: Timestamp, requested: i64) -> Timestamp {
    let life = (expires.as_second() - issued.as_second()).clamp(0, requested.max(0));
    let after = (life as f64 * REFRESH_FRACTION) as i64;
    Timestamp::from_second(issued.as_second() + after).unwrap_or(issued)
}

/// What a pod's token Secret in the twin says about its token, now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// No Secret: a token is requested.
    Missing,
    /// A Secret someone else made (without our marks): left alone, the pod waits.
    NotOurs,
    /// Ours, for another pod of that name (an earlier one), or unreadable: replaced.
    Stale,
    /// Good until this time.
    Fresh(Timestamp),
    /// Past its refresh time.
    Due,
}

/// The state of `secret` (the twin's, if any; `ours`: it carries our marks) for the pod of
/// UID `uid` and token `want`, at `now`.
pub fn state(
    secret: Option<&Secret>,
    ours: bool,
    uid: &str,
    want: &Wanted,
    now: Timestamp,
) -> State {
    let Some(s) = secret else {
        return State::Missing;
    };
    if !ours {
        return State::NotOurs;
    }
    let a = s.metadata.annotations.as_ref();
    let get = |k: &str| a.and_then(|a| a.get(k)).map(String::as_str);
    let time = |k: &str| get(k).and_then(|v| v.parse::<Timestamp>().ok());
    let has_token = s.data.as_ref().is_some_and(|d| d.contains_key(TOKEN_KEY));
    let (Some(issued), Some(expires), Some(true), true) = (
        time(ISSUED),
        time(EXPIRES),
        get(POD_UID).map(|u| u == uid),
        has_token,
    ) else {
        return State::Stale;
    };
    let at = refresh_at(issued, expires, want.expiration_seconds);
    if now >= at {
        State::Due
    } else {
        State::Fresh(at)
    }
}

/// The token Secret for `want`, holding `token` issued at `issued` and expiring at
/// `expires`, for the pod of UID `uid`, with `labels` (our marks).
pub fn secret(
    want: &Wanted,
    token: &str,
    uid: &str,
    issued: Timestamp,
    expires: Timestamp,
    labels: BTreeMap<String, String>,
) -> Secret {
    let mut data = BTreeMap::from([(TOKEN_KEY.to_owned(), ByteString(token.as_bytes().to_vec()))]);
    if let Some(ns) = &want.namespace {
        data.insert(NAMESPACE_KEY.to_owned(), ByteString(ns.as_bytes().to_vec()));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(want.secret.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (ISSUED.to_owned(), issued.to_string()),
                (EXPIRES.to_owned(), expires.to_string()),
                (POD_UID.to_owned(), uid.to_owned()),
            ])),
            ..Default::default()
        },
        data: Some(data),
        type_: Some("Opaque".to_owned()),
        ..Default::default()
    }
}

/// How long until the earliest of `times`, from `now` (at least a second), if any.
pub fn until_earliest(
    times: impl IntoIterator<Item = Timestamp>,
    now: Timestamp,
) -> Option<std::time::Duration> {
    let t = times.into_iter().min()?;
    let secs = (t.as_second() - now.as_second()).max(1);
    Some(std::time::Duration::from_secs(secs as u64))
}

#[cfg(test)]
mod tests {
    use fabric_api::names::service_account_token::OPT_OUT;
    use serde_json::json;

    use super::*;

    fn pod(annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "annotations": annotations},
            "spec": {
                "serviceAccountName": "reader",
                "containers": [{"name": "main", "image": "echo", "volumeMounts": [
                    {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                    {"name": "vault", "mountPath": "/vault"},
                ]}],
                "volumes": [
                    {"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                    ]}},
                    {"name": "vault", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "vault-token", "audience": "vault", "expirationSeconds": 60}},
                        {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                    ]}},
                    {"name": "ca", "configMap": {"name": "kube-root-ca.crt"}},
                    {"name": "data", "emptyDir": {}},
                ],
            },
        }))
        .unwrap()
    }

    fn rewritten(p: &Pod) -> (PodSpec, Vec<Wanted>) {
        let mut spec = p.spec.clone().unwrap();
        let w = rewrite(p, &mut spec);
        (spec, w)
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn each_token_source_becomes_a_secret_of_its_own_in_the_volume() {
        let (spec, wanted) = rewritten(&pod(json!({})));
        // What a ShadowPod mounts names its tokens (an orphan's go with it).
        let mut named: Vec<String> = wanted.iter().map(|w| w.secret.clone()).collect();
        named.sort();
        assert_eq!(secrets_mounted(&spec), named);
        let v = serde_json::to_value(&spec.volumes).unwrap();
        let api = &v[0]["projected"];
        assert_eq!(api["defaultMode"], 420, "{api}");
        let first = &wanted[0];
        assert_eq!(
            api["sources"],
            json!([
                {"secret": {"name": first.secret, "optional": false, "items": [
                    {"key": "token", "path": "token"}, {"key": "namespace", "path": "namespace"}]}},
                {"configMap": {"name": "fabric-home.kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            ]),
            "the namespace from the Secret, the root CA the home one"
        );
        assert_eq!(
            first,
            &Wanted {
                secret: first.secret.clone(),
                account: "reader".into(),
                audiences: vec![],
                expiration_seconds: 3607,
                namespace: Some("shop".into()),
            }
        );
        let vault = &wanted[1];
        assert_eq!(vault.audiences, vec!["vault".to_owned()]);
        assert_eq!(vault.expiration_seconds, MIN_EXPIRATION, "at least 600 s");
        assert_eq!(vault.namespace, None);
        assert_eq!(
            v[1]["projected"]["sources"],
            json!([
                {"secret": {"name": vault.secret, "optional": false, "items": [{"key": "token", "path": "vault-token"}]}},
                {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            ]),
            "other downward-API items stay"
        );
        assert_eq!(v[2]["configMap"]["name"], "fabric-home.kube-root-ca.crt");
        assert_eq!(v[3], json!({"name": "data", "emptyDir": {}}));
        assert_ne!(first.secret, vault.secret);
        assert!(
            first.secret.starts_with("fabric-token.web."),
            "{}",
            first.secret
        );
        // No token source left for the forge to drop: the mounts stay.
        assert!(
            spec.volumes
                .iter()
                .flatten()
                .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()))
                .all(|s| s.service_account_token.is_none())
        );
    }

    #[test]
    fn an_opted_out_pod_or_one_without_token_sources_gets_no_token() {
        let p = pod(json!({OPT_OUT: "never"}));
        let (spec, wanted) = rewritten(&p);
        assert!(wanted.is_empty());
        let v = serde_json::to_value(&spec.volumes).unwrap();
        assert_eq!(
            v[0]["projected"]["sources"][0]["serviceAccountToken"]["path"], "token",
            "left for the forge to drop"
        );
        let mut p = pod(json!({}));
        let spec = p.spec.as_mut().unwrap();
        spec.automount_service_account_token = Some(false);
        spec.volumes.as_mut().unwrap().truncate(0);
        assert!(rewritten(&p).1.is_empty());
        // The default account when the pod names none.
        let mut p = pod(json!({OPT_OUT: "sometimes"}));
        p.spec.as_mut().unwrap().service_account_name = None;
        assert!(rewritten(&p).1.iter().all(|w| w.account == "default"));
    }

    #[test]
    fn secret_names_are_deterministic_distinct_and_bounded() {
        let src = |path: &str, aud: Option<&str>, exp: Option<i64>| ServiceAccountTokenProjection {
            path: path.into(),
            audience: aud.map(str::to_owned),
            expiration_seconds: exp,
            ..Default::default()
        };
        let a = secret_name("web", "v", &src("token", None, None));
        assert_eq!(a, secret_name("web", "v", &src("token", None, Some(3600))));
        for other in [
            secret_name("web", "v", &src("t2", None, None)),
            secret_name("web", "v", &src("token", Some("x"), None)),
            secret_name("web", "v", &src("token", None, Some(7200))),
            secret_name("web", "w", &src("token", None, None)),
            secret_name("web2", "v", &src("token", None, None)),
        ] {
            assert_ne!(a, other);
        }
        let long = "p".repeat(253);
        let n = secret_name(&long, "v", &src("token", None, None));
        assert!(n.len() <= 253, "{}", n.len());
        let mut longer = long.clone();
        longer.push('q');
        assert_ne!(n, secret_name(&longer[1..], "v", &src("token", None, None)));
    }

    #[test]
    fn refresh_comes_at_80_percent_of_the_life() {
        let issued = ts("2026-11-28T00:00:00Z");
        assert_eq!(
            refresh_at(issued, ts("2026-11-28T01:00:00Z"), 3600),
            ts("2026-11-28T00:48:00Z")
        );
        assert_eq!(
            refresh_at(issued, ts("2026-11-28T00:10:00Z"), 600),
            ts("2026-11-28T00:08:00Z")
        );
    }

    #[test]
    fn clock_skew_never_delays_a_refresh_past_the_token_s_end() {
        let issued = ts("2026-11-28T00:00:00Z");
        // The home API server's clock an hour ahead: the life counted is what was asked.
        assert_eq!(
            refresh_at(issued, ts("2026-11-28T02:00:00Z"), 3600),
            ts("2026-11-28T00:48:00Z")
        );
        // Behind: the token ends sooner by our clock, refreshed sooner.
        assert_eq!(
            refresh_at(issued, ts("2026-11-28T00:30:00Z"), 3600),
            ts("2026-11-28T00:24:00Z")
        );
        // Expired at birth: due at once.
        assert_eq!(refresh_at(issued, ts("2026-11-27T23:00:00Z"), 3600), issued);
    }

    #[test]
    fn a_secret_is_missing_stale_fresh_or_due() {
        let want = &rewritten(&pod(json!({}))).1[0];
        let issued = ts("2026-11-28T00:00:00Z");
        let s = secret(
            want,
            "jwt",
            "u-1",
            issued,
            ts("2026-11-28T01:00:00Z"),
            BTreeMap::new(),
        );
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        assert_eq!(s.data.as_ref().unwrap()["namespace"].0, b"shop");
        let at = |now: &str| state(Some(&s), true, "u-1", want, ts(now));
        assert_eq!(state(None, true, "u-1", want, issued), State::Missing);
        assert_eq!(state(Some(&s), false, "u-1", want, issued), State::NotOurs);
        assert_eq!(
            state(Some(&s), true, "u-2", want, issued),
            State::Stale,
            "an earlier pod's"
        );
        assert_eq!(
            at("2026-11-28T00:30:00Z"),
            State::Fresh(ts("2026-11-28T00:48:00Z"))
        );
        assert_eq!(at("2026-11-28T00:48:00Z"), State::Due);
        assert_eq!(at("2026-11-28T02:00:00Z"), State::Due, "expired");
        let mut broken = s.clone();
        broken
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(EXPIRES.into(), "soon".into());
        assert_eq!(
            state(Some(&broken), true, "u-1", want, issued),
            State::Stale
        );
        assert_eq!(
            until_earliest(
                [ts("2026-11-28T00:48:00Z"), ts("2026-11-28T00:50:00Z")],
                issued
            ),
            Some(std::time::Duration::from_secs(48 * 60))
        );
        assert_eq!(
            until_earliest([issued], ts("2026-11-28T00:01:00Z")),
            Some(std::time::Duration::from_secs(1))
        );
        assert_eq!(until_earliest([], issued), None);
    }
}
