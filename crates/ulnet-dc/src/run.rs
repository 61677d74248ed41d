//! Runs a data center and a load against it, and reports: the engine of `ulnet dc run`,
//! the demo, the benchmarks and the end-to-end tests.
//!
//! The nodes run as one process each ([`Launch::Processes`], what `ulnet dc run` does) or
//! as threads of this process ([`Launch::Threads`], for tests). The front load balancer and
//! the clients run in this process. While the load runs, the role word is sampled every
//! [`TIER_SAMPLE_INTERVAL`] for the tier-size plot.

use crate::capacity::CapacityConfig;
use crate::lb::{Balancer, BalancerConfig, BalancerReport};
use crate::load::ClusterKey;
use crate::loadgen;
use crate::node::{self, NodeConfig, NodeHandle, NodeReport};
use crate::policy::HelperConfig;
use crate::report::{site_report, SiteReport};
use crate::role::{initial_table, NodeIndex, RoleTable, SiteId, NODES_MAX};
use crate::state::shm::ShmState;
use crate::state::SharedState;
use crate::trace::Trace;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
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
    /// Starting split: (proxy nodes, application nodes).
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
    /// Shared state.
    #[error(transparent)]
    State(#[from] crate::state::shm::ShmOpenError),
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
    /// The state file.
    pub state: PathBuf,
    /// The node's index.
    pub index: u8,
    /// Capacity.
    pub capacity: CapacityConfig,
    /// Helper settings.
    pub helper: HelperConfig,
    /// Run the helper (reconf).
    pub reconfigure: bool,
}

enum Running {
    Thread(NodeHandle),
    Process(Child, BufReader<std::process::ChildStdout>),
}

fn node_config(spec: &NodeSpec) -> NodeConfig {
    NodeConfig {
        capacity: spec.capacity,
        helper: spec.helper,
        reconfigure: spec.reconfigure,
        ..NodeConfig::new(NodeIndex(spec.index))
    }
}

/// The body of a node process (`ulnet dc node`): start the node, print `{"ready":PORT}`,
/// serve until standard input closes, print the node's report as one JSON line.
pub fn node_process(spec: &NodeSpec) -> Result<(), RunError> {
    let key = std::env::var(KEY_ENV)
        .ok()
        .and_then(|k| ClusterKey::from_hex(&k))
        .ok_or_else(|| RunError::Config(format!("{KEY_ENV} must hold the cluster key in hex")))?;
    let state: Arc<dyn SharedState> = Arc::new(ShmState::open(&spec.state, Some(NodeIndex(spec.index)), key.clone())?);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let handle = node::start(node_config(spec), state, key, listener)?;
    println!("{{\"ready\":{}}}", handle.addr().port());
    std::io::stdout().flush()?;
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line)? > 0 {
        line.clear();
    }
    let report = handle.stop();
    println!("{}", serde_json::to_string(&report).map_err(|e| RunError::Config(e.to_string()))?);
    Ok(())
}

/// Runs the center described by `config` and measures it.
pub fn run(config: &RunConfig) -> Result<RunResult, RunError> {
    let splits: Vec<(usize, usize)> = config.sites.iter().map(|s| s.split).collect();
    let nodes: usize = splits.iter().map(|(p, a)| p + a).sum();
    if nodes > NODES_MAX || config.sites.is_empty() || splits.iter().any(|(p, a)| *p == 0 || *a == 0) {
        return Err(RunError::Config(format!(
            "each site needs at least one proxy and one application node, and at most {NODES_MAX} nodes in all"
        )));
    }
    let table = initial_table(&splits);
    table.validate().map_err(|e| RunError::Config(e.to_string()))?;
    let key = ClusterKey::random();
    let state_path = std::env::temp_dir().join(format!("ulnet-dc-{}-{}", std::process::id(), rand::random::<u32>()));
    let observer: Arc<dyn SharedState> = Arc::new(ShmState::create(&state_path, nodes, table, key.clone())?);
    let result = run_on(config, &state_path, observer, key, table, nodes, splits);
    std::fs::remove_file(&state_path).ok();
    result
}

fn run_on(
    config: &RunConfig,
    state_path: &std::path::Path,
    observer: Arc<dyn SharedState>,
    key: ClusterKey,
    table: RoleTable,
    nodes: usize,
    splits: Vec<(usize, usize)>,
) -> Result<RunResult, RunError> {
    let mut running = Vec::new();
    let launched = (|| -> Result<(), RunError> {
        for i in 0..nodes {
            let spec = NodeSpec {
                state: state_path.to_path_buf(),
                index: i as u8,
                capacity: config.capacity,
                helper: config.helper,
                reconfigure: config.policy == Policy::Reconf,
            };
            running.push(launch(&config.launch, &spec, &key)?);
        }
        Ok(())
    })();
    if let Err(e) = launched {
        for r in running {
            stop_node(r, 0).ok();
        }
        return Err(e);
    }
    let balancer =
        Balancer::start(BalancerConfig::default(), observer.clone(), key, TcpListener::bind("127.0.0.1:0")?)?;
    // Every node has published its address once it printed "ready"; let the balancer read them.
    std::thread::sleep(Duration::from_millis(150));

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
        let samples = loadgen::run(balancer.addr(), config.clients, &config.trace, start, config.duration, &stop);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (samples, sampler.join().expect("sampler thread"))
    });
    let elapsed_s = samples.iter().map(|s| s.done_us).max().unwrap_or(0) as f64 / 1e6;
    let end_table = observer.read_roles().unwrap_or(table);
    let balancer_report = balancer.stop();
    let mut node_reports = Vec::new();
    for (i, r) in running.into_iter().enumerate() {
        node_reports.push(stop_node(r, i)?);
    }
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
        node_reports,
        balancer: balancer_report.into(),
    })
}

fn launch(how: &Launch, spec: &NodeSpec, key: &ClusterKey) -> Result<Running, RunError> {
    match how {
        Launch::Threads => {
            let state: Arc<dyn SharedState> =
                Arc::new(ShmState::open(&spec.state, Some(NodeIndex(spec.index)), key.clone())?);
            let handle = node::start(node_config(spec), state, key.clone(), TcpListener::bind("127.0.0.1:0")?)?;
            Ok(Running::Thread(handle))
        }
        Launch::Processes { exe } => {
            let json = serde_json::to_string(spec).map_err(|e| RunError::Config(e.to_string()))?;
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
            if !line.contains("\"ready\"") {
                child.kill().ok();
                child.wait().ok();
                return Err(RunError::Node(usize::from(spec.index), format!("did not start: {}", line.trim())));
            }
            Ok(Running::Process(child, out))
        }
    }
}

fn stop_node(r: Running, index: usize) -> Result<NodeReport, RunError> {
    match r {
        Running::Thread(h) => Ok(h.stop()),
        Running::Process(mut child, mut out) => {
            drop(child.stdin.take());
            let mut line = String::new();
            out.read_line(&mut line)?;
            let status = child.wait()?;
            if !status.success() {
                return Err(RunError::Node(index, format!("exited with {status}")));
            }
            serde_json::from_str(&line).map_err(|e| RunError::Node(index, format!("bad report: {e}")))
        }
    }
}
