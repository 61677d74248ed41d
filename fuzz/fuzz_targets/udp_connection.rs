//! The reliable-UDP protocol machine under a peer that knows the session: a client and a
//! server shake hands in memory, then the input drives them step by step — messages sent,
//! packets delivered either way, time passing, deliveries taken — while forged datagrams
//! (raw, or with header and checksum made right for the session) reach the server.
//! Nothing may panic, and the server never holds more than its receive slots' worth.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};
use ulnet_core::transport::udp::wire::{self, Kind};
use ulnet_core::transport::udp::{Connection, UdpConfig};
use ulnet_core::NodeId;

const KINDS: [Kind; 6] = [Kind::Hello, Kind::Challenge, Kind::Proof, Kind::Ready, Kind::Data, Kind::Ack];

fuzz_target!(|data: &[u8]| {
    let config = UdpConfig { secret: b"fuzz".to_vec(), ..UdpConfig::lan() };
    let mut now = Instant::now();
    let mut client = Connection::client(config.clone(), now, 0x11, [1; 16], NodeId(3));
    let mut buf = vec![0u8; wire::DATAGRAM_LIMIT];
    let n = client.poll_transmit(now, &mut buf).expect("a hello");
    let held_max = u64::from(config.window_packets) * config.datagram_max as u64;
    let mut server = Connection::server(config, now, 0x22, [2; 16], NodeId(7), &buf[..n]).expect("a valid hello");
    for _ in 0..4 {
        exchange(&mut server, &mut client, now, &mut buf);
        exchange(&mut client, &mut server, now, &mut buf);
    }
    assert!(client.is_established() && server.is_established(), "the handshake completes");
    let salt = server.session_salt();
    let mut input = data;
    while let Some((&op, rest)) = input.split_first() {
        input = rest;
        match op % 7 {
            0 => {
                let len = usize::from(take_u8(&mut input)) * 64;
                let _ = client.send(&[&vec![op; len]]);
                client.flush();
            }
            1 => exchange(&mut client, &mut server, now, &mut buf),
            2 => exchange(&mut server, &mut client, now, &mut buf),
            3 | 4 => {
                let len = (usize::from(take_u8(&mut input)) * 8).min(input.len());
                let (bytes, rest) = input.split_at(len);
                input = rest;
                let mut d = bytes.to_vec();
                if op % 7 == 4 && d.len() >= wire::HEADER_LEN {
                    let kind = KINDS[usize::from(op / 7) % KINDS.len()];
                    let s = if kind.is_session() { salt } else { 0 };
                    wire::finish(&mut d, kind, server.local_id(), s);
                }
                server.handle_datagram(now, &d);
            }
            5 => {
                now += Duration::from_micros(u64::from(take_u8(&mut input)) * 500);
                client.handle_timeout(now);
                server.handle_timeout(now);
            }
            _ => {
                let _ = server.poll_recv(64, &mut |_, _| {});
                let _ = client.poll_recv(64, &mut |_, _| {});
            }
        }
        assert!(server.receive_buffered() <= held_max, "the server holds no more than its slots' worth");
    }
});

/// Delivers every datagram `from` has to send to `to`.
fn exchange(from: &mut Connection, to: &mut Connection, now: Instant, buf: &mut [u8]) {
    while let Some(n) = from.poll_transmit(now, buf) {
        to.handle_datagram(now, &buf[..n]);
    }
}

fn take_u8(input: &mut &[u8]) -> u8 {
    match input.split_first() {
        Some((&b, rest)) => {
            *input = rest;
            b
        }
        None => 0,
    }
}
