//! The sweep on the engine thread: for each seed, target-only and then every (rule, value) point
//! at every draft length, each reported when it ends.

use super::{EngineEvent, Outbox, Worker};
use crate::generate::{DraftLen, Drafting, GenerateRequest, Mode, Verify};
use crate::mentor::MentorRule;
use std::sync::atomic::{AtomicBool, Ordering};

/// One configuration of a sweep.
struct SweepRun {
    label: String,
    mode: Mode,
    rule: MentorRule,
    budget: f64,
    drafting: Drafting,
}

/// Target-only first, then the grid's points with each drafting; labels as `bench` writes them.
fn plan(base: &GenerateRequest, grid: &[(MentorRule, f64)], draftings: &[Drafting]) -> Vec<SweepRun> {
    let target = SweepRun {
        label: "target".into(),
        mode: Mode::Target,
        rule: base.verify.rule,
        budget: 0.0,
        drafting: Drafting::Chain(1),
    };
    let mut runs = vec![target];
    for &drafting in draftings {
        for &(rule, budget) in grid {
            let label = match drafting.len() {
                DraftLen::Auto => format!("auto,{}={budget}", rule.key()),
                DraftLen::Fixed(k) => format!("fixed={k},{}={budget}", rule.key()),
            };
            runs.push(SweepRun { label, mode: Mode::Speculative, rule, budget, drafting });
        }
    }
    runs
}

impl Worker {
    pub(super) fn sweep(
        &mut self,
        run_id: u64,
        base: &GenerateRequest,
        (grid, draftings, seeds): (&[(MentorRule, f64)], &[Drafting], &[u64]),
        cancel: &AtomicBool,
        out: &Outbox,
    ) {
        let runs = plan(base, grid, draftings);
        let total = seeds.len() * runs.len();
        let mut done = 0;
        for &seed in seeds {
            for r in &runs {
                if cancel.load(Ordering::Relaxed) {
                    return;
                }
                let req = GenerateRequest {
                    mode: r.mode,
                    verify: Verify { rule: r.rule, budget: r.budget, ..base.verify },
                    drafting: r.drafting,
                    seed,
                    ..base.clone()
                };
                let Some(stats) = self.run_silent(&req, cancel, out, run_id) else { return };
                let (label, rule, budget, draft_len) = (r.label.clone(), r.rule, r.budget, r.drafting.len());
                out.send(EngineEvent::SweepPoint { run_id, label, rule, budget, draft_len, seed, stats });
                done += 1;
                out.send(EngineEvent::SweepProgress { run_id, done, total });
            }
        }
    }
}
