//! Charges on a consumer's Tenant, batched per webhook replica (the I/O edge of
//! [`quota::charge_batch`]). Admissions for one consumer racing each to write the Tenant
//! conflict with one another, each conflict a fresh read and another try: a burst of a
//! thousand serialises on that one object and most of its writes are refused. Here concurrent
//! admissions queue; whoever holds the consumer's turn charges everything queued with one read
//! and one write of the Tenant, its resourceVersion as precondition (a conflict, with another
//! replica or the usage reconciler, means reading and charging the batch again), so the
//! exact-quota guarantee is the one a single charge had.
//!
//! Creations of the other kinds bounded in number ([`Charger::charge_object`]) are charged on
//! the same Tenant in the consumer's turn, one at a time: each reads the Tenant, then lists
//! the objects, and writes its charge over the version read, so that replicas racing for the
//! last place are ordered by the API server.
use std::{
    collections::{BTreeSet, HashMap},
    convert::Infallible,
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use fabric_api::{
    authentication::v1alpha1::{Tenant, TenantStatus},
    names,
};
use fabric_kube::meta::is_conflict;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, api::PostParams};
use tokio::sync::oneshot;
use tracing::debug;

use super::USAGE_MANAGER;
use crate::shadowpod::{
    admission::Denial,
    quota::{self, Ask, ObjectAsk},
};

type Reply = oneshot::Sender<Result<(), Denial>>;

#[derive(Default)]
struct Queue {
    waiting: Vec<(Ask, Reply)>,
    /// Held by the admission whose turn it is to write this consumer's charges.
    turn: Arc<tokio::sync::Mutex<()>>,
}

pub struct Charger {
    client: Client,
    /// How long charges keep trying after conflicts before they are refused (to be retried).
    budget: Duration,
    queues: Mutex<HashMap<String, Queue>>,
}

impl Charger {
    pub fn new(client: Client, budget: Duration) -> Self {
        Self {
            client,
            budget,
            queues: Mutex::default(),
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<String, Queue>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charges `ask` on `consumer`'s Tenant, with whatever else is queued for it.
    pub async fn charge(&self, consumer: &str, ask: Ask) -> Result<(), Denial> {
        let (tx, rx) = oneshot::channel();
        let turn = {
            let mut queues = self.queues();
            let q = queues.entry(consumer.to_owned()).or_default();
            q.waiting.push((ask, tx));
            q.turn.clone()
        };
        {
            let _turn = turn.lock().await;
            // Empty when the one before took ours along.
            let batch = self
                .queues()
                .get_mut(consumer)
                .map(|q| std::mem::take(&mut q.waiting))
                .unwrap_or_default();
            if !batch.is_empty() {
                let (asks, replies): (Vec<Ask>, Vec<Reply>) = batch.into_iter().unzip();
                debug!(consumer, charges = asks.len(), "charging a batch");
                let verdicts = self.write(consumer, &asks).await;
                for (reply, verdict) in replies.into_iter().zip(verdicts) {
                    let _ = reply.send(verdict);
                }
            }
        }
        rx.await.unwrap_or_else(|_| {
            // The admission charging it was dropped mid-way (its caller went away).
            Err(Denial::Unaccounted {
                cluster: consumer.to_owned(),
                error: "the batch it was charged in was abandoned".to_owned(),
            })
        })
    }

    /// Charges the creation `ask` of an object that is not a ShadowPod on `consumer`'s Tenant
    /// ([`quota::charge_object`]) against `list()`, the names of the objects of its kind in its
    /// namespace, listed afresh after each read of the Tenant. A dry run is decided the same
    /// way and writes nothing. Charges lapse after `ttl`.
    pub async fn charge_object<L, F>(
        &self,
        consumer: &str,
        ask: &ObjectAsk<'_>,
        ttl: Duration,
        dry_run: bool,
        list: L,
    ) -> Result<(), Denial>
    where
        L: Fn() -> F,
        F: Future<Output = Result<BTreeSet<String>, kube::Error>>,
    {
        let turn = self
            .queues()
            .entry(consumer.to_owned())
            .or_default()
            .turn
            .clone();
        // This replica's admissions for the consumer one after the other: only another
        // replica's (or the reconciler's) writes can conflict with this one.
        let _turn = turn.lock().await;
        let list = &list;
        rewrite_status(&self.client, consumer, self.budget, |status| async move {
            // Listed after the read: see [`quota::charge_object`].
            let listed = list().await.map_err(Unwritten::Kube)?;
            let status = quota::charge_object(&status, ask, &listed, Timestamp::now(), ttl)
                .map_err(Unwritten::Denied)?;
            Ok(Rewrite::unless_dry_run(dry_run, status))
        })
        .await
        .map_err(|e| e.denial(consumer))
    }

    /// Reads the Tenant, charges `asks` on it and writes it back over the version read; a
    /// verdict per ask.
    async fn write(&self, consumer: &str, asks: &[Ask]) -> Vec<Result<(), Denial>> {
        rewrite_status::<_, Infallible, _>(
            &self.client,
            consumer,
            self.budget,
            |status| async move {
                let (status, verdicts) =
                    quota::charge_batch(&status, consumer, asks, Timestamp::now());
                Ok(if verdicts.iter().all(Result::is_err) {
                    Rewrite::Answer(verdicts)
                } else {
                    Rewrite::Write(status, verdicts)
                })
            },
        )
        .await
        .unwrap_or_else(|e| {
            let error = match e {
                Unwritten::NoTenant => None,
                Unwritten::Kube(e) => Some(e.to_string()),
                Unwritten::Denied(never) => match never {},
            };
            let cluster = consumer.to_owned();
            let denial = || match &error {
                None => Denial::NoTenant {
                    cluster: cluster.clone(),
                },
                Some(error) => Denial::Unaccounted {
                    cluster: cluster.clone(),
                    error: error.clone(),
                },
            };
            asks.iter().map(|_| Err(denial())).collect()
        })
    }
}

/// What a charge decided over the Tenant status it read.
pub(super) enum Rewrite<T> {
    /// Write this status over the version read, then answer `T`.
    Write(TenantStatus, T),
    /// Answer `T` and write nothing: a dry run, or every ask refused.
    Answer(T),
}

impl Rewrite<()> {
    /// `status` written, unless the review is a dry run (which must change nothing).
    pub(super) fn unless_dry_run(dry_run: bool, status: TenantStatus) -> Self {
        if dry_run {
            Self::Answer(())
        } else {
            Self::Write(status, ())
        }
    }
}

/// Why a charge was not written.
pub(super) enum Unwritten<D> {
    NoTenant,
    Kube(kube::Error),
    /// The charge's own refusal.
    Denied(D),
}

impl Unwritten<Denial> {
    pub(super) fn denial(self, consumer: &str) -> Denial {
        match self {
            Self::NoTenant => Denial::NoTenant {
                cluster: consumer.to_owned(),
            },
            Self::Kube(e) => Denial::Unaccounted {
                cluster: consumer.to_owned(),
                error: e.to_string(),
            },
            Self::Denied(d) => d,
        }
    }
}

/// Reads `consumer`'s Tenant, lets `decide` charge its status, and writes the result over the
/// version read: that precondition orders racing webhook replicas and the usage reconciler. A
/// conflict means reading and deciding again, until `budget` is spent.
pub(super) async fn rewrite_status<T, D, F>(
    client: &Client,
    consumer: &str,
    budget: Duration,
    mut decide: impl FnMut(TenantStatus) -> F,
) -> Result<T, Unwritten<D>>
where
    F: Future<Output = Result<Rewrite<T>, Unwritten<D>>>,
{
    let tenants: Api<Tenant> = Api::namespaced(client.clone(), &names::namespace::tenant(consumer));
    let give_up = Instant::now() + budget;
    let mut attempt = 0u32;
    loop {
        let mut tenant = tenants
            .get_opt(consumer)
            .await
            .map_err(Unwritten::Kube)?
            .ok_or(Unwritten::NoTenant)?;
        let (status, answer) = match decide(tenant.status.clone().unwrap_or_default()).await? {
            Rewrite::Answer(answer) => return Ok(answer),
            Rewrite::Write(status, answer) => (status, answer),
        };
        tenant.status = Some(status);
        tenant.metadata.managed_fields = None;
        let pp = PostParams {
            field_manager: Some(USAGE_MANAGER.to_owned()),
            ..Default::default()
        };
        match tenants.replace_status(consumer, &pp, &tenant).await {
            Ok(_) => return Ok(answer),
            Err(e) if is_conflict(&e) && Instant::now() < give_up => {
                attempt += 1;
                debug!(
                    consumer,
                    attempt, "the Tenant changed under a charge; charging again"
                );
                // Spread the retries of replicas whose charges keep colliding.
                let spread = u64::from(std::process::id() % 7 + attempt.min(10) * 3);
                tokio::time::sleep(Duration::from_millis(spread)).await;
            }
            Err(e) => return Err(Unwritten::Kube(e)),
        }
    }
}
