//! The webhook's wire format, free of I/O: what a request's head may be (which of its
//! endpoints), an AdmissionReview (`admission.k8s.io/v1`) of a ShadowPod, of another object
//! a consumer creates or of a pod, the verdict (with a JSON patch for a pod) as an
//! AdmissionReview out. Anything
//! else is a client error (4xx with a plain-text reason): the API server only ever sends
//! well-formed reviews, so a malformed one is not a decision to make.
use fabric_api::{names, offloading::v1alpha1::ShadowPod};
use hyper::Method;
use kube::{
    Resource,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
    },
};
use serde::de::DeserializeOwned;

use crate::pod_placement::Refusal;

/// The largest review read: the object and its old version, each up to the API server's
/// 1.5 MiB object limit, and the envelope.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// A request refused before any decision, with its HTTP status.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadRequest {
    pub status: u16,
    pub message: String,
}

fn bad(status: u16, message: impl Into<String>) -> BadRequest {
    BadRequest {
        status,
        message: message.into(),
    }
}

/// Who may send reviews: the API server, known by its client certificate (chained to the
/// webhook's `--client-ca` by the TLS handshake) and by the certificate's CommonName, so that
/// another holder of a certificate from the same CA (a consumer's, when that CA is the
/// cluster's) is refused too. Checked before anything else, with no detail in the answer.
pub fn check_caller(cert_der: Option<&[u8]>, names: &[String]) -> Result<(), BadRequest> {
    use x509_parser::prelude::{FromDer as _, X509Certificate};
    let Some(der) = cert_der else {
        return Err(bad(401, "a client certificate is required"));
    };
    let allowed = X509Certificate::from_der(der).is_ok_and(|(_, c)| {
        c.subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok())
            .any(|cn| names.iter().any(|n| n == cn))
    });
    if allowed {
        Ok(())
    } else {
        Err(bad(403, "only the API server may send reviews"))
    }
}

/// What a review is about, by the path it was posted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// [`names::webhook::SHADOWPODS_PATH`]: ShadowPods created or updated.
    ShadowPods,
    /// [`names::webhook::TENANT_OBJECTS_PATH`]: the other objects a consumer creates.
    TenantObjects,
    /// [`names::webhook::PODS_PATH`] (consumer): pods created in offloaded namespaces, placed
    /// by [`crate::pod_placement`].
    Pods,
    /// [`names::webhook::CLAIMS_PATH`]: a consumer's claims, charged against the storage
    /// granted ([`crate::shadowpod::claims`]).
    Claims,
    /// [`names::webhook::TETHERED_PODS_PATH`] (provider): pods created here, refused while
    /// the cluster is tethered ([`crate::tethered`]).
    TetheredPods,
}

/// What a request's head allows before its body is read: the endpoint it is for.
pub fn check_head(
    method: &Method,
    path: &str,
    content_type: Option<&str>,
    content_length: Option<&str>,
) -> Result<Endpoint, BadRequest> {
    let endpoint = match path {
        names::webhook::SHADOWPODS_PATH => Endpoint::ShadowPods,
        names::webhook::TENANT_OBJECTS_PATH => Endpoint::TenantObjects,
        names::webhook::PODS_PATH => Endpoint::Pods,
        names::webhook::CLAIMS_PATH => Endpoint::Claims,
        names::webhook::TETHERED_PODS_PATH => Endpoint::TetheredPods,
        _ => {
            return Err(bad(
                404,
                format!(
                    "no such endpoint; POST {}, {}, {}, {} or {}",
                    names::webhook::SHADOWPODS_PATH,
                    names::webhook::TENANT_OBJECTS_PATH,
                    names::webhook::PODS_PATH,
                    names::webhook::CLAIMS_PATH,
                    names::webhook::TETHERED_PODS_PATH
                ),
            ));
        }
    };
    if method != Method::POST {
        return Err(bad(405, format!("use POST {path}")));
    }
    if !fabric_http::https::is_json(content_type) {
        return Err(bad(415, "send an AdmissionReview as application/json"));
    }
    if let Some(len) = content_length
        && len
            .trim()
            .parse::<u64>()
            .map_or(true, |n| n > MAX_BODY as u64)
    {
        return Err(bad(
            413,
            format!("the body is larger than {MAX_BODY} bytes"),
        ));
    }
    Ok(endpoint)
}

/// The request inside an `admission.k8s.io/v1` AdmissionReview of a ShadowPod.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<ShadowPod>, BadRequest> {
    parse_as(body, "a ShadowPod")
}

/// A ShadowPod review as it came: a request of ShadowPods, or one whose object does not
/// parse as a ShadowPod. The CRD's schema keeps the pod spec open (the pod's API version
/// decides it), so the API server stores whatever JSON a consumer writes there unless this
/// webhook refuses it, and refuses it as a denial that says where, not as a failed call.
#[derive(Debug)]
pub enum ShadowPodReview {
    Parsed(Box<AdmissionRequest<ShadowPod>>),
    Mistyped {
        request: Box<AdmissionRequest<DynamicObject>>,
        why: String,
    },
}

/// [`parse`], a well-formed review whose object is no ShadowPod told apart from garbage.
pub fn parse_shadow_pod(body: &[u8]) -> Result<ShadowPodReview, BadRequest> {
    match parse(body) {
        Ok(request) => Ok(ShadowPodReview::Parsed(Box::new(request))),
        Err(bad) => {
            let request = parse_object(body).map_err(|_| bad)?;
            let why = [&request.object, &request.old_object]
                .into_iter()
                .flatten()
                .find_map(mistyped)
                .unwrap_or_else(|| "the review does not parse as one of ShadowPods".to_owned());
            Ok(ShadowPodReview::Mistyped {
                request: Box::new(request),
                why,
            })
        }
    }
}

/// Where and why `object` is no ShadowPod, if it is not.
fn mistyped(object: &DynamicObject) -> Option<String> {
    let value = serde_json::to_value(object).ok()?;
    serde_path_to_error::deserialize::<_, ShadowPod>(value)
        .err()
        .map(|e| format!("{}: {}", e.path(), e.inner()))
}

/// The refusal of a ShadowPod that does not parse, as a 400 that names the field.
pub fn answer_mistyped(request: &AdmissionRequest<DynamicObject>, why: &str) -> Vec<u8> {
    let mut r = AdmissionResponse::from(request).deny(format!("the ShadowPod is malformed: {why}"));
    r.result.code = 400;
    r.result.reason = "BadRequest".to_owned();
    serde_json::to_vec(&r.into_review()).expect("an AdmissionReview serializes")
}

/// The request inside an `admission.k8s.io/v1` AdmissionReview of any object.
pub fn parse_object(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, BadRequest> {
    parse_as(body, "an object")
}

fn parse_as<K: Resource + DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> Result<AdmissionRequest<K>, BadRequest> {
    let review: AdmissionReview<K> = serde_json::from_slice(body)
        .map_err(|e| bad(400, format!("not an AdmissionReview of {what}: {e}")))?;
    if review.types.api_version != "admission.k8s.io/v1" || review.types.kind != "AdmissionReview" {
        return Err(bad(
            400,
            format!(
                "expected an admission.k8s.io/v1 AdmissionReview, got {:?} {:?}",
                review.types.api_version, review.types.kind
            ),
        ));
    }
    review
        .try_into()
        .map_err(|_| bad(400, "the AdmissionReview carries no request"))
}

/// The AdmissionReview answering `req` with `verdict` (JSON).
pub fn answer<K: Resource, D: std::fmt::Display>(
    req: &AdmissionRequest<K>,
    verdict: &Result<(), D>,
) -> Vec<u8> {
    let response = AdmissionResponse::from(req);
    let response = match verdict {
        Ok(()) => response,
        Err(denial) => refused(response, denial),
    };
    serde_json::to_vec(&response.into_review()).expect("an AdmissionReview serializes")
}

/// The AdmissionReview answering `req` with a mutation: admitted with the JSON patch, if any,
/// or refused with the reason.
pub fn answer_patch<K: Resource>(
    req: &AdmissionRequest<K>,
    verdict: &Result<Option<json_patch::Patch>, Refusal>,
) -> Vec<u8> {
    let response = AdmissionResponse::from(req);
    let response = match verdict {
        Ok(None) => response,
        Ok(Some(patch)) => match response.clone().with_patch(patch.clone()) {
            Ok(r) => r,
            Err(e) => refused(response, format!("the patch does not serialize: {e}")),
        },
        Err(refusal) => refused(response, refusal),
    };
    serde_json::to_vec(&response.into_review()).expect("an AdmissionReview serializes")
}

fn refused(response: AdmissionResponse, reason: impl ToString) -> AdmissionResponse {
    let mut r = response.deny(reason);
    // 403 as RBAC refusals are: the request may not be done (422 would say the object is
    // malformed, which it is not).
    r.result.code = 403;
    r.result.reason = "Forbidden".to_owned();
    r
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::shadowpod::admission::Denial;

    #[test]
    fn a_mistyped_shadow_pod_is_refused_naming_the_field() {
        let object = json!({
            "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowPod",
            "metadata": {"name": "web", "namespace": "fabric-tenant-alpha"},
            "spec": {"clusterId": "alpha",
                     "home": {"namespace": "default", "name": "web", "uid": "u"},
                     "pod": {"spec": {"hostPID": "yes", "containers": []}}},
        });
        let body = serde_json::to_vec(&review(object)).unwrap();
        let ShadowPodReview::Mistyped { request, why } = parse_shadow_pod(&body).unwrap() else {
            panic!("parsed")
        };
        assert!(
            why.starts_with("spec.pod.spec.hostPID: invalid type"),
            "{why}"
        );
        let out: Value = serde_json::from_slice(&answer_mistyped(&request, &why)).unwrap();
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 400);
        assert!(
            out["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("spec.pod.spec.hostPID"),
            "{out}"
        );
        // Garbage is still garbage.
        assert_eq!(parse_shadow_pod(b"{").unwrap_err().status, 400);
    }

    fn review(object: Value) -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "offloading.fabric.io", "version": "v1alpha1", "kind": "ShadowPod"},
                "resource": {"group": "offloading.fabric.io", "version": "v1alpha1", "resource": "shadowpods"},
                "name": "web", "namespace": "fabric-tenant-alpha",
                "operation": "CREATE",
                "userInfo": {"username": "fabric.io:consumer:alpha", "groups": ["fabric.io:consumers"]},
                "object": object,
                "oldObject": null,
                "dryRun": false,
            },
        })
    }

    #[test]
    fn only_the_named_api_server_may_call() {
        let cert = |cn: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
            params.self_signed(&key).unwrap().der().to_vec()
        };
        let names = ["kube-apiserver".to_owned()];
        assert_eq!(check_caller(None, &names).unwrap_err().status, 401);
        let consumer = cert("fabric.io:consumer:alpha");
        assert_eq!(
            check_caller(Some(&consumer), &names).unwrap_err().status,
            403
        );
        assert_eq!(
            check_caller(Some(b"garbage"), &names).unwrap_err().status,
            403
        );
        assert_eq!(check_caller(Some(&cert("kube-apiserver")), &names), Ok(()));
    }

    fn shadow() -> Value {
        json!({
            "apiVersion": "offloading.fabric.io/v1alpha1", "kind": "ShadowPod",
            "metadata": {"name": "web", "namespace": "fabric-tenant-alpha"},
            "spec": {"clusterId": "alpha", "home": {"namespace": "shop", "name": "web", "uid": "u"}, "pod": {"spec": {"containers": [{"name": "a"}]}}},
        })
    }

    #[test]
    fn a_review_round_trips_with_its_uid_and_the_reason() {
        let body = serde_json::to_vec(&review(shadow())).unwrap();
        let req = parse(&body).unwrap();
        assert_eq!(req.name, "web");
        assert_eq!(req.object.as_ref().unwrap().spec.cluster_id, "alpha");
        let out: Value = serde_json::from_slice(&answer(&req, &Ok::<(), Denial>(()))).unwrap();
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(
            out["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        assert_eq!(out["response"]["allowed"], true);
        let denial = Denial::ForeignNamespace {
            namespace: "default".into(),
            cluster: "alpha".into(),
        };
        let out: Value = serde_json::from_slice(&answer(&req, &Err(denial))).unwrap();
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 403);
        assert_eq!(
            out["response"]["status"]["message"],
            "namespace \"default\" does not belong to consumer \"alpha\""
        );
    }

    #[test]
    fn a_pod_is_answered_with_its_patch_or_the_refusal() {
        let mut r = review(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop"}, "spec": {"containers": []}}));
        r["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
        r["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "pods"});
        let req = parse_object(&serde_json::to_vec(&r).unwrap()).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/spec/tolerations", "value": []}
        ]))
        .unwrap();
        let out: Value =
            serde_json::from_slice(&answer_patch(&req, &Ok(Some(patch.clone())))).unwrap();
        assert_eq!(out["response"]["allowed"], true);
        assert_eq!(out["response"]["patchType"], "JSONPatch");
        // kube writes the patch's bytes as a list of numbers, which the API server's JSON
        // decoder takes as it takes base64.
        let sent: Vec<u8> = serde_json::from_value(out["response"]["patch"].clone()).unwrap();
        let sent: json_patch::Patch = serde_json::from_slice(&sent).unwrap();
        assert_eq!(sent, patch);
        let out: Value = serde_json::from_slice(&answer_patch(&req, &Ok(None))).unwrap();
        assert_eq!(out["response"]["allowed"], true);
        assert!(out["response"].get("patch").is_none(), "{out}");
        let refusal = Refusal::NotOffloaded {
            namespace: "shop".into(),
        };
        let out: Value =
            serde_json::from_slice(&answer_patch(&req, &Err(refusal.clone()))).unwrap();
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["message"], refusal.to_string());
    }

    #[test]
    fn garbage_and_other_reviews_are_bad_requests() {
        for body in [
            b"garbage".to_vec(),
            b"{}".to_vec(),
            serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            )
            .unwrap(),
            serde_json::to_vec(&{
                let mut r = review(shadow());
                r["apiVersion"] = "admission.k8s.io/v1beta1".into();
                r
            })
            .unwrap(),
            serde_json::to_vec(&review(json!({"spec": "not a ShadowPod"}))).unwrap(),
        ] {
            let e = parse(&body).unwrap_err();
            assert_eq!(e.status, 400, "{}: {e}", String::from_utf8_lossy(&body));
        }
    }

    #[test]
    fn the_head_is_checked_before_the_body_is_read() {
        let path = names::webhook::SHADOWPODS_PATH;
        assert_eq!(
            check_head(&Method::POST, path, Some("application/json"), Some("100")),
            Ok(Endpoint::ShadowPods)
        );
        assert_eq!(
            check_head(
                &Method::POST,
                names::webhook::TENANT_OBJECTS_PATH,
                Some("application/json"),
                None
            ),
            Ok(Endpoint::TenantObjects)
        );
        assert_eq!(
            check_head(
                &Method::POST,
                names::webhook::CLAIMS_PATH,
                Some("application/json"),
                None
            ),
            Ok(Endpoint::Claims)
        );
        assert_eq!(
            check_head(
                &Method::POST,
                names::webhook::PODS_PATH,
                Some("application/json"),
                None
            ),
            Ok(Endpoint::Pods)
        );
        assert_eq!(
            check_head(
                &Method::POST,
                names::webhook::TETHERED_PODS_PATH,
                Some("application/json"),
                None
            ),
            Ok(Endpoint::TetheredPods)
        );
        let status = |m: Method, p: &str, ct: Option<&str>, len: Option<&str>| {
            check_head(&m, p, ct, len).unwrap_err().status
        };
        assert_eq!(
            status(Method::GET, path, Some("application/json"), None),
            405
        );
        assert_eq!(
            status(Method::POST, "/", Some("application/json"), None),
            404
        );
        assert_eq!(status(Method::POST, path, Some("text/plain"), None), 415);
        assert_eq!(
            status(
                Method::POST,
                path,
                Some("application/json"),
                Some("4194305")
            ),
            413
        );
    }
}
