//! A formed membership node fed datagrams signed with the cluster key (what a broken or
//! confused member could send), with time passing between them: the input is a sequence of
//! `[milliseconds, sender, length, bytes…]`, each datagram signed as the wire does.
//! Nothing may panic, and the node never installs a view without itself.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use ulnet_cluster::{Config, Member, MemberId, Membership};
use ulnet_fuzz::{sign_cluster_datagram, CLUSTER_SECRET};
const ME: u64 = 5;

fuzz_target!(|data: &[u8]| {
    let mut now = Instant::now();
    let me = Member { id: MemberId(ME), name: "m5".into(), addr: addr(ME) };
    let mut node = Membership::new(Config::local(), me, 1, CLUSTER_SECRET, vec![], 1);
    node.start(now);
    let mut input = data;
    while let [dt, sender, len, rest @ ..] = input {
        let len = usize::from(*len).min(rest.len());
        let (body, rest) = rest.split_at(len);
        input = rest;
        let mut datagram = body.to_vec();
        sign_cluster_datagram(&mut datagram);
        now += Duration::from_millis(u64::from(*dt));
        node.handle_datagram(now, addr(u64::from(*sender % 16)), &datagram);
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

fn addr(id: u64) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9000 + id as u16))
}
