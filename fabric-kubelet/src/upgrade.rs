//! The HTTP/1.1 upgrade to SPDY/3.1 as Kubernetes does it: `Connection: Upgrade`,
//! `Upgrade: SPDY/3.1`, and the sub-protocol negotiated through `X-Stream-Protocol-Version`
//! (the first of the client's, in its order, that the server speaks). [`negotiate`] is the
//! pure decision; [`accept`] answers a hyper request and hands over the session.
use std::future::Future;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{HeaderMap, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;

use crate::{
    conn::{self, Incoming},
    frame::Limits,
};

pub const PROTOCOL_HEADER: &str = "X-Stream-Protocol-Version";
pub const ACCEPTED_PROTOCOLS_HEADER: &str = "X-Accepted-Stream-Protocol-Versions";
pub const SPDY: &str = "SPDY/3.1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("unable to upgrade: missing upgrade headers in request")]
    NotAnUpgrade,
    #[error("unable to upgrade: {PROTOCOL_HEADER} is required")]
    NoProtocol,
    #[error(
        "unable to upgrade: unable to negotiate protocol: client supports {client:?}, server accepts {server:?}"
    )]
    NoCommonProtocol {
        client: Vec<String>,
        server: Vec<String>,
    },
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::NoCommonProtocol { .. } => StatusCode::FORBIDDEN,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// The sub-protocol to speak with a client that sent `headers`, among `server`'s.
pub fn negotiate(headers: &HeaderMap, server: &[&'static str]) -> Result<&'static str, Refusal> {
    let has = |name: header::HeaderName, want: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(want)))
        })
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::UPGRADE, SPDY) {
        return Err(Refusal::NotAnUpgrade);
    }
    let client: Vec<String> = headers
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if client.is_empty() {
        return Err(Refusal::NoProtocol);
    }
    client
        .iter()
        .find_map(|c| server.iter().find(|s| **s == c.as_str()).copied())
        .ok_or_else(|| Refusal::NoCommonProtocol {
            client,
            server: server.iter().map(|s| s.to_string()).collect(),
        })
}

/// Answers `req`: on success `101 Switching Protocols` and a future that resolves, once hyper
/// has sent it, to the negotiated protocol's session; else the refusal as a response (the
/// connection continues as HTTP). The server connection must be served `with_upgrades()`.
#[allow(clippy::type_complexity)]
pub fn accept<B>(
    req: &mut Request<B>,
    server: &[&'static str],
    limits: Limits,
) -> Result<
    (
        &'static str,
        Response<Full<Bytes>>,
        impl Future<Output = Result<Incoming, hyper::Error>> + Send + 'static,
    ),
    Box<Response<Full<Bytes>>>,
> {
    let protocol = match negotiate(req.headers(), server) {
        Ok(p) => p,
        Err(r) => {
            let mut b = Response::builder()
                .status(r.status())
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8");
            if matches!(r, Refusal::NoCommonProtocol { .. }) {
                for s in server {
                    b = b.header(ACCEPTED_PROTOCOLS_HEADER, *s);
                }
            }
            return Err(Box::new(
                b.body(Full::new(Bytes::from(r.to_string() + "\n")))
                    .expect("a valid response"),
            ));
        }
    };
    let on = hyper::upgrade::on(req);
    let resp = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, SPDY)
        .header(PROTOCOL_HEADER, protocol)
        .body(Full::new(Bytes::new()))
        .expect("a valid response");
    let session = async move {
        let up = on.await?;
        Ok(conn::serve(TokioIo::new(up), limits))
    };
    Ok((protocol, resp, session))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn negotiates_as_kubernetes() {
        let up = [("connection", "Upgrade"), ("upgrade", "SPDY/3.1")];
        let with = |protos: &[&str]| {
            let mut p: Vec<(&str, &str)> = up.to_vec();
            p.extend(protos.iter().map(|v| (PROTOCOL_HEADER, *v)));
            headers(&p)
        };
        let server = &["v4.channel.k8s.io"];
        assert_eq!(
            negotiate(&with(&["v4.channel.k8s.io", "v3.channel.k8s.io"]), server),
            Ok("v4.channel.k8s.io")
        );
        // The client's order decides.
        assert_eq!(negotiate(&with(&["b, a"]), &["a", "b"]), Ok("b"));
        assert_eq!(negotiate(&with(&[]), server), Err(Refusal::NoProtocol));
        let r = negotiate(&with(&["v2.channel.k8s.io"]), server).unwrap_err();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            negotiate(&headers(&[(PROTOCOL_HEADER, "v4.channel.k8s.io")]), server),
            Err(Refusal::NotAnUpgrade)
        );
        assert_eq!(
            negotiate(
                &headers(&[
                    ("connection", "keep-alive, upgrade"),
                    ("upgrade", "spdy/3.1"),
                    (PROTOCOL_HEADER, "v4.channel.k8s.io")
                ]),
                server
            ),
            Ok("v4.channel.k8s.io")
        );
    }
}
