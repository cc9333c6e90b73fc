//! `fabric-volume-transfer` as the two pods run it: two real processes over TCP. A tree
//! arrives whole with both digests printed and equal; a receiver killed mid-stream leaves the
//! sender failing without a digest (so `fabricctl move volume` sees no match and keeps the
//! source).
use std::{
    io::{BufRead as _, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

const BIN: &str = env!("CARGO_BIN_EXE_fabric-volume-transfer");

fn scratch(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("fvt-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn digest(out: &str, verb: &str) -> Option<String> {
    out.lines()
        .find(|l| l.starts_with(verb) && l.contains(" sha256 "))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_owned)
}

fn tree(dir: &Path, big: usize) {
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    std::fs::write(dir.join("a/b/one.txt"), "one").unwrap();
    std::fs::write(
        dir.join("big.bin"),
        (0..big).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
}

#[test]
fn a_tree_crosses_with_equal_digests() {
    let (src, dst) = (scratch("src"), scratch("dst"));
    tree(&src, 3_000_000);
    let port = free_port();
    let recv = Command::new(BIN)
        .args(["receive", "--port", &port.to_string(), "--dir"])
        .arg(&dst)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let send = Command::new(BIN)
        .args(["send", "--to", &format!("127.0.0.1:{port}"), "--dir"])
        .arg(&src)
        .output()
        .unwrap();
    let recv = recv.wait_with_output().unwrap();
    let (s, r) = (
        String::from_utf8_lossy(&send.stdout).into_owned(),
        String::from_utf8_lossy(&recv.stdout).into_owned(),
    );
    assert!(send.status.success() && recv.status.success(), "{s}\n{r}");
    let (ds, dr) = (digest(&s, "sent"), digest(&r, "received"));
    assert!(ds.is_some() && ds == dr, "digests: {s}\n{r}");
    assert_eq!(std::fs::read(dst.join("a/b/one.txt")).unwrap(), b"one");
    assert_eq!(
        std::fs::read(dst.join("big.bin")).unwrap(),
        std::fs::read(src.join("big.bin")).unwrap()
    );
}

#[test]
fn a_killed_receiver_fails_the_sender() {
    let src = scratch("src2");
    // Large enough that the stream is still going when the receiver dies; sparse, so that
    // making it costs nothing (filling 400 MB took seconds of CPU in a debug build).
    tree(&src, 0);
    std::fs::File::create(src.join("huge.bin"))
        .unwrap()
        .set_len(400_000_000)
        .unwrap();
    // A receiver that takes the connection and dies: a listener in a child we kill.
    let port = free_port();
    let mut recv = Command::new(BIN)
        .args(["receive", "--port", &port.to_string(), "--dir"])
        .arg(scratch("dst2"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(recv.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("listening"));
    let send = Command::new(BIN)
        .args(["send", "--to", &format!("127.0.0.1:{port}"), "--dir"])
        .arg(&src)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(lines.next().unwrap().unwrap().starts_with("receiving from"));
    std::thread::sleep(Duration::from_millis(200));
    recv.kill().unwrap();
    recv.wait().unwrap();
    let out = send.wait_with_output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the sender failed: {s}");
    assert_eq!(digest(&s, "sent"), None, "no digest printed: {s}");
    let _ = std::fs::remove_dir_all(&src);
}

#[test]
fn a_listening_sender_serves_only_the_receiver_with_the_token() {
    use std::io::{Read as _, Write as _};
    let (src, dst) = (scratch("src3"), scratch("dst3"));
    tree(&src, 100_000);
    let port = free_port();
    let mut send = Command::new(BIN)
        .args(["send", "--listen", &port.to_string(), "--dir"])
        .arg(&src)
        .env("FABRIC_TRANSFER_TOKEN", "s3cret")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(send.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("listening"));
    // Another pod connects first, with a wrong token: it gets nothing of the volume.
    let mut intruder = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    intruder.write_all(b"FVTK\x00\x05guess").unwrap();
    let mut got = Vec::new();
    let _ = intruder.read_to_end(&mut got);
    assert!(got.is_empty(), "the intruder got {} bytes", got.len());
    let recv = Command::new(BIN)
        .args(["receive", "--from", &format!("127.0.0.1:{port}"), "--dir"])
        .arg(&dst)
        .env("FABRIC_TRANSFER_TOKEN", "s3cret")
        .output()
        .unwrap();
    let s: Vec<String> = lines.map(Result::unwrap).collect();
    let s = s.join("\n");
    assert!(send.wait().unwrap().success(), "{s}");
    let r = String::from_utf8_lossy(&recv.stdout).into_owned();
    assert!(recv.status.success(), "{r}");
    assert!(s.contains("refused 127.0.0.1"), "{s}");
    let (ds, dr) = (digest(&s, "sent"), digest(&r, "received"));
    assert!(ds.is_some() && ds == dr, "digests: {s}\n{r}");
    assert_eq!(
        std::fs::read(dst.join("big.bin")).unwrap(),
        std::fs::read(src.join("big.bin")).unwrap()
    );
}
