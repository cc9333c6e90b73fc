//! Traffic that notices blips: a long-lived TCP stream (small messages every
//! [`STREAM_EVERY`], echoed by the server) and a fresh TCP connection every
//! [`CONNECT_EVERY`], both from one namespace to another, recorded with their times. The test
//! marks phases (e.g. "before", "operator1 restarted") and gets, per phase, the connections
//! tried and failed, the slowest one, and the stream's longest stall (the longest time
//! without an echo coming back). All of it stays in the test bed's namespaces.
//!
//! What the figures mean: a connection fails when it is not made within [`CONNECT_TIMEOUT`]
//! or its one-byte answer and close do not arrive within it (a SYN lost for a moment shows up
//! as a slow connection: the kernel sends it again after 1 s); the stream stalls while its
//! packets are lost or held, and TCP's retransmission back-off adds to the outage itself.
use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::netns::{join, spawn_in_netns};

/// How often the stream's client sends a message.
pub const STREAM_EVERY: Duration = Duration::from_millis(10);
/// How often a fresh connection is started (or at once after a slower one).
pub const CONNECT_EVERY: Duration = Duration::from_millis(100);
/// A connection not made and answered within this counts as failed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

const MESSAGE: [u8; 32] = [0x42; 32];

/// One connection attempt, `at` from the start of the watch.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub at: Duration,
    pub took: Duration,
    pub error: Option<String>,
}

/// Everything recorded, times from the start of the watch.
#[derive(Debug, Default, Clone)]
pub struct Record {
    /// When an echo of the stream came back.
    pub echoes: Vec<Duration>,
    pub attempts: Vec<Attempt>,
    /// When the stream broke and why (it is opened again at once).
    pub breaks: Vec<(Duration, String)>,
}

/// One phase's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub label: String,
    pub length: Duration,
    pub connects: usize,
    /// The failed connections: when (from the phase's start) and why.
    pub failed: Vec<(Duration, String)>,
    pub slowest_connect: Duration,
    /// The longest time without an echo that began in the phase (after its last echo before
    /// the silence).
    pub max_stall: Duration,
    /// When that stall began, from the phase's start.
    pub max_stall_at: Duration,
    pub stream_breaks: usize,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<28} {:>6.1} s  connects {:>4}  failed {:>3}  slowest {:>6.3} s  max stall {:>6.3} s (at +{:.2} s)  stream breaks {}",
            self.label,
            self.length.as_secs_f64(),
            self.connects,
            self.failed.len(),
            self.slowest_connect.as_secs_f64(),
            self.max_stall.as_secs_f64(),
            self.max_stall_at.as_secs_f64(),
            self.stream_breaks
        )?;
        for (at, why) in &self.failed {
            write!(f, "\n    failed at +{:.2} s: {why}", at.as_secs_f64())?;
        }
        Ok(())
    }
}

/// The figures of each phase: phases are `(label, start)` in order, each lasting until the
/// next one starts, the last until `end`. An attempt belongs to the phase it started in, a
/// stall (its whole length) to the phase it began in, and so does a stream silent from its
/// last echo until `end`. (Mark a phase a moment before what it is about: a stall that began
/// before the mark is the previous phase's.)
pub fn figures(rec: &Record, phases: &[(String, Duration)], end: Duration) -> Vec<Figures> {
    // The gaps between echoes, from the first echo on, and the silence at the end.
    let mut gaps: Vec<(Duration, Duration)> = rec.echoes.windows(2).map(|w| (w[0], w[1])).collect();
    if let Some(last) = rec.echoes.last() {
        gaps.push((*last, end.max(*last)));
    }
    phases
        .iter()
        .enumerate()
        .map(|(i, (label, start))| {
            let stop = phases.get(i + 1).map_or(end, |(_, s)| *s);
            let stall = gaps
                .iter()
                .filter(|(from, _)| *from >= *start && *from < stop)
                .max_by_key(|(from, to)| *to - *from);
            let attempts: Vec<&Attempt> = rec
                .attempts
                .iter()
                .filter(|a| a.at >= *start && a.at < stop)
                .collect();
            Figures {
                label: label.clone(),
                length: stop.saturating_sub(*start),
                connects: attempts.len(),
                failed: attempts
                    .iter()
                    .filter_map(|a| Some((a.at - *start, a.error.clone()?)))
                    .collect(),
                slowest_connect: attempts.iter().map(|a| a.took).max().unwrap_or_default(),
                max_stall: stall.map(|(from, to)| *to - *from).unwrap_or_default(),
                max_stall_at: stall.map(|(from, _)| *from - *start).unwrap_or_default(),
                stream_breaks: rec
                    .breaks
                    .iter()
                    .filter(|(at, _)| *at >= *start && *at < stop)
                    .count(),
            }
        })
        .collect()
}

/// The running traffic; [`Watch::stop`] ends it and returns the figures.
pub struct Watch {
    t0: Instant,
    /// The clients' (threads after the first).
    stop: Arc<AtomicBool>,
    /// The servers' (the first thread).
    stop_servers: Arc<AtomicBool>,
    rec: Arc<Mutex<Record>>,
    phases: Vec<(String, Duration)>,
    threads: Vec<JoinHandle<Result<()>>>,
}

fn set_rcvtimeo(fd: i32, d: Duration) {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: valid fd and option struct.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Watch {
    /// Starts both servers in `server_ns` (the stream's on `port`, the connections' on
    /// `port + 1`) and both clients in `client_ns`, towards `dst` (the server as the client's
    /// cluster sees it). Returns once the stream carries echoes; the first phase is
    /// `first_phase`.
    pub fn start(
        client_ns: &str,
        server_ns: &str,
        dst: &str,
        port: u16,
        first_phase: &str,
    ) -> Result<Self> {
        let ip: std::net::Ipv4Addr = dst
            .parse()
            .with_context(|| format!("bad IPv4 address {dst}"))?;
        let (stream_dst, connect_dst) = (
            SocketAddr::from((ip, port)),
            SocketAddr::from((ip, port + 1)),
        );
        let stop = Arc::new(AtomicBool::new(false));
        // The servers stop after the clients (see `Watch::stop`).
        let stop_servers = Arc::new(AtomicBool::new(false));
        let rec = Arc::new(Mutex::new(Record::default()));
        let t0 = Instant::now();
        let mut threads = Vec::new();

        // Servers: an echo per stream connection, a byte and a close per connection.
        let (ready_tx, ready_rx) = mpsc::channel();
        threads.push({
            let stop = stop_servers.clone();
            spawn_in_netns(server_ns, move || {
                let echo =
                    TcpListener::bind(("0.0.0.0", port)).context("binding the echo server")?;
                let once = TcpListener::bind(("0.0.0.0", port + 1))
                    .context("binding the connection server")?;
                // accept() honours SO_RCVTIMEO: wake up regularly to look at `stop`.
                set_rcvtimeo(echo.as_raw_fd(), Duration::from_millis(20));
                set_rcvtimeo(once.as_raw_fd(), Duration::from_millis(20));
                let _ = ready_tx.send(());
                let mut echoers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((s, _)) = echo.accept() {
                        let stop = stop.clone();
                        echoers.push(std::thread::spawn(move || echo_loop(s, &stop)));
                    }
                    if let Ok((mut s, _)) = once.accept() {
                        // The server closes first: TIME_WAIT stays here, the client's ports
                        // are free again at once.
                        let _ = s.write_all(b"x");
                    }
                }
                for h in echoers {
                    let _ = h.join();
                }
                Ok(())
            })
        });
        if ready_rx.recv_timeout(Duration::from_secs(5)).is_err() {
            stop_servers.store(true, Ordering::Relaxed);
            for t in threads {
                join(t)?;
            }
            bail!("the blip servers did not start");
        }

        // The stream: one connection, written every STREAM_EVERY, echoes timed; opened again
        // when it breaks.
        threads.push({
            let (stop, rec) = (stop.clone(), rec.clone());
            spawn_in_netns(client_ns, move || {
                while !stop.load(Ordering::Relaxed) {
                    let s = match TcpStream::connect_timeout(&stream_dst, CONNECT_TIMEOUT) {
                        Ok(s) => s,
                        Err(e) => {
                            rec.lock().unwrap().breaks.push((
                                t0.elapsed(),
                                format!("opening the stream to {stream_dst}: {e}"),
                            ));
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                    };
                    if let Err(e) = stream_loop(s, &stop, &rec, t0) {
                        rec.lock()
                            .unwrap()
                            .breaks
                            .push((t0.elapsed(), format!("{e:#}")));
                    }
                }
                Ok(())
            })
        });

        // A fresh connection every CONNECT_EVERY.
        threads.push({
            let (stop, rec) = (stop.clone(), rec.clone());
            spawn_in_netns(client_ns, move || {
                while !stop.load(Ordering::Relaxed) {
                    let at = t0.elapsed();
                    let started = Instant::now();
                    let error = connect_once(connect_dst).err().map(|e| format!("{e:#}"));
                    let took = started.elapsed();
                    rec.lock()
                        .unwrap()
                        .attempts
                        .push(Attempt { at, took, error });
                    std::thread::sleep(CONNECT_EVERY.saturating_sub(took));
                }
                Ok(())
            })
        });

        let w = Self {
            t0,
            stop,
            stop_servers,
            rec,
            phases: vec![(first_phase.to_owned(), Duration::ZERO)],
            threads,
        };
        // Nothing to measure until the stream carries.
        let deadline = Instant::now() + Duration::from_secs(10);
        while w.rec.lock().unwrap().echoes.is_empty() {
            if Instant::now() > deadline {
                let rec = w.rec.lock().unwrap().clone();
                w.stop.store(true, Ordering::Relaxed);
                w.stop_servers.store(true, Ordering::Relaxed);
                bail!(
                    "no echo on the stream to {stream_dst} within 10 s: {:?}",
                    rec.breaks
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(w)
    }

    /// Starts a new phase now.
    pub fn phase(&mut self, label: &str) {
        self.phases.push((label.to_owned(), self.t0.elapsed()));
    }

    /// Stops the traffic; the figures of every phase.
    pub fn stop(self) -> Result<Vec<Figures>> {
        let end = self.t0.elapsed();
        // The clients first: a connection tried while the servers close would be refused
        // by the test's own stop, not by the path.
        self.stop.store(true, Ordering::Relaxed);
        let mut threads = self.threads.into_iter();
        let server = threads.next();
        for t in threads {
            join(t)?;
        }
        self.stop_servers.store(true, Ordering::Relaxed);
        if let Some(t) = server {
            join(t)?;
        }
        let rec = self.rec.lock().unwrap().clone();
        Ok(figures(&rec, &self.phases, end))
    }
}

fn echo_loop(mut s: TcpStream, stop: &AtomicBool) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if timed_out(&e) => {}
            Err(_) => return,
        }
    }
}

/// One stream connection until it breaks (an error) or `stop` (Ok).
fn stream_loop(
    s: TcpStream,
    stop: &Arc<AtomicBool>,
    rec: &Arc<Mutex<Record>>,
    t0: Instant,
) -> Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    // Far above what an outage of seconds queues (3 KiB a second).
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut w = s.try_clone()?;
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, done) = (stop.clone(), done.clone());
        std::thread::spawn(move || -> Result<()> {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
                w.write_all(&MESSAGE).context("writing to the stream")?;
                next += STREAM_EVERY;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            Ok(())
        })
    };
    let mut r = s;
    let mut buf = [0u8; 4096];
    let res = loop {
        if stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        if writer.is_finished() {
            break Err(anyhow::anyhow!("the stream's writer stopped"));
        }
        match r.read(&mut buf) {
            Ok(0) => break Err(anyhow::anyhow!("the server closed the stream")),
            Ok(_) => rec.lock().unwrap().echoes.push(t0.elapsed()),
            Err(e) if timed_out(&e) => {}
            Err(e) => break Err(anyhow::Error::from(e).context("reading the stream")),
        }
    };
    done.store(true, Ordering::Relaxed);
    let _ = r.shutdown(Shutdown::Both);
    let wrote = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the stream's writer panicked"))?;
    res.and(wrote)
}

/// One connection: made, its byte read, closed by the server, all within CONNECT_TIMEOUT.
fn connect_once(dst: SocketAddr) -> Result<()> {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT)
        .with_context(|| format!("connecting to {dst}"))?;
    let mut buf = [0u8; 8];
    let mut got = 0;
    loop {
        let left = CONNECT_TIMEOUT.saturating_sub(started.elapsed());
        if left.is_zero() {
            bail!("no answer and close from {dst} within {CONNECT_TIMEOUT:?}");
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf) {
            Ok(0) if got > 0 => return Ok(()),
            Ok(0) => bail!("{dst} closed without its byte"),
            Ok(n) => got += n,
            Err(e) if timed_out(&e) => {
                bail!("no answer and close from {dst} within {CONNECT_TIMEOUT:?}")
            }
            Err(e) => return Err(e).with_context(|| format!("reading from {dst}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn phases_get_their_attempts_and_every_stall_they_overlap() {
        let rec = Record {
            // A 900 ms stall across the second phase's start, and silence from 3 s on.
            echoes: vec![
                ms(0),
                ms(10),
                ms(20),
                ms(1000),
                ms(1010),
                ms(1900),
                ms(3000),
            ],
            attempts: vec![
                Attempt {
                    at: ms(0),
                    took: ms(2),
                    error: None,
                },
                Attempt {
                    at: ms(950),
                    took: ms(1003),
                    error: None,
                },
                Attempt {
                    at: ms(1100),
                    took: ms(3000),
                    error: Some("no answer".into()),
                },
                Attempt {
                    at: ms(4200),
                    took: ms(1),
                    error: None,
                },
            ],
            breaks: vec![(ms(4100), "reset".into())],
        };
        let phases = [
            ("before".to_owned(), ms(0)),
            ("restart".to_owned(), ms(500)),
            ("after".to_owned(), ms(2000)),
        ];
        let f = figures(&rec, &phases, ms(5000));
        assert_eq!(f.len(), 3);
        assert_eq!((f[0].connects, f[0].failed.len()), (1, 0));
        // The stall that began in "before" is its, though it went on into "restart".
        assert_eq!(f[0].max_stall, ms(980));
        assert_eq!(f[0].length, ms(500));
        assert_eq!(f[1].connects, 2);
        assert_eq!(f[1].failed, vec![(ms(600), "no answer".to_owned())]);
        assert_eq!(f[1].slowest_connect, ms(3000));
        assert_eq!(f[1].max_stall, ms(1100));
        assert_eq!(f[1].max_stall_at, ms(1400));
        // The silence until the end counts in the last phase, and so does the break.
        assert_eq!(f[2].max_stall, ms(2000));
        assert_eq!((f[2].connects, f[2].stream_breaks), (1, 1));
        assert_eq!(f[2].slowest_connect, ms(1));
    }

    #[test]
    fn no_echo_at_all_is_no_stall_figure() {
        let f = figures(&Record::default(), &[("x".to_owned(), ms(0))], ms(100));
        assert_eq!(f[0].max_stall, Duration::ZERO);
        assert_eq!(f[0].connects, 0);
    }
}
