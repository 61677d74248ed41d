//! Operations (thesis 9.6.1, 9.8): user activity over 10-minute and 10-second intervals,
//! the mix of operations and their categories, errors by kind, read and write request
//! sizes, the spacing of opens and of reads and writes, and the time the pass-through took
//! to serve each kind of request.
//!
//! Each trace is one user's (the thesis's systems were single-user); an interval is active
//! when it holds any operation.

use super::dist::{cdf_points, percentiles, share, share_at_most, Percentiles};
use super::opens::Session;
use super::Trace;
use crate::format::OpKind;
use serde::Serialize;
use std::collections::BTreeMap;

/// What kind of work an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// Reads and writes.
    Data,
    /// Opens and closes.
    Open,
    /// Names: lookups, listings, creating, removing, renaming, linking.
    Directory,
    /// Attributes, statistics, extended attributes, access tests, syncs, allocation.
    Control,
}

/// The category of an operation kind.
pub fn category(kind: OpKind) -> Category {
    use OpKind::*;
    match kind {
        Read | Write => Category::Data,
        Open | Create | Flush | Release | Opendir | Releasedir => Category::Open,
        Lookup | Readdir | Mkdir | Rmdir | Unlink | Rename | Link | Symlink | Mknod => Category::Directory,
        _ => Category::Control,
    }
}

/// Activity over intervals of one length (Table 9.2).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Activity {
    /// Interval length, seconds.
    pub interval_s: f64,
    /// Intervals from the first operation to the last, summed over traces.
    pub intervals: u64,
    /// Intervals with any operation.
    pub active: u64,
    /// Mean bytes read and written per second over the active intervals, KB/s (1000 B).
    pub mean_kb_per_s: f64,
    /// The busiest interval's, KB/s.
    pub peak_kb_per_s: f64,
}

/// One operation kind's counts.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindCount {
    /// The kind.
    pub op: String,
    /// Its category.
    pub category: Option<Category>,
    /// Requests.
    pub count: u64,
    /// Of them failed.
    pub failed: u64,
    /// Time to serve, microseconds.
    pub service_us: Percentiles,
}

/// Errors of one kind of operation with one errno.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorCount {
    /// The operation.
    pub op: String,
    /// The error's name.
    pub errno: String,
    /// How often.
    pub count: u64,
}

/// The operations' figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Operations {
    /// Requests.
    pub total: u64,
    /// Per kind, most frequent first.
    pub kinds: Vec<KindCount>,
    /// Per category: (category, requests).
    pub categories: Vec<(Category, u64)>,
    /// Files removed by unlink requests that succeeded.
    pub files_deleted: u64,
    /// Share of opens (file opens and directory listings) that moved no data.
    pub opens_without_data_share: f64,
    /// Errors, most frequent first.
    pub errors: Vec<ErrorCount>,
    /// Share of lookups that failed (a missing name: how an open of a missing file shows).
    pub lookup_failed_share: f64,
    /// Share of opens and creates that failed.
    pub open_failed_share: f64,
    /// Share of the failed lookups, opens and creates that failed for a missing name.
    pub open_errors_missing_share: f64,
    /// Share of reads that failed.
    pub read_failed_share: f64,
    /// Share of writes that failed.
    pub write_failed_share: f64,
    /// Share of control operations that failed.
    pub control_failed_share: f64,
    /// Activity per 10 minutes.
    pub per_10_min: Activity,
    /// Activity per 10 seconds.
    pub per_10_s: Activity,
    /// Share of one-second intervals with an open request.
    pub seconds_with_opens_share: f64,
    /// Bytes asked for per read request.
    pub read_size: Percentiles,
    /// Bytes given per write request.
    pub write_size: Percentiles,
    /// Share of reads asking for exactly 512 or 4096 bytes.
    pub reads_512_or_4096_share: f64,
    /// The most common read sizes: (bytes, share).
    pub common_read_sizes: Vec<(u64, f64)>,
    /// The most common write sizes.
    pub common_write_sizes: Vec<(u64, f64)>,
    /// Time between consecutive opens (any process), milliseconds.
    pub open_gap_ms: Percentiles,
    /// Shares of those gaps at most 1 ms and 30 ms.
    pub open_gap_within: (f64, f64),
    /// Time from one read's end to the next read's start in the same session, µs.
    pub read_gap_us: Percentiles,
    /// Share of those at most 90 µs.
    pub read_gap_within_90us: f64,
    /// The same for writes.
    pub write_gap_us: Percentiles,
    /// Share at most 30 µs.
    pub write_gap_within_30us: f64,
    /// Curves for the figures.
    pub curves: Vec<super::Curve>,
}

/// The symbolic name of an errno (a negative result).
pub fn errno_name(result: i64) -> String {
    const NAMES: [(i32, &str); 26] = [
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::EINTR, "EINTR"),
        (libc::EIO, "EIO"),
        (libc::EBADF, "EBADF"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::EACCES, "EACCES"),
        (libc::EBUSY, "EBUSY"),
        (libc::EEXIST, "EEXIST"),
        (libc::EXDEV, "EXDEV"),
        (libc::ENOTDIR, "ENOTDIR"),
        (libc::EISDIR, "EISDIR"),
        (libc::EINVAL, "EINVAL"),
        (libc::ETXTBSY, "ETXTBSY"),
        (libc::EFBIG, "EFBIG"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::EROFS, "EROFS"),
        (libc::EMLINK, "EMLINK"),
        (libc::ERANGE, "ERANGE"),
        (libc::ENAMETOOLONG, "ENAMETOOLONG"),
        (libc::ENOSYS, "ENOSYS"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::ELOOP, "ELOOP"),
        (libc::ENODATA, "ENODATA"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::ESTALE, "ESTALE"),
    ];
    let code = result.unsigned_abs() as i32;
    NAMES.iter().find(|(c, _)| *c == code).map_or_else(|| format!("errno {code}"), |(_, n)| n.to_string())
}

/// The operations' figures of every trace.
pub fn operations(traces: &[Trace], sessions: &[Session]) -> Operations {
    let mut out = Operations { total: traces.iter().map(|t| t.ops.len() as u64).sum(), ..Operations::default() };
    mix_and_errors(traces, &mut out);
    out.per_10_min = activity(traces, 600.0);
    out.per_10_s = activity(traces, 10.0);
    out.seconds_with_opens_share = seconds_with_opens(traces);
    sizes(traces, &mut out);
    spacing(traces, sessions, &mut out);
    let no_data = sessions.iter().filter(|s| s.dir || s.accesses.is_empty()).count() as u64;
    out.opens_without_data_share = share(no_data, sessions.len() as u64);
    out
}

fn mix_and_errors(traces: &[Trace], out: &mut Operations) {
    let mut kinds: BTreeMap<u8, (u64, u64, Vec<f64>)> = BTreeMap::new();
    let mut errors: BTreeMap<(u8, i64), u64> = BTreeMap::new();
    for op in traces.iter().flat_map(|t| &t.ops) {
        let k = kinds.entry(op.kind).or_default();
        k.0 += 1;
        k.2.push(op.duration_ns as f64 / 1e3);
        if op.failed() {
            k.1 += 1;
            *errors.entry((op.kind, op.result)).or_default() += 1;
        } else if op.op_kind() == Some(OpKind::Unlink) {
            out.files_deleted += 1;
        }
    }
    let name = |k: u8| OpKind::from_u8(k).map_or_else(|| format!("kind {k}"), |k| k.name().to_string());
    let mut cats: BTreeMap<Category, u64> = BTreeMap::new();
    let failed_share = |pred: &dyn Fn(OpKind) -> bool| {
        let (n, f) = kinds
            .iter()
            .filter(|(k, _)| OpKind::from_u8(**k).is_some_and(pred))
            .fold((0, 0), |acc, (_, v)| (acc.0 + v.0, acc.1 + v.1));
        share(f, n)
    };
    out.lookup_failed_share = failed_share(&|k| k == OpKind::Lookup);
    out.open_failed_share = failed_share(&|k| matches!(k, OpKind::Open | OpKind::Create));
    out.read_failed_share = failed_share(&|k| k == OpKind::Read);
    out.write_failed_share = failed_share(&|k| k == OpKind::Write);
    out.control_failed_share = failed_share(&|k| category(k) == Category::Control);
    for (k, (count, failed, service)) in &kinds {
        let category = OpKind::from_u8(*k).map(category);
        if let Some(c) = category {
            *cats.entry(c).or_default() += count;
        }
        out.kinds.push(KindCount {
            op: name(*k),
            category,
            count: *count,
            failed: *failed,
            service_us: percentiles(service),
        });
    }
    out.kinds.sort_by_key(|k| std::cmp::Reverse(k.count));
    out.categories = cats.into_iter().collect();
    let opening = |k: &u8| matches!(OpKind::from_u8(*k), Some(OpKind::Lookup | OpKind::Open | OpKind::Create));
    let failed_opening: u64 = errors.iter().filter(|((k, _), _)| opening(k)).map(|(_, n)| n).sum();
    let missing: u64 =
        errors.iter().filter(|((k, e), _)| opening(k) && *e == -i64::from(libc::ENOENT)).map(|(_, n)| n).sum();
    out.open_errors_missing_share = share(missing, failed_opening);
    out.errors =
        errors.into_iter().map(|((k, e), count)| ErrorCount { op: name(k), errno: errno_name(e), count }).collect();
    out.errors.sort_by_key(|e| std::cmp::Reverse(e.count));
    let service = |k: OpKind| -> Vec<(f64, f64)> {
        kinds.get(&(k as u8)).map_or_else(Vec::new, |v| v.2.iter().map(|d| (*d, 1.0)).collect())
    };
    out.curves.push(super::Curve::cdf(
        "service-time",
        "Time the pass-through took to serve each request, by kind (cf. Figure 9.13)",
        "microseconds",
        [OpKind::Read, OpKind::Write, OpKind::Lookup, OpKind::Getattr, OpKind::Open]
            .into_iter()
            .map(|k| (k.name().to_string(), cdf_points(&service(k), 300)))
            .collect(),
    ));
}

/// Bytes moved per interval of `interval_s` seconds, over each trace's span. Only the
/// active intervals are kept (a trace's span bounds nothing a file could forge).
fn activity(traces: &[Trace], interval_s: f64) -> Activity {
    let width = ((interval_s * 1e9) as u64).max(1);
    let mut out = Activity { interval_s, ..Activity::default() };
    let mut rates = Vec::new();
    for t in traces {
        let (Some(first), Some(last)) = (t.ops.first(), t.ops.last()) else { continue };
        let mut active: BTreeMap<u64, u64> = BTreeMap::new();
        for op in &t.ops {
            let bytes = active.entry((op.start_ns - first.start_ns) / width).or_default();
            if matches!(op.op_kind(), Some(OpKind::Read | OpKind::Write)) && !op.failed() {
                *bytes = bytes.saturating_add(op.result as u64);
            }
        }
        out.intervals = out.intervals.saturating_add((last.start_ns - first.start_ns) / width + 1);
        out.active += active.len() as u64;
        rates.extend(active.values().map(|&b| b as f64 / interval_s / 1e3));
    }
    out.mean_kb_per_s = if rates.is_empty() { 0.0 } else { rates.iter().sum::<f64>() / rates.len() as f64 };
    out.peak_kb_per_s = rates.iter().copied().fold(0.0, f64::max);
    out
}

fn seconds_with_opens(traces: &[Trace]) -> f64 {
    let (mut seconds, mut with_opens) = (0u64, 0u64);
    for t in traces {
        let (Some(first), Some(last)) = (t.ops.first(), t.ops.last()) else { continue };
        let hit: std::collections::BTreeSet<u64> = t
            .ops
            .iter()
            .filter(|o| matches!(o.op_kind(), Some(OpKind::Open | OpKind::Create)))
            .map(|o| (o.start_ns - first.start_ns) / 1_000_000_000)
            .collect();
        seconds = seconds.saturating_add((last.start_ns - first.start_ns) / 1_000_000_000 + 1);
        with_opens += hit.len() as u64;
    }
    share(with_opens, seconds)
}

fn common(sizes: &[u64]) -> Vec<(u64, f64)> {
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    for s in sizes {
        *counts.entry(*s).or_default() += 1;
    }
    let mut v: Vec<(u64, u64)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().take(10).map(|(s, c)| (s, share(c, sizes.len() as u64))).collect()
}

fn sizes(traces: &[Trace], out: &mut Operations) {
    let of = |k: OpKind| -> Vec<u64> {
        traces.iter().flat_map(|t| &t.ops).filter(|o| o.kind == k as u8 && !o.failed()).map(|o| o.size).collect()
    };
    let (reads, writes) = (of(OpKind::Read), of(OpKind::Write));
    let f = |v: &[u64]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    out.read_size = percentiles(&f(&reads));
    out.write_size = percentiles(&f(&writes));
    out.reads_512_or_4096_share =
        share(reads.iter().filter(|&&s| s == 512 || s == 4096).count() as u64, reads.len() as u64);
    out.common_read_sizes = common(&reads);
    out.common_write_sizes = common(&writes);
    let pts = |v: &[u64]| cdf_points(&v.iter().map(|&x| (x as f64, 1.0)).collect::<Vec<_>>(), 300);
    out.curves.push(super::Curve::cdf(
        "request-size",
        "Bytes asked for per read and given per write request (cf. Figure 9.14)",
        "bytes",
        vec![("read".into(), pts(&reads)), ("write".into(), pts(&writes))],
    ));
}

fn spacing(traces: &[Trace], sessions: &[Session], out: &mut Operations) {
    let mut open_gaps = Vec::new();
    for t in traces {
        let opens: Vec<u64> = t
            .ops
            .iter()
            .filter(|o| matches!(o.op_kind(), Some(OpKind::Open | OpKind::Create)))
            .map(|o| o.start_ns)
            .collect();
        open_gaps.extend(opens.windows(2).map(|w| (w[1] - w[0]) as f64 / 1e6));
    }
    out.open_gap_ms = percentiles(&open_gaps);
    out.open_gap_within = (share_at_most(&open_gaps, 1.0), share_at_most(&open_gaps, 30.0));
    let (mut read_gaps, mut write_gaps) = (Vec::new(), Vec::new());
    for s in sessions {
        let mut acc = s.accesses.clone();
        acc.sort_by_key(|a| a.start_ns);
        for w in acc.windows(2).filter(|w| w[0].write == w[1].write) {
            let gap = w[1].start_ns.saturating_sub(w[0].end_ns) as f64 / 1e3;
            if w[0].write {
                write_gaps.push(gap)
            } else {
                read_gaps.push(gap)
            }
        }
    }
    out.read_gap_us = percentiles(&read_gaps);
    out.read_gap_within_90us = share_at_most(&read_gaps, 90.0);
    out.write_gap_us = percentiles(&write_gaps);
    out.write_gap_within_30us = share_at_most(&write_gaps, 30.0);
    let pts = |v: &[f64]| cdf_points(&v.iter().map(|&x| (x, 1.0)).collect::<Vec<_>>(), 300);
    out.curves.push(super::Curve::cdf(
        "open-interarrival",
        "Time between consecutive open requests (cf. Figure 9.11)",
        "milliseconds",
        vec![("open requests".into(), pts(&open_gaps))],
    ));
}
