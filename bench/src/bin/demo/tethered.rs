//! The demo's tethered section: the provider hands its resources to its one consumer, and
//! takes them back.
use super::*;

/// Tethered mode: B, which offers resources to A alone, hands A control of them: both sides
/// say so, and a new workload pod of B's own is refused naming the mode; back to autonomous,
/// B's pods are welcome again.
pub(crate) fn tethered(d: &Demo, a_id: &str, b_id: &str) -> Result<()> {
    let (a, b) = (&d.cl.a, &d.cl.b);
    title(&format!(
        "On cluster B: fabricctl mode tethered --peer {a_id} (B offers resources to A alone)"
    ));
    show(fabricctl(&b.api, &["mode", "tethered", "--peer", a_id]));
    let said_on_a = |reason: &str| {
        get_json(&a.api, &["get", "foreigncluster", b_id])
            .and_then(|fc| {
                fc["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "Tethered")
                    .map(|c| c["reason"] == reason)
            })
            .unwrap_or(false)
    };
    wait(
        "A's ForeignCluster saying Tethered",
        Duration::from_secs(30),
        || said_on_a("Tethered").then_some(()),
    )?;
    println!("  A's ForeignCluster for B says Tethered. A workload pod of B's own (kubectl create");
    println!("  --dry-run=server on cluster B) is refused:");
    let local = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "b-local", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}})
    .to_string();
    let try_local = || {
        let o = b.api.kubectl_stdin(
            &["create", "--dry-run=server", "-o", "name", "-f", "-"],
            &local,
        );
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).trim().to_owned(),
        )
    };
    let refusal = wait("B's own pod refused", Duration::from_secs(30), || {
        let (ok, err) = try_local();
        (!ok).then_some(err)
    })?;
    indent(&refusal);
    title("On cluster B: fabricctl mode autonomous");
    show(fabricctl(&b.api, &["mode", "autonomous"]));
    wait(
        "B's own pods welcome again",
        Duration::from_secs(30),
        || try_local().0.then_some(()),
    )?;
    wait(
        "A's ForeignCluster saying Autonomous",
        Duration::from_secs(30),
        || said_on_a("Autonomous").then_some(()),
    )?;
    println!("  B's own pods are welcome again, and A's ForeignCluster says Autonomous.");
    Ok(())
}
