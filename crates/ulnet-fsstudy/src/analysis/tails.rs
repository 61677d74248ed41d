//! Heavy tails and arrivals (thesis 9.7), with `ulnet-trace`'s estimators: every
//! distribution the study finds is tested for a power-law tail (the Hill estimator on the
//! flattest part of its Hill plot, and the slope of the log-log CCDF; see
//! [`ulnet_trace::tail`]), and the arrivals of requests and of opens are counted at time
//! scales ten times apart against a Poisson process of the same rate.

use super::content::Content;
use super::lifetimes::Lifetimes;
use super::opens::{Mode, Session};
use super::{Trace, POISSON_SEED};
use crate::format::OpKind;
use serde::Serialize;
use std::collections::HashMap;
use ulnet_trace::tail::{analyze_tail, ccdf_points, time_scales, Arrivals, TimeScale};

/// The heavy-tail test of one distribution.
#[derive(Clone, Debug, Serialize)]
pub struct TailTest {
    /// What was measured.
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// Values.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub median: f64,
    /// Largest.
    pub max: f64,
    /// Hill estimate of α.
    pub hill_alpha: Option<f64>,
    /// α from the log-log CCDF's slope.
    pub ccdf_slope_alpha: Option<f64>,
    /// R² of the QQ plot against the fitted Pareto.
    pub qq_r2: Option<f64>,
    /// Heavy-tailed by `ulnet-trace`'s rule (both α below 2, a flat Hill plot).
    pub heavy_tailed: bool,
}

/// Arrivals against a Poisson process.
#[derive(Clone, Debug, Serialize)]
pub struct ArrivalTest {
    /// Which arrivals.
    pub name: String,
    /// Arrivals.
    pub n: usize,
    /// Variance-to-mean of counts at time scales ten times apart (nanoseconds).
    pub scales: Vec<TimeScale>,
    /// Poisson-like at every scale.
    pub poisson_like: bool,
}

/// The tail tests.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Tails {
    /// Hill α of file sizes (see [`super::Study::size_hill_alpha`]).
    pub size_hill_alpha: Option<f64>,
    /// Every distribution tested.
    pub tests: Vec<TailTest>,
    /// The range of Hill α over the heavy-tailed ones.
    pub heavy_hill_range: Option<(f64, f64)>,
    /// Arrivals.
    pub arrivals: Vec<ArrivalTest>,
    /// Curves for the figures.
    pub curves: Vec<super::Curve>,
}

fn test(name: &str, unit: &str, values: &[f64]) -> TailTest {
    let r = analyze_tail(name, unit, values, Arrivals::None, POISSON_SEED);
    TailTest {
        name: name.into(),
        unit: unit.into(),
        n: r.n,
        mean: r.mean,
        median: r.median,
        max: r.max,
        hill_alpha: r.hill_alpha,
        ccdf_slope_alpha: r.ccdf_slope_alpha,
        qq_r2: r.qq_r2,
        heavy_tailed: r.heavy_tailed,
    }
}

/// File sizes for the size test: the snapshots' regular files, else each file opened for
/// data once, at its last close.
fn file_sizes(sessions: &[Session], content: Option<&Content>) -> (String, Vec<f64>) {
    if let Some(c) = content.filter(|c| !c.sizes.is_empty()) {
        return ("file size (snapshot)".into(), c.sizes.clone());
    }
    let mut last: HashMap<(usize, u64), u64> = HashMap::new();
    for s in sessions.iter().filter(|s| !s.dir && s.mode() != Mode::NoData) {
        last.insert((s.trace, s.file), s.size_at_close.unwrap_or(s.size_at_open));
    }
    ("file size (files opened)".into(), last.into_values().map(|v| v as f64).collect())
}

/// Tests every distribution and the arrivals.
pub fn tails(traces: &[Trace], sessions: &[Session], lifetimes: &Lifetimes, content: Option<&Content>) -> Tails {
    let data: Vec<&Session> = sessions.iter().filter(|s| !s.dir && s.mode() != Mode::NoData).collect();
    let (size_name, sizes) = file_sizes(sessions, content);
    let per = |f: &dyn Fn(&Session) -> f64| data.iter().map(|s| f(s)).collect::<Vec<f64>>();
    let requests = |k: OpKind| -> Vec<f64> {
        traces.iter().flat_map(|t| &t.ops).filter(|o| o.kind == k as u8 && !o.failed()).map(|o| o.size as f64).collect()
    };
    let gaps = |pred: &dyn Fn(&crate::format::Op) -> bool| -> Vec<f64> {
        traces
            .iter()
            .flat_map(|t| {
                let times: Vec<u64> = t.ops.iter().filter(|o| pred(o)).map(|o| o.start_ns).collect();
                times.windows(2).map(|w| (w[1] - w[0]) as f64).collect::<Vec<f64>>()
            })
            .collect()
    };
    let is_open = |o: &crate::format::Op| matches!(o.op_kind(), Some(OpKind::Open | OpKind::Create));
    let mut tests = vec![
        test(&size_name, "bytes", &sizes),
        test("bytes per session", "bytes", &per(&|s| s.bytes_moved() as f64)),
        test("open duration", "ns", &data.iter().filter_map(|s| s.duration_ns()).map(|d| d as f64).collect::<Vec<_>>()),
        test("reads per session", "requests", &per(&|s| s.accesses.iter().filter(|a| !a.write).count() as f64)),
        test("writes per session", "requests", &per(&|s| s.accesses.iter().filter(|a| a.write).count() as f64)),
        test("read request size", "bytes", &requests(OpKind::Read)),
        test("write request size", "bytes", &requests(OpKind::Write)),
        test("open inter-arrival", "ns", &gaps(&is_open)),
        test("request inter-arrival", "ns", &gaps(&|_| true)),
        test("new-file lifetime", "ns", &lifetimes.lives.iter().map(|l| l.lifetime_ns as f64).collect::<Vec<_>>()),
    ];
    tests.retain(|t| t.n > 0);
    let heavy: Vec<f64> = tests.iter().filter(|t| t.heavy_tailed).filter_map(|t| t.hill_alpha).collect();
    let heavy_hill_range = (!heavy.is_empty())
        .then(|| (heavy.iter().copied().fold(f64::MAX, f64::min), heavy.iter().copied().fold(f64::MIN, f64::max)));
    let arrivals = vec![arrival_test("requests", traces, &|_| true), arrival_test("opens", traces, &is_open)];
    let mut out = Tails {
        size_hill_alpha: tests.first().and_then(|t| t.hill_alpha),
        tests,
        heavy_hill_range,
        arrivals,
        curves: Vec::new(),
    };
    if sizes.is_empty() {
        out.size_hill_alpha = None;
    }
    out.curves = curves(&size_name, &sizes, &out);
    out
}

/// Counts the arrivals of each trace separately (their clocks are separate) and keeps the
/// scales of the longest trace.
fn arrival_test(name: &str, traces: &[Trace], pred: &dyn Fn(&crate::format::Op) -> bool) -> ArrivalTest {
    let longest = traces
        .iter()
        .map(|t| t.ops.iter().filter(|o| pred(o)).map(|o| o.start_ns as f64).collect::<Vec<f64>>())
        .max_by_key(|v| v.len())
        .unwrap_or_default();
    let scales = time_scales(&longest, POISSON_SEED);
    let poisson_like = !scales.is_empty() && scales.iter().all(|s| (s.vmr - 1.0).abs() <= s.tolerance);
    ArrivalTest { name: name.into(), n: longest.len(), scales, poisson_like }
}

fn curves(size_name: &str, sizes: &[f64], t: &Tails) -> Vec<super::Curve> {
    let mut curves = Vec::new();
    if !sizes.is_empty() {
        let mut series = vec![(size_name.to_string(), ccdf_points(sizes, 2000))];
        let fit = analyze_tail(size_name, "bytes", sizes, Arrivals::None, POISSON_SEED);
        if let (Some(f), Some(a)) = (&fit.ccdf_fit, fit.ccdf_slope_alpha) {
            let line = |x: f64| 10f64.powf(f.intercept + f.slope * x.log10());
            series.push((
                format!("fitted tail, alpha = {a:.2}"),
                vec![(f.x_min, line(f.x_min)), (f.x_max, line(f.x_max))],
            ));
        }
        curves.push(super::Curve {
            name: "size-ccdf".into(),
            title: "Log-log complementary distribution of file sizes with the fitted tail (cf. Figure 9.10)".into(),
            x_label: "bytes".into(),
            y_label: "P[X > x]".into(),
            log_x: true,
            log_y: true,
            series,
        });
    }
    if let Some(a) = t.arrivals.iter().find(|a| !a.scales.is_empty()) {
        curves.push(super::Curve {
            name: "arrivals-time-scales".into(),
            title: format!(
                "Variance-to-mean of {} per bin at time scales 10x apart, against Poisson (cf. Figure 9.8)",
                a.name
            ),
            x_label: "bin width (ns)".into(),
            y_label: "variance / mean".into(),
            log_x: true,
            log_y: true,
            series: vec![
                ("trace".into(), a.scales.iter().map(|s| (s.scale, s.vmr.max(1e-6))).collect()),
                ("Poisson, same rate".into(), a.scales.iter().map(|s| (s.scale, s.poisson_vmr.max(1e-6))).collect()),
            ],
        });
    }
    curves
}
