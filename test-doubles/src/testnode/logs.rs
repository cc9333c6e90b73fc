//! Container logs, free of I/O: the CRI log format the test node writes (one line per output
//! line: `<RFC 3339 time> <stdout|stderr> <F|P> <content>`, as containerd writes them, so the
//! time of every line is known), and the kubelet API's `containerLogs` query (`tailLines`,
//! `sinceSeconds`/`sinceTime`, `timestamps`, `previous`, `follow`, `limitBytes`) applied to it.
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One CRI log line. `content` has no newline; `partial` lines continue in the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub time: Timestamp,
    pub stream: Stream,
    pub partial: bool,
    pub content: Vec<u8>,
}

impl Entry {
    /// The line as written to the log file, newline included.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!(
            "{} {} {} ",
            self.time,
            self.stream.as_str(),
            if self.partial { "P" } else { "F" }
        )
        .into_bytes();
        out.extend_from_slice(&self.content);
        out.push(b'\n');
        out
    }

    /// Parses one line of a log file (without or with its newline); None for anything else.
    pub fn decode(line: &[u8]) -> Option<Entry> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let mut parts = line.splitn(4, |b| *b == b' ');
        let time = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let stream = match parts.next()? {
            b"stdout" => Stream::Stdout,
            b"stderr" => Stream::Stderr,
            _ => return None,
        };
        let partial = match parts.next()? {
            b"P" => true,
            b"F" => false,
            _ => return None,
        };
        Some(Entry {
            time,
            stream,
            partial,
            content: parts.next().unwrap_or_default().to_vec(),
        })
    }

    /// What the client gets for this line: the content, a newline unless partial, and the
    /// time in front with `timestamps`.
    pub fn render(&self, timestamps: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.content.len() + 40);
        if timestamps {
            // RFC 3339 with nanoseconds, as the kubelet prints them.
            out.extend_from_slice(format!("{:.9} ", self.time).as_bytes());
        }
        out.extend_from_slice(&self.content);
        if !self.partial {
            out.push(b'\n');
        }
        out
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum QueryError {
    #[error("invalid value {value:?} for {key}")]
    Invalid { key: String, value: String },
}

/// The options of `GET /containerLogs/NS/POD/CONTAINER`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<usize>,
    /// Only lines at or after this time (from `sinceSeconds` or `sinceTime`).
    pub since: Option<Timestamp>,
    pub limit_bytes: Option<usize>,
}

impl Query {
    /// Parses the URL query; `now` turns `sinceSeconds` into a time.
    pub fn parse(query: &str, now: Timestamp) -> Result<Query, QueryError> {
        let mut q = Query::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let bad = || QueryError::Invalid {
                key: k.to_string(),
                value: v.to_string(),
            };
            let flag = || match v.as_ref() {
                "" | "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(bad()),
            };
            match k.as_ref() {
                "follow" => q.follow = flag()?,
                "previous" => q.previous = flag()?,
                "timestamps" => q.timestamps = flag()?,
                "tailLines" => q.tail_lines = Some(v.parse().map_err(|_| bad())?),
                "limitBytes" => q.limit_bytes = Some(v.parse().map_err(|_| bad())?),
                "sinceSeconds" => {
                    let secs: i64 = v.parse().map_err(|_| bad())?;
                    q.since = Some(
                        now.checked_sub(SignedDuration::from_secs(secs))
                            .map_err(|_| bad())?,
                    );
                }
                "sinceTime" => q.since = Some(v.parse().map_err(|_| bad())?),
                // Unknown options are ignored, as the kubelet does.
                _ => {}
            }
        }
        Ok(q)
    }

    /// Of the lines already written, those to send first: from `since` on, then the last
    /// `tailLines` of them.
    pub fn select<'a>(&self, entries: &'a [Entry]) -> &'a [Entry] {
        let from = match self.since {
            Some(t) => entries.partition_point(|e| e.time < t),
            None => 0,
        };
        let entries = &entries[from..];
        match self.tail_lines {
            Some(n) => &entries[entries.len().saturating_sub(n)..],
            None => entries,
        }
    }

    /// Whether a line written later (while following) is sent.
    pub fn admits(&self, e: &Entry) -> bool {
        self.since.is_none_or(|t| e.time >= t)
    }
}

/// Splits a buffer of log file bytes into its complete lines; returns them and the number of
/// bytes they used (a last line without newline is left for the next read).
pub fn decode_lines(buf: &[u8]) -> (Vec<Entry>, usize) {
    let mut out = Vec::new();
    let mut used = 0;
    while let Some(nl) = buf[used..].iter().position(|b| *b == b'\n') {
        if let Some(e) = Entry::decode(&buf[used..used + nl]) {
            out.push(e);
        }
        used += nl + 1;
    }
    (out, used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn e(s: i64, text: &str) -> Entry {
        Entry {
            time: t(s),
            stream: Stream::Stdout,
            partial: false,
            content: text.as_bytes().to_vec(),
        }
    }

    #[test]
    fn lines_round_trip_through_the_cri_format() {
        let line = Entry {
            time: t(3),
            stream: Stream::Stderr,
            partial: true,
            content: b"a b  c".to_vec(),
        };
        let enc = line.encode();
        assert_eq!(enc, b"2023-11-14T22:13:23Z stderr P a b  c\n");
        assert_eq!(Entry::decode(&enc), Some(line));
        assert_eq!(Entry::decode(b"garbage"), None);
        let (lines, used) = decode_lines(b"2023-11-14T22:13:23Z stdout F x\n2023-11-14T22:13");
        assert_eq!((lines, used), (vec![e(3, "x")], 32));
    }

    #[test]
    fn rendering() {
        assert_eq!(e(0, "hi").render(false), b"hi\n");
        assert_eq!(
            e(0, "hi").render(true),
            b"2023-11-14T22:13:20.000000000Z hi\n"
        );
        let mut p = e(0, "part");
        p.partial = true;
        assert_eq!(p.render(false), b"part");
    }

    #[test]
    fn query_options() {
        let q = Query::parse(
            "follow=true&tailLines=2&timestamps=1&previous=false&sinceSeconds=10",
            t(100),
        )
        .unwrap();
        assert_eq!(
            q,
            Query {
                follow: true,
                previous: false,
                timestamps: true,
                tail_lines: Some(2),
                since: Some(t(90)),
                limit_bytes: None,
            }
        );
        let q = Query::parse("sinceTime=2023-11-14T22%3A13%3A25Z", t(0)).unwrap();
        assert_eq!(q.since, Some(t(5)));
        assert!(Query::parse("tailLines=x", t(0)).is_err());
        assert!(Query::parse("follow=maybe", t(0)).is_err());
    }

    #[test]
    fn since_then_tail() {
        let all: Vec<Entry> = (0..10).map(|i| e(i, &i.to_string())).collect();
        let q = |s: &str| Query::parse(s, t(10)).unwrap();
        assert_eq!(q("").select(&all).len(), 10);
        assert_eq!(q("tailLines=3").select(&all), &all[7..]);
        assert_eq!(q("sinceSeconds=4").select(&all), &all[6..]);
        assert_eq!(q("sinceSeconds=4&tailLines=2").select(&all), &all[8..]);
        assert_eq!(q("tailLines=0").select(&all).len(), 0);
        assert!(!q("sinceSeconds=4").admits(&all[5]));
        assert!(q("sinceSeconds=4").admits(&all[6]));
    }
}
