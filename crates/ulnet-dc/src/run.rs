//! Runs a data center and a load against it, and reports: the engine of `ulnet dc run`,
//! the demo, the benchmarks and the end-to-end tests.
//!
//! A [`Center`] is the front (this process: the home of the role word in remote memory,
//! the load balancer, and the clients of a run) and its nodes, one process each
//! ([`Launch::Processes`], what `ulnet dc run` does) or threads of this process
//! ([`Launch::Threads`], for tests). Starting one:
//!
//! 1. the front exports the role word and listens for remote memory;
//! 2. each node starts (exports its load record and inbox, joins the membership cluster
//!    through node 0, takes HTTP requests) and says where it listens ([`Ready`]);
//! 3. the front tells every node where all the others listen ([`Peers`]), and starts the
//!    balancer.
//!
//! While a run's load runs, the role word is sampled every [`TIER_SAMPLE_INTERVAL`] for the
//! tier-size plot.

use crate::capacity::CapacityConfig;
use crate::lb::{Balancer, BalancerConfig, BalancerReport};
use crate::load::ClusterKey;
use crate::loadgen;
use crate::membership::{JoinError, Member};
use crate::node::{self, NodeConfig, NodeHandle, NodeReport};
use crate::policy::HelperConfig;
use crate::report::{site_report, SiteReport};
use crate::role::{initial_table, NodeIndex, RoleTable, SiteId, NODES_MAX};
use crate::state::rma::{OpenError, RmaEndpoint, RmaPath, RmaState, RmaStateConfig};
use crate::state::{SharedState, StateCounters};
use crate::trace::Trace;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the role word is sampled for the tier-size series.
pub const TIER_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
/// Environment variable that hands the cluster key to node processes.
pub const KEY_ENV: &str = "ULNET_DC_KEY";

/// The reconfiguration policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Roles never change.
    Rigid,
    /// Helper modules move nodes between tiers (and sites).
    Reconf,
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Rigid => "rigid",
            Policy::Reconf => "reconf",
        })
    }
}

/// One website of a run.
#[derive(Clone, Copy, Debug)]
pub struct SiteSpec {
    /// Starting split: (proxy nodes, application nodes). Its total is the site's share of
    /// the center ([`HelperConfig::shares`]): nodes it lends while it does not need them
    /// and takes back as soon as it does.
    pub split: (usize, usize),
    /// Throughput guarantee for the QoS figure.
    pub guarantee_tps: Option<f64>,
}

/// How node programs are started.
#[derive(Clone, Debug)]
pub enum Launch {
    /// Threads of this process (tests).
    Threads,
    /// One process per node: `EXE dc node ...`.
    Processes {
        /// The `ulnet` executable.
        exe: PathBuf,
    },
}

/// Settings of a run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Websites, site 0 first (highest priority).
    pub sites: Vec<SiteSpec>,
    /// What the clients replay (its requests name their sites).
    pub trace: Arc<Trace>,
    /// Burst length the trace was made with (reported).
    pub burst: Option<usize>,
    /// Closed-loop clients.
    pub clients: usize,
    /// Policy.
    pub policy: Policy,
    /// Node capacity.
    pub capacity: CapacityConfig,
    /// Helper settings.
    pub helper: HelperConfig,
    /// Longest run (the traces may end it sooner).
    pub duration: Duration,
    /// Snapshot length.
    pub snapshot: Duration,
    /// How nodes start.
    pub launch: Launch,
    /// How the processes reach each other's remote memory.
    pub path: RmaPath,
}

/// Tier sizes at one instant: per site (proxies, apps).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TierSample {
    /// Seconds since the load started.
    pub t_s: f64,
    /// Per site.
    pub split: Vec<(usize, usize)>,
}

/// The outcome of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    /// Policy.
    pub policy: Policy,
    /// Trace of site 0.
    pub trace: String,
    /// Burst length, if the trace has bursts.
    pub burst: Option<usize>,
    /// Nodes.
    pub nodes: usize,
    /// Starting split per site.
    pub splits: Vec<(usize, usize)>,
    /// Answered requests per second, all sites.
    pub tps: f64,
    /// Median response time of site 0, ms.
    pub p50_ms: f64,
    /// 99th percentile of site 0, ms.
    pub p99_ms: f64,
    /// Site 0's QoS figure.
    pub qos_met_pct: Option<f64>,
    /// Role-table changes during the run.
    pub reconfigurations: u64,
    /// Failed client requests, all sites.
    pub failed: u64,
    /// Seconds the load ran.
    pub elapsed_s: f64,
    /// Snapshot length, s.
    pub snapshot_s: f64,
    /// Per site.
    pub sites: Vec<SiteReport>,
    /// Tier sizes over time.
    pub tiers: Vec<TierSample>,
    /// What each node did.
    pub node_reports: Vec<NodeReport>,
    /// What the balancer did.
    pub balancer: BalancerReportData,
    /// How the processes reached each other's remote memory.
    #[serde(default)]
    pub path: RmaPath,
    /// What the front's shared-state handle did.
    #[serde(default)]
    pub front: StateCounters,
}

/// [`BalancerReport`] in a result.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct BalancerReportData {
    /// Requests relayed.
    pub requests: u64,
    /// Errors.
    pub errors: u64,
    /// Retries.
    pub retries: u64,
}

impl From<BalancerReport> for BalancerReportData {
    fn from(r: BalancerReport) -> Self {
        BalancerReportData { requests: r.requests, errors: r.errors, retries: r.retries }
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad settings.
    #[error("{0}")]
    Config(String),
    /// Shared state in remote memory.
    #[error(transparent)]
    State(#[from] OpenError),
    /// Membership.
    #[error(transparent)]
    Join(#[from] JoinError),
    /// A socket or process.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A node process misbehaved.
    #[error("node {0}: {1}")]
    Node(usize, String),
}

/// What `ulnet dc node` is given (as JSON on its command line).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeSpec {
    /// The node's index.
    pub index: u8,
    /// Nodes in the center.
    pub slots: usize,
    /// The center's name (its shared-memory endpoints are named after it).
    pub center: String,
    /// How processes reach each other's remote memory.
    pub path: RmaPath,
    /// Where the front (home of the role word) takes remote-memory requests.
    pub front: RmaEndpoint,
    /// Members to join the membership cluster through (none: this node forms it).
    pub seeds: Vec<SocketAddr>,
    /// Capacity.
    pub capacity: CapacityConfig,
    /// Helper settings.
    pub helper: HelperConfig,
    /// Run the helper (reconf).
    pub reconfigure: bool,
}

/// A node's first line: where it listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ready {
    /// HTTP port (on 127.0.0.1).
    pub http: u16,
    /// Remote memory.
    pub rma: RmaEndpoint,
    /// Its membership member (UDP and TCP).
    pub member: SocketAddr,
}

/// What the front tells every node once all have started: where each takes remote-memory
/// requests, by node index.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Peers {
    /// Endpoints by node index.
    pub endpoints: Vec<Option<RmaEndpoint>>,
}

/// A node running in this process.
struct Booted {
    handle: NodeHandle,
    state: Arc<RmaState>,
    member: Member,
}

impl Booted {
    fn stop(self) -> NodeReport {
        let report = self.handle.stop();
        self.member.stop();
        report
    }
}

enum Running {
    Thread(Booted),
    Process(Child, BufReader<std::process::ChildStdout>),
    Killed,
}

fn node_config(spec: &NodeSpec) -> NodeConfig {
    NodeConfig {
        capacity: spec.capacity,
        helper: spec.helper,
        reconfigure: spec.reconfigure,
        ..NodeConfig::new(NodeIndex(spec.index))
    }
}

/// Starts node `spec` in this process: its shared state, its membership member, its HTTP
/// server.
fn boot(spec: &NodeSpec, key: &ClusterKey) -> Result<(Booted, Ready), RunError> {
    let index = NodeIndex(spec.index);
    let config = RmaStateConfig::new(&spec.center, spec.slots, spec.path);
    let state = Arc::new(RmaState::node(config, index, spec.front.clone(), key.clone())?);
    let member = Member::join(index, SocketAddr::from(([127, 0, 0, 1], 0)), spec.seeds.clone(), key)?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let handle = node::start(node_config(spec), state.clone(), key.clone(), listener, Some(member.watch()))?;
    let ready = Ready { http: handle.addr().port(), rma: state.endpoint().clone(), member: member.addr() };
    Ok((Booted { handle, state, member }, ready))
}

fn json_line<T: Serialize>(value: &T) -> Result<String, RunError> {
    serde_json::to_string(value).map_err(|e| RunError::Config(e.to_string()))
}

/// The body of a node process (`ulnet dc node`): start the node and print [`Ready`]; read
/// [`Peers`] and answer `{"peers":true}`; serve until standard input closes; print the
/// node's report as one JSON line.
pub fn node_process(spec: &NodeSpec) -> Result<(), RunError> {
    let key = std::env::var(KEY_ENV)
        .ok()
        .and_then(|k| ClusterKey::from_hex(&k))
        .ok_or_else(|| RunError::Config(format!("{KEY_ENV} must hold the cluster key in hex")))?;
    let (booted, ready) = boot(spec, &key)?;
    println!("{}", json_line(&ready)?);
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let peers: Peers = serde_json::from_str(&line).map_err(|e| RunError::Config(format!("peers line: {e}")))?;
    booted.state.set_endpoints(&peers.endpoints);
    println!("{{\"peers\":true}}");
    std::io::stdout().flush()?;
    line.clear();
    while std::io::stdin().read_line(&mut line)? > 0 {
        line.clear();
    }
    let report = booted.stop();
    println!("{}", json_line(&report)?);
    Ok(())
}

/// A running center: its front (role word, balancer) and its nodes.
pub struct Center {
    front: Arc<RmaState>,
    balancer: Balancer,
    nodes: Vec<Running>,
    table: RoleTable,
    splits: Vec<(usize, usize)>,
}

impl Center {
    /// Starts the center `config` describes (its sites, policy, capacity, helper, launch
    /// and path; the load settings are for [`run`]).
    pub fn start(config: &RunConfig) -> Result<Center, RunError> {
        let splits: Vec<(usize, usize)> = config.sites.iter().map(|s| s.split).collect();
        let nodes: usize = splits.iter().map(|(p, a)| p + a).sum();
        if nodes > NODES_MAX || config.sites.is_empty() || splits.iter().any(|(p, a)| *p == 0 || *a == 0) {
            return Err(RunError::Config(format!(
                "each site needs at least one proxy and one application node, and at most {NODES_MAX} nodes in all"
            )));
        }
        let table = initial_table(&splits);
        table.validate().map_err(|e| RunError::Config(e.to_string()))?;
        let mut helper = config.helper;
        for (share, (p, a)) in helper.shares.iter_mut().zip(&splits) {
            *share = (p + a) as u8;
        }
        let key = ClusterKey::random();
        let center = format!("dc{}-{:08x}", std::process::id(), rand::random::<u32>());
        let front = Arc::new(RmaState::front(RmaStateConfig::new(&center, nodes, config.path), table, key.clone())?);
        let mut running: Vec<Running> = Vec::new();
        let started = (|| -> Result<Vec<Ready>, RunError> {
            let mut ready: Vec<Ready> = Vec::new();
            for i in 0..nodes {
                let spec = NodeSpec {
                    index: i as u8,
                    slots: nodes,
                    center: center.clone(),
                    path: config.path,
                    front: front.endpoint().clone(),
                    seeds: ready.first().map(|r| r.member).into_iter().collect(),
                    capacity: config.capacity,
                    helper,
                    reconfigure: config.policy == Policy::Reconf,
                };
                let (r, node) = launch(&config.launch, &spec, &key)?;
                ready.push(r);
                running.push(node);
            }
            let peers = Peers { endpoints: ready.iter().map(|r| Some(r.rma.clone())).collect() };
            front.set_endpoints(&peers.endpoints);
            for (i, node) in running.iter_mut().enumerate() {
                tell_peers(node, &peers).map_err(|e| RunError::Node(i, format!("peers: {e}")))?;
            }
            Ok(ready)
        })();
        if let Err(e) = started {
            for (i, r) in running.into_iter().enumerate() {
                stop_node(r, i).ok();
            }
            return Err(e);
        }
        let balancer =
            Balancer::start(BalancerConfig::default(), front.clone(), key, TcpListener::bind("127.0.0.1:0")?)?;
        // Every node published its record before it said it was ready; let the balancer read them.
        std::thread::sleep(Duration::from_millis(150));
        Ok(Center { front, balancer, nodes: running, table, splits })
    }

    /// The front's handle on the shared state (an observer: it reads, it may compare-and-
    /// swap the role word it holds, it never announces).
    pub fn front(&self) -> Arc<RmaState> {
        self.front.clone()
    }

    /// The front load balancer.
    pub fn balancer(&self) -> &Balancer {
        &self.balancer
    }

    /// The table the center started with.
    pub fn initial_table(&self) -> RoleTable {
        self.table
    }

    /// Kills node `node`'s process with SIGKILL, as a crash would (processes only).
    pub fn kill(&mut self, node: NodeIndex) -> Result<(), RunError> {
        let slot = self.nodes.get_mut(node.get()).ok_or(RunError::Config(format!("no node {node}")))?;
        match std::mem::replace(slot, Running::Killed) {
            Running::Process(mut child, _) => {
                child.kill()?;
                child.wait()?;
                Ok(())
            }
            other => {
                *slot = other;
                Err(RunError::Config("only node processes can be killed".into()))
            }
        }
    }

    /// Stops the balancer and every node; their reports (`None` for a killed node).
    pub fn stop(self) -> Result<(Vec<Option<NodeReport>>, BalancerReport), RunError> {
        let balancer = self.balancer.stop();
        // Tell every process first, so they stop together rather than watch each other go.
        let mut nodes = self.nodes;
        for n in &mut nodes {
            if let Running::Process(child, _) = n {
                drop(child.stdin.take());
            }
        }
        let mut reports = Vec::new();
        for (i, r) in nodes.into_iter().enumerate() {
            reports.push(stop_node(r, i)?);
        }
        Ok((reports, balancer))
    }
}

/// Runs the center described by `config` and measures it.
pub fn run(config: &RunConfig) -> Result<RunResult, RunError> {
    let center = Center::start(config)?;
    let observer = center.front();
    let (table, splits) = (center.table, center.splits.clone());
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let (samples, tiers) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut tiers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(t) = observer.read_roles() {
                    tiers.push(TierSample {
                        t_s: start.elapsed().as_secs_f64(),
                        split: (0..splits.len()).map(|s| t.split(SiteId(s as u8))).collect(),
                    });
                }
                std::thread::sleep(TIER_SAMPLE_INTERVAL);
            }
            tiers
        });
        let samples =
            loadgen::run(center.balancer().addr(), config.clients, &config.trace, start, config.duration, &stop);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (samples, sampler.join().expect("sampler thread"))
    });
    let elapsed_s = samples.iter().map(|s| s.done_us).max().unwrap_or(0) as f64 / 1e6;
    let end_table = observer.read_roles().unwrap_or(table);
    let front = observer.counters();
    let nodes = center.nodes.len();
    let (node_reports, balancer_report) = center.stop()?;
    let snapshot_s = config.snapshot.as_secs_f64();
    let sites: Vec<SiteReport> = config
        .sites
        .iter()
        .enumerate()
        .map(|(i, s)| site_report(&samples, i as u8, elapsed_s, snapshot_s, s.guarantee_tps))
        .collect();
    let total_ok: u64 = sites.iter().map(|s| s.ok).sum();
    let failed = sites.iter().map(|s| s.failed).sum();
    Ok(RunResult {
        policy: config.policy,
        trace: config.trace.kind().to_string(),
        burst: config.burst,
        nodes,
        splits,
        tps: if elapsed_s > 0.0 { total_ok as f64 / elapsed_s } else { 0.0 },
        p50_ms: sites[0].p50_ms,
        p99_ms: sites[0].p99_ms,
        qos_met_pct: sites[0].qos_met_pct,
        reconfigurations: u64::from(end_table.epoch().wrapping_sub(table.epoch())),
        failed,
        elapsed_s,
        snapshot_s,
        sites,
        tiers,
        node_reports: node_reports.into_iter().flatten().collect(),
        balancer: balancer_report.into(),
        path: config.path,
        front,
    })
}

fn launch(how: &Launch, spec: &NodeSpec, key: &ClusterKey) -> Result<(Ready, Running), RunError> {
    let index = usize::from(spec.index);
    match how {
        Launch::Threads => {
            let (booted, ready) = boot(spec, key)?;
            Ok((ready, Running::Thread(booted)))
        }
        Launch::Processes { exe } => {
            let json = json_line(spec)?;
            let mut child = Command::new(exe)
                .args(["dc", "node", "--spec", &json])
                .env(KEY_ENV, key.to_hex())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()?;
            let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
            let mut line = String::new();
            out.read_line(&mut line)?;
            match serde_json::from_str::<Ready>(&line) {
                Ok(ready) => Ok((ready, Running::Process(child, out))),
                Err(_) => {
                    child.kill().ok();
                    child.wait().ok();
                    Err(RunError::Node(index, format!("did not start: {}", line.trim())))
                }
            }
        }
    }
}

fn tell_peers(node: &mut Running, peers: &Peers) -> Result<(), RunError> {
    match node {
        Running::Thread(b) => b.state.set_endpoints(&peers.endpoints),
        Running::Process(child, out) => {
            let stdin = child.stdin.as_mut().expect("piped stdin");
            writeln!(stdin, "{}", json_line(peers)?)?;
            stdin.flush()?;
            let mut line = String::new();
            out.read_line(&mut line)?;
            if line.trim() != "{\"peers\":true}" {
                return Err(RunError::Config(format!("unexpected answer {:?}", line.trim())));
            }
        }
        Running::Killed => {}
    }
    Ok(())
}

fn stop_node(r: Running, index: usize) -> Result<Option<NodeReport>, RunError> {
    match r {
        Running::Thread(b) => Ok(Some(b.stop())),
        Running::Killed => Ok(None),
        Running::Process(mut child, mut out) => {
            drop(child.stdin.take());
            let mut line = String::new();
            out.read_line(&mut line)?;
            let status = child.wait()?;
            if !status.success() {
                return Err(RunError::Node(index, format!("exited with {status}")));
            }
            serde_json::from_str(&line).map(Some).map_err(|e| RunError::Node(index, format!("bad report: {e}")))
        }
    }
}
