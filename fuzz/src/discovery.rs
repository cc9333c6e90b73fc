//! A cluster's DNS-SD announcement (`fabric_discovery::announcement`): what any host on the
//! LAN, or whoever controls a searched DNS domain, can make a cluster read.
//!
//! Input: a TXT record's RDATA (strings, each after its length byte, as on the wire; a string
//! running past the end is cut there). Checked: decoding never panics; what it accepts is a
//! valid announcement (a DNS-label id, an `https://` URL with a host, no user info, query or
//! fragment, within the bound), encodes into TXT strings within the wire's limits, decodes back
//! to the same value, and under its own instance name; what it refuses it says in one short
//! line without control characters.

use fabric_discovery::announcement::{
    Announcement, MAX_AUTH_URL_LEN, MAX_TXT_BYTES, MAX_TXT_STRING,
};

pub fn check(data: &[u8]) {
    let strings = split_rdata(data);
    match Announcement::from_txt(strings.iter().copied()) {
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.len() < 400, "a long message: {msg}");
            assert!(!msg.chars().any(char::is_control), "{msg:?}");
        }
        Ok(a) => {
            assert!(fabric_api::identity::is_dns_label(a.cluster_id.as_str()));
            let url = a.auth_url.as_str();
            assert!(
                url.starts_with("https://") && url.len() <= MAX_AUTH_URL_LEN,
                "{url}"
            );
            assert!(!url.contains(['?', '#']), "{url}");
            let authority = url["https://".len()..]
                .split('/')
                .next()
                .unwrap_or_default();
            assert!(!authority.contains('@'), "{url}");
            assert!(!a.auth_url.host_port().0.is_empty(), "{url}");
            let txt = a.to_txt_strings();
            assert!(txt.iter().all(|s| s.len() <= MAX_TXT_STRING));
            assert!(txt.iter().map(Vec::len).sum::<usize>() <= MAX_TXT_BYTES);
            let again = Announcement::from_txt(txt.iter().map(Vec::as_slice));
            assert_eq!(again.as_ref(), Ok(&a), "written back as {txt:?}");
            let named = Announcement::from_instance(a.cluster_id.as_str(), strings.iter().copied());
            assert_eq!(named, Ok(a));
        }
    }
}

fn split_rdata(mut data: &[u8]) -> Vec<&[u8]> {
    let mut strings = Vec::new();
    while let Some((&len, rest)) = data.split_first() {
        let n = usize::from(len).min(rest.len());
        strings.push(&rest[..n]);
        data = &rest[n..];
    }
    strings
}
