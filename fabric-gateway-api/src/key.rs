//! WireGuard keys in the formats `wg` uses (base64 in files, the CLI and the configuration;
//! hex on the UAPI).
//!
//! The private key type deliberately has no `Display`, no serde impls and a redacted
//! `Debug`, so that it cannot end up in logs, status JSON or panics; it is wiped on drop.

use std::{
    fmt, fs,
    io::Read,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use rand_core::{OsRng, RngCore};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key is not valid base64 of 32 bytes")]
    InvalidBase64,
    #[error("key is not valid hex of 32 bytes")]
    InvalidHex,
    #[error("cannot read private key file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "private key file {path} has mode {mode:04o}; it must be 0600 (or 0400) and owned by the gateway user — run `chmod 600 {path}`"
    )]
    InsecurePermissions { path: PathBuf, mode: u32 },
    #[error(
        "private key file {path} is owned by uid {owner}, not by the gateway user (uid {user}) — run `chown {user} {path}` (or write it as that user)"
    )]
    NotOwner {
        path: PathBuf,
        owner: u32,
        user: u32,
    },
    #[error("private key file {path} does not contain a valid base64 WireGuard key")]
    InvalidKeyFile { path: PathBuf },
    #[error("cannot obtain randomness from the kernel: {0}")]
    Random(#[source] rand_core::Error),
}

/// A Curve25519 public key. Serialized as base64, as `wg` prints it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    pub fn from_bytes(b: [u8; 32]) -> Self {
        Self(b)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn from_base64(s: &str) -> Result<Self, KeyError> {
        decode_b64_32(s).map(Self)
    }

    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        decode_hex_32(s).map(Self)
    }

    pub fn to_base64(&self) -> String {
        B64.encode(self.0)
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn to_dalek(&self) -> x25519_dalek::PublicKey {
        x25519_dalek::PublicKey::from(self.0)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

impl std::str::FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_base64(s)
    }
}

impl serde::Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_base64())
    }
}

impl<'de> serde::Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::from_base64(&s).map_err(|_| {
            serde::de::Error::custom(format!(
                "public_key {s:?} is not a base64-encoded 32-byte WireGuard key"
            ))
        })
    }
}

/// A Curve25519 private key. Zeroed on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct PrivateKey([u8; 32]);

impl PrivateKey {
    /// A fresh clamped key, like `wg genkey`.
    pub fn generate() -> Result<Self, KeyError> {
        let mut key = Self([0u8; 32]);
        OsRng.try_fill_bytes(&mut key.0).map_err(KeyError::Random)?;
        key.0[0] &= 248;
        key.0[31] = (key.0[31] & 127) | 64;
        Ok(key)
    }

    pub fn from_base64(s: &str) -> Result<Self, KeyError> {
        decode_b64_32(s).map(Self)
    }

    /// Base64 form, only for `genkey` output and key Secrets; never log it.
    pub fn to_base64(&self) -> String {
        B64.encode(self.0)
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey(x25519_dalek::PublicKey::from(&self.to_dalek()).to_bytes())
    }

    pub fn to_dalek(&self) -> x25519_dalek::StaticSecret {
        x25519_dalek::StaticSecret::from(self.0)
    }

    /// Reads a key file written by `wg genkey`/`fabric-gateway genkey`.
    /// Refuses files readable or writable by group/other, or owned by another user than this
    /// process's, because a leaked gateway key lets anyone impersonate the whole cluster (and
    /// whoever owns the file may change its mode or contents).
    pub fn read_file(path: &Path) -> Result<Self, KeyError> {
        let io = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = fs::File::open(path).map_err(io)?;
        let meta = f.metadata().map_err(io)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let user = unsafe { libc::geteuid() };
        if meta.uid() != user {
            return Err(KeyError::NotOwner {
                path: path.to_path_buf(),
                owner: meta.uid(),
                user,
            });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::InsecurePermissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let mut s = Zeroizing::new(String::new());
        f.read_to_string(&mut s).map_err(io)?;
        Self::from_base64(s.trim()).map_err(|_| KeyError::InvalidKeyFile {
            path: path.to_path_buf(),
        })
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

fn decode_b64_32(s: &str) -> Result<[u8; 32], KeyError> {
    let v = Zeroizing::new(B64.decode(s.trim()).map_err(|_| KeyError::InvalidBase64)?);
    v.as_slice().try_into().map_err(|_| KeyError::InvalidBase64)
}

/// 32 bytes from 64 hex digits (either case), as the UAPI writes keys.
pub fn decode_hex_32(s: &str) -> Result<[u8; 32], KeyError> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).map_err(|_| KeyError::InvalidHex)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn known_vector_matches_wg_pubkey() {
        // Produced with `echo <priv> | wg pubkey`.
        let k = PrivateKey::from_base64("yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=").unwrap();
        assert_eq!(
            k.public_key().to_base64(),
            "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
        );
    }

    #[test]
    fn hex_roundtrip_and_rejects_garbage() {
        let k = PrivateKey::generate().unwrap().public_key();
        assert_eq!(PublicKey::from_hex(&k.to_hex()).unwrap(), k);
        assert_eq!(PublicKey::from_hex(&k.to_hex().to_uppercase()).unwrap(), k);
        assert!(PublicKey::from_hex("zz").is_err());
        assert!(PublicKey::from_hex(&"g".repeat(64)).is_err());
        assert!(PublicKey::from_hex(&"a".repeat(66)).is_err());
        assert!(PublicKey::from_base64("AAAA").is_err());
    }

    #[test]
    fn public_keys_serialize_as_base64() {
        let k = PrivateKey::generate().unwrap().public_key();
        let j = serde_json::to_string(&k).unwrap();
        assert_eq!(j, format!("\"{}\"", k.to_base64()));
        assert_eq!(serde_json::from_str::<PublicKey>(&j).unwrap(), k);
        let e = serde_json::from_str::<PublicKey>("\"nope\"").unwrap_err();
        assert!(e.to_string().contains("base64"), "{e}");
    }

    #[test]
    fn generated_keys_are_clamped_and_distinct() {
        let a = PrivateKey::generate().unwrap();
        let b = PrivateKey::generate().unwrap();
        assert_ne!(a.to_base64(), b.to_base64());
        assert_eq!(a.0[0] & 7, 0);
        assert_eq!(a.0[31] & 0xc0, 0x40);
    }

    #[test]
    fn debug_does_not_leak_private_key() {
        let k = PrivateKey::generate().unwrap();
        let dbg = format!("{k:?}");
        assert!(!dbg.contains(&k.to_base64()));
        assert!(dbg.contains("redacted"));
    }

    #[test]
    fn key_file_permissions_are_enforced() {
        let dir = std::env::temp_dir().join(format!("fgw-api-key-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        let k = PrivateKey::generate().unwrap();
        let mut f = fs::File::create(&p).unwrap();
        writeln!(f, "{}", k.to_base64()).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        let err = PrivateKey::read_file(&p).unwrap_err();
        assert!(
            matches!(err, KeyError::InsecurePermissions { mode: 0o644, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("chmod 600"));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        let read = PrivateKey::read_file(&p).unwrap();
        assert_eq!(read.public_key(), k.public_key());
        // Another user's file: refused even with a safe mode (root could read it, and did).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
            let err = PrivateKey::read_file(&p).unwrap_err();
            assert!(
                matches!(
                    err,
                    KeyError::NotOwner {
                        owner: 65534,
                        user: 0,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("chown 0"), "{err}");
            std::os::unix::fs::chown(&p, Some(0), None).unwrap();
        }
        fs::write(&p, "not a key").unwrap();
        assert!(matches!(
            PrivateKey::read_file(&p),
            Err(KeyError::InvalidKeyFile { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
