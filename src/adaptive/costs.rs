//! The cost model: what a draft step and a verify round over n rows cost, measured or given.
//!
//! Timings are medians of the last few of their kind, and a run's first round is left out (it can
//! find the caches cold: once measured on `code` at 9.6 ms to draft 2 tokens and 25 ms to verify
//! them, against ~2 and ~12.5 ms later; kept, it made drafting look 2x dearer than it was).

use super::MAX_DRAFT_LEN;

/// Timings are estimated by the median of the last this many of their kind. A running average
/// lets one stall decide the rest of a run: a single descheduled step many times the usual length
/// inflates the step's estimate, drafting then wins every round, and the step is never timed again.
pub(super) const RECENT: usize = 5;

/// Tokens a draft catches up on at the start of a round that follows another drafting round: the
/// last round's correction and, after a fully accepted one, its bonus token.
const ROUTINE_CATCH_UP: usize = 2;

/// Seconds per drafted token of a round that proposed `n_proposed` tokens in `draft_s`, whose
/// first draft forward fed `caught_up` tokens in `catch_up_s`. After drafting rounds that forward
/// feeds one or two tokens and costs about a step: the round's time over its tokens. After
/// target-only steps it feeds all of them (9 and 16 for probes on `code`: 3.1 and 5.1 ms for 2
/// tokens, against ~2 ms otherwise): that is the price of switching, not of drafting, and counted as
/// drafting it kept the policy from drafting. Then only the later steps count (each gives one
/// token), and a round with none gives no timing.
pub fn draft_token_s(n_proposed: usize, draft_s: f64, caught_up: usize, catch_up_s: f64) -> Option<f64> {
    match n_proposed {
        0 => None,
        n if caught_up <= ROUTINE_CATCH_UP => Some(draft_s / n as f64),
        1 => None,
        n => Some((draft_s - catch_up_s).max(0.0) / (n - 1) as f64),
    }
}

/// The last `RECENT` timings of one kind.
#[derive(Debug, Clone, Default)]
pub(super) struct Recent {
    vals: [f64; RECENT],
    pub(super) len: usize,
    next: usize,
}

impl Recent {
    pub(super) fn push(&mut self, v: f64) {
        self.vals[self.next] = v;
        self.next = (self.next + 1) % RECENT;
        self.len = (self.len + 1).min(RECENT);
    }

    /// Median of what was pushed (the mean of the middle two for an even count); None if nothing.
    pub(super) fn median(&self) -> Option<f64> {
        let mut v = self.vals[..self.len].to_vec();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => None,
            n if n % 2 == 1 => Some(v[n / 2]),
            n => Some(0.5 * (v[n / 2 - 1] + v[n / 2])),
        }
    }
}

/// Costs given instead of measured: seconds per drafted token, and a verify round over n rows
/// costing `verify_base_s + n · verify_row_s`. With them the policy's choices depend only on the
/// text and the seed, not on the machine's load (deterministic tests).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FixedCosts {
    pub draft_token_s: f64,
    pub verify_base_s: f64,
    pub verify_row_s: f64,
}

impl FixedCosts {
    /// The default pair's costs relative to a target step of `step_s`: a draft step at 0.1 of it,
    /// each extra verify row at 0.19 (docs/performance.md).
    pub fn default_pair(step_s: f64) -> FixedCosts {
        FixedCosts { draft_token_s: 0.1 * step_s, verify_base_s: 0.81 * step_s, verify_row_s: 0.19 * step_s }
    }
}

/// Seconds per drafted token and per verify round of n rows: given ([`FixedCosts`]) or measured.
#[derive(Debug, Clone)]
pub(super) struct CostModel {
    /// Costs given instead of measured.
    pub(super) fixed: Option<FixedCosts>,
    /// Seconds per draft token.
    pub(super) t_draft: Recent,
    /// Seconds per round that verifies n tokens (the forward, and the acceptance walk with its
    /// sampling), index n (0 unused).
    pub(super) t_verify: Vec<Recent>,
    /// Rounds observed so far (the first one's timings are not used).
    pub(super) n_observed: usize,
}

impl CostModel {
    pub(super) fn new(fixed: Option<FixedCosts>) -> Self {
        CostModel {
            fixed,
            t_draft: Recent::default(),
            t_verify: vec![Recent::default(); MAX_DRAFT_LEN + 2],
            n_observed: 0,
        }
    }

    /// Record a round that verified `n_rows` rows in `verify_s` seconds and drafted at
    /// `draft_token_s` seconds per token (None: no draft timing). The first round's timings are
    /// dropped.
    pub(super) fn record(&mut self, n_rows: usize, verify_s: f64, draft_token_s: Option<f64>) {
        let warm = self.n_observed > 0;
        self.n_observed += 1;
        if !warm {
            return;
        }
        if let Some(times) = self.t_verify.get_mut(n_rows) {
            times.push(verify_s);
        }
        if let Some(t) = draft_token_s {
            self.t_draft.push(t);
        }
    }

    /// Seconds per drafted token: given, or the median of the recent measurements.
    pub(super) fn draft(&self) -> Option<f64> {
        self.fixed.map(|c| c.draft_token_s).or_else(|| self.t_draft.median())
    }

    /// Expected cost of a verify forward over n tokens: measured if seen, else interpolated
    /// linearly from the nearest measured sizes. Past the largest measured size it goes on with the
    /// slope between the two largest (each more row costs about the same; proportional to n where
    /// only one size is known). Proportional extrapolation made larger drafts look far too dear:
    /// with verify(1) = 7.1 ms and verify(3) = 8.8 ms it put verify(5) at 14.7 ms against ~10.5 ms
    /// measured, and the policy never drafted more than 2 tokens on `code` at 83% acceptance.
    pub(super) fn verify(&self, n: usize) -> Option<f64> {
        if let Some(c) = self.fixed {
            return Some(c.verify_base_s + c.verify_row_s * n as f64);
        }
        let measured = |i: usize| self.t_verify.get(i).and_then(Recent::median);
        if let Some(t) = measured(n) {
            return Some(t);
        }
        let measured_below = |n: usize| (1..n).rev().find_map(|i| measured(i).map(|t| (i, t)));
        let below = measured_below(n);
        let above = (n + 1..self.t_verify.len()).find_map(|i| measured(i).map(|t| (i, t)));
        match (below, above) {
            (Some((i, ti)), Some((j, tj))) => Some(ti + (tj - ti) * (n - i) as f64 / (j - i) as f64),
            (Some((i, ti)), None) => match measured_below(i) {
                Some((h, th)) => Some(ti + (ti - th).max(0.0) / (i - h) as f64 * (n - i) as f64),
                None => Some(ti * n as f64 / i as f64),
            },
            (None, Some((j, tj))) => Some(tj * n as f64 / j as f64),
            (None, None) => None,
        }
    }

    /// What one more verify row costs after `n` proposed tokens (n + 1 rows). At least the average
    /// row so far: two noisy medians that happen to be close (or inverted) must not make the next
    /// row look free.
    pub(super) fn row(&self, n: usize) -> Option<f64> {
        let (one, now, next) = (self.verify(1)?, self.verify(n + 1)?, self.verify(n + 2)?);
        Some((next - now).max((next - one) / (n + 1) as f64).max(0.0))
    }
}
