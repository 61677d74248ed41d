//! Latency statistics as `ucx_perftest` reports them.

/// Percentiles and mean of samples in nanoseconds, reported in microseconds.
pub struct LatencySummary {
    pub p50_us: f64,
    pub p99_us: f64,
    pub avg_us: f64,
}

/// Summarises round-trip samples (ns) as one-way latencies (round trip / 2).
pub fn one_way(mut round_trips_ns: Vec<u64>) -> LatencySummary {
    assert!(!round_trips_ns.is_empty(), "no samples");
    round_trips_ns.sort_unstable();
    let n = round_trips_ns.len();
    let at = |q: f64| round_trips_ns[((n as f64 * q) as usize).min(n - 1)] as f64 / 2000.0;
    let avg = round_trips_ns.iter().map(|&x| x as f64).sum::<f64>() / n as f64 / 2000.0;
    LatencySummary { p50_us: at(0.5), p99_us: at(0.99), avg_us: avg }
}

#[cfg(test)]
mod tests {
    #[test]
    fn halves_round_trips_and_picks_percentiles() {
        let s = super::one_way((1..=100).map(|x| x * 1000).collect());
        assert_eq!(s.p50_us, 25.5);
        assert_eq!(s.p99_us, 50.0);
        assert!((s.avg_us - 25.25).abs() < 1e-9);
    }
}
