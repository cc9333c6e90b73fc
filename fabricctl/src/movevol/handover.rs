//! The hand-over of a move to a provider, once both digests match: the home claim made again
//! under its name and given the filled claim in the twin. It runs through states that are not
//! the claim's usual ones (the filled claim unmarked, the home claim deleted), so it is
//! written ahead in a journal at home, a ConfigMap ([`journal_name`]) holding [`HandOver`]:
//! a `fabricctl move volume` that dies in between (or loses the API server) leaves it, and
//! the same command run again finishes the hand-over from the journal ([`finish`]), each step
//! idempotent, before anything else. What is decided is pure ([`step`]); the rest reads and
//! writes.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::names;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions},
};
use serde::{Deserialize, Serialize};

use super::copy;

/// The journal's key in its ConfigMap.
const KEY: &str = "hand-over";

/// A hand-over under way, as the journal holds it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HandOver {
    /// The provider holding the data, its twin of the claim's namespace, the filled claim's
    /// UID there.
    pub provider: String,
    pub twin: String,
    pub filled_uid: String,
    /// This cluster's id on that provider (the marks' origin).
    pub me: String,
    /// The home claim's UID before the hand-over: its volume here is the source.
    pub home_uid: String,
    /// The claim made again at home, bound to the provider's virtual node.
    pub remade: PersistentVolumeClaim,
}

/// The journal of claim `claim`'s hand-over holding `value` under `key` (a move to a provider
/// or home: each its own key).
pub(super) fn journal(claim: &str, key: &str, value: &impl Serialize) -> Result<ConfigMap> {
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(journal_name(claim)),
            labels: Some(BTreeMap::from([(
                names::storage::TRANSFER.to_owned(),
                claim.to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            key.to_owned(),
            serde_json::to_string(value).context("writing the journal")?,
        )])),
        ..Default::default()
    })
}

/// The journal of claim `claim`'s hand-over, in the claim's namespace.
pub fn journal_name(claim: &str) -> String {
    names::namespace::bounded(&format!("fabric-move-{claim}"))
}

impl HandOver {
    fn to_config_map(&self, claim: &str) -> Result<ConfigMap> {
        journal(claim, KEY, self)
    }

    fn of(cm: &ConfigMap) -> Result<Self> {
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(KEY))
            .with_context(|| format!("journal {} holds no {KEY}", cm.name_any()))?;
        serde_json::from_str(text).with_context(|| format!("reading journal {}", cm.name_any()))
    }
}

/// The home claim as the hand-over finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Home {
    Absent,
    /// Still the claim whose data moved (UID `home_uid`).
    Source,
    /// Made again (another UID).
    Remade(String),
}

/// What the hand-over does next, given where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The source claim goes (UID-preconditioned): its volume here with it.
    DeleteSource,
    /// The claim made again under its name.
    Remake,
    /// The filled claim marked as the remade claim's (UID): the virtual kubelet binds them.
    Mark(String),
}

/// The next step: the source claim goes, is made again, and the filled claim is marked as
/// the new one's (that last step is repeated harmlessly).
pub fn step(home: &Home) -> Step {
    match home {
        Home::Source => Step::DeleteSource,
        Home::Absent => Step::Remake,
        Home::Remade(uid) => Step::Mark(uid.clone()),
    }
}

fn home_of(claim: Option<&PersistentVolumeClaim>, journal: &HandOver) -> Home {
    match claim.and_then(|c| c.uid()) {
        None => Home::Absent,
        Some(uid) if uid == journal.home_uid => Home::Source,
        Some(uid) => Home::Remade(uid),
    }
}

/// Starts the hand-over of `pvc`'s data, filled into claim `filled` in the twin: the journal
/// first, then [`run`]. Its failure says where the data is and how to finish.
pub async fn start(
    local: &kube::Client,
    pvc: &PersistentVolumeClaim,
    twin_claims: &Api<PersistentVolumeClaim>,
    filled: &PersistentVolumeClaim,
    node: &str,
    me: &str,
    id: &str,
) -> Result<()> {
    let ns = pvc.namespace().unwrap_or_default();
    let claim = pvc.name_any();
    let journal = HandOver {
        provider: id.to_owned(),
        twin: filled.namespace().unwrap_or_default(),
        filled_uid: filled.uid().unwrap_or_default(),
        me: me.to_owned(),
        home_uid: pvc.uid().unwrap_or_default(),
        remade: copy::remade(pvc, node),
    };
    let journals: Api<ConfigMap> = Api::namespaced(local.clone(), &ns);
    journals
        .create(&PostParams::default(), &journal.to_config_map(&claim)?)
        .await
        .with_context(|| format!("writing the journal {ns}/{}", journal_name(&claim)))?;
    run(local, &ns, &claim, &journal, twin_claims).await
}

/// Finishes a hand-over of claim `ns/claim` an earlier run left (its journal there), to
/// provider `id`. `Ok(false)`: there is none.
pub async fn finish(local: &kube::Client, ns: &str, claim: &str, id: &str) -> Result<bool> {
    let journals: Api<ConfigMap> = Api::namespaced(local.clone(), ns);
    let Some(cm) = journals
        .get_opt(&journal_name(claim))
        .await
        .with_context(|| format!("reading the journal of claim {ns}/{claim}"))?
    else {
        return Ok(false);
    };
    if let Some(home) = super::home::HandHome::of(&cm) {
        let home = home?;
        if id != "local" {
            bail!(
                "claim {ns}/{claim}: an earlier move home from {} did not finish handing the \
                 data over (journal {ns}/{}): run `fabricctl move volume {ns}/{claim} --to \
                 local` to finish it",
                home.provider,
                cm.name_any()
            );
        }
        super::home::finish(local, ns, claim, &home).await?;
        return Ok(true);
    }
    let journal = HandOver::of(&cm)?;
    if journal.provider != id {
        bail!(
            "claim {ns}/{claim}: an earlier move to {} did not finish handing the data over \
             (journal {ns}/{}): run `fabricctl move volume {ns}/{claim} --to {}` to finish it",
            journal.provider,
            cm.name_any(),
            journal.provider
        );
    }
    println!(
        "claim {ns}/{claim}: an earlier move to {id} copied the data but did not finish \
         handing it over; finishing it (journal {ns}/{})",
        cm.name_any()
    );
    let remote = fabric_auth::identity::remote_client(local, id)
        .await
        .with_context(|| format!("reaching provider {id} with this cluster's identity"))?;
    let twin_claims: Api<PersistentVolumeClaim> = Api::namespaced(remote, &journal.twin);
    run(local, ns, claim, &journal, &twin_claims).await?;
    Ok(true)
}

/// The hand-over from its journal, each step idempotent: the filled claim unmarked (a claim
/// of ours standing for no home claim would be swept as an orphan while the name is free),
/// the source claim deleted (its volume here goes with it: the source data is removed only
/// now), made again with its selected node the virtual node, the filled claim marked with its
/// new UID, the journal removed; then the claim waited for until the virtual kubelet binds it
/// (it provisions it there, finding its claim filled, and pins a placeholder volume to the
/// node).
async fn run(
    local: &kube::Client,
    ns: &str,
    claim: &str,
    journal: &HandOver,
    twin_claims: &Api<PersistentVolumeClaim>,
) -> Result<()> {
    let (id, twin) = (&journal.provider, &journal.twin);
    let kept = format!(
        "the data is in claim {claim} of twin {twin} on {id} (uid {}); run `fabricctl move \
         volume {ns}/{claim} --to {id}` again to finish",
        journal.filled_uid
    );
    let home: Api<PersistentVolumeClaim> = Api::namespaced(local.clone(), ns);
    async {
        let filled = twin_claims.get_opt(claim).await?;
        if filled.as_ref().and_then(|c| c.uid()).as_deref() != Some(&journal.filled_uid) {
            bail!("claim {claim} in twin {twin} on {id} is not the one filled");
        }
        let unmark = Patch::Merge(copy::ownership(None));
        let now = home.get_opt(claim).await?;
        if !matches!(step(&home_of(now.as_ref(), journal)), Step::Mark(_)) {
            twin_claims
                .patch(claim, &PatchParams::default(), &unmark)
                .await?;
        }
        loop {
            let now = home.get_opt(claim).await?;
            match step(&home_of(now.as_ref(), journal)) {
                Step::DeleteSource => {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(journal.home_uid.clone()),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match home.delete(claim, &dp).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => return Err(e.into()),
                    }
                    wait_gone(&home, ns, claim).await?;
                }
                Step::Remake => {
                    home.create(&PostParams::default(), &journal.remade).await?;
                }
                Step::Mark(uid) => {
                    let mark = copy::ownership(Some((&journal.me, id, &uid)));
                    twin_claims
                        .patch(claim, &PatchParams::default(), &Patch::Merge(&mark))
                        .await?;
                    break;
                }
            }
        }
        remove_journal(local, ns, claim).await
    }
    .await
    .with_context(|| format!("handing the data over to claim {ns}/{claim}: {kept}"))?;
    let node = journal
        .remade
        .annotations()
        .get(names::storage::SELECTED_NODE)
        .cloned()
        .unwrap_or_default();
    println!("the data here removed; claim {ns}/{claim} made again for {node}");
    let v = wait_bound(&home, ns, claim, || {
        format!(
            "not bound by the virtual kubelet of {node} after 120s: the data is in claim \
             {claim} of twin {twin} on {id}"
        )
    })
    .await?;
    println!("claim {ns}/{claim} bound to {v}, pinned to {node}");
    Ok(())
}

/// Removes the journal of claim `ns/claim` (gone already is fine).
pub(super) async fn remove_journal(local: &kube::Client, ns: &str, claim: &str) -> Result<()> {
    let journals: Api<ConfigMap> = Api::namespaced(local.clone(), ns);
    match journals
        .delete(&journal_name(claim), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Waits until claim `ns/claim` made again is bound (for 120 s): its volume, or `late`'s
/// word on where the data is.
pub(super) async fn wait_bound(
    home: &Api<PersistentVolumeClaim>,
    ns: &str,
    claim: &str,
    late: impl Fn() -> String,
) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let bound = home
            .get_opt(claim)
            .await?
            .and_then(|c| c.spec?.volume_name)
            .filter(|v| !v.is_empty());
        if let Some(v) = bound {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("claim {ns}/{claim} {}", late());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn wait_gone(home: &Api<PersistentVolumeClaim>, ns: &str, claim: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while home.get_opt(claim).await?.is_some() {
        if Instant::now() > deadline {
            bail!("claim {ns}/{claim} not gone after 120s");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal() -> HandOver {
        HandOver {
            provider: "prov".into(),
            twin: "shop-cons".into(),
            filled_uid: "filled".into(),
            me: "cons".into(),
            home_uid: "old".into(),
            remade: serde_json::from_value(serde_json::json!({
                "metadata": {"name": "data", "namespace": "shop",
                             "annotations": {names::storage::SELECTED_NODE: "fabric-prov"}},
                "spec": {"storageClassName": "fabric", "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}},
            }))
            .unwrap(),
        }
    }

    fn claim(uid: &str) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "data", "uid": uid}}))
            .unwrap()
    }

    #[test]
    fn the_hand_over_goes_on_from_wherever_it_stopped() {
        let j = journal();
        assert_eq!(home_of(Some(&claim("old")), &j), Home::Source);
        assert_eq!(home_of(None, &j), Home::Absent);
        assert_eq!(home_of(Some(&claim("new")), &j), Home::Remade("new".into()));
        assert_eq!(step(&Home::Source), Step::DeleteSource);
        assert_eq!(step(&Home::Absent), Step::Remake);
        assert_eq!(step(&Home::Remade("new".into())), Step::Mark("new".into()));
    }

    #[test]
    fn the_journal_reads_back_what_was_written() {
        let j = journal();
        let cm = j.to_config_map("data").unwrap();
        assert_eq!(cm.name_any(), "fabric-move-data");
        assert_eq!(HandOver::of(&cm).unwrap(), j);
        let long = "d".repeat(80);
        assert!(journal_name(&long).len() <= 63);
        let mut bad = cm.clone();
        bad.data = Some(BTreeMap::from([(KEY.to_owned(), "{".to_owned())]));
        assert!(HandOver::of(&bad).is_err());
    }
}
