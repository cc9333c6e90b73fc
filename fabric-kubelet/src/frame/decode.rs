//! Bytes read from a peer into frames: the framing, the bounds of [`Limits`], and the header
//! blocks inflated from the direction's one zlib stream.
use bytes::{Buf as _, BytesMut};
use flate2::{Decompress, FlushDecompress, Status};

use super::{
    Error, FLAG_FIN, Frame, Headers, Limits, Setting, TYPE_GOAWAY, TYPE_HEADERS, TYPE_PING,
    TYPE_RST_STREAM, TYPE_SETTINGS, TYPE_SYN_REPLY, TYPE_SYN_STREAM, TYPE_WINDOW_UPDATE, VERSION,
};
use crate::dictionary::DICTIONARY;

/// Reads frames from the bytes a peer sends.
pub struct Decoder {
    limits: Limits,
    buf: BytesMut,
    inflate: Decompress,
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Decoder {
            limits,
            buf: BytesMut::new(),
            inflate: Decompress::new(true),
        }
    }

    /// Adds bytes read from the peer.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes pushed and not yet part of a returned frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, None when more bytes are needed. Control frames of unknown
    /// types are skipped, as SPDY/3 asks. After an error the connection is beyond repair (the
    /// compression context is lost): the caller sends GOAWAY and closes.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, Error> {
        loop {
            if self.buf.len() < 8 {
                return Ok(None);
            }
            let h = &self.buf[..8];
            let control = h[0] & 0x80 != 0;
            let flags = h[4];
            let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
            let limit = if control {
                self.limits.max_control
            } else {
                self.limits.max_data
            };
            if len > limit {
                return Err(Error::TooLarge { len, limit });
            }
            if self.buf.len() < 8 + len {
                return Ok(None);
            }
            let word = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
            let mut frame = self.buf.split_to(8 + len);
            frame.advance(8);
            if !control {
                let stream = word & 0x7fff_ffff;
                if stream == 0 {
                    return Err(Error::ZeroStream { kind: "DATA" });
                }
                return Ok(Some(Frame::Data {
                    stream,
                    fin: flags & FLAG_FIN != 0,
                    data: frame.freeze(),
                }));
            }
            let version = ((word >> 16) & 0x7fff) as u16;
            if version != VERSION {
                return Err(Error::Version(version));
            }
            let kind = (word & 0xffff) as u16;
            if let Some(f) = self.control(kind, flags, &frame)? {
                return Ok(Some(f));
            }
        }
    }

    fn control(&mut self, kind: u16, flags: u8, p: &[u8]) -> Result<Option<Frame>, Error> {
        let u32_at = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        let need = |name: &'static str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(Error::BadLength {
                    kind: name,
                    len: p.len(),
                })
            }
        };
        let stream_of = |name: &'static str| {
            let s = u32_at(0) & 0x7fff_ffff;
            if s == 0 {
                Err(Error::ZeroStream { kind: name })
            } else {
                Ok(s)
            }
        };
        let fin = flags & FLAG_FIN != 0;
        Ok(Some(match kind {
            TYPE_SYN_STREAM => {
                need("SYN_STREAM", p.len() >= 10)?;
                let stream = stream_of("SYN_STREAM")?;
                Frame::SynStream {
                    stream,
                    associated: u32_at(4) & 0x7fff_ffff,
                    priority: p[8] >> 5,
                    flags,
                    headers: self.headers(&p[10..])?,
                }
            }
            TYPE_SYN_REPLY => {
                need("SYN_REPLY", p.len() >= 4)?;
                let stream = stream_of("SYN_REPLY")?;
                Frame::SynReply {
                    stream,
                    fin,
                    headers: self.headers(&p[4..])?,
                }
            }
            TYPE_HEADERS => {
                need("HEADERS", p.len() >= 4)?;
                let stream = stream_of("HEADERS")?;
                Frame::Headers {
                    stream,
                    fin,
                    headers: self.headers(&p[4..])?,
                }
            }
            TYPE_RST_STREAM => {
                need("RST_STREAM", p.len() == 8)?;
                Frame::RstStream {
                    stream: stream_of("RST_STREAM")?,
                    status: u32_at(4),
                }
            }
            TYPE_SETTINGS => {
                need("SETTINGS", p.len() >= 4)?;
                let n = u32_at(0) as usize;
                need("SETTINGS", n <= (p.len() - 4) / 8 && p.len() == 4 + 8 * n)?;
                Frame::Settings(
                    (0..n)
                        .map(|i| {
                            let at = 4 + 8 * i;
                            Setting {
                                flags: p[at],
                                id: u32_at(at) & 0x00ff_ffff,
                                value: u32_at(at + 4),
                            }
                        })
                        .collect(),
                )
            }
            TYPE_PING => {
                need("PING", p.len() == 4)?;
                Frame::Ping(u32_at(0))
            }
            TYPE_GOAWAY => {
                need("GOAWAY", p.len() == 8)?;
                Frame::GoAway {
                    last_good: u32_at(0) & 0x7fff_ffff,
                    status: u32_at(4),
                }
            }
            TYPE_WINDOW_UPDATE => {
                need("WINDOW_UPDATE", p.len() == 8)?;
                Frame::WindowUpdate {
                    stream: u32_at(0) & 0x7fff_ffff,
                    delta: u32_at(4) & 0x7fff_ffff,
                }
            }
            _ => return Ok(None),
        }))
    }

    /// Inflates one header block (continuing the connection's zlib stream) and parses it.
    fn headers(&mut self, compressed: &[u8]) -> Result<Headers, Error> {
        let limit = self.limits.max_header_block;
        let mut out = Vec::with_capacity(256.min(limit));
        let mut input = compressed;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= limit {
                    return Err(Error::HeaderBlockTooLarge { limit });
                }
                out.reserve((out.len()).clamp(256, limit - out.len()));
            }
            let before_in = self.inflate.total_in();
            let r = self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let used = (self.inflate.total_in() - before_in) as usize;
            input = &input[used..];
            match r {
                Ok(Status::Ok | Status::BufError)
                    if input.is_empty() && out.len() < out.capacity() =>
                {
                    break;
                }
                Ok(Status::Ok | Status::BufError) => {
                    if used == 0 && out.len() < out.capacity() {
                        return Err(Error::Compression);
                    }
                }
                Ok(Status::StreamEnd) => {
                    if !input.is_empty() {
                        return Err(Error::Compression);
                    }
                    break;
                }
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&DICTIONARY)
                        .map_err(|_| Error::Compression)?;
                }
                Err(_) => return Err(Error::Compression),
            }
        }
        parse_block(&out, self.limits.max_headers)
    }
}

pub(super) fn parse_block(b: &[u8], max: usize) -> Result<Headers, Error> {
    let mut b = b;
    let mut take = |n: usize, what: &'static str| -> Result<&[u8], Error> {
        if b.len() < n {
            return Err(Error::TruncatedHeaders(what));
        }
        let (x, rest) = b.split_at(n);
        b = rest;
        Ok(x)
    };
    let len = |x: &[u8]| u32::from_be_bytes([x[0], x[1], x[2], x[3]]) as usize;
    let count = u32::from_be_bytes(take(4, "count")?.try_into().expect("4 bytes"));
    if count as usize > max {
        return Err(Error::TooManyHeaders { count, limit: max });
    }
    let mut out: Vec<(String, String)> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let n = len(take(4, "name length")?);
        let name = take(n, "name")?;
        let name = std::str::from_utf8(name)
            .ok()
            .filter(|s| {
                !s.is_empty()
                    && s.bytes()
                        .all(|c| c.is_ascii_graphic() && !c.is_ascii_uppercase())
            })
            .ok_or_else(|| Error::BadHeaderName(String::from_utf8_lossy(name).into_owned()))?
            .to_owned();
        let n = len(take(4, "value length")?);
        let value = std::str::from_utf8(take(n, "value")?)
            .map_err(|_| Error::BadHeaderValue(name.clone()))?
            .to_owned();
        if out.iter().any(|(k, _)| *k == name) {
            return Err(Error::DuplicateHeader(name));
        }
        out.push((name, value));
    }
    if !b.is_empty() {
        return Err(Error::TrailingHeaderBytes);
    }
    Ok(Headers(out))
}
