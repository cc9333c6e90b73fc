//! A request to the authentication service (`fabric_auth`): what anyone who reaches
//! the provider's HTTPS port can send, before any token is checked.
//!
//! Input: the request body (of an authentication, and of a renewal). Checked: parsing never panics; a refusal carries a 4xx status
//! and a short one-line message; an accepted request has a DNS-label cluster id, a token and
//! a CSR within their bounds and serializes back to the same request; the CSR check of an
//! accepted request never panics either, and refuses with a 400 and a short message.

use fabric_auth::{
    protocol::{
        AuthRequest, CONTENT_TYPE, MAX_CSR, MAX_TOKEN, Reason, Refusal, parse_renew, parse_request,
    },
    validate::check_csr,
};

fn short_line(r: &Refusal) {
    assert!((400..500).contains(&r.status()), "{r:?}");
    assert!(r.message.len() < 600, "a long message: {}", r.message);
    assert!(!r.message.chars().any(char::is_control), "{:?}", r.message);
}

pub fn check(data: &[u8]) {
    // The renewal endpoint's parser, on the same bytes.
    match parse_renew(Some(CONTENT_TYPE), data) {
        Err(r) => short_line(&r),
        Ok(req) => assert!(req.csr_pem.len() <= MAX_CSR),
    }
    match parse_request(Some(CONTENT_TYPE), data) {
        Err(r) => short_line(&r),
        Ok(req) => {
            assert!(fabric_api::identity::is_dns_label(&req.cluster_id));
            assert!(!req.token.is_empty() && req.token.len() <= MAX_TOKEN);
            assert!(req.csr_pem.len() <= MAX_CSR);
            let again: AuthRequest = serde_json::from_slice(&serde_json::to_vec(&req).unwrap())
                .expect("a parsed request serializes back");
            assert_eq!(again, req);
            if let Err(r) = check_csr(&req.csr_pem, &req.cluster_id) {
                assert_eq!(r.reason, Reason::InvalidCsr);
                short_line(&r);
            }
        }
    }
}
