//! Exact math of sampling and of the mentor rules, tested statistically (many seeded draws
//! against the exact distribution) and on the edge cases.

use mentor_lab::lookup::point_mass;
use mentor_lab::mentor::{accept_probability, kl_divergence, mix_kl, mix_tv, residual, tv_distance, verify_token};
use mentor_lab::sampling::{
    apply_repeat_penalty, argmax, draft_uniform, probabilities, sample_index, uniform, Purpose, SamplingParams,
};

const N_DRAWS: u64 = 200_000;

#[path = "common/stats.rs"]
mod stats;
use stats::{chi2, chi2_crit, random_dist};

/// Run the one-step rule N times: x ~ q, accept/resample against π. Returns (counts, accepted).
fn simulate(pi: &[f32], q: &[f32], seed: u64) -> (Vec<u64>, u64) {
    let mut counts = vec![0u64; q.len()];
    let mut accepted = 0;
    for i in 0..N_DRAWS {
        let x = sample_index(q, uniform(seed, i, Purpose::DraftSample)) as u32;
        let v = verify_token(pi, q, x, uniform(seed, i, Purpose::AcceptTest), uniform(seed, i, Purpose::Residual));
        counts[v.token as usize] += 1;
        accepted += u64::from(v.accepted);
    }
    (counts, accepted)
}

#[test]
fn tv_rule_output_follows_pi_and_acceptance_is_one_minus_excess() {
    for case in 0..4u64 {
        let n = 6;
        let p = random_dist(n, 100 + case);
        let q = random_dist(n, 200 + case);
        let d = tv_distance(&p, &q);
        assert!(d > 0.1, "case {case}: p and q should differ (d = {d})");
        for budget in [0.0, 0.3, 0.7, 1.0] {
            let m = mix_tv(&p, &q, budget);
            let (counts, accepted) = simulate(&m.pi_mixed, &q, 7 + case);
            let stat = chi2(&counts, &m.pi_mixed, N_DRAWS);
            assert!(stat < chi2_crit(n - 1), "case {case} D={budget}: chi2 {stat:.1} vs π");
            let rate = accepted as f64 / N_DRAWS as f64;
            let expected = 1.0 - (d - budget).max(0.0);
            let sigma = (expected * (1.0 - expected) / N_DRAWS as f64).sqrt().max(1e-9);
            assert!((rate - expected).abs() < 5.0 * sigma + 1e-6, "case {case} D={budget}: rate {rate} vs {expected}");
            assert!((m.tv_pi_p - d.min(budget)).abs() < 1e-6, "realised TV is min(d, D)");
            assert!((tv_distance(&m.pi_mixed, &p) - d.min(budget)).abs() < 1e-5);
            if budget == 0.0 {
                // Lossless: the output is the target's distribution, and clearly not the draft's.
                assert_eq!(m.pi_mixed, p);
                assert!(chi2(&counts, &q, N_DRAWS) > 1000.0);
            }
            if budget >= d {
                assert_eq!(accepted, N_DRAWS, "D ≥ d accepts every draft");
            }
        }
    }
}

/// A token copied from the context is a draft from the point mass q = δ_x: d = 1 − p(x), x is
/// accepted with probability π(x) = (1 − θ)p(x) + θ, a rejection draws from p without x, and the
/// output follows π — p exactly at D = 0.
#[test]
fn a_copied_token_is_a_point_mass_draft_and_the_output_follows_pi() {
    let n = 6;
    for case in 0..3u64 {
        let p = random_dist(n, 300 + case);
        // The target's most likely token, a middling one, and its least likely.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let x = order[[0, n / 2, n - 1][case as usize]];
        let q = point_mass(x as u32, n);
        let d = tv_distance(&p, &q);
        assert!((d - (1.0 - p[x] as f64)).abs() < 1e-6, "d = 1 − p(x)");
        for budget in [0.0, 0.3, 1.0] {
            let m = mix_tv(&p, &q, budget);
            let (counts, accepted) = simulate(&m.pi_mixed, &q, 40 + case);
            let stat = chi2(&counts, &m.pi_mixed, N_DRAWS);
            assert!(stat < chi2_crit(n - 1), "case {case} D={budget}: chi2 {stat:.1} vs π");
            let theta = (budget / d).min(1.0);
            let expected = (1.0 - theta) * p[x] as f64 + theta;
            let rate = accepted as f64 / N_DRAWS as f64;
            let sigma = (expected * (1.0 - expected) / N_DRAWS as f64).sqrt().max(1e-9);
            assert!((rate - expected).abs() < 5.0 * sigma + 1e-6, "case {case} D={budget}: rate {rate} vs {expected}");
            if budget == 0.0 {
                assert_eq!(m.pi_mixed, p);
                // Every rejection is replaced by another token: x is emitted only when accepted.
                assert_eq!(counts[x], accepted);
            }
        }
    }
}

/// Two positions at D = 0 as `auto` runs them: position 1 is drafted; position 2 is drafted too
/// (and verified against p2) only when `extend(x1, x2)` says so, else it is sampled from p2 (the
/// next round's token). Returns the counts of the emitted pairs (y1, y2), index 3·y1 + y2.
fn two_positions(p1: &[f32], q1: &[f32], p2: &[f32], q2: &[f32], extend: impl Fn(usize, usize) -> bool) -> Vec<u64> {
    let mut counts = vec![0u64; 9];
    for i in 0..N_DRAWS {
        let (a, b) = (2 * i, 2 * i + 1);
        let x1 = sample_index(q1, uniform(61, a, Purpose::DraftSample));
        let x2 = sample_index(q2, uniform(61, b, Purpose::DraftSample));
        let v1 =
            verify_token(p1, q1, x1 as u32, uniform(61, a, Purpose::AcceptTest), uniform(61, a, Purpose::Residual));
        let y2 = if v1.accepted && extend(x1, x2) {
            verify_token(p2, q2, x2 as u32, uniform(61, b, Purpose::AcceptTest), uniform(61, b, Purpose::Residual))
                .token as usize
        } else {
            sample_index(p2, uniform(61, b, Purpose::TargetSample))
        };
        counts[3 * v1.token as usize + y2] += 1;
    }
    counts
}

/// `auto` decides how far to draft from the tokens drafted so far (their draft probabilities):
/// the text keeps the target's distribution. Deciding from the next token's own draft probability
/// instead would not — the control shows the test sees that.
#[test]
fn a_draft_length_decided_from_the_drafted_prefix_keeps_the_output_on_p() {
    let (p1, q1) = ([0.5f32, 0.2, 0.3], [0.6f32, 0.3, 0.1]);
    let (p2, q2) = ([0.2f32, 0.5, 0.3], [0.7f32, 0.2, 0.1]);
    let joint: Vec<f32> = (0..9).map(|c| p1[c / 3] * p2[c % 3]).collect();
    // The rule's way: a confident first token lets the round go on.
    let counts = two_positions(&p1, &q1, &p2, &q2, |x1, _| q1[x1] >= 0.4);
    let stat = chi2(&counts, &joint, N_DRAWS);
    assert!(stat < chi2_crit(8), "prefix rule: chi2 {stat:.1} vs p1 × p2");
    // Control: verifying the second token only when its own draft probability is high biases it.
    let peeking = two_positions(&p1, &q1, &p2, &q2, |_, x2| q2[x2] >= 0.5);
    let stat = chi2(&peeking, &joint, N_DRAWS);
    assert!(stat > 100.0, "peeking rule: chi2 {stat:.1} should be far from p1 × p2");
}

#[test]
fn tv_rule_edge_cases() {
    let p = vec![0.5, 0.3, 0.2];
    // d = 0: θ = 1, everything accepted.
    let m = mix_tv(&p, &p, 0.0);
    assert_eq!(m.tv_pq, 0.0);
    assert_eq!(m.theta, 1.0);
    assert_eq!(simulate(&m.pi_mixed, &p, 3).1, N_DRAWS);
    // D = 1: π = q exactly, accept probability 1 for every token.
    let q = vec![0.1, 0.1, 0.8];
    let m = mix_tv(&p, &q, 1.0);
    assert_eq!(m.pi_mixed, q);
    for (&pi_x, &q_x) in m.pi_mixed.iter().zip(&q) {
        assert_eq!(accept_probability(pi_x, q_x), 1.0);
    }
    // Temperature 0: one-hot p and q that disagree. D = 0 always takes the target's token;
    // D = 0.5 accepts the draft's token half the time and otherwise falls back to p's arg-max.
    let p1 = vec![1.0, 0.0, 0.0];
    let q1 = vec![0.0, 0.0, 1.0];
    let m = mix_tv(&p1, &q1, 0.0);
    let v = verify_token(&m.pi_mixed, &q1, 2, 0.0, 0.5);
    assert!(!v.accepted);
    assert_eq!(v.token, 0);
    let m = mix_tv(&p1, &q1, 0.5);
    assert!((accept_probability(m.pi_mixed[2], q1[2]) - 0.5).abs() < 1e-7);
    assert_eq!(verify_token(&m.pi_mixed, &q1, 2, 0.7, 0.3).token, 0);
    assert_eq!(verify_token(&m.pi_mixed, &q1, 2, 0.2, 0.3).token, 2);
    // The residual of the TV rule is proportional to max(p - q, 0).
    let p = random_dist(5, 1);
    let q = random_dist(5, 2);
    let m = mix_tv(&p, &q, 0.2);
    let r = residual(&m.pi_mixed, &q);
    let direct: Vec<f32> = p.iter().zip(&q).map(|(a, b)| (a - b).max(0.0)).collect();
    let (sr, sd): (f32, f32) = (r.iter().sum(), direct.iter().sum());
    for (a, b) in r.iter().zip(&direct) {
        assert!((a / sr - b / sd).abs() < 1e-5);
    }
}

/// Acceptance Σ min(π, q).
fn acceptance(pi: &[f32], q: &[f32]) -> f64 {
    pi.iter().zip(q).map(|(&a, &b)| a.min(b) as f64).sum()
}

/// Best acceptance over a grid on the simplex subject to KL(p‖π) ≤ D.
fn brute_force_kl(p: &[f32], q: &[f32], budget: f64, steps: usize) -> f64 {
    let n = p.len();
    let mut best = 0.0f64;
    let mut idx = vec![0usize; n - 1];
    loop {
        let used: usize = idx.iter().sum();
        if used <= steps {
            let mut pi: Vec<f32> = idx.iter().map(|&i| i as f32 / steps as f32).collect();
            pi.push((steps - used) as f32 / steps as f32);
            if kl_divergence(p, &pi) <= budget {
                best = best.max(acceptance(&pi, q));
            }
        }
        // Next grid point (odometer).
        let mut k = 0;
        loop {
            if k == n - 1 {
                return best;
            }
            idx[k] += 1;
            if idx[k] <= steps {
                break;
            }
            idx[k] = 0;
            k += 1;
        }
    }
}

#[test]
fn kl_rule_matches_brute_force_optimum() {
    for (case, n, steps) in [(0u64, 3usize, 400usize), (1, 3, 400), (2, 4, 120), (3, 4, 120), (4, 5, 48)] {
        let p = random_dist(n, 300 + case);
        let q = random_dist(n, 400 + case);
        let full_kl = kl_divergence(&p, &q);
        for frac in [0.05, 0.2, 0.5] {
            let budget = full_kl * frac;
            let m = mix_kl(&p, &q, budget);
            let kl = kl_divergence(&p, &m.pi_mixed);
            assert!(kl <= budget + 1e-6, "case {case}: KL {kl} over budget {budget}");
            let ours = acceptance(&m.pi_mixed, &q);
            let brute = brute_force_kl(&p, &q, budget, steps);
            // Ours is the continuous optimum: at least the grid's best (minus float noise), and
            // the grid's best approaches it within the grid's resolution.
            assert!(ours >= brute - 1e-4, "case {case} frac {frac}: ours {ours} < brute {brute}");
            assert!(
                ours - brute < 3.0 * n as f64 / steps as f64,
                "case {case} frac {frac}: ours {ours} ≫ brute {brute}"
            );
            assert!((m.pi_mixed.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }
}

#[test]
fn kl_rule_edges_and_statistics() {
    let p = random_dist(6, 11);
    let q = random_dist(6, 12);
    // D = 0 is lossless; a budget above KL(p‖q) follows the draft.
    assert_eq!(mix_kl(&p, &q, 0.0).pi_mixed, p);
    assert_eq!(mix_kl(&p, &q, kl_divergence(&p, &q) + 0.01).pi_mixed, q);
    assert_eq!(mix_kl(&p, &p, 0.3).theta, 1.0);
    // More budget never lowers acceptance.
    let mut last = 0.0;
    for b in [0.0, 0.01, 0.05, 0.1, 0.3] {
        let a = acceptance(&mix_kl(&p, &q, b).pi_mixed, &q);
        assert!(a >= last - 1e-6);
        last = a;
    }
    // The emitted tokens follow π.
    let m = mix_kl(&p, &q, 0.05);
    let (counts, accepted) = simulate(&m.pi_mixed, &q, 99);
    assert!(chi2(&counts, &m.pi_mixed, N_DRAWS) < chi2_crit(5));
    let expected = acceptance(&m.pi_mixed, &q);
    assert!((accepted as f64 / N_DRAWS as f64 - expected).abs() < 0.005);
}

#[test]
fn sampler_follows_the_distribution() {
    // This is also how bonus and target tokens are drawn: from p with the TargetSample stream.
    let p = random_dist(8, 5);
    let mut counts = vec![0u64; 8];
    for i in 0..N_DRAWS {
        counts[sample_index(&p, uniform(3, i, Purpose::TargetSample))] += 1;
    }
    assert!(chi2(&counts, &p, N_DRAWS) < chi2_crit(7));
    // Zero-weight entries are never returned, even at u → 1.
    assert_eq!(sample_index(&[0.5, 0.5, 0.0], 0.999_999_999), 1);
    assert_eq!(sample_index(&[0.0, 1.0, 0.0], 0.0), 1);
}

#[test]
fn keyed_uniforms_are_reproducible_and_independent() {
    assert_eq!(uniform(42, 17, Purpose::AcceptTest), uniform(42, 17, Purpose::AcceptTest));
    let purposes = [Purpose::TargetSample, Purpose::DraftSample, Purpose::AcceptTest, Purpose::Residual];
    for a in purposes {
        for b in purposes {
            if a != b {
                assert_ne!(uniform(42, 17, a), uniform(42, 17, b));
            }
        }
    }
    assert_ne!(uniform(42, 17, Purpose::AcceptTest), uniform(43, 17, Purpose::AcceptTest));
    assert_ne!(uniform(42, 17, Purpose::AcceptTest), uniform(42, 18, Purpose::AcceptTest));
    // Uniform on [0, 1): mean 1/2, variance 1/12, all in range.
    let xs: Vec<f64> = (0..N_DRAWS).map(|i| uniform(9, i, Purpose::DraftSample)).collect();
    assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
    assert!((mean - 0.5).abs() < 0.003 && (var - 1.0 / 12.0).abs() < 0.002);
    // A position drafted again gets a fresh, reproducible draw; the first attempt is the plain one.
    assert_eq!(draft_uniform(42, 17, 0), uniform(42, 17, Purpose::DraftSample));
    assert_eq!(draft_uniform(42, 17, 1), draft_uniform(42, 17, 1));
    let attempts: Vec<f64> = (0..4).map(|a| draft_uniform(42, 17, a)).collect();
    assert!((1..4).all(|a| !attempts[..a].contains(&attempts[a])), "{attempts:?}");
    let redrafts: Vec<f64> = (0..N_DRAWS).map(|i| draft_uniform(9, i, 1)).collect();
    let mean = redrafts.iter().sum::<f64>() / redrafts.len() as f64;
    assert!((mean - 0.5).abs() < 0.003, "redraft draws mean {mean}");
}

#[test]
fn temperature_zero_is_argmax() {
    let logits = vec![0.1, 2.5, -1.0, 2.4];
    let params = SamplingParams { temperature: 0.0, ..Default::default() };
    let p = probabilities(&logits, &[], &params, 4);
    assert_eq!(p, vec![0.0, 1.0, 0.0, 0.0]);
    assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1, "ties go to the lowest id");
    // Temperature scales the softmax; 1 is the plain softmax.
    let p1 = probabilities(&logits, &[], &SamplingParams { temperature: 1.0, ..Default::default() }, 4);
    let z: f32 = logits.iter().map(|l| l.exp()).sum();
    for (a, l) in p1.iter().zip(&logits) {
        assert!((a - l.exp() / z).abs() < 1e-6);
    }
    let hot = probabilities(&logits, &[], &SamplingParams { temperature: 2.0, ..Default::default() }, 4);
    assert!(hot[1] < p1[1], "higher temperature flattens");
    // Only the first n_vocab logits count (padded heads).
    let padded = probabilities(&[0.0, 0.0, 50.0], &[], &SamplingParams { temperature: 1.0, ..Default::default() }, 2);
    assert_eq!(padded, vec![0.5, 0.5]);
}

#[test]
fn repetition_penalty_edge_cases() {
    let base = vec![2.0, -2.0, 1.0, 0.0];
    // Penalty 1 changes nothing.
    let mut l = base.clone();
    apply_repeat_penalty(&mut l, &[0, 1, 2], 1.0, 64);
    assert_eq!(l, base);
    // Positive logits are divided, negative multiplied, zero stays; duplicates count once.
    let mut l = base.clone();
    apply_repeat_penalty(&mut l, &[0, 1, 3, 0, 0], 2.0, 64);
    assert_eq!(l, vec![1.0, -4.0, 1.0, 0.0]);
    // Only the last `last_n` tokens count; last_n = 0 disables.
    let mut l = base.clone();
    apply_repeat_penalty(&mut l, &[0, 2], 2.0, 1);
    assert_eq!(l, vec![2.0, -2.0, 0.5, 0.0]);
    let mut l = base.clone();
    apply_repeat_penalty(&mut l, &[0, 2], 2.0, 0);
    assert_eq!(l, base);
    // Ids outside the vocabulary and an empty context are ignored.
    let mut l = base.clone();
    apply_repeat_penalty(&mut l, &[99], 2.0, 64);
    apply_repeat_penalty(&mut l, &[], 2.0, 64);
    assert_eq!(l, base);
    // A penalty can flip the greedy choice.
    let params = SamplingParams { temperature: 0.0, repeat_penalty: 3.0, ..Default::default() };
    assert_eq!(argmax(&probabilities(&[3.0, 2.0], &[0], &params, 2)), 1);
}

#[test]
fn top_p_keeps_the_nucleus() {
    let logits = vec![(0.5f32).ln(), (0.3f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
    let params = SamplingParams { temperature: 1.0, top_p: 0.75, ..Default::default() };
    let p = probabilities(&logits, &[], &params, 4);
    assert!((p[0] - 0.5 / 0.8).abs() < 1e-5 && (p[1] - 0.3 / 0.8).abs() < 1e-5);
    assert_eq!((p[2], p[3]), (0.0, 0.0));
    let all = probabilities(&logits, &[], &SamplingParams { top_p: 1.0, temperature: 1.0, ..Default::default() }, 4);
    assert!(all.iter().all(|&x| x > 0.0));
}

#[test]
fn fast_exponential_matches_f64_exp() {
    use mentor_lab::vecmath::exp_nonpositive;
    // Dense grid over the range used (max-subtracted logits), plus the representable ends.
    let mut worst = 0f64;
    let mut i = 0u32;
    loop {
        let x = -(i as f32) * 0.000_731;
        if x < -87.0 {
            break;
        }
        let exact = (x as f64).exp();
        let rel = ((exp_nonpositive(x) as f64 - exact) / exact).abs();
        worst = worst.max(rel);
        i += 1;
    }
    assert!(worst < 3e-7, "worst relative error {worst:e}");
    assert_eq!(exp_nonpositive(0.0), 1.0);
    assert_eq!(exp_nonpositive(-87.5), 0.0);
    assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_nonpositive(f32::NAN), 0.0);
    // softmax built on it still sums to 1 and keeps the order of the logits
    let logits: Vec<f32> = (0..49152).map(|i| ((i * 7919) % 1000) as f32 * 0.013 - 6.0).collect();
    let p = mentor_lab::sampling::softmax(&logits, 0.7);
    let total: f64 = p.iter().map(|&x| x as f64).sum();
    assert!((total - 1.0).abs() < 1e-5, "sum {total}");
    let exact_ratio = ((logits[1] - logits[2]) as f64 / 0.7).exp();
    assert!((p[1] as f64 / p[2] as f64 / exact_ratio - 1.0).abs() < 1e-6);
}

/// The vectorized form gives exactly the scalar exponential, value for value (the sampling of a
/// token then does not depend on which CPU path ran), and the block sums give what a plain f64 sum
/// gives to rounding.
#[test]
fn vectorized_exponential_and_sums_match_the_scalar_forms() {
    use mentor_lab::vecmath::{exp_nonpositive, exp_shifted, sum_f64};
    let mut src: Vec<f32> = (0..20_011).map(|i| 3.0 - (i as f32) * 0.0047).collect();
    src.extend([f32::NEG_INFINITY, f32::NAN, -84.0, -87.0, -87.000_01, 3.0, 2.999_9]);
    // Whole vectors that underflow (the AVX2 path stores zeros for them without the polynomial),
    // as a draft's head restricted to its frequent tokens leaves them.
    src.extend([f32::NEG_INFINITY; 24]);
    src.extend([-200.0; 16]);
    src.push(1.0);
    for (max, scale) in [(3.0f32, 1.0f32), (3.0, 1.0 / 0.7), (2.5, 2.0)] {
        let mut fast = vec![0f32; src.len()];
        exp_shifted(&src, max, scale, &mut fast);
        for (&x, &f) in src.iter().zip(&fast) {
            let slow = exp_nonpositive((x - max) * scale);
            assert!(f.to_bits() == slow.to_bits() || (f == 0.0 && slow == 0.0), "x {x}: {f} vs {slow}");
        }
        let plain: f64 = fast.iter().map(|&v| v as f64).sum();
        assert!((sum_f64(&fast) - plain).abs() <= 1e-12 * plain.abs().max(1.0));
    }
}

/// The vectorized maximum is the plain fold's, NaN ignored, at every length around the 8 lanes.
#[test]
fn vectorized_maximum_is_the_plain_fold() {
    use mentor_lab::vecmath::max_f32;
    let mut seed = 99u64;
    for len in (0..40).chain([49152]) {
        for trial in 0..20 {
            let xs: Vec<f32> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    match (seed >> 59, trial) {
                        (0, _) => f32::NAN,
                        (1, _) => f32::NEG_INFINITY,
                        (_, 0) => f32::NAN,
                        _ => ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 40.0,
                    }
                })
                .collect();
            let plain = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max_f32(&xs).to_bits(), plain.to_bits(), "length {len}, trial {trial}: {xs:?}");
        }
    }
    assert_eq!(max_f32(&[]), f32::NEG_INFINITY);
    assert_eq!(max_f32(&[f32::NAN; 9]), f32::NEG_INFINITY);
}

/// The first batch of verify rows: all of them at full acceptance, one at none, the expected
/// accepted prefix plus one in between.
#[test]
fn likely_rows_follow_the_expected_accepted_prefix() {
    use mentor_lab::generate::likely_rows;
    assert_eq!(likely_rows(1.0, 8), 9);
    assert_eq!(likely_rows(0.0, 8), 1);
    assert_eq!(likely_rows(0.5, 8), 2); // 1 + 0.5 + 0.25 + … ≈ 1.996
    assert_eq!(likely_rows(0.9, 8), 7); // 1 + 0.9 + … + 0.9^8 ≈ 6.13
    assert_eq!(likely_rows(0.7, 0), 1);
    assert_eq!(likely_rows(f64::NAN, 4), 1);
}
