//! The accept loop of the data center's HTTP servers (nodes and the balancer): a thread per
//! connection up to a bound, connections beyond it closed at once, and accept failures (a
//! process out of descriptors, most likely) logged at a limited rate; all counted, none
//! stopping the loop. A connection's thread ends when its client closes it, or when it has
//! waited [`crate::http::REQUEST_WAIT_MAX`] for a request.

use crate::http::Conn;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_core::log_limit::LogLimit;

/// Stack of a connection thread: request handling needs little, and a center has hundreds.
const CONNECTION_STACK_BYTES: usize = 256 * 1024;
/// How long the loop sleeps when no connection is waiting (the listener is non-blocking so
/// that the loop sees its stop flag). 2 ms: a new client waits at most that long.
const IDLE_SLEEP: Duration = Duration::from_millis(2);
/// How long the loop rests after a failed accept: 10 ms, for descriptors to be freed by
/// connections that end.
const FAILED_ACCEPT_SLEEP: Duration = Duration::from_millis(10);

/// What an accept loop counts.
#[derive(Debug, Default)]
pub struct ConnectionCounters {
    /// Connections open now.
    pub open: AtomicU32,
    /// Connections closed at once because the bound was reached.
    pub refused: AtomicU64,
    /// Accepts that failed (out of descriptors or memory), and connections left unserved
    /// because no thread could be started for them.
    pub failed: AtomicU64,
}

/// Accepts connections on `listener` (non-blocking) until `stop`, serving each on a thread
/// of its own with `serve`, at most `max` at once.
pub(crate) fn accept_loop(
    what: &'static str,
    listener: &TcpListener,
    stop: &AtomicBool,
    max: u32,
    counters: &Arc<ConnectionCounters>,
    serve: impl Fn(Conn) + Clone + Send + 'static,
) {
    let (mut refused_log, mut failed_log) = (LogLimit::default(), LogLimit::default());
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if counters.open.load(Ordering::Relaxed) >= max {
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                    if let Some(unsaid) = refused_log.allow(Instant::now()) {
                        tracing::warn!("{what}: {max} connections open; closed one from {peer} ({unsaid} more since)");
                    }
                    continue;
                }
                if let Err(e) = spawn_connection(stream, counters, serve.clone()) {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    if let Some(unsaid) = failed_log.allow(Instant::now()) {
                        tracing::warn!("{what}: no thread for a connection from {peer}: {e} ({unsaid} more since)");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(IDLE_SLEEP),
            Err(e) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                if let Some(unsaid) = failed_log.allow(Instant::now()) {
                    tracing::warn!(
                        "{what}: cannot accept: {e} ({unsaid} more since); out of file descriptors? raise the \
                         limit (ulimit -n)"
                    );
                }
                std::thread::sleep(FAILED_ACCEPT_SLEEP);
            }
        }
    }
}

/// Serves `stream` on a new thread, counted open until `serve` returns.
fn spawn_connection(
    stream: TcpStream,
    counters: &Arc<ConnectionCounters>,
    serve: impl FnOnce(Conn) + Send + 'static,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    counters.open.fetch_add(1, Ordering::Relaxed);
    let theirs = counters.clone();
    let spawned =
        std::thread::Builder::new().name("dc-conn".into()).stack_size(CONNECTION_STACK_BYTES).spawn(move || {
            if let Ok(conn) = Conn::new(stream) {
                serve(conn);
            }
            theirs.open.fetch_sub(1, Ordering::Relaxed);
        });
    if spawned.is_err() {
        counters.open.fetch_sub(1, Ordering::Relaxed);
    }
    spawned.map(drop)
}
