//! The clocks records are timed with: CLOCK_MONOTONIC for operation times (it never steps),
//! CLOCK_REALTIME once per file to date it.

use rustix::time::{clock_gettime, ClockId};

fn ns(clock: ClockId) -> u64 {
    let t = clock_gettime(clock);
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn mono_ns() -> u64 {
    ns(ClockId::Monotonic)
}

/// CLOCK_REALTIME in nanoseconds since the Unix epoch.
pub fn real_ns() -> u64 {
    ns(ClockId::Realtime)
}
