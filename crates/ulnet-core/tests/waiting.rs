//! Blocking waits, upcalls and completion queues shared by several endpoints.

mod util;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_core::{CompletionKind, CompletionQueue, Endpoint, EndpointConfig, Event, Upcall};
use util::*;

/// Child: connects to `ULNET_TEST_NAME`, sleeps, sends `count` messages a little apart.
fn slow_sender() {
    let name = std::env::var("ULNET_TEST_NAME").unwrap();
    let count: u64 = std::env::var("ULNET_TEST_COUNT").unwrap().parse().unwrap();
    let mut ep = Endpoint::new(EndpointConfig::default());
    let ch = ep.connect_shm(&name, Duration::from_secs(20)).unwrap();
    for i in 0..count {
        std::thread::sleep(Duration::from_millis(20));
        send_blocking(&mut ep, ch, &[&i.to_le_bytes()], Duration::from_secs(20)).unwrap();
    }
    // Stay until the receiver hangs up, so the test sees messages, not a close.
    while ep.poll(1, |_| {}) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn start(test: &str, count: u64) -> (Endpoint, std::process::Child) {
    let name = unique_name(test);
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let child = spawn_child(test, "sender", &[("ULNET_TEST_NAME", name), ("ULNET_TEST_COUNT", count.to_string())]);
    ep.accept(Duration::from_secs(20)).unwrap();
    (ep, child)
}

#[test]
fn blocking_wait_sleeps_in_the_kernel_and_wakes_on_each_message() {
    if child_role().is_some() {
        return slow_sender();
    }
    let (mut ep, mut child) = start("blocking_wait_sleeps_in_the_kernel_and_wakes_on_each_message", 5);
    let mut got = 0;
    let mut futile_wakeups = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while got < 5 {
        ep.wait(Some(Duration::from_secs(10))).unwrap();
        let polled = ep.poll(16, |e| {
            if let Event::Message { .. } = e {
                got += 1;
            }
        });
        if polled == 0 {
            futile_wakeups += 1;
        }
        assert!(Instant::now() < deadline, "messages did not wake the waiter");
    }
    assert!(ep.counters().sleeps >= 1, "the endpoint never slept; it spun");
    // Consumed records that are not yet handed back to the sender must not read as news:
    // otherwise every wait after the first message returns at once, and the waiter spins.
    assert!(futile_wakeups < 20, "{futile_wakeups} waits returned with nothing to receive");
    drop(ep);
    child.wait().unwrap();
}

#[test]
fn nonempty_upcall_runs_handlers_and_can_be_disabled() {
    if child_role().is_some() {
        return slow_sender();
    }
    let (mut ep, mut child) = start("nonempty_upcall_runs_handlers_and_can_be_disabled", 6);
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    ep.set_upcall_nonempty(move |e| {
        if let Event::Message { .. } = e {
            s.fetch_add(1, Ordering::Relaxed);
        }
    });
    ep.enable_upcall(Upcall::NonEmpty, true);
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.load(Ordering::Relaxed) < 3 {
        ep.wait(Some(Duration::from_secs(10))).unwrap();
        assert!(Instant::now() < deadline);
    }
    ep.enable_upcall(Upcall::NonEmpty, false);
    let before = seen.load(Ordering::Relaxed);
    let mut polled = 0;
    while polled < 6 - before {
        ep.wait(Some(Duration::from_secs(10))).unwrap();
        ep.poll(16, |e| {
            if let Event::Message { .. } = e {
                polled += 1;
            }
        });
        assert!(Instant::now() < deadline);
    }
    assert_eq!(seen.load(Ordering::Relaxed), before, "a disabled upcall must not run");
    drop(ep);
    child.wait().unwrap();
}

#[test]
fn almost_full_upcall_fires_when_the_receiver_falls_behind() {
    if child_role().as_deref() == Some("sender") {
        let name = std::env::var("ULNET_TEST_NAME").unwrap();
        let mut ep = Endpoint::new(EndpointConfig::default());
        let ch = ep.connect_shm(&name, Duration::from_secs(20)).unwrap();
        // Fill the receiver's ring with small inline messages until it pushes back.
        let msg = [3u8; 200];
        while ep.send(ch, &[&msg]).unwrap() == ulnet_core::SendOutcome::Done {}
        while ep.poll(1, |_| {}) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        return;
    }
    if child_role().is_some() {
        return;
    }
    let name = unique_name("almost-full");
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let mut child =
        spawn_child("almost_full_upcall_fires_when_the_receiver_falls_behind", "sender", &[("ULNET_TEST_NAME", name)]);
    let ch = ep.accept(Duration::from_secs(20)).unwrap();
    let fired = Arc::new(AtomicU64::new(0));
    let f = fired.clone();
    ep.set_upcall_almost_full(move |c| {
        assert_eq!(c, ch);
        f.fetch_add(1, Ordering::Relaxed);
    });
    ep.enable_upcall(Upcall::AlmostFull, true);
    let deadline = Instant::now() + Duration::from_secs(30);
    while fired.load(Ordering::Relaxed) == 0 {
        ep.wait(Some(Duration::from_millis(100))).unwrap();
        assert!(Instant::now() < deadline, "almost-full upcall never fired");
    }
    drop(ep);
    child.wait().unwrap();
}

#[test]
fn one_completion_queue_serves_several_endpoints() {
    if child_role().is_some() {
        return slow_sender();
    }
    let cq = CompletionQueue::new(64);
    let (mut a, mut child_a) = start("one_completion_queue_serves_several_endpoints", 3);
    let (mut b, mut child_b) = start("one_completion_queue_serves_several_endpoints", 3);
    a.attach_cq(&cq);
    b.attach_cq(&cq);
    let mut per_endpoint = std::collections::HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut completions = Vec::new();
    while per_endpoint.values().sum::<u64>() < 6 {
        cq.wait(Some(Duration::from_secs(10))).unwrap();
        completions.clear();
        cq.poll(&mut completions, 16);
        for c in &completions {
            assert_eq!(c.kind, CompletionKind::Receive);
            let ep = if c.endpoint == a.id() { &mut a } else { &mut b };
            let mut n = 0;
            ep.poll_channel(c.channel, 16, |e| {
                if let Event::Message { .. } = e {
                    n += 1;
                }
            });
            *per_endpoint.entry(c.endpoint).or_insert(0) += n;
        }
        assert!(Instant::now() < deadline, "completion queue missed messages: {per_endpoint:?}");
    }
    assert_eq!(per_endpoint.get(&a.id()), Some(&3));
    assert_eq!(per_endpoint.get(&b.id()), Some(&3));
    drop(a);
    drop(b);
    child_a.wait().unwrap();
    child_b.wait().unwrap();
}

#[test]
fn posted_send_streams_a_64_mib_message() {
    if child_role().as_deref() == Some("sender") {
        let name = std::env::var("ULNET_TEST_NAME").unwrap();
        let mut ep = Endpoint::new(EndpointConfig::default());
        let ch = ep.connect_shm(&name, Duration::from_secs(20)).unwrap();
        let data: Vec<u8> = (0..64u64 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
        assert!(matches!(ep.post_send(ch, data, 42).unwrap(), ulnet_core::SendOutcome::InProgress(42)));
        let mut done = false;
        while !done {
            ep.poll(16, |e| {
                if let Event::SendComplete { token: 42, .. } = e {
                    done = true;
                }
            });
        }
        ep.close(ch);
        return;
    }
    if child_role().is_some() {
        return;
    }
    let name = unique_name("big");
    let mut ep = Endpoint::new(EndpointConfig::default());
    ep.listen_shm(&name).unwrap();
    let mut child = spawn_child("posted_send_streams_a_64_mib_message", "sender", &[("ULNET_TEST_NAME", name)]);
    ep.accept(Duration::from_secs(20)).unwrap();
    let mut received = 0u64;
    let mut whole = 0;
    let mut bad = 0u64;
    let mut down = false;
    while !down {
        ep.poll(64, |e| match e {
            Event::Message { data, message_len, offset, .. } => {
                assert_eq!(message_len, 64 << 20);
                assert_eq!(offset, received, "fragments arrive in order");
                for (k, &b) in data.iter().enumerate() {
                    let i = offset + k as u64;
                    bad += u64::from(b != (i * 7 + i / 4096) as u8);
                }
                received += data.len() as u64;
                whole += u64::from(offset + data.len() as u64 == message_len);
            }
            Event::ChannelDown { .. } => down = true,
            Event::SendComplete { .. } => {}
        });
    }
    assert!(child.wait().unwrap().success());
    assert_eq!((received, whole, bad), (64 << 20, 1, 0));
}
