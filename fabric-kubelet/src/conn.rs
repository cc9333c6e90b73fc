//! A SPDY/3.1 server session over an upgraded connection: the I/O around [`Session`],
//! [`Decoder`] and [`Encoder`]. Each stream the client opens comes out of [`Incoming`] as a
//! [`Stream`] whose `io` is an in-memory duplex: reading it gives the client's DATA (EOF at
//! the client's FIN or reset), writing it sends DATA, shutting it down (or dropping it) sends
//! FIN. The connection ends when the client closes it or goes away, or when the application
//! has dropped [`Incoming`] and every stream: then what was written is sent, a GOAWAY follows,
//! and the socket is closed.
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, DuplexStream, WriteHalf},
    sync::mpsc,
};
use tracing::debug;

use crate::{
    frame::{Decoder, Encoder, Frame, Headers, Limits},
    session::{Event, Session},
};

/// Bytes buffered per stream and direction before the other side waits.
const STREAM_BUFFER: usize = 64 << 10;
/// Streams open at once on one connection.
const MAX_STREAMS: usize = 256;

/// A stream the client opened.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub io: DuplexStream,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.id)
            .field("headers", &self.headers)
            .finish()
    }
}

/// The streams the client opens, in order.
pub struct Incoming {
    rx: mpsc::Receiver<Stream>,
    // Keeps the writer alive (see the module comment).
    _writer: mpsc::Sender<Frame>,
}

impl Incoming {
    /// The next stream; None once the client has closed the connection or gone away.
    pub async fn next(&mut self) -> Option<Stream> {
        self.rx.recv().await
    }
}

type Shared = Arc<Mutex<Session>>;

/// Serves a SPDY session on `io` (the connection after `101 Switching Protocols`).
pub fn serve<T>(io: T, limits: Limits) -> Incoming
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let session: Shared = Arc::new(Mutex::new(Session::new(MAX_STREAMS)));
    let (ftx, frx) = mpsc::channel::<Frame>(64);
    let (stx, srx) = mpsc::channel::<Stream>(16);
    let reader = tokio::spawn(read_loop(rd, limits, session.clone(), ftx.downgrade(), stx));
    tokio::spawn(write_loop(wr, frx, session, reader));
    Incoming {
        rx: srx,
        _writer: ftx,
    }
}

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Session> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

async fn write_loop<W: AsyncWrite>(
    wr: W,
    mut frames: mpsc::Receiver<Frame>,
    session: Shared,
    reader: tokio::task::JoinHandle<()>,
) {
    tokio::pin!(wr);
    let mut enc = Encoder::new();
    let mut buf = Vec::new();
    let result: std::io::Result<()> = async {
        while let Some(f) = frames.recv().await {
            buf.clear();
            enc.encode(&f, &mut buf).map_err(std::io::Error::other)?;
            // Batch what is queued before flushing.
            while buf.len() < 64 << 10
                && let Ok(f) = frames.try_recv()
            {
                enc.encode(&f, &mut buf).map_err(std::io::Error::other)?;
            }
            wr.write_all(&buf).await?;
            wr.flush().await?;
        }
        // Nobody can send any more: the session is over.
        buf.clear();
        let goaway = lock(&session).go_away(false);
        enc.encode(&goaway, &mut buf)
            .map_err(std::io::Error::other)?;
        wr.write_all(&buf).await?;
        wr.shutdown().await
    }
    .await;
    if let Err(e) = result {
        debug!(error = %e, "SPDY connection write");
    }
    reader.abort();
}

async fn read_loop<R: AsyncRead>(
    rd: R,
    limits: Limits,
    session: Shared,
    frames: mpsc::WeakSender<Frame>,
    streams: mpsc::Sender<Stream>,
) {
    tokio::pin!(rd);
    let mut dec = Decoder::new(limits);
    let mut inbound: HashMap<u32, WriteHalf<DuplexStream>> = HashMap::new();
    let mut buf = vec![0u8; 32 << 10];
    'conn: loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        dec.push(&buf[..n]);
        loop {
            let frame = match dec.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    debug!(error = %e, "SPDY protocol error");
                    let ga = lock(&session).go_away(true);
                    if let Some(tx) = frames.upgrade() {
                        let _ = tx.send(ga).await;
                    }
                    break 'conn;
                }
            };
            let (events, replies) = lock(&session).receive(frame);
            if !replies.is_empty() {
                let Some(tx) = frames.upgrade() else {
                    break 'conn;
                };
                for r in replies {
                    if tx.send(r).await.is_err() {
                        break 'conn;
                    }
                }
            }
            for ev in events {
                match ev {
                    Event::Opened {
                        stream,
                        headers,
                        fin,
                    } => {
                        let Some(tx) = frames.upgrade() else {
                            break 'conn;
                        };
                        let (app, ours) = tokio::io::duplex(STREAM_BUFFER);
                        let (r, mut w) = tokio::io::split(ours);
                        if fin {
                            let _ = w.shutdown().await;
                        } else {
                            inbound.insert(stream, w);
                        }
                        tokio::spawn(outbound(stream, r, session.clone(), tx));
                        let s = Stream {
                            id: stream,
                            headers,
                            io: app,
                        };
                        // An application that no longer listens gets no new streams; they
                        // end (FIN) when dropped here.
                        let _ = streams.send(s).await;
                    }
                    Event::Data { stream, data } => {
                        if let Some(w) = inbound.get_mut(&stream)
                            && w.write_all(&data).await.is_err()
                        {
                            // The application dropped the stream: nothing reads it.
                            inbound.remove(&stream);
                        }
                    }
                    Event::Finished { stream } | Event::Reset { stream } => {
                        if let Some(mut w) = inbound.remove(&stream) {
                            let _ = w.shutdown().await;
                        }
                    }
                    Event::GoAway => break 'conn,
                }
            }
        }
    }
    for (_, mut w) in inbound.drain() {
        let _ = w.shutdown().await;
    }
}

/// Sends what the application writes on one stream, then FIN.
async fn outbound(
    stream: u32,
    mut r: tokio::io::ReadHalf<DuplexStream>,
    session: Shared,
    tx: mpsc::Sender<Frame>,
) {
    let mut buf = vec![0u8; 32 << 10];
    loop {
        let (data, fin) = match r.read(&mut buf).await {
            Ok(0) | Err(_) => (Bytes::new(), true),
            Ok(n) => (Bytes::copy_from_slice(&buf[..n]), false),
        };
        let Some(f) = lock(&session).send(stream, data, fin) else {
            return;
        };
        if tx.send(f).await.is_err() || fin {
            return;
        }
    }
}
