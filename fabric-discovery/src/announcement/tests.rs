//! The TXT codec against records as they come off the wire, well-formed and hostile.
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
