//! Replayed membership datagrams are worthless (issue #31): what a sniffer recorded —
//! no secret needed — and sends again later from the original source address is never
//! acted on, whether its sender died, its receiver restarted, or both still run.

mod util;

use std::time::Duration;
use ulnet_cluster::{Config, MemberId, Status};
use ulnet_sim::{for_each_seed, Faults, NodeId, Sim, Violation};
use util::*;

/// Datagrams recorded from one sender: (destination, bytes).
type Recording = Vec<(NodeId, Vec<u8>)>;

/// Sends `datagrams` recorded from `sender` again, each to its original destination if that
/// node is up, with `sender`'s address as the source.
fn replay(sim: &mut Sim<SimMember>, sender: NodeId, datagrams: &Recording) {
    let now = sim.now();
    for (to, bytes) in datagrams {
        if let Some(node) = sim.node_mut(*to) {
            node.machine.handle_datagram(now, addr_of(sender), bytes);
            sim.flush(*to);
        }
    }
}

/// No live node's view holds any of `dead`, and every live node acts as a member.
fn survivors_hold(sim: &Sim<SimMember>, dead: &[MemberId]) -> Result<(), String> {
    for (_, n) in sim.live_nodes() {
        if let Some(v) = n.machine.view() {
            if let Some(d) = dead.iter().find(|d| v.contains(**d)) {
                return Err(format!("n{} is in view {} with the dead {d}{}", n.index, v.id, dump(sim)));
            }
        }
        if n.machine.status() != Status::Member {
            return Err(format!("n{} is {:?}{}", n.index, n.machine.status(), dump(sim)));
        }
    }
    Ok(())
}

#[test]
fn replayed_datagrams_of_dead_nodes_never_readmit_them() {
    let config = Config::sim();
    for_each_seed("replayed_datagrams_of_dead_nodes_never_readmit_them", 0..40, |seed| {
        let n = 5;
        let mut sim = world_tapped(seed, n, Faults::default(), &config, true);
        let mut checker = Checker::default();
        run_to_convergence(&mut sim, &mut checker, Duration::from_secs(10))?;
        // Three nodes die one after the other, each excluded before the next dies: the two
        // left keep a quorum of every view on the way (the two-member view).
        let mut dead = Vec::new();
        let mut recorded = Vec::new();
        for victim in [NodeId(4), NodeId(3), NodeId(2)] {
            let old = sim.crash(victim).expect("up");
            dead.push(old.machine.me().id);
            recorded.push((victim, old.tap.expect("tapped")));
            run_to_convergence(&mut sim, &mut checker, config.exclusion_bound() * 2)?;
        }
        // The recording is sent again and again: nothing changes.
        let hold = |s: &Sim<SimMember>| survivors_hold(s, &dead);
        replay_rounds(&mut sim, &mut checker, &recorded, 5, config.exclusion_bound(), hold)?;
        // The survivors restart from their data directories one after the other (each
        // comes back in its last view), and the recording, now with what they sent before
        // their restarts, is sent again: nothing changes either.
        for survivor in [NodeId(1), NodeId(0)] {
            let old = sim.crash(survivor).expect("up");
            recorded.push((survivor, old.tap.clone().expect("tapped")));
            let now = sim.now();
            sim.restart(survivor, resumed(&old, n, &config, seed, now));
            run_to_convergence(&mut sim, &mut checker, config.exclusion_bound() * 2)?;
        }
        replay_rounds(&mut sim, &mut checker, &recorded, 3, config.exclusion_bound(), hold)?;
        Ok(())
    });
}

/// `rounds` times: sends every recording again, then runs for `span`, checking the
/// invariants and `holds` after every step.
fn replay_rounds(
    sim: &mut Sim<SimMember>,
    checker: &mut Checker,
    recorded: &[(NodeId, Recording)],
    rounds: usize,
    span: Duration,
    holds: impl Fn(&Sim<SimMember>) -> Result<(), String>,
) -> Result<(), Violation> {
    for _ in 0..rounds {
        replay_all(sim, recorded)?;
        sim.run_for(span, |s| {
            checker.check(s)?;
            holds(s)
        })?;
    }
    Ok(())
}

/// Sends every recording again at once, and checks that every datagram that reached a
/// running node was dropped as not fresh (none was acted on).
fn replay_all(sim: &mut Sim<SimMember>, recorded: &[(NodeId, Recording)]) -> Result<(), Violation> {
    let before = not_fresh(sim);
    let mut delivered = 0;
    for (sender, datagrams) in recorded {
        delivered += datagrams.iter().filter(|(to, _)| sim.node(*to).is_some()).count() as u64;
        replay(sim, *sender, datagrams);
    }
    let dropped = not_fresh(sim) - before;
    if dropped != delivered {
        return Err(
            sim.violation(format!("{delivered} datagrams replayed, {dropped} dropped as not fresh{}", dump(sim)))
        );
    }
    Ok(())
}

/// Authenticated datagrams the running nodes dropped as not fresh, in all.
fn not_fresh(sim: &Sim<SimMember>) -> u64 {
    sim.live_nodes()
        .map(|(_, n)| {
            let c = n.machine.counters();
            c.dropped_replayed + c.dropped_old_incarnation + c.dropped_unconfirmed
        })
        .sum()
}

#[test]
fn replays_between_running_processes_are_dropped_and_counted() {
    // Sender and receiver both still run in the incarnations the recording was made in:
    // the counters' windows are what stands between the replays and the protocol.
    let config = Config::sim();
    for_each_seed("replays_between_running_processes_are_dropped_and_counted", 0..40, |seed| {
        let n = 4;
        let mut sim = world_tapped(seed, n, Faults::lossy(0.02), &config, true);
        let mut checker = Checker::default();
        run_to_convergence(&mut sim, &mut checker, Duration::from_secs(10))?;
        sim.run_for(Duration::from_secs(2), |s| checker.check(s))?;
        let view = sim.node(NodeId(0)).unwrap().view_id();
        // What each node received (a sniffer beside it records that; a datagram lost on
        // the way was never received, and would be new to its receiver).
        let mut arrived = Vec::new();
        for i in 0..n {
            let node = sim.node_mut(NodeId(i)).unwrap();
            for (from, bytes) in std::mem::take(node.heard.as_mut().unwrap()) {
                arrived.push((from, vec![(NodeId(i), bytes)]));
            }
        }
        let unmoved = |s: &Sim<SimMember>| match s
            .live_nodes()
            .find(|(_, node)| node.view_id() != view || node.machine.status() != Status::Member)
        {
            Some((_, node)) => Err(format!("n{} left view {view}{}", node.index, dump(s))),
            None => Ok(()),
        };
        replay_rounds(&mut sim, &mut checker, &arrived, 3, Duration::from_secs(1), unmoved)?;
        Ok(())
    });
}
