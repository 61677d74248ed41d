//! GUP over thousands of seeded fault schedules: crashes of senders, lockers and receivers
//! in any combination (with durable state carried into restarts, sometimes with a corrupted
//! log tail), loss, duplication, reordering and partitions. At every step: all nodes apply
//! the same sequence, without gaps. After each run heals: all nodes converged, every
//! acknowledged update applied exactly once, and no log holds an update that was not
//! applied (case 5 leaves no trace).

mod util;

use std::time::Duration;
use ulnet_sim::{for_each_seed, Faults};
use util::{plan, Cluster};

fn run(seed: u64, n: u32, faults: Faults, corrupt: f64) -> Result<(), ulnet_sim::Violation> {
    let mut c = Cluster::new(seed, n, faults);
    c.corrupt_on_restart = corrupt;
    c.start_clients(Duration::from_millis(3));
    let quiet = Duration::from_millis(400);
    let p = plan(seed, n, quiet);
    c.run_plan(&p, quiet)?;
    c.check_settled().map_err(|what| c.sim.violation(what))?;
    if c.world.borrow().acked.is_empty() {
        return Err(c.sim.violation("no update was acknowledged in the whole run"));
    }
    Ok(())
}

#[test]
fn clean_network_all_updates_commit() {
    let mut c = Cluster::new(1, 5, Faults::default());
    c.start_clients(Duration::from_millis(2));
    c.run_for(Duration::from_millis(300)).unwrap();
    for i in 0..5 {
        c.node_mut(i).unwrap().stop_client();
    }
    c.run_for(Duration::from_millis(200)).unwrap();
    c.check_settled().unwrap();
    let w = c.world.borrow();
    assert_eq!(w.acked.len(), w.submitted.len(), "every update submitted on a clean network is acknowledged");
    assert!(w.acked.len() > 500, "only {} updates", w.acked.len());
    let locker = c.node(0).unwrap().gup.counters();
    assert!(
        locker.combined > 0 && locker.combined < locker.grants,
        "both single and combined grants happen: {locker:?}"
    );
}

#[test]
fn crashes_partitions_and_loss_five_nodes() {
    for_each_seed("crashes_partitions_and_loss_five_nodes", 0..400, |seed| run(seed, 5, Faults::lossy(0.05), 0.0));
}

#[test]
fn crashes_partitions_and_loss_three_nodes() {
    for_each_seed("crashes_partitions_and_loss_three_nodes", 1000..1400, |seed| run(seed, 3, Faults::lossy(0.05), 0.0));
}

#[test]
fn corrupted_log_tails_on_restart() {
    for_each_seed("corrupted_log_tails_on_restart", 2000..2300, |seed| run(seed, 5, Faults::lossy(0.02), 0.5));
}

#[test]
fn seven_nodes_heavy_loss() {
    for_each_seed("seven_nodes_heavy_loss", 3000..3150, |seed| run(seed, 7, Faults::lossy(0.15), 0.1));
}

/// Registry clients set and get three keys on every node under crashes, partitions and
/// loss; the recorded history must be linearizable per key (gets use the read index).
fn run_registry(seed: u64, n: u32) -> Result<(), ulnet_sim::Violation> {
    let mut c = Cluster::new(seed, n, Faults::lossy(0.05));
    for i in 0..n {
        c.node_mut(i).unwrap().registry_keys = 3;
    }
    c.start_clients(Duration::from_millis(4));
    let quiet = Duration::from_millis(400);
    let p = plan(seed, n, quiet);
    c.run_plan(&p, quiet)?;
    c.check_settled().map_err(|what| c.sim.violation(what))?;
    let w = c.world.borrow();
    let gets = w.history.iter().filter(|o| matches!(o.action, ulnet_registry::linearizability::Action::Get(_))).count();
    if gets == 0 {
        return Err(c.sim.violation("no get completed"));
    }
    ulnet_registry::linearizability::check(&w.history, 5_000_000).map_err(|e| c.sim.violation(e.to_string()))
}

#[test]
fn registry_histories_are_linearizable_per_key() {
    for_each_seed("registry_histories_are_linearizable_per_key", 5000..5300, |seed| run_registry(seed, 5));
}

/// Debugging aid for a failing seed: prints the plan and every persist and apply of one
/// update. `DSEED=815 DVAL=4:173 cargo test --release -p ulnet-registry --test gup_sim
/// trace_seed -- --ignored --nocapture` (five nodes, 5% loss, as the main test).
#[test]
#[ignore]
fn trace_seed() {
    let seed: u64 = std::env::var("DSEED").unwrap().parse().unwrap();
    let val = std::env::var("DVAL").unwrap();
    let mut c = Cluster::new(seed, 5, Faults::lossy(0.05));
    c.start_clients(Duration::from_millis(3));
    let quiet = Duration::from_millis(400);
    let p = plan(seed, 5, quiet);
    for ch in &p.changes {
        eprintln!("{ch:?}");
    }
    c.trace = Some(val.into_bytes());
    let r = c.run_plan(&p, quiet);
    eprintln!("{r:?} {:?}", c.check_settled());
}
