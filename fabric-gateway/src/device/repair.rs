//! The remap data plane on the peers' devices, and the drift repair: whatever someone
//! changed under the tunnels since they were configured is put back.

use std::{path::PathBuf, sync::Arc, sync::atomic::Ordering};

use super::{Gateway, GatewayError};
use crate::netconf;

/// Whether a peer's decrypted packets may go to its device: a peer with a data-plane id only
/// once its programs and map entries are `in_place`, a peer without one always.
pub(super) fn dataplane_ready(id: Option<u32>, in_place: bool) -> bool {
    id.is_none() || in_place
}

impl Gateway {
    /// Puts the remap programs on the peers' devices and makes their maps match, then lets
    /// delivery to the devices it covers go ahead (and stops it for the others, when it
    /// fails). The devices exist by now; filters on them go away with them, so a restarted
    /// gateway re-applies.
    /// Keeps a fallback blackhole (see `netconf::sync_fallbacks`) for every prefix routed into
    /// a tunnel, so that a restart of this process drops packets for a moment instead of
    /// refusing them. A failure is logged: the tunnels work without them.
    pub(super) async fn sync_fallbacks(&self) {
        let want: std::collections::BTreeSet<ipnetwork::IpNetwork> = self
            .peers()
            .iter()
            .flat_map(|p| p.cfg.lock().unwrap().routes.clone())
            .collect();
        match netconf::sync_fallbacks(&self.netlink, &want).await {
            Ok((added, removed)) if !added.is_empty() || !removed.is_empty() => {
                tracing::info!(?added, ?removed, "fallback routes")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "fallback routes not updated"),
        }
    }

    pub(super) fn apply_dataplane(
        &self,
        dp: Option<(PathBuf, fabric_dataplane::DataplaneConfig)>,
    ) -> Result<(), GatewayError> {
        let res = self.apply_dataplane_maps(dp);
        self.set_dataplane_ready(res.is_ok(), &[]);
        res
    }

    /// Marks each peer ready for delivery or not: `applied` says whether the data plane last
    /// set (or checked) is in place, but on the `missing` devices.
    fn set_dataplane_ready(&self, applied: bool, missing: &[String]) {
        let cfg = self.dataplane_cfg.lock().unwrap().clone();
        for p in self.peers() {
            let id = p.cfg.lock().unwrap().id;
            let covered = cfg
                .as_ref()
                .is_some_and(|(_, c)| c.peers.iter().any(|d| d.interface == p.tun.name()))
                && !missing.iter().any(|m| m == p.tun.name());
            let ready = dataplane_ready(id, applied && covered);
            if p.dataplane_ready.swap(ready, Ordering::AcqRel) != ready {
                if ready {
                    tracing::info!(peer = %p.name, device = %p.tun.name(), "data plane in place; delivering");
                } else {
                    tracing::warn!(peer = %p.name, device = %p.tun.name(), "data plane not in place; dropping what the peer sends until it is");
                }
            }
        }
    }

    fn apply_dataplane_maps(
        &self,
        dp: Option<(PathBuf, fabric_dataplane::DataplaneConfig)>,
    ) -> Result<(), GatewayError> {
        let err = |e| GatewayError::Dataplane(Box::new(e));
        let Some((pin_dir, cfg)) = dp else {
            // No peer left that wants remapping: empty what the last apply put in the maps and
            // detach from its devices, and stop repairing toward it, or the last peer would
            // stay in the maps and the repair would chase its deleted device forever.
            let Some((pin_dir, _)) = self.dataplane_cfg.lock().unwrap().take() else {
                return Ok(());
            };
            if let Some(plane) = self.dataplane.lock().unwrap().as_mut() {
                let report = plane
                    .apply(&fabric_dataplane::DataplaneConfig::default())
                    .map_err(err)?;
                tracing::info!(pin_dir = %pin_dir.display(), ?report, "data plane emptied: no peers left");
            }
            return Ok(());
        };
        let mut slot = self.dataplane.lock().unwrap();
        let plane = match slot.as_mut() {
            Some(p) => p,
            None => slot.insert(fabric_dataplane::Dataplane::load(Some(&pin_dir)).map_err(err)?),
        };
        let report = plane.apply(&cfg).map_err(err)?;
        tracing::info!(pin_dir = %pin_dir.display(), ?report, "data plane applied");
        *self.dataplane_cfg.lock().unwrap() = Some((pin_dir, cfg));
        Ok(())
    }

    /// Puts back what someone changed under the tunnels since they were configured: a peer
    /// device set down, its addresses or routes deleted, a remap filter detached from it, map
    /// entries deleted or overwritten. Cheap when nothing drifted: a few dumps per device and
    /// one map read.
    pub async fn repair(self: &Arc<Self>) {
        let _guard = self.control.lock().await;
        let snap = match netconf::snapshot(&self.netlink).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "reading links, addresses and routes");
                None
            }
        };
        for p in self.peers().iter().filter(|_| snap.is_some()) {
            let cfg = p.cfg.lock().unwrap().clone();
            let ifindex = p.tun.ifindex();
            if !snap.as_ref().expect("filtered").up.contains_key(&ifindex) {
                // The device was deleted: the peer is set up again from its configuration
                // (a new device, a new session); the data-plane pass below attaches to it.
                tracing::warn!(peer = %p.name, device = %p.tun.name(), "tunnel device gone; recreating the peer");
                self.remove_peer(&p.public_key).await;
                match self.add_peer(cfg).await {
                    Ok(()) => {
                        self.repairs.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::error!(peer = %p.name, error = %e, "recreating the peer"),
                }
                continue;
            }
            let drift =
                snap.as_ref()
                    .expect("filtered")
                    .drift(ifindex, &cfg.addresses, &cfg.routes);
            if drift.count() == 0 {
                continue;
            }
            tracing::warn!(device = %p.tun.name(), ?drift, "tunnel device had drifted; restoring");
            let res = async {
                if drift.down {
                    netconf::link_up(&self.netlink, ifindex, self.iface.mtu).await?;
                }
                netconf::sync_addresses(&self.netlink, ifindex, &[], &drift.addresses).await?;
                netconf::sync_routes(&self.netlink, ifindex, &[], &drift.routes).await
            }
            .await;
            match res {
                Ok(()) => {
                    self.repairs
                        .fetch_add(drift.count() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(device = %p.tun.name(), error = %e, "restoring the device")
                }
            }
        }
        self.repair_dataplane().await;
    }

    async fn repair_dataplane(&self) {
        let Some((pin_dir, cfg)) = self.dataplane_cfg.lock().unwrap().clone() else {
            return;
        };
        let mut detached = Vec::new();
        for p in self.peers() {
            if !cfg.peers.iter().any(|d| d.interface == p.tun.name()) {
                continue;
            }
            match netconf::dataplane_filters_present(&self.netlink, p.tun.ifindex()).await {
                Ok(true) => {}
                Ok(false) => {
                    // Nothing translates this peer's packets now: stop delivering them.
                    p.dataplane_ready.store(false, Ordering::Release);
                    detached.push(p.tun.name().to_string());
                }
                Err(e) => tracing::warn!(device = %p.tun.name(), error = %e, "checking filters"),
            }
            match netconf::strict_rp_filter(p.tun.name()) {
                Ok(false) => {}
                Ok(true) => {
                    tracing::warn!(device = %p.tun.name(), "reverse-path filtering had been loosened; strict again");
                    self.repairs.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(device = %p.tun.name(), error = %e, "checking rp_filter"),
            }
        }
        if !detached.is_empty() {
            tracing::warn!(devices = ?detached, "remap filters missing; attaching them again");
            let res = self.apply_dataplane_maps(Some((pin_dir, cfg)));
            // An apply can succeed without the filters landing where they belong (another
            // qdisc in the place of clsact takes them to its own hook): trust only what is
            // there afterwards.
            let mut missing = Vec::new();
            if res.is_ok() {
                for p in self.peers() {
                    let dev = p.tun.name().to_string();
                    if detached.contains(&dev)
                        && !matches!(
                            netconf::dataplane_filters_present(&self.netlink, p.tun.ifindex())
                                .await,
                            Ok(true)
                        )
                    {
                        missing.push(dev);
                    }
                }
            }
            self.set_dataplane_ready(res.is_ok(), &missing);
            match res {
                Ok(()) if missing.is_empty() => {
                    self.repairs
                        .fetch_add(detached.len() as u64, Ordering::Relaxed);
                }
                Ok(()) => tracing::error!(
                    devices = ?missing,
                    "remap filters cannot be put in place; nothing is delivered to these devices"
                ),
                Err(e) => tracing::error!(error = %e, "repairing the data plane"),
            }
            return;
        }
        let res = match self.dataplane.lock().unwrap().as_mut() {
            Some(plane) => plane.repair_maps(&cfg),
            None => return,
        };
        // Filters there and maps as configured (or not, when the rewrite failed): delivery
        // follows, also for peers an earlier failed apply had stopped.
        self.set_dataplane_ready(res.is_ok(), &[]);
        match res {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(entries = n, "data-plane map entries had drifted; rewritten");
                self.repairs.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => tracing::error!(error = %e, "repairing data-plane maps"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dataplane_ready;

    #[test]
    fn delivery_waits_for_the_data_plane_a_peer_asks_for() {
        assert!(!dataplane_ready(Some(3), false));
        assert!(dataplane_ready(Some(3), true));
        // A plain WireGuard peer (no remapping) has nothing to wait for.
        assert!(dataplane_ready(None, false));
    }
}
