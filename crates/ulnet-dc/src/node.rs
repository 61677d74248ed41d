//! One data-center node: an HTTP server that can serve either tier, and its helper module.
//!
//! Every node runs the same program (the thesis' "software homogeneity"); its role decides
//! what the others send it. Threads:
//!
//! - *acceptor* and one *connection* thread per client connection: a request with
//!   `X-Ulnet-Tier: app` is application work (a dynamic page, or a static document for a
//!   proxy's miss); any other request is proxy work (cache, or forward to the application
//!   tier of its site).
//! - *housekeeping* (every [`NodeConfig::tick`]): applies the newest table announced to it
//!   (a local read of its inbox), and the role word itself every
//!   [`NodeConfig::role_poll_interval`] in case an announcement never came (its winner
//!   died between its compare-and-swap and its announcements); publishes the load record
//!   every [`NodeConfig::publish_interval`]; refreshes addresses.
//! - *helper* (every S, only under the `reconf` policy): reads the role word and the load
//!   record of every node in it, takes nodes that membership says died out of the table
//!   ([`crate::membership`]), else decides ([`crate::policy::Helper`]); compare-and-swaps,
//!   and if it won, announces the new table to every node in it.
//!
//! A role change never drops a request: the node serves new requests by the request's own
//! tier header, so a request routed on a stale view is still answered; it finishes the
//! requests of its old role (*draining*, shown in its load record) before it drops its cache.

use crate::accept::{accept_loop, ConnectionCounters};
use crate::cache::{DocumentCache, CACHE_BYTES_DEFAULT};
use crate::capacity::{Capacity, CapacityConfig, CapacitySample, Class};
use crate::http::{Conn, HttpError};
use crate::load::{ClusterKey, LoadRecord, RecordValidator, ValidatorCounters};
use crate::membership::Watch;
use crate::policy::{Helper, HelperConfig, HelperCounters, NodeLoad, Proposal};
use crate::role::{NodeIndex, Role, RoleTable, Tier};
use crate::state::{epoch_after, CasOutcome, SharedState, StateCounters};
use crate::trace::{document_size, DYNAMIC_PAGE_BYTES};
use crate::upstream::Directory;
use serde::Serialize;
use std::collections::VecDeque;
use std::net::{SocketAddr, SocketAddrV4, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most open connections a node serves; more are refused (closed at once).
pub const CONNECTIONS_MAX: u32 = 2048;

/// Settings of a node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's index (its slot in the shared state).
    pub index: NodeIndex,
    /// Workers and service times.
    pub capacity: CapacityConfig,
    /// The helper module's settings.
    pub helper: HelperConfig,
    /// Run the helper module (the `reconf` policy); off, the node keeps its role (`rigid`).
    pub reconfigure: bool,
    /// Bytes of the proxy cache.
    pub cache_bytes: usize,
    /// How often the housekeeping thread wakes. 10 ms: a role change is applied within it.
    pub tick: Duration,
    /// How often the load record is published. 50 ms: 20 versions a second keep the
    /// helpers' staleness limit (1 s) far away, at a MAC and 8 stores each.
    pub publish_interval: Duration,
    /// Window the published averages cover. 250 ms: a few service times at the slowest
    /// class, short enough that a burst shows within one helper period.
    pub load_window: Duration,
    /// How often addresses are refreshed from the load records. 100 ms.
    pub address_interval: Duration,
    /// How often the role word itself is read, besides the announcements. 100 ms: a change
    /// whose announcement was lost reaches the node within it, at ten remote reads a second.
    pub role_poll_interval: Duration,
}

impl NodeConfig {
    /// Defaults for node `index`.
    pub fn new(index: NodeIndex) -> Self {
        NodeConfig {
            index,
            capacity: CapacityConfig::lab(),
            helper: HelperConfig::lab(),
            reconfigure: true,
            cache_bytes: CACHE_BYTES_DEFAULT,
            tick: Duration::from_millis(10),
            publish_interval: Duration::from_millis(50),
            load_window: Duration::from_millis(250),
            address_interval: Duration::from_millis(100),
            role_poll_interval: Duration::from_millis(100),
        }
    }
}

/// What a node did, reported when it stops.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct NodeReport {
    /// The node.
    pub node: u8,
    /// Requests answered, by work: proxy work, application work.
    pub proxy_requests: u64,
    /// Application-tier requests answered.
    pub app_requests: u64,
    /// Proxy cache hits.
    pub cache_hits: u64,
    /// Requests a proxy forwarded to the application tier.
    pub forwarded: u64,
    /// Requests answered with an error (forward failed on every node tried).
    pub errors: u64,
    /// Exchanges with upstream nodes retried.
    pub upstream_retries: u64,
    /// Role changes applied.
    pub role_changes: u64,
    /// Requests served as the node's old role after it switched (drained).
    pub drained_requests: u64,
    /// Helper counters.
    pub helper: Option<HelperCounters>,
    /// Load records the helper accepted or ignored.
    pub records: Option<ValidatorCounters>,
    /// What the node's shared-state handle did (remote reads, CAS, path taken).
    #[serde(default)]
    pub state: StateCounters,
    /// Client connections closed at once because [`CONNECTIONS_MAX`] were open.
    #[serde(default)]
    pub connections_refused: u64,
    /// Accepts that failed (out of file descriptors, most likely), and connections left
    /// unserved for want of a thread.
    #[serde(default)]
    pub accept_failed: u64,
}

struct Counters {
    proxy_requests: AtomicU64,
    app_requests: AtomicU64,
    cache_lookups: AtomicU64,
    cache_hits: AtomicU64,
    forwarded: AtomicU64,
    errors: AtomicU64,
    role_changes: AtomicU64,
    drained_requests: AtomicU64,
}

struct Inner {
    config: NodeConfig,
    state: Arc<dyn SharedState>,
    key: ClusterKey,
    addr: SocketAddrV4,
    incarnation: u32,
    capacity: Capacity,
    cache: Mutex<DocumentCache>,
    directory: Directory,
    /// Role code served now (0: none yet).
    serving: AtomicU8,
    /// Requests in progress by the tier of their work.
    in_flight: [AtomicU32; 2],
    /// The tier being drained after a switch (`u8::MAX`: none).
    draining_tier: AtomicU8,
    connections: Arc<ConnectionCounters>,
    applied_epoch: AtomicU32,
    counters: Counters,
    helper_counters: Mutex<Option<(HelperCounters, ValidatorCounters)>>,
    /// What membership says (`None`: no membership; the helper never sees a departure).
    watch: Option<Arc<Watch>>,
    stop: AtomicBool,
}

/// A running node; [`NodeHandle::stop`] ends it and returns its report.
pub struct NodeHandle {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

/// Starts a node serving on `listener` (bound by the caller), working on `state` (a handle
/// opened as this node), told of deaths by `watch`.
pub fn start(
    config: NodeConfig,
    state: Arc<dyn SharedState>,
    key: ClusterKey,
    listener: TcpListener,
    watch: Option<Arc<Watch>>,
) -> std::io::Result<NodeHandle> {
    let addr = match listener.local_addr()? {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => return Err(std::io::Error::other("nodes listen on IPv4 (load records carry IPv4)")),
    };
    let validator = RecordValidator::new(key.clone(), state.slots(), config.helper.stale_after);
    let inner = Arc::new(Inner {
        capacity: Capacity::new(config.capacity),
        cache: Mutex::new(DocumentCache::new(config.cache_bytes)),
        directory: Directory::new(state.clone(), validator),
        state,
        key,
        addr,
        incarnation: rand::random(),
        serving: AtomicU8::new(0),
        in_flight: [AtomicU32::new(0), AtomicU32::new(0)],
        draining_tier: AtomicU8::new(u8::MAX),
        connections: Arc::default(),
        applied_epoch: AtomicU32::new(0),
        counters: Counters {
            proxy_requests: AtomicU64::new(0),
            app_requests: AtomicU64::new(0),
            cache_lookups: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            role_changes: AtomicU64::new(0),
            drained_requests: AtomicU64::new(0),
        },
        helper_counters: Mutex::new(None),
        watch,
        stop: AtomicBool::new(false),
        config,
    });
    // Take the first role and publish before taking requests, so peers can route here.
    inner.apply_roles(true);
    let mut threads = Vec::new();
    {
        let inner = inner.clone();
        threads.push(spawn_named("dc-housekeeping", move || inner.housekeeping())?);
    }
    if inner.config.reconfigure {
        let inner = inner.clone();
        threads.push(spawn_named("dc-helper", move || inner.helper_loop())?);
    }
    {
        let inner = inner.clone();
        listener.set_nonblocking(true)?;
        threads.push(spawn_named("dc-acceptor", move || {
            let serving = inner.clone();
            let serve = move |conn| serving.serve_connection(conn);
            accept_loop("dc node", &listener, &inner.stop, CONNECTIONS_MAX, &inner.connections, serve);
        })?);
    }
    Ok(NodeHandle { inner, threads, addr: SocketAddr::V4(addr) })
}

fn spawn_named(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.to_string()).spawn(f)
}

impl NodeHandle {
    /// Where the node takes requests.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The role the node serves now.
    pub fn serving(&self) -> Option<Role> {
        Role::from_code(self.inner.serving.load(Ordering::Acquire))
    }

    /// Stops the node (open connections end as their clients close them) and reports.
    pub fn stop(self) -> NodeReport {
        self.inner.stop.store(true, Ordering::Release);
        for t in self.threads {
            t.join().ok();
        }
        self.inner.report()
    }
}

impl Inner {
    fn report(&self) -> NodeReport {
        let c = &self.counters;
        let (retries, _) = self.directory.counters();
        let helper = *self.helper_counters.lock().expect("helper counters lock");
        NodeReport {
            node: self.config.index.0,
            proxy_requests: c.proxy_requests.load(Ordering::Relaxed),
            app_requests: c.app_requests.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
            forwarded: c.forwarded.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            upstream_retries: retries,
            role_changes: c.role_changes.load(Ordering::Relaxed),
            drained_requests: c.drained_requests.load(Ordering::Relaxed),
            helper: helper.map(|h| h.0),
            records: helper.map(|h| h.1),
            state: self.state.counters(),
            connections_refused: self.connections.refused.load(Ordering::Relaxed),
            accept_failed: self.connections.failed.load(Ordering::Relaxed),
        }
    }

    fn serve_connection(&self, mut conn: Conn) {
        // A stopped node lets its clients notice within a second.
        conn.stream().set_read_timeout(Some(Duration::from_secs(1))).ok();
        loop {
            let req = match conn.next_request(&self.stop) {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(HttpError::TooLarge) => {
                    conn.write_response(431, None, b"", false).ok();
                    return;
                }
                Err(_) => {
                    conn.write_response(400, None, b"", false).ok();
                    return;
                }
            };
            let (status, cache, body) = self.handle(&req.method, &req.path, req.tier.as_deref());
            if conn.write_response(status, cache, &body, req.keep_alive).is_err() || !req.keep_alive {
                return;
            }
        }
    }

    /// Answers one request: (status, X-Cache, body).
    fn handle(&self, method: &str, path: &str, tier: Option<&str>) -> (u16, Option<&'static str>, Arc<[u8]>) {
        let Some((site, dynamic, id)) = parse_path(path).filter(|_| method == "GET") else {
            return (404, None, Arc::from(&b""[..]));
        };
        let work = if tier == Some("app") { Tier::App } else { Tier::Proxy };
        self.in_flight[work as usize].fetch_add(1, Ordering::AcqRel);
        let serving = Role::from_code(self.serving.load(Ordering::Acquire));
        if serving.is_some_and(|r| r.tier != work) {
            self.counters.drained_requests.fetch_add(1, Ordering::Relaxed);
        }
        let out = match work {
            Tier::App => self.app_work(site, dynamic, id),
            Tier::Proxy => self.proxy_work(site, dynamic, id, path),
        };
        self.in_flight[work as usize].fetch_sub(1, Ordering::AcqRel);
        out
    }

    fn app_work(&self, site: u8, dynamic: bool, id: u32) -> (u16, Option<&'static str>, Arc<[u8]>) {
        self.counters.app_requests.fetch_add(1, Ordering::Relaxed);
        if dynamic {
            self.capacity.serve(Class::Dynamic);
            (200, None, dynamic_page(site, id, self.config.index))
        } else {
            self.capacity.serve(Class::Origin);
            (200, None, document(site, id))
        }
    }

    fn proxy_work(&self, site: u8, dynamic: bool, id: u32, path: &str) -> (u16, Option<&'static str>, Arc<[u8]>) {
        self.counters.proxy_requests.fetch_add(1, Ordering::Relaxed);
        if !dynamic {
            self.counters.cache_lookups.fetch_add(1, Ordering::Relaxed);
            let hit = self.cache.lock().expect("cache lock").get(site, id);
            if let Some(body) = hit {
                self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
                self.capacity.serve(Class::CacheHit);
                return (200, Some("HIT"), body);
            }
        }
        self.capacity.serve(Class::Forward);
        self.counters.forwarded.fetch_add(1, Ordering::Relaxed);
        match self.directory.forward(Role::new(site, Tier::App), path, Some("app")) {
            Ok(resp) => {
                let body: Arc<[u8]> = resp.body.into();
                if !dynamic && self.serving_tier() == Some(Tier::Proxy) {
                    self.cache.lock().expect("cache lock").insert(site, id, body.clone());
                }
                (200, Some(if dynamic { "PASS" } else { "MISS" }), body)
            }
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(node = %self.config.index, "forward {path}: {e}");
                (502, None, Arc::from(&b""[..]))
            }
        }
    }

    fn serving_tier(&self) -> Option<Tier> {
        Role::from_code(self.serving.load(Ordering::Acquire)).map(|r| r.tier)
    }

    /// Takes the newest table announced to this node (or, with `read_word`, found in the
    /// role word) and, if this node's role changed, switches: new work by the new role at
    /// once, the old role's requests drained before its cache is dropped.
    fn apply_roles(&self, read_word: bool) {
        let mut table = self.state.announced().unwrap_or(RoleTable::EMPTY);
        if read_word || table == RoleTable::EMPTY {
            if let Ok(word) = self.state.read_roles() {
                if table == RoleTable::EMPTY || epoch_after(word.epoch(), table.epoch()) {
                    table = word;
                }
            }
        }
        if table == RoleTable::EMPTY {
            return;
        }
        self.directory.set_table(table);
        let table = self.directory.table();
        self.applied_epoch.store(u32::from(table.epoch()), Ordering::Relaxed);
        let new = table.role(self.config.index);
        let old = Role::from_code(self.serving.load(Ordering::Acquire));
        if new != old {
            if let (Some(o), Some(n)) = (old, new) {
                if o.tier != n.tier {
                    self.draining_tier.store(o.tier as u8, Ordering::Release);
                }
            }
            self.serving.store(new.map_or(0, Role::code), Ordering::Release);
            if old.is_some() {
                self.counters.role_changes.fetch_add(1, Ordering::Relaxed);
                tracing::info!(node = %self.config.index, from = ?old, to = ?new, epoch = table.epoch(), "role switched");
            }
        }
        let draining = self.draining_tier.load(Ordering::Acquire);
        if draining != u8::MAX && self.in_flight[usize::from(draining)].load(Ordering::Acquire) == 0 {
            self.draining_tier.store(u8::MAX, Ordering::Release);
            if draining == Tier::Proxy as u8 {
                self.cache.lock().expect("cache lock").clear();
            }
        }
    }

    fn housekeeping(&self) {
        let mut window: VecDeque<(Instant, CapacitySample, [u64; 4], f64)> = VecDeque::new();
        let mut next_publish = Instant::now();
        let mut next_addresses = Instant::now();
        let mut next_word = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let read_word = now >= next_word;
            if read_word {
                next_word = now + self.config.role_poll_interval;
            }
            self.apply_roles(read_word);
            if now >= next_addresses {
                self.directory.refresh_addresses(now);
                next_addresses = now + self.config.address_interval;
            }
            if now >= next_publish {
                let c = &self.counters;
                let counts = [
                    c.cache_lookups.load(Ordering::Relaxed),
                    c.cache_hits.load(Ordering::Relaxed),
                    c.proxy_requests.load(Ordering::Relaxed),
                    c.forwarded.load(Ordering::Relaxed),
                ];
                window.push_back((now, self.capacity.sample(), counts, process_cpu_seconds()));
                while window.len() > 2 && now.duration_since(window[1].0) >= self.config.load_window {
                    window.pop_front();
                }
                let record = self.load_record(&window);
                if let Err(e) = self.state.publish_load(&record) {
                    tracing::warn!("publish load: {e}");
                }
                next_publish = now + self.config.publish_interval;
            }
            std::thread::sleep(self.config.tick);
        }
    }

    fn load_record(&self, window: &VecDeque<(Instant, CapacitySample, [u64; 4], f64)>) -> LoadRecord {
        let (first, last) = (window.front().expect("a sample"), window.back().expect("a sample"));
        let dt = last.0.duration_since(first.0).as_secs_f64();
        let workers = self.capacity.config().workers;
        let per_s = |a: u64, b: u64| if dt > 0.0 { (b - a) as f64 / dt } else { 0.0 };
        let busy = per_s(first.1.busy_ns, last.1.busy_ns) / 1e9;
        let queued = per_s(first.1.wait_ns, last.1.wait_ns) / 1e9;
        let permille = |num: u64, den: u64| (num * 1000).checked_div(den).map_or(0, |v| v.min(1000) as u16);
        let lookups = last.2[0] - first.2[0];
        let hits = last.2[1] - first.2[1];
        let proxied = last.2[2] - first.2[2];
        let forwarded = last.2[3] - first.2[3];
        let cpu = if dt > 0.0 { (last.3 - first.3) / dt } else { 0.0 };
        LoadRecord {
            node: self.config.index.0,
            incarnation: self.incarnation,
            addr: Some(self.addr),
            serving: Role::from_code(self.serving.load(Ordering::Acquire)),
            draining: self.draining_tier.load(Ordering::Acquire) != u8::MAX,
            applied_epoch: self.applied_epoch.load(Ordering::Relaxed) as u16,
            workers,
            busy_milli: ((busy * 1000.0) as u32).min(u32::from(workers) * 1000),
            queued_milli: (queued * 1000.0).min(u32::MAX as f64) as u32,
            connections: self.connections.open.load(Ordering::Relaxed),
            cache_hit_permille: permille(hits, lookups),
            backend_share_permille: permille(forwarded, proxied),
            cpu_permille: (cpu * 1000.0).min(f64::from(u16::MAX)) as u16,
            requests_per_s: per_s(first.1.served, last.1.served) as u32,
            completed: last.1.served,
        }
    }

    fn helper_loop(&self) {
        let cfg = self.config.helper;
        let table = self.state.read_roles().unwrap_or(RoleTable::EMPTY);
        let mut helper = Helper::new(cfg, table);
        let mut validator = RecordValidator::new(self.key.clone(), self.state.slots(), cfg.stale_after);
        // Spread the helpers' looks over the period so they do not all read at once.
        let offset = cfg.sensitivity.mul_f64(f64::from(self.config.index.0 % 8) / 8.0);
        std::thread::sleep(offset);
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if let Ok(table) = self.state.read_roles() {
                // Only members are read: a node out of the table (one that died) costs nothing.
                let loads: Vec<Option<NodeLoad>> = (0..self.state.slots())
                    .map(|i| {
                        let node = NodeIndex(i as u8);
                        table.role(node)?;
                        let words = self.state.read_load(node).ok()?;
                        validator.accept(now, node, &words).ok().map(|r| NodeLoad::from(&r))
                    })
                    .collect();
                let acting = self.watch.as_ref().is_none_or(|w| w.acting());
                let departed = self.watch.as_ref().map(|w| w.dead()).unwrap_or_default();
                // Out of the table but not dead to membership, and publishing: taken back
                // into the cluster after an exclusion. (Without membership none returns.)
                let returned: Vec<NodeIndex> = (0..self.state.slots())
                    .map(|i| NodeIndex(i as u8))
                    .filter(|n| self.watch.is_some() && table.role(*n).is_none() && !departed.contains(n))
                    .filter(|n| {
                        let words = self.state.read_load(*n);
                        words.is_ok_and(|w| validator.accept(now, *n, &w).is_ok())
                    })
                    .collect();
                let proposal = if !acting {
                    None
                } else if let Some(p) = helper.handle_departures(now, table, &departed, &loads) {
                    Some(p)
                } else if let Some(p) = helper.handle_returns(now, table, &returned, &loads) {
                    Some(p)
                } else {
                    helper.handle_observation(now, table, &loads)
                };
                if let Some(p) = proposal {
                    self.propose(&mut helper, &p);
                }
            }
            *self.helper_counters.lock().expect("helper counters lock") =
                Some((helper.counters(), validator.counters()));
            std::thread::sleep(cfg.sensitivity.saturating_sub(now.elapsed()));
        }
    }

    /// Compare-and-swaps the role word at its home to `p.proposed`; the winner announces
    /// the new table to every node in it (itself included), the loser adopts the table it
    /// found.
    fn propose(&self, helper: &mut Helper, p: &Proposal) {
        match self.state.cas_roles(p.expected, p.proposed) {
            Ok(outcome) => {
                helper.handle_cas(Instant::now(), p, outcome);
                if outcome == CasOutcome::Swapped {
                    tracing::info!(
                        node = %self.config.index, table = ?p.proposed, to = %p.to, moved = p.moved, removed = p.removed,
                        "reconfigured"
                    );
                    for (n, _) in p.proposed.members() {
                        if let Err(e) = self.state.announce(n, p.proposed) {
                            tracing::debug!(to = %n, "announce: {e}");
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("compare-and-swap of the role word: {e}"),
        }
    }
}

/// `/{site}/{s|d}/{id}` → (site, dynamic, id).
pub fn parse_path(path: &str) -> Option<(u8, bool, u32)> {
    let mut parts = path.strip_prefix('/')?.split('/');
    let site: u8 = parts.next()?.parse().ok()?;
    let dynamic = match parts.next()? {
        "s" => false,
        "d" => true,
        _ => return None,
    };
    let id: u32 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || usize::from(site) >= crate::role::SITES_MAX {
        return None;
    }
    Some((site, dynamic, id))
}

/// The bytes of static document `doc` of `site` (the client checks them).
pub fn document(site: u8, doc: u32) -> Arc<[u8]> {
    let len = document_size(doc);
    (0..len).map(|i| document_byte(site, doc, i)).collect()
}

/// Byte `i` of a document.
pub fn document_byte(site: u8, doc: u32, i: usize) -> u8 {
    (doc as u8).wrapping_mul(31).wrapping_add(site).wrapping_add(i as u8)
}

/// A dynamic page: made for this request (it names the node that computed it).
fn dynamic_page(site: u8, txn: u32, node: NodeIndex) -> Arc<[u8]> {
    let mut page = format!("site {site} transaction {txn} computed by {node}\n").into_bytes();
    page.resize(DYNAMIC_PAGE_BYTES, b'.');
    page.into()
}

/// CPU seconds this process has used.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage struct owned by this frame.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}
