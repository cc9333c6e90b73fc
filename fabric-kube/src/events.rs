//! Kubernetes Events (`events.k8s.io/v1`) on the objects a controller reports about, through
//! kube-runtime's [`Recorder`] (which also folds repeats into an Event series).
//!
//! Events are a courtesy to whoever runs `kubectl describe`: a failure to publish one is
//! logged and never fails the controller's work.
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client, Resource,
    runtime::events::{self, EventType, Recorder, Reporter},
};
use tracing::warn;

/// One Event: reason and action in PascalCase (`Connected`, `Reconcile`), a note for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

impl Event {
    pub fn normal(reason: &'static str, action: &'static str, note: impl Into<String>) -> Self {
        Self {
            warning: false,
            reason,
            action,
            note: note.into(),
        }
    }

    pub fn warning(reason: &'static str, action: &'static str, note: impl Into<String>) -> Self {
        Self {
            warning: true,
            ..Self::normal(reason, action, note)
        }
    }

    fn runtime(&self) -> events::Event {
        events::Event {
            type_: if self.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: self.reason.to_owned(),
            note: Some(self.note.clone()),
            action: self.action.to_owned(),
            secondary: None,
        }
    }
}

/// Publishes Events as one controller (`reportingController`) and replica
/// (`reportingInstance`).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: controller.to_owned(),
                    instance,
                },
            ),
        }
    }

    /// Publishes `ev` about `obj`; a failure is logged, not returned.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, ev: &Event) {
        self.publish_ref(&obj.object_ref(&()), ev).await;
    }

    /// Publishes `ev` about the object `reference` names.
    pub async fn publish_ref(&self, reference: &ObjectReference, ev: &Event) {
        if let Err(e) = self.recorder.publish(&ev.runtime(), reference).await {
            warn!(
                error = %e,
                reason = ev.reason,
                object = reference.name.as_deref().unwrap_or_default(),
                "publishing an Event"
            );
        }
    }
}
