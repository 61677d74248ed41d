//! The registry across real `ulnet node` processes on loopback: a value set on one node is
//! read on every other; killing (SIGKILL) a node and then the locker does not stop updates;
//! a restarted node catches up; a torn log tail is cut at start-up and the node comes back
//! as itself; a bit-flipped one is refused, said so, and recovered from the peers under a
//! new identity.

mod common;
mod registry_util;

use registry_util::{last_segment, tear, Cluster};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn updates_reach_every_node_survive_kills_of_a_node_and_the_locker_and_restarts_catch_up() {
    const N: usize = 5;
    let mut c = Cluster::start(N, 0, "kill");
    c.settle(N, Duration::from_secs(20));
    let mut expected: Vec<(String, String)> = Vec::new();
    // The contract's command lines: set on one node, get on every other.
    let secret = c.dir.join("secret");
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ulnet"))
            .args(args)
            .arg("--secret-file")
            .arg(&secret)
            .env("ULNET_LOG", "error")
            .output()
            .unwrap();
        assert!(out.status.success(), "ulnet {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    cli(&["registry", "set", "k0", "v0", "--connect", &c.addrs[1].to_string()]);
    expected.push(("k0".into(), "v0".into()));
    for i in (0..N).filter(|&i| i != 1) {
        assert_eq!(cli(&["registry", "get", "k0", "--connect", &c.addrs[i].to_string()]), "v0\n");
        let json = cli(&["registry", "get", "k0", "--connect", &c.addrs[i].to_string(), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (v["key"].as_str(), v["value"].as_str(), v["found"].as_bool()),
            (Some("k0"), Some("v0"), Some(true))
        );
    }
    for i in 0..N {
        c.expect_values(i, &expected, Duration::from_secs(5));
    }

    // A receiver dies: a quorum of the voters remains, updates go on at once.
    let locker = (0..N).find(|&i| c.status(i).is_some_and(|s| s.locker)).expect("a locker");
    let receiver = (0..N).find(|&i| i != locker).unwrap();
    c.kill(receiver);
    let writer = (0..N).find(|&i| i != locker && i != receiver).unwrap();
    for k in 1..=5 {
        c.set(writer, &format!("k{k}"), &format!("v{k}"), Duration::from_secs(10));
        expected.push((format!("k{k}"), format!("v{k}")));
    }

    // The locker dies too (3 of 5 remain): the next node takes over and updates go on.
    c.kill(locker);
    let took = c.set(writer, "k6", "v6", Duration::from_secs(15));
    expected.push(("k6".into(), "v6".into()));
    eprintln!("first update after the locker's kill acknowledged in {took:?}");
    for k in 7..=10 {
        c.set(writer, &format!("k{k}"), &format!("v{k}"), Duration::from_secs(5));
        expected.push((format!("k{k}"), format!("v{k}")));
    }
    for &i in &c.running() {
        c.expect_values(i, &expected, Duration::from_secs(5));
    }
    let new_locker = c.running().into_iter().find(|&i| c.status(i).is_some_and(|s| s.locker));
    assert!(new_locker.is_some_and(|l| l != locker), "a surviving node locks");

    // Both come back with their logs and catch up (state transfer), then vote again.
    c.spawn(receiver);
    c.spawn(locker);
    c.set(writer, "k11", "v11", Duration::from_secs(10));
    expected.push(("k11".into(), "v11".into()));
    let s = c.settle(N, Duration::from_secs(30));
    assert!(s.iter().all(|x| x.keys == expected.len() as u64), "{s:#?}");
    for i in 0..N {
        c.expect_values(i, &expected, Duration::from_secs(5));
    }
}

#[test]
fn a_torn_log_tail_is_cut_and_a_bit_flipped_one_recovered_from_the_peers_under_a_new_identity() {
    const N: usize = 5;
    let mut c = Cluster::start(N, 40, "corrupt");
    c.settle(N, Duration::from_secs(20));
    let mut expected: Vec<(String, String)> = Vec::new();
    for k in 0..20 {
        c.set(k % N, &format!("k{k}"), &format!("value-{k}"), Duration::from_secs(5));
        expected.push((format!("k{k}"), format!("value-{k}")));
    }
    let (torn, flipped) = (3, 4);
    let ids_before: Vec<String> = [torn, flipped].iter().map(|&i| c.status(i).unwrap().node).collect();
    c.kill(torn);
    c.kill(flipped);

    tear(&c.data_dir(torn));
    let seg = last_segment(&c.data_dir(flipped));
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();

    // Updates go on meanwhile (3 of 5).
    c.set(0, "during", "down", Duration::from_secs(15));
    expected.push(("during".into(), "down".into()));

    c.spawn(torn);
    c.spawn(flipped);
    for (slot, before) in [torn, flipped].into_iter().zip(ids_before) {
        // Said so in its log. The torn tail (a write that never completed) is cut and the
        // node comes back as itself; the flipped record was whole, so it may have been
        // fsynced and acknowledged: that node comes back under a new identity.
        let (said, identity) =
            if slot == torn { ("cut a torn tail", "the same") } else { ("recover it from the peers", "a new") };
        let deadline = Instant::now() + Duration::from_secs(10);
        let log = loop {
            let log = std::fs::read_to_string(c.log_path(slot)).unwrap();
            if log.contains(said) || Instant::now() > deadline {
                break log;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(log.contains(said), "node {slot} did not say it would {said}: {log}");
        let now = loop {
            if let Some(s) = c.status(slot).filter(|s| s.running) {
                break s.node;
            }
            assert!(Instant::now() < deadline, "node {slot}'s registry does not run");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(now == before, slot == torn, "node {slot} did not come back under {identity} identity");
    }
    // The old identities leave the configuration, the new ones join it.
    let s = c.settle(N, Duration::from_secs(30));
    assert!(s.iter().all(|s| s.keys == expected.len() as u64), "{s:#?}");
    for i in 0..N {
        c.expect_values(i, &expected, Duration::from_secs(5));
    }
}

#[test]
fn a_node_joining_after_the_log_was_truncated_gets_the_state_by_transfer() {
    // Snapshots every 20 positions: after 60 updates the first positions are gone from
    // every log, so a fresh node can only be brought up to date with a snapshot.
    let mut c = Cluster::new(4, 80, "transfer", &["--registry-snapshot-every", "20"]);
    for i in 0..3 {
        c.spawn(i);
    }
    c.settle(3, Duration::from_secs(20));
    let mut expected: Vec<(String, String)> = Vec::new();
    for k in 0..60 {
        c.set(k % 3, &format!("k{k}"), &format!("value-{k}"), Duration::from_secs(5));
        expected.push((format!("k{k}"), format!("value-{k}")));
    }
    c.spawn(3);
    let s = c.settle(4, Duration::from_secs(30));
    assert!(s.iter().all(|s| s.keys == expected.len() as u64), "{s:#?}");
    c.expect_values(3, &expected, Duration::from_secs(5));
    let log = std::fs::read_to_string(c.log_path(3)).unwrap();
    assert!(log.contains("state transferred from a peer"), "the joiner got no snapshot: {log}");
}
