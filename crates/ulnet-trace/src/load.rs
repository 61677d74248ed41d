//! Reading trace files into one time-ordered list of records on a common clock.

use serde::Serialize;
use std::path::{Path, PathBuf};
use ulnet_core::trace::format::TickClock;
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
}

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

/// One traced record, as one side saw it: a message, or a run of `count` identical ones
/// (no request id) spread evenly from `t_ns` to `last_t_ns`. Times are in nanoseconds
/// since the start of the trace (the earliest record of all files).
///
/// A run stays one entry however many messages it stands for (a forged one up to
/// 2^32 - 1), so a trace takes memory in proportion to its records, not its messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// When it (a run: its first message) was sent (send records) or received (receive
    /// records).
    pub t_ns: u64,
    /// When a run's last message was; `t_ns` for a single message.
    pub last_t_ns: u64,
    /// Messages it stands for: 1, or the length of a run.
    pub count: u32,
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
    /// Bytes (of each message of a run).
    pub size: u64,
    /// Bytes of each of the first four buffers.
    pub buffer_len: [u32; 4],
    /// Pairs responses with requests (0: none).
    pub request_id: u64,
    /// Its times were read from the clock (an exact record). Other records carry the
    /// tracer's coarse time (at most one 1 ms tick early): their stage times are `None`.
    pub exact: bool,
    /// Stage times (none: not measured, or not an exact record), of a run's first message.
    pub enqueued: StageTime,
    /// When the transport took it.
    pub sent: StageTime,
    /// When the receiver found it.
    pub received: StageTime,
    /// When its handler started.
    pub handler_start: StageTime,
    /// When its handler ended.
    pub handler_end: StageTime,
    /// Index of the file it came from.
    pub file: u32,
    /// Its first and last message in ticks of its file's clock, where
    /// [`Trace::message_t_ns`] places the messages in between.
    ticks: (u64, u64),
}

/// A stage time of a [`Message`], in nanoseconds since the trace start, or none: 8 bytes
/// where an `Option<u64>` takes 16, so that the five a record carries keep a loaded record
/// at 128 bytes (176 with options). The instant `u64::MAX` (584 years in) stands for none;
/// a time that would land there is kept one nanosecond earlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageTime(u64);

impl StageTime {
    /// No time.
    pub const NONE: StageTime = StageTime(u64::MAX);

    /// The time, if there is one.
    pub fn get(self) -> Option<u64> {
        (self != Self::NONE).then_some(self.0)
    }
}

impl Default for StageTime {
    fn default() -> Self {
        Self::NONE
    }
}

impl From<Option<u64>> for StageTime {
    fn from(t: Option<u64>) -> Self {
        t.map_or(Self::NONE, |ns| StageTime(ns.min(u64::MAX - 1)))
    }
}

/// Messages of one or more trace files on one time line.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The files, in the order given.
    pub files: Vec<FileSummary>,
    /// Every record, by time (of a run's first message).
    pub messages: Vec<Message>,
    /// All files share one clock (one host, one boot): instants compare across files.
    /// Otherwise files are aligned by their wall-clock references, which is only as good
    /// as the hosts' clock synchronisation.
    pub same_clock: bool,
    /// How each file's ticks map onto the time line, by file index.
    time_lines: Vec<TimeLine>,
    /// The time line's instant of the earliest record: the trace's start.
    origin_ns: u64,
}

/// Puts the ticks of one file on the common time line.
#[derive(Clone, Debug)]
struct TimeLine {
    clock: TickClock,
    /// Added to the file's CLOCK_MONOTONIC nanoseconds.
    offset_ns: i128,
}

impl TimeLine {
    /// The instant of `ticks` (`None` for 0: not measured), held within the time line: a
    /// forged clock reference must not wrap it around.
    fn at(&self, ticks: u64) -> Option<u64> {
        (ticks != 0)
            .then(|| (i128::from(self.clock.mono_ns(ticks)) + self.offset_ns).clamp(1, i128::from(u64::MAX)) as u64)
    }

    /// The instant of a record's `ticks` (1 for an unset time).
    fn record_at(&self, ticks: u64) -> u64 {
        self.at(ticks).unwrap_or(1)
    }
}

impl Trace {
    /// Nanoseconds from the start of the trace to the last message.
    pub fn duration_ns(&self) -> u64 {
        self.messages.iter().map(|m| m.last_t_ns).max().unwrap_or(0)
    }

    /// Messages the records stand for (a run counts each of its messages).
    pub fn message_count(&self) -> u64 {
        self.messages.iter().map(|m| u64::from(m.count)).sum()
    }

    /// When message `i` (from 0; past the end: the last) of record `m` was, in
    /// nanoseconds since the start of the trace. A run's messages are spread evenly over
    /// its ticks, message `i` of `count` at `first + span * i / (count - 1)` ticks, so it
    /// is timed exactly as the same messages recorded one by one at those ticks would be.
    pub fn message_t_ns(&self, m: &Message, i: u64) -> u64 {
        let (first, last) = m.ticks;
        let steps = u64::from(m.count.max(1) - 1);
        if steps == 0 || i == 0 {
            return m.t_ns;
        }
        // In 128 bits: a damaged record's span times its count overflows 64.
        let ticks = first + (u128::from(last - first) * u128::from(i.min(steps)) / u128::from(steps)) as u64;
        self.time_lines[m.file as usize].record_at(ticks).saturating_sub(self.origin_ns)
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
    Ok(assemble(decoded))
}

/// Puts decoded trace files (each with the name to report it by) on one time line: one
/// entry per record (a run stays one), times in nanoseconds since the earliest record.
pub fn assemble(decoded: Vec<(String, TraceFile)>) -> Trace {
    let same_clock = decoded.windows(2).all(|w| w[0].1.header.boot_id == w[1].1.header.boot_id)
        && decoded.first().is_some_and(|(_, f)| f.header.boot_id != 0);
    let mut files = Vec::with_capacity(decoded.len());
    let mut time_lines = Vec::with_capacity(decoded.len());
    let mut messages = Vec::with_capacity(decoded.iter().map(|(_, f)| f.records.len()).sum());
    for (index, (path, file)) in decoded.into_iter().enumerate() {
        // Common time line: CLOCK_MONOTONIC when shared, else wall-clock time.
        let offset_ns =
            if same_clock { 0 } else { i128::from(file.header.ref_real_ns) - i128::from(file.header.ref_mono_ns) };
        let line = TimeLine { clock: file.clock(), offset_ns };
        for r in &file.records {
            let count = r.count.max(1);
            let last_ticks = if count == 1 { r.ticks } else { r.ticks.max(r.last_ticks) };
            // Stages only from exact records: a coarse time would make transits of 0 or of
            // a whole tick.
            let stage = |ticks: u64| StageTime::from(if r.exact { line.at(ticks) } else { None });
            let t_ns = line.record_at(r.ticks);
            messages.push(Message {
                t_ns,
                last_t_ns: line.record_at(last_ticks).max(t_ns),
                count,
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
                enqueued: stage(r.enqueued),
                sent: stage(r.sent),
                received: stage(r.received),
                handler_start: stage(r.handler_start),
                handler_end: stage(r.handler_end),
                file: u32::try_from(index).expect("fewer than 2^32 files"),
                ticks: (r.ticks, last_ticks),
            });
        }
        files.push(FileSummary {
            path,
            node: file.header.node_id,
            pid: file.header.pid,
            records: file.records.len(),
            dropped: file.dropped(),
        });
        time_lines.push(line);
    }
    messages.sort_by_key(|m| m.t_ns);
    let origin_ns = messages.first().map_or(0, |m| m.t_ns);
    let shift = |t: &mut StageTime| *t = t.get().map(|v| v.saturating_sub(origin_ns)).into();
    for m in &mut messages {
        m.t_ns -= origin_ns;
        m.last_t_ns -= origin_ns;
        for t in [&mut m.enqueued, &mut m.sent, &mut m.received, &mut m.handler_start, &mut m.handler_end] {
            shift(t);
        }
    }
    Trace { files, messages, same_clock, time_lines, origin_ns }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ulnet_core::trace::format::Record;

    fn file(records: Vec<Record>) -> TraceFile {
        crate::test_files::file(1, 3, 1_000_000_000, &[(0, 0)], records)
    }

    fn run(count: u32, ticks: u64, last_ticks: u64) -> Record {
        Record { ticks, last_ticks, count, size: 8, exact: true, sent: u64::MAX, ..Record::default() }
    }

    #[test]
    fn a_loaded_record_takes_128_bytes_and_its_stage_times_keep_every_instant() {
        assert_eq!(std::mem::size_of::<Message>(), 128);
        assert_eq!(StageTime::from(None).get(), None);
        assert_eq!(StageTime::default(), StageTime::NONE);
        for t in [0, 1, u64::MAX - 1] {
            assert_eq!(StageTime::from(Some(t)).get(), Some(t));
        }
        // The one instant that stands for none is kept as measured, a nanosecond earlier.
        assert_eq!(StageTime::from(Some(u64::MAX)).get(), Some(u64::MAX - 1));
    }

    #[test]
    fn a_run_spread_over_the_whole_clock_loads_without_overflow() {
        let trace = assemble(vec![("a".into(), file(vec![run(3, 1, u64::MAX)]))]);
        let [m] = trace.messages[..] else { panic!("one entry, got {:?}", trace.messages) };
        let t: Vec<f64> = (0..3).map(|i| trace.message_t_ns(&m, i) as f64).collect();
        // Spread evenly from the first tick to the last: the middle one halfway.
        assert!(t[0] == 0.0 && t[2] > 1e19 && (t[1] / t[2] - 0.5).abs() < 1e-6, "times {t:?}");
        let last = trace.message_t_ns(&m, 2);
        assert_eq!((m.t_ns, m.last_t_ns, trace.duration_ns()), (0, last, last));
        assert_eq!(trace.message_t_ns(&m, u64::MAX), m.last_t_ns, "past the end: the last message");
    }

    #[test]
    fn a_run_of_the_largest_count_is_one_entry_and_is_analysed() {
        let trace = assemble(vec![("a".into(), file(vec![run(u32::MAX, 1, 2)]))]);
        assert_eq!(trace.messages.len(), 1);
        assert_eq!((trace.messages[0].count, trace.message_count()), (u32::MAX, u64::from(u32::MAX)));
        assert!(std::mem::size_of_val(&trace.messages[..]) < 1024, "memory for the record, not its messages");
        let study = crate::analyze::analyze(&trace, &Default::default());
        assert_eq!((study.messages, study.bytes), (u64::from(u32::MAX), 8 * u64::from(u32::MAX)));
        assert_eq!(study.rates.nodes[0].per_bin.iter().sum::<u64>(), u64::from(u32::MAX));
        let runs = vec![run(1 << 10, 1, 2); 4];
        let trace = assemble(vec![("a".into(), file(runs))]);
        assert_eq!((trace.messages.len(), trace.message_count()), (4, 4 << 10));
    }

    #[test]
    fn an_exact_run_has_its_first_message_s_stage_times() {
        let trace = assemble(vec![("a".into(), file(vec![Record { sent: 5, ..run(4, 5, 35) }]))]);
        let m = trace.messages[0];
        assert_eq!((m.t_ns, m.last_t_ns, m.sent.get()), (0, 30, Some(0)));
        let times: Vec<u64> = (0..4).map(|i| trace.message_t_ns(&m, i)).collect();
        assert_eq!(times, [0, 10, 20, 30]);
    }
}
