//! The HTTPS edge of the authentication service: TLS, HTTP/1.1, and the limits a port open
//! to other organizations needs. A connection gets a deadline for its TLS handshake, for its
//! request headers and for its body (a client dribbling bytes is cut, with 408 when it got as
//! far as the body), bodies over [`MAX_BODY`] are refused with 413 without being read, only
//! `POST` [`PATH`] and [`RENEW_PATH`] with JSON are served, and at most `max_connections` are
//! served at once. A client certificate is asked for but not required: a renewal presents
//! the consumer's current one, verified by rustls against the CA it chains to.
//! What to answer is the handler's business ([`crate::provider::Service::authenticate`]).
use std::{future::Future, sync::Arc};

use bytes::Bytes;
use fabric_http::https::{self, BodyError, Exchange, is_json, read_body};
use http_body_util::Full;
use hyper::{Method, Request, Response, header};
use tokio::net::TcpListener;

use crate::protocol::{
    AuthRequest, AuthResponse, CONTENT_TYPE, MAX_BODY, PATH, RENEW_PATH, Reason, Refusal,
    RenewRequest, parse_renew, parse_request, too_large,
};

/// One request the service answers.
#[derive(Debug)]
pub enum Call {
    Authenticate(AuthRequest),
    /// `client_cert`: the TLS client certificate (DER), verified against the client CA.
    Renew {
        client_cert: Option<Vec<u8>>,
        request: RenewRequest,
    },
}

pub use fabric_http::https::Limits;

/// What a request's head allows before its body is read: the route, the content type and
/// the declared length.
pub fn check_head(
    method: &Method,
    path: &str,
    content_type: Option<&str>,
    content_length: Option<&str>,
) -> Result<(), Refusal> {
    if path != PATH && path != RENEW_PATH {
        return Err(Refusal::new(
            Reason::NotFound,
            format!("no such endpoint; the authentication service answers POST {PATH}"),
        ));
    }
    if method != Method::POST {
        return Err(Refusal::new(
            Reason::MethodNotAllowed,
            format!("use POST {path}"),
        ));
    }
    if !is_json(content_type) {
        return Err(Refusal::new(
            Reason::UnsupportedMediaType,
            format!("send the request as {CONTENT_TYPE}"),
        ));
    }
    if let Some(len) = content_length
        && len
            .trim()
            .parse::<u64>()
            .map_or(true, |n| n > MAX_BODY as u64)
    {
        return Err(too_large());
    }
    Ok(())
}

fn json_response(status: u16, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE),
    );
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    resp
}

fn refusal_response(r: &Refusal) -> Response<Full<Bytes>> {
    json_response(r.status(), r.to_json())
}

async fn handle<H, F>(
    req: Request<hyper::body::Incoming>,
    client_cert: Option<Vec<u8>>,
    handler: &H,
    limits: Limits,
) -> Response<Full<Bytes>>
where
    H: Fn(Call) -> F,
    F: Future<Output = Result<AuthResponse, Refusal>>,
{
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header(header::CONTENT_TYPE);
    let content_length = header(header::CONTENT_LENGTH);
    if let Err(r) = check_head(
        req.method(),
        req.uri().path(),
        content_type.as_deref(),
        content_length.as_deref(),
    ) {
        return refusal_response(&r);
    }
    let renew = req.uri().path() == RENEW_PATH;
    let bytes = match read_body(req.into_body(), MAX_BODY, limits.body_timeout).await {
        Ok(b) => b,
        Err(BodyError::TooLarge(_)) => return refusal_response(&too_large()),
        Err(e @ BodyError::Timeout(_)) => {
            return refusal_response(&Refusal::new(Reason::Timeout, e.to_string()));
        }
        Err(e @ BodyError::Read(_)) => {
            return refusal_response(&Refusal::new(Reason::MalformedRequest, e.to_string()));
        }
    };
    let call = if renew {
        parse_renew(content_type.as_deref(), &bytes).map(|request| Call::Renew {
            client_cert,
            request,
        })
    } else {
        parse_request(content_type.as_deref(), &bytes).map(Call::Authenticate)
    };
    let call = match call {
        Ok(c) => c,
        Err(r) => return refusal_response(&r),
    };
    match handler(call).await {
        Ok(answer) => json_response(
            200,
            serde_json::to_string(&answer).expect("an answer serializes"),
        ),
        Err(r) => refusal_response(&r),
    }
}

/// Serves `handler` on `listener` with TLS `tls` until the task is dropped.
pub async fn serve<H, F>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    handler: H,
) where
    H: Fn(Call) -> F + Send + Sync + 'static,
    F: Future<Output = Result<AuthResponse, Refusal>> + Send + 'static,
{
    let handler = Arc::new(handler);
    https::serve(
        "auth service",
        listener,
        move || tls.clone(),
        limits,
        Exchange::Once,
        move |req, client_cert| {
            let handler = handler.clone();
            async move { handle(req, client_cert, &*handler, limits).await }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_is_checked_before_the_body_is_read() {
        let ok = check_head(&Method::POST, PATH, Some("application/json"), Some("120"));
        assert!(ok.is_ok());
        let status = |m: Method, p: &str, ct: Option<&str>, len: Option<&str>| {
            check_head(&m, p, ct, len).unwrap_err().status()
        };
        assert_eq!(status(Method::GET, PATH, Some(CONTENT_TYPE), None), 405);
        assert_eq!(status(Method::POST, "/", Some(CONTENT_TYPE), None), 404);
        assert_eq!(status(Method::POST, PATH, Some("text/plain"), None), 415);
        assert_eq!(
            status(Method::POST, PATH, Some(CONTENT_TYPE), Some("65537")),
            413
        );
        assert_eq!(
            status(Method::POST, PATH, Some(CONTENT_TYPE), Some("-1")),
            413
        );
        assert_eq!(
            status(
                Method::POST,
                PATH,
                Some(CONTENT_TYPE),
                Some("99999999999999999999999")
            ),
            413
        );
    }
}
