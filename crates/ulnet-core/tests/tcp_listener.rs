//! Accepting TCP channels never blocks and costs a stranger a bounded slot for a bounded
//! time: the bound on handshakes at once closes the oldest, the deadline closes the
//! silent, refusals close at once; every ending is counted. Accepted channels beyond their
//! bound close the one idle longest.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use ulnet_core::transport::tcp::{TcpConfig, TcpListenerCounters};
use ulnet_core::{ChannelError, ChannelId, Endpoint, EndpointConfig, Event, SendOutcome};

const SECRET: &[u8] = b"listener secret";

fn endpoint(tcp: TcpConfig) -> Endpoint {
    Endpoint::new(EndpointConfig { tcp: TcpConfig { secret: SECRET.to_vec(), ..tcp }, ..Default::default() })
}

fn server(tcp: TcpConfig) -> (Endpoint, String) {
    let mut ep = endpoint(tcp);
    let addr = ep.listen_tcp("127.0.0.1:0").unwrap().to_string();
    (ep, addr)
}

/// Runs `try_accept` (and sleeps on the endpoint between) until `done` holds of the
/// listener's counters; returns the channels accepted meanwhile.
fn accept_until(ep: &mut Endpoint, what: &str, done: impl Fn(&TcpListenerCounters) -> bool) -> Vec<ChannelId> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut accepted = Vec::new();
    while !done(&ep.tcp_listener_counters()) {
        while let Some(ch) = ep.try_accept().unwrap() {
            accepted.push(ch);
        }
        assert!(Instant::now() < deadline, "{what}: {:?}", ep.tcp_listener_counters());
        let wake = ep.accept_timeout().map_or(Duration::from_millis(10), |t| {
            t.saturating_duration_since(Instant::now()).min(Duration::from_millis(10))
        });
        ep.wait(Some(wake)).unwrap();
    }
    accepted
}

/// Whether the server closed `s` (it reads the end of the stream, or a reset).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    matches!(s.read(&mut [0u8; 16]), Ok(0) | Err(_))
}

fn connect_in_thread(addr: &str) -> std::thread::JoinHandle<(Endpoint, ChannelId)> {
    let addr = addr.to_string();
    std::thread::spawn(move || {
        let mut ep = endpoint(TcpConfig::default());
        let ch = ep.connect_tcp(&addr, Duration::from_secs(10)).unwrap();
        (ep, ch)
    })
}

#[test]
fn beyond_the_bound_the_oldest_handshake_is_closed_and_a_client_still_connects() {
    let tcp =
        TcpConfig { handshakes_pending_max: 8, handshake_timeout: Duration::from_secs(600), ..Default::default() };
    let (mut ep, addr) = server(tcp);
    let mut idle: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    accept_until(&mut ep, "20 idle connections taken", |c| c.connections_accepted == 20);
    let c = ep.tcp_listener_counters();
    assert_eq!((c.dropped_for_bound, ep.tcp_handshakes_pending()), (12, 8), "{c:?}");
    for (i, s) in idle.iter_mut().enumerate().take(12) {
        assert!(closed_by_server(s), "idle connection {i}, among the oldest, is closed");
    }
    // The newest idle ones still hold every slot; a client gets through all the same.
    let client = connect_in_thread(&addr);
    let accepted = accept_until(&mut ep, "the client's channel", |c| c.handshakes_completed == 1);
    let (mut client_ep, ch) = client.join().unwrap();
    assert_eq!(accepted.len(), 1);
    assert_eq!(ep.tcp_listener_counters().dropped_for_bound, 13);
    assert_eq!(client_ep.send(ch, &[b"hello"]).unwrap(), SendOutcome::Done);
    assert!(client_ep.flush_sends());
}

#[test]
fn a_silent_or_half_finished_handshake_is_closed_at_its_deadline() {
    let tcp = TcpConfig { handshake_timeout: Duration::from_millis(300), ..Default::default() };
    let (mut ep, addr) = server(tcp);
    let mut silent = TcpStream::connect(&addr).unwrap();
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"ULNETTCP\x02\x00\x00\x00half a nonce").unwrap();
    let start = Instant::now();
    accept_until(&mut ep, "both time out", |c| c.timed_out == 2);
    assert!(start.elapsed() >= Duration::from_millis(300), "not before the deadline");
    assert!(closed_by_server(&mut silent) && closed_by_server(&mut half));
    assert_eq!(ep.tcp_handshakes_pending(), 0);
    assert_eq!(ep.accept_timeout(), None, "no handshake left, no timer");
}

#[test]
fn refusals_are_counted_by_reason_and_closed_at_once() {
    let (mut ep, addr) = server(TcpConfig::default());
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage.write_all(&[0xAB; 36]).unwrap();
    let mut other_version = TcpStream::connect(&addr).unwrap();
    let mut hello = b"ULNETTCP".to_vec();
    hello.extend_from_slice(&9u32.to_le_bytes());
    hello.extend_from_slice(&[0; 24]);
    other_version.write_all(&hello).unwrap();
    let gone = TcpStream::connect(&addr).unwrap();
    drop(gone);
    // A HELLO that gets its challenge, then a proof of 32 wrong bytes.
    let mut forger = TcpStream::connect(&addr).unwrap();
    let mut hello = b"ULNETTCP".to_vec();
    hello.extend_from_slice(&2u32.to_le_bytes());
    hello.extend_from_slice(&[1; 24]);
    forger.write_all(&hello).unwrap();
    let forger = std::thread::spawn(move || {
        let mut challenge = [0u8; 68];
        forger.read_exact(&mut challenge).unwrap();
        forger.write_all(&[0x55; 32]).unwrap();
        closed_by_server(&mut forger)
    });
    accept_until(&mut ep, "four refusals", |c| {
        c.refused_not_ulnet == 1 && c.refused_version == 1 && c.refused_closed == 1 && c.refused_bad_secret == 1
    });
    assert!(forger.join().unwrap());
    assert!(closed_by_server(&mut garbage) && closed_by_server(&mut other_version));
    assert_eq!(ep.channels().count(), 0);
}

#[test]
fn a_client_with_another_secret_is_refused_and_nothing_is_accepted() {
    let (mut ep, addr) = server(TcpConfig::default());
    let stranger = std::thread::spawn(move || {
        let mut other = Endpoint::new(EndpointConfig {
            tcp: TcpConfig { secret: b"another secret".to_vec(), ..Default::default() },
            ..Default::default()
        });
        other.connect_tcp(&addr, Duration::from_secs(10)).map(|_| ())
    });
    accept_until(&mut ep, "the stranger hangs up", |c| c.refused_closed == 1);
    assert!(stranger.join().unwrap().is_err());
    assert_eq!((ep.channels().count(), ep.tcp_listener_counters().handshakes_completed), (0, 0));
}

/// Polls `ep` until `channel` is reported down; returns why.
fn wait_down(ep: &mut Endpoint, channel: ChannelId) -> ChannelError {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut down = None;
        ep.poll(64, |e| {
            if let Event::ChannelDown { channel: c, error } = e {
                if c == channel {
                    down = Some(error);
                }
            }
        });
        if let Some(e) = down {
            return e;
        }
        assert!(Instant::now() < deadline, "channel {channel:?} never went down");
        ep.wait(Some(Duration::from_millis(10))).unwrap();
    }
}

#[test]
fn beyond_the_bound_on_accepted_channels_the_one_idle_longest_is_closed() {
    let (mut ep, addr) = server(TcpConfig { accepted_channels_max: 2, ..Default::default() });
    let mut clients = Vec::new();
    let mut accepted = Vec::new();
    for i in 0..2 {
        let client = connect_in_thread(&addr);
        accepted.extend(accept_until(&mut ep, "a client", |c| c.handshakes_completed == i + 1));
        clients.push(client.join().unwrap());
    }
    // The first client talks; the second stays idle.
    let (first_ep, first) = &mut clients[0];
    assert_eq!(first_ep.send(*first, &[b"still here"]).unwrap(), SendOutcome::Done);
    assert!(first_ep.flush_sends());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = 0;
    while got == 0 {
        got = ep.poll(64, |_| {});
        assert!(Instant::now() < deadline);
    }
    let third = connect_in_thread(&addr);
    accepted.extend(accept_until(&mut ep, "a third client", |c| c.handshakes_completed == 3));
    let _third = third.join().unwrap();
    assert_eq!(ep.counters().channels_evicted, 1);
    assert!(matches!(wait_down(&mut ep, accepted[1]), ChannelError::PeerFailed(_)), "the idle one is closed");
    ep.close(accepted[1]);
    assert_eq!(ep.channels_open(), 2);
    let (second_ep, second) = &mut clients[1];
    assert!(matches!(wait_down(second_ep, *second), ChannelError::PeerFailed(_)), "its client sees it go");
}
