//! The same-seed coupling's math, tested statistically (many seeded draws against the exact
//! distribution) and on its edge cases: the race picks exact samples, the emitted token follows π
//! for the TV and KL rules, acceptance meets the (1 − d)/(1 + d) bound, and D = 0 reproduces the
//! target-only draw whatever the draft proposed.

use mentor_lab::mentor::{mix, tv_distance, verify_same_seed, MentorRule};
use mentor_lab::sampling::{
    ln_unit, probabilities, race_argmax, race_top, race_weights, same_seed_agreement, SamplingParams,
};

const N_DRAWS: u64 = 100_000;

#[path = "common/stats.rs"]
mod stats;
use stats::{chi2, chi2_crit, random_dist};

fn weights(seed: u64, pos: u64, n: usize) -> Vec<f32> {
    let mut w = Vec::new();
    race_weights(seed, pos, n, &mut w);
    w
}

/// N same-seed positions: the draft proposes the race's pick from q with the noise of position
/// `pos + draft_shift` (0 is the rule; anything else shares the noise wrongly), the verifier emits
/// the race's pick from π at `pos`. Returns (counts of emitted tokens, number accepted).
fn simulate(pi: &[f32], q: &[f32], seed: u64, draft_shift: u64) -> (Vec<u64>, u64) {
    let mut counts = vec![0u64; pi.len()];
    let mut accepted = 0;
    for pos in 0..N_DRAWS {
        let x = race_argmax(q, &weights(seed, pos + draft_shift, q.len())) as u32;
        let v = verify_same_seed(pi, x, &weights(seed, pos, pi.len()));
        counts[v.token as usize] += 1;
        accepted += u64::from(v.accepted);
    }
    (counts, accepted)
}

#[test]
fn the_race_picks_exact_samples() {
    let mut dists: Vec<Vec<f32>> = (0..4).map(|c| random_dist(7, 300 + c)).collect();
    // Zeros (a top-p nucleus) and a nearly one-hot distribution.
    dists.push(vec![0.0, 0.5, 0.0, 0.3, 0.2, 0.0]);
    dists.push(vec![0.98, 0.01, 0.005, 0.005]);
    for (case, p) in dists.iter().enumerate() {
        let mut counts = vec![0u64; p.len()];
        for pos in 0..N_DRAWS {
            counts[race_argmax(p, &weights(77 + case as u64, pos, p.len()))] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            assert!(p[i] > 0.0 || c == 0, "case {case}: token {i} has no mass but was picked");
        }
        let df = p.iter().filter(|&&x| x > 0.0).count() - 1;
        let stat = chi2(&counts, p, N_DRAWS);
        assert!(stat < chi2_crit(df), "case {case}: χ² = {stat:.2} (df {df}), counts {counts:?}");
    }
}

#[test]
fn the_emitted_token_follows_pi_for_both_rules() {
    for case in 0..3u64 {
        let (p, q) = (random_dist(6, 400 + case), random_dist(6, 500 + case));
        for rule in [MentorRule::Tv, MentorRule::Kl] {
            for budget in [0.0, 0.3, 0.7, 1.0] {
                let m = mix(rule, &p, &q, budget);
                let (counts, _) = simulate(&m.pi_mixed, &q, 900 + case, 0);
                let stat = chi2(&counts, &m.pi_mixed, N_DRAWS);
                assert!(stat < chi2_crit(5), "case {case}, {rule:?}, D = {budget}: χ² = {stat:.2}");
            }
        }
    }
}

/// (1 − d)/(1 + d) with d = TV(π, q) is the coupling's guaranteed acceptance; 1 − d, the maximal
/// coupling's, is the most any coupling can give.
fn acceptance_bounds(pi: &[f32], q: &[f32]) -> (f64, f64) {
    let d = tv_distance(pi, q);
    ((1.0 - d) / (1.0 + d), 1.0 - d)
}

#[test]
fn acceptance_meets_the_same_seed_bound() {
    // Three standard errors of a proportion estimated from N_DRAWS draws.
    let slack = 3.0 * (0.25 / N_DRAWS as f64).sqrt();
    for case in 0..4u64 {
        let p = random_dist(8, 600 + case);
        // A draft close to the target and one far from it.
        let near: Vec<f32> = p.iter().map(|&x| 0.8 * x + 0.2 / 8.0).collect();
        for q in [near, random_dist(8, 700 + case)] {
            for budget in [0.0, 0.5] {
                let m = mix(MentorRule::Tv, &p, &q, budget);
                let (_, accepted) = simulate(&m.pi_mixed, &q, 1000 + case, 0);
                let rate = accepted as f64 / N_DRAWS as f64;
                let (low, high) = acceptance_bounds(&m.pi_mixed, &q);
                assert!(rate >= low - slack, "case {case}, D = {budget}: acceptance {rate:.4} < bound {low:.4}");
                assert!(rate <= high + slack, "case {case}, D = {budget}: acceptance {rate:.4} > 1 − d = {high:.4}");
            }
        }
    }
}

/// The exact probability that p and q win the same race: both pick i when every other token j
/// loses to i in both races, E_j > E_i · max(p_j / p_i, q_j / q_i); integrating over E_i ~ Exp(1)
/// gives 1 / Σ_j max(p_j / p_i, q_j / q_i).
fn exact_agreement(p: &[f32], q: &[f32]) -> f64 {
    let both = |i: usize| p[i] > 0.0 && q[i] > 0.0;
    (0..p.len())
        .filter(|&i| both(i))
        .map(|i| {
            let ratio = |a: &[f32], j: usize| f64::from(a[j]) / f64::from(a[i]);
            1.0 / (0..p.len()).map(|j| ratio(p, j).max(ratio(q, j))).sum::<f64>()
        })
        .sum()
}

/// `eval-draft`'s estimate of the same-seed acceptance equals the closed form, stays within
/// [(1 − d)/(1 + d), 1 − d], is 1 for q = p and 0 for disjoint supports.
#[test]
fn the_same_seed_agreement_estimate_matches_the_closed_form() {
    let draws = 100_000u32;
    let slack = 3.0 * (0.25 / f64::from(draws)).sqrt();
    let mut w = Vec::new();
    for case in 0..4u64 {
        let p = random_dist(9, 800 + case);
        let near: Vec<f32> = p.iter().map(|&x| 0.7 * x + 0.3 / 9.0).collect();
        let mut sparse = random_dist(9, 900 + case);
        sparse[case as usize] = 0.0;
        let total: f32 = sparse.iter().sum();
        sparse.iter_mut().for_each(|x| *x /= total);
        for q in [near, random_dist(9, 850 + case), sparse] {
            let exact = exact_agreement(&p, &q);
            let (low, high) = acceptance_bounds(&p, &q);
            assert!(exact >= low - 1e-9 && exact <= high + 1e-9, "case {case}: {exact} outside [{low}, {high}]");
            let est = same_seed_agreement(&p, &q, 40 + case, 0, draws, &mut w);
            assert!((est - exact).abs() < slack, "case {case}: estimate {est:.4}, exact {exact:.4}");
        }
        assert_eq!(same_seed_agreement(&p, &p, 41, 0, 1000, &mut w), 1.0);
        let first: Vec<f32> = p.iter().enumerate().map(|(i, &x)| if i < 4 { x } else { 0.0 }).collect();
        let rest: Vec<f32> = p.iter().enumerate().map(|(i, &x)| if i < 4 { 0.0 } else { x }).collect();
        assert_eq!(exact_agreement(&first, &rest), 0.0);
        assert_eq!(same_seed_agreement(&first, &rest, 42, 0, 1000, &mut w), 0.0);
    }
}

/// The bound above has the power to see noise shared wrongly: a draft that draws with another
/// position's noise proposes independently of the verifier and falls below it.
#[test]
fn noise_from_another_position_breaks_the_bound() {
    let p = random_dist(8, 610);
    let q: Vec<f32> = p.iter().map(|&x| 0.8 * x + 0.2 / 8.0).collect();
    let (low, _) = acceptance_bounds(&p, &q);
    let (counts, accepted) = simulate(&p, &q, 1100, 1);
    let rate = accepted as f64 / N_DRAWS as f64;
    assert!(rate < low - 0.1, "acceptance {rate:.4} with another position's noise, bound {low:.4}");
    // The output itself is still a sample of π = p: only the coupling is lost.
    assert!(chi2(&counts, &p, N_DRAWS) < chi2_crit(7));
}

#[test]
fn edge_cases_zero_budget_full_budget_equal_distributions_and_greedy() {
    for pos in 0..2_000u64 {
        let (p, q) = (random_dist(9, 2000 + pos), random_dist(9, 3000 + pos));
        let w = weights(5, pos, 9);
        let x = race_argmax(&q, &w) as u32;
        // D = 0: π = p, and the emitted token is target-only's draw at this position, whatever q.
        let v = verify_same_seed(&mix(MentorRule::Tv, &p, &q, 0.0).pi_mixed, x, &w);
        assert_eq!(v.token as usize, race_argmax(&p, &w));
        assert_eq!(v.accepted, v.token == x);
        // D = 1 (TV): π = q, every proposal is accepted.
        let v = verify_same_seed(&mix(MentorRule::Tv, &p, &q, 1.0).pi_mixed, x, &w);
        assert!(v.accepted && v.token == x && v.accept_prob == 1.0);
        // d = 0: the draft is the target, every proposal is accepted at any budget.
        let y = race_argmax(&p, &w) as u32;
        for budget in [0.0, 0.4] {
            let v = verify_same_seed(&mix(MentorRule::Tv, &p, &p, budget).pi_mixed, y, &w);
            assert!(v.accepted && v.token == y);
        }
    }
    // Temperature 0: one-hot distributions, so the race returns the arg-max whatever the noise.
    let logits = [0.3f32, 2.5, -1.0, 2.4, 0.0];
    let greedy = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    let p = probabilities(&logits, &[], &greedy, logits.len());
    for pos in 0..100 {
        assert_eq!(race_argmax(&p, &weights(9, pos, logits.len())), 1);
    }
}

#[test]
fn the_noise_is_keyed_finite_and_independent_of_the_vocabulary_length() {
    let a = weights(42, 17, 1000);
    assert_eq!(a, weights(42, 17, 1000));
    assert_ne!(a, weights(42, 18, 1000));
    assert_ne!(a, weights(43, 17, 1000));
    assert!(a.iter().all(|w| w.is_finite() && *w > 0.0));
    // Token i's noise does not depend on how many tokens there are (the vectorized body and the
    // scalar tail agree).
    for n in [1, 7, 8, 9, 31, 999] {
        assert_eq!(weights(42, 17, n)[..], a[..n]);
    }
    // 1/w = E ~ Exp(1): mean 1, P(E > 1) = 1/e, over 100k tokens.
    let e: Vec<f64> = weights(7, 3, 100_000).iter().map(|&w| 1.0 / w as f64).collect();
    let mean = e.iter().sum::<f64>() / e.len() as f64;
    let above = e.iter().filter(|&&x| x > 1.0).count() as f64 / e.len() as f64;
    assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
    assert!((above - (-1f64).exp()).abs() < 0.005, "P(E > 1) = {above}");
}

#[test]
fn the_branch_free_logarithm_matches_ln() {
    let mut u = 1e-9f32;
    while u <= 1.0 {
        let (got, want) = (ln_unit(u) as f64, (u as f64).ln());
        assert!((got - want).abs() <= 2e-7 * want.abs().max(1.0), "ln({u}) = {got}, want {want}");
        u *= 1.0007;
    }
    assert_eq!(ln_unit(1.0), 0.0);
}

/// A tree node offers the first `w` tokens of the draft's race; the verifier's token is the race's
/// pick from π whatever is offered, so the output stays on π, while the share of positions where
/// it is among the offers grows with `w` (from the chain's acceptance at w = 1 to 1 when every
/// token of q's support is offered). The first offer is always the chain's token.
#[test]
fn tree_offers_raise_acceptance_and_leave_the_output_on_pi() {
    let n = 10;
    let p = random_dist(n, 91);
    let q = random_dist(n, 92);
    let pi = mix(MentorRule::Tv, &p, &q, 0.2).pi_mixed;
    let n_draws = N_DRAWS / 4;
    let mut last_rate = 0.0;
    for width in [1, 2, 3, 5, n] {
        let (mut counts, mut hits) = (vec![0u64; n], 0u64);
        for pos in 0..n_draws {
            let w = weights(7, pos, n);
            let offers = race_top(&q, &w, width);
            assert_eq!(offers[0], race_argmax(&q, &w), "position {pos}: the first offer is the chain's token");
            assert!(offers.windows(2).all(|o| q[o[0]] * w[o[0]] >= q[o[1]] * w[o[1]]), "offers in race order");
            let y = race_argmax(&pi, &w);
            counts[y] += 1;
            hits += u64::from(offers.contains(&y));
        }
        let stat = chi2(&counts, &pi, n_draws);
        assert!(stat < chi2_crit(n - 1), "width {width}: output off π, χ² {stat:.1}");
        let rate = hits as f64 / n_draws as f64;
        assert!(rate > last_rate, "width {width}: acceptance {rate:.4} not above {last_rate:.4}");
        last_rate = rate;
    }
    assert_eq!(last_rate, 1.0, "every token offered: always accepted");
    assert!(race_top(&[0.0, 0.5, 0.5, 0.0], &[1.0; 4], 4).len() == 2, "no offer of zero probability");
    assert!(race_top(&q, &weights(7, 0, n), 0).is_empty());
}
