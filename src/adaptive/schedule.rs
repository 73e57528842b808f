//! The scheduler: when the estimates say "take target steps", when to draft anyway so that they
//! stay current (probes), and when to time a target step again during a drafting streak.

use super::PROBE_LEN;

/// After this many consecutive target-only steps, probe with a drafting round; each probe whose
/// first drafted token is rejected doubles the wait, up to `MAX_PROBE_EVERY`, while an accepted
/// one keeps it: doubling after every probe that left target steps the better choice locked runs
/// into target steps after one dip of α (Qwen pair, `code`, AVX2: 60 to 120 steps at a time,
/// each probe moving α by only a tenth of the way up). A probe costs the draft's catching up on
/// the skipped tokens plus a verify (measured when probes were 2 tokens: ~16 ms for ~1.5 tokens
/// on the default pair at α ≈ 0.4, against ~7 ms per target step; one every 8 steps cost ~7%).
/// Its length is the depth rule's, as in any drafting round.
const PROBE_EVERY: usize = 8;
const MAX_PROBE_EVERY: usize = 64;
/// While drafting wins, a target-only step is timed again after this many rounds if drafting's
/// expected gain is below `RETIME_GAIN`: its estimate would otherwise date from before the streak
/// (a shorter context, the machine's speed since). It costs at most (gain − 1) of a round
/// once per `RETIME_EVERY` rounds, under 1%.
pub(super) const RETIME_EVERY: usize = 24;
const RETIME_GAIN: f64 = 1.25;
/// A copy from the context ([`crate::lookup`]) is declined while its estimated rate loses; after
/// this many declined copies in a row one token is copied anyway, so that its acceptance estimate
/// follows the text (repetition often starts late in a run).
pub(super) const LOOKUP_PROBE_EVERY: usize = 16;

#[derive(Debug, Clone)]
pub(super) struct Scheduler {
    steps_since_probe: usize,
    /// Rounds since the last target-only step.
    rounds_since_step: usize,
    /// Target-only steps between probes now.
    probe_every: usize,
    /// Copies declined since the last one made.
    lookups_declined: usize,
    /// Whether the policy is in a drafting streak: its last decision was to draft (a retiming
    /// step keeps the streak; a probe is not one).
    drafting: bool,
    /// Whether the round being made is a probe.
    probing: bool,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler {
            steps_since_probe: 0,
            rounds_since_step: 0,
            probe_every: PROBE_EVERY,
            lookups_declined: 0,
            drafting: false,
            probing: false,
        }
    }
}

impl Scheduler {
    /// The round's draft length given the estimates' best length `best` (0: a target step) and its
    /// expected gain over a target step: a target step to retime, a probe, or `best` itself.
    pub(super) fn draft_len(&mut self, best: usize, gain: f64, cap: usize) -> usize {
        if best > 0 && gain < RETIME_GAIN && self.rounds_since_step >= RETIME_EVERY {
            return 0;
        }
        self.drafting = best > 0;
        if best == 0 {
            self.steps_since_probe += 1;
            if self.steps_since_probe >= self.probe_every {
                self.steps_since_probe = 0;
                self.probing = true;
                return PROBE_LEN.min(cap);
            }
        } else {
            self.steps_since_probe = 0;
            self.probe_every = PROBE_EVERY;
        }
        best
    }

    /// Whether the policy is in a drafting streak (its last decision was to draft).
    pub(super) fn drafting(&self) -> bool {
        self.drafting
    }

    /// The copy's length given the length `k` its estimates chose (0: declined): after
    /// `LOOKUP_PROBE_EVERY` declined copies in a row, one token is copied anyway.
    pub(super) fn copy_len(&mut self, k: usize) -> usize {
        if k > 0 {
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

    /// A round was made, drafting (or copying) `n_proposed` tokens; `first_rejected`: the target
    /// rejected its first drafted token.
    pub(super) fn observe_round(&mut self, n_proposed: usize, first_rejected: bool) {
        self.rounds_since_step = if n_proposed == 0 { 0 } else { self.rounds_since_step + 1 };
        if std::mem::take(&mut self.probing) && first_rejected {
            self.probe_every = (2 * self.probe_every).min(MAX_PROBE_EVERY);
        }
    }
}
