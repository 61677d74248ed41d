//! The export table: the segments a node exports, read by its engine on every request
//! without a lock, and the owner's handle on each ([`ExportedSegment`]).
//!
//! Each slot holds one state word, `generation << 2 | kind` (free, live or revoked), and a
//! pointer to the segment's shared state. The engine checks a request against the state
//! word inside a Dekker handshake with the owner (it publishes the slot it is applying to
//! in `engine_busy`, then loads the state; the owner changes the state, then waits until
//! the engine is not busy on that slot), so once a revocation or unexport returns, the
//! engine never touches the segment again under the old generation.

use super::control::{self, BlockInfo};
use super::error::{AccessError, ExportError};
use super::memory::Region;
use super::notify::Notifications;
use super::rights::{Access, Generation, GrantTable, NodeId, NotifyMode, Rights, SegmentId};
use crate::transport::shm::mem::MappedMem;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const KIND_FREE: u64 = 0;
const KIND_LIVE: u64 = 1;
const KIND_REVOKED: u64 = 2;

/// What an importer needs to reach a segment: where it is and which export of it.
/// The name service stores these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SegmentDescriptor {
    /// The node that exports it.
    pub node: NodeId,
    /// Its id on that node.
    pub segment: SegmentId,
    /// The generation of the export.
    pub generation: Generation,
    /// Its size in bytes.
    pub len: u64,
}

/// A mapped importer of a segment, as the owner keeps it.
pub(crate) struct MappedImporter {
    pub(crate) node: NodeId,
    pub(crate) block: Arc<MappedMem>,
    /// The rendezvous connection, kept open: it hangs up when the importer dies.
    pub(crate) socket: UnixStream,
}

impl MappedImporter {
    fn hung_up(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.socket, rustix::event::PollFlags::RDHUP)];
        match rustix::event::poll(&mut fds, 0) {
            Ok(0) => false,
            Ok(_) => fds[0].revents().intersects(
                rustix::event::PollFlags::HUP | rustix::event::PollFlags::RDHUP | rustix::event::PollFlags::ERR,
            ),
            Err(_) => true,
        }
    }
}

/// The control state of a segment: changed by the owner and by the engine's rendezvous,
/// never on the data path.
pub(crate) struct SegmentControl {
    /// The memory file the owner's mapping shows (replaced by migration).
    pub(crate) file: File,
    pub(crate) importers: Vec<MappedImporter>,
    /// Some importer mapped the current file: revocation must migrate.
    pub(crate) ever_mapped: bool,
}

/// A segment's state shared by its owner, the engine and the rendezvous.
pub(crate) struct SegmentShared {
    pub(crate) id: SegmentId,
    pub(crate) name: String,
    pub(crate) region: Region,
    pub(crate) grants: GrantTable,
    notify: AtomicU8,
    pub(crate) control: Mutex<SegmentControl>,
}

impl SegmentShared {
    #[inline]
    pub(crate) fn notify_mode(&self) -> NotifyMode {
        NotifyMode::from_u8(self.notify.load(Ordering::Relaxed)).unwrap_or(NotifyMode::Never)
    }

    pub(crate) fn lock_control(&self) -> MutexGuard<'_, SegmentControl> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Slot {
    state: AtomicU64,
    shared: AtomicPtr<SegmentShared>,
}

/// Every segment a node exports.
pub(crate) struct ExportTable {
    pub(crate) node: NodeId,
    slots: Box<[Slot]>,
    next_generation: AtomicU32,
    /// Slot index + 1 the engine is applying a request to, or 0.
    engine_busy: AtomicU64,
    names: Mutex<HashMap<String, u32>>,
    pub(crate) notifications: Notifications,
    /// How long revocation waits for a mapped importer caught inside a store.
    pub(crate) revoke_grace: Duration,
    counters: RevokeCounters,
}

#[derive(Default)]
struct RevokeCounters {
    revocations: AtomicU64,
    migrations: AtomicU64,
    importers_stuck: AtomicU64,
}

/// Why a request under `generation` may or may not access a slot in `state`.
#[inline(always)]
fn classify_state(state: u64, generation: Generation) -> Result<(), AccessError> {
    match state & 3 {
        KIND_LIVE if state >> 2 == u64::from(generation.0) => Ok(()),
        KIND_REVOKED if state >> 2 == u64::from(generation.0) => Err(AccessError::Revoked),
        KIND_FREE => Err(AccessError::UnknownSegment),
        _ => Err(AccessError::StaleGeneration),
    }
}

/// A segment as the engine sees it while it applies one request (see [`ExportTable::enter`]).
pub(crate) struct Entered<'a> {
    table: &'a ExportTable,
    pub(crate) shared: &'a SegmentShared,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.table.engine_busy.store(0, Ordering::Release);
    }
}

impl ExportTable {
    pub(crate) fn new(node: NodeId, capacity: usize, notifications: Notifications, revoke_grace: Duration) -> Self {
        assert!(capacity >= 1 && capacity <= u32::MAX as usize);
        let slots = (0..capacity)
            .map(|_| Slot { state: AtomicU64::new(KIND_FREE), shared: AtomicPtr::new(std::ptr::null_mut()) })
            .collect();
        Self {
            node,
            slots,
            next_generation: AtomicU32::new(1),
            engine_busy: AtomicU64::new(0),
            names: Mutex::new(HashMap::new()),
            notifications,
            revoke_grace,
            counters: RevokeCounters::default(),
        }
    }

    fn lock_names(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_generation(&self) -> Generation {
        loop {
            let g = self.next_generation.fetch_add(1, Ordering::Relaxed);
            if g != 0 {
                return Generation(g);
            }
        }
    }

    /// Exports a new segment of `len` bytes into slot `at` (or the first free slot from 1;
    /// slot 0 is reserved for the name table).
    pub(crate) fn export(
        self: &Arc<Self>,
        name: &str,
        len: usize,
        access: &Access,
        notify: NotifyMode,
        at: Option<SegmentId>,
    ) -> Result<ExportedSegment, ExportError> {
        if len == 0 || len > (1 << 40) {
            return Err(ExportError::InvalidSize(len as u64));
        }
        if name.len() > super::wire::NAME_MAX || name.is_empty() {
            return Err(ExportError::NameTooLong);
        }
        let grants = GrantTable::new();
        grants.set(access).map_err(ExportError::TooManyGrants)?;
        let (region, file) = Region::create(len)?;
        let mut names = self.lock_names();
        if names.contains_key(name) {
            return Err(ExportError::NameTaken(name.to_string()));
        }
        let index = match at {
            Some(id) => {
                let i = id.0 as usize;
                if self.slots.get(i).is_none_or(|s| !s.shared.load(Ordering::Acquire).is_null()) {
                    return Err(ExportError::TableFull(self.slots.len()));
                }
                i
            }
            None => (1..self.slots.len())
                .find(|&i| self.slots[i].shared.load(Ordering::Acquire).is_null())
                .ok_or(ExportError::TableFull(self.slots.len()))?,
        };
        let generation = self.take_generation();
        let shared = Arc::new(SegmentShared {
            id: SegmentId(index as u32),
            name: name.to_string(),
            region,
            grants,
            notify: AtomicU8::new(notify as u8),
            control: Mutex::new(SegmentControl { file, importers: Vec::new(), ever_mapped: false }),
        });
        let slot = &self.slots[index];
        slot.shared.store(Arc::into_raw(shared.clone()).cast_mut(), Ordering::Release);
        slot.state.store((u64::from(generation.0) << 2) | KIND_LIVE, Ordering::SeqCst);
        names.insert(name.to_string(), index as u32);
        tracing::debug!(segment = index, generation = generation.0, len, name, "exported");
        Ok(ExportedSegment { table: self.clone(), shared, generation, revoked: false })
    }

    /// Checks that `segment` is live at `generation`, and marks the engine busy on it until
    /// the returned guard is dropped. The owner waits for the guard before it changes what
    /// the slot holds.
    #[inline]
    pub(crate) fn enter(&self, segment: SegmentId, generation: Generation) -> Result<Entered<'_>, AccessError> {
        let index = segment.0 as usize;
        let slot = self.slots.get(index).ok_or(AccessError::UnknownSegment)?;
        self.engine_busy.store(index as u64 + 1, Ordering::SeqCst);
        if let Err(e) = classify_state(slot.state.load(Ordering::SeqCst), generation) {
            self.engine_busy.store(0, Ordering::Release);
            return Err(e);
        }
        // SAFETY: the slot is live, and the owner neither frees nor replaces what the pointer
        // names before it has seen `engine_busy` clear (Dekker handshake with `quiesce`).
        let shared = unsafe { &*slot.shared.load(Ordering::Acquire) };
        Ok(Entered { table: self, shared })
    }

    /// Whether `segment` is live at `generation`, and if not, why.
    pub(crate) fn classify(&self, segment: SegmentId, generation: Generation) -> Result<(), AccessError> {
        let slot = self.slots.get(segment.0 as usize).ok_or(AccessError::UnknownSegment)?;
        classify_state(slot.state.load(Ordering::SeqCst), generation)
    }

    /// Waits until the engine is not applying a request to slot `index`. Call after
    /// changing the slot's state (with `SeqCst`).
    fn quiesce(&self, index: usize) {
        while self.engine_busy.load(Ordering::SeqCst) == index as u64 + 1 {
            std::hint::spin_loop();
        }
    }

    /// The live segment exported under `name`, with its generation.
    pub(crate) fn find(&self, name: &[u8]) -> Option<(Arc<SegmentShared>, Generation)> {
        let name = std::str::from_utf8(name).ok()?;
        let index = *self.lock_names().get(name)?;
        self.live(SegmentId(index))
    }

    /// The segment in `segment`'s slot if it is live, with its generation.
    pub(crate) fn live(&self, segment: SegmentId) -> Option<(Arc<SegmentShared>, Generation)> {
        let slot = self.slots.get(segment.0 as usize)?;
        // Hold the names lock so the slot cannot be freed while its Arc is cloned.
        let _names = self.lock_names();
        let state = slot.state.load(Ordering::Acquire);
        if state & 3 != KIND_LIVE {
            return None;
        }
        let ptr = slot.shared.load(Ordering::Acquire);
        // SAFETY: a live slot's pointer came from `Arc::into_raw` and the slot's own count
        // is only released by `unexport`, which takes the names lock we hold.
        let shared = unsafe {
            Arc::increment_strong_count(ptr);
            Arc::from_raw(ptr)
        };
        Some((shared, Generation((state >> 2) as u32)))
    }

    /// Whether the state word of `segment` still says live at `generation`.
    pub(crate) fn is_live(&self, segment: SegmentId, generation: Generation) -> bool {
        self.slots
            .get(segment.0 as usize)
            .is_some_and(|s| s.state.load(Ordering::SeqCst) == (u64::from(generation.0) << 2) | KIND_LIVE)
    }

    /// Revocations, migrations and importers that overstayed the grace period so far.
    pub(crate) fn revoke_counts(&self) -> (u64, u64, u64) {
        (
            self.counters.revocations.load(Ordering::Relaxed),
            self.counters.migrations.load(Ordering::Relaxed),
            self.counters.importers_stuck.load(Ordering::Relaxed),
        )
    }
}

impl Drop for ExportTable {
    fn drop(&mut self) {
        for slot in self.slots.iter() {
            let ptr = slot.shared.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !ptr.is_null() {
                // SAFETY: the slot owned one count from `Arc::into_raw`; nothing else can
                // reach the table any more.
                drop(unsafe { Arc::from_raw(ptr) });
            }
        }
    }
}

/// What [`ExportedSegment::revoke`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevokeReport {
    /// Same-host importers whose mappings were cut off.
    pub mapped_importers: usize,
    /// Of those, importers still inside a store when the grace period ran out (their
    /// in-flight store may or may not have reached the segment; their next access fails).
    pub importers_stuck: usize,
    /// The segment was moved to a fresh memory file, so stale mappings no longer alias it.
    pub migrated: bool,
}

/// The owner's handle on an exported segment: local access to its memory, revocation,
/// re-export and rights. Dropping it withdraws the export.
///
/// Local loads, stores and atomics on an aligned 64-bit word are atomic with respect to
/// remote accesses of that word through any path (see the [module docs](super)).
pub struct ExportedSegment {
    table: Arc<ExportTable>,
    shared: Arc<SegmentShared>,
    generation: Generation,
    revoked: bool,
}

impl std::fmt::Debug for ExportedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportedSegment")
            .field("id", &self.shared.id)
            .field("name", &self.shared.name)
            .field("generation", &self.generation)
            .field("len", &self.shared.region.len())
            .field("revoked", &self.revoked)
            .finish()
    }
}

impl ExportedSegment {
    /// Its id on this node.
    pub fn id(&self) -> SegmentId {
        self.shared.id
    }

    /// The name it is exported under.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The generation of the current export (importers need it).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.shared.region.len()
    }

    /// Segments are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether it is revoked (and not yet re-exported).
    pub fn is_revoked(&self) -> bool {
        self.revoked
    }

    /// What an importer on another node needs to reach this export.
    pub fn descriptor(&self) -> SegmentDescriptor {
        SegmentDescriptor {
            node: self.table.node,
            segment: self.shared.id,
            generation: self.generation,
            len: self.len() as u64,
        }
    }

    /// Loads the aligned 64-bit word at `offset` (Acquire).
    ///
    /// # Panics
    /// If the word is misaligned or outside the segment (a bug of the owner).
    #[inline]
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.shared.region.load_u64(offset, Ordering::Acquire)
    }

    /// Stores the aligned 64-bit word at `offset` (Release).
    ///
    /// # Panics
    /// If the word is misaligned or outside the segment.
    #[inline]
    pub fn store_u64(&self, offset: usize, value: u64) {
        self.shared.region.store_u64(offset, value, Ordering::Release)
    }

    /// Atomically adds to the word at `offset` (wrapping); returns the previous value.
    ///
    /// # Panics
    /// If the word is misaligned or outside the segment.
    #[inline]
    pub fn fetch_add_u64(&self, offset: usize, addend: u64) -> u64 {
        self.shared.region.fetch_add_u64(offset, addend)
    }

    /// Atomically replaces the word at `offset` with `desired` if it holds `expected`;
    /// returns the previous value (equal to `expected` on success).
    ///
    /// # Panics
    /// If the word is misaligned or outside the segment.
    #[inline]
    pub fn compare_swap_u64(&self, offset: usize, expected: u64, desired: u64) -> u64 {
        self.shared.region.compare_swap_u64(offset, expected, desired)
    }

    /// Copies bytes out of the segment (each aligned word with one load).
    ///
    /// # Panics
    /// If the range is outside the segment.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.shared.region.copy_out(offset, dst)
    }

    /// Copies bytes into the segment (each aligned word with one store).
    ///
    /// # Panics
    /// If the range is outside the segment.
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.shared.region.copy_in(offset, src)
    }

    /// Replaces the rights of every importer. Rights apply to each later request through
    /// the engine; a same-host importer keeps the mapping it has (read-only or writable)
    /// until the segment is revoked, so narrowing its rights takes a revoke.
    pub fn set_access(&self, access: &Access) -> Result<(), ExportError> {
        self.shared.grants.set(access).map_err(ExportError::TooManyGrants)
    }

    /// The rights `node` holds now.
    pub fn rights_of(&self, node: NodeId) -> Rights {
        self.shared.grants.rights_of(node)
    }

    /// Changes when the owner hears about accesses.
    pub fn set_notify(&self, mode: NotifyMode) {
        self.shared.notify.store(mode as u8, Ordering::Relaxed);
        for imp in &self.shared.lock_control().importers {
            control::set_notify_mode(&imp.block, mode as u8);
        }
    }

    /// Revokes the segment: from now on every access under the current generation fails
    /// with [`AccessError::Revoked`], through the engine and on same-host mappings alike,
    /// until [`ExportedSegment::reexport`]. Returns once no access can touch the segment
    /// any more:
    ///
    /// 1. the slot's state turns revoked and the engine is waited for, if it is applying a
    ///    request to this segment;
    /// 2. every mapped importer's control block turns revoked, a barrier (membarrier) makes
    ///    that visible to their CPUs, and each importer caught inside a store is waited for
    ///    (up to `RmaConfig::revoke_grace`; one that overstays is counted in the report);
    /// 3. if the segment was ever mapped, its memory moves to a fresh memory file mapped at
    ///    the same address, so the old mappings no longer alias anything the owner sees.
    pub fn revoke(&mut self) -> RevokeReport {
        if self.revoked {
            return RevokeReport::default();
        }
        let index = self.shared.id.0 as usize;
        let slot = &self.table.slots[index];
        slot.state.store((u64::from(self.generation.0) << 2) | KIND_REVOKED, Ordering::SeqCst);
        self.table.quiesce(index);
        self.revoked = true;
        self.table.counters.revocations.fetch_add(1, Ordering::Relaxed);
        let report = self.cut_off_importers(true);
        tracing::debug!(segment = index, generation = self.generation.0, ?report, "revoked");
        report
    }

    /// Steps 2 and 3 of [`ExportedSegment::revoke`].
    fn cut_off_importers(&mut self, migrate: bool) -> RevokeReport {
        let (importers, ever_mapped) = {
            let mut c = self.shared.lock_control();
            let ever = c.ever_mapped;
            (std::mem::take(&mut c.importers), ever)
        };
        let mut report = RevokeReport { mapped_importers: importers.len(), ..Default::default() };
        for imp in &importers {
            control::revoke(&*imp.block);
        }
        if !importers.is_empty() {
            crate::sys::barrier::sleeper_barrier();
            let deadline = Instant::now() + self.table.revoke_grace;
            for imp in &importers {
                while control::busy(&*imp.block) && !imp.hung_up() {
                    if Instant::now() >= deadline {
                        report.importers_stuck += 1;
                        tracing::warn!(
                            segment = self.shared.id.0,
                            importer = imp.node.0,
                            "mapped importer still inside a store after the grace period; revoking anyway"
                        );
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            let blocks: Vec<_> = importers.iter().map(|i| i.block.clone()).collect();
            self.table.notifications.remove_sources(&blocks);
        }
        self.table.counters.importers_stuck.fetch_add(report.importers_stuck as u64, Ordering::Relaxed);
        if migrate && ever_mapped {
            // SAFETY: the owner holds `&mut self`, the engine is quiesced on this slot (its
            // state is not live), and every mapped importer has left its store or been
            // given up on; nothing of this process touches the region during the call.
            match unsafe { self.shared.region.migrate() } {
                Ok(file) => {
                    let mut c = self.shared.lock_control();
                    c.file = file;
                    c.ever_mapped = false;
                    report.migrated = true;
                    self.table.counters.migrations.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tracing::error!(
                    segment = self.shared.id.0,
                    "migration to a fresh memory file failed ({e}); stale same-host mappings still alias the segment"
                ),
            }
        }
        report
    }

    /// Makes a revoked segment available again under a new generation (old handles keep
    /// failing with [`AccessError::StaleGeneration`]). Returns the new generation.
    pub fn reexport(&mut self) -> Generation {
        if !self.revoked {
            return self.generation;
        }
        self.generation = self.table.take_generation();
        self.revoked = false;
        let slot = &self.table.slots[self.shared.id.0 as usize];
        slot.state.store((u64::from(self.generation.0) << 2) | KIND_LIVE, Ordering::SeqCst);
        self.generation
    }
}

impl Drop for ExportedSegment {
    fn drop(&mut self) {
        let index = self.shared.id.0 as usize;
        let slot = &self.table.slots[index];
        let mut names = self.table.lock_names();
        slot.state.store(KIND_FREE, Ordering::SeqCst);
        self.table.quiesce(index);
        names.remove(&self.shared.name);
        let ptr = slot.shared.swap(std::ptr::null_mut(), Ordering::AcqRel);
        drop(names);
        // Mapped importers see the revocation; nothing needs migrating, since the owner's
        // mapping goes away with the segment and theirs show only orphaned pages.
        self.cut_off_importers(false);
        if !ptr.is_null() {
            // SAFETY: the slot's count from `Arc::into_raw`, released once (swapped out).
            drop(unsafe { Arc::from_raw(ptr) });
        }
    }
}

/// Registers a new mapped importer of `shared` under the control lock, if the segment is
/// still live at `generation`: creates its control block and returns it with the memory
/// file to pass on.
pub(crate) fn add_mapped_importer(
    table: &ExportTable,
    shared: &SegmentShared,
    generation: Generation,
    importer: NodeId,
    socket: &UnixStream,
) -> Result<(File, File), AccessError> {
    let mut c = shared.lock_control();
    if !table.is_live(shared.id, generation) {
        return Err(AccessError::Revoked);
    }
    c.importers.retain(|i| !i.hung_up());
    let block_file = crate::sys::memfd::create_sealed("ulnet-rma-control", control::BLOCK_LEN).map_err(|e| {
        tracing::warn!("control block for a mapped import: {e}");
        AccessError::Unavailable
    })?;
    let block = Arc::new(MappedMem::map(&block_file).map_err(|_| AccessError::Unavailable)?);
    let info = BlockInfo {
        segment: shared.id.0,
        generation: generation.0,
        importer: importer.0,
        owner_uses_membarrier: crate::sys::barrier::membarrier_registered(),
    };
    control::init(&*block, info, shared.notify_mode() as u8);
    let data = c.file.try_clone().map_err(|_| AccessError::Unavailable)?;
    let liveness = socket.try_clone().map_err(|_| AccessError::Unavailable)?;
    table.notifications.add_source(shared.id, importer, block.clone());
    c.importers.push(MappedImporter { node: importer, block, socket: liveness });
    c.ever_mapped = true;
    Ok((data, block_file))
}
