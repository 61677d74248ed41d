//! Forming and joining in the simulator: sponsor-based join through any seed, constant
//! round trips, strangers kept out, and only joiners alive in the regroup admitted.

mod util;

use std::time::Duration;
use ulnet_cluster::wire::{Authenticator, Message, Packet, Stamp};
use ulnet_cluster::{membership::join_bound, Config, Member, MemberId, MemberState, Status};
use ulnet_sim::{for_each_seed, Faults, NodeId};
use util::*;

#[test]
fn nodes_form_one_view_through_their_seeds() {
    for_each_seed("nodes_form_one_view_through_their_seeds", 0..200, |seed| {
        let config = Config::sim();
        let mut sim = world(seed, 7, Faults::lossy(0.05), &config);
        let mut checker = Checker::default();
        run_to_convergence(&mut sim, &mut checker, Duration::from_secs(10))?;
        Ok(())
    });
}

#[test]
fn a_join_takes_constant_round_trips_whatever_the_cluster_size() {
    let config = Config::sim();
    let mut times = Vec::new();
    for n in [4u32, 16, 32] {
        let mut sim = world(1, n, Faults::default(), &config);
        let mut checker = Checker::default();
        run_to_convergence(&mut sim, &mut checker, Duration::from_secs(20)).unwrap();
        // One more node joins an idle cluster.
        sim.run_for(Duration::from_secs(1), |s| checker.check(s)).unwrap();
        let joiner = restarted(NodeId(n), n + 1, 0, &config, 9, sim.start());
        sim.add_node(joiner);
        let took = run_to_convergence(&mut sim, &mut checker, Duration::from_secs(5)).unwrap();
        times.push((n, took));
    }
    for (n, took) in &times {
        assert!(*took <= join_bound(&config), "join into {n} nodes took {took:?}, bound {:?}", join_bound(&config));
    }
}

#[test]
fn strangers_without_the_secret_cannot_join_or_disturb() {
    let config = Config::sim();
    let mut sim = world(3, 4, Faults::default(), &config);
    let mut checker = Checker::default();
    run_to_convergence(&mut sim, &mut checker, Duration::from_secs(5)).unwrap();
    let view_before = sim.node(NodeId(0)).unwrap().view_id();
    let now = sim.now();
    let seeds = (0..4).map(|j| addr_of(NodeId(j))).collect();
    let mut stranger = SimMember::new(4, 0, config.clone(), seeds, b"wrong secret", 5);
    stranger.machine.start(now);
    sim.add_node(stranger);
    sim.run_for(Duration::from_secs(3), |s| checker.check(s)).unwrap();
    assert!(sim.node(NodeId(4)).unwrap().machine.view().is_none(), "the stranger got a view");
    for i in 0..4 {
        let n = sim.node(NodeId(i)).unwrap();
        assert_eq!(n.view_id(), view_before, "the stranger changed the view");
    }
    let dropped: u64 = (0..4).map(|i| sim.node(NodeId(i)).unwrap().machine.counters().dropped_auth).sum();
    assert!(dropped > 0, "the stranger's datagrams were not counted as dropped");
}

/// A datagram from a node that holds the secret, asked to join, and died before any regroup
/// asked it to answer: a join request stamped fresh for `to` (what no replay can be, but a
/// joiner that crashes right after asking sends).
fn last_words(sim: &ulnet_sim::Sim<SimMember>, to: NodeId, joiner: &Member) -> Vec<u8> {
    let receiver = &sim.node(to).unwrap().machine;
    let stamp = Stamp {
        sender_incarnation: 1,
        receiver: receiver.me().id,
        receiver_incarnation: receiver.incarnation(),
        counter: 1,
    };
    let message = Message::JoinRequest { member: joiner.clone(), forwarded: false };
    Authenticator::new(SECRET).encode(&Packet { sender: joiner.id, sender_view: 0, stamp, message })
}

#[test]
fn a_joiner_that_never_answers_the_regroup_is_never_admitted() {
    let config = Config::sim();
    for_each_seed("a_joiner_that_never_answers_the_regroup_is_never_admitted", 0..100, |seed| {
        let n = 3;
        let mut sim = world(seed, n, Faults::lossy(0.02), &config);
        let mut checker = Checker::default();
        run_to_convergence(&mut sim, &mut checker, Duration::from_secs(10))?;
        let formed = sim.node(NodeId(0)).unwrap().view_id();
        // Nodes 7, 8, 9 never run: they asked once and died.
        for (i, ghost) in (7u32..10).enumerate() {
            let joiner = Member {
                id: MemberId(0xdead_0000 + u64::from(ghost)),
                name: format!("n{ghost}"),
                addr: addr_of(NodeId(ghost)),
            };
            let to = NodeId(i as u32 % n);
            let bytes = last_words(&sim, to, &joiner);
            let now = sim.now();
            sim.node_mut(to).unwrap().machine.handle_datagram(now, joiner.addr, &bytes);
            sim.flush(to);
        }
        sim.run_for(config.exclusion_bound() * 2, |s| {
            checker.check(s)?;
            for (_, node) in s.live_nodes() {
                if node.view_id() != formed || node.machine.status() != Status::Member {
                    return Err(format!(
                        "n{} moved from view {formed}: {:?}{}",
                        node.index,
                        node.machine.status(),
                        dump(s)
                    ));
                }
            }
            Ok(())
        })?;
        Ok(())
    });
}

#[test]
fn a_node_restarted_under_a_new_identity_is_listed_once() {
    // Issue #31: old identities of a restarted node stayed in `cluster status` as dead
    // entries beside the new one.
    let config = Config::sim();
    for_each_seed("a_node_restarted_under_a_new_identity_is_listed_once", 0..50, |seed| {
        let n = 3;
        let mut sim = world(seed, n, Faults::lossy(0.01), &config);
        let mut checker = Checker::default();
        run_to_convergence(&mut sim, &mut checker, Duration::from_secs(10))?;
        for incarnation in 1..=3 {
            // Lost its data directory each time: a new identity, same name and address.
            sim.crash(NodeId(2));
            run_to_convergence(&mut sim, &mut checker, config.exclusion_bound() * 2)?;
            let now = sim.now();
            sim.restart(NodeId(2), restarted(NodeId(2), n, incarnation, &config, seed, now));
            run_to_convergence(&mut sim, &mut checker, Duration::from_secs(10))?;
        }
        let states = sim.node(NodeId(0)).unwrap().machine.member_states();
        let listed: Vec<(&str, MemberState)> = states.iter().map(|(m, s)| (m.name.as_str(), *s)).collect();
        let expected = vec![("n0", MemberState::Alive), ("n1", MemberState::Alive), ("n2", MemberState::Alive)];
        if listed != expected {
            return Err(sim.violation(format!("status lists {listed:?}")));
        }
        Ok(())
    });
}
