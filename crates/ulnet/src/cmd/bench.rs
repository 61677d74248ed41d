//! `ulnet bench`: micro-benchmarks between two processes, in the shape of `ucx_perftest`.
//!
//! Without `--server/--connect` the command starts its own peer process on this host
//! (`ulnet bench TEST --server ...`) and measures across the two processes.

mod access;
mod file_service;
mod rma;
mod trace_ab;

use super::clock::{ticks, CycleClock};
use super::stats;
use access::PeerAccess;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use trace_ab::{AbFigure, AbMode, LatencyBlocks, PollSwitch, RateBlocks};
use ulnet_core::trace::alternate::Switch;
use ulnet_core::{trace, ChannelId, Endpoint, Event, SendOutcome};
use ulnet_msg::rpc::{CallOutcome, Rpc, RpcConfig, RpcEvent};

mod incast;

/// Which benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Test {
    /// Active-message ping-pong latency (one-way = round trip / 2).
    AmLat,
    /// Active-message bandwidth: stream of messages, MB/s.
    AmBw,
    /// Message rate: stream of small messages, messages/s.
    MsgRate,
    /// RPC round trip through the message layer, one call at a time (one-way = RTT / 2).
    RpcLat,
    /// RPC rate: calls/s with `--outstanding` calls in flight.
    RpcRate,
    /// One-sided put ping-pong latency (one-way = round trip / 2).
    PutLat,
    /// One-sided get latency: the time of one whole get, as ucx_perftest's ucp_get.
    GetLat,
    /// Remote compare-and-swap ping-pong latency (one-way = round trip / 2).
    CasLat,
    /// Remote fetch-and-add ping-pong latency (one-way = round trip / 2).
    FaaLat,
    /// One-sided put bandwidth, MB/s.
    PutBw,
    /// One-sided get bandwidth, MB/s.
    GetBw,
    /// File service by one-sided reads (DX) against RPC: client latency and server CPU per
    /// operation for GetAttribute, LookupName, ReadFile 1K/4K/8K (prints its own table).
    FileService,
    /// N sender processes to one receiver: aggregate throughput and fairness.
    Incast,
}

impl Test {
    /// One-sided tests, run by `bench::rma`.
    fn is_rma(self) -> bool {
        matches!(self, Test::PutLat | Test::GetLat | Test::CasLat | Test::FaaLat | Test::PutBw | Test::GetBw)
    }

    fn name(self) -> &'static str {
        match self {
            Test::AmLat => "am-lat",
            Test::AmBw => "am-bw",
            Test::MsgRate => "msg-rate",
            Test::RpcLat => "rpc-lat",
            Test::RpcRate => "rpc-rate",
            Test::PutLat => "put-lat",
            Test::GetLat => "get-lat",
            Test::CasLat => "cas-lat",
            Test::FaaLat => "faa-lat",
            Test::PutBw => "put-bw",
            Test::GetBw => "get-bw",
            Test::FileService => "file-service",
            Test::Incast => "incast",
        }
    }
    fn default_size(self) -> usize {
        match self {
            Test::AmLat => 64,
            Test::AmBw => 1 << 20,
            Test::MsgRate => 8,
            Test::RpcLat | Test::RpcRate => 128,
            Test::PutLat | Test::GetLat | Test::CasLat | Test::FaaLat => 8,
            Test::PutBw | Test::GetBw => 64 << 10,
            Test::FileService => 8,
            Test::Incast => 64 << 10,
        }
    }
    fn default_iters(self) -> u64 {
        match self {
            Test::AmLat => 100_000,
            Test::AmBw => 20_000,
            Test::MsgRate => 5_000_000,
            Test::RpcLat => 100_000,
            Test::RpcRate => 2_000_000,
            Test::PutLat | Test::GetLat | Test::CasLat | Test::FaaLat => 100_000,
            Test::PutBw | Test::GetBw => 50_000,
            Test::FileService => 20_000,
            Test::Incast => 0, // incast runs for --duration-ms
        }
    }
}

/// Transports the benchmarks run over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// Shared memory between processes on this host.
    Shm,
    /// TCP, one connection.
    Tcp,
    /// Reliable, flow-controlled UDP.
    Udp,
}

impl TransportArg {
    fn name(self) -> &'static str {
        match self {
            TransportArg::Shm => "shm",
            TransportArg::Tcp => "tcp",
            TransportArg::Udp => "udp",
        }
    }
}

/// Arguments of `ulnet bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The benchmark to run.
    #[arg(value_enum)]
    test: Test,
    /// Transport between the two processes.
    #[arg(long, value_enum, default_value = "shm")]
    transport: TransportArg,
    /// Message size in bytes.
    #[arg(long)]
    size: Option<usize>,
    /// Measured iterations (messages for rate and bandwidth tests).
    #[arg(long)]
    iters: Option<u64>,
    /// Unmeasured iterations first.
    #[arg(long)]
    warmup: Option<u64>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Be the passive side and wait for a peer. Give it the same TEST, --size, --iters and
    /// --warmup as the active side: stream tests acknowledge by count.
    #[arg(long)]
    server: bool,
    /// Where the server listens (shm: a name; tcp, udp: HOST:PORT, port 0 picks one). The
    /// server prints `listening ADDR` on stdout once it does.
    #[arg(long)]
    listen: Option<String>,
    /// Connect to a server (shm: its name; tcp, udp: HOST:PORT).
    #[arg(long, conflicts_with = "server")]
    connect: Option<String>,
    /// Calls in flight for `rpc-rate`.
    #[arg(long, default_value_t = 32)]
    outstanding: usize,
    /// Receiving side of stream tests copies every delivery into its own buffer, as a
    /// tag-matching receive into a user buffer does (default: consume in place).
    #[arg(long)]
    recv_copy: bool,
    /// Trace every message into FILE (this process; node 0) and FILE.peer (the peer
    /// process this command starts; node 1), for `ulnet trace analyze`.
    #[arg(long, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
    /// With --trace: both processes switch tracing on and off every 2^24 ticks of the
    /// time-stamp counter (about 6 ms), and the report compares each traced block with the
    /// untraced one before it (`trace_ab` in the JSON; latency by each block's median,
    /// trimmed mean and mean): the cost of tracing measured in one run. The measured phase
    /// lasts --duration-ms. `control` keeps every block untraced, to show the comparison's
    /// own spread. For am-lat, rpc-lat, msg-rate and am-bw.
    #[arg(long, value_enum, requires = "trace", num_args = 0..=1, default_missing_value = "traced")]
    trace_ab: Option<AbMode>,
    /// RMA tests over shm: send every operation through the target's engine over a
    /// shared-memory channel instead of mapping the segment.
    #[arg(long)]
    no_map: bool,
    /// `faa-lat`, `cas-lat`: time one whole fetching atomic at a time (request and reply,
    /// not halved), as `ucx_perftest -t ucp_fadd` does, instead of a halved ping-pong.
    #[arg(long)]
    whole_op: bool,
    /// `faa-lat`: time the posting of each fetch-and-add, back to back, not its round trip
    /// (completions are reaped as they come and flushed at the end), as
    /// `ucx_perftest -t ucp_add` reports its "overhead".
    #[arg(long, conflicts_with = "whole_op")]
    overhead: bool,
    /// RMA tests over udp and tcp: send every request in a message of its own
    /// (`RmaConfig::batch_max` 0, as before wire version 2), to compare with batching.
    #[arg(long)]
    no_batch: bool,
    /// file-service: how long both servers keep polling after their last request before
    /// they sleep in the kernel (0: sleep at once, as an interrupt-driven server would).
    #[arg(long, default_value_t = 0)]
    server_spin_us: u64,
    /// Sender processes for `incast`.
    #[arg(long, default_value_t = 8)]
    senders: usize,
    /// Streams each `incast` sender process opens (round-robin from one thread). 1, the
    /// default: one process per sender, as on separate hosts. More puts the N senders'
    /// streams in `ceil(N / this)` processes, so that on a host with fewer CPUs than senders
    /// the receiver's share of the work is measured without N processes taking turns on
    /// one CPU; the single-stream baseline is one stream in one process either way.
    #[arg(long, default_value_t = 1)]
    streams_per_sender: usize,
    /// Measured time of each `incast` phase, and of the measured phase with --trace-ab, in
    /// milliseconds.
    #[arg(long, default_value_t = 2000)]
    duration_ms: u64,
    /// `incast` cycles: the N streams are measured this many times, each time between two
    /// single-stream phases (S N S N … S), and the reported ratio is the median of the
    /// cycles' ratios, each against the mean of its two neighbouring single streams. The
    /// speed of a shared host changes within seconds; the interleaving lets every ratio
    /// compare phases that saw the same host.
    #[arg(long, default_value_t = 3)]
    cycles: usize,
    /// Blocking mode: sleep in `Endpoint::wait` whenever a poll found nothing to do or a
    /// send found no room, instead of busy-polling (as iperf3 and most socket programs do).
    #[arg(long)]
    blocking: bool,
    /// Adaptive mode: busy-poll while traffic flows, sleep in `Endpoint::wait` once polls
    /// have found nothing for `ADAPTIVE_SPIN` (UCX's progress-then-arm; what keeps a
    /// stream going on a host whose CPUs other processes share).
    #[arg(long, conflicts_with = "blocking")]
    adaptive: bool,
    /// Whether UDP senders obey the receiver's credit (`incast`): on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    flow_control: String,
    /// File holding the cluster secret, which both sides prove on every channel (shm, tcp,
    /// udp): give the server and the client the same file. A server on a tcp or udp
    /// address other than loopback needs one. Without --server/--connect the run makes a
    /// secret of its own for its two processes.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<std::path::PathBuf>,
    /// Let a server listen on a tcp or udp address other than loopback without a secret
    /// (development only: anyone who reaches it may connect).
    #[arg(long)]
    insecure_no_secret: bool,
    /// Shared-memory servers also admit processes of this user id (repeat for more), and
    /// clients trust servers of it; by default only processes of our own user (clients
    /// also trust root's).
    #[arg(long, value_name = "UID")]
    allow_uid: Vec<u32>,
    /// Shared-memory servers also admit processes in this group (effective or
    /// supplementary; repeat for more), and clients trust servers in it.
    #[arg(long, value_name = "GID")]
    allow_gid: Vec<u32>,
}

#[derive(Serialize)]
struct Report {
    test: &'static str,
    transport: &'static str,
    size: usize,
    iters: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    avg_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msgs_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mb_per_s: Option<f64>,
    /// With --trace-ab: traced against untraced blocks of this run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    trace_ab: Vec<AbFigure>,
}

impl Report {
    /// A report of `p`'s test with no figures yet.
    fn of(p: &Params) -> Self {
        Report {
            test: p.test.name(),
            transport: p.transport.name(),
            size: p.size,
            iters: p.iters,
            p50_us: None,
            p99_us: None,
            avg_us: None,
            msgs_per_s: None,
            mb_per_s: None,
            trace_ab: Vec::new(),
        }
    }
}

struct Params {
    test: Test,
    transport: TransportArg,
    size: usize,
    iters: u64,
    warmup: u64,
    recv_copy: bool,
    outstanding: usize,
    trace_ab: Option<AbMode>,
    /// The measured phase's length with `trace_ab` (which counts no iterations).
    duration: Duration,
}

impl Params {
    fn from(a: &BenchArgs) -> Self {
        let iters = a.iters.unwrap_or(a.test.default_iters());
        Params {
            test: a.test,
            transport: a.transport,
            size: a.size.unwrap_or(a.test.default_size()),
            // A run with --trace-ab lasts a time; the passive side of a stream then never
            // reaches the count that would end it, and ends when the channel closes.
            iters: if a.trace_ab.is_some() { u64::MAX / 4 } else { iters },
            warmup: a.warmup.unwrap_or((iters / 10).max(1)),
            recv_copy: a.recv_copy,
            outstanding: a.outstanding.max(1),
            trace_ab: a.trace_ab,
            duration: Duration::from_millis(a.duration_ms),
        }
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The one-byte message that acknowledges the end of a warm-up or measured stream.
const ACK: &[u8] = b"A";

/// Set by `--blocking`: idle loops sleep in `Endpoint::wait` instead of spinning.
static BLOCKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set by `--adaptive`: idle loops spin for `ADAPTIVE_SPIN`, then sleep.
static ADAPTIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long adaptive mode spins on empty polls before it sleeps. 50 µs: several round
/// trips on loopback, so a stream or a ping-pong never sleeps between messages, while a
/// process that waits for a descheduled peer gives its CPU away within a fraction of a
/// scheduler slice.
const ADAPTIVE_SPIN: Duration = Duration::from_micros(50);

/// Longest gap between two empty polls of one idle spell: a longer gap means work was
/// done in between, and the spell starts again.
const IDLE_SPELL_GAP: Duration = Duration::from_micros(20);

thread_local! {
    /// (start, last empty poll) of the current idle spell, for adaptive mode.
    static IDLE_SPELL: std::cell::Cell<Option<(Instant, Instant)>> = const { std::cell::Cell::new(None) };
}

/// Called after a poll found nothing to do (or a send no room): in blocking mode sleeps
/// until the endpoint has something (or a protocol timer is due); in adaptive mode does
/// so once the idle spell is `ADAPTIVE_SPIN` long; in busy-poll mode returns at once.
fn idle(ep: &mut Endpoint) -> Result<()> {
    if BLOCKING.load(std::sync::atomic::Ordering::Relaxed) {
        ep.wait(Some(Duration::from_millis(10)))?;
    } else if ADAPTIVE.load(std::sync::atomic::Ordering::Relaxed) {
        let now = Instant::now();
        let start = match IDLE_SPELL.get() {
            Some((start, last)) if now.duration_since(last) <= IDLE_SPELL_GAP => start,
            _ => now,
        };
        if now.duration_since(start) >= ADAPTIVE_SPIN {
            ep.wait(Some(Duration::from_millis(10)))?;
            IDLE_SPELL.set(None);
        } else {
            IDLE_SPELL.set(Some((start, now)));
        }
    }
    Ok(())
}

pub fn run(args: BenchArgs) -> Result<i32> {
    BLOCKING.store(args.blocking, std::sync::atomic::Ordering::Relaxed);
    ADAPTIVE.store(args.adaptive, std::sync::atomic::Ordering::Relaxed);
    if args.test == Test::Incast {
        return incast::run(&args);
    }
    let params = Params::from(&args);
    if params.test.is_rma() {
        return rma::run(&args, &params);
    }
    if params.test == Test::FileService {
        return file_service::run(&args, &params);
    }
    if params.size == 0 && args.test != Test::AmLat {
        bail!("--size must be at least 1 byte");
    }
    if args.trace_ab.is_some() && !matches!(args.test, Test::AmLat | Test::RpcLat | Test::MsgRate | Test::AmBw) {
        bail!("--trace-ab is for am-lat, rpc-lat, msg-rate and am-bw");
    }
    let node = super::bench_trace::node_id(args.server);
    if let Some(path) = &args.trace {
        super::bench_trace::start(path, node)?;
    }
    let result = run_traced(&args, &params, node);
    super::bench_trace::finish(args.trace.as_deref())?;
    result
}

fn run_traced(args: &BenchArgs, params: &Params, node: ulnet_core::NodeId) -> Result<i32> {
    let access = PeerAccess::of(args)?;
    let mut ep = Endpoint::new(access.endpoint_config(node));
    if args.server {
        let listen = args.listen.clone().context("--server needs --listen")?;
        access.check_listen(params.transport, &listen)?;
        let bound = match params.transport {
            TransportArg::Shm => {
                ep.listen_shm(&listen)?;
                listen
            }
            TransportArg::Tcp => ep.listen_tcp(&listen)?.to_string(),
            TransportArg::Udp => ep.listen_udp(&listen)?.to_string(),
        };
        println!("listening {bound}");
        std::io::Write::flush(&mut std::io::stdout())?;
        let ch = ep.accept(CONNECT_TIMEOUT)?;
        match params.test {
            Test::RpcLat | Test::RpcRate => serve_rpc(ep, params),
            _ => serve(&mut ep, ch, params)?,
        }
        return Ok(0);
    }
    let mut child: Option<Child> = None;
    let addr = match &args.connect {
        Some(addr) => addr.clone(),
        None => {
            let listen = match params.transport {
                TransportArg::Shm => format!("bench-{}-{}", std::process::id(), params.test.name()),
                TransportArg::Tcp | TransportArg::Udp => "127.0.0.1:0".to_string(),
            };
            let (c, bound) = spawn_server(args, &listen, params, &access)?;
            child = Some(c);
            bound
        }
    };
    let ch = match params.transport {
        TransportArg::Shm => ep.connect_shm(&addr, CONNECT_TIMEOUT),
        TransportArg::Tcp => ep.connect_tcp(&addr, CONNECT_TIMEOUT),
        TransportArg::Udp => ep.connect_udp(&addr, CONNECT_TIMEOUT),
    }
    .with_context(|| connect_context(&addr))?;
    let report = match params.test {
        Test::AmLat | Test::AmBw | Test::MsgRate => {
            let report =
                if params.test == Test::AmLat { latency(&mut ep, ch, params)? } else { stream(&mut ep, ch, params)? };
            ep.close(ch);
            report
        }
        Test::RpcLat | Test::RpcRate => {
            let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
            let report = rpc_client(&mut rpc, ch, params)?;
            rpc.endpoint().close(ch);
            report
        }
        Test::Incast => unreachable!("incast is run by its own module"),
        _ => unreachable!("RMA tests are run by bench::rma"),
    };
    if let Some(mut c) = child {
        let status = c.wait()?;
        if !status.success() {
            bail!("benchmark server exited with {status}");
        }
    }
    print_report(&report, args.json)?;
    Ok(0)
}

/// What a failed connection to a benchmark server may mean.
fn connect_context(addr: &str) -> String {
    format!("connecting to the benchmark server at {addr}")
}

/// Starts the passive side as a child process and reads the address it listens on.
fn spawn_server(args: &BenchArgs, listen: &str, p: &Params, access: &PeerAccess) -> Result<(Child, String)> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command
        .args(["bench", p.test.name(), "--server", "--listen", listen, "--transport", p.transport.name()])
        .args(["--size", &p.size.to_string(), "--iters", &p.iters.to_string(), "--warmup", &p.warmup.to_string()])
        .args(p.recv_copy.then_some("--recv-copy"))
        .args(BLOCKING.load(std::sync::atomic::Ordering::Relaxed).then_some("--blocking"))
        .args(ADAPTIVE.load(std::sync::atomic::Ordering::Relaxed).then_some("--adaptive"))
        .args(["--outstanding", &p.outstanding.to_string()])
        .args(super::bench_trace::peer_args(args.trace.as_deref()))
        .args(p.trace_ab.map(|m| format!("--trace-ab={}", m.to_possible_value().expect("a value").get_name())))
        .stdout(Stdio::piped());
    access.pass_to(&mut command);
    let mut child = command.spawn().with_context(|| format!("starting the peer process for {:?}", args.test))?;
    access.hand_over(&mut child)?;
    let out = child.stdout.take().context("peer stdout")?;
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)?;
    let bound = line.trim().strip_prefix("listening ").context("the peer process did not start listening")?.to_string();
    Ok((child, bound))
}

fn print_report(r: &Report, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    match (r.p50_us, r.msgs_per_s) {
        (Some(p50), _) => println!(
            "{} over {}: {} B x {}  p50 {:.3} us  p99 {:.3} us  avg {:.3} us (one-way)",
            r.test,
            r.transport,
            r.size,
            r.iters,
            p50,
            r.p99_us.unwrap_or(0.0),
            r.avg_us.unwrap_or(0.0)
        ),
        (_, Some(rate)) => println!(
            "{} over {}: {} B x {}  {:.0} msgs/s  {:.1} MB/s",
            r.test,
            r.transport,
            r.size,
            r.iters,
            rate,
            r.mb_per_s.unwrap_or(0.0)
        ),
        _ => unreachable!("every report has latency or rate"),
    }
    for f in &r.trace_ab {
        println!(
            "  --trace-ab {}: untraced {:.4}  traced {:.4}  traced / untraced, adjacent blocks: median {:.4} (quartiles {:.4} .. {:.4}, {} pairs)",
            f.metric, f.untraced, f.traced, f.ratio, f.ratio_q1, f.ratio_q3, f.pairs
        );
    }
    Ok(())
}

/// Sends one message, making progress (and noticing a dead peer) while there is no room.
fn send_blocking(ep: &mut Endpoint, ch: ChannelId, msg: &[u8]) -> Result<()> {
    loop {
        match ep.send(ch, &[msg])? {
            SendOutcome::Done => return Ok(()),
            SendOutcome::NoResource | SendOutcome::InProgress(_) => {
                let mut down = None;
                let n = ep.poll(64, |e| {
                    if let Event::ChannelDown { error, .. } = e {
                        down = Some(error);
                    }
                });
                if let Some(e) = down {
                    bail!("peer went away: {e}");
                }
                if n == 0 {
                    idle(ep)?;
                }
            }
        }
    }
}

/// Polls until `count` whole messages have arrived on the channel, taking at most
/// `batch` per poll (1 for latency: return as soon as the first message is in).
fn receive_messages(ep: &mut Endpoint, count: u64, batch: usize) -> Result<()> {
    let mut got = 0;
    let mut down = None;
    while got < count && down.is_none() {
        let n = ep.poll(batch, |e| match e {
            Event::Message { data, message_len, offset, .. } if offset + data.len() as u64 == message_len => got += 1,
            Event::ChannelDown { error, .. } => down = Some(error),
            _ => {}
        });
        if n == 0 {
            idle(ep)?;
        }
    }
    match down {
        Some(e) => bail!("peer went away: {e}"),
        None => Ok(()),
    }
}

fn latency(ep: &mut Endpoint, ch: ChannelId, p: &Params) -> Result<Report> {
    let msg = vec![0xa5u8; p.size];
    ping_pong(p, || {
        send_blocking(ep, ch, &msg)?;
        receive_messages(ep, 1, 1)
    })
}

/// A latency test of `round_trip` (one whole round trip): `p.warmup` unmeasured, then
/// `p.iters` timed one by one (with --trace-ab, [`latency_ab`]).
fn ping_pong(p: &Params, mut round_trip: impl FnMut() -> Result<()>) -> Result<Report> {
    if let Some(mut switch) = trace_ab::switch(p.trace_ab) {
        return latency_ab(p, &mut switch, round_trip);
    }
    let clock = CycleClock::calibrate(Duration::from_millis(50));
    let mut samples = Vec::with_capacity(p.iters as usize);
    for i in 0..p.warmup + p.iters {
        let t0 = ticks();
        round_trip()?;
        if i >= p.warmup {
            samples.push(ticks() - t0);
        }
    }
    let s = stats::one_way(samples.into_iter().map(|t| clock.ns(t)).collect());
    Ok(Report { p50_us: Some(s.p50_us), p99_us: Some(s.p99_us), avg_us: Some(s.avg_us), ..Report::of(p) })
}

fn stream(ep: &mut Endpoint, ch: ChannelId, p: &Params) -> Result<Report> {
    let msg = vec![0x5au8; p.size];
    // (Made before the warm-up: it pauses tracing until the schedule turns it on.)
    let mut switch = trace_ab::switch(p.trace_ab);
    for _ in 0..p.warmup {
        send_blocking(ep, ch, &msg)?;
    }
    receive_messages(ep, 1, 256)?;
    if let Some(switch) = &mut switch {
        return stream_ab(ep, ch, p, &msg, switch);
    }
    let t0 = Instant::now();
    for _ in 0..p.iters {
        send_blocking(ep, ch, &msg)?;
    }
    receive_messages(ep, 1, 256)?;
    let secs = t0.elapsed().as_secs_f64();
    let rate = p.iters as f64 / secs;
    Ok(Report { msgs_per_s: Some(rate), mb_per_s: Some(rate * p.size as f64 / 1e6), ..Report::of(p) })
}

/// A latency test with --trace-ab: `round_trip` (one whole round trip) repeated for
/// `p.warmup` times unmeasured, then for `p.duration` with every round trip timed by the
/// trace clock and tracing following the schedule.
fn latency_ab(p: &Params, switch: &mut Switch, mut round_trip: impl FnMut() -> Result<()>) -> Result<Report> {
    for _ in 0..p.warmup {
        round_trip()?;
    }
    let mut blocks = LatencyBlocks::new();
    let wall = Instant::now();
    let mut done = 0u64;
    while !done.is_multiple_of(1024) || wall.elapsed() < p.duration {
        let t0 = trace::now();
        switch.follow(t0);
        round_trip()?;
        blocks.add(t0, trace::now());
        done += 1;
    }
    let (all, figures) = blocks.finish();
    let s = stats::one_way(all);
    Ok(Report {
        iters: done,
        p50_us: Some(s.p50_us),
        p99_us: Some(s.p99_us),
        avg_us: Some(s.avg_us),
        trace_ab: figures,
        ..Report::of(p)
    })
}

/// The measured phase of a stream test with --trace-ab: sends for `p.duration`, reading the
/// clock and following the schedule every 64 small messages (a clock read costs as much as
/// a message of 8 bytes) or every message of 4 KiB and more, and closes without waiting for
/// an acknowledgement (the passive side ends when the channel closes).
fn stream_ab(ep: &mut Endpoint, ch: ChannelId, p: &Params, msg: &[u8], switch: &mut Switch) -> Result<Report> {
    let check_every: u64 = if msg.len() >= 4096 { 1 } else { 64 };
    let mut blocks = RateBlocks::new();
    let wall = Instant::now();
    let mut sent = 0u64;
    // (The wall clock is read every 4,096 messages; `check_every` divides that.)
    while !sent.is_multiple_of(4096) || wall.elapsed() < p.duration {
        for _ in 0..check_every {
            send_blocking(ep, ch, msg)?;
        }
        sent += check_every;
        let now = trace::now();
        switch.follow(now);
        blocks.add(now, check_every);
    }
    let secs = wall.elapsed().as_secs_f64();
    let rate = sent as f64 / secs;
    Ok(Report {
        iters: sent,
        msgs_per_s: Some(rate),
        mb_per_s: Some(rate * p.size as f64 / 1e6),
        trace_ab: vec![blocks.finish()],
        ..Report::of(p)
    })
}

/// The passive side: echoes for latency tests, counts and acknowledges for streams.
fn serve(ep: &mut Endpoint, ch: ChannelId, p: &Params) -> Result<()> {
    let echo = vec![0x3cu8; p.size];
    let mut user_buffer = vec![0u8; if p.recv_copy { p.size } else { 0 }];
    let mut whole = 0u64;
    let mut answered = 0u64;
    // Latency: hand each message over as soon as it is in; streams: drain in batches.
    let batch = if p.test == Test::AmLat { 1 } else { 256 };
    let mut switch = PollSwitch::new(p.trace_ab);
    loop {
        switch.poll();
        let mut closed = None;
        let polled = ep.poll(batch, |e| match e {
            Event::Message { data, message_len, offset, mut reply, .. } => {
                if !user_buffer.is_empty() {
                    let at = offset as usize;
                    user_buffer[at..at + data.len()].copy_from_slice(data);
                }
                if offset + data.len() as u64 == message_len {
                    whole += 1;
                    // Latency: answer from the handler, as an active-message handler does.
                    if p.test == Test::AmLat
                        && answered + 1 == whole
                        && matches!(reply.send(&[&echo]), Ok(SendOutcome::Done))
                    {
                        answered += 1;
                    }
                }
            }
            Event::ChannelDown { error, .. } => closed = Some(error),
            _ => {}
        });
        match p.test {
            Test::AmLat => {
                while answered < whole {
                    send_blocking(ep, ch, &echo)?;
                    answered += 1;
                }
            }
            Test::RpcLat | Test::RpcRate => unreachable!("RPC tests are served by serve_rpc"),
            Test::PutLat
            | Test::GetLat
            | Test::CasLat
            | Test::FaaLat
            | Test::PutBw
            | Test::GetBw
            | Test::FileService => {
                unreachable!("RMA tests are run by bench::rma and bench::file_service")
            }
            Test::Incast => unreachable!("incast is run by its own module"),
            Test::AmBw | Test::MsgRate => {
                if answered == 0 && whole >= p.warmup {
                    send_blocking(ep, ch, ACK)?;
                    answered = 1;
                }
                if answered == 1 && whole >= p.warmup + p.iters {
                    send_blocking(ep, ch, ACK)?;
                    answered = 2;
                }
            }
        }
        match closed {
            Some(ulnet_core::ChannelError::Closed) => return Ok(()),
            Some(e) => bail!("client went away: {e}"),
            None => {}
        }
        if polled == 0 {
            idle(ep)?;
        }
    }
}

/// The method the RPC benchmarks call: answers with a payload of the request's size.
const RPC_ECHO: u16 = 1;

/// The passive side of the RPC tests: an inline handler that echoes, until the client leaves.
fn serve_rpc(ep: Endpoint, p: &Params) {
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let echo = vec![0x3cu8; p.size];
    rpc.register_inline(RPC_ECHO, move |req, replier| replier.reply(&[&echo[..req.payload.len().min(echo.len())]]));
    let mut down = false;
    let mut switch = PollSwitch::new(p.trace_ab);
    while !down {
        switch.poll();
        if rpc.poll(256, |e| down |= matches!(e, RpcEvent::ChannelDown { .. })) == 0 && idle(rpc.endpoint()).is_err() {
            return;
        }
    }
}

/// Replies counted and the first failure, for the RPC client loops.
#[derive(Default)]
struct Tally {
    done: u64,
    failure: Option<String>,
}

impl Tally {
    fn count(&mut self, e: RpcEvent<'_>) {
        match e {
            RpcEvent::Reply { .. } => self.done += 1,
            RpcEvent::Failed { error, .. } => self.failure = Some(error.to_string()),
            RpcEvent::ChannelDown { error, .. } => self.failure = Some(error.to_string()),
        }
    }

    fn check(&mut self) -> Result<()> {
        match self.failure.take() {
            Some(f) => bail!("call failed: {f}"),
            None => Ok(()),
        }
    }
}

fn rpc_client(rpc: &mut Rpc, ch: ChannelId, p: &Params) -> Result<Report> {
    let request = vec![0xa5u8; p.size];
    let mut report = Report::of(p);
    let mut tally = Tally::default();
    if p.test == Test::RpcLat {
        return ping_pong(p, || {
            while rpc.call(ch, RPC_ECHO, &[&request], None)? == CallOutcome::NoResource {
                rpc.poll(1, |e| tally.count(e));
            }
            let want = tally.done + 1;
            while tally.done < want && tally.failure.is_none() {
                rpc.poll(1, |e| tally.count(e));
            }
            tally.check()
        });
    }
    let total = p.warmup + p.iters;
    let mut sent = 0u64;
    let mut t0 = Instant::now();
    while tally.done < total {
        while sent < total && sent - tally.done < p.outstanding as u64 {
            match rpc.call(ch, RPC_ECHO, &[&request], None)? {
                CallOutcome::Sent(_) => sent += 1,
                CallOutcome::NoResource => break,
            }
        }
        let before = tally.done;
        if rpc.poll(256, |e| tally.count(e)) == 0 {
            idle(rpc.endpoint())?;
        }
        tally.check()?;
        if before < p.warmup && tally.done >= p.warmup {
            t0 = Instant::now();
        }
    }
    let rate = (tally.done - p.warmup) as f64 / t0.elapsed().as_secs_f64();
    (report.msgs_per_s, report.mb_per_s) = (Some(rate), Some(rate * p.size as f64 / 1e6));
    Ok(report)
}
