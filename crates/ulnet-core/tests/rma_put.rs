//! Put and get: data lands where it was put and nowhere else, large operations are split
//! and reassembled, completions and flushes come in order, a fence orders operations across
//! targets, notifications follow the notify mode, and aligned words are never torn — over
//! every transport.

mod rma_util;

use rand::{Rng, SeedableRng};
use rma_util::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_core::rma::{
    Access, AccessKind, Completed, NodeId, Notification, NotifyMode, Rights, Rma, RmaCompletion, RmaError, RmaOutcome,
    PUT_INLINE_MAX,
};

/// A completion as the tests keep it: token, and the data of a get or atomic.
type Owned = (u64, Result<Option<Vec<u8>>, RmaError>);

/// Polls until `n` completions arrived; returns them in arrival order.
fn completions(me: &mut Rma, n: usize) -> Vec<Owned> {
    let mut got = Vec::new();
    let deadline = Instant::now() + T;
    while got.len() < n {
        me.poll(64, |c: RmaCompletion<'_>| {
            let r = c.result.map(|v| match v {
                Completed::Get(d) => Some(d.to_vec()),
                Completed::Atomic(w) => Some(w.to_ne_bytes().to_vec()),
                Completed::Put | Completed::Flush => None,
            });
            got.push((c.token, r));
        });
        assert!(Instant::now() < deadline, "{} of {n} completions", got.len());
    }
    got
}

fn puts_and_gets_round_trip_at_random_places(mode: Mode) {
    const LEN: usize = 512 << 10;
    let mut t = target(1, "roundtrip");
    let seg = patterned(&mut t, "s", LEN, Access::everyone(Rights::ALL), NotifyMode::Never);
    let mut model = snapshot(&seg);
    let (mut me, _, r) = importer(2, &t, "s", mode);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for round in 0..40 {
        // A batch of puts in flight at once, then their completions.
        let mut in_flight = 0;
        for i in 0..16u64 {
            let len = if rng.gen_ratio(1, 10) { rng.gen_range(64 << 10..300 << 10) } else { rng.gen_range(1..3000) };
            let off = rng.gen_range(0..LEN - len);
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            model[off..off + len].copy_from_slice(&data);
            loop {
                match me.put(&r, off as u64, &data, i).unwrap() {
                    RmaOutcome::Done(()) => break,
                    RmaOutcome::InProgress(t) => {
                        assert_eq!(t, i);
                        in_flight += 1;
                        break;
                    }
                    RmaOutcome::NoResource => {
                        in_flight -= completions(&mut me, 1).len();
                    }
                }
            }
        }
        for (_, result) in completions(&mut me, in_flight) {
            assert_eq!(result, Ok(None));
        }
        assert!(snapshot(&seg) == model, "{mode:?} round {round}: owner memory differs from the model");
        // Gets, blocking and not, of random ranges (some split into several messages).
        for _ in 0..8 {
            let len = if rng.gen_ratio(1, 4) { rng.gen_range(64 << 10..LEN) } else { rng.gen_range(1..5000) };
            let off = rng.gen_range(0..=LEN - len);
            let mut buf = vec![0u8; len];
            me.get_blocking(&r, off as u64, &mut buf, T).unwrap();
            assert!(buf == model[off..off + len], "{mode:?}: get of {len} at {off}");
            match me.get(&r, off as u64, &mut buf, 99).unwrap() {
                RmaOutcome::Done(()) => assert!(buf == model[off..off + len]),
                RmaOutcome::InProgress(99) => {
                    let got = completions(&mut me, 1);
                    assert_eq!(got[0].0, 99);
                    assert!(got[0].1.as_ref().unwrap().as_deref() == Some(&model[off..off + len]));
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

fn put_inline_takes_small_puts_only(mode: Mode) {
    let mut t = target(1, "inline");
    let seg = patterned(&mut t, "s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never);
    let (mut me, _, r) = importer(2, &t, "s", mode);
    let small = [5u8; PUT_INLINE_MAX];
    match me.put_inline(&r, 100, &small, 1).unwrap() {
        RmaOutcome::Done(()) => {}
        RmaOutcome::InProgress(1) => assert_eq!(completions(&mut me, 1)[0].1, Ok(None)),
        other => panic!("{other:?}"),
    }
    let mut b = [0u8; PUT_INLINE_MAX];
    seg.read(100, &mut b);
    assert_eq!(b, small);
    let big = [6u8; PUT_INLINE_MAX + 1];
    assert_eq!(
        me.put_inline(&r, 0, &big, 2),
        Err(RmaError::TooLarge { len: PUT_INLINE_MAX as u64 + 1, max: PUT_INLINE_MAX as u64 })
    );
}

fn flush_completes_after_every_earlier_operation(mode: Mode) {
    let mut t = target(1, "flush");
    let seg = patterned(&mut t, "s", 64 << 10, Access::everyone(Rights::ALL), NotifyMode::Never);
    let (mut me, _, r) = importer(2, &t, "s", mode);
    let mut posted = 0;
    for i in 0..50u64 {
        let data = [i as u8 + 1; 100];
        loop {
            match me.put(&r, i * 100, &data, i).unwrap() {
                RmaOutcome::Done(()) => break,
                RmaOutcome::InProgress(_) => {
                    posted += 1;
                    break;
                }
                RmaOutcome::NoResource => std::thread::yield_now(),
            }
        }
    }
    match me.flush(1000) {
        RmaOutcome::Done(()) => assert_eq!(posted, 0, "only mapped operations are complete at once"),
        RmaOutcome::InProgress(1000) => {
            let got = completions(&mut me, posted + 1);
            assert_eq!(got.last().unwrap().0, 1000, "the flush completes after the puts it covers");
            let tokens: Vec<u64> = got[..posted].iter().map(|g| g.0).collect();
            assert_eq!(tokens, (0..50).collect::<Vec<_>>(), "completions in the order posted");
        }
        other => panic!("{other:?}"),
    }
    for i in 0..50usize {
        let mut b = [0u8; 100];
        seg.read(i * 100, &mut b);
        assert_eq!(b, [i as u8 + 1; 100]);
    }
    assert_eq!(me.flush(1001), RmaOutcome::Done(()), "nothing left in flight");
}

fn fence_orders_operations_across_targets(mode: Mode) {
    let mut a = target(1, "fence-a");
    let mut b = target(3, "fence-b");
    let seg_a = patterned(&mut a, "s", 1 << 20, Access::everyone(Rights::ALL), NotifyMode::Never);
    let seg_b = patterned(&mut b, "s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never);
    let mut me = Rma::new(ulnet_core::rma::RmaConfig::new(NodeId(2))).unwrap();
    let (pa, ma) = connect(&mut me, &a.shm, &a.tcp, &a.udp, mode);
    let (pb, mb) = connect(&mut me, &b.shm, &b.tcp, &b.udp, mode);
    let ra = me.import_with(pa, "s", ma).unwrap();
    let rb = me.import_with(pb, "s", mb).unwrap();
    let big = vec![0xabu8; 1 << 20];
    let first = me.put(&ra, 0, &big, 1).unwrap();
    me.fence();
    let mut refused_at_first = None;
    let deadline = Instant::now() + T;
    while me.put(&rb, 0, &[1u8; 8], 2).unwrap() == RmaOutcome::NoResource {
        refused_at_first.get_or_insert(true);
        me.poll(64, |_| {});
        assert!(Instant::now() < deadline);
    }
    refused_at_first.get_or_insert(false);
    if matches!(first, RmaOutcome::InProgress(_)) {
        assert_eq!(refused_at_first, Some(true), "{mode:?}: the put to B waits for the put to A");
    }
    me.flush_blocking(T).unwrap();
    assert!(snapshot(&seg_a) == big, "A's put is complete");
    assert_eq!(seg_b.load_u64(0), u64::from_ne_bytes([1; 8]));
}

fn notifications_follow_the_notify_mode(mode: Mode) {
    let mut t = target(1, "notify");
    let segs: Vec<_> = [NotifyMode::Never, NotifyMode::Always, NotifyMode::Conditional]
        .into_iter()
        .enumerate()
        .map(|(i, m)| patterned(&mut t, &format!("s{i}"), 4096, Access::everyone(Rights::ALL), m))
        .collect();
    let notes = t.rma.notifications();
    let mut me = Rma::new(ulnet_core::rma::RmaConfig::new(NodeId(2))).unwrap();
    let (peer, import_mode) = connect(&mut me, &t.shm, &t.tcp, &t.udp, mode);
    let mut expected: Vec<Vec<Notification>> = vec![Vec::new(); 3];
    for (i, seg) in segs.iter().enumerate() {
        let plain = me.import_with(peer, &format!("s{i}"), import_mode).unwrap();
        for (handle, bit) in [(plain, false), (plain.with_notify(), true)] {
            let base = if bit { 1024 } else { 0 };
            me.put_blocking(&handle, base, &[1; 24], T).unwrap();
            me.get_blocking(&handle, base + 8, &mut [0; 16], T).unwrap();
            me.fetch_and_add_blocking(&handle, base + 64, 1, T).unwrap();
            me.compare_and_swap_blocking(&handle, base + 64, 1, 2, T).unwrap();
            let note = |kind, offset, len| Notification { segment: seg.id(), importer: NodeId(2), kind, offset, len };
            if matches!((i, bit), (1, _) | (2, true)) {
                expected[i].extend([
                    note(AccessKind::Put, base, 24),
                    note(AccessKind::Get, base + 8, 16),
                    note(AccessKind::FetchAdd, base + 64, 8),
                    note(AccessKind::CompareSwap, base + 64, 8),
                ]);
            }
        }
    }
    // The notification descriptor is readable once something is pending.
    let mut fds = [rustix::event::PollFd::new(&notes, rustix::event::PollFlags::IN)];
    assert_eq!(rustix::event::poll(&mut fds, 5000).unwrap(), 1);
    let mut got: Vec<Vec<Notification>> = vec![Vec::new(); 3];
    let deadline = Instant::now() + T;
    while got.iter().map(Vec::len).sum::<usize>() < 12 {
        notes.poll(64, |n| got[segs.iter().position(|s| s.id() == n.segment).unwrap()].push(n));
        assert!(Instant::now() < deadline);
    }
    std::thread::sleep(Duration::from_millis(20));
    notes.poll(64, |n| panic!("unexpected notification {n:?}"));
    assert_eq!(got, expected, "{mode:?}");
    assert_eq!(notes.dropped(), 0);
}

fn aligned_words_are_never_torn(mode: Mode) {
    let mut t = target(1, "torn");
    let seg = Arc::new(patterned(&mut t, "s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never));
    seg.write(0, &[0u8; 128]);
    let (mut me, _, r) = importer(2, &t, "s", mode);
    let stop = Arc::new(AtomicBool::new(false));
    // The owner reads the put region and writes the get region, word by word.
    let owner = {
        let (seg, stop) = (seg.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut torn = 0;
            let mut flip = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for w in 0..8 {
                    let v = seg.load_u64(w * 8);
                    if v != 0 && v != u64::MAX {
                        torn += 1;
                    }
                    seg.store_u64(64 + w * 8, flip);
                }
                flip = !flip;
            }
            torn
        })
    };
    let ones = [0xffu8; 64];
    let zeros = [0u8; 64];
    let mut buf = [0u8; 64];
    let rounds = if mode.through_engine() { 2000 } else { 200_000 };
    for i in 0..rounds {
        me.put_blocking(&r, 0, if i % 2 == 0 { &ones } else { &zeros }, T).unwrap();
        me.get_blocking(&r, 64, &mut buf, T).unwrap();
        for w in buf.chunks(8) {
            let v = u64::from_ne_bytes(w.try_into().unwrap());
            assert!(v == 0 || v == u64::MAX, "{mode:?}: torn word {v:#x} in a get");
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(owner.join().unwrap(), 0, "{mode:?}: the owner saw a torn word");
}

fn import_by_descriptor_reaches_the_same_segment(mode: Mode) {
    let mut t = target(1, "by-descriptor");
    let seg = patterned(&mut t, "s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never);
    let mut me = Rma::new(ulnet_core::rma::RmaConfig::new(NodeId(2))).unwrap();
    let (peer, import_mode) = connect(&mut me, &t.shm, &t.tcp, &t.udp, mode);
    let r = me.import_descriptor(peer, seg.descriptor(), import_mode).unwrap();
    assert_eq!((r.descriptor(), r.is_mapped()), (seg.descriptor(), mode == Mode::ShmMapped));
    me.put_blocking(&r, 16, &[7; 16], T).unwrap();
    assert_eq!(me.fetch_and_add_blocking(&r, 16, 1, T), Ok(u64::from_ne_bytes([7; 8])));
    let mut b = [0u8; 16];
    me.get_blocking(&r, 16, &mut b, T).unwrap();
    assert_eq!(b[..8], (u64::from_ne_bytes([7; 8]) + 1).to_ne_bytes());
    assert_eq!(b[8..], [7; 8]);
}

for_every_transport!(
    import_by_descriptor_reaches_the_same_segment,
    puts_and_gets_round_trip_at_random_places,
    put_inline_takes_small_puts_only,
    flush_completes_after_every_earlier_operation,
    fence_orders_operations_across_targets,
    notifications_follow_the_notify_mode,
    aligned_words_are_never_torn,
);
