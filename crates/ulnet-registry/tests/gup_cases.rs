//! The five failure cases of MSCS's GUP, each staged deliberately in the simulator: five
//! voters, n0 the locker, n3 the sender of one update, and the failures placed right after
//! the lock grant. In every case the survivors agree; in case 5 the update leaves no trace.

mod util;

use std::time::Duration;
use ulnet_sim::{Faults, NodeId as SimId, WorldChange};
use util::Cluster;

const SENDER: u32 = 3;

fn ids(v: &[u32]) -> Vec<SimId> {
    v.iter().map(|&i| SimId(i)).collect()
}

/// A settled 5-node cluster, and one update submitted at the sender; returns once the sender
/// holds the grant (the update is in its log).
fn staged(seed: u64, value: &str, cut_sender_from: &[u32]) -> Cluster {
    let mut c = Cluster::new(seed, 5, Faults::default());
    c.run_for(Duration::from_millis(30)).unwrap();
    assert!(c.node(0).unwrap().gup.is_locker(), "n0 locks");
    if !cut_sender_from.is_empty() {
        c.apply(&WorldChange::PartitionOneWay { from: ids(&[SENDER]), to: ids(cut_sender_from) });
    }
    let now = c.sim.now();
    c.node_mut(SENDER).unwrap().submit_value(now, value.as_bytes().to_vec()).unwrap();
    c.flush(SENDER);
    for _ in 0..100 {
        c.run_for(Duration::from_micros(100)).unwrap();
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
    // The sender's deliveries to the receivers are lost, then it crashes.
    let mut c = staged(11, "case1", &[1, 2, 4]);
    c.apply(&WorldChange::Crash(SimId(SENDER)));
    c.apply(&WorldChange::Heal);
    c.run_for(Duration::from_millis(200)).unwrap();
    c.check_settled().unwrap();
    assert!(applied_everywhere(&c, "case1"));
    assert_eq!(holders(&c, "case1"), vec![0, 1, 2, 4]);
    assert!(c.node(0).unwrap().gup.counters().takeovers > 0, "the locker transmitted for the sender");
}

#[test]
fn case2_receiver_fails_nobody_waits_and_it_catches_up() {
    let mut c = staged(12, "case2", &[]);
    c.apply(&WorldChange::Crash(SimId(4)));
    c.run_for(Duration::from_millis(50)).unwrap();
    assert!(applied_everywhere(&c, "case2"));
    assert_eq!(c.node(SENDER).unwrap().committed, 1, "the client was answered without n4");
    c.apply(&WorldChange::Restart(SimId(4)));
    c.run_for(Duration::from_millis(200)).unwrap();
    c.check_settled().unwrap();
    assert_eq!(holders(&c, "case2").len(), 5);
}

#[test]
fn case3_locker_fails_the_next_node_locks_and_replays() {
    let mut c = staged(13, "case3", &[]);
    c.apply(&WorldChange::Crash(SimId(0)));
    c.run_for(Duration::from_millis(200)).unwrap();
    c.check_settled().unwrap();
    assert!(c.node(1).unwrap().gup.is_locker(), "n1, next in circular order, locks");
    assert!(applied_everywhere(&c, "case3"));
    assert_eq!(c.node(SENDER).unwrap().committed, 1, "the sender's client is answered");
}

#[test]
fn case4_sender_and_locker_fail_the_next_node_finishes() {
    // Only n1 (after the locker in circular order) receives the update before the sender
    // and the locker crash.
    let mut c = staged(14, "case4", &[2, 4]);
    c.run_for(Duration::from_millis(2)).unwrap();
    assert!(holders(&c, "case4").contains(&1));
    c.apply(&WorldChange::Crash(SimId(SENDER)));
    c.apply(&WorldChange::Crash(SimId(0)));
    c.apply(&WorldChange::Heal);
    c.run_for(Duration::from_millis(200)).unwrap();
    c.check_settled().unwrap();
    assert!(applied_everywhere(&c, "case4"));
    assert_eq!(holders(&c, "case4"), vec![1, 2, 4]);
}

#[test]
fn case5_sender_and_every_receiver_fail_the_update_leaves_no_trace() {
    // Nobody but the locker gets the update; sender and locker crash before the locker
    // takes over. Their disks keep the update — until they come back.
    let mut c = staged(15, "case5", &[1, 2, 4]);
    assert_eq!(holders(&c, "case5"), vec![0, SENDER]);
    c.apply(&WorldChange::Crash(SimId(SENDER)));
    c.apply(&WorldChange::Crash(SimId(0)));
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
    c.apply(&WorldChange::Restart(SimId(SENDER)));
    c.apply(&WorldChange::Restart(SimId(0)));
    c.run_for(Duration::from_millis(300)).unwrap();
    c.check_settled().unwrap();
    assert!(!applied_everywhere(&c, "case5"), "never applied anywhere");
    assert_eq!(holders(&c, "case5"), Vec::<u32>::new(), "no log holds it any more");
    assert!(!c.world.borrow().acked.contains(b"case5".as_slice()), "its client was never told it happened");
    assert_eq!(holders(&c, "after").len(), 5);
}

#[test]
fn a_joining_node_gets_the_state_by_transfer_and_then_every_update() {
    // Three voters run long enough to compact their logs; a fourth node with an empty log
    // joins the view: it receives a snapshot and the log tail, then follows as a learner.
    let mut c = Cluster::with_learners(16, 3, 1, Faults::default());
    c.install_view((0..3).map(ulnet_registry::gup::NodeId).collect());
    for i in 0..3 {
        let now = c.sim.now();
        c.node_mut(i).unwrap().start_client(Duration::from_millis(2), now);
    }
    c.run_for(Duration::from_millis(150)).unwrap();
    assert!(c.node(0).unwrap().gup.snapshot_seq() > 0, "the voters compacted their logs");
    assert_eq!(c.node(3).unwrap().gup.applied(), 0);
    c.install_view((0..4).map(ulnet_registry::gup::NodeId).collect());
    c.run_for(Duration::from_millis(100)).unwrap();
    for i in 0..3 {
        c.node_mut(i).unwrap().stop_client();
    }
    c.run_for(Duration::from_millis(100)).unwrap();
    c.check_settled().unwrap();
    let joiner = &c.node(3).unwrap().gup;
    assert!(joiner.is_normal());
    assert!(joiner.snapshot_seq() > 0, "it started from a transferred snapshot");
    assert_eq!(joiner.applied(), c.node(0).unwrap().gup.applied());
}
