//! Traffic between namespaces: ping, TCP/UDP probes whose servers report the client address
//! they saw, iperf3, and a new-connection-rate loop. All of it stays inside the test bed's
//! namespaces; every wait is bounded.
use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::netns::{Testbed, join, spawn_in_netns};

/// Summary of a `ping` run.
#[derive(Debug, Clone)]
pub struct Ping {
    pub transmitted: u64,
    pub received: u64,
    /// Average round trip, when any reply came back.
    pub rtt_avg_ms: Option<f64>,
    pub output: String,
}

impl Ping {
    pub fn parse(output: &str) -> Self {
        let mut p = Ping {
            transmitted: 0,
            received: 0,
            rtt_avg_ms: None,
            output: output.to_owned(),
        };
        for line in output.lines() {
            // "10 packets transmitted, 10 received, 0% packet loss, time 9ms"
            if line.contains("packets transmitted") {
                for part in line.split(',') {
                    let mut w = part.split_whitespace();
                    let (Some(n), Some(what)) = (w.next(), w.next()) else {
                        continue;
                    };
                    match what {
                        "packets" => p.transmitted = n.parse().unwrap_or(0),
                        "received" => p.received = n.parse().unwrap_or(0),
                        _ => {}
                    }
                }
            }
            // "rtt min/avg/max/mdev = 0.031/0.045/0.120/0.010 ms"
            if let Some(v) = line.split(" = ").nth(1)
                && line.starts_with("rtt")
            {
                p.rtt_avg_ms = v.split('/').nth(1).and_then(|a| a.parse().ok());
            }
        }
        p
    }

    pub fn all_replied(&self) -> bool {
        self.transmitted > 0 && self.received == self.transmitted
    }
}

/// `ping -c count -i interval -W 1 [extra] dst` inside `ns`; never fails on lost replies.
pub fn ping(
    bed: &Testbed,
    ns: &str,
    dst: &str,
    count: u32,
    interval: &str,
    extra: &[&str],
) -> Result<Ping> {
    let count = count.to_string();
    let mut argv = vec!["ping", "-n", "-c", &count, "-i", interval, "-W", "1"];
    argv.extend_from_slice(extra);
    argv.push(dst);
    let out = bed.exec_any(ns, &argv)?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(Ping::parse(&text))
}

/// What one TCP or UDP exchange looked like from both ends.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The client's own socket address (its real address).
    pub client_local: SocketAddr,
    /// Where the client sent to (the server as the client's cluster sees it).
    pub client_dst: SocketAddr,
    /// The client address the server saw (the client as the server's cluster sees it).
    pub server_saw: SocketAddr,
    /// The server's own address on the connection (TCP only: the UDP server is bound to
    /// 0.0.0.0 and does not learn the destination of a datagram).
    pub server_local: Option<SocketAddr>,
}

fn addr(ip: &str, port: u16) -> Result<SocketAddr> {
    Ok(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from_str(ip).with_context(|| format!("bad IPv4 address {ip}"))?,
        port,
    )))
}

/// One TCP connection from `client_ns` to `dst:port`, served in `server_ns`. The server answers
/// with the peer address it saw, which the client returns.
pub fn tcp_probe(client_ns: &str, server_ns: &str, dst: &str, port: u16) -> Result<Probe> {
    let dst = addr(dst, port)?;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = spawn_in_netns(server_ns, move || {
        let l = TcpListener::bind(("0.0.0.0", port)).context("binding the TCP probe server")?;
        l.set_nonblocking(true)?;
        let _ = ready_tx.send(());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match l.accept() {
                Ok((mut s, peer)) => {
                    s.set_nonblocking(false)?;
                    let local = s.local_addr()?;
                    s.write_all(format!("{peer} {local}").as_bytes())?;
                    return Ok(peer);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        bail!("TCP probe server: no connection within 5s");
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e).context("accept"),
            }
        }
    });
    if ready_rx.recv_timeout(Duration::from_secs(5)).is_err() {
        join(server)?;
        bail!("TCP probe server did not start");
    }
    let client = spawn_in_netns(client_ns, move || {
        let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(3))
            .with_context(|| format!("TCP connect to {dst}"))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        let local = s.local_addr()?;
        let mut text = String::new();
        s.read_to_string(&mut text)
            .context("reading the TCP probe answer")?;
        Ok((local, text))
    });
    let client = join(client);
    let server = join(server);
    let (client_local, text) = client?;
    server?;
    let mut w = text.split_whitespace();
    let server_saw: SocketAddr = w
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow!("bad TCP probe answer {text:?}"))?;
    let server_local: SocketAddr = w
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow!("bad TCP probe answer {text:?}"))?;
    Ok(Probe {
        client_local,
        client_dst: dst,
        server_saw,
        server_local: Some(server_local),
    })
}

/// A UDP exchange like [`tcp_probe`] (retried up to 3 times, 1 s each).
pub fn udp_probe(client_ns: &str, server_ns: &str, dst: &str, port: u16) -> Result<Probe> {
    let dst = addr(dst, port)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = {
        let stop = stop.clone();
        spawn_in_netns(server_ns, move || {
            let s = UdpSocket::bind(("0.0.0.0", port)).context("binding the UDP probe server")?;
            s.set_read_timeout(Some(Duration::from_millis(100)))?;
            let _ = ready_tx.send(());
            let deadline = Instant::now() + Duration::from_secs(6);
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                if let Ok((_, peer)) = s.recv_from(&mut buf) {
                    // The reply's source is the address the datagram was sent to.
                    let _ = s.send_to(peer.to_string().as_bytes(), peer);
                }
            }
            Ok(())
        })
    };
    if ready_rx.recv_timeout(Duration::from_secs(5)).is_err() {
        join(server)?;
        bail!("UDP probe server did not start");
    }
    let client = spawn_in_netns(client_ns, move || {
        let s = UdpSocket::bind(("0.0.0.0", 0))?;
        s.connect(dst)?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut buf = [0u8; 64];
        for _ in 0..3 {
            s.send(b"probe")?;
            if let Ok(n) = s.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                return Ok((s.local_addr()?, text));
            }
        }
        bail!("no UDP answer from {dst} after 3 tries")
    });
    let client = join(client);
    stop.store(true, Ordering::Relaxed);
    join(server)?;
    let (client_local, text) = client?;
    let server_saw = text
        .parse()
        .map_err(|_| anyhow!("bad UDP probe answer {text:?}"))?;
    Ok(Probe {
        client_local,
        client_dst: dst,
        server_saw,
        server_local: None,
    })
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

/// New TCP connections per second from `client_ns` to `dst:port` (server in `server_ns`):
/// connect, read the server's one byte until it closes, repeat. Bounded by `duration` and
/// `max_conns`. Returns (connections, elapsed).
pub fn conn_rate(
    client_ns: &str,
    server_ns: &str,
    dst: &str,
    port: u16,
    duration: Duration,
    max_conns: u64,
) -> Result<(u64, Duration)> {
    let dst = addr(dst, port)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = {
        let stop = stop.clone();
        spawn_in_netns(server_ns, move || {
            let l = TcpListener::bind(("0.0.0.0", port)).context("binding the conn-rate server")?;
            // accept() honours SO_RCVTIMEO: wake up regularly to look at `stop`.
            set_rcvtimeo(l.as_raw_fd(), Duration::from_millis(100));
            let _ = ready_tx.send(());
            let mut n = 0u64;
            let hard_deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < hard_deadline {
                if let Ok((mut s, _)) = l.accept() {
                    // The server closes first, so TIME_WAIT stays here and the client's
                    // ephemeral ports are free again at once.
                    let _ = s.write_all(b"x");
                    n += 1;
                }
            }
            Ok(n)
        })
    };
    if ready_rx.recv_timeout(Duration::from_secs(5)).is_err() {
        join(server)?;
        bail!("conn-rate server did not start");
    }
    let client = spawn_in_netns(client_ns, move || {
        let start = Instant::now();
        let mut n = 0u64;
        let mut buf = [0u8; 8];
        while start.elapsed() < duration && n < max_conns {
            let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(2))
                .with_context(|| format!("connection {n} to {dst}"))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            while s.read(&mut buf).context("reading")? > 0 {}
            n += 1;
        }
        Ok((n, start.elapsed()))
    });
    let res = join(client);
    stop.store(true, Ordering::Relaxed);
    join(server)?;
    res
}

/// iperf3 TCP throughput from `client_ns` to `dst` with `streams` parallel streams for
/// `secs` seconds; the server runs in `server_ns`. Returns received bits per second.
pub fn iperf3(
    bed: &mut Testbed,
    client_ns: &str,
    server_ns: &str,
    dst: &str,
    streams: u32,
    secs: u32,
) -> Result<f64> {
    let port = "5201";
    let server = bed.spawn(server_ns, &["iperf3", "-s", "-1", "-p", port])?;
    let streams = streams.to_string();
    let secs_s = secs.to_string();
    let mut last_err = String::new();
    // Retry while the server is still starting up.
    for _ in 0..50 {
        let out = bed.exec_any(
            client_ns,
            &[
                "iperf3", "-c", dst, "-p", port, "-t", &secs_s, "-P", &streams, "-J",
            ],
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let bps = v
            .pointer("/end/sum_received/bits_per_second")
            .and_then(serde_json::Value::as_f64);
        if let (true, Some(bps)) = (out.status.success(), bps) {
            let _ = server.wait(Duration::from_secs(5));
            return Ok(bps);
        }
        last_err = match v.get("error").and_then(|e| e.as_str()) {
            Some(e) => e.to_owned(),
            None => format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
        };
        if !(last_err.contains("refused") || last_err.contains("busy")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("iperf3 to {dst} failed: {}", last_err.trim())
}

/// Sends `bytes` over one TCP connection from `client_ns` to `dst:port` (server in
/// `server_ns`); returns how many bytes the server received. Bounded to 20 s.
pub fn tcp_bulk(
    client_ns: &str,
    server_ns: &str,
    dst: &str,
    port: u16,
    bytes: usize,
) -> Result<usize> {
    tcp_copy(
        client_ns,
        server_ns,
        dst,
        port,
        bytes,
        Duration::from_secs(20),
    )
    .map(|(n, _)| n)
}

/// [`tcp_bulk`] bounded to `limit`: how many bytes the server received, and how long it took
/// from its accepting the connection to the end of the stream.
pub fn tcp_copy(
    client_ns: &str,
    server_ns: &str,
    dst: &str,
    port: u16,
    bytes: usize,
    limit: Duration,
) -> Result<(usize, Duration)> {
    let dst = addr(dst, port)?;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = spawn_in_netns(server_ns, move || {
        let l = TcpListener::bind(("0.0.0.0", port)).context("binding the bulk server")?;
        set_rcvtimeo(l.as_raw_fd(), Duration::from_secs(5));
        let _ = ready_tx.send(());
        let (mut s, _) = l.accept().context("bulk server: no connection within 5s")?;
        let t0 = Instant::now();
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let deadline = t0 + limit;
        let mut buf = vec![0u8; 64 << 10];
        let mut n = 0usize;
        loop {
            let k = s.read(&mut buf).context("bulk server read")?;
            if k == 0 || Instant::now() > deadline {
                break;
            }
            n += k;
        }
        Ok((n, t0.elapsed()))
    });
    if ready_rx.recv_timeout(Duration::from_secs(5)).is_err() {
        join(server)?;
        bail!("bulk server did not start");
    }
    let client = spawn_in_netns(client_ns, move || {
        let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(3))
            .with_context(|| format!("TCP connect to {dst}"))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        let chunk = vec![0x5au8; 64 << 10];
        let mut left = bytes;
        while left > 0 {
            let k = left.min(chunk.len());
            s.write_all(&chunk[..k]).context("bulk client write")?;
            left -= k;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        Ok(())
    });
    let c = join(client);
    let got = join(server)?;
    c?;
    Ok(got)
}

/// A UDP listener on `bind:port` in `ns` that records the source of every datagram it gets
/// until `stop` is set (or 30 s pass). Returns once it is bound; join the handle for the
/// sources.
pub fn udp_sink(
    ns: &str,
    bind: &str,
    port: u16,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Result<Vec<SocketAddr>>>> {
    let bind = addr(bind, port)?;
    let (ready_tx, ready_rx) = mpsc::channel();
    let h = spawn_in_netns(ns, move || {
        let s = UdpSocket::bind(bind).with_context(|| format!("binding {bind}"))?;
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        let _ = ready_tx.send(());
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        let mut buf = [0u8; 64];
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            if let Ok((_, from)) = s.recv_from(&mut buf) {
                seen.push(from);
            }
        }
        Ok(seen)
    });
    if ready_rx.recv_timeout(Duration::from_secs(5)).is_err() {
        join(h)?;
        bail!("UDP sink on {bind} did not start");
    }
    Ok(h)
}

/// Sends `count` datagrams from `ns` to `dst:port`, `gap` apart, ignoring send errors (an
/// ICMP error from an earlier datagram may surface on a later send).
pub fn udp_send(ns: &str, dst: &str, port: u16, count: usize, gap: Duration) -> Result<()> {
    let dst = addr(dst, port)?;
    join(spawn_in_netns(ns, move || {
        let s = UdpSocket::bind(("0.0.0.0", 0))?;
        for _ in 0..count {
            let _ = s.send_to(b"fabric", dst);
            std::thread::sleep(gap);
        }
        Ok(())
    }))
}

/// Request/response at a fixed rate over one TCP connection from `client_ns` to `dst:port`
/// (an echo server in `server_ns`): every `1/rate` s the client sends `size` bytes and waits
/// for the server's echo of them; returns each request's latency (send to last byte back), in
/// send order. A fixed rate, not ping at idle spacing, so that the path is warm as under load
/// (idle wake-ups dominate a slow ping). A request that falls behind its slot is sent at once,
/// without catching up the missed slots (so the count can fall short of `rate * duration`).
pub fn request_response(
    client_ns: &str,
    server_ns: &str,
    dst: &str,
    port: u16,
    rate: u32,
    duration: Duration,
    size: usize,
) -> Result<Vec<Duration>> {
    anyhow::ensure!(rate > 0, "request_response: rate must be above 0");
    anyhow::ensure!(size > 0, "request_response: size must be above 0 bytes");
    let dst = addr(dst, port)?;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = spawn_in_netns(server_ns, move || {
        let l = TcpListener::bind(("0.0.0.0", port)).context("binding the echo server")?;
        set_rcvtimeo(l.as_raw_fd(), Duration::from_secs(5));
        let _ = ready_tx.send(());
        let (mut s, _) = l.accept().context("echo server: no connection within 5s")?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = vec![0u8; size];
        loop {
            match s.read_exact(&mut buf) {
                Ok(()) => s.write_all(&buf).context("echo server write")?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(anyhow!(e).context("echo server read")),
            }
        }
    });
    if ready_rx.recv_timeout(Duration::from_secs(5)).is_err() {
        join(server)?;
        bail!("echo server did not start");
    }
    let client = spawn_in_netns(client_ns, move || {
        let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(3))
            .with_context(|| format!("TCP connect to {dst}"))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let gap = Duration::from_secs_f64(1.0 / f64::from(rate));
        let n = (duration.as_secs_f64() * f64::from(rate)) as u64;
        let req = vec![0x5au8; size];
        let mut resp = vec![0u8; size];
        let mut lat = Vec::with_capacity(n as usize);
        let start = Instant::now();
        for i in 0..n {
            let slot = start + gap * i as u32;
            let now = Instant::now();
            if slot > now {
                std::thread::sleep(slot - now);
            }
            let t = Instant::now();
            s.write_all(&req).with_context(|| format!("request {i}"))?;
            s.read_exact(&mut resp)
                .with_context(|| format!("response {i} (2 s timeout)"))?;
            lat.push(t.elapsed());
        }
        s.shutdown(std::net::Shutdown::Write)?;
        Ok(lat)
    });
    let lat = join(client);
    let srv = join(server);
    let lat = lat?;
    srv?;
    Ok(lat)
}
