//! Whether to draft in the next round, and how far.
//!
//! Why it is shaped this way: on a GPU, verifying k tokens costs about one step, so drafting more
//! is nearly free and the usual rule is "grow k after full acceptance, shrink after a rejection".
//! On a CPU (and for small targets) verifying k tokens costs close to k steps, so speculation only
//! pays when acceptance is high — and a fixed k can be slower than the target alone (the reference
//! measured k = 4, D = 1 slower than target-only). So the adaptive policy *measures* the costs it
//! decides between and drafts only when some k promises more tokens per second than a target step:
//!
//!   E[tokens | k] = (1 − α^(k+1)) / (1 − α)          (α: per-token acceptance, bonus included)
//!   cost(k)       = k · t_draft + t_verify(k + 1)
//!
//! with k = 0 meaning an ordinary target step (1 token for t_verify(1)). α is a running average of
//! observed acceptance; t_draft and t_verify(n) are medians of the last few measured times (t_verify
//! covers the whole round after drafting: the forward, the acceptance walk and its sampling). When k = 0
//! wins, a short probe round is still made every few steps so that α and the timings stay current
//! (the text, and so the acceptance, changes along the way).
//!
//! That choice only says whether to draft; how far a round drafts is decided token by token
//! ([`AdaptivePolicy::depth_thresholds`]). The draft's probability of the token it just proposed predicts
//! whether the target will accept it (on `code`, 24% for q(x) < 0.2 against 88% for q(x) ≥ 0.97), so
//! the chance that the whole drafted prefix survives is known as the round goes. One more token is
//! drafted while what it adds, that chance times the acceptance α, per its cost (a draft step and a
//! verify row) beats the best rate the policy expects: the rule for maximising tokens per second
//! round after round. The decision uses only the tokens drafted so far, never the next one's own
//! probability, so the output keeps the target's distribution (a position is either verified with
//! a fresh draft sample or sampled from the target).
//!
//! Two kinds of timing would mislead the estimates and are left out: a run's first round (it can
//! find the caches cold: once measured on `code` at 9.6 ms to draft 2 tokens and 25 ms to verify
//! them, against ~2 and ~12.5 ms later; kept, it made drafting look 2x dearer than it was, the
//! policy took target steps, and only the rare probes replaced the estimate), and the draft
//! catching up on the tokens of target-only steps (see [`draft_token_s`]).

/// Largest draft length the policy (and the fixed setting) allows.
pub const MAX_DRAFT_LEN: usize = 16;
/// Tokens a round drafts until the costs are measured, and a probe's length.
const PROBE_LEN: usize = 2;
/// A draft length is chosen only when it promises at least this many times a target step's rate:
/// near break-even the estimates' noise, and costs the model leaves out (the draft catching up on
/// the tokens of target-only steps, the mixing per token), make speculating a loss as often as a
/// gain. Measured on the default pair (creative, TV 0): verifying 2 tokens cost 1.39 steps and α
/// was ~0.5, so k = 1 promised ~1.00x and delivered 0.81–0.87x in `bench` without this margin.
const MIN_GAIN: f64 = 1.05;
/// In a drafting streak, drafting goes on while it promises at least this: stopping at
/// `MIN_GAIN` too made runs on the Qwen pair (AVX2, `code`, where k = 1 gains ~1.1x and α ≈ 0.8)
/// stop at every dip of the running α, and lose to a fixed draft length of 1.
const STAY_GAIN: f64 = 1.0;

mod acceptance;
mod costs;
mod schedule;
mod side;

use crate::lookup::Match;
use acceptance::AcceptanceModel;
use costs::CostModel;
pub use costs::{draft_token_s, FixedCosts};
use schedule::Scheduler;
pub use side::MAX_SIDE_OFFERS;

/// The policy: a cost model (what rows and draft steps cost), an acceptance model (how likely the
/// target accepts what is proposed) and a scheduler (probes and retiming), with the decisions that
/// combine them.
#[derive(Debug, Clone)]
pub struct AdaptivePolicy {
    costs: CostModel,
    accept: AcceptanceModel,
    schedule: Scheduler,
}

impl Default for AdaptivePolicy {
    fn default() -> Self {
        Self::with_costs(None)
    }
}

impl AdaptivePolicy {
    /// A policy that decides from `costs` instead of measured times (`None`: measure them).
    pub fn with_costs(costs: Option<FixedCosts>) -> Self {
        AdaptivePolicy {
            costs: CostModel::new(costs),
            accept: AcceptanceModel::default(),
            schedule: Scheduler::default(),
        }
    }

    /// Expected tokens per second of drafting k (k = 0: target step).
    pub fn expected_rate(&self, k: usize) -> Option<f64> {
        self.rate(self.accept.alpha, k, self.costs.draft().unwrap_or(0.0))
    }

    /// Expected tokens per second of a round proposing k tokens accepted each with probability
    /// `alpha`, at `t_draft` seconds per proposed token.
    fn rate(&self, alpha: f64, k: usize, t_draft: f64) -> Option<f64> {
        let cost = k as f64 * t_draft + self.costs.verify(k + 1)?;
        let a = alpha.clamp(0.0, 0.999);
        let tokens = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
        Some(tokens / cost.max(1e-9))
    }

    /// The best rate the estimates promise: a target step's or the best draft length's.
    fn best_rate(&self) -> Option<f64> {
        let step = self.expected_rate(0)?;
        Some((1..=MAX_DRAFT_LEN).filter_map(|k| self.expected_rate(k)).fold(step, f64::max))
    }

    /// A draft length for the next round (at most `cap`) whose expected rate beats a target step by
    /// `MIN_GAIN` (by `STAY_GAIN` in a drafting streak), or a probe's; 0: take a target step.
    /// Callers in `auto` use it only to decide whether to draft ([`Self::depth_thresholds`] decides
    /// how far).
    pub fn next_len(&mut self, cap: usize) -> usize {
        let cap = cap.min(MAX_DRAFT_LEN);
        if cap == 0 {
            return 0;
        }
        // Until both a draft step and a verify have been timed, explore with a small draft.
        if self.costs.draft().is_none() || self.costs.verify(1).is_none() {
            return PROBE_LEN.min(cap);
        }
        let step = self.expected_rate(0).unwrap_or(0.0);
        let (best, gain) = (1..=cap)
            .filter_map(|k| self.expected_rate(k).map(|r| (k, r / step.max(1e-12))))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .filter(|&(_, gain)| gain >= if self.schedule.drafting() { STAY_GAIN } else { MIN_GAIN })
            .unwrap_or((0, 1.0));
        self.schedule.draft_len(best, gain, cap)
    }

    /// For a round that has drafted n tokens, entry n is the smallest probability that they all
    /// survive verification (the product of their [`Self::accept_estimate`]s) at which one more is
    /// drafted (n = 1 ..= MAX_DRAFT_LEN; entry 0 is unused). The token adds p_prefix · α expected
    /// tokens for a draft step and one more verify row; it is drafted while that rate is at least
    /// the best rate expected ([`Self::best_rate`]). Until the costs are measured, rounds draft
    /// `PROBE_LEN` tokens. Computed once per round (the medians behind it sort their samples).
    pub fn depth_thresholds(&self) -> [f64; MAX_DRAFT_LEN + 1] {
        let mut out = [f64::INFINITY; MAX_DRAFT_LEN + 1];
        let (Some(t_draft), Some(best)) = (self.costs.draft(), self.best_rate()) else {
            out[..PROBE_LEN].fill(0.0);
            return out;
        };
        for (n, at) in out.iter_mut().enumerate().skip(1) {
            if let Some(row) = self.costs.row(n) {
                *at = best * (t_draft + row) / self.accept.alpha.max(1e-6);
            }
        }
        out
    }

    /// How many of the `available` tokens a copy from the context offers ([`crate::lookup`]) to
    /// verify in the next round; 0: draft with the model (or step) instead. A copy costs no draft
    /// forward, so it is taken at the length with the best expected rate under its own acceptance
    /// estimate, when that rate beats both what drafting with the model promises and a target step
    /// by `MIN_GAIN`. Until the verify cost is known, and now and then after declined copies
    /// ([`Scheduler::copy_len`]), a short copy is made to measure.
    pub fn lookup_len(&mut self, available: usize, matched: impl Into<Match>) -> usize {
        let matched = matched.into();
        let cap = available.min(MAX_DRAFT_LEN);
        if cap == 0 {
            return 0;
        }
        let Some(step) = self.expected_rate(0) else {
            return PROBE_LEN.min(cap);
        };
        let model_best = (0..=MAX_DRAFT_LEN).filter_map(|k| self.expected_rate(k)).fold(step, f64::max);
        let (k, rate) = (1..=cap)
            .filter_map(|k| self.rate(self.accept.copied(matched), k, 0.0).map(|r| (k, r)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0));
        let pays = k > 0 && rate >= model_best && rate >= MIN_GAIN * step;
        self.schedule.copy_len(if pays { k } else { 0 })
    }

    /// How many of the `available` tokens a copy from the context offers (after a match of
    /// `matched` tokens) to append to a round that has drafted `n_drafted` tokens with the model,
    /// all surviving with estimated probability `p_prefix`; 0: go on with the model (or stop).
    /// A copied token costs a verify row and no draft step. Copying starts only where the copy's
    /// next token is worth more per cost than the model's would be, and goes on, like the depth
    /// rule, while p_prefix · α_copy per row beats the best rate expected.
    pub fn copy_tail_len(&self, p_prefix: f64, n_drafted: usize, matched: impl Into<Match>, available: usize) -> usize {
        let (Some(t_draft), Some(best)) = (self.costs.draft(), self.best_rate()) else {
            return 0;
        };
        let a = self.accept.copied(matched.into());
        let mut p = p_prefix;
        let mut n = 0;
        while n < available && n_drafted + n < MAX_DRAFT_LEN {
            let Some(row) = self.costs.row(n_drafted + n) else {
                break;
            };
            let beats_model = n > 0 || a * (t_draft + row) >= self.accept.alpha * row;
            if !beats_model || p * a < best * row {
                break;
            }
            p *= a;
            n += 1;
        }
        n
    }

    /// Record one round: `n_proposed` drafted, `n_accepted` accepted, the seconds per drafted token
    /// ([`draft_token_s`]; None: not known) and the seconds of the rest of the round. The first
    /// round's timings are not used (cold caches); its acceptance is.
    pub fn observe(&mut self, n_proposed: usize, n_accepted: usize, draft_token_s: Option<f64>, verify_s: f64) {
        let draft_token_s = draft_token_s.filter(|_| n_proposed > 0);
        self.costs.record(n_proposed + 1, verify_s, draft_token_s);
        self.schedule.observe_round(n_proposed, n_proposed > 0 && n_accepted == 0);
        if n_proposed > 0 {
            self.accept.observe_round(n_accepted);
        }
    }

    /// Record a round that verified `n_proposed` tokens copied from the context after a match of
    /// `matched` tokens, `n_accepted` of them accepted, in `verify_s` seconds (the forward and the
    /// acceptance walk).
    pub fn observe_lookup(&mut self, matched: impl Into<Match>, n_proposed: usize, n_accepted: usize, verify_s: f64) {
        if n_proposed == 0 {
            return;
        }
        self.observe_verify(n_proposed, verify_s);
        self.accept.observe_copies(matched.into(), n_proposed, n_accepted);
    }

    /// Record a round that verified `n_proposed` tokens and ran no draft forward, in `verify_s`
    /// seconds: its cost alone (a tree of copies records their acceptance node by node).
    pub fn observe_verify(&mut self, n_proposed: usize, verify_s: f64) {
        self.costs.record(n_proposed + 1, verify_s, None);
        self.schedule.observe_round(n_proposed, false);
    }

    /// Record copies appended to a drafting round ([`Self::copy_tail_len`]) that verification
    /// reached: `n_proposed` copied after a match of `matched` tokens, `n_accepted` accepted. The
    /// round itself (timing, the model's acceptance) is recorded by [`Self::observe`].
    pub fn observe_copies(&mut self, matched: impl Into<Match>, n_proposed: usize, n_accepted: usize) {
        if n_proposed > 0 {
            self.accept.observe_copies(matched.into(), n_proposed, n_accepted);
        }
    }

    /// Estimated probability that the target accepts a drafted token the draft gave probability
    /// `q_x`.
    pub fn accept_estimate(&self, q_x: f32) -> f64 {
        self.accept.drafted(q_x)
    }

    /// Record a verified drafted token: the draft's probability `q_x` of it, and the probability
    /// with which the rule accepted it (min(1, π(x)/q(x)), exact given the token, so the estimate
    /// needs no luck of the draw).
    pub fn observe_drafted(&mut self, q_x: f32, accept_prob: f64) {
        self.accept.observe_drafted(q_x, accept_prob);
    }

    pub fn alpha(&self) -> f64 {
        self.accept.alpha
    }

    /// Acceptance estimate of tokens copied after a match `matched` (a length alone: in the
    /// context).
    pub fn alpha_lookup(&self, matched: impl Into<Match>) -> f64 {
        self.accept.copied(matched.into())
    }
}

#[cfg(test)]
mod tests;
