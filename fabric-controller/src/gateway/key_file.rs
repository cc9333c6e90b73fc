//! The gateway's private key file, kept equal to the key Secret.
//!
//! The operator writes the file when the Secret's key is not the one it last wrote (compared by
//! public key) or when the file is no longer the one it wrote (compared by `stat`). It neither
//! keeps the key's text nor reads the file back on every pass: only once, when it starts, to
//! adopt a file that already holds the key (a restarted operator rewrites nothing).
use std::{
    io::Write as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use fabric_gateway_api::{PrivateKey, PublicKey};
use zeroize::Zeroizing;

/// What `stat` says about the file we wrote; a change means someone else touched it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileId {
    fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// What happened to the key file in one [`KeyFile::sync`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Synced {
    /// The file already holds this key.
    Unchanged,
    /// Found holding this key at the first sync (left by an earlier operator): not written.
    Adopted,
    /// Written: first time, or the file was changed or removed behind our back.
    Written,
    /// Written with a key other than the one written before: the gateway must take it up.
    Rotated,
}

pub struct KeyFile {
    path: PathBuf,
    written: Option<(PublicKey, FileId)>,
}

impl KeyFile {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            written: None,
        }
    }

    pub fn sync(&mut self, key: &PrivateKey) -> std::io::Result<Synced> {
        let public = key.public_key();
        let now = FileId::of(&self.path);
        if self.written.is_none()
            && let Some(id) = now
            && PrivateKey::read_file(&self.path).is_ok_and(|k| k.public_key() == public)
        {
            self.written = Some((public, id));
            return Ok(Synced::Adopted);
        }
        let before = self.written.map(|(k, _)| k);
        if let Some((k, id)) = self.written
            && k == public
            && Some(id) == now
        {
            return Ok(Synced::Unchanged);
        }
        let mut text = Zeroizing::new(key.to_base64());
        text.push('\n');
        write_0600(&self.path, text.as_bytes())?;
        let id = FileId::of(&self.path).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "{} vanished right after it was written",
                    self.path.display()
                ),
            )
        })?;
        self.written = Some((public, id));
        Ok(match before {
            Some(k) if k != public => Synced::Rotated,
            _ => Synced::Written,
        })
    }
}

/// Written beside and renamed over, so the gateway never reads half a key; 0600 from the
/// start (a fresh temporary file, never one left with another mode).
fn write_0600(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn written_once_per_key_and_again_when_changed_behind_our_back() {
        let dir = std::env::temp_dir().join(format!("fabric-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gw.key");
        let (a, b) = (
            PrivateKey::generate().unwrap(),
            PrivateKey::generate().unwrap(),
        );
        let mut f = KeyFile::new(path.clone());
        let _ = std::fs::remove_file(&path);
        assert_eq!(f.sync(&a).unwrap(), Synced::Written);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            PrivateKey::read_file(&path).unwrap().public_key(),
            a.public_key()
        );
        // Same key, file untouched: nothing written (the file is not read either: garbage of
        // the same size and time would go unnoticed, which is why only stat decides).
        assert_eq!(f.sync(&a).unwrap(), Synced::Unchanged);
        assert_eq!(f.sync(&b).unwrap(), Synced::Rotated);
        assert_eq!(
            PrivateKey::read_file(&path).unwrap().public_key(),
            b.public_key()
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(f.sync(&b).unwrap(), Synced::Written);
        std::fs::write(&path, "someone else's key, written over ours\n").unwrap();
        assert_eq!(f.sync(&b).unwrap(), Synced::Written);
        assert_eq!(
            PrivateKey::read_file(&path).unwrap().public_key(),
            b.public_key()
        );
        // A restarted operator finds the key it would write and leaves the file alone (its
        // inode and time stay); one that finds another key writes its own.
        let before = FileId::of(&path);
        let mut again = KeyFile::new(path.clone());
        assert_eq!(again.sync(&b).unwrap(), Synced::Adopted);
        assert_eq!(FileId::of(&path), before);
        assert_eq!(again.sync(&b).unwrap(), Synced::Unchanged);
        // A key rotated after the adoption is one the gateway must take up.
        let mut rotated = KeyFile::new(path.clone());
        assert_eq!(rotated.sync(&b).unwrap(), Synced::Adopted);
        assert_eq!(rotated.sync(&a).unwrap(), Synced::Rotated);
        assert_eq!(rotated.sync(&b).unwrap(), Synced::Rotated);
        let mut other = KeyFile::new(path.clone());
        assert_eq!(other.sync(&a).unwrap(), Synced::Written);
        assert_eq!(
            PrivateKey::read_file(&path).unwrap().public_key(),
            a.public_key()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
