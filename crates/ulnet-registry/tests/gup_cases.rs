//! The five failure cases of MSCS's GUP, each staged deliberately in the simulator: five
//! voters, slot 0 the locker (the lowest identity), slot 3 the sender of one update, and
//! the failures placed right after the lock grant. The membership oracle installs the views
//! that follow. In every case the survivors agree; in case 5 the update leaves no trace.
//! Each case runs under `CASE_SEEDS` seeds (different message timings).
//! Then a joining node: state transfer, then a vote.

mod util;

use std::time::Duration;
use ulnet_sim::{Faults, NodeId as SlotId, WorldChange};
use util::Cluster;

const SENDER: u32 = 3;

/// Seeds per staged case (more with `ULNET_SIM_SEEDS`): the same staging under different
/// message timings.
const CASE_SEEDS: u64 = 1000;

/// Runs `case` for `CASE_SEEDS` seeds from `first`; a failure names its seed.
fn each_seed(first: u64, case: impl Fn(u64)) {
    let n = std::env::var("ULNET_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(CASE_SEEDS);
    for seed in first * 1000..first * 1000 + n {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(seed))).is_err() {
            panic!("failed with seed {seed}");
        }
    }
}

fn slots(v: &[u32]) -> Vec<SlotId> {
    v.iter().map(|&i| SlotId(i)).collect()
}

/// A settled 5-node cluster, and one update submitted at the sender; returns once the sender
/// holds the grant (the update is in its log).
fn staged(seed: u64, value: &str, cut_sender_from: &[u32]) -> Cluster {
    let mut c = Cluster::ordered(seed, 5, 0, Faults::default());
    c.run_for(Duration::from_millis(30)).unwrap();
    assert!(c.node(0).unwrap().gup.is_locker(), "slot 0 locks");
    if !cut_sender_from.is_empty() {
        c.apply(&WorldChange::PartitionOneWay { from: slots(&[SENDER]), to: slots(cut_sender_from) });
    }
    let now = c.sim.now();
    c.node_mut(SENDER).unwrap().submit_value(now, value.as_bytes().to_vec()).unwrap();
    c.flush(SENDER);
    for _ in 0..100 {
        c.sim.run_for(Duration::from_micros(100), |_| Ok(())).unwrap();
        let granted =
            c.node(SENDER).unwrap().gup.log_entries().any(|(_, e)| e.updates().any(|u| &u[..] == value.as_bytes()));
        if granted {
            return c;
        }
    }
    panic!("the sender never got the grant");
}

fn holders(c: &Cluster, value: &str) -> Vec<u32> {
    (0..5)
        .filter(|&i| {
            c.node(i).is_some_and(|n| n.gup.log_entries().any(|(_, e)| e.updates().any(|u| &u[..] == value.as_bytes())))
        })
        .collect()
}

fn applied_everywhere(c: &Cluster, value: &str) -> bool {
    c.applied_values().contains_key(value.as_bytes())
}

#[test]
fn case1_sender_fails_locker_finishes_the_transmission() {
    each_seed(11, |seed| {
        // The sender's deliveries to the receivers are lost, then it crashes. The membership
        // takes longer to notice than the locker (as with real failure detectors: hundreds of
        // milliseconds against `takeover_after`), so the locker finishes in its own epoch.
        let mut c = staged(seed, "case1", &[1, 2, 4]);
        c.detect = Duration::from_millis(100);
        c.apply(&WorldChange::Crash(SlotId(SENDER)));
        c.apply(&WorldChange::Heal);
        c.run_for(Duration::from_millis(200)).unwrap();
        assert!(applied_everywhere(&c, "case1"));
        assert_eq!(holders(&c, "case1"), vec![0, 1, 2, 4]);
        // The locker transmitted it: on its own (a takeover), or answering the repairs of the
        // receivers that learned from its heartbeat that a position is missing.
        let takeovers = c.node(0).unwrap().gup.counters().takeovers;
        let repairs: u64 = [1, 2, 4].iter().map(|&i| c.node(i).unwrap().gup.counters().repairs).sum();
        assert!(takeovers + repairs > 0, "the locker transmitted for the sender");
        c.apply(&WorldChange::Restart(SlotId(SENDER)));
        c.run_for(Duration::from_millis(200)).unwrap();
        c.check_settled().unwrap();
    });
}

#[test]
fn case2_receiver_fails_nobody_waits_and_it_catches_up() {
    each_seed(12, |seed| {
        let mut c = staged(seed, "case2", &[]);
        c.apply(&WorldChange::Crash(SlotId(4)));
        c.run_for(Duration::from_millis(50)).unwrap();
        assert!(applied_everywhere(&c, "case2"));
        assert_eq!(c.node(SENDER).unwrap().committed, 1, "the client was answered without slot 4");
        c.apply(&WorldChange::Restart(SlotId(4)));
        c.run_for(Duration::from_millis(200)).unwrap();
        c.check_settled().unwrap();
        assert_eq!(holders(&c, "case2").len(), 5);
    });
}

#[test]
fn case3_locker_fails_the_next_node_locks_and_replays() {
    each_seed(13, |seed| {
        let mut c = staged(seed, "case3", &[]);
        c.apply(&WorldChange::Crash(SlotId(0)));
        c.run_for(Duration::from_millis(200)).unwrap();
        assert!(c.node(1).unwrap().gup.is_locker(), "slot 1, next in circular order, locks");
        assert!(applied_everywhere(&c, "case3"));
        assert_eq!(c.node(SENDER).unwrap().committed, 1, "the sender's client is answered");
        let config = c.node(1).unwrap().gup.applied_config().unwrap().clone();
        assert!(!config.contains(c.identities[0]), "the failed locker no longer votes: {config}");
        c.apply(&WorldChange::Restart(SlotId(0)));
        c.run_for(Duration::from_millis(300)).unwrap();
        c.check_settled().unwrap();
    });
}

#[test]
fn case4_sender_and_locker_fail_the_next_node_finishes() {
    each_seed(14, |seed| {
        // Only slot 1 (after the locker in circular order) receives the update before the
        // sender and the locker crash.
        let mut c = staged(seed, "case4", &[2, 4]);
        c.sim.run_for(Duration::from_millis(2), |_| Ok(())).unwrap();
        assert!(holders(&c, "case4").contains(&1));
        c.apply(&WorldChange::Crash(SlotId(SENDER)));
        c.apply(&WorldChange::Crash(SlotId(0)));
        c.apply(&WorldChange::Heal);
        c.run_for(Duration::from_millis(200)).unwrap();
        assert!(applied_everywhere(&c, "case4"));
        assert_eq!(holders(&c, "case4"), vec![1, 2, 4]);
    });
}

#[test]
fn case5_sender_and_every_receiver_fail_the_update_leaves_no_trace() {
    each_seed(15, |seed| {
        // Nobody but the locker gets the update; sender and locker crash before the locker
        // takes over. Their disks keep the update — until they come back.
        let mut c = staged(seed, "case5", &[1, 2, 4]);
        assert_eq!(holders(&c, "case5"), vec![0, SENDER]);
        c.apply(&WorldChange::Crash(SlotId(SENDER)));
        c.apply(&WorldChange::Crash(SlotId(0)));
        c.apply(&WorldChange::Heal);
        c.run_for(Duration::from_millis(100)).unwrap();
        assert!(c.node(1).unwrap().gup.is_locker());
        assert!(!applied_everywhere(&c, "case5"));
        // Later updates go on.
        let now = c.sim.now();
        c.node_mut(2).unwrap().submit_value(now, b"after".to_vec()).unwrap();
        c.flush(2);
        c.run_for(Duration::from_millis(50)).unwrap();
        assert!(applied_everywhere(&c, "after"));
        // The failed nodes restart with the update on their disks; the new epoch's log wins.
        c.apply(&WorldChange::Restart(SlotId(SENDER)));
        c.apply(&WorldChange::Restart(SlotId(0)));
        c.run_for(Duration::from_millis(300)).unwrap();
        c.check_settled().unwrap();
        assert!(!applied_everywhere(&c, "case5"), "never applied anywhere");
        assert_eq!(holders(&c, "case5"), Vec::<u32>::new(), "no log holds it any more");
        assert!(!c.world.borrow().acked.contains(b"case5".as_slice()), "its client was never told it happened");
        assert_eq!(holders(&c, "after").len(), 5);
    });
}

#[test]
fn a_joining_node_gets_the_state_by_transfer_then_votes() {
    // Three voters run long enough to compact their logs; a fourth node with an empty log
    // joins: it receives a snapshot and the log tail, follows, and is voted in.
    let mut c = Cluster::ordered(16, 3, 1, Faults::default());
    c.start_clients(Duration::from_millis(2));
    c.run_for(Duration::from_millis(150)).unwrap();
    assert!(c.node(0).unwrap().gup.snapshot_seq() > 0, "the voters compacted their logs");
    c.apply(&WorldChange::Restart(SlotId(3)));
    c.run_for(Duration::from_millis(100)).unwrap();
    c.stop_clients();
    c.run_for(Duration::from_millis(100)).unwrap();
    c.check_settled().unwrap();
    let joiner = &c.node(3).unwrap().gup;
    assert!(joiner.is_normal());
    assert!(joiner.snapshot_seq() > 0, "it started from a transferred snapshot");
    assert_eq!(joiner.applied(), c.node(0).unwrap().gup.applied());
    assert!(joiner.applied_config().unwrap().contains(c.identities[3]), "it votes");
}

#[test]
fn a_locker_that_restarts_in_place_locks_again_in_a_new_round() {
    // The locker crashes and restarts before anyone notices: the view does not change, the
    // locker resumes it (as `ulnet node` resumes its membership) and starts a new round.
    let mut c = Cluster::ordered(17, 3, 0, Faults::default());
    c.detect = Duration::from_secs(10);
    c.start_clients(Duration::from_millis(2));
    c.run_for(Duration::from_millis(50)).unwrap();
    let before = c.node(0).unwrap().gup.epoch();
    c.apply(&WorldChange::Crash(SlotId(0)));
    c.apply(&WorldChange::Restart(SlotId(0)));
    c.run_for(Duration::from_millis(100)).unwrap();
    let after = c.node(0).unwrap().gup.epoch();
    assert!(c.node(0).unwrap().gup.is_locker());
    assert_eq!((after.view, after.round), (before.view, before.round + 1), "{before} then {after}");
    c.stop_clients();
    c.run_for(Duration::from_millis(100)).unwrap();
    c.check_settled().unwrap();
}

#[test]
fn a_view_of_two_leaves_three_voters() {
    // A view that keeps two of five voters (a late or partial one) must not leave a set of
    // two voters: the view may still list a node that has just lost its log for good, and a
    // set of two without that node never has a quorum again (seed 5592 of
    // `gup_sim::seven_nodes_heavy_loss`). A voter the view dropped stays as the third.
    let mut c = Cluster::ordered(18, 5, 0, Faults::default());
    c.run_for(Duration::from_millis(30)).unwrap();
    let (a, b) = (c.identities[0], c.identities[1]);
    c.install_view_now(vec![a, b]);
    c.run_for(Duration::from_millis(100)).unwrap();
    let locker = &c.node(0).unwrap().gup;
    assert!(locker.counters().config_changes > 0, "the configuration followed the view");
    let config = locker.applied_config().unwrap();
    assert!(!config.is_joint() && config.voters.len() == 3, "{config}");
    assert!(config.contains(a) && config.contains(b), "{config}");
}
