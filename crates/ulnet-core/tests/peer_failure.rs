//! A peer that dies mid-stream: the survivor gets an error, not a hang.

mod util;

use std::time::{Duration, Instant};
use ulnet_core::{ChannelError, Endpoint, EndpointConfig, Event};
use util::*;

/// The child streams messages (large and small) until it is killed.
fn stream_forever() {
    let name = std::env::var("ULNET_TEST_NAME").unwrap();
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = ep.connect_shm(&name, Duration::from_secs(20)).unwrap();
    let big = vec![7u8; 300_000];
    for i in 0u64.. {
        let m: &[u8] = if i % 3 == 0 { &big } else { b"small message" };
        if send_blocking(&mut ep, ch, &[m], Duration::from_secs(60)).is_err() {
            return;
        }
    }
}

/// The child receives and never sends, until it is killed.
fn receive_forever() {
    let name = std::env::var("ULNET_TEST_NAME").unwrap();
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = ep.connect_shm(&name, Duration::from_secs(20)).unwrap();
    let _ = ch;
    loop {
        ep.poll(16, |_| {});
    }
}

#[test]
fn receiver_sees_error_when_sender_is_killed_mid_stream() {
    match child_role().as_deref() {
        Some("streamer") => return stream_forever(),
        Some(_) => return,
        None => {}
    }
    let name = unique_name("kill-sender");
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let mut child =
        spawn_child("receiver_sees_error_when_sender_is_killed_mid_stream", "streamer", &[("ULNET_TEST_NAME", name)]);
    ep.accept(Duration::from_secs(20)).unwrap();
    let mut received = 0u64;
    let mut killed_at = None;
    let mut down = None;
    let start = Instant::now();
    while down.is_none() {
        ep.poll(64, |e| match e {
            Event::Message { .. } => received += 1,
            Event::ChannelDown { error, .. } => down = Some(error),
            Event::SendComplete { .. } => {}
        });
        if killed_at.is_none() && received >= 10_000 {
            child.kill().unwrap();
            child.wait().unwrap();
            killed_at = Some(Instant::now());
        }
        assert!(start.elapsed() < Duration::from_secs(60), "hung: no error after the peer died");
    }
    let killed_at = killed_at.unwrap_or_else(|| {
        child.kill().unwrap();
        child.wait().unwrap();
        panic!("the channel went down before the peer was killed: {down:?}")
    });
    let detected = killed_at.elapsed();
    assert!(matches!(down, Some(ChannelError::PeerFailed(_))), "got {down:?}");
    eprintln!("peer death detected {detected:?} after kill, {received} deliveries before");
}

#[test]
fn sender_blocked_on_full_ring_sees_error_when_receiver_is_killed() {
    match child_role().as_deref() {
        Some("receiver") => return receive_forever(),
        Some(_) => return,
        None => {}
    }
    let name = unique_name("kill-receiver");
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let mut child = spawn_child(
        "sender_blocked_on_full_ring_sees_error_when_receiver_is_killed",
        "receiver",
        &[("ULNET_TEST_NAME", name)],
    );
    let ch = ep.accept(Duration::from_secs(20)).unwrap();
    let payload = vec![1u8; 100_000];
    for _ in 0..100 {
        send_blocking(&mut ep, ch, &[&payload], Duration::from_secs(20)).unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    let outcome = loop {
        if let Err(e) = send_blocking(&mut ep, ch, &[&payload], Duration::from_secs(30)) {
            break e;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "sends kept succeeding into a dead peer");
    };
    assert!(outcome.contains("peer"), "unexpected error: {outcome}");
}

#[test]
fn clean_close_is_reported_as_closed_after_all_data() {
    if let Some(role) = child_role() {
        if role == "closer" {
            let name = std::env::var("ULNET_TEST_NAME").unwrap();
            let mut ep = Endpoint::new(EndpointConfig::default());
            let ch = ep.connect_shm(&name, Duration::from_secs(20)).unwrap();
            for i in 0u32..1000 {
                send_blocking(&mut ep, ch, &[&i.to_le_bytes()], Duration::from_secs(20)).unwrap();
            }
            ep.close(ch);
        }
        return;
    }
    let name = unique_name("close");
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let mut child =
        spawn_child("clean_close_is_reported_as_closed_after_all_data", "closer", &[("ULNET_TEST_NAME", name)]);
    ep.accept(Duration::from_secs(20)).unwrap();
    let mut next = 0u32;
    let mut down = None;
    let start = Instant::now();
    while down.is_none() && start.elapsed() < Duration::from_secs(30) {
        ep.poll(64, |e| match e {
            Event::Message { data, .. } => {
                assert_eq!(data, next.to_le_bytes());
                next += 1;
            }
            Event::ChannelDown { error, .. } => down = Some(error),
            Event::SendComplete { .. } => {}
        });
    }
    child.wait().unwrap();
    assert_eq!(next, 1000, "everything sent before the close arrived");
    assert_eq!(down, Some(ChannelError::Closed));
}
