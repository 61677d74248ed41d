//! The pass-through's inodes: each file the kernel knows through the mount is held open
//! with an `O_PATH` descriptor of the backing file, so it keeps working however it is
//! renamed or moved, and operations run relative to it (`*at` calls).
//!
//! Ids are the FUSE node ids and the trace's file ids at once: a counter, never reused,
//! so a file's id in a trace means one file. A backing file (device, inode number) has one
//! id while the kernel holds a reference to it; when its last name is removed, the link
//! from (device, inode number) to the id is cut, so a new file that gets the same inode
//! number gets a new id.

use crate::format::NodeKind;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// The id of the mount's root (FUSE's root node id).
pub const ROOT_ID: u64 = 1;

/// A backing file the kernel holds a reference to.
#[derive(Debug)]
pub struct Inode {
    /// The pass-through's id.
    pub id: u64,
    /// `O_PATH` descriptor of the backing file.
    pub fd: OwnedFd,
    /// What it is.
    pub kind: NodeKind,
    /// Device and inode number of the backing file.
    pub key: (u64, u64),
}

struct Entry {
    inode: Arc<Inode>,
    /// Lookups the kernel has not forgotten.
    lookups: u64,
    /// The path below the root it was first met at (for names in the trace; not updated by
    /// renames of directories above it).
    path: String,
}

struct Table {
    by_id: HashMap<u64, Entry>,
    by_key: HashMap<(u64, u64), u64>,
    next_id: u64,
}

/// The inode table; shared by the session's threads.
pub struct Inodes {
    table: Mutex<Table>,
}

/// What [`Inodes::add_lookup`] found.
pub struct Looked {
    /// The inode.
    pub inode: Arc<Inode>,
    /// It is new to the table: name it in the trace.
    pub new: bool,
    /// Its path below the root.
    pub path: String,
}

impl Inodes {
    /// A table holding the root.
    pub fn new(root_fd: OwnedFd, root_key: (u64, u64)) -> Self {
        let root = Arc::new(Inode { id: ROOT_ID, fd: root_fd, kind: NodeKind::Dir, key: root_key });
        let mut by_id = HashMap::new();
        by_id.insert(ROOT_ID, Entry { inode: root, lookups: 1, path: String::new() });
        let by_key = HashMap::from([(root_key, ROOT_ID)]);
        Inodes { table: Mutex::new(Table { by_id, by_key, next_id: ROOT_ID + 1 }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic in another thread's handler leaves the table consistent (every change is
        // a single insert or remove), so a poisoned lock is used as it is.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The inode with this id.
    pub fn get(&self, id: u64) -> Option<Arc<Inode>> {
        self.lock().by_id.get(&id).map(|e| e.inode.clone())
    }

    /// The path of the inode with this id.
    pub fn path(&self, id: u64) -> Option<String> {
        self.lock().by_id.get(&id).map(|e| e.path.clone())
    }

    /// The id of the backing file `key`, if the kernel holds it.
    pub fn id_of(&self, key: (u64, u64)) -> Option<u64> {
        self.lock().by_key.get(&key).copied()
    }

    /// Counts a lookup of the backing file `key` reached as `name` in `parent`: the inode
    /// it already has, or a new one holding `fd`.
    pub fn add_lookup(&self, key: (u64, u64), kind: NodeKind, fd: OwnedFd, parent: u64, name: &str) -> Looked {
        let mut t = self.lock();
        if let Some(entry) = t.by_key.get(&key).copied().and_then(|id| t.by_id.get_mut(&id)) {
            entry.lookups += 1;
            return Looked { inode: entry.inode.clone(), new: false, path: entry.path.clone() };
        }
        let id = t.next_id;
        t.next_id += 1;
        let parent_path = t.by_id.get(&parent).map(|e| e.path.as_str()).unwrap_or("");
        let path = if parent_path.is_empty() { name.to_string() } else { format!("{parent_path}/{name}") };
        let inode = Arc::new(Inode { id, fd, kind, key });
        t.by_id.insert(id, Entry { inode: inode.clone(), lookups: 1, path: path.clone() });
        t.by_key.insert(key, id);
        Looked { inode, new: true, path }
    }

    /// The kernel forgot `n` lookups of `id`; the inode goes when none is left.
    pub fn forget(&self, id: u64, n: u64) {
        if id == ROOT_ID {
            return;
        }
        let mut t = self.lock();
        let Some(entry) = t.by_id.get_mut(&id) else { return };
        entry.lookups = entry.lookups.saturating_sub(n);
        if entry.lookups == 0 {
            let key = entry.inode.key;
            t.by_id.remove(&id);
            if t.by_key.get(&key) == Some(&id) {
                t.by_key.remove(&key);
            }
        }
    }

    /// The backing file `key` lost its last name: a later file with its inode number is
    /// another file.
    pub fn unlinked(&self, key: (u64, u64)) {
        self.lock().by_key.remove(&key);
    }

    /// `id` was renamed to `name` in `parent`.
    pub fn renamed(&self, id: u64, parent: u64, name: &str) {
        let mut t = self.lock();
        let parent_path = t.by_id.get(&parent).map(|e| e.path.clone()).unwrap_or_default();
        if let Some(entry) = t.by_id.get_mut(&id) {
            entry.path = if parent_path.is_empty() { name.to_string() } else { format!("{parent_path}/{name}") };
        }
    }

    /// Inodes the kernel holds (the root included).
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Only the root is held.
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }
}
