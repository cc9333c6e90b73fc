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

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Announcement {
        Announcement {
            cluster_id: "cluster-a".parse().unwrap(),
            auth_url: "https://auth.a.example:8443/fabric".parse().unwrap(),
            roles: [Role::Provider].into(),
        }
    }

    fn strings(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn decode(list: &[Vec<u8>]) -> Result<Announcement, TxtError> {
        Announcement::from_txt(list.iter().map(Vec::as_slice))
    }

    #[test]
    fn encodes_and_decodes_back() {
        let a = good();
        let txt = a.to_txt_strings();
        assert_eq!(
            txt,
            strings(&[
                "txtvers=1",
                "id=cluster-a",
                "auth=https://auth.a.example:8443/fabric",
                "roles=provider"
            ])
        );
        assert_eq!(decode(&txt), Ok(a.clone()));
        let both = Announcement {
            roles: [Role::Provider, Role::Consumer].into(),
            ..a.clone()
        };
        assert_eq!(
            both.to_txt().last(),
            Some(&("roles", "consumer,provider".to_owned()))
        );
        assert_eq!(decode(&both.to_txt_strings()), Ok(both));
        let none = Announcement {
            roles: BTreeSet::new(),
            ..a
        };
        assert_eq!(none.to_txt().len(), 3);
        assert_eq!(decode(&none.to_txt_strings()), Ok(none));
    }

    #[test]
    fn keys_are_case_insensitive_in_any_order_and_unknown_ones_ignored() {
        let txt = strings(&[
            "Roles=provider",
            "future-field=whatever",
            "flag",
            "",
            "AUTH=https://auth.a.example:8443/fabric",
            "ID=cluster-a",
            "TxtVers=1",
        ]);
        assert_eq!(decode(&txt), Ok(good()));
    }

    #[test]
    fn refuses_missing_fields() {
        for (drop, key) in [(0, "txtvers"), (1, "id"), (2, "auth")] {
            let mut txt = good().to_txt_strings();
            txt.remove(drop);
            assert_eq!(decode(&txt), Err(TxtError::Missing { key }));
        }
        assert_eq!(
            decode(&[]),
            Err(TxtError::Missing { key: "txtvers" }),
            "an empty record"
        );
    }

    #[test]
    fn refuses_duplicate_keys_whatever_their_case() {
        let mut txt = good().to_txt_strings();
        txt.push(b"ID=cluster-b".to_vec());
        assert_eq!(
            decode(&txt),
            Err(TxtError::DuplicateKey { key: "id".into() })
        );
        let mut txt = good().to_txt_strings();
        txt.push(b"x=1".to_vec());
        txt.push(b"x".to_vec());
        assert!(matches!(decode(&txt), Err(TxtError::DuplicateKey { .. })));
    }

    #[test]
    fn refuses_versions_it_does_not_speak() {
        let with_version = |v: &str| {
            let mut txt = good().to_txt_strings();
            txt[0] = format!("txtvers={v}").into_bytes();
            decode(&txt)
        };
        assert_eq!(
            with_version("2"),
            Err(TxtError::UnsupportedVersion { version: 2 })
        );
        assert_eq!(
            with_version("4294967295"),
            Err(TxtError::UnsupportedVersion { version: u32::MAX })
        );
        for bad in ["", "0", "01", "+1", " 1", "1.0", "v1", "99999999999"] {
            assert!(
                matches!(with_version(bad), Err(TxtError::BadVersion { .. })),
                "{bad:?}"
            );
        }
        let mut txt = good().to_txt_strings();
        txt[0] = b"txtvers".to_vec();
        assert!(matches!(decode(&txt), Err(TxtError::BadVersion { .. })));
    }

    #[test]
    fn refuses_bad_cluster_ids() {
        for bad in [
            "",
            "Cluster-A",
            "-a",
            "a-",
            "a.b",
            "a_b",
            "a b",
            "é",
            &"a".repeat(64),
        ] {
            let mut txt = good().to_txt_strings();
            txt[1] = format!("id={bad}").into_bytes();
            assert!(
                matches!(decode(&txt), Err(TxtError::BadClusterId { .. })),
                "{bad:?}"
            );
        }
        let mut txt = good().to_txt_strings();
        txt[1] = b"id".to_vec();
        assert!(matches!(decode(&txt), Err(TxtError::BadClusterId { .. })));
    }

    #[test]
    fn authentication_urls_are_https_with_a_host_and_nothing_else() {
        for ok in [
            "https://auth.example",
            "https://auth.example:8443",
            "https://auth.example/peering/v1",
            "https://192.0.2.1:443",
            "https://[2001:db8::1]:8443/x",
        ] {
            assert_eq!(ok.parse::<AuthUrl>().map(|u| u.to_string()), Ok(ok.into()));
        }
        let problem = |s: &str| match s.parse::<AuthUrl>() {
            Err(TxtError::BadAuthUrl { problem, .. }) => Some(problem),
            _ => None,
        };
        use UrlProblem::*;
        assert_eq!(problem("http://auth.example"), Some(NotHttps));
        assert_eq!(problem("HTTPS://auth.example"), Some(NotHttps));
        assert_eq!(problem("ftp://auth.example"), Some(NotHttps));
        assert_eq!(problem("auth.example"), Some(NotHttps));
        assert_eq!(problem(""), Some(NotHttps));
        assert_eq!(problem("https://"), Some(Unparsable));
        assert_eq!(problem("https://user:pw@auth.example"), Some(UserInfo));
        assert_eq!(
            problem("https://auth.example/?token=x"),
            Some(QueryOrFragment)
        );
        assert_eq!(problem("https://auth.example/#x"), Some(QueryOrFragment));
        assert_eq!(problem("https://auth.example:0"), Some(PortZero));
        assert_eq!(problem("https://auth.example:99999"), Some(Unparsable));
        assert_eq!(problem("https://auth.example:x"), Some(Unparsable));
        assert_eq!(problem("https://auth example"), Some(Unparsable));
        assert_eq!(problem("https://auth.example/\n"), Some(Unparsable));
        assert_eq!(problem("https://auth.example/[x]"), Some(BadPath));
        assert_eq!(problem("https://auth.example/a%zz"), Some(BadPath));
        assert_eq!(problem("https://auth.example/a%4"), Some(BadPath));
        assert!(
            "https://auth.example/a%41/@x:y/~"
                .parse::<AuthUrl>()
                .is_ok()
        );
        let long = format!("https://{}.example", "a".repeat(MAX_AUTH_URL_LEN));
        assert_eq!(problem(&long), Some(TooLong));
        let longest = format!("https://a.example/{}", "p".repeat(MAX_AUTH_URL_LEN - 18));
        assert_eq!(longest.len(), MAX_AUTH_URL_LEN);
        let a = Announcement {
            auth_url: longest.parse().unwrap(),
            ..good()
        };
        assert!(a.to_txt_strings().iter().all(|s| s.len() <= MAX_TXT_STRING));
        assert_eq!(decode(&a.to_txt_strings()), Ok(a));
    }

    #[test]
    fn host_and_port_of_an_authentication_url() {
        let hp = |s: &str| s.parse::<AuthUrl>().unwrap().host_port();
        assert_eq!(hp("https://auth.example"), ("auth.example".into(), 443));
        assert_eq!(
            hp("https://auth.example:8443/x"),
            ("auth.example".into(), 8443)
        );
        assert_eq!(
            hp("https://[2001:db8::1]:9443"),
            ("[2001:db8::1]".into(), 9443)
        );
    }

    #[test]
    fn refuses_bad_roles() {
        for bad in [
            "admin",
            "provider,provider",
            "provider,",
            ",",
            "Provider",
            "consumer provider",
        ] {
            let mut txt = good().to_txt_strings();
            txt[3] = format!("roles={bad}").into_bytes();
            assert!(
                matches!(decode(&txt), Err(TxtError::BadRoles { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn refuses_values_that_are_not_utf8_and_keys_that_are_not_ascii() {
        let mut txt = good().to_txt_strings();
        txt[2] = b"auth=https://\xff\xfe.example".to_vec();
        assert_eq!(decode(&txt), Err(TxtError::NotUtf8 { key: "auth" }));
        let mut txt = good().to_txt_strings();
        txt.push(b"k\xffey=1".to_vec());
        assert!(matches!(decode(&txt), Err(TxtError::BadKey { .. })));
        let mut txt = good().to_txt_strings();
        txt.push(b"=value".to_vec());
        assert!(matches!(decode(&txt), Err(TxtError::BadKey { .. })));
        let mut txt = good().to_txt_strings();
        txt.push(b"new\nline=1".to_vec());
        assert!(matches!(decode(&txt), Err(TxtError::BadKey { .. })));
        // A non-UTF-8 value under an unknown key is nobody's business here.
        let mut txt = good().to_txt_strings();
        txt.push(b"blob=\xff".to_vec());
        assert_eq!(decode(&txt), Ok(good()));
    }

    #[test]
    fn refuses_oversized_records() {
        let mut txt = good().to_txt_strings();
        txt.push([b"x=".as_slice(), &[b'y'; 300]].concat());
        assert_eq!(decode(&txt), Err(TxtError::StringTooLong { bytes: 302 }));
        let mut txt = good().to_txt_strings();
        txt.extend((0..20).map(|i| format!("k{i}=v").into_bytes()));
        assert_eq!(decode(&txt), Err(TxtError::TooManyStrings { count: 17 }));
        let mut txt = good().to_txt_strings();
        txt.extend((0..6).map(|i| format!("k{i}={}", "v".repeat(250)).into_bytes()));
        assert!(matches!(decode(&txt), Err(TxtError::TooLarge { .. })));
    }

    #[test]
    fn the_instance_name_is_the_cluster_id() {
        let txt = good().to_txt_strings();
        let strings = || txt.iter().map(Vec::as_slice);
        assert_eq!(
            Announcement::from_instance("cluster-a", strings()),
            Ok(good())
        );
        assert_eq!(
            Announcement::from_instance("cluster-b", strings()),
            Err(TxtError::InstanceMismatch {
                instance: "cluster-b".into(),
                cluster_id: "cluster-a".parse().unwrap()
            })
        );
    }

    /// Records near valid ones (known keys in any case, values from valid, hostile and random
    /// fragments, strings of any bytes): whatever decodes is valid and round-trips, and errors are
    /// one short line. The fuzz target `discovery` explores the same invariants further.
    mod properties {
        use proptest::prelude::*;

        use super::*;

        fn key() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                Just(b"txtvers".to_vec()),
                Just(b"id".to_vec()),
                Just(b"ID".to_vec()),
                Just(b"auth".to_vec()),
                Just(b"roles".to_vec()),
                Just(b"x".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..8),
            ]
        }

        fn value() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                Just(b"1".to_vec()),
                Just(b"2".to_vec()),
                Just(b"cluster-a".to_vec()),
                Just(b"https://auth.example:8443/p".to_vec()),
                Just(b"https://[::1]".to_vec()),
                Just(b"http://auth.example".to_vec()),
                Just(b"https://u@h".to_vec()),
                Just(b"provider,consumer".to_vec()),
                "[ -~]{0,40}".prop_map(String::into_bytes),
                "https://[a-z0-9.:\\[\\]/@?#%-]{0,40}".prop_map(String::into_bytes),
                proptest::collection::vec(any::<u8>(), 0..300),
            ]
        }

        fn entry() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                (key(), value()).prop_map(|(k, v)| [k, b"=".to_vec(), v].concat()),
                key(),
                proptest::collection::vec(any::<u8>(), 0..40),
            ]
        }

        proptest! {
            #[test]
            fn decoded_records_are_valid_and_round_trip(
                strings in prop_oneof![
                    proptest::collection::vec(entry(), 0..20),
                    // A good record's fields, mostly valid values, and maybe more strings.
                    (
                        prop_oneof![
                            3 => "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?".prop_map(String::into_bytes),
                            1 => value(),
                        ],
                        prop_oneof![
                            3 => "https://[a-z0-9.-]{1,20}(:[0-9]{1,5})?(/[a-z0-9/]{0,10})?"
                                .prop_map(String::into_bytes),
                            1 => value(),
                        ],
                        proptest::option::of(prop_oneof![
                            Just(b"consumer".to_vec()),
                            Just(b"consumer,provider".to_vec()),
                            value(),
                        ]),
                        proptest::collection::vec(entry(), 0..2),
                    )
                        .prop_map(|(id, auth, roles, more)| {
                            let mut v = vec![
                                b"txtvers=1".to_vec(),
                                [b"id=".as_slice(), &id].concat(),
                                [b"auth=".as_slice(), &auth].concat(),
                            ];
                            v.extend(roles.map(|r| [b"roles=".as_slice(), &r].concat()));
                            v.extend(more);
                            v
                        }),
                ]
            ) {
                match Announcement::from_txt(strings.iter().map(Vec::as_slice)) {
                    Err(e) => {
                        let msg = e.to_string();
                        prop_assert!(msg.len() < 400 && !msg.chars().any(char::is_control), "{msg:?}");
                    }
                    Ok(a) => {
                        prop_assert!(fabric_api::identity::is_dns_label(a.cluster_id.as_str()));
                        let url = a.auth_url.as_str();
                        prop_assert!(url.starts_with("https://") && url.len() <= MAX_AUTH_URL_LEN);
                        prop_assert!(!url.contains(['?', '#']));
                        let authority = url["https://".len()..].split('/').next().unwrap_or_default();
                        prop_assert!(!authority.contains('@'), "{url}");
                        let txt = a.to_txt_strings();
                        prop_assert!(txt.iter().all(|s| s.len() <= MAX_TXT_STRING));
                        let again = Announcement::from_txt(txt.iter().map(Vec::as_slice));
                        prop_assert_eq!(again, Ok(a));
                    }
                }
            }
        }
    }

    #[test]
    fn errors_show_values_escaped_and_cut_short() {
        let mut txt = good().to_txt_strings();
        txt[1] = format!("id=evil\nFAKE LOG LINE{}", "x".repeat(200)).into_bytes();
        let e = decode(&txt).unwrap_err();
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.contains(r"evil\nFAKE"), "{msg}");
        assert!(msg.len() < 160, "{msg}");
    }
}
