//! What each part of per-message tracing costs, in CPU time of the traced thread (so the
//! figures hold on a loaded machine, where wall-clock rates swing by 10x between runs).
//!
//! Two endpoints joined by a shared-memory channel run in ONE thread: a message is sent,
//! then polled, with no waiting, so the thread's CPU time per message is the work of the
//! send and receive paths themselves. Rounds with tracing off and on alternate and the
//! medians are compared. The tracer's writer thread is measured separately (its own CPU
//! time per record written), since on a 2-core host it competes with the traced threads.
//!
//! Run: `cargo run --release -p ulnet-msg --example trace_cost [-- ROUNDS]`
//! (bench/trace-overhead.sh runs it). Environment: the `ULNET_TRACE_*` variables of
//! `ulnet_core::trace` apply to the traced rounds (for example `ULNET_TRACE_SAMPLE=1`).

use std::time::Duration;
use ulnet_core::trace::{self, TraceConfig};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, NodeId, SendOutcome};
use ulnet_msg::rpc::{CallOutcome, Rpc, RpcConfig, RpcEvent};

fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn clock_ns(id: rustix::time::ClockId) -> u64 {
    let t = rustix::time::clock_gettime(id);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU nanoseconds per call of `f`, over `n` calls.
fn per_call(n: u64, mut f: impl FnMut()) -> f64 {
    let t = cpu_ns();
    for _ in 0..n {
        f();
    }
    (cpu_ns() - t) as f64 / n as f64
}

fn clock_sources(rounds: usize) {
    let n = 2_000_000;
    let mut acc = 0u64;
    let mut rows: Vec<(&str, Vec<f64>)> = vec![
        ("rdtsc", vec![]),
        ("rdtscp", vec![]),
        ("clock_gettime(MONOTONIC), vDSO", vec![]),
        ("clock_gettime(MONOTONIC_COARSE), vDSO", vec![]),
        ("a shared atomic (the session ticker)", vec![]),
    ];
    let ticker = std::sync::atomic::AtomicU64::new(1);
    for _ in 0..rounds {
        // SAFETY: RDTSC and RDTSCP have no preconditions on x86-64.
        rows[0].1.push(per_call(n, || acc = acc.wrapping_add(unsafe { core::arch::x86_64::_rdtsc() })));
        rows[1].1.push(per_call(n, || {
            let mut aux = 0u32;
            // SAFETY: as above.
            acc = acc.wrapping_add(unsafe { core::arch::x86_64::__rdtscp(&mut aux) });
        }));
        rows[2].1.push(per_call(n, || acc = acc.wrapping_add(clock_ns(rustix::time::ClockId::Monotonic))));
        rows[3].1.push(per_call(n, || acc = acc.wrapping_add(clock_ns(rustix::time::ClockId::MonotonicCoarse))));
        rows[4].1.push(per_call(n, || {
            acc = acc.wrapping_add(std::hint::black_box(&ticker).load(std::sync::atomic::Ordering::Relaxed))
        }));
    }
    println!("## Time sources (thread CPU ns per read, median of {rounds} rounds; checksum {})", acc % 10);
    println!("| source | ns per read |\n|---|---|");
    for (name, v) in rows {
        println!("| {name} | {:.2} |", median(v));
    }
}

/// Two endpoints of this thread joined by a shared-memory channel.
fn pair() -> (Endpoint, ChannelId, Endpoint, ChannelId) {
    let name = format!("trace-cost-{}", std::process::id());
    let mut server = Endpoint::new(EndpointConfig { node_id: NodeId(1), ..Default::default() });
    server.listen_shm(&name).unwrap();
    let connector = std::thread::spawn(move || {
        let mut client = Endpoint::new(EndpointConfig { node_id: NodeId(0), ..Default::default() });
        let ch = client.connect_shm(&name, Duration::from_secs(10)).unwrap();
        (client, ch)
    });
    let sch = server.accept(Duration::from_secs(10)).unwrap();
    let (client, ch) = connector.join().unwrap();
    (client, ch, server, sch)
}

/// The writer thread's CPU time so far (ns), from /proc (0 when it is not running).
fn writer_cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return 0 };
    for task in dir.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "ulnet-trace" {
            // schedstat: time on the CPU (ns), time waiting to run, timeslices.
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            return stat.split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or(0);
        }
    }
    0
}

struct Traced {
    on: bool,
    path: std::path::PathBuf,
}

impl Traced {
    fn start(on: bool) -> Self {
        let path = std::env::temp_dir().join(format!("trace-cost-{}.ultrace", std::process::id()));
        if on {
            trace::start(TraceConfig::new(&path, NodeId(0)).with_env()).unwrap();
        }
        Traced { on, path }
    }
    /// Stops; returns (records, writer CPU ns per record).
    fn finish(self) -> (u64, f64) {
        if !self.on {
            return (0, 0.0);
        }
        let writer = writer_cpu_ns();
        let s = trace::stop().unwrap();
        let _ = std::fs::remove_file(&self.path);
        (s.records, writer as f64 / s.records.max(1) as f64)
    }
}

struct Row {
    name: &'static str,
    unit: &'static str,
    off: Vec<f64>,
    on: Vec<f64>,
    records: Vec<f64>,
    writer: Vec<f64>,
}

impl Row {
    fn new(name: &'static str, unit: &'static str) -> Self {
        Row { name, unit, off: vec![], on: vec![], records: vec![], writer: vec![] }
    }
    fn print(self) {
        let (off, on) = (median(self.off), median(self.on));
        println!(
            "| {} | {off:.1} | {on:.1} | {:+.1} ({:+.1}%) | {:.2} | {:.1} |",
            self.name,
            on - off,
            100.0 * (on - off) / off,
            median(self.records),
            median(self.writer),
        );
        let _ = self.unit;
    }
}

/// Raw 8-byte messages, `burst` sent then all received: ns per message.
fn raw_stream(rounds: usize, burst: usize) -> Row {
    let (mut a, ch, mut b, _) = pair();
    let msg = [0x5au8; 8];
    let n = 200_000u64;
    let mut row = Row::new(if burst == 1 { "raw 8 B, send 1 + receive 1" } else { "raw 8 B, bursts of 64" }, "msg");
    let run = |a: &mut Endpoint, b: &mut Endpoint| {
        per_call(n / burst as u64, || {
            for _ in 0..burst {
                while a.send(ch, &[&msg]).unwrap() != SendOutcome::Done {
                    b.poll(256, |_| {});
                }
            }
            let mut got = 0;
            while got < burst {
                got += b.poll(256, |_| {});
            }
        }) / burst as f64
    };
    run(&mut a, &mut b);
    for _ in 0..rounds {
        for on in [false, true] {
            let t = Traced::start(on);
            let ns = run(&mut a, &mut b);
            let (records, writer) = t.finish();
            if on {
                row.on.push(ns);
                row.records.push(records as f64 / n as f64);
                row.writer.push(writer);
            } else {
                row.off.push(ns);
            }
        }
    }
    row
}

/// One RPC at a time, 128-byte request and reply, client and server in this thread: ns per
/// round trip (4 messages: request sent and received, reply sent and received).
fn rpc_round_trip(rounds: usize) -> Row {
    let (a, ch, b, _) = pair();
    let mut client = Rpc::new(a, RpcConfig { workers: 0, ..Default::default() });
    let mut server = Rpc::new(b, RpcConfig { workers: 0, ..Default::default() });
    let echo = vec![0x3cu8; 128];
    server.register_inline(1, move |req, r| r.reply(&[&echo[..req.payload.len()]]));
    let request = vec![0xa5u8; 128];
    let n = 100_000u64;
    let mut row = Row::new("RPC 128 B round trip (4 messages)", "call");
    let run = |client: &mut Rpc, server: &mut Rpc| {
        per_call(n, || {
            assert!(matches!(client.call(ch, 1, &[&request], None).unwrap(), CallOutcome::Sent(_)));
            while server.poll(16, |_| {}) == 0 {}
            let mut done = false;
            while !done {
                client.poll(16, |e| done |= matches!(e, RpcEvent::Reply { .. }));
            }
        })
    };
    run(&mut client, &mut server);
    for _ in 0..rounds {
        for on in [false, true] {
            let t = Traced::start(on);
            let ns = run(&mut client, &mut server);
            let (records, writer) = t.finish();
            if on {
                row.on.push(ns);
                row.records.push(records as f64 / n as f64);
                row.writer.push(writer);
            } else {
                row.off.push(ns);
            }
        }
    }
    row
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|r| r.parse().ok()).unwrap_or(7);
    clock_sources(rounds);
    println!();
    println!("## Traced thread and writer (thread CPU ns, medians of {rounds} alternating rounds)");
    println!("| path | off | on | added | records per unit | writer ns per record |");
    println!("|---|---|---|---|---|---|");
    raw_stream(rounds, 64).print();
    raw_stream(rounds, 1).print();
    rpc_round_trip(rounds).print();
}
