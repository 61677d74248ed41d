//! A Global Update Protocol member (node 1 of voters 1, 2, 3) fed whatever its peers could
//! send, with time passing, its log writes made durable, and the view changing. The input
//! is a sequence of `[milliseconds, from, length (2 bytes), bytes…]`: from 2–4 delivers the
//! bytes as a message of that node; from 0 reads them as a new view (a member per byte).
//! Nothing may panic, and the node never applies past what is committed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};
use ulnet_registry::gup::{Event, Gup, GupConfig, NodeId, View};

const ME: NodeId = NodeId(1);

fuzz_target!(|data: &[u8]| {
    let mut now = Instant::now();
    let voters = vec![NodeId(1), NodeId(2), NodeId(3)];
    let mut node = Gup::bootstrap(ME, voters.clone(), GupConfig::local(), now);
    let mut view_id = 1;
    node.handle_view(now, View::new(view_id, voters));
    settle(&mut node, now);
    let mut input = data;
    while let [dt, from, lo, hi, rest @ ..] = input {
        let len = (usize::from(*lo) | usize::from(*hi) << 8).min(rest.len());
        let (bytes, rest) = rest.split_at(len);
        input = rest;
        now += Duration::from_millis(u64::from(*dt));
        match from % 5 {
            0 => {
                view_id += 1;
                let mut members: Vec<NodeId> = bytes.iter().map(|&b| NodeId(u64::from(b % 6))).collect();
                members.push(ME);
                members.sort();
                members.dedup();
                node.handle_view(now, View::new(view_id, members));
            }
            1 => node.handle_timeout(now),
            peer => node.handle_message(now, NodeId(u64::from(peer)), bytes),
        }
        settle(&mut node, now);
        assert!(node.applied() <= node.committed(), "applied {} past committed {}", node.applied(), node.committed());
    }
});

/// What a host does after each input: sends what is queued (to nobody here), makes every
/// log write durable, and runs the housekeeping that is due.
fn settle(node: &mut Gup, now: Instant) {
    for _ in 0..64 {
        let mut durable = None;
        while let Some(event) = node.poll_event() {
            if let Event::Persist { lsn, .. } = event {
                durable = Some(lsn);
            }
        }
        while node.poll_transmit().is_some() {}
        match durable {
            Some(lsn) => node.handle_durable(now, lsn),
            None => break,
        }
    }
    if node.poll_timeout().is_some_and(|t| t <= now) {
        node.handle_timeout(now);
    }
}
