//! The closed-loop load generator: each client sends a request, waits for the response,
//! checks it, records it, and only then sends the next (the thesis' Web-Bench-like
//! clients). Clients take the next request of the trace in turn, so the trace's bursts
//! reach the center in order.

use crate::http::Conn;
use crate::node::document_byte;
use crate::trace::{document_size, Request, Trace, DYNAMIC_PAGE_BYTES};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One answered (or failed) request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// When the response arrived, µs since the run started.
    pub done_us: u64,
    /// Response time, µs.
    pub latency_us: u32,
    /// Website.
    pub site: u8,
    /// A dynamic request.
    pub dynamic: bool,
    /// Answered with the right content.
    pub ok: bool,
}

/// Whether `body` is what the center must answer to `req` on `site`.
pub fn response_is_right(req: Request, site: u8, status: u16, body: &[u8]) -> bool {
    if status != 200 {
        return false;
    }
    match req {
        Request::Static(doc) => {
            body.len() == document_size(doc) && body.iter().enumerate().all(|(i, b)| *b == document_byte(site, doc, i))
        }
        Request::Dynamic(txn) => {
            body.len() == DYNAMIC_PAGE_BYTES && body.starts_with(format!("site {site} transaction {txn} ").as_bytes())
        }
    }
}

/// Runs `clients` closed-loop clients replaying `trace` against the balancer at `target`
/// until the trace is replayed, `duration` has passed, or `stop` is set; returns every
/// sample, in no particular order.
pub fn run(
    target: SocketAddr,
    clients: usize,
    trace: &Trace,
    start: Instant,
    duration: Duration,
    stop: &AtomicBool,
) -> Vec<Sample> {
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            (0..clients).map(|_| scope.spawn(|| client(target, trace, &next, start, duration, stop))).collect();
        handles.into_iter().flat_map(|h| h.join().expect("client thread")).collect()
    })
}

fn client(
    target: SocketAddr,
    trace: &Trace,
    next: &AtomicUsize,
    start: Instant,
    duration: Duration,
    stop: &AtomicBool,
) -> Vec<Sample> {
    let mut samples = Vec::with_capacity(trace.len() / 16 + 16);
    let mut conn: Option<Conn> = None;
    loop {
        if stop.load(Ordering::Relaxed) || start.elapsed() >= duration {
            break;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= trace.len() {
            break;
        }
        let req = trace.get(i);
        let site = trace.site(i);
        let path = req.path(site);
        let sent = Instant::now();
        let ok = (|| {
            if conn.is_none() {
                conn = Some(Conn::connect(target, Duration::from_secs(2)).ok()?);
            }
            let c = conn.as_mut()?;
            let r = c.get(&path, None).ok()?;
            if !r.keep_alive {
                conn = None;
            }
            Some(response_is_right(req, site, r.status, &r.body))
        })()
        .unwrap_or(false);
        if !ok {
            conn = None;
        }
        let done = Instant::now();
        samples.push(Sample {
            done_us: done.duration_since(start).as_micros() as u64,
            latency_us: done.duration_since(sent).as_micros().min(u128::from(u32::MAX)) as u32,
            site,
            dynamic: req.is_dynamic(),
            ok,
        });
    }
    samples
}
