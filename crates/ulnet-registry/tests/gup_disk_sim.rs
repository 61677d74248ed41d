//! GUP and the registry when disks fail, over many seeded schedules (on top of the crashes,
//! partitions and loss of `gup_sim`'s plans):
//!
//! - *Full disks*: the disk of one node, then of a majority, then of every node refuses
//!   writes for a while. Each node whose fsync fails stops, drops what it had not fsynced,
//!   and once its disk is healed starts again in place from its log, under the same
//!   identity, as `ulnet node`'s registry does.
//! - *Every log torn at once*: every node crashes at the same moment (a power loss), each
//!   log keeps a torn prefix of what was written but not fsynced (read back by the
//!   write-ahead log's reader, which must cut it), and all restart as themselves.
//!
//! After each run heals: the usual checks of `gup_sim` (one history, every acknowledged
//! update applied exactly once, the configuration is the last view), the registry clients'
//! histories are linearizable per key, and the fault did happen (nodes stopped at once;
//! torn tails were cut).

mod util;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use ulnet_sim::NodeId as SlotId;
use ulnet_sim::{for_each_seed, Faults, Violation, WorldChange};
use util::{plan, Cluster};

/// Registry keys the clients set and get (the histories are checked per key).
const KEYS: u32 = 3;
/// When the clients stop and the plan's faults end; the run then settles for `SETTLE`.
const QUIET: Duration = Duration::from_millis(400);
const SETTLE: Duration = Duration::from_millis(700);

/// Something that happens to the world or to a disk at a time of the run.
#[derive(Clone, Debug)]
enum Event {
    World(WorldChange),
    /// The disks of these slots refuse writes (true) or take them again.
    Disks(Vec<u32>, bool),
    /// Every node crashes at once.
    Blackout,
    /// Every crashed node restarts; with `new_view`, a view of the same members follows
    /// (as a regroup after the restart may install one).
    PowerBack {
        new_view: bool,
    },
}

/// A cluster of `nodes` whose clients work on registry keys.
fn cluster(seed: u64, nodes: u32) -> Cluster {
    let mut c = Cluster::with_joiners(seed, nodes, 0, Faults::lossy(0.02));
    c.set_registry_keys(KEYS);
    c.start_clients(Duration::from_millis(4));
    c
}

/// Runs `events` over `c` (clients stop at `QUIET`), then lets it settle and checks it;
/// `during` sees the cluster just before each event.
fn run(
    mut c: Cluster,
    mut events: Vec<(Duration, Event)>,
    mut during: impl FnMut(&Cluster, &Event),
) -> Result<Cluster, Violation> {
    events.sort_by_key(|(t, _)| *t);
    let start = c.sim.start();
    for (at, event) in events {
        c.run_until(start + at)?;
        during(&c, &event);
        if at >= QUIET {
            c.stop_clients();
        }
        match event {
            Event::World(change) => c.apply(&change),
            Event::Disks(slots, full) => slots.iter().for_each(|&s| c.set_disk_full(s, full)),
            Event::Blackout => {
                let up: Vec<u32> = (0..c.n()).filter(|&s| c.node(s).is_some()).collect();
                up.into_iter().for_each(|s| c.apply(&WorldChange::Crash(SlotId(s))));
            }
            Event::PowerBack { new_view } => {
                (0..c.n()).for_each(|s| c.apply(&WorldChange::Restart(SlotId(s))));
                if new_view {
                    let members = c.views.last().expect("a view").members.clone();
                    c.install_view_now(members);
                }
            }
        }
    }
    c.stop_clients();
    c.run_until(start + QUIET + SETTLE)?;
    check(&c)?;
    Ok(c)
}

/// `gup_sim`'s checks, and the registry histories' linearizability.
fn check(c: &Cluster) -> Result<(), Violation> {
    c.check_settled().map_err(|what| c.sim.violation(what))?;
    let w = c.world.borrow();
    if w.acked.is_empty() {
        return Err(c.sim.violation("no update was acknowledged in the whole run"));
    }
    ulnet_registry::linearizability::check(&w.history, 5_000_000).map_err(|e| c.sim.violation(e.to_string()))
}

/// The plan's crashes, partitions and loss (a majority of the nodes up at any time) until
/// `QUIET`, then everything healed and restarted.
fn noise(seed: u64, nodes: u32) -> Vec<(Duration, Event)> {
    plan(seed, nodes, nodes, QUIET, SETTLE).changes.into_iter().map(|(t, c)| (t, Event::World(c))).collect()
}

/// Full disks on one node, then on a majority, then on every node, each for 30–80 ms and
/// healed 20–40 ms before the next (all healed by 360 ms, before `QUIET`), among the
/// plan's faults.
fn disk_faults(seed: u64, nodes: u32) -> Vec<(Duration, Event)> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xd15c_f011);
    let mut events = noise(seed, nodes);
    let mut t = Duration::from_millis(rng.gen_range(10..=40));
    for count in [1, nodes / 2 + 1, nodes] {
        let mut slots: Vec<u32> = (0..nodes).collect();
        for i in (1..slots.len()).rev() {
            slots.swap(i, rng.gen_range(0..=i));
        }
        slots.truncate(count as usize);
        events.push((t, Event::Disks(slots.clone(), true)));
        t += Duration::from_millis(rng.gen_range(30..=80));
        events.push((t, Event::Disks(slots, false)));
        t += Duration::from_millis(rng.gen_range(20..=40));
    }
    debug_assert!(t <= QUIET, "every disk healed before the clients stop");
    events
}

/// What the full-disk runs did, over all seeds: for each phase (one node, a majority, every
/// node with a full disk), the runs in which at least one, at least two, and all of those
/// nodes stopped; and the restarts in place.
#[derive(Default)]
struct DiskTally {
    any: [u32; 3],
    two: [u32; 3],
    all: [u32; 3],
    restarts: u64,
}

fn full_disks(seed: u64, nodes: u32, tally: &mut DiskTally) -> Result<(), Violation> {
    let mut phase = 0;
    let mut stopped = [(0, 0); 3];
    let mut failures_at_fill: Vec<u64> = Vec::new();
    let c = run(cluster(seed, nodes), disk_faults(seed, nodes), |c, event| {
        let failures = |s: u32| c.node(s).map_or(0, |n| n.disk_failures);
        match event {
            Event::Disks(slots, true) => failures_at_fill = slots.iter().map(|&s| failures(s)).collect(),
            Event::Disks(slots, false) => {
                let n = slots.iter().zip(&failures_at_fill).filter(|(&s, &f)| failures(s) > f).count();
                stopped[phase] = (n, slots.len());
                phase += 1;
            }
            _ => {}
        }
    })?;
    for (i, (n, full)) in stopped.into_iter().enumerate() {
        tally.any[i] += u32::from(n >= 1);
        tally.two[i] += u32::from(n >= 2);
        tally.all[i] += u32::from(n == full);
    }
    tally.restarts += (0..nodes).filter_map(|s| c.node(s)).map(|n| n.restarts).sum::<u64>();
    Ok(())
}

/// Runs the full-disk schedules of `seeds` and checks that the faults happened. Not every
/// node with a full disk stops: one stops when it must fsync, and once the locker or a
/// quorum has stopped, the others have nothing to write until the disks heal (and a crash
/// or partition of the plan may keep a node from writing) — but many must have.
fn full_disks_over(name: &str, seeds: std::ops::Range<u64>, nodes: u32) {
    let runs = (seeds.end - seeds.start) as u32;
    let mut tally = DiskTally::default();
    for_each_seed(name, seeds, |seed| full_disks(seed, nodes, &mut tally));
    let phases = ["one node", "a majority", "every node"];
    for (i, what) in phases.iter().enumerate() {
        assert!(
            tally.any[i] * 5 > runs * 4,
            "{what} with full disks: a node stopped in {} of {runs} runs",
            tally.any[i]
        );
    }
    for (i, what) in phases.iter().enumerate().skip(1) {
        assert!(tally.two[i] * 3 > runs, "{what} with full disks: two stopped in {} of {runs} runs", tally.two[i]);
    }
    assert!(tally.all[2] * 20 > runs, "every node stopped at once in only {} of {runs} runs", tally.all[2]);
    assert!(tally.restarts >= u64::from(runs) * 2, "only {} restarts in place in {runs} runs", tally.restarts);
}

#[test]
fn full_disks_on_one_a_majority_and_every_node_heal_in_place_without_loss_five_nodes() {
    full_disks_over("full_disks_five_nodes", 6000..6200, 5);
}

#[test]
fn full_disks_on_one_a_majority_and_every_node_heal_in_place_without_loss_three_nodes() {
    full_disks_over("full_disks_three_nodes", 6500..6700, 3);
}

/// One or two moments at which every node crashes at once, each followed 5–40 ms later by
/// the restart of all, among the plan's faults.
fn blackouts(seed: u64, nodes: u32) -> Vec<(Duration, Event)> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb1ac_0000);
    let mut events = noise(seed, nodes);
    let mut t = Duration::from_millis(rng.gen_range(40..150));
    for _ in 0..rng.gen_range(1..=2) {
        events.push((t, Event::Blackout));
        t += Duration::from_millis(rng.gen_range(5..40));
        events.push((t, Event::PowerBack { new_view: rng.gen_bool(0.5) }));
        t += Duration::from_millis(rng.gen_range(60..150));
    }
    events
}

fn torn_everywhere(seed: u64, nodes: u32, torn_total: &mut u64) -> Result<(), Violation> {
    let c = cluster(seed, nodes);
    let before = c.identities.clone();
    let c = run(c, blackouts(seed, nodes), |_, _| {})?;
    if c.identities != before {
        return Err(c.sim.violation("a node came back under a new identity after a torn tail"));
    }
    *torn_total += c.world.borrow().torn_tails_cut;
    Ok(())
}

#[test]
fn torn_tails_on_every_node_at_once_then_all_restart_as_themselves_five_nodes() {
    let mut torn = 0;
    for_each_seed("torn_everywhere_five_nodes", 7000..7200, |seed| torn_everywhere(seed, 5, &mut torn));
    assert!(torn > 200, "the blackouts tore only {torn} logs in 200 runs");
}

#[test]
fn torn_tails_on_every_node_at_once_then_all_restart_as_themselves_three_nodes() {
    let mut torn = 0;
    for_each_seed("torn_everywhere_three_nodes", 7500..7700, |seed| torn_everywhere(seed, 3, &mut torn));
    assert!(torn > 100, "the blackouts tore only {torn} logs in 200 runs");
}
