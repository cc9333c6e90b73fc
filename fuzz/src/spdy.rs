//! SPDY/3.1 frames as a client sends them to the kubelet API (`fabric-kubelet`): the decoder
//! never panics or allocates past its limits, whatever it is fed and however the bytes are cut;
//! every frame it returns encodes and decodes back to itself; the server session takes every
//! frame without panicking; the resize stream decoder takes the same bytes.
use fabric_kubelet::{
    frame::{Decoder, Encoder, Limits},
    remotecommand::ResizeDecoder,
    session::Session,
};

pub fn check(data: &[u8]) {
    let limits = Limits::default();
    // The first byte picks where to cut the input, to exercise partial frames.
    let (cut, data) = match data.split_first() {
        Some((c, rest)) => (*c as usize + 1, rest),
        None => return,
    };
    let mut dec = Decoder::new(limits);
    let mut session = Session::new(16);
    let (mut enc, mut redec) = (Encoder::new(), Decoder::new(limits));
    // Replies go the other way: their own compression context.
    let mut replies = Encoder::new();
    'outer: for chunk in data.chunks(cut) {
        dec.push(chunk);
        loop {
            match dec.next_frame() {
                Ok(Some(f)) => {
                    let mut bytes = Vec::new();
                    enc.encode(&f, &mut bytes).expect("a decoded frame encodes");
                    redec.push(&bytes);
                    assert_eq!(
                        redec.next_frame().expect("our own bytes decode").as_ref(),
                        Some(&f)
                    );
                    let (_, out) = session.receive(f);
                    for o in out {
                        replies
                            .encode(&o, &mut Vec::new())
                            .expect("a reply encodes");
                    }
                    assert!(session.open_streams() <= 16);
                }
                Ok(None) => break,
                Err(_) => break 'outer,
            }
        }
        assert!(dec.buffered() <= limits.max_data.max(limits.max_control) + 8 + cut);
    }
    let _ = ResizeDecoder::default().push(data);
}
