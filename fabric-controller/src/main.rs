//! fabric-controller: the cluster-level controllers.
//! - `ipam`: grants peers' remapped CIDRs and data-plane ids (one per cluster); with the
//!   discovery flags, also announces the cluster and finds others (ForeignClusters).
//! - `gateway`: the gateway operator, beside each fabric-gateway (renders its configuration
//!   from the API and reports Connections).
//! - `auth`: the authentication service consumers peer through (HTTPS; issue 10).
//! - `sharing`: the sharing layer's negotiation (network and resources over a consumer's
//!   identity, both as consumer and as provider; one active replica), the renewal of the
//!   identities this cluster holds on providers, and on a provider the ShadowPod controller
//!   that runs consumers' pods (issue 11) and the ShadowEndpointSlice controller that writes
//!   their Services' endpoints, remapped (issue 20).
//! - `shadowpod-webhook`: the provider's validating webhook on ShadowPods (consumer,
//!   namespace, grant) and, on a consumer, the mutating webhook that places the pods of
//!   offloaded namespaces, with its own certificates; every replica serves.
//! - `identities`: the renewal alone (`sharing` runs it too; never run both on one cluster).
//! - `virtual-nodes`: runs a virtual kubelet per VirtualNode and removes its Node with it
//!   (one active replica).
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use fabric_api::names;
use fabric_controller::{discovery, gateway, ipam, ips};
use fabric_kube::{client_ca::ClientCa, lease::run_elected};
use fabric_offloading::{shadowpod, virtual_node};
use k8s_openapi::api::coordination::v1::Lease;
use tokio_util::task::AbortOnDropHandle;

mod cli;

use cli::{Cli, Cmd};

fn identity_or_hostname(identity: Option<String>) -> Result<String> {
    match identity {
        Some(i) => Ok(i),
        None => Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("no --identity or POD_NAME, and no host name")?
            .trim()
            .to_owned()),
    }
}

/// Where the elected subcommands' Leases are.
fn leases(client: &kube::Client, namespace: &str) -> kube::Api<Lease> {
    kube::Api::namespaced(client.clone(), namespace)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // `{:#}` prints the chain of causes on one line; returning the error from main would print
    // its Debug form, which carries a backtrace whenever RUST_BACKTRACE is set.
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
    match cli.cmd {
        Cmd::Ipam {
            pod_cidr,
            service_cidr,
            external_cidr,
            reserved,
            largest_claim,
            pools,
            identity,
            namespace,
            lease,
            cluster_id,
            discovery,
        } => {
            let discovery = match (discovery.enabled(), cluster_id) {
                (false, _) => None,
                (true, Some(id)) => Some(
                    discovery.settings(
                        id.parse()
                            .with_context(|| format!("--cluster-id / FABRIC_CLUSTER_ID {id:?}"))?,
                    ),
                ),
                (true, None) => anyhow::bail!(
                    "discovery needs this cluster's id: --cluster-id or FABRIC_CLUSTER_ID"
                ),
            };
            let mut all = vec![pod_cidr, service_cidr, external_cidr];
            all.extend(reserved.into_iter().flatten());
            let election = fabric_kube::Election::new(lease, identity_or_hostname(identity)?);
            let settings = ipam::Settings {
                namespace: namespace.clone(),
                pools,
                reserved: all,
                largest_claim,
            };
            let work = || async {
                tokio::try_join!(
                    async {
                        ipam::run(client.clone(), settings.clone())
                            .await
                            .context("IPAM controller")
                    },
                    async {
                        ips::run(client.clone(), &namespace, external_cidr)
                            .await
                            .context("IP controller")
                    },
                    async {
                        match discovery.clone() {
                            Some(settings) => discovery::run(client.clone(), settings)
                                .await
                                .context("discovery controller"),
                            None => Ok(()),
                        }
                    },
                )
                .map(|_| ())
            };
            run_elected(leases(&client, &namespace), election, work).await
        }
        Cmd::Gateway {
            namespace,
            name,
            config,
            key_file,
            control_dir,
            listen_port,
            mtu,
            advertise,
            interval,
            pin_dir,
            guard_pin_dir,
            pin_root,
            busy_poll_us,
            overlay,
            overlay_args,
            identity,
            gateway_ip,
            lease,
            lease_duration,
            lease_retry,
            gateway_grace,
            ignore_gateway_health,
        } => {
            let identity = identity_or_hostname(identity)?;
            let pin_dir = match pin_dir {
                Some(p) => p,
                None => gateway::replica_pin_dir(&pin_root, &name, &identity)?,
            };
            let election = fabric_kube::Election::new(lease, identity)
                .with_timing(lease_duration, lease_retry)
                .context(
                    "--lease-retry must be shorter than --lease-duration, or the holder loses the Lease between renewals",
                )?;
            gateway::run(
                client,
                gateway::Opts {
                    namespace,
                    name,
                    config_path: config,
                    key_path: key_file,
                    control_dir,
                    listen_port,
                    mtu,
                    advertise,
                    interval,
                    pin_dir: Some(pin_dir),
                    busy_poll_us,
                    overlay: overlay.then(|| overlay_args.overlay()),
                    guard_pin_dir,
                    gateway_ip,
                    election,
                    gateway_grace: (!ignore_gateway_health).then_some(gateway_grace),
                },
            )
            .await
        }
        Cmd::Identities { namespace, renewal } => {
            fabric_auth::renewal::run(client, &namespace, renewal.policy()).await;
            Ok(())
        }
        Cmd::CsrApprover {
            namespace,
            approver,
        } => {
            fabric_auth::approver::run(client, approver.settings(&namespace)).await;
            Ok(())
        }
        Cmd::Auth {
            namespace,
            cluster_id,
            listen,
            api_server_url,
            api_server_ca,
            certificate_ttl,
            sign_timeout,
            tls_secret,
            tls_hosts,
            client_ca,
        } => {
            anyhow::ensure!(
                fabric_api::identity::is_dns_label(&cluster_id),
                "--cluster-id {cluster_id:?} is not a DNS label"
            );
            anyhow::ensure!(
                api_server_url.starts_with("https://"),
                "--api-server-url must be an https:// URL"
            );
            let ca_pem = std::fs::read_to_string(&api_server_ca)
                .with_context(|| format!("reading --api-server-ca {}", api_server_ca.display()))?;
            let limits = fabric_auth::server::Limits {
                request_timeout: sign_timeout + Duration::from_secs(30),
                ..Default::default()
            };
            let service = fabric_auth::provider::Service {
                client,
                namespace,
                token_namespace: names::namespace::PEERING_TOKENS.to_owned(),
                cluster_id,
                api_server_url,
                ca_pem,
                certificate_ttl,
                sign_timeout,
            };
            let source = client_ca.map_or(ClientCa::Cluster, ClientCa::File);
            let client_ca = fabric_kube::client_ca::read(&service.client, &source)
                .await
                .with_context(|| {
                    format!("the client CA consumers renew with ({source}); set --client-ca")
                })?;
            fabric_auth::run::run(
                service,
                listen,
                &tls_secret,
                &tls_hosts,
                Some(&client_ca),
                limits,
            )
            .await
            .context("authentication service")
        }
        Cmd::Sharing {
            namespace,
            identity,
            lease,
            offer_percent,
            advertise_labels,
            remote_poll,
            at_most_once_min_partition,
            at_most_once_max_grace,
            tenant_pods,
            drain_grace,
            finished_retention,
            unrecorded_retention,
            reserved_namespaces,
            max_namespaces_per_tenant,
            cluster_dns,
            renewal,
            approver,
        } => {
            let finished_retention = shadowpod::lifetime::Retention {
                recorded: finished_retention,
                unrecorded: unrecorded_retention,
            };
            let rules = tenant_pods.rules();
            let approver = approver.settings(&namespace);
            let at_most_once = fabric_api::offloading::at_most_once::Bounds::new(
                at_most_once_min_partition,
                at_most_once_max_grace,
            )
            .context("--at-most-once-min-partition / --at-most-once-max-grace")?;
            let identity = identity_or_hostname(identity)?;
            let settings = fabric_negotiation::Settings {
                namespace: namespace.clone(),
                remote_poll,
                percent: offer_percent,
                labels: advertise_labels.into_iter().collect(),
                instance: Some(identity.clone()),
                at_most_once,
                reserved_namespaces,
                max_namespaces_per_tenant,
            };
            let election = fabric_kube::Election::new(lease, identity);
            // Each controller on a task of its own, so that the multi-thread runtime spreads
            // them over the cores (one future joining them all runs on one at a time). Spawned
            // once leading (the work future is first polled then), aborted when it is dropped
            // (leadership lost).
            let work = || {
                let (client, settings) = (client.clone(), settings.clone());
                let (namespace, policy) = (namespace.clone(), renewal.policy());
                let (rules, approver) = (rules.clone(), approver.clone());
                let cluster_dns = cluster_dns.clone();
                async move {
                    // The drain of the excess after tethered mode charges as admission does.
                    let defaults = rules.default_requests.clone();
                    let negotiation = AbortOnDropHandle::new(tokio::spawn({
                        let client = client.clone();
                        async move {
                            fabric_negotiation::run(client, settings)
                                .await
                                .context("sharing controllers")
                        }
                    }));
                    // One active replica: two would both re-create a vanished pod's successor
                    // (one refused as a duplicate) and both count it.
                    let shadowpods = AbortOnDropHandle::new(tokio::spawn({
                        let client = client.clone();
                        async move {
                            shadowpod::controller::run(client, rules, finished_retention)
                                .await
                                .context("ShadowPod controller")
                        }
                    }));
                    // One active replica: the real EndpointSlices of consumers' shadows.
                    let endpointslices = AbortOnDropHandle::new(tokio::spawn({
                        let (client, namespace) = (client.clone(), namespace.clone());
                        async move {
                            fabric_offloading::endpointslices::controller::run(client, namespace)
                                .await
                                .context("ShadowEndpointSlice controller")
                        }
                    }));
                    // One active replica: the real NetworkPolicies of consumers' shadows.
                    let networkpolicies = AbortOnDropHandle::new(tokio::spawn({
                        let (client, namespace) = (client.clone(), namespace.clone());
                        let dns = cluster_dns;
                        async move {
                            fabric_offloading::networkpolicies::controller::run(
                                client, namespace, dns,
                            )
                            .await
                            .context("ShadowNetworkPolicy controller")
                        }
                    }));
                    // The authentication service faces the internet: it asks, this approves.
                    let csrs = AbortOnDropHandle::new(tokio::spawn({
                        let client = client.clone();
                        async move {
                            fabric_auth::approver::run(client, approver).await;
                            Ok(())
                        }
                    }));
                    // One active replica: the drained tenants' pods are stopped once.
                    let drains = AbortOnDropHandle::new(tokio::spawn({
                        let client = client.clone();
                        async move {
                            shadowpod::drainer::run(client, drain_grace, defaults).await;
                            Ok(())
                        }
                    }));
                    // One active replica: two would both renew, each with a key of its own,
                    // and the Secret would flip between them.
                    let renewals = AbortOnDropHandle::new(tokio::spawn(async move {
                        fabric_auth::renewal::run(client, &namespace, policy).await;
                        Ok(())
                    }));
                    let joined = |h: AbortOnDropHandle<Result<()>>| async move {
                        h.await.context("a sharing task panicked")?
                    };
                    tokio::try_join!(
                        joined(negotiation),
                        joined(shadowpods),
                        joined(endpointslices),
                        joined(networkpolicies),
                        joined(csrs),
                        joined(drains),
                        joined(renewals)
                    )
                    .map(|_| ())
                }
            };
            run_elected(leases(&client, &namespace), election, work).await
        }
        Cmd::ShadowpodWebhook {
            namespace,
            listen,
            service,
            tls_secret,
            config,
            pods_config,
            refresh,
            pending_ttl,
            tenant_pods,
            client_ca,
            client_names,
            max_shadowpods_per_tenant,
            max_objects_per_tenant,
            max_shadowpod_bytes,
            max_shadowpod_bytes_per_tenant,
        } => {
            let ca = std::fs::read_to_string(&client_ca)
                .with_context(|| format!("reading --client-ca {}", client_ca.display()))?;
            let settings = shadowpod::webhook::Settings {
                tls_secret,
                config,
                pods_config,
                refresh,
                pending_ttl,
                rules: tenant_pods.rules(),
                callers: Some(shadowpod::webhook::Callers {
                    ca,
                    names: client_names,
                }),
                max_shadow_pods: max_shadowpods_per_tenant,
                max_objects: max_objects_per_tenant,
                max_shadow_pod_bytes: max_shadowpod_bytes,
                max_tenant_bytes: max_shadowpod_bytes_per_tenant,
                ..shadowpod::webhook::Settings::new(&namespace, &service, listen)
            };
            shadowpod::webhook::run(client, settings)
                .await
                .context("ShadowPod webhook")
        }
        Cmd::VirtualNodes {
            namespace,
            identity,
            lease,
            virtual_kubelet_image,
            virtual_kubelet_port,
            home_api_address,
            reflect_custom_resource,
            virtual_kubelet_probe_interval,
            virtual_kubelet_probe_timeout,
            virtual_kubelet_grace,
            drain_grace,
        } => {
            // One active replica: two would both apply every virtual kubelet and publish
            // every Event twice, and race on a removal's cordon and deletes.
            let election = fabric_kube::Election::new(lease, identity_or_hostname(identity)?);
            let settings = virtual_node::objects::Settings {
                image: virtual_kubelet_image,
                fabric_namespace: namespace.clone(),
                kubelet_port: virtual_kubelet_port,
                home_api_address: home_api_address.map(|a| a.to_string()),
                reflect: reflect_custom_resource,
                health: virtual_node::objects::Health {
                    probe_interval: virtual_kubelet_probe_interval,
                    probe_timeout: virtual_kubelet_probe_timeout,
                    grace: virtual_kubelet_grace,
                },
            };
            let work = || async {
                virtual_node::controller::run(client.clone(), settings.clone(), drain_grace).await;
                Ok(())
            };
            run_elected(leases(&client, &namespace), election, work).await
        }
        Cmd::Storage {
            namespace,
            identity,
            lease,
            storage_class,
            real_storage_class,
            storage_namespace,
        } => {
            // One active replica: two would race to make the same real claim and volume.
            let election = fabric_kube::Election::new(lease, identity_or_hostname(identity)?);
            let provisioner = fabric_offloading::storage::Provisioner {
                class: storage_class,
                real_class: real_storage_class.filter(|c| !c.is_empty()),
                namespace: storage_namespace,
            };
            let work = || async {
                fabric_offloading::storage::controller::run(client.clone(), provisioner.clone())
                    .await
                    .context("storage provisioner")
            };
            run_elected(leases(&client, &namespace), election, work).await
        }
    }
}
