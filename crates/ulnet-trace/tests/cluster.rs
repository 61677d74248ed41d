//! A workload of known traffic — a fixed RPC pattern among four node processes, over shared
//! memory and over TCP — traced and analysed: the traces reproduce exactly the message
//! and byte counts of each endpoint's own counters, and the traffic matrix the pattern.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::trace::{self, Direction, MessageKind, TraceConfig};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, NodeId};
use ulnet_msg::rpc::{CallOutcome, Rpc, RpcConfig, RpcEvent};
use ulnet_trace::{analyze, load};

const NODES: usize = 4;
/// Calls each node makes to each other node.
const CALLS: usize = 300;
/// One-way messages each node sends to each other node.
const ONE_WAYS: usize = 40;
const ECHO: u16 = 1;
const NOTE: u16 = 2;
const BYE: u16 = 3;
const ROLE_ENV: &str = "ULNET_TRACE_TEST_ROLE";

/// Payload of call `c` from `i` to `j`: sizes from a fixed pattern, sent as two buffers
/// (even `c`) or one (odd `c`: with the header, a request a pair record can list).
fn request_parts(i: usize, j: usize, c: usize) -> (usize, usize) {
    (8 + (i * 7 + j * 3 + c) % 40, 20 + (c * 37 + i * 11) % 1200)
}

/// The reply to a request whose payload has `len` bytes.
fn reply_len(len: usize) -> usize {
    len / 2 + 8
}

/// Message sizes on the wire: the 24-byte RPC header in front of the payload.
const HEADER: u64 = ulnet_msg::wire::HEADER_LEN as u64;

fn run_node(index: usize, dir: &Path, transport: &str) {
    let config = EndpointConfig { node_id: NodeId(index as u32), ..Default::default() };
    let mut ep = Endpoint::new(config);
    let mut peers: Vec<Option<ChannelId>> = vec![None; NODES];
    let timeout = Duration::from_secs(20);
    match transport {
        "shm" => {
            let run = dir.file_name().unwrap().to_string_lossy().to_string();
            ep.listen_shm(&format!("{run}-{index}")).unwrap();
            for (j, peer) in peers.iter_mut().enumerate().take(index) {
                *peer = Some(ep.connect_shm(&format!("{run}-{j}"), timeout).unwrap());
            }
        }
        _ => {
            let addr = ep.listen_tcp("127.0.0.1:0").unwrap();
            let tmp = dir.join(format!("addr-{index}.tmp"));
            std::fs::write(&tmp, addr.to_string()).unwrap();
            std::fs::rename(&tmp, dir.join(format!("addr-{index}"))).unwrap();
            for (j, peer) in peers.iter_mut().enumerate().take(index) {
                let deadline = Instant::now() + timeout;
                let addr = loop {
                    if let Ok(a) = std::fs::read_to_string(dir.join(format!("addr-{j}"))) {
                        break a;
                    }
                    assert!(Instant::now() < deadline, "node {j} never listened");
                    std::thread::sleep(Duration::from_millis(5));
                };
                *peer = Some(ep.connect_tcp(&addr, timeout).unwrap());
            }
        }
    }
    for _ in index + 1..NODES {
        let ch = ep.accept(timeout).unwrap();
        // The handshake told us who it is.
        let j = ep.peer_node(ch).expect("the handshake names the peer").0 as usize;
        assert!(j > index && peers[j].is_none());
        peers[j] = Some(ch);
    }
    trace::start(TraceConfig::new(dir.join(format!("node-{index}.ultrace")), NodeId(index as u32))).unwrap();

    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    rpc.register_inline(ECHO, |req, replier| {
        let reply = vec![0x5a; reply_len(req.payload.len())];
        // Two parts or one: a reply of header and one part pairs with its request.
        if req.payload.len() % 3 != 0 {
            replier.reply(&[&reply[..8], &reply[8..]]);
        } else {
            replier.reply(&[&reply]);
        }
    });
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let byes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s = served.clone();
    rpc.register_inline(NOTE, move |_, _| {
        s.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let b = byes.clone();
    rpc.register_inline(BYE, move |_, _| {
        b.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let data = vec![0xa5u8; 4096];
    let mut next_call = [0usize; NODES];
    let mut next_note = [0usize; NODES];
    let mut replies = 0usize;
    let mut bye_sent = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    let load = |a: &std::sync::Arc<std::sync::atomic::AtomicUsize>| a.load(std::sync::atomic::Ordering::Relaxed);
    loop {
        assert!(Instant::now() < deadline, "node {index} timed out: {replies} replies");
        for j in (0..NODES).filter(|&j| j != index) {
            let ch = peers[j].unwrap();
            while next_call[j] < CALLS {
                let (a, b) = request_parts(index, j, next_call[j]);
                let whole = [&data[..a + b]];
                let parts = [&data[..a], &data[a..a + b]];
                let payload: &[&[u8]] = if next_call[j] % 2 == 0 { &parts } else { &whole };
                match rpc.call(ch, ECHO, payload, None).unwrap() {
                    CallOutcome::Sent(_) => next_call[j] += 1,
                    CallOutcome::NoResource => break,
                }
            }
            while next_note[j] < ONE_WAYS {
                let len = 100 + 13 * next_note[j];
                match rpc.one_way(ch, NOTE, &[&data[..len]]).unwrap() {
                    ulnet_core::SendOutcome::Done => next_note[j] += 1,
                    _ => break,
                }
            }
        }
        rpc.poll(256, |e| match e {
            RpcEvent::Reply { data, .. } => {
                assert!(data.len() >= 8);
                replies += 1;
            }
            other => panic!("node {index}: {other:?}"),
        });
        let all_mine = replies == CALLS * (NODES - 1) && next_note.iter().sum::<usize>() == ONE_WAYS * (NODES - 1);
        let echoes = rpc.counters().served as usize - load(&served) - load(&byes);
        let all_theirs = load(&served) == ONE_WAYS * (NODES - 1) && echoes == CALLS * (NODES - 1);
        if all_mine && all_theirs && !bye_sent {
            for j in (0..NODES).filter(|&j| j != index) {
                while rpc.one_way(peers[j].unwrap(), BYE, &[b"bye"]).unwrap() != ulnet_core::SendOutcome::Done {
                    rpc.poll(64, |_| {});
                }
            }
            bye_sent = true;
        }
        if bye_sent && load(&byes) == NODES - 1 {
            break;
        }
    }
    rpc.endpoint().flush_sends();
    let summary = trace::stop().unwrap();
    let c = rpc.endpoint().counters();
    println!(
        "COUNTERS {} {} {} {} {} {}",
        c.messages_sent, c.bytes_sent, c.deliveries_received, c.bytes_received, summary.records, summary.dropped
    );
    // Stay until every peer has read our bye (a channel closed early would fail theirs).
    std::thread::sleep(Duration::from_millis(300));
}

fn cluster(test_name: &str, transport: &str) {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        let mut parts = role.split(',');
        let (index, dir) = (parts.next().unwrap().parse().unwrap(), PathBuf::from(parts.next().unwrap()));
        run_node(index, &dir, transport);
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "ulnet-trace-{transport}-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let children: Vec<_> = (0..NODES)
        .map(|i| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
                .env(ROLE_ENV, format!("{i},{}", dir.display()))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut counters = Vec::new();
    for mut child in children {
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        // The test harness may print its "test ... " prefix on the same line.
        let lines: Vec<String> = out.lines().map(Result::unwrap).collect();
        let line = lines.iter().find(|l| l.contains("COUNTERS ")).expect("a node reported");
        let report = &line[line.find("COUNTERS ").unwrap() + 9..];
        let v: Vec<u64> = report.split_whitespace().take(6).map(|x| x.parse().unwrap()).collect();
        assert!(child.wait().unwrap().success());
        counters.push(v);
    }
    let files: Vec<PathBuf> = (0..NODES).map(|i| dir.join(format!("node-{i}.ultrace"))).collect();
    let trace = load::load(&files).unwrap();
    assert!(trace.same_clock);
    for (i, c) in counters.iter().enumerate() {
        let (sent, sent_bytes, delivered, delivered_bytes, records, dropped) = (c[0], c[1], c[2], c[3], c[4], c[5]);
        assert_eq!(dropped, 0);
        let mine: Vec<_> = trace.messages.iter().filter(|m| m.file as usize == i).collect();
        // A request and its response seen by one side may share a record (a pair).
        let pairs = mine.len() as u64 - records;
        assert!(pairs > 0 && pairs <= records, "node {i}: {pairs} pairs in {records} records");
        let sends: Vec<_> = mine.iter().filter(|m| m.direction == Direction::Send).collect();
        let recvs: Vec<_> = mine.iter().filter(|m| m.direction == Direction::Receive).collect();
        // A run record stands for `count` messages of `size` bytes each.
        let tally = |records: &[&&load::Message]| {
            records.iter().fold((0, 0), |(n, b), m| (n + u64::from(m.count), b + m.size * u64::from(m.count)))
        };
        assert_eq!(tally(&sends), (sent, sent_bytes), "node {i}: send records vs messages_sent, bytes_sent");
        assert_eq!(tally(&recvs), (delivered, delivered_bytes), "node {i}: receive records vs deliveries_received");
        assert!(sends.iter().all(|m| m.src == i as u32) && recvs.iter().all(|m| m.dst == i as u32));
    }
    let study = analyze::analyze(&trace, &Default::default());
    assert_eq!(study.dropped, 0);
    for i in 0..NODES {
        for j in (0..NODES).filter(|&j| j != i) {
            // i -> j: i's calls to j, replies to j's calls, i's one-ways and its bye.
            let calls: u64 = (0..CALLS).map(|c| request_parts(i, j, c)).map(|(a, b)| HEADER + (a + b) as u64).sum();
            let replies: u64 =
                (0..CALLS).map(|c| request_parts(j, i, c)).map(|(a, b)| HEADER + reply_len(a + b) as u64).sum();
            let notes: u64 = (0..ONE_WAYS).map(|n| HEADER + 100 + 13 * n as u64).sum();
            let cell = study.cell(i as u32, j as u32).unwrap();
            assert_eq!(cell.messages, (2 * CALLS + ONE_WAYS + 1) as u64, "{i} -> {j}");
            assert_eq!(cell.bytes, calls + replies + notes + HEADER + 3, "{i} -> {j} bytes");
        }
        assert!(study.cell(i as u32, i as u32).is_none());
    }
    let kind = |k: &str| study.kinds.iter().find(|c| c.kind == k).map_or(0, |c| c.messages);
    assert_eq!(kind(MessageKind::Request.name()), (NODES * (NODES - 1) * CALLS) as u64);
    assert_eq!(kind(MessageKind::Response.name()), (NODES * (NODES - 1) * CALLS) as u64);
    let latency = study.latency.unwrap();
    assert_eq!((latency.pairs, latency.unanswered), (NODES * (NODES - 1) * CALLS, 0));
    assert_eq!(latency.stages.len(), 4, "one host: stages between processes are measured");
    // Requests are three buffers (header and two payload parts) or two (one part), as sent;
    // replies too, except those the message layer had to copy into one buffer because the
    // channel was full.
    let sends = || trace.messages.iter().filter(|m| m.direction == Direction::Send);
    let requests = |n: u8| sends().filter(|m| m.kind == MessageKind::Request && m.buffers == n).count();
    assert_eq!((requests(3), requests(2)), (NODES * (NODES - 1) * CALLS / 2, NODES * (NODES - 1) * CALLS / 2));
    let replies = |n: u8| sends().filter(|m| m.kind == MessageKind::Response && m.buffers == n).count();
    assert_eq!(replies(1) + replies(2) + replies(3), NODES * (NODES - 1) * CALLS);
    let of = |n: u8| study.buffers_per_message.iter().find(|b| b.buffers == n).map_or(0, |b| b.messages);
    // One-way notes and byes are two buffers too (header and one part).
    let one_ways = NODES * (NODES - 1) * (ONE_WAYS + 1);
    assert_eq!(of(3) + of(2), (requests(3) + requests(2) + replies(3) + replies(2) + one_ways) as u64);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn four_nodes_over_shm_trace_matches_counters() {
    cluster("four_nodes_over_shm_trace_matches_counters", "shm");
}

#[test]
fn four_nodes_over_tcp_trace_matches_counters() {
    cluster("four_nodes_over_tcp_trace_matches_counters", "tcp");
}
