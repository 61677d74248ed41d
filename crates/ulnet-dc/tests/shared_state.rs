//! The shared state in ulnet remote memory, on every path (segments mapped, and every
//! operation through the owner's engine over shared-memory and TCP channels): records
//! published and read one-sidedly, torn copies read again, forged and stale records
//! ignored and counted, rights, forward-only announcements, and concurrent compare-and-
//! swaps from every helper.

use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_core::rma::{Access, AccessError, NodeId, NotifyMode, Rights, Rma, RmaConfig, RmaError};
use ulnet_dc::load::{ClusterKey, LoadRecord, RecordValidator, Rejection, SLOT_WORDS};
use ulnet_dc::policy::{Helper, HelperConfig, NodeLoad};
use ulnet_dc::role::{initial_table, NodeIndex, Role, RoleTable, Tier};
use ulnet_dc::state::record::READ_TRIES;
use ulnet_dc::state::rma::{RmaEndpoint, RmaPath, RmaState, RmaStateConfig, LOAD_SEGMENT, ROLES_SEGMENT};
use ulnet_dc::state::{CasOutcome, SharedState, StateError};

const PATHS: [RmaPath; 3] = [RmaPath::Map, RmaPath::Shm, RmaPath::Tcp];

fn center_name(what: &str) -> String {
    format!("t-dc-{what}-{}-{:x}", std::process::id(), rand::random::<u32>())
}

/// A front and `slots` node handles of one center in this process, each with its own
/// remote-memory node, told where the others listen.
fn center(what: &str, path: RmaPath, table: RoleTable, slots: usize, key: &ClusterKey) -> (RmaState, Vec<RmaState>) {
    let config = RmaStateConfig::new(&center_name(what), slots, path);
    let front = RmaState::front(config.clone(), table, key.clone()).unwrap();
    let nodes: Vec<RmaState> = (0..slots as u8)
        .map(|i| RmaState::node(config.clone(), NodeIndex(i), front.endpoint().clone(), key.clone()).unwrap())
        .collect();
    let endpoints: Vec<Option<RmaEndpoint>> = nodes.iter().map(|n| Some(n.endpoint().clone())).collect();
    front.set_endpoints(&endpoints);
    for n in &nodes {
        n.set_endpoints(&endpoints);
    }
    (front, nodes)
}

fn record(node: u8, busy_milli: u32) -> LoadRecord {
    LoadRecord {
        node,
        incarnation: 42,
        addr: Some("127.0.0.1:9000".parse().unwrap()),
        serving: Some(Role::new(0, Tier::App)),
        workers: 2,
        busy_milli,
        ..LoadRecord::default()
    }
}

/// A process that answers at a node's endpoint with whatever record it likes: it has the
/// segment names and the transport's secret (over TCP and shared memory), not the key
/// records are signed with.
struct Impostor {
    _rma: Rma,
    load: ulnet_core::rma::ExportedSegment,
    _inbox: ulnet_core::rma::ExportedSegment,
    endpoint: RmaEndpoint,
}

impl Impostor {
    fn new(path: RmaPath, key: &ClusterKey) -> Impostor {
        let mut config = RmaConfig::new(NodeId(77));
        config.tcp.secret = key.derive("ulnet-dc rma");
        config.shm.secret = key.derive("ulnet-dc rma");
        let mut rma = Rma::new(config).unwrap();
        let endpoint = match path {
            RmaPath::Tcp => RmaEndpoint::Tcp(rma.listen_tcp("127.0.0.1:0").unwrap()),
            _ => {
                let name = center_name("impostor");
                rma.listen_shm(&name).unwrap();
                RmaEndpoint::Shm(name)
            }
        };
        let load = rma.export(LOAD_SEGMENT, SLOT_WORDS * 8, Access::everyone(Rights::READ), NotifyMode::Never).unwrap();
        let _inbox = rma.export("dc/inbox", 8, Access::everyone(Rights::READ), NotifyMode::Never).unwrap();
        Impostor { _rma: rma, load, _inbox, endpoint }
    }

    fn serve(&self, words: &[u64; SLOT_WORDS]) {
        for (i, w) in words.iter().enumerate() {
            self.load.store_u64(i * 8, *w);
        }
    }
}

/// A reader handle (node 0 of its own center) that finds node 1 at `endpoint`.
fn reader_of(path: RmaPath, key: &ClusterKey, endpoint: RmaEndpoint) -> (RmaState, RmaState) {
    let config = RmaStateConfig::new(&center_name("reader"), 3, path);
    let front = RmaState::front(config.clone(), initial_table(&[(1, 2)]), key.clone()).unwrap();
    let reader = RmaState::node(config, NodeIndex(0), front.endpoint().clone(), key.clone()).unwrap();
    reader.set_endpoints(&[None, Some(endpoint)]);
    (front, reader)
}

#[test]
fn a_published_record_is_read_one_sided_on_every_path() {
    for path in PATHS {
        let key = ClusterKey::new(b"secret");
        let table = initial_table(&[(1, 2)]);
        let (front, nodes) = center("publish", path, table, 3, &key);
        nodes[2].publish_load(&record(2, 1500)).unwrap();
        let mut v = RecordValidator::new(key, 3, Duration::from_secs(1));
        for reader in [&front as &dyn SharedState, &nodes[0], &nodes[2]] {
            let got = v.accept(Instant::now(), NodeIndex(2), &reader.read_load(NodeIndex(2)).unwrap());
            assert_eq!(got, Ok(record(2, 1500)), "{path}");
        }
        assert_eq!(
            v.accept(Instant::now(), NodeIndex(1), &front.read_load(NodeIndex(1)).unwrap()),
            Err(Rejection::Absent)
        );
        assert_eq!(front.read_roles().unwrap(), table);
        assert_eq!(nodes[1].read_roles().unwrap(), table, "{path}: the role word read at its home");
        let c = nodes[0].counters();
        match path {
            RmaPath::Map => assert!(c.mapped_ops >= 1 && c.channel_ops == 0, "{path}: {c:?}"),
            _ => assert!(c.channel_ops >= 1 && c.mapped_ops == 0, "{path}: {c:?}"),
        }
        let served = nodes[2].counters().served_by_engine;
        assert_eq!(served == 0, path == RmaPath::Map, "{path}: the owner's engine served {served} reads");
        assert!(matches!(front.read_load(NodeIndex(9)), Err(StateError::NoSuchNode(_))));
    }
}

#[test]
fn forged_torn_and_stale_records_are_ignored_and_counted() {
    for path in PATHS {
        let key = ClusterKey::new(b"secret");
        let (_front, nodes) = center("forged", path, initial_table(&[(1, 2)]), 3, &key);
        let impostor = Impostor::new(path, &key);
        let (_f, via_impostor) = reader_of(path, &key, impostor.endpoint.clone());
        let mut v = RecordValidator::new(key.clone(), 3, Duration::from_millis(200));
        let t0 = Instant::now();
        let one = NodeIndex(1);

        nodes[1].publish_load(&record(1, 100)).unwrap();
        let genuine_old = nodes[0].read_load(one).unwrap();
        assert!(v.accept(t0, one, &genuine_old).is_ok());
        nodes[1].publish_load(&record(1, 200)).unwrap();
        assert!(v.accept(t0, one, &nodes[0].read_load(one).unwrap()).is_ok());

        // A process without the key serves a plausible record claiming the node is idle.
        impostor.serve(&record(1, 0).encode(&ClusterKey::new(b"guess"), 100));
        let before = via_impostor.counters().torn_copies;
        assert_eq!(v.accept(t0, one, &via_impostor.read_load(one).unwrap()), Err(Rejection::Forged), "{path}");
        assert_eq!(
            via_impostor.counters().torn_copies - before,
            READ_TRIES as u64 - 1,
            "{path}: a copy that fails its MAC is read again before it is given up"
        );
        // A genuine record of node 2 served as node 1's.
        impostor.serve(&record(2, 0).encode(&key, 100));
        assert_eq!(v.accept(t0, one, &via_impostor.read_load(one).unwrap()), Err(Rejection::Forged), "{path}");
        // An old genuine record of node 1 replayed.
        impostor.serve(&genuine_old);
        assert_eq!(v.accept(t0, one, &via_impostor.read_load(one).unwrap()), Err(Rejection::Stale), "{path}");
        // A record caught mid-write forever (odd version): torn after every retry.
        let mut odd = record(1, 5).encode(&key, 300);
        odd[0] = 301;
        impostor.serve(&odd);
        assert_eq!(v.accept(t0, one, &via_impostor.read_load(one).unwrap()), Err(Rejection::Torn), "{path}");

        // The node publishes again, then stops: its record goes stale after 200 ms.
        nodes[1].publish_load(&record(1, 300)).unwrap();
        let words = nodes[0].read_load(one).unwrap();
        let t1 = t0 + Duration::from_millis(10);
        assert!(v.accept(t1, one, &words).is_ok());
        assert!(v.accept(t1 + Duration::from_millis(100), one, &words).is_ok());
        assert_eq!(v.accept(t1 + Duration::from_millis(300), one, &words), Err(Rejection::Stale));

        let c = v.counters();
        assert_eq!((c.accepted, c.forged, c.stale, c.torn), (4, 2, 2, 1), "{path}");
    }
}

/// The owner rewrites its record as fast as it can while another node reads it: every copy
/// the validator accepts is one the owner wrote (its fields agree with each other); a copy
/// that raced the writer is read again, and never judged forged.
#[test]
fn a_record_rewritten_under_its_readers_is_never_accepted_mixed() {
    for path in [RmaPath::Map, RmaPath::Shm] {
        let key = ClusterKey::new(b"k");
        let (_front, nodes) = center("torn", path, initial_table(&[(1, 1)]), 2, &key);
        let nodes = Arc::new(nodes);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (nodes, stop) = (nodes.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let r = LoadRecord {
                        completed: n,
                        busy_milli: (n % 2000) as u32,
                        queued_milli: (n % 7919) as u32,
                        connections: (n % 1000) as u32,
                        ..record(1, 0)
                    };
                    nodes[1].publish_load(&r).unwrap();
                }
                n
            })
        };
        let mut v = RecordValidator::new(key, 2, Duration::from_secs(5));
        let (mut accepted, deadline) = (0u64, Instant::now() + Duration::from_millis(400));
        while Instant::now() < deadline {
            if let Ok(r) = v.accept(Instant::now(), NodeIndex(1), &nodes[0].read_load(NodeIndex(1)).unwrap()) {
                let n = r.completed;
                assert_eq!(
                    (r.busy_milli, r.queued_milli, r.connections),
                    ((n % 2000) as u32, (n % 7919) as u32, (n % 1000) as u32),
                    "{path}: an accepted record mixes two writes"
                );
                accepted += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let written = writer.join().unwrap();
        let c = nodes[0].counters();
        eprintln!("{path}: {written} writes, {accepted} copies accepted, {} torn copies read again", c.torn_copies);
        assert!(accepted > 100, "{path}: {accepted} copies accepted");
        assert_eq!(v.counters().forged, 0, "{path}: a whole copy was judged forged");
    }
}

#[test]
fn only_nodes_may_swap_the_role_word_and_only_nodes_announce() {
    for path in [RmaPath::Map, RmaPath::Tcp] {
        let key = ClusterKey::new(b"k");
        let table = initial_table(&[(1, 2)]);
        let (front, nodes) = center("rights", path, table, 3, &key);
        // A stranger (a holder of the key, not a node of the center) reaches the role word:
        // it may read it, not swap it.
        let mut c = RmaConfig::new(NodeId(99));
        c.tcp.secret = key.derive("ulnet-dc rma");
        c.shm.secret = key.derive("ulnet-dc rma");
        let mut stranger = Rma::new(c).unwrap();
        let (peer, mode) = match front.endpoint() {
            RmaEndpoint::Shm(name) => (stranger.connect_shm(name), ulnet_core::rma::ImportMode::Map),
            RmaEndpoint::Tcp(addr) => (
                stranger.connect_tcp(&addr.to_string(), Duration::from_secs(5)).unwrap(),
                ulnet_core::rma::ImportMode::Channel,
            ),
        };
        let roles = stranger.import_with(peer, ROLES_SEGMENT, mode).unwrap();
        let mut word = [0u8; 8];
        stranger.get_blocking(&roles, 0, &mut word, Duration::from_secs(5)).unwrap();
        assert_eq!(RoleTable(u64::from_ne_bytes(word)), table);
        let next = table.with_role(NodeIndex(1), Some(Role::new(0, Tier::Proxy)));
        let r = stranger.compare_and_swap_blocking(&roles, 0, table.0, next.0, Duration::from_secs(5));
        assert_eq!(r, Err(RmaError::Access(AccessError::Denied)), "{path}");
        assert_eq!(front.read_roles().unwrap(), table, "{path}: the word is unchanged");
        // A node may.
        assert_eq!(nodes[2].cas_roles(table, next).unwrap(), CasOutcome::Swapped);
        assert_eq!(nodes[0].cas_roles(table, next).unwrap(), CasOutcome::Failed(next), "{path}");
        // The front is an observer: it has no inbox and announces nothing.
        assert!(matches!(front.announce(NodeIndex(0), next), Err(StateError::NotANode)));
        assert!(matches!(front.publish_load(&record(0, 0)), Err(StateError::NotANode)));
    }
}

#[test]
fn announcements_only_move_forward() {
    for path in PATHS {
        let key = ClusterKey::new(b"k");
        let t = initial_table(&[(1, 2)]);
        let (_front, nodes) = center("announce", path, t, 3, &key);
        let newer = t.with_role(NodeIndex(1), Some(Role::new(0, Tier::Proxy)));
        assert_eq!(nodes[0].announced().unwrap(), RoleTable::EMPTY, "nothing announced yet");
        nodes[1].announce(NodeIndex(0), newer).unwrap();
        nodes[2].announce(NodeIndex(0), t).unwrap();
        assert_eq!(nodes[0].announced().unwrap(), newer, "{path}");
        nodes[0].announce(NodeIndex(0), t).unwrap();
        assert_eq!(nodes[0].announced().unwrap(), newer, "{path}: to itself, too");
    }
}

/// Every node's helper runs on its own thread with its own handle, against the role word at
/// the front, each fed loads that keep changing which tier is overloaded; every table the
/// word holds is checked.
#[test]
fn concurrent_cas_decisions_from_every_helper_keep_tiers_populated() {
    for path in [RmaPath::Map, RmaPath::Tcp] {
        let key = ClusterKey::new(b"k");
        let start = initial_table(&[(3, 4)]);
        let (front, nodes) = center("cas", path, start, 7, &key);
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = HelperConfig {
            history_window: Duration::ZERO,
            settle: Duration::ZERO,
            nodes_per_change_max: 2,
            ..HelperConfig::lab()
        };
        let mut threads = Vec::new();
        for (me, state) in nodes.into_iter().enumerate() {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let mut helper = Helper::new(cfg, state.read_roles().unwrap());
                let (mut won, mut lost) = (0u64, 0u64);
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let table = state.read_roles().unwrap();
                    // Loads that flip between "proxies overloaded" and "apps overloaded".
                    let hot = if (round / 50 + me as u64).is_multiple_of(2) { Tier::Proxy } else { Tier::App };
                    let loads: Vec<Option<NodeLoad>> = (0..16u8)
                        .map(|i| {
                            table.role(NodeIndex(i)).map(|r| {
                                if r.tier == hot {
                                    NodeLoad { workers: 2.0, busy: 2.0, queued: 5.0 }
                                } else {
                                    NodeLoad { workers: 2.0, busy: 0.0, queued: 0.0 }
                                }
                            })
                        })
                        .collect();
                    if let Some(p) = helper.handle_observation(Instant::now(), table, &loads) {
                        let outcome = state.cas_roles(p.expected, p.proposed).unwrap();
                        match outcome {
                            CasOutcome::Swapped => {
                                won += 1;
                                for (n, _) in p.proposed.members() {
                                    state.announce(n, p.proposed).unwrap();
                                }
                            }
                            CasOutcome::Failed(actual) => {
                                lost += 1;
                                assert_ne!(actual, p.expected, "a failed CAS returns the table found");
                            }
                        }
                        helper.handle_cas(Instant::now(), &p, outcome);
                    }
                }
                // The handle (and its exports) outlives the loop until every helper stopped.
                (won, lost, state)
            }));
        }
        let deadline = Instant::now() + Duration::from_millis(700);
        let (mut seen, mut last) = (0u64, RoleTable::EMPTY);
        while Instant::now() < deadline {
            let t = front.read_roles().unwrap();
            assert!(t.validate().is_ok(), "{path}: the word holds an invalid table: {t:?}");
            assert_eq!(t.members().count(), 7, "{path}: a node vanished: {t:?}");
            if t != last {
                seen += 1;
                last = t;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let (mut won, mut lost) = (0, 0);
        let mut handles = Vec::new();
        for t in threads {
            let (w, l, state) = t.join().unwrap();
            won += w;
            lost += l;
            handles.push(state);
        }
        let end = front.read_roles().unwrap();
        assert!(end.validate().is_ok());
        assert!(won > 10, "{path}: helpers reconfigured the center ({won} changes)");
        assert_eq!(u64::from(end.epoch().wrapping_sub(start.epoch())), won % 65536, "{path}: one epoch per won CAS");
        eprintln!("{path}: {won} changes won, {lost} CASes lost, {seen} tables observed");
    }
}

proptest! {
    /// Any bytes in a slot are rejected or accepted, never a panic.
    #[test]
    fn random_slot_contents_never_panic(words in proptest::array::uniform8(any::<u64>()), slot in 0u8..16) {
        let key = ClusterKey::new(b"k");
        let mut v = RecordValidator::new(key, 16, Duration::from_secs(1));
        let r = v.accept(Instant::now(), NodeIndex(slot), &words);
        prop_assert!(r.is_err(), "random bytes pass the MAC: {r:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A node's HTTP parser given arbitrary bytes answers or closes; it never panics.
    #[test]
    fn random_bytes_on_an_http_connection_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048), head in any::<bool>()) {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut c = ulnet_dc::http::Conn::new(l.accept().unwrap().0).unwrap();
            let mut n = 0;
            while let Ok(Some(_)) = c.read_request() {
                n += 1;
            }
            n
        });
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        if head {
            s.write_all(b"GET /0/s/1 HTTP/1.1\r\n").unwrap();
        }
        s.write_all(&bytes).unwrap();
        drop(s);
        let _requests = server.join().unwrap();
    }
}
