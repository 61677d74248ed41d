//! Bad input never crashes a node: random bytes, and validly signed datagrams with
//! random contents (what a broken or confused member could send), are counted or handled,
//! the node keeps a view it belongs to, and a datagram delivered twice is acted on once.

use proptest::prelude::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use ulnet_cluster::wire::{Authenticator, Ballot, Message, Packet, Stamp};
use ulnet_cluster::{Config, Counters, Member, MemberId, Membership, View};

const SECRET: &[u8] = b"hostile";

fn member(id: u64, port: u16) -> Member {
    Member { id: MemberId(id), name: format!("m{id}"), addr: SocketAddr::from(([127, 0, 0, 1], port)) }
}

/// The incarnation of the node under test.
const INCARNATION: u64 = 3;

fn formed() -> (Membership, Instant) {
    let now = Instant::now();
    let mut m = Membership::new(Config::local(), member(5, 9000), INCARNATION, SECRET, vec![], 1);
    m.start(now);
    (m, now)
}

/// Authenticated datagrams dropped as not fresh.
fn not_fresh(c: &Counters) -> u64 {
    c.dropped_replayed + c.dropped_old_incarnation + c.dropped_unconfirmed
}

fn ballot() -> impl Strategy<Value = Ballot> {
    (0u32..4, 0u64..8).prop_map(|(round, p)| Ballot { round, proposer: MemberId(p) })
}

fn view() -> impl Strategy<Value = View> {
    (0u64..4, proptest::collection::btree_set(0u64..10, 1..6))
        .prop_map(|(id, ids)| View::new(id, ids.into_iter().map(|i| member(i, 9000 + i as u16)).collect()))
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (proptest::collection::vec((0u64..10, any::<u64>()), 0..8), proptest::collection::vec(0u64..10, 0..3))
            .prop_map(|(d, s)| Message::Heartbeat {
                digest: d.into_iter().map(|(a, b)| (MemberId(a), b)).collect(),
                suspects: s.into_iter().map(MemberId).collect()
            }),
        (0u64..10, any::<bool>())
            .prop_map(|(i, f)| Message::JoinRequest { member: member(i, 9000 + i as u16), forwarded: f }),
        (0u64..10).prop_map(|t| Message::Suspect { target: MemberId(t) }),
        (0u64..4, ballot()).prop_map(|(base, ballot)| Message::Prepare { base, ballot }),
        (
            0u64..4,
            ballot(),
            proptest::option::of((ballot(), view())),
            proptest::collection::vec(0u64..10, 0..3),
            any::<u32>()
        )
            .prop_map(|(base, ballot, accepted, s, row)| Message::Promise {
                base,
                ballot,
                accepted,
                suspects: s.into_iter().map(MemberId).collect(),
                row
            }),
        (0u64..4, ballot()).prop_map(|(base, promised)| Message::Nack { base, promised }),
        (0u64..4, ballot(), view()).prop_map(|(base, ballot, proposal)| Message::Accept { base, ballot, proposal }),
        (0u64..4, ballot()).prop_map(|(base, ballot)| Message::Accepted { base, ballot }),
        view().prop_map(|view| Message::Commit { view }),
        Just(Message::ViewRequest),
        Just(Message::Probe),
        Just(Message::ProbeAck),
        Just(Message::Challenge),
        (0u64..4, ballot()).prop_map(|(base, ballot)| Message::JoinerAlive { base, ballot }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_are_dropped_and_counted(datagrams in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..20)) {
        let (mut m, now) = formed();
        for d in &datagrams {
            m.handle_datagram(now, SocketAddr::from(([127, 0, 0, 1], 1)), d);
        }
        let c = m.counters();
        prop_assert_eq!(c.dropped_auth + c.dropped_malformed, datagrams.len() as u64);
        prop_assert_eq!(m.view().map(|v| v.id), Some(1));
    }

    #[test]
    fn signed_random_messages_never_crash_a_node(
        msgs in proptest::collection::vec((0u64..10, 0u64..4, message(), 0u64..300), 1..40)
    ) {
        let (mut m, mut now) = formed();
        let auth = Authenticator::new(SECRET);
        for (counter, (sender, sender_view, message, dt)) in (1..).zip(msgs) {
            now += Duration::from_millis(dt);
            // Fresh stamps, so that the messages reach the protocol.
            let stamp = Stamp { sender_incarnation: 1, receiver: MemberId(5), receiver_incarnation: INCARNATION, counter };
            let bytes = auth.encode(&Packet { sender: MemberId(sender), sender_view, stamp, message });
            let from = SocketAddr::from(([127, 0, 0, 1], 9000 + sender as u16));
            m.handle_datagram(now, from, &bytes);
            // The same datagram again (a replay, or a network duplicate): never acted on.
            let before = m.counters();
            m.handle_datagram(now, from, &bytes);
            let after = m.counters();
            prop_assert_eq!(after.packets_received - before.packets_received, not_fresh(&after) - not_fresh(&before));
            if m.poll_timeout().is_some_and(|t| t <= now) {
                m.handle_timeout(now);
            }
            while m.poll_transmit().is_some() {}
            while m.poll_event().is_some() {}
            if let Some(v) = m.view() {
                prop_assert!(v.contains(MemberId(5)), "installed a view without itself");
            }
        }
    }
}
