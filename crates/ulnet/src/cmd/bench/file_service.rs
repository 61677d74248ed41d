//! `ulnet bench file-service`: the paper's comparison of a file service built on pure data
//! transfer (DX: the client's clerk reads the server's cache with one-sided gets) against
//! the same operations done by RPC (the server's procedure looks the cache up and replies),
//! for GetAttribute, LookupName and ReadFile of 1, 4 and 8 KiB.
//!
//! The server process holds a file-system cache of 1,024 files in one exported segment,
//! organised as the paper's hash tables: a name area (open-addressed, FNV-1a, 128-byte
//! entries), an attribute area (64 bytes per file handle) and a data area (8 KiB per file);
//! every entry starts with a valid word. It serves DX with its RMA engine thread and RPC
//! with a `ulnet-msg` server thread running inline handlers over the same cache. Both
//! servers sleep in the kernel as soon as they are idle (or after `--server-spin-us`), so a
//! server thread's CPU time is the work of its requests, wake-ups included.
//!
//! For each operation and each scheme the client runs `--iters` operations on random files
//! one at a time, timing each; the server reports the CPU time every one of its threads
//! spent during the phase (`/proc/self/task/*/schedstat`). Over `shm` the DX client maps the
//! cache, and the server's CPU does nothing at all for DX (the "co-processor" case of the
//! paper); `--no-map` sends DX reads through the engine instead.

use super::access::PeerAccess;
use super::{ticks, CycleClock};
use super::{BenchArgs, Params, TransportArg, CONNECT_TIMEOUT};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ulnet_core::rma::{
    Access, Completed, ExportedSegment, ImportMode, NodeId, NotifyMode, RemoteSegment, Rights, Rma, RmaConfig,
    RmaOutcome,
};
use ulnet_core::{ChannelId, Endpoint};
use ulnet_msg::rpc::{CallOutcome, Rpc, RpcConfig, RpcEvent};

const FILES: usize = 1024;
const NAME_SLOTS: usize = 4096;
const NAME_ENTRY: usize = 128;
const NAME_MAX: usize = NAME_ENTRY - 24;
const ATTR_LEN: usize = 64;
const BLOCK: usize = 8192;
const NAMES_OFF: usize = 0;
const ATTRS_OFF: usize = NAMES_OFF + NAME_SLOTS * NAME_ENTRY;
const DATA_OFF: usize = ATTRS_OFF + FILES * ATTR_LEN;
const CACHE_LEN: usize = DATA_OFF + FILES * BLOCK;

/// The file server's node id, and the client's, which alone may read the cache.
const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);

const GET_ATTR: u16 = 1;
const LOOKUP: u16 = 2;
const READ: u16 = 3;
const PHASE_BEGIN: u16 = 10;
const PHASE_END: u16 = 11;

fn file_name(f: usize) -> String {
    format!("/usr/src/ulnet/crates/file-{f:04}.rs")
}

fn fnv(name: &[u8]) -> u64 {
    name.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

/// Fills the cache: names, attributes (handle, size, mode, uid, gid, times) and data.
fn fill_cache(seg: &ExportedSegment) {
    for f in 0..FILES {
        let name = file_name(f);
        let mut slot = fnv(name.as_bytes()) as usize % NAME_SLOTS;
        while seg.load_u64(NAMES_OFF + slot * NAME_ENTRY) != 0 {
            slot = (slot + 1) % NAME_SLOTS;
        }
        let at = NAMES_OFF + slot * NAME_ENTRY;
        seg.store_u64(at + 8, f as u64);
        seg.store_u64(at + 16, name.len() as u64);
        seg.write(at + 24, name.as_bytes());
        seg.store_u64(at, 1);
        let attrs = [1, f as u64, BLOCK as u64, 0o100644, 1000, 1000, 1_700_000_000 + f as u64, 1_700_000_000];
        let bytes: Vec<u8> = attrs.iter().flat_map(|w| w.to_ne_bytes()).collect();
        seg.write(ATTRS_OFF + f * ATTR_LEN, &bytes);
        let data: Vec<u8> = (0..BLOCK).map(|i| (i + f) as u8).collect();
        seg.write(DATA_OFF + f * BLOCK, &data);
        seg.store_u64(DATA_OFF + f * BLOCK, f as u64);
    }
}

/// The name entry of `name`, probing as the table was filled (server side, local memory).
fn lookup_local(seg: &ExportedSegment, name: &[u8], out: &mut [u8; NAME_ENTRY]) -> bool {
    let mut slot = fnv(name) as usize % NAME_SLOTS;
    for _ in 0..NAME_SLOTS {
        seg.read(NAMES_OFF + slot * NAME_ENTRY, out);
        if word(out, 0) == 0 {
            return false;
        }
        let len = (word(out, 2) as usize).min(NAME_MAX);
        if &out[24..24 + len] == name {
            return true;
        }
        slot = (slot + 1) % NAME_SLOTS;
    }
    false
}

/// CPU time of every thread of this process so far, in ns, by thread id.
fn thread_cpu() -> HashMap<i32, u64> {
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return out };
    for t in tasks.flatten() {
        let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>() else { continue };
        if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
            if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
                out.insert(tid, ns);
            }
        }
    }
    out
}

/// This thread's kernel id (`/proc/thread-self` links to `PID/task/TID`).
fn own_thread_id() -> Result<i32> {
    let link = std::fs::read_link("/proc/thread-self")?;
    let tid = link.file_name().and_then(|t| t.to_str()).and_then(|t| t.parse().ok());
    tid.context("reading /proc/thread-self")
}

/// Which operation.
#[derive(Clone, Copy, Debug)]
enum FsOp {
    GetAttribute,
    LookupName,
    ReadFile(usize),
}

impl FsOp {
    fn name(self) -> String {
        match self {
            FsOp::GetAttribute => "GetAttribute".into(),
            FsOp::LookupName => "LookupName".into(),
            FsOp::ReadFile(n) => format!("ReadFile({}K)", n / 1024),
        }
    }
}

const OPS: [FsOp; 5] =
    [FsOp::GetAttribute, FsOp::LookupName, FsOp::ReadFile(1024), FsOp::ReadFile(4096), FsOp::ReadFile(8192)];

/// Server CPU per operation, by thread, in µs.
#[derive(Serialize, Clone, Copy, Default)]
struct ThreadCpu {
    /// The RMA engine thread (serves DX through a channel).
    engine_us: f64,
    /// The RPC server thread (runs the procedures).
    server_thread_us: f64,
    /// Any other thread of the server.
    other_us: f64,
}

#[derive(Serialize)]
struct Row {
    op: String,
    dx_p50_us: f64,
    rpc_p50_us: f64,
    dx_server_cpu_us: f64,
    rpc_server_cpu_us: f64,
    /// DX server CPU over RPC server CPU (the paper found under 0.5).
    server_load_ratio: f64,
    dx_cpu_by_thread: ThreadCpu,
    rpc_cpu_by_thread: ThreadCpu,
}

#[derive(Serialize)]
struct FsReport {
    test: &'static str,
    transport: &'static str,
    /// How DX reads reach the cache: "mapped" (no server CPU) or "engine".
    dx_path: &'static str,
    iters: u64,
    rows: Vec<Row>,
}

pub(super) fn run(args: &BenchArgs, p: &Params) -> Result<i32> {
    let spin = Duration::from_micros(args.server_spin_us);
    let access = PeerAccess::of(args)?;
    if args.server {
        let listen = args.listen.clone().context("--server needs --listen")?;
        serve(p, &access, &listen, spin)?;
        return Ok(0);
    }
    let (mut child, rma_addr, rpc_addr) = spawn_server(args, p, &access)?;
    let report = client(args, p, &access, &rma_addr, &rpc_addr);
    let status = child.wait()?;
    let report = report?;
    if !status.success() {
        bail!("file server exited with {status}");
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "file-service over {} (DX {}; {} files, {} operations each; servers sleep when idle)",
            report.transport, report.dx_path, FILES, report.iters
        );
        println!(
            "{:<14}{:>10}{:>11}{:>15}{:>16}{:>8}   by thread, engine/server/other: DX; RPC",
            "op", "DX p50 us", "RPC p50 us", "DX srv CPU us", "RPC srv CPU us", "DX/RPC"
        );
        for r in &report.rows {
            let (d, c) = (r.dx_cpu_by_thread, r.rpc_cpu_by_thread);
            println!(
                "{:<14}{:>10.2}{:>11.2}{:>15.2}{:>16.2}{:>8.2}   {:.2}/{:.2}/{:.2}; {:.2}/{:.2}/{:.2}",
                r.op,
                r.dx_p50_us,
                r.rpc_p50_us,
                r.dx_server_cpu_us,
                r.rpc_server_cpu_us,
                r.server_load_ratio,
                d.engine_us,
                d.server_thread_us,
                d.other_us,
                c.engine_us,
                c.server_thread_us,
                c.other_us
            );
        }
    }
    Ok(0)
}

fn spawn_server(args: &BenchArgs, p: &Params, access: &PeerAccess) -> Result<(Child, String, String)> {
    let listen = match p.transport {
        TransportArg::Shm => format!("fs-{}", std::process::id()),
        TransportArg::Tcp | TransportArg::Udp => "127.0.0.1:0".to_string(),
    };
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["bench", "file-service", "--server", "--listen", &listen, "--transport", p.transport.name()])
        .args(["--server-spin-us", &args.server_spin_us.to_string()])
        .stdout(Stdio::piped());
    access.pass_to(&mut command);
    let mut child = command.spawn().context("starting the file server")?;
    access.hand_over(&mut child)?;
    let out = child.stdout.take().context("server stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line)?;
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("listening"), Some(rma), Some(rpc)) => Ok((child, rma.to_string(), rpc.to_string())),
        _ => bail!("the file server did not start listening"),
    }
}

fn serve(p: &Params, access: &PeerAccess, listen: &str, spin: Duration) -> Result<()> {
    access.check_listen(p.transport, listen)?;
    let mut config = access.rma_config(RmaConfig::new(SERVER));
    config.engine_spin = spin;
    let mut rma = Rma::new(config)?;
    let mut ep = Endpoint::new(access.endpoint_config(NodeId::default()));
    let (rma_addr, rpc_addr) = match p.transport {
        TransportArg::Shm => {
            rma.listen_shm(listen)?;
            let rpc = format!("{listen}-rpc");
            ep.listen_shm(&rpc)?;
            (listen.to_string(), rpc)
        }
        TransportArg::Tcp => (rma.listen_tcp(listen)?.to_string(), ep.listen_tcp(listen)?.to_string()),
        TransportArg::Udp => (rma.listen_udp(listen)?.to_string(), ep.listen_udp(listen)?.to_string()),
    };
    let readers = Access::none().grant(CLIENT, Rights::READ);
    let seg = Arc::new(rma.export("fs-cache", CACHE_LEN, readers, NotifyMode::Never)?);
    fill_cache(&seg);
    println!("listening {rma_addr} {rpc_addr}");
    std::io::Write::flush(&mut std::io::stdout())?;
    ep.accept(CONNECT_TIMEOUT)?;
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let s = seg.clone();
    rpc.register_inline(GET_ATTR, move |req, replier| {
        let mut attrs = [0u8; ATTR_LEN];
        let handle = req.payload.get(..8).map_or(u64::MAX, |b| word(b, 0)) as usize;
        if handle < FILES {
            s.read(ATTRS_OFF + handle * ATTR_LEN, &mut attrs);
        }
        replier.reply(&[&attrs]);
    });
    let s = seg.clone();
    rpc.register_inline(LOOKUP, move |req, replier| {
        let mut entry = [0u8; NAME_ENTRY];
        if !lookup_local(&s, req.payload, &mut entry) {
            entry = [0; NAME_ENTRY];
        }
        replier.reply(&[&entry]);
    });
    let s = seg.clone();
    let mut data = vec![0u8; BLOCK];
    rpc.register_inline(READ, move |req, replier| {
        let (handle, len) = match req.payload {
            b if b.len() == 16 => (word(b, 0) as usize, (word(b, 1) as usize).min(BLOCK)),
            _ => (usize::MAX, 0),
        };
        if handle < FILES {
            s.read(DATA_OFF + handle * BLOCK, &mut data[..len]);
        }
        replier.reply(&[&data[..len]]);
    });
    let engine_tid = loop {
        if let Some(t) = rma.engine_thread_id() {
            break t;
        }
        std::thread::yield_now();
    };
    let rpc_tid = own_thread_id()?;
    let phase_start: Arc<Mutex<HashMap<i32, u64>>> = Arc::default();
    let start = phase_start.clone();
    rpc.register_inline(PHASE_BEGIN, move |_, replier| {
        *start.lock().unwrap_or_else(|e| e.into_inner()) = thread_cpu();
        replier.reply(&[]);
    });
    rpc.register_inline(PHASE_END, move |_, replier| {
        let before = phase_start.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (mut engine, mut server, mut other) = (0u64, 0u64, 0u64);
        for (tid, ns) in thread_cpu() {
            let delta = ns.saturating_sub(before.get(&tid).copied().unwrap_or(0));
            match tid {
                t if t == engine_tid => engine += delta,
                t if t == rpc_tid => server += delta,
                _ => other += delta,
            }
        }
        let reply: Vec<u8> = [engine, server, other].iter().flat_map(|w| w.to_ne_bytes()).collect();
        replier.reply(&[&reply]);
    });
    let mut idle_since = Instant::now();
    let mut down = false;
    while !down {
        if rpc.poll(64, |e| down |= matches!(e, RpcEvent::ChannelDown { .. })) > 0 {
            idle_since = Instant::now();
        } else if idle_since.elapsed() >= spin {
            rpc.endpoint().wait(Some(Duration::from_secs(1)))?;
            idle_since = Instant::now();
        }
    }
    drop(seg);
    Ok(())
}

/// One RPC call, waited for; the reply's bytes go to `out` (returns their length).
fn call(rpc: &mut Rpc, ch: ChannelId, method: u16, payload: &[u8], out: &mut [u8]) -> Result<usize> {
    while rpc.call(ch, method, &[payload], Some(CONNECT_TIMEOUT))? == CallOutcome::NoResource {
        rpc.poll(16, |_| {});
    }
    let mut result: Option<Result<usize>> = None;
    while result.is_none() {
        rpc.poll(16, |e| match e {
            RpcEvent::Reply { data, .. } => {
                let n = data.len().min(out.len());
                out[..n].copy_from_slice(&data[..n]);
                result = Some(Ok(data.len()));
            }
            RpcEvent::Failed { error, .. } => result = Some(Err(anyhow::anyhow!("call failed: {error}"))),
            RpcEvent::ChannelDown { error, .. } => result = Some(Err(anyhow::anyhow!("server gone: {error}"))),
        });
    }
    result.expect("loop ends with a result")
}

/// One-sided read of `out.len()` bytes at `off`, waited for.
fn dx_read(rma: &mut Rma, seg: &RemoteSegment, off: u64, out: &mut [u8]) -> Result<()> {
    loop {
        match rma.get(seg, off, out, 0)? {
            RmaOutcome::Done(()) => return Ok(()),
            RmaOutcome::InProgress(_) => break,
            RmaOutcome::NoResource => {
                rma.poll(16, |_| {});
            }
        }
    }
    let mut result = None;
    while result.is_none() {
        rma.poll(1, |c| {
            result = Some(match c.result {
                Ok(Completed::Get(d)) => {
                    out.copy_from_slice(d);
                    Ok(())
                }
                Ok(_) => Err(anyhow::anyhow!("unexpected completion")),
                Err(e) => Err(e.into()),
            })
        });
    }
    result.expect("loop ends with a result")
}

/// Runs one operation on file `f` by DX (`rpc` None) or RPC, and checks what came back.
fn one(
    op: FsOp,
    f: usize,
    rma: &mut Rma,
    seg: &RemoteSegment,
    rpc: Option<(&mut Rpc, ChannelId)>,
    buf: &mut [u8],
) -> Result<()> {
    match (op, rpc) {
        (FsOp::GetAttribute, None) => dx_read(rma, seg, (ATTRS_OFF + f * ATTR_LEN) as u64, &mut buf[..ATTR_LEN])?,
        (FsOp::GetAttribute, Some((rpc, ch))) => {
            call(rpc, ch, GET_ATTR, &(f as u64).to_ne_bytes(), &mut buf[..ATTR_LEN])?;
        }
        (FsOp::LookupName, None) => {
            let name = file_name(f);
            let mut slot = fnv(name.as_bytes()) as usize % NAME_SLOTS;
            loop {
                dx_read(rma, seg, (NAMES_OFF + slot * NAME_ENTRY) as u64, &mut buf[..NAME_ENTRY])?;
                let len = (word(buf, 2) as usize).min(NAME_MAX);
                if word(buf, 0) == 0 || &buf[24..24 + len] == name.as_bytes() {
                    break;
                }
                slot = (slot + 1) % NAME_SLOTS;
            }
        }
        (FsOp::LookupName, Some((rpc, ch))) => {
            call(rpc, ch, LOOKUP, file_name(f).as_bytes(), &mut buf[..NAME_ENTRY])?;
        }
        (FsOp::ReadFile(len), None) => dx_read(rma, seg, (DATA_OFF + f * BLOCK) as u64, &mut buf[..len])?,
        (FsOp::ReadFile(len), Some((rpc, ch))) => {
            let req: Vec<u8> = [f as u64, len as u64].iter().flat_map(|w| w.to_ne_bytes()).collect();
            call(rpc, ch, READ, &req, &mut buf[..len])?;
        }
    }
    let ok = match op {
        FsOp::GetAttribute => word(buf, 0) == 1 && word(buf, 1) == f as u64,
        FsOp::LookupName => word(buf, 0) == 1 && word(buf, 1) == f as u64,
        FsOp::ReadFile(_) => word(buf, 0) == f as u64,
    };
    if !ok {
        bail!("{} of file {f} returned the wrong entry", op.name());
    }
    Ok(())
}

fn client(args: &BenchArgs, p: &Params, access: &PeerAccess, rma_addr: &str, rpc_addr: &str) -> Result<FsReport> {
    let mut rma = Rma::new(access.rma_config(RmaConfig::manual(CLIENT)))?;
    let (peer, mode) = match p.transport {
        TransportArg::Shm => {
            (rma.connect_shm(rma_addr), if args.no_map { ImportMode::Channel } else { ImportMode::Map })
        }
        TransportArg::Tcp => (rma.connect_tcp(rma_addr, CONNECT_TIMEOUT)?, ImportMode::Channel),
        TransportArg::Udp => (rma.connect_udp(rma_addr, CONNECT_TIMEOUT)?, ImportMode::Channel),
    };
    let seg = rma.import_with(peer, "fs-cache", mode)?;
    let mut ep = Endpoint::new(access.endpoint_config(NodeId::default()));
    let ch = match p.transport {
        TransportArg::Shm => ep.connect_shm(rpc_addr, CONNECT_TIMEOUT)?,
        TransportArg::Tcp => ep.connect_tcp(rpc_addr, CONNECT_TIMEOUT)?,
        TransportArg::Udp => ep.connect_udp(rpc_addr, CONNECT_TIMEOUT)?,
    };
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let clock = CycleClock::calibrate(Duration::from_millis(50));
    let mut buf = vec![0u8; BLOCK];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_file = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % FILES as u64) as usize
    };
    let mut rows = Vec::new();
    for op in OPS {
        let mut p50 = [0.0; 2];
        let mut cpu = [0.0; 2];
        let mut by_thread = [ThreadCpu::default(); 2];
        for (k, by_rpc) in [false, true].into_iter().enumerate() {
            for _ in 0..p.warmup {
                let f = next_file();
                one(op, f, &mut rma, &seg, by_rpc.then_some((&mut rpc, ch)), &mut buf)?;
            }
            call(&mut rpc, ch, PHASE_BEGIN, &[], &mut [])?;
            let mut samples = Vec::with_capacity(p.iters as usize);
            for _ in 0..p.iters {
                let f = next_file();
                let t0 = ticks();
                one(op, f, &mut rma, &seg, by_rpc.then_some((&mut rpc, ch)), &mut buf)?;
                samples.push(clock.ns(ticks() - t0));
            }
            let mut used = [0u8; 24];
            call(&mut rpc, ch, PHASE_END, &[], &mut used)?;
            let total_ns: u64 = (0..3).map(|i| word(&used, i)).sum();
            let per_op = |ns: u64| ns as f64 / p.iters as f64 / 1000.0;
            by_thread[k] = ThreadCpu {
                engine_us: per_op(word(&used, 0)),
                server_thread_us: per_op(word(&used, 1)),
                other_us: per_op(word(&used, 2)),
            };
            samples.sort_unstable();
            p50[k] = samples[samples.len() / 2] as f64 / 1000.0;
            cpu[k] = total_ns as f64 / p.iters as f64 / 1000.0;
        }
        rows.push(Row {
            op: op.name(),
            dx_p50_us: p50[0],
            rpc_p50_us: p50[1],
            dx_server_cpu_us: cpu[0],
            rpc_server_cpu_us: cpu[1],
            server_load_ratio: if cpu[1] > 0.0 { cpu[0] / cpu[1] } else { f64::NAN },
            dx_cpu_by_thread: by_thread[0],
            rpc_cpu_by_thread: by_thread[1],
        });
    }
    rpc.endpoint().close(ch);
    Ok(FsReport {
        test: "file-service",
        transport: p.transport.name(),
        dx_path: if seg.is_mapped() { "mapped" } else { "engine" },
        iters: p.iters,
        rows,
    })
}
