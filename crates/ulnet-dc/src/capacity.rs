//! A node's capacity, explicit: a fixed number of workers and a service time per request
//! class, so that a center of seven processes on a two-core machine behaves like seven
//! machines of that capacity rather than like two cores.
//!
//! A request holds one worker for its class's service time. [`ServiceMode::Sleep`] waits
//! out the time (the host's cores stay free for the HTTP work around it);
//! [`ServiceMode::Burn`] spends it computing, for real clusters where a node's CPU is its
//! own. A proxy does not hold a worker while it waits for the application tier (an
//! event-driven proxy, as nginx is); it pays [`ServiceTimes::forward`] for relaying.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

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
    free: Mutex<u16>,
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
            free: Mutex::new(config.workers),
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
        {
            let mut free = self.free.lock().expect("capacity lock");
            while *free == 0 {
                free = self.freed.wait(free).expect("capacity lock");
            }
            *free -= 1;
        }
        let started = Instant::now();
        let time = self.config.times.of(class);
        match self.config.mode {
            ServiceMode::Sleep => std::thread::sleep(time),
            ServiceMode::Burn => burn(time),
        }
        let done = Instant::now();
        {
            let mut free = self.free.lock().expect("capacity lock");
            *free += 1;
            debug_assert!(*free <= self.config.workers, "more workers freed than taken");
        }
        self.freed.notify_one();
        self.wait_ns.fetch_add((started - asked).as_nanos() as u64, Ordering::Relaxed);
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
}
