//! The communication study of a trace: who talks to whom (traffic matrix in messages and
//! bytes), how big messages are (size distributions by count and by bytes), how often each
//! node sends over time, how messages are built (buffers per message, bytes per buffer
//! position), and where the time of a request–response goes.
//!
//! Each message is counted once, from the sender's record when the sender's file is
//! loaded, else from the receiver's: a trace of some nodes only still counts every
//! message one of them sent or received. A run record counts as its `count` messages
//! everywhere (its bytes as `count` times its size), and its messages fall in the rate
//! bins where [`Trace::message_t_ns`] puts them: the figures are those of the same
//! messages recorded one by one, at the cost of the records.
//!
//! Message counts are plain sums (they would need 2^32 records in memory to overflow);
//! byte counts saturate, since a forged record may claim 2^32 - 1 messages of 2^64 - 1
//! bytes.

use crate::load::{FileSummary, Message, StageTime, Trace};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use ulnet_core::trace::{Direction, MessageKind};

/// One cell of the traffic matrix.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct MatrixCell {
    /// Sending node.
    pub src: u32,
    /// Receiving node.
    pub dst: u32,
    /// Messages sent.
    pub messages: u64,
    /// Bytes sent.
    pub bytes: u64,
}

/// The size distribution at one size.
#[derive(Clone, Debug, Serialize)]
pub struct SizePoint {
    /// Bytes.
    pub size: u64,
    /// Fraction of messages of at most `size` bytes.
    pub count_frac: f64,
    /// Fraction of all bytes carried in messages of at most `size` bytes.
    pub bytes_frac: f64,
}

/// Message sizes sent by one node (or all).
#[derive(Clone, Debug, Serialize)]
pub struct SizeDistribution {
    /// The node (`None`: all nodes).
    pub node: Option<u32>,
    /// Messages.
    pub messages: u64,
    /// Smallest, median, mean and largest size.
    pub min: u64,
    /// Median size.
    pub median: u64,
    /// Mean size.
    pub mean: f64,
    /// Largest size.
    pub max: u64,
    /// Fraction of messages of 68 to 256 bytes (the range the Solaris MC study found for
    /// 80% of messages).
    pub frac_68_to_256: f64,
    /// Fraction of bytes carried in messages of 4 KiB or more.
    pub bytes_frac_4k_or_more: f64,
    /// The cumulative distributions at sizes 2^(i/2).
    pub cdf: Vec<SizePoint>,
}

/// Messages each node sent per time bin.
#[derive(Clone, Debug, Serialize)]
pub struct NodeRate {
    /// The node.
    pub node: u32,
    /// Messages per bin, from the start of the trace.
    pub per_bin: Vec<u64>,
    /// Mean messages per second over the trace.
    pub mean_per_s: f64,
    /// Busiest bin, in messages per second.
    pub peak_per_s: f64,
}

/// Per-node message rates over time.
#[derive(Clone, Debug, Serialize)]
pub struct Rates {
    /// Width of a bin in seconds.
    pub bin_s: f64,
    /// One row per sending node.
    pub nodes: Vec<NodeRate>,
}

/// How many messages had a given number of buffers.
#[derive(Clone, Debug, Serialize)]
pub struct BufferCount {
    /// Buffers in the gather list.
    pub buffers: u8,
    /// Messages.
    pub messages: u64,
    /// Fraction of the messages whose buffers are known.
    pub fraction: f64,
}

/// Bytes carried at one buffer position.
#[derive(Clone, Debug, Serialize)]
pub struct BufferPosition {
    /// 1 for the first buffer of a gather list, ...
    pub position: u8,
    /// Messages that had a buffer there.
    pub messages: u64,
    /// Bytes carried there.
    pub bytes: u64,
    /// Fraction of the bytes of messages whose buffers are known.
    pub fraction: f64,
    /// Median size of the buffer there.
    pub median: u64,
    /// Largest buffer there.
    pub max: u64,
}

/// Messages and bytes of one kind.
#[derive(Clone, Debug, Serialize)]
pub struct KindCount {
    /// The kind.
    pub kind: String,
    /// Messages.
    pub messages: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One stage of a request–response, over every pair found.
#[derive(Clone, Debug, Serialize)]
pub struct Stage {
    /// What the stage is.
    pub name: String,
    /// Pairs in which it was measured.
    pub samples: usize,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 90th percentile, microseconds.
    pub p90_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Mean, microseconds.
    pub mean_us: f64,
    /// Mean as a share of the mean round trip (stages of the round trip add up to 1).
    pub share: Option<f64>,
}

/// Where the time of a request–response goes.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    /// Requests whose response was traced too.
    pub pairs: usize,
    /// Requests traced without a response.
    pub unanswered: usize,
    /// The stages that make up the round trip as the requester saw it, in order; stages
    /// between processes appear only when all files share one clock.
    pub stages: Vec<Stage>,
    /// Figures measured at one side only: the round trip at the requester, the time the
    /// server held the request, handler durations.
    pub totals: Vec<Stage>,
}

/// The whole study of a trace.
#[derive(Clone, Debug, Serialize)]
pub struct Analysis {
    /// The files read.
    pub files: Vec<FileSummary>,
    /// Messages counted.
    pub messages: u64,
    /// Their bytes.
    pub bytes: u64,
    /// From the first record to the last, seconds.
    pub duration_s: f64,
    /// Records the writers dropped because a ring was full (the figures miss these).
    pub dropped: u64,
    /// Whether instants compare across files (one host, one boot).
    pub same_clock: bool,
    /// Nodes seen.
    pub nodes: Vec<u32>,
    /// Messages and bytes from each node to each node.
    pub matrix: Vec<MatrixCell>,
    /// Message sizes, all nodes then per sending node.
    pub sizes: Vec<SizeDistribution>,
    /// Messages per node over time.
    pub rates: Rates,
    /// Messages by number of buffers.
    pub buffers_per_message: Vec<BufferCount>,
    /// Bytes by buffer position.
    pub bytes_per_buffer_position: Vec<BufferPosition>,
    /// Messages and bytes by kind.
    pub kinds: Vec<KindCount>,
    /// The request–response breakdown, when requests were traced.
    pub latency: Option<Latency>,
}

/// Settings of the study.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnalyzeConfig {
    /// Width of the rate bins in seconds; `None` picks about 50 bins of a round width
    /// (1, 2 or 5 times a power of ten), at most 1 s.
    pub bin_s: Option<f64>,
}

/// The messages counted once each: send records of traced senders, receive records of
/// messages whose sender was not traced.
pub fn counted(trace: &Trace) -> Vec<&Message> {
    let traced = trace.traced_nodes();
    trace
        .messages
        .iter()
        .filter(|m| match m.direction {
            Direction::Send => true,
            Direction::Receive => traced.binary_search(&m.src).is_err(),
        })
        .collect()
}

fn round_bin(duration_s: f64) -> f64 {
    let raw = (duration_s / 50.0).max(1e-6);
    let decade = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * decade).find(|s| *s >= raw).unwrap_or(10.0 * decade);
    step.min(1.0)
}

/// Percentile `q` of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

/// Bytes of `count` messages of `size` bytes (saturating: see the module documentation).
fn bytes_of(size: u64, count: u64) -> u64 {
    size.saturating_mul(count)
}

/// Bytes of the messages of (size, count) pairs.
fn total_bytes(sizes: &[(u64, u64)]) -> u64 {
    sizes.iter().fold(0, |bytes, &(size, count)| bytes.saturating_add(bytes_of(size, count)))
}

/// The value at rank `n / 2` (from 0) of sorted (value, count) pairs that stand for `n`
/// values: the median as it is of the values one by one.
fn weighted_median<T: Copy>(sorted: &[(T, u64)]) -> Option<T> {
    let n: u64 = sorted.iter().map(|p| p.1).sum();
    let mut through = 0u64;
    sorted
        .iter()
        .find(|p| {
            through += p.1;
            through > n / 2
        })
        .map(|p| p.0)
}

fn size_distribution(node: Option<u32>, msgs: &[&Message]) -> SizeDistribution {
    let mut sizes: Vec<(u64, u64)> = msgs.iter().map(|m| (m.size, u64::from(m.count))).collect();
    sizes.sort_unstable();
    let n: u64 = sizes.iter().map(|s| s.1).sum();
    let total = total_bytes(&sizes);
    let mut cdf = Vec::new();
    if let Some(&(max, _)) = sizes.last() {
        let (mut i, mut messages, mut bytes) = (0usize, 0u64, 0u64);
        let mut e = 0u32;
        loop {
            let at = 2f64.powf(f64::from(e) / 2.0).round() as u64;
            while i < sizes.len() && sizes[i].0 <= at {
                let (size, count) = sizes[i];
                messages += count;
                bytes = bytes.saturating_add(bytes_of(size, count));
                i += 1;
            }
            if cdf.last().is_none_or(|p: &SizePoint| p.size != at) {
                cdf.push(SizePoint {
                    size: at,
                    count_frac: messages as f64 / n as f64,
                    bytes_frac: if total == 0 { 1.0 } else { bytes as f64 / total as f64 },
                });
            }
            if at >= max {
                break;
            }
            e += 1;
        }
    }
    let in_range: u64 = sizes.iter().filter(|s| (68..=256).contains(&s.0)).map(|s| s.1).sum();
    let big = total_bytes(&sizes[sizes.partition_point(|s| s.0 < 4096)..]);
    SizeDistribution {
        node,
        messages: n,
        min: sizes.first().map_or(0, |s| s.0),
        median: weighted_median(&sizes).unwrap_or(0),
        mean: if n == 0 { 0.0 } else { total as f64 / n as f64 },
        max: sizes.last().map_or(0, |s| s.0),
        frac_68_to_256: if n == 0 { 0.0 } else { in_range as f64 / n as f64 },
        bytes_frac_4k_or_more: if total == 0 { 0.0 } else { big as f64 / total as f64 },
        cdf,
    }
}

/// Adds the messages of record `m` to the bins their times fall in (`bin_of` an instant).
/// A run's times rise with the message index, so the messages in one bin are a stretch of
/// indices whose end a binary search finds: the work grows with the bins a run covers and
/// the logarithm of its count, not with the count.
fn add_to_bins(trace: &Trace, m: &Message, per_bin: &mut [u64], bin_of: impl Fn(u64) -> usize) {
    let count = u64::from(m.count);
    let bin_at = |i: u64| bin_of(trace.message_t_ns(m, i));
    let Some(last) = count.checked_sub(1) else { return };
    let last_bin = bin_at(last);
    let mut first = 0u64;
    while first < count {
        let bin = bin_at(first);
        // `>=`: the clock's floating point may break the rise by a hair; the run still ends.
        let end = if bin >= last_bin {
            count
        } else {
            let (mut lo, mut hi) = (first + 1, last);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if bin_at(mid) <= bin {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        per_bin[bin] += end - first;
        first = end;
    }
}

fn stage(name: &str, mut values_ns: Vec<f64>, total_mean_ns: Option<f64>) -> Stage {
    values_ns.sort_by(f64::total_cmp);
    let mean = values_ns.iter().sum::<f64>() / values_ns.len().max(1) as f64;
    Stage {
        name: name.to_string(),
        samples: values_ns.len(),
        p50_us: percentile(&values_ns, 0.5) / 1e3,
        p90_us: percentile(&values_ns, 0.9) / 1e3,
        p99_us: percentile(&values_ns, 0.99) / 1e3,
        mean_us: mean / 1e3,
        share: total_mean_ns.map(|t| mean / t),
    }
}

/// Key of a request: (requester, server, request id).
type CallKey = (u32, u32, u64);

fn latency(trace: &Trace) -> Option<Latency> {
    // The four records of a call, by key, each list in time order.
    let mut parts: [HashMap<CallKey, Vec<&Message>>; 4] = Default::default();
    for m in &trace.messages {
        // A run is not a call (the decoder refuses runs with a request id).
        if m.request_id == 0 || m.count > 1 {
            continue;
        }
        let (slot, key) = match (m.kind, m.direction) {
            (MessageKind::Request, Direction::Send) => (0, (m.src, m.dst, m.request_id)),
            (MessageKind::Request, Direction::Receive) => (1, (m.src, m.dst, m.request_id)),
            (MessageKind::Response, Direction::Send) => (2, (m.dst, m.src, m.request_id)),
            (MessageKind::Response, Direction::Receive) => (3, (m.dst, m.src, m.request_id)),
            _ => continue,
        };
        parts[slot].entry(key).or_default().push(m);
    }
    let requests: usize = parts[0].values().map(Vec::len).sum();
    if requests == 0 {
        return None;
    }
    let delta = |a: StageTime, b: StageTime| match (a.get(), b.get()) {
        (Some(a), Some(b)) if b >= a => Some((b - a) as f64),
        _ => None,
    };
    let names = [
        "request transit (sent -> found by server)",
        "server dispatch (found -> handler start)",
        "server handler until response sent",
        "response transit (sent -> found by requester)",
    ];
    // Without handler times (a call not sampled on the server) the server's part is one stage.
    let names_without_handlers = [names[0], "server holds the request (found -> response sent)", names[3]];
    let mut staged: [Vec<f64>; 4] = Default::default();
    let mut staged_without_handlers: [Vec<f64>; 3] = Default::default();
    let (mut rtt, mut server_held, mut server_handler, mut client_handler) = (vec![], vec![], vec![], vec![]);
    let mut pairs = 0usize;
    let empty = Vec::new();
    for (key, sends) in &parts[0] {
        let get = |slot: usize| parts[slot].get(key).unwrap_or(&empty);
        let (server_recv, server_send, client_recv) = (get(1), get(2), get(3));
        for (i, req) in sends.iter().enumerate() {
            let resp_in = client_recv.get(i);
            if let Some(r) = resp_in {
                pairs += 1;
                rtt.extend(delta(req.sent, r.received));
                client_handler.extend(delta(r.handler_start, r.handler_end));
            }
            let (s_in, s_out) = (server_recv.get(i), server_send.get(i));
            if let Some(s) = s_in {
                server_handler.extend(delta(s.handler_start, s.handler_end));
                if let Some(o) = s_out {
                    server_held.extend(delta(s.received, o.sent));
                }
            }
            if let (true, Some(s), Some(o), Some(r)) = (trace.same_clock, s_in, s_out, resp_in) {
                let d = [
                    delta(req.sent, s.received),
                    delta(s.received, s.handler_start),
                    delta(s.handler_start, o.sent),
                    delta(o.sent, r.received),
                ];
                if d.iter().all(Option::is_some) {
                    for (v, x) in staged.iter_mut().zip(d) {
                        v.push(x.expect("checked"));
                    }
                } else if let (Some(a), Some(b), Some(c)) = (d[0], delta(s.received, o.sent), d[3]) {
                    for (v, x) in staged_without_handlers.iter_mut().zip([a, b, c]) {
                        v.push(x);
                    }
                }
            }
        }
    }
    let rtt_mean = (!rtt.is_empty()).then(|| rtt.iter().sum::<f64>() / rtt.len() as f64);
    let mean_sum = |v: &[Vec<f64>]| v.iter().map(|v| v.iter().sum::<f64>() / v.len() as f64).sum::<f64>();
    let stages = if !staged[0].is_empty() {
        let total = mean_sum(&staged);
        names.iter().zip(staged).map(|(n, v)| stage(n, v, Some(total))).collect()
    } else if !staged_without_handlers[0].is_empty() {
        let total = mean_sum(&staged_without_handlers);
        names_without_handlers.iter().zip(staged_without_handlers).map(|(n, v)| stage(n, v, Some(total))).collect()
    } else {
        Vec::new()
    };
    let mut totals = vec![stage("round trip at the requester (sent -> response found)", rtt, rtt_mean)];
    totals.push(stage("server holds the request (found -> response sent)", server_held, rtt_mean));
    totals.push(stage("server handler (start -> end)", server_handler, rtt_mean));
    totals.push(stage("requester's response handler (start -> end)", client_handler, rtt_mean));
    totals.retain(|s| s.samples > 0);
    Some(Latency { pairs, unanswered: requests - pairs, stages, totals })
}

/// Runs the study.
pub fn analyze(trace: &Trace, config: &AnalyzeConfig) -> Analysis {
    let msgs = counted(trace);
    let duration_s = trace.duration_ns() as f64 / 1e9;
    let mut matrix: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
    let mut by_kind: BTreeMap<MessageKind, (u64, u64)> = BTreeMap::new();
    let mut by_src: BTreeMap<u32, Vec<&Message>> = BTreeMap::new();
    let mut nodes: Vec<u32> = trace.traced_nodes();
    let (mut messages, mut bytes) = (0u64, 0u64);
    for m in &msgs {
        let (count, size) = (u64::from(m.count), bytes_of(m.size, u64::from(m.count)));
        messages += count;
        bytes = bytes.saturating_add(size);
        for tally in [matrix.entry((m.src, m.dst)).or_default(), by_kind.entry(m.kind).or_default()] {
            tally.0 += count;
            tally.1 = tally.1.saturating_add(size);
        }
        by_src.entry(m.src).or_default().push(m);
        nodes.extend([m.src, m.dst]);
    }
    nodes.sort_unstable();
    nodes.dedup();
    let mut sizes = vec![size_distribution(None, &msgs)];
    if by_src.len() > 1 {
        sizes.extend(by_src.iter().map(|(n, v)| size_distribution(Some(*n), v)));
    }
    let bin_s = config.bin_s.filter(|b| *b > 0.0).unwrap_or_else(|| round_bin(duration_s));
    let bins = ((duration_s / bin_s).floor() as usize + 1).min(1_000_000);
    let bin_of = |t_ns: u64| ((t_ns as f64 / 1e9 / bin_s) as usize).min(bins - 1);
    let rates = Rates {
        bin_s,
        nodes: by_src
            .iter()
            .map(|(node, v)| {
                let mut per_bin = vec![0u64; bins];
                for m in v {
                    add_to_bins(trace, m, &mut per_bin, bin_of);
                }
                let sent: u64 = per_bin.iter().sum();
                let peak = per_bin.iter().copied().max().unwrap_or(0);
                NodeRate {
                    node: *node,
                    mean_per_s: if duration_s > 0.0 { sent as f64 / duration_s } else { 0.0 },
                    peak_per_s: peak as f64 / bin_s,
                    per_bin,
                }
            })
            .collect(),
    };
    let known: Vec<&&Message> = msgs.iter().filter(|m| m.buffers > 0 && m.buffers as usize <= 4).collect();
    let mut per_count = [0u64; 5];
    let mut pos_bytes = [0u64; 4];
    let mut pos_sizes: [Vec<(u32, u64)>; 4] = Default::default();
    for m in &known {
        let count = u64::from(m.count);
        per_count[m.buffers as usize] += count;
        for i in 0..m.buffers as usize {
            pos_bytes[i] = pos_bytes[i].saturating_add(bytes_of(u64::from(m.buffer_len[i]), count));
            pos_sizes[i].push((m.buffer_len[i], count));
        }
    }
    let known_messages: u64 = per_count.iter().sum();
    let known_bytes = pos_bytes.iter().fold(0u64, |a, b| a.saturating_add(*b));
    for v in &mut pos_sizes {
        v.sort_unstable();
    }
    let buffers_per_message = (1..=4u8)
        .filter(|&b| per_count[b as usize] > 0)
        .map(|b| BufferCount {
            buffers: b,
            messages: per_count[b as usize],
            fraction: per_count[b as usize] as f64 / known_messages as f64,
        })
        .collect();
    let bytes_per_buffer_position = (0..4)
        .filter(|&i| !pos_sizes[i].is_empty())
        .map(|i| BufferPosition {
            position: i as u8 + 1,
            messages: pos_sizes[i].iter().map(|p| p.1).sum(),
            bytes: pos_bytes[i],
            fraction: if known_bytes == 0 { 0.0 } else { pos_bytes[i] as f64 / known_bytes as f64 },
            median: u64::from(weighted_median(&pos_sizes[i]).expect("not empty")),
            max: u64::from(pos_sizes[i].last().expect("not empty").0),
        })
        .collect();
    Analysis {
        files: trace.files.clone(),
        messages,
        bytes,
        duration_s,
        dropped: trace.dropped(),
        same_clock: trace.same_clock,
        nodes,
        matrix: matrix
            .into_iter()
            .map(|((src, dst), (messages, bytes))| MatrixCell { src, dst, messages, bytes })
            .collect(),
        sizes,
        rates,
        buffers_per_message,
        bytes_per_buffer_position,
        kinds: by_kind
            .into_iter()
            .map(|(k, (messages, bytes))| KindCount { kind: k.name().to_string(), messages, bytes })
            .collect(),
        latency: latency(trace),
    }
}

/// Bytes in a short human form (B, KB, MB, GB; 10^3 steps).
pub fn human_bytes(b: u64) -> String {
    let b = b as f64;
    match b {
        _ if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        _ if b >= 1e6 => format!("{:.2} MB", b / 1e6),
        _ if b >= 1e3 => format!("{:.1} KB", b / 1e3),
        _ => format!("{b} B"),
    }
}

impl Analysis {
    /// The cell from `src` to `dst`.
    pub fn cell(&self, src: u32, dst: u32) -> Option<&MatrixCell> {
        self.matrix.iter().find(|c| c.src == src && c.dst == dst)
    }

    /// The study as human-readable tables.
    pub fn render_text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{} messages, {} in {:.3} s from {} file(s); nodes {:?}{}",
            self.messages,
            human_bytes(self.bytes),
            self.duration_s,
            self.files.len(),
            self.nodes,
            if self.dropped > 0 { format!("; {} records DROPPED (full rings)", self.dropped) } else { String::new() }
        );
        let _ = writeln!(o, "\nTraffic matrix (messages / bytes), rows: from, columns: to");
        let _ = write!(o, "{:>10}", "from\\to");
        for d in &self.nodes {
            let _ = write!(o, " {:>20}", d);
        }
        let _ = writeln!(o);
        for s in &self.nodes {
            let _ = write!(o, "{:>10}", s);
            for d in &self.nodes {
                let cell =
                    self.cell(*s, *d).map_or("-".to_string(), |c| format!("{} / {}", c.messages, human_bytes(c.bytes)));
                let _ = write!(o, " {cell:>20}");
            }
            let _ = writeln!(o);
        }
        let _ = writeln!(o, "\nMessage sizes (cumulative: fraction of messages / of bytes at or below each size)");
        for d in &self.sizes {
            let who = d.node.map_or("all nodes".to_string(), |n| format!("node {n}"));
            let _ = writeln!(
                o,
                "  {who}: {} msgs, min {} median {} mean {:.0} max {}; {:.1}% are 68-256 B; {:.1}% of bytes in messages >= 4 KiB",
                d.messages,
                d.min,
                d.median,
                d.mean,
                d.max,
                100.0 * d.frac_68_to_256,
                100.0 * d.bytes_frac_4k_or_more
            );
        }
        if let Some(all) = self.sizes.first() {
            let _ = writeln!(o, "  {:>10} {:>10} {:>10}", "size <=", "messages", "bytes");
            let last = all.cdf.len().saturating_sub(1);
            for (_, p) in all.cdf.iter().enumerate().filter(|(i, p)| p.size.is_power_of_two() || *i == last) {
                let _ = writeln!(o, "  {:>10} {:>9.1}% {:>9.1}%", p.size, 100.0 * p.count_frac, 100.0 * p.bytes_frac);
            }
        }
        let _ = writeln!(o, "\nMessage rates (messages sent per second; bins of {} s)", self.rates.bin_s);
        for r in &self.rates.nodes {
            let _ =
                writeln!(o, "  node {:>6}: mean {:>12.0}/s  peak bin {:>12.0}/s", r.node, r.mean_per_s, r.peak_per_s);
        }
        let _ = writeln!(o, "\nBuffers per message (gather lists)");
        for b in &self.buffers_per_message {
            let _ = writeln!(o, "  {} buffer(s): {:>10} messages  {:>5.1}%", b.buffers, b.messages, 100.0 * b.fraction);
        }
        let _ = writeln!(o, "Bytes per buffer position");
        for p in &self.bytes_per_buffer_position {
            let _ = writeln!(
                o,
                "  buffer {}: {:>10} in {} messages  {:>5.1}% of bytes  median {} B  max {} B",
                p.position,
                human_bytes(p.bytes),
                p.messages,
                100.0 * p.fraction,
                p.median,
                p.max
            );
        }
        let _ = writeln!(o, "\nMessages by kind");
        for k in &self.kinds {
            let _ = writeln!(o, "  {:>10}: {:>10} messages  {}", k.kind, k.messages, human_bytes(k.bytes));
        }
        if let Some(l) = &self.latency {
            let _ = writeln!(
                o,
                "\nRequest-response breakdown: {} pairs ({} requests without a traced response)",
                l.pairs, l.unanswered
            );
            let _ = writeln!(
                o,
                "  {:<50} {:>9} {:>9} {:>9} {:>9} {:>6}",
                "stage", "p50 us", "p90 us", "p99 us", "mean us", "share"
            );
            for s in l.stages.iter().chain(&l.totals) {
                let share = s.share.map_or(String::new(), |x| format!("{:.0}%", 100.0 * x));
                let _ = writeln!(
                    o,
                    "  {:<50} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>6}",
                    s.name, s.p50_us, s.p90_us, s.p99_us, s.mean_us, share
                );
            }
            if l.stages.is_empty() {
                let _ = writeln!(o, "  (stages between processes need files from one host and boot)");
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::assemble;
    use crate::test_files::{file, one_by_one};
    use proptest::prelude::*;
    use ulnet_core::trace::format::Record;
    use ulnet_core::trace::TraceFile;

    fn study_json(trace: &Trace, config: &AnalyzeConfig) -> serde_json::Value {
        let mut v = serde_json::to_value(analyze(trace, config)).unwrap();
        // Records per file differ by design; everything else must not.
        v["files"] = serde_json::Value::Null;
        v
    }

    /// A record: a single message (some of them calls) or a run, with or without buffers.
    fn record() -> impl Strategy<Value = Record> {
        let shape = (0u8..3, any::<bool>(), any::<bool>(), 0u64..4);
        let size = (0u8..=4, [0u32..5000, 0u32..5000, 0u32..5000, 0u32..5000], 0u64..20_000);
        let run = (prop_oneof![Just(1u32), 2u32..=40], 0u64..4_000_000);
        (0u64..400_000_000, 1u32..=3, 1u32..=3, shape, size, run).prop_map(
            |(
                ticks,
                src_node,
                dst_node,
                (kind, receive, exact, request),
                (buffers, mut buffer_len, size),
                (count, span),
            )| {
                let ticks = ticks + 1;
                for len in &mut buffer_len[buffers as usize..] {
                    *len = 0;
                }
                let size = if buffers == 0 { size } else { buffer_len.iter().map(|&l| u64::from(l)).sum() };
                let run = count > 1;
                Record {
                    ticks,
                    src_node,
                    dst_node,
                    kind,
                    direction: u8::from(receive),
                    exact,
                    buffers,
                    size,
                    buffer_len,
                    request_id: if run { 0 } else { request },
                    count,
                    last_ticks: if run { ticks + span } else { ticks },
                    sent: if receive { 0 } else { ticks },
                    received: if receive { ticks } else { 0 },
                    ..Record::default()
                }
            },
        )
    }

    /// A clock: ticks per second, and references `(ticks, ns)` rising at about that rate.
    fn clock() -> impl Strategy<Value = (u64, Vec<(u64, u64)>)> {
        let steps = proptest::collection::vec((1u64..200_000_000, 0.98f64..1.02), 0..4);
        (100_000_000u64..4_000_000_000, 0u64..1_000_000_000, 1_000_000_000u64..1_000_000_000_000, steps).prop_map(
            |(ticks_per_sec, ticks, ns, steps)| {
                let mut refs = vec![(ticks, ns)];
                for (dticks, skew) in steps {
                    let &(t, n) = refs.last().unwrap();
                    refs.push((t + dticks, n + (dticks as f64 * 1e9 / ticks_per_sec as f64 * skew) as u64 + 1));
                }
                (ticks_per_sec, refs)
            },
        )
    }

    fn trace_file() -> impl Strategy<Value = (u64, Vec<(u64, u64)>, Vec<Record>)> {
        (clock(), proptest::collection::vec(record(), 1..40)).prop_map(|((tps, refs), records)| (tps, refs, records))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Run records give the study of the same messages recorded one by one, at the
        /// times the loader used to spread them at: matrix, kinds, totals, sizes, buffers,
        /// rates (bin by bin), latency.
        #[test]
        fn runs_are_studied_as_their_messages_one_by_one(
            files in proptest::collection::vec(trace_file(), 1..=2),
            boots in prop_oneof![Just((7, 7)), Just((7, 8)), Just((0, 0))],
            bin_s in prop_oneof![Just(None), Just(Some(1e-4)), Just(Some(1e-3)), (1e-4f64..0.1).prop_map(Some)],
        ) {
            let decoded = |expand: bool| -> Vec<(String, TraceFile)> {
                (files.iter().enumerate())
                    .map(|(i, (tps, refs, records))| {
                        let records = if expand { one_by_one(records) } else { records.clone() };
                        let boot = if i == 0 { boots.0 } else { boots.1 };
                        (format!("node-{}", i + 1), file(i as u32 + 1, boot, *tps, refs, records))
                    })
                    .collect()
            };
            let (runs, singles) = (assemble(decoded(false)), assemble(decoded(true)));
            prop_assert_eq!(runs.message_count(), singles.messages.len() as u64);
            prop_assert_eq!(runs.duration_ns(), singles.duration_ns());
            let config = AnalyzeConfig { bin_s };
            prop_assert_eq!(study_json(&runs, &config), study_json(&singles, &config));
        }
    }

    #[test]
    fn a_run_of_the_largest_count_spreads_over_the_bins_it_covers() {
        let count = u32::MAX;
        // One second at 1 GHz: 50 bins of 20 ms.
        let run = Record { ticks: 1, last_ticks: 1_000_000_001, count, size: 100, ..Record::default() };
        let single = Record { ticks: 500_000_000, last_ticks: 500_000_000, count: 1, size: 50, ..Record::default() };
        let trace = assemble(vec![("a".into(), file(1, 7, 1_000_000_000, &[(0, 0)], vec![run, single]))]);
        let study = analyze(&trace, &AnalyzeConfig::default());
        let messages = u64::from(count) + 1;
        assert_eq!((study.messages, study.bytes), (messages, 100 * u64::from(count) + 50));
        assert_eq!(study.cell(0, 0).map(|c| (c.messages, c.bytes)), Some((study.messages, study.bytes)));
        let sizes = &study.sizes[0];
        assert_eq!((sizes.messages, sizes.min, sizes.median, sizes.max), (messages, 50, 100, 100));
        let rates = &study.rates;
        assert_eq!((rates.bin_s, rates.nodes[0].per_bin.len()), (0.02, 51));
        let per_bin = &rates.nodes[0].per_bin;
        assert_eq!(per_bin.iter().sum::<u64>(), messages);
        // 20 ms of the run's 1 s in each bin, the last message alone in the 51st. Bin edges
        // are found in floating point, a few nanoseconds off: 4.3 messages a nanosecond.
        let share = u64::from(count) / 50;
        for (bin, &n) in per_bin[..50].iter().enumerate() {
            let n = if bin == 24 { n - 1 } else { n };
            assert!(n.abs_diff(share) <= 20, "bin {bin}: {n} messages, {share} expected");
        }
        assert_eq!(per_bin[50], 1);
    }
}
