//! How the locker answers a member that asks for missing positions: a repair gets one
//! catch-up message of at most `catchup_entries_max` entries, the first ones asked for (the
//! member asks again for the rest), and entries past the granted log are not sent.

mod hand;

use hand::Net;
use std::time::{Duration, Instant};
use ulnet_registry::gup::{GupConfig, Msg};

#[test]
fn a_repair_of_a_long_range_gets_one_message_of_the_first_entries_asked_for() {
    let config = GupConfig {
        catchup_entries_max: 16,
        grant_delay: Duration::ZERO,
        grant_hold_max: Duration::ZERO,
        ..GupConfig::local()
    };
    let now = Instant::now();
    let mut net = Net::new(3, config, now);
    assert!(net.nodes[0].is_locker(), "n1 locks");
    for _ in 0..40 {
        net.submit(1, now);
        net.settle(now);
    }
    let positions: Vec<u64> = net.nodes[0].log_entries().map(|(p, _)| p).filter(|&p| p > 0).collect();
    assert!(positions.len() >= 40, "40 positions in the locker's log: {positions:?}");
    let (first, last) = (positions[0], *positions.last().unwrap());

    let asker = net.nodes[1].id();
    let epoch = net.nodes[0].epoch();
    net.nodes[0].handle_msg(now, asker, Msg::RepairRequest { epoch, from: first, to: last + 100 });
    let mut catchups = Vec::new();
    while let Some((to, msg)) = net.nodes[0].poll_msg() {
        if let Msg::Catchup { establish, from, end, snapshot, entries, .. } = msg {
            assert_eq!(to, asker);
            catchups.push((
                establish,
                from,
                end,
                snapshot.is_some(),
                entries.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            ));
        }
    }
    assert_eq!(catchups.len(), 1, "one message for a repair: {catchups:?}");
    let (establish, from, end, snapshot, sent) = &catchups[0];
    assert!(!establish && !snapshot);
    assert_eq!((*from, *end), (first, last), "from the first position asked for up to the granted end");
    assert_eq!(sent[..], positions[..16], "the first 16 entries asked for, in order");
}
