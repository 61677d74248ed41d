//! What snapshots hold (thesis 9.5): the size distribution of regular files by count and
//! by bytes, the types (file-name extensions) that dominate each, directory depth and
//! size, and the ages the file times give (with the share whose last modification is
//! later than their last access, one of the inconsistencies the thesis found).

use super::dist::{cdf_points, percentiles, share, Percentiles};
use super::Snapshot;
use crate::format::NodeKind;
use serde::Serialize;
use std::collections::HashMap;

/// Types listed in each table.
const TYPES_LISTED: usize = 12;

/// One file type.
#[derive(Clone, Debug, Serialize)]
pub struct TypeRow {
    /// The extension ("(none)" for none).
    pub ext: String,
    /// Files.
    pub files: u64,
    /// Bytes.
    pub bytes: u64,
    /// Share of all files.
    pub files_share: f64,
    /// Share of all bytes.
    pub bytes_share: f64,
}

/// One size class.
#[derive(Clone, Debug, Serialize)]
pub struct SizeClass {
    /// Files up to this many bytes (from the previous class's bound).
    pub up_to: u64,
    /// Share of the files.
    pub files_share: f64,
    /// Share of the bytes.
    pub bytes_share: f64,
}

/// The snapshots' content.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Content {
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Bytes of the regular files.
    pub bytes: u64,
    /// File sizes.
    pub size: Percentiles,
    /// Sizes by class, by count and by bytes.
    pub size_classes: Vec<SizeClass>,
    /// The types with the most files.
    pub types_by_files: Vec<TypeRow>,
    /// The types with the most bytes.
    pub types_by_bytes: Vec<TypeRow>,
    /// Depth of files below the root.
    pub depth: Percentiles,
    /// Entries per directory.
    pub dir_entries: Percentiles,
    /// Days since last modification, at the snapshot.
    pub modified_age_days: Percentiles,
    /// Days since last access.
    pub accessed_age_days: Percentiles,
    /// Share of files modified later than last accessed.
    pub modified_after_access_share: f64,
    /// Share of files whose creation time the file system keeps.
    pub created_known_share: f64,
    /// Every regular file's size (for the tail test).
    #[serde(skip)]
    pub sizes: Vec<f64>,
    /// Curves for the figures.
    pub curves: Vec<super::Curve>,
}

fn ext(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name.rsplit_once('.') {
        Some((stem, e)) if !stem.is_empty() && !e.is_empty() && e.len() <= 10 => e.to_ascii_lowercase(),
        _ => "(none)".into(),
    }
}

/// The content of every snapshot together; `None` without snapshots.
pub fn content(snapshots: &[Snapshot]) -> Option<Content> {
    if snapshots.is_empty() {
        return None;
    }
    let mut c = Content::default();
    let mut types: HashMap<String, (u64, u64)> = HashMap::new();
    let (mut depths, mut entries, mut modified, mut accessed) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut later, mut created) = (0u64, 0u64);
    for snap in snapshots {
        let now = snap.taken_real_ns as f64;
        for e in &snap.entries {
            match NodeKind::from_u8(e.kind) {
                Some(NodeKind::File) => {
                    c.files += 1;
                    c.bytes = c.bytes.saturating_add(e.size);
                    c.sizes.push(e.size as f64);
                    let t = types.entry(ext(&e.path)).or_default();
                    (t.0, t.1) = (t.0 + 1, t.1.saturating_add(e.size));
                    depths.push(f64::from(e.depth));
                    modified.push((now - e.modified_ns as f64) / 86_400e9);
                    accessed.push((now - e.accessed_ns as f64) / 86_400e9);
                    later += u64::from(e.modified_ns > e.accessed_ns);
                    created += u64::from(e.created_ns != 0);
                }
                Some(NodeKind::Dir) => {
                    c.dirs += 1;
                    entries.push(f64::from(e.files) + f64::from(e.dirs));
                }
                Some(NodeKind::Symlink) => c.symlinks += 1,
                _ => {}
            }
        }
    }
    c.size = percentiles(&c.sizes);
    c.size_classes = size_classes(&c.sizes, c.bytes);
    let mut rows: Vec<TypeRow> = types
        .into_iter()
        .map(|(ext, (files, bytes))| TypeRow {
            ext,
            files,
            bytes,
            files_share: share(files, c.files),
            bytes_share: share(bytes, c.bytes),
        })
        .collect();
    rows.sort_by(|a, b| b.files.cmp(&a.files).then(a.ext.cmp(&b.ext)));
    c.types_by_files = rows.iter().take(TYPES_LISTED).cloned().collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ext.cmp(&b.ext)));
    c.types_by_bytes = rows.into_iter().take(TYPES_LISTED).collect();
    c.depth = percentiles(&depths);
    c.dir_entries = percentiles(&entries);
    c.modified_age_days = percentiles(&modified);
    c.accessed_age_days = percentiles(&accessed);
    c.modified_after_access_share = share(later, c.files);
    c.created_known_share = share(created, c.files);
    c.curves.push(super::Curve::cdf(
        "snapshot-sizes",
        "File sizes in the snapshots, by files and by bytes",
        "file size (bytes)",
        vec![
            ("by files".into(), cdf_points(&c.sizes.iter().map(|s| (*s, 1.0)).collect::<Vec<_>>(), 400)),
            ("by bytes".into(), cdf_points(&c.sizes.iter().map(|s| (*s, *s)).collect::<Vec<_>>(), 400)),
        ],
    ));
    Some(c)
}

/// Shares of files and bytes in classes of sizes 8 times apart, from 512 B to 1 GiB.
fn size_classes(sizes: &[f64], bytes: u64) -> Vec<SizeClass> {
    let mut bounds: Vec<u64> = (0..=7).map(|i| 512u64 << (3 * i)).collect();
    bounds.push(u64::MAX);
    let mut lower = -1.0;
    bounds
        .into_iter()
        .map(|up_to| {
            let in_class = sizes.iter().filter(|s| **s > lower && **s <= up_to as f64);
            let (n, b) = in_class.fold((0u64, 0f64), |acc, s| (acc.0 + 1, acc.1 + s));
            lower = up_to as f64;
            SizeClass {
                up_to,
                files_share: share(n, sizes.len() as u64),
                bytes_share: if bytes == 0 { 0.0 } else { b / bytes as f64 },
            }
        })
        .collect()
}
