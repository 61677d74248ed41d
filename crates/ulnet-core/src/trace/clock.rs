//! The trace clock: the time-stamp counter where there is an invariant one (a read costs a
//! few nanoseconds, against about 20 for `clock_gettime`), CLOCK_MONOTONIC elsewhere.
//! Files carry references that map ticks to CLOCK_MONOTONIC (see `format`).

use std::time::Duration;

/// The current tick count.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn ticks() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64; it only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The current tick count.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn ticks() -> u64 {
    mono_ns()
}

fn clock_ns(id: rustix::time::ClockId) -> u64 {
    let t = rustix::time::clock_gettime(id);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CLOCK_MONOTONIC in nanoseconds.
pub(crate) fn mono_ns() -> u64 {
    clock_ns(rustix::time::ClockId::Monotonic)
}

/// CLOCK_REALTIME in nanoseconds since the epoch.
pub(crate) fn real_ns() -> u64 {
    clock_ns(rustix::time::ClockId::Realtime)
}

/// A tick reading and the monotonic time at (about) the same instant: the tick read is
/// bracketed by two clock reads and the pair with the tightest bracket of a few is kept.
pub(crate) fn reference() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..5 {
        let a = mono_ns();
        let t = ticks();
        let b = mono_ns();
        if b - a < best.0 {
            best = (b - a, t, a + (b - a) / 2);
        }
    }
    (best.1, best.2)
}

/// Ticks per second, measured over `window` (the blocks' references refine it later).
pub(crate) fn ticks_per_sec(window: Duration) -> u64 {
    let (t0, m0) = reference();
    std::thread::sleep(window);
    let (t1, m1) = reference();
    ((t1 - t0) as f64 * 1e9 / (m1 - m0).max(1) as f64) as u64
}

/// A hash of the kernel's boot id: processes with the same value share CLOCK_MONOTONIC, so
/// their traces can be compared instant by instant. 0 when it cannot be read.
pub(crate) fn boot_id() -> u64 {
    match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        // FNV-1a: only equality matters.
        Ok(s) => {
            s.trim().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
        }
        Err(_) => 0,
    }
}
