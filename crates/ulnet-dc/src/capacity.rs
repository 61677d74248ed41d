//! A node's capacity, explicit: a fixed number of workers and a service time per request
//! class, so that a center of seven processes on a two-core machine behaves like seven
//! machines of that capacity rather than like two cores.
//!
//! A request holds one worker for its class's service time. [`ServiceMode::Sleep`] waits
//! out the time (the host's cores stay free for the HTTP work around it);
//! [`ServiceMode::Burn`] spends it computing, for real clusters where a node's CPU is its
//! own. A proxy does not hold a worker while it waits for the application tier (an
//! event-driven proxy, as nginx is); it pays [`ServiceTimes::forward`] for relaying.
//!
//! Sleeping workers keep a service clock: a worker's next request starts (in the clock)
//! when its previous one ended in the clock, not when the host got round to waking the
//! thread, so the lateness of a busy host's wake-ups (milliseconds when it runs dozens of
//! threads per core) is made up on the next request instead of taking capacity from the
//! emulated node — up to [`LATE_CREDIT_MAX`], so a node the host stopped for long does not
//! then serve a burst at more than its capacity.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How far behind the host may leave a sleeping worker's clock and still have it made up.
/// 25 ms: a few of the host scheduler's time slices (wake-ups on a loaded host come that
/// late), three dynamic pages of the lab profile.
pub const LATE_CREDIT_MAX: Duration = Duration::from_millis(25);

/// What a request costs a worker, by class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Class {
    /// A proxy answers a static document from its cache.
    CacheHit,
    /// A proxy relays a request to the application tier and its answer back.
    Forward,
    /// An application node serves a static document (a proxy's cache miss).
    Origin,
    /// An application node produces dynamic content.
    Dynamic,
}

/// Service time per class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceTimes {
    /// [`Class::CacheHit`].
    pub cache_hit: Duration,
    /// [`Class::Forward`].
    pub forward: Duration,
    /// [`Class::Origin`].
    pub origin: Duration,
    /// [`Class::Dynamic`].
    pub dynamic: Duration,
}

impl ServiceTimes {
    /// The time of a class.
    pub fn of(&self, class: Class) -> Duration {
        match class {
            Class::CacheHit => self.cache_hit,
            Class::Forward => self.forward,
            Class::Origin => self.origin,
            Class::Dynamic => self.dynamic,
        }
    }
}

/// How a worker spends a service time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ServiceMode {
    /// Waits it out (emulated capacity; for many nodes on one host).
    #[default]
    Sleep,
    /// Computes for it (real CPU; for one node per machine).
    Burn,
}

/// A node's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityConfig {
    /// Requests served at once.
    pub workers: u16,
    /// Service time per class.
    pub times: ServiceTimes,
    /// How service time is spent.
    pub mode: ServiceMode,
}

impl CapacityConfig {
    /// The profile of the experiments (`ulnet dc run` default), chosen so that a 7-node
    /// center peaks at about 3,000 requests/s, which the HTTP work around it leaves room for
    /// on two shared cores. Per node: 2 workers; a cache hit 4 ms (cache I/O: 500 hits/s per
    /// node), relaying 0.5 ms, an origin read 2 ms, a dynamic page 8 ms (250 pages/s per
    /// node). Dynamic work costs twice a hit, as in the thesis' runs where the best rigid
    /// split for an even mix gave the application tier more nodes.
    pub fn lab() -> Self {
        CapacityConfig {
            workers: 2,
            times: ServiceTimes {
                cache_hit: Duration::from_millis(4),
                forward: Duration::from_micros(500),
                origin: Duration::from_millis(2),
                dynamic: Duration::from_millis(8),
            },
            mode: ServiceMode::Sleep,
        }
    }

    /// A fast profile for tests: the same shape at a quarter of the times.
    pub fn quick() -> Self {
        let l = Self::lab();
        CapacityConfig {
            times: ServiceTimes {
                cache_hit: l.times.cache_hit / 4,
                forward: l.times.forward / 4,
                origin: l.times.origin / 4,
                dynamic: l.times.dynamic / 4,
            },
            ..l
        }
    }
}

/// The workers of a node and the counters its load record is computed from.
#[derive(Debug)]
pub struct Capacity {
    config: CapacityConfig,
    /// The idle workers, each as the time its last request ended in its service clock.
    free: Mutex<Vec<Instant>>,
    freed: Condvar,
    /// Nanoseconds workers spent serving, summed.
    busy_ns: AtomicU64,
    /// Nanoseconds requests spent waiting for a worker, summed.
    wait_ns: AtomicU64,
    /// Requests served.
    served: AtomicU64,
}

/// Counter values at one instant (differences of two give window averages).
#[derive(Clone, Copy, Debug, Default)]
pub struct CapacitySample {
    /// Busy worker-nanoseconds so far.
    pub busy_ns: u64,
    /// Waiting request-nanoseconds so far.
    pub wait_ns: u64,
    /// Requests served so far.
    pub served: u64,
}

impl Capacity {
    /// Workers per `config`.
    pub fn new(config: CapacityConfig) -> Self {
        assert!(config.workers > 0, "a node needs a worker");
        Capacity {
            config,
            free: Mutex::new(vec![Instant::now(); usize::from(config.workers)]),
            freed: Condvar::new(),
            busy_ns: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    /// The settings.
    pub fn config(&self) -> &CapacityConfig {
        &self.config
    }

    /// Serves one request of `class`: waits for a worker, spends the service time, frees it.
    pub fn serve(&self, class: Class) {
        let asked = Instant::now();
        let worker_free_at = {
            let mut free = self.free.lock().expect("capacity lock");
            loop {
                if let Some(at) = free.pop() {
                    break at;
                }
                free = self.freed.wait(free).expect("capacity lock");
            }
        };
        let time = self.config.times.of(class);
        let (started, done) = match self.config.mode {
            ServiceMode::Sleep => {
                // In the service clock: the request started when it asked, or when its worker
                // ended the previous one, whichever is later (but not further back than the
                // credit allows).
                let now = Instant::now();
                let started = asked.max(worker_free_at).max(now.checked_sub(LATE_CREDIT_MAX).unwrap_or(now));
                let done = started + time;
                std::thread::sleep(done.saturating_duration_since(now));
                (started, done)
            }
            ServiceMode::Burn => {
                let started = Instant::now();
                burn(time);
                (started, Instant::now())
            }
        };
        {
            let mut free = self.free.lock().expect("capacity lock");
            debug_assert!(free.len() < usize::from(self.config.workers), "more workers freed than taken");
            free.push(done);
        }
        self.freed.notify_one();
        self.wait_ns.fetch_add(started.saturating_duration_since(asked).as_nanos() as u64, Ordering::Relaxed);
        self.busy_ns.fetch_add((done - started).as_nanos() as u64, Ordering::Relaxed);
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn sample(&self) -> CapacitySample {
        CapacitySample {
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
            served: self.served.load(Ordering::Relaxed),
        }
    }
}

/// Computes for `time` (the work is a hash chain the optimiser cannot drop).
fn burn(time: Duration) {
    let end = Instant::now() + time;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while Instant::now() < end {
        for _ in 0..256 {
            x = x.rotate_left(5).wrapping_mul(0xff51_afd7_ed55_8ccd) ^ 0xc4ce_b9fe_1a85_ec53;
        }
        std::hint::black_box(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn workers_bound_concurrency() {
        let mut cfg = CapacityConfig::lab();
        cfg.times.dynamic = Duration::from_millis(20);
        let cap = Arc::new(Capacity::new(cfg));
        let start = Instant::now();
        let together = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (cap, together) = (cap.clone(), together.clone());
                std::thread::spawn(move || {
                    together.wait();
                    cap.serve(Class::Dynamic)
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        // Four 20 ms requests on two workers take two rounds, not one.
        assert!(start.elapsed() >= Duration::from_millis(40));
        let s = cap.sample();
        assert_eq!(s.served, 4);
        assert!(s.busy_ns >= 80_000_000);
        assert!(s.wait_ns > 0, "with four requests on two workers, some waited");
    }

    /// The service clock makes up late wake-ups but never lends capacity: a worker idle
    /// between requests gets no credit for the idle time, a queue on one worker takes at
    /// least n service times less the credit, and the busy time counted is the clock's.
    /// (That it makes lateness up is what the benchmarks show, not a timed test.)
    #[test]
    fn the_service_clock_never_serves_faster_than_its_workers() {
        let mut cfg = CapacityConfig::lab();
        cfg.workers = 1;
        cfg.times.dynamic = Duration::from_millis(5);
        let cap = Capacity::new(cfg);
        let start = Instant::now();
        for _ in 0..40 {
            cap.serve(Class::Dynamic);
            // The host is slow to come back for the next request: 2 ms each time.
            std::thread::sleep(Duration::from_millis(2));
        }
        let took = start.elapsed();
        // Each request arrives after its worker went idle: no credit, 40 × (5 + 2) ms.
        assert!(took >= Duration::from_millis(40 * 7), "{took:?}");
        let queued = Arc::new(Capacity::new(cfg));
        let start = Instant::now();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let q = queued.clone();
                std::thread::spawn(move || (0..5).for_each(|_| q.serve(Class::Dynamic)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200) - LATE_CREDIT_MAX, "faster than one worker: {took:?}");
        assert_eq!(queued.sample().busy_ns, 40 * 5_000_000, "busy time is the clock's");
    }
}
