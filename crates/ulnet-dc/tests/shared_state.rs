//! The one-host shared state: records published and read across handles, forged and stale
//! records ignored and counted, concurrent compare-and-swaps from every helper.

use proptest::prelude::*;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_dc::load::{ClusterKey, LoadRecord, RecordValidator, Rejection, SLOT_WORDS};
use ulnet_dc::policy::{Helper, HelperConfig, NodeLoad};
use ulnet_dc::role::{initial_table, NodeIndex, Role, RoleTable, Tier};
use ulnet_dc::state::shm::{slot_offset, ShmState};
use ulnet_dc::state::{CasOutcome, SharedState};

fn state_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ulnet-dc-test-{name}-{}", std::process::id()))
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

#[test]
fn a_published_record_is_read_by_another_handle() {
    let path = state_path("publish");
    let key = ClusterKey::new(b"secret");
    let table = initial_table(&[(1, 2)]);
    let observer = ShmState::create(&path, 3, table, key.clone()).unwrap();
    let node = ShmState::open(&path, Some(NodeIndex(2)), key.clone()).unwrap();
    node.publish_load(&record(2, 1500)).unwrap();
    let mut v = RecordValidator::new(key, 3, Duration::from_secs(1));
    let got = v.accept(Instant::now(), NodeIndex(2), &observer.read_load(NodeIndex(2)).unwrap()).unwrap();
    assert_eq!(got, record(2, 1500));
    assert_eq!(
        v.accept(Instant::now(), NodeIndex(1), &observer.read_load(NodeIndex(1)).unwrap()),
        Err(Rejection::Absent)
    );
    assert_eq!(observer.read_roles().unwrap(), table);
    std::fs::remove_file(path).ok();
}

#[test]
fn forged_and_stale_records_are_ignored_and_counted() {
    let path = state_path("forged");
    let key = ClusterKey::new(b"secret");
    let observer = ShmState::create(&path, 3, initial_table(&[(1, 2)]), key.clone()).unwrap();
    let node = ShmState::open(&path, Some(NodeIndex(1)), key.clone()).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let forge = |words: &[u64; SLOT_WORDS]| {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        file.write_all_at(&bytes, slot_offset(NodeIndex(1)) as u64).unwrap();
    };
    let mut v = RecordValidator::new(key.clone(), 3, Duration::from_millis(200));
    let t0 = Instant::now();

    node.publish_load(&record(1, 100)).unwrap();
    let genuine_old = observer.read_load(NodeIndex(1)).unwrap();
    assert!(v.accept(t0, NodeIndex(1), &genuine_old).is_ok());
    node.publish_load(&record(1, 200)).unwrap();
    assert!(v.accept(t0, NodeIndex(1), &observer.read_load(NodeIndex(1)).unwrap()).is_ok());

    // A process without the key writes a plausible record claiming the node is idle.
    forge(&record(1, 0).encode(&ClusterKey::new(b"guess"), 100));
    assert_eq!(v.accept(t0, NodeIndex(1), &observer.read_load(NodeIndex(1)).unwrap()), Err(Rejection::Forged));
    // A genuine record of node 2 copied into node 1's slot.
    forge(&record(2, 0).encode(&key, 100));
    assert_eq!(v.accept(t0, NodeIndex(1), &observer.read_load(NodeIndex(1)).unwrap()), Err(Rejection::Forged));
    // An old genuine record of node 1 replayed into its slot.
    forge(&genuine_old);
    assert_eq!(v.accept(t0, NodeIndex(1), &observer.read_load(NodeIndex(1)).unwrap()), Err(Rejection::Stale));

    // The node publishes again, then stops: its record goes stale after 200 ms.
    node.publish_load(&record(1, 300)).unwrap();
    let words = observer.read_load(NodeIndex(1)).unwrap();
    let t1 = t0 + Duration::from_millis(10);
    assert!(v.accept(t1, NodeIndex(1), &words).is_ok());
    assert!(v.accept(t1 + Duration::from_millis(100), NodeIndex(1), &words).is_ok());
    assert_eq!(v.accept(t1 + Duration::from_millis(300), NodeIndex(1), &words), Err(Rejection::Stale));

    let c = v.counters();
    assert_eq!((c.accepted, c.forged, c.stale), (4, 2, 2));
    std::fs::remove_file(path).ok();
}

#[test]
fn announcements_only_move_forward() {
    let path = state_path("announce");
    let key = ClusterKey::new(b"k");
    let t = initial_table(&[(1, 2)]);
    let observer = ShmState::create(&path, 3, t, key.clone()).unwrap();
    let node = ShmState::open(&path, Some(NodeIndex(0)), key).unwrap();
    let newer = t.with_role(NodeIndex(1), Some(Role::new(0, Tier::Proxy)));
    observer.announce(NodeIndex(0), newer).unwrap();
    observer.announce(NodeIndex(0), t).unwrap();
    assert_eq!(node.announced().unwrap(), newer);
    std::fs::remove_file(path).ok();
}

/// Every node's helper runs on its own thread against the shared word, each fed loads that
/// keep changing which tier is overloaded; every table the word holds is checked.
#[test]
fn concurrent_cas_decisions_from_every_helper_keep_tiers_populated() {
    let path = state_path("cas");
    let key = ClusterKey::new(b"k");
    let start = initial_table(&[(3, 4)]);
    let observer = Arc::new(ShmState::create(&path, 7, start, key.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = HelperConfig {
        history_window: Duration::ZERO,
        settle: Duration::ZERO,
        nodes_per_change_max: 2,
        ..HelperConfig::lab()
    };
    let mut threads = Vec::new();
    for me in 0..7u8 {
        let state = ShmState::open(&path, Some(NodeIndex(me)), key.clone()).unwrap();
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut helper = Helper::new(cfg, state.read_roles().unwrap());
            let (mut won, mut lost) = (0u64, 0u64);
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let table = state.read_roles().unwrap();
                // Loads that flip between "proxies overloaded" and "apps overloaded".
                let hot = if (round / 50 + u64::from(me)).is_multiple_of(2) { Tier::Proxy } else { Tier::App };
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
                            for n in 0..7 {
                                state.announce(NodeIndex(n), p.proposed).unwrap();
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
            (won, lost)
        }));
    }
    let deadline = Instant::now() + Duration::from_millis(700);
    let mut seen = 0u64;
    let mut last = RoleTable::EMPTY;
    while Instant::now() < deadline {
        let t = observer.read_roles().unwrap();
        assert!(t.validate().is_ok(), "the word holds an invalid table: {t:?}");
        assert_eq!(t.members().count(), 7, "a node vanished: {t:?}");
        if t != last {
            seen += 1;
            last = t;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (mut won, mut lost) = (0, 0);
    for t in threads {
        let (w, l) = t.join().unwrap();
        won += w;
        lost += l;
    }
    let end = observer.read_roles().unwrap();
    assert!(end.validate().is_ok());
    assert!(won > 10, "helpers reconfigured the center ({won} changes)");
    assert_eq!(u64::from(end.epoch().wrapping_sub(start.epoch())), won % 65536, "one epoch per won CAS");
    eprintln!("{won} changes won, {lost} CASes lost, {seen} tables observed");
    std::fs::remove_file(path).ok();
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
