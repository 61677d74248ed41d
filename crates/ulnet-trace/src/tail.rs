//! Heavy tails, as the file-system usage study tested them: the slope of the log-log
//! complementary distribution (CCDF), the Hill estimator, a QQ comparison with the fitted
//! Pareto distribution, and counts of arrivals at time scales ten times apart against a
//! Poisson process of the same rate.
//!
//! A distribution is heavy-tailed when `P[X > x] ~ x^-α` with `0 < α < 2` (infinite
//! variance; `α < 1`: infinite mean).
//!
//! **Choosing the tail (Hill's k).** The Hill estimate `α(k)` uses the k largest values.
//! Too small a k is noisy (its standard error is about α/√k); too large a k reaches into
//! the body of the distribution, where the power law does not hold, and is biased. The
//! estimate is taken where the Hill plot is flattest: `α(k)` is computed on 64 values of
//! k spaced evenly in log k between `max(10, n/2000)` and `n/5`; every run of grid points
//! spanning a factor of 4 in k is scored by its spread `(max − min) / median`, and the
//! flattest run (the largest k among equally flat ones) gives `hill_alpha`, the median of
//! its estimates, and `hill_k`, its middle k. A power-law tail has a long plateau (spread
//! of a few percent); a lighter tail has none (the Hill plot climbs as k falls), which
//! `hill_plateau_spread` reports.
//!
//! **The CCDF fit.** The log-log CCDF is fitted by least squares over the same tail, from
//! the k-th largest value up to the 10th largest (beyond that the empirical CCDF has fewer
//! than ten points behind it and is too coarse), at 30 points evenly spaced in log x, each
//! weighted by the number of values beyond it (the variance of a log count falls as 1/count).
//! `ccdf_slope_alpha` is minus the slope.
//!
//! **Verdict.** `heavy_tailed` holds when both estimates are below 2 and the Hill plot has
//! a plateau (spread at most 0.25).
//!
//! **Poisson comparison.** Arrival times (the records' times of a trace; for a column of
//! numbers, the values read as gaps between consecutive arrivals) are counted in bins at
//! time scales ten times apart, the finest holding 10 arrivals on average, as long as at
//! least 10 bins remain. A Poisson process has variance-to-mean 1 at every scale; a seeded
//! Poisson process of the same rate and length is counted alongside. `poisson_like` holds
//! when the data's variance-to-mean stays within `max(0.25, 4·sqrt(2/(bins−1)))` of 1 at
//! every scale (four standard errors of a Poisson sample's ratio).

use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Points on the k grid of the Hill plot.
const HILL_GRID: usize = 64;
/// A plateau spans this factor of k.
const PLATEAU_SPAN: f64 = 4.0;
/// Largest plateau spread still called a plateau.
const PLATEAU_SPREAD_MAX: f64 = 0.25;
/// CCDF points fitted.
const CCDF_POINTS: usize = 30;
/// The fit stops at the value with this many values beyond it.
const CCDF_TOP_EXCLUDED: usize = 10;

/// The least-squares fit of the log-log CCDF.
#[derive(Clone, Debug, Serialize)]
pub struct CcdfFit {
    /// Smallest value of the fitted range.
    pub x_min: f64,
    /// Largest value of the fitted range.
    pub x_max: f64,
    /// Points fitted.
    pub points: usize,
    /// Slope of log10 P(X > x) against log10 x.
    pub slope: f64,
    /// Intercept of that line.
    pub intercept: f64,
    /// Coefficient of determination of the fit.
    pub r2: f64,
}

/// Counts at one time scale.
#[derive(Clone, Debug, Serialize)]
pub struct TimeScale {
    /// Bin width, in the unit of the arrivals (nanoseconds for traces).
    pub scale: f64,
    /// Bins.
    pub bins: usize,
    /// Mean arrivals per bin.
    pub mean_count: f64,
    /// Variance-to-mean of the data's counts.
    pub vmr: f64,
    /// Variance-to-mean of the Poisson process's counts.
    pub poisson_vmr: f64,
    /// Largest distance from 1 still counted as Poisson-like at this scale.
    pub tolerance: f64,
}

/// The heavy-tail report of a sample.
#[derive(Clone, Debug, Serialize)]
pub struct TailReport {
    /// What was read.
    pub source: String,
    /// Which column.
    pub column: String,
    /// Values.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub median: f64,
    /// Standard deviation.
    pub std_dev: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Values above zero (the tail analysis uses these).
    pub positive: usize,
    /// The Hill estimate of α on the flattest part of the Hill plot.
    pub hill_alpha: Option<f64>,
    /// The k (values in the tail) it stands for.
    pub hill_k: usize,
    /// `hill_k / positive`.
    pub tail_fraction: f64,
    /// Spread of the Hill plot over the chosen run of k (relative).
    pub hill_plateau_spread: Option<f64>,
    /// α from the slope of the log-log CCDF.
    pub ccdf_slope_alpha: Option<f64>,
    /// That fit.
    pub ccdf_fit: Option<CcdfFit>,
    /// R² of the log-log QQ plot against the fitted Pareto distribution.
    pub qq_r2: Option<f64>,
    /// Heavy-tailed by the verdict rule in the module documentation.
    pub heavy_tailed: bool,
    /// α < 2 by both estimates.
    pub infinite_variance: bool,
    /// α < 1 by both estimates.
    pub infinite_mean: bool,
    /// How arrivals were read: "times", "gaps", or "none".
    pub arrivals: String,
    /// Counts at time scales ten times apart.
    pub time_scales: Vec<TimeScale>,
    /// The arrivals look like a Poisson process at every scale.
    pub poisson_like: bool,
    /// The Hill plot: (k, α(k)) on the grid.
    pub hill_plot: Vec<(usize, f64)>,
    /// The k range of the chosen plateau.
    pub hill_window: Option<(usize, usize)>,
    /// Remarks on what could not be computed.
    pub notes: Vec<String>,
}

/// Arrivals for the time-scale analysis.
#[derive(Clone, Debug)]
pub enum Arrivals {
    /// Arrival times.
    Times(Vec<f64>),
    /// Gaps between consecutive arrivals.
    Gaps(Vec<f64>),
    /// None.
    None,
}

/// The Hill estimates α(k) for the k on `ks`, from values sorted in decreasing order.
pub fn hill_curve(desc: &[f64], ks: &[usize]) -> Vec<Option<f64>> {
    let logs: Vec<f64> = desc.iter().map(|x| x.ln()).collect();
    let mut prefix = Vec::with_capacity(logs.len() + 1);
    prefix.push(0.0);
    for l in &logs {
        prefix.push(prefix.last().expect("not empty") + l);
    }
    ks.iter()
        .map(|&k| {
            if k == 0 || k >= desc.len() {
                return None;
            }
            let mean_excess = prefix[k] / k as f64 - logs[k];
            (mean_excess > 0.0).then(|| 1.0 / mean_excess)
        })
        .collect()
}

/// The k grid of the Hill plot for `n` positive values.
fn k_grid(n: usize) -> Vec<usize> {
    let lo = (n / 2000).max(10);
    let hi = (n / 5).max(lo + 1);
    if n < 50 {
        return Vec::new();
    }
    let mut ks: Vec<usize> = (0..HILL_GRID)
        .map(|i| {
            let f = i as f64 / (HILL_GRID - 1) as f64;
            (lo as f64 * (hi as f64 / lo as f64).powf(f)).round() as usize
        })
        .collect();
    ks.dedup();
    ks
}

/// Picks the flattest run of the Hill plot: (median α, middle k, spread, window).
fn choose_plateau(ks: &[usize], alphas: &[Option<f64>]) -> Option<(f64, usize, f64, (usize, usize))> {
    let mut best: Option<(f64, usize, usize)> = None;
    for start in 0..ks.len() {
        let Some(end) = (start..ks.len()).find(|&e| ks[e] as f64 >= ks[start] as f64 * PLATEAU_SPAN) else { break };
        let window: Option<Vec<f64>> = alphas[start..=end].iter().copied().collect();
        let Some(mut w) = window else { continue };
        w.sort_by(f64::total_cmp);
        let median = w[w.len() / 2];
        let spread = (w[w.len() - 1] - w[0]) / median;
        // Ties (within 1%) go to the larger k: less noise.
        if best.is_none_or(|(s, _, _)| spread <= s * 1.01) {
            best = Some((spread, start, end));
        }
    }
    let (spread, start, end) = best?;
    let mut w: Vec<f64> = alphas[start..=end].iter().map(|a| a.expect("window has estimates")).collect();
    w.sort_by(f64::total_cmp);
    let mid_k = ((ks[start] as f64 * ks[end] as f64).sqrt()).round() as usize;
    Some((w[w.len() / 2], mid_k, spread, (ks[start], ks[end])))
}

/// Weighted least squares of y on x: (slope, intercept, r²).
fn fit_line(points: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    let sw: f64 = points.iter().map(|p| p.2).sum();
    let mx = points.iter().map(|p| p.2 * p.0).sum::<f64>() / sw;
    let my = points.iter().map(|p| p.2 * p.1).sum::<f64>() / sw;
    let sxy: f64 = points.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| p.2 * (p.0 - mx).powi(2)).sum();
    let syy: f64 = points.iter().map(|p| p.2 * (p.1 - my).powi(2)).sum();
    let slope = sxy / sxx;
    let r2 = if syy > 0.0 { (sxy * sxy) / (sxx * syy) } else { 1.0 };
    (slope, my - slope * mx, r2)
}

/// Fits the log-log CCDF between the k-th largest value and the 10th largest.
fn ccdf_fit(desc: &[f64], k: usize) -> Option<CcdfFit> {
    let n = desc.len();
    if k <= CCDF_TOP_EXCLUDED + 2 || k >= n {
        return None;
    }
    let (lo, hi) = (desc[k], desc[CCDF_TOP_EXCLUDED - 1]);
    if lo <= 0.0 || hi <= lo {
        return None;
    }
    let asc: Vec<f64> = desc.iter().rev().copied().collect();
    let mut points = Vec::with_capacity(CCDF_POINTS);
    for i in 0..CCDF_POINTS {
        let x = lo * (hi / lo).powf(i as f64 / (CCDF_POINTS - 1) as f64);
        let beyond = n - asc.partition_point(|&v| v <= x);
        if beyond == 0 {
            continue;
        }
        points.push((x.log10(), (beyond as f64 / n as f64).log10(), beyond as f64));
    }
    points.dedup_by(|a, b| a.1 == b.1 && a.0 == b.0);
    if points.len() < 3 {
        return None;
    }
    let (slope, intercept, r2) = fit_line(&points);
    Some(CcdfFit { x_min: lo, x_max: hi, points: points.len(), slope, intercept, r2 })
}

/// R² of log(empirical) against log(fitted Pareto) quantiles over the k largest values.
pub fn qq_points(desc: &[f64], k: usize, alpha: f64) -> Vec<(f64, f64)> {
    let x_min = desc[k];
    (0..k)
        .map(|i| {
            let p_beyond = (i as f64 + 0.5) / k as f64;
            (x_min * p_beyond.powf(-1.0 / alpha), desc[i])
        })
        .collect()
}

fn counts_vmr(times: &[f64], start: f64, scale: f64, bins: usize) -> (f64, f64) {
    let mut counts = vec![0u64; bins];
    for &t in times {
        let b = ((t - start) / scale) as usize;
        if b < bins {
            counts[b] += 1;
        }
    }
    let mean = counts.iter().sum::<u64>() as f64 / bins as f64;
    let var = counts.iter().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / (bins - 1) as f64;
    (mean, if mean > 0.0 { var / mean } else { f64::NAN })
}

/// Counts per bin at time scales ten times apart, against a seeded Poisson process.
pub fn time_scales(times: &[f64], seed: u64) -> Vec<TimeScale> {
    if times.len() < 100 {
        return Vec::new();
    }
    let (start, end) = (times[0], times[times.len() - 1]);
    let span = end - start;
    if span <= 0.0 {
        return Vec::new();
    }
    let rate = (times.len() - 1) as f64 / span;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut poisson = Vec::with_capacity(times.len());
    let mut t = start;
    loop {
        let u: f64 = rng.gen::<f64>();
        t += -(1.0 - u).ln() / rate;
        if t > end {
            break;
        }
        poisson.push(t);
    }
    let mut out = Vec::new();
    let mut scale = 10.0 / rate;
    loop {
        let bins = (span / scale).floor() as usize;
        if bins < 10 {
            break;
        }
        let (mean, vmr) = counts_vmr(times, start, scale, bins);
        let (_, poisson_vmr) = counts_vmr(&poisson, start, scale, bins);
        let tolerance = (4.0 * (2.0 / (bins - 1) as f64).sqrt()).max(0.25);
        out.push(TimeScale { scale, bins, mean_count: mean, vmr, poisson_vmr, tolerance });
        scale *= 10.0;
    }
    out
}

/// Analyses a sample; `arrivals` feed the Poisson comparison.
pub fn analyze_tail(source: &str, column: &str, values: &[f64], arrivals: Arrivals, seed: u64) -> TailReport {
    let n = values.len();
    let mut notes = Vec::new();
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let mean = sorted.iter().sum::<f64>() / sorted.len().max(1) as f64;
    let var = sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (sorted.len().max(2) - 1) as f64;
    let desc: Vec<f64> = sorted.iter().rev().copied().filter(|&v| v > 0.0).collect();
    if desc.len() < sorted.len() {
        notes.push(format!("{} values of zero or less left out of the tail analysis", sorted.len() - desc.len()));
    }
    let ks = k_grid(desc.len());
    let alphas = hill_curve(&desc, &ks);
    let hill_plot: Vec<(usize, f64)> = ks.iter().zip(&alphas).filter_map(|(k, a)| a.map(|a| (*k, a))).collect();
    let plateau = choose_plateau(&ks, &alphas);
    if ks.is_empty() {
        notes.push("fewer than 50 positive values: no tail estimates".into());
    } else if plateau.is_none() {
        notes.push("the largest values repeat too often for the Hill estimator (too few distinct values)".into());
    }
    let (hill_alpha, hill_k, spread, window) = match plateau {
        Some((a, k, s, w)) => (Some(a), k, Some(s), Some(w)),
        None => (None, 0, None, None),
    };
    let fit = plateau.and_then(|(_, _, _, (_, k_hi))| ccdf_fit(&desc, k_hi));
    let ccdf_alpha = fit.as_ref().map(|f| -f.slope);
    let qq_r2 = hill_alpha.filter(|_| hill_k > 2).map(|a| {
        let pts: Vec<(f64, f64, f64)> =
            qq_points(&desc, hill_k, a).iter().map(|(t, e)| (t.ln(), e.ln(), 1.0)).collect();
        fit_line(&pts).2
    });
    let both_below = |limit: f64| matches!((hill_alpha, ccdf_alpha), (Some(h), Some(c)) if h < limit && c < limit);
    let heavy_tailed = both_below(2.0) && spread.is_some_and(|s| s <= PLATEAU_SPREAD_MAX);
    let (kind, times) = match arrivals {
        Arrivals::Times(mut t) => {
            t.sort_by(f64::total_cmp);
            ("times", Some(t))
        }
        Arrivals::Gaps(g) if g.iter().all(|v| *v >= 0.0 && v.is_finite()) => {
            let mut t = Vec::with_capacity(g.len() + 1);
            let mut acc = 0.0;
            t.push(0.0);
            for v in g {
                acc += v;
                t.push(acc);
            }
            ("gaps", Some(t))
        }
        Arrivals::Gaps(_) => {
            notes.push("negative or non-finite values cannot be gaps between arrivals: no time-scale analysis".into());
            ("none", None)
        }
        Arrivals::None => ("none", None),
    };
    let scales = times.as_deref().map_or_else(Vec::new, |t| time_scales(t, seed));
    if times.is_some() && scales.is_empty() {
        notes.push("too few arrivals (or too short a span) for ten bins at any time scale".into());
    }
    let poisson_like = !scales.is_empty() && scales.iter().all(|s| (s.vmr - 1.0).abs() <= s.tolerance);
    TailReport {
        source: source.to_string(),
        column: column.to_string(),
        n,
        mean,
        median: if sorted.is_empty() { f64::NAN } else { sorted[sorted.len() / 2] },
        std_dev: var.sqrt(),
        min: sorted.first().copied().unwrap_or(f64::NAN),
        max: sorted.last().copied().unwrap_or(f64::NAN),
        positive: desc.len(),
        hill_alpha,
        hill_k,
        tail_fraction: if desc.is_empty() { 0.0 } else { hill_k as f64 / desc.len() as f64 },
        hill_plateau_spread: spread,
        ccdf_slope_alpha: ccdf_alpha,
        ccdf_fit: fit,
        qq_r2,
        heavy_tailed,
        infinite_variance: both_below(2.0),
        infinite_mean: both_below(1.0),
        arrivals: kind.to_string(),
        time_scales: scales,
        poisson_like,
        hill_plot,
        hill_window: window,
        notes,
    }
}

/// The values behind the report's plots: the CCDF of the sample, the QQ points.
pub fn ccdf_points(values: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let mut asc: Vec<f64> = values.iter().copied().filter(|v| *v > 0.0 && v.is_finite()).collect();
    asc.sort_by(f64::total_cmp);
    let n = asc.len();
    if n == 0 {
        return Vec::new();
    }
    let step = (n / max_points.max(1)).max(1);
    let mut pts: Vec<(f64, f64)> = (0..n).step_by(step).map(|i| (asc[i], (n - i) as f64 / n as f64)).collect();
    pts.push((asc[n - 1], 1.0 / n as f64));
    pts
}

impl TailReport {
    /// The report as text.
    pub fn render_text(&self) -> String {
        use std::fmt::Write;
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{} [{}]: n = {}, mean {:.6}, median {:.6}, sd {:.6}, min {:.6}, max {:.6}",
            self.source, self.column, self.n, self.mean, self.median, self.std_dev, self.min, self.max
        );
        let _ = writeln!(
            o,
            "Hill alpha          {}   (k = {}, tail fraction {:.3}, plateau spread {})",
            opt(self.hill_alpha),
            self.hill_k,
            self.tail_fraction,
            opt(self.hill_plateau_spread)
        );
        match &self.ccdf_fit {
            Some(f) => {
                let _ = writeln!(
                    o,
                    "CCDF slope alpha    {}   (log-log fit over [{:.4}, {:.4}], {} points, R^2 {:.4})",
                    opt(self.ccdf_slope_alpha),
                    f.x_min,
                    f.x_max,
                    f.points,
                    f.r2
                );
            }
            None => {
                let _ = writeln!(o, "CCDF slope alpha    -");
            }
        }
        let _ = writeln!(o, "QQ vs fitted Pareto R^2 {}", opt(self.qq_r2));
        let _ = writeln!(
            o,
            "heavy-tailed: {}   (infinite variance: {}, infinite mean: {})",
            if self.heavy_tailed { "yes" } else { "no" },
            self.infinite_variance,
            self.infinite_mean
        );
        if !self.time_scales.is_empty() {
            let _ = writeln!(o, "Counts at time scales 10x apart (arrivals read as {}):", self.arrivals);
            let _ = writeln!(
                o,
                "  {:>14} {:>8} {:>12} {:>10} {:>12} {:>9}",
                "scale", "bins", "mean count", "var/mean", "Poisson v/m", "within"
            );
            for s in &self.time_scales {
                let ok = (s.vmr - 1.0).abs() <= s.tolerance;
                let _ = writeln!(
                    o,
                    "  {:>14.6e} {:>8} {:>12.2} {:>10.3} {:>12.3} {:>9}",
                    s.scale,
                    s.bins,
                    s.mean_count,
                    s.vmr,
                    s.poisson_vmr,
                    if ok { "yes" } else { "no" }
                );
            }
        }
        let _ = writeln!(o, "Poisson-like: {}", if self.poisson_like { "yes" } else { "no" });
        for n in &self.notes {
            let _ = writeln!(o, "note: {n}");
        }
        o
    }
}
