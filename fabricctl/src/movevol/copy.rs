//! The copy's pure parts, unit-tested: the transfer pods, progress read from their logs, the
//! verdict on the two digests, the hand-over's ownership patches. [`to_provider`] and
//! [`hand_over`] are the I/O around them.
use super::*;

/// The port the receiver listens on.
pub const PORT: u16 = 7070;
/// Where the transfer pods mount the volume: a directory that exists in every image
/// (the test node mounts onto its host's own directories, and makes none).
pub const MOUNT: &str = "/srv";
/// Label of the transfer pods: the claim they move.
pub const MOVE_LABEL: &str = names::storage::TRANSFER;
/// Where the transfer pods find the move's token (`fabric-volume-transfer --token`).
pub const TOKEN_ENV: &str = "FABRIC_TRANSFER_TOKEN";

/// A claim's spec as big as `spec` (its access modes, size and volume mode), of `class`:
/// nothing of its binding.
fn sized_like(
    spec: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec,
    class: Option<String>,
) -> k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
    k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
        access_modes: spec.access_modes.clone(),
        resources: spec.resources.clone(),
        volume_mode: spec.volume_mode.clone(),
        storage_class_name: class,
        ..Default::default()
    }
}

/// A fresh token for one move: 128 random bits, hex.
pub fn token() -> String {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the system's random source");
    hex::encode(b)
}

/// The claim a move home fills beside the claim it moves: `<claim>-landing`, bounded.
pub fn landing_name(claim: &str) -> String {
    names::storage::landing(claim)
}

/// The landing claim of home claim `home` (on a provider): of its class, size, access modes
/// and volume mode, labelled as `home`'s transfer ([`MOVE_LABEL`]): its first consumer, the
/// receiver on a real node, has the real-node provisioner make it a real claim there.
pub fn landing_claim(home: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    let spec = home.spec.clone().unwrap_or_default();
    let claim = home.name_any();
    PersistentVolumeClaim {
        metadata: kube::api::ObjectMeta {
            name: Some(landing_name(&claim)),
            namespace: home.metadata.namespace.clone(),
            labels: Some([(MOVE_LABEL.to_owned(), claim)].into()),
            ..Default::default()
        },
        spec: Some(sized_like(&spec, spec.storage_class_name.clone())),
        status: None,
    }
}

/// Whether claim `c` is the landing claim of a move of `claim` (by its label).
pub fn is_landing_of(c: &PersistentVolumeClaim, claim: &str) -> bool {
    c.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MOVE_LABEL))
        .is_some_and(|m| m == claim)
}

/// One side of the transfer: `receive` beside the fresh claim, `send` mounting the source.
/// Placed on `place` (a provider: its virtual node, so it goes through the ShadowPod path
/// with this cluster's identity like any tenant pod; `local`: off virtual nodes). The image
/// is the fabric's own (`--image`), which holds `fabric-volume-transfer`; `token` is the
/// move's own, which the side that connects presents to the one that listens.
pub fn transfer_pod(
    claim: &str,
    volume_claim: &str,
    place: &Place,
    image: &str,
    args: &[String],
    token: &str,
) -> Pod {
    let side = args.first().map_or("transfer", String::as_str);
    let mut spec = serde_json::json!({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "transfer", "image": image,
            "command": std::iter::once("fabric-volume-transfer".to_owned()).chain(args.iter().cloned()).collect::<Vec<_>>(),
            "env": [{"name": TOKEN_ENV, "value": token}],
            "volumeMounts": [{"name": "data", "mountPath": MOUNT}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": volume_claim}}],
    });
    match place {
        Place::Provider(id) => {
            // Bound by name, not scheduled: the claim it mounts may have a volume that
            // keeps its consumers off virtual nodes (the data still at home, the claim
            // in the twin not yet its own).
            spec["nodeName"] = serde_json::json!(names::node::virtual_node(id));
            spec["tolerations"] =
                serde_json::json!([{"key": names::taint::VIRTUAL_NODE, "operator": "Exists"}]);
        }
        Place::Local => {
            spec["affinity"] = serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": names::label::NODE_TYPE,
                    "operator": "NotIn", "values": [names::label::VIRTUAL_NODE_TYPE]}]}]}}});
        }
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": names::namespace::bounded(&format!("move-{claim}-{side}")),
                     "labels": {MOVE_LABEL: claim}},
        "spec": spec,
    }))
    .expect("a pod")
}

/// Why pod `p` cannot be scheduled, when the scheduler said so (condition `PodScheduled`
/// False, reason `Unschedulable`): its message, which names what no node satisfied.
pub fn unschedulable(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
        .map(|c| {
            c.message
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "Unschedulable".to_owned())
        })
}

/// What one side's log says: the bytes so far and, once done, the digest.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Progress {
    pub bytes: u64,
    pub sha256: Option<String>,
}

/// Reads `sent N bytes [sha256 HEX]` / `received N bytes sha256 HEX` lines (the last wins).
pub fn progress(log: &str, verb: &str) -> Progress {
    let mut out = Progress::default();
    for line in log.lines() {
        let mut w = line.split_whitespace();
        if w.next() != Some(verb) {
            continue;
        }
        let (Some(n), Some("bytes")) = (w.next().and_then(|n| n.parse().ok()), w.next()) else {
            continue;
        };
        out.bytes = n;
        if w.next() == Some("sha256") {
            out.sha256 = w.next().map(str::to_owned);
        }
    }
    out
}

/// The copy is good only when both sides finished with the same digest over the same number
/// of bytes; otherwise why not (the source is then kept).
pub fn verdict(sent: &Progress, received: &Progress) -> Result<String, String> {
    match (&sent.sha256, &received.sha256) {
        (Some(s), Some(r)) if s == r && sent.bytes == received.bytes => Ok(s.clone()),
        (Some(s), Some(r)) => Err(format!(
            "checksums differ: sent {} bytes sha256 {s}, received {} bytes sha256 {r}",
            sent.bytes, received.bytes
        )),
        (None, _) => Err(format!(
            "the sender did not finish (after {} bytes)",
            sent.bytes
        )),
        (_, None) => Err(format!(
            "the receiver did not finish (after the sender's {} bytes)",
            sent.bytes
        )),
    }
}
/// The claim the receiver fills on provider `to`, made in the twin `twin` with this
/// cluster's identity: the home claim's name (an offloaded pod's claim names its twin's
/// claim of the same name, so the data must end up under it), labels, access modes, size
/// and volume mode, the provider's class `class` (`None`: its default), and the marks
/// (`origin` this cluster's id there, `to` the provider's) with [`names::storage::HOME_UID`]
/// naming the home claim as it is now: the virtual kubelet then lets the receiver mount it,
/// and does not sweep it as an orphan while the home claim stands.
pub fn twin_claim(
    home: &PersistentVolumeClaim,
    twin: &str,
    class: Option<&str>,
    origin: &str,
    to: &str,
) -> PersistentVolumeClaim {
    let spec = home.spec.clone().unwrap_or_default();
    let mut labels = home.metadata.labels.clone().unwrap_or_default();
    labels.extend(marks(origin, to));
    PersistentVolumeClaim {
        metadata: kube::api::ObjectMeta {
            name: home.metadata.name.clone(),
            namespace: Some(twin.to_owned()),
            labels: Some(labels),
            annotations: Some(
                [(
                    names::storage::HOME_UID.to_owned(),
                    home.metadata.uid.clone().unwrap_or_default(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(sized_like(&spec, class.map(str::to_owned))),
        status: None,
    }
}

/// The ownership marks the virtual kubelet stamps on what it makes on provider `to`.
pub fn marks(origin: &str, to: &str) -> std::collections::BTreeMap<String, String> {
    [
        (names::label::REFLECTED_FROM.to_owned(), origin.to_owned()),
        (names::label::REFLECTED_TO.to_owned(), to.to_owned()),
    ]
    .into()
}

/// The merge patch that hands a claim in the twin over: `Some((origin, to, uid))` marks it
/// ours for home claim `uid`; `None` takes our marks and that UID off (nothing at home
/// then sweeps it as an orphan, nor mounts it).
pub fn ownership(owner: Option<(&str, &str, &str)>) -> serde_json::Value {
    match owner {
        Some((origin, to, uid)) => serde_json::json!({"metadata": {
            "labels": marks(origin, to),
            "annotations": {names::storage::HOME_UID: uid}}}),
        None => serde_json::json!({"metadata": {
            "labels": {names::label::REFLECTED_FROM: null, names::label::REFLECTED_TO: null},
            "annotations": {names::storage::HOME_UID: null}}}),
    }
}

/// The transfer pods of claim `claim` among `pods` (by their label), sorted.
pub fn transfer_pods_of(claim: &str, pods: &[Pod]) -> Vec<String> {
    let mut out: Vec<String> = pods
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MOVE_LABEL))
                .is_some_and(|c| c == claim)
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    out.sort();
    out
}

/// Whether claim `there` in a twin is left from an interrupted copy of home claim `home`
/// (this cluster `origin`'s, to provider `to`): marked as ours and as that very claim's (its
/// UID), which only a move's copy does (a hand-over marks the claim made again, another UID).
pub fn interrupted(
    there: &PersistentVolumeClaim,
    home: &PersistentVolumeClaim,
    origin: &str,
    to: &str,
) -> bool {
    let labels = there.metadata.labels.clone().unwrap_or_default();
    let ours = marks(origin, to)
        .iter()
        .all(|(k, v)| labels.get(k.as_str()) == Some(v));
    let of_home = there
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::storage::HOME_UID))
        .is_some_and(|u| Some(u) == home.metadata.uid.as_ref());
    ours && of_home
}

/// The home claim made again under its name once the data is on provider `node`'s side:
/// its labels, annotations (but those of its binding and its scheduling), access modes,
/// size, volume mode and class; its selected node `node`, so that the virtual kubelet
/// of that node provisions it there: it finds the filled claim in the twin made for it
/// and pins a placeholder volume to its node (data gravity).
pub fn remade(home: &PersistentVolumeClaim, node: &str) -> PersistentVolumeClaim {
    let spec = home.spec.clone().unwrap_or_default();
    let mut annotations: std::collections::BTreeMap<String, String> = home
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| {
            ![
                "pv.kubernetes.io/",
                "volume.kubernetes.io/",
                "volume.beta.kubernetes.io/",
            ]
            .iter()
            .any(|p| k.starts_with(p))
                && k != "kubectl.kubernetes.io/last-applied-configuration"
        })
        .collect();
    annotations.insert(names::storage::SELECTED_NODE.to_owned(), node.to_owned());
    PersistentVolumeClaim {
        metadata: kube::api::ObjectMeta {
            name: home.metadata.name.clone(),
            namespace: home.metadata.namespace.clone(),
            labels: home.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(sized_like(&spec, spec.storage_class_name.clone())),
        status: None,
    }
}
