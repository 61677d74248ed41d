//! The registry across real `ulnet node` processes when disks fail, on loopback:
//!
//! - Three nodes with their data directories on tmpfs filesystems of their own (mounted by
//!   the test: root only, skipped with the reason otherwise; unmounted even when it fails).
//!   The disk of one node fills, then of a majority, then of every node: each node whose
//!   log cannot be written stops its registry and refuses its clients with the cause; once
//!   the space is freed, reads and writes work again without restarting anything, and
//!   every acknowledged write is readable on every node. Then every disk fills, every node
//!   is killed while full, the space is freed and all restart: they come back as
//!   themselves, with every acknowledged write.
//! - Every node killed (SIGKILL) at once, each log torn in the middle of a record (a write
//!   the crash interrupted), all restarted without seeds: each cuts its torn tail and comes
//!   back under its own identity, a view forms from the views they resume, the registry
//!   syncs, and every acknowledged write is readable on all three, which agree.

mod common;
mod registry_util;

use registry_util::{last_segment, tear, Cluster};
use std::time::{Duration, Instant};
use ulnet_registry::client::RegistryStatus;

/// Each node's filesystem: room for the log of the test's writes and the disk probe
/// (1 MiB), small enough to fill in a moment.
const DISK_BYTES: u64 = 16 << 20;

/// Values big enough that a few of them cross a page of the log (a node fails its first
/// write past the page its log segment had room in).
fn value(k: usize) -> Vec<u8> {
    format!("{k:06}-{}", "v".repeat(2000)).into_bytes()
}

/// Acknowledged writes: key and value.
type Acked = Vec<(String, String)>;

/// The status of node `i`, waiting up to `within` for `until` to hold.
fn wait_status(
    c: &Cluster,
    i: usize,
    within: Duration,
    what: &str,
    until: impl Fn(&RegistryStatus) -> bool,
) -> RegistryStatus {
    let deadline = Instant::now() + within;
    loop {
        let s = c.status(i);
        if let Some(s) = s.as_ref().filter(|s| until(s)) {
            return s.clone();
        }
        assert!(Instant::now() < deadline, "node {i}: {what} not within {within:?}: {s:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sets keys until node `watch` reports its registry stopped (by its full disk; at most 200
/// sets), each through `via` or, once `via` has stopped, through a node whose registry
/// still runs; records the acknowledged ones. Sets may fail once a quorum or the locker has
/// stopped.
fn write_until_stopped(c: &Cluster, via: usize, watch: usize, next: &mut usize, acked: &mut Acked) {
    for _ in 0..200 {
        if c.status(watch).is_some_and(|s| !s.running) {
            return;
        }
        let through =
            std::iter::once(via).chain(c.running()).find(|&i| c.status(i).is_some_and(|s| s.running)).unwrap_or(via);
        let key = format!("k{next}");
        if c.try_set(through, &key, &value(*next)).is_ok() {
            acked.push((key, String::from_utf8(value(*next)).unwrap()));
        }
        *next += 1;
    }
    panic!("node {watch} never stopped: {:#?}", c.status(watch));
}

/// Node `i` refuses a set and a get with the cause of its stop.
fn expect_refusals(c: &Cluster, i: usize) {
    let dir = c.data_dir(i).join("registry");
    let cause = format!("registry stopped: no space left on {}; retrying every 1 s", dir.display());
    let set = c.try_set(i, "refused", b"x");
    assert_eq!(set, Err(format!("refused: {cause}")), "node {i}'s set");
    let get = c.client(i).expect("connects").get(b"k0").map_err(|e| e.to_string());
    assert_eq!(get.map(|g| g.value), Err(format!("refused: {cause}")), "node {i}'s get");
    let s = c.status(i).unwrap();
    assert!(!s.running && s.stopped == cause && s.disk_failures >= 1, "{s:#?}");
}

/// Every node reads every acknowledged write, takes a new one, and they all agree.
fn expect_everything(c: &Cluster, acked: &mut Acked, tag: &str) {
    for i in c.running() {
        c.set(i, &format!("{tag}-{i}"), tag, Duration::from_secs(20));
        acked.push((format!("{tag}-{i}"), tag.to_string()));
    }
    for i in c.running() {
        c.expect_values(i, acked, Duration::from_secs(20));
    }
}

#[test]
fn full_disks_on_one_a_majority_and_every_node_stop_the_registry_there_and_it_resumes_in_place() {
    let Some(mut c) = Cluster::on_small_disks(3, 60, "disk", DISK_BYTES) else { return };
    for i in 0..3 {
        c.spawn(i);
    }
    c.settle(3, Duration::from_secs(20));
    let mut acked: Acked = Vec::new();
    let mut next = 0;
    for _ in 0..10 {
        c.set(next % 3, &format!("k{next}"), std::str::from_utf8(&value(next)).unwrap(), Duration::from_secs(5));
        acked.push((format!("k{next}"), String::from_utf8(value(next)).unwrap()));
        next += 1;
    }
    let pids: Vec<u32> = (0..3).map(|i| c.pid(i)).collect();
    let locker = (0..3).find(|&i| c.status(i).is_some_and(|s| s.locker)).expect("a locker");
    let (full, writer) = ((locker + 1) % 3, (locker + 2) % 3);

    // One node's disk fills: it stops and says why; the two others go on.
    c.fill_disk(full);
    write_until_stopped(&c, writer, full, &mut next, &mut acked);
    expect_refusals(&c, full);
    let before = acked.len();
    for _ in 0..5 {
        c.set(writer, &format!("k{next}"), "while one is full", Duration::from_secs(10));
        acked.push((format!("k{next}"), "while one is full".into()));
        next += 1;
    }
    assert_eq!(acked.len(), before + 5);
    c.free_disk(full);
    let s = wait_status(&c, full, Duration::from_secs(15), "restart in place", |s| s.running && s.normal);
    assert!(s.restarts >= 1 && s.stopped.is_empty(), "{s:#?}");
    expect_everything(&c, &mut acked, "after-one");

    // A majority (the locker among them): writes stop everywhere; the locker refuses.
    c.fill_disk(locker);
    c.fill_disk(full);
    write_until_stopped(&c, writer, locker, &mut next, &mut acked);
    expect_refusals(&c, locker);
    assert!(c.try_set(writer, "no-quorum", b"x").is_err(), "a set was acknowledged without a quorum of disks");
    c.free_disk(locker);
    c.free_disk(full);
    c.settle(3, Duration::from_secs(30));
    expect_everything(&c, &mut acked, "after-majority");

    // Every node's disk fills.
    let locker = (0..3).find(|&i| c.status(i).is_some_and(|s| s.locker)).expect("a locker");
    let writer = (locker + 1) % 3;
    (0..3).for_each(|i| c.fill_disk(i));
    write_until_stopped(&c, writer, locker, &mut next, &mut acked);
    expect_refusals(&c, locker);
    (0..3).for_each(|i| c.free_disk(i));
    let s = c.settle(3, Duration::from_secs(30));
    expect_everything(&c, &mut acked, "after-all");
    let pids_now: Vec<u32> = (0..3).map(|i| c.pid(i)).collect();
    assert_eq!(pids_now, pids, "no node was restarted");
    let restarts: u64 = (0..3).map(|i| c.status(i).unwrap().restarts).sum();
    eprintln!(
        "disk full on one, two and three nodes: {} writes acknowledged, {restarts} restarts in place",
        acked.len()
    );
    assert!(restarts >= 3, "{s:#?}");

    // Every disk fills again and every node is killed while full (the case): the
    // space is freed and all restart, as themselves, with every acknowledged write.
    let ids: Vec<String> = (0..3).map(|i| c.status(i).unwrap().node).collect();
    let locker = (0..3).find(|&i| c.status(i).is_some_and(|s| s.locker)).expect("a locker");
    (0..3).for_each(|i| c.fill_disk(i));
    write_until_stopped(&c, (locker + 1) % 3, locker, &mut next, &mut acked);
    (0..3).for_each(|i| c.kill(i));
    (0..3).for_each(|i| c.free_disk(i));
    (0..3).for_each(|i| c.spawn(i));
    c.settle(3, Duration::from_secs(30));
    let ids_now: Vec<String> = (0..3).map(|i| c.status(i).unwrap().node).collect();
    assert_eq!(ids_now, ids, "a node came back under a new identity");
    expect_everything(&c, &mut acked, "after-restart");
}

#[test]
fn every_log_torn_at_once_after_kill_9_and_all_restart_as_themselves_with_every_acknowledged_write() {
    let mut c = Cluster::start(3, 70, "torn");
    c.settle(3, Duration::from_secs(20));
    let mut acked: Acked = Vec::new();
    for k in 0..40 {
        c.set(k % 3, &format!("k{k}"), &format!("value-{k}"), Duration::from_secs(5));
        acked.push((format!("k{k}"), format!("value-{k}")));
    }
    let ids: Vec<String> = (0..3).map(|i| c.status(i).unwrap().node).collect();
    (0..3).for_each(|i| c.kill(i));
    // Each log ends inside a record, as a write the crash interrupted leaves it: half a
    // record; a file extended for a write that never reached the disk (zeros); a record
    // header cut short.
    tear(&c.data_dir(0));
    let seg = last_segment(&c.data_dir(1));
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len + 4096).unwrap();
    let seg = last_segment(&c.data_dir(2));
    let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
    std::io::Write::write_all(&mut f, &[0x40, 0x00, 0x00]).unwrap();
    drop(f);
    // Without seeds: each finds the others through the view it resumes.
    (0..3).for_each(|i| c.spawn_without_seeds(i));
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(c.log_path(i)).unwrap().contains("cut a torn tail") {
            assert!(Instant::now() < deadline, "node {i} did not cut its torn tail");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let s = c.settle(3, Duration::from_secs(30));
    let ids_now: Vec<String> = s.iter().map(|s| s.node.clone()).collect();
    assert_eq!(ids_now, ids, "a node came back under a new identity");
    assert!(s.iter().all(|s| s.keys == acked.len() as u64), "the three disagree: {s:#?}");
    expect_everything(&c, &mut acked, "after-torn");
}
