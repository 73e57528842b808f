//! The max-acceptance rule at a tree node (recursive rejection sampling): candidates drawn from q
//! without replacement, checked in order, emit exactly π; tested statistically (many seeded
//! draws against the exact distribution) and on its edge cases.

use mentor_lab::lookup::point_mass;
use mentor_lab::mentor::{
    mix_tv, take_probabilities, tv_distance, verify_candidates, verify_token, RecursiveRejection,
};
use mentor_lab::sampling::{draft_uniform, sample_index, sample_without_replacement, uniform, uniform_nth, Purpose};

#[path = "common/stats.rs"]
mod stats;
use stats::{chi2, chi2_crit, random_dist};

const N_DRAWS: u64 = 200_000;

/// The uniforms a run uses at draw `i`: the candidates' draws, and the node's accept tests.
fn draws(seed: u64, i: u64) -> (impl Fn(usize) -> f64, impl Fn(usize) -> f64) {
    let draw = move |j: usize| match j {
        0 => draft_uniform(seed, i, 0),
        j => uniform_nth(seed, i, j as u32, Purpose::DraftRunnerUp),
    };
    let accept = move |j: usize| match j {
        0 => uniform(seed, i, Purpose::AcceptTest),
        j => uniform_nth(seed, i, j as u32, Purpose::AcceptRunnerUp),
    };
    (draw, accept)
}

/// Run one node N times: `width` candidates drawn from q without replacement (then `copy`, a
/// point mass, if given), checked against π. Returns the emitted tokens' counts and how often a
/// candidate was taken.
fn simulate(pi: &[f32], q: &[f32], width: usize, copy: Option<u32>, seed: u64) -> (Vec<u64>, u64) {
    let mut counts = vec![0u64; q.len()];
    let mut taken = 0;
    for i in 0..N_DRAWS {
        let (draw, accept) = draws(seed, i);
        let mut candidates: Vec<(u32, bool)> =
            sample_without_replacement(q, draw, width).into_iter().map(|x| (x as u32, false)).collect();
        candidates.extend(copy.map(|c| (c, true)));
        let v = verify_candidates(pi, q, &candidates, accept, uniform(seed, i, Purpose::Residual));
        counts[v.token as usize] += 1;
        taken += u64::from(v.taken.is_some());
    }
    (counts, taken)
}

/// The exact probability that a node takes one of `width` candidates: every ordered draw of
/// them, weighted by its probability, times the chance the rule takes one of them.
fn exact_acceptance(pi: &[f32], q: &[f32], width: usize) -> f64 {
    fn walk(pi: &[f32], q: &[f32], drawn: &mut Vec<u32>, p_drawn: f64, width: usize) -> f64 {
        let left: f64 = 1.0 - drawn.iter().map(|&x| q[x as usize] as f64).sum::<f64>();
        if drawn.len() == width || left <= 1e-12 {
            return p_drawn * take_probabilities(pi, q, drawn).iter().sum::<f64>();
        }
        let mut total = 0.0;
        for x in 0..q.len() as u32 {
            if drawn.contains(&x) || q[x as usize] <= 0.0 {
                continue;
            }
            drawn.push(x);
            total += walk(pi, q, drawn, p_drawn * q[x as usize] as f64 / left, width);
            drawn.pop();
        }
        total
    }
    walk(pi, q, &mut Vec::new(), 1.0, width)
}

/// A draw without replacement: the first token follows q, the second q without the first; every
/// token at most once, none of zero probability, and fewer once q is used up.
#[test]
fn candidates_are_drawn_without_replacement() {
    let n = 5;
    let mut q = random_dist(n, 11);
    q[3] = 0.0;
    let s: f32 = q.iter().sum();
    q.iter_mut().for_each(|x| *x /= s);
    let mut pairs = vec![0u64; n * n];
    for i in 0..N_DRAWS {
        let (draw, _) = draws(5, i);
        let c = sample_without_replacement(&q, draw, 2);
        assert!(c.len() == 2 && c[0] != c[1] && q[c[0]] > 0.0 && q[c[1]] > 0.0, "{c:?}");
        pairs[c[0] * n + c[1]] += 1;
    }
    let expected: Vec<f32> = (0..n * n)
        .map(|k| {
            let (a, b) = (k / n, k % n);
            match a == b {
                true => 0.0,
                false => q[a] * q[b] / (1.0 - q[a]),
            }
        })
        .collect();
    let df = expected.iter().filter(|&&e| e > 0.0).count() - 1;
    let stat = chi2(&pairs, &expected, N_DRAWS);
    assert_eq!(df, 11, "four tokens with mass: twelve ordered pairs");
    assert!(stat < chi2_crit(df), "ordered pairs: chi2 {stat:.1}");
    // Asked for every token: the four with mass, each once.
    let (draw, _) = draws(6, 0);
    let mut all = sample_without_replacement(&q, draw, 9);
    all.sort();
    assert_eq!(all, vec![0, 1, 2, 4]);
    // A one-hot q has nothing after its token; an empty draw stays empty.
    let (draw, _) = draws(6, 1);
    assert_eq!(sample_without_replacement(&point_mass(2, n), draw, 3), vec![2]);
    let (draw, _) = draws(6, 2);
    assert!(sample_without_replacement(&q, draw, 0).is_empty());
}

/// Whatever the width, the budget or a copied token after the draws, the emitted token follows
/// π, and a node takes one of its candidates exactly as often as the rule says: 1 − TV(π, q)
/// with one candidate (the chain's acceptance), more with each further one.
#[test]
fn recursive_rejection_emits_pi_and_accepts_more_with_width() {
    let n = 6;
    for case in 0..3u64 {
        let p = random_dist(n, 400 + case);
        let q = random_dist(n, 500 + case);
        let d = tv_distance(&p, &q);
        assert!(d > 0.1, "case {case}: p and q should differ (d = {d})");
        for budget in [0.0, 0.3] {
            let pi = mix_tv(&p, &q, budget).pi_mixed;
            let mut last = 0.0;
            for width in 1..=3 {
                let (counts, taken) = simulate(&pi, &q, width, None, 90 + case);
                let stat = chi2(&counts, &pi, N_DRAWS);
                assert!(stat < chi2_crit(n - 1), "case {case} D={budget} width {width}: chi2 {stat:.1} vs π");
                let expected = exact_acceptance(&pi, &q, width);
                let rate = taken as f64 / N_DRAWS as f64;
                let sigma = (expected * (1.0 - expected) / N_DRAWS as f64).sqrt();
                assert!(
                    (rate - expected).abs() < 5.0 * sigma,
                    "case {case} D={budget} width {width}: {rate} vs {expected}"
                );
                if width == 1 {
                    assert!((expected - (1.0 - tv_distance(&pi, &q))).abs() < 1e-6, "one candidate: the chain's");
                } else {
                    assert!(expected > last + 1e-3, "case {case} D={budget}: width {width} takes no more than {last}");
                }
                last = expected;
            }
            if budget == 0.0 {
                assert!(chi2(&simulate(&pi, &q, 3, None, 7).0, &q, N_DRAWS) > 1000.0, "the output is not q's");
            }
            // A copied token checked after the draws, as a point mass: still π.
            let copy = (0..n as u32).max_by(|&a, &b| p[a as usize].total_cmp(&p[b as usize]));
            let (counts, _) = simulate(&pi, &q, 2, copy, 60 + case);
            let stat = chi2(&counts, &pi, N_DRAWS);
            assert!(stat < chi2_crit(n - 1), "case {case} D={budget} with a copy: chi2 {stat:.1} vs π");
        }
    }
}

/// With one candidate the recursion is the one-step rule, to the bit: same verdict, same token,
/// same acceptance probability, for any uniforms (so `verify_candidates` may take the one-step
/// rule for a chain's one candidate).
#[test]
fn one_candidate_is_the_one_step_rule() {
    // The recursion's steps for one candidate, as `verify_candidates` takes them for several.
    let recursion = |pi: &[f32], q: &[f32], x: u32, point_mass: bool, ua: f64, ur: f64| {
        let mut rule = RecursiveRejection::new(pi, q);
        let a = rule.accept_prob(x, point_mass);
        if ua < a {
            return (true, x, a);
        }
        rule.reject(x, point_mass);
        (false, sample_index(rule.residual(), ur) as u32, a)
    };
    for case in 0..50u64 {
        let p = random_dist(7, 700 + case);
        let q = random_dist(7, 800 + case);
        let pi = mix_tv(&p, &q, [0.0, 0.2, 0.5][case as usize % 3]).pi_mixed;
        let x = (case % 7) as u32;
        let (ua, ur) = (uniform(case, 1, Purpose::AcceptTest), uniform(case, 1, Purpose::Residual));
        let one = verify_token(&pi, &q, x, ua, ur);
        let (taken, token, a) = recursion(&pi, &q, x, false, ua, ur);
        assert_eq!((taken, token), (one.accepted, one.token), "case {case}");
        assert_eq!(a.to_bits(), one.accept_prob.to_bits(), "case {case}");
        let node = verify_candidates(&pi, &q, &[(x, false)], |_| ua, ur);
        assert_eq!((node.taken.is_some(), node.token), (one.accepted, one.token), "case {case}");
        // A copied token (q a point mass) the same way, as a copy or as a draw.
        let copy = point_mass(x, 7);
        let one = verify_token(&p, &copy, x, ua, ur);
        for point_mass in [false, true] {
            let (taken, token, _) = recursion(&p, &copy, x, point_mass, ua, ur);
            assert_eq!((taken, token), (one.accepted, one.token), "copy, case {case}");
        }
        let node = verify_candidates(&p, &copy, &[(x, true)], |_| ua, ur);
        assert_eq!((node.taken.is_some(), node.token), (one.accepted, one.token), "copy, case {case}");
    }
}

/// D = 1 takes the first draw always; so does d = 0; a one-hot (temperature 0) target takes its
/// token exactly when it is among the draws, and otherwise emits it anyway; a node whose draws
/// cover every token of q always takes one.
#[test]
fn edge_cases_full_budget_equal_distributions_greedy_target_and_every_token_drawn() {
    let p = random_dist(5, 31);
    let q = random_dist(5, 32);
    let always = |pi: &[f32], q: &[f32], width: usize| {
        let (counts, taken) = simulate(pi, q, width, None, 3);
        (counts, taken == N_DRAWS)
    };
    // D = 1: π = q, the first draw is accepted with probability 1.
    let pi = mix_tv(&p, &q, 1.0).pi_mixed;
    assert_eq!(pi, q);
    assert_eq!(take_probabilities(&pi, &q, &[0, 1, 2]), vec![1.0, 0.0, 0.0]);
    assert!(always(&pi, &q, 3).1);
    // d = 0: the same.
    assert!(always(&p, &p, 2).1);
    // Every token of q drawn: one is always taken, and the output is still π.
    let pi = mix_tv(&p, &q, 0.0).pi_mixed;
    let (counts, every) = always(&pi, &q, 5);
    assert!(every, "five draws of five tokens: the residual is never needed");
    assert!(chi2(&counts, &pi, N_DRAWS) < chi2_crit(4));
    // A one-hot target: its token is taken iff drawn; when not, the residual is that token.
    let greedy = point_mass(3, 5);
    for i in 0..2000u64 {
        let (draw, accept) = draws(77, i);
        let drawn: Vec<(u32, bool)> =
            sample_without_replacement(&q, draw, 2).into_iter().map(|x| (x as u32, false)).collect();
        let v = verify_candidates(&greedy, &q, &drawn, accept, uniform(77, i, Purpose::Residual));
        assert_eq!(v.token, 3);
        assert_eq!(v.taken, drawn.iter().position(|&(x, _)| x == 3), "draw {i}: {drawn:?}");
    }
    // A one-hot draft that disagrees with a one-hot target: nothing is taken, the target's token
    // is emitted.
    let v = verify_candidates(&greedy, &point_mass(1, 5), &[(1, false)], |_| 0.0, 0.5);
    assert_eq!((v.taken, v.token, v.accept_prob), (None, 3, 0.0));
}
