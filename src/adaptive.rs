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
/// Bounds of the classes of a drafted token's draft probability q(x) whose acceptance is
/// estimated apart ([`AdaptivePolicy::accept_estimate`]).
const Q_CLASS_BOUNDS: [f32; 6] = [0.2, 0.4, 0.6, 0.8, 0.9, 0.97];
const N_Q_CLASSES: usize = Q_CLASS_BOUNDS.len() + 1;
/// Acceptance assumed per class of q(x) before any was verified: between what the default pair
/// gave on `code` (0.24, 0.35, 0.42, 0.58, 0.60, 0.75, 0.88) and on `creative` (0.35, 0.45, 0.50,
/// 0.69, 0.75, 0.84, 0.96), 1700 and 1230 drafted tokens at k = 4, T = 0.7, D = 0.
const Q_CLASS_PRIOR: [f64; N_Q_CLASSES] = [0.3, 0.4, 0.45, 0.6, 0.65, 0.8, 0.9];
/// How far one verified token's acceptance probability moves its class's estimate.
const Q_CLASS_STEP: f64 = 0.05;
/// After this many consecutive target-only steps, probe with a drafting round; each probe that
/// leaves target-only steps the better choice doubles the wait, up to `MAX_PROBE_EVERY`. A probe
/// costs the draft's catching up on the skipped tokens plus a verify (measured when probes were 2
/// tokens: ~16 ms for ~1.5 tokens on the default pair at α ≈ 0.4, against ~7 ms per target step;
/// one every 8 steps cost ~7%). Its length is the depth rule's, as in any drafting round.
const PROBE_EVERY: usize = 8;
const MAX_PROBE_EVERY: usize = 64;
const PROBE_LEN: usize = 2;
/// A draft length is chosen only when it promises at least this many times a target step's rate:
/// near break-even the estimates' noise, and costs the model leaves out (the draft catching up on
/// the tokens of target-only steps, the mixing per token), make speculating a loss as often as a
/// gain. Measured on the default pair (creative, TV 0): verifying 2 tokens cost 1.39 steps and α
/// was ~0.5, so k = 1 promised ~1.00x and delivered 0.81–0.87x in `bench` without this margin.
const MIN_GAIN: f64 = 1.05;
/// How far one drafted token's outcome (accepted, or the round's rejection) moves α. Weighing
/// whole rounds instead (a weight of 0.25 per round's accepted / (accepted + rejections)) let a
/// single token decide a k = 1 round's observation: on `code`, at a true acceptance of ~0.55, α
/// swung between 0.26 and 0.81 within 20 rounds, and each dip below break-even stopped drafting
/// for 8 to 64 target steps until a probe.
const ALPHA_STEP: f64 = 0.1;
/// Timings are estimated by the median of the last this many of their kind. A running average
/// lets one stall decide the rest of a run: a single descheduled step many times the usual length
/// inflates the step's estimate, drafting then wins every round, and the step is never timed again.
const RECENT: usize = 5;
/// While drafting wins, a target-only step is timed again after this many rounds if drafting's
/// expected gain is below `RETIME_GAIN`: its estimate would otherwise date from before the streak
/// (a shorter context, another phase of a noisy machine). It costs at most (gain − 1) of a round
/// once per `RETIME_EVERY` rounds, under 1%.
const RETIME_EVERY: usize = 24;
const RETIME_GAIN: f64 = 1.25;
/// A copy from the context ([`crate::lookup`]) is declined while its estimated rate loses; after
/// this many declined copies in a row one token is copied anyway, so that its acceptance estimate
/// follows the text (repetition often starts late in a run).
const LOOKUP_PROBE_EVERY: usize = 16;
/// Acceptance assumed for copied tokens before any was verified, by class of match length (3,
/// 4–5, 6–9, 10+ tokens): near what the target's own `code` outputs gave (46%, 78%, 78%, 94%, see
/// [`crate::lookup`]), lower for the shorter matches, which on prose are right less often. With
/// 0.6 for every class, `bench` accepted 35–36% of the copies on `creative` and `qa`.
const LOOKUP_PRIOR: [f64; N_MATCH_LENS] = [0.4, 0.6, 0.75, 0.9];
const N_MATCH_LENS: usize = crate::lookup::N_MATCH_CLASSES;

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
struct Recent {
    vals: [f64; RECENT],
    len: usize,
    next: usize,
}

impl Recent {
    fn push(&mut self, v: f64) {
        self.vals[self.next] = v;
        self.next = (self.next + 1) % RECENT;
        self.len = (self.len + 1).min(RECENT);
    }

    /// Median of what was pushed (the mean of the middle two for an even count); None if nothing.
    fn median(&self) -> Option<f64> {
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

#[derive(Debug, Clone)]
pub struct AdaptivePolicy {
    /// Costs given instead of measured (see [`FixedCosts`]).
    fixed: Option<FixedCosts>,
    /// Running acceptance probability of a round's first drafted token.
    alpha: f64,
    /// Seconds per draft token.
    t_draft: Recent,
    /// Seconds per round that verifies n tokens (the forward, and the acceptance walk with its
    /// sampling), index n (0 unused).
    t_verify: Vec<Recent>,
    steps_since_probe: usize,
    /// Rounds since the last target-only step.
    rounds_since_step: usize,
    /// Target-only steps between probes now.
    probe_every: usize,
    /// Rounds observed so far (the first one's timings are not used).
    n_observed: usize,
    /// Running per-token acceptance of tokens copied from the context, by the class of the match's
    /// length ([`crate::lookup::match_class`]).
    alpha_lookup: [f64; N_MATCH_LENS],
    /// Copies declined since the last one made.
    lookups_declined: usize,
    /// Running acceptance probability of a drafted token by the class of its draft probability
    /// q(x) (see [`Q_CLASS_BOUNDS`]).
    accept_by_q: [f64; N_Q_CLASSES],
    /// Running probability that the target's token is a side offer (a runner-up of the draft's
    /// race at a drafted position), by the class of the offer's draft probability.
    side_by_q: [f64; N_Q_CLASSES],
}

impl Default for AdaptivePolicy {
    fn default() -> Self {
        Self {
            fixed: None,
            alpha: 0.7,
            t_draft: Recent::default(),
            t_verify: vec![Recent::default(); MAX_DRAFT_LEN + 2],
            steps_since_probe: 0,
            rounds_since_step: 0,
            probe_every: PROBE_EVERY,
            n_observed: 0,
            alpha_lookup: LOOKUP_PRIOR,
            lookups_declined: 0,
            accept_by_q: Q_CLASS_PRIOR,
            side_by_q: side::SIDE_PRIOR,
        }
    }
}

impl AdaptivePolicy {
    /// A policy that decides from `costs` instead of measured times (`None`: measure them).
    pub fn with_costs(costs: Option<FixedCosts>) -> Self {
        AdaptivePolicy { fixed: costs, ..Self::default() }
    }

    /// Seconds per drafted token: given, or the median of the recent measurements.
    fn draft_cost(&self) -> Option<f64> {
        self.fixed.map(|c| c.draft_token_s).or_else(|| self.t_draft.median())
    }

    /// Expected cost of a verify forward over n tokens: measured if seen, else interpolated
    /// linearly from the nearest measured sizes. Past the largest measured size it goes on with the
    /// slope between the two largest (each more row costs about the same; proportional to n where
    /// only one size is known). Proportional extrapolation made larger drafts look far too dear:
    /// with verify(1) = 7.1 ms and verify(3) = 8.8 ms it put verify(5) at 14.7 ms against ~10.5 ms
    /// measured, and the policy never drafted more than 2 tokens on `code` at 83% acceptance.
    fn verify_cost(&self, n: usize) -> Option<f64> {
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

    /// Expected tokens per second of drafting k (k = 0: target step).
    pub fn expected_rate(&self, k: usize) -> Option<f64> {
        self.rate(self.alpha, k, self.draft_cost().unwrap_or(0.0))
    }

    /// Expected tokens per second of a round proposing k tokens accepted each with probability
    /// `alpha`, at `t_draft` seconds per proposed token.
    fn rate(&self, alpha: f64, k: usize, t_draft: f64) -> Option<f64> {
        let cost = k as f64 * t_draft + self.verify_cost(k + 1)?;
        let a = alpha.clamp(0.0, 0.999);
        let tokens = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
        Some(tokens / cost.max(1e-9))
    }

    /// How many of the `available` tokens a copy from the context offers ([`crate::lookup`]) to
    /// verify in the next round; 0: draft with the model (or step) instead. A copy costs no draft
    /// forward, so it is taken at the length with the best expected rate under its own acceptance
    /// estimate, when that rate beats both what drafting with the model promises and a target step
    /// by `MIN_GAIN`. Until the verify cost is known, and after `LOOKUP_PROBE_EVERY` declined
    /// copies, a short copy is made to measure.
    pub fn lookup_len(&mut self, available: usize, matched: usize) -> usize {
        let cap = available.min(MAX_DRAFT_LEN);
        if cap == 0 {
            return 0;
        }
        let Some(step) = self.expected_rate(0) else {
            return PROBE_LEN.min(cap);
        };
        let model_best = (0..=MAX_DRAFT_LEN).filter_map(|k| self.expected_rate(k)).fold(step, f64::max);
        let (k, rate) = (1..=cap)
            .filter_map(|k| self.rate(self.alpha_lookup(matched), k, 0.0).map(|r| (k, r)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0));
        if k > 0 && rate >= model_best && rate >= MIN_GAIN * step {
            self.lookups_declined = 0;
            return k;
        }
        self.lookups_declined += 1;
        if self.lookups_declined >= LOOKUP_PROBE_EVERY {
            self.lookups_declined = 0;
            return 1;
        }
        0
    }

    /// Record a round that verified `n_proposed` tokens copied from the context after a match of
    /// `matched` tokens, `n_accepted` of them accepted, in `verify_s` seconds (the forward and the
    /// acceptance walk).
    pub fn observe_lookup(&mut self, matched: usize, n_proposed: usize, n_accepted: usize, verify_s: f64) {
        if n_proposed == 0 {
            return;
        }
        let warm = self.n_observed > 0;
        self.n_observed += 1;
        if let (true, Some(times)) = (warm, self.t_verify.get_mut(n_proposed + 1)) {
            times.push(verify_s);
        }
        self.rounds_since_step += 1;
        let a = &mut self.alpha_lookup[crate::lookup::match_class(matched)];
        *a = moved(*a, n_proposed, n_accepted);
    }

    /// The best rate the estimates promise: a target step's or the best draft length's.
    fn best_rate(&self) -> Option<f64> {
        let step = self.expected_rate(0)?;
        Some((1..=MAX_DRAFT_LEN).filter_map(|k| self.expected_rate(k)).fold(step, f64::max))
    }

    /// For a round that has drafted n tokens, entry n is the smallest probability that they all
    /// survive verification (the product of their [`Self::accept_estimate`]s) at which one more is
    /// drafted (n = 1 ..= MAX_DRAFT_LEN; entry 0 is unused). The token adds p_prefix · α expected
    /// tokens for a draft step and one more verify row; it is drafted while that rate is at least
    /// the best rate expected ([`Self::best_rate`]). Until the costs are measured, rounds draft
    /// `PROBE_LEN` tokens. Computed once per round (the medians behind it sort their samples).
    pub fn depth_thresholds(&self) -> [f64; MAX_DRAFT_LEN + 1] {
        let mut out = [f64::INFINITY; MAX_DRAFT_LEN + 1];
        let (Some(t_draft), Some(best)) = (self.draft_cost(), self.best_rate()) else {
            out[..PROBE_LEN].fill(0.0);
            return out;
        };
        for (n, at) in out.iter_mut().enumerate().skip(1) {
            if let Some(row) = self.row_cost(n) {
                *at = best * (t_draft + row) / self.alpha.max(1e-6);
            }
        }
        out
    }

    /// What one more verify row costs after `n` proposed tokens (n + 1 rows). At least the average
    /// row so far: two noisy medians that happen to be close (or inverted) must not make the next
    /// row look free.
    fn row_cost(&self, n: usize) -> Option<f64> {
        let (one, now, next) = (self.verify_cost(1)?, self.verify_cost(n + 1)?, self.verify_cost(n + 2)?);
        Some((next - now).max((next - one) / (n + 1) as f64).max(0.0))
    }

    /// How many of the `available` tokens a copy from the context offers (after a match of
    /// `matched` tokens) to append to a round that has drafted `n_drafted` tokens with the model,
    /// all surviving with estimated probability `p_prefix`; 0: go on with the model (or stop).
    /// A copied token costs a verify row and no draft step. Copying starts only where the copy's
    /// next token is worth more per cost than the model's would be, and goes on, like the depth
    /// rule, while p_prefix · α_copy per row beats the best rate expected.
    pub fn copy_tail_len(&self, p_prefix: f64, n_drafted: usize, matched: usize, available: usize) -> usize {
        let (Some(t_draft), Some(best)) = (self.draft_cost(), self.best_rate()) else {
            return 0;
        };
        let a = self.alpha_lookup(matched);
        let mut p = p_prefix;
        let mut n = 0;
        while n < available && n_drafted + n < MAX_DRAFT_LEN {
            let Some(row) = self.row_cost(n_drafted + n) else {
                break;
            };
            let beats_model = n > 0 || a * (t_draft + row) >= self.alpha * row;
            if !beats_model || p * a < best * row {
                break;
            }
            p *= a;
            n += 1;
        }
        n
    }

    /// Record copies appended to a drafting round ([`Self::copy_tail_len`]) that verification
    /// reached: `n_proposed` copied after a match of `matched` tokens, `n_accepted` accepted. The
    /// round itself (timing, the model's acceptance) is recorded by [`Self::observe`].
    pub fn observe_copies(&mut self, matched: usize, n_proposed: usize, n_accepted: usize) {
        if n_proposed > 0 {
            let a = &mut self.alpha_lookup[crate::lookup::match_class(matched)];
            *a = moved(*a, n_proposed, n_accepted);
        }
    }

    /// Estimated probability that the target accepts a drafted token the draft gave probability
    /// `q_x`.
    pub fn accept_estimate(&self, q_x: f32) -> f64 {
        self.accept_by_q[q_class(q_x)]
    }

    /// Record a verified drafted token: the draft's probability `q_x` of it, and the probability
    /// with which the rule accepted it (min(1, π(x)/q(x)), exact given the token, so the estimate
    /// needs no luck of the draw).
    pub fn observe_drafted(&mut self, q_x: f32, accept_prob: f64) {
        let a = &mut self.accept_by_q[q_class(q_x)];
        *a += Q_CLASS_STEP * (accept_prob.clamp(0.0, 1.0) - *a);
    }

    /// A draft length for the next round (at most `cap`) whose expected rate beats a target step by
    /// `MIN_GAIN`, or a probe's; 0: take a target step. Callers in `auto` use it only to decide
    /// whether to draft ([`Self::depth_thresholds`] decides how far).
    pub fn next_len(&mut self, cap: usize) -> usize {
        let cap = cap.min(MAX_DRAFT_LEN);
        if cap == 0 {
            return 0;
        }
        // Until both a draft step and a verify have been timed, explore with a small draft.
        if self.draft_cost().is_none() || self.verify_cost(1).is_none() {
            return PROBE_LEN.min(cap);
        }
        let step = self.expected_rate(0).unwrap_or(0.0);
        let (best, gain) = (1..=cap)
            .filter_map(|k| self.expected_rate(k).map(|r| (k, r / step.max(1e-12))))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .filter(|&(_, gain)| gain >= MIN_GAIN)
            .unwrap_or((0, 1.0));
        if best > 0 && gain < RETIME_GAIN && self.rounds_since_step >= RETIME_EVERY {
            return 0;
        }
        if best == 0 {
            self.steps_since_probe += 1;
            if self.steps_since_probe >= self.probe_every {
                self.steps_since_probe = 0;
                self.probe_every = (2 * self.probe_every).min(MAX_PROBE_EVERY);
                return PROBE_LEN.min(cap);
            }
        } else {
            self.steps_since_probe = 0;
            self.probe_every = PROBE_EVERY;
        }
        best
    }

    /// Record one round: `n_proposed` drafted, `n_accepted` accepted, the seconds per drafted token
    /// ([`draft_token_s`]; None: not known) and the seconds of the rest of the round. The first
    /// round's timings are not used (cold caches); its acceptance is.
    pub fn observe(&mut self, n_proposed: usize, n_accepted: usize, draft_token_s: Option<f64>, verify_s: f64) {
        let warm = self.n_observed > 0;
        self.n_observed += 1;
        if let (true, Some(times)) = (warm, self.t_verify.get_mut(n_proposed + 1)) {
            times.push(verify_s);
        }
        self.rounds_since_step = if n_proposed == 0 { 0 } else { self.rounds_since_step + 1 };
        if n_proposed > 0 {
            if let (true, Some(t)) = (warm, draft_token_s) {
                self.t_draft.push(t);
            }
            // The first drafted token only: every drafting round proposes it, while how far a
            // round goes depends on how likely its tokens looked, so later tokens are a selected
            // sample (the estimate of the copies, and whether to draft at all, need the plain one).
            self.alpha = moved(self.alpha, 1, n_accepted.min(1));
        }
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Acceptance estimate of tokens copied from the context after a match of `matched` tokens.
    pub fn alpha_lookup(&self, matched: usize) -> f64 {
        self.alpha_lookup[crate::lookup::match_class(matched)]
    }
}

/// The class of a draft probability ([`Q_CLASS_BOUNDS`]).
fn q_class(q_x: f32) -> usize {
    Q_CLASS_BOUNDS.iter().take_while(|&&b| q_x >= b).count()
}

/// An acceptance estimate after a round: each proposed token's outcome moves it, the accepted
/// ones towards 1, then the rejection (if any) towards 0.
fn moved(mut alpha: f64, n_proposed: usize, n_accepted: usize) -> f64 {
    for _ in 0..n_accepted {
        alpha += ALPHA_STEP * (1.0 - alpha);
    }
    if n_accepted < n_proposed {
        alpha -= ALPHA_STEP * alpha;
    }
    alpha
}

mod side;
pub use side::MAX_SIDE_OFFERS;

#[cfg(test)]
mod tests;
