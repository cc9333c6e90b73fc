//! The home API server in the twins (issue 20): offloaded pods reach it at its address in
//! the provider's view. The admin says where it listens on the cluster network
//! (`--home-api-address`); the virtual kubelet exposes that address to peers with an `IP`
//! ([`names::home_api::SERVICE`], in the fabric's namespace: IPAM gives it an address of
//! this cluster's external CIDR, the gateway carries it), and keeps in every twin namespace
//! a Service of that name (no selector, port [`names::home_api::PORT`]) with a
//! ShadowEndpointSlice holding the external address, which the provider turns into a real
//! slice remapped into its view of this cluster. The twin Service's cluster IP is what
//! [`fabric_offloading::shadowpod::forge::home_api`] points offloaded pods at; a pod of a
//! twin waits until it is allocated. Both objects carry our marks; one of that name we did
//! not make is left alone (said in the log), and they go with their twin. Started without the
//! option, the virtual kubelet withdraws what a run with it left ([`withdraw`]): the option
//! turned off takes the home API server out of the providers' reach.
//!
//! The objects are pure functions here ([`service`], [`shadow_slice`], [`ip`]); [`follow`]
//! and [`withdraw`] are their edges.
use std::{collections::BTreeMap, net::SocketAddrV4, time::Duration};

use fabric_api::{
    names::{self, endpoint_slice::SERVICE_NAME, home_api},
    networking::v1alpha1::{IP, IPSpec},
    offloading::v1alpha1::{
        EndpointConditions, EndpointSliceTemplate, ShadowEndpoint, ShadowEndpointPort,
        ShadowEndpointSlice, ShadowEndpointSliceSpec,
    },
};
use fabric_offloading::shadowpod::forge::HomeApi;
use fabric_reflector::{Endpoint, Marks};
use k8s_openapi::{
    api::core::v1::{Service, ServicePort, ServiceSpec},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{
    Api, Client, Resource,
    api::{ObjectMeta, Patch, PatchParams},
};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::pods::twins::Twins;

/// Where offloaded pods find the home API server, by home namespace.
pub type HomeApis = BTreeMap<String, HomeApi>;

/// The name of the Service port (and of the slice's port).
const PORT_NAME: &str = "https";

/// How often the twins' objects are looked at besides the watches' changes (one deleted
/// there is made again).
const RESYNC: Duration = Duration::from_secs(30);

fn meta(marks: &Marks, mut labels: BTreeMap<String, String>) -> ObjectMeta {
    marks.stamp(&mut labels);
    ObjectMeta {
        name: Some(home_api::SERVICE.to_owned()),
        labels: Some(labels),
        ..Default::default()
    }
}

/// The `IP` exposing the home API server at `address` to peers.
pub fn ip(address: &SocketAddrV4) -> IP {
    IP::new(
        home_api::SERVICE,
        IPSpec {
            ip: address.ip().to_string(),
        },
    )
}

/// The Service in a twin: port [`home_api::PORT`] to the home API server's port.
pub fn service(marks: &Marks, address: &SocketAddrV4) -> Service {
    Service {
        metadata: meta(marks, BTreeMap::new()),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_owned()),
                port: home_api::PORT,
                target_port: Some(IntOrString::Int(i32::from(address.port()))),
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Its ShadowEndpointSlice: the home API server at `external` (its address in this
/// cluster's external CIDR, which the provider remaps), always ready (the provider marks it
/// not ready while this cluster is unreachable).
pub fn shadow_slice(marks: &Marks, address: &SocketAddrV4, external: &str) -> ShadowEndpointSlice {
    let labels = BTreeMap::from([(SERVICE_NAME.to_owned(), home_api::SERVICE.to_owned())]);
    ShadowEndpointSlice {
        metadata: meta(marks, labels),
        spec: ShadowEndpointSliceSpec {
            template: EndpointSliceTemplate {
                address_type: "IPv4".to_owned(),
                endpoints: vec![ShadowEndpoint {
                    addresses: vec![external.to_owned()],
                    conditions: EndpointConditions {
                        ready: Some(true),
                        serving: Some(true),
                        terminating: Some(false),
                    },
                    hostname: None,
                    zone: None,
                    target_ref: None,
                }],
                ports: vec![ShadowEndpointPort {
                    name: Some(PORT_NAME.to_owned()),
                    port: Some(i32::from(address.port())),
                    protocol: Some("TCP".to_owned()),
                    app_protocol: None,
                }],
            },
        },
    }
}

/// The cluster IP the provider gave Service `s`, once it has.
pub fn cluster_ip(s: &Service) -> Option<String> {
    s.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && ip != "None")
}

/// Applies `want` in `api` unless an object of its name there is someone else's; returns
/// what the API server keeps (`None`: not ours).
async fn keep<K>(api: &Api<K>, marks: &Marks, want: &K) -> kube::Result<Option<K>>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    if let Some(have) = api.get_opt(home_api::SERVICE).await?
        && !marks.on(have.meta())
    {
        return Ok(None);
    }
    let pp = PatchParams::apply(names::field_manager::REFLECTION).force();
    api.patch(home_api::SERVICE, &pp, &Patch::Apply(want))
        .await
        .map(Some)
}

/// Keeps the home API server's Service and slice in twin `remote` (of home namespace
/// `home`); its cluster IP once allocated.
async fn keep_twin(
    endpoint: &Endpoint,
    remote: &str,
    address: &SocketAddrV4,
    external: &str,
) -> kube::Result<Option<String>> {
    let marks = &endpoint.marks;
    let services = Api::<Service>::namespaced(endpoint.client.clone(), remote);
    let Some(s) = keep(&services, marks, &service(marks, address)).await? else {
        warn!(
            namespace = remote,
            name = home_api::SERVICE,
            "a Service of that name there is not ours: offloaded pods of this twin get no home API server"
        );
        return Ok(None);
    };
    let slices = Api::<ShadowEndpointSlice>::namespaced(endpoint.client.clone(), remote);
    if keep(&slices, marks, &shadow_slice(marks, address, external))
        .await?
        .is_none()
    {
        warn!(
            namespace = remote,
            name = home_api::SERVICE,
            "a ShadowEndpointSlice of that name there is not ours: offloaded pods of this twin get no home API server"
        );
        return Ok(None);
    }
    Ok(cluster_ip(&s))
}

/// Exposes the home API server at `address` and keeps its Service in every twin `twins`
/// accepts; sends where each twin's pods find it.
pub fn follow(
    local: Client,
    fabric_namespace: String,
    address: SocketAddrV4,
    endpoints: watch::Receiver<Option<Endpoint>>,
    twins: watch::Receiver<Twins>,
) -> watch::Receiver<HomeApis> {
    let (tx, rx) = watch::channel(HomeApis::new());
    tokio::spawn(run(local, fabric_namespace, address, endpoints, twins, tx));
    rx
}

async fn run(
    local: Client,
    fabric_namespace: String,
    address: SocketAddrV4,
    mut endpoints: watch::Receiver<Option<Endpoint>>,
    mut twins: watch::Receiver<Twins>,
    tx: watch::Sender<HomeApis>,
) {
    let ips = Api::<IP>::namespaced(local, &fabric_namespace);
    let mut exposed = fabric_kube::cache::follow(ips.clone(), home_api::SERVICE);
    let want = ip(&address);
    let mut tick = tokio::time::interval(RESYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = endpoints.changed() => if r.is_err() { return },
            r = twins.changed() => if r.is_err() { return },
            r = exposed.changed() => if r.is_err() { return },
        }
        let have = exposed.borrow_and_update().clone();
        if have.as_ref().map(|i| &i.spec) != Some(&want.spec) {
            let pp = PatchParams::apply(names::field_manager::VIRTUAL_KUBELET).force();
            match ips
                .patch(home_api::SERVICE, &pp, &Patch::Apply(&want))
                .await
            {
                Ok(_) => info!(address = %address.ip(), "the home API server exposed to peers"),
                Err(e) => {
                    warn!(error = %e, "exposing the home API server (IP {})", home_api::SERVICE)
                }
            }
        }
        let external = have.and_then(|i| i.status).and_then(|s| s.ip);
        let endpoint = endpoints.borrow_and_update().clone();
        let accepted = twins.borrow_and_update().accepted();
        let (Some(external), Some(endpoint)) = (external, endpoint) else {
            continue;
        };
        let mut found = HomeApis::new();
        for (home, remote) in &accepted {
            match keep_twin(&endpoint, remote, &address, &external).await {
                Ok(Some(cluster_ip)) => {
                    found.insert(home.clone(), HomeApi { cluster_ip });
                }
                // Allocated on the next look.
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, namespace = %remote, "keeping the home API server's Service in the twin");
                    // What was known stays: a moment's failure does not hold new pods back.
                    if let Some(known) = tx.borrow().get(home) {
                        found.insert(home.clone(), known.clone());
                    }
                }
            }
        }
        tx.send_if_modified(|h| {
            let changed = *h != found;
            *h = found;
            changed
        });
        // A Service just made has its cluster IP in the answer; one that had none (or a
        // twin not ready) is looked at again soon.
        if accepted.keys().any(|h| !tx.borrow().contains_key(h)) {
            tick.reset_after(Duration::from_secs(2));
        }
    }
}

/// How soon a withdrawal that failed (a provider out of reach) is tried again.
const WITHDRAW_RETRY: Duration = Duration::from_secs(10);

/// Whether `meta` is of the `IP` an earlier run applied ([`follow`] writes it under the
/// virtual kubelet's field manager).
fn exposed_by_us(meta: &ObjectMeta) -> bool {
    meta.managed_fields
        .iter()
        .flatten()
        .any(|f| f.manager.as_deref() == Some(names::field_manager::VIRTUAL_KUBELET))
}

/// Deletes object [`home_api::SERVICE`] in `api` if it is ours (by `ours`), UID-preconditioned;
/// whether it was there to delete.
async fn delete_ours<K>(api: &Api<K>, ours: impl Fn(&ObjectMeta) -> bool) -> kube::Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(have) = api.get_opt(home_api::SERVICE).await? else {
        return Ok(false);
    };
    if !ours(have.meta()) {
        return Ok(false);
    }
    let dp = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: have.meta().uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(home_api::SERVICE, &dp).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Without `--home-api-address`, what an earlier run with it left goes: the `IP` (so that
/// the gateways stop carrying the home API server's external address to peers) and, in every
/// twin `twins` accepts, the Service and ShadowEndpointSlice of that name (ours only), so that
/// turning the option off takes the home API server out of the providers' reach. A twin is
/// looked at once; one that fails (its provider out of reach) again after [`WITHDRAW_RETRY`].
pub fn withdraw(
    local: Client,
    fabric_namespace: String,
    mut endpoints: watch::Receiver<Option<Endpoint>>,
    mut twins: watch::Receiver<Twins>,
) {
    tokio::spawn(async move {
        let ips = Api::<IP>::namespaced(local, &fabric_namespace);
        let mut ip_done = false;
        let mut done = std::collections::BTreeSet::<String>::new();
        loop {
            if !ip_done {
                match delete_ours(&ips, exposed_by_us).await {
                    Ok(deleted) => {
                        if deleted {
                            info!(
                                "the home API server no longer exposed to peers (no --home-api-address)"
                            );
                        }
                        ip_done = true;
                    }
                    Err(e) => warn!(error = %e, "withdrawing the IP {}", home_api::SERVICE),
                }
            }
            let endpoint = endpoints.borrow_and_update().clone();
            let accepted = twins.borrow_and_update().accepted();
            let mut pending = !ip_done;
            if let Some(endpoint) = endpoint {
                let left: Vec<String> = accepted
                    .into_values()
                    .filter(|r| !done.contains(r))
                    .collect();
                for remote in &left {
                    let ours = |m: &ObjectMeta| endpoint.marks.on(m);
                    let services = Api::<Service>::namespaced(endpoint.client.clone(), remote);
                    let slices =
                        Api::<ShadowEndpointSlice>::namespaced(endpoint.client.clone(), remote);
                    let r: kube::Result<bool> = async {
                        let a = delete_ours(&services, ours).await?;
                        let b = delete_ours(&slices, ours).await?;
                        Ok(a || b)
                    }
                    .await;
                    match r {
                        Ok(deleted) => {
                            if deleted {
                                info!(namespace = %remote, "the home API server's Service withdrawn from the twin (no --home-api-address)");
                            }
                            done.insert(remote.clone());
                        }
                        Err(e) => {
                            warn!(error = %e, namespace = %remote, "withdrawing the home API server's Service from the twin");
                            pending = true;
                        }
                    }
                }
            }
            tokio::select! {
                r = endpoints.changed() => if r.is_err() { return },
                r = twins.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(WITHDRAW_RETRY), if pending => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;

    use super::*;

    fn marks() -> Marks {
        Marks::new("alpha", "beta")
    }

    fn address() -> SocketAddrV4 {
        "10.0.1.100:6443".parse().unwrap()
    }

    #[test]
    fn the_service_sends_its_port_to_the_api_servers() {
        let s = service(&marks(), &address());
        assert_eq!(s.name_any(), home_api::SERVICE);
        assert!(marks().on(&s.metadata));
        let spec = s.spec.unwrap();
        assert_eq!(spec.selector, None, "its endpoints are ours");
        assert_eq!(spec.cluster_ip, None, "the provider allocates it");
        let port = &spec.ports.unwrap()[0];
        assert_eq!(port.port, 443);
        assert_eq!(port.target_port, Some(IntOrString::Int(6443)));
        assert_eq!(port.name.as_deref(), Some("https"));
    }

    #[test]
    fn the_slice_holds_the_external_address_under_the_services_name() {
        let s = shadow_slice(&marks(), &address(), "10.70.0.1");
        assert_eq!(s.name_any(), home_api::SERVICE);
        assert!(marks().on(&s.metadata));
        assert_eq!(s.labels()[SERVICE_NAME], home_api::SERVICE);
        let t = &s.spec.template;
        assert_eq!(t.endpoints.len(), 1);
        assert_eq!(t.endpoints[0].addresses, ["10.70.0.1"]);
        assert_eq!(t.endpoints[0].conditions.ready, Some(true));
        assert_eq!(t.ports[0].port, Some(6443));
        assert_eq!(t.ports[0].name.as_deref(), Some("https"));
    }

    #[test]
    fn the_ip_is_the_api_servers_and_the_cluster_ip_is_a_real_one() {
        let i = ip(&address());
        assert_eq!(i.spec.ip, "10.0.1.100");
        assert_eq!(i.name_any(), home_api::SERVICE);
        let mut s = service(&marks(), &address());
        assert_eq!(cluster_ip(&s), None);
        s.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        assert_eq!(cluster_ip(&s), None);
        s.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.7".into());
        assert_eq!(cluster_ip(&s).as_deref(), Some("10.96.0.7"));
    }
}
