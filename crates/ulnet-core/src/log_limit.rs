//! Rate-limited log lines. A fault that can repeat at the pace of a stranger's packets or
//! connections (refused handshakes, a process out of file descriptors) is said at once,
//! then at most once per interval, each line with the number of occurrences not said
//! since the line before; counters keep the exact totals.

use std::time::{Duration, Instant};

/// Interval of the limits used across ulnet. 10 s: a fault that persists is in the log
/// within seconds of its start and costs at most 8,640 lines a day.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Decides which occurrences of one kind of fault get a log line.
#[derive(Debug, Clone)]
pub struct LogLimit {
    interval: Duration,
    /// When the next line may be written (`None`: at once).
    next_at: Option<Instant>,
    /// Occurrences since the last line that got none.
    unsaid: u64,
}

impl LogLimit {
    /// A limit of one line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self { interval, next_at: None, unsaid: 0 }
    }

    /// Records an occurrence at `now`. `Some(n)` when it gets a line: `n` occurrences went
    /// unsaid before it; `None` when it is to be counted only.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.next_at.is_some_and(|at| now < at) {
            self.unsaid += 1;
            return None;
        }
        self.next_at = Some(now + self.interval);
        Some(std::mem::take(&mut self.unsaid))
    }
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new(LOG_EVERY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_the_first_then_one_per_interval_with_the_count_between() {
        let mut limit = LogLimit::new(Duration::from_secs(10));
        let t = Instant::now();
        assert_eq!(limit.allow(t), Some(0));
        for s in 1..10 {
            assert_eq!(limit.allow(t + Duration::from_secs(s)), None);
        }
        assert_eq!(limit.allow(t + Duration::from_secs(10)), Some(9));
        assert_eq!(limit.allow(t + Duration::from_secs(11)), None);
        assert_eq!(limit.allow(t + Duration::from_secs(60)), Some(1));
    }
}
