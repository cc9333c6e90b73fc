//! `exec` with a terminal (`kubectl exec -it`): the command runs on the slave side of a
//! pseudo-terminal as its session's controlling terminal, the client's stdin and stdout are the
//! master side, and the sizes the client sends on the resize stream are set on it, as a
//! container runtime does.
use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    process::Stdio,
    time::Duration,
};

use fabric_kubelet::remotecommand::{self, Options, ResizeDecoder, Status, Streams, TerminalSize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tracing::debug;

/// How long the command waits for the client's first terminal size: kubectl sends it as soon
/// as the streams are up, and a command that asks for the size at once must find it set.
const FIRST_SIZE_WAIT: Duration = Duration::from_secs(2);
/// How long output is still read after the command ended (a background process it left may
/// hold the terminal open forever).
const DRAIN: Duration = Duration::from_secs(2);

/// A pseudo-terminal pair, both ends close-on-exec (the command gets duplicates as its stdio).
struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
}

impl Pty {
    fn open() -> io::Result<Self> {
        let (mut m, mut s) = (-1, -1);
        // SAFETY: openpty writes two fds into the out-pointers; no name, termios or size asked.
        let r = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both fds were just opened by openpty and are owned by nobody else.
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
        for fd in [&master, &slave] {
            // SAFETY: plain fcntl on an fd we own.
            if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Self { master, slave })
    }
}

fn set_size(master: &OwnedFd, size: TerminalSize) {
    let ws = libc::winsize {
        ws_row: size.height,
        ws_col: size.width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer; the fd is a terminal we own.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
        debug!(error = %io::Error::last_os_error(), "setting the terminal size");
    }
}

/// Runs the command of `opts` (which asked for a terminal) in `netns` on a new terminal.
pub async fn run(netns: String, opts: Options, mut s: Streams) {
    let pty = match Pty::open() {
        Ok(p) => p,
        Err(e) => {
            let _ = s
                .finish(&Status::failure(format!("opening a terminal: {e}")))
                .await;
            return;
        }
    };
    let master = std::sync::Arc::new(pty.master);
    let (sizes, mut first) = tokio::sync::watch::channel(None::<TerminalSize>);
    if let Some(mut resize) = s.resize.take() {
        let master = master.clone();
        tokio::spawn(async move {
            let (mut dec, mut buf) = (ResizeDecoder::default(), [0u8; 512]);
            while let Ok(n) = resize.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                match dec.push(&buf[..n]) {
                    Ok(got) => {
                        for size in got {
                            set_size(&master, size);
                            let _ = sizes.send(Some(size));
                        }
                    }
                    Err(e) => return debug!(error = %e, "resize stream"),
                }
            }
        });
        let _ = tokio::time::timeout(FIRST_SIZE_WAIT, first.wait_for(Option::is_some)).await;
    }
    let stdio = || pty.slave.try_clone().map(Stdio::from);
    let (stdin, stdout, stderr) = match (stdio(), stdio(), stdio()) {
        (Ok(i), Ok(o), Ok(e)) => (i, o, e),
        (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => {
            let _ = s
                .finish(&Status::failure(format!("opening a terminal: {e}")))
                .await;
            return;
        }
    };
    let mut cmd = tokio::process::Command::new("ip");
    cmd.args(["netns", "exec", &netns])
        .args(&opts.command)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(true);
    // SAFETY: setsid and ioctl are async-signal-safe; they touch only the child.
    unsafe {
        cmd.pre_exec(|| {
            // A session of its own, with the terminal (its stdin) as controlling terminal.
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    // Only the command holds the slave now: reading the master ends when it is gone.
    drop(pty.slave);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = s
                .finish(&Status::failure(format!("running {:?}: {e}", opts.command)))
                .await;
            return;
        }
    };
    let dup = || {
        master
            .try_clone()
            .map(|fd| tokio::fs::File::from_std(std::fs::File::from(fd)))
    };
    if let (Some(mut from), Ok(mut to)) = (s.stdin.take(), dup()) {
        // Not waited for: a command that ends without reading its input must not hang on it.
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = from.read(&mut buf).await {
                if n == 0 || to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
                    break;
                }
            }
        });
    }
    let output = match (s.stdout.take(), dup()) {
        (Some(mut to), Ok(mut from)) => Some(tokio::spawn(async move {
            let mut buf = vec![0u8; 16 << 10];
            // EIO once the command and whatever shares its terminal are gone.
            while let Ok(n) = from.read(&mut buf).await {
                if n == 0 || to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = to.shutdown().await;
        })),
        _ => None,
    };
    let status = super::stream::exit_status(child.wait().await, &opts);
    if let Some(o) = output {
        let _ = tokio::time::timeout(DRAIN, o).await;
    }
    if let Err(e) = remotecommand::report(s.into_error(), &status).await {
        debug!(error = %e, "reporting the exit status");
    }
}
