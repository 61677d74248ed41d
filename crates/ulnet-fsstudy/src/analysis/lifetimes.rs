//! Lifetimes of new files (thesis 9.6.3): a file is new when a create request made it; it
//! dies at the first of: its name removed (unlink), another file renamed over it
//! (replaced), or its contents discarded — opened with `O_TRUNC` or truncated to 0
//! (overwritten). Its lifetime runs from the create to the death; files alive when the
//! trace ends are counted as such.

use super::dist::{cdf_points, percentiles, share_at_most, Percentiles};
use super::Trace;
use crate::format::OpKind;
use crate::passthrough::fs::setattr_bits;
use serde::Serialize;
use std::collections::HashMap;

/// How a new file died.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Death {
    /// Its name was removed.
    Deleted,
    /// Another file was renamed over it.
    Replaced,
    /// Its contents were discarded by a truncating open or a truncation to 0.
    Overwritten,
}

/// One new file that died.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Life {
    /// How.
    pub death: Death,
    /// From create to death, nanoseconds.
    pub lifetime_ns: u64,
    /// From its last close before the death to the death (`None`: never closed before).
    pub close_to_death_ns: Option<u64>,
    /// Its size when it died (as last seen).
    pub size: u64,
    /// The process that made it also ended it.
    pub same_process: bool,
    /// Opens of it between the create and the death.
    pub opened_between: u32,
}

/// The lifetimes of new files.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Lifetimes {
    /// New files.
    pub created: u64,
    /// Of them deleted.
    pub deleted: u64,
    /// Replaced by a rename.
    pub replaced: u64,
    /// Overwritten.
    pub overwritten: u64,
    /// Alive when the trace ended.
    pub alive_at_end: u64,
    /// Lifetimes of the files that died, milliseconds.
    pub lifetime_ms: Percentiles,
    /// Shares of new files dead (any way) within 4 ms, 1 s, 4 s, 5 s, 30 s, 5 min.
    pub dead_within: Vec<(String, f64)>,
    /// Share of new files overwritten within 4 ms.
    pub overwritten_within_4ms: f64,
    /// Share of new files deleted (or replaced) within 5 s.
    pub deleted_within_5s: f64,
    /// Share of dead files smaller than 100 bytes.
    pub dead_under_100b_share: f64,
    /// Share of dead files over 40 KB.
    pub dead_over_40k_share: f64,
    /// Each dead file (for the tail tests and figures).
    pub lives: Vec<Life>,
    /// Curves for the figures.
    pub curves: Vec<super::Curve>,
}

struct Born {
    at_ns: u64,
    pid: u32,
    size: u64,
    last_close_ns: Option<u64>,
    opens: u32,
}

/// Finds the new files of every trace and how long they lived.
pub fn lifetimes(traces: &[Trace]) -> Lifetimes {
    let mut out = Lifetimes::default();
    for t in traces {
        let mut alive: HashMap<u64, Born> = HashMap::new();
        for op in t.ops.iter().filter(|o| !o.failed()) {
            let Some(kind) = op.op_kind() else { continue };
            if kind == OpKind::Create && op.result == 1 {
                out.created += 1;
                alive.insert(op.file, Born { at_ns: op.start_ns, pid: op.pid, size: 0, last_close_ns: None, opens: 0 });
                continue;
            }
            let truncating_open = matches!(kind, OpKind::Open | OpKind::Create) && op.flags as i32 & libc::O_TRUNC != 0;
            let truncation = kind == OpKind::Setattr && op.flags & setattr_bits::SIZE != 0 && op.size == 0;
            let (victim, death) = match kind {
                OpKind::Unlink => (op.other, Death::Deleted),
                OpKind::Rename => (op.other, Death::Replaced),
                _ if truncating_open || truncation => (op.file, Death::Overwritten),
                _ => {
                    note(&mut alive, kind, op);
                    continue;
                }
            };
            if let Some(born) = alive.remove(&victim) {
                out.lives.push(Life {
                    death,
                    lifetime_ns: op.start_ns.saturating_sub(born.at_ns),
                    close_to_death_ns: born.last_close_ns.map(|c| op.start_ns.saturating_sub(c)),
                    size: born.size,
                    same_process: born.pid == op.pid,
                    opened_between: born.opens,
                });
            }
            if matches!(kind, OpKind::Open | OpKind::Create) {
                note(&mut alive, kind, op);
            }
        }
        out.alive_at_end += alive.len() as u64;
    }
    summarize(&mut out);
    out
}

/// Keeps what later tells about a live new file: its size, closes, opens.
fn note(alive: &mut HashMap<u64, Born>, kind: OpKind, op: &crate::format::Op) {
    let Some(born) = alive.get_mut(&op.file) else { return };
    match kind {
        OpKind::Release => {
            born.last_close_ns = Some(op.end_ns());
            born.size = op.file_size;
        }
        OpKind::Write => born.size = born.size.max(op.offset.saturating_add(op.result as u64)),
        OpKind::Open => born.opens += 1,
        OpKind::Getattr | OpKind::Setattr => born.size = op.file_size,
        _ => {}
    }
}

fn summarize(out: &mut Lifetimes) {
    let count = |d: Death| out.lives.iter().filter(|l| l.death == d).count() as u64;
    (out.deleted, out.replaced, out.overwritten) =
        (count(Death::Deleted), count(Death::Replaced), count(Death::Overwritten));
    let ms: Vec<f64> = out.lives.iter().map(|l| l.lifetime_ns as f64 / 1e6).collect();
    out.lifetime_ms = percentiles(&ms);
    let created = out.created.max(1) as f64;
    let within = |pred: &dyn Fn(&Life) -> bool, limit_ms: f64| {
        out.lives.iter().filter(|l| pred(l) && l.lifetime_ns as f64 / 1e6 <= limit_ms).count() as f64 / created
    };
    out.dead_within = [("4 ms", 4.0), ("1 s", 1e3), ("4 s", 4e3), ("5 s", 5e3), ("30 s", 30e3), ("5 min", 300e3)]
        .into_iter()
        .map(|(name, limit)| (name.to_string(), within(&|_| true, limit)))
        .collect();
    out.overwritten_within_4ms = within(&|l| l.death == Death::Overwritten, 4.0);
    out.deleted_within_5s = within(&|l| l.death != Death::Overwritten, 5e3);
    let sizes: Vec<f64> = out.lives.iter().map(|l| l.size as f64).collect();
    out.dead_under_100b_share = share_at_most(&sizes, 99.0);
    out.dead_over_40k_share = 1.0 - share_at_most(&sizes, 40.0 * 1024.0);
    if sizes.is_empty() {
        out.dead_over_40k_share = 0.0;
    }
    let points = |d: Option<Death>| -> Vec<(f64, f64)> {
        out.lives.iter().filter(|l| d.is_none_or(|d| l.death == d)).map(|l| (l.lifetime_ns as f64 / 1e6, 1.0)).collect()
    };
    let close: Vec<(f64, f64)> =
        out.lives.iter().filter_map(|l| l.close_to_death_ns).map(|c| (c as f64 / 1e6, 1.0)).collect();
    out.curves.push(super::Curve::cdf(
        "lifetimes",
        "Lifetimes of new files (cf. Figure 9.6)",
        "milliseconds",
        vec![
            ("create to death, all".into(), cdf_points(&points(None), 300)),
            ("create to delete".into(), cdf_points(&points(Some(Death::Deleted)), 300)),
            ("create to overwrite".into(), cdf_points(&points(Some(Death::Overwritten)), 300)),
            ("last close to death".into(), cdf_points(&close, 300)),
        ],
    ));
}
