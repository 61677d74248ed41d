//! The study of traces and snapshots (thesis 9.5–9.10): [`load`] reads the files as far as
//! they are whole; [`study`] computes every part:
//! - [`opens`]: per-open sessions — mode (read-only, write-only, read-write), pattern
//!   (whole-file, other sequential, random), bytes, open durations, sequential runs,
//!   read-ahead opportunity, reuse of files;
//! - [`lifetimes`]: how long newly created files live, and how they die;
//! - [`ops`]: user activity, the operation mix, errors, request sizes and spacing;
//! - [`tails`]: heavy-tail tests of the distributions and the Poisson comparison;
//! - [`content`]: what snapshots hold;
//! - [`thesis`]: the thesis's findings beside ours.

pub mod content;
pub mod dist;
pub mod lifetimes;
pub mod opens;
pub mod ops;
pub mod tails;
pub mod thesis;

use crate::format::{Entry, FileKind, Name, Op, Record};
use crate::reader::{Damage, ReadError};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Why the inputs could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: ReadError,
}

/// One trace, its operations in order of start time.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The file.
    pub path: PathBuf,
    /// When tracing started (CLOCK_REALTIME, ns).
    pub start_real_ns: u64,
    /// The operations, ordered by start time (the serving threads record in the order
    /// they finish).
    pub ops: Vec<Op>,
    /// The names of file ids.
    pub names: HashMap<u64, Name>,
    /// The names of processes.
    pub processes: HashMap<u32, String>,
    /// Records lost to a full ring while tracing.
    pub dropped: u64,
}

/// One snapshot.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The file.
    pub path: PathBuf,
    /// When it was taken (CLOCK_REALTIME, ns).
    pub taken_real_ns: u64,
    /// Its entries.
    pub entries: Vec<Entry>,
}

/// What was loaded.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// The traces.
    pub traces: Vec<Trace>,
    /// The snapshots.
    pub snapshots: Vec<Snapshot>,
    damage: Vec<(PathBuf, Damage)>,
}

impl Inputs {
    /// What could not be read, file by file (the rest was).
    pub fn damage(&self) -> &[(PathBuf, Damage)] {
        &self.damage
    }
}

/// Reads every file: a file that cannot be read at all is an error; damage past a good
/// header is reported by [`Inputs::damage`] and the whole blocks are used.
pub fn load(paths: &[impl AsRef<Path>]) -> Result<Inputs, LoadError> {
    let mut inputs = Inputs::default();
    for path in paths {
        let path = path.as_ref();
        let file = crate::reader::read_path(path).map_err(|source| LoadError { path: path.into(), source })?;
        inputs.damage.extend(file.damage.iter().map(|d| (path.to_path_buf(), d.clone())));
        match file.header.kind {
            FileKind::Trace => inputs.traces.push(trace_of(path, file)),
            FileKind::Snapshot => inputs.snapshots.push(Snapshot {
                path: path.into(),
                taken_real_ns: file.header.start_real_ns,
                entries: file
                    .records
                    .into_iter()
                    .filter_map(|r| if let Record::Entry(e) = r { Some(e) } else { None })
                    .collect(),
            }),
        }
    }
    Ok(inputs)
}

/// A trace from a file's records.
pub fn trace_of(path: &Path, file: crate::reader::StudyFile) -> Trace {
    let mut trace = Trace {
        path: path.into(),
        start_real_ns: file.header.start_real_ns,
        ops: Vec::new(),
        names: HashMap::new(),
        processes: HashMap::new(),
        dropped: file.dropped,
    };
    for record in file.records {
        match record {
            Record::Op(op) => trace.ops.push(op),
            Record::Name(n) => {
                trace.names.entry(n.file).or_insert(n);
            }
            Record::Process(p) => {
                trace.processes.insert(p.pid, p.name);
            }
            Record::Entry(_) => {}
        }
    }
    trace.ops.sort_by_key(|o| (o.start_ns, o.offset));
    trace
}

/// The whole study. The fields the command-line contract names (`opens`, `bytes_read`,
/// `bytes_written`, `files_created`, `files_deleted`, `size_hill_alpha`, `whole_file`,
/// `sequential`, `random`) come first.
#[derive(Clone, Debug, Serialize)]
pub struct Study {
    /// Files opened (open and create requests that succeeded).
    pub opens: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// New files made by create requests.
    pub files_created: u64,
    /// Files removed by unlink requests.
    pub files_deleted: u64,
    /// Hill estimate of α of file sizes: of the snapshots' regular files when there are
    /// snapshots, else of the sizes of the files opened for data (each file once, its size
    /// at its last close).
    pub size_hill_alpha: Option<f64>,
    /// Opens that moved data and read or wrote the whole file sequentially.
    pub whole_file: u64,
    /// Opens that moved data sequentially, not the whole file.
    pub sequential: u64,
    /// Opens that moved data at least once out of sequence.
    pub random: u64,
    /// The inputs.
    pub inputs: InputsSummary,
    /// Per-open sessions.
    pub sessions: opens::Sessions,
    /// New files' lifetimes.
    pub lifetimes: lifetimes::Lifetimes,
    /// Operations: activity, mix, errors, sizes, spacing.
    pub operations: ops::Operations,
    /// Heavy tails and arrivals.
    pub tails: tails::Tails,
    /// Snapshot content.
    pub content: Option<content::Content>,
    /// The thesis's findings beside ours.
    pub thesis: Vec<thesis::Comparison>,
}

/// What the study was made from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct InputsSummary {
    /// Trace files.
    pub traces: Vec<String>,
    /// Snapshot files.
    pub snapshots: Vec<String>,
    /// Operations.
    pub operations: u64,
    /// Records lost to a full ring while tracing (the figures miss them).
    pub dropped: u64,
    /// Seconds traced (first to last operation, summed over traces).
    pub traced_s: f64,
    /// Damage found while reading, one line each.
    pub damage: Vec<String>,
}

/// Seed of the Poisson processes the arrivals are compared with.
pub const POISSON_SEED: u64 = 1;

/// Studies what was loaded.
pub fn study(inputs: &Inputs) -> Study {
    let sessions = opens::collect(&inputs.traces);
    let lifetimes = lifetimes::lifetimes(&inputs.traces);
    let operations = ops::operations(&inputs.traces, &sessions);
    let content = content::content(&inputs.snapshots);
    let tails = tails::tails(&inputs.traces, &sessions, &lifetimes, content.as_ref());
    let summary = opens::summarize(&sessions);
    let mut study = Study {
        opens: summary.opens,
        bytes_read: summary.bytes_read,
        bytes_written: summary.bytes_written,
        files_created: lifetimes.created,
        files_deleted: operations.files_deleted,
        size_hill_alpha: tails.size_hill_alpha,
        whole_file: summary.whole_file,
        sequential: summary.sequential,
        random: summary.random,
        inputs: inputs_summary(inputs),
        sessions: summary,
        lifetimes,
        operations,
        tails,
        content,
        thesis: Vec::new(),
    };
    study.thesis = thesis::compare(&study);
    study
}

fn inputs_summary(inputs: &Inputs) -> InputsSummary {
    let span = |t: &Trace| match (t.ops.first(), t.ops.iter().map(|o| o.end_ns()).max()) {
        (Some(first), Some(last)) => last.saturating_sub(first.start_ns) as f64 / 1e9,
        _ => 0.0,
    };
    InputsSummary {
        traces: inputs.traces.iter().map(|t| t.path.display().to_string()).collect(),
        snapshots: inputs.snapshots.iter().map(|s| s.path.display().to_string()).collect(),
        operations: inputs.traces.iter().map(|t| t.ops.len() as u64).sum(),
        dropped: inputs.traces.iter().fold(0u64, |a, t| a.saturating_add(t.dropped)),
        traced_s: inputs.traces.iter().map(span).sum(),
        damage: inputs.damage.iter().map(|(p, d)| format!("{}: {d}", p.display())).collect(),
    }
}

/// The data of one figure: named series of points.
#[derive(Clone, Debug, Serialize)]
pub struct Curve {
    /// File-name stem.
    pub name: String,
    /// Title.
    pub title: String,
    /// Horizontal axis.
    pub x_label: String,
    /// Vertical axis.
    pub y_label: String,
    /// Logarithmic horizontal axis.
    pub log_x: bool,
    /// Logarithmic vertical axis.
    pub log_y: bool,
    /// (legend, points).
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

impl Curve {
    /// Cumulative distributions on a logarithmic axis.
    pub fn cdf(name: &str, title: &str, x_label: &str, series: Vec<(String, Vec<(f64, f64)>)>) -> Curve {
        Curve {
            name: name.into(),
            title: title.into(),
            x_label: x_label.into(),
            y_label: "cumulative share".into(),
            log_x: true,
            log_y: false,
            series: series.into_iter().filter(|(_, p)| !p.is_empty()).collect(),
        }
    }
}
