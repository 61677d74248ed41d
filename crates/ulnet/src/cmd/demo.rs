//! `ulnet demo`: a local cluster of processes exchanging messages.
//!
//! Node 0 (this process) starts the others. Every pair of nodes opens a shared-memory
//! channel; each node sends every other node a stream of messages of random sizes
//! (1 B – 1 MiB, from gather lists of 1–4 buffers) carrying a sequence number and a
//! checksum, and checks what it receives. Each node reports a JSON line; node 0 prints a
//! short summary.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::{ChannelId, Endpoint, EndpointConfig, Event, NodeId, SendOutcome};

/// Arguments of `ulnet demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Number of local processes.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Messages each node sends to each other node.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Trace every process's messages into DIR/node-N.ultrace and end with their study.
    #[arg(long, value_name = "DIR")]
    trace: Option<std::path::PathBuf>,
}

/// Arguments of one demo process.
#[derive(Args, Debug)]
pub struct DemoNodeArgs {
    #[arg(long)]
    run: String,
    #[arg(long)]
    index: usize,
    #[arg(long)]
    nodes: usize,
    #[arg(long)]
    messages: u64,
}

#[derive(Serialize, Deserialize, Debug)]
struct NodeReport {
    index: usize,
    sent: u64,
    received: u64,
    bytes_received: u64,
    bad: u64,
    secs: f64,
}

pub fn run(args: DemoArgs) -> Result<i32> {
    if !(2..=16).contains(&args.nodes) {
        bail!("--nodes must be between 2 and 16");
    }
    super::demo_trace::start(args.trace.as_deref())?;
    let run = format!("demo-{}", std::process::id());
    eprintln!("ulnet demo: starting {} local processes, full mesh of shared-memory channels", args.nodes);
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for index in 1..args.nodes {
        let child = Command::new(&exe)
            .args(["demo-node", "--run", &run, "--index", &index.to_string()])
            .args(["--nodes", &args.nodes.to_string(), "--messages", &args.messages.to_string()])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()?;
        children.push(child);
    }
    let mut reports = vec![node(&run, 0, args.nodes, args.messages)?];
    for mut child in children {
        let out = child.stdout.take().context("child stdout")?;
        let line = BufReader::new(out).lines().next().context("a node printed no report")??;
        reports.push(serde_json::from_str(&line)?);
        let status = child.wait()?;
        if !status.success() {
            bail!("a demo node exited with {status}");
        }
    }
    println!("node  sent      received  MB received  bad  seconds");
    let (mut sent, mut received, mut bytes, mut bad) = (0, 0, 0, 0);
    for r in &reports {
        println!(
            "{:>4}  {:>8}  {:>8}  {:>11.1}  {:>3}  {:>7.2}",
            r.index,
            r.sent,
            r.received,
            r.bytes_received as f64 / 1e6,
            r.bad,
            r.secs
        );
        sent += r.sent;
        received += r.received;
        bytes += r.bytes_received;
        bad += r.bad;
    }
    println!(
        "{} nodes exchanged {} messages ({:.1} MB); {} received, {} lost, {} corrupt or out of order",
        reports.len(),
        sent,
        bytes as f64 / 1e6,
        received,
        sent - received,
        bad
    );
    super::demo_trace::report(args.trace.as_deref(), reports.len())?;
    let rma_ok = super::demo_rma::run(args.nodes)?;
    let membership_ok = super::demo_cluster::run()?;
    let registry_ok = super::demo_registry::run()?;
    super::sort_demo::run(args.nodes)?;
    super::dc::demo()?;
    Ok(if bad == 0 && sent == received && rma_ok && membership_ok && registry_ok { 0 } else { 1 })
}

pub fn run_node(a: DemoNodeArgs) -> Result<i32> {
    let report = node(&a.run, a.index, a.nodes, a.messages)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(0)
}

/// A small deterministic generator, so the receiver can regenerate what the sender sent.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Size of message `seq` from `from` to `to`: mostly small, sometimes up to 1 MiB.
fn message_size(rng: &mut XorShift) -> usize {
    match rng.next() % 100 {
        0 => 1 + (rng.next() % (1 << 20)) as usize,
        1..=15 => 1 + (rng.next() % (64 << 10)) as usize,
        _ => 1 + (rng.next() % 256) as usize,
    }
}

fn node(run: &str, index: usize, nodes: usize, messages: u64) -> Result<NodeReport> {
    let mut ep = Endpoint::new(EndpointConfig { node_id: NodeId(index as u32), ..Default::default() });
    ep.listen_shm(&format!("{run}-{index}"))?;
    // peers[j] = channel to node j.
    let mut peers: Vec<Option<ChannelId>> = vec![None; nodes];
    for (j, peer) in peers.iter_mut().enumerate().take(index) {
        let ch = ep.connect_shm(&format!("{run}-{j}"), Duration::from_secs(10))?;
        anyhow::ensure!(ep.send(ch, &[&(index as u64).to_le_bytes()])? == SendOutcome::Done, "a new channel has room");
        *peer = Some(ch);
    }
    let mut unidentified = Vec::new();
    for _ in index + 1..nodes {
        unidentified.push(ep.accept(Duration::from_secs(10))?);
    }
    // Learn which node each accepted channel belongs to from its first message.
    while !unidentified.is_empty() {
        let mut hello = Vec::new();
        for &ch in &unidentified {
            ep.poll_channel(ch, 1, |e| {
                if let Event::Message { channel, data, .. } = e {
                    hello.push((channel, u64::from_le_bytes(data.try_into().unwrap_or([0xff; 8])) as usize));
                }
            });
        }
        for (ch, j) in hello {
            if j >= nodes || peers[j].is_some() {
                bail!("bad hello from a peer");
            }
            peers[j] = Some(ch);
            unidentified.retain(|c| *c != ch);
        }
    }
    let channel_of: Vec<ChannelId> = peers.iter().flatten().copied().collect();
    let node_of = |ch: ChannelId| peers.iter().position(|p| *p == Some(ch)).expect("known channel");

    let start = Instant::now();
    let mut tx_rng: Vec<XorShift> =
        (0..nodes).map(|j| XorShift(0x9e37_79b9_7f4a_7c15 ^ ((index * 64 + j) as u64 + 1))).collect();
    let mut rx_rng: Vec<XorShift> =
        (0..nodes).map(|j| XorShift(0x9e37_79b9_7f4a_7c15 ^ ((j * 64 + index) as u64 + 1))).collect();
    let mut next_tx = vec![0u64; nodes];
    let mut next_rx = vec![0u64; nodes];
    let mut partial: Vec<Vec<u8>> = vec![Vec::new(); nodes];
    let mut pending: Vec<Option<Vec<u8>>> = vec![None; nodes];
    let (mut received, mut bytes_received, mut bad, mut sent) = (0u64, 0u64, 0u64, 0u64);
    let mut byes = 0;
    let expected_total = messages * (nodes as u64 - 1);
    let deadline = start + Duration::from_secs(300);
    while received < expected_total || sent < expected_total {
        if Instant::now() > deadline {
            bail!("node {index}: timed out ({sent} sent, {received} received)");
        }
        for &ch in &channel_of {
            let j = node_of(ch);
            while next_tx[j] < messages {
                let msg = pending[j].take().unwrap_or_else(|| make_message(&mut tx_rng[j], next_tx[j]));
                // A gather list of up to four pieces: header, payload split in three.
                let cut = |k: usize| msg.len() * k / 4;
                let pieces = [&msg[..cut(1)], &msg[cut(1)..cut(2)], &msg[cut(2)..cut(3)], &msg[cut(3)..]];
                match ep.send(ch, &pieces)? {
                    SendOutcome::Done => {
                        next_tx[j] += 1;
                        sent += 1;
                    }
                    _ => {
                        pending[j] = Some(msg);
                        break;
                    }
                }
            }
        }
        let mut down = None;
        ep.poll(1024, |e| match e {
            Event::Message { channel, data, .. } if next_rx[node_of(channel)] == messages => {
                // A peer that finished sends "bye" after its last message.
                if data == b"bye" {
                    byes += 1;
                } else {
                    bad += 1;
                }
            }
            Event::Message { channel, data, message_len, offset, .. } => {
                let j = node_of(channel);
                if offset == 0 {
                    partial[j].clear();
                }
                partial[j].extend_from_slice(data);
                if offset + data.len() as u64 == message_len {
                    let want = make_message(&mut rx_rng[j], next_rx[j]);
                    if partial[j] != want {
                        bad += 1;
                    }
                    next_rx[j] += 1;
                    received += 1;
                    bytes_received += message_len;
                }
            }
            Event::ChannelDown { channel, error } if received < expected_total => {
                down = Some((node_of(channel), error))
            }
            _ => {}
        });
        if let Some((j, e)) = down {
            bail!("node {index}: channel to node {j} went down: {e}");
        }
    }
    // Wait until every peer is done with us before closing, so no one sees an early close.
    let secs = start.elapsed().as_secs_f64();
    for &ch in &channel_of {
        let _ = ep.send(ch, &[b"bye"]);
    }
    let bye_deadline = Instant::now() + Duration::from_secs(30);
    while byes < channel_of.len() && Instant::now() < bye_deadline {
        ep.poll(64, |e| {
            if let Event::Message { data: b"bye", .. } = e {
                byes += 1;
            }
        });
    }
    Ok(NodeReport { index, sent, received, bytes_received, bad, secs })
}

/// Message `seq` of a stream: 8-byte sequence number, then generated bytes.
fn make_message(rng: &mut XorShift, seq: u64) -> Vec<u8> {
    let len = message_size(rng).max(8);
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&seq.to_le_bytes());
    let mut fill = XorShift(seq.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    while m.len() < len {
        m.extend_from_slice(&fill.next().to_le_bytes());
    }
    m.truncate(len);
    m
}
