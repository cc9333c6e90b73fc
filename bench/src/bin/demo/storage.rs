//! The demo's storage sections: a stateful pod at home on the fabric's StorageClass, its
//! volume moved to the provider and back, a stateful pod offloaded whose data stays there, and the
//! volumes a provider keeps after an unoffload, forgotten on request.
use super::*;

/// `pod` with claim `claim` mounted at /srv.
pub(crate) fn mounting(mut pod: Value, claim: &str) -> Value {
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{ "name": "data", "mountPath": "/srv" }]);
    pod["spec"]["volumes"] =
        json!([{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }]);
    pod
}

/// `fabricctl move volume`'s output without its progress lines: the copy and its two digests.
fn without_progress(out: &str) -> String {
    out.lines()
        .filter(|l| !l.starts_with("sent ") || l.contains(" sha256 "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A claim of the fabric's StorageClass whose first consumer runs on a real node of A: the
/// storage provisioner makes a real claim of A's default class and binds the claim to a volume
/// over the real one; the file a pod writes there is read by the next pod.
pub(crate) fn stateful_at_home(d: &Demo) -> Result<()> {
    title(
        "A stateful pod at home: a claim of the fabric's StorageClass on a real node (cluster A)",
    );
    let a = &d.cl.a;
    let class = fabric_tests::manifests::Manifests::rendered(&a.api)?
        .into_iter()
        .find(|o| o["kind"] == "StorageClass" && o["metadata"]["name"] == names::storage::CLASS)
        .context("deploy/ has no StorageClass fabric")?;
    a.create(&class)?;
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "notes", "namespace": "default"},
        "spec": {"storageClassName": names::storage::CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "64Mi"}}}});
    a.create(&claim)?;
    let with_claim = |pod: Value| mounting(pod, "notes");
    let text = "written on cluster A's node, through the fabric's storage class";
    println!("  a claim `notes` of class fabric, and a pod on A's node writing /srv/note:");
    a.create_pod(&on_node(
        with_claim(command_pod(
            "writer",
            &["fabric-test-pod", "write", "/srv/note", text],
        )),
        0,
    ))?;
    a.wait_pod_succeeded("default", "writer", Duration::from_secs(60))?;
    println!("  kubectl get pvc notes; the volume it is bound to (over the real one):");
    show(kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "notes",
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,CLASS:.spec.storageClassName,VOLUME:.spec.volumeName",
        ],
    ));
    show(kubectl(
        &a.api,
        &[
            "get",
            "pv",
            "-o",
            "custom-columns=NAME:.metadata.name,CLASS:.spec.storageClassName,CLAIM:.spec.claimRef.name,PATH:.spec.hostPath.path",
        ],
    ));
    println!(
        "  kubectl get pvc -n {} (the real claim the provisioner made):",
        names::namespace::STORAGE
    );
    show(kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "-n",
            names::namespace::STORAGE,
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,CLASS:.spec.storageClassName,FOR:.metadata.labels.storage\\.fabric\\.io/home-name",
        ],
    ));
    kubectl(&a.api, &["delete", "pod", "writer", "--wait=true"])?;
    a.create_pod(&with_claim(command_pod(
        "reader",
        &["fabric-test-pod", "read", "/srv/note"],
    )))?;
    a.wait_pod_succeeded("default", "reader", Duration::from_secs(60))?;
    println!("  the next pod reads it (kubectl logs reader):");
    let read = kubectl(&a.api, &["logs", "reader"])?;
    indent(read.trim());
    if read.trim() != text {
        bail!("the reader read {read:?}, not what the writer wrote");
    }
    kubectl(&a.api, &["delete", "pod", "reader", "--wait=true"])?;
    kubectl(&a.api, &["delete", "pvc", "notes", "--wait=true"])?;
    println!("  kubectl delete pvc notes: its volume, real claim and real volume are gone too.");
    Ok(())
}

/// What shop's pods wrote at home before it was offloaded: a claim `orders` of the fabric's
/// class, written by a pod on A's node (a few bytes: the demo stays quick).
pub(crate) const ORDERS: &str = "order 1: 3 mugs; order 2: 1 teapot";

pub(crate) fn orders_at_home(d: &Demo) -> Result<()> {
    let a = &d.cl.a;
    a.create(&json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "orders", "namespace": shop::NAMESPACE},
        "spec": {"storageClassName": names::storage::CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "16Mi"}}}}))?;
    let mut pod = command_pod(
        "orders-writer",
        &["fabric-test-pod", "write", "/srv/orders", ORDERS],
    );
    pod["metadata"]["namespace"] = json!(shop::NAMESPACE);
    a.create_pod(&mounting(pod, "orders"))?;
    a.wait_pod_succeeded(shop::NAMESPACE, "orders-writer", Duration::from_secs(60))?;
    kubectl(
        &a.api,
        &[
            "delete",
            "pod",
            "orders-writer",
            "-n",
            shop::NAMESPACE,
            "--wait=true",
        ],
    )?;
    println!("  and a claim `orders` of class fabric its pods wrote at home: {ORDERS:?}");
    Ok(())
}

/// The claim `orders` written at home moved to B with `fabricctl move volume` (offline,
/// checksummed; shop being `Remote` does not keep the sender off A's node), then read by a
/// pod that lands on the virtual node, where the data now is.
pub(crate) fn orders_moved(d: &Demo, b_id: &str) -> Result<()> {
    title("A volume moved: fabricctl move volume shop/orders --to B (cluster A)");
    let a = &d.cl.a;
    let out = fabricctl(
        &a.api,
        &[
            "move",
            "volume",
            &format!("{}/orders", shop::NAMESPACE),
            "--to",
            b_id,
        ],
    )?;
    indent(&without_progress(&out));
    let digest = |verb: &str| {
        out.lines()
            .find(|l| l.starts_with(verb) && l.contains(" sha256 "))
            .and_then(|l| l.split(" sha256 ").nth(1))
            .map(str::to_owned)
    };
    match (digest("sent "), digest("received ")) {
        (Some(s), Some(r)) if s == r => {}
        (s, r) => bail!("the move's digests differ or are missing: sent {s:?}, received {r:?}"),
    }
    let mut pod = command_pod("orders-reader", &["fabric-test-pod", "read", "/srv/orders"]);
    pod["metadata"]["namespace"] = json!(shop::NAMESPACE);
    a.create_pod(&mounting(pod, "orders"))?;
    a.wait_pod_succeeded(shop::NAMESPACE, "orders-reader", Duration::from_secs(60))?;
    let node = kubectl(
        &a.api,
        &[
            "get",
            "pod",
            "orders-reader",
            "-n",
            shop::NAMESPACE,
            "-o",
            "jsonpath={.spec.nodeName}",
        ],
    )?;
    let read = kubectl(&a.api, &["logs", "orders-reader", "-n", shop::NAMESPACE])?;
    println!(
        "  a pod of the claim ran on {} and read (kubectl logs orders-reader -n shop):",
        node.trim()
    );
    indent(read.trim());
    if read.trim() != ORDERS {
        bail!("orders-reader read {read:?}, not what was written at home");
    }
    if !node.trim().ends_with(b_id) {
        bail!("orders-reader ran on {node:?}, not on B's virtual node");
    }
    kubectl(
        &a.api,
        &[
            "delete",
            "pod",
            "orders-reader",
            "-n",
            shop::NAMESPACE,
            "--wait=true",
        ],
    )?;
    orders_home(d, b_id)
}

/// The claim `orders` moved back from B (`--to local`): the sender listens on B, the receiver
/// fills a landing claim on A's node; the claim, made again under its name, is bound over a
/// volume on A's node holding the same bytes.
fn orders_home(d: &Demo, b_id: &str) -> Result<()> {
    title("And home again: fabricctl move volume shop/orders --to local (cluster A)");
    let a = &d.cl.a;
    let out = fabricctl(
        &a.api,
        &[
            "move",
            "volume",
            &format!("{}/orders", shop::NAMESPACE),
            "--to",
            "local",
        ],
    )?;
    indent(&without_progress(&out));
    let claim = kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "orders",
            "-n",
            shop::NAMESPACE,
            "-o",
            "jsonpath={.spec.volumeName}",
        ],
    )?;
    let pv: Value = serde_json::from_str(&kubectl(
        &a.api,
        &["get", "pv", claim.trim(), "-o", "json"],
    )?)?;
    let terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"].to_string();
    if terms.contains(&names::node::virtual_node(b_id)) {
        bail!("orders is still pinned to B's virtual node: {terms}");
    }
    let dir = pv["spec"]["hostPath"]["path"]
        .as_str()
        .context("the volume at home has no host path")?;
    let read = std::fs::read_to_string(std::path::Path::new(dir).join("orders"))
        .with_context(|| format!("reading orders in {dir}"))?;
    println!(
        "  the claim's volume {} is on A's node again, holding:",
        claim.trim()
    );
    indent(read.trim());
    if read.trim() != ORDERS {
        bail!("orders holds {read:?} at home, not what was moved");
    }
    Ok(())
}

/// A claim of the fabric's StorageClass in the offloaded namespace whose first consumer runs on
/// the virtual node: the claim is made in B's twin (B's class `standard`, lent to A), the volume
/// at home is a placeholder pinned to the virtual node, so the next pod using it goes there
/// too (data gravity) and reads what the first one wrote.
pub(crate) fn stateful_offloaded(d: &Demo, b_id: &str, twin: &str) -> Result<()> {
    title("A stateful pod offloaded: its claim lands in cluster B, the next pod follows the data");
    let (a, b) = (&d.cl.a, &d.cl.b);
    a.create(&json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ledger", "namespace": shop::NAMESPACE},
        "spec": {"storageClassName": names::storage::CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "64Mi"}}}}))?;
    let with_claim = |name: &str, command: &[&str]| {
        let mut pod = command_pod(name, command);
        pod["metadata"]["namespace"] = json!(shop::NAMESPACE);
        mounting(pod, "ledger")
    };
    let text = "written in cluster B, on a volume of B's, for a pod of A's";
    println!("  a claim `ledger` of class fabric in shop, and a pod writing /srv/ledger (shop's");
    println!("  strategy Remote sends it to the virtual node):");
    a.create_pod(&with_claim(
        "ledger-writer",
        &["fabric-test-pod", "write", "/srv/ledger", text],
    ))?;
    let done = |name: &str| a.wait_pod_succeeded(shop::NAMESPACE, name, Duration::from_secs(90));
    if let Err(e) = done("ledger-writer") {
        show(kubectl(
            &a.api,
            &["get", "pvc,pods", "-n", shop::NAMESPACE, "-o", "wide"],
        ));
        show(kubectl(&b.api, &["get", "pvc,pods,events", "-n", twin]));
        return Err(e);
    }
    println!("  kubectl get pvc ledger -n shop; its volume at home, pinned to the virtual node:");
    show(kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "ledger",
            "-n",
            shop::NAMESPACE,
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,CLASS:.spec.storageClassName,VOLUME:.spec.volumeName",
        ],
    ));
    let volume = kubectl(
        &a.api,
        &[
            "get",
            "pvc",
            "ledger",
            "-n",
            shop::NAMESPACE,
            "-o",
            "jsonpath={.spec.volumeName}",
        ],
    )?;
    show(kubectl(
        &a.api,
        &[
            "get",
            "pv",
            volume.trim(),
            "-o",
            "custom-columns=NAME:.metadata.name,CLASS:.spec.storageClassName,NODE:.spec.nodeAffinity.required.nodeSelectorTerms[*].matchExpressions[*].values[*]",
        ],
    ));
    println!(
        "  On cluster B, in the twin: the claim itself, of B's class standard (kubectl get pvc -n {twin}):"
    );
    show(kubectl(
        &b.api,
        &[
            "get",
            "pvc",
            "-n",
            twin,
            "-o",
            "custom-columns=NAME:.metadata.name,STATUS:.status.phase,CLASS:.spec.storageClassName,VOLUME:.spec.volumeName",
        ],
    ));
    kubectl(
        &a.api,
        &[
            "delete",
            "pod",
            "ledger-writer",
            "-n",
            shop::NAMESPACE,
            "--wait=true",
        ],
    )?;
    a.create_pod(&with_claim(
        "ledger-reader",
        &["fabric-test-pod", "read", "/srv/ledger"],
    ))?;
    done("ledger-reader")?;
    let node = kubectl(
        &a.api,
        &[
            "get",
            "pod",
            "ledger-reader",
            "-n",
            shop::NAMESPACE,
            "-o",
            "jsonpath={.spec.nodeName}",
        ],
    )?;
    println!(
        "  the next pod using it ran on {} and read (kubectl logs ledger-reader -n shop):",
        node.trim()
    );
    let read = kubectl(&a.api, &["logs", "ledger-reader", "-n", shop::NAMESPACE])?;
    indent(read.trim());
    if read.trim() != text {
        bail!("ledger-reader read {read:?}, not what ledger-writer wrote");
    }
    if !node.trim().ends_with(b_id) {
        bail!("ledger-reader ran on {node:?}, not on B's virtual node");
    }
    kubectl(
        &a.api,
        &[
            "delete",
            "pod",
            "ledger-reader",
            "-n",
            shop::NAMESPACE,
            "--wait=true",
        ],
    )?;
    Ok(())
}

/// After the unoffload the claim stays on B with its data (storageRetention Retain, the
/// default), out of A's reach but reported to it; an unpeer would be refused while it is kept;
/// `fabricctl forget volumes` deletes it.
pub(crate) fn retained_and_forgotten(d: &Demo, a_id: &str, b_id: &str, twin: &str) -> Result<()> {
    let (a, b) = (&d.cl.a, &d.cl.b);
    let tenant = names::namespace::tenant(a_id);
    wait(
        "the claim reported retained",
        Duration::from_secs(30),
        || {
            let out = kubectl(
                &b.api,
                &[
                    "get",
                    "namespacemap",
                    a_id,
                    "-n",
                    &tenant,
                    "-o",
                    "jsonpath={.status.retained[*].name}",
                ],
            )
            .ok()?;
            out.contains("ledger").then_some(())
        },
    )?;
    println!("  The claim stays on B with its data (storageRetention Retain, the default); A's");
    println!("  rights there are gone. fabricctl unpeer {b_id} (cluster A) now refuses:");
    match fabricctl(&a.api, &["unpeer", b_id, "--timeout-secs", "20"]) {
        Err(refused) => indent(&format!("{refused:#}")),
        Ok(out) => bail!("the unpeer went ahead with a claim retained: {out}"),
    }
    println!("  fabricctl forget volumes --peer {b_id}:");
    show(fabricctl(&a.api, &["forget", "volumes", "--peer", b_id]));
    wait("the twin gone", Duration::from_secs(30), || {
        kubectl(
            &b.api,
            &["get", "namespace", twin, "-o", "jsonpath={.status.phase}"],
        )
        .map_or(Some(()), |p| (p.trim() == "Terminating").then_some(()))
    })?;
    println!("  and B removed the twin {twin} once it held nothing.");
    Ok(())
}
