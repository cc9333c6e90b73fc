//! `fabric-volume-transfer`: the program of `fabricctl move volume`'s two pods (issue 21).
//!
//! - `receive (--port P | --from ADDR:PORT) --dir D`: takes one stream, writes its files
//!   under D, prints `received N bytes sha256 HEX` and exits 0 (1 on a bad or cut stream:
//!   nothing tells the CLI the copy is good then).
//! - `send (--to ADDR:PORT | --listen P) --dir D`: walks D, streams its directories and
//!   regular files, printing `sent N bytes` as it goes and `sent N bytes sha256 HEX` at the end.
//!
//! Either side may listen and the other connect: a move to a provider has the receiver listen
//! there (this cluster reaches the provider's pods), a move home has the sender listen there.
//! The side that connects first presents `--token` (the CLI makes one per move); the listener
//! drops a connection that does not present its own and waits for the next, so that no other
//! pod can take the volume's data, or fill the claim, by connecting first.
//!
//! The CLI compares both digests: each side hashes the bytes it saw on the wire, so equal
//! digests mean the receiver got exactly what the sender read. A real deployment runs it from
//! the fabric's own image (the one `fabricctl` ships in); the test node runs it from its
//! directory, as it runs `fabric-test-pod`.
//!
//! The stream (all integers big-endian): the magic `FVT1`, then entries
//! `kind:u8 path_len:u16 path mode:u32 [size:u64 data]` (kind 1 directory, 2 file with size
//! and data), ended by kind 0. Paths are relative, `/`-separated, never `..`, `.` or empty
//! parts: a sender cannot write outside the receiver's directory.
use std::{
    io::{self, BufReader, BufWriter, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Component, Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

const MAGIC: &[u8; 4] = b"FVT1";
const END: u8 = 0;
const DIR: u8 = 1;
const FILE: u8 = 2;

#[derive(Parser)]
#[command(about = "Copies a volume's files over TCP, checksummed (fabricctl move volume)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Send {
        /// Connect to the receiver there ...
        #[arg(long, required_unless_present = "listen", conflicts_with = "listen")]
        to: Option<SocketAddr>,
        /// ... or listen on this port for it.
        #[arg(long)]
        listen: Option<u16>,
        #[arg(long)]
        dir: PathBuf,
        /// What the connecting side presents (both sides are given the same).
        #[arg(long, env = "FABRIC_TRANSFER_TOKEN", default_value = "")]
        token: String,
        /// How long to keep trying to connect (the other side may start later).
        #[arg(long, default_value_t = 60)]
        connect_secs: u64,
    },
    Receive {
        /// Listen on this port for the sender ...
        #[arg(long, required_unless_present = "from", conflicts_with = "from")]
        port: Option<u16>,
        /// ... or connect to it there.
        #[arg(long)]
        from: Option<SocketAddr>,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, env = "FABRIC_TRANSFER_TOKEN", default_value = "")]
        token: String,
        #[arg(long, default_value_t = 60)]
        connect_secs: u64,
    },
}

/// What the connecting side sends first: this, the token's length (u16) and the token.
const HELLO: &[u8; 4] = b"FVTK";
/// How many connections without the token a listener drops before it gives up.
const REFUSALS: usize = 16;
/// How long a connection may take to present its token.
const HELLO_WITHIN: Duration = Duration::from_secs(5);

fn hello(token: &str) -> Result<Vec<u8>, ProtoError> {
    let len = u16::try_from(token.len()).map_err(|_| ProtoError::TooLong)?;
    let mut out = HELLO.to_vec();
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(token.as_bytes());
    Ok(out)
}

/// Whether `r` presents `token` (compared in time independent of where they differ).
fn check_hello(r: &mut impl Read, token: &str) -> Result<bool, ProtoError> {
    let mut head = [0u8; 6];
    r.read_exact(&mut head)?;
    if &head[..4] != HELLO {
        return Ok(false);
    }
    let len = usize::from(u16::from_be_bytes([head[4], head[5]]));
    let mut got = vec![0u8; len];
    r.read_exact(&mut got)?;
    let same = got.len() == token.len()
        && got
            .iter()
            .zip(token.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    Ok(same)
}

/// One entry of the stream, as framed.
#[derive(Debug, PartialEq, Eq)]
enum Header {
    End,
    Dir { path: String, mode: u32 },
    File { path: String, mode: u32, size: u64 },
}

#[derive(Debug, thiserror::Error)]
enum ProtoError {
    #[error("not a volume transfer stream (magic {0:?})")]
    Magic([u8; 4]),
    #[error("unknown entry kind {0}")]
    Kind(u8),
    #[error("path {0:?} refused: it must be relative, without '..', '.' or empty parts")]
    Path(String),
    #[error("path is not UTF-8")]
    Utf8,
    #[error("path longer than {} bytes", u16::MAX)]
    TooLong,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A path as the stream may carry it: relative, plain parts only.
fn check_path(p: &str) -> Result<(), ProtoError> {
    let ok = !p.is_empty()
        && !p.starts_with('/')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(ProtoError::Path(p.to_owned()))
    }
}

fn encode_header(h: &Header, out: &mut Vec<u8>) -> Result<(), ProtoError> {
    let (kind, path, mode, size) = match h {
        Header::End => {
            out.push(END);
            return Ok(());
        }
        Header::Dir { path, mode } => (DIR, path, *mode, None),
        Header::File { path, mode, size } => (FILE, path, *mode, Some(*size)),
    };
    check_path(path)?;
    let len = u16::try_from(path.len()).map_err(|_| ProtoError::TooLong)?;
    out.push(kind);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(&mode.to_be_bytes());
    if let Some(size) = size {
        out.extend_from_slice(&size.to_be_bytes());
    }
    Ok(())
}

fn read_header(r: &mut impl Read) -> Result<Header, ProtoError> {
    let mut kind = [0u8; 1];
    r.read_exact(&mut kind)?;
    if kind[0] == END {
        return Ok(Header::End);
    }
    if kind[0] != DIR && kind[0] != FILE {
        return Err(ProtoError::Kind(kind[0]));
    }
    let mut len = [0u8; 2];
    r.read_exact(&mut len)?;
    let mut path = vec![0u8; usize::from(u16::from_be_bytes(len))];
    r.read_exact(&mut path)?;
    let path = String::from_utf8(path).map_err(|_| ProtoError::Utf8)?;
    check_path(&path)?;
    let mut mode = [0u8; 4];
    r.read_exact(&mut mode)?;
    let mode = u32::from_be_bytes(mode);
    if kind[0] == DIR {
        return Ok(Header::Dir { path, mode });
    }
    let mut size = [0u8; 8];
    r.read_exact(&mut size)?;
    Ok(Header::File {
        path,
        mode,
        size: u64::from_be_bytes(size),
    })
}

/// Hashes (SHA-256) and counts every byte that passes, either way.
struct Hashing<T> {
    inner: T,
    ctx: ring::digest::Context,
    bytes: u64,
}

impl<T> Hashing<T> {
    fn new(inner: T) -> Self {
        Self {
            inner,
            ctx: ring::digest::Context::new(&ring::digest::SHA256),
            bytes: 0,
        }
    }
    fn digest(&self) -> String {
        hex::encode(self.ctx.clone().finish().as_ref())
    }
}

impl<T: Read> Read for Hashing<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.ctx.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<T: Write> Write for Hashing<T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.ctx.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// What a stream holds, in order: directories before what they contain, names sorted (the
/// same tree gives the same stream, so the same digest).
fn walk(root: &Path) -> Result<Vec<(String, bool)>> {
    fn go(root: &Path, rel: &str, out: &mut Vec<(String, bool)>) -> Result<()> {
        let dir = if rel.is_empty() {
            root.to_owned()
        } else {
            root.join(rel)
        };
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .collect::<Result<_, _>>()?;
        names.sort_by_key(std::fs::DirEntry::file_name);
        for e in names {
            let name = e
                .file_name()
                .into_string()
                .map_err(|n| anyhow::anyhow!("file name {n:?} is not UTF-8"))?;
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let ty = e.file_type()?;
            if ty.is_dir() {
                out.push((path.clone(), true));
                go(root, &path, out)?;
            } else if ty.is_file() {
                out.push((path, false));
            } else {
                // Symlinks and special files would let the stream point outside the volume.
                bail!("{path}: only directories and regular files are moved");
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    go(root, "", &mut out)?;
    Ok(out)
}

fn mode_of(m: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    m.permissions().mode() & 0o7777
}

/// Writes `root`'s tree to `w`; `progress` is told the bytes so far now and then.
fn send_tree<W: Write>(
    root: &Path,
    w: &mut Hashing<W>,
    mut progress: impl FnMut(u64),
) -> Result<()> {
    w.write_all(MAGIC)?;
    let mut last = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    for (path, is_dir) in walk(root)? {
        let full = root.join(&path);
        let meta = std::fs::metadata(&full)?;
        let mut head = Vec::new();
        if is_dir {
            encode_header(
                &Header::Dir {
                    path,
                    mode: mode_of(&meta),
                },
                &mut head,
            )?;
            w.write_all(&head)?;
            continue;
        }
        let size = meta.len();
        encode_header(
            &Header::File {
                path: path.clone(),
                mode: mode_of(&meta),
                size,
            },
            &mut head,
        )?;
        w.write_all(&head)?;
        let mut f = std::fs::File::open(&full)?.take(size);
        let mut left = size;
        while left > 0 {
            let n = f.read(&mut buf)?;
            if n == 0 {
                bail!("{path} shrank while being sent (the volume is in use?)");
            }
            w.write_all(&buf[..n])?;
            left -= n as u64;
            if last.elapsed() >= Duration::from_secs(1) {
                progress(w.bytes);
                last = Instant::now();
            }
        }
    }
    let mut end = Vec::new();
    encode_header(&Header::End, &mut end)?;
    w.write_all(&end)?;
    w.flush()?;
    Ok(())
}

/// Reads a stream into `root`; fails on anything malformed or cut short.
fn receive_tree<R: Read>(root: &Path, r: &mut Hashing<R>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)
        .context("reading the stream's start")?;
    if &magic != MAGIC {
        return Err(ProtoError::Magic(magic).into());
    }
    loop {
        match read_header(r)? {
            Header::End => return Ok(()),
            Header::Dir { path, mode } => {
                let p = root.join(&path);
                std::fs::create_dir_all(&p).with_context(|| format!("creating {path}"))?;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
            }
            Header::File { path, mode, size } => {
                let p = root.join(&path);
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let mut f =
                    std::fs::File::create(&p).with_context(|| format!("creating {path}"))?;
                let n = io::copy(&mut r.take(size), &mut f)?;
                if n != size {
                    bail!("{path}: stream cut after {n} of {size} bytes");
                }
                f.sync_all()?;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Connects to `to` (trying again for `secs`: the other side may start later) and presents
/// `token`.
fn connect(to: SocketAddr, secs: u64, token: &str) -> Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut s = loop {
        match TcpStream::connect_timeout(&to, Duration::from_secs(3)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                println!("connecting to {to}: {e}; again");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to {to}")),
        }
    };
    s.write_all(&hello(token)?)?;
    Ok(s)
}

/// Listens on `port` and takes the first connection that presents `token`.
fn accept(port: u16, token: &str) -> Result<(TcpStream, SocketAddr)> {
    let l = TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("listening on {port}"))?;
    println!("listening on {port}");
    for _ in 0..REFUSALS {
        let (mut s, from) = l.accept()?;
        s.set_read_timeout(Some(HELLO_WITHIN))?;
        match check_hello(&mut s, token) {
            Ok(true) => {
                s.set_read_timeout(None)?;
                return Ok((s, from));
            }
            Ok(false) => println!("refused {from}: it did not present the token"),
            Err(e) => println!("refused {from}: {e}"),
        }
    }
    bail!("{REFUSALS} connections refused, none presented the token")
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Receive {
            port,
            from,
            dir,
            token,
            connect_secs,
        } => {
            let s = match (port, from) {
                (Some(port), _) => {
                    let (s, from) = accept(port, &token)?;
                    println!("receiving from {from}");
                    s
                }
                (None, Some(from)) => {
                    let s = connect(from, connect_secs, &token)?;
                    println!("receiving from {from}");
                    s
                }
                (None, None) => bail!("--port or --from"),
            };
            let mut r = Hashing::new(BufReader::new(s));
            receive_tree(&dir, &mut r)?;
            println!("received {} bytes sha256 {}", r.bytes, r.digest());
            Ok(())
        }
        Cmd::Send {
            to,
            listen,
            dir,
            token,
            connect_secs,
        } => {
            let s = match (to, listen) {
                (Some(to), _) => connect(to, connect_secs, &token)?,
                (None, Some(port)) => {
                    let (s, to) = accept(port, &token)?;
                    println!("sending to {to}");
                    s
                }
                (None, None) => bail!("--to or --listen"),
            };
            let mut w = Hashing::new(BufWriter::new(s));
            send_tree(&dir, &mut w, |n| println!("sent {n} bytes"))?;
            println!("sent {} bytes sha256 {}", w.bytes, w.digest());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this test's own (removed when dropped).
    struct TempDir(PathBuf);
    impl TempDir {
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn tempdir(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("fvt-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    #[test]
    fn only_the_token_is_taken() {
        let check = |bytes: &[u8], token: &str| check_hello(&mut &bytes[..], token);
        assert!(check(&hello("s3cret").unwrap(), "s3cret").unwrap());
        assert!(!check(&hello("s3cres").unwrap(), "s3cret").unwrap());
        assert!(!check(&hello("s3cre").unwrap(), "s3cret").unwrap());
        assert!(!check(&hello("").unwrap(), "s3cret").unwrap());
        assert!(check(&hello("").unwrap(), "").unwrap());
        // Not a hello at all (a bare stream, an old sender): refused, not read further.
        assert!(!check(b"FVT1\x00\x00", "").unwrap());
        assert!(check(b"FVTK\x00", "").is_err());
    }

    #[test]
    fn headers_round_trip() {
        let hs = [
            Header::Dir {
                path: "a".into(),
                mode: 0o755,
            },
            Header::File {
                path: "a/b.txt".into(),
                mode: 0o644,
                size: 5,
            },
            Header::End,
        ];
        let mut buf = Vec::new();
        for h in &hs {
            encode_header(h, &mut buf).unwrap();
        }
        let mut r = &buf[..];
        for h in hs {
            assert_eq!(read_header(&mut r).unwrap(), h);
        }
        assert!(r.is_empty());
    }

    #[test]
    fn paths_that_escape_are_refused_both_ways() {
        for bad in ["../x", "/etc/passwd", "a/../../x", "a//b", "./a", ""] {
            assert!(check_path(bad).is_err(), "{bad:?}");
            let mut buf = Vec::new();
            assert!(
                encode_header(
                    &Header::Dir {
                        path: bad.into(),
                        mode: 0
                    },
                    &mut buf
                )
                .is_err()
            );
            // A hostile sender frames it by hand: the receiver refuses it.
            let mut raw = vec![FILE];
            raw.extend_from_slice(&u16::try_from(bad.len()).unwrap().to_be_bytes());
            raw.extend_from_slice(bad.as_bytes());
            raw.extend_from_slice(&[0; 12]);
            let e = read_header(&mut &raw[..]).unwrap_err();
            assert!(matches!(e, ProtoError::Path(_)), "{bad:?}: {e}");
        }
        assert!(matches!(
            read_header(&mut &[9u8][..]),
            Err(ProtoError::Kind(9))
        ));
    }

    fn tree(dir: &Path) {
        std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
        std::fs::write(dir.join("top.txt"), b"hello").unwrap();
        std::fs::write(dir.join("sub/deeper/big.bin"), vec![7u8; 200_000]).unwrap();
        std::fs::write(dir.join("sub/empty"), b"").unwrap();
    }

    #[test]
    fn a_tree_copies_and_both_digests_agree() {
        let t = tempdir("t1");
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        tree(&src);
        std::fs::create_dir(&dst).unwrap();
        let mut w = Hashing::new(Vec::new());
        send_tree(&src, &mut w, |_| {}).unwrap();
        let sent = w.digest();
        let stream = w.inner;
        let mut r = Hashing::new(&stream[..]);
        receive_tree(&dst, &mut r).unwrap();
        assert_eq!(r.digest(), sent);
        assert_eq!(r.bytes, stream.len() as u64);
        assert_eq!(std::fs::read(dst.join("top.txt")).unwrap(), b"hello");
        assert_eq!(
            std::fs::read(dst.join("sub/deeper/big.bin")).unwrap(),
            vec![7u8; 200_000]
        );
        assert_eq!(std::fs::read(dst.join("sub/empty")).unwrap(), b"");
        // The same tree gives the same stream.
        let mut again = Hashing::new(Vec::new());
        send_tree(&src, &mut again, |_| {}).unwrap();
        assert_eq!(again.digest(), sent);
    }

    #[test]
    fn a_cut_or_changed_stream_fails_or_differs() {
        let t = tempdir("t2");
        let src = t.path().join("src");
        tree(&src);
        let mut w = Hashing::new(Vec::new());
        send_tree(&src, &mut w, |_| {}).unwrap();
        let sent = w.digest();
        let stream = w.inner;
        // Cut short: the receiver fails (it never prints a digest).
        let cut = t.path().join("cut");
        std::fs::create_dir(&cut).unwrap();
        assert!(receive_tree(&cut, &mut Hashing::new(&stream[..stream.len() / 2])).is_err());
        // One data byte flipped: still well-formed, but the digest differs.
        let mut bad = stream.clone();
        let i = bad.windows(16).position(|w| w == [7u8; 16]).unwrap() + 1000;
        bad[i] ^= 1;
        let flipped = t.path().join("flipped");
        std::fs::create_dir(&flipped).unwrap();
        let mut r = Hashing::new(&bad[..]);
        receive_tree(&flipped, &mut r).unwrap();
        assert_ne!(r.digest(), sent);
        // Not our stream at all.
        let e = receive_tree(&cut, &mut Hashing::new(&b"GET / HTTP/1.0\r\n"[..])).unwrap_err();
        assert!(
            e.to_string().contains("not a volume transfer stream"),
            "{e}"
        );
    }

    #[test]
    fn symlinks_are_not_sent() {
        let t = tempdir("t3");
        std::os::unix::fs::symlink("/etc/passwd", t.path().join("link")).unwrap();
        let e = send_tree(t.path(), &mut Hashing::new(Vec::new()), |_| {}).unwrap_err();
        assert!(
            e.to_string().contains("only directories and regular files"),
            "{e}"
        );
    }
}
