//! The checks of a request that need no API server: the token against the cluster's peering
//! tokens (and what a one-time token was used for), the CSR against the name the consumer
//! may have, and the cluster id against what the provider already holds under it. Pure: the
//! caller loads the token Secrets and what it holds, and passes the clock.
use fabric_api::{core::v1alpha1::PeerRole, names};
use k8s_openapi::{api::core::v1::Secret, jiff::Timestamp};
use subtle::ConstantTimeEq;
use x509_parser::{
    extensions::ParsedExtension,
    oid_registry::{OID_KEY_TYPE_EC_PUBLIC_KEY, OID_PKCS1_RSAENCRYPTION, OID_SIG_ED25519},
    prelude::{FromDer, X509CertificationRequest},
    public_key::PublicKey,
};

use crate::protocol::{Reason, Refusal};

/// The field of a token Secret holding the token.
pub const TOKEN_FIELD: &str = "token";

/// A peering token as the provider keeps it (a Secret labelled
/// [`names::label::PEERING_TOKEN`] in [`names::namespace::PEERING_TOKENS`]).
#[derive(Clone)]
pub struct TokenRecord {
    /// The Secret's name, for logs.
    pub name: String,
    pub token: Vec<u8>,
    /// After this instant the token is refused; `None`: until rotated.
    pub expires_at: Option<Timestamp>,
    /// The cluster's standing token (Secret [`names::secret::PEERING_TOKEN`]); every other
    /// one is one-time.
    pub standing: bool,
    /// The one cluster id a one-time token may be used for.
    pub cluster_id: Option<String>,
    /// The [`request_digest`] of the request a one-time token was used with.
    pub used_by: Option<String>,
}

impl std::fmt::Debug for TokenRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRecord")
            .field("name", &self.name)
            .field("expires_at", &self.expires_at)
            .field("standing", &self.standing)
            .field("cluster_id", &self.cluster_id)
            .field("used_by", &self.used_by)
            .finish_non_exhaustive()
    }
}

impl TokenRecord {
    /// The record of a token Secret; `None` for a Secret without a token or with an expiry
    /// that does not parse (an admin's typo must not make a token valid forever).
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let token = secret.data.as_ref()?.get(TOKEN_FIELD)?.0.clone();
        if token.is_empty() {
            return None;
        }
        let annotation = |key| {
            secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .cloned()
        };
        let expires_at = match annotation(names::annotation::TOKEN_EXPIRES_AT) {
            Some(t) => Some(t.parse().ok()?),
            None => None,
        };
        let name = secret.metadata.name.clone().unwrap_or_default();
        Some(Self {
            standing: name == names::secret::PEERING_TOKEN,
            name,
            token,
            expires_at,
            cluster_id: annotation(names::annotation::TOKEN_CLUSTER_ID),
            used_by: annotation(names::annotation::TOKEN_USED_BY),
        })
    }
}

fn digest(bytes: &[u8]) -> ring::digest::Digest {
    ring::digest::digest(&ring::digest::SHA256, bytes)
}

/// Which record `presented` is. Every record is compared, in constant time on digests (so
/// neither the position of the first differing byte nor the token length shows in the
/// timing); an expired match is refused as such.
pub fn check_token<'r>(
    presented: &str,
    records: &'r [TokenRecord],
    now: Timestamp,
) -> Result<&'r TokenRecord, Refusal> {
    let presented = digest(presented.as_bytes());
    let mut found = None;
    for r in records {
        let equal: bool = digest(&r.token).as_ref().ct_eq(presented.as_ref()).into();
        if equal {
            found = Some(r);
        }
    }
    match found {
        None => Err(Refusal::new(
            Reason::InvalidToken,
            "the token is not valid (wrong, or revoked by `fabricctl token rotate`): ask the \
             provider admin for a new peer command",
        )),
        Some(r) => match r.expires_at {
            Some(at) if at <= now => Err(Refusal::new(
                Reason::ExpiredToken,
                format!("the token expired at {at}: ask the provider admin for a new peer command"),
            )),
            _ => Ok(r),
        },
    }
}

/// A request's fingerprint, as the service records it: the digest of its CSR (a retry of
/// the same request sends the same CSR; another key makes another CSR).
pub fn request_digest(csr_pem: &str) -> String {
    hex::encode(&digest(csr_pem.as_bytes()).as_ref()[..16])
}

/// How a (valid, unexpired) token may serve a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenUse {
    /// The standing token: any number of ids, until it expires or is rotated.
    Standing,
    /// A one-time token's one use: the service records it on the token before it writes
    /// anything else.
    First,
    /// The request that was a one-time token's one use, sent again (its answer was lost).
    Retry,
}

/// Whether `record` may serve a request of `cluster_id` whose [`request_digest`] is
/// `request`: a one-time token serves one id (the one it was minted for, else the first that
/// used it) and one request.
pub fn check_use(
    record: &TokenRecord,
    cluster_id: &str,
    request: &str,
) -> Result<TokenUse, Refusal> {
    if record.standing {
        return Ok(TokenUse::Standing);
    }
    if record
        .cluster_id
        .as_deref()
        .is_some_and(|b| b != cluster_id)
    {
        return Err(Refusal::new(
            Reason::TokenBound,
            "this token was issued for another cluster id: ask the provider admin for a peer \
             command of your own",
        ));
    }
    match &record.used_by {
        None => Ok(TokenUse::First),
        Some(u) if u == request => Ok(TokenUse::Retry),
        Some(_) => Err(Refusal::new(
            Reason::TokenUsed,
            "this one-time token was used already: ask the provider admin for a new peer command",
        )),
    }
}

/// What the provider holds under a cluster id, as far as a peering request is concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Its Tenant, when there is one not being removed, with the [`request_digest`] of the
    /// request that created it.
    pub tenant: Option<Option<String>>,
    /// The role of its ForeignCluster, when there is one.
    pub peer_role: Option<PeerRole>,
    /// Its tenant namespace, when it exists: whether the service created it (its labels).
    pub namespace_ours: Option<bool>,
}

/// Whether a request with [`request_digest`] `request` may create the tenant of `id` given
/// what the provider holds under that id. A tenant there is renewed only by its current
/// certificate (`/v1/renew`), never re-issued to whoever holds a token, except for the very
/// request that created it, retried. An id that is a provider of this cluster, or whose tenant
/// namespace someone else made, is refused, unless (for a provider) the token was minted
/// for that id (`bound`): the provider admin then meant it, as for clusters peered both ways.
pub fn check_id(id: &str, held: &Holdings, request: &str, bound: bool) -> Result<(), Refusal> {
    if let Some(made_by) = &held.tenant {
        if made_by.as_deref() == Some(request) {
            return Ok(());
        }
        return Err(Refusal::new(
            Reason::AlreadyPeered,
            format!(
                "cluster {id} already has a tenant on this provider: its identity is renewed with \
                 its current certificate, never re-issued; to peer it again, the provider admin \
                 removes the tenant first (kubectl delete tenant {id} -n {})",
                names::namespace::tenant(id)
            ),
        ));
    }
    if held.namespace_ours == Some(false) {
        return Err(Refusal::new(
            Reason::IdTaken,
            format!(
                "namespace {} exists here and was not made by the authentication service: \
                 cluster id {id} cannot peer with this provider",
                names::namespace::tenant(id)
            ),
        ));
    }
    let provider = matches!(
        held.peer_role,
        Some(PeerRole::Provider | PeerRole::ConsumerAndProvider)
    );
    if provider && !bound {
        return Err(Refusal::new(
            Reason::IdTaken,
            format!(
                "cluster {id} is a provider of this cluster: it peers as a consumer only with a \
                 token minted for it (`fabricctl generate peer-command --consumer-id {id}`, or \
                 `fabricctl peer` in band)"
            ),
        ));
    }
    Ok(())
}

/// Whether the labels of an existing tenant namespace of `id` are those the service gives it.
pub fn namespace_is_ours(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    id: &str,
) -> bool {
    labels.is_some_and(|l| {
        l.get(names::label::TENANT_NAMESPACE).map(String::as_str) == Some("true")
            && l.get(names::label::REMOTE_CLUSTER).map(String::as_str) == Some(id)
    })
}

/// Key types and sizes the service signs: what Kubernetes' API server accepts for client
/// certificates and is strong enough.
fn check_key(csr: &X509CertificationRequest<'_>) -> Result<(), String> {
    let spki = &csr.certification_request_info.subject_pki;
    let alg = &spki.algorithm.algorithm;
    if *alg == OID_SIG_ED25519 {
        return Ok(());
    }
    let key = spki
        .parsed()
        .map_err(|e| format!("has a public key that does not parse: {e}"))?;
    match key {
        PublicKey::EC(ref p) if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY => match p.key_size() {
            256 | 384 => Ok(()),
            n => Err(format!("has an EC key of {n} bits; use P-256 or P-384")),
        },
        PublicKey::RSA(ref rsa) if *alg == OID_PKCS1_RSAENCRYPTION => match rsa.key_size() {
            2048..=8192 => Ok(()),
            n => Err(format!(
                "has an RSA key of {n} bits; use 2048 to 8192 (or an EC P-256 key)"
            )),
        },
        _ => Err(
            "has a key type that is not accepted; use EC P-256/P-384, Ed25519 or RSA".to_owned(),
        ),
    }
}

/// Checks that `pem` is one PKCS#10 request, signed by its own key (so the consumer holds
/// it), for user [`names::user::consumer`]`(consumer)` in group
/// [`names::user::CONSUMERS_GROUP`] and one group [`names::user::peering`]`(consumer, nonce)`
/// and nothing else, with an accepted key and no subject alternative names (the client signer
/// would copy them into the certificate). Returns that peering group.
pub fn check_csr(pem: &str, consumer: &str) -> Result<String, Refusal> {
    let bad = |why: String| Refusal::new(Reason::InvalidCsr, format!("the CSR {why}"));
    let (rest, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|_| bad("is not PEM".to_owned()))?;
    if pem.label != "CERTIFICATE REQUEST" && pem.label != "NEW CERTIFICATE REQUEST" {
        return Err(bad(format!(
            "is a PEM {:?}, not a CERTIFICATE REQUEST",
            pem.label
        )));
    }
    if !String::from_utf8_lossy(rest).trim().is_empty() {
        return Err(bad("has data after the request".to_owned()));
    }
    let (rest, csr) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| bad(format!("does not parse: {e}")))?;
    if !rest.is_empty() {
        return Err(bad("has bytes after the request".to_owned()));
    }
    // The key first: ring refuses to verify with keys it deems weak, which would read as a
    // forgery.
    check_key(&csr).map_err(bad)?;
    csr.verify_signature()
        .map_err(|e| bad(format!("is not signed by its key: {e}")))?;

    let subject = &csr.certification_request_info.subject;
    let user = names::user::consumer(consumer);
    let cns: Vec<_> = subject
        .iter_common_name()
        .map(|a| a.as_str().unwrap_or(""))
        .collect();
    if cns != [user.as_str()] {
        return Err(bad(format!(
            "must name CN={user} (it names {cns:?}): a consumer asks only for its own name"
        )));
    }
    let orgs: Vec<_> = subject
        .iter_organization()
        .map(|a| a.as_str().unwrap_or(""))
        .collect();
    let wanted = || {
        format!(
            "must name O={} and one O={} and no other group (it names {orgs:?})",
            names::user::CONSUMERS_GROUP,
            names::user::peering(consumer, "<nonce>")
        )
    };
    let peering = match orgs[..] {
        [a, b] if a == names::user::CONSUMERS_GROUP => b,
        [a, b] if b == names::user::CONSUMERS_GROUP => a,
        _ => return Err(bad(wanted())),
    };
    if peering_nonce(peering, consumer).is_none() {
        return Err(bad(wanted()));
    }
    if subject.iter_attributes().count() != 3 {
        return Err(bad("has subject attributes other than CN and O".to_owned()));
    }
    if let Some(mut exts) = csr.requested_extensions()
        && exts.any(|e| matches!(e, ParsedExtension::SubjectAlternativeName(_)))
    {
        return Err(bad("asks for subject alternative names".to_owned()));
    }
    Ok(peering.to_owned())
}

/// The nonce of `group` when it is a [`names::user::peering`] group of `consumer` (a nonce of
/// 1 to 64 lowercase letters, digits and '-').
fn peering_nonce<'g>(group: &'g str, consumer: &str) -> Option<&'g str> {
    let (id, nonce) = group
        .strip_prefix(names::user::PEERING_PREFIX)?
        .split_once(':')?;
    let ok = id == consumer
        && (1..=64).contains(&nonce.len())
        && nonce
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(nonce)
}

/// The [`names::user::peering`] group of consumer `consumer` that client certificate
/// `cert_der` (already verified against the client CA) carries, if exactly one.
pub fn peering_of(cert_der: &[u8], consumer: &str) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let mut groups = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .filter(|g| peering_nonce(g, consumer).is_some());
    let group = groups.next()?;
    groups.next().is_none().then(|| group.to_owned())
}

/// [`peering_of`] the first certificate of a PEM.
pub fn peering_of_pem(pem: &str, consumer: &str) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    peering_of(&pem.contents, consumer)
}

/// When the first certificate in `pem` expires.
pub fn certificate_expiry(pem: &str) -> Option<Timestamp> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&pem.contents).ok()?;
    Timestamp::from_second(cert.validity().not_after.timestamp()).ok()
}

/// [`consumer_of`] the first certificate of a PEM.
pub fn consumer_of_pem(pem: &str) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    consumer_of(&pem.contents)
}

/// The consumer a client certificate (DER, already verified against the client CA) names:
/// CN [`names::user::consumer`]`(id)` with O [`names::user::CONSUMERS_GROUP`] among its
/// groups, and a DNS-label id.
pub fn consumer_of(cert_der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let subject = cert.subject();
    let mut cns = subject.iter_common_name();
    let cn = cns.next()?.as_str().ok()?;
    if cns.next().is_some() {
        return None;
    }
    let in_group = subject
        .iter_organization()
        .any(|o| o.as_str() == Ok(names::user::CONSUMERS_GROUP));
    let id = cn.strip_prefix(&names::user::consumer(""))?;
    (in_group && fabric_api::identity::is_dns_label(id)).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    use super::*;

    fn csr_with(dn: &[(DnType, &str)], key: &KeyPair, sans: Vec<SanType>) -> String {
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        for (t, v) in dn {
            name.push(t.clone(), *v);
        }
        params.distinguished_name = name;
        params.subject_alt_names = sans;
        params.serialize_request(key).unwrap().pem().unwrap()
    }

    /// rcgen keeps one value per attribute type: a second O under its OID.
    fn second_o() -> DnType {
        DnType::CustomDnType(vec![2, 5, 4, 10])
    }

    fn good_dn(id: &str) -> Vec<(DnType, String)> {
        vec![
            (DnType::CommonName, names::user::consumer(id)),
            (
                DnType::OrganizationName,
                names::user::CONSUMERS_GROUP.to_owned(),
            ),
            (second_o(), names::user::peering(id, "n1")),
        ]
    }

    fn csr(dn: &[(DnType, String)], key: &KeyPair) -> String {
        let dn: Vec<_> = dn.iter().map(|(t, v)| (t.clone(), v.as_str())).collect();
        csr_with(&dn, key, vec![])
    }

    #[test]
    fn the_consumers_own_request_passes() {
        let key = KeyPair::generate().unwrap();
        assert_eq!(
            check_csr(&csr(&good_dn("alpha"), &key), "alpha").unwrap(),
            "fabric.io:peering:alpha:n1"
        );
        let ed = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        check_csr(&csr(&good_dn("alpha"), &ed), "alpha").unwrap();
        let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        check_csr(&csr(&good_dn("alpha"), &p384), "alpha").unwrap();
    }

    #[test]
    fn requests_for_another_name_or_more_are_refused() {
        let key = KeyPair::generate().unwrap();
        let refuse = |pem: String, what: &str| {
            let e = check_csr(&pem, "alpha").unwrap_err();
            assert_eq!(e.reason, Reason::InvalidCsr);
            assert!(e.message.contains(what), "{}: wanted {what}", e.message);
        };
        refuse(csr(&good_dn("beta"), &key), "CN=fabric.io:consumer:alpha");
        let mut masters = good_dn("alpha");
        masters[1].1 = "system:masters".to_owned();
        refuse(csr(&masters, &key), "no other group");
        let mut two_groups = good_dn("alpha");
        two_groups.push((DnType::OrganizationName, "system:masters".to_owned()));
        refuse(csr(&two_groups, &key), "no other group");
        let mut extra = good_dn("alpha");
        extra.push((DnType::OrganizationalUnitName, "x".to_owned()));
        refuse(csr(&extra, &key), "other than CN and O");
        refuse(csr(&good_dn("alpha")[..1], &key), "no other group");
        refuse(csr(&good_dn("alpha")[..2], &key), "no other group");
        for peering in [
            names::user::peering("beta", "n1"),
            names::user::peering("alpha", ""),
            names::user::peering("alpha", "N1"),
            names::user::peering("alpha", &"n".repeat(65)),
            "fabric.io:peering:alpha".to_owned(),
        ] {
            let mut other = good_dn("alpha");
            other[2].1 = peering;
            refuse(csr(&other, &key), "no other group");
        }
        let dn: Vec<_> = good_dn("alpha");
        let dn: Vec<_> = dn.iter().map(|(t, v)| (t.clone(), v.as_str())).collect();
        refuse(
            csr_with(
                &dn,
                &key,
                vec![SanType::DnsName("kubernetes".try_into().unwrap())],
            ),
            "subject alternative names",
        );
    }

    #[test]
    fn garbage_and_forgeries_are_refused() {
        let key = KeyPair::generate().unwrap();
        let good = csr(&good_dn("alpha"), &key);
        for (pem, what) in [
            ("".to_owned(), "not PEM"),
            ("hello".to_owned(), "not PEM"),
            (key.serialize_pem(), "not a CERTIFICATE REQUEST"),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
                    .to_owned(),
                "does not parse",
            ),
            (format!("{good}{good}"), "data after"),
        ] {
            let e = check_csr(&pem, "alpha").unwrap_err();
            assert!(e.message.contains(what), "{}: wanted {what}", e.message);
        }
        // A request whose signature does not match its key: flip a byte of the signature.
        let (_, p) = x509_parser::pem::parse_x509_pem(good.as_bytes()).unwrap();
        let mut der = p.contents.clone();
        let last = der.len() - 1;
        der[last] ^= 0x55;
        let forged = pem_of(&der);
        let e = check_csr(&forged, "alpha").unwrap_err();
        assert!(e.message.contains("not signed by its key"), "{}", e.message);
    }

    fn pem_of(der: &[u8]) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<_> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            lines.join("\n")
        )
    }

    fn secret(name: &str, token: &str, expires: Option<&str>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                annotations: expires.map(|e| {
                    BTreeMap::from([(names::annotation::TOKEN_EXPIRES_AT.to_owned(), e.to_owned())])
                }),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                TOKEN_FIELD.to_owned(),
                ByteString(token.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn a_client_certificate_names_its_consumer() {
        let key = KeyPair::generate().unwrap();
        let cert = |dn: &[(DnType, String)]| {
            let mut p = CertificateParams::default();
            p.distinguished_name = DistinguishedName::new();
            for (t, v) in dn {
                p.distinguished_name.push(t.clone(), v.as_str());
            }
            p.self_signed(&key).unwrap().der().to_vec()
        };
        assert_eq!(
            consumer_of(&cert(&good_dn("alpha"))).as_deref(),
            Some("alpha")
        );
        assert_eq!(consumer_of(&cert(&good_dn("alpha")[..1])), None, "no group");
        let mut admin = good_dn("alpha");
        admin[0].1 = "kubelite-admin".to_owned();
        assert_eq!(consumer_of(&cert(&admin)), None);
        assert_eq!(consumer_of(&cert(&good_dn("Not_A_Label"))), None);
        assert_eq!(consumer_of(b"garbage"), None);
        assert_eq!(
            peering_of(&cert(&good_dn("alpha")), "alpha").as_deref(),
            Some("fabric.io:peering:alpha:n1")
        );
        assert_eq!(peering_of(&cert(&good_dn("alpha")), "beta"), None);
        assert_eq!(peering_of(&cert(&good_dn("alpha")[..2]), "alpha"), None);
    }

    fn one_time(cluster_id: Option<&str>, used_by: Option<&str>) -> TokenRecord {
        TokenRecord {
            name: "fabric-peering-token-abc".to_owned(),
            token: b"t".to_vec(),
            expires_at: None,
            standing: false,
            cluster_id: cluster_id.map(str::to_owned),
            used_by: used_by.map(str::to_owned),
        }
    }

    #[test]
    fn a_one_time_token_serves_one_request_of_one_id() {
        let standing = TokenRecord {
            standing: true,
            ..one_time(None, None)
        };
        assert_eq!(check_use(&standing, "a", "r1"), Ok(TokenUse::Standing));
        assert_eq!(
            check_use(&one_time(None, None), "a", "r1"),
            Ok(TokenUse::First)
        );
        let named = one_time(Some("a"), None);
        assert_eq!(check_use(&named, "a", "r1"), Ok(TokenUse::First));
        assert_eq!(
            check_use(&named, "b", "r1").unwrap_err().reason,
            Reason::TokenBound
        );
        let used = one_time(Some("a"), Some("r1"));
        assert_eq!(check_use(&used, "a", "r1"), Ok(TokenUse::Retry));
        assert_eq!(
            check_use(&used, "a", "r2").unwrap_err().reason,
            Reason::TokenUsed
        );
        assert_eq!(
            check_use(&used, "b", "r1").unwrap_err().reason,
            Reason::TokenBound
        );
    }

    #[test]
    fn an_id_held_here_is_refused_to_a_token_holder() {
        let free = Holdings::default();
        check_id("a", &free, "r1", false).unwrap();
        let tenant = Holdings {
            tenant: Some(Some("r1".to_owned())),
            namespace_ours: Some(true),
            peer_role: Some(PeerRole::Consumer),
        };
        check_id("a", &tenant, "r1", false).expect("the same request, retried");
        for bound in [false, true] {
            let e = check_id("a", &tenant, "r2", bound).unwrap_err();
            assert_eq!(e.reason, Reason::AlreadyPeered);
            assert!(
                e.message.contains("kubectl delete tenant a"),
                "{}",
                e.message
            );
        }
        let unmarked = Holdings {
            tenant: Some(None),
            ..Default::default()
        };
        assert_eq!(
            check_id("a", &unmarked, "r1", false).unwrap_err().reason,
            Reason::AlreadyPeered
        );
        let foreign_ns = Holdings {
            namespace_ours: Some(false),
            ..Default::default()
        };
        assert_eq!(
            check_id("a", &foreign_ns, "r1", true).unwrap_err().reason,
            Reason::IdTaken
        );
        for role in [PeerRole::Provider, PeerRole::ConsumerAndProvider] {
            let provider = Holdings {
                peer_role: Some(role),
                ..Default::default()
            };
            let e = check_id("a", &provider, "r1", false).unwrap_err();
            assert_eq!(e.reason, Reason::IdTaken);
            assert!(e.message.contains("--consumer-id a"), "{}", e.message);
            check_id("a", &provider, "r1", true).expect("a token minted for it");
        }
        for role in [PeerRole::Unknown, PeerRole::Consumer] {
            let known = Holdings {
                peer_role: Some(role),
                namespace_ours: Some(true),
                ..Default::default()
            };
            check_id("a", &known, "r1", false).unwrap();
        }
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let ours = labels(&[
            (names::label::TENANT_NAMESPACE, "true"),
            (names::label::REMOTE_CLUSTER, "a"),
        ]);
        assert!(namespace_is_ours(Some(&ours), "a"));
        assert!(!namespace_is_ours(Some(&ours), "b"));
        assert!(!namespace_is_ours(
            Some(&labels(&[(names::label::REMOTE_CLUSTER, "a")])),
            "a"
        ));
        assert!(!namespace_is_ours(None, "a"));
    }

    #[test]
    fn tokens_match_exactly_and_expire() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let records: Vec<_> = [
            secret("standing", "aaaa", None),
            secret("short", "bbbb", Some("2025-12-31T23:59:59Z")),
            secret("later", "cccc", Some("2026-01-01T00:00:01Z")),
            secret("typo", "dddd", Some("tomorrow")),
        ]
        .iter()
        .filter_map(TokenRecord::from_secret)
        .collect();
        assert_eq!(
            records.len(),
            3,
            "a token with an unreadable expiry is no token"
        );
        assert_eq!(check_token("aaaa", &records, now).unwrap().name, "standing");
        assert_eq!(check_token("cccc", &records, now).unwrap().name, "later");
        let e = check_token("bbbb", &records, now).unwrap_err();
        assert_eq!(e.reason, Reason::ExpiredToken);
        assert!(e.message.contains("ask the provider admin"));
        for wrong in ["aaa", "aaaaa", "AAAA", "dddd", ""] {
            let e = check_token(wrong, &records, now).unwrap_err();
            assert_eq!(e.reason, Reason::InvalidToken, "{wrong}");
        }
        assert!(check_token("aaaa", &[], now).is_err());
    }
}
