//! Busy polling (`busy_poll_us` > 0): one thread serves both directions of every peer.

use std::{
    io,
    os::fd::AsRawFd,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use super::{Gateway, POLL_TIMEOUT, liveness::Heartbeat, peer::Peer, rx::UdpBufs, tx::TunBufs};

fn pollfd(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

impl Gateway {
    /// After traffic it keeps polling without sleeping for `spin`, so a reply that comes back
    /// within the window costs no thread wake-up. Trades CPU for latency.
    pub(super) fn poll_loop(&self, spin: Duration, beat: &Heartbeat) {
        let mut tb = TunBufs::new();
        let mut ub = UdpBufs::new(self);
        let mut seen_gen = u64::MAX;
        let mut peers: Vec<Arc<Peer>> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut last_traffic = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            beat.beat();
            let g = self.peers_gen.load(Ordering::Acquire);
            if g != seen_gen {
                seen_gen = g;
                peers = self.peers();
                fds.clear();
                fds.push(pollfd(self.udp.as_raw_fd()));
                fds.extend(peers.iter().map(|p| pollfd(p.tun.as_raw_fd())));
            }
            let spinning = last_traffic.elapsed() < spin;
            let timeout = if spinning {
                0
            } else {
                POLL_TIMEOUT.as_millis() as libc::c_int
            };
            // SAFETY: fds is a live array of pollfd of the given length.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if r <= 0 {
                if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %io::Error::last_os_error(), "poll failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
                if spinning {
                    // Give way to whatever else wants this CPU (a woken peer thread, the
                    // application): spinning must never delay the packets it waits for.
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
                continue;
            }
            last_traffic = Instant::now();
            if fds[0].revents != 0 {
                self.udp_receive(&mut ub);
            }
            for (pfd, peer) in fds[1..].iter_mut().zip(&peers) {
                if pfd.revents == 0 || peer.stop.load(Ordering::Relaxed) {
                    continue;
                }
                match peer.tun.recv(&mut tb.src) {
                    Ok(Some(n)) => self.tun_packet(peer, n, &mut tb),
                    Ok(None) => {}
                    Err(e) => {
                        // As the threaded reader does: stop reading a broken device (poll
                        // skips negative fds) rather than spin on its error.
                        tracing::error!(peer = %peer.name, error = %e, "TUN read failed; no longer reading it");
                        pfd.fd = -1;
                    }
                }
            }
        }
    }
}
