//! `ulnet registry`: set and get keys of the replicated registry of a running cluster, show
//! a node's registry status, and drive a load (the `bench/registry.sh` figures).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig};
use ulnet_msg::rpc::{CallId, CallOutcome, Rpc, RpcConfig, RpcEvent};
use ulnet_registry::client::{self, ClientError, Outcome, RegistryClient};

/// `ulnet registry` subcommands.
#[derive(Subcommand, Debug)]
pub enum RegistryCommand {
    /// Set KEY to VALUE (answered once committed: fsynced on a quorum and applied).
    Set(SetArgs),
    /// Read KEY (linearizable).
    Get(GetArgs),
    /// A node's registry: epoch, locker, applied position, voters.
    Status(StatusArgs),
    /// Closed-loop clients setting values as fast as the cluster answers; prints the rate
    /// and latency percentiles.
    Load(LoadArgs),
}

/// Where the cluster is.
#[derive(Args, Debug)]
pub struct Connect {
    /// The node to ask (its --listen address).
    #[arg(long)]
    connect: String,
    /// File holding the cluster secret (default: the file ULNET_SECRET_FILE names; none: the
    /// empty secret of an --insecure-no-secret node).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// How long to wait for an answer, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

/// Arguments of `ulnet registry set`.
#[derive(Args, Debug)]
pub struct SetArgs {
    /// The key.
    key: String,
    /// The value.
    value: String,
    #[command(flatten)]
    connect: Connect,
}

/// Arguments of `ulnet registry get`.
#[derive(Args, Debug)]
pub struct GetArgs {
    /// The key.
    key: String,
    #[command(flatten)]
    connect: Connect,
    /// Print one JSON object: `{"key", "value" (null when absent), "found", "seq"}`.
    #[arg(long)]
    json: bool,
}

/// Arguments of `ulnet registry status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    connect: Connect,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Arguments of `ulnet registry load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Nodes to spread the clients over (client c uses node c mod N), comma-separated.
    #[arg(long, value_delimiter = ',')]
    connect: Vec<String>,
    /// File holding the cluster secret (default: the file ULNET_SECRET_FILE names; none: the
    /// empty secret of an --insecure-no-secret node).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Concurrent clients, each with one request at a time.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Bytes of each value.
    #[arg(long, default_value_t = 64)]
    value_bytes: usize,
    /// Measured time, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Unmeasured time before, in seconds.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Before starting, wait until every node given has a registry whose voters are this
    /// many (the cluster formed and the configuration followed).
    #[arg(long)]
    wait_members: Option<usize>,
    /// Print one JSON object (`system`, `clients`, `value_bytes`, `ops`, `seconds`,
    /// `updates_per_s`, `p50_ms`, `p99_ms`, `failed`).
    #[arg(long)]
    json: bool,
}

pub fn run(c: RegistryCommand) -> Result<i32> {
    match c {
        RegistryCommand::Set(a) => set(a),
        RegistryCommand::Get(a) => get(a),
        RegistryCommand::Status(a) => status(a),
        RegistryCommand::Load(a) => load(a),
    }
}

fn client(c: &Connect) -> Result<RegistryClient> {
    let secret = super::node::read_secret(&c.secret_file)?;
    Ok(RegistryClient::connect(&c.connect, &secret, Duration::from_millis(c.timeout_ms))?)
}

fn set(a: SetArgs) -> Result<i32> {
    let seq = client(&a.connect)?.set(a.key.as_bytes(), a.value.as_bytes())?;
    println!("set {} at position {seq}", a.key);
    Ok(0)
}

#[derive(Serialize)]
struct GetJson<'a> {
    key: &'a str,
    value: Option<String>,
    found: bool,
    seq: u64,
}

fn get(a: GetArgs) -> Result<i32> {
    let got = client(&a.connect)?.get(a.key.as_bytes())?;
    let value = got.value.as_ref().map(|v| String::from_utf8_lossy(v).into_owned());
    if a.json {
        println!("{}", serde_json::to_string(&GetJson { key: &a.key, found: value.is_some(), value, seq: got.seq })?);
    } else {
        match value {
            Some(v) => println!("{v}"),
            None => bail!("no key {}", a.key),
        }
    }
    Ok(0)
}

fn status(a: StatusArgs) -> Result<i32> {
    let s = client(&a.connect)?.status()?;
    if a.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "node {} registry {}: epoch {}{}{}, applied {}, committed {}, {} keys",
            s.node,
            if s.running { "running" } else { "not running" },
            s.epoch,
            if s.locker { ", locker" } else { "" },
            if s.normal { "" } else { ", not synced" },
            s.applied,
            s.committed,
            s.keys
        );
        println!("voters: {}", s.voters.join(", "));
        if !s.stopped.is_empty() {
            println!("{}", s.stopped);
        }
        if s.disk_failures > 0 {
            println!("disk failures: {}, restarts in place: {}", s.disk_failures, s.restarts);
        }
    }
    Ok(0)
}

/// Waits until each node's registry runs, is in its epoch and votes with `members` voters.
fn wait_members(addrs: &[String], secret: &[u8], members: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<&String> = addrs.iter().collect();
    while !pending.is_empty() {
        pending.retain(|addr| {
            let ok = RegistryClient::connect(addr, secret, Duration::from_millis(500))
                .and_then(|mut c| c.status())
                .map(|s| s.running && s.normal && s.voters.len() == members && s.committed == s.applied);
            !matches!(ok, Ok(true))
        });
        if pending.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("{} of the nodes did not reach {members} voters within {timeout:?}: {pending:?}", pending.len());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[derive(Serialize)]
struct LoadJson {
    system: &'static str,
    clients: usize,
    value_bytes: usize,
    ops: usize,
    seconds: f64,
    updates_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    failed: u64,
}

fn load(a: LoadArgs) -> Result<i32> {
    if a.connect.is_empty() || a.clients == 0 {
        bail!("--connect needs at least one node and --clients at least one client");
    }
    let secret = super::node::read_secret(&a.secret_file)?;
    if let Some(n) = a.wait_members {
        eprintln!("waiting for {n} voters at every node ...");
        wait_members(&a.connect, &secret, n, Duration::from_secs(120))?;
    }
    // One channel per client, like independent clients (bench/peers/etcd-load does the
    // same with etcd's client): client c talks to node c mod N. One thread drives them all.
    let mut config = EndpointConfig::default();
    config.tcp.secret = secret;
    let mut ep = Endpoint::new(config);
    let mut channels: Vec<ChannelId> = Vec::new();
    for c in 0..a.clients {
        let addr = &a.connect[c % a.connect.len()];
        channels.push(ep.connect_tcp(addr, Duration::from_secs(5)).with_context(|| format!("connecting to {addr}"))?);
    }
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..RpcConfig::default() });
    let value = vec![b'v'; a.value_bytes];
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(a.warmup);
    let end = measure_from + Duration::from_secs_f64(a.seconds);
    let timeout = Duration::from_secs(10);
    // Per client: the call in flight and when it was sent; its counter.
    let mut inflight: Vec<Option<(CallId, Instant)>> = vec![None; a.clients];
    let mut counter = vec![0u64; a.clients];
    let mut latencies_ns: Vec<u64> = Vec::new();
    let mut failed = 0u64;
    let mut errors: Vec<String> = Vec::new();
    loop {
        let now = Instant::now();
        let running = now < end;
        for c in 0..a.clients {
            if inflight[c].is_none() && running {
                let key = format!("bench/{c}/{}", counter[c] % 1000);
                counter[c] += 1;
                let payload = client::encode_set(key.as_bytes(), &value);
                if let CallOutcome::Sent(id) = rpc.call(channels[c], client::METHOD_SET, &[&payload], Some(timeout))? {
                    inflight[c] = Some((id, Instant::now()));
                }
            }
        }
        if !running && inflight.iter().all(Option::is_none) {
            break;
        }
        let mut answered = false;
        rpc.poll(256, |e| {
            let (call, result) = match e {
                RpcEvent::Reply { call, data, .. } => {
                    (call, client::decode_update_answer(data).map_err(ClientError::from))
                }
                RpcEvent::Failed { call, error, .. } => (call, Err(ClientError::Call(error))),
                RpcEvent::ChannelDown { .. } => return,
            };
            let Some(c) = inflight.iter().position(|f| f.is_some_and(|(id, _)| id == call)) else { return };
            let (_, sent) = inflight[c].take().expect("found");
            answered = true;
            match result {
                Ok(answer) if answer.outcome == Outcome::Done => {
                    if sent >= measure_from && sent < end {
                        latencies_ns.push(sent.elapsed().as_nanos() as u64);
                    }
                }
                Ok(answer) => {
                    failed += 1;
                    errors.push(answer.message);
                }
                Err(e) => {
                    failed += 1;
                    errors.push(e.to_string());
                }
            }
        });
        if !answered {
            let _ = rpc.endpoint().wait(Some(Duration::from_millis(5)));
        }
        if now > end + timeout * 2 {
            bail!("clients still waiting {:?} after the end", timeout * 2);
        }
    }
    if latencies_ns.is_empty() {
        bail!("no set completed in the measured time ({failed} failed: {:?})", errors.first());
    }
    if failed > 0 {
        eprintln!("registry load: {failed} sets failed (first: {:?})", errors.first());
    }
    latencies_ns.sort_unstable();
    let n = latencies_ns.len();
    let at = |q: f64| latencies_ns[((n as f64 * q) as usize).min(n - 1)] as f64 / 1e6;
    let out = LoadJson {
        system: "ulnet",
        clients: a.clients,
        value_bytes: a.value_bytes,
        ops: n,
        seconds: a.seconds,
        updates_per_s: n as f64 / a.seconds,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        failed,
    };
    if a.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "{} clients, {} B values: {:.0} updates/s, p50 {:.2} ms, p99 {:.2} ms ({} failed)",
            out.clients, out.value_bytes, out.updates_per_s, out.p50_ms, out.p99_ms, out.failed
        );
    }
    Ok(0)
}
