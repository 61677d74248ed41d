//! Where to send a request: the nodes serving a role, their addresses (from their load
//! records), and pooled keep-alive connections to them.
//!
//! Used by the front load balancer (to reach proxies) and by proxies (to reach application
//! nodes). A request goes to the node of the role with the fewest requests outstanding from
//! here. A failed exchange is retried on a fresh connection and then on other nodes of the
//! role (requests are idempotent GETs), so a node that changes role or dies costs a retry,
//! not a failed client request; a node whose exchange failed is passed over for
//! [`FAILED_SKIP`] while the role has others, so a dead node costs few retries until it
//! leaves the role word.
//!
//! A node's address comes from its load record. A look that gets no whole record (every
//! copy torn because the owner was descheduled mid-write, a mixed copy, a read that timed
//! out) keeps the address the last accepted record gave, for as long as the validator
//! would accept an unchanged record; only a record the validator calls stale (or none
//! accepted for that long) takes the node out of routing. Dropping it at the first bad
//! look took the only node of a one-node tier out for a refresh period: on a busy host a
//! writer preempted inside its seqlock write failed a few hundred client requests.

use crate::http::{Conn, HttpError, Response};
use crate::load::{RecordValidator, Rejection};
use crate::role::{NodeIndex, Role, RoleTable, NODES_MAX};
use crate::state::{epoch_after, SharedState};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Nodes tried for one request before it fails.
pub const TRIES_MAX: usize = 4;
/// Idle connections kept per upstream node (more are closed after use). 128: the load
/// generator's default client count plus headroom; each is one idle socket.
pub const POOL_MAX: usize = 128;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a node whose exchange failed is passed over (when its role has other nodes).
/// 250 ms: a few times the balancer's view refresh, short against the time membership takes
/// to declare a node dead (its helper then takes it out of the table).
pub const FAILED_SKIP: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug)]
struct View {
    table: RoleTable,
    addrs: [Option<SocketAddr>; NODES_MAX],
}

/// The record validator, and when each node's record was last accepted.
struct Records {
    validator: RecordValidator,
    accepted_at: [Option<Instant>; NODES_MAX],
}

/// Routing state shared by a process's request threads.
pub struct Directory {
    state: Arc<dyn SharedState>,
    records: Mutex<Records>,
    view: RwLock<View>,
    pools: Vec<Mutex<Vec<Conn>>>,
    outstanding: Vec<AtomicU32>,
    sent: Vec<AtomicU64>,
    /// When an exchange with each node last failed, µs since `born` (0: never).
    failed_at: Vec<AtomicU64>,
    born: Instant,
    retries: AtomicU64,
    failures: AtomicU64,
}

impl Directory {
    /// A directory over `state`, with its own record validator.
    pub fn new(state: Arc<dyn SharedState>, validator: RecordValidator) -> Self {
        Directory {
            state,
            records: Mutex::new(Records { validator, accepted_at: [None; NODES_MAX] }),
            view: RwLock::new(View { table: RoleTable::EMPTY, addrs: [None; NODES_MAX] }),
            pools: (0..NODES_MAX).map(|_| Mutex::new(Vec::new())).collect(),
            outstanding: (0..NODES_MAX).map(|_| AtomicU32::new(0)).collect(),
            sent: (0..NODES_MAX).map(|_| AtomicU64::new(0)).collect(),
            failed_at: (0..NODES_MAX).map(|_| AtomicU64::new(0)).collect(),
            born: Instant::now(),
            retries: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// The table requests are routed by.
    pub fn table(&self) -> RoleTable {
        self.view.read().expect("directory lock").table
    }

    /// Routes by `table` from now on (ignored if older than the one held).
    pub fn set_table(&self, table: RoleTable) {
        let mut v = self.view.write().expect("directory lock");
        if v.table == RoleTable::EMPTY || epoch_after(table.epoch(), v.table.epoch()) {
            v.table = table;
        }
    }

    /// Reads the load record of every node in the table for its address; a node whose
    /// record is stale, or that has had no record accepted for the validator's staleness
    /// limit, gets no requests until it publishes again; a node out of the table is not
    /// read at all.
    pub fn refresh_addresses(&self, now: Instant) {
        let held = self.view.read().expect("directory lock").addrs;
        let mut addrs = [None; NODES_MAX];
        let table = self.table();
        {
            let mut records = self.records.lock().expect("records lock");
            let Records { validator, accepted_at } = &mut *records;
            let grace = validator.stale_after();
            for (node, _) in table.members().filter(|(n, _)| n.get() < self.state.slots()) {
                let i = node.get();
                let judged = self.state.read_load(node).map(|words| validator.accept(now, node, &words));
                addrs[i] = match judged {
                    Ok(Ok(r)) => {
                        accepted_at[i] = Some(now);
                        r.addr.map(SocketAddr::V4)
                    }
                    Ok(Err(Rejection::Stale)) => None,
                    // No whole copy this time: the last good address, within the grace.
                    _ => held[i].filter(|_| accepted_at[i].is_some_and(|t| now.saturating_duration_since(t) <= grace)),
                };
            }
        }
        self.view.write().expect("directory lock").addrs = addrs;
    }

    /// Exchanges started with `node` so far.
    pub fn sent_to(&self, node: NodeIndex) -> u64 {
        self.sent.get(node.get()).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// (retried exchanges, failed requests) so far.
    pub fn counters(&self) -> (u64, u64) {
        (self.retries.load(Ordering::Relaxed), self.failures.load(Ordering::Relaxed))
    }

    fn now_us(&self) -> u64 {
        self.born.elapsed().as_micros() as u64 + 1
    }

    fn recently_failed(&self, node: NodeIndex, now_us: u64) -> bool {
        let at = self.failed_at[node.get()].load(Ordering::Relaxed);
        at != 0 && now_us.saturating_sub(at) < FAILED_SKIP.as_micros() as u64
    }

    fn pick(&self, role: Role, tried: &[NodeIndex]) -> Option<(NodeIndex, SocketAddr)> {
        let v = *self.view.read().expect("directory lock");
        let now = self.now_us();
        v.table
            .nodes_in(role)
            .filter(|n| !tried.contains(n))
            .filter_map(|n| v.addrs[n.get()].map(|a| (n, a)))
            .min_by_key(|(n, _)| (self.recently_failed(*n, now), self.outstanding[n.get()].load(Ordering::Relaxed)))
    }

    /// Sends `GET path` to a node serving `role` and returns its response.
    pub fn forward(&self, role: Role, path: &str, tier_header: Option<&str>) -> Result<Response, HttpError> {
        let mut tried = Vec::with_capacity(TRIES_MAX);
        let mut last = HttpError::Malformed("no node serves the role");
        while tried.len() < TRIES_MAX {
            let Some((node, addr)) = self.pick(role, &tried) else { break };
            tried.push(node);
            self.outstanding[node.get()].fetch_add(1, Ordering::Relaxed);
            self.sent[node.get()].fetch_add(1, Ordering::Relaxed);
            let r = self.exchange(node, addr, path, tier_header);
            self.outstanding[node.get()].fetch_sub(1, Ordering::Relaxed);
            match r {
                Ok(resp) if resp.status == 200 => return Ok(resp),
                Ok(resp) => {
                    last = HttpError::Malformed(if resp.status == 502 { "upstream 502" } else { "upstream status" })
                }
                Err(e) => {
                    self.failed_at[node.get()].store(self.now_us(), Ordering::Relaxed);
                    last = e
                }
            }
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        Err(last)
    }

    /// One exchange with `node`: on a pooled connection, and once more on a fresh one if
    /// the pooled one had been closed by the peer.
    fn exchange(
        &self,
        node: NodeIndex,
        addr: SocketAddr,
        path: &str,
        tier: Option<&str>,
    ) -> Result<Response, HttpError> {
        let pooled = self.pools[node.get()].lock().expect("pool lock").pop();
        if let Some(mut c) = pooled {
            if c.stream().peer_addr().is_ok_and(|a| a == addr) {
                if let Ok(r) = c.get(path, tier) {
                    self.give_back(node, c, r.keep_alive);
                    return Ok(r);
                }
            }
        }
        let mut c = Conn::connect(addr, CONNECT_TIMEOUT)?;
        let r = c.get(path, tier)?;
        self.give_back(node, c, r.keep_alive);
        Ok(r)
    }

    fn give_back(&self, node: NodeIndex, c: Conn, keep_alive: bool) {
        if keep_alive {
            let mut pool = self.pools[node.get()].lock().expect("pool lock");
            if pool.len() < POOL_MAX {
                pool.push(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{ClusterKey, LoadRecord, SLOT_WORDS};
    use crate::role::{initial_table, Tier};
    use crate::state::{CasOutcome, StateCounters, StateError};

    /// A shared state whose records are whatever the test puts there.
    struct Scripted {
        records: Mutex<[[u64; SLOT_WORDS]; 2]>,
    }

    impl SharedState for Scripted {
        fn slots(&self) -> usize {
            2
        }
        fn publish_load(&self, _: &LoadRecord) -> Result<(), StateError> {
            Err(StateError::NotANode)
        }
        fn read_load(&self, node: NodeIndex) -> Result<[u64; SLOT_WORDS], StateError> {
            Ok(self.records.lock().unwrap()[node.get()])
        }
        fn read_roles(&self) -> Result<RoleTable, StateError> {
            Ok(initial_table(&[(1, 1)]))
        }
        fn cas_roles(&self, _: RoleTable, new: RoleTable) -> Result<CasOutcome, StateError> {
            Ok(CasOutcome::Failed(new))
        }
        fn announce(&self, _: NodeIndex, _: RoleTable) -> Result<(), StateError> {
            Ok(())
        }
        fn announced(&self) -> Result<RoleTable, StateError> {
            Err(StateError::NotANode)
        }
        fn counters(&self) -> StateCounters {
            StateCounters::default()
        }
    }

    /// The one application node of a site stays routable through torn and forged copies of
    /// its record for the staleness limit, and leaves routing when its record is stale or
    /// no copy was whole for longer than that.
    #[test]
    fn a_bad_copy_keeps_the_last_address_until_the_record_is_stale() {
        let key = ClusterKey::new(b"directory test");
        let app = NodeIndex(1);
        let record = |version| {
            let r = LoadRecord {
                node: 1,
                incarnation: 5,
                addr: Some("127.0.0.1:9001".parse().unwrap()),
                serving: Some(Role::new(0, Tier::App)),
                workers: 2,
                ..LoadRecord::default()
            };
            r.encode(&key, version)
        };
        let state = Arc::new(Scripted { records: Mutex::new([[0; SLOT_WORDS], record(2)]) });
        let stale_after = Duration::from_secs(1);
        let dir = Directory::new(state.clone(), RecordValidator::new(key.clone(), 2, stale_after));
        dir.set_table(initial_table(&[(1, 1)]));
        let role = Role::new(0, Tier::App);
        let routable = |dir: &Directory| dir.pick(role, &[]).map(|(n, _)| n);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        dir.refresh_addresses(at(0));
        assert_eq!(routable(&dir), Some(app));
        let set = |words| state.records.lock().unwrap()[1] = words;
        let mut torn = record(4);
        torn[0] |= 1;
        set(torn);
        dir.refresh_addresses(at(100));
        assert_eq!(routable(&dir), Some(app), "a torn copy keeps the address");
        set(LoadRecord { node: 1, incarnation: 5, workers: 2, ..LoadRecord::default() }
            .encode(&ClusterKey::new(b"forger"), 6));
        dir.refresh_addresses(at(500));
        assert_eq!(routable(&dir), Some(app), "a forged copy is ignored, the address kept");
        dir.refresh_addresses(at(1001));
        assert_eq!(routable(&dir), None, "no whole record for longer than the limit");
        set(record(8));
        dir.refresh_addresses(at(1100));
        assert_eq!(routable(&dir), Some(app), "publishing again brings it back");
        dir.refresh_addresses(at(2101));
        assert_eq!(routable(&dir), None, "a record that stopped moving is stale at once");
    }
}
