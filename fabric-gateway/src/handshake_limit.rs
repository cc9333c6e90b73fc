//! Per-source handshake limits, free of I/O (the clock is passed in), as kernel WireGuard
//! has them: while the gateway is under handshake load, each source address gets a token
//! bucket (20 handshake messages a second, bursts of 5), so one source flooding valid-looking
//! initiations cannot take every other peer's handshakes down with it.
//!
//! boringtun's limiter, which runs first, only counts handshakes over all sources and, under
//! load, asks for a cookie: a source that got one (for its own, real address) then passes it
//! at any rate, and each of its initiations costs the single receive thread two Diffie-Hellman
//! computations before anything can tell it is garbage or a replay. These buckets are checked
//! after boringtun's (so spoofed sources, which cannot return the cookie, never get a bucket)
//! and before that work. At most one check per datagram: the peers' own state machines are
//! given limiters that never limit.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    time::{Duration, Instant},
};

/// Handshake messages a second one source may send while the gateway is under load.
pub const PER_SOURCE_RATE: u64 = 20;
/// How many of them it may send at once.
pub const PER_SOURCE_BURST: u64 = 5;
/// Sources tracked at most: beyond that, idle ones are forgotten, and while none is idle
/// new sources are refused (only under load, and only sources that returned a cookie).
pub const MAX_SOURCES: usize = 8192;

/// The key a source is limited by: its IPv4 address, or its IPv6 /64 (one host commonly
/// holds a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    V4(u32),
    V6(u64),
}

impl From<IpAddr> for Source {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => Source::V4(a.into()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.into()),
                None => Source::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Nanoseconds of credit, at most `burst * cost`.
    credit: u64,
    last: Instant,
}

/// Whether a handshake message from a source may go on to the (costly) handshake.
#[derive(Debug)]
pub struct SourceLimiter {
    /// Handshake messages a second over all sources before the per-source buckets apply.
    load_threshold: u64,
    window: Instant,
    in_window: u64,
    /// When the count last went over the threshold: the gateway stays under load for a
    /// second after (as the kernel's), so a flood does not get a fresh allowance each second.
    overloaded: Option<Instant>,
    /// Nanoseconds of credit one message costs.
    cost: u64,
    max_credit: u64,
    buckets: HashMap<Source, Bucket>,
    max_sources: usize,
}

impl SourceLimiter {
    /// Per-source buckets apply once more than `load_threshold` handshake messages arrived
    /// within a second (boringtun's limiter starts asking for cookies at its own limit).
    pub fn new(load_threshold: u64, now: Instant) -> Self {
        Self::with_limits(
            load_threshold,
            PER_SOURCE_RATE,
            PER_SOURCE_BURST,
            MAX_SOURCES,
            now,
        )
    }

    pub fn with_limits(
        load_threshold: u64,
        rate: u64,
        burst: u64,
        max_sources: usize,
        now: Instant,
    ) -> Self {
        let cost = 1_000_000_000 / rate.max(1);
        Self {
            load_threshold,
            window: now,
            in_window: 0,
            overloaded: None,
            cost,
            max_credit: cost * burst.max(1),
            buckets: HashMap::new(),
            max_sources,
        }
    }

    /// Counts a handshake message from `src` and says whether it may be processed.
    pub fn allow(&mut self, src: IpAddr, now: Instant) -> bool {
        if now.saturating_duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.in_window = 0;
        }
        self.in_window += 1;
        if self.in_window > self.load_threshold {
            self.overloaded = Some(now);
        }
        let under_load = self
            .overloaded
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1));
        let key = Source::from(src);
        if !self.buckets.contains_key(&key) {
            if !under_load {
                // Not under load: nothing is limited, and a source needs no bucket yet.
                return true;
            }
            if self.buckets.len() >= self.max_sources {
                self.forget_idle(now);
                if self.buckets.len() >= self.max_sources {
                    return false;
                }
            }
            self.buckets.insert(
                key,
                Bucket {
                    credit: self.max_credit,
                    last: now,
                },
            );
        }
        let (cost, max) = (self.cost, self.max_credit);
        let b = self.buckets.get_mut(&key).expect("present");
        let elapsed = now.saturating_duration_since(b.last).as_nanos();
        b.credit = (u128::from(b.credit) + elapsed).min(u128::from(max)) as u64;
        b.last = now;
        if !under_load {
            return true;
        }
        if b.credit >= cost {
            b.credit -= cost;
            true
        } else {
            false
        }
    }

    /// Forgets sources whose bucket has refilled: they hold nothing worth remembering.
    pub fn forget_idle(&mut self, now: Instant) {
        let full = Duration::from_nanos(self.max_credit);
        self.buckets.retain(|_, b| {
            let refill = now.saturating_duration_since(b.last);
            u128::from(b.credit) + refill.as_nanos() < full.as_nanos()
        });
    }

    /// Sources with a bucket.
    pub fn sources(&self) -> usize {
        self.buckets.len()
    }
}

/// The /64 of an IPv6 address, as the limiter keys it (for logs and tests).
pub fn v6_prefix(a: Ipv6Addr) -> u64 {
    (u128::from(a) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Offers `n` messages from `src` spread evenly over `over`, from `t`; returns how many
    /// were allowed.
    fn offer(l: &mut SourceLimiter, src: &str, n: u32, t: Instant, over: Duration) -> u32 {
        (0..n)
            .filter(|i| l.allow(ip(src), t + over * *i / n))
            .count() as u32
    }

    #[test]
    fn nothing_is_limited_below_the_load_threshold() {
        let t = Instant::now();
        let mut l = SourceLimiter::new(100, t);
        // 50 peers behind one address handshaking at once (a restart): all pass.
        assert_eq!(offer(&mut l, "192.0.2.1", 50, t, Duration::ZERO), 50);
        assert_eq!(l.sources(), 0, "no bucket while not under load");
    }

    #[test]
    fn a_flooding_source_is_held_to_its_rate_and_others_pass() {
        let t = Instant::now();
        let mut l = SourceLimiter::new(100, t);
        let sec = Duration::from_secs(1);
        // 10,000 initiations a second from one source, for three seconds; a well-behaved
        // peer's handshake lands in the middle of each second.
        let mut flood_ok = 0;
        for s in 0..3u32 {
            let start = t + sec * s;
            flood_ok += offer(&mut l, "198.51.100.66", 5_000, start, sec / 2);
            assert!(
                l.allow(ip("192.0.2.7"), start + sec / 2),
                "the peer's handshake in second {s} was refused"
            );
            flood_ok += offer(&mut l, "198.51.100.66", 5_000, start + sec / 2, sec / 2);
        }
        // Below the threshold (100 in the first second) nothing is limited; after that the
        // flood gets its burst and 20 a second, and stays limited from one second to the next.
        assert!(flood_ok <= 100 + 5 + 3 * 20, "flood got {flood_ok} through");
        assert!(flood_ok >= 100, "flood got {flood_ok} through");
        // Its neighbour in the same IPv6 /64 shares its bucket; another /64 does not.
        let mut l = SourceLimiter::new(0, t);
        assert_eq!(offer(&mut l, "2001:db8::1", 5, t, Duration::ZERO), 5);
        assert!(!l.allow(ip("2001:db8::2"), t));
        assert!(l.allow(ip("2001:db8:0:1::2"), t));
        assert_eq!(
            v6_prefix("2001:db8::1".parse().unwrap()),
            0x2001_0db8_0000_0000
        );
    }

    #[test]
    fn buckets_refill_and_the_table_is_bounded() {
        let t = Instant::now();
        let mut l = SourceLimiter::with_limits(0, 20, 5, 3, t);
        assert_eq!(offer(&mut l, "10.0.0.1", 10, t, Duration::ZERO), 5);
        // 50 ms buys one more.
        assert!(l.allow(ip("10.0.0.1"), t + Duration::from_millis(50)));
        assert!(!l.allow(ip("10.0.0.1"), t + Duration::from_millis(51)));
        for s in ["10.0.0.2", "10.0.0.3"] {
            assert_eq!(offer(&mut l, s, 10, t, Duration::ZERO), 5);
        }
        // Full, and nobody idle: a new source is refused, under load.
        assert!(!l.allow(ip("10.0.0.4"), t + Duration::from_millis(60)));
        // A second later all are idle again and make room.
        assert!(l.allow(ip("10.0.0.4"), t + Duration::from_secs(2)));
        assert!(l.sources() <= 3);
        // An IPv4-mapped IPv6 source is its IPv4 address.
        let mut l = SourceLimiter::with_limits(0, 20, 1, 8, t);
        assert!(l.allow(ip("10.0.0.9"), t));
        assert!(!l.allow(ip("::ffff:10.0.0.9"), t));
    }
}
