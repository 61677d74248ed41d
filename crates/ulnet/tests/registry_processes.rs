//! The registry across real `ulnet node` processes on loopback: a value set on one node is
//! read on every other; killing (SIGKILL) a node and then the locker does not stop updates;
//! a restarted node catches up; a torn or bit-flipped log tail is refused at start-up, said
//! so, and recovered from the peers.

mod common;

use common::free_addrs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_registry::client::{RegistryClient, RegistryStatus};

const SECRET: &[u8] = b"registry-processes-secret";

/// Node processes; slot i listens on `addrs[i]` with data in `dir/n<i>`, stderr in
/// `dir/n<i>.<start>.log`.
struct Cluster {
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    procs: Vec<Option<Child>>,
    starts: Vec<u32>,
    /// More arguments for every `ulnet node`.
    extra: Vec<String>,
}

impl Cluster {
    fn start(n: usize, salt: u16, tag: &str) -> Cluster {
        let mut c = Cluster::new(n, salt, tag, &[]);
        for i in 0..n {
            c.spawn(i);
        }
        c
    }

    /// Room for `n` nodes, none started.
    fn new(n: usize, salt: u16, tag: &str, extra: &[&str]) -> Cluster {
        let dir = std::env::temp_dir().join(format!("ulnet-registry-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), SECRET).unwrap();
        let addrs = free_addrs(n, salt);
        let extra = extra.iter().map(|a| a.to_string()).collect();
        Cluster { dir, addrs, procs: (0..n).map(|_| None).collect(), starts: vec![0; n], extra }
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}"))
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}.{}.log", self.starts[i]))
    }

    fn spawn(&mut self, i: usize) {
        self.starts[i] += 1;
        let mut c = Command::new(env!("CARGO_BIN_EXE_ulnet"));
        c.args(["node", "--name", &format!("n{i}"), "--listen", &self.addrs[i].to_string()]);
        c.args(["--secret-file", self.dir.join("secret").to_str().unwrap()]);
        c.args(["--data-dir", self.data_dir(i).to_str().unwrap()]);
        c.args(&self.extra);
        // First start: join through the nodes started before; a restart: through any other.
        let seeds: Vec<String> = (0..self.addrs.len())
            .filter(|&j| j != i && (j < i || self.starts[i] > 1))
            .map(|j| self.addrs[j].to_string())
            .collect();
        if !seeds.is_empty() {
            c.args(["--seeds", &seeds.join(",")]);
        }
        let log = std::fs::File::create(self.log_path(i)).unwrap();
        self.procs[i] = Some(
            c.env("ULNET_LOG", "info")
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }

    /// SIGKILL.
    fn kill(&mut self, i: usize) {
        let mut p = self.procs[i].take().expect("running");
        p.kill().unwrap();
        p.wait().unwrap();
    }

    fn client(&self, i: usize) -> Option<RegistryClient> {
        RegistryClient::connect(&self.addrs[i].to_string(), SECRET, Duration::from_secs(3)).ok()
    }

    fn status(&self, i: usize) -> Option<RegistryStatus> {
        self.client(i)?.status().ok()
    }

    fn running(&self) -> Vec<usize> {
        (0..self.procs.len()).filter(|&i| self.procs[i].is_some()).collect()
    }

    /// Waits until every running node's registry is in the same epoch with `voters` voters,
    /// at the same applied position, everything known applied.
    fn settle(&self, voters: usize, within: Duration) -> Vec<RegistryStatus> {
        let deadline = Instant::now() + within;
        loop {
            let s: Vec<Option<RegistryStatus>> = self.running().iter().map(|&i| self.status(i)).collect();
            let ok = s.iter().all(|s| {
                s.as_ref().is_some_and(|s| {
                    s.running
                        && s.normal
                        && s.voters.len() == voters
                        && s.committed == s.applied
                        && !s.voters.is_empty()
                })
            }) && s
                .windows(2)
                .all(|w| w[0].as_ref().map(|s| (&s.epoch, s.applied)) == w[1].as_ref().map(|s| (&s.epoch, s.applied)));
            if ok {
                return s.into_iter().map(Option::unwrap).collect();
            }
            assert!(Instant::now() < deadline, "the registry did not settle with {voters} voters: {s:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sets `key` through node `i`, retrying (a failover may answer "indeterminate" or
    /// time out) until it is acknowledged; returns how long that took.
    fn set(&self, i: usize, key: &str, value: &str, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            match self.client(i).map(|mut c| c.set(key.as_bytes(), value.as_bytes())) {
                Some(Ok(_)) => return start.elapsed(),
                other => assert!(
                    start.elapsed() < within,
                    "set {key} at node {i} not acknowledged within {within:?}: {:?}",
                    other.map(|r| r.err())
                ),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asserts that node `i` reads `expected` for every key (waiting for it to catch up).
    fn expect_values(&self, i: usize, expected: &[(String, String)], within: Duration) {
        let deadline = Instant::now() + within;
        for (k, v) in expected {
            loop {
                let got = self.client(i).and_then(|mut c| c.get(k.as_bytes()).ok());
                if got.as_ref().and_then(|g| g.value.as_deref()) == Some(v.as_bytes()) {
                    break;
                }
                assert!(Instant::now() < deadline, "node {i} reads {k} = {got:?}, not {v}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().flatten() {
            let _ = p.kill();
            let _ = p.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

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

/// The newest non-empty segment of node `i`'s log.
fn last_segment(data_dir: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(data_dir.join("registry"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log") && std::fs::metadata(p).unwrap().len() > 0)
        .collect();
    segs.sort();
    segs.pop().expect("a non-empty segment")
}

#[test]
fn a_torn_or_bit_flipped_log_tail_is_refused_at_start_and_recovered_from_the_peers() {
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

    let seg = last_segment(&c.data_dir(torn));
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 5).unwrap();
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
        // Said so in its log, and came back under a new identity (its old one may have
        // acknowledged what the lost tail held).
        let deadline = Instant::now() + Duration::from_secs(10);
        let log = loop {
            let log = std::fs::read_to_string(c.log_path(slot)).unwrap();
            // Two lines from two places (the log's reader, then the node): wait for the later.
            if log.contains("recover it from the peers") || Instant::now() > deadline {
                break log;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(log.contains("refused a bad tail"), "node {slot} did not report the bad tail: {log}");
        assert!(log.contains("recover it from the peers"), "{log}");
        let now = loop {
            if let Some(s) = c.status(slot).filter(|s| s.running) {
                break s.node;
            }
            assert!(Instant::now() < deadline, "node {slot}'s registry does not run");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_ne!(now, before, "node {slot} kept the identity whose log it lost");
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
