//! Reading trace files into one time-ordered list of messages on a common clock.

use serde::Serialize;
use std::path::{Path, PathBuf};
use ulnet_core::trace::{decode_file, decode_prefix, DecodeError, Direction, MessageKind, TraceFile};

/// Why trace files could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("{0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    /// A file is not an intact trace file (the error names the byte offset).
    #[error("{0}: {1}")]
    Decode(PathBuf, #[source] DecodeError),
    /// No file was given.
    #[error("no trace files given")]
    Empty,
    /// The files' records stand for more messages than the analysis holds.
    #[error("the trace files stand for {messages} messages; at most {MESSAGES_MAX} are analysed")]
    TooLarge {
        /// Messages the records stand for (each run record for its count).
        messages: u64,
    },
}

/// Most messages a trace may stand for: 2^27, about 18 GB once loaded. A run record stands
/// for up to 2^32 - 1 messages, so a small damaged or forged file could otherwise ask for
/// more memory than any machine has.
pub const MESSAGES_MAX: u64 = 1 << 27;

/// What one file contributed.
#[derive(Clone, Debug, Serialize)]
pub struct FileSummary {
    /// Its path.
    pub path: String,
    /// The node that wrote it.
    pub node: u32,
    /// That node's process id.
    pub pid: u32,
    /// Records in it.
    pub records: usize,
    /// Records its writer dropped because a ring was full.
    pub dropped: u64,
}

/// One traced message, as one side saw it, with times in nanoseconds since the start of
/// the trace (the earliest record of all files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// When it was sent (send records) or received (receive records).
    pub t_ns: u64,
    /// Sending node.
    pub src: u32,
    /// Receiving node.
    pub dst: u32,
    /// Channel at the recording side.
    pub channel: u32,
    /// What it was.
    pub kind: MessageKind,
    /// Which side recorded it.
    pub direction: Direction,
    /// Buffers in its gather list (0: not known).
    pub buffers: u8,
    /// Bytes.
    pub size: u64,
    /// Bytes of each of the first four buffers.
    pub buffer_len: [u32; 4],
    /// Pairs responses with requests (0: none).
    pub request_id: u64,
    /// Its times were read from the clock (an exact record). Other records carry the
    /// tracer's coarse time (at most one 1 ms tick early): their stage times are `None`.
    pub exact: bool,
    /// Stage times (nanoseconds since the trace start; `None`: not measured, or not an
    /// exact record).
    pub enqueued: Option<u64>,
    /// When the transport took it.
    pub sent: Option<u64>,
    /// When the receiver found it.
    pub received: Option<u64>,
    /// When its handler started.
    pub handler_start: Option<u64>,
    /// When its handler ended.
    pub handler_end: Option<u64>,
    /// Index of the file it came from.
    pub file: usize,
}

/// Messages of one or more trace files on one time line.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The files, in the order given.
    pub files: Vec<FileSummary>,
    /// Every record, by time.
    pub messages: Vec<Message>,
    /// All files share one clock (one host, one boot): instants compare across files.
    /// Otherwise files are aligned by their wall-clock references, which is only as good
    /// as the hosts' clock synchronisation.
    pub same_clock: bool,
}

impl Trace {
    /// Nanoseconds from the first record to the last.
    pub fn duration_ns(&self) -> u64 {
        match (self.messages.first(), self.messages.last()) {
            (Some(a), Some(b)) => b.t_ns - a.t_ns,
            _ => 0,
        }
    }

    /// Records dropped by all writers.
    pub fn dropped(&self) -> u64 {
        self.files.iter().map(|f| f.dropped).sum()
    }

    /// Nodes whose files are loaded.
    pub fn traced_nodes(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.files.iter().map(|f| f.node).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Loads trace files (strictly: any damage is an error naming the file and offset).
pub fn load(paths: &[impl AsRef<Path>]) -> Result<Trace, LoadError> {
    load_with(paths, false)
}

/// Loads trace files; with `partial`, a file cut short (its process was killed before it
/// wrote the end block) contributes its intact blocks, and the damage is reported on
/// stderr instead of failing the load. A file whose header is unreadable is still an error.
pub fn load_with(paths: &[impl AsRef<Path>], partial: bool) -> Result<Trace, LoadError> {
    if paths.is_empty() {
        return Err(LoadError::Empty);
    }
    let mut decoded = Vec::with_capacity(paths.len());
    for p in paths {
        let p = p.as_ref();
        let bytes = std::fs::read(p).map_err(|e| LoadError::Io(p.to_path_buf(), e))?;
        let file = if partial {
            match decode_prefix(&bytes) {
                (Some(file), None) => file,
                (Some(file), Some(e)) => {
                    eprintln!("{}: {e}; using the {} intact records before it", p.display(), file.records.len());
                    file
                }
                (None, e) => {
                    let e = e.expect("an unreadable header is an error");
                    return Err(LoadError::Decode(p.to_path_buf(), e));
                }
            }
        } else {
            decode_file(&bytes).map_err(|e| LoadError::Decode(p.to_path_buf(), e))?
        };
        decoded.push((p.display().to_string(), file));
    }
    assemble(decoded)
}

/// Puts decoded trace files (each with the name to report it by) on one time line: run
/// records become their messages, times go to nanoseconds since the earliest record.
pub fn assemble(decoded: Vec<(String, TraceFile)>) -> Result<Trace, LoadError> {
    let messages: u64 = decoded.iter().map(|(_, f)| f.messages()).sum();
    if messages > MESSAGES_MAX {
        return Err(LoadError::TooLarge { messages });
    }
    let same_clock = decoded.windows(2).all(|w| w[0].1.header.boot_id == w[1].1.header.boot_id)
        && decoded.first().is_some_and(|(_, f)| f.header.boot_id != 0);
    let mut files = Vec::new();
    let mut messages = Vec::new();
    for (index, (path, file)) in decoded.iter().enumerate() {
        let clock = file.clock();
        // Common time line: CLOCK_MONOTONIC when shared, else wall-clock time.
        let offset: i128 =
            if same_clock { 0 } else { i128::from(file.header.ref_real_ns) - i128::from(file.header.ref_mono_ns) };
        let at = |ticks: u64| -> Option<u64> {
            (ticks != 0).then(|| (i128::from(clock.mono_ns(ticks)) + offset).max(1) as u64)
        };
        for r in &file.records {
            // A run record stands for `count` identical messages between its first and
            // last time: each becomes a message, at times spread evenly over the run.
            let count = u64::from(r.count.max(1));
            let span = r.last_ticks.saturating_sub(r.ticks);
            for i in 0..count {
                // In 128 bits: a damaged record's span times its count overflows 64.
                let ticks = if count == 1 {
                    r.ticks
                } else {
                    r.ticks + (u128::from(span) * u128::from(i) / u128::from(count - 1)) as u64
                };
                // Stages only from exact records: a coarse time would make transits of 0 or
                // of a whole tick.
                let shift = |stage: u64| if stage == 0 || !r.exact { 0 } else { stage.saturating_add(ticks - r.ticks) };
                messages.push(Message {
                    t_ns: at(ticks).unwrap_or(1),
                    src: r.src_node,
                    dst: r.dst_node,
                    channel: r.channel,
                    kind: r.message_kind(),
                    direction: r.direction(),
                    buffers: r.buffers,
                    size: r.size,
                    buffer_len: r.buffer_len,
                    request_id: r.request_id,
                    exact: r.exact,
                    enqueued: at(shift(r.enqueued)),
                    sent: at(shift(r.sent)),
                    received: at(shift(r.received)),
                    handler_start: at(shift(r.handler_start)),
                    handler_end: at(shift(r.handler_end)),
                    file: index,
                });
            }
        }
        files.push(FileSummary {
            path: path.clone(),
            node: file.header.node_id,
            pid: file.header.pid,
            records: file.records.len(),
            dropped: file.dropped(),
        });
    }
    messages.sort_by_key(|m| m.t_ns);
    let origin = messages.first().map_or(0, |m| m.t_ns);
    let shift = |t: &mut Option<u64>| {
        if let Some(v) = t {
            *v = v.saturating_sub(origin);
        }
    };
    for m in &mut messages {
        m.t_ns -= origin;
        for t in [&mut m.enqueued, &mut m.sent, &mut m.received, &mut m.handler_start, &mut m.handler_end] {
            shift(t);
        }
    }
    Ok(Trace { files, messages, same_clock })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ulnet_core::trace::format::{FileHeader, Record};

    fn file(records: Vec<Record>) -> TraceFile {
        let header = FileHeader {
            version: ulnet_core::trace::format::VERSION,
            node_id: 1,
            pid: 2,
            boot_id: 3,
            ref_ticks: 0,
            ref_mono_ns: 0,
            ref_real_ns: 0,
            ticks_per_sec: 1_000_000_000,
        };
        TraceFile { header, blocks: Vec::new(), records }
    }

    fn run(count: u32, ticks: u64, last_ticks: u64) -> Record {
        Record { ticks, last_ticks, count, size: 8, exact: true, sent: u64::MAX, ..Record::default() }
    }

    #[test]
    fn a_run_spread_over_the_whole_clock_loads_without_overflow() {
        let trace = assemble(vec![("a".into(), file(vec![run(3, 1, u64::MAX)]))]).unwrap();
        let t: Vec<f64> = trace.messages.iter().map(|m| m.t_ns as f64).collect();
        assert_eq!(t.len(), 3);
        // Spread evenly from the first tick to the last: the middle one halfway.
        assert!(t[0] == 0.0 && t[2] > 1e19 && (t[1] / t[2] - 0.5).abs() < 1e-6, "times {t:?}");
    }

    #[test]
    fn records_standing_for_too_many_messages_are_refused() {
        let records = vec![run(u32::MAX, 1, 2)];
        match assemble(vec![("a".into(), file(records))]) {
            Err(LoadError::TooLarge { messages }) => assert_eq!(messages, u64::from(u32::MAX)),
            other => panic!("expected TooLarge, got {:?}", other.map(|t| t.messages.len())),
        }
        let fits = vec![run(1 << 10, 1, 2); 4];
        assert_eq!(assemble(vec![("a".into(), file(fits))]).unwrap().messages.len(), 4 << 10);
    }
}
