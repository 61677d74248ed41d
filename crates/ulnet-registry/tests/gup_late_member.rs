//! A member that missed its locker's sync (it was cut off when the epoch began) is brought
//! into the epoch by one establishing catch-up — its whole missing log tail — however many
//! sync states it sends. Over TCP, the heartbeats and sync requests a partition held back
//! arrive together when it heals, and the member answers each with its sync state: the
//! locker answering each of those with another copy of the tail stalled the registry of the
//! network-namespace test for seconds (thousands of copies of a 3,000-position tail). A
//! catch-up that is lost is still asked for again, so the member catches up anyway.

mod util;

use std::time::Duration;
use ulnet_registry::gup::Msg;
use ulnet_sim::{Faults, NodeId as SlotId, WorldChange};
use util::Cluster;

/// Seeds (more with `ULNET_SIM_SEEDS`): the same staging under different message timings.
const SEEDS: u64 = 300;
/// Sync states of the late member delivered together.
const REPEATS: u64 = 40;
const LATE: u32 = 2;

#[test]
fn repeated_sync_states_of_a_late_member_get_one_catchup_and_it_still_catches_up() {
    let n = std::env::var("ULNET_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(SEEDS);
    for seed in 0..n {
        if std::panic::catch_unwind(|| late_member(seed)).is_err() {
            panic!("failed with seed {seed}");
        }
    }
}

fn late_member(seed: u64) {
    let mut c = Cluster::ordered(seed, 3, 0, Faults::default());
    c.start_clients(Duration::from_millis(2));
    c.run_for(Duration::from_millis(30)).unwrap();
    assert_eq!(c.locker_slot(), 0);
    // The membership oracle keeps the view: the member is cut off but not removed, and a
    // new view of the same members starts an epoch whose sync it misses.
    c.detect = Duration::from_secs(3600);
    c.apply(&WorldChange::Partition { side_a: vec![SlotId(LATE)], side_b: vec![SlotId(0), SlotId(1)] });
    c.install_view_now(c.identities.clone());
    c.run_for(Duration::from_millis(60)).unwrap();
    let locker = &c.node(0).unwrap().gup;
    assert!(locker.is_locker() && locker.is_normal(), "the locker reigns in its new epoch");
    let epoch = locker.epoch();
    let late = c.node(LATE).unwrap();
    assert!(late.gup.epoch() < epoch, "the cut-off member missed the epoch");
    let (late_id, applied, commit) = (late.me, late.gup.applied(), late.gup.committed());

    // The member's sync states, held back and delivered at once.
    let now = c.sim.now();
    let locker = &mut c.node_mut(0).unwrap().gup;
    let before = locker.counters().repeated_sync_states;
    for _ in 0..REPEATS {
        let state = Msg::SyncState { epoch, last_normal: None, applied, commit, snapshot: None, entries: Vec::new() };
        locker.handle_msg(now, late_id, state);
    }
    let mut establishing = 0;
    while let Some((to, msg)) = locker.poll_msg() {
        // Taken out of the simulation: the one catch-up is lost, as over a reset channel.
        if to == late_id && matches!(msg, Msg::Catchup { establish: true, .. }) {
            establishing += 1;
        }
    }
    assert_eq!(establishing, 1, "one establishing catch-up for {REPEATS} sync states");
    assert_eq!(locker.counters().repeated_sync_states - before, REPEATS - 1);

    // The partition heals: the member asks again (its next heartbeat) and catches up.
    c.apply(&WorldChange::Heal);
    c.run_for(Duration::from_millis(100)).unwrap();
    c.stop_clients();
    c.run_for(Duration::from_millis(200)).unwrap();
    c.check_settled().unwrap();
    let late = &c.node(LATE).unwrap().gup;
    assert!(late.is_normal() && late.epoch() == c.node(0).unwrap().gup.epoch());
}
