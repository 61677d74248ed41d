//! Tracing on against off in ONE pair of processes, switched every few milliseconds: the
//! RPC latency benchmark's ping-pong (128-byte echo over shared memory, client and server
//! in two processes), with both processes switching tracing on and off on the same
//! schedule of the trace clock (the time-stamp counter, shared by every core). Each block
//! of the schedule (2^24 ticks, about 6 ms) gets its own median one-way latency, and each
//! traced block is compared with the untraced block just before it.
//!
//! Why: on a shared 2-core machine, the rate of whole benchmark runs swings by ±10% from
//! one run to the next as other work comes and goes, more than the cost being measured;
//! blocks a few milliseconds apart see nearly the same machine, so the median of their
//! paired ratios shows a few percent where whole runs cannot.
//!
//! Each block is summed up two ways: its median, and its *trimmed mean* (the mean of the
//! round trips between its 10th and 90th percentiles). The median moves in steps of the
//! pollers' spin-loop period (5 ns one-way on the guest this was built on, 3% of a 0.14 us
//! latency), so a cost under one step shows in it only as a step in some blocks; the
//! trimmed mean averages over the steps, and leaves out the round trips a preemption hit.
//!
//! The client is pinned to the first CPU of `TRACE_AB_CPUS` (default `0,1`) and the server
//! to the second (an empty value: no pinning), so the two busy-polling processes never take
//! turns on one CPU.
//!
//! With `stream` after SECONDS it runs the message-rate benchmark's stream instead: 8-byte
//! messages one way as fast as they go, the receiver counting those that arrive in each
//! block; each traced block's count is compared with the untraced block's before it.
//!
//! Run: `cargo run --release -p ulnet-msg --example trace_ab [-- SECONDS [stream]]`
//! (default 3).
//! The `ULNET_TRACE_*` variables of `ulnet_core::trace` apply to both processes. With
//! `TRACE_AB_AA` set, the "traced" blocks stay untraced too: the ratio then shows the
//! harness's own bias and spread (an A/A run).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::trace::{self, TraceConfig};
use ulnet_core::{Endpoint, EndpointConfig, Event, NodeId, SendOutcome};
use ulnet_msg::rpc::{CallOutcome, Rpc, RpcConfig, RpcEvent};

/// A block of the schedule is 2^BLOCK_SHIFT ticks; odd blocks are traced.
const BLOCK_SHIFT: u32 = 24;
/// Calls that start this many ticks or less after a block began are not counted: the
/// server switches at most 64 polls (a few microseconds) after the block begins.
const GUARD_TICKS: u64 = 1 << 16;
const METHOD: u16 = 1;
const SIZE: usize = 128;
/// The message size of the stream test (as `ulnet bench msg-rate`).
const STREAM_SIZE: usize = 8;

fn block(t: u64) -> u64 {
    t >> BLOCK_SHIFT
}

fn traced_block(b: u64) -> bool {
    b & 1 == 1
}

/// Switches tracing to what the schedule says now.
fn follow(on: &mut bool) {
    let want = traced_block(block(trace::now()));
    if want != *on {
        if want && std::env::var_os("TRACE_AB_AA").is_none() {
            trace::resume();
        } else {
            trace::pause();
        }
        *on = want;
    }
}

/// Pins this process to the CPU of `TRACE_AB_CPUS` for `side` (0: client, 1: server).
fn pin(side: usize) {
    let cpus = std::env::var("TRACE_AB_CPUS").unwrap_or_else(|_| "0,1".into());
    let Some(cpu) = cpus.split(',').nth(side).and_then(|c| c.trim().parse::<usize>().ok()) else { return };
    let mut set = rustix::process::CpuSet::new();
    set.set(cpu);
    if let Err(e) = rustix::process::sched_setaffinity(None, &set) {
        eprintln!("trace_ab: cannot pin to CPU {cpu}: {e}");
    }
}

fn start_trace(path: &Path, node: NodeId) {
    trace::start(TraceConfig::new(path, node).with_env()).expect("tracing starts");
    trace::pause();
}

/// The passive side's start: pinned, listening on `name`, then the peer accepted and a
/// paused trace session into `path`.
fn accept_traced(name: &str, path: &Path) -> Endpoint {
    pin(1);
    let mut ep = Endpoint::new(EndpointConfig { node_id: NodeId(1), ..Default::default() });
    ep.listen_shm(name).expect("listen");
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    ep.accept(Duration::from_secs(10)).expect("accept");
    start_trace(path, NodeId(1));
    ep
}

fn serve(name: &str, path: &Path) {
    let ep = accept_traced(name, path);
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let echo = [0x3cu8; SIZE];
    rpc.register_inline(METHOD, move |req, r| r.reply(&[&echo[..req.payload.len().min(SIZE)]]));
    let (mut on, mut down, mut polls) = (false, false, 0u32);
    while !down {
        polls = polls.wrapping_add(1);
        if polls % 64 == 0 {
            follow(&mut on);
        }
        rpc.poll(256, |e| down |= matches!(e, RpcEvent::ChannelDown { .. }));
    }
    let _ = trace::stop();
}

/// The receiving side of the stream test: counts the messages of each block (past its
/// guard, with tracing as the block says) and prints the comparison.
fn receive_stream(name: &str, path: &Path) {
    let mut ep = accept_traced(name, path);
    let (mut on, mut down, mut polls) = (false, false, 0u32);
    let mut counts: Vec<(u64, u64)> = Vec::new();
    let mut total = 0u64;
    while !down {
        polls = polls.wrapping_add(1);
        if polls % 64 == 0 {
            follow(&mut on);
        }
        let mut got = 0u64;
        ep.poll(256, |e| match e {
            Event::Message { .. } => got += 1,
            Event::ChannelDown { .. } => down = true,
            _ => {}
        });
        total += got;
        let now = trace::now();
        let b = block(now);
        if got > 0 && now - (b << BLOCK_SHIFT) > GUARD_TICKS && traced_block(b) == on && total > 1_000_000 {
            match counts.last_mut() {
                Some((last, n)) if *last == b => *n += got,
                _ => counts.push((b, got)),
            }
        }
    }
    let summary = trace::stop().expect("trace stops");
    // The first and last blocks are partial.
    let whole = counts.get(1..counts.len().saturating_sub(1)).unwrap_or_default();
    let ratios: Vec<f64> = whole
        .windows(2)
        .filter(|w| w[1].0 == w[0].0 + 1 && traced_block(w[1].0))
        .map(|w| w[1].1 as f64 / w[0].1 as f64)
        .collect();
    let rate = |traced: bool| {
        let mut v: Vec<u64> = whole.iter().filter(|c| traced_block(c.0) == traced).map(|c| c.1).collect();
        if v.is_empty() {
            return 0;
        }
        median(&mut v)
    };
    println!("messages {total}, blocks {}, pairs {}", whole.len(), ratios.len());
    println!("receiver records {} ({} dropped)", summary.records, summary.dropped);
    if ratios.is_empty() {
        println!("no pair of whole blocks");
        return;
    }
    let mut sorted = ratios;
    sorted.sort_by(f64::total_cmp);
    let q = |p: f64| sorted[((sorted.len() as f64 - 1.0) * p) as usize];
    println!(
        "messages per block, median: untraced {}  traced {}; traced / untraced, adjacent blocks: median {:.4}  (quartiles {:.4} .. {:.4})",
        rate(false),
        rate(true),
        q(0.5),
        q(0.25),
        q(0.75)
    );
}

/// The sending side of the stream test, for `seconds`.
fn send_stream(name: &str, seconds: f64, dir: &Path) {
    let mut ep = Endpoint::new(EndpointConfig { node_id: NodeId(0), ..Default::default() });
    let ch = ep.connect_shm(name, Duration::from_secs(10)).expect("connect");
    start_trace(&dir.join("client.ultrace"), NodeId(0));
    let msg = [0x5au8; STREAM_SIZE];
    let wall = Instant::now();
    let (mut on, mut sent) = (false, 0u64);
    while wall.elapsed().as_secs_f64() < seconds {
        for _ in 0..4096 {
            if sent % 64 == 0 {
                follow(&mut on);
            }
            while ep.send(ch, &[&msg]).expect("send") != SendOutcome::Done {
                ep.poll(64, |_| {});
            }
            sent += 1;
        }
    }
    ep.close(ch);
    let summary = trace::stop().expect("trace stops");
    println!("sent {sent}; sender records {} ({} dropped)", summary.records, summary.dropped);
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The mean of the values between the 10th and 90th percentiles.
fn trimmed_mean(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    let kept = &v[v.len() / 10..v.len() - v.len() / 10];
    kept.iter().sum::<u64>() as f64 / kept.len() as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => return serve(&args[2], Path::new(&args[3])),
        Some("receive-stream") => return receive_stream(&args[2], Path::new(&args[3])),
        _ => {}
    }
    let seconds: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let stream = args.get(2).map(String::as_str) == Some("stream");
    pin(0);
    let dir = std::env::temp_dir().join(format!("trace-ab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let name = format!("trace-ab-{}", std::process::id());
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .args([
            if stream { "receive-stream" } else { "serve" },
            &name,
            &dir.join("server.ultrace").display().to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("server process");
    let mut child_out = BufReader::new(child.stdout.take().expect("piped"));
    let mut ready = String::new();
    child_out.read_line(&mut ready).expect("server says ready");
    if stream {
        send_stream(&name, seconds, &dir);
        let mut report = String::new();
        std::io::Read::read_to_string(&mut child_out, &mut report).expect("receiver's report");
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        print!("{report}");
        return;
    }
    let mut ep = Endpoint::new(EndpointConfig { node_id: NodeId(0), ..Default::default() });
    let ch = ep.connect_shm(&name, Duration::from_secs(10)).expect("connect");
    start_trace(&dir.join("client.ultrace"), NodeId(0));
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let request = [0xa5u8; SIZE];
    // Round trips in ticks, per block of the schedule.
    let mut blocks: Vec<(u64, Vec<u64>)> = Vec::new();
    let (wall, first) = (Instant::now(), trace::now());
    let mut on = false;
    let mut calls = 0u64;
    while wall.elapsed().as_secs_f64() < seconds {
        follow(&mut on);
        let t0 = trace::now();
        while rpc.call(ch, METHOD, &[&request], None).expect("call") == CallOutcome::NoResource {
            rpc.poll(1, |_| {});
        }
        let mut done = false;
        while !done {
            rpc.poll(1, |e| match e {
                RpcEvent::Reply { .. } => done = true,
                RpcEvent::Failed { error, .. } => panic!("call failed: {error}"),
                RpcEvent::ChannelDown { error, .. } => panic!("channel down: {error}"),
            });
        }
        let t1 = trace::now();
        calls += 1;
        // Whole calls inside one block, past its guard, with tracing as the block says.
        let b = block(t1);
        if block(t0.saturating_sub(GUARD_TICKS)) == b && traced_block(b) == on && calls > 10_000 {
            match blocks.last_mut() {
                Some((last, v)) if *last == b => v.push(t1 - t0),
                _ => blocks.push((b, vec![t1 - t0])),
            }
        }
    }
    let ns_per_tick = wall.elapsed().as_nanos() as f64 / (trace::now() - first) as f64;
    rpc.endpoint().close(ch);
    drop(rpc);
    let _ = child.wait();
    let client = trace::stop().expect("trace stops");
    let _ = std::fs::remove_dir_all(&dir);
    // Each block's one-way latency (half its round trips' median, or trimmed mean), in ns.
    let ns = |ticks: f64| ticks * ns_per_tick / 2.0;
    let mut summaries: Vec<(u64, [f64; 2], usize)> =
        blocks.iter_mut().map(|(b, v)| (*b, [ns(median(v) as f64), ns(trimmed_mean(v))], v.len())).collect();
    summaries.retain(|m| m.2 >= 100);
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let pairs = summaries.windows(2).filter(|w| w[1].0 == w[0].0 + 1 && traced_block(w[1].0)).count();
    let untraced = summaries.iter().filter(|m| !traced_block(m.0)).count();
    println!("calls {calls}, blocks untraced {untraced} traced {}, pairs {pairs}", summaries.len() - untraced);
    println!("client records {} ({} dropped)", client.records, client.dropped);
    if pairs == 0 {
        // Calls that slow mean the two processes shared a core: nothing to compare.
        println!("no pair of complete blocks (100 calls or more each, after 10,000 warm-up calls)");
        std::process::exit(1);
    }
    for (i, name) in ["p50", "trimmed mean"].into_iter().enumerate() {
        let of = |traced: bool| summaries.iter().filter(|m| traced_block(m.0) == traced).map(|m| m.1[i]).collect();
        let ratios: Vec<f64> = summaries
            .windows(2)
            .filter(|w| w[1].0 == w[0].0 + 1 && traced_block(w[1].0))
            .map(|w| w[1].1[i] / w[0].1[i])
            .collect();
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let q = |p: f64| sorted.get(((sorted.len() as f64 - 1.0) * p) as usize).copied().unwrap_or(f64::NAN);
        println!(
            "one-way {name} ns, median over blocks: untraced {:.1}  traced {:.1}; traced / untraced, adjacent blocks: median {:.4}  (quartiles {:.4} .. {:.4})",
            mid(of(false)),
            mid(of(true)),
            mid(ratios),
            q(0.25),
            q(0.75)
        );
    }
}
