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
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            rpc.poll(256, |_| {});
        }
        rpc
    });
    (addr, stop, handle)
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
    while ok < calls && failure.is_none() {
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
        rpc.poll(256, |e| match e {
            RpcEvent::Reply { call, data, .. } => match outstanding.remove(&call) {
                Some(p) if data == expected_reply(&p) => ok += 1,
                Some(_) => failure = Some(format!("wrong reply to {call:?}")),
                None => failure = Some(format!("reply to unknown call {call:?}")),
            },
            RpcEvent::Failed { call, error, .. } => failure = Some(format!("{call:?} failed: {error}")),
            RpcEvent::ChannelDown { error, .. } => failure = Some(format!("channel down: {error}")),
        });
        assert!(Instant::now() < deadline, "timed out after {ok} calls");
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
