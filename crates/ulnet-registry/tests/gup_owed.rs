//! Members outside a combined position's eager set are owed it (see
//! `GupConfig::eager_spare`). When such a member is in the eager set of a later position —
//! it sends an update of its own, or is picked as a spare — it must not get that position
//! over a hole: it could neither acknowledge it (acknowledgements cover durable prefixes)
//! nor apply it and answer its client until the owed positions came, `lazy_delivery_max`
//! later. Seven machines driven by hand at one instant, no timer ever firing: what commits
//! here commits without waiting for the lazy delivery.

mod hand;

use hand::Net;
use std::time::{Duration, Instant};
use ulnet_registry::gup::{Gup, GupConfig};

#[test]
fn a_member_owed_positions_gets_them_with_the_next_position_it_gets_at_once() {
    let config = GupConfig {
        eager_spare: 0,
        grant_delay: Duration::ZERO,
        grant_hold_max: Duration::ZERO,
        lazy_delivery_max: Duration::from_millis(10),
        ..GupConfig::local()
    };
    let now = Instant::now();
    let mut net = Net::new(7, config, now);
    assert!(net.nodes[0].is_locker() && net.nodes.iter().all(Gup::is_normal), "n1 locks, everyone follows");

    // Position A: n2 and n3 together. Seven voters: a quorum is the locker and 3 others, so
    // A goes at once to n2, n3 and n4; n5, n6 and n7 are owed it.
    let a = [net.submit(1, now), net.submit(2, now)];
    net.settle(now);
    for (i, id) in [(1, a[0]), (2, a[1])] {
        assert!(net.committed.contains(&(i, id)), "A commits at once at its sender n{}", i + 1);
    }
    let owed = net.nodes[0].counters().owed_deliveries;
    let behind: Vec<u64> = net.nodes[4..].iter().map(Gup::durable_prefix).collect();
    assert!(
        behind.iter().all(|&p| p < net.nodes[1].durable_prefix()),
        "n5..n7 do not hold A yet (lazy delivery): {behind:?}"
    );

    // Position B: n5 and n6, both owed A. They are B's senders, so they get B at once —
    // and A with it: they acknowledge B (the quorum needs them: n2 is the only other member
    // of B's eager set) and apply it, with no timer having fired.
    let b = [net.submit(4, now), net.submit(5, now)];
    net.settle(now);
    for (i, id) in [(4, b[0]), (5, b[1])] {
        assert!(
            net.committed.contains(&(i, id)),
            "B commits and is applied at its sender n{} without waiting for the lazy delivery \
             (durable prefixes {:?}, committed {:?})",
            i + 1,
            net.nodes.iter().map(Gup::durable_prefix).collect::<Vec<_>>(),
            net.nodes.iter().map(Gup::committed).collect::<Vec<_>>(),
        );
    }
    let locker = net.nodes[0].counters();
    assert_eq!(locker.owed_deliveries, owed, "no lazy delivery was due: nothing waited for one");
    assert!(locker.owed_with_delivery >= 2, "n5 and n6 got A ahead of B: {locker:?}");
    // n7 is still owed A and B, and gets them later.
    assert!(net.nodes[6].durable_prefix() < net.nodes[4].durable_prefix());
}
