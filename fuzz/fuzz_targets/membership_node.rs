//! A formed membership node fed datagrams signed with the cluster key (what a broken or
//! confused member could send), with time passing between them: the input is a sequence of
//! `[milliseconds, sender, flags, length, bytes…]`, each datagram signed as the wire does.
//! With flag 1 the harness stamps the datagram for this node's process (its id and
//! incarnation, which the fuzzer could not guess) so that it reaches the protocol; with
//! flag 2 it delivers the datagram twice. Nothing may panic, the node never installs a view
//! without itself, and a datagram delivered again is never acted on again.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use ulnet_cluster::{Config, Counters, Member, MemberId, Membership};
use ulnet_fuzz::{sign_cluster_datagram, CLUSTER_SECRET};
const ME: u64 = 5;
const INCARNATION: u64 = 7;
/// Where the receiver's id and incarnation sit in the header (wire.rs).
const RECEIVER_AT: usize = 28;

fuzz_target!(|data: &[u8]| {
    let mut now = Instant::now();
    let me = Member { id: MemberId(ME), name: "m5".into(), addr: addr(ME) };
    let mut node = Membership::new(Config::local(), me, INCARNATION, CLUSTER_SECRET, vec![], 1);
    node.start(now);
    let mut input = data;
    while let [dt, sender, flags, len, rest @ ..] = input {
        let len = usize::from(*len).min(rest.len());
        let (body, rest) = rest.split_at(len);
        input = rest;
        let mut datagram = body.to_vec();
        if flags & 1 == 1 && datagram.len() >= RECEIVER_AT + 16 {
            datagram[RECEIVER_AT..RECEIVER_AT + 8].copy_from_slice(&ME.to_le_bytes());
            datagram[RECEIVER_AT + 8..RECEIVER_AT + 16].copy_from_slice(&INCARNATION.to_le_bytes());
        }
        sign_cluster_datagram(&mut datagram);
        now += Duration::from_millis(u64::from(*dt));
        let from = addr(u64::from(*sender % 16));
        node.handle_datagram(now, from, &datagram);
        if flags & 2 == 2 {
            let before = node.counters();
            node.handle_datagram(now, from, &datagram);
            let after = node.counters();
            assert_eq!(
                after.packets_received - before.packets_received,
                not_fresh(&after) - not_fresh(&before),
                "a datagram delivered again was acted on again"
            );
        }
        if node.poll_timeout().is_some_and(|t| t <= now) {
            node.handle_timeout(now);
        }
        while node.poll_transmit().is_some() {}
        while node.poll_event().is_some() {}
        if let Some(view) = node.view() {
            assert!(view.contains(MemberId(ME)), "installed a view without itself");
        }
    }
});

/// Authenticated datagrams dropped as not fresh.
fn not_fresh(c: &Counters) -> u64 {
    c.dropped_replayed + c.dropped_old_incarnation + c.dropped_unconfirmed
}

fn addr(id: u64) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9000 + id as u16))
}
