//! The gateway's WireGuard key, when a cluster has none yet.
use std::io::Read;

use base64::Engine;

/// A fresh WireGuard private key (clamped like `wg genkey`), base64.
pub fn generate_private_key() -> std::io::Result<String> {
    let mut k = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut k)?;
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    Ok(base64::engine::general_purpose::STANDARD.encode(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fresh_clamped_and_valid() {
        let a = generate_private_key().unwrap();
        let b = generate_private_key().unwrap();
        assert_ne!(a, b);
        assert!(fabric_api::identity::is_wireguard_key(&a), "{a}");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&a)
            .unwrap();
        assert_eq!(raw[0] & 7, 0);
        assert_eq!(raw[31] & 0xc0, 0x40);
    }
}
