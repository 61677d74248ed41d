//! RMA over UDP, where the protocol moves only when someone polls: the target's engine
//! must run its channels' and handshakes' timers (retransmissions, acks) itself, also
//! while it sleeps. A relay between importer and target drops datagrams, so every lost
//! request, response or handshake packet comes back only by a retransmission.

mod rma_util;

use rma_util::*;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use ulnet_core::rma::{Access, NodeId, NotifyMode, Rights, Rma, RmaConfig};

/// Forwards datagrams between a client (whoever sends to the relay's address first) and
/// `target`, dropping every `nth` datagram in each direction. Returns the relay's address.
fn lossy_relay(target: &str, nth: u64, stop: Arc<AtomicBool>, dropped: Arc<AtomicU64>) -> String {
    let front = UdpSocket::bind("127.0.0.1:0").unwrap();
    let back = UdpSocket::bind("127.0.0.1:0").unwrap();
    back.connect(target).unwrap();
    for s in [&front, &back] {
        s.set_nonblocking(true).unwrap();
    }
    let addr = front.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut client = None;
        let (mut up, mut down) = (0u64, 0u64);
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let mut fds = [
                rustix::event::PollFd::new(&front, rustix::event::PollFlags::IN),
                rustix::event::PollFd::new(&back, rustix::event::PollFlags::IN),
            ];
            let _ = rustix::event::poll(&mut fds, 5);
            while let Ok((n, from)) = front.recv_from(&mut buf) {
                client = Some(from);
                up += 1;
                if up.is_multiple_of(nth) {
                    dropped.fetch_add(1, Ordering::Relaxed);
                } else {
                    let _ = back.send(&buf[..n]);
                }
            }
            while let Ok(n) = back.recv(&mut buf) {
                down += 1;
                match client {
                    Some(c) if !down.is_multiple_of(nth) => {
                        let _ = front.send_to(&buf[..n], c);
                    }
                    _ => {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    });
    addr
}

#[test]
fn operations_complete_over_a_lossy_link_with_the_target_engine_asleep() {
    let mut t = target(1, "lossy");
    let seg = t.rma.export("s", 1 << 20, Access::everyone(Rights::ALL), NotifyMode::Never).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicU64::new(0));
    let relay = lossy_relay(&t.udp, 5, stop.clone(), dropped.clone());
    let mut me = Rma::new(RmaConfig::new(NodeId(2))).unwrap();
    let peer = me.connect_udp(&relay, T).unwrap();
    let r = me.import(peer, "s").unwrap();
    const OPS: u64 = 60;
    for i in 0..OPS {
        assert_eq!(me.fetch_and_add_blocking(&r, 0, 1, T).unwrap(), i);
        // Pauses longer than the engine's spin, so that it sleeps between requests and
        // only its timers bring back what the relay dropped.
        std::thread::sleep(Duration::from_micros(300));
    }
    let block: Vec<u8> = (0..256 << 10).map(|i| (i * 31 + 7) as u8).collect();
    me.put_blocking(&r, 4096, &block, T).unwrap();
    let mut back = vec![0u8; block.len()];
    me.get_blocking(&r, 4096, &mut back, T).unwrap();
    assert_eq!(seg.load_u64(0), OPS);
    assert!(back == block, "a 256 KiB put and get round trip through the lossy link");
    let lost = dropped.load(Ordering::Relaxed);
    let (target_udp, my_udp) = (t.rma.udp_counters(), me.udp_counters());
    eprintln!("relay dropped {lost}; target retransmits {}, importer {}", target_udp.retransmits, my_udp.retransmits);
    assert!(lost >= 20, "the relay dropped datagrams ({lost})");
    assert!(target_udp.retransmits > 0, "the target's engine retransmitted: {target_udp:?}");
    drop(me); // closes through the relay
    stop.store(true, Ordering::Relaxed);
}
