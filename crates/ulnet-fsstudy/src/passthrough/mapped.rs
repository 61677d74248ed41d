//! Large reads served from a mapping of the backing file, so the data is copied once (by
//! the kernel, from the backing file's page cache into the reader's buffer) instead of
//! twice (into the pass-through's buffer, then out of it).
//!
//! A file is mapped whole, read-only and shared, at its first read of [`MAP_MIN`] bytes or
//! more, and mapped again when a read reaches past the mapping (the file grew); it is
//! unmapped when its open instance is released. A read never reaches past the file's size
//! at the time of the read (checked with `fstat` first). Should another process shrink the
//! backing file between that check and the kernel's copy, the copy faults inside the
//! kernel, which fails the reply: the reader gets EIO, nothing crashes. A descriptor that
//! cannot be mapped (opened write-only, or a file system without mmap) is read with
//! `pread`.

use memmap2::{Mmap, MmapOptions};
use std::os::fd::OwnedFd;
use std::sync::{Arc, RwLock};

/// Reads smaller than this are copied with `pread`: below it, setting up the mapping costs
/// more than the copy it saves.
pub const MAP_MIN: usize = 64 << 10;

/// The mapping of one open file.
#[derive(Debug, Default)]
pub struct FileMap {
    state: RwLock<State>,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Unmapped,
    Mapped(Arc<Mmap>),
    /// Mapping failed once: use `pread`.
    Unmappable,
}

impl FileMap {
    /// A mapping covering bytes up to `end` of `fd`, whose size is `size` (>= `end`), for a
    /// read of `len` bytes; `None` to read with `pread`.
    pub fn covering(&self, fd: &OwnedFd, end: u64, size: u64, len: usize) -> Option<Arc<Mmap>> {
        match &*self.state.read().unwrap_or_else(|e| e.into_inner()) {
            State::Mapped(m) if m.len() as u64 >= end => return Some(m.clone()),
            State::Unmappable => return None,
            State::Unmapped if len < MAP_MIN => return None,
            _ => {}
        }
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        let len = usize::try_from(size).ok()?;
        // SAFETY: the mapping is read-only and only ever read by the kernel (the reply's
        // copy to the reader), never by this process's code: a backing file changed or
        // shrunk underneath is a fault the kernel turns into a failed reply (see the
        // module documentation), not undefined behaviour in safe Rust.
        match unsafe { MmapOptions::new().len(len).map(fd) } {
            Ok(m) => {
                let m = Arc::new(m);
                *state = State::Mapped(m.clone());
                Some(m)
            }
            Err(e) => {
                tracing::debug!("reading with pread: mapping failed: {e}");
                *state = State::Unmappable;
                None
            }
        }
    }
}
