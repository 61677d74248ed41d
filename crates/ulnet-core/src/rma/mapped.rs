//! Same-host imports: the segment is mapped into the importer, and every operation is a
//! plain load, store or atomic instruction on the owner's pages — the owner's process takes
//! no part. What the target would check, the importer's library checks here, against the
//! rights it was granted and the owner's control block, before it touches memory:
//!
//! - the control block's state still holds this import's generation (a revocation sets it
//!   to zero; stores also hold the busy word across the access, see [`super::control`]);
//! - the rights granted at import (and the mapping itself is read-only without write or
//!   atomic rights, so a store that bypassed this check would fault);
//! - `offset + length` within the segment, without overflow; 8-alignment for atomics.
//!
//! A refused access changes nothing and is counted by the initiator.

use super::control::{self, ImporterWords, NotifyProducer, Record};
use super::error::AccessError;
use super::memory::Region;
use super::notify::AccessKind;
use super::rendezvous::Granted;
use super::rights::{Generation, NodeId, NotifyMode, Rights, SegmentId};
use crate::sys::doorbell::Doorbell;
use crate::transport::shm::mem::MappedMem;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, Ordering};

/// One mapped import.
pub(crate) struct MappedImport {
    pub(crate) segment: SegmentId,
    pub(crate) generation: Generation,
    pub(crate) owner: NodeId,
    pub(crate) rights: Rights,
    region: Region,
    /// Direct handles on `block`'s state and busy words (declared before `block`, which
    /// keeps them mapped).
    words: ImporterWords,
    block: MappedMem,
    doorbell: Doorbell,
    /// Kept open: the owner sees us die as a hang-up.
    socket: UnixStream,
    /// Our barrier is a compiler fence: both sides use membarrier.
    compiler_fence_only: bool,
    notifications: NotifyProducer,
    revoked: bool,
}

impl MappedImport {
    pub(crate) fn new(g: Granted) -> Self {
        let owner_uses_membarrier = control::read_info(&g.block).is_some_and(|i| i.owner_uses_membarrier);
        Self {
            segment: g.segment,
            generation: g.generation,
            owner: g.owner,
            rights: g.rights,
            region: g.region,
            words: ImporterWords::new(&g.block),
            block: g.block,
            doorbell: Doorbell::from_fd(g.doorbell),
            socket: g.socket,
            compiler_fence_only: owner_uses_membarrier && crate::sys::barrier::membarrier_registered(),
            notifications: NotifyProducer::new(control::RING),
            revoked: false,
        }
    }

    /// Bytes in the segment.
    pub(crate) fn len(&self) -> usize {
        self.region.len()
    }

    /// Whether the owner's process has gone (its end of the rendezvous hung up).
    pub(crate) fn owner_gone(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.socket, rustix::event::PollFlags::RDHUP)];
        match rustix::event::poll(&mut fds, 0) {
            Ok(0) => false,
            Ok(_) => true,
            Err(_) => true,
        }
    }

    /// The state word if the import is live (one load tells the generation and the
    /// owner's notify mode).
    #[inline(always)]
    fn live(&mut self) -> Result<u64, AccessError> {
        let state = self.words.state();
        if self.revoked || control::state_generation(state) != self.generation.0 {
            self.revoked = true;
            return Err(AccessError::Revoked);
        }
        Ok(state)
    }

    /// The checks of a target after the state (rights, bounds, alignment); returns the
    /// offset, checked: `offset + len <= region.len()`, and 8-aligned if `atomic`.
    #[inline(always)]
    fn check_access(&self, offset: u64, len: u64, need: Rights, atomic: bool) -> Result<usize, AccessError> {
        if !self.rights.contains(need) {
            return Err(AccessError::Denied);
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.region.len() as u64 => {}
            _ => return Err(AccessError::OutOfBounds),
        }
        if atomic && !offset.is_multiple_of(8) {
            return Err(AccessError::Misaligned);
        }
        Ok(offset as usize)
    }

    /// Enters a store and checks it, in a target's order (state, rights, bounds,
    /// alignment); on success the caller stores and then calls `words.leave()`. Returns
    /// the checked offset and the state word.
    #[inline(always)]
    fn enter(&mut self, offset: u64, len: u64, need: Rights, atomic: bool) -> Result<(usize, u64), AccessError> {
        if self.revoked {
            return Err(AccessError::Revoked);
        }
        let Some(state) = self.words.enter(self.generation.0, self.compiler_fence_only) else {
            self.revoked = true;
            return Err(AccessError::Revoked);
        };
        match self.check_access(offset, len, need, atomic) {
            Ok(off) => Ok((off, state)),
            Err(e) => {
                self.words.leave();
                Err(e)
            }
        }
    }

    #[inline(always)]
    fn notice(&mut self, state: u64, requested: bool, kind: AccessKind, offset: u64, len: usize) {
        // An unknown mode byte (only a corrupted block holds one) notifies nobody.
        let mode = NotifyMode::from_u8(control::state_notify_mode(state)).unwrap_or(NotifyMode::Never);
        if mode.notifies(requested) {
            self.notifications.push(&self.block, Record { op: kind as u8, len: len as u32, offset });
            self.doorbell.ring();
        }
    }

    #[inline]
    pub(crate) fn get(&mut self, offset: u64, dst: &mut [u8], notify: bool) -> Result<(), AccessError> {
        let state = self.live()?;
        let off = self.check_access(offset, dst.len() as u64, Rights::READ, false)?;
        if dst.len() == 8 && off.is_multiple_of(8) {
            // SAFETY: `check_access` bounded `off + 8` by the segment; aligned just above.
            let w = unsafe { self.region.load_u64_prechecked(off, Ordering::Acquire) };
            dst.copy_from_slice(&w.to_ne_bytes());
        } else {
            self.region.copy_out(off, dst);
            fence(Ordering::Acquire);
        }
        self.notice(state, notify, AccessKind::Get, offset, dst.len());
        Ok(())
    }

    #[inline]
    pub(crate) fn put(&mut self, offset: u64, data: &[u8], notify: bool) -> Result<(), AccessError> {
        let (off, state) = self.enter(offset, data.len() as u64, Rights::WRITE, false)?;
        if data.len() == 8 && off.is_multiple_of(8) {
            let w = u64::from_ne_bytes(data.try_into().expect("8 bytes"));
            // SAFETY: `enter` bounded `off + 8` by the segment; aligned just above. The
            // WRITE right means the mapping is writable. Release orders this put after
            // every earlier one, also on machines with weaker stores.
            unsafe { self.region.store_u64_prechecked(off, w, Ordering::Release) };
        } else {
            // Order this put after every earlier one, also on machines with weaker stores.
            fence(Ordering::Release);
            self.region.copy_in(off, data);
        }
        self.words.leave();
        self.notice(state, notify, AccessKind::Put, offset, data.len());
        Ok(())
    }

    #[inline]
    pub(crate) fn compare_swap(
        &mut self,
        offset: u64,
        expected: u64,
        desired: u64,
        notify: bool,
    ) -> Result<u64, AccessError> {
        let (off, state) = self.enter(offset, 8, Rights::ATOMIC, true)?;
        // SAFETY: `enter` checked `off + 8` in bounds and `off` 8-aligned; the ATOMIC
        // right means the mapping is writable.
        let old = unsafe { self.region.compare_swap_u64_prechecked(off, expected, desired) };
        self.words.leave();
        self.notice(state, notify, AccessKind::CompareSwap, offset, 8);
        Ok(old)
    }

    #[inline]
    pub(crate) fn fetch_add(&mut self, offset: u64, addend: u64, notify: bool) -> Result<u64, AccessError> {
        let (off, state) = self.enter(offset, 8, Rights::ATOMIC, true)?;
        // SAFETY: as in `compare_swap`.
        let old = unsafe { self.region.fetch_add_u64_prechecked(off, addend) };
        self.words.leave();
        self.notice(state, notify, AccessKind::FetchAdd, offset, 8);
        Ok(old)
    }

    /// The importer's own view of the segment's pages, for tests that show a stale mapping
    /// no longer aliases the owner's memory after revocation.
    #[cfg(test)]
    pub(crate) fn raw_region(&self) -> &Region {
        &self.region
    }
}
