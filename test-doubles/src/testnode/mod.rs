//! The test node (`fabric-test-node`): the test clusters' stand-in for a kubelet. One process
//! per node, run inside the node's network namespace. It registers the Node (addresses,
//! kubelet port, capacity, Ready) and renews its Lease in `kube-node-lease`, watches the pods
//! bound to it, and gives each a network namespace (`fabt-<pid>-pod-<uid>`, so the test bed's
//! reaper removes it when the node dies unclean), a veth into the node's namespace and an
//! address from the node's pod CIDR, then runs each container's `command` + `args` as a
//! process in it (the image is ignored). It reports status through `pods/status` and honours
//! the restart policy and graceful deletion, and it serves the kubelet API's `containerLogs`
//! over HTTPS so that `kubectl logs [-f]` works through the API server, and `exec` and
//! `portForward` over SPDY ([`stream`], on `fabric-kubelet`) for `kubectl exec` and
//! `kubectl port-forward`. With `--service-proxy` it is also the node's kube-proxy: Service
//! cluster IPs DNATed to ready endpoints in the node's namespace ([`proxy`]).
//!
//! A `persistentVolumeClaim` volume is its bound PV's host directory, bind-mounted read-write
//! ([`claims`]); the pod waits in `ContainerCreating` while the claim is unbound.
//!
//! Pure parts: [`status`] (restart decisions, phase, `PodStatus`), [`logs`] (the CRI log
//! format and the logs query), [`pick_address`], [`claims::resolve`]. I/O: [`node`] (registration, Lease),
//! [`pods`] (the per-pod workers: processes, status), [`podnet`] (their network), [`server`] (kubelet API), [`proxy`] (its
//! pure part: [`proxy::programme`], the nft script).
pub mod claims;
pub mod config;
pub mod files;
pub mod logs;
pub mod node;
pub mod podnet;
pub mod pods;
pub mod proxy;
pub mod server;
pub mod status;
pub mod stream;
pub mod tty;

use std::{collections::BTreeSet, net::Ipv4Addr};

use ipnetwork::Ipv4Network;

/// Annotation that makes a pod hollow: Running with an address, but no network namespace and
/// no process (for benchmarks with many pods). `--hollow` does it for every pod.
pub const HOLLOW_ANNOTATION: &str = "testing.fabric.io/hollow";

/// Annotation of mirror pods (the API's copy of a static pod a node runs by itself): the
/// kubelet does not run them from the API, and neither does the test node. The fixtures' fixed
/// pods that they wire up themselves carry it.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The first free address of `cidr` for a pod: never the network or broadcast address, the
/// node's gateway address, or one `taken`.
pub fn pick_address(
    cidr: Ipv4Network,
    gateway: Ipv4Addr,
    taken: &BTreeSet<Ipv4Addr>,
) -> Option<Ipv4Addr> {
    let (net, bcast) = (cidr.network(), cidr.broadcast());
    // Walks the addresses and the taken ones side by side (both in order): a hollow node with
    // ten thousand pods picks each in one pass, not a lookup per address.
    let mut taken = taken.range(net..).peekable();
    cidr.iter().find(|a| {
        while taken.next_if(|t| *t < a).is_some() {}
        *a != net && *a != bcast && *a != gateway && taken.peek() != Some(&a)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_skip_the_reserved_ones() {
        let cidr: Ipv4Network = "10.244.1.0/24".parse().unwrap();
        let gw = Ipv4Addr::new(10, 244, 1, 1);
        let mut taken = BTreeSet::new();
        assert_eq!(
            pick_address(cidr, gw, &taken),
            Some(Ipv4Addr::new(10, 244, 1, 2))
        );
        taken.insert(Ipv4Addr::new(10, 244, 1, 2));
        taken.insert(Ipv4Addr::new(10, 244, 1, 3));
        assert_eq!(
            pick_address(cidr, gw, &taken),
            Some(Ipv4Addr::new(10, 244, 1, 4))
        );
        // A gap left by a pod gone is taken again first.
        taken.insert(Ipv4Addr::new(10, 244, 1, 5));
        taken.remove(&Ipv4Addr::new(10, 244, 1, 3));
        assert_eq!(
            pick_address(cidr, gw, &taken),
            Some(Ipv4Addr::new(10, 244, 1, 3))
        );
        taken.insert(Ipv4Addr::new(10, 244, 1, 3));
        taken.insert(Ipv4Addr::new(10, 244, 1, 4));
        assert_eq!(
            pick_address(cidr, gw, &taken),
            Some(Ipv4Addr::new(10, 244, 1, 6))
        );
        let tiny: Ipv4Network = "10.0.0.0/30".parse().unwrap();
        assert_eq!(
            pick_address(tiny, Ipv4Addr::new(10, 0, 0, 1), &taken),
            Some(Ipv4Addr::new(10, 0, 0, 2))
        );
        taken.insert(Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(pick_address(tiny, Ipv4Addr::new(10, 0, 0, 1), &taken), None);
    }
}
