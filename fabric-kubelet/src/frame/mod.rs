//! SPDY/3.1 frames, without I/O: [`Decoder`] turns bytes read from a peer into [`Frame`]s,
//! [`Encoder`] turns frames into bytes to write. Each side of a connection has one of each,
//! because SPDY compresses every header block of one direction as a single zlib stream (primed
//! with [`crate::dictionary::DICTIONARY`], one sync flush per block).
//!
//! Everything read is bounded ([`Limits`]): frame lengths, the size a header block inflates to
//! and the number of headers; a peer that exceeds them gets an error, never an allocation.
use bytes::Bytes;

mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub use decode::Decoder;
pub use encode::Encoder;

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
