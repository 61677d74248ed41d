//! The reliability run behind `docs/reliability.md` (issue #31), in the form of Jepsen's
//! tests: five `ulnet node` processes with durable registries, one per host of a
//! `ulnet-netlab` lab (network namespaces on a bridge), each with its data directory on a
//! small filesystem of its own. Clients inside every host hold a steady load of sets and
//! linearizable gets while a nemesis injects one fault after another, healing each and
//! waiting for the registry to settle before the next:
//!
//! - kill -9 of a minority, and of every node at once (restarted from their data);
//! - SIGSTOP of a node for seconds (then SIGCONT);
//! - partitions: a random minority cut off, the locker isolated;
//! - loss of 10 % of every host's packets;
//! - a full disk on one node, on a majority, on every node (then freed);
//! - torn tails: every node killed, every log cut inside a record, every node restarted;
//! - replays: the membership datagrams a node sent, recorded on its host, sent again from
//!   its own address after it was killed;
//! - idle and garbage connections on every control port, garbage datagrams on every
//!   membership port.
//!
//! At the end every fault is healed and the registry settles; then every acknowledged write
//! of a unique key is read back from every node (nothing acknowledged may be lost), and the
//! history of the shared keys is checked for linearizability per key.
//!
//! In CI the nemesis plays each fault once, in a shuffled order. `ULNET_RELIABILITY_ROUNDS=N`
//! plays N faults drawn at random (the report's run), `ULNET_RELIABILITY_SEED=S` picks the
//! order. Needs root (namespaces, iptables, mounts, raw sockets); skips with the reason
//! otherwise. The nodes' logs are kept when the run fails.

mod common;
mod registry_util;

use registry_util::tear;
use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ulnet_netlab::{Host, Lab};
use ulnet_registry::client::{ClientError, RegistryClient, RegistryStatus};
use ulnet_registry::linearizability::{check, Action, Operation};

const NODES: usize = 5;
/// Membership (UDP) and control plane (TCP) port of every node.
const PORT: u16 = 7600;
/// Prometheus counters of every node.
const METRICS_PORT: u16 = 7601;
const SECRET: &[u8] = b"reliability-run-secret";
/// Each node's filesystem: its log and snapshots for the run, and the registry's 1 MiB disk
/// probe; small enough to fill in a moment.
const DISK_BYTES: u64 = 48 << 20;
/// Clients per host.
const CLIENTS_PER_HOST: usize = 2;
/// Keys shared by every client, whose history is checked for linearizability.
const SHARED_KEYS: u64 = 8;
/// A client gives up on a call after this long (its set is then indeterminate).
const CALL_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a fault lasts before it is healed.
const FAULT_TIME: Duration = Duration::from_secs(3);
/// Longest the registry may take to settle after a fault is healed. Generous: it only trips
/// on a registry that does not recover.
const SETTLE_LIMIT: Duration = Duration::from_secs(90);
/// Search steps allowed to the linearizability checker per key.
const CHECK_STEPS: u64 = 50_000_000;
/// Datagrams kept per host for the replays (the newest).
const RECORDED_MAX: usize = 4096;
/// Connections per node that read the acknowledged writes back at the end.
const READERS_PER_NODE: usize = 4;
/// Pause of each client between its calls, unless `ULNET_RELIABILITY_PACE_MS` says
/// otherwise (0: as fast as the cluster answers, the report's load). With it the CI run
/// writes a few thousand keys a second instead of tens of thousands, so that reading every
/// one back from every node stays short.
const PACE_DEFAULT: Duration = Duration::from_millis(5);

/// The faults of the nemesis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillMinority,
    KillAll,
    Pause,
    PartitionMinority,
    IsolateLocker,
    Loss,
    DiskFullOne,
    DiskFullMajority,
    DiskFullAll,
    TornTails,
    Replay,
    IdleAndGarbage,
}

const FAULTS: [Fault; 12] = [
    Fault::KillMinority,
    Fault::KillAll,
    Fault::Pause,
    Fault::PartitionMinority,
    Fault::IsolateLocker,
    Fault::Loss,
    Fault::DiskFullOne,
    Fault::DiskFullMajority,
    Fault::DiskFullAll,
    Fault::TornTails,
    Fault::Replay,
    Fault::IdleAndGarbage,
];

/// A seeded xorshift: the nemesis's choices replay from `ULNET_RELIABILITY_SEED`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// `k` distinct nodes.
    fn nodes(&mut self, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..NODES).collect();
        for i in (1..all.len()).rev() {
            all.swap(i, self.below(i + 1));
        }
        all.truncate(k);
        all
    }
}

/// One datagram a node sent, as recorded on its host.
#[derive(Clone)]
struct Recorded {
    dst: SocketAddrV4,
    payload: Vec<u8>,
}

/// The lab, the node processes, their filesystems, and what the sniffers recorded.
struct World {
    lab: Lab,
    dir: PathBuf,
    nodes: Vec<Option<Child>>,
    mounts: Vec<PathBuf>,
    recorded: Vec<Arc<Mutex<VecDeque<Recorded>>>>,
    sniffing: Arc<AtomicBool>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.sniffing.store(false, Ordering::Relaxed);
        for c in self.nodes.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for m in &self.mounts {
            if !Command::new("umount").arg(m).status().is_ok_and(|s| s.success()) {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
        }
        if std::thread::panicking() || std::env::var_os("ULNET_KEEP_LOGS").is_some() {
            eprintln!("logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl World {
    fn new(lab: Lab) -> Option<World> {
        let dir = std::env::temp_dir().join(format!("ulnet-reliability-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, SECRET).unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let mut w = World {
            lab,
            dir,
            nodes: (0..NODES).map(|_| None).collect(),
            mounts: Vec::new(),
            recorded: (0..NODES).map(|_| Arc::new(Mutex::new(VecDeque::new()))).collect(),
            sniffing: Arc::new(AtomicBool::new(true)),
        };
        for i in 0..NODES {
            let data = w.data_dir(i);
            std::fs::create_dir_all(&data).unwrap();
            let out = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={DISK_BYTES}"), "tmpfs"])
                .arg(&data)
                .output()
                .unwrap();
            if !out.status.success() {
                eprintln!("skipped: mounting a tmpfs per node: {}", String::from_utf8_lossy(&out.stderr).trim());
                return None;
            }
            w.mounts.push(data);
        }
        for i in 0..NODES {
            w.sniff(i);
        }
        Some(w)
    }

    fn host(&self, i: usize) -> Host {
        self.lab.host(i)
    }

    fn addr(&self, i: usize) -> SocketAddrV4 {
        SocketAddrV4::new(self.host(i).addr(), PORT)
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("r{i}"))
    }

    /// Starts node `i`: the first time through the nodes before it, later through all.
    fn spawn(&mut self, i: usize, restart: bool) {
        let mut c = self.lab.command(self.host(i), env!("CARGO_BIN_EXE_ulnet"));
        c.args(["node", "--name", &format!("r{i}"), "--listen", &self.addr(i).to_string()]);
        c.arg("--secret-file").arg(self.dir.join("secret"));
        c.arg("--data-dir").arg(self.data_dir(i));
        c.args(["--metrics", &SocketAddrV4::new(self.host(i).addr(), METRICS_PORT).to_string()]);
        let seeds: Vec<String> =
            (0..NODES).filter(|&j| j != i && (j < i || restart)).map(|j| self.addr(j).to_string()).collect();
        if !seeds.is_empty() {
            c.args(["--seeds", &seeds.join(",")]);
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("r{i}.log")));
        c.env("ULNET_LOG", "info").env("NO_COLOR", "1").stdin(Stdio::null()).stdout(Stdio::null());
        c.stderr(log.unwrap());
        self.nodes[i] = Some(c.spawn().expect("spawning ulnet node in its namespace"));
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.nodes[i].take() {
            p.kill().unwrap();
            p.wait().unwrap();
        }
    }

    fn signal(&self, i: usize, signal: rustix::process::Signal) {
        let pid = self.nodes[i].as_ref().expect("running").id();
        let pid = rustix::process::Pid::from_raw(pid as i32).expect("a child has a pid");
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// Asks node `i` from inside its host.
    fn status(&self, i: usize) -> Option<RegistryStatus> {
        let addr = self.addr(i).to_string();
        self.lab
            .run_in(self.host(i), move || {
                RegistryClient::connect(&addr, SECRET, Duration::from_secs(1)).and_then(|mut c| c.status()).ok()
            })
            .join()
            .unwrap()
    }

    fn locker(&self) -> Option<usize> {
        (0..NODES).find(|&i| self.status(i).is_some_and(|s| s.locker && s.normal))
    }

    /// Waits until every node's registry runs in one epoch with all five voters and has
    /// applied everything it knows committed; returns how long that took.
    fn settle(&self) -> Duration {
        let start = Instant::now();
        loop {
            let s: Vec<Option<RegistryStatus>> = (0..NODES).map(|i| self.status(i)).collect();
            let ok = s.iter().all(|s| {
                s.as_ref().is_some_and(|s| s.running && s.normal && s.voters.len() == NODES && s.applied == s.committed)
            });
            let one_epoch = s.windows(2).all(|w| w[0].as_ref().map(|s| &s.epoch) == w[1].as_ref().map(|s| &s.epoch));
            if ok && one_epoch {
                return start.elapsed();
            }
            assert!(start.elapsed() < SETTLE_LIMIT, "the registry did not settle: {s:#?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Records, on host `i`, every UDP datagram its node sends from its membership port.
    fn sniff(&self, i: usize) {
        let (me, out, on) = (self.addr(i), self.recorded[i].clone(), self.sniffing.clone());
        // Detached: it ends when `sniffing` is cleared.
        drop(self.lab.run_in(self.host(i), move || {
            use rustix::net::{recv, socket, sockopt, AddressFamily, RecvFlags, SocketType};
            let fd = socket(AddressFamily::PACKET, SocketType::RAW, Some(rustix::net::eth::ALL)).expect("AF_PACKET");
            sockopt::set_socket_timeout(&fd, sockopt::Timeout::Recv, Some(Duration::from_millis(50))).unwrap();
            let mut frame = vec![0u8; 1 << 16];
            while on.load(Ordering::Relaxed) {
                let Ok(n) = recv(&fd, &mut frame, RecvFlags::empty()) else { continue };
                if let Some((src, d)) = parse_udp(&frame[..n]).filter(|(src, _)| *src == me) {
                    debug_assert_eq!(src, me);
                    let mut q = out.lock().unwrap();
                    if q.len() == RECORDED_MAX {
                        q.pop_front();
                    }
                    q.push_back(d);
                }
            }
        }));
    }

    /// Sends node `i`'s recorded datagrams again from its own address (it must be dead, so
    /// that its port is free). Returns how many went out.
    fn replay(&self, i: usize) -> usize {
        let (me, recorded) = (self.addr(i), self.recorded[i].lock().unwrap().clone());
        self.lab
            .run_in(self.host(i), move || {
                let socket = UdpSocket::bind(me).expect("the dead node's address is free");
                let mut sent = 0;
                for _ in 0..2 {
                    for (k, d) in recorded.iter().enumerate() {
                        if socket.send_to(&d.payload, d.dst).is_ok() {
                            sent += 1;
                        }
                        if k % 32 == 31 {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                }
                sent
            })
            .join()
            .unwrap()
    }

    /// Node `i`'s Prometheus counter `name` (without its prefix), read from inside its host.
    fn counter(&self, i: usize, name: &str) -> u64 {
        let (addr, name) = (SocketAddrV4::new(self.host(i).addr(), METRICS_PORT), name.to_string());
        self.lab
            .run_in(self.host(i), move || {
                use std::io::{Read, Write};
                let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2)) else {
                    return 0;
                };
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
                let mut text = String::new();
                let _ = s.read_to_string(&mut text);
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name} ")))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .map_or(0, |v| v as u64)
            })
            .join()
            .unwrap()
    }

    /// Whether a node other than `dead` lists `dead` in its view as alive.
    fn view_holds(&self, dead: usize) -> bool {
        (0..NODES).filter(|&i| i != dead && self.nodes[i].is_some()).any(|i| {
            let addr = self.addr(i).to_string();
            let name = format!("r{dead}");
            self.lab
                .run_in(self.host(i), move || {
                    ulnet_cluster::runtime::query_status(&addr, SECRET, Duration::from_secs(1))
                        .map(|s| s.members.iter().any(|m| m.name == name && m.state != "dead"))
                        .unwrap_or(false)
                })
                .join()
                .unwrap()
        })
    }

    fn fill_disk(&self, i: usize) {
        let mut f = std::fs::File::create(self.data_dir(i).join("filler")).unwrap();
        let chunk = vec![0u8; 1 << 16];
        while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
        while std::io::Write::write_all(&mut f, &chunk[..1]).is_ok() {}
    }

    fn free_disk(&self, i: usize) {
        let _ = std::fs::remove_file(self.data_dir(i).join("filler"));
    }
}

/// An Ethernet frame carrying IPv4 and UDP: its source and the datagram.
fn parse_udp(frame: &[u8]) -> Option<(SocketAddrV4, Recorded)> {
    const ETH: usize = 14;
    let ip = frame.get(ETH..)?;
    if frame.get(12..14)? != [0x08, 0x00] || ip.first()? >> 4 != 4 || *ip.get(9)? != 17 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let udp = ip.get(ihl..)?;
    let len = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    let addr = |at: usize, port: &[u8]| {
        SocketAddrV4::new(
            Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]),
            u16::from_be_bytes([port[0], port[1]]),
        )
    };
    let src = addr(12, udp.get(0..2)?);
    Some((src, Recorded { dst: addr(16, udp.get(2..4)?), payload: udp.get(8..len)?.to_vec() }))
}

/// What the clients did.
#[derive(Default)]
struct Record {
    /// Operations on the shared keys, for the linearizability check.
    history: Vec<Operation>,
    /// Acknowledged writes of unique keys: key, value.
    acked: Vec<(String, String)>,
    /// Writes of unique keys with no answer (they may or may not have happened).
    indeterminate: u64,
    /// Calls refused or failed without effect (a get, or a refused set).
    failed: u64,
}

/// One client: sets of unique keys, and sets and gets of the shared keys, until `stop`.
fn client(addr: String, id: usize, t0: Instant, pace: Duration, stop: Arc<AtomicBool>) -> Record {
    let mut r = Record::default();
    let mut conn: Option<RegistryClient> = None;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let us = |t: Instant| t.duration_since(t0).as_micros() as u64;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            conn = RegistryClient::connect(&addr, SECRET, CALL_TIMEOUT).ok();
            if conn.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        };
        n += 1;
        std::thread::sleep(pace);
        let call = Instant::now();
        let result = match rng.below(4) {
            0 | 1 => {
                let (key, value) = (format!("u{id}-{n}"), format!("v{id}-{n}"));
                let result = c.set(key.as_bytes(), value.as_bytes()).map(|_| ());
                match &result {
                    Ok(()) => r.acked.push((key, value)),
                    Err(ClientError::Refused(_)) => r.failed += 1,
                    Err(_) => r.indeterminate += 1,
                }
                result
            }
            2 => {
                let key = format!("s{}", rng.next() % SHARED_KEYS).into_bytes();
                let value = format!("c{id}-{n}").into_bytes();
                let result = c.set(&key, &value).map(|_| ());
                // A refused set had no effect; any other error may have taken effect (no
                // return time: the checker lets it happen or not).
                if matches!(result, Err(ClientError::Refused(_))) {
                    r.failed += 1;
                } else {
                    let ret = result.is_ok().then(|| us(Instant::now()));
                    r.history.push(Operation { key, action: Action::Set(value), call: us(call), ret });
                }
                result
            }
            _ => {
                let key = format!("s{}", rng.next() % SHARED_KEYS).into_bytes();
                let result = c.get(&key).map(|got| {
                    let ret = Some(us(Instant::now()));
                    r.history.push(Operation { key, action: Action::Get(got.value), call: us(call), ret });
                });
                if result.is_err() {
                    r.failed += 1;
                }
                result
            }
        };
        if let Err(e) = result {
            if !matches!(e, ClientError::Refused(_)) {
                conn = None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    r
}

/// What one fault did, for the report.
struct Played {
    fault: Fault,
    detail: String,
    recovery: Duration,
}

/// Plays `fault`, heals it, and waits for the registry to settle.
fn play(w: &mut World, fault: Fault, rng: &mut Rng) -> Played {
    let pause = || std::thread::sleep(FAULT_TIME);
    let detail = match fault {
        Fault::KillMinority => {
            let k = 1 + rng.below(2);
            let victims = rng.nodes(k);
            for &v in &victims {
                w.kill(v);
            }
            pause();
            for &v in &victims {
                w.spawn(v, true);
            }
            format!("kill -9 of {victims:?}, restarted")
        }
        Fault::KillAll => {
            for i in 0..NODES {
                w.kill(i);
            }
            for i in 0..NODES {
                w.spawn(i, true);
            }
            "kill -9 of every node, restarted".into()
        }
        Fault::Pause => {
            let v = w.locker().unwrap_or_else(|| rng.below(NODES));
            w.signal(v, rustix::process::Signal::Stop);
            pause();
            w.signal(v, rustix::process::Signal::Cont);
            format!("SIGSTOP of r{v} (the locker when known) for {FAULT_TIME:?}")
        }
        Fault::PartitionMinority => {
            let k = 1 + rng.below(2);
            let minority = rng.nodes(k);
            for &a in &minority {
                for b in (0..NODES).filter(|b| !minority.contains(b)) {
                    w.lab.partition(w.host(a), w.host(b)).unwrap();
                }
            }
            pause();
            w.lab.heal().unwrap();
            format!("{minority:?} cut off from the rest")
        }
        Fault::IsolateLocker => {
            let l = w.locker().unwrap_or(0);
            for j in (0..NODES).filter(|&j| j != l) {
                w.lab.partition(w.host(l), w.host(j)).unwrap();
            }
            pause();
            w.lab.heal().unwrap();
            format!("the locker r{l} isolated")
        }
        Fault::Loss => {
            for i in 0..NODES {
                w.lab.set_loss(w.host(i), 0.10).unwrap();
            }
            pause();
            for i in 0..NODES {
                w.lab.set_loss(w.host(i), 0.0).unwrap();
            }
            "10 % of every host's packets dropped".into()
        }
        Fault::DiskFullOne | Fault::DiskFullMajority | Fault::DiskFullAll => {
            let k = match fault {
                Fault::DiskFullOne => 1,
                Fault::DiskFullMajority => 3,
                _ => NODES,
            };
            let full = rng.nodes(k);
            for &i in &full {
                w.fill_disk(i);
            }
            pause();
            for &i in &full {
                w.free_disk(i);
            }
            format!("disks of {full:?} full, then freed")
        }
        Fault::TornTails => {
            for i in 0..NODES {
                w.kill(i);
            }
            for i in 0..NODES {
                tear(&w.data_dir(i));
            }
            for i in 0..NODES {
                w.spawn(i, true);
            }
            "every node killed, every log cut inside a record, all restarted".into()
        }
        Fault::Replay => {
            let v = rng.below(NODES);
            let recorded = w.recorded[v].lock().unwrap().len();
            w.kill(v);
            let others: Vec<usize> = (0..NODES).filter(|&i| i != v).collect();
            let before: u64 = others.iter().map(|&i| not_fresh(w, i)).sum();
            let excluded = Instant::now();
            while w.view_holds(v) {
                assert!(excluded.elapsed() < SETTLE_LIMIT, "r{v} was never excluded");
                std::thread::sleep(Duration::from_millis(100));
            }
            let sent = w.replay(v);
            std::thread::sleep(Duration::from_millis(500));
            assert!(!w.view_holds(v), "replayed datagrams put the dead r{v} back in a view");
            let dropped: u64 = others.iter().map(|&i| not_fresh(w, i)).sum::<u64>() - before;
            w.spawn(v, true);
            format!(
                "r{v} killed; its {recorded} recorded datagrams sent twice from its address ({sent}): \
                 {dropped} dropped as not fresh, none re-admitted it"
            )
        }
        Fault::IdleAndGarbage => {
            let holders: Vec<_> = (0..NODES).map(|i| strangers(w, i)).collect();
            pause();
            drop(holders);
            "100 idle and 30 garbage TCP connections per control port, 2,000 garbage datagrams per node".into()
        }
    };
    let recovery = w.settle();
    Played { fault, detail, recovery }
}

/// Authenticated membership datagrams node `i` dropped as not fresh, so far.
fn not_fresh(w: &World, i: usize) -> u64 {
    ["dropped_replayed_total", "dropped_old_incarnation_total", "dropped_unconfirmed_total"]
        .iter()
        .map(|c| w.counter(i, &format!("ulnet_membership_{c}")))
        .sum()
}

/// Opens idle and garbage connections to node `i`'s control port and sends garbage
/// datagrams to its membership port, from host `i`; returns the connections (closed when
/// dropped).
fn strangers(w: &World, i: usize) -> Vec<std::net::TcpStream> {
    let addr = w.addr(i);
    w.lab
        .run_in(w.host(i), move || {
            use std::io::Write;
            let mut conns = Vec::new();
            let mut rng = Rng(0x1234_5678 ^ u64::from(addr.port()));
            for k in 0..130 {
                let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr.into(), Duration::from_secs(1)) else {
                    continue;
                };
                if k >= 100 {
                    let junk: Vec<u8> = (0..64).map(|_| rng.next() as u8).collect();
                    let _ = s.write_all(&junk);
                }
                conns.push(s);
            }
            let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..2000 {
                let junk: Vec<u8> = (0..(20 + rng.below(1400))).map(|_| rng.next() as u8).collect();
                let _ = udp.send_to(&junk, addr);
            }
            conns
        })
        .join()
        .unwrap()
}

fn rounds(rng: &mut Rng) -> Vec<Fault> {
    match std::env::var("ULNET_RELIABILITY_ROUNDS").ok().and_then(|s| s.parse::<usize>().ok()) {
        Some(n) => (0..n).map(|_| FAULTS[rng.below(FAULTS.len())]).collect(),
        None => {
            let mut all = FAULTS.to_vec();
            for i in (1..all.len()).rev() {
                all.swap(i, rng.below(i + 1));
            }
            all
        }
    }
}

/// Reads every acknowledged unique key back from every node, each node by
/// [`READERS_PER_NODE`] connections at once; returns the writes some node does not hold
/// (key, node, what it read).
fn lost_writes(w: &World, acked: &[(String, String)]) -> Vec<(String, usize, Option<Vec<u8>>)> {
    let mut readers = Vec::new();
    for i in 0..NODES {
        for part in 0..READERS_PER_NODE {
            let addr = w.addr(i).to_string();
            let share: Vec<(String, String)> = acked.iter().skip(part).step_by(READERS_PER_NODE).cloned().collect();
            readers.push((i, w.lab.run_in(w.host(i), move || read_back(&addr, share))));
        }
    }
    readers.into_iter().flat_map(|(i, r)| r.join().unwrap().into_iter().map(move |(k, got)| (k, i, got))).collect()
}

/// The keys of `acked` whose value the node at `addr` does not read back, with what it read.
fn read_back(addr: &str, acked: Vec<(String, String)>) -> Vec<(String, Option<Vec<u8>>)> {
    let mut c = RegistryClient::connect(addr, SECRET, Duration::from_secs(5)).expect("connects");
    acked
        .into_iter()
        .filter_map(|(k, v)| {
            let got = c.get(k.as_bytes()).ok().and_then(|g| g.value);
            (got.as_deref() != Some(v.as_bytes())).then_some((k, got))
        })
        .collect()
}

#[test]
fn nothing_acknowledged_is_lost_under_the_nemesis() {
    let Some(lab) = Lab::for_test(NODES) else { return };
    let Some(mut w) = World::new(lab) else { return };
    let seed = std::env::var("ULNET_RELIABILITY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(31);
    eprintln!("nemesis seed {seed} (replay with ULNET_RELIABILITY_SEED={seed})");
    let mut rng = Rng(seed | 1);
    for i in 0..NODES {
        w.spawn(i, false);
    }
    w.settle();
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let pace = std::env::var("ULNET_RELIABILITY_PACE_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(PACE_DEFAULT, Duration::from_millis);
    let clients: Vec<_> = (0..NODES * CLIENTS_PER_HOST)
        .map(|id| {
            let host = id % NODES;
            let (addr, stop) = (w.addr(host).to_string(), stop.clone());
            w.lab.run_in(w.host(host), move || client(addr, id, t0, pace, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let mut played = Vec::new();
    for fault in rounds(&mut rng) {
        eprintln!("nemesis: {fault:?}");
        let p = play(&mut w, fault, &mut rng);
        eprintln!("  {} — settled {:.1} s after the heal", p.detail, p.recovery.as_secs_f64());
        played.push(p);
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let records: Vec<Record> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let elapsed = t0.elapsed();
    let acked: Vec<(String, String)> = records.iter().flat_map(|r| r.acked.iter().cloned()).collect();
    let history: Vec<Operation> = records.iter().flat_map(|r| r.history.iter().cloned()).collect();
    let indeterminate: u64 = records.iter().map(|r| r.indeterminate).sum();
    let failed: u64 = records.iter().map(|r| r.failed).sum();
    w.settle();
    let reading = Instant::now();
    let lost = lost_writes(&w, &acked);
    eprintln!("read {} acknowledged writes back from {NODES} nodes in {:?}", acked.len(), reading.elapsed());
    report(&played, elapsed, acked.len(), indeterminate, failed, &history, &lost);
    assert!(acked.len() >= 50, "too little was acknowledged for the check to mean anything");
    assert!(lost.is_empty(), "acknowledged writes lost: {:?}", &lost[..lost.len().min(20)]);
    let started = Instant::now();
    check(&history, CHECK_STEPS).unwrap_or_else(|e| panic!("shared keys not linearizable: {e:?}"));
    eprintln!("shared keys linearizable ({SHARED_KEYS} keys), checked in {:?}", started.elapsed());
}

/// Prints the run's report: the load held, the faults and their recoveries, what was lost.
fn report(
    played: &[Played],
    elapsed: Duration,
    acked: usize,
    indeterminate: u64,
    failed: u64,
    history: &[Operation],
    lost: &[(String, usize, Option<Vec<u8>>)],
) {
    let mut by_fault: BTreeMap<Fault, (usize, f64)> = BTreeMap::new();
    for p in played {
        let e = by_fault.entry(p.fault).or_default();
        e.0 += 1;
        e.1 = e.1.max(p.recovery.as_secs_f64());
    }
    eprintln!("REPORT run {:.0} s, {} faults", elapsed.as_secs_f64(), played.len());
    eprintln!("REPORT | fault | times | longest settle after heal (s) |");
    for (f, (n, worst)) in &by_fault {
        eprintln!("REPORT | {f:?} | {n} | {worst:.1} |");
    }
    let shared_sets = history.iter().filter(|o| matches!(o.action, Action::Set(_))).count();
    let gets = history.iter().filter(|o| matches!(o.action, Action::Get(_))).count();
    eprintln!(
        "REPORT load: {acked} unique writes acknowledged, {indeterminate} indeterminate, {failed} refused or failed; \
         {shared_sets} sets and {gets} gets of {SHARED_KEYS} shared keys"
    );
    eprintln!("REPORT lost acknowledged writes: {} (checked on every node)", lost.len());
}
