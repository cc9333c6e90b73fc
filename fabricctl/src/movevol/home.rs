//! A move home (`--to local`): a claim whose data is on a provider (its volume a placeholder
//! pinned to that provider's virtual node) gets it back on a real node here.
//!
//! The copy: a landing claim beside it ([`copy::landing_claim`], of the fabric's class), a
//! sender on the provider's virtual node mounting the claim (so its filled claim in the twin)
//! that listens, and a receiver here mounting the landing claim that connects to the
//! sender's address as this cluster sees it (a provider's pods reach this cluster's only
//! through addresses the provider alone knows). The receiver is the landing claim's first
//! consumer on a real node: the real-node provisioner makes it a real claim in the storage
//! namespace, which the receiver fills. Until both digests match, a failure removes the
//! transfer pods and the landing claim (its real claim with it) and leaves the claim and its
//! data on the provider as they were.
//!
//! The hand-over, written ahead in the same journal as a move's to a provider (its own key,
//! [`KEY`]): the real claim handed over to the claim's name (its home UID label emptied: the
//! provisioner lets the landing claim go without it, and gives it to the next claim of that
//! name), the landing claim deleted, the claim deleted (its filled claim on the provider goes
//! with it, as with any deletion), made again with its selected node the real claim's, whose
//! provisioner adopts the real claim and binds it over the same volume. Each step is
//! idempotent; what is decided is pure ([`step`]).
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use fabric_api::names::storage::{HOME_NAME, HOME_UID, SELECTED_NODE};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde::{Deserialize, Serialize};

use super::{
    Copy, Listener, Place, copy,
    handover::{self, journal_name},
    remove_transfer_pods, transfer,
};

/// The journal's key in its ConfigMap ([`journal_name`]).
pub const KEY: &str = "hand-over-home";

/// A hand-over home under way, as the journal holds it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HandHome {
    /// The provider the data was on.
    pub provider: String,
    /// The claim's UID before the hand-over (bound to the provider's placeholder).
    pub source_uid: String,
    /// The landing claim the receiver filled.
    pub landing: String,
    pub landing_uid: String,
    /// Its real claim, which holds the data: namespace, name, UID.
    pub real_namespace: String,
    pub real: String,
    pub real_uid: String,
    /// The claim made again, its selected node the real claim's.
    pub remade: PersistentVolumeClaim,
}

impl HandHome {
    fn to_config_map(&self, claim: &str) -> Result<ConfigMap> {
        handover::journal(claim, KEY, self)
    }

    /// The hand-over home a journal holds, if it is one.
    pub fn of(cm: &ConfigMap) -> Option<Result<Self>> {
        let text = cm.data.as_ref()?.get(KEY)?;
        Some(
            serde_json::from_str(text)
                .with_context(|| format!("reading journal {}", cm.name_any())),
        )
    }
}

/// Where the hand-over stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The real claim's home UID label (`None`: the real claim is gone).
    pub real_home_uid: Option<String>,
    pub landing_there: bool,
    /// The claim's UID, if there is one.
    pub claim_uid: Option<String>,
}

/// What the hand-over does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The real claim labelled as handed over to the claim's name.
    HandOverReal,
    /// The landing claim goes (UID-preconditioned).
    DeleteLanding,
    /// The claim bound to the provider goes (UID-preconditioned), its data there with it.
    DeleteSource,
    /// The claim made again under its name.
    Remake,
    /// Made again: the provisioner adopts the real claim.
    Done,
    /// The real claim is gone, or taken by another claim: the data is not where the journal
    /// says.
    Lost(String),
}

pub fn step(j: &HandHome, s: &Seen) -> Step {
    let Some(real_uid) = s.real_home_uid.as_deref() else {
        return Step::Lost(format!(
            "the real claim {}/{} holding the copy is gone",
            j.real_namespace, j.real
        ));
    };
    if real_uid == j.landing_uid {
        return Step::HandOverReal;
    }
    if s.landing_there {
        return Step::DeleteLanding;
    }
    match s.claim_uid.as_deref() {
        Some(u) if u == j.source_uid => Step::DeleteSource,
        None if real_uid.is_empty() => Step::Remake,
        None => Step::Lost(format!(
            "the real claim {}/{} was taken by claim UID {real_uid}",
            j.real_namespace, j.real
        )),
        Some(_) => Step::Done,
    }
}

fn uid_only(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    }
}

/// Deletes claim `name` if it is still the one of `uid`, and waits (120 s) until it is gone.
pub(super) async fn delete_and_wait(
    api: &Api<PersistentVolumeClaim>,
    name: &str,
    uid: &str,
) -> Result<()> {
    match api.delete(name, &uid_only(uid)).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => return Err(e).with_context(|| format!("deleting claim {name}")),
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while api
        .get_opt(name)
        .await?
        .is_some_and(|c| c.uid().as_deref() == Some(uid))
    {
        if Instant::now() > deadline {
            bail!("claim {name} not gone after 120s");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// The data of claim `pvc` (on provider `id`) back on a real node here (see the module).
pub async fn to_local(
    local: &kube::Client,
    pvc: &PersistentVolumeClaim,
    id: &str,
    image: &str,
) -> Result<()> {
    let ns = pvc.namespace().unwrap_or_default();
    let claim = pvc.name_any();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(local.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(local.clone(), &ns);
    let landing_name = copy::landing_name(&claim);
    if let Some(left) = claims.get_opt(&landing_name).await? {
        if !copy::is_landing_of(&left, &claim) {
            bail!(
                "claim {ns}/{landing_name} exists and is not a move's: a move of {claim} home \
                 lands there; nothing was changed"
            );
        }
        // Left by a copy that never ended: not trusted; it goes (its real claim with it).
        println!(
            "claim {ns}/{landing_name} is left from an earlier move of {claim} that did not \
             finish its copy: removing it and its transfer pods, copying again"
        );
        remove_transfer_pods(&pods, &claim).await?;
        delete_and_wait(&claims, &landing_name, &left.uid().unwrap_or_default()).await?;
    }
    let landing = claims
        .create(&PostParams::default(), &copy::landing_claim(pvc))
        .await
        .with_context(|| format!("making the landing claim {ns}/{landing_name}"))?;
    println!("landing claim {ns}/{landing_name} made");
    let outcome = transfer(
        &pods,
        &Copy {
            claim: &claim,
            from: Place::Provider(id.to_owned()),
            from_claim: &claim,
            to: Place::Local,
            to_claim: &landing_name,
            listener: Listener::Sender,
            image,
        },
    )
    .await;
    let removed = remove_transfer_pods(&pods, &claim).await;
    let digest = match outcome.and_then(|d| removed.map(|()| d)) {
        Ok(d) => d,
        Err(e) => {
            let undo =
                delete_and_wait(&claims, &landing_name, &landing.uid().unwrap_or_default()).await;
            let left = match undo {
                Ok(()) => String::new(),
                Err(u) => format!(" (the landing claim {ns}/{landing_name} is left: {u:#})"),
            };
            return Err(e.context(format!(
                "moving claim {ns}/{claim} home from {id} failed: nothing was changed, the data \
                 stays on {id} and the claim points to it{left}"
            )));
        }
    };
    println!("checksums match: sha256 {digest}");
    // The real claim the provisioner made for the landing claim: it holds the copy.
    let real = Api::<PersistentVolumeClaim>::all(local.clone())
        .list(
            &ListParams::default()
                .labels(&format!("{HOME_UID}={}", landing.uid().unwrap_or_default())),
        )
        .await
        .context("finding the landing claim's real claim")?
        .items
        .into_iter()
        .next()
        .with_context(|| format!("the landing claim {ns}/{landing_name} has no real claim"))?;
    let node = real
        .annotations()
        .get(SELECTED_NODE)
        .cloned()
        .with_context(|| format!("real claim {} names no node", real.name_any()))?;
    let journal = HandHome {
        provider: id.to_owned(),
        source_uid: pvc.uid().unwrap_or_default(),
        landing: landing_name.clone(),
        landing_uid: landing.uid().unwrap_or_default(),
        real_namespace: real.namespace().unwrap_or_default(),
        real: real.name_any(),
        real_uid: real.uid().unwrap_or_default(),
        remade: copy::remade(pvc, &node),
    };
    Api::<ConfigMap>::namespaced(local.clone(), &ns)
        .create(&PostParams::default(), &journal.to_config_map(&claim)?)
        .await
        .with_context(|| format!("writing the journal {ns}/{}", journal_name(&claim)))?;
    run(local, &ns, &claim, &journal).await
}

/// Finishes the hand-over home a journal holds (an earlier run died in it).
pub async fn finish(local: &kube::Client, ns: &str, claim: &str, journal: &HandHome) -> Result<()> {
    println!(
        "claim {ns}/{claim}: an earlier move home from {} copied the data but did not finish \
         handing it over; finishing it (journal {ns}/{})",
        journal.provider,
        journal_name(claim)
    );
    run(local, ns, claim, journal).await
}

async fn run(local: &kube::Client, ns: &str, claim: &str, j: &HandHome) -> Result<()> {
    let home: Api<PersistentVolumeClaim> = Api::namespaced(local.clone(), ns);
    let reals: Api<PersistentVolumeClaim> = Api::namespaced(local.clone(), &j.real_namespace);
    let kept = format!(
        "the data is in claim {}/{} (uid {}); run `fabricctl move volume {ns}/{claim} --to \
         local` again to finish",
        j.real_namespace, j.real, j.real_uid
    );
    async {
        loop {
            let real = reals
                .get_opt(&j.real)
                .await?
                .filter(|r| r.uid().as_deref() == Some(&j.real_uid));
            let seen = Seen {
                real_home_uid: real.map(|r| r.labels().get(HOME_UID).cloned().unwrap_or_default()),
                landing_there: home
                    .get_opt(&j.landing)
                    .await?
                    .is_some_and(|c| c.uid().as_deref() == Some(&j.landing_uid)),
                claim_uid: home.get_opt(claim).await?.and_then(|c| c.uid()),
            };
            match step(j, &seen) {
                Step::HandOverReal => {
                    let patch =
                        serde_json::json!({"metadata": {"labels": {HOME_UID: "", HOME_NAME: claim}}});
                    reals
                        .patch(&j.real, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
                Step::DeleteLanding => delete_and_wait(&home, &j.landing, &j.landing_uid).await?,
                Step::DeleteSource => delete_and_wait(&home, claim, &j.source_uid).await?,
                Step::Remake => {
                    home.create(&PostParams::default(), &j.remade).await?;
                }
                Step::Done => break,
                Step::Lost(why) => bail!("{why}"),
            }
        }
        handover::remove_journal(local, ns, claim).await
    }
    .await
    .with_context(|| format!("handing the data over to claim {ns}/{claim}: {kept}"))?;
    let node = j
        .remade
        .annotations()
        .get(SELECTED_NODE)
        .cloned()
        .unwrap_or_default();
    println!(
        "the data on {} removed; claim {ns}/{claim} made again for {node}",
        j.provider
    );
    let v = handover::wait_bound(&home, ns, claim, || {
        format!(
            "not bound by the storage provisioner after 120s: the data is in claim {}/{}",
            j.real_namespace, j.real
        )
    })
    .await?;
    println!("claim {ns}/{claim} bound to {v}, on {node}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn journal() -> HandHome {
        HandHome {
            provider: "prov".into(),
            source_uid: "src".into(),
            landing: "data-landing".into(),
            landing_uid: "land".into(),
            real_namespace: "fabric-storage".into(),
            real: "home-land".into(),
            real_uid: "r1".into(),
            remade: serde_json::from_value(serde_json::json!({
                "metadata": {"name": "data", "namespace": "shop",
                             "annotations": {SELECTED_NODE: "node-a"}},
                "spec": {"storageClassName": "fabric"},
            }))
            .unwrap(),
        }
    }

    fn seen(real: Option<&str>, landing: bool, claim: Option<&str>) -> Seen {
        Seen {
            real_home_uid: real.map(str::to_owned),
            landing_there: landing,
            claim_uid: claim.map(str::to_owned),
        }
    }

    #[test]
    fn the_hand_over_home_goes_on_from_wherever_it_stopped() {
        let j = journal();
        // In order: the real claim handed over, the landing claim and the source gone, the
        // claim made again, adopted.
        assert_eq!(
            step(&j, &seen(Some("land"), true, Some("src"))),
            Step::HandOverReal
        );
        assert_eq!(
            step(&j, &seen(Some(""), true, Some("src"))),
            Step::DeleteLanding
        );
        assert_eq!(
            step(&j, &seen(Some(""), false, Some("src"))),
            Step::DeleteSource
        );
        assert_eq!(step(&j, &seen(Some(""), false, None)), Step::Remake);
        assert_eq!(step(&j, &seen(Some(""), false, Some("new"))), Step::Done);
        // Adopted before this run looked again.
        assert_eq!(step(&j, &seen(Some("new"), false, Some("new"))), Step::Done);
        // The data gone or taken: said, nothing done.
        assert!(matches!(step(&j, &seen(None, false, None)), Step::Lost(_)));
        assert!(matches!(
            step(&j, &seen(Some("other"), false, None)),
            Step::Lost(_)
        ));
    }

    #[test]
    fn the_journal_reads_back_what_was_written() {
        let j = journal();
        let cm = j.to_config_map("data").unwrap();
        assert_eq!(cm.name_any(), "fabric-move-data");
        assert_eq!(HandHome::of(&cm).unwrap().unwrap(), j);
        // A move to a provider's journal is not one.
        let mut other = cm.clone();
        other.data = Some(BTreeMap::from([("hand-over".to_owned(), "{}".to_owned())]));
        assert!(HandHome::of(&other).is_none());
    }

    #[test]
    fn the_landing_claim_is_the_claims_size_and_class_and_known_as_a_moves() {
        let home: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data", "namespace": "shop", "uid": "u1",
                         "annotations": {SELECTED_NODE: "fabric-prov"}},
            "spec": {"storageClassName": "fabric", "accessModes": ["ReadWriteOnce"],
                     "volumeName": "pvc-u1", "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap();
        let l = copy::landing_claim(&home);
        let v = serde_json::to_value(&l).unwrap();
        assert_eq!(v["metadata"]["name"], "data-landing");
        assert_eq!(v["metadata"]["namespace"], "shop");
        assert!(v["metadata"]["annotations"].is_null(), "{v}");
        assert_eq!(v["spec"]["storageClassName"], "fabric");
        assert_eq!(v["spec"]["resources"]["requests"]["storage"], "1Gi");
        assert!(v["spec"]["volumeName"].is_null(), "{v}");
        assert!(copy::is_landing_of(&l, "data"));
        assert!(!copy::is_landing_of(&l, "logs"));
        assert!(!copy::is_landing_of(&home, "data"));
    }
}
