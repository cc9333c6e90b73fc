//! `fabricctl move volume CLAIM [--claim-namespace NS] --to CLUSTER` (issue 21): a claim's data
//! moves, offline, from this cluster to a peered provider (CLUSTER its cluster id), from a
//! provider back here (`local`, [`home`]), or from one provider to another (through this
//! cluster: home, then there).
//!
//! What is decided here is pure ([`users`], [`destination`], [`location`]); the reads are in
//! [`move_volume`]. The checks come first and write nothing: a claim any non-terminated pod
//! still uses is refused naming those pods (its workload is scaled to 0 first: a copy of a
//! volume being written is not the volume), and a destination that is neither `local` nor a
//! provider of this cluster is refused naming those there are.
//!
//! The copy, home to a provider ([`to_provider`]; the way back is [`home`]'s): the claim of the same name made in the namespace's twin with this cluster's
//! identity, a receiver pod (`fabric-volume-transfer receive`) bound to the provider's virtual
//! node mounting it there, a sender pod here mounting the source, progress printed from the
//! sender's log, both digests compared ([`copy::verdict`]). Only then is the home claim made
//! again under its name and handed the filled claim ([`handover`], written ahead in a journal
//! at home), its volume here (the source) going with the old one. Before that, any failure
//! removes the transfer pods and the claim in the twin and leaves the home claim and its data
//! as they were.
//!
//! A move that dies (or loses the API server) is finished or undone by the same command run
//! again: a hand-over begun is finished from its journal before anything else, and a claim
//! left in the twin by a copy that never ended ([`copy::interrupted`]) goes with its transfer
//! pods before the copy starts again.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use fabric_api::{
    core::v1alpha1::{ForeignCluster, PeerRole},
    names,
    offloading::v1alpha1::{NamespaceMap, VirtualNode},
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams, LogParams, PostParams, Preconditions},
};

pub mod copy;
pub mod handover;
pub mod home;

/// Where a claim's data is, or is to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A real node of this cluster.
    Local,
    /// Provider `cluster_id` (its virtual node).
    Provider(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Local => f.write_str("local"),
            Place::Provider(id) => write!(f, "provider {id}"),
        }
    }
}

/// The pods that keep `claim` from moving: those mounting it that have not terminated
/// (`Succeeded`/`Failed`), sorted. A pod being deleted still counts: it may still write.
pub fn users(claim: &str, pods: &[Pod]) -> Vec<String> {
    let mut out: Vec<String> = pods
        .iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == claim)
                })
        })
        .map(|p| p.name_any())
        .collect();
    out.sort();
    out
}

/// The destination `to` names: `local`, or the cluster id of a peer that provides to this
/// cluster; anything else is an error naming the choices.
pub fn destination(to: &str, peers: &[ForeignCluster]) -> Result<Place, String> {
    if to == "local" {
        return Ok(Place::Local);
    }
    let providers: Vec<&str> = peers
        .iter()
        .filter(|fc| {
            matches!(
                fc.spec.role,
                PeerRole::Provider | PeerRole::ConsumerAndProvider
            )
        })
        .map(|fc| fc.spec.cluster_id.as_str())
        .collect();
    if providers.contains(&to) {
        return Ok(Place::Provider(to.to_owned()));
    }
    let known = if providers.is_empty() {
        "none".to_owned()
    } else {
        providers.join(", ")
    };
    Err(format!(
        "--to {to}: not `local` nor a provider of this cluster (providers: {known})"
    ))
}

/// Where a bound claim's volume is: a placeholder pinned to a provider's virtual node is on
/// that provider, anything else is here.
pub fn location(pv: &PersistentVolume, peers: &[ForeignCluster]) -> Place {
    let pinned: Vec<&str> = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .iter()
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
        .flat_map(|e| e.values.iter().flatten())
        .map(String::as_str)
        .collect();
    peers
        .iter()
        .map(|fc| fc.spec.cluster_id.as_str())
        .find(|id| pinned.contains(&names::node::virtual_node(id).as_str()))
        .map_or(Place::Local, |id| Place::Provider(id.to_owned()))
}

pub async fn move_volume(
    local: &kube::Client,
    fabric_ns: &str,
    ns: &str,
    claim: &str,
    to: &str,
    image: &str,
) -> Result<()> {
    // A hand-over an earlier run began is finished first (the home claim may be gone).
    if handover::finish(local, ns, claim, to).await? {
        println!("claim {ns}/{claim} moved to {to}");
        return Ok(());
    }
    let pvc = Api::<PersistentVolumeClaim>::namespaced(local.clone(), ns)
        .get_opt(claim)
        .await
        .with_context(|| format!("reading claim {ns}/{claim}"))?
        .with_context(|| format!("claim {ns}/{claim}: no such claim"))?;
    let class = pvc
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref());
    if class != Some(names::storage::CLASS) {
        bail!(
            "claim {ns}/{claim}: its class is {}, only claims of the fabric's class {} move",
            class.unwrap_or("(none)"),
            names::storage::CLASS
        );
    }
    let peers = Api::<ForeignCluster>::all(local.clone())
        .list(&ListParams::default())
        .await
        .context("listing ForeignClusters (is the fabric installed?)")?
        .items;
    let dest = destination(to, &peers).map_err(anyhow::Error::msg)?;
    let pods_api = Api::<Pod>::namespaced(local.clone(), ns);
    let mut pods = pods_api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the pods of {ns}"))?
        .items;
    let left = copy::transfer_pods_of(claim, &pods);
    if !left.is_empty() {
        // An earlier move of this claim that died: its copy is not trusted (a claim it made
        // in a twin goes before the next copy), its pods go now.
        println!(
            "transfer pod(s) {} of claim {ns}/{claim} are left from an earlier move: removing them",
            left.join(", ")
        );
        remove_transfer_pods(&pods_api, claim).await?;
        pods.retain(|p| !left.contains(&p.name_any()));
    }
    let using = users(claim, &pods);
    if !using.is_empty() {
        bail!(
            "claim {ns}/{claim} is in use by pod(s) {}: scale their workload to 0 first (a volume moves offline)",
            using.join(", ")
        );
    }
    let Some(volume) = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) else {
        bail!("claim {ns}/{claim} is not bound yet: it has no data to move");
    };
    let pv = Api::<PersistentVolume>::all(local.clone())
        .get(volume)
        .await
        .with_context(|| format!("reading volume {volume} of claim {ns}/{claim}"))?;
    let from = location(&pv, &peers);
    if from == dest {
        bail!("claim {ns}/{claim}: its data is already on {dest}");
    }
    match (&from, &dest) {
        (Place::Local, Place::Provider(id)) => to_provider(local, fabric_ns, &pvc, id, image).await,
        (Place::Provider(id), Place::Local) => home::to_local(local, &pvc, id, image).await,
        (Place::Provider(a), Place::Provider(b)) => {
            // Through this cluster: a provider's pods reach another provider's only if those
            // two are peered themselves, which this cluster cannot know.
            println!("claim {ns}/{claim}: from {a} to {b} through this cluster: home first");
            home::to_local(local, &pvc, a, image).await?;
            let pvc = Api::<PersistentVolumeClaim>::namespaced(local.clone(), ns)
                .get(claim)
                .await
                .with_context(|| format!("reading claim {ns}/{claim} again"))?;
            to_provider(local, fabric_ns, &pvc, b, image)
                .await
                .with_context(|| format!("the data is home now, on claim {ns}/{claim}"))
        }
        (Place::Local, Place::Local) => bail!("claim {ns}/{claim}: its data is already here"),
    }
}

/// How long the receiver has to start on the provider, and the sender to make progress.
const START: Duration = Duration::from_secs(180);
const STALL: Duration = Duration::from_secs(120);
/// How long the sender may stay unschedulable before the move fails with the scheduler's
/// reason: long enough for a retry of the scheduler to place it (a node Ready again), far
/// shorter than waiting for progress that cannot come.
const UNSCHEDULABLE: Duration = Duration::from_secs(15);

/// The data of home claim `pvc` (on a real node here) to provider `id`: a claim of the same
/// name in the namespace's twin there (this cluster's identity), filled by a receiver pod
/// bound to the provider's virtual node (offloaded as any pod, its ShadowPod admitted by the
/// provider's policy) from a sender pod here mounting the claim, over the fabric (the
/// receiver's address as this cluster sees it); both digests compared; then the home claim
/// made again under its name and handed the filled claim (see [`handover`]). Until the
/// digests match, a failure removes the transfer pods and the claim in the twin, and leaves
/// the home claim and its data as they were.
async fn to_provider(
    local: &kube::Client,
    fabric_ns: &str,
    pvc: &PersistentVolumeClaim,
    id: &str,
    image: &str,
) -> Result<()> {
    let ns = pvc.namespace().unwrap_or_default();
    let claim = pvc.name_any();
    let node = names::node::virtual_node(id);
    // What the provider lends (the twin claim's class), from its VirtualNode here.
    let lent = Api::<VirtualNode>::namespaced(local.clone(), fabric_ns)
        .list(&ListParams::default())
        .await
        .context("listing VirtualNodes")?
        .items
        .into_iter()
        .find(|v| v.spec.cluster_id == id)
        .with_context(|| format!("provider {id} has no VirtualNode in {fabric_ns}"))?
        .spec
        .storage
        .with_context(|| format!("provider {id} lends no storage to this cluster"))?;
    let class = pvc
        .annotations()
        .get(names::storage::REMOTE_CLASS)
        .filter(|c| !c.is_empty())
        .cloned()
        .or(lent.default);
    let remote = fabric_auth::identity::remote_client(local, id)
        .await
        .with_context(|| format!("reaching provider {id} with this cluster's identity"))?;
    let tenant = remote.default_namespace().to_owned();
    let Some(me) = tenant.strip_prefix(&names::namespace::tenant("")) else {
        bail!("the identity for {id} names namespace {tenant}, which is no tenant namespace");
    };
    let twin = Api::<NamespaceMap>::namespaced(remote.clone(), &tenant)
        .get_opt(me)
        .await
        .with_context(|| format!("reading NamespaceMap {tenant}/{me} on {id}"))?
        .and_then(|m| m.spec.namespaces.into_iter().find(|m| m.home == ns))
        .map(|m| m.remote)
        .with_context(|| {
            format!(
                "namespace {ns} is not offloaded to {id}: offload it there first \
                 (`fabricctl offload namespace {ns}`); nothing was changed"
            )
        })?;
    let twin_claims: Api<PersistentVolumeClaim> = Api::namespaced(remote.clone(), &twin);
    let pods: Api<Pod> = Api::namespaced(local.clone(), &ns);
    if let Some(there) = twin_claims.get_opt(&claim).await? {
        if !copy::interrupted(&there, pvc, me, id) {
            bail!(
                "claim {claim} already exists in twin {twin} on {id} (uid {}): nothing was changed",
                there.uid().unwrap_or_default()
            );
        }
        // Made for this very claim by a move that stopped before the digests matched: its
        // copy is not trusted, it goes with the transfer pods, and the copy starts again.
        println!(
            "claim {claim} in twin {twin} on {id} is left from an earlier move of this claim \
             that did not finish its copy: removing it and its transfer pods, copying again"
        );
        remove_transfer_pods(&pods, &claim).await?;
        home::delete_and_wait(&twin_claims, &claim, &there.uid().unwrap_or_default())
            .await
            .with_context(|| format!("removing claim {claim} left in twin {twin} on {id}"))?;
    }
    let made = twin_claims
        .create(
            &PostParams::default(),
            &copy::twin_claim(pvc, &twin, class.as_deref(), me, id),
        )
        .await
        .with_context(|| format!("making claim {claim} in twin {twin} on {id}"))?;
    println!(
        "claim {claim} made in twin {twin} on {id} (class {})",
        class.as_deref().unwrap_or("(its default)")
    );
    let outcome = transfer(
        &pods,
        &Copy {
            claim: &claim,
            from: Place::Local,
            from_claim: &claim,
            to: Place::Provider(id.to_owned()),
            to_claim: &claim,
            listener: Listener::Receiver,
            image,
        },
    )
    .await;
    // The transfer pods go whatever the outcome: the claims are free again.
    let removed = remove_transfer_pods(&pods, &claim).await;
    let digest = match outcome.and_then(|d| removed.map(|()| d)) {
        Ok(d) => d,
        Err(e) => {
            let undo = twin_claims
                .delete(
                    &claim,
                    &DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: made.uid(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    },
                )
                .await;
            let left = match undo {
                Ok(_) => String::new(),
                Err(u) => format!(
                    " (claim {claim} in twin {twin} on {id} could not be removed: {u}; \
                     delete it there)"
                ),
            };
            return Err(e.context(format!(
                "moving claim {ns}/{claim} to {id} failed: nothing was changed, the data stays \
                 here and the claim points to it{left}"
            )));
        }
    };
    println!("checksums match: sha256 {digest}");
    handover::start(local, pvc, &twin_claims, &made, &node, me, id).await?;
    println!("claim {ns}/{claim} moved to {id}: its pods now run on {node}");
    Ok(())
}

/// Which side of a copy listens: the one the other can reach (this cluster reaches its
/// providers' pods; a provider's pods reach this cluster's only through addresses it alone
/// knows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listener {
    Receiver,
    Sender,
}

/// A copy: the sender where the data is, mounting the claim there, the receiver where it
/// goes, mounting the claim it fills.
struct Copy<'a> {
    /// The claim moved (the transfer pods' names and label).
    claim: &'a str,
    from: Place,
    from_claim: &'a str,
    to: Place,
    to_claim: &'a str,
    listener: Listener,
    image: &'a str,
}

/// The copy: the listening side started first (its address as this cluster sees it), then
/// the other, progress printed from the sender's log, both digests compared. The digest, or
/// why not.
async fn transfer(pods: &Api<Pod>, c: &Copy<'_>) -> Result<String> {
    let port = copy::PORT.to_string();
    let token = copy::token();
    let dir = ["--dir".to_owned(), copy::MOUNT.into()];
    let (listen_args, listen_place, listen_claim, listen_role) = match c.listener {
        Listener::Receiver => (["receive", "--port", &port], &c.to, c.to_claim, "receiver"),
        Listener::Sender => (["send", "--listen", &port], &c.from, c.from_claim, "sender"),
    };
    let args: Vec<String> = listen_args
        .iter()
        .map(|a| (*a).to_owned())
        .chain(dir.iter().cloned())
        .collect();
    let listening = pods
        .create(
            &PostParams::default(),
            &copy::transfer_pod(c.claim, listen_claim, listen_place, c.image, &args, &token),
        )
        .await
        .with_context(|| format!("creating the {listen_role} pod"))?
        .name_any();
    let ip = wait_pod(pods, &listening, START, "running with an address", |p| {
        let s = p.status.as_ref()?;
        if matches!(s.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return Some(Err(format!("it ended: {}", ended(p))));
        }
        (s.phase.as_deref() == Some("Running"))
            .then(|| s.pod_ip.clone())
            .flatten()
            .map(Ok)
    })
    .await?;
    println!("{listen_role} {listening} running on {listen_place}, at {ip}");
    let at = format!("{ip}:{port}");
    let (connect_args, connect_place, connect_claim, connect_role) = match c.listener {
        Listener::Receiver => (["send", "--to", &at], &c.from, c.from_claim, "sender"),
        Listener::Sender => (["receive", "--from", &at], &c.to, c.to_claim, "receiver"),
    };
    let args: Vec<String> = connect_args
        .iter()
        .map(|a| (*a).to_owned())
        .chain(dir.iter().cloned())
        .collect();
    let connecting = pods
        .create(
            &PostParams::default(),
            &copy::transfer_pod(
                c.claim,
                connect_claim,
                connect_place,
                c.image,
                &args,
                &token,
            ),
        )
        .await
        .with_context(|| format!("creating the {connect_role} pod"))?
        .name_any();
    let (sender, receiver) = match c.listener {
        Listener::Receiver => (connecting.clone(), listening),
        Listener::Sender => (listening, connecting.clone()),
    };
    let logs = |name: String| async move {
        pods.logs(&name, &LogParams::default())
            .await
            .unwrap_or_default()
    };
    let mut shown = 0;
    let mut moved_at = Instant::now();
    let mut unschedulable_since: Option<Instant> = None;
    let sent = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = copy::progress(&logs(sender.clone()).await, "sent");
        if now.bytes != shown {
            println!("sent {} bytes", now.bytes);
            shown = now.bytes;
            moved_at = Instant::now();
        }
        let phase = |p: Option<Pod>| {
            p.and_then(|p| p.status?.phase)
                .unwrap_or_else(|| "gone".to_owned())
        };
        let sender_pod = pods.get_opt(&sender).await?;
        let receiver_pod = pods.get_opt(&receiver).await?;
        // The side placed here (the one that connects) is the scheduler's to place.
        let here = match c.listener {
            Listener::Receiver => &sender_pod,
            Listener::Sender => &receiver_pod,
        };
        match here.as_ref().and_then(copy::unschedulable) {
            Some(why) => {
                let since = *unschedulable_since.get_or_insert_with(Instant::now);
                if since.elapsed() > UNSCHEDULABLE {
                    bail!(
                        "the {connect_role} {connecting} cannot be scheduled here (for {}s): {why}",
                        since.elapsed().as_secs()
                    );
                }
            }
            None => unschedulable_since = None,
        }
        let s = phase(sender_pod);
        let r = phase(receiver_pod);
        match (s.as_str(), r.as_str()) {
            ("Succeeded", _) => break now,
            ("Failed" | "gone", _) => bail!(
                "the sender {sender} failed after {} bytes: {}",
                now.bytes,
                last_line(&logs(sender.clone()).await)
            ),
            (_, "Failed" | "gone") => bail!(
                "the receiver {receiver} is {} (after the sender's {} bytes)",
                if r == "gone" { "gone" } else { "failed" },
                now.bytes
            ),
            _ if moved_at.elapsed() > STALL => bail!(
                "no progress for {}s (sender {s}, receiver {r}, {} bytes sent)",
                STALL.as_secs(),
                now.bytes
            ),
            _ => {}
        }
    };
    // The receiver ends once the stream was whole and it printed its digest.
    wait_pod(pods, &receiver, STALL, "finished", |p| {
        match p.status.as_ref()?.phase.as_deref()? {
            "Succeeded" => Some(Ok(())),
            "Failed" => Some(Err(format!("it failed: {}", ended(p)))),
            _ => None,
        }
    })
    .await?;
    let received = copy::progress(&logs(receiver.clone()).await, "received");
    println!(
        "sent {} bytes sha256 {}",
        sent.bytes,
        sent.sha256.as_deref().unwrap_or("-")
    );
    println!(
        "received {} bytes sha256 {}",
        received.bytes,
        received.sha256.as_deref().unwrap_or("-")
    );
    copy::verdict(&sent, &received).map_err(anyhow::Error::msg)
}

/// How a pod ended: its phase, and its container's exit code and reason.
fn ended(p: &Pod) -> String {
    let s = p.status.as_ref();
    let phase = s.and_then(|s| s.phase.as_deref()).unwrap_or("unknown");
    let how = s
        .and_then(|s| {
            s.container_statuses
                .as_ref()?
                .first()?
                .state
                .as_ref()?
                .terminated
                .clone()
        })
        .map(|t| {
            format!(
                ", exit code {}{}",
                t.exit_code,
                t.message
                    .or(t.reason)
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    format!("{phase}{how}")
}

fn last_line(log: &str) -> &str {
    log.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no log)")
}

/// Waits until `f` says something of pod `name`: its value, or why it cannot be (an error).
async fn wait_pod<T>(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
    what: &str,
    f: impl Fn(&Pod) -> Option<Result<T, String>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match pods.get_opt(name).await? {
            None => bail!("pod {name} is gone (waiting for it {what})"),
            Some(p) => match f(&p) {
                Some(Ok(v)) => return Ok(v),
                Some(Err(why)) => bail!("pod {name}: {why} (waiting for it {what})"),
                None => {}
            },
        }
        if Instant::now() > deadline {
            bail!("pod {name} not {what} after {}s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Deletes the transfer pods of `claim` and waits until they are gone (their claims free).
async fn remove_transfer_pods(pods: &Api<Pod>, claim: &str) -> Result<()> {
    let lp = ListParams::default().labels(&format!("{}={claim}", copy::MOVE_LABEL));
    for p in pods.list(&lp).await?.items {
        match pods.delete(&p.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).context("deleting a transfer pod"),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pods.list(&lp).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("the transfer pods of {claim} are not gone after 60s");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{copy::*, *};
    use serde_json::json;

    fn pod(name: &str, claim: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c"}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn peer(id: &str, role: &str) -> ForeignCluster {
        serde_json::from_value(json!({
            "apiVersion": "core.fabric.io/v1alpha1", "kind": "ForeignCluster",
            "metadata": {"name": id},
            "spec": {"clusterId": id, "role": role},
        }))
        .unwrap()
    }

    #[test]
    fn only_running_pods_of_that_claim_hold_it() {
        let pods = [
            pod("db-1", "data", "Running"),
            pod("db-0", "data", "Pending"),
            pod("done", "data", "Succeeded"),
            pod("crashed", "data", "Failed"),
            pod("other", "logs", "Running"),
        ];
        assert_eq!(users("data", &pods), ["db-0", "db-1"]);
        assert!(users("nothing", &pods).is_empty());
    }

    #[test]
    fn the_destination_is_local_or_a_provider() {
        let peers = [peer("b", "Provider"), peer("c", "Consumer")];
        assert_eq!(destination("local", &peers), Ok(Place::Local));
        assert_eq!(destination("b", &peers), Ok(Place::Provider("b".into())));
        let e = destination("c", &peers).unwrap_err();
        assert!(e.contains("--to c") && e.contains("providers: b"), "{e}");
        let e = destination("zz", &[]).unwrap_err();
        assert!(e.contains("providers: none"), "{e}");
    }

    #[test]
    fn both_digests_must_match() {
        let log = "connecting to 1.2.3.4:7070: refused; again\nsent 65536 bytes\nsent 131072 bytes\nsent 140000 bytes sha256 ab12\n";
        let sent = progress(log, "sent");
        assert_eq!(
            sent,
            Progress {
                bytes: 140_000,
                sha256: Some("ab12".into())
            }
        );
        assert_eq!(
            progress("sent 10 bytes\n", "sent"),
            Progress {
                bytes: 10,
                sha256: None
            }
        );
        let got = progress(
            "listening on 7070\nreceived 140000 bytes sha256 ab12\n",
            "received",
        );
        assert_eq!(verdict(&sent, &got), Ok("ab12".into()));
        let other = Progress {
            bytes: 140_000,
            sha256: Some("cd34".into()),
        };
        assert!(
            verdict(&sent, &other)
                .unwrap_err()
                .contains("checksums differ")
        );
        assert!(
            verdict(&sent, &Progress::default())
                .unwrap_err()
                .contains("receiver did not finish")
        );
        assert!(
            verdict(
                &Progress {
                    bytes: 5,
                    sha256: None
                },
                &got
            )
            .unwrap_err()
            .contains("sender did not finish (after 5 bytes)")
        );
    }

    #[test]
    fn transfer_pods_go_where_their_claim_is() {
        let args = [
            "receive".to_owned(),
            "--port".into(),
            PORT.to_string(),
            "--dir".into(),
            copy::MOUNT.into(),
        ];
        let p = transfer_pod(
            "data",
            "data-moved",
            &Place::Provider("b".into()),
            "fabric-controller",
            &args,
            "t0k",
        );
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["metadata"]["name"], "move-data-receive");
        assert_eq!(v["spec"]["nodeName"], "fabric-b");
        assert_eq!(
            v["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "data-moved"
        );
        assert_eq!(
            v["spec"]["containers"][0]["command"][0],
            "fabric-volume-transfer"
        );
        assert_eq!(v["spec"]["containers"][0]["command"][1], "receive");
        assert_eq!(
            v["spec"]["containers"][0]["env"],
            json!([{"name": TOKEN_ENV, "value": "t0k"}])
        );
        let l = serde_json::to_value(transfer_pod(
            "data",
            "data",
            &Place::Local,
            "img",
            &args,
            "t0k",
        ))
        .unwrap();
        assert!(l["spec"]["nodeName"].is_null());
        assert_eq!(
            l["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"],
            "NotIn"
        );
    }

    fn home_claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "store", "uid": "u1",
                "labels": {"app": "db"},
                "annotations": {"note": "kept", "pv.kubernetes.io/bind-completed": "yes",
                    "volume.kubernetes.io/selected-node": "worker-1",
                    "volume.beta.kubernetes.io/storage-provisioner": "fabric.io/storage"}},
            "spec": {"storageClassName": "fabric", "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem", "volumeName": "pvc-u1",
                "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    #[test]
    fn the_twin_claim_is_marked_for_the_home_claim_as_it_is() {
        let t = serde_json::to_value(twin_claim(
            &home_claim(),
            "store-a1",
            Some("standard"),
            "a",
            "b",
        ))
        .unwrap();
        assert_eq!(t["metadata"]["name"], "data");
        assert_eq!(t["metadata"]["namespace"], "store-a1");
        assert_eq!(t["metadata"]["labels"]["app"], "db");
        assert_eq!(t["metadata"]["labels"]["reflection.fabric.io/origin"], "a");
        assert_eq!(
            t["metadata"]["labels"]["reflection.fabric.io/destination"],
            "b"
        );
        assert_eq!(
            t["metadata"]["annotations"],
            json!({"storage.fabric.io/home-uid": "u1"})
        );
        assert_eq!(t["spec"]["storageClassName"], "standard");
        assert_eq!(t["spec"]["resources"]["requests"]["storage"], "1Gi");
        // Nothing of the home side's binding: the provider binds it.
        assert!(t["spec"]["volumeName"].is_null(), "{t}");
        assert!(t["metadata"]["uid"].is_null(), "{t}");
    }

    #[test]
    fn the_twin_claim_is_handed_over_by_its_marks() {
        let mut t =
            serde_json::to_value(twin_claim(&home_claim(), "store-a1", None, "a", "b")).unwrap();
        // Unmarked: no marks, no home UID; the home claim's own labels stay.
        json_patch_merge(&mut t, &ownership(None));
        assert_eq!(t["metadata"]["labels"], json!({"app": "db"}));
        assert_eq!(t["metadata"]["annotations"], json!({}));
        // Marked again for the claim made again.
        json_patch_merge(&mut t, &ownership(Some(("a", "b", "u2"))));
        assert_eq!(t["metadata"]["labels"]["reflection.fabric.io/origin"], "a");
        assert_eq!(
            t["metadata"]["labels"]["reflection.fabric.io/destination"],
            "b"
        );
        assert_eq!(
            t["metadata"]["annotations"]["storage.fabric.io/home-uid"],
            "u2"
        );
    }

    #[test]
    fn transfer_pods_are_known_by_their_claims_label() {
        let mut a = pod("move-data-send", "data", "Running");
        a.metadata.labels = Some([(MOVE_LABEL.to_owned(), "data".to_owned())].into());
        let mut b = pod("move-logs-send", "logs", "Running");
        b.metadata.labels = Some([(MOVE_LABEL.to_owned(), "logs".to_owned())].into());
        let c = pod("db", "data", "Running");
        assert_eq!(transfer_pods_of("data", &[c, b, a]), ["move-data-send"]);
    }

    #[test]
    fn only_a_claim_a_copy_of_this_very_claim_left_is_taken_for_interrupted() {
        let home = home_claim();
        let as_left: PersistentVolumeClaim = serde_json::from_value(
            serde_json::to_value(twin_claim(&home, "s", None, "a", "b")).unwrap(),
        )
        .unwrap();
        assert!(interrupted(&as_left, &home, "a", "b"));
        // Another consumer's, or for another provider.
        assert!(!interrupted(&as_left, &home, "c", "b"));
        assert!(!interrupted(&as_left, &home, "a", "x"));
        // Handed over (a claim made again, another UID), or unmarked mid-hand-over.
        let mut t = serde_json::to_value(&as_left).unwrap();
        json_patch_merge(&mut t, &ownership(Some(("a", "b", "u2"))));
        let handed: PersistentVolumeClaim = serde_json::from_value(t.clone()).unwrap();
        assert!(!interrupted(&handed, &home, "a", "b"));
        json_patch_merge(&mut t, &ownership(None));
        let unmarked: PersistentVolumeClaim = serde_json::from_value(t).unwrap();
        assert!(!interrupted(&unmarked, &home, "a", "b"));
    }

    /// RFC 7386, as the API server applies a merge patch.
    fn json_patch_merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
        match (target, patch) {
            (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        json_patch_merge(t.entry(k.clone()).or_insert(json!({})), v);
                    }
                }
            }
            (t, p) => *t = p.clone(),
        }
    }

    #[test]
    fn the_home_claim_is_made_again_for_the_virtual_node() {
        let r = serde_json::to_value(remade(&home_claim(), "fabric-b")).unwrap();
        assert_eq!(r["metadata"]["name"], "data");
        assert_eq!(r["metadata"]["namespace"], "store");
        assert!(r["metadata"]["uid"].is_null(), "{r}");
        assert_eq!(
            r["metadata"]["annotations"],
            json!({"note": "kept", "volume.kubernetes.io/selected-node": "fabric-b"})
        );
        assert_eq!(r["spec"]["storageClassName"], "fabric");
        assert_eq!(r["spec"]["accessModes"], json!(["ReadWriteOnce"]));
        assert_eq!(r["spec"]["resources"]["requests"]["storage"], "1Gi");
        assert!(r["spec"]["volumeName"].is_null(), "{r}");
        assert!(r["status"].is_null(), "{r}");
    }

    #[test]
    fn an_unschedulable_pod_says_why() {
        let p = |conditions: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "s"},
                "status": {"phase": "Pending", "conditions": conditions}}))
            .unwrap()
        };
        let why = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.";
        assert_eq!(
            unschedulable(&p(json!([{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": why}]))),
            Some(why.to_owned())
        );
        assert_eq!(
            unschedulable(&p(json!([{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable"}]))),
            Some("Unschedulable".to_owned())
        );
        // Scheduled, or not yet tried: nothing to say.
        assert_eq!(
            unschedulable(&p(json!([{"type": "PodScheduled", "status": "True"}]))),
            None
        );
        assert_eq!(
            unschedulable(&p(json!([{"type": "PodScheduled", "status": "False",
                "reason": "SchedulingGated"}]))),
            None
        );
        assert_eq!(unschedulable(&p(json!([]))), None);
    }

    #[test]
    fn a_placeholder_pinned_to_a_virtual_node_is_on_its_provider() {
        let pv = |node: &str| -> PersistentVolume {
            serde_json::from_value(json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}}))
            .unwrap()
        };
        let peers = [peer("b", "Provider")];
        assert_eq!(
            location(&pv("fabric-b"), &peers),
            Place::Provider("b".into())
        );
        assert_eq!(location(&pv("worker-1"), &peers), Place::Local);
    }
}
