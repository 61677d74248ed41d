//! The quorum resource of a two-node cluster (MSCS rule 3): when one of two members is
//! left, it continues only if it holds the witness. Holding is decided once per view, so
//! two survivors of the same view can never both continue.

use crate::view::MemberId;
use std::io::Write;
use std::path::PathBuf;

/// A quorum resource. `acquire` must be idempotent for the holder and exclusive per
/// `base_view`: once one member holds it for a view, every other member is refused.
pub trait Witness: Send {
    /// Tries to take the witness for the regroup of view `base_view`.
    fn acquire(&mut self, base_view: u64, me: MemberId) -> bool;
}

/// No quorum resource: a two-node cluster cannot continue with one node.
#[derive(Debug, Default)]
pub struct NoWitness;

impl Witness for NoWitness {
    fn acquire(&mut self, _base_view: u64, _me: MemberId) -> bool {
        false
    }
}

/// A lock file per view on a path both nodes share (a shared disk or NFS with working
/// exclusive create): `DIR/witness-<view>` is created exclusively and names its holder.
#[derive(Debug)]
pub struct FileWitness {
    dir: PathBuf,
}

impl FileWitness {
    /// Uses `dir` (created if missing).
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }
}

impl Witness for FileWitness {
    fn acquire(&mut self, base_view: u64, me: MemberId) -> bool {
        let path = self.dir.join(format!("witness-{base_view}"));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                let ok = writeln!(f, "{}", me.0).and_then(|_| f.sync_all()).is_ok();
                if !ok {
                    tracing::warn!(path = %path.display(), "could not write the witness file");
                }
                ok
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .is_some_and(|holder| holder == me.0),
            Err(e) => {
                tracing::warn!(path = %path.display(), "witness unavailable: {e}");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_witness_is_exclusive_per_view_and_idempotent() {
        let dir = std::env::temp_dir().join(format!("ulnet-witness-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut a = FileWitness::new(&dir).unwrap();
        let mut b = FileWitness::new(&dir).unwrap();
        assert!(a.acquire(3, MemberId(1)));
        assert!(a.acquire(3, MemberId(1)), "the holder keeps it");
        assert!(!b.acquire(3, MemberId(2)), "the other survivor is refused");
        assert!(b.acquire(4, MemberId(2)), "a later view is a new decision");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
