//! Channels that go down under an [`Rpc`]: it closes them, so a server whose clients come
//! and go keeps no socket of theirs, and an answer owed to a client that left never
//! reaches the client that takes its channel id next.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, EndpointCounters};
use ulnet_msg::rpc::{CallOutcome, DeferredReply, Rpc, RpcConfig, RpcEvent};

const ECHO: u16 = 1;
const LATER: u16 = 2;
const T: Duration = Duration::from_secs(10);

/// The connected TCP sockets this process holds on local port `port` (a server's accepted
/// connections; its listening socket not counted), in any state, CLOSE-WAIT included.
fn sockets_on_port(port: u16) -> usize {
    let inodes: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(String::from))
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| cols.len() > 9 && cols[3] != "0A" && inodes.contains(&cols[9].to_string()))
        .filter(|cols| cols[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port))
        .count()
}

/// One call of `method` on a new TCP channel to `addr`; returns the answer.
fn call_once(addr: &str, method: u16, payload: &[u8]) -> Vec<u8> {
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = ep.connect_tcp(addr, T).unwrap();
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let CallOutcome::Sent(id) = rpc.call(ch, method, &[payload], Some(T)).unwrap() else { panic!("no room") };
    let deadline = Instant::now() + T;
    let mut answer = None;
    while answer.is_none() {
        rpc.poll(16, |e| match e {
            RpcEvent::Reply { call, data, .. } if call == id => answer = Some(data.to_vec()),
            other => panic!("unexpected {other:?}"),
        });
        assert!(Instant::now() < deadline, "no answer");
        rpc.endpoint().wait(Some(Duration::from_millis(5))).unwrap();
    }
    assert_eq!(rpc.counters().stale_replies, 0, "an answer meant for another client arrived");
    answer.unwrap()
}

/// What the server thread shares with the test.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Deferred `LATER` requests: their channel, payload and answer handle, oldest first.
    held: Mutex<Vec<(ChannelId, Vec<u8>, DeferredReply)>>,
    /// How many of the held requests to answer now, oldest first.
    answer: AtomicUsize,
    /// Channels reported down.
    down: Mutex<Vec<ChannelId>>,
}

/// A server on a thread: accepts, polls, answers `ECHO` at once and `LATER` when told.
struct Server {
    addr: String,
    shared: Arc<Shared>,
    thread: std::thread::JoinHandle<(usize, EndpointCounters)>,
}

impl Server {
    fn start() -> Server {
        let mut ep = Endpoint::new(EndpointConfig::default());
        let addr = ep.listen_tcp("127.0.0.1:0").unwrap().to_string();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::spawn(move || serve(ep, &s));
        Server { addr, shared, thread }
    }

    /// Stops it; returns its endpoint's open channels and counters.
    fn stop(self) -> (usize, EndpointCounters) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn serve(ep: Endpoint, shared: &Arc<Shared>) -> (usize, EndpointCounters) {
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    rpc.register_inline(ECHO, |req, replier| replier.reply(&[req.payload]));
    let s = shared.clone();
    rpc.register_inline(LATER, move |req, replier| {
        let deferred = replier.defer().expect("a call gets an answer handle");
        s.held.lock().unwrap().push((req.channel, req.payload.to_vec(), deferred));
    });
    while !shared.stop.load(Ordering::Relaxed) {
        while rpc.endpoint().try_accept().unwrap().is_some() {}
        rpc.poll(64, |e| {
            if let RpcEvent::ChannelDown { channel, .. } = e {
                shared.down.lock().unwrap().push(channel);
            }
        });
        for _ in 0..shared.answer.swap(0, Ordering::Relaxed) {
            let (_, payload, deferred) = shared.held.lock().unwrap().remove(0);
            rpc.reply_later(deferred, Ok(&[b"answer to ", &payload]));
        }
        rpc.endpoint().wait(Some(Duration::from_millis(2))).unwrap();
    }
    (rpc.endpoint().channels_open(), rpc.endpoint().counters())
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_server_closes_the_channels_of_clients_that_left() {
    let server = Server::start();
    let port: u16 = server.addr.rsplit(':').next().unwrap().parse().unwrap();
    for i in 0..100u32 {
        assert_eq!(call_once(&server.addr, ECHO, &i.to_le_bytes()), i.to_le_bytes());
    }
    let shared = server.shared.clone();
    eventually("every client's channel reported down", || shared.down.lock().unwrap().len() == 100);
    eventually("the server holds no socket of the clients", || sockets_on_port(port) == 0);
    let (open, counters) = server.stop();
    assert_eq!(open, 0);
    assert_eq!(counters.channels_closed_by_peer, 100);
}

#[test]
fn an_answer_owed_to_a_client_that_left_never_reaches_the_next_one() {
    let server = Server::start();
    // Client A asks, and leaves before the answer.
    {
        let mut ep = Endpoint::new(EndpointConfig::default());
        let ch = ep.connect_tcp(&server.addr, T).unwrap();
        let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
        let CallOutcome::Sent(_) = rpc.call(ch, LATER, &[b"A"], Some(T)).unwrap() else { panic!("no room") };
        rpc.endpoint().flush_sends();
        let shared = server.shared.clone();
        eventually("A's request held", || shared.held.lock().unwrap().len() == 1);
    }
    let shared = server.shared.clone();
    eventually("A's channel down", || shared.down.lock().unwrap().len() == 1);
    let a_channel = shared.down.lock().unwrap()[0];
    // Client B takes A's channel id and asks the same way (its first call has A's call id).
    let addr = server.addr.clone();
    let b = std::thread::spawn(move || call_once(&addr, LATER, b"B"));
    eventually("B's request held", || shared.held.lock().unwrap().len() == 2);
    assert_eq!(shared.held.lock().unwrap()[1].0, a_channel, "B has A's channel id");
    // The answer to A first, then B's.
    shared.answer.store(2, Ordering::Relaxed);
    assert_eq!(b.join().unwrap(), b"answer to B");
    server.stop();
}
