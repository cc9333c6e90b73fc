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
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use fabric_api::{authentication::v1alpha1::Tenant, names};
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
        let unaccounted = |e: kube::Error| Denial::Unaccounted {
            cluster: consumer.to_owned(),
            error: e.to_string(),
        };
        let turn = self
            .queues()
            .entry(consumer.to_owned())
            .or_default()
            .turn
            .clone();
        // This replica's admissions for the consumer one after the other: only another
        // replica's (or the reconciler's) writes can conflict with this one.
        let _turn = turn.lock().await;
        let tenants: Api<Tenant> =
            Api::namespaced(self.client.clone(), &names::namespace::tenant(consumer));
        let give_up = Instant::now() + self.budget;
        let mut attempt = 0u32;
        loop {
            let Some(mut tenant) = tenants.get_opt(consumer).await.map_err(unaccounted)? else {
                return Err(Denial::NoTenant {
                    cluster: consumer.to_owned(),
                });
            };
            // Listed after the read: see [`quota::charge_object`].
            let listed = list().await.map_err(unaccounted)?;
            let status = quota::charge_object(
                &tenant.status.clone().unwrap_or_default(),
                ask,
                &listed,
                Timestamp::now(),
                ttl,
            )?;
            if dry_run {
                return Ok(());
            }
            tenant.status = Some(status);
            tenant.metadata.managed_fields = None;
            let pp = PostParams {
                field_manager: Some(USAGE_MANAGER.to_owned()),
                ..Default::default()
            };
            match tenants.replace_status(consumer, &pp, &tenant).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 && Instant::now() < give_up => {
                    attempt += 1;
                    debug!(
                        consumer,
                        attempt,
                        kind = ask.kind,
                        "object charge conflicted; charging it again"
                    );
                    let spread = u64::from(std::process::id() % 7 + attempt.min(10) * 3);
                    tokio::time::sleep(Duration::from_millis(spread)).await;
                }
                Err(e) => return Err(unaccounted(e)),
            }
        }
    }

    /// Reads the Tenant, charges `asks` on it and writes it back over the version read; a
    /// verdict per ask.
    async fn write(&self, consumer: &str, asks: &[Ask]) -> Vec<Result<(), Denial>> {
        let tenants: Api<Tenant> =
            Api::namespaced(self.client.clone(), &names::namespace::tenant(consumer));
        let every = |d: &dyn Fn() -> Denial| asks.iter().map(|_| Err(d())).collect::<Vec<_>>();
        let unaccounted = |e: &kube::Error| {
            every(&|| Denial::Unaccounted {
                cluster: consumer.to_owned(),
                error: e.to_string(),
            })
        };
        let give_up = Instant::now() + self.budget;
        let mut attempt = 0u32;
        loop {
            let mut tenant = match tenants.get_opt(consumer).await {
                Ok(Some(t)) => t,
                Ok(None) => {
                    return every(&|| Denial::NoTenant {
                        cluster: consumer.to_owned(),
                    });
                }
                Err(e) => return unaccounted(&e),
            };
            let (status, verdicts) = quota::charge_batch(
                &tenant.status.clone().unwrap_or_default(),
                consumer,
                asks,
                Timestamp::now(),
            );
            if verdicts.iter().all(Result::is_err) {
                return verdicts;
            }
            tenant.status = Some(status);
            tenant.metadata.managed_fields = None;
            let pp = PostParams {
                field_manager: Some(USAGE_MANAGER.to_owned()),
                ..Default::default()
            };
            match tenants.replace_status(consumer, &pp, &tenant).await {
                Ok(_) => return verdicts,
                Err(kube::Error::Api(e)) if e.code == 409 && Instant::now() < give_up => {
                    attempt += 1;
                    debug!(consumer, attempt, "charges conflicted; charging them again");
                    // Spread the retries of replicas whose batches keep colliding.
                    let spread = u64::from(std::process::id() % 7 + attempt.min(10) * 3);
                    tokio::time::sleep(Duration::from_millis(spread)).await;
                }
                Err(e) => return unaccounted(&e),
            }
        }
    }
}
