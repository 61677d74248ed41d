//! Describing a sample: percentiles, the share at or below a bound, and the points of a
//! cumulative distribution (plain or weighted) for the figures.

use serde::Serialize;

/// The percentiles of a sample (nearest rank) and its mean.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Values.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 25th.
    pub p25: f64,
    /// Median.
    pub p50: f64,
    /// 75th.
    pub p75: f64,
    /// 80th.
    pub p80: f64,
    /// 90th.
    pub p90: f64,
    /// 99th.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// Sorts a copy of `values` (non-finite values left out).
pub fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The value at quantile `q` of sorted values (nearest rank); 0 for none.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The percentiles of `values`.
pub fn percentiles(values: &[f64]) -> Percentiles {
    let s = sorted(values);
    if s.is_empty() {
        return Percentiles::default();
    }
    Percentiles {
        n: s.len(),
        mean: s.iter().sum::<f64>() / s.len() as f64,
        p10: quantile(&s, 0.10),
        p25: quantile(&s, 0.25),
        p50: quantile(&s, 0.50),
        p75: quantile(&s, 0.75),
        p80: quantile(&s, 0.80),
        p90: quantile(&s, 0.90),
        p99: quantile(&s, 0.99),
        max: s[s.len() - 1],
    }
}

/// The share (0..=1) of `values` at or below `bound`; 0 for none.
pub fn share_at_most(values: &[f64], bound: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().filter(|v| **v <= bound).count() as f64 / values.len() as f64
}

/// The share of `part` in `whole` (0 when `whole` is 0).
pub fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Points (value, share at or below it) of the cumulative distribution of `values`, each
/// weighted by its weight (or 1), at most `max_points` of them.
pub fn cdf_points(values: &[(f64, f64)], max_points: usize) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = values.iter().copied().filter(|(x, w)| x.is_finite() && *w >= 0.0).collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = v.iter().map(|p| p.1).sum();
    if v.is_empty() || total <= 0.0 {
        return Vec::new();
    }
    let step = (v.len() / max_points.max(1)).max(1);
    let mut acc = 0.0;
    let mut out = Vec::new();
    for (i, (x, w)) in v.iter().enumerate() {
        acc += w;
        let last_of_value = v.get(i + 1).is_none_or(|n| n.0 != *x);
        if last_of_value && (i % step == 0 || i + 1 == v.len()) {
            out.push((*x, acc / total));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = percentiles(&v);
        assert_eq!((p.p10, p.p50, p.p75, p.p90, p.max, p.n), (10.0, 50.0, 75.0, 90.0, 100.0, 100));
        assert_eq!(share_at_most(&v, 25.0), 0.25);
        assert_eq!(percentiles(&[]), Percentiles::default());
    }

    #[test]
    fn weighted_cdf_ends_at_one_and_weighs() {
        let pts = cdf_points(&[(1.0, 1.0), (10.0, 3.0), (10.0, 0.0)], 100);
        assert_eq!(pts, vec![(1.0, 0.25), (10.0, 1.0)]);
    }
}
