//! A whole exec over a session: a client (this test, with the crate's own encoder and decoder)
//! opens the v4 streams as kubectl's side does, the server echoes stdin to stdout and reports
//! exit code 3; then the server's end of the session sends its GOAWAY and closes.
use std::time::Duration;

use bytes::Bytes;
use fabric_kubelet::{
    conn,
    frame::{Decoder, Encoder, FLAG_FIN, Frame, Headers, Limits},
    remotecommand::{Options, Status, Streams},
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[tokio::test]
async fn exec_round_trip() {
    let (client, server) = tokio::io::duplex(1 << 16);
    let srv = tokio::spawn(async move {
        let mut incoming = conn::serve(server, Limits::default());
        let opts = Options::from_query("command=cat&input=1&output=1", true).unwrap();
        let mut s = Streams::collect(&mut incoming, &opts, Duration::from_secs(5))
            .await
            .unwrap();
        let mut input = Vec::new();
        s.stdin
            .take()
            .unwrap()
            .read_to_end(&mut input)
            .await
            .unwrap();
        s.stdout.as_mut().unwrap().write_all(&input).await.unwrap();
        s.finish(&Status::exit(3)).await.unwrap();
    });

    let (mut rd, mut wr) = tokio::io::split(client);
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    for (id, t, flags) in [
        (1, "error", FLAG_FIN),
        (3, "stdin", 0),
        (5, "stdout", FLAG_FIN),
    ] {
        enc.encode(
            &Frame::SynStream {
                stream: id,
                associated: 0,
                priority: 0,
                flags,
                headers: Headers::default().with("streamType", t),
            },
            &mut out,
        )
        .unwrap();
    }
    enc.encode(&Frame::Ping(1), &mut out).unwrap();
    enc.encode(
        &Frame::Data {
            stream: 3,
            fin: true,
            data: Bytes::from_static(b"hello\n"),
        },
        &mut out,
    )
    .unwrap();
    wr.write_all(&out).await.unwrap();

    let mut dec = Decoder::new(Limits::default());
    let mut frames = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), rd.read(&mut buf))
            .await
            .expect("the server answers")
            .unwrap();
        if n == 0 {
            break;
        }
        dec.push(&buf[..n]);
        while let Some(f) = dec.next_frame().unwrap() {
            frames.push(f);
        }
    }
    srv.await.unwrap();
    let replies: Vec<u32> = frames
        .iter()
        .filter_map(|f| match f {
            Frame::SynReply { stream, .. } => Some(*stream),
            _ => None,
        })
        .collect();
    assert_eq!(replies, [1, 3, 5]);
    assert!(frames.contains(&Frame::Ping(1)));
    let data = |id: u32| -> (Vec<u8>, bool) {
        let mut v = Vec::new();
        let mut fin = false;
        for f in &frames {
            if let Frame::Data {
                stream,
                fin: f,
                data,
            } = f
                && *stream == id
            {
                v.extend_from_slice(data);
                fin |= *f;
            }
        }
        (v, fin)
    };
    assert_eq!(data(5), (b"hello\n".to_vec(), true));
    let (status, fin) = data(1);
    assert!(fin);
    let status: Status = serde_json::from_slice(&status).unwrap();
    assert_eq!(status.exit_code(), Some(3));
    assert!(matches!(
        frames.last(),
        Some(Frame::GoAway {
            last_good: 5,
            status: 0
        })
    ));
}
