//! `ulnet bench incast`: N sender processes stream to one receiver (the hot spot of the
//! thesis's tree-saturation study). Reports the aggregate throughput at the receiver, each
//! sender's share, Jain's fairness index over the shares, and — measured in the same run —
//! a single stream's throughput, so the aggregate can be read as a fraction of it. Over
//! UDP, `--flow-control off` makes the senders ignore the receiver's credit, to show what
//! per-stream flow control is worth.
//!
//! Senders sleep in `Endpoint::wait` when they have no room (blocking mode), so idle
//! senders leave the CPU to the receiver; the receiver busy-polls. On a host with two or
//! more CPUs the receiver is pinned to one CPU and every sender to another, as if the
//! senders were other hosts: the single stream and the N streams then have the same
//! resources, and the comparison measures the protocol, not the scheduler.
//!
//! What that placement cannot equalise: N sender processes on one CPU take turns on it
//! and share its caches, where real senders on N hosts would each have a CPU of their own.
//! (Eight senders cost about twice a lone sender's CPU per byte until each was bounded to
//! `UdpConfig::unsent_max` written ahead of its credit: blocked senders had filled their
//! send slots megabytes ahead, and the kernel copied them out of memory; see BENCHMARKS.md,
//! issue 3.) `--streams-per-sender K`
//! puts K of the N streams in each sender process (one thread sending round-robin), so
//! the receiver's side of incast — N sockets, N credit-controlled streams, fairness among
//! them — is measured without that cost; the default (K = 1) stays one process per sender.

use super::access::PeerAccess;
use super::{BenchArgs, TransportArg, CONNECT_TIMEOUT};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use ulnet_core::transport::udp::UdpConfig;
use ulnet_core::{ChannelError, ChannelId, Endpoint, EndpointConfig, Event, NodeId, SendError, SendOutcome};

/// Unmeasured time after every sender connected, for the streams to settle.
const WARMUP: Duration = Duration::from_millis(300);
/// Environment variable that tells a sender process which CPU to pin itself to.
const SENDER_CPU_ENV: &str = "ULNET_INCAST_CPU";

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    match rustix::process::sched_getaffinity(None) {
        Ok(set) => (0..rustix::process::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => Vec::new(),
    }
}

/// Pins the calling process to one CPU (best effort: an error only costs isolation).
fn pin_to(cpu: usize) {
    let mut set = rustix::process::CpuSet::new();
    set.set(cpu);
    if let Err(e) = rustix::process::sched_setaffinity(None, &set) {
        tracing::warn!("incast: cannot pin to CPU {cpu}: {e}");
    }
}

#[derive(Serialize)]
struct IncastReport {
    test: &'static str,
    transport: &'static str,
    size: usize,
    senders: usize,
    /// Streams per sender process (`--streams-per-sender`); 1: a process per sender.
    streams_per_sender: usize,
    flow_control: bool,
    duration_s: f64,
    /// Aggregate at the receiver, 10^6 bytes per second.
    mb_per_s: f64,
    msgs_per_s: f64,
    /// One sender alone, same settings, measured in the same run before, between and
    /// after the cycles of N senders: the median of those phases (absent with --senders 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    single_stream_mb_per_s: Option<f64>,
    /// The median over the cycles of each cycle's aggregate divided by the mean of the
    /// single streams measured right before and right after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregate_ratio: Option<f64>,
    /// Each cycle's ratio, in order.
    cycle_ratios: Vec<f64>,
    /// Jain's fairness index over the senders' throughputs (their bytes over all cycles):
    /// 1 is a perfectly even split.
    fairness: f64,
    /// Each sender's throughput, averaged over the cycles.
    per_sender_mb_per_s: Vec<f64>,
    /// What the N senders and the receiver did during the N-sender phase (absent over tcp).
    #[serde(skip_serializing_if = "Option::is_none")]
    udp: Option<UdpActivity>,
}

/// Where the time of the N-sender phase went, over UDP: the senders' retransmissions and
/// credit stalls, the receiver's acks, and datagrams the kernel dropped for want of
/// receive-buffer room (host-wide, so only meaningful on an otherwise idle loopback).
#[derive(Serialize, Default, Clone, Copy)]
struct UdpActivity {
    sender_packets: u64,
    sender_retransmits: u64,
    sender_timeouts: u64,
    sender_credit_stalls: u64,
    /// Share of the senders' lifetime their next packet waited for credit, averaged.
    sender_credit_blocked_fraction: f64,
    receiver_acks_sent: u64,
    kernel_rcvbuf_drops: u64,
}

impl UdpActivity {
    /// Adds one of `cycles` N-sender phases: counts summed, the blocked share averaged.
    fn add(&mut self, phase: &UdpActivity, cycles: usize) {
        self.sender_packets += phase.sender_packets;
        self.sender_retransmits += phase.sender_retransmits;
        self.sender_timeouts += phase.sender_timeouts;
        self.sender_credit_stalls += phase.sender_credit_stalls;
        self.sender_credit_blocked_fraction += phase.sender_credit_blocked_fraction / cycles as f64;
        self.receiver_acks_sent += phase.receiver_acks_sent;
        self.kernel_rcvbuf_drops += phase.kernel_rcvbuf_drops;
    }
}

/// The median of `xs` (the mean of the middle two for an even count; 0 for none).
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Prefix of the line a sender process prints on exit with its counters.
const COUNTERS_LINE: &str = "incast-sender-counters";

/// The kernel's count of UDP datagrams dropped for a full receive buffer (`RcvbufErrors`
/// in /proc/net/snmp), or 0 where that is unreadable.
fn kernel_rcvbuf_errors() -> u64 {
    let Ok(snmp) = std::fs::read_to_string("/proc/net/snmp") else { return 0 };
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Jain's fairness index: (Σx)² / (n·Σx²).
pub(super) fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

fn endpoint_config(access: &PeerAccess, flow_control: bool) -> EndpointConfig {
    let mut config = access.endpoint_config(NodeId::default());
    config.udp = UdpConfig { flow_control, secret: std::mem::take(&mut config.udp.secret), ..UdpConfig::lan() };
    config
}

fn flag(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

pub(super) fn run(args: &BenchArgs) -> Result<i32> {
    if args.transport == TransportArg::Shm {
        bail!("incast runs over udp or tcp");
    }
    let size = args.size.unwrap_or(64 << 10).max(1);
    let flow_control = args.flow_control != "off";
    if let Some(addr) = &args.connect {
        let access = PeerAccess::of(args)?;
        return sender(&access, args.transport, addr, size, flow_control, args.streams_per_sender.max(1)).map(|()| 0);
    }
    let duration = Duration::from_millis(args.duration_ms);
    let senders = args.senders.max(1);
    let cycles = args.cycles.max(1);
    // The single stream is measured before, between and after the cycles of N streams
    // (S N S N … S), so that a change of the host's speed during the run weighs on both
    // sides of every cycle's ratio.
    let baseline = senders > 1 && !args.server;
    // Read once, before the first phase pins this process to one of them: every phase
    // places the receiver and the senders on the same CPUs.
    let cpus = allowed_cpus();
    let single_phase = || receive(args, &cpus, 1, size, flow_control, duration).map(|r| r.0[0]);
    let mut singles = Vec::new();
    if baseline {
        singles.push(single_phase()?);
    }
    let mut per_sender = vec![0.0; senders];
    let (mut aggregates, mut rates, mut cycle_ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut activity = UdpActivity::default();
    for _ in 0..cycles {
        let (shares, msgs, phase) = receive(args, &cpus, senders, size, flow_control, duration)?;
        let aggregate: f64 = shares.iter().sum();
        per_sender.iter_mut().zip(&shares).for_each(|(total, s)| *total += s / cycles as f64);
        aggregates.push(aggregate);
        rates.push(msgs);
        activity.add(&phase, cycles);
        if baseline {
            singles.push(single_phase()?);
            let around = (singles[singles.len() - 2] + singles[singles.len() - 1]) / 2.0;
            cycle_ratios.push(aggregate / around);
        }
    }
    let single = baseline.then(|| median(&singles));
    let report = IncastReport {
        test: "incast",
        transport: args.transport.name(),
        size,
        senders,
        streams_per_sender: args.streams_per_sender.max(1),
        flow_control,
        duration_s: duration.as_secs_f64(),
        mb_per_s: median(&aggregates),
        msgs_per_s: median(&rates),
        single_stream_mb_per_s: single,
        aggregate_ratio: baseline.then(|| median(&cycle_ratios)),
        cycle_ratios,
        fairness: jain(&per_sender),
        per_sender_mb_per_s: per_sender,
        udp: (args.transport == TransportArg::Udp && !args.server).then_some(activity),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "incast over {}: {} senders{} x {} B, flow control {}: aggregate {:.1} MB/s{}, fairness {:.3}{}",
            report.transport,
            senders,
            if report.streams_per_sender > 1 {
                format!(" ({} streams per sender process)", report.streams_per_sender)
            } else {
                String::new()
            },
            size,
            flag(flow_control),
            report.mb_per_s,
            report.aggregate_ratio.map_or(String::new(), |r| format!(
                " ({r:.2} x one stream's {:.1} MB/s, median of {cycles} cycles)",
                report.single_stream_mb_per_s.unwrap_or(0.0)
            )),
            report.fairness,
            report.udp.map_or(String::new(), |u| format!(
                "; senders blocked on credit {:.1}% of the time ({} stalls), {} retransmits, {} timeouts; receiver {} acks; kernel drops {}",
                u.sender_credit_blocked_fraction * 100.0,
                u.sender_credit_stalls,
                u.sender_retransmits,
                u.sender_timeouts,
                u.receiver_acks_sent,
                u.kernel_rcvbuf_drops
            ))
        );
    }
    Ok(0)
}

/// Listens, starts sender processes for `senders` streams (`--streams-per-sender` each; or
/// waits for remote ones with `--server`),
/// and measures what each delivers during `duration`; the receiver runs on `cpus[0]` and
/// the senders on `cpus[1]` (the CPUs the process was allowed before any phase pinned it).
/// Returns MB/s per sender and the aggregate message rate, and what the senders and the
/// receiver did.
fn receive(
    args: &BenchArgs,
    cpus: &[usize],
    senders: usize,
    size: usize,
    flow_control: bool,
    duration: Duration,
) -> Result<(Vec<f64>, f64, UdpActivity)> {
    let drops_before = kernel_rcvbuf_errors();
    let access = PeerAccess::of(args)?;
    let mut ep = Endpoint::new(endpoint_config(&access, flow_control));
    let listen = args.listen.clone().unwrap_or_else(|| "127.0.0.1:0".into());
    access.check_listen(args.transport, &listen)?;
    let addr = match args.transport {
        TransportArg::Udp => ep.listen_udp(&listen)?,
        TransportArg::Tcp => ep.listen_tcp(&listen)?,
        TransportArg::Shm => unreachable!("refused above"),
    };
    let mut children: Vec<Child> = Vec::new();
    if args.server {
        println!("listening {addr}");
    } else {
        if cpus.len() >= 2 {
            pin_to(cpus[0]);
        }
        let exe = std::env::current_exe()?;
        let per_process = args.streams_per_sender.max(1);
        for first in (0..senders).step_by(per_process) {
            let streams = per_process.min(senders - first);
            let mut command = Command::new(&exe);
            command
                .args(["bench", "incast", "--connect", &addr.to_string(), "--transport", args.transport.name()])
                .args(["--streams-per-sender", &streams.to_string()])
                .args(["--size", &size.to_string(), "--flow-control", flag(flow_control)])
                .env(SENDER_CPU_ENV, cpus.get(1).map_or(String::new(), |c| c.to_string()))
                .stdout(Stdio::piped());
            access.pass_to(&mut command);
            let mut child = command.spawn().context("starting a sender process")?;
            access.hand_over(&mut child)?;
            children.push(child);
        }
    }
    let mut channels: Vec<ChannelId> = Vec::new();
    while channels.len() < senders {
        channels.push(ep.accept(CONNECT_TIMEOUT).context("waiting for the senders")?);
    }
    let index_of = |ch: ChannelId| channels.iter().position(|&c| c == ch);
    let mut bytes = vec![0u64; senders];
    let mut messages = 0u64;
    let mut failure = None;
    let start = Instant::now();
    let mut measuring = false;
    let mut t0 = start;
    loop {
        let now = Instant::now();
        if !measuring && now >= start + WARMUP {
            measuring = true;
            t0 = now;
            bytes.iter_mut().for_each(|b| *b = 0);
            messages = 0;
        }
        if measuring && now >= t0 + duration {
            break;
        }
        ep.poll(256, |e| match e {
            Event::Message { channel, data, message_len, offset, .. } => {
                if let Some(i) = index_of(channel) {
                    bytes[i] += data.len() as u64;
                    if offset + data.len() as u64 == message_len {
                        messages += 1;
                    }
                }
            }
            Event::ChannelDown { error, .. } => failure = Some(error),
            Event::SendComplete { .. } => {}
        });
        if let Some(e) = failure.take() {
            bail!("a sender went away: {e}");
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    for ch in channels.iter().copied() {
        ep.close(ch);
    }
    let mut activity = UdpActivity { receiver_acks_sent: ep.udp_counters().acks_sent, ..Default::default() };
    let mut blocked_fraction_sum = 0.0;
    for c in children {
        let output = c.wait_with_output()?;
        if !output.status.success() {
            bail!("a sender process exited with {}", output.status);
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout.lines().find_map(|l| l.strip_prefix(COUNTERS_LINE));
        let fields: Vec<u64> = line.unwrap_or("").split_whitespace().filter_map(|v| v.parse().ok()).collect();
        if let [packets, retransmits, timeouts, stalls, blocked_us, lifetime_us] = fields[..] {
            activity.sender_packets += packets;
            activity.sender_retransmits += retransmits;
            activity.sender_timeouts += timeouts;
            activity.sender_credit_stalls += stalls;
            // Summed over the process's streams: the mean below is per stream.
            blocked_fraction_sum += blocked_us as f64 / lifetime_us.max(1) as f64;
        }
    }
    activity.sender_credit_blocked_fraction = blocked_fraction_sum / senders as f64;
    activity.kernel_rcvbuf_drops = kernel_rcvbuf_errors().saturating_sub(drops_before);
    Ok((bytes.iter().map(|&b| b as f64 / secs / 1e6).collect(), messages as f64 / secs, activity))
}

/// Notes that stream `ch` of a sender process went down; anything but a clean close by the
/// receiver is the process's failure.
fn mark_down(
    channels: &[ChannelId],
    closed: &mut [bool],
    failure: &mut Option<ChannelError>,
    ch: ChannelId,
    error: ChannelError,
) {
    if let Some(i) = channels.iter().position(|&c| c == ch) {
        closed[i] = true;
    }
    if error != ChannelError::Closed && failure.is_none() {
        *failure = Some(error);
    }
}

/// One sender process: streams `size`-byte messages on `streams` channels, round-robin,
/// until the receiver closes them.
fn sender(
    access: &PeerAccess,
    transport: TransportArg,
    addr: &str,
    size: usize,
    flow_control: bool,
    streams: usize,
) -> Result<()> {
    if let Some(cpu) = std::env::var(SENDER_CPU_ENV).ok().and_then(|c| c.parse().ok()) {
        pin_to(cpu);
    }
    let mut ep = Endpoint::new(endpoint_config(access, flow_control));
    let mut channels = Vec::with_capacity(streams);
    for _ in 0..streams {
        channels.push(match transport {
            TransportArg::Udp => ep.connect_udp(addr, CONNECT_TIMEOUT)?,
            TransportArg::Tcp => ep.connect_tcp(addr, CONNECT_TIMEOUT)?,
            TransportArg::Shm => unreachable!("refused by run"),
        });
    }
    let msg = vec![0x6bu8; size];
    let mut closed = vec![false; streams];
    let mut failure: Option<ChannelError> = None;
    let born = Instant::now();
    let result = loop {
        let mut sent = false;
        for (i, &ch) in channels.iter().enumerate() {
            if closed[i] {
                continue;
            }
            match ep.send(ch, &[&msg]) {
                Ok(SendOutcome::Done) => sent = true,
                Ok(_) => {}
                Err(SendError::ChannelDown(e)) => mark_down(&channels, &mut closed, &mut failure, ch, e),
                Err(e) => return Err(e.into()),
            }
        }
        if !sent {
            // No room on any stream: sleep until acks or credit arrive, leaving the CPU
            // to others.
            ep.wait(Some(Duration::from_millis(5)))?;
            ep.poll(64, |e| {
                if let Event::ChannelDown { channel, error } = e {
                    mark_down(&channels, &mut closed, &mut failure, channel, error);
                }
            });
        }
        if let Some(e) = failure.take() {
            break Err(anyhow::anyhow!("receiver went away: {e}"));
        }
        if closed.iter().all(|&c| c) {
            break Ok(());
        }
    };
    let c = ep.udp_counters();
    println!(
        "{COUNTERS_LINE} {} {} {} {} {} {}",
        c.packets_sent,
        c.retransmits,
        c.timeouts,
        c.credit_stalls,
        c.credit_blocked_us,
        born.elapsed().as_micros()
    );
    result
}

#[cfg(test)]
mod tests {
    #[test]
    fn jain_index_is_one_for_even_shares_and_one_over_n_for_one_taker() {
        assert!((super::jain(&[5.0, 5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((super::jain(&[8.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((super::jain(&[1.0, 2.0]) - 0.9).abs() < 1e-12);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(super::median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(super::median(&[]), 0.0);
    }
}
