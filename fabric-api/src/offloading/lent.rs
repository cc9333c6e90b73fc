//! What storage a provider lends its tenants (issue 21): its admin writes it in ConfigMap
//! [`CONFIG_MAP`] (namespace `fabric-system`), key [`LENT`], as `CLASS=SIZE` pairs
//! (`standard=100Gi,fast=10Gi`), and optionally key [`DEFAULT`] (the class a claim gets when it
//! names none; without it, the first listed). The provider's offer policy advertises each
//! class as resource [`resource`]`(CLASS)` in the ResourceSlices' grants, and its webhook
//! charges tenants' claims against what each was granted. Parsed here, purely: a bad entry is
//! an error naming the key, the entry and the rule (nothing is lent then: a configuration the
//! admin wrote wrong refuses rather than lends more than meant).
use std::collections::BTreeMap;

use crate::{
    identity::is_dns_label,
    quantity::{Amounts, milli},
};

/// The ConfigMap, in the fabric's namespace.
pub const CONFIG_MAP: &str = "fabric-storage";
/// Its key of the classes lent and how much of each.
pub const LENT: &str = "lent";
/// Its key of the default class (optional).
pub const DEFAULT: &str = "default";

/// Resource names of lent storage: this prefix and the provider's StorageClass.
pub const RESOURCE_PREFIX: &str = "storage.fabric.io/";

/// The resource standing for the storage lent of `class` (`storage.fabric.io/standard`).
pub fn resource(class: &str) -> String {
    format!("{RESOURCE_PREFIX}{class}")
}

/// The class a resource name stands for, if it is lent storage.
pub fn class_of(resource: &str) -> Option<&str> {
    resource
        .strip_prefix(RESOURCE_PREFIX)
        .filter(|c| !c.is_empty())
}

/// What a provider lends: classes in the order listed, each with how much (thousandths of a
/// byte, as [`crate::quantity`] counts), and the default class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lent {
    pub classes: Vec<(String, i128)>,
    /// Always one of `classes` (None only when nothing is lent).
    pub default: Option<String>,
}

/// Why the ConfigMap's storage is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LentError {
    #[error(
        "{CONFIG_MAP} key {LENT}: entry {0:?}: give CLASS=SIZE, comma-separated (standard=100Gi,fast=10Gi)"
    )]
    NoSize(String),
    #[error(
        "{CONFIG_MAP} key {LENT}: entry {0:?}: the class must be a StorageClass name (lowercase letters, digits, '-' and '.')"
    )]
    BadClass(String),
    #[error(
        "{CONFIG_MAP} key {LENT}: entry {entry:?}: {size:?} is not a size (such as 100Gi) above zero"
    )]
    BadSize { entry: String, size: String },
    #[error("{CONFIG_MAP} key {LENT}: class {0} is listed twice")]
    Twice(String),
    #[error("{CONFIG_MAP} key {DEFAULT}: {0:?} is not one of the classes lent ({1})")]
    DefaultNotLent(String, String),
}

/// A StorageClass name: a DNS subdomain.
fn is_class(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

impl Lent {
    /// From the ConfigMap's data (None, or no [`LENT`] key, or an empty one: nothing lent).
    pub fn from_data(data: Option<&BTreeMap<String, String>>) -> Result<Self, LentError> {
        let get = |k: &str| data.and_then(|d| d.get(k)).map(String::as_str);
        Self::parse(get(LENT).unwrap_or(""), get(DEFAULT))
    }

    /// `lent` as `CLASS=SIZE,...`; `default` names one of them (blank: the first).
    pub fn parse(lent: &str, default: Option<&str>) -> Result<Self, LentError> {
        let mut classes: Vec<(String, i128)> = Vec::new();
        for entry in lent.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((class, size)) = entry.split_once('=') else {
                return Err(LentError::NoSize(entry.to_owned()));
            };
            let (class, size) = (class.trim(), size.trim());
            if !is_class(class) {
                return Err(LentError::BadClass(entry.to_owned()));
            }
            let amount = milli(size)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| LentError::BadSize {
                    entry: entry.to_owned(),
                    size: size.to_owned(),
                })?;
            if classes.iter().any(|(c, _)| c == class) {
                return Err(LentError::Twice(class.to_owned()));
            }
            classes.push((class.to_owned(), amount));
        }
        let default = match default.map(str::trim).filter(|d| !d.is_empty()) {
            Some(d) if classes.iter().any(|(c, _)| c == d) => Some(d.to_owned()),
            Some(d) => {
                let names: Vec<&str> = classes.iter().map(|(c, _)| c.as_str()).collect();
                let names = if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                };
                return Err(LentError::DefaultNotLent(d.to_owned(), names));
            }
            None => classes.first().map(|(c, _)| c.clone()),
        };
        Ok(Self { classes, default })
    }

    /// As resources of a grant: [`resource`]`(class)` → amount.
    pub fn amounts(&self) -> Amounts {
        self.classes
            .iter()
            .map(|(c, v)| (resource(c), *v))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: i128 = 1000 << 30;

    #[test]
    fn classes_sizes_and_the_default() {
        let l = Lent::parse(" standard=100Gi, fast = 10Gi ,", None).unwrap();
        assert_eq!(
            l.classes,
            vec![("standard".into(), 100 * GI), ("fast".into(), 10 * GI)]
        );
        assert_eq!(l.default.as_deref(), Some("standard"), "the first listed");
        assert_eq!(
            l.amounts(),
            Amounts::from([
                ("storage.fabric.io/fast".into(), 10 * GI),
                ("storage.fabric.io/standard".into(), 100 * GI),
            ])
        );
        let l = Lent::parse("standard=100Gi,fast=10Gi", Some("fast")).unwrap();
        assert_eq!(l.default.as_deref(), Some("fast"));
        // Nothing: none lent, no default.
        for nothing in ["", " , "] {
            assert_eq!(Lent::parse(nothing, None), Ok(Lent::default()));
        }
        assert_eq!(Lent::from_data(None), Ok(Lent::default()));
        let data = BTreeMap::from([
            (LENT.to_owned(), "a.b=1Gi".to_owned()),
            (DEFAULT.to_owned(), "".to_owned()),
        ]);
        assert_eq!(
            Lent::from_data(Some(&data)).unwrap().default.as_deref(),
            Some("a.b")
        );
    }

    #[test]
    fn bad_input_names_the_entry_and_the_rule() {
        let e = Lent::parse("standard,fast=1Gi", None).unwrap_err();
        assert_eq!(e, LentError::NoSize("standard".into()));
        assert!(e.to_string().contains("give CLASS=SIZE"), "{e}");
        assert!(e.to_string().contains("fabric-storage key lent"), "{e}");
        assert_eq!(
            Lent::parse("Fast=1Gi", None),
            Err(LentError::BadClass("Fast=1Gi".into()))
        );
        assert_eq!(
            Lent::parse("=1Gi", None),
            Err(LentError::BadClass("=1Gi".into()))
        );
        for size in ["lots", "0", "-1Gi", ""] {
            let e = Lent::parse(&format!("fast={size}"), None).unwrap_err();
            assert_eq!(
                e,
                LentError::BadSize {
                    entry: format!("fast={size}"),
                    size: size.into()
                }
            );
            assert!(e.to_string().contains("is not a size"), "{e}");
        }
        assert_eq!(
            Lent::parse("fast=1Gi,fast=2Gi", None),
            Err(LentError::Twice("fast".into()))
        );
        let e = Lent::parse("fast=1Gi", Some("gold")).unwrap_err();
        assert_eq!(e, LentError::DefaultNotLent("gold".into(), "fast".into()));
        assert!(
            e.to_string().contains("not one of the classes lent (fast)"),
            "{e}"
        );
    }

    #[test]
    fn resource_names() {
        assert_eq!(resource("fast"), "storage.fabric.io/fast");
        assert_eq!(class_of("storage.fabric.io/fast"), Some("fast"));
        assert_eq!(class_of("storage.fabric.io/"), None);
        assert_eq!(class_of("cpu"), None);
    }
}
