//! Completion queues: one queue that many endpoints and channels report into (VIA), so
//! one thread can serve many peers.

use crate::endpoint::{ChannelId, EndpointId};
use crate::transport::ReadyProbe;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// What completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    /// The channel has something to receive: poll its endpoint.
    Receive,
    /// A posted send finished.
    SendDone(u64),
    /// The channel went down (its endpoint's poll reports why).
    ChannelDown,
}

/// One entry of a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The endpoint.
    pub endpoint: EndpointId,
    /// The channel of that endpoint.
    pub channel: ChannelId,
    /// What happened.
    pub kind: CompletionKind,
}

struct Watch {
    endpoint: EndpointId,
    channel: ChannelId,
    probe: Arc<dyn ReadyProbe>,
}

struct Inner {
    entries: VecDeque<Completion>,
    capacity: usize,
    overflows: u64,
    watches: Vec<Watch>,
}

/// A completion queue shared by endpoints (cloning shares it; endpoints on other threads
/// may report into it too).
///
/// Receive readiness is found by probing every registered channel's ring (a load each);
/// send completions and channel failures are queued by the endpoints. The queue is bounded:
/// entries beyond `capacity` are dropped and counted (the endpoints still hold the state,
/// so nothing is lost but the notification).
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<Mutex<Inner>>,
}

impl CompletionQueue {
    /// A queue that holds up to `capacity` queued entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                entries: VecDeque::with_capacity(capacity),
                capacity,
                overflows: 0,
                watches: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register(&self, endpoint: EndpointId, channel: ChannelId, probe: Arc<dyn ReadyProbe>) {
        self.lock().watches.push(Watch { endpoint, channel, probe });
    }

    pub(crate) fn unregister(&self, endpoint: EndpointId, channel: ChannelId) {
        self.lock().watches.retain(|w| !(w.endpoint == endpoint && w.channel == channel));
    }

    pub(crate) fn push(&self, endpoint: EndpointId, channel: ChannelId, kind: CompletionKind) {
        let mut inner = self.lock();
        if inner.entries.len() >= inner.capacity {
            inner.overflows += 1;
            return;
        }
        inner.entries.push_back(Completion { endpoint, channel, kind });
    }

    /// Entries dropped because the queue was full.
    pub fn overflows(&self) -> u64 {
        self.lock().overflows
    }

    /// Appends up to `max` completions to `out`: queued ones first, then one `Receive` per
    /// channel with something waiting. Returns how many were added. Never blocks.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut inner = self.lock();
        let mut n = 0;
        while n < max {
            let Some(c) = inner.entries.pop_front() else {
                break;
            };
            out.push(c);
            n += 1;
        }
        for w in &inner.watches {
            if n >= max {
                break;
            }
            if w.probe.is_ready() {
                out.push(Completion { endpoint: w.endpoint, channel: w.channel, kind: CompletionKind::Receive });
                n += 1;
            }
        }
        n
    }

    /// Sleeps until some registered channel has something (or its peer hangs up, which its
    /// endpoint's next poll reports), an entry is queued, or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        let probes: Vec<Arc<dyn ReadyProbe>> = {
            let inner = self.lock();
            if !inner.entries.is_empty() {
                return Ok(());
            }
            inner.watches.iter().map(|w| w.probe.clone()).collect()
        };
        crate::wait::sleep_on(&probes, &[], timeout).map(|_| ())
    }
}
