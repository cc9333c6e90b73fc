//! The authentication service's contract, shared by the server and the consumer's client:
//! one JSON request (the consumer's cluster id, the peering token and a CSR), one JSON answer
//! (the signed certificate and how to reach the provider's API server), or a typed refusal
//! with an HTTP status and a message that says what to do.
//!
//! [`parse_request`] is the only code that reads a request's bytes; it is pure and fuzzed
//! (`fuzz/fuzz_targets/auth_request.rs`).
use std::fmt;

use fabric_http::https::is_json;
use serde::{Deserialize, Serialize};

/// Where the service takes requests (`POST`).
pub const PATH: &str = "/v1/authenticate";
/// Where a consumer renews its certificate (`POST`), authenticated by that certificate
/// (TLS client authentication) instead of a token.
pub const RENEW_PATH: &str = "/v1/renew";
/// The only content type accepted and answered.
pub const CONTENT_TYPE: &str = "application/json";
/// Bodies larger than this are refused with 413 before they are read further: a CSR for a
/// 4096-bit RSA key is under 2 KiB.
pub const MAX_BODY: usize = 64 * 1024;
/// Tokens are 64 hex characters (`fabricctl generate peer-command`); anything much longer is
/// not one of ours.
pub const MAX_TOKEN: usize = 256;
/// A PEM CSR is a few KiB at most.
pub const MAX_CSR: usize = 16 * 1024;

/// What a consumer sends.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthRequest {
    /// The consumer's cluster id (a DNS label): its user on the provider is
    /// `fabric_api::names::user::consumer(cluster_id)`.
    pub cluster_id: String,
    /// The peering token from the provider's peer command.
    pub token: String,
    /// A PKCS#10 certificate signing request (PEM) for a key the consumer keeps.
    pub csr_pem: String,
    /// The provider the consumer means to peer with (its peer command's `--cluster-id`): a
    /// request meant for another provider is refused before anything is written. Absent in
    /// requests of clients that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_cluster_id: Option<String>,
}

impl fmt::Debug for AuthRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token: requests end up in logs and error messages.
        f.debug_struct("AuthRequest")
            .field("cluster_id", &self.cluster_id)
            .field("provider_cluster_id", &self.provider_cluster_id)
            .field("csr_pem", &format_args!("{} bytes", self.csr_pem.len()))
            .finish_non_exhaustive()
    }
}

/// A renewal: a CSR for a new key; who asks is the TLS client certificate's subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewRequest {
    pub csr_pem: String,
}

/// What the provider answers to a good request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthResponse {
    /// The consumer's client certificate (PEM), signed by the provider's cluster CA.
    pub certificate_pem: String,
    /// The provider's API server, as consumers reach it.
    pub api_server_url: String,
    /// The CA (PEM) that the provider's API server certificate chains to.
    pub ca_pem: String,
    /// The consumer's tenant namespace on the provider.
    pub tenant_namespace: String,
    /// The provider's cluster id.
    pub provider_cluster_id: String,
}

/// Why a request was refused; each maps to one HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// Not JSON, or not the request's shape (400).
    MalformedRequest,
    /// The cluster id is not a DNS label (400).
    InvalidClusterId,
    /// The CSR does not parse, is not signed by its key, names someone else, or has a key
    /// that is not accepted (400).
    InvalidCsr,
    /// Wrong or revoked token (401).
    InvalidToken,
    /// The token was good but expired (401).
    ExpiredToken,
    /// The consumer's cluster id is this provider's own (409).
    SameCluster,
    /// The request names another provider than this one (400).
    WrongProvider,
    /// The cluster id already has a tenant here: it renews with its certificate, or peers
    /// again once the provider admin removed the tenant (409).
    AlreadyPeered,
    /// The cluster id is taken here by something the authentication service did not create
    /// for a consumer: a peer this cluster consumes from, a namespace of someone else (409).
    IdTaken,
    /// A one-time token that was used already (401).
    TokenUsed,
    /// A token issued for another cluster id (401).
    TokenBound,
    /// An object the service would write under a name of its own exists with content the
    /// service did not write (409).
    Conflict,
    /// A renewal without a valid client certificate of a consumer (401).
    Unauthenticated,
    /// A renewal by a consumer whose tenant was removed (403).
    Revoked,
    /// Not `POST` (405).
    MethodNotAllowed,
    /// Not [`PATH`] (404).
    NotFound,
    /// The body took too long to arrive (408).
    Timeout,
    /// The body is larger than [`MAX_BODY`] (413).
    PayloadTooLarge,
    /// Not `application/json` (415).
    UnsupportedMediaType,
    /// The provider failed (its API server, the CSR signer) (500).
    Internal,
    /// The CSR was not signed in time; retrying the same request is safe (503).
    Unavailable,
}

impl Reason {
    pub fn status(self) -> u16 {
        match self {
            Reason::MalformedRequest
            | Reason::InvalidClusterId
            | Reason::InvalidCsr
            | Reason::WrongProvider => 400,
            Reason::InvalidToken
            | Reason::ExpiredToken
            | Reason::Unauthenticated
            | Reason::TokenUsed
            | Reason::TokenBound => 401,
            Reason::Revoked => 403,
            Reason::NotFound => 404,
            Reason::MethodNotAllowed => 405,
            Reason::Timeout => 408,
            Reason::SameCluster | Reason::AlreadyPeered | Reason::IdTaken | Reason::Conflict => 409,
            Reason::PayloadTooLarge => 413,
            Reason::UnsupportedMediaType => 415,
            Reason::Internal => 500,
            Reason::Unavailable => 503,
        }
    }
}

/// A refusal, as sent in the body of every non-2xx answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub reason: Reason,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    pub fn status(&self) -> u16 {
        self.reason.status()
    }

    /// The refusal as a JSON body.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a refusal serializes")
    }
}

/// A JSON body of a bounded size, read as a `what` (its name in the refusal).
fn read_json<T: serde::de::DeserializeOwned>(
    content_type: Option<&str>,
    body: &[u8],
    what: &str,
) -> Result<T, Refusal> {
    if !is_json(content_type) {
        return Err(Refusal::new(
            Reason::UnsupportedMediaType,
            format!("send the request as {CONTENT_TYPE}"),
        ));
    }
    if body.len() > MAX_BODY {
        return Err(too_large());
    }
    serde_json::from_slice(body).map_err(|e| {
        Refusal::new(
            Reason::MalformedRequest,
            format!(
                "the request is not a valid {what}: {}",
                printable(&e.to_string())
            ),
        )
    })
}

/// Reads a request: `content_type` is the header's value, `body` the whole body (the server
/// has already refused bodies over [`MAX_BODY`]). Checks shape and bounds only; the token and
/// the CSR are checked by [`crate::validate`].
pub fn parse_request(content_type: Option<&str>, body: &[u8]) -> Result<AuthRequest, Refusal> {
    let req: AuthRequest = read_json(content_type, body, "authentication request")?;
    if !fabric_api::identity::is_dns_label(&req.cluster_id) {
        return Err(Refusal::new(
            Reason::InvalidClusterId,
            "clusterId must be a DNS label (at most 63 lowercase letters, digits and '-')",
        ));
    }
    if req.token.is_empty() || req.token.len() > MAX_TOKEN {
        return Err(Refusal::new(
            Reason::InvalidToken,
            "the token is not valid: ask the provider admin for a new peer command",
        ));
    }
    if req.csr_pem.len() > MAX_CSR {
        return Err(Refusal::new(
            Reason::InvalidCsr,
            format!("the CSR is larger than {MAX_CSR} bytes"),
        ));
    }
    if let Some(p) = &req.provider_cluster_id
        && !fabric_api::identity::is_dns_label(p)
    {
        return Err(Refusal::new(
            Reason::WrongProvider,
            "providerClusterId must be a DNS label (the peer command's --cluster-id)",
        ));
    }
    Ok(req)
}

/// Reads a renewal request (same rules as [`parse_request`]).
pub fn parse_renew(content_type: Option<&str>, body: &[u8]) -> Result<RenewRequest, Refusal> {
    let req: RenewRequest = read_json(content_type, body, "renewal request")?;
    if req.csr_pem.len() > MAX_CSR {
        return Err(Refusal::new(
            Reason::InvalidCsr,
            format!("the CSR is larger than {MAX_CSR} bytes"),
        ));
    }
    Ok(req)
}

/// Longest echo of a parser's message: it may quote what the client sent.
const MAX_ECHO: usize = 200;

/// `s` cut to [`MAX_ECHO`] characters, control characters replaced: fit for a one-line
/// message and a terminal.
fn printable(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(MAX_ECHO)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.chars().count() > MAX_ECHO {
        out.push('…');
    }
    out
}

/// The refusal of a body over [`MAX_BODY`].
pub fn too_large() -> Refusal {
    Refusal::new(
        Reason::PayloadTooLarge,
        format!("the request body is larger than {MAX_BODY} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn a_good_request_parses() {
        let b = body(serde_json::json!({
            "clusterId": "alpha", "token": "ab12", "csrPem": "-----BEGIN CERTIFICATE REQUEST-----"
        }));
        let r = parse_request(Some("application/json; charset=utf-8"), &b).unwrap();
        assert_eq!(r.cluster_id, "alpha");
        assert!(
            !format!("{r:?}").contains("ab12"),
            "the token stays out of logs"
        );
    }

    #[test]
    fn refusals_say_why_with_their_status() {
        let good = serde_json::json!({"clusterId": "alpha", "token": "t", "csrPem": "x"});
        let cases: Vec<(Option<&str>, Vec<u8>, u16)> = vec![
            (Some("text/plain"), body(good.clone()), 415),
            (None, body(good.clone()), 415),
            (Some(CONTENT_TYPE), b"{not json".to_vec(), 400),
            (Some(CONTENT_TYPE), b"[]".to_vec(), 400),
            (
                Some(CONTENT_TYPE),
                body(serde_json::json!({"clusterId": "alpha", "token": "t"})),
                400,
            ),
            (
                Some(CONTENT_TYPE),
                body(
                    serde_json::json!({"clusterId": "alpha", "token": "t", "csrPem": "x", "admin": true}),
                ),
                400,
            ),
            (
                Some(CONTENT_TYPE),
                body(serde_json::json!({"clusterId": "Alpha_1", "token": "t", "csrPem": "x"})),
                400,
            ),
            (
                Some(CONTENT_TYPE),
                body(serde_json::json!({"clusterId": "alpha", "token": "", "csrPem": "x"})),
                401,
            ),
            (
                Some(CONTENT_TYPE),
                body(
                    serde_json::json!({"clusterId": "alpha", "token": "t", "csrPem": "x".repeat(MAX_CSR + 1)}),
                ),
                400,
            ),
            (Some(CONTENT_TYPE), vec![b' '; MAX_BODY + 1], 413),
        ];
        let long_field = format!("{{\"{}\n\": 1}}", "x".repeat(10_000));
        let e = parse_request(Some(CONTENT_TYPE), long_field.as_bytes()).unwrap_err();
        assert!(
            e.message.len() < 400 && !e.message.contains('\n'),
            "{}",
            e.message
        );
        for (ct, b, status) in cases {
            let e = parse_request(ct, &b).unwrap_err();
            assert_eq!(e.status(), status, "{e:?}");
            assert!(!e.message.is_empty());
            let back: Refusal = serde_json::from_str(&e.to_json()).unwrap();
            assert_eq!(back, e);
        }
    }
}
