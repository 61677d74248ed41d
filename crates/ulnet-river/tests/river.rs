//! The distributed queue between threads over real shared-memory channels: delivery,
//! credit flow control, end of stream, failures and protocol violations named by node.

use std::time::Duration;
use ulnet_core::SendOutcome;
use ulnet_river::mesh::{self, MeshConfig};
use ulnet_river::wire::{Header, Kind};
use ulnet_river::{PartitionSink, River, RiverConfig, RiverError, Sink};

/// A store that keeps what it gets and may be slow to take it.
#[derive(Default)]
struct Collect {
    records: Vec<u8>,
    delay: Option<Duration>,
    closed: bool,
}

impl Sink for Collect {
    fn sink_records(&mut self, records: &[u8]) -> Result<(), RiverError> {
        if let Some(d) = self.delay {
            std::thread::sleep(d);
        }
        self.records.extend_from_slice(records);
        Ok(())
    }
    fn close(&mut self) -> Result<(), RiverError> {
        self.closed = true;
        Ok(())
    }
}

const RS: usize = 100;

fn job(what: &str) -> String {
    format!("test-{what}-{}-{:x}", std::process::id(), rand::random::<u32>())
}

/// Record `seq` from node `from` to node `to`.
fn record(from: usize, to: usize, seq: u32) -> [u8; RS] {
    let mut r = [0u8; RS];
    r[0] = from as u8;
    r[1] = to as u8;
    r[2..6].copy_from_slice(&seq.to_le_bytes());
    r[99] = 0xee;
    r
}

fn small_config() -> RiverConfig {
    RiverConfig { chunk_records: 7, credits: 1, staged_chunks: 1, ..RiverConfig::default() }
}

/// Runs `nodes` nodes on threads over shared memory, each with a [`Collect`] store slowed
/// by `delay`: `feed` puts the node's records (and closes every sink it took); then the
/// node closes its side, runs dry and returns its store and counters.
fn run_nodes(
    what: &str,
    nodes: usize,
    config: RiverConfig,
    delay: Option<Duration>,
    feed: impl Fn(usize, &River<Collect>) + Clone + Send + 'static,
) -> Vec<(Collect, ulnet_river::RiverCounters)> {
    let job = job(what);
    let handles: Vec<_> = (0..nodes)
        .map(|rank| {
            let job = job.clone();
            let config = config.clone();
            let feed = feed.clone();
            std::thread::spawn(move || {
                let (ep, peers) = mesh::connect(&MeshConfig::shm(&job, rank, nodes)).unwrap();
                let store = Collect { delay, ..Default::default() };
                let river = River::new(ep, rank, peers, store, config, None);
                feed(rank, &river);
                river.close_local().unwrap();
                river.run_dry().unwrap();
                let counters = river.counters();
                let store = river.take_store().unwrap();
                // Keep channels up until everyone is dry.
                river.finish();
                std::thread::sleep(Duration::from_millis(200));
                river.shutdown();
                (store, counters)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Runs `nodes` nodes; each puts `per_peer` records to every node (itself included), one
/// at a time.
fn exchange(
    nodes: usize,
    per_peer: u32,
    config: RiverConfig,
    delay: Option<Duration>,
) -> Vec<(Collect, ulnet_river::RiverCounters)> {
    run_nodes("exchange", nodes, config, delay, move |rank, river| {
        let mut sinks = river.sinks();
        for seq in 0..per_peer {
            for (to, sink) in sinks.iter_mut().enumerate() {
                sink.sink_records(&record(rank, to, seq)).unwrap();
            }
        }
        for s in &mut sinks {
            s.close().unwrap();
        }
    })
}

/// Checks that node `rank` of `nodes` got `per_peer` records from every node, each node's
/// in the order it put them.
fn check_in_order(store: &Collect, rank: usize, nodes: usize, per_peer: u32) {
    assert_eq!(store.records.len(), nodes * per_peer as usize * RS);
    let mut next = vec![0u32; nodes];
    for r in store.records.chunks(RS) {
        let from = r[0] as usize;
        assert_eq!(r[1] as usize, rank, "delivered to the right node");
        assert_eq!(u32::from_le_bytes(r[2..6].try_into().unwrap()), next[from], "in order from node {from}");
        assert_eq!(r[99], 0xee);
        next[from] += 1;
    }
}

#[test]
fn every_record_arrives_in_order_per_source_with_one_credit() {
    let per_peer = 500;
    let out = exchange(3, per_peer, small_config(), None);
    for (rank, (store, counters)) in out.iter().enumerate() {
        assert!(store.closed, "the store is closed when the queue runs dry");
        check_in_order(store, rank, 3, per_peer);
        assert_eq!(counters.records_sent, 2 * per_peer as u64);
        assert_eq!(counters.records_received, 2 * per_peer as u64);
        assert_eq!(counters.records_local, per_peer as u64);
    }
}

/// Runs `nodes` nodes; each routes `per_peer` records for every node through a
/// [`PartitionSink`] in slices of 1 to 40 records of every destination (whole chunks are
/// packed straight into the channel, the rest staged).
fn exchange_partitioned(
    nodes: usize,
    per_peer: u32,
    config: RiverConfig,
) -> Vec<(Collect, ulnet_river::RiverCounters)> {
    run_nodes("partitioned", nodes, config, None, move |rank, river| {
        let mut part = PartitionSink::new(|r: &[u8]| usize::from(r[1]), river.sinks(), RS);
        let mut seq = 0u32;
        let mut slice = 1u32;
        while seq < per_peer {
            let n = slice.min(per_peer - seq);
            let records: Vec<u8> =
                (seq..seq + n).flat_map(|s| (0..nodes).flat_map(move |to| record(rank, to, s))).collect();
            part.sink_records(&records).unwrap();
            river.progress().unwrap();
            seq += n;
            slice = slice * 7 % 41;
        }
        part.close().unwrap();
    })
}

#[test]
fn records_routed_in_slices_arrive_in_order_whether_packed_or_staged() {
    let per_peer = 3000;
    // Chunks of 7 records with one credit (packing often refused) and the default chunks
    // with plenty.
    for config in [small_config(), RiverConfig { chunk_records: 30, ..RiverConfig::default() }] {
        let out = exchange_partitioned(3, per_peer, config.clone());
        for (rank, (store, counters)) in out.iter().enumerate() {
            check_in_order(store, rank, 3, per_peer);
            assert_eq!(counters.records_sent, 2 * per_peer as u64);
            assert!(counters.chunks_packed > 0, "{config:?}: {counters:?}");
            assert!(counters.chunks_packed < counters.chunks_sent, "{config:?}: {counters:?}");
        }
    }
}

#[test]
fn contiguous_records_are_packed_in_whole_chunks_and_arrive_in_order() {
    let out = run_nodes("contiguous", 2, RiverConfig::default(), None, |rank, river| {
        let mut to_peer = river.net_sink(1 - rank);
        // One record staged, then slices of 2,000 and 3 records.
        let mut seq = 0u32;
        for n in [1u32, 2000, 3, 2000] {
            let records: Vec<u8> = (seq..seq + n).flat_map(|s| record(rank, 1 - rank, s)).collect();
            to_peer.sink_records(&records).unwrap();
            seq += n;
        }
        to_peer.close().unwrap();
    });
    for (rank, (store, counters)) in out.iter().enumerate() {
        let got: Vec<u32> = store.records.chunks(RS).map(|r| u32::from_le_bytes(r[2..6].try_into().unwrap())).collect();
        assert_eq!(got, (0..4004).collect::<Vec<u32>>(), "node {rank} got every record in order");
        assert!(store.records.chunks(RS).all(|r| r[0] as usize == 1 - rank && r[99] == 0xee));
        assert!(counters.chunks_packed > 0 && counters.chunks_packed < counters.chunks_sent, "{counters:?}");
    }
}

#[test]
fn a_slow_store_stalls_its_senders_through_credit() {
    let out = exchange(2, 200, small_config(), Some(Duration::from_millis(1)));
    for (store, counters) in &out {
        assert_eq!(store.records.len(), 2 * 200 * RS);
        assert!(counters.credit_waits > 0, "senders waited for credit: {counters:?}");
    }
}

#[test]
fn a_peer_lost_before_its_end_of_stream_fails_the_river_naming_it() {
    let job = job("lost");
    let j2 = job.clone();
    let peer = std::thread::spawn(move || {
        let (ep, peers) = mesh::connect(&MeshConfig::shm(&j2, 1, 2)).unwrap();
        let river = River::new(ep, 1, peers, Collect::default(), small_config(), None);
        let mut to0 = river.net_sink(0);
        to0.sink_records(&record(1, 0, 0)).unwrap();
        // Gone without closing its sink: no end of stream.
        drop(to0);
        river.progress().unwrap();
        drop(river);
    });
    let (ep, peers) = mesh::connect(&MeshConfig::shm(&job, 0, 2)).unwrap();
    let river = River::new(ep, 0, peers, Collect::default(), small_config(), None);
    peer.join().unwrap();
    match river.close_local().and_then(|()| river.run_dry()) {
        Err(RiverError::NodeFailed { node: 1, reason }) => assert!(reason.contains("end of stream"), "{reason}"),
        other => panic!("expected node 1 to be named: {other:?}"),
    }
}

/// Node 1 is a raw endpoint that sends `messages` (whole wire messages) to node 0.
fn misbehaving_peer(messages: Vec<Vec<u8>>) -> RiverError {
    let job = job("bad");
    let j2 = job.clone();
    let peer = std::thread::spawn(move || {
        let (mut ep, peers) = mesh::connect(&MeshConfig::shm(&j2, 1, 2)).unwrap();
        let ch = peers[0].unwrap();
        for m in &messages {
            assert_eq!(ep.send(ch, &[m]).unwrap(), SendOutcome::Done);
        }
        std::thread::sleep(Duration::from_millis(500));
    });
    let (ep, peers) = mesh::connect(&MeshConfig::shm(&job, 0, 2)).unwrap();
    let river = River::new(ep, 0, peers, Collect::default(), RiverConfig::default(), None);
    // Closing sends our end of stream, receiving meanwhile: the error may surface there.
    let err = river.close_local().and_then(|()| river.run_dry()).unwrap_err();
    peer.join().unwrap();
    err
}

fn message(kind: Kind, aux: u32, value: u64, payload: &[u8]) -> Vec<u8> {
    let mut m = Header { kind, aux, value }.encode().to_vec();
    m.extend_from_slice(payload);
    m
}

#[test]
fn data_after_the_end_of_stream_is_refused_naming_the_peer() {
    let err =
        misbehaving_peer(vec![message(Kind::EndOfStream, 0, 0, &[]), message(Kind::Data, 0, 1, &record(1, 0, 0))]);
    assert!(
        matches!(&err, RiverError::Protocol { node: 1, reason } if reason.contains("after its end of stream")),
        "{err}"
    );
}

#[test]
fn an_end_of_stream_that_miscounts_is_refused() {
    let err =
        misbehaving_peer(vec![message(Kind::Data, 0, 1, &record(1, 0, 0)), message(Kind::EndOfStream, 0, 5, &[])]);
    assert!(
        matches!(&err, RiverError::Protocol { node: 1, reason } if reason.contains("declares 5 records, 1 arrived")),
        "{err}"
    );
}

#[test]
fn garbage_and_bad_lengths_are_refused() {
    let err = misbehaving_peer(vec![vec![0xff; 40]]);
    assert!(matches!(err, RiverError::Protocol { node: 1, .. }), "{err}");
    let err = misbehaving_peer(vec![message(Kind::Data, 0, 2, &record(1, 0, 0))]);
    assert!(matches!(err, RiverError::Protocol { node: 1, .. }), "{err}");
}

#[test]
fn an_abort_carries_the_peer_s_reason() {
    let err = misbehaving_peer(vec![message(Kind::Abort, 0, 9, b"disk full")]);
    assert!(matches!(&err, RiverError::Aborted { node: 1, reason } if reason == "disk full"), "{err}");
}

mod random_input {
    use super::*;
    use proptest::prelude::*;

    fn any_message() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 1..64),
            (1u8..=6, any::<u32>(), 0u64..4, proptest::collection::vec(any::<u8>(), 0..400)).prop_map(
                |(kind, aux, value, payload)| {
                    let mut m = vec![kind, ulnet_river::wire::VERSION, 0, 0];
                    m.extend_from_slice(&aux.to_le_bytes());
                    m.extend_from_slice(&value.to_le_bytes());
                    m.extend_from_slice(&payload);
                    m
                }
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Whatever a peer sends, the river ends with a result (an error naming the peer,
        /// or dry when the bytes happen to make a valid stream), never a panic or a hang.
        #[test]
        fn random_messages_from_a_peer_end_in_an_error_or_dry(messages in proptest::collection::vec(any_message(), 1..8)) {
            let job = job("fuzz");
            let j2 = job.clone();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let peer = std::thread::spawn(move || {
                let (mut ep, peers) = mesh::connect(&MeshConfig::shm(&j2, 1, 2)).unwrap();
                let ch = peers[0].unwrap();
                for m in &messages {
                    let _ = ep.send(ch, &[m]);
                }
                let _ = done_rx.recv_timeout(Duration::from_secs(10));
            });
            let (ep, peers) = mesh::connect(&MeshConfig::shm(&job, 0, 2)).unwrap();
            let config = RiverConfig { idle_timeout: Duration::from_millis(300), ..RiverConfig::default() };
            let river = River::new(ep, 0, peers, Collect::default(), config, None);
            let result = river.close_local().and_then(|()| river.run_dry());
            if let Err(e) = &result {
                let named = matches!(e, RiverError::Protocol { node: 1, .. } | RiverError::Aborted { node: 1, .. }
                    | RiverError::NodeFailed { node: 1, .. } | RiverError::Timeout { .. });
                prop_assert!(named, "unexpected error {e}");
            }
            done_tx.send(()).unwrap();
            peer.join().unwrap();
        }
    }
}
