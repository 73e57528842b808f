//! Helpers of the statistical tests: seeded distributions and Pearson's χ².

use mentor_lab::sampling::{uniform, Purpose};

/// A deterministic random distribution over `n` tokens (some tokens near zero).
pub fn random_dist(n: usize, seed: u64) -> Vec<f32> {
    let w: Vec<f64> = (0..n)
        .map(|i| {
            let u = uniform(seed, i as u64, Purpose::TargetSample);
            u * u * u + 1e-3
        })
        .collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| (x / s) as f32).collect()
}

/// Pearson χ² statistic of observed counts against expected probabilities.
pub fn chi2(counts: &[u64], expected: &[f32], n: u64) -> f64 {
    counts
        .iter()
        .zip(expected)
        .filter(|(_, &e)| e > 0.0)
        .map(|(&c, &e)| {
            let exp = e as f64 * n as f64;
            (c as f64 - exp).powi(2) / exp
        })
        .sum()
}

/// χ² critical value at p = 0.001 for df ≤ 12 (the vocabularies used here).
pub fn chi2_crit(df: usize) -> f64 {
    [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91][df - 1]
}
