//! SPDY/3.1 frames, without I/O: [`Decoder`] turns bytes read from a peer into [`Frame`]s,
//! [`Encoder`] turns frames into bytes to write. Each side of a connection has one of each,
//! because SPDY compresses every header block of one direction as a single zlib stream (primed
//! with [`crate::dictionary::DICTIONARY`], one sync flush per block).
//!
//! Everything read is bounded ([`Limits`]): frame lengths, the size a header block inflates to
//! and the number of headers; a peer that exceeds them gets an error, never an allocation.
use bytes::{Buf as _, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::dictionary::DICTIONARY;

pub const VERSION: u16 = 3;

pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes (SPDY/3 §2.4.2).
pub mod rst {
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INVALID_STREAM: u32 = 2;
    pub const REFUSED_STREAM: u32 = 3;
    pub const CANCEL: u32 = 5;
    pub const INTERNAL_ERROR: u32 = 6;
    pub const STREAM_IN_USE: u32 = 8;
    pub const STREAM_ALREADY_CLOSED: u32 = 9;
    pub const FRAME_TOO_LARGE: u32 = 11;
}

/// GOAWAY status codes.
pub mod goaway {
    pub const OK: u32 = 0;
    pub const PROTOCOL_ERROR: u32 = 1;
}

/// The header block of a SYN_STREAM, SYN_REPLY or HEADERS frame: lower-case names, each once;
/// several values of one name are joined by NUL, as on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// The (first) value of `name`, compared without case as HTTP does.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.split('\0').next().unwrap_or_default())
    }

    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.0.push((name.to_ascii_lowercase(), value.to_owned()));
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub flags: u8,
    pub id: u32,
    pub value: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream: u32,
        associated: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Settings(Vec<Setting>),
    Ping(u32),
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
}

/// Hard limits on what a peer may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Payload of a DATA frame (the wire allows 16 MiB; Go peers send at most 32 KiB).
    pub max_data: usize,
    /// Payload of a control frame (a compressed header block included).
    pub max_control: usize,
    /// What one header block may inflate to.
    pub max_header_block: usize,
    /// Name/value pairs in one header block.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_data: 1 << 20,
            max_control: 64 << 10,
            max_header_block: 64 << 10,
            max_headers: 128,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("SPDY version {0} (only 3 is spoken)")]
    Version(u16),
    #[error("frame of {len} bytes exceeds the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("{kind} frame with a length of {len}")]
    BadLength { kind: &'static str, len: usize },
    #[error("{kind} frame for stream 0")]
    ZeroStream { kind: &'static str },
    #[error("header block inflates past {limit} bytes")]
    HeaderBlockTooLarge { limit: usize },
    #[error("header block with {count} headers (limit {limit})")]
    TooManyHeaders { count: u32, limit: usize },
    #[error("header block ends inside its {0}")]
    TruncatedHeaders(&'static str),
    #[error("header block with bytes after its last header")]
    TrailingHeaderBytes,
    #[error("header name {0:?} is empty, not lower case or not text")]
    BadHeaderName(String),
    #[error("header value of {0:?} is not UTF-8")]
    BadHeaderValue(String),
    #[error("header {0:?} appears twice")]
    DuplicateHeader(String),
    #[error("header block is not valid zlib for the SPDY dictionary")]
    Compression,
    #[error("header block to send exceeds the limits of a frame")]
    EncodeTooLarge,
}

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

fn parse_block(b: &[u8], max: usize) -> Result<Headers, Error> {
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

/// Writes frames for a peer.
pub struct Encoder {
    deflate: Compress,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    pub fn new() -> Self {
        let mut deflate = Compress::new(Compression::best(), true);
        deflate
            .set_dictionary(&DICTIONARY)
            .expect("a fresh compressor takes a dictionary");
        Encoder { deflate }
    }

    /// Appends the frame's bytes to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), Error> {
        let control = |out: &mut Vec<u8>, kind: u16, flags: u8, payload: &[u8]| {
            if payload.len() >= 1 << 24 {
                return Err(Error::EncodeTooLarge);
            }
            out.extend_from_slice(
                &(0x8000_0000u32 | (u32::from(VERSION) << 16) | u32::from(kind)).to_be_bytes(),
            );
            out.extend_from_slice(&((u32::from(flags) << 24) | payload.len() as u32).to_be_bytes());
            out.extend_from_slice(payload);
            Ok(())
        };
        let fin = |f: bool| if f { FLAG_FIN } else { 0 };
        match frame {
            Frame::SynStream {
                stream,
                associated,
                priority,
                flags,
                headers,
            } => {
                let mut p = Vec::new();
                p.extend_from_slice(&stream.to_be_bytes());
                p.extend_from_slice(&associated.to_be_bytes());
                p.extend_from_slice(&[priority << 5, 0]);
                self.compress(headers, &mut p)?;
                control(out, TYPE_SYN_STREAM, *flags, &p)
            }
            Frame::SynReply {
                stream,
                fin: f,
                headers,
            } => {
                let mut p = stream.to_be_bytes().to_vec();
                self.compress(headers, &mut p)?;
                control(out, TYPE_SYN_REPLY, fin(*f), &p)
            }
            Frame::Headers {
                stream,
                fin: f,
                headers,
            } => {
                let mut p = stream.to_be_bytes().to_vec();
                self.compress(headers, &mut p)?;
                control(out, TYPE_HEADERS, fin(*f), &p)
            }
            Frame::RstStream { stream, status } => {
                let p = [stream.to_be_bytes(), status.to_be_bytes()].concat();
                control(out, TYPE_RST_STREAM, 0, &p)
            }
            Frame::Settings(entries) => {
                let mut p = (entries.len() as u32).to_be_bytes().to_vec();
                for s in entries {
                    p.extend_from_slice(
                        &((u32::from(s.flags) << 24) | (s.id & 0x00ff_ffff)).to_be_bytes(),
                    );
                    p.extend_from_slice(&s.value.to_be_bytes());
                }
                control(out, TYPE_SETTINGS, 0, &p)
            }
            Frame::Ping(id) => control(out, TYPE_PING, 0, &id.to_be_bytes()),
            Frame::GoAway { last_good, status } => {
                let p = [last_good.to_be_bytes(), status.to_be_bytes()].concat();
                control(out, TYPE_GOAWAY, 0, &p)
            }
            Frame::WindowUpdate { stream, delta } => {
                let p = [stream.to_be_bytes(), delta.to_be_bytes()].concat();
                control(out, TYPE_WINDOW_UPDATE, 0, &p)
            }
            Frame::Data {
                stream,
                fin: f,
                data,
            } => {
                if data.len() >= 1 << 24 {
                    return Err(Error::EncodeTooLarge);
                }
                out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
                out.extend_from_slice(
                    &((u32::from(fin(*f)) << 24) | data.len() as u32).to_be_bytes(),
                );
                out.extend_from_slice(data);
                Ok(())
            }
        }
    }

    fn compress(&mut self, h: &Headers, out: &mut Vec<u8>) -> Result<(), Error> {
        let mut block = (h.0.len() as u32).to_be_bytes().to_vec();
        for (k, v) in &h.0 {
            for s in [k.to_ascii_lowercase().as_bytes(), v.as_bytes()] {
                let n = u32::try_from(s.len()).map_err(|_| Error::EncodeTooLarge)?;
                block.extend_from_slice(&n.to_be_bytes());
                block.extend_from_slice(s);
            }
        }
        let mut input = &block[..];
        loop {
            out.reserve(input.len() + 64);
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, out, FlushCompress::Sync)
                .map_err(|_| Error::Compression)?;
            input = &input[(self.deflate.total_in() - before) as usize..];
            // Done once everything is in and the flush left room to spare.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// What a client sends for `exec -i`: three SYN_STREAMs whose header blocks continue one
    /// zlib stream (compressed by Python's zlib at level 9 with the dictionary and a sync flush
    /// per block, as Go's framer does), stdin data, a PING.
    const CAPTURED: &str = "80030001010000280000000100000000000078f9e3c6a7c202a62346703a2b294a4dcc851625aca9a08006000000ffff800300010000001700000003000000000000c22e555c02cc2e00000000ffff800300010000001900000005000000000000c22a054ce729f9a52500000000ffff000000030100000668656c6c6f0a800300060000000400000001";

    fn all(d: &mut Decoder) -> Result<Vec<Frame>, Error> {
        let mut v = Vec::new();
        while let Some(f) = d.next_frame()? {
            v.push(f);
        }
        Ok(v)
    }

    #[test]
    fn decodes_captured_frames_byte_by_byte() {
        let bytes = hex(CAPTURED);
        let mut d = Decoder::new(Limits::default());
        let mut frames = Vec::new();
        for b in &bytes {
            d.push(std::slice::from_ref(b));
            frames.extend(all(&mut d).unwrap());
        }
        assert_eq!(d.buffered(), 0);
        let types: Vec<_> = frames
            .iter()
            .filter_map(|f| match f {
                Frame::SynStream {
                    stream,
                    flags,
                    headers,
                    ..
                } => Some((
                    *stream,
                    *flags,
                    headers.get("streamType").unwrap().to_owned(),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            types,
            [
                (1, FLAG_FIN, "error".to_owned()),
                (3, 0, "stdin".into()),
                (5, 0, "stdout".into())
            ]
        );
        assert_eq!(
            frames[3],
            Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::from_static(b"hello\n")
            }
        );
        assert_eq!(frames[4], Frame::Ping(1));
    }

    #[test]
    fn encoded_frames_decode_to_themselves() {
        let frames = vec![
            Frame::SynStream {
                stream: 1,
                associated: 0,
                priority: 7,
                flags: FLAG_FIN,
                headers: Headers::default()
                    .with("streamType", "data")
                    .with("port", "8080")
                    .with("requestID", "0"),
            },
            Frame::SynReply {
                stream: 1,
                fin: false,
                headers: Headers::default(),
            },
            Frame::Headers {
                stream: 1,
                fin: true,
                headers: Headers::default().with("x", "a\0b"),
            },
            Frame::RstStream {
                stream: 9,
                status: rst::CANCEL,
            },
            Frame::Settings(vec![Setting {
                flags: 1,
                id: 7,
                value: 65536,
            }]),
            Frame::Ping(2),
            Frame::GoAway {
                last_good: 5,
                status: goaway::OK,
            },
            Frame::WindowUpdate {
                stream: 3,
                delta: 1000,
            },
            Frame::Data {
                stream: 3,
                fin: false,
                data: Bytes::from(vec![7u8; 40_000]),
            },
        ];
        let mut e = Encoder::new();
        let mut bytes = Vec::new();
        for f in &frames {
            e.encode(f, &mut bytes).unwrap();
        }
        let mut d = Decoder::new(Limits::default());
        d.push(&bytes);
        assert_eq!(all(&mut d).unwrap(), frames);
        assert_eq!(frames[2].clone(), {
            let Frame::Headers { headers, .. } = &frames[2] else {
                unreachable!()
            };
            assert_eq!(headers.get("X"), Some("a"));
            frames[2].clone()
        });
    }

    #[test]
    fn limits_hold() {
        let lim = Limits {
            max_data: 16,
            max_control: 64,
            max_header_block: 100,
            max_headers: 2,
        };
        let mut e = Encoder::new();
        let enc = |e: &mut Encoder, f: Frame| {
            let mut b = Vec::new();
            e.encode(&f, &mut b).unwrap();
            b
        };
        let mut d = Decoder::new(lim);
        d.push(&enc(
            &mut e,
            Frame::Data {
                stream: 1,
                fin: false,
                data: Bytes::from(vec![0; 17]),
            },
        ));
        assert_eq!(d.next_frame(), Err(Error::TooLarge { len: 17, limit: 16 }));
        // Only the header, the length already refused: nothing waits for 16 MiB to arrive.
        let mut d = Decoder::new(lim);
        d.push(&[0, 0, 0, 1, 0, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_frame(), Err(Error::TooLarge { .. })));
        // Three headers where two are allowed.
        let mut e = Encoder::new();
        let h = Headers::default()
            .with("a", "1")
            .with("b", "2")
            .with("c", "3");
        let mut d = Decoder::new(lim);
        d.push(&enc(
            &mut e,
            Frame::SynReply {
                stream: 1,
                fin: false,
                headers: h,
            },
        ));
        assert!(matches!(d.next_frame(), Err(Error::TooManyHeaders { .. })));
        // A small block that inflates past the limit.
        let mut e = Encoder::new();
        let h = Headers::default().with("a", &"x".repeat(500));
        let mut d = Decoder::new(lim);
        d.push(&enc(
            &mut e,
            Frame::SynReply {
                stream: 1,
                fin: false,
                headers: h,
            },
        ));
        assert_eq!(
            d.next_frame(),
            Err(Error::HeaderBlockTooLarge { limit: 100 })
        );
    }

    #[test]
    fn refuses_malformed_frames() {
        let check = |bytes: &[u8], want: Error| {
            let mut d = Decoder::new(Limits::default());
            d.push(bytes);
            assert_eq!(d.next_frame(), Err(want), "{bytes:?}");
        };
        check(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1], Error::Version(2));
        check(
            &[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 1],
            Error::BadLength {
                kind: "PING",
                len: 3,
            },
        );
        check(
            &[0, 0, 0, 0, 0, 0, 0, 0],
            Error::ZeroStream { kind: "DATA" },
        );
        // Settings claiming more entries than the frame holds.
        check(
            &[0x80, 3, 0, 4, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff],
            Error::BadLength {
                kind: "SETTINGS",
                len: 4,
            },
        );
        // A header block that is not zlib at all.
        check(
            &[0x80, 3, 0, 2, 0, 0, 0, 8, 0, 0, 0, 1, 1, 2, 3, 4],
            Error::Compression,
        );
        // An unknown control type is skipped.
        let mut d = Decoder::new(Limits::default());
        d.push(&[
            0x80, 3, 0, 0x42, 0, 0, 0, 1, 9, 0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 3,
        ]);
        assert_eq!(d.next_frame(), Ok(Some(Frame::Ping(3))));
    }

    #[test]
    fn header_blocks_are_checked() {
        let block = |pairs: &[(&[u8], &[u8])], count: u32| {
            let mut b = count.to_be_bytes().to_vec();
            for (k, v) in pairs {
                b.extend_from_slice(&(k.len() as u32).to_be_bytes());
                b.extend_from_slice(k);
                b.extend_from_slice(&(v.len() as u32).to_be_bytes());
                b.extend_from_slice(v);
            }
            b
        };
        assert_eq!(
            parse_block(&block(&[(b"a", b"1"), (b"a", b"2")], 2), 10),
            Err(Error::DuplicateHeader("a".into()))
        );
        assert_eq!(
            parse_block(&block(&[(b"Host", b"x")], 1), 10),
            Err(Error::BadHeaderName("Host".into()))
        );
        assert_eq!(
            parse_block(&block(&[(b"a", b"1")], 2), 10),
            Err(Error::TruncatedHeaders("name length"))
        );
        assert_eq!(
            parse_block(&block(&[(b"a", b"\xff")], 1), 10),
            Err(Error::BadHeaderValue("a".into()))
        );
        let mut b = block(&[(b"a", b"1")], 1);
        b.push(0);
        assert_eq!(parse_block(&b, 10), Err(Error::TrailingHeaderBytes));
    }
}
