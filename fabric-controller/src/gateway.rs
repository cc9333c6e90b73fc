//! The gateway operator: runs beside `fabric-gateway` (a second container in the gateway pod)
//! and turns the API into the gateway's configuration, then the gateway's state back into the
//! API. It renders the gateway's configuration from the peers' Configurations (real and granted CIDRs,
//! peer id), PublicKeys and GatewayClients, writes the private key from its Secret to a 0600
//! file, asks the gateway to reload (over its control socket) when anything changed, and
//! reports each tunnel as a `Connection`. It also publishes this gateway's identity (public
//! key, endpoint) for `fabricctl peer`.
//!
//! Rendering ([`render`](mod@render)) and reporting ([`report`]) are free of I/O; the loop
//! ([`operator`]) works from watch caches ([`caches`]) and writes to the API only what
//! changed. The Lease election is `fabric-kube`'s.
//!
//! Replicas run active/passive: the operators compete for a Lease, and only the holder's
//! gateway runs tunnels. A replica whose gateway cannot serve gives the Lease up and does not
//! take it ([`health`]). The passive replica's gateway gets a configuration without peers, so
//! the peer never sees two gateways with the same key. The holder publishes its gateway's
//! cluster-network address on the Lease; node agents route to whatever that says.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use fabric_api::names::{self, field_manager};
pub use fabric_kube::Election;
use fabric_kube::FieldManager;
use k8s_openapi::api::{
    core::v1::ObjectReference,
    discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
};
use kube::api::ObjectMeta;

mod caches;
pub mod health;
mod key_file;
mod operator;
mod render;
pub mod report;

pub use operator::{COUNTER_REFRESH, RESYNC, run};
pub use render::{
    ExternalView, PeerView, Peers, RenderError, Rendered, Skipped, Subject, config_file, device,
    externals, peers, render, tunnel_addrs,
};

/// Everything the operator writes: Connections and the gateway identity.
pub const FIELD_MANAGER: FieldManager = FieldManager(field_manager::GATEWAY_OPERATOR);

pub struct Opts {
    pub namespace: String,
    /// Name of the gateway interface (its control and UAPI socket names).
    pub name: String,
    pub config_path: PathBuf,
    pub key_path: PathBuf,
    /// Where the gateway's control socket `<name>.ctl` is.
    pub control_dir: PathBuf,
    pub listen_port: u16,
    pub mtu: u16,
    /// `address:port` where peers reach this gateway (after NodePort/LoadBalancer mapping).
    pub advertise: SocketAddr,
    pub interval: Duration,
    /// Where the gateway pins its data-plane maps (its default when unset).
    pub pin_dir: Option<PathBuf>,
    /// The gateway's `busy_poll_us` (0: off).
    pub busy_poll_us: u64,
    /// Reach the nodes through the VXLAN overlay (the gateway's end of it, from Node objects).
    pub overlay: Option<fabric_routing::overlay::Overlay>,
    /// Where the overlay guard is pinned so that it outlives the operator (None: it lives as
    /// long as the operator).
    pub guard_pin_dir: Option<PathBuf>,
    /// This replica's gateway address as the nodes reach it: published on the Lease while it
    /// holds it, and the gateway's end of the overlay.
    pub gateway_ip: Option<Ipv4Addr>,
    /// The active/passive election (the gateway address annotation is added by [`run`]).
    pub election: Election,
    /// How long the gateway may go without answering that it serves before this replica
    /// gives the Lease up (see [`health`]); None: the Lease ignores the gateway.
    pub gateway_grace: Option<Duration>,
}

/// The gateway Service's endpoints while this replica (at `ip`, pod `pod`) holds the Lease.
/// The Service has no selector: the holder writes its EndpointSlice, so the gateway's service
/// account needs no write access to pods (a pod patch could replace any container's image).
pub fn service_endpoints(ip: Ipv4Addr, pod: Option<&str>, port: u16) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(names::endpoint_slice::GATEWAY.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    "kubernetes.io/service-name".to_owned(),
                    names::endpoint_slice::GATEWAY_SERVICE.to_owned(),
                ),
                (
                    "endpointslice.kubernetes.io/managed-by".to_owned(),
                    field_manager::GATEWAY_OPERATOR.to_owned(),
                ),
            ])),
            ..Default::default()
        },
        address_type: "IPv4".to_owned(),
        endpoints: Some(vec![Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            target_ref: pod.map(|p| ObjectReference {
                kind: Some("Pod".to_owned()),
                name: Some(p.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![EndpointPort {
            name: Some("wireguard".to_owned()),
            port: Some(port.into()),
            protocol: Some("UDP".to_owned()),
            ..Default::default()
        }]),
    }
}

/// Where the gateway of this replica pins its data plane when `--pin-dir` is not given: a
/// directory of its own under `root` (the node's shared BPF filesystem), named after the
/// interface and the replica's identity (its pod name). Two replicas on one node must not
/// share one: each resets its pins on start and exit, which would tear down the other's data
/// plane. A container restart keeps the pod name, and so its pins.
pub fn replica_pin_dir(root: &Path, name: &str, identity: &str) -> Result<PathBuf, PinDirError> {
    let component = format!("fabric-gw-{name}-{identity}");
    let fits = identity
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !identity.is_empty()
        && !identity.starts_with('.')
        // NAME_MAX.
        && component.len() <= 255;
    if !fits {
        return Err(PinDirError {
            identity: identity.to_owned(),
        });
    }
    Ok(root.join(component))
}

#[derive(Debug, thiserror::Error)]
#[error(
    "replica identity {identity:?} cannot name a pin directory (letters, digits, '-', '_', '.'; \
     at most 255 bytes with the interface name): pass --pin-dir"
)]
pub struct PinDirError {
    identity: String,
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
    }
    std::fs::rename(tmp, path)
}

/// How long the operator waits for its gateway's answer (a reload creating many devices
/// and loading programs takes a while; a hung gateway must not stall the passes for long).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// The gateway's control socket (`<control_dir>/<name>.ctl`).
fn control(o: &Opts) -> fabric_gateway_api::control::Client {
    fabric_gateway_api::control::Client::for_gateway(&o.control_dir, &o.name)
        .with_timeout(CONTROL_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_on_one_node_pin_apart() {
        let root = Path::new("/sys/fs/bpf");
        let a = replica_pin_dir(root, "fabric", "fabric-gateway-7d9f-abcde").unwrap();
        let b = replica_pin_dir(root, "fabric", "fabric-gateway-7d9f-fghij").unwrap();
        assert_ne!(a, b);
        assert_eq!(
            a,
            Path::new("/sys/fs/bpf/fabric-gw-fabric-fabric-gateway-7d9f-abcde")
        );
        // The same pod (a container restart) finds its pins again.
        assert_eq!(
            a,
            replica_pin_dir(root, "fabric", "fabric-gateway-7d9f-abcde").unwrap()
        );
        for bad in ["", "..", "../x", "a/b", "a b", &"x".repeat(250)] {
            assert!(replica_pin_dir(root, "fabric", bad).is_err(), "{bad:?}");
        }
    }
}
