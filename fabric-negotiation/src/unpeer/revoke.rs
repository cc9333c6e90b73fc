//! The provider's admin revokes a consumer by deleting its ForeignCluster here (`kubectl
//! delete foreigncluster C`), as it would by deleting its Tenant: the consumer's ForeignCluster
//! holds finalizer [`names::finalizer::CONSUMER`] while the consumer has a Tenant here; once
//! the ForeignCluster is being deleted, the Tenant is deleted (its removal, [`super::provider`],
//! takes the consumer's access and the tenant area) and the ForeignCluster goes when the
//! Tenant has. [`step`] decides, free of I/O. The revocation also rotates the standing peering
//! token (the revoked consumer saw the command that carries it) and removes the one-time
//! tokens bound to the consumer ([`fabric_auth::token::revoked_with`]), and says so (a log
//! line and an Event on the ForeignCluster).
use std::{sync::Arc, time::Duration};

use fabric_api::{authentication::v1alpha1::Tenant, core::v1alpha1::ForeignCluster, names};
use fabric_kube::{
    controller::Runner,
    events::Event,
    meta::{add_finalizer, delete_gone_ok, remove_finalizer},
};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, ResourceExt,
    api::ListParams,
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use tracing::info;

use crate::kit::{Error, Shared};

const FINALIZER: &str = names::finalizer::CONSUMER;
const WAIT: Duration = Duration::from_millis(500);

/// What to do about one ForeignCluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// A consumer with a Tenant here: its ForeignCluster waits for the Tenant when deleted.
    AddFinalizer,
    /// No longer a consumer here, or its Tenant is gone: nothing to wait for.
    RemoveFinalizer,
    /// Deleted by the admin: the consumer goes with it.
    DeleteTenant,
    /// The Tenant is being removed.
    Wait,
}

/// The step for a ForeignCluster (`deleting`, whether its peer `consumes` here, whether it
/// holds `ours`), given its consumer's Tenant (None: there is none; Some(deleting)).
pub fn step(deleting: bool, consumes: bool, ours: bool, tenant: Option<bool>) -> Step {
    match (deleting, ours, tenant) {
        (false, false, Some(_)) if consumes => Step::AddFinalizer,
        (false, true, _) if !consumes => Step::RemoveFinalizer,
        (false, _, _) | (true, false, _) => Step::Nothing,
        (true, true, None) => Step::RemoveFinalizer,
        (true, true, Some(false)) => Step::DeleteTenant,
        (true, true, Some(true)) => Step::Wait,
    }
}

async fn reconcile(fc: Arc<ForeignCluster>, ctx: Shared) -> Result<Action, Error> {
    let fcs: Api<ForeignCluster> = Api::all(ctx.client.clone());
    // Decided from a fresh read: the Tenant's removal changes the role underneath.
    let Some(fc) = fcs.get_opt(&fc.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let consumer = fc.name_any();
    let ns = names::namespace::tenant(&consumer);
    let tenants: Api<Tenant> = Api::namespaced(ctx.client.clone(), &ns);
    let tenant = tenants
        .get_opt(&consumer)
        .await?
        .map(|t| t.metadata.deletion_timestamp.is_some());
    let ours = fc.finalizers().iter().any(|f| f == FINALIZER);
    let deleting = fc.metadata.deletion_timestamp.is_some();
    match step(deleting, fc.spec.role.consumes(), ours, tenant) {
        Step::Nothing => {}
        Step::AddFinalizer => add_finalizer(&fcs, &fc, FINALIZER).await?,
        Step::RemoveFinalizer => remove_finalizer(&fcs, &fc, FINALIZER).await?,
        Step::DeleteTenant => {
            // Before the Tenant: a failure here is retried while the Tenant still says so.
            let revoked = revoke_tokens(&ctx, &consumer).await?;
            info!(
                consumer,
                tokens = ?revoked,
                "ForeignCluster deleted: peering tokens revoked (the standing one is rotated: \
                 `fabricctl generate peer-command` prints a new one); removing the consumer's tenant"
            );
            let note = format!(
                "consumer {consumer} revoked: peering tokens {revoked:?} deleted, so every peer \
                 command printed before is refused (`fabricctl generate peer-command` prints a \
                 new one)"
            );
            ctx.events
                .publish(&fc, &Event::normal("TokensRotated", "Revoke", note))
                .await;
            delete_gone_ok(&tenants, &consumer).await?;
            return Ok(Action::requeue(WAIT));
        }
        Step::Wait => return Ok(Action::requeue(WAIT)),
    }
    Ok(Action::await_change())
}

/// Deletes the peering tokens a revocation of `consumer` removes: what was deleted.
async fn revoke_tokens(ctx: &Shared, consumer: &str) -> Result<Vec<String>, Error> {
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), names::namespace::PEERING_TOKENS);
    let tokens = secrets
        .list(&ListParams::default().labels(&fabric_auth::token::selector()))
        .await?;
    let revoked = fabric_auth::token::revoked_with(&tokens.items, consumer);
    for name in &revoked {
        delete_gone_ok(&secrets, name).await?;
    }
    Ok(revoked)
}

/// Runs until the watch ends.
pub async fn run(ctx: Shared) {
    let fcs: Api<ForeignCluster> = Api::all(ctx.client.clone());
    let tenants: Api<Tenant> = Api::all(ctx.client.clone());
    // A consumer's Tenant is named after it, as its ForeignCluster is.
    let controller = Controller::new(fcs, watcher::Config::default()).watches(
        tenants,
        watcher::Config::default(),
        |t| Some(ObjectRef::new(&t.spec.cluster_id)),
    );
    Runner::new("consumer revocation (provider)", ctx.backoff())
        .run(controller, reconcile, ctx)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_with_a_tenant_is_held_until_its_tenant_is_gone() {
        // Peered: the finalizer goes on once there is a Tenant.
        assert_eq!(step(false, true, false, None), Step::Nothing);
        assert_eq!(step(false, true, false, Some(false)), Step::AddFinalizer);
        assert_eq!(step(false, true, true, Some(false)), Step::Nothing);
        // Deleted by the admin: the Tenant goes first, then the ForeignCluster.
        assert_eq!(step(true, true, true, Some(false)), Step::DeleteTenant);
        assert_eq!(step(true, true, true, Some(true)), Step::Wait);
        assert_eq!(step(true, true, true, None), Step::RemoveFinalizer);
        // The consumer left (its Tenant removed, the role taken off): nothing to hold.
        assert_eq!(step(false, false, true, None), Step::RemoveFinalizer);
        assert_eq!(step(false, false, true, Some(true)), Step::RemoveFinalizer);
        // Not ours, or not a consumer: left alone.
        assert_eq!(step(true, true, false, Some(false)), Step::Nothing);
        assert_eq!(step(false, false, false, Some(false)), Step::Nothing);
    }
}
