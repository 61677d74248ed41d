//! A whole center over loopback HTTP (nodes as threads of this process): no client request
//! fails while nodes switch roles, whether the helpers decide or a test forces switches.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_dc::capacity::CapacityConfig;
use ulnet_dc::loadgen;
use ulnet_dc::policy::HelperConfig;
use ulnet_dc::role::{NodeIndex, Role, Tier};
use ulnet_dc::run::{self, Center, Launch, Policy, RunConfig, SiteSpec};
use ulnet_dc::state::rma::RmaPath;
use ulnet_dc::state::{CasOutcome, SharedState};
use ulnet_dc::trace::{Trace, TraceKind};

#[test]
fn helpers_follow_bursts_without_failing_a_request() {
    let config = RunConfig {
        sites: vec![SiteSpec { split: (2, 2), guarantee_tps: None }],
        trace: Arc::new(Trace::generate(TraceKind::Burst, 3000, 12_000, 1)),
        burst: Some(3000),
        clients: 24,
        policy: Policy::Reconf,
        capacity: CapacityConfig::quick(),
        helper: HelperConfig {
            sensitivity: Duration::from_millis(100),
            history_window: Duration::from_millis(200),
            ..HelperConfig::lab()
        },
        duration: Duration::from_secs(20),
        snapshot: Duration::from_millis(500),
        launch: Launch::Threads,
        path: RmaPath::Map,
    };
    let r = run::run(&config).unwrap();
    assert_eq!(r.failed, 0, "client requests failed");
    assert_eq!(r.sites[0].ok, 12_000, "the whole trace was answered");
    assert!(r.reconfigurations >= 2, "the helpers followed the bursts ({} changes)", r.reconfigurations);
    let switches: u64 = r.node_reports.iter().map(|n| n.role_changes).sum();
    assert!(switches >= 2, "nodes switched roles ({switches})");
    let won: u64 = r.node_reports.iter().filter_map(|n| n.helper).map(|h| h.cas_won).sum();
    assert_eq!(won, r.reconfigurations, "every change was one won compare-and-swap");
    // During static bursts the proxy tier grew; during dynamic ones the application tier.
    assert!(r.tiers.iter().any(|t| t.split[0].0 >= 3), "proxies grew: {:?}", r.tiers);
    assert!(r.tiers.iter().any(|t| t.split[0].1 >= 3), "application tier grew");
    eprintln!(
        "{} changes, {} role switches, {:.0} TPS, {} requests answered by a node's previous role",
        r.reconfigurations,
        switches,
        r.tps,
        r.node_reports.iter().map(|n| n.drained_requests).sum::<u64>()
    );
}

/// Node 1 flips between proxy and application every 150 ms while clients run; node 0 stays
/// a proxy and node 2 an application node so each tier keeps a member. The front swaps the
/// role word and announces nothing: the nodes find each change by reading the word.
#[test]
fn forced_role_switches_fail_no_request() {
    let config = RunConfig {
        sites: vec![SiteSpec { split: (2, 1), guarantee_tps: None }],
        trace: Arc::new(Trace::generate(TraceKind::Zipf, 50, 1_000_000, 4)),
        burst: None,
        clients: 16,
        policy: Policy::Rigid,
        capacity: CapacityConfig::quick(),
        helper: HelperConfig::lab(),
        duration: Duration::from_secs(3),
        snapshot: Duration::from_secs(1),
        launch: Launch::Threads,
        path: RmaPath::Map,
    };
    let center = Center::start(&config).unwrap();
    let front = center.front();
    let stop = AtomicBool::new(false);
    let (samples, flips) = std::thread::scope(|s| {
        let flipper = s.spawn(|| {
            let mut flips = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(150));
                let t = front.read_roles().unwrap();
                let to = if t.role(NodeIndex(1)).unwrap().tier == Tier::Proxy { Tier::App } else { Tier::Proxy };
                let next = t.with_role(NodeIndex(1), Some(Role::new(0, to)));
                assert_eq!(front.cas_roles(t, next).unwrap(), CasOutcome::Swapped);
                flips += 1;
            }
            flips
        });
        let samples = loadgen::run(center.balancer().addr(), 16, &config.trace, Instant::now(), config.duration, &stop);
        stop.store(true, Ordering::Relaxed);
        (samples, flipper.join().unwrap())
    });
    let (node_reports, report) = center.stop().unwrap();
    let node_reports: Vec<_> = node_reports.into_iter().map(Option::unwrap).collect();
    let failed = samples.iter().filter(|s| !s.ok).count();
    assert!(samples.len() > 1000, "load ran ({} requests)", samples.len());
    assert!(flips >= 12, "node 1 switched {flips} times");
    assert_eq!(failed, 0, "{failed} of {} requests failed across {flips} switches", samples.len());
    assert_eq!(report.errors, 0);
    assert!(node_reports[1].role_changes as usize >= flips - 2, "node 1 applied the switches: {:?}", node_reports[1]);
    assert!(node_reports[1].proxy_requests > 0 && node_reports[1].app_requests > 0, "node 1 served both roles");
}
