//! Atomics: compare-and-swap and fetch-and-add on aligned 64-bit words — their results,
//! and exact totals when several processes (and the owner itself, with local atomics)
//! hammer one word at once, over every transport.

mod rma_util;

use rma_util::*;
use std::time::Instant;
use ulnet_core::rma::{Access, Completed, NodeId, NotifyMode, Rights, Rma, RmaConfig, RmaOutcome};

fn atomics_return_the_previous_value(mode: Mode) {
    let mut t = target(1, "amo");
    let seg = patterned(&mut t, "s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never);
    seg.store_u64(0, u64::MAX - 1);
    let (mut me, _, r) = importer(2, &t, "s", mode);
    assert_eq!(me.fetch_and_add_blocking(&r, 0, 3, T), Ok(u64::MAX - 1));
    assert_eq!(seg.load_u64(0), 1, "fetch-and-add wraps");
    assert_eq!(me.compare_and_swap_blocking(&r, 0, 5, 9, T), Ok(1), "a failed swap returns what it found");
    assert_eq!(seg.load_u64(0), 1, "and changes nothing");
    assert_eq!(me.compare_and_swap_blocking(&r, 0, 1, 9, T), Ok(1));
    assert_eq!(seg.load_u64(0), 9);
    // Non-blocking: the old value comes now (mapped) or in the completion.
    let mut old = None;
    match me.fetch_and_add(&r, 0, 1, 42).unwrap() {
        RmaOutcome::Done(v) => old = Some(v),
        RmaOutcome::InProgress(42) => {
            let deadline = Instant::now() + T;
            while old.is_none() {
                me.poll(8, |c| {
                    assert_eq!(c.token, 42);
                    if let Ok(Completed::Atomic(v)) = c.result {
                        old = Some(v);
                    }
                });
                assert!(Instant::now() < deadline);
            }
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(old, Some(9));
    assert_eq!(seg.load_u64(0), 10);
    // Neighbouring words are untouched.
    assert_eq!(seg.load_u64(8), u64::from_ne_bytes(std::array::from_fn(|i| ((8 + i) * 7 + 3) as u8)));
}

/// Increments by compare-and-swap: read, try to swap in one more, retry on a miss.
fn cas_increment(me: &mut Rma, seg: &ulnet_core::rma::RemoteSegment, off: u64) -> u32 {
    let mut guess = 0;
    let mut misses = 0;
    loop {
        let seen = me.compare_and_swap_blocking(seg, off, guess, guess + 1, T).unwrap();
        if seen == guess {
            return misses;
        }
        guess = seen;
        misses += 1;
    }
}

/// One importer process: `n` fetch-and-adds on word 0 and `n` compare-and-swap increments
/// on word 8.
fn hammer_as_child() {
    let env = |k: &str| std::env::var(k).unwrap();
    let mode = Mode::parse(&env("RMA_MODE"));
    let n: u64 = env("RMA_N").parse().unwrap();
    let node: u32 = env("RMA_NODE").parse().unwrap();
    let mut me = Rma::new(RmaConfig::new(NodeId(node))).unwrap();
    let (peer, import_mode) = connect(&mut me, &env("RMA_SHM"), &env("RMA_TCP"), &env("RMA_UDP"), mode);
    let seg = me.import_with(peer, "counter", import_mode).unwrap();
    for _ in 0..n {
        me.fetch_and_add_blocking(&seg, 0, 1, T).unwrap();
        cas_increment(&mut me, &seg, 8);
    }
}

fn concurrent_atomics_from_several_processes_sum_exactly(mode: Mode) {
    if child_role().as_deref() == Some("hammer") {
        return hammer_as_child();
    }
    const CHILDREN: u64 = 3;
    let n: u64 = if mode.through_engine() { 3000 } else { 100_000 };
    let mut t = target(1, "hammer");
    let seg = t.rma.export("counter", 4096, Access::everyone(Rights::ATOMIC), NotifyMode::Never).unwrap();
    let test = format!("{}::concurrent_atomics_from_several_processes_sum_exactly", mode.module());
    let children: Vec<_> = (0..CHILDREN)
        .map(|i| {
            spawn_child(
                &test,
                "hammer",
                &[
                    ("RMA_MODE", mode.name().to_string()),
                    ("RMA_N", n.to_string()),
                    ("RMA_NODE", (10 + i).to_string()),
                    ("RMA_SHM", t.shm.clone()),
                    ("RMA_TCP", t.tcp.clone()),
                    ("RMA_UDP", t.udp.clone()),
                ],
            )
        })
        .collect();
    // The owner increments the same words with its own local atomics meanwhile.
    for _ in 0..n {
        seg.fetch_add_u64(0, 1);
        let mut guess = seg.load_u64(8);
        loop {
            let seen = seg.compare_swap_u64(8, guess, guess + 1);
            if seen == guess {
                break;
            }
            guess = seen;
        }
    }
    for mut c in children {
        assert!(c.wait().unwrap().success(), "{mode:?}: a child failed");
    }
    let want = (CHILDREN + 1) * n;
    assert_eq!(seg.load_u64(0), want, "{mode:?}: fetch-and-add total");
    assert_eq!(seg.load_u64(8), want, "{mode:?}: compare-and-swap total");
    if mode.through_engine() {
        let c = t.rma.target_counters();
        assert!(c.atomics >= 2 * CHILDREN * n, "{c:?}");
        assert_eq!(c.refused(), 0);
    }
}

for_every_transport!(atomics_return_the_previous_value, concurrent_atomics_from_several_processes_sum_exactly);
