//! Node processes on loopback for the registry's tests: start, kill and restart
//! `ulnet node`s with data directories (on small filesystems of their own, for the disk
//! tests), call their registries, wait for them to settle.
#![allow(dead_code)] // each test file uses a part

use crate::common::free_addrs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_registry::client::{RegistryClient, RegistryStatus};

const SECRET: &[u8] = b"registry-processes-secret";

/// Node processes; slot i listens on `addrs[i]` with data in `dir/n<i>`, stderr in
/// `dir/n<i>.<start>.log`.
pub struct Cluster {
    pub dir: PathBuf,
    pub addrs: Vec<SocketAddr>,
    procs: Vec<Option<Child>>,
    starts: Vec<u32>,
    /// More arguments for every `ulnet node`.
    extra: Vec<String>,
    /// Data directories with a filesystem of their own, unmounted when the cluster drops.
    mounts: Vec<PathBuf>,
}

impl Cluster {
    pub fn start(n: usize, salt: u16, tag: &str) -> Cluster {
        let mut c = Cluster::new(n, salt, tag, &[]);
        for i in 0..n {
            c.spawn(i);
        }
        c
    }

    /// Room for `n` nodes, none started.
    pub fn new(n: usize, salt: u16, tag: &str, extra: &[&str]) -> Cluster {
        let dir = std::env::temp_dir().join(format!("ulnet-registry-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), SECRET).unwrap();
        let addrs = free_addrs(n, salt);
        let extra = extra.iter().map(|a| a.to_string()).collect();
        Cluster { dir, addrs, procs: (0..n).map(|_| None).collect(), starts: vec![0; n], extra, mounts: Vec::new() }
    }

    /// Room for `n` nodes, none started, each data directory on a tmpfs of `bytes` of its
    /// own — or None when mounting is not allowed (the test needs root), said on stderr.
    pub fn on_small_disks(n: usize, salt: u16, tag: &str, bytes: u64) -> Option<Cluster> {
        let mut c = Cluster::new(n, salt, tag, &[]);
        for i in 0..n {
            let dir = c.data_dir(i);
            std::fs::create_dir_all(&dir).unwrap();
            let out = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
                .arg(&dir)
                .stderr(Stdio::piped())
                .output();
            match out {
                Ok(o) if o.status.success() => c.mounts.push(dir),
                other => {
                    let why = other.map_or_else(|e| e.to_string(), |o| String::from_utf8_lossy(&o.stderr).into());
                    eprintln!("skipped: mounting a tmpfs per node needs root (mount: {})", why.trim());
                    return None;
                }
            }
        }
        Some(c)
    }

    /// Fills node `i`'s filesystem: a file grows until the disk refuses more.
    pub fn fill_disk(&self, i: usize) {
        let mut f = std::fs::File::create(self.filler(i)).unwrap();
        let chunk = vec![0u8; 4096];
        while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
        while std::io::Write::write_all(&mut f, &chunk[..1]).is_ok() {}
    }

    /// Frees what [`Cluster::fill_disk`] took.
    pub fn free_disk(&self, i: usize) {
        std::fs::remove_file(self.filler(i)).unwrap();
    }

    fn filler(&self, i: usize) -> PathBuf {
        self.data_dir(i).join("filler")
    }

    /// The process id of node `i`.
    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i].as_ref().expect("running").id()
    }

    /// One set through node `i`, with its answer.
    pub fn try_set(&self, i: usize, key: &str, value: &[u8]) -> Result<u64, String> {
        let mut c = self.client(i).ok_or("cannot connect")?;
        c.set(key.as_bytes(), value).map_err(|e| e.to_string())
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}"))
    }

    pub fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}.{}.log", self.starts[i]))
    }

    /// Starts node `i`: the first time through the nodes started before it, a restart
    /// through any other.
    pub fn spawn(&mut self, i: usize) {
        let seeds: Vec<String> = (0..self.addrs.len())
            .filter(|&j| j != i && (j < i || self.starts[i] > 0))
            .map(|j| self.addrs[j].to_string())
            .collect();
        self.spawn_with_seeds(i, seeds);
    }

    /// Restarts node `i` with no seeds: it finds the others through the view it resumes
    /// from its data directory.
    pub fn spawn_without_seeds(&mut self, i: usize) {
        self.spawn_with_seeds(i, Vec::new());
    }

    fn spawn_with_seeds(&mut self, i: usize, seeds: Vec<String>) {
        self.starts[i] += 1;
        let mut c = Command::new(env!("CARGO_BIN_EXE_ulnet"));
        c.args(["node", "--name", &format!("n{i}"), "--listen", &self.addrs[i].to_string()]);
        c.args(["--secret-file", self.dir.join("secret").to_str().unwrap()]);
        c.args(["--data-dir", self.data_dir(i).to_str().unwrap()]);
        c.args(&self.extra);
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
    pub fn kill(&mut self, i: usize) {
        let mut p = self.procs[i].take().expect("running");
        p.kill().unwrap();
        p.wait().unwrap();
    }

    pub fn client(&self, i: usize) -> Option<RegistryClient> {
        RegistryClient::connect(&self.addrs[i].to_string(), SECRET, Duration::from_secs(3)).ok()
    }

    pub fn status(&self, i: usize) -> Option<RegistryStatus> {
        self.client(i)?.status().ok()
    }

    pub fn running(&self) -> Vec<usize> {
        (0..self.procs.len()).filter(|&i| self.procs[i].is_some()).collect()
    }

    /// Waits until every running node's registry is in the same epoch with `voters` voters,
    /// at the same applied position, everything known applied.
    pub fn settle(&self, voters: usize, within: Duration) -> Vec<RegistryStatus> {
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
    pub fn set(&self, i: usize, key: &str, value: &str, within: Duration) -> Duration {
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
    pub fn expect_values(&self, i: usize, expected: &[(String, String)], within: Duration) {
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
        for m in &self.mounts {
            if !Command::new("umount").arg(m).status().is_ok_and(|s| s.success()) {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The newest non-empty segment of the registry's log in a node's data directory.
pub fn last_segment(data_dir: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(data_dir.join("registry"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log") && std::fs::metadata(p).unwrap().len() > 0)
        .collect();
    segs.sort();
    segs.pop().expect("a non-empty segment")
}

/// What a write torn by a crash leaves at the end of the log in `data_dir` (of a node that
/// is not running): the first bytes of a record — a copy of the first half of the newest
/// segment's first frame, cut in the middle of its payload.
pub fn tear(data_dir: &Path) {
    let seg = last_segment(data_dir);
    let bytes = std::fs::read(&seg).unwrap();
    let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    let torn = &bytes[..8 + len / 2];
    let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
    std::io::Write::write_all(&mut f, torn).unwrap();
}
