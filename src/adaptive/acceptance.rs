//! The acceptance model: how likely the target is to accept what a round proposes, learned from
//! the verified tokens of the run. One estimate for a round's first drafted token (α), one per
//! class of the draft's probability q(x), one per class of a copy's match length, and one per
//! class of q for side offers.

/// Bounds of the classes of a drafted token's draft probability q(x) whose acceptance is
/// estimated apart ([`AcceptanceModel::drafted`]).
const Q_CLASS_BOUNDS: [f32; 6] = [0.2, 0.4, 0.6, 0.8, 0.9, 0.97];
pub(super) const N_Q_CLASSES: usize = Q_CLASS_BOUNDS.len() + 1;
/// Acceptance assumed per class of q(x) before any was verified: between what the default pair
/// gave on `code` (0.24, 0.35, 0.42, 0.58, 0.60, 0.75, 0.88) and on `creative` (0.35, 0.45, 0.50,
/// 0.69, 0.75, 0.84, 0.96), 1700 and 1230 drafted tokens at k = 4, T = 0.7, D = 0.
pub(super) const Q_CLASS_PRIOR: [f64; N_Q_CLASSES] = [0.3, 0.4, 0.45, 0.6, 0.65, 0.8, 0.9];
/// The prior probability that the target's token is a side offer, per class of the offer's draft
/// probability: a runner-up is rarely the target's choice unless the draft was torn.
pub(super) const SIDE_PRIOR: [f64; N_Q_CLASSES] = [0.05, 0.2, 0.3, 0.35, 0.4, 0.4, 0.4];
/// How far one verified token's acceptance probability moves its class's estimate.
const Q_CLASS_STEP: f64 = 0.05;
/// How far one drafted token's outcome (accepted, or the round's rejection) moves α. Weighing
/// whole rounds instead (a weight of 0.25 per round's accepted / (accepted + rejections)) let a
/// single token decide a k = 1 round's observation: on `code`, at a true acceptance of ~0.55, α
/// swung between 0.26 and 0.81 within 20 rounds, and each dip below break-even stopped drafting
/// for 8 to 64 target steps until a probe.
const ALPHA_STEP: f64 = 0.1;
/// Acceptance assumed for copied tokens before any was verified, by class of match length (3,
/// 4–5, 6–9, 10+ tokens) in the context, then in a corpus: in the context near what the target's
/// own `code` outputs gave (46%, 78%, 78%, 94%, see [`crate::lookup`]), lower for the shorter
/// matches, which on prose are right less often (with 0.6 for every class, `bench` accepted 35–36%
/// of the copies on `creative` and `qa`); in a corpus, which is other text than this one, lower
/// again until the run's own copies say otherwise (its matches start at 6 tokens,
/// [`crate::corpus::MIN_CORPUS_MATCH`], so its first two classes stay unused).
pub(super) const LOOKUP_PRIOR: [f64; N_MATCH_LENS] = [0.4, 0.6, 0.75, 0.9, 0.2, 0.35, 0.5, 0.75];
const N_MATCH_LENS: usize = crate::lookup::N_MATCH_CLASSES;
use crate::lookup::Match;

#[derive(Debug, Clone)]
pub(super) struct AcceptanceModel {
    /// Running acceptance probability of a round's first drafted token.
    pub(super) alpha: f64,
    /// Running per-token acceptance of copied tokens, by the class of their match
    /// ([`crate::lookup::Match::class`]).
    alpha_lookup: [f64; N_MATCH_LENS],
    /// Running acceptance probability of a drafted token by the class of its draft probability
    /// q(x) (see [`Q_CLASS_BOUNDS`]).
    accept_by_q: [f64; N_Q_CLASSES],
    /// Running probability that the target's token is a side offer (a runner-up of the draft's
    /// race at a drafted position), by the class of the offer's draft probability.
    side_by_q: [f64; N_Q_CLASSES],
}

impl Default for AcceptanceModel {
    fn default() -> Self {
        AcceptanceModel { alpha: 0.7, alpha_lookup: LOOKUP_PRIOR, accept_by_q: Q_CLASS_PRIOR, side_by_q: SIDE_PRIOR }
    }
}

impl AcceptanceModel {
    /// A drafting round's outcome: only its first drafted token moves α. Every drafting round
    /// proposes it, while how far a round goes depends on how likely its tokens looked, so later
    /// tokens are a selected sample (the estimate of the copies, and whether to draft at all, need
    /// the plain one).
    pub(super) fn observe_round(&mut self, n_accepted: usize) {
        self.alpha = moved(self.alpha, 1, n_accepted.min(1));
    }

    /// Acceptance estimate of tokens copied after the match `matched`.
    pub(super) fn copied(&self, matched: Match) -> f64 {
        self.alpha_lookup[matched.class()]
    }

    /// Copies verified after the match `matched`: `n_proposed`, `n_accepted` of them accepted.
    pub(super) fn observe_copies(&mut self, matched: Match, n_proposed: usize, n_accepted: usize) {
        let a = &mut self.alpha_lookup[matched.class()];
        *a = moved(*a, n_proposed, n_accepted);
    }

    /// Acceptance estimate of a drafted token of draft probability `q_x`.
    pub(super) fn drafted(&self, q_x: f32) -> f64 {
        self.accept_by_q[q_class(q_x)]
    }

    /// A verified drafted token of draft probability `q_x`, accepted with probability `accept_prob`.
    pub(super) fn observe_drafted(&mut self, q_x: f32, accept_prob: f64) {
        let a = &mut self.accept_by_q[q_class(q_x)];
        *a += Q_CLASS_STEP * (accept_prob.clamp(0.0, 1.0) - *a);
    }

    /// Probability that the target's token is a side offer of draft probability `q_x`.
    pub(super) fn side(&self, q_x: f32) -> f64 {
        self.side_by_q[q_class(q_x)]
    }

    /// Whether (1 or 0, or how likely) the target's token was a side offer of draft probability `q_x`.
    pub(super) fn observe_side(&mut self, q_x: f32, hit: f64) {
        let a = &mut self.side_by_q[q_class(q_x)];
        *a += Q_CLASS_STEP * (hit - *a);
    }
}

/// The class of a draft probability ([`Q_CLASS_BOUNDS`]).
pub(super) fn q_class(q_x: f32) -> usize {
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
