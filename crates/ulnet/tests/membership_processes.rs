//! Real `ulnet node` processes on loopback against what issue #31 found:
//!
//! - Replayed datagrams: a sniffer on `lo` (an `AF_PACKET` socket) records every
//!   membership datagram while four nodes join a fifth; three of them are killed one after
//!   the other; their recorded datagrams are sent again from their own addresses (raw IPv4
//!   with a forged source, as an attacker without the secret would), and again after both
//!   survivors were restarted from their data directories. The two survivors keep their
//!   view of two with quorum throughout: no view change at all, no dead node re-admitted.
//!   Needs root (raw sockets); skips with the reason otherwise.
//! - Nodes that all start with seeds (none forms the cluster) stay joining, and say so in
//!   their log, naming what to do.

mod common;

use common::free_addrs;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ulnet_cluster::runtime::{query_status, StatusReport};

const SECRET: &str = "membership-processes-secret";
/// Far above what the `local` profile needs (five nodes form in under two seconds, a
/// crash is handled in `exclusion_bound()`, 3 s), so that only a failure trips them.
const CHANGE_LIMIT: Duration = Duration::from_secs(30);

/// Node processes, killed when dropped; their directory is kept if the test failed.
struct Nodes {
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    metrics: Vec<SocketAddr>,
    children: Vec<Option<Child>>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("node logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Nodes {
    fn new(test: &str, addrs: Vec<SocketAddr>, metrics: Vec<SocketAddr>) -> Self {
        let dir = std::env::temp_dir().join(format!("ulnet-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), format!("{SECRET}\n")).unwrap();
        let children = addrs.iter().map(|_| None).collect();
        Self { dir, addrs, metrics, children }
    }

    /// Starts node `i` (again), with a data directory and metrics, joining through `seeds`.
    fn start(&mut self, i: usize, seeds: &[usize]) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ulnet"));
        c.args(["node", "--name", &format!("p{i}"), "--listen", &self.addrs[i].to_string()]);
        c.args(["--secret-file", self.dir.join("secret").to_str().unwrap()]);
        c.args(["--data-dir", self.dir.join(format!("p{i}")).to_str().unwrap()]);
        c.args(["--metrics", &self.metrics[i].to_string()]);
        if !seeds.is_empty() {
            let seeds: Vec<String> = seeds.iter().map(|&j| self.addrs[j].to_string()).collect();
            c.args(["--seeds", &seeds.join(",")]);
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log(i)).unwrap();
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        self.children[i] = Some(c.spawn().unwrap());
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("p{i}.log"))
    }

    fn kill(&mut self, i: usize) {
        let mut c = self.children[i].take().expect("running");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn status(&self, i: usize) -> Option<StatusReport> {
        query_status(&self.addrs[i].to_string(), SECRET.as_bytes(), Duration::from_secs(2)).ok()
    }

    /// Waits until every node of `nodes` acts as a member of one view whose members are
    /// exactly `nodes`; returns the view.
    fn wait_for_view(&self, nodes: &[usize]) -> u64 {
        let want: BTreeSet<String> = nodes.iter().map(|i| format!("p{i}")).collect();
        let deadline = Instant::now() + CHANGE_LIMIT;
        loop {
            let reports: Vec<Option<StatusReport>> = nodes.iter().map(|&i| self.status(i)).collect();
            let views: BTreeSet<Option<u64>> =
                reports.iter().map(|r| r.as_ref().filter(|r| r.quorum && in_view(r) == want).map(|r| r.view)).collect();
            if let [Some(view)] = views.iter().copied().collect::<Vec<_>>()[..] {
                return view;
            }
            assert!(Instant::now() < deadline, "no view of {want:?} with quorum: {reports:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Counters of node `i` (its Prometheus text), by name without the prefix.
    fn counter(&self, i: usize, name: &str) -> u64 {
        let mut stream = std::net::TcpStream::connect(self.metrics[i]).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let line = format!("ulnet_membership_{name} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    }
}

/// The members a report lists as in the view (the dead it lists are removed ones).
fn in_view(r: &StatusReport) -> BTreeSet<String> {
    r.members.iter().filter(|m| m.state != "dead").map(|m| m.name.clone()).collect()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// One datagram seen on the wire.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Recorded {
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: Vec<u8>,
}

/// Records every UDP datagram on loopback whose source port is one of `ports`, on its own
/// thread, until `stop` is set. Each datagram is seen twice on `lo` (leaving and arriving):
/// kept once.
fn sniff(
    ports: BTreeSet<u16>,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<BTreeSet<Recorded>>>,
) -> std::thread::JoinHandle<()> {
    use rustix::net::{recv, socket, sockopt, AddressFamily, RecvFlags, SocketType};
    let fd = socket(AddressFamily::PACKET, SocketType::RAW, Some(rustix::net::eth::ALL)).expect("AF_PACKET socket");
    sockopt::set_socket_timeout(&fd, sockopt::Timeout::Recv, Some(Duration::from_millis(50))).unwrap();
    std::thread::spawn(move || {
        let mut frame = vec![0u8; 1 << 16];
        while !stop.load(Ordering::Relaxed) {
            let Ok(n) = recv(&fd, &mut frame, RecvFlags::empty()) else { continue };
            if let Some(d) = parse_udp(&frame[..n]).filter(|d| ports.contains(&d.src.port())) {
                out.lock().unwrap().insert(d);
            }
        }
    })
}

/// An Ethernet frame (loopback's all-zero header) carrying IPv4 and UDP.
fn parse_udp(frame: &[u8]) -> Option<Recorded> {
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
    Some(Recorded { src: addr(12, udp.get(0..2)?), dst: addr(16, udp.get(2..4)?), payload: udp.get(8..len)?.to_vec() })
}

/// Sends `d` again as it was: an IPv4 datagram from its original source (raw socket with
/// the header built here, the kernel filling in the checksum and identification).
fn forge(raw: &rustix::fd::OwnedFd, d: &Recorded) {
    let total = 20 + 8 + d.payload.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&d.src.ip().octets());
    p.extend_from_slice(&d.dst.ip().octets());
    p.extend_from_slice(&d.src.port().to_be_bytes());
    p.extend_from_slice(&d.dst.port().to_be_bytes());
    p.extend_from_slice(&((8 + d.payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]); // no UDP checksum (allowed over IPv4)
    p.extend_from_slice(&d.payload);
    rustix::net::sendto_v4(raw, &p, rustix::net::SendFlags::empty(), &SocketAddrV4::new(*d.dst.ip(), 0))
        .expect("raw send");
}

/// Authenticated datagrams node `i` dropped as not fresh, so far.
fn not_fresh(nodes: &Nodes, i: usize) -> u64 {
    ["dropped_replayed_total", "dropped_old_incarnation_total", "dropped_unconfirmed_total"]
        .iter()
        .map(|c| nodes.counter(i, c))
        .sum()
}

/// Sends every recording to the running `survivors` three times over, checking between
/// rounds that their view stays `view` with quorum. Returns how many datagrams went out.
fn replay_and_check(nodes: &Nodes, recorded: &[Recorded], survivors: &[usize], view: u64) -> usize {
    use rustix::net::{socket, AddressFamily, SocketType};
    let raw = socket(AddressFamily::INET, SocketType::RAW, Some(rustix::net::ipproto::RAW)).expect("raw socket");
    let targets: BTreeSet<SocketAddrV4> = survivors
        .iter()
        .map(|&i| match nodes.addrs[i] {
            SocketAddr::V4(a) => a,
            _ => unreachable!(),
        })
        .collect();
    let mut sent = 0;
    for _ in 0..3 {
        for (k, d) in recorded.iter().filter(|d| targets.contains(&d.dst)).enumerate() {
            forge(&raw, d);
            sent += 1;
            if k % 32 == 31 {
                // Paced, so that the receivers' socket buffers take every one.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            for &i in survivors {
                let r = nodes.status(i).unwrap_or_else(|| panic!("p{i} does not answer"));
                let want: BTreeSet<String> = survivors.iter().map(|j| format!("p{j}")).collect();
                assert!(
                    r.quorum && r.view == view && in_view(&r) == want,
                    "replays moved p{i} from view {view} of {want:?}: {r:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    sent
}

#[test]
fn replayed_datagrams_of_dead_nodes_never_readmit_them_nor_take_quorum() {
    if !is_root() {
        eprintln!("skipped: recording and forging datagrams on lo needs root (AF_PACKET and raw sockets)");
        return;
    }
    let addrs = free_addrs(5, 0);
    let metrics = free_addrs(5, 50);
    let mut nodes = Nodes::new("replay", addrs.clone(), metrics);
    nodes.start(0, &[]);
    nodes.wait_for_view(&[0]);
    // Record everything the five send while four join and for a while after.
    let stop = Arc::new(AtomicBool::new(false));
    let recorded = Arc::new(Mutex::new(BTreeSet::new()));
    let ports = addrs.iter().map(|a| a.port()).collect();
    let sniffer = sniff(ports, stop.clone(), recorded.clone());
    for i in 1..5 {
        let seeds: Vec<usize> = [0, i - 1].into_iter().collect::<BTreeSet<_>>().into_iter().collect();
        nodes.start(i, &seeds);
    }
    nodes.wait_for_view(&[0, 1, 2, 3, 4]);
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    sniffer.join().unwrap();
    let recorded: Vec<Recorded> = recorded.lock().unwrap().iter().cloned().collect();
    let joins_of = |i: usize| recorded.iter().filter(|d| d.src.port() == addrs[i].port()).count();
    assert!((2..5).all(|i| joins_of(i) > 0), "the sniffer saw the joiners' datagrams");
    // Three die one after the other, each excluded before the next: the view of two.
    let mut alive = vec![0, 1, 2, 3, 4];
    for victim in [4, 3, 2] {
        nodes.kill(victim);
        alive.retain(|&i| i != victim);
        nodes.wait_for_view(&alive);
    }
    let view = nodes.wait_for_view(&[0, 1]);
    let before: Vec<u64> = [0, 1].iter().map(|&i| not_fresh(&nodes, i)).collect();
    let sent = replay_and_check(&nodes, &recorded, &[0, 1], view);
    let dropped: u64 = [0, 1].iter().zip(&before).map(|(&i, b)| not_fresh(&nodes, i) - b).sum();
    eprintln!("replayed {sent} recorded datagrams into view {view}: {dropped} dropped as not fresh");
    assert!(dropped > sent as u64 / 2, "the replays reached the survivors ({dropped} of {sent} counted)");
    // The survivors restart from their data directories, one after the other, and the
    // recording (their own earlier datagrams too) is sent again.
    for survivor in [1, 0] {
        nodes.kill(survivor);
        nodes.start(survivor, &[1 - survivor]);
        nodes.wait_for_view(&[0, 1]);
    }
    let view = nodes.wait_for_view(&[0, 1]);
    let sent = replay_and_check(&nodes, &recorded, &[0, 1], view);
    eprintln!("after both survivors restarted: replayed {sent} datagrams, view {view} held");
}

#[test]
fn nodes_that_all_start_with_seeds_say_why_they_stay_joining() {
    let addrs = free_addrs(2, 20);
    let metrics = free_addrs(2, 70);
    let mut nodes = Nodes::new("all-seeded", addrs, metrics);
    nodes.start(0, &[1]);
    nodes.start(1, &[0]);
    let deadline = Instant::now() + CHANGE_LIMIT;
    let said = |log: &Path| {
        std::fs::read_to_string(log).unwrap_or_default().lines().any(|l| {
            l.contains("still joining: seeds answer, but none is a member")
                && l.contains("The first node of a new cluster is started without --seeds")
        })
    };
    while !(0..2).all(|i| said(&nodes.log(i))) {
        assert!(Instant::now() < deadline, "no warning in the logs of nodes that cannot form a cluster");
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..2 {
        let s = nodes.status(i).expect("answers");
        assert_eq!((s.status.as_str(), s.view), ("joining", 0), "p{i}");
    }
}
