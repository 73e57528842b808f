//! Runs into the runs table: each comparison's two panes and each sweep point as a
//! [`RunRecord`] naming its models, and each mentored pane's per-position spend of its budget.

use super::engine_thread::Pane;
use super::view::{RunRecord, SpendRun};
use super::{ui_models, MentorApp};

/// Comparisons whose per-position spend is kept for the scatter.
const MAX_SPEND_RUNS: usize = 12;

impl MentorApp {
    pub(super) fn record(&mut self, pane: Pane, stats: &crate::generate::Stats) {
        let target_e2e = self.view.target.stats.as_ref().map(|s| s.e2e_s);
        let (config, speedup) = match pane {
            Pane::Target => ("target".to_string(), 1.0),
            Pane::Mentored => {
                (self.view.mentored_label.clone(), target_e2e.map(|t| t / stats.e2e_s.max(1e-9)).unwrap_or(f64::NAN))
            }
        };
        let req = self.view.target_request.clone().unwrap_or_else(|| self.settings.target_request());
        let (target, draft) = self.run_models(pane == Pane::Mentored);
        self.history.push(RunRecord {
            target,
            draft,
            when: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            config,
            prompt: req.prompt.chars().take(80).collect(),
            seed: req.seed,
            temperature: req.sampling.temperature,
            n_tokens: stats.n_tokens,
            acceptance: stats.acceptance_rate,
            rounds: stats.n_rounds,
            e2e_s: stats.e2e_s,
            tok_s: if stats.e2e_s > 0.0 { stats.n_tokens as f64 / stats.e2e_s } else { 0.0 },
            speedup,
            target_nll: stats.mean_target_nll,
            mean_tv: stats.mean_tv,
        });
        // Each run is on disk as soon as it is in the table.
        self.save_state();
    }

    /// The loaded models' short names for a run's record; the draft only where the run used it.
    pub(crate) fn run_models(&self, with_draft: bool) -> (String, String) {
        let name = |m: &Option<(crate::gguf::ModelInfo, String)>| m.as_ref().map(|(i, _)| ui_models::short_name(i));
        let draft = if with_draft { name(&self.view.models.draft) } else { None };
        (name(&self.view.models.target).unwrap_or_default(), draft.unwrap_or_default())
    }

    /// The sweep's newest point into the runs table (config `sweep: …`, speedup paired with
    /// target-only of the same seed).
    pub(super) fn record_sweep_point(&mut self) {
        let Some(p) = self.view.sweep.points.last() else { return };
        let speedup = self.view.sweep.paired_speedup(p).unwrap_or(f64::NAN);
        let req = self.settings.mentored_request();
        let s = &p.stats;
        let (target, draft) = self.run_models(p.label != "target");
        self.history.push(RunRecord {
            target,
            draft,
            when: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            config: format!("sweep: {}", p.label),
            prompt: req.prompt.chars().take(80).collect(),
            seed: p.seed,
            temperature: req.sampling.temperature,
            n_tokens: s.n_tokens,
            acceptance: s.acceptance_rate,
            rounds: s.n_rounds,
            e2e_s: s.e2e_s,
            tok_s: if s.e2e_s > 0.0 { s.n_tokens as f64 / s.e2e_s } else { 0.0 },
            speedup,
            target_nll: s.mean_target_nll,
            mean_tv: s.mean_tv,
        });
        self.save_state();
    }

    /// A mentored pane's drafted positions as (d, realised TV(π, p)) points, under its rule.
    pub(super) fn record_spend(&mut self) {
        let points: Vec<[f64; 2]> =
            self.view.mentored.tokens.iter().filter_map(|t| Some([t.tv?, t.tv? * t.theta?])).collect();
        if points.is_empty() {
            return;
        }
        let label = format!("{} #{}", self.view.mentored_label, self.history.len());
        self.view.spend.push(SpendRun { rule: self.settings.rule, label, points });
        let n = self.view.spend.len();
        self.view.spend.drain(..n.saturating_sub(MAX_SPEND_RUNS));
    }
}
