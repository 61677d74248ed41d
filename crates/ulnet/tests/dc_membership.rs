//! A data-center node process killed in the middle of a reconfiguration (right after the
//! compare-and-swap that moves it, before it has finished switching): membership excludes
//! it, a surviving helper takes it out of the role word, the balancer stops sending to it,
//! and no client request is lost.
//!
//! "Lost" means a client got an error or a wrong answer. Requests in flight on the dead
//! node, and requests routed to it before it left the role word, fail their exchange; the
//! balancer and the proxies retry them on another node of the role (they are idempotent
//! GETs), and the test counts those retries.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_dc::capacity::CapacityConfig;
use ulnet_dc::loadgen;
use ulnet_dc::policy::HelperConfig;
use ulnet_dc::role::{NodeIndex, RoleTable};
use ulnet_dc::run::{Center, Launch, Policy, RunConfig, SiteSpec};
use ulnet_dc::state::rma::RmaPath;
use ulnet_dc::state::SharedState;
use ulnet_dc::trace::{Trace, TraceKind};

/// Every table the role word holds: valid (no tier empty, every code a role) and every
/// node in one role (the packed word gives each node one code; count them to be sure).
fn check(t: RoleTable, nodes: usize) {
    assert!(t.validate().is_ok(), "invalid table {t:?}: {:?}", t.validate());
    let counted: usize = (0..3u8).map(|s| t.split(ulnet_dc::role::SiteId(s))).map(|(p, a)| p + a).sum();
    assert_eq!(counted, t.members().count(), "a node counted in two tiers: {t:?}");
    assert!(t.members().count() <= nodes);
}

#[test]
fn a_node_killed_mid_reconfiguration_leaves_the_role_word_and_no_request_is_lost() {
    let sensitivity = Duration::from_millis(100);
    let config = RunConfig {
        sites: vec![SiteSpec { split: (2, 3), guarantee_tps: None }],
        // One long static burst: the proxies are overloaded, the application nodes idle, so
        // the helpers move application nodes to the proxy tier.
        trace: Arc::new(Trace::generate(TraceKind::Burst, 1 << 20, 400_000, 1)),
        burst: None,
        clients: 24,
        policy: Policy::Reconf,
        capacity: CapacityConfig::quick(),
        helper: HelperConfig { sensitivity, history_window: Duration::from_millis(200), ..HelperConfig::lab() },
        duration: Duration::from_secs(30),
        snapshot: Duration::from_secs(1),
        launch: Launch::Processes { exe: PathBuf::from(env!("CARGO_BIN_EXE_ulnet")) },
        path: RmaPath::Map,
    };
    let nodes = 5;
    let mut center = Center::start(&config).unwrap();
    let front = center.front();
    let start = center.initial_table();
    let balancer = center.balancer().addr();
    let stop = AtomicBool::new(false);
    let bound = ulnet_cluster::Config::local().exclusion_bound() + 2 * sensitivity;

    let (samples, victim, kill_delay, removal, sent_after_removal) = std::thread::scope(|s| {
        let load =
            s.spawn(|| loadgen::run(balancer, config.clients, &config.trace, Instant::now(), config.duration, &stop));
        let _stop_on_panic = StopOnDrop(&stop);
        // Watch the word until the first change, and kill a node that change moves.
        let deadline = Instant::now() + Duration::from_secs(10);
        let (changed, seen_at) = loop {
            let t = front.read_roles().unwrap();
            check(t, nodes);
            if t != start {
                break (t, Instant::now());
            }
            assert!(Instant::now() < deadline, "the helpers never reconfigured");
            std::thread::sleep(Duration::from_millis(1));
        };
        let victim = (0..nodes as u8)
            .map(NodeIndex)
            .find(|n| changed.role(*n) != start.role(*n))
            .expect("a change moves a node");
        center.kill(victim).unwrap();
        let killed_at = Instant::now();
        let kill_delay = killed_at - seen_at;
        // Until the victim is out of the word: every table valid.
        let removed_at = loop {
            let t = front.read_roles().unwrap();
            check(t, nodes);
            if t.role(victim).is_none() {
                assert_eq!(t.members().count(), nodes - 1, "only the victim left: {t:?}");
                break Instant::now();
            }
            assert!(killed_at.elapsed() < bound, "{victim} still in the role word {:?} after the kill", bound);
            std::thread::sleep(Duration::from_millis(1));
        };
        // The balancer reads the word every 10 ms; after that it sends the victim nothing.
        std::thread::sleep(Duration::from_millis(100));
        let sent = center.balancer().sent_to(victim);
        std::thread::sleep(Duration::from_millis(1000));
        let sent_after_removal = center.balancer().sent_to(victim) - sent;
        for _ in 0..20 {
            check(front.read_roles().unwrap(), nodes);
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        (load.join().unwrap(), victim, kill_delay, removed_at - killed_at, sent_after_removal)
    });
    let end = front.read_roles().unwrap();
    let (reports, balancer) = center.stop().unwrap();
    let failed = samples.iter().filter(|s| !s.ok).count();
    let retries: u64 = balancer.retries + reports.iter().flatten().map(|r| r.upstream_retries).sum::<u64>();
    let departures: u64 = reports.iter().flatten().filter_map(|r| r.helper).map(|h| h.departures).sum();
    eprintln!(
        "killed {victim} {kill_delay:?} after its move appeared in the word; out of the word {removal:?} later \
         (bound {bound:?}); {} requests answered, {failed} failed, {retries} exchanges retried; end {end:?}",
        samples.len()
    );
    assert!(reports[victim.get()].is_none());
    assert!(kill_delay < Duration::from_millis(50), "the kill came {kill_delay:?} after the change");
    assert_eq!(sent_after_removal, 0, "the balancer sent requests to {victim} after it left the word");
    assert!(samples.len() > 1000, "load ran ({} requests)", samples.len());
    assert_eq!(failed, 0, "client requests were lost");
    assert!(departures >= 1, "a surviving helper took the victim out (departure proposals won: {departures})");
    check(end, nodes);
}

/// Sets the flag when dropped, so a failed assertion stops the load threads too.
struct StopOnDrop<'a>(&'a AtomicBool);
impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
