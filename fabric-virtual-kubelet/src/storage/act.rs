//! The claims kind on the reflection framework: [`Claims::decide`]'s step carried out, the
//! remote claim server-side applied in the twin, the placeholder volume created and deleted
//! at home (only ours: our provisioner, bound to that very claim), the claim's finalizer and
//! `volumeName` written.
use anyhow::{Context as _, Result, bail};
use fabric_api::names::{
    self,
    storage::{FINALIZER, RESCHEDULING_REQUIRED, SELECTED_NODE},
};
use fabric_kube::{
    events::Event,
    meta::{self, GoneOk},
};
use fabric_reflector::{Cx, Key, Kind, Next, Pair, View};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tracing::info;

use super::{Claims, Step, made_for, orphaned, volume_name};

impl Kind for Claims {
    type Home = PersistentVolumeClaim;
    type Remote = PersistentVolumeClaim;
    type Step = Step;
    type Error = anyhow::Error;
    const NAME: &'static str = "persistentvolumeclaims";

    fn remote_name(&self, key: &Key) -> String {
        key.name.clone()
    }

    fn key_of(&self, pair: &Pair, remote: &PersistentVolumeClaim) -> Option<Key> {
        Some(Key::new(pair.home.clone()?, remote.name_any()))
    }

    fn orphaned(
        &self,
        remote: &PersistentVolumeClaim,
        home: Option<&PersistentVolumeClaim>,
    ) -> bool {
        orphaned(remote, home)
    }

    fn decide(&self, view: &View<'_, Self>) -> Step {
        self.decide(view.home, view.remote, view.reachable, view.marks)
    }

    async fn act(&self, cx: &Cx<'_, Self>, step: Step) -> Result<Next> {
        let home = cx.view.home.as_ref();
        let claims = cx.home_api();
        let volumes: Api<PersistentVolume> = Api::all(claims.clone().into_client());
        let key = &cx.view.key;
        match step {
            Step::Nothing => {}
            Step::Reschedule => {
                let patch = json!({"metadata": {"annotations": {SELECTED_NODE: null}}});
                claims
                    .patch(
                        &home.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .gone_ok()
                    .context("dropping the claim's selected node")?;
                cx.event(&Event::warning(
                    RESCHEDULING_REQUIRED,
                    "Provision",
                    format!(
                        "the provider behind virtual node {} lends no storage: its consumer is \
                         to be scheduled elsewhere",
                        self.node_name
                    ),
                ))
                .await;
                info!(claim = %key, "the provider lends no storage: sent back to the scheduler");
            }
            Step::Provision { remote, volume } => {
                meta::add_finalizer(&claims, home, FINALIZER)
                    .await
                    .context("adding the claim's finalizer")?;
                if let Some(mut remote) = remote {
                    let (Some(api), Some(ns)) = (cx.remote_api(), cx.remote_namespace()) else {
                        return Ok(Next::Done);
                    };
                    remote.metadata.namespace = Some(ns.to_owned());
                    let pp = PatchParams::apply(names::field_manager::REFLECTION).force();
                    if let Err(e) = api
                        .patch(&home.name_any(), &pp, &Patch::Apply(&*remote))
                        .await
                    {
                        if let kube::Error::Api(s) = &e
                            && (400..500).contains(&s.code)
                            && s.code != 409
                            && s.code != 429
                        {
                            cx.event(&Event::warning(
                                fabric_reflector::mirror::REFUSED,
                                "Provision",
                                format!("the provider refused the claim in {ns}: {}", s.message),
                            ))
                            .await;
                        }
                        return Err(e).context("making the claim in the twin namespace");
                    }
                    info!(claim = %key, twin = ns, "claim made on the provider");
                }
                ensure_volume(&volumes, home, &volume).await?;
                let patch = json!({"spec": {"volumeName": volume_name(home)}});
                let bound = claims
                    .patch(
                        &home.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .context("binding the claim to its placeholder")?;
                cx.wrote_home(bound);
            }
            Step::Release { delete_remote } => {
                if delete_remote
                    && let Some(r) = cx.view.remote.ours().filter(|r| made_for(r, home))
                {
                    cx.delete_remote(r, None)
                        .await
                        .context("deleting the claim in the twin namespace")?;
                    info!(claim = %key, "deleted its claim on the provider");
                }
                delete_volume(&volumes, home).await?;
                meta::remove_finalizer(&claims, home, FINALIZER)
                    .await
                    .context("removing the claim's finalizer")?;
            }
        }
        Ok(Next::Done)
    }
}

/// Creates the placeholder, unless it is there already (a sync cut short).
async fn ensure_volume(
    volumes: &Api<PersistentVolume>,
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
) -> Result<()> {
    let name = volume.name_any();
    match volumes.create(&PostParams::default(), volume).await {
        Ok(_) => {
            info!(volume = name, "placeholder volume made");
            Ok(())
        }
        Err(e) if meta::is_conflict(&e) => {
            let have = volumes
                .get(&name)
                .await
                .context("reading the placeholder")?;
            if !fabric_api::offloading::volumes::fabric_volume_of(&have, claim) {
                bail!("a PersistentVolume {name} is there that is not this claim's placeholder");
            }
            Ok(())
        }
        Err(e) => Err(e).context("making the placeholder volume"),
    }
}

/// Deletes the placeholder of `claim` if it is there and ours (UID-preconditioned).
async fn delete_volume(
    volumes: &Api<PersistentVolume>,
    claim: &PersistentVolumeClaim,
) -> Result<()> {
    let name = volume_name(claim);
    let Some(pv) = volumes
        .get_opt(&name)
        .await
        .context("reading the placeholder")?
    else {
        return Ok(());
    };
    if !fabric_api::offloading::volumes::fabric_volume_of(&pv, claim) {
        return Ok(());
    }
    meta::delete(
        volumes,
        &name,
        &meta::only_uid(pv.metadata.uid.clone(), None),
    )
    .await
    .context("deleting the placeholder volume")?;
    info!(volume = name, "placeholder volume deleted");
    Ok(())
}
