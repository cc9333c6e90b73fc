//! Frames into bytes to write, header blocks deflated into the direction's one zlib stream.
use flate2::{Compress, Compression, FlushCompress};

use super::{
    Error, FLAG_FIN, Frame, Headers, TYPE_GOAWAY, TYPE_HEADERS, TYPE_PING, TYPE_RST_STREAM,
    TYPE_SETTINGS, TYPE_SYN_REPLY, TYPE_SYN_STREAM, TYPE_WINDOW_UPDATE, VERSION,
};
use crate::dictionary::DICTIONARY;

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
