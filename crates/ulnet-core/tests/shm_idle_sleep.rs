//! An idle shared-memory receiver really sleeps: after a few small messages (far less than
//! the batch in which consumed ring space is released), `wait` must block in the kernel
//! rather than find the consumed, not yet released record and return at once — which made
//! every idle shm server spin.

use std::time::{Duration, Instant};
use ulnet_core::{Endpoint, EndpointConfig, Event};

#[test]
fn idle_receiver_sleeps_after_small_messages() {
    let name = format!("idle-sleep-{}-{:x}", std::process::id(), rand::random::<u32>());
    let mut a = Endpoint::new(EndpointConfig::default());
    a.listen_shm(&name).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        let mut b = Endpoint::new(EndpointConfig::default());
        let ch = b.connect_shm(&name, Duration::from_secs(10)).unwrap();
        for _ in 0..3 {
            assert_eq!(b.send(ch, &[b"hello"]).unwrap(), ulnet_core::SendOutcome::Done);
        }
        // Keep the channel open until the receiver is done waiting.
        rx.recv().unwrap();
    });
    a.accept(Duration::from_secs(10)).unwrap();
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got < 3 {
        a.poll(16, |e| {
            if let Event::Message { .. } = e {
                got += 1
            }
        });
        assert!(Instant::now() < deadline);
    }
    let t0 = Instant::now();
    a.wait(Some(Duration::from_millis(200))).unwrap();
    let waited = t0.elapsed();
    tx.send(()).unwrap();
    sender.join().unwrap();
    assert_eq!(a.counters().sleeps, 1, "the receiver slept in the kernel");
    assert!(waited >= Duration::from_millis(150), "wait returned after {waited:?} with nothing to receive");
}
