//! Doorbell batching over UDP and TCP: requests posted to one peer share messages, every
//! one is applied once and in order, and a lone operation still leaves at the first poll.

mod rma_util;

use rma_util::*;
use ulnet_core::rma::{Access, Completed, NodeId, NotifyMode, RemoteSegment, Rights, Rma, RmaConfig, RmaOutcome};

const OPS: u64 = 500;

fn importer_with(t: &Target, mode: Mode, batch_max: usize) -> (Rma, RemoteSegment) {
    let mut config = RmaConfig::new(NodeId(2));
    config.batch_max = batch_max;
    let mut me = Rma::new(config).unwrap();
    let (peer, import_mode) = connect(&mut me, &t.shm, &t.tcp, &t.udp, mode);
    let seg = me.import_with(peer, "s", import_mode).unwrap();
    (me, seg)
}

/// Posts `OPS` fetch-and-adds of 1, each followed by one poll (as `bench faa-lat
/// --overhead` does), then flushes; checks every old value came back exactly once, in
/// posting order, and the word holds the total.
fn stream(me: &mut Rma, r: &RemoteSegment) -> Vec<u64> {
    let olds = std::cell::RefCell::new(Vec::new());
    let take = |c: ulnet_core::rma::RmaCompletion<'_>| match c.result {
        Ok(Completed::Atomic(v)) => olds.borrow_mut().push((c.token, v)),
        Ok(Completed::Flush) => {}
        other => panic!("unexpected completion {other:?}"),
    };
    for i in 0..OPS {
        while me.fetch_and_add(r, 8, 1, i).unwrap() == RmaOutcome::NoResource {
            me.poll(64, take);
        }
        me.poll(64, take);
    }
    me.flush_blocking(T).unwrap();
    while olds.borrow().len() < OPS as usize {
        me.poll(64, take);
    }
    let olds = olds.into_inner();
    assert_eq!(olds.iter().map(|o| o.0).collect::<Vec<_>>(), (0..OPS).collect::<Vec<_>>(), "completions in order");
    olds.into_iter().map(|o| o.1).collect()
}

#[test]
fn a_stream_of_posts_shares_datagrams_and_every_request_is_applied_once_in_order() {
    let mut t = target(1, "batch-udp");
    let seg = t.rma.export("s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never).unwrap();
    let mut sent = Vec::new();
    for batch_max in [1400, 0] {
        let (mut me, r) = importer_with(&t, Mode::Udp, batch_max);
        let before = seg.load_u64(8);
        let packets = me.udp_counters().packets_sent;
        let olds = stream(&mut me, &r);
        assert_eq!(olds, (before..before + OPS).collect::<Vec<_>>(), "each add applied once, in order");
        sent.push(me.udp_counters().packets_sent - packets);
    }
    assert_eq!(seg.load_u64(8), 2 * OPS);
    let (batched, alone) = (sent[0], sent[1]);
    eprintln!("{OPS} posts: {batched} datagrams batched, {alone} one request per message");
    assert!(batched < OPS / 5, "posts shared datagrams ({batched} for {OPS})");
    assert!(alone >= OPS, "without batching, a datagram per poll ({alone})");
}

#[test]
fn a_stream_of_posts_over_tcp_is_applied_once_in_order() {
    let mut t = target(1, "batch-tcp");
    let seg = t.rma.export("s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never).unwrap();
    let (mut me, r) = importer_with(&t, Mode::Tcp, RmaConfig::new(NodeId(2)).batch_max);
    assert_eq!(stream(&mut me, &r), (0..OPS).collect::<Vec<_>>());
    assert_eq!(seg.load_u64(8), OPS);
    assert_eq!(t.rma.target_counters().atomics, OPS);
}

#[test]
fn a_lone_operation_leaves_at_the_first_poll_and_a_second_at_most_one_poll_later() {
    let mut t = target(1, "batch-lone");
    let _seg = t.rma.export("s", 4096, Access::everyone(Rights::ALL), NotifyMode::Never).unwrap();
    let (mut me, r) = importer_with(&t, Mode::Udp, RmaConfig::new(NodeId(2)).batch_max);
    me.flush_blocking(T).unwrap();
    let sent = |me: &Rma| me.udp_counters().packets_sent;
    // Nothing in flight: the first poll sends it.
    let p0 = sent(&me);
    assert!(matches!(me.fetch_and_add(&r, 0, 1, 1).unwrap(), RmaOutcome::InProgress(1)));
    me.poll(64, |_| {});
    let p1 = sent(&me);
    assert!(p1 > p0, "a lone operation left at the first poll");
    // One in flight: a second post may wait for one more poll (more may join it), not more.
    assert!(matches!(me.fetch_and_add(&r, 0, 1, 2).unwrap(), RmaOutcome::InProgress(2)));
    me.poll(64, |_| {});
    me.poll(64, |_| {});
    assert!(sent(&me) > p1, "the second left by the second poll after it");
    me.flush_blocking(T).unwrap();
}
