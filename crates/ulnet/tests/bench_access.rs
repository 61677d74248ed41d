//! Benchmark servers answer only holders of the secret, and grant each only what its test
//! needs (issue #31 part 5): a `get-lat` server's segment can be neither imported, read
//! nor written by a client without the secret or with another one, over tcp and udp; a
//! client with the secret may read it and nothing more (its puts and atomics are refused
//! with the typed error and the memory stays as it was); and a server will not listen
//! beyond loopback without a secret.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use ulnet_core::rma::{AccessError, NodeId, Rights, Rma, RmaConfig, RmaError};

const T: Duration = Duration::from_secs(10);
/// The node ids `ulnet bench` gives its server and its client.
const SERVER: NodeId = NodeId(1);
const CLIENT: NodeId = NodeId(2);

fn secret_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Starts `ulnet bench get-lat --server` over `transport` with `secret`; returns it and
/// the address it listens on.
fn get_lat_server(transport: &str, secret: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ulnet"))
        .args(["bench", "get-lat", "--server", "--listen", "127.0.0.1:0", "--transport", transport])
        .args(["--iters", "10", "--warmup", "1", "--secret-file"])
        .arg(secret)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening ").unwrap_or_else(|| panic!("not listening: {line:?}")).into();
    (child, addr)
}

fn rma(node: NodeId, secret: &[u8]) -> Rma {
    let mut config = RmaConfig::new(node);
    config.tcp.secret = secret.to_vec();
    config.udp.secret = secret.to_vec();
    Rma::new(config).unwrap()
}

fn connect(me: &mut Rma, transport: &str, addr: &str) -> Result<ulnet_core::rma::PeerId, ulnet_core::ConnectError> {
    match transport {
        "tcp" => me.connect_tcp(addr, T),
        _ => me.connect_udp(addr, Duration::from_secs(2)),
    }
}

/// `ulnet bench TEST --connect addr` with `extra` arguments: whether it succeeded, and
/// its stderr.
fn bench_client(test: &str, transport: &str, addr: &str, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ulnet"))
        .args(["bench", test, "--connect", addr, "--transport", transport, "--size", "64"])
        .args(["--iters", "200", "--warmup", "1"])
        .args(extra)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn strangers_cannot_reach_a_bench_servers_segment() {
    let dir = tempfile::tempdir().unwrap();
    let secret = b"the benchmark's secret";
    let ours = secret_file(&dir, "secret", secret);
    let theirs = secret_file(&dir, "other", b"a stranger's secret");
    for transport in ["tcp", "udp"] {
        let (server, addr) = get_lat_server(transport, &ours);
        // Without the secret, or with another: no channel, so no import, read or write.
        for stranger_secret in [&b""[..], b"a stranger's secret"] {
            let mut stranger = rma(CLIENT, stranger_secret);
            let r = connect(&mut stranger, transport, &addr);
            assert!(r.is_err(), "{transport}: a stranger connected with {stranger_secret:?}");
        }
        // The reproduction: a foreign put-bw client writing into a get-lat server.
        for extra in [&[][..], &["--secret-file", theirs.to_str().unwrap()]] {
            let (ok, stderr) = bench_client("put-bw", transport, &addr, extra);
            assert!(!ok && stderr.contains("cluster secret"), "{transport} {extra:?}: {stderr}");
        }
        // With the secret, the client node reads and does nothing else.
        let mut client = rma(CLIENT, secret);
        let server_peer = connect(&mut client, transport, &addr).unwrap();
        let seg = client.import(server_peer, "bench").unwrap();
        assert_eq!(seg.rights(), Some(Rights::READ), "{transport}: get-lat grants reading only");
        let mut before = vec![0u8; 64];
        client.get_blocking(&seg, 0, &mut before, T).unwrap();
        let denied = Err(RmaError::Access(AccessError::Denied));
        assert_eq!(client.put_blocking(&seg, 0, &[0xee; 64], T), denied, "{transport}: put");
        assert_eq!(client.fetch_and_add_blocking(&seg, 0, 1, T).map(|_| ()), denied, "{transport}: faa");
        assert_eq!(client.compare_and_swap_blocking(&seg, 8, 0, 9, T).map(|_| ()), denied, "{transport}: cas");
        let mut after = vec![0u8; 64];
        client.get_blocking(&seg, 0, &mut after, T).unwrap();
        assert_eq!(after, before, "{transport}: refused operations changed nothing");
        let (ok, stderr) = bench_client("put-bw", transport, &addr, &["--secret-file", ours.to_str().unwrap()]);
        assert!(!ok && stderr.contains("not permitted"), "{transport}: put-bw with the secret: {stderr}");
        // A holder of the secret claiming to be the server itself is granted nothing.
        let mut impostor = rma(SERVER, secret);
        let peer = connect(&mut impostor, transport, &addr).unwrap();
        let as_server = impostor.import(peer, "bench").unwrap();
        assert_eq!(as_server.rights(), Some(Rights::NONE));
        assert_eq!(impostor.get_blocking(&as_server, 0, &mut after, T), denied, "{transport}: impostor");
        // The client's "done" ends the server, which served all this without failing.
        let control = client.import(server_peer, "bench-control").unwrap();
        client.put_blocking(&control, 2048, &1u64.to_ne_bytes(), T).unwrap();
        let out = server.wait_with_output().unwrap();
        assert!(out.status.success(), "{transport}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn a_server_beyond_loopback_needs_a_secret() {
    for transport in ["tcp", "udp"] {
        let out = Command::new(env!("CARGO_BIN_EXE_ulnet"))
            .args(["bench", "get-lat", "--server", "--listen", "0.0.0.0:0", "--transport", transport])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("--secret-file"), "{transport}: {stderr}");
        // The development flag lets it listen.
        let mut child = Command::new(env!("CARGO_BIN_EXE_ulnet"))
            .args(["bench", "get-lat", "--server", "--listen", "0.0.0.0:0", "--transport", transport])
            .arg("--insecure-no-secret")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("listening "), "{transport}: {line:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
