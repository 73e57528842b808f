//! The adaptive policy's decisions on given costs and acceptance.

use super::acceptance::{q_class, LOOKUP_PRIOR, Q_CLASS_PRIOR};
use super::costs::{Recent, RECENT};
use super::schedule::{LOOKUP_PROBE_EVERY, RETIME_EVERY};
use super::*;

/// A policy that has seen target steps of 10 ms, verifies of n tokens costing `verify(n)`,
/// draft steps of `t_draft` and per-token acceptance ~`alpha`.
fn trained(alpha: f64, t_draft: f64, verify: impl Fn(usize) -> f64) -> AdaptivePolicy {
    let mut p = AdaptivePolicy::default();
    for n in 1..=MAX_DRAFT_LEN + 1 {
        p.costs.t_verify[n].push(verify(n));
    }
    p.costs.t_draft.push(t_draft);
    p.accept.alpha = alpha;
    p.costs.n_observed = 1;
    p
}

#[test]
fn speculates_when_verification_is_cheap_and_acceptance_high() {
    // GPU-like: verifying 17 tokens costs little more than one step.
    let mut p = trained(0.9, 0.001, |n| 0.010 + 0.0002 * n as f64);
    assert!(p.next_len(MAX_DRAFT_LEN) >= 8);
    assert_eq!(p.next_len(3), 3, "the cap holds");
}

#[test]
fn steps_alone_near_break_even_and_probes_now_and_then() {
    // The default pair on a CPU at TV 0: verify(2) = 1.39 steps, α = 0.5, draft 1.2 ms.
    let verify = |n: usize| 0.010 * (1.0 + 0.39 * (n as f64 - 1.0));
    let mut p = trained(0.5, 0.0012, verify);
    assert!(p.expected_rate(1).unwrap() < MIN_GAIN * p.expected_rate(0).unwrap());
    // Every probe rejected at its first token: probes after 8, then 16, 32, 64, 64 … target steps.
    let mut choices = Vec::new();
    for _ in 0..8 + 16 + 32 + 64 + 64 {
        let k = p.next_len(MAX_DRAFT_LEN);
        choices.push(k);
        p.observe(k, 0, Some(0.0012), verify(k + 1));
        p.accept.alpha = 0.5;
    }
    let probes: Vec<usize> = choices.iter().enumerate().filter(|&(_, &k)| k == PROBE_LEN).map(|(i, _)| i).collect();
    assert_eq!(probes, vec![7, 8 + 15, 8 + 16 + 31, 8 + 16 + 32 + 63, 8 + 16 + 32 + 64 + 63], "{choices:?}");
    assert!(choices.iter().all(|&k| k == 0 || k == PROBE_LEN), "{choices:?}");
    // A round that makes drafting pay resets the wait.
    p.accept.alpha = 0.95;
    assert!(p.next_len(MAX_DRAFT_LEN) > 0);
    p.accept.alpha = 0.5;
    let again: Vec<usize> = (0..8).map(|_| p.next_len(MAX_DRAFT_LEN)).collect();
    assert_eq!(again[7], PROBE_LEN, "{again:?}");
}

#[test]
fn accepted_probes_keep_the_wait() {
    let verify = |n: usize| 0.010 * (1.0 + 0.39 * (n as f64 - 1.0));
    let mut p = trained(0.5, 0.0012, verify);
    let mut probes = Vec::new();
    for i in 0..64 {
        let k = p.next_len(MAX_DRAFT_LEN);
        if k > 0 {
            probes.push(i);
        }
        // Accepted, but α is held where target steps stay the better choice.
        p.observe(k, k, Some(0.0012), verify(k + 1));
        p.accept.alpha = 0.5;
    }
    assert_eq!(probes, vec![7, 15, 23, 31, 39, 47, 55, 63]);
    // A copy-only round during the wait does not double it.
    for _ in 0..7 {
        assert_eq!(p.next_len(MAX_DRAFT_LEN), 0);
    }
    assert_eq!(p.next_len(MAX_DRAFT_LEN), PROBE_LEN);
    p.observe_verify(3, verify(4));
    let next: Vec<usize> = (0..8).map(|_| p.next_len(MAX_DRAFT_LEN)).collect();
    assert_eq!(next[7], PROBE_LEN, "{next:?}");
}

#[test]
fn a_drafting_streak_stops_only_below_break_even() {
    // Target steps of 10 ms, verify(2) 13 ms, draft 2 ms: k = 1 gains (1 + α) / 1.5.
    let verify = |n: usize| 0.010 + 0.003 * (n as f64 - 1.0);
    let gain = |p: &AdaptivePolicy| p.expected_rate(1).unwrap() / p.expected_rate(0).unwrap();
    // Stepping at α = 0.55 (a gain of 1.03): it takes target steps.
    let mut p = trained(0.55, 0.002, verify);
    assert!(gain(&p) > STAY_GAIN && gain(&p) < MIN_GAIN);
    assert_eq!(p.next_len(1), 0);
    // At α = 0.8 it drafts; back at 0.55 it goes on, and stops below break-even.
    p.accept.alpha = 0.8;
    assert_eq!(p.next_len(1), 1);
    p.accept.alpha = 0.55;
    assert_eq!(p.next_len(1), 1, "inside the band a streak goes on");
    p.accept.alpha = 0.45;
    assert!(gain(&p) < STAY_GAIN);
    assert_eq!(p.next_len(1), 0);
    p.accept.alpha = 0.55;
    assert_eq!(p.next_len(1), 0, "and inside the band it does not restart");
}

#[test]
fn observations_move_the_estimates() {
    let mut p = AdaptivePolicy::default();
    assert_eq!(p.next_len(8), PROBE_LEN, "explores before anything is timed");
    // The first round's (cold) timings are left out, its acceptance is not.
    p.observe(2, 0, Some(0.005), 0.025);
    assert!(p.alpha() < 0.7 && p.costs.verify(3).is_none() && p.costs.t_draft.median().is_none());
    assert_eq!(p.next_len(8), PROBE_LEN, "still explores");
    p.accept.alpha = 0.7;
    p.observe(2, 2, Some(0.001), 0.013);
    p.observe(0, 0, None, 0.010);
    assert!(p.alpha() > 0.7, "two of two accepted raise α");
    p.observe(4, 0, Some(0.001), 0.02);
    assert!(p.alpha() < 0.75, "a rejection at the first token lowers it");
    assert_eq!(p.costs.verify(5), Some(0.02));
    assert!((p.costs.verify(4).unwrap() - (0.013 + (0.02 - 0.013) / 2.0)).abs() < 1e-12, "interpolated");
    // Beyond the largest size: the slope between the two largest (1 → 3 → 5 → 7 tokens).
    assert!((p.costs.verify(7).unwrap() - (0.02 + (0.02 - 0.013) / 2.0 * 2.0)).abs() < 1e-12, "extrapolated");
    let mut q = AdaptivePolicy::default();
    q.observe(1, 1, Some(0.001), 0.012);
    q.observe(1, 1, Some(0.001), 0.012);
    assert!((q.costs.verify(4).unwrap() - 0.024).abs() < 1e-12, "one size: proportional");
}

#[test]
fn one_stall_does_not_decide_the_rest_of_a_run() {
    // Target steps of 10 ms are the better choice; then one step stalls for 110 ms.
    let mut p = trained(0.5, 0.0012, |n| 0.010 * (1.0 + 0.39 * (n as f64 - 1.0)));
    p.observe(0, 0, None, 0.010);
    p.observe(0, 0, None, 0.010);
    assert_eq!(p.next_len(MAX_DRAFT_LEN), 0);
    p.observe(0, 0, None, 0.110);
    assert_eq!(p.next_len(MAX_DRAFT_LEN), 0, "a stall is not the step's cost");
    // A real change of cost moves the estimate once it is the majority of the recent steps.
    for _ in 0..2 {
        p.observe(0, 0, None, 0.030);
    }
    assert!(p.next_len(MAX_DRAFT_LEN) > 0, "steps of 30 ms make drafting pay");
}

/// Draft lengths chosen over `rounds` rounds when every round costs what `verify` says and
/// acceptance stays at `alpha`.
fn choices(alpha: f64, verify: impl Fn(usize) -> f64, rounds: usize) -> Vec<usize> {
    let mut p = trained(alpha, 0.0005, &verify);
    (0..rounds)
        .map(|_| {
            let k = p.next_len(MAX_DRAFT_LEN);
            p.observe(k, k / 2, draft_token_s(k, 0.0005 * k as f64, 1, 0.0005), verify(k + 1));
            p.accept.alpha = alpha;
            k
        })
        .collect()
}

#[test]
fn a_drafting_streak_times_the_target_step_again_when_the_gain_is_small() {
    // Drafting one token promises ~1.15x: a target step is timed again every 24 rounds.
    let small = choices(0.55, |n| 0.010 * (1.0 + 0.3 * (n as f64 - 1.0)), 60);
    let steps: Vec<usize> = small.iter().enumerate().filter(|&(_, &k)| k == 0).map(|(i, _)| i).collect();
    assert_eq!(steps, vec![RETIME_EVERY, 2 * RETIME_EVERY + 1], "{small:?}");
    // GPU-like costs promise far more: no round is given up.
    let large = choices(0.9, |n| 0.010 + 0.0002 * n as f64, 60);
    assert!(large.iter().all(|&k| k >= 8), "{large:?}");
}

#[test]
fn acceptance_follows_tokens_not_rounds() {
    // k = 1 rounds at a true acceptance of 0.55: 11 of every 20 accepted, in a fixed order.
    let outcomes = [1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0];
    let mut p = AdaptivePolicy::default();
    let mut seen = Vec::new();
    for r in 0..200 {
        p.observe(1, outcomes[r % 20], Some(0.001), 0.011);
        if r >= 40 {
            seen.push(p.alpha());
        }
    }
    let (lo, hi) = seen.iter().fold((1.0f64, 0.0f64), |(lo, hi), &a| (lo.min(a), hi.max(a)));
    // Weighing each round's outcome by 0.25 swung it between 0.40 and 0.71.
    assert!(lo > 0.45 && hi < 0.65, "α between {lo} and {hi}");
}

#[test]
fn catching_up_after_target_steps_is_not_a_drafting_cost() {
    // A routine round: its time over its tokens.
    assert_eq!(draft_token_s(2, 0.002, 1, 0.001), Some(0.001));
    assert_eq!(draft_token_s(3, 0.003, 2, 0.0012), Some(0.001));
    // A probe after 16 target steps: the 16-token catch-up left out, the later step counted.
    assert_eq!(draft_token_s(2, 0.0051, 16, 0.0041), Some(0.0051 - 0.0041));
    assert_eq!(draft_token_s(1, 0.004, 9, 0.0035), None, "no later step to time");
    assert_eq!(draft_token_s(0, 0.0, 0, 0.0), None);
    // Kept as drafting cost, such probes made drafting look too dear for a policy that would
    // otherwise draft (α = 0.55, steps 9.3 ms, verifies of 2 and 3 rows 11.2 and 12.5 ms: k = 2
    // promises 1.20x with drafts of 0.9 ms, under 1.05x with 2.55 ms).
    let verify = |n: usize| [0.0, 0.0093, 0.0112, 0.0125, 0.0142][n.min(4)];
    assert!(trained(0.55, 0.0009, verify).next_len(MAX_DRAFT_LEN) > 0);
    let mut p = trained(0.55, 0.0009, verify);
    for _ in 0..RECENT {
        p.costs.t_draft.push(0.0051 / 2.0); // the probe's whole draft time over its 2 tokens
    }
    assert_eq!(p.next_len(MAX_DRAFT_LEN), 0, "the catch-up, counted as drafting, stops it");
}

#[test]
fn drafts_longer_when_extra_rows_are_cheap_and_acceptance_high() {
    // As measured on `code`: steps of 7.1 ms, 3-token verifies of 8.8 ms, drafts of 0.8 ms,
    // 83% acceptance, and nothing larger tried yet.
    let mut p = AdaptivePolicy::default();
    p.costs.t_verify[1].push(0.0071);
    p.costs.t_verify[3].push(0.0088);
    p.costs.t_draft.push(0.0008);
    p.accept.alpha = 0.83;
    assert!(p.next_len(MAX_DRAFT_LEN) > 2, "tries beyond the sizes it has seen");
}

/// Costs as measured on `code` (2 threads): steps of 11.7 ms, each more verified row ~1.6 ms,
/// draft steps of 1.5 ms.
fn code_costs(alpha: f64) -> AdaptivePolicy {
    trained(alpha, 0.0015, |n| 0.0117 + 0.0016 * (n - 1) as f64)
}

#[test]
fn copies_from_the_context_when_its_acceptance_pays() {
    // Copies after 4-token matches accepted ~86% of the time, the draft model ~45%: copy,
    // at a length that uses the acceptance, but not all 16 offered.
    let mut p = code_costs(0.45);
    for _ in 0..30 {
        p.observe_lookup(4, 4, 4, 0.018);
    }
    assert!(p.alpha_lookup(4) > 0.9);
    let k = p.lookup_len(16, 4);
    assert!((3..=16).contains(&k), "copy length {k}");
    assert_eq!(p.lookup_len(2, 4), 2, "no more than offered");
    assert_eq!(p.lookup_len(0, 4), 0);
    // After 3-token matches copies have failed: their estimate is apart, and the draft model
    // (whose drafting costs show) is preferred.
    for _ in 0..30 {
        p.observe_lookup(3, 2, 0, 0.0133);
    }
    assert!(p.alpha_lookup(3) < 0.1 && p.alpha_lookup(4) > 0.9);
    assert_eq!(p.lookup_len(16, 3), 0);
}

#[test]
fn declined_copies_are_probed_now_and_then() {
    let mut p = code_costs(0.6);
    for _ in 0..30 {
        p.observe_lookup(3, 1, 0, 0.0133);
    }
    let choices: Vec<usize> = (0..2 * LOOKUP_PROBE_EVERY).map(|_| p.lookup_len(8, 3)).collect();
    // One 1-token probe every LOOKUP_PROBE_EVERY declined copies, nothing else.
    assert_eq!(choices.iter().filter(|&&k| k == 1).count(), 2, "{choices:?}");
    assert!(choices.iter().all(|&k| k <= 1));
    // A copy that is accepted again brings copying back.
    for _ in 0..30 {
        p.observe_lookup(3, 3, 3, 0.016);
    }
    assert!(p.lookup_len(8, 3) >= 2);
}

#[test]
fn a_copy_is_made_to_measure_before_costs_are_known() {
    let mut p = AdaptivePolicy::default();
    assert_eq!(p.lookup_len(16, 4), PROBE_LEN);
    assert_eq!(p.lookup_len(1, 4), 1);
}

#[test]
fn copy_rounds_do_not_touch_the_draft_models_estimates() {
    let mut p = code_costs(0.45);
    let before = (p.alpha(), p.costs.t_draft.median());
    p.observe_lookup(4, 5, 5, 0.02);
    assert_eq!((p.alpha(), p.costs.t_draft.median()), before);
    assert!(p.alpha_lookup(4) > LOOKUP_PRIOR[crate::lookup::match_class(4)]);
    // Their verify time is a verify time like any other.
    assert_eq!(p.costs.t_verify[6].len, 2);
}

#[test]
fn a_round_drafts_on_while_the_drafted_prefix_is_likely_to_survive() {
    let p = code_costs(0.55);
    let at = p.depth_thresholds();
    // One more token adds p_prefix · α tokens for a draft step and a verify row (3.1 ms),
    // against a best rate of 104.7 tokens/s (k = 1): worth it from p_prefix = 0.590 on, at
    // every depth (each row costs the same here).
    for (n, &threshold) in at.iter().enumerate().skip(1) {
        assert!((threshold - 0.0031 * 1.55 / 0.0148 / 0.55).abs() < 1e-9, "depth {n}: {threshold}");
    }
    // After a token the draft was sure of the round goes on, after a doubtful one it ends;
    // six sure tokens in a row end it too (0.9⁶ = 0.53).
    let sure = p.accept_estimate(0.99);
    assert!(sure >= at[1] && p.accept_estimate(0.1) < at[1]);
    assert!(sure.powi(6) < at[6]);
    // A noisy median that makes one size look as cheap as the one below does not make the
    // next row free: it costs the average row.
    let mut noisy = code_costs(0.55);
    let three = noisy.costs.verify(3).unwrap_or(0.0);
    noisy.costs.t_verify[4] = Recent::default();
    noisy.costs.t_verify[4].push(three);
    let avg = (noisy.costs.verify(4).unwrap_or(0.0) - noisy.costs.verify(1).unwrap_or(0.0)) / 3.0;
    assert!((avg - 0.0032 / 3.0).abs() < 1e-12);
    // After 2 tokens the 4th row looks free: 0.29 without the floor, 0.49 with it.
    assert!(noisy.depth_thresholds()[2] > 0.4, "{}", noisy.depth_thresholds()[2]);
    // Cheaper verify rows make a doubtful prefix worth extending.
    let cheap = trained(0.55, 0.0015, |n| 0.0117 + 0.0004 * (n - 1) as f64).depth_thresholds();
    assert!(cheap[1] < 0.45, "{}", cheap[1]);
}

#[test]
fn a_drafted_round_goes_on_by_copying_while_that_pays() {
    let mut p = code_costs(0.55);
    // Copies after 10+ token matches (prior 0.9) cost a verify row each (1.6 ms) against a
    // best rate of 104.7 tokens/s: one more is worth it while p_prefix · 0.9 ≥ 0.1675, so
    // after one sure drafted token (0.9) the copy runs until 0.9^17 < 0.1675: 15 tokens, which
    // also fills the round to MAX_DRAFT_LEN.
    assert_eq!(p.copy_tail_len(0.9, 1, 12, 16), MAX_DRAFT_LEN - 1);
    assert_eq!(p.copy_tail_len(0.9, 1, 12, 3), 3, "no more than offered");
    assert_eq!(p.copy_tail_len(0.9, MAX_DRAFT_LEN, 12, 8), 0, "the round is full");
    assert_eq!(p.copy_tail_len(0.5, 1, 12, 16), 10, "0.5 · 0.9^11 < 0.1675");
    // A doubtful prefix is not worth a row, however good the copy.
    assert_eq!(p.copy_tail_len(0.15, 1, 12, 16), 0);
    // Copies after 3-token matches that keep failing lose to the draft model's next token.
    for _ in 0..30 {
        p.observe_copies(3, 2, 0);
    }
    assert!(p.alpha_lookup(3) < 0.05);
    assert_eq!(p.copy_tail_len(0.9, 1, 3, 16), 0);
    // Only the copies' estimate moved.
    assert_eq!((p.alpha(), p.costs.t_draft.median()), (0.55, Some(0.0015)));
    assert_eq!(p.alpha_lookup(12), LOOKUP_PRIOR[3]);
    // Before the costs are known nothing is appended.
    assert_eq!(AdaptivePolicy::default().copy_tail_len(0.9, 1, 12, 16), 0);
}

#[test]
fn before_costs_are_known_a_round_drafts_the_probe_length() {
    let at = AdaptivePolicy::default().depth_thresholds();
    assert!(at[1..PROBE_LEN].iter().all(|&t| t == 0.0), "{at:?}");
    assert!(at[PROBE_LEN..].iter().all(|&t| t > 1.0), "{at:?}");
}

#[test]
fn acceptance_is_estimated_per_class_of_the_draft_probability() {
    assert_eq!([0.0, 0.19, 0.2, 0.5, 0.969, 0.97, 1.0].map(q_class), [0, 0, 1, 2, 5, 6, 6]);
    let mut p = AdaptivePolicy::default();
    for _ in 0..100 {
        p.observe_drafted(0.99, 1.0);
        p.observe_drafted(0.1, 0.0);
    }
    assert!(p.accept_estimate(0.98) > 0.99);
    assert!(p.accept_estimate(0.05) < 0.01);
    assert_eq!(p.accept_estimate(0.5), Q_CLASS_PRIOR[2], "other classes keep their prior");
}

/// Given costs replace the measured ones: two policies that see the same acceptance but
/// very different timings make the same choices, and they draft from the first round.
#[test]
fn fixed_costs_make_the_choices_independent_of_timings() {
    let costs = FixedCosts::default_pair(0.01);
    let (mut a, mut b) = (AdaptivePolicy::with_costs(Some(costs)), AdaptivePolicy::with_costs(Some(costs)));
    assert!(a.depth_thresholds()[1].is_finite() && a.depth_thresholds()[1] > 0.0);
    for i in 0..40 {
        let (k, acc) = (1 + i % 6, i % 4);
        a.observe(k, acc.min(k), Some(0.001), 0.012);
        b.observe(k, acc.min(k), Some(0.05), 0.3);
        assert_eq!(a.next_len(MAX_DRAFT_LEN), b.next_len(MAX_DRAFT_LEN), "round {i}");
        assert_eq!(a.depth_thresholds(), b.depth_thresholds(), "round {i}");
        assert_eq!(a.lookup_len(8, 6), b.lookup_len(8, 6), "round {i}");
    }
    // Measured, the same timings would have changed the choices.
    let (mut c, mut d) = (AdaptivePolicy::default(), AdaptivePolicy::default());
    for i in 0..40 {
        let (k, acc) = (1 + i % 6, i % 4);
        c.observe(k, acc.min(k), Some(0.001), 0.012);
        d.observe(k, acc.min(k), Some(0.05), 0.3);
    }
    assert_ne!(c.depth_thresholds(), d.depth_thresholds());
}
