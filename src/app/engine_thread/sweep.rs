//! The sweep on the engine thread: for each seed, target-only and then every (rule, value) point
//! at every draft length, each reported when it ends.

use super::{EngineEvent, Outbox, Worker};
use crate::generate::{DraftLen, GenerateRequest, Mode};
use crate::mentor::MentorRule;
use std::sync::atomic::{AtomicBool, Ordering};

/// One configuration of a sweep.
struct SweepRun {
    label: String,
    mode: Mode,
    rule: MentorRule,
    budget: f64,
    draft_len: DraftLen,
}

/// Target-only first, then the grid's points at each draft length; labels as `bench` writes them.
fn plan(base: &GenerateRequest, grid: &[(MentorRule, f64)], lens: &[DraftLen]) -> Vec<SweepRun> {
    let target = SweepRun {
        label: "target".into(),
        mode: Mode::Target,
        rule: base.rule,
        budget: 0.0,
        draft_len: DraftLen::Fixed(1),
    };
    let mut runs = vec![target];
    for &draft_len in lens {
        for &(rule, budget) in grid {
            let label = match draft_len {
                DraftLen::Auto => format!("auto,{}={budget}", rule.key()),
                DraftLen::Fixed(k) => format!("fixed={k},{}={budget}", rule.key()),
            };
            runs.push(SweepRun { label, mode: Mode::Speculative, rule, budget, draft_len });
        }
    }
    runs
}

impl Worker {
    pub(super) fn sweep(
        &mut self,
        run_id: u64,
        base: &GenerateRequest,
        (grid, lens, seeds): (&[(MentorRule, f64)], &[DraftLen], &[u64]),
        cancel: &AtomicBool,
        out: &Outbox,
    ) {
        let runs = plan(base, grid, lens);
        let total = seeds.len() * runs.len();
        let mut done = 0;
        for &seed in seeds {
            for r in &runs {
                if cancel.load(Ordering::Relaxed) {
                    return;
                }
                let req = GenerateRequest {
                    mode: r.mode,
                    rule: r.rule,
                    budget: r.budget,
                    draft_len: r.draft_len,
                    seed,
                    ..base.clone()
                };
                let Some(stats) = self.run_silent(&req, cancel, out, run_id) else { return };
                let (label, rule, budget, draft_len) = (r.label.clone(), r.rule, r.budget, r.draft_len);
                out.send(EngineEvent::SweepPoint { run_id, label, rule, budget, draft_len, seed, stats });
                done += 1;
                out.send(EngineEvent::SweepProgress { run_id, done, total });
            }
        }
    }
}
