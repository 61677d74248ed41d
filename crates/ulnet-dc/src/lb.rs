//! The front load balancer: takes the clients' requests and hands each to the proxy of its
//! website with the fewest requests outstanding, by the current role word.
//!
//! It is an observer of the shared state (it has no load record and decides nothing): it
//! reads the role word every [`BalancerConfig::table_interval`] and the nodes' addresses
//! from their load records.

use crate::accept::{accept_loop, ConnectionCounters};
use crate::http::Conn;
use crate::load::{ClusterKey, RecordValidator};
use crate::node::{parse_path, CONNECTIONS_MAX};
use crate::role::{NodeIndex, Role, Tier};
use crate::state::SharedState;
use crate::upstream::Directory;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Settings of the balancer.
#[derive(Clone, Copy, Debug)]
pub struct BalancerConfig {
    /// How often the role word is read. 10 ms: new proxies get requests within it.
    pub table_interval: Duration,
    /// How often addresses are refreshed. 100 ms.
    pub address_interval: Duration,
    /// Staleness limit for the nodes' records. 1 s.
    pub stale_after: Duration,
}

impl Default for BalancerConfig {
    fn default() -> Self {
        BalancerConfig {
            table_interval: Duration::from_millis(10),
            address_interval: Duration::from_millis(100),
            stale_after: Duration::from_secs(1),
        }
    }
}

struct Inner {
    directory: Directory,
    state: Arc<dyn SharedState>,
    config: BalancerConfig,
    stop: AtomicBool,
    requests: AtomicU64,
    errors: AtomicU64,
    connections: Arc<ConnectionCounters>,
}

/// A running balancer.
pub struct Balancer {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

/// What the balancer did.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct BalancerReport {
    /// Requests relayed.
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Exchanges with proxies retried.
    pub retries: u64,
    /// Client connections closed at once because [`CONNECTIONS_MAX`] were open.
    pub connections_refused: u64,
    /// Accepts that failed (out of file descriptors, most likely), and connections left
    /// unserved for want of a thread.
    pub accept_failed: u64,
}

impl Balancer {
    /// Starts a balancer on `listener`.
    pub fn start(
        config: BalancerConfig,
        state: Arc<dyn SharedState>,
        key: ClusterKey,
        listener: TcpListener,
    ) -> std::io::Result<Balancer> {
        let addr = listener.local_addr()?;
        let validator = RecordValidator::new(key, state.slots(), config.stale_after);
        let inner = Arc::new(Inner {
            directory: Directory::new(state.clone(), validator),
            state,
            config,
            stop: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            connections: Arc::default(),
        });
        inner.refresh(Instant::now(), true);
        let mut threads = Vec::new();
        {
            let inner = inner.clone();
            threads.push(std::thread::Builder::new().name("lb-refresh".into()).spawn(move || {
                let mut next_addresses = Instant::now();
                while !inner.stop.load(Ordering::Acquire) {
                    let now = Instant::now();
                    let addresses = now >= next_addresses;
                    if addresses {
                        next_addresses = now + inner.config.address_interval;
                    }
                    inner.refresh(now, addresses);
                    std::thread::sleep(inner.config.table_interval);
                }
            })?);
        }
        {
            let inner = inner.clone();
            listener.set_nonblocking(true)?;
            threads.push(std::thread::Builder::new().name("lb-acceptor".into()).spawn(move || {
                let serving = inner.clone();
                let serve = move |conn| serving.serve_connection(conn);
                accept_loop("balancer", &listener, &inner.stop, CONNECTIONS_MAX, &inner.connections, serve);
            })?);
        }
        Ok(Balancer { inner, threads, addr })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests relayed to `node` so far (tries included).
    pub fn sent_to(&self, node: NodeIndex) -> u64 {
        self.inner.directory.sent_to(node)
    }

    /// Stops and reports.
    pub fn stop(self) -> BalancerReport {
        self.inner.stop.store(true, Ordering::Release);
        for t in self.threads {
            t.join().ok();
        }
        BalancerReport {
            requests: self.inner.requests.load(Ordering::Relaxed),
            errors: self.inner.errors.load(Ordering::Relaxed),
            retries: self.inner.directory.counters().0,
            connections_refused: self.inner.connections.refused.load(Ordering::Relaxed),
            accept_failed: self.inner.connections.failed.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    fn refresh(&self, now: Instant, addresses: bool) {
        if let Ok(t) = self.state.read_roles() {
            self.directory.set_table(t);
        }
        if addresses {
            self.directory.refresh_addresses(now);
        }
    }

    fn serve_connection(&self, mut conn: Conn) {
        conn.stream().set_read_timeout(Some(Duration::from_secs(1))).ok();
        loop {
            let req = match conn.next_request(&self.stop) {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(_) => {
                    conn.write_response(400, None, b"", false).ok();
                    return;
                }
            };
            self.requests.fetch_add(1, Ordering::Relaxed);
            let site = parse_path(&req.path).map(|(site, _, _)| site);
            let sent = match site {
                None => conn.write_response(404, None, b"", req.keep_alive),
                Some(site) => match self.directory.forward(Role::new(site, Tier::Proxy), &req.path, None) {
                    Ok(resp) => conn.write_response(200, resp.cache.as_deref(), &resp.body, req.keep_alive),
                    Err(e) => {
                        self.errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("balancer: {}: {e}", req.path);
                        conn.write_response(502, None, b"", req.keep_alive)
                    }
                },
            };
            if sent.is_err() || !req.keep_alive {
                return;
            }
        }
    }
}
