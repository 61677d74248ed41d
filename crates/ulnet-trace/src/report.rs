//! The figures of a study and of a tail analysis, written as SVG and PNG files, and the
//! self-contained HTML report (tables and inline SVG, no external assets).

use crate::analyze::{human_bytes, Analysis};
use crate::plot::{BarChart, Figure, Heatmap, LineChart, PlotError, Series, Style};
use crate::tail::{qq_points, TailReport};
use std::fmt::Write;
use std::path::Path;

/// The figures of a communication study.
pub fn analysis_figures(a: &Analysis) -> Vec<Figure> {
    let mut figs = Vec::new();
    let names: Vec<String> = a.nodes.iter().map(|n| n.to_string()).collect();
    let cell = |s: u32, d: u32| a.cell(s, d);
    figs.push(Figure::Heatmap(Heatmap {
        name: "matrix-messages".into(),
        title: "Traffic matrix: messages from node to node".into(),
        rows: names.clone(),
        cols: names.clone(),
        values: a
            .nodes
            .iter()
            .map(|s| a.nodes.iter().map(|d| cell(*s, *d).map_or(0.0, |c| c.messages as f64)).collect())
            .collect(),
        labels: a
            .nodes
            .iter()
            .map(|s| a.nodes.iter().map(|d| cell(*s, *d).map_or("-".into(), |c| c.messages.to_string())).collect())
            .collect(),
    }));
    figs.push(Figure::Heatmap(Heatmap {
        name: "matrix-bytes".into(),
        title: "Traffic matrix: bytes from node to node".into(),
        rows: names.clone(),
        cols: names,
        values: a
            .nodes
            .iter()
            .map(|s| a.nodes.iter().map(|d| cell(*s, *d).map_or(0.0, |c| c.bytes as f64)).collect())
            .collect(),
        labels: a
            .nodes
            .iter()
            .map(|s| a.nodes.iter().map(|d| cell(*s, *d).map_or("-".into(), |c| human_bytes(c.bytes))).collect())
            .collect(),
    }));
    for d in &a.sizes {
        // From the last size below the smallest message on.
        let first = d.cdf.iter().rposition(|p| p.count_frac == 0.0).unwrap_or(0);
        let cdf = &d.cdf[first..];
        let who = d.node.map_or("all nodes".to_string(), |n| format!("node {n}"));
        let stem = d.node.map_or("sizes-all".to_string(), |n| format!("sizes-node-{n}"));
        figs.push(Figure::Lines(LineChart {
            name: stem,
            title: format!("Message size distribution, {who}"),
            x_label: "message size (bytes)".into(),
            y_label: "cumulative fraction".into(),
            log_x: true,
            log_y: false,
            series: vec![
                Series {
                    name: "by count".into(),
                    points: cdf.iter().map(|p| (p.size as f64, p.count_frac)).collect(),
                    style: Style::Line,
                },
                Series {
                    name: "by bytes".into(),
                    points: cdf.iter().map(|p| (p.size as f64, p.bytes_frac)).collect(),
                    style: Style::Line,
                },
            ],
        }));
    }
    figs.push(Figure::Lines(LineChart {
        name: "rates".into(),
        title: format!("Messages sent per second by each node ({} s bins)", a.rates.bin_s),
        x_label: "time since start (s)".into(),
        y_label: "messages per second".into(),
        log_x: false,
        log_y: false,
        series: a
            .rates
            .nodes
            .iter()
            .map(|r| Series {
                name: format!("node {}", r.node),
                points: r
                    .per_bin
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (i as f64 * a.rates.bin_s, *c as f64 / a.rates.bin_s))
                    .collect(),
                style: Style::Line,
            })
            .collect(),
    }));
    if !a.buffers_per_message.is_empty() {
        figs.push(Figure::Bars(BarChart {
            name: "buffers".into(),
            title: "Buffers per message (gather list length)".into(),
            y_label: "fraction of messages".into(),
            categories: a.buffers_per_message.iter().map(|b| format!("{} buffer(s)", b.buffers)).collect(),
            groups: vec![(String::new(), a.buffers_per_message.iter().map(|b| b.fraction).collect())],
        }));
        figs.push(Figure::Bars(BarChart {
            name: "buffer-bytes".into(),
            title: "Bytes per buffer position".into(),
            y_label: "fraction of bytes".into(),
            categories: a.bytes_per_buffer_position.iter().map(|p| format!("buffer {}", p.position)).collect(),
            groups: vec![(String::new(), a.bytes_per_buffer_position.iter().map(|p| p.fraction).collect())],
        }));
    }
    if let Some(l) = &a.latency {
        let stages: Vec<_> = if l.stages.is_empty() { l.totals.iter().collect() } else { l.stages.iter().collect() };
        figs.push(Figure::Bars(BarChart {
            name: "latency".into(),
            title: "Request-response: time per stage (microseconds)".into(),
            y_label: "microseconds".into(),
            categories: stages.iter().map(|s| s.name.split(" (").next().unwrap_or(&s.name).to_string()).collect(),
            // Medians and 90th percentiles: means are dominated by rare preemptions.
            groups: vec![
                ("median".into(), stages.iter().map(|s| s.p50_us).collect()),
                ("p90".into(), stages.iter().map(|s| s.p90_us).collect()),
            ],
        }));
    }
    figs
}

/// The figures of a tail analysis (`values` is the sample the report was made from).
pub fn tail_figures(r: &TailReport, values: &[f64]) -> Vec<Figure> {
    let mut figs = Vec::new();
    let mut ccdf =
        vec![Series { name: "empirical".into(), points: crate::tail::ccdf_points(values, 2000), style: Style::Points }];
    if let (Some(f), Some(a)) = (&r.ccdf_fit, r.ccdf_slope_alpha) {
        let line = |x: f64| 10f64.powf(f.intercept + f.slope * x.log10());
        ccdf.push(Series {
            name: format!("fit: alpha = {a:.2}"),
            points: vec![(f.x_min, line(f.x_min)), (f.x_max, line(f.x_max))],
            style: Style::Reference,
        });
    }
    figs.push(Figure::Lines(LineChart {
        name: "ccdf".into(),
        title: format!("Log-log complementary distribution of {}", r.column),
        x_label: r.column.clone(),
        y_label: "P[X > x]".into(),
        log_x: true,
        log_y: true,
        series: ccdf,
    }));
    if !r.hill_plot.is_empty() {
        let mut series = vec![Series {
            name: "Hill estimate".into(),
            points: r.hill_plot.iter().map(|(k, a)| (*k as f64, *a)).collect(),
            style: Style::Line,
        }];
        if let (Some(a), Some((lo, hi))) = (r.hill_alpha, r.hill_window) {
            series.push(Series {
                name: format!("chosen: alpha = {a:.2}"),
                points: vec![(lo as f64, a), (hi as f64, a)],
                style: Style::Reference,
            });
        }
        figs.push(Figure::Lines(LineChart {
            name: "hill".into(),
            title: "Hill plot".into(),
            x_label: "k (largest values used)".into(),
            y_label: "alpha".into(),
            log_x: true,
            log_y: false,
            series,
        }));
    }
    if let Some(a) = r.hill_alpha.filter(|_| r.hill_k > 2) {
        let mut desc: Vec<f64> = values.iter().copied().filter(|v| *v > 0.0 && v.is_finite()).collect();
        desc.sort_by(|a, b| b.total_cmp(a));
        if r.hill_k < desc.len() {
            let pts = qq_points(&desc, r.hill_k, a);
            let step = (pts.len() / 1000).max(1);
            let pts: Vec<(f64, f64)> = pts.into_iter().step_by(step).collect();
            let (lo, hi) =
                pts.iter().fold((f64::MAX, f64::MIN), |(l, h), p| (l.min(p.0.min(p.1)), h.max(p.0.max(p.1))));
            figs.push(Figure::Lines(LineChart {
                name: "qq".into(),
                title: format!("QQ plot against the fitted Pareto (alpha = {a:.2})"),
                x_label: "Pareto quantile".into(),
                y_label: "sample quantile".into(),
                log_x: true,
                log_y: true,
                series: vec![
                    Series { name: "tail values".into(), points: pts, style: Style::Points },
                    Series { name: "y = x".into(), points: vec![(lo, lo), (hi, hi)], style: Style::Reference },
                ],
            }));
        }
    }
    if !r.time_scales.is_empty() {
        figs.push(Figure::Lines(LineChart {
            name: "time-scales".into(),
            title: "Variance-to-mean of arrival counts at time scales 10x apart".into(),
            x_label: "bin width".into(),
            y_label: "variance / mean".into(),
            log_x: true,
            log_y: true,
            series: vec![
                Series {
                    name: "data".into(),
                    points: r.time_scales.iter().map(|s| (s.scale, s.vmr.max(1e-6))).collect(),
                    style: Style::Line,
                },
                Series {
                    name: "Poisson, same rate".into(),
                    points: r.time_scales.iter().map(|s| (s.scale, s.poisson_vmr.max(1e-6))).collect(),
                    style: Style::Line,
                },
            ],
        }));
    }
    figs
}

/// Writes every figure as `DIR/NAME.svg` and `DIR/NAME.png`; returns the files written.
pub fn write_figures(figs: &[Figure], dir: &Path) -> Result<Vec<String>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|e| ReportError::Io(dir.display().to_string(), e))?;
    let mut written = Vec::new();
    for f in figs {
        let svg = dir.join(format!("{}.svg", f.name()));
        std::fs::write(&svg, f.svg()?).map_err(|e| ReportError::Io(svg.display().to_string(), e))?;
        let png = dir.join(format!("{}.png", f.name()));
        f.png(&png)?;
        written.extend([svg.display().to_string(), png.display().to_string()]);
    }
    Ok(written)
}

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A figure could not be drawn.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// A file could not be written.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

const STYLE: &str = "body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}\
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}figure{margin:1em 0}svg{max-width:100%;height:auto}\
pre{background:#f7f7f7;padding:0.5em}";

fn table(o: &mut String, head: &[&str], rows: &[Vec<String>]) {
    o.push_str("<table><tr>");
    for h in head {
        let _ = write!(o, "<th>{}</th>", esc(h));
    }
    o.push_str("</tr>");
    for r in rows {
        o.push_str("<tr>");
        for c in r {
            let _ = write!(o, "<td>{}</td>", esc(c));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>\n");
}

fn figures_html(o: &mut String, figs: &[Figure]) -> Result<(), PlotError> {
    for f in figs {
        let svg = f.svg()?;
        // Drop the XML prolog: the SVG is inlined in HTML.
        let svg = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
        let _ = writeln!(o, "<figure>{svg}<figcaption>{}</figcaption></figure>", esc(f.title()));
    }
    Ok(())
}

/// The study as one self-contained HTML page.
pub fn analysis_html(a: &Analysis) -> Result<String, PlotError> {
    let mut o = String::new();
    let _ = write!(o, "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>ulnet trace analysis</title><style>{STYLE}</style></head><body>");
    o.push_str("<h1>Communication study</h1>");
    let _ = write!(
        o,
        "<p>{} messages, {} in {:.3} s, nodes {:?}, from {} file(s){}.</p>",
        a.messages,
        human_bytes(a.bytes),
        a.duration_s,
        a.nodes,
        a.files.len(),
        if a.dropped > 0 { format!("; <b>{} records dropped</b> (full rings)", a.dropped) } else { String::new() }
    );
    o.push_str("<h2>Traffic matrix</h2>");
    let rows: Vec<Vec<String>> = a
        .matrix
        .iter()
        .map(|c| vec![c.src.to_string(), c.dst.to_string(), c.messages.to_string(), human_bytes(c.bytes)])
        .collect();
    table(&mut o, &["from", "to", "messages", "bytes"], &rows);
    o.push_str("<h2>Message sizes</h2>");
    let rows: Vec<Vec<String>> = a
        .sizes
        .iter()
        .map(|d| {
            vec![
                d.node.map_or("all".into(), |n| n.to_string()),
                d.messages.to_string(),
                d.min.to_string(),
                d.median.to_string(),
                format!("{:.0}", d.mean),
                d.max.to_string(),
                format!("{:.1}%", 100.0 * d.frac_68_to_256),
                format!("{:.1}%", 100.0 * d.bytes_frac_4k_or_more),
            ]
        })
        .collect();
    table(&mut o, &["sender", "messages", "min", "median", "mean", "max", "68-256 B", "bytes in >= 4 KiB"], &rows);
    o.push_str("<h2>Message rates</h2>");
    let rows: Vec<Vec<String>> = a
        .rates
        .nodes
        .iter()
        .map(|r| vec![r.node.to_string(), format!("{:.0}", r.mean_per_s), format!("{:.0}", r.peak_per_s)])
        .collect();
    table(&mut o, &["node", "mean msgs/s", "peak bin msgs/s"], &rows);
    o.push_str("<h2>Anatomy of a message</h2>");
    let rows: Vec<Vec<String>> = a
        .buffers_per_message
        .iter()
        .map(|b| vec![b.buffers.to_string(), b.messages.to_string(), format!("{:.1}%", 100.0 * b.fraction)])
        .collect();
    table(&mut o, &["buffers", "messages", "share"], &rows);
    let rows: Vec<Vec<String>> = a
        .bytes_per_buffer_position
        .iter()
        .map(|p| {
            vec![
                p.position.to_string(),
                p.messages.to_string(),
                human_bytes(p.bytes),
                format!("{:.1}%", 100.0 * p.fraction),
                p.median.to_string(),
                p.max.to_string(),
            ]
        })
        .collect();
    table(&mut o, &["buffer", "messages", "bytes", "share of bytes", "median size", "max size"], &rows);
    let rows: Vec<Vec<String>> =
        a.kinds.iter().map(|k| vec![k.kind.clone(), k.messages.to_string(), human_bytes(k.bytes)]).collect();
    table(&mut o, &["kind", "messages", "bytes"], &rows);
    if let Some(l) = &a.latency {
        let _ = write!(
            o,
            "<h2>Request-response breakdown</h2><p>{} pairs, {} requests without a traced response.</p>",
            l.pairs, l.unanswered
        );
        let rows: Vec<Vec<String>> = l
            .stages
            .iter()
            .chain(&l.totals)
            .enumerate()
            .map(|(i, s)| {
                vec![
                    if i < l.stages.len() { format!("stage {}: {}", i + 1, s.name) } else { s.name.clone() },
                    format!("{:.3}", s.p50_us),
                    format!("{:.3}", s.p90_us),
                    format!("{:.3}", s.p99_us),
                    format!("{:.3}", s.mean_us),
                    s.share.map_or(String::new(), |x| format!("{:.0}%", 100.0 * x)),
                ]
            })
            .collect();
        table(&mut o, &["stage", "p50 us", "p90 us", "p99 us", "mean us", "share"], &rows);
    }
    o.push_str("<h2>Figures</h2>");
    figures_html(&mut o, &analysis_figures(a))?;
    o.push_str("</body></html>\n");
    Ok(o)
}

/// A tail analysis as one self-contained HTML page.
pub fn tail_html(r: &TailReport, values: &[f64]) -> Result<String, PlotError> {
    let mut o = String::new();
    let _ = write!(o, "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>ulnet tail analysis</title><style>{STYLE}</style></head><body>");
    let _ = write!(o, "<h1>Heavy-tail analysis</h1><pre>{}</pre>", esc(&r.render_text()));
    figures_html(&mut o, &tail_figures(r, values))?;
    o.push_str("</body></html>\n");
    Ok(o)
}
