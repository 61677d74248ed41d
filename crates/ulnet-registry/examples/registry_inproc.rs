//! The registry's protocol and disk cost without a network: N nodes in one process, each
//! with its own write-ahead log on disk (real fsync, group commit), messages handed over in
//! memory by one driver thread, and C closed-loop clients spread over the nodes, each setting
//! 64-byte values one after another. Not comparable to multi-process figures (no transport,
//! one thread runs every node); it shows what GUP's batching and pipelining allow.
//!
//! `cargo run --release -p ulnet-registry --example registry_inproc -- NODES [CLIENTS] [SECONDS] [DIR]`
//! prints one JSON object like `bench/peers/etcd-load`.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};
use ulnet_registry::gup::{Gup, GupConfig, NodeId, UpdateId, View};
use ulnet_registry::wal::{recover, Wal};
use ulnet_registry::{Registry, RegistryEvent};

struct DiskNode {
    reg: Registry,
    wal: Wal,
    durable: Receiver<u64>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let nodes: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16);
    let seconds: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let dir = PathBuf::from(args.get(4).cloned().unwrap_or_else(|| "/var/tmp/ulnet-registry-inproc".into()));
    let _ = std::fs::remove_dir_all(&dir);
    let voters: Vec<NodeId> = (0..nodes).map(NodeId).collect();
    let now = Instant::now();
    let mut net: Vec<DiskNode> = (0..nodes)
        .map(|i| {
            let d = dir.join(format!("n{i}"));
            recover(&d).expect("log dir");
            let gup = Gup::bootstrap(NodeId(i), voters.clone(), Registry::config(GupConfig::local()), now);
            let (wal, durable) = Wal::open(&d).expect("open log");
            DiskNode { reg: Registry::new(gup, 10_000), wal, durable }
        })
        .collect();
    for n in &mut net {
        n.reg.handle_view(now, View::new(1, voters.clone()));
    }
    let value = vec![b'v'; 64];
    // Client c sits on node c % nodes; its one outstanding set and when it started.
    let mut outstanding: HashMap<(u64, UpdateId), (usize, Instant)> = HashMap::new();
    let mut started = vec![false; clients];
    let mut counter = vec![0u64; clients];
    let mut latencies: Vec<Duration> = Vec::new();
    let mut inflight: VecDeque<(NodeId, NodeId, Vec<u8>)> = VecDeque::new();
    let warm_until = Instant::now() + Duration::from_secs(1);
    let end = warm_until + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let now = Instant::now();
        for (c, started) in started.iter_mut().enumerate() {
            let node = (c as u64) % nodes;
            if !*started && net[node as usize].reg.gup().is_normal() {
                *started = true;
                let id =
                    net[node as usize].reg.set(now, format!("bench/{c}/0").into_bytes(), value.clone()).expect("set");
                outstanding.insert((node, id), (c, now));
            }
        }
        let mut busy = false;
        for (i, n) in net.iter_mut().enumerate() {
            while let Ok(lsn) = n.durable.try_recv() {
                n.reg.handle_durable(now, lsn);
                busy = true;
            }
            n.reg.handle_timeout(now);
            let mut next = Vec::new();
            while let Some(ev) = n.reg.poll_event() {
                match ev {
                    RegistryEvent::Persist { lsn, record } => n.wal.append(lsn, &record).expect("append"),
                    RegistryEvent::SetDone { id, .. } | RegistryEvent::SetIndeterminate { id } => {
                        if let Some((c, t0)) = outstanding.remove(&(i as u64, id)) {
                            if t0 >= warm_until {
                                latencies.push(now - t0);
                            }
                            next.push(c);
                        }
                    }
                    _ => {}
                }
            }
            for c in next {
                counter[c] += 1;
                let key = format!("bench/{c}/{}", counter[c] % 1000).into_bytes();
                let id = n.reg.set(now, key, value.clone()).expect("set");
                outstanding.insert((i as u64, id), (c, now));
                busy = true;
            }
            while let Some((to, bytes)) = n.reg.poll_transmit() {
                inflight.push_back((NodeId(i as u64), to, bytes));
            }
        }
        while let Some((from, to, bytes)) = inflight.pop_front() {
            busy = true;
            // Delivered after every node ran: each node's sends of this round go out together.
            net[to.0 as usize].reg.handle_message(now, from, &bytes);
        }
        if !busy {
            std::thread::yield_now();
        }
    }
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies.get(((latencies.len().max(1) - 1) as f64 * p) as usize).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    println!(
        "{{\"system\":\"ulnet-inproc\",\"nodes\":{nodes},\"clients\":{clients},\"value_bytes\":64,\"ops\":{},\"seconds\":{seconds},\"updates_per_s\":{:.1},\"p50_ms\":{:.3},\"p99_ms\":{:.3}}}",
        latencies.len(),
        latencies.len() as f64 / seconds,
        pct(0.5),
        pct(0.99)
    );
    drop(net);
    let _ = std::fs::remove_dir_all(&dir);
}
