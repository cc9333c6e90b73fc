//! What a provider writes into a ShadowPod's status, bounded before it comes home (pure). A
//! provider may write anything the ShadowPod's schema lets through, and the home pod's
//! status goes into the consumer's API server and the memory of its controllers. Each string
//! is cut to its bound with [`MARKER`] at the end; the provider's pod conditions and each
//! list of container statuses are kept up to [`ITEMS`], resource maps up to [`ENTRIES`]; the
//! provider's node details (container users, volume mount and device statuses) stay there;
//! a phase other than Kubernetes' five is `Unknown`.
//!
//! In all: the pod's reason and message (~1.2 KiB); 16 pod conditions of ~1.5 KiB each
//! (~24 KiB); 2 × 16 container statuses of at most name 128 + image, image ID and container
//! ID 3 × 512 + two states of 2 × 128 + 1024 + 512 + three resource maps of 8 × (128 + 64)
//! bytes, ~7.5 KiB each (~240 KiB); the fabric's own conditions the same as the pod's: under
//! [`TOTAL`] (512 KiB, a third of an object's 1.5 MiB), JSON syntax included.
use std::collections::BTreeMap;

use fabric_api::offloading::v1alpha1::ShadowPodStatus;
use k8s_openapi::{
    api::core::v1::{ContainerState, ContainerStatus, PodCondition},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Condition},
};

/// The end of a cut string.
pub const MARKER: &str = "… [truncated]";
/// Messages.
pub const MESSAGE: usize = 1024;
/// Reasons, types, names, statuses.
pub const WORD: usize = 128;
/// Image names and ids, container ids, pod IPs.
pub const REFERENCE: usize = 512;
/// Quantities.
pub const QUANTITY: usize = 64;
/// Conditions (the pod's, the fabric's) and container statuses per list.
pub const ITEMS: usize = 16;
/// Entries of a resource map.
pub const ENTRIES: usize = 8;
/// What a home status built from a bounded one serializes to at most.
pub const TOTAL: usize = 512 * 1024;

const PHASES: [&str; 5] = ["Pending", "Running", "Succeeded", "Failed", "Unknown"];

/// `s` if it fits in `max` bytes, else its longest prefix (on a character boundary) that
/// fits with [`MARKER`] after it.
pub fn clip(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max.saturating_sub(MARKER.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(MARKER);
}

fn clip_opt(s: &mut Option<String>, max: usize) {
    if let Some(s) = s {
        clip(s, max);
    }
}

fn clip_map(m: &mut BTreeMap<String, Quantity>) {
    *m = std::mem::take(m)
        .into_iter()
        .take(ENTRIES)
        .map(|(mut k, mut q)| {
            clip(&mut k, WORD);
            clip(&mut q.0, QUANTITY);
            (k, q)
        })
        .collect();
}

fn state(s: &mut Option<ContainerState>) {
    let Some(s) = s else { return };
    if let Some(w) = &mut s.waiting {
        clip_opt(&mut w.reason, WORD);
        clip_opt(&mut w.message, MESSAGE);
    }
    if let Some(t) = &mut s.terminated {
        clip_opt(&mut t.reason, WORD);
        clip_opt(&mut t.message, MESSAGE);
        clip_opt(&mut t.container_id, REFERENCE);
    }
}

fn container(c: &mut ContainerStatus) {
    clip(&mut c.name, WORD);
    clip(&mut c.image, REFERENCE);
    clip(&mut c.image_id, REFERENCE);
    clip_opt(&mut c.container_id, REFERENCE);
    clip_opt(&mut c.stop_signal, WORD);
    state(&mut c.state);
    state(&mut c.last_state);
    if let Some(m) = &mut c.allocated_resources {
        clip_map(m);
    }
    if let Some(r) = &mut c.resources {
        r.claims = None;
        r.limits.iter_mut().for_each(clip_map);
        r.requests.iter_mut().for_each(clip_map);
    }
    c.allocated_resources_status = None;
    c.user = None;
    c.volume_mounts = None;
}

fn pod_condition(c: &mut PodCondition) {
    clip(&mut c.type_, WORD);
    clip(&mut c.status, WORD);
    clip_opt(&mut c.reason, WORD);
    clip_opt(&mut c.message, MESSAGE);
}

fn condition(c: &mut Condition) {
    clip(&mut c.type_, WORD);
    clip(&mut c.status, WORD);
    clip(&mut c.reason, WORD);
    clip(&mut c.message, MESSAGE);
}

/// `st` as the provider wrote it, bounded.
pub fn provider_status(mut st: ShadowPodStatus) -> ShadowPodStatus {
    if st.phase.as_deref().is_some_and(|p| !PHASES.contains(&p)) {
        st.phase = Some("Unknown".to_owned());
    }
    clip_opt(&mut st.reason, WORD);
    clip_opt(&mut st.message, MESSAGE);
    clip_opt(&mut st.pod_ip, REFERENCE);
    st.pod_ips.truncate(2);
    st.pod_ips.iter_mut().for_each(|ip| clip(ip, REFERENCE));
    st.pod_conditions.truncate(ITEMS);
    st.pod_conditions.iter_mut().for_each(pod_condition);
    st.conditions.truncate(ITEMS);
    st.conditions.iter_mut().for_each(condition);
    for list in [&mut st.container_statuses, &mut st.init_container_statuses] {
        list.truncate(ITEMS);
        list.iter_mut().for_each(container);
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_string_ends_with_the_marker_within_its_bound() {
        let mut s = "é".repeat(1000);
        clip(&mut s, 101);
        assert!(s.len() <= 101 && s.ends_with(MARKER), "{s}");
        let mut short = "fine".to_owned();
        clip(&mut short, 4);
        assert_eq!(short, "fine");
    }
}
