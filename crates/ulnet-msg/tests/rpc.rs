//! RPC end to end: many calls with random payloads and gather splits, deadlines, a server
//! that crashes mid-call, malformed and oversized requests.

use rand::{Rng, SeedableRng};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, SendOutcome};
use ulnet_msg::rpc::{CallError, CallId, CallOutcome, Rpc, RpcConfig, RpcEvent};
use ulnet_msg::wire::Status;

const ECHO_CRC: u16 = 1;
const SLOW: u16 = 2;

/// The reply to `ECHO_CRC`: the payload's CRC32C and length, then the payload reversed,
/// sent as a gather of three buffers.
fn serve_echo(rpc: &mut Rpc) {
    rpc.register_inline(ECHO_CRC, |req, replier| {
        let crc = crc32c::crc32c(req.payload).to_le_bytes();
        let len = (req.payload.len() as u32).to_le_bytes();
        let (a, b) = req.payload.split_at(req.payload.len() / 2);
        replier.reply(&[&crc, &len, &[b, a].concat()]);
    });
    rpc.register_pooled(SLOW, |p| {
        std::thread::sleep(Duration::from_millis(300));
        Ok(p.to_vec())
    });
}

fn expected_reply(payload: &[u8]) -> Vec<u8> {
    let (a, b) = payload.split_at(payload.len() / 2);
    [&crc32c::crc32c(payload).to_le_bytes()[..], &(payload.len() as u32).to_le_bytes(), b, a].concat()
}

enum Transport {
    Shm,
    Tcp,
    Udp,
}

/// A server on a thread; returns the address to connect to and a stop flag.
fn start_server(
    t: Transport,
    config: RpcConfig,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<Rpc>) {
    let mut ep = Endpoint::new(EndpointConfig::default());
    let addr = match t {
        Transport::Shm => {
            let name = format!("rpc-test-{}-{}", std::process::id(), rand::random::<u64>());
            ep.listen_shm(&name).unwrap();
            name
        }
        Transport::Tcp => ep.listen_tcp("127.0.0.1:0").unwrap().to_string(),
        Transport::Udp => ep.listen_udp("127.0.0.1:0").unwrap().to_string(),
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let handle = std::thread::spawn(move || {
        let mut rpc = Rpc::new(ep, config);
        serve_echo(&mut rpc);
        rpc.endpoint().accept(Duration::from_secs(10)).unwrap();
        let mut idle = Idle::default();
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            let n = rpc.poll(256, |_| {});
            idle.after(&mut rpc, n > 0);
        }
        rpc
    });
    (addr, stop, handle)
}

/// Spin-then-sleep for the polling loops: client and server are two threads of one
/// process, and on a host whose CPUs other processes share, two threads that only spin
/// keep waiting for each other to be scheduled. After `SPIN` empty polls in a row a loop
/// sleeps in `Endpoint::wait` (woken by the peer's next message), giving its CPU away.
#[derive(Default)]
struct Idle {
    empty: u32,
}

impl Idle {
    const SPIN: u32 = 200;

    fn after(&mut self, rpc: &mut Rpc, progressed: bool) {
        if progressed {
            self.empty = 0;
            return;
        }
        self.empty += 1;
        if self.empty >= Self::SPIN {
            self.empty = 0;
            rpc.endpoint().wait(Some(Duration::from_millis(5))).unwrap();
        }
    }
}

fn connect(t: &Transport, addr: &str) -> (Rpc, ChannelId) {
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = match t {
        Transport::Shm => ep.connect_shm(addr, Duration::from_secs(10)).unwrap(),
        Transport::Tcp => ep.connect_tcp(addr, Duration::from_secs(10)).unwrap(),
        Transport::Udp => ep.connect_udp(addr, Duration::from_secs(10)).unwrap(),
    };
    (Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() }), ch)
}

fn random_payload(rng: &mut impl Rng) -> Vec<u8> {
    let len = match rng.gen_range(0..100) {
        0..=79 => rng.gen_range(0..=256),
        80..=98 => rng.gen_range(257..=8192),
        _ => rng.gen_range(8193..=200_000),
    };
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn many_calls_verified(t: Transport, calls: u64) {
    let (addr, stop, server) = start_server(Transport::from(&t), RpcConfig::default());
    let (mut rpc, ch) = connect(&t, &addr);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let mut outstanding: std::collections::HashMap<CallId, Vec<u8>> = std::collections::HashMap::new();
    let (mut sent, mut ok) = (0u64, 0u64);
    let mut failure = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut idle = Idle::default();
    while ok < calls && failure.is_none() {
        let sent_before = sent;
        while sent < calls && outstanding.len() < 32 {
            let payload = random_payload(&mut rng);
            let cuts = [rng.gen_range(0..=payload.len()), rng.gen_range(0..=payload.len())];
            let (lo, hi) = (cuts[0].min(cuts[1]), cuts[0].max(cuts[1]));
            let gather: Vec<&[u8]> = match rng.gen_range(1..=3) {
                1 => vec![&payload[..]],
                2 => vec![&payload[..lo], &payload[lo..]],
                _ => vec![&payload[..lo], &payload[lo..hi], &payload[hi..]],
            };
            match rpc.call(ch, ECHO_CRC, &gather, Some(Duration::from_secs(60))).unwrap() {
                CallOutcome::Sent(id) => {
                    outstanding.insert(id, payload);
                    sent += 1;
                }
                CallOutcome::NoResource => break,
            }
        }
        let events = rpc.poll(256, |e| match e {
            RpcEvent::Reply { call, data, .. } => match outstanding.remove(&call) {
                Some(p) if data == expected_reply(&p) => ok += 1,
                Some(_) => failure = Some(format!("wrong reply to {call:?}")),
                None => failure = Some(format!("reply to unknown call {call:?}")),
            },
            RpcEvent::Failed { call, error, .. } => failure = Some(format!("{call:?} failed: {error}")),
            RpcEvent::ChannelDown { error, .. } => failure = Some(format!("channel down: {error}")),
        });
        assert!(Instant::now() < deadline, "timed out after {ok} calls");
        idle.after(&mut rpc, events > 0 || sent > sent_before);
    }
    assert_eq!(failure, None);
    assert_eq!((ok, rpc.outstanding()), (calls, 0));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let server = server.join().unwrap();
    assert_eq!(server.counters().served, calls);
}

impl From<&Transport> for Transport {
    fn from(t: &Transport) -> Self {
        match t {
            Transport::Shm => Transport::Shm,
            Transport::Tcp => Transport::Tcp,
            Transport::Udp => Transport::Udp,
        }
    }
}

#[test]
fn million_calls_with_random_payloads_and_gathers_over_shm() {
    many_calls_verified(Transport::Shm, 1_000_000);
}

#[test]
fn many_calls_with_random_payloads_and_gathers_over_tcp() {
    many_calls_verified(Transport::Tcp, 200_000);
}

#[test]
fn million_calls_with_random_payloads_and_gathers_over_udp() {
    many_calls_verified(Transport::Udp, 1_000_000);
}

#[test]
fn deadlines_fire_at_the_client_and_late_replies_are_dropped() {
    let (addr, stop, server) = start_server(Transport::Shm, RpcConfig::default());
    let (mut rpc, ch) = connect(&Transport::Shm, &addr);
    let t0 = Instant::now();
    let CallOutcome::Sent(id) = rpc.call(ch, SLOW, &[b"zzz"], Some(Duration::from_millis(30))).unwrap() else {
        panic!()
    };
    let mut failed = None;
    while failed.is_none() {
        rpc.poll(16, |e| {
            if let RpcEvent::Failed { call, error, .. } = e {
                failed = Some((call, error, t0.elapsed()));
            }
        });
    }
    let (call, error, after) = failed.unwrap();
    assert_eq!((call, error), (id, CallError::DeadlineExceeded));
    assert!(after >= Duration::from_millis(30) && after < Duration::from_millis(250), "{after:?}");
    // The slow reply arrives later and is dropped as stale.
    let until = Instant::now() + Duration::from_millis(800);
    while Instant::now() < until {
        rpc.poll(16, |e| panic!("no event expected, got {e:?}"));
    }
    assert_eq!(rpc.counters().stale_replies, 1);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    server.join().unwrap();
}

#[test]
fn malformed_oversized_and_unknown_requests_get_error_replies_and_service_continues() {
    let config = RpcConfig { max_request_len: 1000, ..Default::default() };
    let (addr, stop, server) = start_server(Transport::Shm, config);
    let (mut rpc, ch) = connect(&Transport::Shm, &addr);
    let expect = |rpc: &mut Rpc, outcome: CallOutcome, want: Result<(), CallError>| {
        let CallOutcome::Sent(id) = outcome else { panic!("no room") };
        let mut got = None;
        while got.is_none() {
            rpc.poll(16, |e| match e {
                RpcEvent::Reply { call, .. } if call == id => got = Some(Ok(())),
                RpcEvent::Failed { call, error, .. } if call == id => got = Some(Err(error)),
                other => panic!("unexpected {other:?}"),
            });
        }
        assert_eq!(got.unwrap(), want);
    };
    let big = vec![1u8; 5000];
    let o = rpc.call(ch, ECHO_CRC, &[&big], None).unwrap();
    expect(&mut rpc, o, Err(CallError::PayloadTooLarge));
    let huge = vec![2u8; 300_000]; // arrives in fragments: refused from the first one
    let o = rpc.call(ch, ECHO_CRC, &[&huge], None).unwrap();
    expect(&mut rpc, o, Err(CallError::PayloadTooLarge));
    let o = rpc.call(ch, 999, &[b"x"], None).unwrap();
    expect(&mut rpc, o, Err(CallError::UnknownMethod));
    // A request with reserved header bytes set, written raw on the channel.
    let CallOutcome::Sent(id) = rpc.call(ch, ECHO_CRC, &[b"ok"], None).unwrap() else { panic!() };
    let mut raw = ulnet_msg::wire::Header {
        kind: ulnet_msg::wire::Kind::Request,
        method: ECHO_CRC,
        status: None,
        request_id: id.0 + 1,
        deadline_us: 0,
    }
    .encode();
    raw[1] = 0xff;
    assert_eq!(rpc.endpoint().send(ch, &[&raw]).unwrap(), SendOutcome::Done);
    let mut replies = 0;
    while replies < 1 {
        rpc.poll(16, |e| match e {
            RpcEvent::Reply { call, .. } => {
                assert_eq!(call, id);
                replies += 1;
            }
            other => panic!("unexpected {other:?}"),
        });
    }
    let o = rpc.call(ch, ECHO_CRC, &[b"still serving"], None).unwrap();
    expect(&mut rpc, o, Ok(()));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let server = server.join().unwrap();
    assert_eq!(server.counters().malformed, 1);
    assert!(server.counters().refused >= 3);
    let _ = Status::Malformed;
}

#[test]
fn server_crash_fails_every_outstanding_call() {
    if let Ok(name) = std::env::var("ULNET_RPC_SERVER") {
        // Child: a server whose handler never answers (pooled, very slow), until killed.
        let mut ep = Endpoint::new(EndpointConfig::default());
        ep.listen_shm(&name).unwrap();
        let mut rpc = Rpc::new(ep, RpcConfig::default());
        rpc.register_pooled(SLOW, |_| {
            std::thread::sleep(Duration::from_secs(3600));
            Ok(Vec::new())
        });
        rpc.endpoint().accept(Duration::from_secs(10)).unwrap();
        loop {
            rpc.poll(64, |_| {});
        }
    }
    let name = format!("rpc-crash-{}-{}", std::process::id(), rand::random::<u64>());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "server_crash_fails_every_outstanding_call", "--test-threads=1"])
        .env("ULNET_RPC_SERVER", &name)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (mut rpc, ch) = connect(&Transport::Shm, &name);
    let mut ids = std::collections::HashSet::new();
    for _ in 0..100 {
        let CallOutcome::Sent(id) = rpc.call(ch, SLOW, &[b"wait"], None).unwrap() else { panic!() };
        ids.insert(id);
    }
    std::thread::sleep(Duration::from_millis(100));
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    let mut down = false;
    while !down {
        rpc.poll(256, |e| match e {
            RpcEvent::Failed { call, error: CallError::PeerFailed(_), .. } => assert!(ids.remove(&call)),
            RpcEvent::ChannelDown { .. } => down = true,
            other => panic!("unexpected {other:?}"),
        });
        assert!(start.elapsed() < Duration::from_secs(30), "hung after the server died");
    }
    assert!(ids.is_empty(), "{} calls got no error", ids.len());
    assert_eq!(rpc.outstanding(), 0);
}

/// A handler defers its answer; the server answers later, out of order, with payloads and
/// with an error status; a one-way request gets no handle.
#[test]
fn deferred_replies_are_answered_later_in_any_order() {
    const LATER: u16 = 7;
    let name = format!("rpc-defer-{}", std::process::id());
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let server = std::thread::spawn(move || {
        let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
        let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = held.clone();
        rpc.register_inline(LATER, move |req, replier| {
            let deferred = replier.defer();
            h.lock().unwrap().push((req.payload.to_vec(), deferred));
        });
        rpc.endpoint().accept(Duration::from_secs(10)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while held.lock().unwrap().len() < 4 {
            rpc.poll(64, |_| {});
            assert!(Instant::now() < deadline);
        }
        let mut taken: Vec<(Vec<u8>, Option<ulnet_msg::rpc::DeferredReply>)> = held.lock().unwrap().drain(..).collect();
        assert!(taken.iter().any(|(p, d)| p == b"one-way" && d.is_none()), "one-way requests get no handle");
        taken.retain(|(_, d)| d.is_some());
        taken.reverse();
        for (payload, deferred) in taken {
            let deferred = deferred.unwrap();
            if payload == b"fail" {
                rpc.reply_later(deferred, Err(Status::HandlerFailed));
            } else {
                rpc.reply_later(deferred, Ok(&[b"re:", &payload]));
            }
        }
        let mut down = false;
        while !down {
            rpc.poll(64, |e| down |= matches!(e, RpcEvent::ChannelDown { .. }));
        }
    });
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = ep.connect_shm(&name, Duration::from_secs(10)).unwrap();
    let mut rpc = Rpc::new(ep, RpcConfig { workers: 0, ..Default::default() });
    let mut calls = Vec::new();
    for p in [&b"a"[..], b"fail", b"b"] {
        match rpc.call(ch, LATER, &[p], Some(Duration::from_secs(20))).unwrap() {
            CallOutcome::Sent(id) => calls.push((id, p.to_vec())),
            CallOutcome::NoResource => panic!("no room"),
        }
    }
    assert_eq!(rpc.one_way(ch, LATER, &[b"one-way"]).unwrap(), SendOutcome::Done);
    let mut answers: Vec<(CallId, Result<Vec<u8>, CallError>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while answers.len() < 3 {
        rpc.poll(64, |e| match e {
            RpcEvent::Reply { call, data, .. } => answers.push((call, Ok(data.to_vec()))),
            RpcEvent::Failed { call, error, .. } => answers.push((call, Err(error))),
            RpcEvent::ChannelDown { .. } => {}
        });
        assert!(Instant::now() < deadline);
    }
    for (id, payload) in calls {
        let got = &answers.iter().find(|(c, _)| *c == id).unwrap().1;
        if payload == b"fail" {
            assert_eq!(got, &Err(CallError::HandlerFailed));
        } else {
            assert_eq!(got, &Ok([&b"re:"[..], &payload].concat()));
        }
    }
    rpc.endpoint().close(ch);
    server.join().unwrap();
}
