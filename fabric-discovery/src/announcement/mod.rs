//! What a cluster announces about itself, and its DNS-SD TXT encoding.
//!
//! An [`Announcement`] is valid by construction: the cluster id is a DNS label, the
//! authentication URL is `https://` with a host and no credentials, short enough for one TXT
//! string. The TXT record (RFC 6763 §6: strings `key=value`) carries
//!
//! | key | value |
//! |---|---|
//! | `txtvers` | the protocol version, `1` |
//! | `id` | the cluster id, equal to the DNS-SD instance name |
//! | `auth` | the URL of the cluster's authentication service |
//! | `roles` | optional: `consumer`, `provider` or both, comma separated |
//!
//! Decoding takes the record's strings as they came off the wire (mDNS or unicast DNS) and
//! refuses anything it would have to guess about: a record too large, a key twice, a value
//! that is not UTF-8, a field missing or invalid, a version it does not speak. Unknown keys are
//! ignored (RFC 6763 §6.4), so version 1 can grow optional fields. Errors show offending values
//! escaped and cut short, so a hostile record cannot flood or forge log lines.
//!
//! Pure: no I/O here.
use std::{collections::BTreeSet, fmt, str::FromStr};

#[cfg(test)]
mod tests;

/// The DNS-SD service type, without a domain: instances are
/// `<cluster id>._fabric-peering._tcp.<domain>`.
pub const SERVICE: &str = "_fabric-peering._tcp";
/// The protocol version this crate announces and understands.
pub const PROTOCOL_VERSION: u32 = 1;
/// The longest authentication URL: `auth=` and the URL fit in one TXT string (255 bytes).
pub const MAX_AUTH_URL_LEN: usize = 255 - key::AUTH.len() - 1;
/// The largest TXT record accepted (sum of the strings' lengths). Ours is under 300 bytes.
pub const MAX_TXT_BYTES: usize = 1300;
/// The most TXT strings accepted in one record.
pub const MAX_TXT_STRINGS: usize = 16;
/// The longest single TXT string (its length is one byte on the wire).
pub const MAX_TXT_STRING: usize = 255;

/// The TXT keys.
pub mod key {
    pub const VERSION: &str = "txtvers";
    pub const ID: &str = "id";
    pub const AUTH: &str = "auth";
    pub const ROLES: &str = "roles";
}

/// A cluster's id: a DNS label (the rule of `fabric_api::identity`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterId(String);

impl ClusterId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ClusterId {
    type Err = TxtError;

    fn from_str(s: &str) -> Result<Self, TxtError> {
        if fabric_api::identity::is_dns_label(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(TxtError::BadClusterId { value: shown(s) })
        }
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The URL of a cluster's authentication service: `https://host[:port][/path]`, at most
/// [`MAX_AUTH_URL_LEN`] bytes, without user info, query or fragment.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AuthUrl(String);

impl AuthUrl {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The host (a name, or an address; IPv6 in brackets) and port, 443 when not given.
    pub fn host_port(&self) -> (String, u16) {
        let uri: http::Uri = self.0.parse().expect("validated when built");
        let authority = uri.authority().expect("validated when built");
        (
            authority.host().to_owned(),
            authority.port_u16().unwrap_or(443),
        )
    }
}

/// Why a URL is not an authentication URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("longer than {MAX_AUTH_URL_LEN} bytes")]
    TooLong,
    #[error("not https://")]
    NotHttps,
    #[error("not a URL")]
    Unparsable,
    #[error("no host")]
    NoHost,
    #[error("carries user info")]
    UserInfo,
    #[error("carries a query or fragment")]
    QueryOrFragment,
    #[error("port 0")]
    PortZero,
    #[error("has a path with characters a URL path does not take")]
    BadPath,
}

impl FromStr for AuthUrl {
    type Err = TxtError;

    fn from_str(s: &str) -> Result<Self, TxtError> {
        let bad = |problem| TxtError::BadAuthUrl {
            value: shown(s),
            problem,
        };
        if s.len() > MAX_AUTH_URL_LEN {
            return Err(bad(UrlProblem::TooLong));
        }
        // Exactly this prefix: a canonical scheme, so equal URLs compare equal.
        if !s.starts_with("https://") {
            return Err(bad(UrlProblem::NotHttps));
        }
        if s.contains(['?', '#']) {
            return Err(bad(UrlProblem::QueryOrFragment));
        }
        let uri: http::Uri = s.parse().map_err(|_| bad(UrlProblem::Unparsable))?;
        let authority = uri.authority().ok_or(bad(UrlProblem::NoHost))?;
        if authority.as_str().contains('@') {
            return Err(bad(UrlProblem::UserInfo));
        }
        let host = authority.host();
        if host.is_empty() || host == "[]" {
            return Err(bad(UrlProblem::NoHost));
        }
        // `http` lets through characters RFC 3986 refuses in a path (`[`, `"`, `{`, ...), which
        // the ForeignCluster's validation would then refuse.
        if !is_url_path(uri.path()) {
            return Err(bad(UrlProblem::BadPath));
        }
        // `http` accepts a port it cannot read as u16 (`:99999`, `:x`): refuse those too.
        let port_text = authority.as_str().strip_prefix(host).unwrap_or_default();
        if !port_text.is_empty() {
            match authority.port_u16() {
                None => return Err(bad(UrlProblem::Unparsable)),
                Some(0) => return Err(bad(UrlProblem::PortZero)),
                Some(_) => {}
            }
        }
        Ok(Self(s.to_owned()))
    }
}

impl fmt::Display for AuthUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// RFC 3986 `path-abempty`: segments of unreserved characters, sub-delimiters, `:`, `@` and
/// percent-encoded octets.
fn is_url_path(path: &str) -> bool {
    let b = path.as_bytes();
    let pchar = |c: u8| c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&c);
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if !(i + 2 < b.len() && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit()) {
                return false;
            }
            i += 3;
        } else if pchar(b[i]) {
            i += 1;
        } else {
            return false;
        }
    }
    true
}

/// What a cluster offers to do in a peering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Borrows resources from providers.
    Consumer,
    /// Lends resources to consumers.
    Provider,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Consumer => "consumer",
            Role::Provider => "provider",
        }
    }
}

impl FromStr for Role {
    type Err = TxtError;

    fn from_str(s: &str) -> Result<Self, TxtError> {
        match s {
            "consumer" => Ok(Role::Consumer),
            "provider" => Ok(Role::Provider),
            _ => Err(TxtError::BadRoles { value: shown(s) }),
        }
    }
}

/// A cluster's announcement, valid by construction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Announcement {
    pub cluster_id: ClusterId,
    pub auth_url: AuthUrl,
    pub roles: BTreeSet<Role>,
}

/// Why a TXT record is not an announcement.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxtError {
    #[error("TXT record of {bytes} bytes (at most {MAX_TXT_BYTES})")]
    TooLarge { bytes: usize },
    #[error("TXT record of {count} strings (at most {MAX_TXT_STRINGS})")]
    TooManyStrings { count: usize },
    #[error("TXT string of {bytes} bytes (at most {MAX_TXT_STRING})")]
    StringTooLong { bytes: usize },
    #[error("TXT key {key:?} is empty or not printable ASCII")]
    BadKey { key: String },
    #[error("TXT key {key:?} appears more than once")]
    DuplicateKey { key: String },
    #[error("TXT key {key:?} is missing")]
    Missing { key: &'static str },
    #[error("the value of TXT key {key:?} is not UTF-8")]
    NotUtf8 { key: &'static str },
    #[error("txtvers={value:?} is not a version number")]
    BadVersion { value: String },
    #[error("protocol version {version} is not supported (this cluster speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion { version: u32 },
    #[error("cluster id {value:?} is not a DNS label")]
    BadClusterId { value: String },
    #[error("authentication URL {value:?} {problem}")]
    BadAuthUrl { value: String, problem: UrlProblem },
    #[error("roles={value:?}: each role is consumer or provider, at most once")]
    BadRoles { value: String },
    #[error("instance {instance:?} announces cluster id {cluster_id}: they must be equal")]
    InstanceMismatch {
        instance: String,
        cluster_id: ClusterId,
    },
}

impl Announcement {
    /// The TXT record as key/value pairs, in a fixed order (`txtvers` first, RFC 6763 §6.7).
    pub fn to_txt(&self) -> Vec<(&'static str, String)> {
        let mut txt = vec![
            (key::VERSION, PROTOCOL_VERSION.to_string()),
            (key::ID, self.cluster_id.to_string()),
            (key::AUTH, self.auth_url.to_string()),
        ];
        if !self.roles.is_empty() {
            let roles: Vec<&str> = self.roles.iter().map(|r| r.as_str()).collect();
            txt.push((key::ROLES, roles.join(",")));
        }
        txt
    }

    /// The TXT record's strings (`key=value`), as they go on the wire.
    pub fn to_txt_strings(&self) -> Vec<Vec<u8>> {
        self.to_txt()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}").into_bytes())
            .collect()
    }

    /// Decodes a TXT record's strings.
    pub fn from_txt<'a>(strings: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, TxtError> {
        let mut version = None;
        let mut id = None;
        let mut auth = None;
        let mut roles = None;
        let mut seen: BTreeSet<Vec<u8>> = BTreeSet::new();
        let (mut count, mut bytes) = (0usize, 0usize);
        for s in strings {
            count += 1;
            bytes += s.len();
            if count > MAX_TXT_STRINGS {
                return Err(TxtError::TooManyStrings { count });
            }
            if bytes > MAX_TXT_BYTES {
                return Err(TxtError::TooLarge { bytes });
            }
            if s.len() > MAX_TXT_STRING {
                return Err(TxtError::StringTooLong { bytes: s.len() });
            }
            // An empty string is what an empty TXT record holds (RFC 6763 §6.1).
            if s.is_empty() {
                continue;
            }
            let (k, v) = match s.iter().position(|&b| b == b'=') {
                Some(i) => (&s[..i], Some(&s[i + 1..])),
                None => (s, None),
            };
            if k.is_empty() || !k.iter().all(|b| (0x20..0x7f).contains(b)) {
                return Err(TxtError::BadKey {
                    key: shown_bytes(k),
                });
            }
            // Keys are case-insensitive (RFC 6763 §6.4).
            let k = k.to_ascii_lowercase();
            if !seen.insert(k.clone()) {
                return Err(TxtError::DuplicateKey {
                    key: shown_bytes(&k),
                });
            }
            let slot = match k.as_slice() {
                b"txtvers" => (&mut version, key::VERSION),
                b"id" => (&mut id, key::ID),
                b"auth" => (&mut auth, key::AUTH),
                b"roles" => (&mut roles, key::ROLES),
                _ => continue,
            };
            let text = std::str::from_utf8(v.unwrap_or_default())
                .map_err(|_| TxtError::NotUtf8 { key: slot.1 })?;
            *slot.0 = Some(text);
        }
        let version = version.ok_or(TxtError::Missing { key: key::VERSION })?;
        let version = parse_version(version)?;
        if version != PROTOCOL_VERSION {
            return Err(TxtError::UnsupportedVersion { version });
        }
        let cluster_id: ClusterId = id.ok_or(TxtError::Missing { key: key::ID })?.parse()?;
        let auth_url: AuthUrl = auth.ok_or(TxtError::Missing { key: key::AUTH })?.parse()?;
        let roles = match roles {
            None => BTreeSet::new(),
            Some(r) => parse_roles(r)?,
        };
        Ok(Self {
            cluster_id,
            auth_url,
            roles,
        })
    }

    /// Decodes the TXT record of DNS-SD instance `instance` (its first label, unescaped):
    /// the announced cluster id must be the instance name, so one cluster cannot announce
    /// itself under another's name.
    pub fn from_instance<'a>(
        instance: &str,
        strings: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Self, TxtError> {
        let a = Self::from_txt(strings)?;
        if a.cluster_id.as_str() != instance {
            return Err(TxtError::InstanceMismatch {
                instance: shown(instance),
                cluster_id: a.cluster_id,
            });
        }
        Ok(a)
    }
}

/// A decimal version, digits only (no sign, no spaces), without leading zeros.
fn parse_version(v: &str) -> Result<u32, TxtError> {
    let bad = || TxtError::BadVersion { value: shown(v) };
    let digits = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    if !digits || (v.len() > 1 && v.starts_with('0')) {
        return Err(bad());
    }
    match v.parse() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(n) => Ok(n),
    }
}

fn parse_roles(v: &str) -> Result<BTreeSet<Role>, TxtError> {
    let mut roles = BTreeSet::new();
    if v.is_empty() {
        return Ok(roles);
    }
    for r in v.split(',') {
        let role: Role = r
            .parse()
            .map_err(|_| TxtError::BadRoles { value: shown(v) })?;
        if !roles.insert(role) {
            return Err(TxtError::BadRoles { value: shown(v) });
        }
    }
    Ok(roles)
}

/// How many characters of an offending value an error shows.
const SHOWN_CHARS: usize = 64;

/// An offending value for an error message: at most [`SHOWN_CHARS`] characters, with `…` when
/// cut. Messages print it with `{:?}`, which escapes control characters.
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(SHOWN_CHARS).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

fn shown_bytes(b: &[u8]) -> String {
    shown(&String::from_utf8_lossy(b))
}
