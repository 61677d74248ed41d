//! Active messages: request handlers answer, reply handlers run at the requester.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_core::{Endpoint, EndpointConfig, SendOutcome};
use ulnet_msg::rpc::{Rpc, RpcConfig};

const ADD_ONE: u16 = 10;
const GOT_SUM: u16 = 11;

#[test]
fn requests_run_handlers_that_reply_into_reply_handlers() {
    let name = format!("am-test-{}", std::process::id());
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let server = std::thread::spawn(move || {
        let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
        rpc.register_am_request(ADD_ONE, |m, replier| {
            let bytes: u64 = m.payload.iter().map(|&b| u64::from(b)).sum();
            replier.reply(GOT_SUM, [m.args[0] + 1, bytes, 0, 0], &[m.payload]);
        });
        rpc.endpoint().accept(Duration::from_secs(10)).unwrap();
        let mut down = false;
        while !down {
            rpc.poll(64, |e| down |= matches!(e, ulnet_msg::rpc::RpcEvent::ChannelDown { .. }));
        }
        rpc.counters()
    });
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = ep.connect_shm(&name, Duration::from_secs(10)).unwrap();
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let (sum, count) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (s, c) = (sum.clone(), count.clone());
    rpc.register_am_reply(GOT_SUM, move |m| {
        assert_eq!(m.args[1], m.payload.iter().map(|&b| u64::from(b)).sum::<u64>());
        s.fetch_add(m.args[0], Ordering::Relaxed);
        c.fetch_add(1, Ordering::Relaxed);
    });
    const N: u64 = 100_000;
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..N {
        let payload = [i as u8; 40];
        while rpc.am_request(ch, ADD_ONE, [i, 0, 0, 0], &[&payload[..20], &payload[20..]]).unwrap()
            == SendOutcome::NoResource
        {
            rpc.poll(64, |_| {});
        }
        rpc.poll(64, |_| {});
    }
    while count.load(Ordering::Relaxed) < N {
        rpc.poll(64, |_| {});
        assert!(Instant::now() < deadline);
    }
    assert_eq!(sum.load(Ordering::Relaxed), (1..=N).sum::<u64>(), "every request ran once and was answered once");
    rpc.endpoint().close(ch);
    let served = server.join().unwrap();
    assert_eq!(served.served, N);
}
