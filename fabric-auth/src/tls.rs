//! TLS of the authentication service: its serving certificate (self-signed unless the admin
//! provides one; served with `fabric_http::https::server_config`) and how a consumer decides
//! to trust it.
//!
//! The consumer has no CA in common with the provider, so the peer command carries a **pin**:
//! `sha256:` and the hex SHA-256 of the service's certificate (DER). The consumer accepts the
//! server whose leaf certificate has exactly that digest, and the handshake signatures prove
//! the server holds its key; nothing else about the certificate (names, dates, issuer) is
//! trusted or needed. Alternatively the consumer is given a CA (PEM) and verifies the server
//! as any HTTPS client would. There is no way to connect without one of the two.
use std::sync::Arc;

use fabric_http::https::{self, provider};
use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
};
use subtle::ConstantTimeEq;

const PIN_PREFIX: &str = "sha256:";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the pin {0:?} is not sha256: followed by 64 hex digits")]
    BadPin(String),
    /// What the server side can say too: no certificate, a PEM or TLS configuration error.
    #[error(transparent)]
    Tls(#[from] https::TlsError),
    #[error("generating the certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        Self::Tls(e.into())
    }
}

impl From<rustls::pki_types::pem::Error> for TlsError {
    fn from(e: rustls::pki_types::pem::Error) -> Self {
        Self::Tls(e.into())
    }
}

/// The pin of a certificate (DER).
pub fn pin_of(cert_der: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, cert_der);
    format!("{PIN_PREFIX}{}", hex::encode(d.as_ref()))
}

/// The pin of the first certificate in `cert_pem`.
pub fn pin_of_pem(cert_pem: &str) -> Result<String, TlsError> {
    let der = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .next()
        .ok_or(https::TlsError::NoCertificate)??;
    Ok(pin_of(&der))
}

/// Parses a pin as printed by [`pin_of`].
pub fn parse_pin(pin: &str) -> Result<[u8; 32], TlsError> {
    let bad = || TlsError::BadPin(pin.to_owned());
    let hex_part = pin.strip_prefix(PIN_PREFIX).ok_or_else(bad)?;
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut out).map_err(|_| bad())?;
    Ok(out)
}

/// A self-signed serving certificate and key (PEM) for `hosts` (DNS names or IP addresses),
/// valid ten years: consumers pin it, so its dates and issuer carry no trust.
pub fn self_signed(hosts: &[String]) -> Result<(String, String), TlsError> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(hosts.to_vec())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "fabric-auth");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(3650);
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// How a consumer trusts the authentication service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// The SHA-256 of the service's certificate, from the peer command.
    Pin([u8; 32]),
    /// A CA (PEM) the service's certificate chains to, with the URL's host in its names.
    Ca(String),
}

/// The client side for `trust`.
pub fn client_config(trust: &Trust) -> Result<rustls::ClientConfig, TlsError> {
    client_config_with(trust, None)
}

/// The client side for `trust`, presenting `identity` (certificate and key PEM) when given.
pub fn client_config_with(
    trust: &Trust,
    identity: Option<(&str, &str)>,
) -> Result<rustls::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match trust {
        Trust::Pin(pin) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinVerifier {
                pin: *pin,
                provider: provider(),
            })),
        Trust::Ca(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(cert?)?;
            }
            if roots.is_empty() {
                return Err(https::TlsError::NoCertificate.into());
            }
            builder.with_root_certificates(roots)
        }
    };
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert_pem, key_pem)) => {
            let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
            builder.with_client_auth_cert(certs, key)?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepts exactly the pinned leaf certificate; the handshake signatures are still checked,
/// so the server must hold the certificate's key.
#[derive(Debug)]
struct PinVerifier {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let d = ring::digest::digest(&ring::digest::SHA256, end_entity);
        if bool::from(d.as_ref().ct_eq(&self.pin)) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_round_trip_and_refuse_garbage() {
        let (cert, key) = self_signed(&["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        let pin = pin_of_pem(&cert).unwrap();
        assert!(pin.starts_with("sha256:") && pin.len() == 7 + 64, "{pin}");
        let bytes = parse_pin(&pin).unwrap();
        assert_eq!(
            pin_of(&CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()),
            pin
        );
        assert_ne!(bytes, [0; 32]);
        for bad in [
            "",
            "sha256:",
            "md5:00",
            &pin[..pin.len() - 1],
            &pin.replace("sha256", "SHA256"),
        ] {
            assert!(parse_pin(bad).is_err(), "{bad}");
        }
        https::server_config(&cert, &key, None).unwrap();
        https::server_config(&cert, &key, Some(&cert)).unwrap();
        client_config(&Trust::Pin(bytes)).unwrap();
        client_config(&Trust::Ca(cert)).unwrap();
        assert!(client_config(&Trust::Ca(String::new())).is_err());
    }
}
