//! Per-open sessions (thesis 9.6.2, 9.8.1, 9.9.1): each open or create is a session —
//! the thesis's FileObject — from the open request to its release, with the reads and
//! writes made through it.
//!
//! **Mode** is what the session did: read-only, write-only, read-write, or no data (a
//! control or directory open). **Pattern** (of sessions that moved data): *whole-file* —
//! every access follows the one before, the first at offset 0, and the last reaches the
//! file's end (read-only: its size at open; write-only: at close; read-write: the larger);
//! *sequential* — every access follows the one before, but not over the whole file;
//! *random* — at least one access elsewhere. Requests that overlap in time (the kernel
//! splits one large read into requests served in parallel) are put in offset order before
//! this is judged. A *sequential run* is a stretch of accesses each following the one
//! before; its length is the bytes it moved.

use super::dist::{cdf_points, percentiles, share, share_at_most, Percentiles};
use super::Trace;
use crate::format::OpKind;
use serde::Serialize;
use std::collections::HashMap;

/// One read or write of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Where it started.
    pub offset: u64,
    /// Bytes moved.
    pub len: u64,
    /// A write (else a read).
    pub write: bool,
    /// Bytes asked for.
    pub asked: u64,
    /// When it reached the pass-through.
    pub start_ns: u64,
    /// When it was served.
    pub end_ns: u64,
}

impl Access {
    fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// One open instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// Which trace.
    pub trace: usize,
    /// The handle.
    pub handle: u64,
    /// The file id.
    pub file: u64,
    /// Who opened it.
    pub pid: u32,
    /// A directory listing (opendir), not a file open.
    pub dir: bool,
    /// When the open arrived.
    pub start_ns: u64,
    /// When it was released (`None`: still open when the trace ended).
    pub end_ns: Option<u64>,
    /// Open flags.
    pub flags: u32,
    /// The file's size after the open.
    pub size_at_open: u64,
    /// Its size at release.
    pub size_at_close: Option<u64>,
    /// Made by a create request that made a new file.
    pub created: bool,
    /// Its reads and writes that succeeded, in arrival order.
    pub accesses: Vec<Access>,
}

/// What a session did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Only reads.
    ReadOnly,
    /// Only writes.
    WriteOnly,
    /// Both.
    ReadWrite,
    /// Neither.
    NoData,
}

/// How a session moved its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Sequentially over the whole file.
    WholeFile,
    /// Sequentially over part of it.
    Sequential,
    /// Not in sequence.
    Random,
}

impl Session {
    /// What it did.
    pub fn mode(&self) -> Mode {
        let (r, w) = (self.accesses.iter().any(|a| !a.write), self.accesses.iter().any(|a| a.write));
        match (r, w) {
            (true, false) => Mode::ReadOnly,
            (false, true) => Mode::WriteOnly,
            (true, true) => Mode::ReadWrite,
            (false, false) => Mode::NoData,
        }
    }

    /// Bytes read.
    pub fn bytes_read(&self) -> u64 {
        self.accesses.iter().filter(|a| !a.write).fold(0u64, |acc, a| acc.saturating_add(a.len))
    }

    /// Bytes written.
    pub fn bytes_written(&self) -> u64 {
        self.accesses.iter().filter(|a| a.write).fold(0u64, |acc, a| acc.saturating_add(a.len))
    }

    /// Bytes read and written.
    pub fn bytes_moved(&self) -> u64 {
        self.bytes_read().saturating_add(self.bytes_written())
    }

    /// The accesses in the order they were made, requests overlapping in time put in
    /// offset order.
    pub fn ordered(&self) -> Vec<Access> {
        let mut v = self.accesses.clone();
        v.sort_by_key(|a| (a.start_ns, a.offset));
        let mut out: Vec<Access> = Vec::with_capacity(v.len());
        let mut group_start = 0;
        let mut group_end = 0u64;
        for a in v {
            if out.len() > group_start && a.start_ns > group_end {
                out[group_start..].sort_by_key(|x| x.offset);
                group_start = out.len();
            }
            group_end = if out.len() == group_start { a.end_ns } else { group_end.max(a.end_ns) };
            out.push(a);
        }
        out[group_start..].sort_by_key(|x| x.offset);
        out
    }

    /// How it moved its data (`None` when it moved none).
    pub fn pattern(&self) -> Option<Pattern> {
        let mode = self.mode();
        if mode == Mode::NoData {
            return None;
        }
        let acc = self.ordered();
        if acc.windows(2).any(|w| w[1].offset != w[0].end()) {
            return Some(Pattern::Random);
        }
        let end = acc.last().map_or(0, |a| a.end());
        let close = self.size_at_close.unwrap_or(end);
        let reference = match mode {
            Mode::ReadOnly => self.size_at_open,
            Mode::WriteOnly => close,
            _ => self.size_at_open.max(close),
        };
        if acc[0].offset == 0 && end >= reference {
            Some(Pattern::WholeFile)
        } else {
            Some(Pattern::Sequential)
        }
    }

    /// Bytes of each sequential run.
    pub fn runs(&self) -> Vec<u64> {
        let mut runs = Vec::new();
        let mut current: Option<(u64, u64)> = None; // (end, bytes)
        for a in self.ordered().into_iter().filter(|a| a.len > 0) {
            current = match current {
                Some((end, bytes)) if a.offset == end => Some((a.end(), bytes.saturating_add(a.len))),
                Some((_, bytes)) => {
                    runs.push(bytes);
                    Some((a.end(), a.len))
                }
                None => Some((a.end(), a.len)),
            };
        }
        runs.extend(current.map(|c| c.1));
        runs
    }

    /// How long it was open, in nanoseconds.
    pub fn duration_ns(&self) -> Option<u64> {
        self.end_ns.map(|e| e.saturating_sub(self.start_ns))
    }
}

/// The sessions of every trace, in order of their opens.
pub fn collect(traces: &[Trace]) -> Vec<Session> {
    let mut done = Vec::new();
    for (ti, t) in traces.iter().enumerate() {
        let mut open: HashMap<u64, Session> = HashMap::new();
        for op in &t.ops {
            let Some(kind) = op.op_kind() else { continue };
            match kind {
                OpKind::Open | OpKind::Create | OpKind::Opendir if !op.failed() && op.handle != 0 => {
                    let session = Session {
                        trace: ti,
                        handle: op.handle,
                        file: op.file,
                        pid: op.pid,
                        dir: kind == OpKind::Opendir,
                        start_ns: op.start_ns,
                        end_ns: None,
                        flags: op.flags,
                        size_at_open: op.file_size,
                        size_at_close: None,
                        created: kind == OpKind::Create && op.result == 1,
                        accesses: Vec::new(),
                    };
                    if let Some(old) = open.insert(op.handle, session) {
                        done.push(old);
                    }
                }
                OpKind::Read | OpKind::Write if !op.failed() => {
                    if let Some(s) = open.get_mut(&op.handle) {
                        s.accesses.push(Access {
                            offset: op.offset,
                            len: op.result as u64,
                            write: kind == OpKind::Write,
                            asked: op.size,
                            start_ns: op.start_ns,
                            end_ns: op.end_ns(),
                        });
                    }
                }
                OpKind::Release | OpKind::Releasedir => {
                    if let Some(mut s) = open.remove(&op.handle) {
                        s.end_ns = Some(op.end_ns());
                        s.size_at_close = (kind == OpKind::Release).then_some(op.file_size);
                        done.push(s);
                    }
                }
                _ => {}
            }
        }
        done.extend(open.into_values());
    }
    done.sort_by_key(|s| (s.trace, s.start_ns, s.handle));
    done
}

/// One row of the access-pattern table (thesis Table 9.3): sessions of one mode.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PatternRow {
    /// The mode.
    pub mode: String,
    /// Sessions.
    pub opens: u64,
    /// Whole-file sequential sessions.
    pub whole_file: u64,
    /// Other sequential sessions.
    pub sequential: u64,
    /// Random sessions.
    pub random: u64,
    /// Bytes moved by whole-file sessions.
    pub bytes_whole_file: u64,
    /// By other sequential sessions.
    pub bytes_sequential: u64,
    /// By random sessions.
    pub bytes_random: u64,
}

impl PatternRow {
    /// Bytes moved sequentially (whole-file and other).
    pub fn sequential_bytes(&self) -> u64 {
        self.bytes_whole_file.saturating_add(self.bytes_sequential)
    }

    /// Bytes moved.
    pub fn bytes(&self) -> u64 {
        self.sequential_bytes().saturating_add(self.bytes_random)
    }
}

/// Read-ahead opportunity (thesis 9.9.1).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Readahead {
    /// Sessions that read.
    pub read_sessions: u64,
    /// Share of them that read with a single request.
    pub single_read_share: f64,
    /// Sequential read-only sessions with more than one read.
    pub sequential_multi_read: u64,
    /// Share of those whose largest read was under 4 KiB.
    pub reads_under_4k_share: f64,
    /// Under 64 KiB.
    pub reads_under_64k_share: f64,
    /// Share of those that read more than one 64 KiB read-ahead holds.
    pub beyond_one_64k_share: f64,
}

/// Files opened again (thesis 9.8.1).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Reuse {
    /// Files opened read-only.
    pub read_only_files: u64,
    /// Share of them opened read-only more than once.
    pub read_only_reopened_share: f64,
    /// Files opened write-only.
    pub write_only_files: u64,
    /// Share of them opened write-only again.
    pub write_only_rewritten_share: f64,
    /// Share of them opened for reading afterwards.
    pub write_only_read_after_share: f64,
    /// Files opened read-write.
    pub read_write_files: u64,
    /// Share of them opened read-write more than once.
    pub read_write_reopened_share: f64,
}

/// The sessions' figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sessions {
    /// File opens (open and create).
    pub opens: u64,
    /// Directory listings opened.
    pub dir_opens: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Whole-file sessions.
    pub whole_file: u64,
    /// Other sequential sessions.
    pub sequential: u64,
    /// Random sessions.
    pub random: u64,
    /// File opens that moved no data.
    pub opens_without_data: u64,
    /// Table 9.3: per mode.
    pub patterns: Vec<PatternRow>,
    /// How long sessions that moved data were open, milliseconds.
    pub open_ms_data: Percentiles,
    /// How long sessions without data (file and directory) were open, milliseconds.
    pub open_ms_no_data: Percentiles,
    /// Shares of all closed sessions open at most 1 ms, 10 ms, 1 s; of data sessions at
    /// most 10 ms.
    pub open_within: OpenWithin,
    /// Bytes of sequential runs.
    pub run_bytes: Percentiles,
    /// The run length below which 80% of the bytes moved in runs were moved.
    pub run_bytes_p80_by_bytes: f64,
    /// Bytes moved per session that moved data.
    pub session_bytes: Percentiles,
    /// Size at close of the files of sessions that moved data.
    pub file_size_at_close: Percentiles,
    /// Share of those under 26 KB.
    pub files_under_26k_share: f64,
    /// Read-ahead opportunity.
    pub readahead: Readahead,
    /// Reuse of files.
    pub reuse: Reuse,
    /// Curves for the figures.
    pub curves: Vec<super::Curve>,
}

/// Shares of sessions closed within a time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpenWithin {
    /// All sessions, 1 ms.
    pub all_1ms: f64,
    /// All sessions, 10 ms.
    pub all_10ms: f64,
    /// All sessions, 1 s.
    pub all_1s: f64,
    /// Sessions that moved data, 10 ms.
    pub data_10ms: f64,
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::ReadOnly => "read-only",
        Mode::WriteOnly => "write-only",
        Mode::ReadWrite => "read-write",
        Mode::NoData => "no data",
    }
}

/// The figures of `sessions`.
pub fn summarize(sessions: &[Session]) -> Sessions {
    let files: Vec<&Session> = sessions.iter().filter(|s| !s.dir).collect();
    let data: Vec<&Session> = files.iter().copied().filter(|s| s.mode() != Mode::NoData).collect();
    let mut out = Sessions {
        opens: files.len() as u64,
        dir_opens: (sessions.len() - files.len()) as u64,
        bytes_read: files.iter().fold(0u64, |a, s| a.saturating_add(s.bytes_read())),
        bytes_written: files.iter().fold(0u64, |a, s| a.saturating_add(s.bytes_written())),
        opens_without_data: (files.len() - data.len()) as u64,
        patterns: pattern_rows(&data),
        ..Sessions::default()
    };
    for s in &data {
        match s.pattern() {
            Some(Pattern::WholeFile) => out.whole_file += 1,
            Some(Pattern::Sequential) => out.sequential += 1,
            Some(Pattern::Random) => out.random += 1,
            None => {}
        }
    }
    durations(sessions, &data, &mut out);
    runs_and_sizes(&data, &mut out);
    out.readahead = readahead(&data);
    out.reuse = reuse(&data);
    out
}

fn pattern_rows(data: &[&Session]) -> Vec<PatternRow> {
    [Mode::ReadOnly, Mode::WriteOnly, Mode::ReadWrite]
        .into_iter()
        .map(|mode| {
            let mut row = PatternRow { mode: mode_name(mode).into(), ..PatternRow::default() };
            for s in data.iter().filter(|s| s.mode() == mode) {
                let bytes = s.bytes_moved();
                row.opens += 1;
                match s.pattern() {
                    Some(Pattern::WholeFile) => {
                        (row.whole_file += 1, row.bytes_whole_file = row.bytes_whole_file.saturating_add(bytes))
                    }
                    Some(Pattern::Sequential) => {
                        (row.sequential += 1, row.bytes_sequential = row.bytes_sequential.saturating_add(bytes))
                    }
                    _ => (row.random += 1, row.bytes_random = row.bytes_random.saturating_add(bytes)),
                };
            }
            row
        })
        .collect()
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn durations(all: &[Session], data: &[&Session], out: &mut Sessions) {
    let all_ms: Vec<f64> = all.iter().filter_map(|s| s.duration_ns()).map(ms).collect();
    let data_ms: Vec<f64> = data.iter().filter_map(|s| s.duration_ns()).map(ms).collect();
    let none_ms: Vec<f64> =
        all.iter().filter(|s| s.dir || s.mode() == Mode::NoData).filter_map(|s| s.duration_ns()).map(ms).collect();
    out.open_ms_data = percentiles(&data_ms);
    out.open_ms_no_data = percentiles(&none_ms);
    out.open_within = OpenWithin {
        all_1ms: share_at_most(&all_ms, 1.0),
        all_10ms: share_at_most(&all_ms, 10.0),
        all_1s: share_at_most(&all_ms, 1000.0),
        data_10ms: share_at_most(&data_ms, 10.0),
    };
    let by_mode = |m: Mode| -> Vec<(f64, f64)> {
        data.iter().filter(|s| s.mode() == m).filter_map(|s| s.duration_ns()).map(|d| (ms(d), 1.0)).collect()
    };
    let mut series =
        vec![("all sessions".to_string(), cdf_points(&all_ms.iter().map(|v| (*v, 1.0)).collect::<Vec<_>>(), 300))];
    for m in [Mode::ReadOnly, Mode::WriteOnly, Mode::ReadWrite] {
        series.push((mode_name(m).to_string(), cdf_points(&by_mode(m), 300)));
    }
    series.push(("no data".into(), cdf_points(&none_ms.iter().map(|v| (*v, 1.0)).collect::<Vec<_>>(), 300)));
    out.curves.push(super::Curve::cdf(
        "open-duration",
        "How long files stay open (cf. Figures 9.5, 9.12)",
        "milliseconds open",
        series,
    ));
}

fn runs_and_sizes(data: &[&Session], out: &mut Sessions) {
    let runs: Vec<u64> = data.iter().flat_map(|s| s.runs()).collect();
    let runs_f: Vec<f64> = runs.iter().map(|&r| r as f64).collect();
    out.run_bytes = percentiles(&runs_f);
    let by_bytes: Vec<(f64, f64)> = runs.iter().map(|&r| (r as f64, r as f64)).collect();
    let by_count: Vec<(f64, f64)> = runs.iter().map(|&r| (r as f64, 1.0)).collect();
    let bytes_cdf = cdf_points(&by_bytes, usize::MAX);
    out.run_bytes_p80_by_bytes = bytes_cdf.iter().find(|p| p.1 >= 0.8).map_or(0.0, |p| p.0);
    out.curves.push(super::Curve::cdf(
        "sequential-runs",
        "Sequential run length, by runs and by bytes (cf. Figures 9.1, 9.2)",
        "run length (bytes)",
        vec![
            ("weighted by runs".into(), cdf_points(&by_count, 300)),
            ("weighted by bytes".into(), cdf_points(&by_bytes, 300)),
        ],
    ));
    let session_bytes: Vec<f64> = data.iter().map(|s| s.bytes_moved() as f64).collect();
    out.session_bytes = percentiles(&session_bytes);
    let sizes: Vec<f64> = data.iter().map(|s| s.size_at_close.unwrap_or(s.size_at_open) as f64).collect();
    out.file_size_at_close = percentiles(&sizes);
    out.files_under_26k_share = share_at_most(&sizes, 26.0 * 1024.0);
    let by_mode = |m: Mode| -> Vec<(f64, f64)> {
        data.iter().filter(|s| s.mode() == m).map(|s| (s.size_at_close.unwrap_or(s.size_at_open) as f64, 1.0)).collect()
    };
    out.curves.push(super::Curve::cdf(
        "file-size-by-mode",
        "Size of the files opened, by session mode (cf. Figure 9.3)",
        "file size (bytes)",
        [Mode::ReadOnly, Mode::ReadWrite, Mode::WriteOnly]
            .into_iter()
            .map(|m| (mode_name(m).to_string(), cdf_points(&by_mode(m), 300)))
            .collect(),
    ));
}

fn readahead(data: &[&Session]) -> Readahead {
    let readers: Vec<&&Session> = data.iter().filter(|s| s.accesses.iter().any(|a| !a.write)).collect();
    let single = readers.iter().filter(|s| s.accesses.iter().filter(|a| !a.write).count() == 1).count();
    let multi: Vec<&&Session> = data
        .iter()
        .filter(|s| s.mode() == Mode::ReadOnly && s.pattern() != Some(Pattern::Random) && s.accesses.len() > 1)
        .collect();
    let largest = |s: &Session| s.accesses.iter().map(|a| a.asked).max().unwrap_or(0);
    let n = multi.len() as u64;
    let count = |f: &dyn Fn(&Session) -> bool| multi.iter().filter(|s| f(s)).count() as u64;
    Readahead {
        read_sessions: readers.len() as u64,
        single_read_share: share(single as u64, readers.len() as u64),
        sequential_multi_read: n,
        reads_under_4k_share: share(count(&|s| largest(s) < 4096), n),
        reads_under_64k_share: share(count(&|s| largest(s) < 65536), n),
        beyond_one_64k_share: share(count(&|s| s.bytes_read() > 65536), n),
    }
}

fn reuse(data: &[&Session]) -> Reuse {
    let mut modes: HashMap<(usize, u64), Vec<Mode>> = HashMap::new();
    for s in data {
        modes.entry((s.trace, s.file)).or_default().push(s.mode());
    }
    let (mut ro, mut ro_again, mut wo, mut wo_again, mut wo_read, mut rw, mut rw_again) = (0, 0, 0, 0, 0, 0, 0);
    for seq in modes.values() {
        let count = |m: Mode| seq.iter().filter(|x| **x == m).count();
        if count(Mode::ReadOnly) > 0 {
            ro += 1;
            ro_again += u64::from(count(Mode::ReadOnly) > 1);
        }
        if let Some(first_wo) = seq.iter().position(|m| *m == Mode::WriteOnly) {
            wo += 1;
            wo_again += u64::from(count(Mode::WriteOnly) > 1);
            wo_read += u64::from(seq[first_wo + 1..].iter().any(|m| matches!(m, Mode::ReadOnly | Mode::ReadWrite)));
        }
        if count(Mode::ReadWrite) > 0 {
            rw += 1;
            rw_again += u64::from(count(Mode::ReadWrite) > 1);
        }
    }
    Reuse {
        read_only_files: ro,
        read_only_reopened_share: share(ro_again, ro),
        write_only_files: wo,
        write_only_rewritten_share: share(wo_again, wo),
        write_only_read_after_share: share(wo_read, wo),
        read_write_files: rw,
        read_write_reopened_share: share(rw_again, rw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(size_at_open: u64, size_at_close: u64, accesses: &[(u64, u64, bool)]) -> Session {
        Session {
            trace: 0,
            handle: 1,
            file: 2,
            pid: 3,
            dir: false,
            start_ns: 0,
            end_ns: Some(100),
            flags: 0,
            size_at_open,
            size_at_close: Some(size_at_close),
            created: false,
            accesses: accesses
                .iter()
                .enumerate()
                .map(|(i, &(offset, len, write))| Access {
                    offset,
                    len,
                    write,
                    asked: len,
                    start_ns: 10 * i as u64,
                    end_ns: 10 * i as u64 + 5,
                })
                .collect(),
        }
    }

    #[test]
    fn patterns_follow_the_definitions() {
        assert_eq!(session(100, 100, &[(0, 60, false), (60, 40, false)]).pattern(), Some(Pattern::WholeFile));
        assert_eq!(session(100, 100, &[(0, 60, false)]).pattern(), Some(Pattern::Sequential));
        assert_eq!(session(100, 100, &[(10, 90, false)]).pattern(), Some(Pattern::Sequential));
        assert_eq!(session(100, 100, &[(60, 40, false), (0, 60, false)]).pattern(), Some(Pattern::Random));
        assert_eq!(session(0, 50, &[(0, 50, true)]).pattern(), Some(Pattern::WholeFile));
        assert_eq!(session(0, 0, &[]).pattern(), None);
        assert_eq!(session(100, 100, &[(0, 50, true), (0, 50, false)]).mode(), Mode::ReadWrite);
    }

    #[test]
    fn requests_overlapping_in_time_are_taken_in_offset_order() {
        let mut s = session(200, 200, &[]);
        // One 200-byte read split in two requests served in parallel, the second first.
        s.accesses = vec![
            Access { offset: 100, len: 100, write: false, asked: 100, start_ns: 5, end_ns: 20 },
            Access { offset: 0, len: 100, write: false, asked: 100, start_ns: 6, end_ns: 21 },
        ];
        assert_eq!(s.pattern(), Some(Pattern::WholeFile));
        assert_eq!(s.runs(), vec![200]);
    }

    #[test]
    fn runs_break_at_each_jump() {
        let s =
            session(1000, 1000, &[(0, 10, false), (10, 10, false), (500, 5, false), (505, 5, false), (0, 1, false)]);
        assert_eq!(s.runs(), vec![20, 10, 1]);
    }
}
