//! Snapshots of a directory tree (thesis 9.3.1): one entry per file, directory, link or
//! other node, with its size, its times (modified, accessed, changed, created where the
//! file system keeps it), its depth below the root, and for directories the files and
//! subdirectories directly inside, written as a file of the study's format.
//!
//! The walk does not follow symbolic links. Entries it cannot read (permissions, a file
//! removed during the walk) are counted, the first few logged, and left out.

use crate::format::{Entry, FileKind, NodeKind, Record};
use crate::writer::{TraceWriter, WriteError};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::UNIX_EPOCH;

/// Unreadable entries logged one by one before the rest are only counted.
const UNREADABLE_LOGGED: u64 = 10;

/// Why a snapshot could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The root cannot be read.
    #[error("{path}: {source} (give a readable directory)")]
    Root {
        /// The directory.
        path: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The snapshot file.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// What a snapshot holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotSummary {
    /// Regular files.
    pub files: u64,
    /// Directories (the root included).
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Devices, fifos and sockets.
    pub others: u64,
    /// Bytes of the regular files.
    pub bytes: u64,
    /// Deepest entry below the root.
    pub max_depth: u32,
    /// Entries that could not be read.
    pub unreadable: u64,
}

fn ns(t: std::io::Result<std::time::SystemTime>) -> i64 {
    match t.map(|t| t.duration_since(UNIX_EPOCH)) {
        Ok(Ok(d)) => d.as_nanos().min(i64::MAX as u128) as i64,
        Ok(Err(e)) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
        Err(_) => 0,
    }
}

/// The entry of one walked node (directory counts filled in by the caller).
fn entry(root: &Path, e: &walkdir::DirEntry, md: &std::fs::Metadata) -> Entry {
    let kind = NodeKind::of(md.file_type());
    Entry {
        kind: kind as u8,
        depth: e.depth() as u32,
        size: md.len(),
        modified_ns: ns(md.modified()),
        accessed_ns: ns(md.accessed()),
        changed_ns: md.ctime().saturating_mul(1_000_000_000).saturating_add(md.ctime_nsec()),
        created_ns: ns(md.created()),
        files: 0,
        dirs: 0,
        path: e.path().strip_prefix(root).unwrap_or(e.path()).to_string_lossy().into_owned(),
    }
}

/// Walks `dir` and writes its snapshot to `output`.
pub fn take(dir: &Path, output: &Path) -> Result<SnapshotSummary, SnapshotError> {
    std::fs::read_dir(dir).map_err(|source| SnapshotError::Root { path: dir.display().to_string(), source })?;
    let mut file = TraceWriter::create(output, FileKind::Snapshot, crate::clock::mono_ns())?;
    let mut summary = SnapshotSummary::default();
    // Children come before their directory, so each directory's counts are complete when
    // it is written: `counts[d]` holds the (files, dirs) seen at depth d since the last
    // directory at depth d - 1 was written.
    let mut counts: Vec<(u32, u32)> = vec![(0, 0)];
    for item in walkdir::WalkDir::new(dir).follow_links(false).contents_first(true) {
        let walked =
            item.map_err(|e| e.to_string()).and_then(|e| e.metadata().map(|md| (e, md)).map_err(|e| e.to_string()));
        let (e, md) = match walked {
            Ok(found) => found,
            Err(why) => {
                summary.unreadable += 1;
                if summary.unreadable <= UNREADABLE_LOGGED {
                    tracing::warn!("snapshot: left out: {why}");
                }
                continue;
            }
        };
        let mut entry = entry(dir, &e, &md);
        let depth = e.depth();
        if counts.len() < depth + 2 {
            counts.resize(depth + 2, (0, 0));
        }
        if md.is_dir() {
            (entry.files, entry.dirs) = std::mem::take(&mut counts[depth + 1]);
            counts[depth].1 += 1;
            summary.dirs += 1;
        } else {
            counts[depth].0 += u32::from(md.is_file());
            match NodeKind::of(md.file_type()) {
                NodeKind::File => {
                    summary.files += 1;
                    summary.bytes += md.len();
                }
                NodeKind::Symlink => summary.symlinks += 1,
                _ => summary.others += 1,
            }
        }
        summary.max_depth = summary.max_depth.max(depth as u32);
        file.push(&Record::Entry(entry), 0)?;
    }
    file.finish(0)?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_records_every_node_with_its_counts_and_depth() {
        let root = tempfile::tempdir().expect("temp dir");
        let r = root.path();
        std::fs::create_dir_all(r.join("a/b")).expect("mkdir");
        std::fs::write(r.join("top.txt"), b"12345").expect("write");
        std::fs::write(r.join("a/x.c"), vec![0u8; 1000]).expect("write");
        std::fs::write(r.join("a/b/y.h"), b"").expect("write");
        std::os::unix::fs::symlink("x.c", r.join("a/link")).expect("symlink");
        let out = tempfile::tempdir().expect("temp dir");
        let path = out.path().join("s.fssnap");
        let summary = take(r, &path).expect("snapshot");
        assert_eq!(
            summary,
            SnapshotSummary { files: 3, dirs: 3, symlinks: 1, others: 0, bytes: 1005, max_depth: 3, unreadable: 0 }
        );
        let file = crate::reader::read_path(&path).expect("reads");
        assert_eq!(file.header.kind, FileKind::Snapshot);
        let entries: Vec<Entry> =
            file.records.into_iter().filter_map(|r| if let Record::Entry(e) = r { Some(e) } else { None }).collect();
        let by_path = |p: &str| entries.iter().find(|e| e.path == p).unwrap_or_else(|| panic!("{p} in {entries:?}"));
        assert_eq!((by_path("").files, by_path("").dirs, by_path("").depth), (1, 1, 0));
        assert_eq!((by_path("a").files, by_path("a").dirs), (1, 1));
        assert_eq!((by_path("a/b").files, by_path("a/b").dirs, by_path("a/b").depth), (1, 0, 2));
        assert_eq!((by_path("a/x.c").size, by_path("a/b/y.h").depth), (1000, 3));
        assert_eq!(by_path("a/link").kind, NodeKind::Symlink as u8);
        assert!(by_path("top.txt").modified_ns > 1_600_000_000_000_000_000);
    }
}
