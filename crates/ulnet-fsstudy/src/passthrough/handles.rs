//! Open files and directory listings of the pass-through. A handle is one open (or
//! create, or opendir) — the thesis's FileObject — and its number is the trace's handle.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// An open backing file.
#[derive(Debug)]
pub struct OpenFile {
    /// The backing file, opened with the caller's flags.
    pub fd: OwnedFd,
    /// The inode id.
    pub file: u64,
    /// The mapping large reads are served from.
    pub map: super::mapped::FileMap,
}

/// A directory entry as listed.
#[derive(Clone, Debug)]
pub struct Listed {
    /// Inode number to report (the mount's id when the kernel holds the file).
    pub ino: u64,
    /// Its type.
    pub kind: fuser::FileType,
    /// Its name.
    pub name: OsString,
}

/// An open directory listing: the entries as read at `opendir` (and again when the
/// listing is rewound to offset 0), so offsets stay meaningful between calls.
#[derive(Debug)]
pub struct OpenDir {
    /// The backing directory, opened for reading.
    pub fd: OwnedFd,
    /// The inode id.
    pub file: u64,
    /// The entries, read lazily at the first readdir from offset 0.
    pub entries: Mutex<Option<Vec<Listed>>>,
}

/// The handle tables, shared by the session's threads.
#[derive(Default)]
pub struct Handles {
    files: RwLock<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, Arc<OpenDir>>>,
    next: AtomicU64,
}

impl Handles {
    fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Keeps an open file; returns its handle.
    pub fn add_file(&self, file: OpenFile) -> u64 {
        let h = self.next();
        self.files.write().unwrap_or_else(|e| e.into_inner()).insert(h, Arc::new(file));
        h
    }

    /// The open file of handle `h`.
    pub fn file(&self, h: u64) -> Option<Arc<OpenFile>> {
        self.files.read().unwrap_or_else(|e| e.into_inner()).get(&h).cloned()
    }

    /// Forgets handle `h` and returns its file.
    pub fn remove_file(&self, h: u64) -> Option<Arc<OpenFile>> {
        self.files.write().unwrap_or_else(|e| e.into_inner()).remove(&h)
    }

    /// Keeps an open directory; returns its handle.
    pub fn add_dir(&self, dir: OpenDir) -> u64 {
        let h = self.next();
        self.dirs.lock().unwrap_or_else(|e| e.into_inner()).insert(h, Arc::new(dir));
        h
    }

    /// The open directory of handle `h`.
    pub fn dir(&self, h: u64) -> Option<Arc<OpenDir>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner()).get(&h).cloned()
    }

    /// Forgets directory handle `h`.
    pub fn remove_dir(&self, h: u64) -> Option<Arc<OpenDir>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner()).remove(&h)
    }

    /// Files and directories open now.
    pub fn open_count(&self) -> usize {
        self.files.read().unwrap_or_else(|e| e.into_inner()).len()
            + self.dirs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
