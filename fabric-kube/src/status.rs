//! Writing what a controller owns: server-side apply of objects and of status subresources,
//! under one field manager per controller, and conditions.
//!
//! A condition is decided as a [`Verdict`]: its status, a typed reason (an enum per condition
//! type implementing [`Reason`], made with [`reasons!`](crate::reasons), whose `as_str` is the
//! wire value) and a message. Readers parse a condition back into the same type
//! ([`Verdict::read`]) instead of comparing reason strings.
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};

/// The field manager a controller writes under: the API server records which fields each
/// one owns, and a controller's apply only touches (and, forced, takes over) its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldManager(pub &'static str);

impl FieldManager {
    fn params(&self) -> PatchParams {
        PatchParams::apply(self.0).force()
    }

    /// Server-side applies `obj` (named by its metadata) and returns the object as stored.
    pub async fn apply<K>(&self, api: &Api<K>, obj: &K) -> kube::Result<K>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    {
        let name = obj.meta().name.clone().unwrap_or_default();
        api.patch(&name, &self.params(), &Patch::Apply(obj)).await
    }

    /// Server-side applies `status` to the status subresource of object `name`.
    pub async fn apply_status<K>(
        &self,
        api: &Api<K>,
        name: &str,
        status: impl Serialize,
    ) -> kube::Result<()>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        api.patch_status(name, &self.params(), &Patch::Apply(&patch))
            .await?;
        Ok(())
    }

    /// As [`FieldManager::apply_status`], returning the object as written; with
    /// `resource_version`, refused with a 409 Conflict unless the object is still at that
    /// version (a status computed from a copy that may lag behind, e.g. a watch cache's, is
    /// only written over the version it was computed from).
    pub async fn apply_status_at<K>(
        &self,
        api: &Api<K>,
        name: &str,
        resource_version: Option<&str>,
        status: impl Serialize,
    ) -> kube::Result<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let mut patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        if let Some(rv) = resource_version {
            patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
        }
        api.patch_status(name, &self.params(), &Patch::Apply(&patch))
            .await
    }
}

/// A condition of type `type_` observed at `now`.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(now),
        observed_generation: generation,
    }
}

/// Puts `new` into `conditions` in place of the one of its type. As Kubernetes' own
/// `meta.SetStatusCondition`: the lastTransitionTime stays the old one while the status does
/// not change, so re-applying the same state writes the same object (no new resourceVersion,
/// no watch event, no reconcile loop).
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            *old = new;
        }
        None => conditions.push(new),
    }
}

/// `conditions` with `new` set in them (see [`set_condition`]).
pub fn with_condition(conditions: &[Condition], new: Condition) -> Vec<Condition> {
    let mut out = conditions.to_vec();
    set_condition(&mut out, new);
    out
}

/// The reasons one condition type gives: an enum whose [`Reason::as_str`] is the wire value.
pub trait Reason: Sized + Clone + PartialEq + std::fmt::Debug {
    /// The value written in `reason`.
    fn as_str(&self) -> &str;
    /// The reason written as `s`, if it is one of these.
    fn parse(s: &str) -> Option<Self>;
}

/// Declares a [`Reason`] enum: each variant with its wire value, and optionally (`else`) a
/// variant carrying any other reason as it was written (a reason copied from another object,
/// e.g. a Node's, or written by a peer running another version).
///
/// ```
/// fabric_kube::reasons! {
///     /// Why a thing is or is not Ready.
///     pub enum Ready {
///         Allocated = "Allocated",
///         Full = "IPAMFailed",
///     }
/// }
/// use fabric_kube::status::Reason;
/// assert_eq!(Ready::Full.as_str(), "IPAMFailed");
/// assert_eq!(Ready::parse("Allocated"), Some(Ready::Allocated));
/// ```
#[macro_export]
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $wire:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $crate::status::Reason for $name {
            fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $wire),+
                }
            }

            fn parse(s: &str) -> Option<Self> {
                match s {
                    $($wire => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::status::Reason::as_str(self))
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $wire:literal),+ $(,)?
        } else {
            $(#[$ometa:meta])* $other:ident(String) $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
            $(#[$ometa])* $other(String),
        }

        impl $crate::status::Reason for $name {
            fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $wire,)+
                    Self::$other(s) => s,
                }
            }

            fn parse(s: &str) -> Option<Self> {
                Some(match s {
                    $($wire => Self::$variant,)+
                    other => Self::$other(other.to_owned()),
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::status::Reason::as_str(self))
            }
        }
    };
}

/// A condition's decision: status, typed reason, message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<R> {
    pub ok: bool,
    pub reason: R,
    pub message: String,
}

impl<R: Reason> Verdict<R> {
    /// Status True for `reason`.
    pub fn ok(reason: R, message: impl Into<String>) -> Self {
        Self {
            ok: true,
            reason,
            message: message.into(),
        }
    }

    /// Status False for `reason`.
    pub fn not(reason: R, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            reason,
            message: message.into(),
        }
    }

    /// The condition of type `type_` saying this, observed at `now`.
    pub fn condition(&self, type_: &str, generation: Option<i64>, now: Timestamp) -> Condition {
        condition(
            type_,
            self.ok,
            self.reason.as_str(),
            self.message.clone(),
            generation,
            now,
        )
    }

    /// The verdict `c` records (None when its reason is not one of `R`, or its status is
    /// neither True nor False).
    pub fn read(c: &Condition) -> Option<Self> {
        let ok = match c.status.as_str() {
            "True" => true,
            "False" => false,
            _ => return None,
        };
        Some(Self {
            ok,
            reason: R::parse(&c.reason)?,
            message: c.message.clone(),
        })
    }

    /// The verdict of the condition of type `type_` among `conditions`, if there is one
    /// [`Verdict::read`] understands.
    pub fn find(conditions: &[Condition], type_: &str) -> Option<Self> {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .and_then(Self::read)
    }

    /// Whether `c` already says this (status, reason and message), whatever its times.
    pub fn says(&self, c: &Condition) -> bool {
        Self::read(c).as_ref() == Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let t0 = at("2026-01-01T00:00:00Z");
        let t1 = at("2026-01-01T00:05:00Z");
        let mut c = vec![condition("Other", true, "X", "x".into(), None, t0)];
        set_condition(
            &mut c,
            condition("Ready", true, "Allocated", "a".into(), Some(1), t0),
        );
        assert_eq!(c.len(), 2);
        // Same status, new message and generation: the transition time stays.
        set_condition(
            &mut c,
            condition("Ready", true, "Allocated", "b".into(), Some(2), t1),
        );
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].last_transition_time, Time(t0));
        assert_eq!(
            (c[1].message.as_str(), c[1].observed_generation),
            ("b", Some(2))
        );
        // A new status: a transition.
        set_condition(
            &mut c,
            condition("Ready", false, "IPAMFailed", "full".into(), Some(2), t1),
        );
        assert_eq!(c[1].last_transition_time, Time(t1));
        assert_eq!(c[1].status, "False");
        assert_eq!(c[0].type_, "Other");
        let same = with_condition(
            &c,
            condition(
                "Ready",
                false,
                "IPAMFailed",
                "full".into(),
                Some(2),
                at("2027-01-01T00:00:00Z"),
            ),
        );
        assert_eq!(same, c);
    }

    crate::reasons! {
        enum Ready {
            Allocated = "Allocated",
            Full = "IPAMFailed",
        }
    }

    crate::reasons! {
        enum Carried {
            Waiting = "Waiting",
        } else {
            Node(String),
        }
    }

    #[test]
    fn verdicts_write_and_read_back_their_wire_values() {
        let t0 = at("2026-01-01T00:00:00Z");
        let v = Verdict::not(Ready::Full, "no room");
        let c = v.condition("Ready", Some(3), t0);
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Ready", "False", "IPAMFailed")
        );
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(Verdict::read(&c), Some(v.clone()));
        assert!(v.says(&c));
        assert!(!Verdict::ok(Ready::Full, "no room").says(&c));
        assert_eq!(
            Verdict::<Ready>::find(std::slice::from_ref(&c), "Ready").map(|v| v.reason),
            Some(Ready::Full)
        );
        assert_eq!(
            Verdict::<Ready>::find(std::slice::from_ref(&c), "Other"),
            None
        );
        // A reason this type does not know, or an Unknown status: nothing to read.
        let mut odd = c.clone();
        odd.reason = "Elsewhere".into();
        assert_eq!(Verdict::<Ready>::read(&odd), None);
        odd.reason = "Allocated".into();
        odd.status = "Unknown".into();
        assert_eq!(Verdict::<Ready>::read(&odd), None);
        assert_eq!(Ready::Allocated.to_string(), "Allocated");
    }

    #[test]
    fn a_carrying_reason_keeps_what_it_does_not_know() {
        assert_eq!(Carried::parse("Waiting"), Some(Carried::Waiting));
        let other = Carried::parse("KubeletNotReady").unwrap();
        assert_eq!(other, Carried::Node("KubeletNotReady".into()));
        assert_eq!(other.as_str(), "KubeletNotReady");
        assert_eq!(Carried::Waiting.as_str(), "Waiting");
    }
}
