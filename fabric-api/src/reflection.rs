//! The custom kinds a consumer's admin chooses to reflect into its twins (issue 20):
//! `--reflect-custom-resource RESOURCE.GROUP/VERSION` of `fabric-controller virtual-nodes`,
//! handed on to every virtual kubelet as the same flag. One type on both sides: the value is
//! parsed once by each process from the same text, and written back by [`fmt::Display`].
use std::{fmt, str::FromStr};

/// A custom resource by plural, group and version, as `widgets.example.com/v1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CustomResource {
    pub plural: String,
    pub group: String,
    pub version: String,
}

/// Why a `--reflect-custom-resource` value does not name a custom resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadCustomResource {
    #[error("{0:?}: expected RESOURCE.GROUP/VERSION, as widgets.example.com/v1 (no '/')")]
    NoVersion(String),
    #[error(
        "{0:?}: expected RESOURCE.GROUP/VERSION, as widgets.example.com/v1 (no '.' between resource and group: core kinds are not reflected this way)"
    )]
    NoGroup(String),
    #[error("{value:?}: {part} {got:?} is not a lowercase DNS name (RFC 1123)")]
    NotDns {
        value: String,
        part: &'static str,
        got: String,
    },
}

/// Whether `s` is a lowercase RFC 1123 label (`dots`: or a subdomain).
fn dns(s: &str, dots: bool) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').count() >= 1
        && (dots || !s.contains('.'))
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

impl FromStr for CustomResource {
    type Err = BadCustomResource;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let (rg, version) = value
            .rsplit_once('/')
            .ok_or_else(|| BadCustomResource::NoVersion(value.to_owned()))?;
        let (plural, group) = rg
            .split_once('.')
            .ok_or_else(|| BadCustomResource::NoGroup(value.to_owned()))?;
        for (part, got, dots) in [
            ("resource", plural, false),
            ("group", group, true),
            ("version", version, false),
        ] {
            if !dns(got, dots) {
                return Err(BadCustomResource::NotDns {
                    value: value.to_owned(),
                    part,
                    got: got.to_owned(),
                });
            }
        }
        Ok(Self {
            plural: plural.to_owned(),
            group: group.to_owned(),
            version: version.to_owned(),
        })
    }
}

impl fmt::Display for CustomResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}/{}", self.plural, self.group, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_resource_parses_and_prints_back() {
        let w: CustomResource = "widgets.example.com/v1".parse().unwrap();
        assert_eq!(
            w,
            CustomResource {
                plural: "widgets".into(),
                group: "example.com".into(),
                version: "v1".into()
            }
        );
        assert_eq!(w.to_string(), "widgets.example.com/v1");
        let beta: CustomResource = "gadgets.shop/v1beta2".parse().unwrap();
        assert_eq!(
            (beta.group.as_str(), beta.version.as_str()),
            ("shop", "v1beta2")
        );
    }

    #[test]
    fn a_bad_value_says_which_part_and_what_is_expected() {
        let err = |s: &str| s.parse::<CustomResource>().unwrap_err().to_string();
        assert!(err("widgets.example.com").contains("RESOURCE.GROUP/VERSION"));
        assert!(err("pods/v1").contains("core kinds"));
        assert!(err("Widgets.example.com/v1").contains("resource \"Widgets\""));
        assert!(err("widgets.example..com/v1").contains("group \"example..com\""));
        assert!(err("widgets.example.com/").contains("version \"\""));
        assert!(err("widgets.example.com/v1/x").contains("group \"example.com/v1\""));
    }
}
