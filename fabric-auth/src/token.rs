//! Peering tokens on a provider and the peer command that carries one to a consumer.
//!
//! The standing token lives in Secret [`names::secret::PEERING_TOKEN`] and expires after
//! [`STANDING_TTL`] (`fabricctl generate peer-command` makes a new one then); `fabricctl
//! generate peer-command --ttl D` adds a one-time token of its own with an expiry (annotation
//! [`names::annotation::TOKEN_EXPIRES_AT`]), bound to one consumer cluster id when minted
//! with `--consumer-id` ([`bind`]) or else by its first use; `fabricctl token rotate`
//! deletes them all and creates a new standing one, so every token handed out before is
//! refused from then on. The service accepts any Secret labelled
//! [`names::label::PEERING_TOKEN`] in [`names::namespace::PEERING_TOKENS`], where nothing else
//! lives (`fabricctl` creates it when absent, as deploy/ does).
use std::collections::BTreeMap;

use fabric_api::names;
use k8s_openapi::{ByteString, api::core::v1::Secret, jiff::Timestamp};
use kube::api::ObjectMeta;
use ring::rand::SecureRandom;

use crate::validate::TOKEN_FIELD;

/// How long a standing token is accepted: any number of consumers may peer with it, so a
/// leaked one must not stay good for ever.
pub const STANDING_TTL: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// A new token: 32 random bytes, hex.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system's random source works");
    hex::encode(bytes)
}

/// The token Secret (in `namespace`): the standing one when `one_time` is false, else one
/// named after the token's digest; expiring at `expires_at` (none: an admin's own standing
/// token, until rotated).
pub fn secret(
    namespace: &str,
    token: &str,
    one_time: bool,
    expires_at: Option<Timestamp>,
) -> Secret {
    let name = match one_time {
        false => names::secret::PEERING_TOKEN.to_owned(),
        true => {
            let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
            format!(
                "{}-{}",
                names::secret::PEERING_TOKEN,
                &hex::encode(d.as_ref())[..12]
            )
        }
    };
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                names::label::PEERING_TOKEN.to_owned(),
                "true".to_owned(),
            )])),
            annotations: expires_at.map(|t| {
                BTreeMap::from([(
                    names::annotation::TOKEN_EXPIRES_AT.to_owned(),
                    t.to_string(),
                )])
            }),
            ..Default::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            TOKEN_FIELD.to_owned(),
            ByteString(token.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

/// `secret` (a one-time token's) usable for consumer `cluster_id` only.
pub fn bind(mut secret: Secret, cluster_id: &str) -> Secret {
    secret.metadata.annotations.get_or_insert_default().insert(
        names::annotation::TOKEN_CLUSTER_ID.to_owned(),
        cluster_id.to_owned(),
    );
    secret
}

/// The token Secrets (of `secrets`) a revocation of consumer `consumer` removes: the standing
/// token, which the revoked consumer saw (any number of consumers peer with it; the next
/// `fabricctl generate peer-command` makes a new one), and the one-time tokens bound to it.
pub fn revoked_with(secrets: &[Secret], consumer: &str) -> Vec<String> {
    secrets
        .iter()
        .filter(|s| {
            s.metadata.name.as_deref() == Some(names::secret::PEERING_TOKEN)
                || s.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(names::annotation::TOKEN_CLUSTER_ID))
                    .is_some_and(|id| id == consumer)
        })
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

/// The label selector of token Secrets.
pub fn selector() -> String {
    format!("{}=true", names::label::PEERING_TOKEN)
}

/// What a consumer needs to authenticate to a provider: printed by `fabricctl generate
/// peer-command` as one `fabricctl peer out-of-band ...` line.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerCommand {
    pub auth_url: String,
    pub cluster_id: String,
    pub token: String,
    /// See [`crate::tls`]; `None` when the service's certificate is to be verified with a
    /// CA the consumer has.
    pub auth_pin: Option<String>,
}

impl std::fmt::Debug for PeerCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCommand")
            .field("auth_url", &self.auth_url)
            .field("cluster_id", &self.cluster_id)
            .field("auth_pin", &self.auth_pin)
            .finish_non_exhaustive()
    }
}

impl PeerCommand {
    /// The arguments after `fabricctl`.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "peer".to_owned(),
            "out-of-band".to_owned(),
            "--auth-url".to_owned(),
            self.auth_url.clone(),
            "--cluster-id".to_owned(),
            self.cluster_id.clone(),
            "--token".to_owned(),
            self.token.clone(),
        ];
        if let Some(pin) = &self.auth_pin {
            a.extend(["--auth-pin".to_owned(), pin.clone()]);
        }
        a
    }

    /// The command line, quoted for a POSIX shell where needed.
    pub fn shell_line(&self) -> String {
        std::iter::once("fabricctl".to_owned())
            .chain(self.args().iter().map(|a| shell_quote(a)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{TokenRecord, check_token};

    #[test]
    fn generated_tokens_are_accepted_until_they_expire() {
        let t = generate();
        assert_eq!(t.len(), 64);
        assert_ne!(t, generate());
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let later = now + std::time::Duration::from_secs(60);
        let standing = secret("fabric-system", &t, false, Some(later));
        assert_eq!(
            standing.metadata.name.as_deref(),
            Some("fabric-peering-token")
        );
        let short = bind(secret("fabric-system", &generate(), true, Some(later)), "c");
        assert!(
            short
                .metadata
                .name
                .unwrap()
                .starts_with("fabric-peering-token-")
        );
        let records: Vec<_> = [
            secret("fabric-system", &t, false, Some(later)),
            bind(secret("x", "u", true, Some(later)), "c"),
        ]
        .iter()
        .filter_map(TokenRecord::from_secret)
        .collect();
        assert!(check_token(&t, &records, now).unwrap().standing);
        let one_time = check_token("u", &records, now).unwrap();
        assert!(!one_time.standing);
        assert_eq!(one_time.cluster_id.as_deref(), Some("c"));
        assert!(check_token("u", &records, later).is_err());
        assert!(
            check_token(&t, &records, later).is_err(),
            "the standing one expires too"
        );
    }

    #[test]
    fn a_revocation_takes_the_standing_token_and_the_consumers_own() {
        let later = Some("2030-01-01T00:00:00Z".parse().unwrap());
        let secrets = [
            secret("t", &generate(), false, later),
            bind(secret("t", &generate(), true, later), "gone"),
            bind(secret("t", &generate(), true, later), "staying"),
            secret("t", &generate(), true, later),
        ];
        let revoked = revoked_with(&secrets, "gone");
        assert_eq!(revoked.len(), 2, "{revoked:?}");
        assert!(revoked.contains(&names::secret::PEERING_TOKEN.to_owned()));
        assert!(revoked.contains(secrets[1].metadata.name.as_ref().unwrap()));
    }

    #[test]
    fn the_peer_command_is_one_shell_safe_line() {
        let mut c = PeerCommand {
            auth_url: "https://203.0.113.5:31443".to_owned(),
            cluster_id: "provider".to_owned(),
            token: "ab".repeat(32),
            auth_pin: Some(format!("sha256:{}", "0".repeat(64))),
        };
        let line = c.shell_line();
        assert!(line.starts_with("fabricctl peer out-of-band --auth-url https://203.0.113.5:31443 --cluster-id provider --token abab"), "{line}");
        assert!(line.ends_with(&format!("--auth-pin sha256:{}", "0".repeat(64))));
        assert!(!format!("{c:?}").contains("abab"));
        c.auth_url = "https://x/a b'c".to_owned();
        assert!(c.shell_line().contains(r"'https://x/a b'\''c'"));
    }
}
