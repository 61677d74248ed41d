//! Room on a file system for a file whose size is known before it is written: [`check`].
//!
//! Why: `gensort 18446744073709551615 x.dat` started writing 1.8 ZB and went on until the
//! disk was full. A command that knows the size it will write checks it first, against
//! the room the file system gives ordinary users (what `df` shows as available), and
//! refuses with both figures, touching nothing.
//!
//! ```
//! use ulnet_sortbench::room::{check, Replaced, RoomError};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("records.dat");
//! check(&path, 1000, Replaced::InPlace)?;
//! let huge = u128::from(u64::MAX) * 100;
//! assert!(matches!(check(&path, huge, Replaced::InPlace), Err(RoomError::TooLarge { .. })));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The largest file Linux can hold: `off_t`'s largest value, 2^63 - 1 bytes (9.2 EB).
pub const FILE_BYTES_MAX: u128 = i64::MAX as u128;

/// How a file already at the path is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replaced {
    /// Truncated, then written (gensort): its blocks are free again before the writing.
    InPlace,
    /// Kept until the new file is complete and renamed over it (sort): its blocks are no
    /// room for the new one.
    AfterRename,
}

/// Why a file of the size asked for does not fit.
#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    /// More bytes than any file can hold.
    #[error("{} would need {}, more than a file can hold ({})", path.display(), decimal(*needed), decimal(FILE_BYTES_MAX))]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Bytes it would need.
        needed: u128,
    },
    /// The file system has less room than the file needs.
    #[error(
        "{} needs {}, the file system at {} has {} free{}: free some space or choose another place",
        path.display(),
        decimal(*needed),
        mount.display(),
        decimal(u128::from(*available)),
        if *reclaimed > 0 { format!(" (counting the {} the file holds now)", decimal(u128::from(*reclaimed))) } else { String::new() }
    )]
    NoRoom {
        /// The file.
        path: PathBuf,
        /// Bytes it needs.
        needed: u128,
        /// Where the file system is mounted.
        mount: PathBuf,
        /// Bytes free for it: the file system's room for ordinary users, plus `reclaimed`.
        available: u64,
        /// Bytes the file at the path holds now and gives back before the writing
        /// ([`Replaced::InPlace`]).
        reclaimed: u64,
    },
}

/// Checks that a file of `needed` bytes fits at `path`. Nothing to check (so `Ok`) when the
/// path is not a regular file (a device such as `/dev/null`, a pipe) or when its file
/// system cannot be asked (its directory does not exist: creating the file then fails with
/// its own message).
pub fn check(path: &Path, needed: u128, replaced: Replaced) -> Result<(), RoomError> {
    if needed > FILE_BYTES_MAX {
        return Err(RoomError::TooLarge { path: path.to_path_buf(), needed });
    }
    let (asked, reclaimed) = match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return Ok(()),
        // st_blocks counts 512-byte units whatever the file system's block size.
        Ok(m) if replaced == Replaced::InPlace => (path.to_path_buf(), m.blocks().saturating_mul(512)),
        Ok(_) => (path.to_path_buf(), 0),
        Err(_) => (directory_of(path), 0),
    };
    let Ok(fs) = rustix::fs::statvfs(&asked) else { return Ok(()) };
    let available = fs.f_bavail.saturating_mul(fs.f_frsize).saturating_add(reclaimed);
    if needed <= u128::from(available) {
        return Ok(());
    }
    Err(RoomError::NoRoom { path: path.to_path_buf(), needed, mount: mount_point(&asked), available, reclaimed })
}

/// The directory a new file at `path` goes in.
fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Where the file system holding `path` is mounted: its highest ancestor on the same
/// device (`path` itself when that cannot be told).
fn mount_point(path: &Path) -> PathBuf {
    let Ok(mut at) = path.canonicalize() else { return path.to_path_buf() };
    let Ok(device) = std::fs::metadata(&at).map(|m| m.dev()) else { return at };
    while let Some(parent) = at.parent() {
        if std::fs::metadata(parent).map_or(true, |m| m.dev() != device) {
            break;
        }
        at = parent.to_path_buf();
    }
    at
}

/// `bytes` in decimal units with one decimal, as `df -H` shows them: "999 B", "80.0 GB",
/// "1.8 ZB".
pub fn decimal(bytes: u128) -> String {
    const UNITS: [&str; 8] = ["kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 999.95 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_df_shows_them() {
        assert_eq!(decimal(0), "0 B");
        assert_eq!(decimal(999), "999 B");
        assert_eq!(decimal(1000), "1.0 kB");
        assert_eq!(decimal(80_000_000_000), "80.0 GB");
        assert_eq!(decimal(999_960), "1.0 MB");
        assert_eq!(decimal(u128::from(u64::MAX) * 100), "1.8 ZB");
        assert_eq!(decimal(FILE_BYTES_MAX), "9.2 EB");
        assert!(decimal(u128::MAX).ends_with(" YB"), "the largest unit takes what is left");
    }

    #[test]
    fn more_than_a_file_holds_is_refused_before_asking_the_file_system() {
        let path = Path::new("/nonexistent/dir/x.dat");
        let err = check(path, FILE_BYTES_MAX + 1, Replaced::InPlace).unwrap_err();
        assert!(matches!(err, RoomError::TooLarge { .. }));
        assert!(err.to_string().contains("more than a file can hold (9.2 EB)"), "{err}");
        assert!(check(path, FILE_BYTES_MAX, Replaced::InPlace).is_ok(), "no directory: nothing to check");
    }

    #[test]
    fn more_than_the_file_system_has_is_refused_with_both_figures() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.dat");
        let err = check(&path, FILE_BYTES_MAX, Replaced::InPlace).unwrap_err();
        let RoomError::NoRoom { available, reclaimed, ref mount, .. } = err else { panic!("{err}") };
        assert_eq!(reclaimed, 0);
        assert!(dir.path().canonicalize().unwrap().starts_with(mount));
        let text = err.to_string();
        assert!(
            text.contains("needs 9.2 EB") && text.contains(&format!("{} free", decimal(available.into()))),
            "{text}"
        );
        assert!(check(&path, 1, Replaced::InPlace).is_ok());
    }

    #[test]
    fn a_file_replaced_in_place_gives_its_blocks_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.dat");
        std::fs::write(&path, vec![1u8; 1 << 20]).unwrap();
        let err = check(&path, FILE_BYTES_MAX, Replaced::InPlace).unwrap_err();
        assert!(matches!(err, RoomError::NoRoom { reclaimed, .. } if reclaimed >= 1 << 20), "{err}");
        assert!(err.to_string().contains("counting the"), "{err}");
        let err = check(&path, FILE_BYTES_MAX, Replaced::AfterRename).unwrap_err();
        assert!(matches!(err, RoomError::NoRoom { reclaimed: 0, .. }), "{err}");
    }

    #[test]
    fn devices_are_not_checked() {
        assert!(check(Path::new("/dev/null"), FILE_BYTES_MAX, Replaced::InPlace).is_ok());
    }

    #[test]
    fn a_file_without_a_directory_part_is_in_the_current_one() {
        assert_eq!(directory_of(Path::new("x.dat")), PathBuf::from("."));
        assert_eq!(directory_of(Path::new("/x.dat")), PathBuf::from("/"));
        assert_eq!(directory_of(Path::new("a/x.dat")), PathBuf::from("a"));
    }
}
