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

/// The tracing session of the whole run; rounds switch it with pause and resume, as a
/// user switches tracing at run time (so no round pays for opening a file or a ring).
struct Session {
    path: std::path::PathBuf,
}

impl Session {
    fn start() -> Self {
        let path = std::env::temp_dir().join(format!("trace-cost-{}.ultrace", std::process::id()));
        trace::start(TraceConfig::new(&path, NodeId(0)).with_env()).unwrap();
        trace::pause();
        Session { path }
    }

    /// Runs `f` with tracing on (unless TRACE_COST_AA is set: then the "on" rounds run
    /// untraced too, which shows the harness's own bias) or off.
    fn round<T>(&self, on: bool, f: impl FnOnce() -> T) -> T {
        if on && std::env::var_os("TRACE_COST_AA").is_none() {
            trace::resume();
        }
        let r = f();
        trace::pause();
        r
    }

    /// Stops; returns (records, writer CPU ns per record).
    fn finish(self) -> (u64, f64) {
        let writer = writer_cpu_ns();
        let s = trace::stop().unwrap();
        let _ = std::fs::remove_file(&self.path);
        (s.records, writer as f64 / s.records.max(1) as f64)
    }
}

struct Row {
    name: &'static str,
    off: Vec<f64>,
    on: Vec<f64>,
    /// Records per unit and writer CPU ns per record, over the whole run.
    records: f64,
    writer: f64,
}

impl Row {
    fn new(name: &'static str) -> Self {
        Row { name, off: vec![], on: vec![], records: 0.0, writer: 0.0 }
    }

    /// `rounds` pairs of an untraced and a traced round of `units` units each.
    fn measure(name: &'static str, rounds: usize, units: u64, mut run: impl FnMut() -> f64) -> Row {
        let mut row = Row::new(name);
        run();
        let session = Session::start();
        for _ in 0..rounds {
            row.off.push(session.round(false, &mut run));
            row.on.push(session.round(true, &mut run));
        }
        let (records, writer) = session.finish();
        row.records = records as f64 / (units * rounds as u64) as f64;
        row.writer = writer;
        row
    }
    /// Prints the medians, and the median of the differences of the rounds of each pair
    /// (an off round and the on round right after it), which cancels slow drifts of load.
    fn print(self) {
        let paired: Vec<f64> = self.on.iter().zip(&self.off).map(|(a, b)| a - b).collect();
        let (off, on, added) = (median(self.off), median(self.on), median(paired));
        println!(
            "| {} | {off:.1} | {on:.1} | {added:+.1} ({:+.1}%) | {:.3} | {:.1} |",
            self.name,
            100.0 * added / off,
            self.records,
            self.writer,
        );
    }
}

/// Raw 8-byte messages, `burst` sent then all received: ns per message.
fn raw_stream(rounds: usize, burst: usize) -> Row {
    let (mut a, ch, mut b, _) = pair();
    let msg = [0x5au8; 8];
    let n = 200_000u64;
    let name = if burst == 1 { "raw 8 B, send 1 + receive 1" } else { "raw 8 B, bursts of 64" };
    Row::measure(name, rounds, n, || {
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
    })
}

/// One RPC at a time, 128-byte request and reply, client and server in this thread: ns per
/// round trip (4 messages: request sent and received, reply sent and received).
fn rpc_round_trip(rounds: usize) -> Row {
    let (a, ch, b, _) = pair();
    let mut client = Rpc::new(a, RpcConfig { workers: 0, ..Default::default() });
    let mut server = Rpc::new(b, RpcConfig { workers: 0, ..Default::default() });
    let echo = [0x3cu8; 128];
    server.register_inline(1, move |req, r| r.reply(&[&echo[..req.payload.len()]]));
    let request = vec![0xa5u8; 128];
    let n = 100_000u64;
    Row::measure("RPC 128 B round trip (4 messages)", rounds, n, || {
        per_call(n, || {
            assert!(matches!(client.call(ch, 1, &[&request], None).unwrap(), CallOutcome::Sent(_)));
            while server.poll(16, |_| {}) == 0 {}
            let mut done = false;
            while !done {
                client.poll(16, |e| done |= matches!(e, RpcEvent::Reply { .. }));
            }
        })
    })
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|r| r.parse().ok()).unwrap_or(7);
    // An optional second argument runs one part only (for profiling): clock, burst, single, rpc.
    let only = std::env::args().nth(2);
    let run = |part: &str| only.as_deref().is_none_or(|o| o == part);
    if run("clock") {
        clock_sources(rounds);
        println!();
    }
    println!("## Traced thread and writer (thread CPU ns, medians of {rounds} alternating rounds)");
    println!("| path | off | on | added (median of paired differences) | records per unit | writer ns per record |");
    println!("|---|---|---|---|---|---|");
    if run("burst") {
        raw_stream(rounds, 64).print();
    }
    if run("single") {
        raw_stream(rounds, 1).print();
    }
    if run("rpc") {
        rpc_round_trip(rounds).print();
    }
}
