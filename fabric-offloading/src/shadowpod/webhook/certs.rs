//! The webhook's certificates, without cert-manager: a CA of its own (its certificate is the
//! `caBundle` the API server verifies the webhook with) and a serving certificate it signs for
//! the Service's DNS name. What to renew is a pure function of the current material and the
//! clock ([`plan`]); [`issue`] makes the new material.
//!
//! Why a CA rather than a self-signed serving certificate in `caBundle`: renewing the serving
//! certificate then leaves `caBundle` as it is, so replicas that still serve the previous
//! certificate (until their next refresh) and those serving the new one are both trusted.
//! Only a new CA (ten years, or a deleted Secret) changes `caBundle`.
use ::time::{Duration, OffsetDateTime};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use x509_parser::{certificate::X509Certificate, extensions::GeneralName, prelude::FromDer};

/// The CA's lifetime.
pub const CA_VALIDITY: Duration = Duration::days(3650);
/// The serving certificate's lifetime.
pub const SERVING_VALIDITY: Duration = Duration::days(365);
/// Either is replaced this long before it expires.
pub const RENEW_BEFORE: Duration = Duration::days(30);

const CA_NAME: &str = "fabric-shadowpod-webhook-ca";

/// The webhook's TLS material (PEM), as kept in its Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
}

/// What to do with the current material.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    Keep,
    /// A new serving certificate signed by the current CA.
    Serving,
    /// A new CA and serving certificate (none yet, or the CA is unusable or expiring).
    Fresh,
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

fn parsed(pem: &str) -> Option<Vec<u8>> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    (p.label == "CERTIFICATE").then_some(p.contents)
}

fn expires_soon(cert: &X509Certificate<'_>, now: OffsetDateTime) -> bool {
    let not_after = cert.validity().not_after.timestamp();
    not_after - now.unix_timestamp() < RENEW_BEFORE.whole_seconds()
}

fn names_all(cert: &X509Certificate<'_>, hosts: &[String]) -> bool {
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return hosts.is_empty();
    };
    hosts.iter().all(|h| {
        san.value
            .general_names
            .iter()
            .any(|n| matches!(n, GeneralName::DNSName(d) if d.eq_ignore_ascii_case(h)))
    })
}

/// What to renew of `current` at `now` for a serving certificate naming `hosts`: a CA that
/// does not parse, is not a CA, does not match its key or expires within [`RENEW_BEFORE`] is
/// replaced with everything; a serving certificate that does not parse, is not signed by the
/// CA, misses one of `hosts` or expires within [`RENEW_BEFORE`] is re-issued.
pub fn plan(now: OffsetDateTime, current: Option<&Material>, hosts: &[String]) -> Plan {
    let Some(m) = current else {
        return Plan::Fresh;
    };
    let Some(ca_der) = parsed(&m.ca_cert) else {
        return Plan::Fresh;
    };
    let Ok((_, ca)) = X509Certificate::from_der(&ca_der) else {
        return Plan::Fresh;
    };
    let key_matches = KeyPair::from_pem(&m.ca_key)
        .is_ok_and(|k| k.public_key_raw() == ca.public_key().subject_public_key.data.as_ref());
    if !ca.is_ca() || !key_matches || expires_soon(&ca, now) {
        return Plan::Fresh;
    }
    let Some(der) = parsed(&m.cert) else {
        return Plan::Serving;
    };
    let Ok((_, cert)) = X509Certificate::from_der(&der) else {
        return Plan::Serving;
    };
    let signed = cert.verify_signature(Some(ca.public_key())).is_ok();
    let key_matches = KeyPair::from_pem(&m.key)
        .is_ok_and(|k| k.public_key_raw() == cert.public_key().subject_public_key.data.as_ref());
    if !signed || !key_matches || !names_all(&cert, hosts) || expires_soon(&cert, now) {
        return Plan::Serving;
    }
    Plan::Keep
}

fn ca_params(now: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - Duration::hours(1);
    params.not_after = now + CA_VALIDITY;
    params
}

/// New material for `plan` at `now`: a serving certificate for `hosts`, signed by the CA of
/// `current` ([`Plan::Serving`]) or by a new one ([`Plan::Fresh`]). `Keep` returns `current`.
pub fn issue(
    plan: Plan,
    now: OffsetDateTime,
    current: Option<&Material>,
    hosts: &[String],
) -> Result<Material, CertError> {
    let (ca_cert, ca_key) = match (plan, current) {
        (Plan::Keep, Some(m)) => return Ok(m.clone()),
        (Plan::Serving, Some(m)) => (m.ca_cert.clone(), m.ca_key.clone()),
        _ => {
            let key = KeyPair::generate()?;
            let cert = ca_params(now).self_signed(&key)?;
            (cert.pem(), key.serialize_pem())
        }
    };
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, KeyPair::from_pem(&ca_key)?)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().map_or("webhook", String::as_str),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.not_before = now - Duration::hours(1);
    params.not_after = now + SERVING_VALIDITY;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Material {
        ca_cert,
        ca_key,
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::{
        client::danger::ServerCertVerifier,
        pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
    };

    use super::*;

    fn hosts() -> Vec<String> {
        vec!["fabric-shadowpod-webhook.fabric-system.svc".to_owned()]
    }

    #[test]
    fn fresh_material_verifies_against_its_ca_and_is_kept() {
        let now = OffsetDateTime::now_utc();
        assert_eq!(plan(now, None, &hosts()), Plan::Fresh);
        let m = issue(Plan::Fresh, now, None, &hosts()).unwrap();
        assert_eq!(plan(now, Some(&m), &hosts()), Plan::Keep);

        // As the API server does: the serving chain against caBundle, for the Service's name.
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(m.ca_cert.as_bytes()).unwrap())
            .unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            fabric_http::https::provider(),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(m.cert.as_bytes()).unwrap();
        let name = ServerName::try_from(hosts()[0].clone()).unwrap();
        verifier
            .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
            .unwrap();
        fabric_http::https::server_config(&m.cert, &m.key, None).unwrap();
    }

    #[test]
    fn the_serving_certificate_is_renewed_under_the_same_ca() {
        let now = OffsetDateTime::now_utc();
        let m = issue(Plan::Fresh, now, None, &hosts()).unwrap();
        let later = now + SERVING_VALIDITY - RENEW_BEFORE + Duration::minutes(1);
        assert_eq!(plan(later, Some(&m), &hosts()), Plan::Serving);
        let renewed = issue(Plan::Serving, later, Some(&m), &hosts()).unwrap();
        assert_eq!(renewed.ca_cert, m.ca_cert, "caBundle stays as it is");
        assert_ne!(renewed.cert, m.cert);
        assert_eq!(plan(later, Some(&renewed), &hosts()), Plan::Keep);

        let other_name = vec!["other.fabric-system.svc".to_owned()];
        assert_eq!(plan(now, Some(&m), &other_name), Plan::Serving);
        let foreign = issue(Plan::Fresh, now, None, &hosts()).unwrap();
        let mixed = Material {
            cert: foreign.cert.clone(),
            key: foreign.key.clone(),
            ..m.clone()
        };
        assert_eq!(
            plan(now, Some(&mixed), &hosts()),
            Plan::Serving,
            "signed by another CA"
        );
        let wrong_key = Material {
            key: foreign.key,
            ..m.clone()
        };
        assert_eq!(plan(now, Some(&wrong_key), &hosts()), Plan::Serving);
    }

    #[test]
    fn an_expiring_or_broken_ca_starts_afresh() {
        let now = OffsetDateTime::now_utc();
        let m = issue(Plan::Fresh, now, None, &hosts()).unwrap();
        let late = now + CA_VALIDITY - RENEW_BEFORE + Duration::minutes(1);
        assert_eq!(plan(late, Some(&m), &hosts()), Plan::Fresh);
        let broken = Material {
            ca_cert: "garbage".into(),
            ..m.clone()
        };
        assert_eq!(plan(now, Some(&broken), &hosts()), Plan::Fresh);
        let other = issue(Plan::Fresh, now, None, &hosts()).unwrap();
        let wrong_key = Material {
            ca_key: other.ca_key,
            ..m.clone()
        };
        assert_eq!(plan(now, Some(&wrong_key), &hosts()), Plan::Fresh);
        let not_a_ca = Material {
            ca_cert: m.cert.clone(),
            ca_key: m.key.clone(),
            ..m
        };
        assert_eq!(plan(now, Some(&not_a_ca), &hosts()), Plan::Fresh);
    }
}
