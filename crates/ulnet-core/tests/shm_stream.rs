//! A million messages of random sizes between two processes: none lost, duplicated,
//! reordered or corrupted; a third of those that fit one buffer are packed in place
//! (`Endpoint::send_packed`), between copied ones.

mod util;

use rand::SeedableRng;
use std::time::Duration;
use ulnet_core::{Endpoint, EndpointConfig, Event};
use util::*;

const MESSAGES: u64 = 1_000_000;
const SEED: u64 = 0x5eed_0001;

#[test]
fn million_random_messages_arrive_in_order_exactly_once() {
    if child_role().as_deref() == Some("sender") {
        return sender();
    }
    if child_role().is_some() {
        return;
    }
    let name = unique_name("stream");
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let mut child =
        spawn_child("million_random_messages_arrive_in_order_exactly_once", "sender", &[("ULNET_TEST_NAME", name)]);
    let ch = ep.accept(Duration::from_secs(20)).expect("sender connects");
    let mut expect = rand_chacha::ChaCha8Rng::seed_from_u64(SEED);
    let mut seq = 0u64;
    let mut assembling: Vec<u8> = Vec::new();
    let mut bytes = 0u64;
    let mut failure: Option<String> = None;
    let mut closed = false;
    while !closed && failure.is_none() {
        ep.poll(256, |e| match e {
            Event::Message { data, message_len, offset, .. } => {
                if offset == 0 {
                    assembling.clear();
                }
                if offset != assembling.len() as u64 {
                    failure = Some(format!("fragment at {offset} after {} bytes", assembling.len()));
                    return;
                }
                assembling.extend_from_slice(data);
                if offset + data.len() as u64 == message_len {
                    let want = make_message(&mut expect, seq);
                    if let Err(e) = check_message(&assembling, seq, want.len()) {
                        failure = Some(e);
                    }
                    bytes += message_len;
                    seq += 1;
                }
            }
            Event::ChannelDown { error, .. } => {
                closed = true;
                if error != ulnet_core::ChannelError::Closed {
                    failure = Some(format!("channel failed: {error}"));
                }
            }
            Event::SendComplete { .. } => {}
        });
    }
    assert!(child.wait().unwrap().success(), "sender failed");
    assert_eq!(failure, None);
    assert_eq!(seq, MESSAGES, "every message arrived exactly once");
    let _ = ch;
    eprintln!("received {seq} messages, {:.1} MB", bytes as f64 / 1e6);
}

fn sender() {
    let name = std::env::var("ULNET_TEST_NAME").unwrap();
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = ep.connect_shm(&name, Duration::from_secs(20)).unwrap();
    let mut gen = rand_chacha::ChaCha8Rng::seed_from_u64(SEED);
    let mut split = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let fragment_max = ep.caps(ch).unwrap().fragment_max;
    let mut packed = 0u64;
    for seq in 0..MESSAGES {
        let m = make_message(&mut gen, seq);
        let gather = random_gather(&mut split, &m);
        if seq % 3 == 0 && m.len() <= fragment_max {
            send_packed_blocking(&mut ep, ch, &gather);
            packed += 1;
        } else {
            send_blocking(&mut ep, ch, &gather, Duration::from_secs(60)).unwrap();
        }
    }
    assert!(packed > MESSAGES / 4, "{packed} packed");
    ep.close(ch);
}

/// Sends `gather` as one message packed in place, polling while there is no room.
fn send_packed_blocking(ep: &mut Endpoint, ch: ulnet_core::ChannelId, gather: &[&[u8]]) {
    let len = gather.iter().map(|p| p.len()).sum();
    let mut pack = |dst: &mut [u8]| {
        let mut at = 0;
        for piece in gather {
            dst[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ep.send_packed(ch, len, &mut pack).unwrap() != ulnet_core::SendOutcome::Done {
        ep.poll(16, |_| {});
        assert!(std::time::Instant::now() < deadline, "send timed out");
    }
}
