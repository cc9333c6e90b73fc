//! The server side of a SPDY/3.1 session as a pure state machine: frames from the client go
//! in, [`Event`]s for the application and frames to send come out. It accepts every valid
//! stream the client opens (answering SYN_REPLY at once, as Kubernetes' servers do), echoes
//! the client's PINGs, and resets what breaks the rules.
//!
//! Flow control: Kubernetes' SPDY implementation (spdystream) neither sends WINDOW_UPDATE nor
//! honours windows, so a peer that waited for them would stall after 64 KiB. This session
//! therefore ignores SETTINGS and WINDOW_UPDATE too; backpressure comes from TCP (the
//! connection stops reading while a stream's consumer is full).
use std::collections::BTreeMap;

use bytes::Bytes;

use crate::frame::{FLAG_FIN, FLAG_UNIDIRECTIONAL, Frame, Headers, goaway, rst};

/// What the application learns from the client's frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new stream; `fin`: the client will send nothing on it.
    Opened {
        stream: u32,
        headers: Headers,
        fin: bool,
    },
    Data {
        stream: u32,
        data: Bytes,
    },
    /// The client has finished sending on the stream.
    Finished {
        stream: u32,
    },
    /// The client reset the stream (or broke its rules and this session did).
    Reset {
        stream: u32,
    },
    /// The client is going away: no new streams.
    GoAway,
}

#[derive(Debug, Default)]
struct StreamState {
    /// Our side has sent FIN (or must not send).
    local_closed: bool,
    remote_closed: bool,
}

/// One session's state.
#[derive(Debug)]
pub struct Session {
    streams: BTreeMap<u32, StreamState>,
    last_client_stream: u32,
    max_streams: usize,
    going_away: bool,
}

impl Session {
    /// `max_streams`: open streams at once; more are refused.
    pub fn new(max_streams: usize) -> Self {
        Session {
            streams: BTreeMap::new(),
            last_client_stream: 0,
            max_streams,
            going_away: false,
        }
    }

    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Handles one frame from the client: events for the application, frames to send.
    pub fn receive(&mut self, frame: Frame) -> (Vec<Event>, Vec<Frame>) {
        let mut ev = Vec::new();
        let mut out = Vec::new();
        match frame {
            Frame::SynStream {
                stream,
                flags,
                headers,
                ..
            } => {
                // Client streams are odd and increase.
                if stream % 2 == 0 || stream <= self.last_client_stream {
                    out.push(Frame::RstStream {
                        stream,
                        status: rst::PROTOCOL_ERROR,
                    });
                } else if self.going_away || self.streams.len() >= self.max_streams {
                    self.last_client_stream = stream;
                    out.push(Frame::RstStream {
                        stream,
                        status: rst::REFUSED_STREAM,
                    });
                } else {
                    self.last_client_stream = stream;
                    let fin = flags & FLAG_FIN != 0;
                    self.streams.insert(
                        stream,
                        StreamState {
                            local_closed: flags & FLAG_UNIDIRECTIONAL != 0,
                            remote_closed: fin,
                        },
                    );
                    out.push(Frame::SynReply {
                        stream,
                        fin: false,
                        headers: Headers::default(),
                    });
                    ev.push(Event::Opened {
                        stream,
                        headers,
                        fin,
                    });
                }
            }
            Frame::Data { stream, fin, data } => match self.streams.get_mut(&stream) {
                Some(s) if !s.remote_closed => {
                    if !data.is_empty() {
                        ev.push(Event::Data { stream, data });
                    }
                    if fin {
                        s.remote_closed = true;
                        ev.push(Event::Finished { stream });
                        self.forget_if_done(stream);
                    }
                }
                Some(_) => {
                    self.streams.remove(&stream);
                    out.push(Frame::RstStream {
                        stream,
                        status: rst::STREAM_ALREADY_CLOSED,
                    });
                    ev.push(Event::Reset { stream });
                }
                None => out.push(Frame::RstStream {
                    stream,
                    status: rst::INVALID_STREAM,
                }),
            },
            Frame::Headers { stream, fin, .. } => {
                if fin && let Some(s) = self.streams.get_mut(&stream) {
                    if !s.remote_closed {
                        s.remote_closed = true;
                        ev.push(Event::Finished { stream });
                    }
                    self.forget_if_done(stream);
                }
            }
            Frame::RstStream { stream, .. } => {
                if self.streams.remove(&stream).is_some() {
                    ev.push(Event::Reset { stream });
                }
            }
            Frame::Ping(id) => {
                // Odd ids are the client's: answered with the same frame. Even ones would be
                // answers to our own pings, and we send none.
                if id % 2 == 1 {
                    out.push(Frame::Ping(id));
                }
            }
            Frame::GoAway { .. } => {
                self.going_away = true;
                ev.push(Event::GoAway);
            }
            // A client does not reply to streams here: none are pushed to it.
            Frame::SynReply { stream, .. } => out.push(Frame::RstStream {
                stream,
                status: rst::PROTOCOL_ERROR,
            }),
            Frame::Settings(_) | Frame::WindowUpdate { .. } => {}
        }
        (ev, out)
    }

    /// Frames carrying `data` from the application on `stream`, FIN with `fin`; none when the
    /// stream is gone or already finished on our side.
    pub fn send(&mut self, stream: u32, data: Bytes, fin: bool) -> Option<Frame> {
        let s = self.streams.get_mut(&stream)?;
        if s.local_closed {
            return None;
        }
        if fin {
            s.local_closed = true;
        }
        let f = Frame::Data { stream, fin, data };
        self.forget_if_done(stream);
        Some(f)
    }

    /// Resets a stream from our side.
    pub fn reset(&mut self, stream: u32) -> Option<Frame> {
        self.streams.remove(&stream).map(|_| Frame::RstStream {
            stream,
            status: rst::CANCEL,
        })
    }

    /// The GOAWAY that ends the session: `error` for a protocol error.
    pub fn go_away(&mut self, error: bool) -> Frame {
        self.going_away = true;
        Frame::GoAway {
            last_good: self.last_client_stream,
            status: if error {
                goaway::PROTOCOL_ERROR
            } else {
                goaway::OK
            },
        }
    }

    fn forget_if_done(&mut self, stream: u32) {
        if self
            .streams
            .get(&stream)
            .is_some_and(|s| s.local_closed && s.remote_closed)
        {
            self.streams.remove(&stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syn(stream: u32, flags: u8) -> Frame {
        Frame::SynStream {
            stream,
            associated: 0,
            priority: 0,
            flags,
            headers: Headers::default().with("streamType", "stdout"),
        }
    }

    #[test]
    fn a_stream_lives_and_ends_both_ways() {
        let mut s = Session::new(8);
        let (ev, out) = s.receive(syn(1, 0));
        assert!(matches!(
            ev[..],
            [Event::Opened {
                stream: 1,
                fin: false,
                ..
            }]
        ));
        assert!(matches!(
            out[..],
            [Frame::SynReply {
                stream: 1,
                fin: false,
                ..
            }]
        ));
        let (ev, _) = s.receive(Frame::Data {
            stream: 1,
            fin: true,
            data: Bytes::from_static(b"x"),
        });
        assert_eq!(
            ev,
            [
                Event::Data {
                    stream: 1,
                    data: Bytes::from_static(b"x")
                },
                Event::Finished { stream: 1 }
            ]
        );
        assert!(s.send(1, Bytes::from_static(b"y"), false).is_some());
        assert!(s.send(1, Bytes::new(), true).is_some());
        // Both sides done: forgotten, nothing more goes out.
        assert_eq!(s.open_streams(), 0);
        assert_eq!(s.send(1, Bytes::from_static(b"z"), false), None);
    }

    #[test]
    fn rule_breakers_are_reset() {
        let mut s = Session::new(1);
        // Even (server-initiated) id from the client.
        let (ev, out) = s.receive(syn(2, 0));
        assert!(ev.is_empty());
        assert_eq!(
            out,
            [Frame::RstStream {
                stream: 2,
                status: rst::PROTOCOL_ERROR
            }]
        );
        s.receive(syn(3, 0));
        // Not increasing.
        let (_, out) = s.receive(syn(1, 0));
        assert!(matches!(
            out[..],
            [Frame::RstStream {
                stream: 1,
                status: rst::PROTOCOL_ERROR
            }]
        ));
        // Over the limit.
        let (ev, out) = s.receive(syn(5, 0));
        assert!(ev.is_empty());
        assert!(matches!(
            out[..],
            [Frame::RstStream {
                stream: 5,
                status: rst::REFUSED_STREAM
            }]
        ));
        // Data on an unknown stream, data after FIN.
        let (_, out) = s.receive(Frame::Data {
            stream: 7,
            fin: false,
            data: Bytes::new(),
        });
        assert!(matches!(
            out[..],
            [Frame::RstStream {
                stream: 7,
                status: rst::INVALID_STREAM
            }]
        ));
        s.receive(Frame::Data {
            stream: 3,
            fin: true,
            data: Bytes::new(),
        });
        let (ev, out) = s.receive(Frame::Data {
            stream: 3,
            fin: false,
            data: Bytes::from_static(b"late"),
        });
        assert_eq!(ev, [Event::Reset { stream: 3 }]);
        assert!(matches!(
            out[..],
            [Frame::RstStream {
                stream: 3,
                status: rst::STREAM_ALREADY_CLOSED
            }]
        ));
    }

    #[test]
    fn pings_resets_and_goaway() {
        let mut s = Session::new(8);
        assert_eq!(s.receive(Frame::Ping(1)).1, [Frame::Ping(1)]);
        assert!(s.receive(Frame::Ping(2)).1.is_empty());
        s.receive(syn(1, FLAG_FIN));
        assert_eq!(
            s.receive(Frame::RstStream {
                stream: 1,
                status: rst::CANCEL
            })
            .0,
            [Event::Reset { stream: 1 }]
        );
        assert_eq!(s.send(1, Bytes::new(), true), None);
        assert!(
            s.receive(Frame::WindowUpdate {
                stream: 0,
                delta: 5
            })
            .1
            .is_empty()
        );
        assert_eq!(
            s.receive(Frame::GoAway {
                last_good: 0,
                status: 0
            })
            .0,
            [Event::GoAway]
        );
        // No new streams after GOAWAY.
        let (ev, out) = s.receive(syn(3, 0));
        assert!(ev.is_empty());
        assert!(matches!(
            out[..],
            [Frame::RstStream {
                status: rst::REFUSED_STREAM,
                ..
            }]
        ));
        assert_eq!(
            s.go_away(false),
            Frame::GoAway {
                last_good: 3,
                status: goaway::OK
            }
        );
    }
}
