//! What a node's process used: CPU time, page faults, context switches (all threads) and
//! peak resident memory, from `getrusage(2)`, for the per-phase profile of a sort.

use serde::{Deserialize, Serialize};

/// Resource use of this process so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// CPU seconds in user mode.
    pub user_s: f64,
    /// CPU seconds in the kernel.
    pub sys_s: f64,
    /// Page faults served without I/O.
    pub minor_faults: u64,
    /// Times a thread gave up the CPU to wait.
    pub voluntary_switches: u64,
    /// Times a thread was preempted.
    pub involuntary_switches: u64,
    /// Peak resident set size of the process, KiB (what a memory bound is checked by).
    #[serde(default)]
    pub max_rss_kib: u64,
}

impl Usage {
    /// This process's use so far (zeros if the kernel refuses, which it does not for
    /// `RUSAGE_SELF`).
    pub fn now() -> Self {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `ru` is a valid, writable rusage; getrusage writes it whole on success
        // and it was zeroed before, so it is initialized either way.
        let ru = unsafe {
            libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
            ru.assume_init()
        };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Usage {
            user_s: secs(ru.ru_utime),
            sys_s: secs(ru.ru_stime),
            minor_faults: ru.ru_minflt as u64,
            voluntary_switches: ru.ru_nvcsw as u64,
            involuntary_switches: ru.ru_nivcsw as u64,
            max_rss_kib: ru.ru_maxrss as u64,
        }
    }
}
