//! Tracing switched on and off on a fixed schedule of the trace clock, to measure what it
//! costs inside one run.
//!
//! The time-stamp counter is shared by every core, so processes that follow the schedule
//! switch together: blocks of [`BLOCK_TICKS`] (about 6 ms at 3 GHz), odd ones traced.
//! Comparing each traced block with the untraced block just before it compares periods a
//! few milliseconds apart, which see nearly the same machine; whole runs of a traced and an
//! untraced process, seconds apart, differ on a shared host by more than tracing costs.
//!
//! A process needs a session ([`super::start`]) to switch: [`Switch`] only pauses and
//! resumes it.

/// log2 of a block's length in ticks.
const BLOCK_SHIFT: u32 = 24;

/// A block's length in ticks of the trace clock.
pub const BLOCK_TICKS: u64 = 1 << BLOCK_SHIFT;

/// Work that starts this many ticks or less after a block began belongs to neither side: a
/// process that checks the schedule every few dozen messages switches within microseconds
/// of the block's start, and about 20 us at 3 GHz covers that.
pub const GUARD_TICKS: u64 = 1 << 16;

/// The schedule's block of clock reading `ticks`.
#[inline]
pub fn block(ticks: u64) -> u64 {
    ticks >> BLOCK_SHIFT
}

/// Whether block `b` is traced.
#[inline]
pub fn is_traced(b: u64) -> bool {
    b & 1 == 1
}

/// Whether a clock reading lies past its block's guard.
#[inline]
pub fn past_guard(ticks: u64) -> bool {
    ticks & (BLOCK_TICKS - 1) > GUARD_TICKS
}

/// One process's follower of the schedule.
#[derive(Debug)]
pub struct Switch {
    on: bool,
    /// Keeps tracing paused in the traced blocks too: the control run (A/A), whose ratios
    /// show the bias and spread of the comparison itself.
    control: bool,
}

impl Switch {
    /// A follower that starts paused (tracing is paused now); `control` keeps it paused.
    pub fn new(control: bool) -> Self {
        super::pause();
        Self { on: false, control }
    }

    /// Switches tracing to what the schedule says at clock reading `now` (a recent
    /// [`super::now`]), and returns whether the block is traced. The traced blocks of a
    /// control follower are reported traced while tracing stays paused.
    #[inline]
    pub fn follow(&mut self, now: u64) -> bool {
        let want = is_traced(block(now));
        if want != self.on {
            if want && !self.control {
                super::resume();
            } else {
                super::pause();
            }
            self.on = want;
        }
        want
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_alternate_and_guards_open_them() {
        let start = 7 * BLOCK_TICKS;
        assert_eq!(block(start), 7);
        assert_eq!(block(start + BLOCK_TICKS - 1), 7);
        assert_eq!(block(start + BLOCK_TICKS), 8);
        assert!(is_traced(7) && !is_traced(8));
        assert!(!past_guard(start) && !past_guard(start + GUARD_TICKS));
        assert!(past_guard(start + GUARD_TICKS + 1) && past_guard(start + BLOCK_TICKS - 1));
    }
}
