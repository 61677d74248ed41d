//! A cheap cycle clock for timing every iteration, as `ucx_perftest` does: reading the
//! monotonic clock costs about 20 ns here, which would be part of every measured round trip.

use std::time::{Duration, Instant};

/// Ticks of the time-stamp counter, converted with a rate measured against `Instant`.
pub struct CycleClock {
    ticks_per_ns: f64,
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn ticks() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64; it only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn ticks() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl CycleClock {
    /// Measures the tick rate over `window` (the counter is invariant on current x86-64).
    pub fn calibrate(window: Duration) -> Self {
        let (t0, c0) = (Instant::now(), ticks());
        while t0.elapsed() < window {
            std::hint::spin_loop();
        }
        let (ns, c) = (t0.elapsed().as_nanos() as f64, ticks() - c0);
        Self { ticks_per_ns: (c as f64 / ns).max(1e-9) }
    }

    /// Nanoseconds in `ticks`.
    #[inline]
    pub fn ns(&self, ticks: u64) -> u64 {
        (ticks as f64 / self.ticks_per_ns) as u64
    }
}
