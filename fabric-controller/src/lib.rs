//! Cluster-level controllers of the fabric.
pub mod gateway;
pub mod ipam;
pub mod ips;
pub mod overlay;

/// Server-side applies `status` to the status subresource of object `name`, owning its fields
/// as `manager` (every controller here writes status this way).
pub(crate) async fn apply_status<K>(
    api: &kube::Api<K>,
    name: &str,
    manager: &str,
    status: impl serde::Serialize,
) -> kube::Result<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &kube::api::PatchParams::apply(manager).force(),
        &kube::api::Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}
