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

#[test]
fn debug_seed() {
    let seed: u64 = std::env::var("DSEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let n: u32 = std::env::var("DN").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let loss: f64 = std::env::var("DLOSS").ok().and_then(|s| s.parse().ok()).unwrap_or(0.05);
    let mut c = Cluster::new(seed, n, Faults::lossy(loss));
    c.corrupt_on_restart = std::env::var("DCORRUPT").ok().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    c.start_clients(Duration::from_millis(3));
    let quiet = Duration::from_millis(400);
    let p = plan(seed, n, quiet);
    for ch in &p.changes {
        eprintln!("{:?}", ch);
    }
    let r = c.run_plan(&p, quiet);
    eprintln!("run: {:?} settled: {:?} now {:?}", r, c.check_settled(), c.sim.now());
    for i in 0..n {
        let Some(x) = c.node(i) else { continue };
        let last = x.gup.log_entries().last().map(|(s, _)| s);
        eprintln!(
            "n{i}: durable {} epoch {} applied {} commit {} last {:?} normal {} locker {} view {:?} {:?}",
            x.gup.durable_prefix(),
            x.gup.epoch(),
            x.gup.applied(),
            x.gup.committed(),
            last,
            x.gup.is_normal(),
            x.gup.is_locker(),
            x.gup.view().map(|v| v.id),
            x.gup.counters()
        );
        eprintln!("    {} {}", x.gup.debug_state(), x.disk_state());
    }
}
