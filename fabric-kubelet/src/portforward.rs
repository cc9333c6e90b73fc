//! Port forwarding over SPDY, protocol `portforward.k8s.io`, server side. For every
//! connection it forwards, the client opens two streams with the same `requestID` and `port`
//! headers: `streamType: error` (the server writes a message there if it cannot connect) and
//! `streamType: data` (the bytes, both ways). [`Pairer`] matches them (pure); [`next_request`]
//! reads them off a session.
use std::collections::HashMap;

use tokio::io::{AsyncWriteExt as _, DuplexStream};

use crate::{
    conn::{Incoming, Stream},
    frame::Headers,
};

pub const PROTOCOL: &str = "portforward.k8s.io";
pub const PROTOCOLS: &[&str] = &[PROTOCOL];

/// Unpaired streams kept at once; a client that opens more halves is cut off.
const MAX_PENDING: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PairError {
    #[error("stream without a valid {0} header")]
    Header(&'static str),
    #[error("request {0:?} already has a {1} stream")]
    Duplicate(String, &'static str),
    #[error("request {0:?}: the data and error streams name different ports")]
    PortMismatch(String),
    #[error("more than {MAX_PENDING} unpaired streams")]
    TooManyPending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data,
    Error,
}

/// One forwarded connection's two streams.
#[derive(Debug)]
pub struct Pair<T> {
    pub request_id: String,
    pub port: u16,
    pub data: T,
    pub error: T,
}

/// Matches data and error streams by request id.
#[derive(Debug)]
pub struct Pairer<T> {
    pending: HashMap<String, (u16, Option<T>, Option<T>)>,
}

impl<T> Default for Pairer<T> {
    fn default() -> Self {
        Pairer {
            pending: HashMap::new(),
        }
    }
}

impl<T> Pairer<T> {
    /// Adds a stream; the pair once both halves are there.
    pub fn add(&mut self, headers: &Headers, stream: T) -> Result<Option<Pair<T>>, PairError> {
        let kind = match headers.get("streamType") {
            Some("data") => Kind::Data,
            Some("error") => Kind::Error,
            _ => return Err(PairError::Header("streamType")),
        };
        let port: u16 = headers
            .get("port")
            .and_then(|p| p.parse().ok())
            .filter(|p| *p > 0)
            .ok_or(PairError::Header("port"))?;
        let id = headers
            .get("requestID")
            .filter(|s| !s.is_empty() && s.len() <= 64)
            .ok_or(PairError::Header("requestID"))?
            .to_owned();
        if !self.pending.contains_key(&id) && self.pending.len() >= MAX_PENDING {
            return Err(PairError::TooManyPending);
        }
        let e = self.pending.entry(id.clone()).or_insert((port, None, None));
        if e.0 != port {
            return Err(PairError::PortMismatch(id));
        }
        let slot = match kind {
            Kind::Data => &mut e.1,
            Kind::Error => &mut e.2,
        };
        if slot.is_some() {
            let k = if kind == Kind::Data { "data" } else { "error" };
            return Err(PairError::Duplicate(id, k));
        }
        *slot = Some(stream);
        if e.1.is_some() && e.2.is_some() {
            let (port, data, error) = self.pending.remove(&id).expect("just seen");
            return Ok(Some(Pair {
                request_id: id,
                port,
                data: data.expect("checked"),
                error: error.expect("checked"),
            }));
        }
        Ok(None)
    }
}

/// The next complete request of a session; None once the client is gone. A stream that
/// breaks the rules ends the session with that error.
pub async fn next_request(
    incoming: &mut Incoming,
    pairer: &mut Pairer<DuplexStream>,
) -> Result<Option<Pair<DuplexStream>>, PairError> {
    loop {
        let Some(Stream { headers, io, .. }) = incoming.next().await else {
            return Ok(None);
        };
        if let Some(p) = pairer.add(&headers, io)? {
            return Ok(Some(p));
        }
    }
}

impl Pair<DuplexStream> {
    /// Reports that the connection could not be made, and closes both streams.
    pub async fn fail(mut self, message: &str) {
        let _ = self.error.write_all(message.as_bytes()).await;
        let _ = self.error.shutdown().await;
        let _ = self.data.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(t: &str, port: &str, id: &str) -> Headers {
        Headers::default()
            .with("streamType", t)
            .with("port", port)
            .with("requestID", id)
    }

    #[test]
    fn pairs_by_request_id_in_any_order() {
        let mut p = Pairer::default();
        assert!(p.add(&h("error", "8080", "0"), "e0").unwrap().is_none());
        assert!(p.add(&h("data", "9090", "1"), "d1").unwrap().is_none());
        let a = p.add(&h("data", "8080", "0"), "d0").unwrap().unwrap();
        assert_eq!(
            (a.port, a.data, a.error, a.request_id.as_str()),
            (8080, "d0", "e0", "0")
        );
        let b = p.add(&h("error", "9090", "1"), "e1").unwrap().unwrap();
        assert_eq!((b.port, b.data, b.error), (9090, "d1", "e1"));
    }

    #[test]
    fn refuses_broken_streams() {
        let mut p = Pairer::default();
        assert_eq!(
            p.add(&h("stdin", "1", "0"), ()).unwrap_err(),
            PairError::Header("streamType")
        );
        assert_eq!(
            p.add(&h("data", "0", "0"), ()).unwrap_err(),
            PairError::Header("port")
        );
        assert_eq!(
            p.add(&h("data", "70000", "0"), ()).unwrap_err(),
            PairError::Header("port")
        );
        assert_eq!(
            p.add(&h("data", "80", ""), ()).unwrap_err(),
            PairError::Header("requestID")
        );
        p.add(&h("data", "80", "5"), ()).unwrap();
        assert_eq!(
            p.add(&h("data", "80", "5"), ()).unwrap_err(),
            PairError::Duplicate("5".into(), "data")
        );
        assert_eq!(
            p.add(&h("error", "81", "5"), ()).unwrap_err(),
            PairError::PortMismatch("5".into())
        );
        for i in 0..MAX_PENDING - 1 {
            p.add(&h("data", "80", &format!("x{i}")), ()).unwrap();
        }
        assert_eq!(
            p.add(&h("data", "80", "y"), ()).unwrap_err(),
            PairError::TooManyPending
        );
    }
}
