//! `ulnet bench put-lat | get-lat | cas-lat | faa-lat | put-bw | get-bw`: one-sided
//! operations between two processes, measured as `ucx_perftest` measures them.
//!
//! Both processes are RMA nodes with the engine run by their own thread of control
//! ([`Progress::Manual`](ulnet_core::rma::Progress::Manual), as `ucx_perftest` drives UCX: one thread per process). The server
//! exports a segment; the client imports it (mapped over `shm`, through the engine over a
//! channel otherwise, or with `--no-map`).
//!
//! - `put-lat`, `faa-lat`, `cas-lat`: ping-pong. The client also exports a segment, tells
//!   the server where (through a mailbox word in the server's segment), and each side
//!   writes / adds to / swaps the other's word and waits to see its own word change;
//!   one-way latency = round trip / 2 (UCX `put_lat`, `add_lat`).
//! - `get-lat`: one blocking get at a time; the figure is the time of one whole get, not
//!   halved, as `ucx_perftest -t ucp_get` reports it. `faa-lat`/`cas-lat --whole-op`: the
//!   same for one fetching atomic at a time (`ucx_perftest -t ucp_fadd`).
//! - `faa-lat --overhead`: the time to post each fetch-and-add of a back-to-back stream
//!   (`ucx_perftest -t ucp_add`, whose latency column is this "overhead").
//! - `--no-batch`: every request in a message of its own (no doorbell batching), to set
//!   beside the default, where requests posted to one peer share datagrams and writes.
//! - `put-bw`, `get-bw`: operations of `--size` bytes posted back to back (as many in flight
//!   as the node allows), then a flush; MB/s.
//!
//! Rights: each side grants the other node (server 1, client 2), and no one else, only the
//! right its test needs on its `bench` segment (read for gets, write for puts, atomic for
//! compare-and-swap and fetch-and-add); the client also writes the server's small
//! `bench-control` segment (its address, and "done"). Channels prove the secret
//! (`access`), so the node ids the rights name are those of secret holders.

use super::access::PeerAccess;
use super::{connect_context, print_report, BenchArgs, Params, Report, Test, TransportArg, CONNECT_TIMEOUT};
use super::{ticks, CycleClock};
use anyhow::{bail, Context, Result};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::rma::{
    Access, ExportedSegment, ImportMode, NodeId, NotifyMode, PeerId, RemoteSegment, Rights, Rma, RmaConfig, RmaOutcome,
};

/// The server's node id, and the client's: each grants rights to the other by it.
const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);

/// The segment the test's operations go to (on the server, and for ping-pong tests on the
/// client too).
const DATA_SEGMENT: &str = "bench";
/// The server's segment the client writes its address and "done" into.
const CONTROL_SEGMENT: &str = "bench-control";
/// Bytes of the control segment: the client's address (length word, then the bytes) and,
/// at [`DONE`], the "done" word.
const CONTROL_LEN: usize = 4096;
/// Offset of the "done" word in the control segment.
const DONE: usize = 2048;

/// Where the ping-pong word sits: the last aligned word of the first `size` bytes.
fn word_off(size: usize) -> usize {
    size.max(8) / 8 * 8 - 8
}

fn segment_len(size: usize) -> usize {
    size.max(64).next_multiple_of(4096)
}

/// The one right test `t` needs on the other side's data segment.
fn right_of(t: Test) -> Rights {
    match t {
        Test::GetLat | Test::GetBw => Rights::READ,
        Test::PutLat | Test::PutBw => Rights::WRITE,
        _ => Rights::ATOMIC,
    }
}

fn is_ping_pong(args: &BenchArgs, t: Test) -> bool {
    match t {
        Test::PutLat => true,
        Test::FaaLat => !args.whole_op && !args.overhead,
        Test::CasLat => !args.whole_op,
        _ => false,
    }
}

/// Tests timed one whole operation at a time.
fn is_whole_op(args: &BenchArgs, t: Test) -> bool {
    t == Test::GetLat || (args.whole_op && matches!(t, Test::FaaLat | Test::CasLat))
}

fn node(args: &BenchArgs, access: &PeerAccess, id: NodeId) -> Result<Rma> {
    let mut config = access.rma_config(RmaConfig::manual(id));
    if args.no_batch {
        config.batch_max = 0;
    }
    Ok(Rma::new(config)?)
}

fn listen(rma: &mut Rma, access: &PeerAccess, transport: TransportArg, addr: &str) -> Result<String> {
    access.check_listen(transport, addr)?;
    Ok(match transport {
        TransportArg::Shm => {
            rma.listen_shm(addr)?;
            addr.to_string()
        }
        TransportArg::Tcp => rma.listen_tcp(addr)?.to_string(),
        TransportArg::Udp => rma.listen_udp(addr)?.to_string(),
    })
}

fn connect(rma: &mut Rma, transport: TransportArg, addr: &str, no_map: bool) -> Result<(PeerId, ImportMode)> {
    Ok(match transport {
        TransportArg::Shm => (rma.connect_shm(addr), if no_map { ImportMode::Channel } else { ImportMode::Map }),
        TransportArg::Tcp => {
            (rma.connect_tcp(addr, CONNECT_TIMEOUT).with_context(|| connect_context(addr))?, ImportMode::Channel)
        }
        TransportArg::Udp => {
            (rma.connect_udp(addr, CONNECT_TIMEOUT).with_context(|| connect_context(addr))?, ImportMode::Channel)
        }
    })
}

/// Imports `name` from `peer` (for shm, the first import is where the connection is made).
fn import(rma: &mut Rma, peer: PeerId, name: &str, mode: ImportMode, addr: &str) -> Result<RemoteSegment> {
    rma.import_with(peer, name, mode).with_context(|| format!("importing {name}: {}", connect_context(addr)))
}

/// Runs an RMA test: the server side with `--server`, else the client (spawning its own
/// server unless `--connect` names one).
pub(super) fn run(args: &BenchArgs, p: &Params) -> Result<i32> {
    if is_ping_pong(args, p.test) && p.size < 8 {
        bail!("{} needs --size of at least 8 bytes (a whole word)", p.test.name());
    }
    let access = PeerAccess::of(args)?;
    if args.server {
        let addr = args.listen.clone().context("--server needs --listen")?;
        serve(args, p, &access, &addr)?;
        return Ok(0);
    }
    let mut child: Option<Child> = None;
    let server = match &args.connect {
        Some(a) => a.clone(),
        None => {
            let listen = match p.transport {
                TransportArg::Shm => format!("bench-rma-{}-{}", std::process::id(), p.test.name()),
                TransportArg::Tcp | TransportArg::Udp => "127.0.0.1:0".to_string(),
            };
            let (c, bound) = spawn_server(args, &listen, p, &access)?;
            child = Some(c);
            bound
        }
    };
    let report = client(args, p, &access, &server)?;
    if let Some(mut c) = child {
        let status = c.wait()?;
        if !status.success() {
            bail!("benchmark server exited with {status}");
        }
    }
    print_report(&report, args.json)?;
    Ok(0)
}

fn spawn_server(args: &BenchArgs, listen: &str, p: &Params, access: &PeerAccess) -> Result<(Child, String)> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["bench", p.test.name(), "--server", "--listen", listen, "--transport", p.transport.name()])
        .args(["--size", &p.size.to_string(), "--iters", &p.iters.to_string(), "--warmup", &p.warmup.to_string()])
        .args(args.no_map.then_some("--no-map"))
        .args(args.whole_op.then_some("--whole-op"))
        .args(args.overhead.then_some("--overhead"))
        .args(args.no_batch.then_some("--no-batch"))
        .stdout(Stdio::piped());
    access.pass_to(&mut command);
    let mut child = command.spawn().context("starting the peer process")?;
    access.hand_over(&mut child)?;
    let out = child.stdout.take().context("peer stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line)?;
    let bound = line.trim().strip_prefix("listening ").context("the peer process did not start listening")?.to_string();
    Ok((child, bound))
}

/// How often [`wait_word`] runs the engine, in spins of its load.
#[derive(Clone, Copy)]
enum Cadence {
    /// The peer stores into our mapped pages: the engine has nothing to do for the word,
    /// so run it only now and then (64 spins).
    Mapped,
    /// The peer's operations arrive through our engine (a channel): run it on every spin,
    /// or the word changes only when the engine next runs.
    Channel,
}

impl Cadence {
    fn of(seg: &RemoteSegment) -> Cadence {
        if seg.is_mapped() {
            Cadence::Mapped
        } else {
            Cadence::Channel
        }
    }
}

/// Polls for up to `max` completions: one that failed (the target refused the operation,
/// or the channel went down) ends the run with its error, which a benchmark must not
/// count as done.
fn poll_checked(rma: &mut Rma, max: usize) -> Result<usize> {
    let mut failed = None;
    let n = rma.poll(max, |c| {
        if let Err(e) = &c.result {
            failed.get_or_insert_with(|| e.clone());
        }
    });
    match failed {
        Some(e) => Err(e).context("an operation failed at the target"),
        None => Ok(n),
    }
}

/// Waits (running the engine) until the owner's word at `off` satisfies `ready`.
fn wait_word(
    rma: &mut Rma,
    seg: &ExportedSegment,
    off: usize,
    ready: impl Fn(u64) -> bool,
    cadence: Cadence,
    deadline: Instant,
) -> Result<u64> {
    let every: u32 = match cadence {
        Cadence::Mapped => 64,
        Cadence::Channel => 1,
    };
    let mut spins = 0u32;
    loop {
        let v = seg.load_u64(off);
        if ready(v) {
            return Ok(v);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(every) {
            poll_checked(rma, 64)?;
            if spins.is_multiple_of(64) && Instant::now() > deadline {
                bail!("timed out waiting for the peer");
            }
        }
        if every > 1 {
            std::hint::spin_loop();
        }
    }
}

/// The passive side: exports the segments and serves; in ping-pong tests, answers.
fn serve(args: &BenchArgs, p: &Params, access: &PeerAccess, addr: &str) -> Result<()> {
    let mut rma = node(args, access, SERVER)?;
    let bound = listen(&mut rma, access, p.transport, addr)?;
    let data = Access::none().grant(CLIENT, right_of(p.test));
    let seg = rma.export(DATA_SEGMENT, segment_len(p.size), data, NotifyMode::Never)?;
    let control =
        rma.export(CONTROL_SEGMENT, CONTROL_LEN, Access::none().grant(CLIENT, Rights::WRITE), NotifyMode::Never)?;
    println!("listening {bound}");
    std::io::Write::flush(&mut std::io::stdout())?;
    let far = Instant::now() + Duration::from_secs(600);
    if is_ping_pong(args, p.test) {
        let len = wait_word(&mut rma, &control, 0, |v| v != 0, Cadence::Channel, far)? as usize;
        let mut name = vec![0u8; len.min(DONE - 8)];
        control.read(8, &mut name);
        let client_addr = String::from_utf8(name).context("client address")?;
        let (peer, mode) = connect(&mut rma, p.transport, &client_addr, args.no_map)?;
        let theirs = import(&mut rma, peer, DATA_SEGMENT, mode, &client_addr)?;
        let w = word_off(p.size) as u64;
        let mut data = vec![0x5au8; p.size];
        for i in 1..=p.warmup + p.iters {
            wait_word(&mut rma, &seg, w as usize, |v| v >= i, Cadence::of(&theirs), far)?;
            ping(&mut rma, p, &theirs, w, i, &mut data)?;
        }
        rma.flush_blocking(CONNECT_TIMEOUT)?;
    }
    wait_word(&mut rma, &control, DONE, |v| v != 0, Cadence::Channel, far)?;
    drop(seg);
    Ok(())
}

/// One move of a ping-pong: make the peer's word `i` (a put sends `data` with `i` in it).
fn ping(rma: &mut Rma, p: &Params, theirs: &RemoteSegment, w: u64, i: u64, data: &mut [u8]) -> Result<()> {
    loop {
        let outcome = match p.test {
            Test::PutLat => {
                data[w as usize..w as usize + 8].copy_from_slice(&i.to_ne_bytes());
                rma.put(theirs, 0, data, i)?
            }
            Test::FaaLat => match rma.fetch_and_add(theirs, w, 1, i)? {
                RmaOutcome::NoResource => RmaOutcome::NoResource,
                _ => RmaOutcome::Done(()),
            },
            Test::CasLat => match rma.compare_and_swap(theirs, w, i - 1, i, i)? {
                RmaOutcome::NoResource => RmaOutcome::NoResource,
                _ => RmaOutcome::Done(()),
            },
            _ => unreachable!("ping-pong tests only"),
        };
        if outcome != RmaOutcome::NoResource {
            return Ok(());
        }
        poll_checked(rma, 64)?;
    }
}

fn client(args: &BenchArgs, p: &Params, access: &PeerAccess, server: &str) -> Result<Report> {
    let mut rma = node(args, access, CLIENT)?;
    let (peer, mode) = connect(&mut rma, p.transport, server, args.no_map)?;
    let theirs = import(&mut rma, peer, DATA_SEGMENT, mode, server)?;
    let control = import(&mut rma, peer, CONTROL_SEGMENT, mode, server)?;
    let report = if is_ping_pong(args, p.test) {
        let own_addr = match p.transport {
            TransportArg::Shm => format!("{server}-client"),
            TransportArg::Tcp | TransportArg::Udp => args.listen.clone().unwrap_or_else(|| "127.0.0.1:0".to_string()),
        };
        let own_bound = listen(&mut rma, access, p.transport, &own_addr)?;
        let ours = Access::none().grant(SERVER, right_of(p.test));
        let mine = rma.export(DATA_SEGMENT, segment_len(p.size), ours, NotifyMode::Never)?;
        rma.put_blocking(&control, 8, own_bound.as_bytes(), CONNECT_TIMEOUT)?;
        rma.put_blocking(&control, 0, &(own_bound.len() as u64).to_ne_bytes(), CONNECT_TIMEOUT)?;
        ping_pong(&mut rma, p, &theirs, &mine)?
    } else if is_whole_op(args, p.test) {
        op_latency(&mut rma, p, &theirs)?
    } else if args.overhead && p.test == Test::FaaLat {
        post_overhead(&mut rma, p, &theirs)?
    } else {
        stream(&mut rma, p, &theirs)?
    };
    rma.put_blocking(&control, DONE as u64, &1u64.to_ne_bytes(), CONNECT_TIMEOUT)?;
    Ok(report)
}

fn ping_pong(rma: &mut Rma, p: &Params, theirs: &RemoteSegment, mine: &ExportedSegment) -> Result<Report> {
    let clock = CycleClock::calibrate(Duration::from_millis(50));
    let w = word_off(p.size);
    let mut data = vec![0xa5u8; p.size];
    let far = Instant::now() + Duration::from_secs(600);
    let mut samples = Vec::with_capacity(p.iters as usize);
    for i in 1..=p.warmup + p.iters {
        let t0 = ticks();
        ping(rma, p, theirs, w as u64, i, &mut data)?;
        wait_word(rma, mine, w, |v| v >= i, Cadence::of(theirs), far)?;
        if i > p.warmup {
            samples.push(clock.ns(ticks() - t0));
        }
    }
    rma.flush_blocking(CONNECT_TIMEOUT)?;
    poll_checked(rma, usize::MAX)?;
    Ok(latency_report(p, samples, true))
}

/// Posts one operation of a whole-operation test; `Done` when it completed at once
/// (mapped), else its completion comes from `poll`.
fn post_one(rma: &mut Rma, p: &Params, theirs: &RemoteSegment, buf: &mut [u8], i: u64) -> Result<RmaOutcome> {
    Ok(match p.test {
        Test::GetLat => rma.get(theirs, 0, buf, i)?,
        Test::FaaLat => match rma.fetch_and_add(theirs, 0, 1, i)? {
            RmaOutcome::Done(_) => RmaOutcome::Done(()),
            RmaOutcome::InProgress(t) => RmaOutcome::InProgress(t),
            RmaOutcome::NoResource => RmaOutcome::NoResource,
        },
        Test::CasLat => match rma.compare_and_swap(theirs, 0, i, i + 1, i)? {
            RmaOutcome::Done(_) => RmaOutcome::Done(()),
            RmaOutcome::InProgress(t) => RmaOutcome::InProgress(t),
            RmaOutcome::NoResource => RmaOutcome::NoResource,
        },
        _ => unreachable!("whole-operation tests only"),
    })
}

/// One operation at a time, each timed whole (not halved).
fn op_latency(rma: &mut Rma, p: &Params, theirs: &RemoteSegment) -> Result<Report> {
    let clock = CycleClock::calibrate(Duration::from_millis(50));
    let mut buf = vec![0u8; p.size];
    let mut samples = Vec::with_capacity(p.iters as usize);
    for i in 0..p.warmup + p.iters {
        let t0 = ticks();
        loop {
            match post_one(rma, p, theirs, &mut buf, i)? {
                RmaOutcome::Done(()) => break,
                RmaOutcome::InProgress(_) => {
                    let mut done = None;
                    while done.is_none() {
                        rma.poll(1, |c| {
                            if let Ok(ulnet_core::rma::Completed::Get(d)) = c.result {
                                buf.copy_from_slice(d);
                            }
                            done = Some(c.result.map(|_| ()));
                        });
                    }
                    done.expect("loop ends with a result")?;
                    break;
                }
                RmaOutcome::NoResource => {
                    poll_checked(rma, 64)?;
                }
            }
        }
        if i >= p.warmup {
            samples.push(clock.ns(ticks() - t0));
        }
    }
    Ok(latency_report(p, samples, false))
}

/// Fetch-and-adds posted back to back, each iteration timed whole: the post (with its
/// retries after `NoResource`) and one poll that sends it and reaps what completed, as
/// `ucx_perftest` times each iteration of its stream with its progress call. The final
/// flush is outside the timing.
fn post_overhead(rma: &mut Rma, p: &Params, theirs: &RemoteSegment) -> Result<Report> {
    let clock = CycleClock::calibrate(Duration::from_millis(50));
    let mut samples = Vec::with_capacity(p.iters as usize);
    for i in 0..p.warmup + p.iters {
        let t0 = ticks();
        while rma.fetch_and_add(theirs, 0, 1, i)? == RmaOutcome::NoResource {
            poll_checked(rma, 256)?;
        }
        poll_checked(rma, 256)?;
        if i >= p.warmup {
            samples.push(clock.ns(ticks() - t0));
        }
    }
    rma.flush_blocking(Duration::from_secs(600))?;
    poll_checked(rma, usize::MAX)?;
    Ok(latency_report(p, samples, false))
}

/// Puts or gets of `size` bytes back to back, as many in flight as the node allows.
fn stream(rma: &mut Rma, p: &Params, theirs: &RemoteSegment) -> Result<Report> {
    let data = vec![0x3cu8; p.size];
    let mut buf = vec![0u8; p.size];
    let mut run = |count: u64| -> Result<()> {
        let mut posted = 0;
        while posted < count {
            let outcome = match p.test {
                Test::PutBw => rma.put(theirs, 0, &data, posted)?,
                _ => rma.get(theirs, 0, &mut buf, posted)?,
            };
            match outcome {
                RmaOutcome::NoResource => {
                    poll_checked(rma, 256)?;
                }
                _ => posted += 1,
            }
            if posted % 64 == 0 {
                poll_checked(rma, 256)?;
            }
        }
        rma.flush_blocking(Duration::from_secs(600))?;
        poll_checked(rma, usize::MAX)?;
        Ok(())
    };
    run(p.warmup)?;
    let t0 = Instant::now();
    run(p.iters)?;
    let secs = t0.elapsed().as_secs_f64();
    let rate = p.iters as f64 / secs;
    Ok(Report { msgs_per_s: Some(rate), mb_per_s: Some(rate * p.size as f64 / 1e6), ..Report::of(p) })
}

/// Percentiles of per-iteration times; halved for round trips (one-way latency).
fn latency_report(p: &Params, mut ns: Vec<u64>, round_trips: bool) -> Report {
    ns.sort_unstable();
    let div = if round_trips { 2000.0 } else { 1000.0 };
    let n = ns.len().max(1);
    let at = |q: f64| ns.get(((n as f64 * q) as usize).min(n - 1)).copied().unwrap_or(0) as f64 / div;
    let avg = ns.iter().map(|&x| x as f64).sum::<f64>() / n as f64 / div;
    Report { p50_us: Some(at(0.5)), p99_us: Some(at(0.99)), avg_us: Some(avg), ..Report::of(p) }
}
