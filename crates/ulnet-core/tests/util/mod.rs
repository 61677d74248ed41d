//! Helpers shared by the integration tests: child processes and message generators.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, Event, NodeId, SendOutcome};

/// Environment variable that turns a test function into a child process's entry point.
pub const CHILD_ENV: &str = "ULNET_TEST_CHILD";

/// Runs `test_name` of this test binary in a child process with `CHILD_ENV=role`.
pub fn spawn_child(test_name: &str, role: &str, extra_env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// The role this process was started with, if it is a child.
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// A name unique to this test run, for shared-memory rendezvous.
pub fn unique_name(what: &str) -> String {
    format!("test-{what}-{}-{:x}", std::process::id(), rand::random::<u64>())
}

/// Size of message `i`: 80% up to 256 B, 19% up to 64 KiB, 1% up to 1 MiB.
pub fn random_size(rng: &mut impl Rng) -> usize {
    match rng.gen_range(0..100) {
        0 => rng.gen_range(1..=1 << 20),
        1..=19 => rng.gen_range(1..=64 << 10),
        _ => rng.gen_range(1..=256),
    }
}

/// Message `seq` of a seeded stream: 8-byte sequence number, pseudo-random bytes, and the
/// CRC32C of everything before it in the last 4 bytes (messages shorter than 12 bytes carry
/// only a prefix of the sequence number).
pub fn make_message(rng: &mut rand_chacha::ChaCha8Rng, seq: u64) -> Vec<u8> {
    let len = random_size(rng);
    let mut m = vec![0u8; len];
    let head = len.min(8);
    m[..head].copy_from_slice(&seq.to_le_bytes()[..head]);
    if len > 12 {
        let mut fill = rand_chacha::ChaCha8Rng::seed_from_u64(seq);
        fill.fill(&mut m[8..len - 4]);
        let crc = crc32c::crc32c(&m[..len - 4]);
        m[len - 4..].copy_from_slice(&crc.to_le_bytes());
    }
    m
}

/// Checks a received message against the expectation for `seq`.
pub fn check_message(m: &[u8], seq: u64, expected_len: usize) -> Result<(), String> {
    if m.len() != expected_len {
        return Err(format!("message {seq}: length {} != {expected_len}", m.len()));
    }
    let head = m.len().min(8);
    if m[..head] != seq.to_le_bytes()[..head] {
        return Err(format!("message {seq}: wrong sequence number (lost, duplicated or reordered)"));
    }
    if m.len() > 12 {
        let crc = crc32c::crc32c(&m[..m.len() - 4]);
        if m[m.len() - 4..] != crc.to_le_bytes() {
            return Err(format!("message {seq}: checksum mismatch"));
        }
    }
    Ok(())
}

/// Splits `m` into 1–4 pieces at random points: a gather list.
pub fn random_gather<'a>(rng: &mut impl Rng, m: &'a [u8]) -> Vec<&'a [u8]> {
    let pieces = rng.gen_range(1..=4usize);
    let mut cuts: Vec<usize> = (0..pieces - 1).map(|_| rng.gen_range(0..=m.len())).collect();
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(pieces);
    let mut start = 0;
    for c in cuts {
        out.push(&m[start..c]);
        start = c;
    }
    out.push(&m[start..]);
    out
}

/// Sends, polling (and failing on a dead channel) while there is no room.
pub fn send_blocking(ep: &mut Endpoint, ch: ChannelId, gather: &[&[u8]], timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        match ep.send(ch, gather).map_err(|e| e.to_string())? {
            SendOutcome::Done => return Ok(()),
            _ => {
                let mut down = None;
                ep.poll(16, |e| {
                    if let Event::ChannelDown { error, .. } = e {
                        down = Some(error.to_string());
                    }
                });
                if let Some(e) = down {
                    return Err(e);
                }
                if Instant::now() > deadline {
                    return Err("send timed out".into());
                }
            }
        }
    }
}

/// Receives until `n` whole messages arrived (reassembling fragments), the channel went
/// down, or `within` passed.
pub fn receive_whole(
    ep: &mut Endpoint,
    n: usize,
    within: Duration,
) -> (Vec<Vec<u8>>, Option<ulnet_core::ChannelError>) {
    let mut whole = Vec::new();
    let mut partial = Vec::new();
    let mut down = None;
    let deadline = Instant::now() + within;
    while whole.len() < n && down.is_none() && Instant::now() < deadline {
        ep.poll(64, |e| match e {
            Event::Message { data, message_len, offset, .. } => {
                assert_eq!(offset, partial.len() as u64, "fragments in order");
                partial.extend_from_slice(data);
                if partial.len() as u64 == message_len {
                    whole.push(std::mem::take(&mut partial));
                }
            }
            Event::ChannelDown { error, .. } => down = Some(error),
            Event::SendComplete { .. } => {}
        });
    }
    (whole, down)
}

/// A shared-memory channel between two endpoints of this process, of nodes `server` and
/// `client`: (server, its channel, client, its channel).
pub fn shm_pair(what: &str, server: u32, client: u32) -> (Endpoint, ChannelId, Endpoint, ChannelId) {
    let endpoint = |node| Endpoint::new(EndpointConfig { node_id: NodeId(node), ..Default::default() });
    let name = unique_name(what);
    let mut listener = endpoint(server);
    listener.listen_shm(&name).unwrap();
    let connector = std::thread::spawn(move || {
        let mut c = endpoint(client);
        let ch = c.connect_shm(&name, Duration::from_secs(5)).unwrap();
        (c, ch)
    });
    let sch = listener.accept(Duration::from_secs(5)).unwrap();
    let (c, ch) = connector.join().unwrap();
    (listener, sch, c, ch)
}
