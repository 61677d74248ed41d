//! Asymmetric memory barriers for the doorbell handshake.
//!
//! A receiver about to sleep stores "I sleep" and then checks its ring; a sender stores a
//! record and then checks "does it sleep". Without a full barrier on both sides each can
//! miss the other's store and the receiver sleeps on a message. Instead of paying a fence
//! on every send, senders only stop the compiler from reordering, and the rare sleeper
//! runs `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, which makes every running thread of
//! every registered process execute a full barrier before it returns (the asymmetric
//! scheme of userspace RCU). Processes register once, on their first channel.

use std::sync::atomic::{compiler_fence, fence, Ordering};
use std::sync::OnceLock;

/// Whether this process is registered for expedited global membarriers.
pub(crate) fn membarrier_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        use rustix::process::{membarrier, membarrier_query, MembarrierCommand, MembarrierQuery};
        let q = membarrier_query();
        q.contains(MembarrierQuery::GLOBAL_EXPEDITED | MembarrierQuery::REGISTER_GLOBAL_EXPEDITED)
            && membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok()
    })
}

/// The barrier a sender runs between publishing a record and reading the peer's sleep flag.
#[inline(always)]
pub(crate) fn sender_barrier(peer_uses_membarrier: bool) {
    if peer_uses_membarrier {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The barrier a receiver runs between setting its sleep flag and re-checking its ring.
pub(crate) fn sleeper_barrier() {
    if membarrier_registered() {
        if rustix::process::membarrier(rustix::process::MembarrierCommand::GlobalExpedited).is_ok() {
            return;
        }
        tracing::warn!("membarrier failed; falling back to a fence (senders of this process's channels fence too)");
    }
    fence(Ordering::SeqCst);
}
