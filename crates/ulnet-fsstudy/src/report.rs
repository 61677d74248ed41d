//! The study as a report: Markdown with tables laid out like the thesis's (Table 9.1's
//! observations with the thesis's values beside ours, Table 9.2's user activity, Table
//! 9.3's access patterns, then lifetimes, operations, errors, read-ahead, heavy tails and
//! content), SVG figures drawn with `ulnet-trace`'s plotting (the thesis's values marked
//! on them where it gives them), the study as JSON, and a short text for the terminal.

use crate::analysis::{Curve, Study};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use ulnet_trace::plot::{Figure, LineChart, PlotError, Series, Style};

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A figure could not be drawn.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The JSON could not be made.
    #[error("encoding the study as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The thesis's values that the figures mark: (figure, legend, points).
fn thesis_marks(figure: &str) -> Option<(&'static str, Vec<(f64, f64)>)> {
    match figure {
        "open-duration" => Some((
            "thesis: 75% of data opens < 10 ms; 40% of all < 1 ms, 90% < 1 s",
            vec![(10.0, 0.75), (1.0, 0.4), (1000.0, 0.9)],
        )),
        "sequential-runs" => Some(("thesis: 80% of runs <= 11 KB", vec![(11.0 * 1024.0, 0.8)])),
        "open-interarrival" => Some(("thesis: 40% within 1 ms, 90% within 30 ms", vec![(1.0, 0.4), (30.0, 0.9)])),
        "file-size-by-mode" => Some(("thesis: 80% of files < 26 KB", vec![(26.0 * 1024.0, 0.8)])),
        "lifetimes" => {
            Some(("thesis: 26% overwritten within 4 ms, 80% deleted within 4 s", vec![(4.0, 0.26), (4000.0, 0.8)]))
        }
        _ => None,
    }
}

fn figure(c: &Curve) -> Figure {
    let mut series: Vec<Series> = c
        .series
        .iter()
        .map(|(name, points)| Series {
            name: name.clone(),
            points: points.clone(),
            style: if points.len() <= 2 { Style::Reference } else { Style::Line },
        })
        .collect();
    if let Some((name, points)) = thesis_marks(&c.name) {
        series.push(Series { name: name.into(), points, style: Style::Points });
    }
    Figure::Lines(LineChart {
        name: c.name.clone(),
        title: c.title.clone(),
        x_label: c.x_label.clone(),
        y_label: c.y_label.clone(),
        log_x: c.log_x,
        log_y: c.log_y,
        series,
    })
}

/// Every curve of the study, in report order.
pub fn curves(s: &Study) -> Vec<&Curve> {
    let mut v: Vec<&Curve> = Vec::new();
    v.extend(&s.sessions.curves);
    v.extend(&s.lifetimes.curves);
    v.extend(&s.operations.curves);
    v.extend(&s.tails.curves);
    if let Some(c) = &s.content {
        v.extend(&c.curves);
    }
    v.retain(|c| c.series.iter().any(|(_, p)| !p.is_empty()));
    v
}

/// Writes `report.md`, `study.json` and `figures/NAME.svg` into `dir`; returns the files.
pub fn write(s: &Study, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReportError::Io { path, source }
    };
    let figures_dir = dir.join("figures");
    std::fs::create_dir_all(&figures_dir).map_err(io(&figures_dir))?;
    let mut written = Vec::new();
    for c in curves(s) {
        let path = figures_dir.join(format!("{}.svg", c.name));
        std::fs::write(&path, figure(c).svg()?).map_err(io(&path))?;
        written.push(path);
    }
    let md = dir.join("report.md");
    std::fs::write(&md, markdown(s, "figures")).map_err(io(&md))?;
    let json = dir.join("study.json");
    std::fs::write(&json, serde_json::to_string_pretty(s)?).map_err(io(&json))?;
    written.extend([md, json]);
    Ok(written)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn bytes(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.2} GB", x / 1e9),
        x if x >= 1e6 => format!("{:.2} MB", x / 1e6),
        x if x >= 1e3 => format!("{:.1} KB", x / 1e3),
        x => format!("{x:.0} B"),
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

fn table(o: &mut String, head: &[&str], rows: impl IntoIterator<Item = Vec<String>>) {
    let _ = writeln!(o, "| {} |", head.join(" | "));
    let _ = writeln!(o, "|{}", head.iter().map(|_| "---|").collect::<String>());
    for r in rows {
        let _ = writeln!(o, "| {} |", r.join(" | "));
    }
    o.push('\n');
}

/// A few lines for the terminal.
pub fn text(s: &Study) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} operations in {:.1} s ({} dropped); {} opens, {} read, {} written; {} files created, {} deleted",
        s.inputs.operations,
        s.inputs.traced_s,
        s.inputs.dropped,
        s.opens,
        bytes(s.bytes_read as f64),
        bytes(s.bytes_written as f64),
        s.files_created,
        s.files_deleted
    );
    let _ = writeln!(
        o,
        "opens with data: {} whole-file, {} other sequential, {} random",
        s.whole_file, s.sequential, s.random
    );
    let _ = writeln!(o, "file size Hill alpha: {}", opt(s.size_hill_alpha));
    for c in &s.thesis {
        let verdict = match c.holds {
            Some(true) => "holds",
            Some(false) => "does not hold",
            None => "compare",
        };
        let _ = writeln!(o, "[{verdict}] {} — thesis: {}; here: {}", c.finding, c.thesis, c.ours);
    }
    o
}

/// The report as Markdown; figures are linked from `figures_dir` (relative to the report).
pub fn markdown(s: &Study, figures_dir: &str) -> String {
    let mut o = String::from("# File-system usage study\n\n");
    inputs(&mut o, s);
    observations(&mut o, s);
    activity(&mut o, s);
    patterns(&mut o, s);
    sessions(&mut o, s);
    lifetimes(&mut o, s);
    operations(&mut o, s);
    tails(&mut o, s);
    content(&mut o, s);
    o.push_str("## Figures\n\n");
    for c in curves(s) {
        let _ = writeln!(o, "![{}]({figures_dir}/{}.svg)\n", c.title, c.name);
    }
    o
}

fn inputs(o: &mut String, s: &Study) {
    let i = &s.inputs;
    let _ = writeln!(
        o,
        "From {} trace(s) and {} snapshot(s): {} operations over {:.1} s traced; {} records dropped while tracing.\n",
        i.traces.len(),
        i.snapshots.len(),
        i.operations,
        i.traced_s,
        i.dropped
    );
    for d in &i.damage {
        let _ = writeln!(o, "- damage: {d}");
    }
    let _ = writeln!(
        o,
        "Totals: {} opens, {} read, {} written, {} files created, {} deleted; opens with data: {} whole-file, {} other sequential, {} random.\n",
        s.opens,
        bytes(s.bytes_read as f64),
        bytes(s.bytes_written as f64),
        s.files_created,
        s.files_deleted,
        s.whole_file,
        s.sequential,
        s.random
    );
}

fn observations(o: &mut String, s: &Study) {
    o.push_str("## Observations beside the thesis's (cf. Table 9.1)\n\n");
    let rows = s.thesis.iter().map(|c| {
        let verdict = match c.holds {
            Some(true) => format!("holds ({})", c.rule),
            Some(false) => format!("does not hold ({})", c.rule),
            None => "figures only".into(),
        };
        vec![c.section.into(), c.finding.into(), c.thesis.into(), c.ours.clone(), verdict]
    });
    table(o, &["§", "finding", "thesis (NT 4.0, 1998)", "here", "verdict"], rows);
}

fn activity(o: &mut String, s: &Study) {
    o.push_str("## User activity (cf. Table 9.2)\n\nEach trace is one user. Thesis: 24 KB/s per user over 10-minute intervals (Sprite: 8 KB/s); no increase over 10-second intervals.\n\n");
    let row = |a: &crate::analysis::ops::Activity| {
        vec![
            format!("{} s", a.interval_s),
            a.intervals.to_string(),
            a.active.to_string(),
            format!("{:.1}", a.mean_kb_per_s),
            format!("{:.1}", a.peak_kb_per_s),
        ]
    };
    let ops = &s.operations;
    table(
        o,
        &["interval", "intervals", "active", "mean KB/s per active user", "peak KB/s"],
        [row(&ops.per_10_min), row(&ops.per_10_s)],
    );
}

fn patterns(o: &mut String, s: &Study) {
    o.push_str("## Access patterns (cf. Table 9.3)\n\nShares of the opens of each mode (and of their bytes). Thesis: 68% of read-only opens whole-file sequential (Sprite 78%); 58% of read-only bytes sequential (Sprite 89%).\n\n");
    let rows = s.sessions.patterns.iter().map(|r| {
        let n = r.opens;
        let b = r.bytes();
        let sh = |x: u64, of: u64| pct(crate::analysis::dist::share(x, of));
        vec![
            r.mode.clone(),
            n.to_string(),
            sh(r.whole_file, n),
            sh(r.sequential, n),
            sh(r.random, n),
            sh(r.bytes_whole_file, b),
            sh(r.bytes_sequential, b),
            sh(r.bytes_random, b),
        ]
    });
    table(
        o,
        &[
            "mode",
            "opens",
            "whole-file",
            "other sequential",
            "random",
            "bytes whole-file",
            "bytes other seq.",
            "bytes random",
        ],
        rows,
    );
}

fn sessions(o: &mut String, s: &Study) {
    let ss = &s.sessions;
    o.push_str("## Open sessions (9.6.2, 9.8.1, 9.9.1)\n\n");
    let p = |name: &str, q: &crate::analysis::dist::Percentiles, f: &dyn Fn(f64) -> String| {
        vec![name.to_string(), q.n.to_string(), f(q.p50), f(q.p75), f(q.p90), f(q.p99), f(q.max)]
    };
    let msf = |v: f64| format!("{v:.3} ms");
    let bf = |v: f64| bytes(v);
    table(
        o,
        &["distribution", "n", "median", "75th", "90th", "99th", "max"],
        [
            p("open time, sessions with data", &ss.open_ms_data, &msf),
            p("open time, sessions without data", &ss.open_ms_no_data, &msf),
            p("bytes per session with data", &ss.session_bytes, &bf),
            p("size of the files opened for data", &ss.file_size_at_close, &bf),
            p("sequential run length", &ss.run_bytes, &bf),
        ],
    );
    let w = &ss.open_within;
    let ra = &ss.readahead;
    let ru = &ss.reuse;
    let _ = writeln!(
        o,
        "- Closed within 1 ms: {}; within 10 ms: {}; within 1 s: {} (thesis 40%, -, 90%). Data sessions within 10 ms: {} (thesis 75%).",
        pct(w.all_1ms),
        pct(w.all_10ms),
        pct(w.all_1s),
        pct(w.data_10ms)
    );
    let _ = writeln!(o, "- 80% of the bytes moved in runs moved in runs up to {}.", bytes(ss.run_bytes_p80_by_bytes));
    let _ = writeln!(
        o,
        "- Read-ahead: {} of {} read sessions read once (thesis 31%); of {} sequential multi-read sessions, largest read < 4 KB in {}, < 64 KB in {} (thesis 40%, 92%); {} read more than one 64 KB read-ahead (thesis 8%).",
        pct(ra.single_read_share),
        ra.read_sessions,
        ra.sequential_multi_read,
        pct(ra.reads_under_4k_share),
        pct(ra.reads_under_64k_share),
        pct(ra.beyond_one_64k_share)
    );
    let _ = writeln!(
        o,
        "- Reuse: {} of {} read-only files opened read-only again (thesis 24-40%); of {} write-only files {} written again (4%) and {} read afterwards (36-52%); {} of {} read-write files reopened (94%).\n",
        pct(ru.read_only_reopened_share),
        ru.read_only_files,
        ru.write_only_files,
        pct(ru.write_only_rewritten_share),
        pct(ru.write_only_read_after_share),
        pct(ru.read_write_reopened_share),
        ru.read_write_files
    );
}

fn lifetimes(o: &mut String, s: &Study) {
    let l = &s.lifetimes;
    o.push_str("## Lifetimes of new files (9.6.3)\n\n");
    let _ = writeln!(
        o,
        "{} new files: {} deleted, {} replaced by a rename, {} overwritten, {} alive at the end. Lifetime median {:.1} ms, 90th percentile {:.1} ms. Of the dead, {} were under 100 B and {} over 40 KB (thesis 65%, 4%).\n",
        l.created,
        l.deleted,
        l.replaced,
        l.overwritten,
        l.alive_at_end,
        l.lifetime_ms.p50,
        l.lifetime_ms.p90,
        pct(l.dead_under_100b_share),
        pct(l.dead_over_40k_share)
    );
    table(o, &["dead within", "share of new files"], l.dead_within.iter().map(|(n, v)| vec![n.clone(), pct(*v)]));
    let _ = writeln!(
        o,
        "Overwritten within 4 ms: {} (thesis 26%); deleted within 5 s: {} (thesis 55%).\n",
        pct(l.overwritten_within_4ms),
        pct(l.deleted_within_5s)
    );
}

fn operations(o: &mut String, s: &Study) {
    let ops = &s.operations;
    o.push_str("## Operations (9.8)\n\n");
    let total = ops.total.max(1) as f64;
    table(
        o,
        &["category", "requests", "share"],
        ops.categories
            .iter()
            .map(|(c, n)| vec![format!("{c:?}").to_lowercase(), n.to_string(), pct(*n as f64 / total)]),
    );
    table(
        o,
        &["operation", "requests", "share", "failed", "median service", "90th service"],
        ops.kinds.iter().map(|k| {
            vec![
                k.op.clone(),
                k.count.to_string(),
                pct(k.count as f64 / total),
                pct(crate::analysis::dist::share(k.failed, k.count)),
                format!("{:.1} us", k.service_us.p50),
                format!("{:.1} us", k.service_us.p90),
            ]
        }),
    );
    let _ = writeln!(o, "Opens that moved no data: {} (thesis 74%).\n", pct(ops.opens_without_data_share));
    o.push_str("### Errors (9.8.4)\n\n");
    let _ = writeln!(
        o,
        "Failed: {} of lookups, {} of opens and creates, {} of reads, {} of writes, {} of control operations (thesis: 12% of opens, 8% of control operations, 0.2% of reads, no writes). An open of a missing name fails at its lookup and never reaches the file system as an open.\n",
        pct(ops.lookup_failed_share),
        pct(ops.open_failed_share),
        pct(ops.read_failed_share),
        pct(ops.write_failed_share),
        pct(ops.control_failed_share)
    );
    table(
        o,
        &["operation", "error", "count"],
        ops.errors.iter().take(15).map(|e| vec![e.op.clone(), e.errno.clone(), e.count.to_string()]),
    );
    o.push_str("### Request sizes and spacing (9.8.1, 9.8.2)\n\n");
    let sizes = |v: &[(u64, f64)]| {
        v.iter().take(6).map(|(b, sh)| format!("{} ({})", bytes(*b as f64), pct(*sh))).collect::<Vec<_>>().join(", ")
    };
    let _ = writeln!(
        o,
        "- Reads asking for 512 or 4096 bytes: {} (thesis 59%). Common read sizes: {}.",
        pct(ops.reads_512_or_4096_share),
        sizes(&ops.common_read_sizes)
    );
    let _ = writeln!(o, "- Common write sizes: {}.", sizes(&ops.common_write_sizes));
    let _ = writeln!(
        o,
        "- Opens within 1 ms of the previous: {}, within 30 ms: {} (thesis 40%, 90%); one-second intervals with opens: {} (thesis up to 24%).",
        pct(ops.open_gap_within.0),
        pct(ops.open_gap_within.1),
        pct(ops.seconds_with_opens_share)
    );
    let _ = writeln!(
        o,
        "- Next read within 90 us: {}; next write within 30 us: {} (thesis 80%, 80%).\n",
        pct(ops.read_gap_within_90us),
        pct(ops.write_gap_within_30us)
    );
}

fn tails(o: &mut String, s: &Study) {
    let t = &s.tails;
    o.push_str("## Heavy tails and arrivals (9.7)\n\nThesis: every distribution heavy-tailed, Hill alpha 1.2-1.7 (alpha < 2: infinite variance); arrivals not Poisson at any time scale.\n\n");
    table(
        o,
        &["distribution", "n", "mean", "median", "max", "Hill alpha", "CCDF alpha", "heavy-tailed"],
        t.tests.iter().map(|x| {
            vec![
                format!("{} ({})", x.name, x.unit),
                x.n.to_string(),
                format!("{:.4e}", x.mean),
                format!("{:.4e}", x.median),
                format!("{:.4e}", x.max),
                opt(x.hill_alpha),
                opt(x.ccdf_slope_alpha),
                if x.heavy_tailed { "yes" } else { "no" }.into(),
            ]
        }),
    );
    for a in &t.arrivals {
        let _ = writeln!(
            o,
            "Arrivals of {} ({}): {}.\n",
            a.name,
            a.n,
            if a.poisson_like { "Poisson-like at every scale" } else { "not Poisson-like" }
        );
        table(
            o,
            &["bin", "bins", "mean count", "variance/mean", "Poisson's", "within Poisson's range"],
            a.scales.iter().map(|sc| {
                vec![
                    format!("{:.3} s", sc.scale / 1e9),
                    sc.bins.to_string(),
                    format!("{:.1}", sc.mean_count),
                    format!("{:.2}", sc.vmr),
                    format!("{:.2}", sc.poisson_vmr),
                    if (sc.vmr - 1.0).abs() <= sc.tolerance { "yes" } else { "no" }.into(),
                ]
            }),
        );
    }
}

fn content(o: &mut String, s: &Study) {
    let Some(c) = &s.content else { return };
    o.push_str("## Content (9.5)\n\n");
    let _ = writeln!(
        o,
        "{} files ({}), {} directories, {} symbolic links. File size median {}, 80th percentile {}, largest {}. Depth median {:.0}, directory entries median {:.0} (90th {:.0}). Files modified later than last accessed: {} (thesis 2-4%: the file times are unreliable).\n",
        c.files,
        bytes(c.bytes as f64),
        c.dirs,
        c.symlinks,
        bytes(c.size.p50),
        bytes(c.size.p80),
        bytes(c.size.max),
        c.depth.p50,
        c.dir_entries.p50,
        c.dir_entries.p90,
        pct(c.modified_after_access_share)
    );
    table(
        o,
        &["size up to", "files", "bytes"],
        c.size_classes.iter().map(|k| {
            vec![
                if k.up_to == u64::MAX { "larger".into() } else { bytes(k.up_to as f64) },
                pct(k.files_share),
                pct(k.bytes_share),
            ]
        }),
    );
    let types = |rows: &[crate::analysis::content::TypeRow]| -> Vec<Vec<String>> {
        rows.iter()
            .map(|r| {
                vec![r.ext.clone(), r.files.to_string(), pct(r.files_share), bytes(r.bytes as f64), pct(r.bytes_share)]
            })
            .collect()
    };
    o.push_str("Types with the most files:\n\n");
    table(o, &["type", "files", "share", "bytes", "share"], types(&c.types_by_files));
    o.push_str("Types with the most bytes (thesis: executables, libraries and fonts dominate):\n\n");
    table(o, &["type", "files", "share", "bytes", "share"], types(&c.types_by_bytes));
}
