//! `ulnet dc`: the self-reconfiguring multi-tier data center.
//!
//! `ulnet dc run` starts one process per node (`ulnet dc node`, hidden), a front load
//! balancer and closed-loop clients in this process, replays a trace, and reports TPS,
//! response-time percentiles, the QoS figure and the number of reconfigurations. With
//! `--policy rigid` and no `--split`, a search runs the trace on every split first and
//! keeps the best. The processes share their state in ulnet remote memory (`--rma`: mapped
//! segments, or every operation through the owner's engine over shm or TCP channels) and
//! are members of one membership cluster.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use ulnet_dc::capacity::{CapacityConfig, ServiceMode};
use ulnet_dc::policy::HelperConfig;
use ulnet_dc::run::{Launch, NodeSpec, Policy, RunConfig, RunResult, SiteSpec};
use ulnet_dc::state::rma::RmaPath;
use ulnet_dc::trace::{Trace, TraceKind};

/// Arguments of `ulnet dc`.
#[derive(Args, Debug)]
pub struct DcArgs {
    #[command(subcommand)]
    command: DcCommand,
}

#[derive(Subcommand, Debug)]
enum DcCommand {
    /// Run a data center under a trace and report.
    Run(RunArgs),
    /// Plot saved runs (`--save`) side by side: throughput and tier sizes over time.
    Plot(PlotArgs),
    /// One node of a data center (started by `dc run`).
    #[command(hide = true)]
    Node {
        /// The node's settings, as JSON.
        #[arg(long)]
        spec: String,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TraceArg {
    Burst,
    Zipf,
    Worldcup,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum PolicyArg {
    Rigid,
    Reconf,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RmaArg {
    /// Same host: segments mapped, the owner's CPU takes no part.
    Map,
    /// Same host: every operation through the owner's engine over a shared-memory channel.
    Shm,
    /// Every operation through the owner's engine over TCP (the path across hosts).
    Tcp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ServiceArg {
    Sleep,
    Burn,
}

/// Arguments of `ulnet dc run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Trace to replay.
    #[arg(long, value_enum)]
    trace: TraceArg,
    /// Burst length of the burst and zipf traces (thesis: 512 to 65,536); for worldcup it
    /// scales the period lengths (65,536: the documented means).
    #[arg(long, default_value_t = 65_536)]
    burst: usize,
    /// Nodes in the center (all websites).
    #[arg(long, default_value_t = 7)]
    nodes: usize,
    /// Reconfiguration policy.
    #[arg(long, value_enum, default_value = "reconf")]
    policy: PolicyArg,
    /// Longest run, seconds (the trace may end sooner).
    #[arg(long, default_value_t = 120.0)]
    duration: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Starting split of site 0 as PROXIES:APPS (rigid: fixed; default for rigid: search;
    /// for reconf: the even split).
    #[arg(long)]
    split: Option<String>,
    /// Longest run of each split during the rigid search. The search replays the same trace
    /// with bursts 32 times shorter (at least 512), four bursts (worldcup: 16 × that many
    /// requests): for a fixed split the time a trace takes depends on its mix, not on its
    /// burst length, so the best split for the short trace is the best for the long one.
    #[arg(long, default_value_t = 15.0)]
    search_duration: f64,
    /// Requests in the trace (default: 4 bursts, i.e. two static and two dynamic; 400,000
    /// for worldcup).
    #[arg(long)]
    requests: Option<usize>,
    /// Closed-loop clients.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Throughput guarantee of site 0, TPS, for the QoS figure.
    #[arg(long)]
    guarantee: Option<f64>,
    /// Snapshot length, seconds.
    #[arg(long, default_value_t = 1.0)]
    snapshot: f64,
    /// Websites: 1, or 2 (site 0 has priority; site 1 starts with 1 proxy and 1 app node,
    /// bursts of the two sites alternate).
    #[arg(long, default_value_t = 1)]
    websites: usize,
    /// Workers per node.
    #[arg(long, default_value_t = CapacityConfig::lab().workers)]
    workers: u16,
    /// Service time scale: 1 = the lab profile (cache hit 4 ms, dynamic page 8 ms, ...).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// How service time is spent: sleep (emulated capacity) or burn (real CPU).
    #[arg(long, value_enum, default_value = "sleep")]
    service: ServiceArg,
    /// History window T, ms.
    #[arg(long)]
    history_ms: Option<u64>,
    /// Sensitivity S (time between two looks of a helper), ms.
    #[arg(long)]
    sensitivity_ms: Option<u64>,
    /// Trace seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Save the whole result (snapshots, tier sizes) as JSON, for `ulnet dc plot`.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Write an SVG plot of throughput and tier sizes over time.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// How the processes reach each other's remote memory (load records, role word).
    #[arg(long, value_enum, default_value = "map")]
    rma: RmaArg,
}

/// Arguments of `ulnet dc plot`.
#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Output SVG.
    #[arg(long)]
    out: PathBuf,
    /// Title.
    #[arg(long, default_value = "")]
    title: String,
    /// Saved runs (`dc run --save`).
    runs: Vec<PathBuf>,
}

fn parse_split(s: &str) -> Result<(usize, usize)> {
    let (p, a) = s.split_once(':').context("--split is PROXIES:APPS")?;
    Ok((p.trim().parse()?, a.trim().parse()?))
}

#[derive(Serialize)]
struct SearchEntry {
    split: (usize, usize),
    tps: f64,
}

#[derive(Serialize)]
struct Output<'a> {
    policy: String,
    trace: String,
    tps: f64,
    p50_ms: f64,
    p99_ms: f64,
    qos_met_pct: Option<f64>,
    reconfigurations: u64,
    burst: Option<usize>,
    nodes: usize,
    split: (usize, usize),
    failed: u64,
    elapsed_s: f64,
    tps_static_bursts: Option<f64>,
    tps_dynamic_bursts: Option<f64>,
    guarantee_tps: Option<f64>,
    rigid_search: &'a [SearchEntry],
    sites: Vec<SiteSummary>,
}

#[derive(Serialize)]
struct SiteSummary {
    site: u8,
    tps: f64,
    ok: u64,
    failed: u64,
    tps_static_bursts: Option<f64>,
    tps_dynamic_bursts: Option<f64>,
    qos_met_pct: Option<f64>,
    active_snapshots: usize,
    p50_ms: f64,
    p99_ms: f64,
}

/// Runs `ulnet dc`.
pub fn run(args: DcArgs) -> Result<i32> {
    match args.command {
        DcCommand::Run(a) => run_dc(a),
        DcCommand::Plot(a) => {
            let mut runs = Vec::new();
            for p in &a.runs {
                let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
                let r: RunResult = serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
                let label = p.file_stem().map_or_else(|| "run".into(), |s| s.to_string_lossy().into_owned());
                runs.push((label, r));
            }
            // plotters draws text only with a registered font (its ab_glyph backend).
            ulnet_trace::plot::ensure_font()?;
            ulnet_dc::plot::write_svg(&a.out, &a.title, &runs)?;
            Ok(0)
        }
        DcCommand::Node { spec } => {
            let spec: NodeSpec = serde_json::from_str(&spec).context("--spec")?;
            ulnet_dc::run::node_process(&spec)?;
            Ok(0)
        }
    }
}

fn run_dc(a: RunArgs) -> Result<i32> {
    if a.websites == 0 || a.websites > 2 {
        bail!("--websites is 1 or 2");
    }
    if a.burst == 0 || a.clients == 0 || a.duration <= 0.0 || a.snapshot <= 0.0 || a.time_scale <= 0.0 {
        bail!("--burst, --clients, --duration, --snapshot and --time-scale must be positive");
    }
    let kind = match a.trace {
        TraceArg::Burst => TraceKind::Burst,
        TraceArg::Zipf => TraceKind::Zipf,
        TraceArg::Worldcup => TraceKind::Worldcup,
    };
    let len = a.requests.unwrap_or(match kind {
        TraceKind::Worldcup => 400_000,
        _ => 4 * a.burst * a.websites,
    });
    let trace = Arc::new(if a.websites == 2 {
        Trace::two_sites(kind, a.burst, len, a.seed)
    } else {
        Trace::generate(kind, a.burst, len, a.seed)
    });
    let search_burst = (a.burst / 32).max(512);
    let search_len = match kind {
        TraceKind::Worldcup => 16 * search_burst,
        _ => 4 * search_burst * a.websites,
    };
    let search_trace = Arc::new(if a.websites == 2 {
        Trace::two_sites(kind, search_burst, search_len, a.seed)
    } else {
        Trace::generate(kind, search_burst, search_len, a.seed)
    });
    let low_site_nodes = if a.websites == 2 { 2 } else { 0 };
    if a.nodes < 2 + low_site_nodes || a.nodes > ulnet_dc::role::NODES_MAX {
        bail!("--nodes must be between {} and {}", 2 + low_site_nodes, ulnet_dc::role::NODES_MAX);
    }
    let high_nodes = a.nodes - low_site_nodes;
    let mut capacity = CapacityConfig::lab();
    capacity.workers = a.workers;
    capacity.times.cache_hit = capacity.times.cache_hit.mul_f64(a.time_scale);
    capacity.times.forward = capacity.times.forward.mul_f64(a.time_scale);
    capacity.times.origin = capacity.times.origin.mul_f64(a.time_scale);
    capacity.times.dynamic = capacity.times.dynamic.mul_f64(a.time_scale);
    capacity.mode = match a.service {
        ServiceArg::Sleep => ServiceMode::Sleep,
        ServiceArg::Burn => ServiceMode::Burn,
    };
    let mut helper = HelperConfig::lab();
    if let Some(t) = a.history_ms {
        helper.history_window = Duration::from_millis(t);
    }
    if let Some(s) = a.sensitivity_ms {
        helper.sensitivity = Duration::from_millis(s);
    }
    let policy = match a.policy {
        PolicyArg::Rigid => Policy::Rigid,
        PolicyArg::Reconf => Policy::Reconf,
    };
    let base = RunConfig {
        sites: Vec::new(),
        trace: trace.clone(),
        burst: Some(a.burst),
        clients: a.clients,
        policy,
        capacity,
        helper,
        duration: Duration::from_secs_f64(a.duration),
        snapshot: Duration::from_secs_f64(a.snapshot),
        launch: Launch::Processes { exe: std::env::current_exe()? },
        path: match a.rma {
            RmaArg::Map => RmaPath::Map,
            RmaArg::Shm => RmaPath::Shm,
            RmaArg::Tcp => RmaPath::Tcp,
        },
    };
    let sites_for = |split: (usize, usize)| {
        let mut s = vec![SiteSpec { split, guarantee_tps: a.guarantee }];
        if a.websites == 2 {
            s.push(SiteSpec { split: (1, 1), guarantee_tps: None });
        }
        s
    };
    let mut search = Vec::new();
    let split = match a.split.as_deref().map(parse_split).transpose()? {
        Some(s) => s,
        None if policy == Policy::Rigid => {
            let mut best: Option<((usize, usize), f64)> = None;
            for p in 1..high_nodes {
                let split = (p, high_nodes - p);
                eprintln!(
                    "ulnet dc: rigid search: {}:{} (bursts of {search_burst}, at most {:.0} s)",
                    split.0, split.1, a.search_duration
                );
                let cfg = RunConfig {
                    sites: sites_for(split),
                    trace: search_trace.clone(),
                    duration: Duration::from_secs_f64(a.search_duration),
                    ..base.clone()
                };
                let r = ulnet_dc::run::run(&cfg)?;
                search.push(SearchEntry { split, tps: r.sites[0].tps });
                if best.is_none_or(|(_, t)| r.sites[0].tps > t) {
                    best = Some((split, r.sites[0].tps));
                }
            }
            best.expect("at least one split").0
        }
        None => (high_nodes / 2, high_nodes - high_nodes / 2),
    };
    if split.0 + split.1 != high_nodes {
        bail!("--split {}:{} must add up to {high_nodes} nodes", split.0, split.1);
    }
    eprintln!(
        "ulnet dc: {} trace ({} requests), {} nodes, policy {}, split {}:{}, remote memory over {}",
        kind,
        trace.len(),
        a.nodes,
        policy,
        split.0,
        split.1,
        base.path
    );
    let config = RunConfig { sites: sites_for(split), ..base };
    let r = ulnet_dc::run::run(&config)?;
    if let Some(p) = &a.save {
        std::fs::write(p, serde_json::to_string(&r)?).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        let label = format!("{} {}:{}", policy, split.0, split.1);
        ulnet_trace::plot::ensure_font()?;
        ulnet_dc::plot::write_svg(p, &format!("{kind} trace"), &[(label, r.clone())])?;
    }
    let out = Output {
        policy: policy.to_string(),
        trace: kind.to_string(),
        tps: r.tps,
        p50_ms: r.p50_ms,
        p99_ms: r.p99_ms,
        qos_met_pct: r.qos_met_pct,
        reconfigurations: r.reconfigurations,
        burst: r.burst,
        nodes: r.nodes,
        split,
        failed: r.failed,
        elapsed_s: r.elapsed_s,
        tps_static_bursts: r.sites[0].tps_static_bursts,
        tps_dynamic_bursts: r.sites[0].tps_dynamic_bursts,
        guarantee_tps: a.guarantee,
        rigid_search: &search,
        sites: r
            .sites
            .iter()
            .map(|s| SiteSummary {
                site: s.site,
                tps: s.tps,
                ok: s.ok,
                failed: s.failed,
                tps_static_bursts: s.tps_static_bursts,
                tps_dynamic_bursts: s.tps_dynamic_bursts,
                qos_met_pct: s.qos_met_pct,
                active_snapshots: s.active_snapshots,
                p50_ms: s.p50_ms,
                p99_ms: s.p99_ms,
            })
            .collect(),
    };
    if a.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        print_table(&out);
    }
    Ok(if r.failed == 0 { 0 } else { 1 })
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

fn print_table(o: &Output<'_>) {
    for s in o.rigid_search {
        println!("rigid search  {}:{}  {:>7.0} TPS", s.split.0, s.split.1, s.tps);
    }
    println!(
        "{} {} trace, {} nodes, split {}:{}: {:.0} TPS, p50 {:.1} ms, p99 {:.1} ms, {} reconfigurations, {} failed, {:.1} s",
        o.policy, o.trace, o.nodes, o.split.0, o.split.1, o.tps, o.p50_ms, o.p99_ms, o.reconfigurations, o.failed, o.elapsed_s
    );
    println!("site  TPS     static-burst TPS  dynamic-burst TPS  QoS met %  p50 ms  p99 ms");
    for s in &o.sites {
        println!(
            "{:>4}  {:>6.0}  {:>16}  {:>17}  {:>9}  {:>6.1}  {:>6.1}",
            s.site,
            s.tps,
            opt(s.tps_static_bursts),
            opt(s.tps_dynamic_bursts),
            s.qos_met_pct.map_or_else(|| "-".into(), |v| format!("{v:.1}")),
            s.p50_ms,
            s.p99_ms
        );
    }
}

/// The data-center step of `ulnet demo`: 7 node processes under alternating bursts of
/// 4,096 static and 4,096 dynamic requests; prints the tier changes and the throughput.
pub fn demo() -> Result<()> {
    eprintln!("ulnet demo: data center of 7 node processes, bursts of 4,096 static then dynamic requests");
    let trace = Arc::new(Trace::generate(TraceKind::Burst, 4096, 4 * 4096, 1));
    let config = RunConfig {
        sites: vec![SiteSpec { split: (3, 4), guarantee_tps: None }],
        trace,
        burst: Some(4096),
        clients: 64,
        policy: Policy::Reconf,
        capacity: CapacityConfig::lab(),
        helper: HelperConfig::lab(),
        duration: Duration::from_secs(30),
        snapshot: Duration::from_secs(1),
        launch: Launch::Processes { exe: std::env::current_exe()? },
        path: RmaPath::Map,
    };
    let r = ulnet_dc::run::run(&config)?;
    let mut last = None;
    for t in &r.tiers {
        if last != Some(t.split[0]) {
            println!("{:>6.1} s  proxy tier {} nodes, application tier {} nodes", t.t_s, t.split[0].0, t.split[0].1);
            last = Some(t.split[0]);
        }
    }
    let s = &r.sites[0];
    println!(
        "{} requests in {:.1} s ({:.0} TPS; static bursts {} TPS, dynamic bursts {} TPS), {} reconfigurations, {} failed",
        s.ok,
        r.elapsed_s,
        r.tps,
        opt(s.tps_static_bursts),
        opt(s.tps_dynamic_bursts),
        r.reconfigurations,
        r.failed
    );
    if r.failed > 0 {
        bail!("{} data-center requests failed", r.failed);
    }
    Ok(())
}
