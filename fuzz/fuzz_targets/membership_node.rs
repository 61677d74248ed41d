//! A formed membership node fed datagrams signed with the cluster key (what a broken or
//! confused member could send), with time passing between them: the input is a sequence of
//! `[milliseconds, sender, length, bytes…]`, each datagram signed as the wire does.
//! Nothing may panic, and the node never installs a view without itself.
#![no_main]
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use ulnet_cluster::{Config, Member, MemberId, Membership};

const SECRET: &[u8] = b"fuzz cluster secret";
/// Bytes of HMAC-SHA256 the wire keeps (the format's tag).
const TAG_LEN: usize = 16;
const ME: u64 = 5;

fuzz_target!(|data: &[u8]| {
    let mut now = Instant::now();
    let me = Member { id: MemberId(ME), name: "m5".into(), addr: addr(ME) };
    let mut node = Membership::new(Config::local(), me, SECRET, vec![], 1);
    node.start(now);
    let mut input = data;
    while let [dt, sender, len, rest @ ..] = input {
        let len = usize::from(*len).min(rest.len());
        let (body, rest) = rest.split_at(len);
        input = rest;
        let mut datagram = body.to_vec();
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
        mac.update(&datagram);
        datagram.extend_from_slice(&mac.finalize().into_bytes()[..TAG_LEN]);
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
