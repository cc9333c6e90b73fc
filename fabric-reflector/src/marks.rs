//! Ownership marks, pure: the labels every reflected object carries in the remote cluster
//! (where it came from, where it went), by which a reflector knows its own objects from
//! objects someone else made there under the same name.
//!
//! A remote object without our marks is never overwritten or deleted: the edge hands it to
//! the kind as [`crate::Remote::Foreign`], publishes a Warning Event on the home object once,
//! and refuses to delete it. A home object that carries marks is a reflection itself (made
//! here by a peer reflecting into this cluster) and is never reflected back.
use std::collections::BTreeMap;

use fabric_api::names::label::{REFLECTED_FROM, REFLECTED_TO};
use kube::api::ObjectMeta;

/// The marks a reflector stamps on what it makes in one remote cluster: this cluster's id
/// there (`origin`) and the remote cluster's (`destination`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Marks {
    origin: String,
    destination: String,
}

impl Marks {
    pub fn new(origin: impl Into<String>, destination: impl Into<String>) -> Self {
        Self {
            origin: origin.into(),
            destination: destination.into(),
        }
    }

    /// The id of the cluster objects are reflected from (this one, as the remote knows it).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The id of the cluster objects are reflected into.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The marks as labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (REFLECTED_FROM.to_owned(), self.origin.clone()),
            (REFLECTED_TO.to_owned(), self.destination.clone()),
        ])
    }

    /// Puts the marks among `labels` (over any value they had).
    pub fn stamp(&self, labels: &mut BTreeMap<String, String>) {
        labels.extend(self.labels());
    }

    /// Whether an object carries these very marks: it is ours to overwrite and delete.
    pub fn on(&self, meta: &ObjectMeta) -> bool {
        let labels = meta.labels.as_ref();
        let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        get(REFLECTED_FROM) == Some(self.origin.as_str())
            && get(REFLECTED_TO) == Some(self.destination.as_str())
    }
}

/// Whether a home object is a reflection itself (it carries a reflector's origin mark): made
/// here by another cluster's reflector, it is never reflected back.
pub fn reflected(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(REFLECTED_FROM))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn only_both_marks_of_ours_make_an_object_ours() {
        let m = Marks::new("alpha", "beta");
        let mut labels = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
        m.stamp(&mut labels);
        let ours = ObjectMeta {
            labels: Some(labels),
            ..Default::default()
        };
        assert!(m.on(&ours));
        assert_eq!(ours.labels.as_ref().unwrap()["app"], "web");
        // Someone else's object of the same name.
        assert!(!m.on(&ObjectMeta::default()));
        assert!(!m.on(&meta(&[("app", "web")])));
        // Another origin (a third cluster reflecting into the same namespace), another
        // destination, or half the marks: not ours.
        assert!(!m.on(&meta(&[(REFLECTED_FROM, "gamma"), (REFLECTED_TO, "beta")])));
        assert!(!m.on(&meta(&[(REFLECTED_FROM, "alpha"), (REFLECTED_TO, "delta")])));
        assert!(!m.on(&meta(&[(REFLECTED_FROM, "alpha")])));
    }

    #[test]
    fn stamping_takes_over_a_stale_value() {
        let m = Marks::new("alpha", "beta");
        let mut labels = BTreeMap::from([(REFLECTED_FROM.to_owned(), "old".to_owned())]);
        m.stamp(&mut labels);
        assert_eq!(labels, m.labels());
    }

    #[test]
    fn a_home_object_with_an_origin_mark_is_a_reflection() {
        assert!(reflected(&meta(&[(REFLECTED_FROM, "beta")])));
        assert!(!reflected(&meta(&[("app", "web")])));
        assert!(!reflected(&ObjectMeta::default()));
    }
}
