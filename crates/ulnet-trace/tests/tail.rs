//! The heavy-tail estimators on samples of known distribution.

use rand::{Rng, SeedableRng};
use ulnet_trace::tail::{analyze_tail, Arrivals, TailReport};

const N: usize = 100_000;

fn pareto(alpha: f64, seed: u64) -> Vec<f64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..N).map(|_| (1.0 - rng.gen::<f64>()).powf(-1.0 / alpha)).collect()
}

fn exponential(seed: u64) -> Vec<f64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..N).map(|_| -(1.0 - rng.gen::<f64>()).ln()).collect()
}

fn report(values: &[f64]) -> TailReport {
    analyze_tail("generated", "x", values, Arrivals::Gaps(values.to_vec()), 7)
}

#[test]
fn pareto_alphas_are_recovered_within_a_tenth() {
    for (alpha, seed) in [1.2, 1.5, 1.8].into_iter().flat_map(|a| [1, 2, 3].map(|s| (a, s))) {
        let r = report(&pareto(alpha, seed));
        let (hill, ccdf) = (r.hill_alpha.unwrap(), r.ccdf_slope_alpha.unwrap());
        eprintln!(
            "alpha {alpha}: hill {hill:.4} (k {}, spread {:?}) ccdf {ccdf:.4} qq r2 {:?}",
            r.hill_k, r.hill_plateau_spread, r.qq_r2
        );
        assert!((hill - alpha).abs() <= 0.1, "Hill {hill} for alpha {alpha}");
        assert!((ccdf - alpha).abs() <= 0.1, "CCDF slope {ccdf} for alpha {alpha}");
        assert!(r.heavy_tailed && r.infinite_variance && !r.infinite_mean);
        assert!(!r.poisson_like, "Pareto gaps make bursty arrivals: {:?}", r.time_scales);
        assert_eq!(r.n, N);
    }
}

#[test]
fn exponential_is_not_heavy_tailed_and_its_arrivals_are_poisson() {
    for seed in [4, 5] {
        let r = report(&exponential(seed));
        eprintln!(
            "exp: hill {:?} (spread {:?}) ccdf {:?} scales {:?}",
            r.hill_alpha, r.hill_plateau_spread, r.ccdf_slope_alpha, r.time_scales
        );
        assert!(!r.heavy_tailed, "{}", r.render_text());
        assert!(!r.infinite_variance);
        assert!(r.poisson_like, "{}", r.render_text());
    }
}

#[test]
fn evenly_spaced_arrivals_are_not_poisson() {
    let r = analyze_tail("even", "x", &vec![1.0; 10_000], Arrivals::Gaps(vec![1.0; 10_000]), 1);
    assert!(!r.poisson_like);
    assert!(r.hill_alpha.is_none(), "one repeated value has no tail");
}
