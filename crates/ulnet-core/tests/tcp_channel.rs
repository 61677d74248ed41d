//! TCP channels: handshake with the cluster secret, gather, whole and streamed messages,
//! clean close and peer failure, forged frames.

mod util;

use util::receive_whole;

use std::io::Write;
use std::time::{Duration, Instant};
use ulnet_core::transport::tcp::TcpConfig;
use ulnet_core::{ChannelError, ConnectError, Endpoint, EndpointConfig, Event, SendOutcome};

fn config(secret: &[u8]) -> EndpointConfig {
    EndpointConfig { tcp: TcpConfig { secret: secret.to_vec(), ..Default::default() }, ..Default::default() }
}

#[test]
fn messages_of_every_size_arrive_whole_in_order_then_closed() {
    let mut server = Endpoint::new(config(b"s3cret"));
    let addr = server.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let sizes = [0usize, 1, 64, 1000, 100_000, 250_000, 3_000_000];
    let client = std::thread::spawn(move || {
        let mut ep = Endpoint::new(config(b"s3cret"));
        let ch = ep.connect_tcp(&addr, Duration::from_secs(5)).unwrap();
        for (i, &len) in sizes.iter().enumerate() {
            let m: Vec<u8> = (0..len).map(|k| (k + i) as u8).collect();
            let (a, b) = m.split_at(len / 3);
            while ep.send(ch, &[b"", a, b]).unwrap() == SendOutcome::NoResource {
                ep.poll(16, |_| {});
            }
        }
        let big: Vec<u8> = (0..20_000_000u32).map(|k| (k % 251) as u8).collect();
        assert!(matches!(ep.post_send(ch, big, 9).unwrap(), SendOutcome::InProgress(9)));
        ep.flush(ch, Duration::from_secs(30)).unwrap();
        ep.close(ch);
    });
    server.accept(Duration::from_secs(5)).unwrap();
    let (got, down) = receive_whole(&mut server, sizes.len() + 1, Duration::from_secs(30));
    client.join().unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        let want: Vec<u8> = (0..len).map(|k| (k + i) as u8).collect();
        assert_eq!(got[i], want, "message {i}");
    }
    assert!(got[sizes.len()].iter().enumerate().all(|(k, &b)| b == (k % 251) as u8));
    assert_eq!(got[sizes.len()].len(), 20_000_000);
    let (_, down) =
        if down.is_none() { receive_whole(&mut server, 1, Duration::from_secs(30)) } else { (vec![], down) };
    assert_eq!(down, Some(ChannelError::Closed));
}

#[test]
fn packed_messages_arrive_over_a_transport_without_send_buffers() {
    let mut server = Endpoint::new(config(b"s3cret"));
    let addr = server.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let client = std::thread::spawn(move || {
        let mut ep = Endpoint::new(config(b"s3cret"));
        let ch = ep.connect_tcp(&addr, Duration::from_secs(5)).unwrap();
        assert!(!ep.caps(ch).unwrap().pack_in_place);
        for len in [0usize, 7, 60_000] {
            let mut pack = |dst: &mut [u8]| dst.iter_mut().enumerate().for_each(|(i, x)| *x = (i * 3 + len) as u8);
            while ep.send_packed(ch, len, &mut pack).unwrap() == SendOutcome::NoResource {
                ep.poll(16, |_| {});
            }
        }
        ep.flush(ch, Duration::from_secs(30)).unwrap();
        let sent = ep.counters();
        ep.close(ch);
        (sent.messages_sent, sent.bytes_sent)
    });
    server.accept(Duration::from_secs(5)).unwrap();
    let (got, _) = receive_whole(&mut server, 3, Duration::from_secs(30));
    for (m, len) in got.iter().zip([0usize, 7, 60_000]) {
        let want: Vec<u8> = (0..len).map(|i| (i * 3 + len) as u8).collect();
        assert_eq!(m, &want);
    }
    assert_eq!(client.join().unwrap(), (3, 60_007));
}

#[test]
fn wrong_secret_cannot_connect() {
    let mut server = Endpoint::new(config(b"right"));
    let addr = server.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let client = std::thread::spawn(move || {
        Endpoint::new(config(b"wrong")).connect_tcp(&addr, Duration::from_secs(5)).map(|_| ())
    });
    // The client refuses the server's proof and closes: the server counts the handshake
    // refused and accepts nothing.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.tcp_listener_counters().refused_closed == 0 {
        assert!(server.try_accept().unwrap().is_none());
        assert!(Instant::now() < deadline, "{:?}", server.tcp_listener_counters());
        server.wait(Some(Duration::from_millis(10))).unwrap();
    }
    assert!(matches!(client.join().unwrap(), Err(ConnectError::Handshake(_))));
    assert_eq!(server.channels().count(), 0);
    assert_eq!(server.tcp_handshakes_pending(), 0);
}

#[test]
fn vanished_peer_is_a_failure() {
    if let Some(addr) = util::child_role() {
        // Child: one good message, then exit without closing (no goodbye frame).
        let mut ep = Endpoint::new(config(b""));
        let ch = ep.connect_tcp(&addr, Duration::from_secs(5)).unwrap();
        assert_eq!(ep.send(ch, &[b"last words"]).unwrap(), SendOutcome::Done);
        assert!(ep.flush_sends());
        std::process::exit(0);
    }
    let mut server = Endpoint::new(config(b""));
    let addr = server.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let mut child = util::spawn_child("vanished_peer_is_a_failure", &addr, &[]);
    server.accept(Duration::from_secs(5)).unwrap();
    let (got, down) = receive_whole(&mut server, 2, Duration::from_secs(30));
    child.wait().unwrap();
    assert_eq!(got, vec![b"last words".to_vec()]);
    assert!(matches!(down, Some(ChannelError::PeerFailed(_))), "{down:?}");
}

#[test]
fn forged_frames_fail_the_channel_and_strangers_never_connect() {
    let mut server = Endpoint::new(config(b"k"));
    let addr = server.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let a2 = addr.clone();
    let t = std::thread::spawn(move || {
        let mut raw = std::net::TcpStream::connect(&a2).unwrap();
        let server_tag = ulnet_core::transport::tcp::handshake::client(&mut raw, b"k", 5).unwrap();
        // A frame with the right tag but a length beyond any limit.
        let mut frame = Vec::new();
        frame.extend_from_slice(&server_tag.to_le_bytes());
        frame.extend_from_slice(&0u32.to_le_bytes());
        frame.extend_from_slice(&u64::MAX.to_le_bytes());
        raw.write_all(&frame).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    server.accept(Duration::from_secs(5)).unwrap();
    let (got, down) = receive_whole(&mut server, 1, Duration::from_secs(30));
    t.join().unwrap();
    assert!(got.is_empty());
    assert!(matches!(down, Some(ChannelError::Protocol(_))), "{down:?}");

    // A raw client that speaks garbage never becomes a channel: it is refused and counted,
    // and its connection closed.
    let mut raw = std::net::TcpStream::connect(&addr).unwrap();
    raw.write_all(&[0xAB; 64]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.tcp_listener_counters().refused_not_ulnet == 0 {
        assert!(server.try_accept().unwrap().is_none());
        assert!(Instant::now() < deadline, "{:?}", server.tcp_listener_counters());
        server.wait(Some(Duration::from_millis(10))).unwrap();
    }
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(matches!(std::io::Read::read(&mut raw, &mut [0u8; 8]), Ok(0) | Err(_)), "the stranger is closed");
}

#[test]
fn connecting_where_nothing_listens_fails_at_once() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let result = Endpoint::new(config(b"k")).connect_tcp(&addr, Duration::from_secs(600));
    assert!(matches!(&result, Err(ConnectError::NoListener(a)) if *a == addr), "{result:?}");
    // A caller that waits for a peer to start retries until its timeout.
    let start = Instant::now();
    let result = Endpoint::new(config(b"k")).connect_tcp_retry(&addr, Duration::from_millis(300));
    assert!(matches!(result, Err(ConnectError::NoListener(_))), "{result:?}");
    assert!(start.elapsed() >= Duration::from_millis(300));
}

/// A receiver that closes while its peer is still streaming to it: the peer sees a clean
/// `Closed`, not a reset (the closed socket keeps draining until the peer closes too).
#[test]
fn closing_while_the_peer_streams_is_a_clean_close_for_the_peer() {
    let mut receiver = Endpoint::new(config(b"s3cret"));
    let addr = receiver.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let streamer = std::thread::spawn(move || {
        let mut ep = Endpoint::new(config(b"s3cret"));
        let ch = ep.connect_tcp(&addr, Duration::from_secs(5)).unwrap();
        let msg = vec![0x5au8; 8 * 1024];
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut down = None;
        while down.is_none() && Instant::now() < deadline {
            match ep.send(ch, &[&msg]) {
                Ok(SendOutcome::Done) => {}
                Ok(_) => {
                    ep.poll(64, |e| {
                        if let Event::ChannelDown { error, .. } = e {
                            down = Some(error);
                        }
                    });
                }
                Err(ulnet_core::SendError::ChannelDown(e)) => down = Some(e),
                Err(e) => panic!("send: {e}"),
            }
        }
        down
    });
    let ch = receiver.accept(Duration::from_secs(5)).unwrap();
    // Read at full speed (the streamer never waits for room), then close with input unread.
    let (got, down) = receive_whole(&mut receiver, 2000, Duration::from_secs(30));
    assert!(got.len() >= 2000 && down.is_none(), "{} messages, {down:?}", got.len());
    receiver.close(ch);
    assert_eq!(streamer.join().unwrap(), Some(ChannelError::Closed));
}

/// Aborting a channel whose peer does not read (as an unreachable one): what is still queued
/// is dropped rather than delivered later, and the peer sees a failure, not a clean close.
#[test]
fn aborting_drops_what_the_peer_has_not_received() {
    let mut receiver = Endpoint::new(config(b"s3cret"));
    let addr = receiver.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let (filled_tx, filled_rx) = std::sync::mpsc::channel();
    let (abort_tx, abort_rx) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        let mut ep = Endpoint::new(config(b"s3cret"));
        let ch = ep.connect_tcp(&addr, Duration::from_secs(5)).unwrap();
        let msg = vec![0xa5u8; 8 * 1024];
        let mut sent = 0usize;
        // Until the socket buffers of both sides are full: the receiver reads nothing yet.
        while ep.send(ch, &[&msg]).unwrap() == SendOutcome::Done {
            sent += 1;
        }
        filled_tx.send(sent).unwrap();
        abort_rx.recv().unwrap();
        ep.abort(ch);
    });
    receiver.accept(Duration::from_secs(5)).unwrap();
    let sent = filled_rx.recv().unwrap();
    abort_tx.send(()).unwrap();
    sender.join().unwrap();
    let (got, down) = receive_whole(&mut receiver, sent, Duration::from_secs(30));
    assert!(got.len() < sent, "{} of {sent} messages arrived after the abort", got.len());
    assert!(matches!(down, Some(ChannelError::PeerFailed(_))), "{down:?}");
}
