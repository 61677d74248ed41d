//! The control plane of a real `ulnet node` process (TCP, on loopback) against clients that
//! misbehave or merely go away: idle, garbage and half-finished connections cost the
//! authenticated clients nothing and are dropped and counted; the sockets of finished CLI
//! calls are released; a node out of file descriptors says so and keeps answering; a CLI
//! call to an address where nothing listens fails at once, saying what happened.

mod common;

use common::free_addrs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SECRET: &str = "control-plane-processes-secret";

/// One `ulnet node` with a data directory (so the registry runs) and a metrics address.
struct Node {
    dir: PathBuf,
    addr: SocketAddr,
    metrics: SocketAddr,
    child: Child,
}

impl Node {
    fn start(salt: u16, tag: &str) -> Node {
        let dir = std::env::temp_dir().join(format!("ulnet-control-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), SECRET).unwrap();
        let addrs = free_addrs(2, salt);
        let mut c = Command::new(env!("CARGO_BIN_EXE_ulnet"));
        c.args(["node", "--name", "n0", "--listen", &addrs[0].to_string()]);
        c.args(["--secret-file", dir.join("secret").to_str().unwrap()]);
        c.args(["--data-dir", dir.join("data").to_str().unwrap()]);
        c.args(["--metrics", &addrs[1].to_string()]);
        let log = std::fs::File::create(dir.join("node.log")).unwrap();
        let child = c
            .env("ULNET_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let node = Node { dir, addr: addrs[0], metrics: addrs[1], child };
        node.wait_ready();
        node
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `ulnet ARGS --connect <node> --secret-file <secret>`.
    fn cli(&self, args: &[&str]) -> Output {
        cli_to(&self.addr.to_string(), &self.dir.join("secret"), args)
    }

    /// Waits until the node is a member and its registry takes a set.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.cli(&["cluster", "status", "--json"]);
            let member = status.status.success() && String::from_utf8_lossy(&status.stdout).contains("\"member\"");
            if member && self.cli(&["registry", "set", "ready", "yes"]).status.success() {
                return;
            }
            assert!(Instant::now() < deadline, "the node did not become ready; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("node.log")).unwrap_or_default()
    }

    /// The node's Prometheus text.
    fn metrics_text(&self) -> String {
        let mut s = TcpStream::connect(self.metrics).expect("metrics server");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    }

    /// The value of the sample `name` (with its labels, if any, as written) in the node's
    /// metrics; 0 when absent.
    fn metric(&self, name: &str) -> u64 {
        sample(&self.metrics_text(), name)
    }

    /// Open descriptors of the node process.
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).unwrap().count()
    }

    /// The node's TCP sockets in CLOSE-WAIT (the peer closed, the node did not).
    fn close_wait_sockets(&self) -> usize {
        let inodes = socket_inodes(self.pid());
        let mut n = 0;
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else { continue };
            for line in text.lines().skip(1) {
                let cols: Vec<&str> = line.split_whitespace().collect();
                // Column 3 is the state (08: CLOSE_WAIT), column 9 the inode.
                if cols.len() > 9 && cols[3] == "08" && inodes.contains(&cols[9].to_string()) {
                    n += 1;
                }
            }
        }
        n
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn cli_to(addr: &str, secret: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ulnet"))
        .args(args)
        .args(["--connect", addr, "--secret-file", secret.to_str().unwrap()])
        .env("ULNET_LOG", "error")
        .output()
        .unwrap()
}

fn assert_success(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed: {stderr}");
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The value of sample `name` in Prometheus text (0 when absent).
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0, |v| v.trim().parse().unwrap_or_else(|_| panic!("{name}: not a number: {v}")))
}

/// The inodes of the sockets process `pid` holds.
fn socket_inodes(pid: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(String::from))
        .collect()
}

/// The first bytes of a HELLO of the TCP handshake (magic, version, half a nonce), never
/// finished.
fn half_hello() -> Vec<u8> {
    let mut h = b"ULNETTCP".to_vec();
    h.extend_from_slice(&2u32.to_le_bytes());
    h.extend_from_slice(&[7u8; 8]);
    h
}

/// Polls `f` until it is true, or panics with `what` after `within`.
fn eventually(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const HANDSHAKES_ENDED: [&str; 6] = [
    "ulnet_control_handshakes_dropped_total",
    "ulnet_control_handshakes_timed_out_total",
    "ulnet_control_handshakes_refused_total{reason=\"not_ulnet\"}",
    "ulnet_control_handshakes_refused_total{reason=\"version\"}",
    "ulnet_control_handshakes_refused_total{reason=\"bad_secret\"}",
    "ulnet_control_handshakes_refused_total{reason=\"closed\"}",
];

#[test]
fn idle_garbage_and_half_hello_connections_cost_authenticated_clients_nothing() {
    let node = Node::start(0, "idle");
    let accepted_before = node.metric("ulnet_control_connections_accepted_total");
    // 200 connections that never finish a handshake: 150 say nothing, 25 send garbage, 25
    // half a HELLO. They stay open while the clients below run.
    let mut strangers = Vec::new();
    for i in 0..200 {
        let mut s = TcpStream::connect(node.addr).unwrap();
        match i {
            150..175 => s.write_all(&[0xAB; 64]).unwrap(),
            175.. => s.write_all(&half_hello()).unwrap(),
            _ => {}
        }
        strangers.push(s);
    }
    let status = assert_success(&node.cli(&["cluster", "status", "--json"]), "cluster status");
    assert!(status.contains("\"member\""), "{status}");
    let set = assert_success(&node.cli(&["registry", "set", "k", "v1"]), "registry set");
    assert!(set.starts_with("set k at position "), "the confirmation goes to stdout: {set:?}");
    assert_eq!(assert_success(&node.cli(&["registry", "get", "k"]), "registry get"), "v1\n");

    // Every stranger's connection is ended by the node (dropped for the bound, timed out or
    // refused) and counted; none is left in handshake.
    let ended = || HANDSHAKES_ENDED.iter().map(|m| node.metric(m)).sum::<u64>();
    eventually(Duration::from_secs(20), "the node ends all 200 strangers' handshakes", || ended() >= 200);
    let text = node.metrics_text();
    assert_eq!(sample(&text, "ulnet_control_handshakes_pending"), 0, "{text}");
    assert!(sample(&text, "ulnet_control_connections_accepted_total") >= accepted_before + 203, "{text}");
    assert!(sample(&text, "ulnet_control_handshakes_dropped_total") > 0, "the bound dropped the oldest: {text}");
    assert!(sample(&text, "ulnet_control_handshakes_refused_total{reason=\"not_ulnet\"}") > 0, "{text}");
    assert!(node.log().contains("refused"), "refusals are logged:\n{}", node.log());
    // The node closed their connections: each stranger reads the end of its stream.
    for s in &mut strangers {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 128];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("a stranger's connection is still open: {e}"),
            }
        }
    }
    assert_success(&node.cli(&["cluster", "status"]), "cluster status after the strangers");
}

#[test]
fn cli_calls_leave_no_socket_behind() {
    let node = Node::start(10, "leak");
    let fds_before = node.fds();
    for i in 0..500 {
        let out = match i % 5 {
            0 => node.cli(&["registry", "set", &format!("k{}", i % 7), "v"]),
            1 => node.cli(&["registry", "get", "ready"]),
            _ => node.cli(&["cluster", "status"]),
        };
        assert_success(&out, &format!("call {i}"));
    }
    eventually(Duration::from_secs(10), "the node's descriptors return to their count before the calls", || {
        node.fds() <= fds_before + 4
    });
    assert_eq!(node.close_wait_sockets(), 0, "sockets the clients closed are closed by the node");
    // The control thread publishes its counters every few milliseconds.
    eventually(Duration::from_secs(10), "the metrics count 500 channels closed, none open", || {
        let text = node.metrics_text();
        sample(&text, "ulnet_control_channels_closed_by_peer_total") >= 500
            && sample(&text, "ulnet_control_channels_open") == 0
    });
}

#[test]
fn a_node_out_of_file_descriptors_says_so_and_keeps_answering() {
    let node = Node::start(20, "emfile");
    let limit = node.fds() + 12;
    let prlimit = Command::new("prlimit")
        .args([&format!("--pid={}", node.pid()), &format!("--nofile={limit}:{limit}")])
        .status()
        .expect("prlimit (util-linux)");
    assert!(prlimit.success());
    // More idle connections than the node has descriptors left for.
    let strangers: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(node.addr).unwrap()).collect();
    eventually(Duration::from_secs(10), "the node counts failed accepts", || {
        sample(&node.metrics_text(), "ulnet_control_accept_failed_total") > 0
    });
    drop(strangers);
    // The limit still holds: the node keeps answering call after call.
    for i in 0..100 {
        let out = node.cli(&["cluster", "status"]);
        if !out.status.success() {
            // A call may meet the limit while the strangers' sockets are being released.
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("os error"), "call {i}: a raw system error reached the user: {stderr}");
            std::thread::sleep(Duration::from_millis(100));
            assert_success(&node.cli(&["cluster", "status"]), &format!("call {i}, again"));
        }
    }
    assert_success(&node.cli(&["registry", "get", "ready"]), "registry get under the limit");
    let log = node.log();
    assert!(log.contains("cannot accept"), "the node says why it could not accept:\n{log}");
}

#[test]
fn registry_set_to_a_port_with_no_listener_fails_at_once_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let nobody = free_addrs(1, 30)[0].to_string();
    let timeout_ms = 60_000;
    let start = Instant::now();
    let out = cli_to(&nobody, &secret, &["registry", "set", "k", "v", "--timeout-ms", &timeout_ms.to_string()]);
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("nothing listens at") && stderr.contains(&nobody), "{stderr}");
    assert!(!stderr.contains("os error"), "{stderr}");
    // Refused at once rather than retried until --timeout-ms: far below it whatever the load.
    assert!(took < Duration::from_millis(timeout_ms / 4), "failed only after {took:?}");
    let out = cli_to(&nobody, &secret, &["cluster", "status"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing listens at"));
}
