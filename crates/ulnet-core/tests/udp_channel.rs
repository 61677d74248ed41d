//! UDP channels over real sockets on loopback: handshake with the cluster secret, gather,
//! whole and streamed messages up to 64 MiB, clean close, a vanished peer, blocking waits
//! that wake for protocol timers, and malformed, truncated, replayed and wrong-secret
//! datagrams dropped and counted. (Loss, partitions and the relay: ulnet-netlab's tests.)

mod util;

use util::receive_whole;

use std::net::UdpSocket;
use std::time::{Duration, Instant};
use ulnet_core::transport::udp::{wire, Connection, UdpConfig};
use ulnet_core::{ChannelError, ConnectError, Endpoint, EndpointConfig, Event, NodeId, SendOutcome};

fn config(secret: &[u8]) -> EndpointConfig {
    EndpointConfig { udp: UdpConfig { secret: secret.to_vec(), ..UdpConfig::lan() }, ..Default::default() }
}

#[test]
fn messages_of_every_size_arrive_whole_in_order_then_closed() {
    let mut server = Endpoint::new(config(b"s3cret"));
    let addr = server.listen_udp("127.0.0.1:0").unwrap().to_string();
    let sizes = [0usize, 1, 64, 1000, 65_000, 100_000, 250_000, 3_000_000];
    let client = std::thread::spawn(move || {
        let mut ep = Endpoint::new(config(b"s3cret"));
        let ch = ep.connect_udp(&addr, Duration::from_secs(5)).unwrap();
        let caps = ep.caps(ch).unwrap();
        assert_eq!(caps.kind, ulnet_core::TransportKind::Udp);
        assert_eq!(caps.message_max, 64 << 20);
        for (i, &len) in sizes.iter().enumerate() {
            let m: Vec<u8> = (0..len).map(|k| (k + i) as u8).collect();
            if len > caps.send_max {
                assert!(matches!(ep.post_send(ch, m, i as u64).unwrap(), SendOutcome::InProgress(_)));
                ep.flush(ch, Duration::from_secs(30)).unwrap();
                continue;
            }
            let (a, b) = m.split_at(len / 3);
            while ep.send(ch, &[b"", a, b]).unwrap() == SendOutcome::NoResource {
                ep.poll(16, |_| {});
            }
        }
        let big: Vec<u8> = (0..(64u32 << 20)).map(|k| (k % 251) as u8).collect();
        assert!(matches!(ep.post_send(ch, big, 99).unwrap(), SendOutcome::InProgress(99)));
        ep.flush(ch, Duration::from_secs(60)).unwrap();
        ep.close(ch);
    });
    server.accept(Duration::from_secs(5)).unwrap();
    let (got, down) = receive_whole(&mut server, sizes.len() + 1, Duration::from_secs(60));
    client.join().unwrap();
    assert_eq!(got.len(), sizes.len() + 1, "all messages arrived ({down:?})");
    for (i, &len) in sizes.iter().enumerate() {
        let want: Vec<u8> = (0..len).map(|k| (k + i) as u8).collect();
        assert_eq!(got[i], want, "message {i}");
    }
    let last = &got[sizes.len()];
    assert_eq!(last.len(), 64 << 20);
    assert!(last.iter().enumerate().all(|(k, &b)| b == (k % 251) as u8));
    let (_, down) = if down.is_none() { receive_whole(&mut server, 1, Duration::from_secs(5)) } else { (vec![], down) };
    assert_eq!(down, Some(ChannelError::Closed));
}

#[test]
fn wrong_secret_cannot_connect_and_is_counted() {
    let mut server = Endpoint::new(config(b"right"));
    let addr = server.listen_udp("127.0.0.1:0").unwrap().to_string();
    let client = std::thread::spawn(move || {
        let mut ep = Endpoint::new(config(b"wrong"));
        let r = ep.connect_udp(&addr, Duration::from_secs(3)).map(|_| ());
        (r, ep.udp_counters())
    });
    let accepted = server.accept(Duration::from_secs(2));
    let (result, counters) = client.join().unwrap();
    assert!(matches!(result, Err(ConnectError::Handshake(_))), "{result:?}");
    assert_eq!(counters.wrong_secret, 1, "the client refused the server's proof and counted it");
    assert!(accepted.is_err(), "a stranger never becomes a channel");
}

#[test]
fn node_ids_are_exchanged_in_the_handshake() {
    let mut server = Endpoint::new(EndpointConfig { node_id: NodeId(7), ..config(b"k") });
    let addr = server.listen_udp("127.0.0.1:0").unwrap().to_string();
    let t = std::thread::spawn(move || {
        let mut client = Endpoint::new(EndpointConfig { node_id: NodeId(3), ..config(b"k") });
        let ch = client.connect_udp(&addr, Duration::from_secs(5)).unwrap();
        let peer = client.peer_node(ch);
        client.close(ch);
        peer
    });
    let ch = server.accept(Duration::from_secs(5)).unwrap();
    assert_eq!(server.peer_node(ch), Some(NodeId(3)));
    assert_eq!(t.join().unwrap(), Some(NodeId(7)));
}

/// Runs a handshake between two protocol machines in memory; `tamper` may change each
/// datagram on its way. Returns both sides.
fn handshake_in_memory(tamper: impl Fn(&mut Vec<u8>)) -> (Connection, Option<Connection>) {
    handshake_in_memory_with(UdpConfig { secret: b"k".to_vec(), ..UdpConfig::lan() }, tamper)
}

/// [`handshake_in_memory`] with both sides on `config`.
fn handshake_in_memory_with(config: UdpConfig, tamper: impl Fn(&mut Vec<u8>)) -> (Connection, Option<Connection>) {
    let now = Instant::now();
    let mut client = Connection::client(config.clone(), now, 0x11, [1; 16], NodeId(3));
    let mut buf = vec![0u8; wire::DATAGRAM_LIMIT];
    let n = client.poll_transmit(now, &mut buf).expect("a hello");
    let mut hello = buf[..n].to_vec();
    tamper(&mut hello);
    let Ok(mut server) = Connection::server(config, now, 0x22, [2; 16], NodeId(7), &hello) else {
        return (client, None);
    };
    for _ in 0..4 {
        while let Some(n) = server.poll_transmit(now, &mut buf) {
            let mut d = buf[..n].to_vec();
            tamper(&mut d);
            client.handle_datagram(now, &d);
        }
        while let Some(n) = client.poll_transmit(now, &mut buf) {
            let mut d = buf[..n].to_vec();
            tamper(&mut d);
            server.handle_datagram(now, &d);
        }
    }
    (client, Some(server))
}

#[test]
fn node_ids_are_bound_by_the_handshake_macs() {
    let (client, server) = handshake_in_memory(|_| {});
    let server = server.expect("the server answers");
    assert!(client.is_established() && server.is_established());
    assert_eq!((client.peer_node(), server.peer_node()), (NodeId(7), NodeId(3)));
    // A HELLO whose node id was changed on the way (checksum redone: a forger can) makes
    // the server's MAC disagree with what the client sent: the client refuses it.
    let (client, server) = handshake_in_memory(|d| {
        if wire::parse_header(d).is_ok_and(|h| h.kind == wire::Kind::Hello) {
            let at = wire::HEADER_LEN + wire::HELLO_FIELDS_LEN;
            d[at..at + 4].copy_from_slice(&4u32.to_le_bytes());
            wire::finish(d, wire::Kind::Hello, 0, 0);
        }
    });
    assert!(!client.is_established() && !server.expect("the server answers").is_established());
    assert_eq!(client.counters().wrong_secret, 1);
}

/// A packet selectively acked early and covered by the cumulative ack only after a long
/// stall (its predecessor lost and resent on a timeout) must not count the stall as its
/// round trip: the timeout would grow to `rto_max` for every later loss.
#[test]
fn a_stall_before_a_hole_fills_does_not_inflate_the_retransmission_timeout() {
    let (mut client, server) = handshake_in_memory(|_| {});
    let mut server = server.expect("the server answers");
    let t0 = Instant::now();
    let mut buf = vec![0u8; wire::DATAGRAM_LIMIT];
    let mut packets = Vec::new();
    for i in 0..5u8 {
        assert_eq!(client.send(&[&[i; 100]]).unwrap(), SendOutcome::Done);
        client.flush();
        while let Some(n) = client.poll_transmit(t0, &mut buf) {
            packets.push(buf[..n].to_vec());
        }
    }
    assert_eq!(packets.len(), 5);
    // The first is lost; the others arrive and are selectively acked 200 µs later.
    let t1 = t0 + Duration::from_micros(100);
    for p in &packets[1..] {
        server.handle_datagram(t1, p);
    }
    let deliver_acks = |server: &mut Connection, client: &mut Connection, at: Instant, buf: &mut Vec<u8>| {
        while let Some(n) = server.poll_transmit(at, buf) {
            let d = buf[..n].to_vec();
            client.handle_datagram(at + Duration::from_micros(100), &d);
        }
    };
    deliver_acks(&mut server, &mut client, t1, &mut buf);
    // A long stall (the sender descheduled, say), then the timeout resends the first.
    let t2 = t0 + Duration::from_secs(1);
    client.handle_timeout(t2);
    let mut resent = 0;
    while let Some(n) = client.poll_transmit(t2, &mut buf) {
        server.handle_datagram(t2 + Duration::from_micros(100), &buf[..n]);
        resent += 1;
    }
    assert!(resent >= 1, "the timeout resends the lost packet");
    deliver_acks(&mut server, &mut client, t2 + Duration::from_micros(100), &mut buf);
    assert_eq!(client.send_backlog(), (0, 0), "everything acknowledged");
    // The next packet's timeout reflects the 200 µs round trips, not the 1 s stall.
    let t3 = t2 + Duration::from_millis(1);
    assert_eq!(client.send(&[b"next"]).unwrap(), SendOutcome::Done);
    client.flush();
    assert!(client.poll_transmit(t3, &mut buf).is_some());
    let timeout = client.poll_timeout().expect("a timer runs").saturating_duration_since(t3);
    assert!(timeout < Duration::from_millis(50), "retransmission timeout {timeout:?}");
}

/// Sends `chunk`-sized messages and carries datagrams both ways until nothing moves (the
/// sender out of slots or credit); the receiver consumes nothing.
fn pump(client: &mut Connection, server: &mut Connection, t: &mut Instant, chunk: &[u8]) {
    let mut buf = vec![0u8; wire::DATAGRAM_LIMIT];
    for _ in 0..10_000 {
        let mut moved = false;
        while client.send(&[chunk]).unwrap() == SendOutcome::Done {
            moved = true;
        }
        client.flush();
        while let Some(n) = client.poll_transmit(*t, &mut buf) {
            server.handle_datagram(*t, &buf[..n]);
            moved = true;
        }
        while let Some(n) = server.poll_transmit(*t, &mut buf) {
            client.handle_datagram(*t, &buf[..n]);
            moved = true;
        }
        if !moved {
            return;
        }
        *t += Duration::from_micros(50);
    }
    panic!("the pump never settled");
}

/// A receiver sharing its budget among four channels grants each a quarter: once the
/// handshake's whole credit is used up, the sender stops at its share.
#[test]
fn a_shared_receive_budget_holds_each_sender_to_its_share() {
    let (mut client, server) = handshake_in_memory(|_| {});
    let mut server = server.expect("the server answers");
    let whole = u64::from(UdpConfig::lan().credit_bytes);
    server.share_receive_budget(4);
    assert_eq!(server.receive_capacity(), whole / 4);
    let chunk = vec![7u8; client.fragment_max()];
    let mut t = Instant::now();
    pump(&mut client, &mut server, &mut t, &chunk);
    let first = server.receive_buffered();
    assert!(first > whole / 2, "the handshake's credit is the whole budget: {first} buffered");
    let mut consumed = 0u64;
    server.poll_recv(usize::MAX, &mut |d, _| consumed += d.data.len() as u64).unwrap();
    assert!(consumed > whole / 2 && server.receive_buffered() == 0, "{consumed} consumed, all of it");
    pump(&mut client, &mut server, &mut t, &chunk);
    let second = server.receive_buffered();
    assert!(second <= whole / 4, "{second} buffered, more than the share {}", whole / 4);
    assert!(second + 2 * chunk.len() as u64 > whole / 4, "the share is used: {second} buffered");
    assert!(client.counters().credit_stalls >= 1, "the sender waited for credit");
    // Alone again, the receiver grants its whole budget.
    server.share_receive_budget(1);
    server.poll_recv(usize::MAX, &mut |_, _| {}).unwrap();
    pump(&mut client, &mut server, &mut t, &chunk);
    assert!(server.receive_buffered() > whole / 2, "{} buffered", server.receive_buffered());
}

#[test]
fn a_forged_proof_is_counted_as_wrong_secret() {
    let mut server = Endpoint::new(config(b"right"));
    let addr = server.listen_udp("127.0.0.1:0").unwrap();
    // A raw client that sends a valid HELLO, then a PROOF of 32 random bytes.
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.connect(addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut hello = vec![0u8; wire::HEADER_LEN + wire::HELLO_BODY_LEN];
    wire::Hello { nonce: [7; 16], conn_id: 5, window: 64, datagram_max: 1400, flags: 1, credit: 1 << 20, node: 9 }
        .write_body(wire::Kind::Hello, &mut hello, wire::HEADER_LEN);
    wire::finish(&mut hello, wire::Kind::Hello, 0, 0);
    raw.send(&hello).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 2048];
    let challenge = loop {
        let _ = server.try_accept();
        if let Ok(n) = raw.recv(&mut buf) {
            break buf[..n].to_vec();
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no challenge");
    };
    let server_id = wire::parse_header(&challenge)
        .map(|_| wire::Hello::read_body(wire::Kind::Challenge, &challenge, wire::HEADER_LEN).unwrap().conn_id);
    let mut proof = vec![0u8; wire::HEADER_LEN + wire::PROOF_BODY_LEN];
    proof[wire::HEADER_LEN..].copy_from_slice(&[0x42; 32]);
    wire::finish(&mut proof, wire::Kind::Proof, server_id.unwrap(), 0);
    raw.send(&proof).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.udp_counters().wrong_secret == 0 && Instant::now() < deadline {
        assert!(server.try_accept().unwrap().is_none());
    }
    assert_eq!(server.udp_counters().wrong_secret, 1);
}

/// HELLOs that never go further (forged source addresses, say) fill the listener's
/// handshake slots; each new HELLO closes the oldest, so a real client still connects
/// rather than waiting for a slot to time out.
#[test]
fn hellos_that_never_finish_do_not_lock_out_a_real_client() {
    let mut server = Endpoint::new(config(b"k"));
    let addr = server.listen_udp("127.0.0.1:0").unwrap();
    let strangers: Vec<UdpSocket> = (0..ulnet_core::transport::udp::listener::PENDING_MAX as u32 + 16)
        .map(|i| {
            let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut hello = vec![0u8; wire::HEADER_LEN + wire::HELLO_BODY_LEN];
            let body = wire::Hello {
                nonce: [7; 16],
                conn_id: i + 1,
                window: 64,
                datagram_max: 1400,
                flags: 1,
                credit: 1 << 20,
                node: i,
            };
            body.write_body(wire::Kind::Hello, &mut hello, wire::HEADER_LEN);
            wire::finish(&mut hello, wire::Kind::Hello, 0, 0);
            raw.send_to(&hello, addr).unwrap();
            raw
        })
        .collect();
    for _ in 0..10 {
        assert!(server.try_accept().unwrap().is_none());
        std::thread::sleep(Duration::from_millis(5));
    }
    let a = addr.to_string();
    // Well under the 5 s a stranger's slot would take to time out.
    let client =
        std::thread::spawn(move || Endpoint::new(config(b"k")).connect_udp(&a, Duration::from_secs(2)).is_ok());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut accepted = false;
    while !accepted && Instant::now() < deadline {
        accepted = server.try_accept().unwrap().is_some();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(client.join().unwrap() && accepted, "the real client connected");
    drop(strangers);
}

/// A client made of a plain socket and the protocol machine, so that the test can also
/// send raw datagrams from the channel's own address.
struct RawClient {
    socket: UdpSocket,
    conn: Connection,
    buf: Vec<u8>,
    sent: Vec<Vec<u8>>,
}

impl RawClient {
    fn connect(addr: std::net::SocketAddr, secret: &[u8]) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(addr).unwrap();
        socket.set_nonblocking(true).unwrap();
        let config = UdpConfig { secret: secret.to_vec(), ..UdpConfig::lan() };
        let conn = Connection::client(config, Instant::now(), 0x77, [9; 16], NodeId::UNKNOWN);
        let mut c = Self { socket, conn, buf: vec![0; wire::DATAGRAM_LIMIT], sent: Vec::new() };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !c.conn.is_established() {
            assert!(Instant::now() < deadline, "raw client handshake");
            c.drive();
        }
        c
    }

    fn drive(&mut self) {
        let now = Instant::now();
        while let Some(n) = self.conn.poll_transmit(now, &mut self.buf) {
            self.socket.send(&self.buf[..n]).unwrap();
            self.sent.push(self.buf[..n].to_vec());
        }
        while let Ok(n) = self.socket.recv(&mut self.buf) {
            let d = self.buf[..n].to_vec();
            self.conn.handle_datagram(now, &d);
        }
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
        std::thread::sleep(Duration::from_micros(200));
    }

    fn send(&mut self, m: &[u8]) {
        assert_eq!(self.conn.send(&[m]).unwrap(), SendOutcome::Done);
        self.conn.flush();
        self.drive();
    }
}

#[test]
fn malformed_truncated_replayed_stranger_and_wrong_secret_datagrams_are_dropped_and_counted() {
    let mut server = Endpoint::new(config(b"k"));
    let addr = server.listen_udp("127.0.0.1:0").unwrap();
    let server_thread = std::thread::spawn(move || {
        server.accept(Duration::from_secs(5)).unwrap();
        server
    });
    let mut raw = RawClient::connect(addr, b"k");
    let mut server = server_thread.join().unwrap();
    raw.send(b"first");
    let (got, _) = receive_whole(&mut server, 1, Duration::from_secs(5));
    assert_eq!(got, vec![b"first".to_vec()]);
    let data = raw
        .sent
        .iter()
        .rev()
        .find(|d| wire::parse_header(d).is_ok_and(|h| h.kind == wire::Kind::Data))
        .unwrap()
        .clone();
    let base = server.udp_counters();
    // From the channel's own address, so the datagrams reach the channel, not the listener.
    let mut random = vec![0u8; 100];
    random.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 37 + 11) as u8);
    raw.socket.send(&random).unwrap(); // malformed: no magic
    raw.socket.send(&data[..data.len() - 3]).unwrap(); // truncated
    raw.socket.send(&data).unwrap(); // replayed
    let mut other_version = data.clone();
    other_version[2] = 99;
    raw.socket.send(&other_version).unwrap(); // wrong version
    let mut stranger = data.clone();
    stranger[8..12].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    wire::finish(&mut stranger, wire::Kind::Data, 0xdead_beef, 0);
    raw.socket.send(&stranger).unwrap(); // another connection's id
    let mut forged = data.clone();
    let conn_id = wire::parse_header(&data).unwrap().conn_id;
    wire::finish(&mut forged, wire::Kind::Data, conn_id, 0x1234_5678);
    raw.socket.send(&forged).unwrap(); // right id, checksum without the session secret
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut c = server.udp_counters();
    while c.dropped() < base.dropped() + 6 && Instant::now() < deadline {
        server.poll(16, |e| panic!("nothing may be delivered from garbage: {e:?}"));
        c = server.udp_counters();
    }
    assert_eq!(c.malformed, base.malformed + 1, "{c:?}");
    assert_eq!(c.truncated, base.truncated + 1, "{c:?}");
    assert_eq!(c.replayed, base.replayed + 1, "{c:?}");
    assert_eq!(c.wrong_version, base.wrong_version + 1, "{c:?}");
    assert_eq!(c.stranger, base.stranger + 1, "{c:?}");
    assert_eq!(c.bad_checksum, base.bad_checksum + 1, "{c:?}");
    // A stranger's socket aimed at the listening port is counted by the listener.
    let outsider = UdpSocket::bind("127.0.0.1:0").unwrap();
    outsider.send_to(&data, addr).unwrap();
    outsider.send_to(b"hello?", addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.udp_counters().dropped() < c.dropped() + 2 && Instant::now() < deadline {
        let _ = server.try_accept();
    }
    assert_eq!(server.udp_counters().dropped(), c.dropped() + 2);
    // The channel still works, in order.
    raw.send(b"second");
    let (got, down) = receive_whole(&mut server, 1, Duration::from_secs(5));
    assert_eq!((got, down), (vec![b"second".to_vec()], None));
}

#[test]
fn vanished_peer_is_a_failure_within_the_peer_timeout() {
    let peer_timeout = Duration::from_millis(1500);
    let short = || EndpointConfig { udp: UdpConfig { peer_timeout, ..UdpConfig::lan() }, ..Default::default() };
    if let Some(addr) = util::child_role() {
        // Child: one good message, then exit without closing.
        let mut ep = Endpoint::new(short());
        let ch = ep.connect_udp(&addr, Duration::from_secs(5)).unwrap();
        assert_eq!(ep.send(ch, &[b"last words"]).unwrap(), SendOutcome::Done);
        ep.flush_sends();
        std::thread::sleep(Duration::from_millis(50));
        ep.poll(16, |_| {});
        std::process::exit(0);
    }
    let mut server = Endpoint::new(short());
    let addr = server.listen_udp("127.0.0.1:0").unwrap().to_string();
    let mut child = util::spawn_child("vanished_peer_is_a_failure_within_the_peer_timeout", &addr, &[]);
    server.accept(Duration::from_secs(5)).unwrap();
    let (got, _) = receive_whole(&mut server, 1, Duration::from_secs(5));
    assert_eq!(got, vec![b"last words".to_vec()]);
    child.wait().unwrap();
    let gone = Instant::now();
    // Blocking mode: the endpoint sleeps and its timerfd wakes it for keep-alives and the
    // peer timeout.
    let mut down = None;
    while down.is_none() && gone.elapsed() < Duration::from_secs(10) {
        server.wait(Some(Duration::from_secs(5))).unwrap();
        server.poll(16, |e| {
            if let Event::ChannelDown { error, .. } = e {
                down = Some(error);
            }
        });
    }
    let after = gone.elapsed();
    assert!(matches!(down, Some(ChannelError::PeerFailed(_))), "{down:?}");
    assert!(after <= peer_timeout + Duration::from_millis(800), "reported after {after:?}");
    assert!(server.counters().sleeps >= 2, "the endpoint slept between timer wake-ups");
}

/// A sender blocked on credit seals at most an eighth of the peer's grant (capped at
/// `unsent_max`) ahead of what it may transmit, although it has free send slots (without a
/// bound it filled them all, 16 MiB, and the kernel later copied them out of memory long
/// evicted from the caches), and goes on as soon as credit comes.
fn sender_blocked_on_credit_seals_at_most(credit: u64, unsent_max: u64, bound: u64) {
    let config = UdpConfig {
        secret: b"k".to_vec(),
        credit_bytes: credit as u32,
        unsent_max: unsent_max as u32,
        ..UdpConfig::lan()
    };
    let window = u64::from(config.window_packets);
    let (mut client, server) = handshake_in_memory_with(config, |_| {});
    let mut server = server.expect("the server answers");
    let chunk = vec![7u8; client.fragment_max()];
    let packet = chunk.len() as u64 + 64;
    let mut t = Instant::now();
    pump(&mut client, &mut server, &mut t, &chunk);
    assert!(server.receive_buffered() + packet > credit, "the credit is used: {}", server.receive_buffered());
    let unsent = client.unsent_bytes();
    assert!(unsent >= bound && unsent < bound + packet, "{unsent} bytes sealed ahead of the credit, bound {bound}");
    let (waiting, in_flight) = client.send_backlog();
    assert!(waiting + in_flight < window / 2, "the bound stopped the sender, not its {window} slots");
    assert_eq!(client.send(&[&chunk]).unwrap(), SendOutcome::NoResource);
    assert!(client.counters().credit_stalls >= 1, "the sender waited for credit");
    // The receiver consumes: its window update lets the waiting packets and new ones go.
    let sent_before = client.counters().packets_sent;
    server.poll_recv(usize::MAX, &mut |_, _| {}).unwrap();
    pump(&mut client, &mut server, &mut t, &chunk);
    let sent = client.counters().packets_sent - sent_before;
    assert!(
        (sent + 1) * packet > credit && sent * packet > unsent + packet,
        "{sent} packets went out after the window update"
    );
    assert!(client.unsent_bytes() < bound + packet, "{} bytes sealed ahead", client.unsent_bytes());
}

/// One of eight streams sharing a 16 MiB budget has a 2 MiB grant: it seals 256 KiB ahead,
/// not the 1 MiB ceiling.
#[test]
fn a_sender_with_a_small_grant_seals_an_eighth_of_it_ahead() {
    sender_blocked_on_credit_seals_at_most(2 << 20, 1 << 20, 256 << 10);
}

/// A lone stream with a 16 MiB grant: an eighth would be 2 MiB, so the `unsent_max`
/// ceiling (1 MiB) applies.
#[test]
fn a_sender_with_a_large_grant_seals_at_most_unsent_max_ahead() {
    sender_blocked_on_credit_seals_at_most(16 << 20, 1 << 20, 1 << 20);
}

/// The grant the sender follows is the receiver's share of its budget, learned from its
/// acks after the HELLO's whole credit: sharing among four channels cuts the fill-ahead
/// from `unsent_max` to an eighth of a quarter of the budget.
#[test]
fn the_fill_ahead_follows_a_shared_receive_budget() {
    let (mut client, server) = handshake_in_memory(|_| {});
    let mut server = server.expect("the server answers");
    let whole = u64::from(UdpConfig::lan().credit_bytes);
    server.share_receive_budget(4);
    let chunk = vec![3u8; client.fragment_max()];
    let packet = chunk.len() as u64 + 64;
    let mut t = Instant::now();
    // The HELLO granted the whole budget; use it up, then consume, so that the grants
    // from here on are the quarter share.
    pump(&mut client, &mut server, &mut t, &chunk);
    server.poll_recv(usize::MAX, &mut |_, _| {}).unwrap();
    pump(&mut client, &mut server, &mut t, &chunk);
    let bound = whole / 4 / 8;
    let unsent = client.unsent_bytes();
    assert!(unsent >= bound && unsent < bound + packet, "{unsent} bytes sealed ahead, bound {bound}");
}
