//! [`SharedState`] for the processes of one host: one file in `/dev/shm` that every node
//! process maps, worked on with real atomics.
//!
//! ```text
//! offset    size                 what
//! 0         64                   header: magic, slots                       (written once)
//! 64        64                   role word (the RoleTable), alone on its cache line
//! 128       NODES_MAX × 64       inbox words, one per node, each on its own line
//! 1152      NODES_MAX × 64       load-record slots (seqlock, see slot.rs), one line each
//! ```
//!
//! Each node writes only its own slot and is the only reader of its own inbox; any process
//! reads any slot, compare-and-swaps the role word and writes inboxes (forward only). This
//! is the one-host picture of the thesis' shared state: "own memory" is the node's slot
//! and inbox line, and a one-sided read is a load from another node's line.

use super::{epoch_after, CasOutcome, SharedState, Slot, StateError};
use crate::load::{ClusterKey, LoadRecord, SLOT_WORDS};
use crate::role::{NodeIndex, RoleTable, NODES_MAX};
use memmap2::MmapMut;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"ULNETDC1");
const LINE: usize = 64;
const ROLES_OFFSET: usize = LINE;
const INBOX_OFFSET: usize = 2 * LINE;
const SLOTS_OFFSET: usize = INBOX_OFFSET + NODES_MAX * LINE;
/// Byte offset of `node`'s load-record slot in the file (for tools and fault-injection
/// tests that write the file directly, as a misbehaving process would).
pub const fn slot_offset(node: NodeIndex) -> usize {
    SLOTS_OFFSET + node.0 as usize * LINE
}
/// Bytes of the mapping.
pub const MAPPING_LEN: usize = SLOTS_OFFSET + NODES_MAX * LINE;
const _: () = assert!(std::mem::size_of::<Slot>() == LINE && std::mem::align_of::<Slot>() == LINE);

/// Why the shared file could not be created or opened.
#[derive(Debug, thiserror::Error)]
pub enum ShmOpenError {
    /// File system error.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a data-center state file of this layout.
    #[error("{0}: not a ulnet-dc state file (bad magic or size)")]
    NotState(PathBuf),
    /// More slots than the role word can name.
    #[error("{0} nodes: at most {NODES_MAX}")]
    TooManyNodes(usize),
}

/// A process's handle on the shared mapping.
pub struct ShmState {
    _map: MmapMut,
    base: *mut u8,
    slots: usize,
    me: Option<NodeIndex>,
    key: ClusterKey,
}

// SAFETY: `base` points into `_map`, which lives as long as the handle and is never
// remapped; every access through it is an atomic operation on an aligned word.
unsafe impl Send for ShmState {}
// SAFETY: as above; shared access is atomics only.
unsafe impl Sync for ShmState {}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ShmOpenError + '_ {
    move |source| ShmOpenError::Io { path: path.to_path_buf(), source }
}

impl ShmState {
    /// Creates (or truncates) the state file for `slots` nodes, with `table` as the first
    /// configuration, and returns an observer handle on it.
    pub fn create(path: &Path, slots: usize, table: RoleTable, key: ClusterKey) -> Result<ShmState, ShmOpenError> {
        if slots > NODES_MAX || slots == 0 {
            return Err(ShmOpenError::TooManyNodes(slots));
        }
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).map_err(io(path))?;
        file.set_len(MAPPING_LEN as u64).map_err(io(path))?;
        let state = Self::map(path, &file, None, key)?;
        state.word(ROLES_OFFSET).store(table.0, Ordering::Relaxed);
        for i in 0..NODES_MAX {
            state.word(INBOX_OFFSET + i * LINE).store(table.0, Ordering::Relaxed);
        }
        state.word(8).store(slots as u64, Ordering::Relaxed);
        state.word(0).store(MAGIC, Ordering::Release);
        Ok(ShmState { slots, ..state })
    }

    /// Opens an existing state file as node `me` (or as an observer, for `None`).
    pub fn open(path: &Path, me: Option<NodeIndex>, key: ClusterKey) -> Result<ShmState, ShmOpenError> {
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io(path))?;
        if file.metadata().map_err(io(path))?.len() != MAPPING_LEN as u64 {
            return Err(ShmOpenError::NotState(path.to_path_buf()));
        }
        let state = Self::map(path, &file, me, key)?;
        if state.word(0).load(Ordering::Acquire) != MAGIC {
            return Err(ShmOpenError::NotState(path.to_path_buf()));
        }
        let slots = state.word(8).load(Ordering::Relaxed) as usize;
        if slots == 0 || slots > NODES_MAX || me.is_some_and(|n| n.get() >= slots) {
            return Err(ShmOpenError::NotState(path.to_path_buf()));
        }
        Ok(ShmState { slots, ..state })
    }

    fn map(
        path: &Path,
        file: &std::fs::File,
        me: Option<NodeIndex>,
        key: ClusterKey,
    ) -> Result<ShmState, ShmOpenError> {
        // SAFETY: the file is the project's own state file, sized to MAPPING_LEN above (or
        // checked to be); other processes change it only through atomics, which is what
        // this handle uses too. A process truncating it behind our back would be a bug of
        // ours, not input.
        let mut map = unsafe { MmapMut::map_mut(file) }.map_err(io(path))?;
        if map.len() != MAPPING_LEN {
            return Err(ShmOpenError::NotState(path.to_path_buf()));
        }
        let base = map.as_mut_ptr();
        Ok(ShmState { _map: map, base, slots: 0, me, key })
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= MAPPING_LEN, "word offset inside the mapping");
        // SAFETY: in bounds and 8-aligned (checked above; the mapping is page-aligned), and
        // the memory is only ever accessed atomically.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    fn slot(&self, node: NodeIndex) -> Result<&Slot, StateError> {
        if node.get() >= self.slots {
            return Err(StateError::NoSuchNode(node));
        }
        let offset = SLOTS_OFFSET + node.get() * LINE;
        // SAFETY: `Slot` is 64 atomic bytes with alignment 64 (asserted at compile time);
        // the offset is a whole line inside the mapping, accessed only atomically.
        Ok(unsafe { &*(self.base.add(offset) as *const Slot) })
    }

    fn inbox(&self, node: NodeIndex) -> Result<&AtomicU64, StateError> {
        if node.get() >= self.slots {
            return Err(StateError::NoSuchNode(node));
        }
        Ok(self.word(INBOX_OFFSET + node.get() * LINE))
    }
}

impl SharedState for ShmState {
    fn slots(&self) -> usize {
        self.slots
    }

    fn publish_load(&self, record: &LoadRecord) -> Result<(), StateError> {
        let me = self.me.ok_or(StateError::NotANode)?;
        debug_assert_eq!(record.node, me.0, "a node publishes its own record");
        let slot = self.slot(me)?;
        let words = record.encode(&self.key, (slot.version() & !1) + 2);
        slot.write(&words);
        Ok(())
    }

    fn read_load(&self, node: NodeIndex) -> Result<[u64; SLOT_WORDS], StateError> {
        Ok(self.slot(node)?.read())
    }

    fn read_roles(&self) -> Result<RoleTable, StateError> {
        Ok(RoleTable(self.word(ROLES_OFFSET).load(Ordering::Acquire)))
    }

    fn cas_roles(&self, expected: RoleTable, new: RoleTable) -> Result<CasOutcome, StateError> {
        match self.word(ROLES_OFFSET).compare_exchange(expected.0, new.0, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(CasOutcome::Swapped),
            Err(found) => Ok(CasOutcome::Failed(RoleTable(found))),
        }
    }

    fn announce(&self, to: NodeIndex, table: RoleTable) -> Result<(), StateError> {
        let inbox = self.inbox(to)?;
        let mut current = inbox.load(Ordering::Acquire);
        while epoch_after(table.epoch(), RoleTable(current).epoch()) {
            match inbox.compare_exchange_weak(current, table.0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(found) => current = found,
            }
        }
        Ok(())
    }

    fn announced(&self) -> Result<RoleTable, StateError> {
        let me = self.me.ok_or(StateError::NotANode)?;
        Ok(RoleTable(self.inbox(me)?.load(Ordering::Acquire)))
    }
}
