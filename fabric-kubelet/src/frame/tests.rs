//! Frames against captures of real clients, round trips, and the limits a peer may not pass.
use super::{decode::parse_block, *};

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
