//! Reconfiguration at runtime: reload from the configuration file, and the UAPI (`wg show`,
//! `wg set`). What changes is decided by `crate::reconfig` and `uapi::plan_set`; this
//! applies it.

use std::{
    sync::{Arc, atomic::Ordering},
    time::SystemTime,
};

use super::{Gateway, GatewayError};
use crate::{config::Config, key::PrivateKey, reconfig, uapi};

impl Gateway {
    /// Makes the running peer set match `cfg`. Untouched peers keep their
    /// sessions and devices, so their traffic is not disturbed.
    pub async fn reload(self: &Arc<Self>, cfg: Config) -> Result<(), GatewayError> {
        let _guard = self.control.lock().await;
        // Until this reload is through, what runs is neither the old configuration nor the
        // new one.
        *self.running.lock().unwrap() = None;
        let wanted = cfg.clone();
        let i = &cfg.interface;
        if reconfig::needs_restart(&self.iface, i) {
            tracing::warn!("interface settings changed; they take effect only after a restart");
        }
        let key = PrivateKey::read_file(&i.private_key_file)?;
        if key.public_key() != self.public_key() {
            self.rotate_key(key);
        }
        // The snapshot is dropped before anything is added: a removed peer's device goes only
        // with its last reference, and a new peer (another key, e.g. the peer's rotated one)
        // may want the same device name.
        let removals = {
            let running = self.peers();
            reconfig::reload_removals(
                running.iter().map(|p| (p.public_key, p.name(), p.device())),
                &cfg.peers,
            )
        };
        for key in removals {
            self.remove_peer(&key).await;
        }
        let mut errors = Vec::new();
        for pc in &cfg.peers {
            let res = match self.peer_by_key(&pc.public_key) {
                Some(p) => self.update_peer(&p, pc.clone()).await,
                None => self.add_peer(pc.clone()).await,
            };
            if let Err(e) = res {
                tracing::error!(peer = %pc.name, error = %e, "reload: peer not applied");
                errors.push(e);
            }
        }
        if let Err(e) = self.apply_dataplane(cfg.dataplane()) {
            tracing::error!(error = %e, "reload: data plane not applied");
            errors.push(e);
        }
        self.sync_fallbacks().await;
        if errors.is_empty() {
            tracing::info!(peers = cfg.peers.len(), "configuration reloaded");
            *self.running.lock().unwrap() = Some(wanted);
            Ok(())
        } else {
            Err(GatewayError::Reload(errors))
        }
    }

    /// The configuration this gateway runs in full: the last one it started or reloaded with,
    /// None when that was not applied in full. (`wg set` changes are live only and not in it.)
    pub fn running_config(&self) -> Option<Config> {
        self.running.lock().unwrap().clone()
    }

    pub fn uapi_get(&self) -> uapi::DeviceSnapshot {
        let now = SystemTime::now();
        uapi::DeviceSnapshot {
            listen_port: self.listen_port(),
            peers: self
                .peers()
                .iter()
                .map(|p| {
                    let (hs, ..) = p.tunn.lock().unwrap().stats();
                    uapi::PeerSnapshot {
                        public_key: p.public_key,
                        endpoint: *p.endpoint.read().unwrap(),
                        last_handshake: hs.and_then(|d| now.checked_sub(d)),
                        tx_bytes: p.counters.tx_bytes.load(Ordering::Relaxed),
                        rx_bytes: p.counters.rx_bytes.load(Ordering::Relaxed),
                        persistent_keepalive: p.cfg.lock().unwrap().persistent_keepalive,
                        allowed_ips: p.allowed.read().unwrap().nets().to_vec(),
                    }
                })
                .collect(),
        }
    }

    /// Applies a `wg set`. Changes are live only: a reload restores the file's state.
    pub async fn uapi_set(self: &Arc<Self>, req: uapi::SetRequest) -> Result<(), uapi::UapiError> {
        let _guard = self.control.lock().await;
        // What runs is no longer the configuration: the next reload must happen even when
        // the configuration did not change, to undo this.
        *self.running.lock().unwrap() = None;
        let running = self
            .peers()
            .iter()
            .map(|p| uapi::LivePeer {
                config: p.cfg.lock().unwrap().clone(),
                endpoint: *p.endpoint.read().unwrap(),
            })
            .collect();
        for change in uapi::plan_set(req, self.listen_port(), running)? {
            match change {
                uapi::PeerChange::Remove(key) => self.remove_peer(&key).await,
                uapi::PeerChange::Apply(cfg) => {
                    let res = match self.peer_by_key(&cfg.public_key) {
                        Some(p) => self.update_peer(&p, *cfg).await,
                        None => self.add_peer(*cfg).await,
                    };
                    res.map_err(|e| uapi::UapiError {
                        errno: uapi::EINVAL,
                        message: e.to_string(),
                    })?;
                }
            }
        }
        Ok(())
    }
}
