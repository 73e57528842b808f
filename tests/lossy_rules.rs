//! The lossy rules of the literature (cascade, fuzzy, typical, lenience) as π rules: π is a
//! distribution, matches its closed form on small hand-worked pairs, is p itself at the value that
//! means no relaxation, and the emitted token follows it under both couplings and at a tree node
//! (many seeded draws against the exact distribution).

use mentor_lab::mentor::{
    js_divergence, mix, mix_cascade, mix_fuzzy, mix_lenience, mix_typical, tv_distance, verify_candidates,
    verify_same_seed, verify_token, MentorRule,
};
use mentor_lab::sampling::{
    draft_uniform, race_argmax, race_weights, sample_index, sample_without_replacement, uniform, uniform_nth, Purpose,
};

const N_DRAWS: u64 = 100_000;

#[path = "common/stats.rs"]
mod stats;
use stats::{chi2, chi2_crit, random_dist};

const NEW_RULES: [MentorRule; 4] = [MentorRule::Cascade, MentorRule::Fuzzy, MentorRule::Typical, MentorRule::Lenience];

/// Five values across the rule's range, both ends included.
fn values(rule: MentorRule) -> Vec<f64> {
    let p = rule.param();
    (0..5).map(|i| p.min + (p.max - p.min) * i as f64 / 4.0).collect()
}

fn assert_close(a: &[f32], b: &[f64], what: &str) {
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!((x as f64 - y).abs() < 1e-6, "{what}: π[{i}] = {x}, expected {y}");
    }
}

#[test]
fn pi_is_a_distribution_and_its_numbers_are_the_realised_ones() {
    for case in 0..6u64 {
        let (p, q) = (random_dist(7, 40 + case), random_dist(7, 60 + case));
        for rule in NEW_RULES {
            for value in values(rule) {
                let m = mix(rule, &p, &q, value);
                let what = format!("case {case}, {rule} = {value}");
                assert!(m.pi_mixed.iter().all(|&x| x >= 0.0 && x.is_finite()), "{what}: {:?}", m.pi_mixed);
                let sum: f64 = m.pi_mixed.iter().map(|&x| x as f64).sum();
                assert!((sum - 1.0).abs() < 1e-5, "{what}: Σπ = {sum}");
                assert_eq!(m.tv_pq, tv_distance(&p, &q), "{what}");
                assert_eq!(m.tv_pi_p, tv_distance(&m.pi_mixed, &p), "{what}");
                assert_eq!(m.theta, m.tv_pi_p / m.tv_pq, "{what}");
            }
        }
    }
    // d = 0: θ is 1 by definition.
    let p = random_dist(5, 3);
    assert_eq!(mix(MentorRule::Lenience, &p, &p, 0.3).theta, 1.0);
}

/// At the value that means no relaxation π is p to the bit, so the same-seed text is the
/// target-only text token for token, whatever the draft proposed.
#[test]
fn the_no_relaxation_value_gives_p_exactly_and_the_target_only_text() {
    for case in 0..8u64 {
        let (p, q) = (random_dist(9, 80 + case), random_dist(9, 90 + case));
        for rule in [MentorRule::Tv, MentorRule::Kl, MentorRule::Cascade, MentorRule::Fuzzy, MentorRule::Lenience] {
            let lossless = rule.param().lossless.expect("these rules have a lossless value");
            let m = mix(rule, &p, &q, lossless);
            assert_eq!(m.pi_mixed, p, "case {case}, {rule}");
            assert_eq!(m.tv_pi_p, 0.0);
            let mut w = Vec::new();
            for pos in 0..200 {
                race_weights(case, pos, p.len(), &mut w);
                let drafted = race_argmax(&q, &w) as u32;
                let v = verify_same_seed(&m.pi_mixed, drafted, &w);
                assert_eq!(v.token as usize, race_argmax(&p, &w), "case {case}, {rule}, pos {pos}");
            }
        }
    }
    assert_eq!(MentorRule::Typical.param().lossless, None, "typical acceptance has no lossless setting");
}

#[test]
fn cascade_follows_the_draft_where_it_is_confident_enough() {
    // d = (0.1 + 0.2 + 0.1)/2 = 0.2; max q = 0.6 > max p − α·d = 0.7 − 0.2α iff α > 0.5.
    let (p, q) = ([0.7f32, 0.1, 0.2], [0.6f32, 0.3, 0.1]);
    for (alpha, follows) in [(-1.0, false), (0.0, false), (0.4, false), (0.6, true), (1.0, true)] {
        let m = mix_cascade(&p, &q, alpha);
        assert_eq!(m.pi_mixed, if follows { q.to_vec() } else { p.to_vec() }, "α = {alpha}");
        let why = MentorRule::Cascade.explain(&p, &q, alpha, 0);
        assert_eq!(why[2], ("follows the draft", f64::from(u8::from(follows))));
        assert!((why[1].1 - (0.7 - 0.2 * alpha)).abs() < 1e-6, "{why:?}");
    }
    // A draft more confident than the target is followed at α = 0.
    assert_eq!(mix_cascade(&[0.6, 0.3, 0.1], &[0.2, 0.7, 0.1], 0.0).pi_mixed, vec![0.2, 0.7, 0.1]);
}

#[test]
fn fuzzy_follows_the_draft_within_its_js_threshold() {
    // m = (0.75, 0.25): JS = ½(½ln(2/3) + ½ln 2) + ½ln(4/3) = ¾ ln(4/3) ≈ 0.2158 nats.
    let (p, q) = ([0.5f32, 0.5], [1.0f32, 0.0]);
    let js = 0.75 * (4.0f64 / 3.0).ln();
    assert!((js_divergence(&p, &q) - js).abs() < 1e-7);
    assert!((js_divergence(&[1.0, 0.0], &[0.0, 1.0]) - std::f64::consts::LN_2).abs() < 1e-12);
    assert_eq!(js_divergence(&p, &p), 0.0);
    assert_eq!(mix_fuzzy(&p, &q, 0.21).pi_mixed, p);
    assert_eq!(mix_fuzzy(&p, &q, 0.22).pi_mixed, q);
    assert_eq!(mix_fuzzy(&p, &q, std::f64::consts::LN_2).pi_mixed, q);
    let why = MentorRule::Fuzzy.explain(&p, &q, 0.3, 0);
    assert!((why[0].1 - js).abs() < 1e-7 && why[1] == ("T", 0.3), "{why:?}");
}

#[test]
fn typical_keeps_drafts_the_target_finds_plausible() {
    let (p, q) = ([0.5f32, 0.3, 0.2], [0.2f32, 0.2, 0.6]);
    let h = -(0.5f64 * 0.5f64.ln() + 0.3 * 0.3f64.ln() + 0.2 * 0.2f64.ln());
    // ε = 0.5: τ = min(0.5, √0.5·e^(−H)) ≈ 0.2525, so A = {0, 1}, q(A) = 0.4 and
    // π = (0.2, 0.2, 0) + 0.6·p = (0.5, 0.38, 0.12).
    let tau = 0.5f64.min(0.5f64.sqrt() * (-h).exp());
    assert!(tau > 0.2 && tau < 0.3, "τ = {tau}");
    assert_close(&mix_typical(&p, &q, 0.5).pi_mixed, &[0.5, 0.38, 0.12], "ε = 0.5");
    let why = MentorRule::Typical.explain(&p, &q, 0.5, 2);
    assert!((why[0].1 - tau).abs() < 1e-6 && why[1].1 == 0.0, "token 2 is outside A: {why:?}");
    assert_eq!(MentorRule::Typical.explain(&p, &q, 0.5, 1)[1].1, 1.0);
    // ε = 0.25: τ ≈ 0.179 < 0.2, every token is in A and π = q.
    assert_close(&mix_typical(&p, &q, 0.25).pi_mixed, &[0.2, 0.2, 0.6], "ε = 0.25");
    // No ε is lossless: even a draft equal to the target is pulled towards A.
    let m = mix_typical(&p, &p, 0.5);
    assert_close(&m.pi_mixed, &[0.5 + 0.2 * 0.5, 0.3 + 0.2 * 0.3, 0.2 * 0.2], "q = p");
    assert!(m.tv_pi_p > 0.1 && m.theta == 1.0, "d = 0 yet π moved: {m:?}");
}

#[test]
fn lenience_accepts_more_as_l_falls() {
    // l = 0.5: min(q, p/l) = (0.2, 0.2, 0.4), β = 0.2, the residual max(p − that, 0) = (0.3, 0.1, 0)
    // normalises to (0.75, 0.25, 0): π = (0.35, 0.25, 0.4).
    let (p, q) = ([0.5f32, 0.3, 0.2], [0.2f32, 0.2, 0.6]);
    assert_close(&mix_lenience(&p, &q, 0.5).pi_mixed, &[0.35, 0.25, 0.4], "l = 0.5");
    // Small l: π = q wherever p allows it.
    assert_close(&mix_lenience(&p, &q, 0.01).pi_mixed, &[0.2, 0.2, 0.6], "l = 0.01");
    assert_eq!(mix_lenience(&p, &q, 1.0).pi_mixed, p);
    assert_eq!(MentorRule::Lenience.explain(&p, &q, 0.5, 0), vec![("l", 0.5)]);
}

/// The emitted token's counts under one coupling: `same_seed` races π against the noise the
/// draft raced q with; otherwise x ~ q is accepted with min(1, π/q), else the residual is drawn.
fn simulate(pi: &[f32], q: &[f32], seed: u64, same_seed: bool) -> Vec<u64> {
    let mut counts = vec![0u64; pi.len()];
    let mut w = Vec::new();
    for i in 0..N_DRAWS {
        let token = if same_seed {
            race_weights(seed, i, q.len(), &mut w);
            verify_same_seed(pi, race_argmax(q, &w) as u32, &w).token
        } else {
            let x = sample_index(q, uniform(seed, i, Purpose::DraftSample)) as u32;
            verify_token(pi, q, x, uniform(seed, i, Purpose::AcceptTest), uniform(seed, i, Purpose::Residual)).token
        };
        counts[token as usize] += 1;
    }
    counts
}

/// Two candidates at a tree node, drawn from q without replacement and checked by recursive
/// rejection sampling.
fn simulate_node(pi: &[f32], q: &[f32], seed: u64) -> Vec<u64> {
    let mut counts = vec![0u64; pi.len()];
    for i in 0..N_DRAWS {
        let draw = |j: usize| {
            if j == 0 {
                draft_uniform(seed, i, 0)
            } else {
                uniform_nth(seed, i, j as u32, Purpose::DraftRunnerUp)
            }
        };
        let accept = |j: usize| {
            if j == 0 {
                uniform(seed, i, Purpose::AcceptTest)
            } else {
                uniform_nth(seed, i, j as u32, Purpose::AcceptRunnerUp)
            }
        };
        let candidates: Vec<(u32, bool)> =
            sample_without_replacement(q, draw, 2).into_iter().map(|x| (x as u32, false)).collect();
        counts[verify_candidates(pi, q, &candidates, accept, uniform(seed, i, Purpose::Residual)).token as usize] += 1;
    }
    counts
}

fn assert_follows(counts: &[u64], pi: &[f32], what: &str) {
    for (i, (&c, &x)) in counts.iter().zip(pi).enumerate() {
        assert!(x > 0.0 || c == 0, "{what}: token {i} has no mass under π but was emitted {c} times");
    }
    let df = pi.iter().filter(|&&x| x > 0.0).count() - 1;
    let stat = chi2(counts, pi, N_DRAWS);
    assert!(stat < chi2_crit(df), "{what}: χ² = {stat:.2} (df {df})");
}

#[test]
fn the_emitted_token_follows_pi_under_both_couplings_and_at_a_tree_node() {
    for case in 0..2u64 {
        let (p, q) = (random_dist(6, 1100 + case), random_dist(6, 1200 + case));
        for rule in NEW_RULES {
            let param = rule.param();
            for value in [param.min + 0.25 * (param.max - param.min), param.min + 0.75 * (param.max - param.min)] {
                let pi = mix(rule, &p, &q, value).pi_mixed;
                let what = format!("case {case}, {rule} = {value:.3}");
                let seed = 7 * case + 3;
                assert_follows(&simulate(&pi, &q, seed, true), &pi, &format!("{what}, same seed"));
                assert_follows(&simulate(&pi, &q, seed, false), &pi, &format!("{what}, max acceptance"));
                assert_follows(&simulate_node(&pi, &q, seed), &pi, &format!("{what}, tree node"));
            }
        }
    }
}
