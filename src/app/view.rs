//! Runtime view state: what the panes, plots and tables show, built from engine events. No model
//! math here; the engine computed every number.

use super::engine_thread::{EngineEvent, ExperimentRun, Pane};
use crate::generate::{DraftLen, Drafting, GenerateRequest, Mode, RoundInfo, Stats, TokenInfo, Verify};
use crate::gguf::ModelInfo;
use serde::{Deserialize, Serialize};

/// One side of the comparison as it streams in.
#[derive(Debug, Clone, Default)]
pub struct PaneView {
    pub tokens: Vec<TokenInfo>,
    /// Seconds since the run started, when each token arrived.
    pub token_times: Vec<f64>,
    pub rounds: Vec<(RoundInfo, f64)>,
    pub stats: Option<Stats>,
    pub running: bool,
    pub cancelled: bool,
}

impl PaneView {
    pub fn text(&self) -> String {
        self.tokens.iter().map(|t| t.text.as_str()).collect()
    }

    /// Tokens per second at each token, over at least the last `window_s` seconds: from the last
    /// token that arrived that long before (or from the run's start, prefill included, until one
    /// did). A speculative round delivers its tokens within microseconds; counted over a fixed
    /// number of tokens, a window starting inside such a burst read as thousands of tokens per
    /// second. Tokens with the same arrival time give one point, at the last of them.
    pub fn rolling_tok_s(&self, window_s: f64) -> Vec<[f64; 2]> {
        let t = &self.token_times;
        let mut before = 0; // tokens that arrived at least `window_s` before the current one
        let mut points = Vec::with_capacity(t.len());
        for (i, &now) in t.iter().enumerate() {
            while before < i && t[before] <= now - window_s {
                before += 1;
            }
            if t.get(i + 1).is_some_and(|&next| next <= now) {
                continue;
            }
            let (n, span) = match before.checked_sub(1) {
                Some(j) => (i - j, now - t[j]),
                None => (i + 1, now),
            };
            if span > 0.0 {
                points.push([now, n as f64 / span]);
            }
        }
        points
    }
}

/// A finished comparison, as a row of the runs table (kept across restarts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Unix seconds.
    pub when: u64,
    pub config: String,
    pub prompt: String,
    pub seed: u64,
    pub temperature: f32,
    pub n_tokens: usize,
    pub acceptance: f64,
    pub rounds: usize,
    pub e2e_s: f64,
    pub tok_s: f64,
    /// Target-only e2e over this run's e2e (for the target-only row itself: 1).
    pub speedup: f64,
    pub target_nll: f64,
    pub mean_tv: f64,
    /// The models that made the run (the bar's short names; empty in runs saved before they were
    /// recorded). `draft` is empty for target-only runs.
    #[serde(default)]
    pub target: String,
    #[serde(default)]
    pub draft: String,
}

impl RunRecord {
    pub const CSV_HEADER: &'static str =
        "when,target,draft,config,prompt,seed,temperature,n_tokens,acceptance,rounds,e2e_s,tok_s,speedup,target_nll,mean_tv";

    pub fn csv_row(&self) -> String {
        let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        format!(
            "{},{},{},{},{},{},{},{},{:.4},{},{:.4},{:.2},{:.4},{:.4},{:.4}",
            self.when,
            quote(&self.target),
            quote(&self.draft),
            self.config,
            quote(&self.prompt),
            self.seed,
            self.temperature,
            self.n_tokens,
            self.acceptance,
            self.rounds,
            self.e2e_s,
            self.tok_s,
            self.speedup,
            self.target_nll,
            self.mean_tv
        )
    }
}

pub fn to_csv(records: &[RunRecord]) -> String {
    let mut s = String::from(RunRecord::CSV_HEADER);
    s.push('\n');
    for r in records {
        s.push_str(&r.csv_row());
        s.push('\n');
    }
    s
}

/// Where one mentored run spent its budget: (d = TV(p, q), realised TV(π, p)) at each drafted
/// position, under its rule.
#[derive(Debug, Clone, PartialEq)]
pub struct SpendRun {
    pub rule: crate::mentor::MentorRule,
    pub label: String,
    pub points: Vec<[f64; 2]>,
}

/// One point of a sweep: the speed/quality frontier.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    pub label: String,
    pub rule: crate::mentor::MentorRule,
    pub budget: f64,
    pub draft_len: DraftLen,
    pub seed: u64,
    pub stats: Stats,
}

#[derive(Debug, Clone, Default)]
pub struct SweepView {
    pub run_id: Option<u64>,
    pub points: Vec<SweepPoint>,
    pub done: usize,
    pub total: usize,
}

/// One configuration of a sweep over its seeds: target NLL and speedup (paired with target-only
/// of the same seed), each as [minimum, median, maximum].
#[derive(Debug, Clone, PartialEq)]
pub struct FrontierPoint {
    pub label: String,
    /// The rule of a speculative point (none for target-only), which colours it.
    pub rule: Option<crate::mentor::MentorRule>,
    pub n_seeds: usize,
    pub nll: [f64; 3],
    pub speedup: [f64; 3],
}

impl SweepView {
    /// Target-only's time over this point's, for the same seed.
    pub fn paired_speedup(&self, p: &SweepPoint) -> Option<f64> {
        let base = self.points.iter().find(|t| t.label == "target" && t.seed == p.seed)?;
        Some(base.stats.e2e_s / p.stats.e2e_s.max(1e-9))
    }

    /// One point per configuration (target-only included), in the order first seen.
    pub fn frontier(&self) -> Vec<FrontierPoint> {
        let spread = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            [v[0], quantile_sorted(&v, 0.5), v[v.len() - 1]]
        };
        let mut labels: Vec<&str> = Vec::new();
        for p in &self.points {
            if !labels.contains(&p.label.as_str()) {
                labels.push(&p.label);
            }
        }
        labels
            .into_iter()
            .filter_map(|label| {
                let mine: Vec<&SweepPoint> = self.points.iter().filter(|p| p.label == label).collect();
                let speedups: Vec<f64> = mine.iter().filter_map(|p| self.paired_speedup(p)).collect();
                if speedups.is_empty() {
                    return None;
                }
                Some(FrontierPoint {
                    label: label.to_string(),
                    rule: mine.first().filter(|_| label != "target").map(|p| p.rule),
                    n_seeds: mine.len(),
                    nll: spread(mine.iter().map(|p| p.stats.mean_target_nll).collect()),
                    speedup: spread(speedups),
                })
            })
            .collect()
    }
}

/// Loaded models as the top bar shows them.
#[derive(Debug, Clone, Default)]
pub struct ModelsView {
    pub target: Option<(ModelInfo, String)>,
    pub draft: Option<(ModelInfo, String)>,
    /// What the corpus of "copy from files" holds, or why it could not be read.
    pub corpus: Option<Result<String, String>>,
    pub loading: bool,
    pub progress: Option<(String, Option<f32>)>,
}

/// Label of the experiment's warm-up run (left out of its table).
pub const WARM_UP: &str = "warm-up";

/// The article's experiment: the runs sent to the engine and their results so far.
#[derive(Debug, Default)]
pub struct ExperimentView {
    pub run_id: Option<u64>,
    /// (configuration label, repeat, seed) of every run, in the order sent.
    pub plan: Vec<(String, usize, u64)>,
    /// The stats of each run of `plan` that has ended.
    pub results: Vec<Option<Stats>>,
    /// The pair that ran it, "target + draft".
    pub models: String,
}

/// One configuration's line of the experiment table.
#[derive(Debug, Clone, PartialEq)]
pub struct ExperimentRow {
    pub label: String,
    pub n_runs: usize,
    /// Accepted / drafted over all its runs (None for target-only).
    pub acceptance: Option<f64>,
    pub mean_rounds: Option<f64>,
    pub median_e2e_s: f64,
    /// Target-only's time over this configuration's, paired by (repeat, seed): minimum, lower
    /// quartile, median, upper quartile, maximum.
    pub speedup: Option<[f64; 5]>,
    pub mean_target_nll: f64,
}

/// The `q`-quantile of sorted values, interpolated between neighbours.
fn quantile_sorted(v: &[f64], q: f64) -> f64 {
    let at = q.clamp(0.0, 1.0) * (v.len().saturating_sub(1)) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    match (v.get(lo), v.get(hi)) {
        (Some(&a), Some(&b)) => a + (b - a) * (at - lo as f64),
        _ => f64::NAN,
    }
}

/// The article's configurations: target-only, fixed k = 4/6/8 at TV 1, fixed 8 at TV 0.75 and
/// 0.5, and lossless adaptive drafting: (label, mode, draft length, TV budget).
pub const ARTICLE_CONFIGS: [(&str, Mode, DraftLen, f64); 7] = [
    ("target", Mode::Target, DraftLen::Fixed(1), 0.0),
    ("fixed=4,tv=1", Mode::Speculative, DraftLen::Fixed(4), 1.0),
    ("fixed=6,tv=1", Mode::Speculative, DraftLen::Fixed(6), 1.0),
    ("fixed=8,tv=1", Mode::Speculative, DraftLen::Fixed(8), 1.0),
    ("fixed=8,tv=0.75", Mode::Speculative, DraftLen::Fixed(8), 0.75),
    ("fixed=8,tv=0.5", Mode::Speculative, DraftLen::Fixed(8), 0.5),
    ("auto,tv=0", Mode::Speculative, DraftLen::Auto, 0.0),
];

/// The published numbers (Qwen2.5 7B + 0.5B on an Apple M2, creative prompt, T = 0.7, 256
/// tokens): (configuration, median end-to-end seconds, acceptance).
pub const ARTICLE_REFERENCE: [(&str, f64, Option<f64>); 4] = [
    ("target", 20.97, None),
    ("fixed=4,tv=1", 24.43, None),
    ("fixed=8,tv=1", 18.51, None),
    ("fixed=8,tv=0.75", 18.82, Some(0.934)),
];

impl ExperimentView {
    /// The runs of the experiment on `base` (prompt, sampling, length, coupling): one warm-up,
    /// then for each repeat and seed every configuration in turn, starting one later each time
    /// so that drift in the machine's speed spreads over all of them. Seeds are base.seed + i.
    pub fn plan_runs(base: &GenerateRequest, seeds: u64, repeats: usize) -> Vec<ExperimentRun> {
        let config = |i: usize, seed: u64, repeat: usize, label: &str| {
            let (_, mode, draft_len, budget) = ARTICLE_CONFIGS[i];
            let drafting = match draft_len {
                DraftLen::Fixed(k) => Drafting::Chain(k),
                DraftLen::Auto => Drafting::adaptive(),
            };
            let req = GenerateRequest {
                mode,
                drafting,
                verify: Verify { rule: crate::mentor::MentorRule::Tv, budget, ..base.verify },
                seed,
                ignore_eos: true,
                ..base.clone()
            };
            ExperimentRun { label: label.to_string(), repeat, req }
        };
        let mut runs = vec![config(4, base.seed.wrapping_add(1_000_003), 0, WARM_UP)];
        let n = ARTICLE_CONFIGS.len();
        for repeat in 0..repeats {
            for s in 0..seeds {
                let shift = (repeat * seeds as usize + s as usize) % n;
                for i in (0..n).map(|i| (i + shift) % n) {
                    runs.push(config(i, base.seed.wrapping_add(s), repeat, ARTICLE_CONFIGS[i].0));
                }
            }
        }
        runs
    }

    pub fn done(&self) -> usize {
        self.results.iter().filter(|r| r.is_some()).count()
    }

    /// The table: one row per configuration, in the order of the plan, warm-up left out.
    pub fn summary(&self) -> Vec<ExperimentRow> {
        let runs: Vec<(&(String, usize, u64), &Stats)> =
            self.plan.iter().zip(&self.results).filter_map(|(p, r)| r.as_ref().map(|s| (p, s))).collect();
        let mut labels: Vec<&str> = Vec::new();
        for (label, ..) in &self.plan {
            if label != WARM_UP && !labels.contains(&label.as_str()) {
                labels.push(label);
            }
        }
        let target_e2e = |repeat: usize, seed: u64| {
            runs.iter().find(|((l, r, s), _)| l == "target" && *r == repeat && *s == seed).map(|(_, st)| st.e2e_s)
        };
        labels
            .into_iter()
            .filter_map(|label| {
                let mine: Vec<_> = runs.iter().filter(|((l, ..), _)| l == label).collect();
                if mine.is_empty() {
                    return None;
                }
                let mut e2e: Vec<f64> = mine.iter().map(|(_, s)| s.e2e_s).collect();
                e2e.sort_by(f64::total_cmp);
                let mut ratios: Vec<f64> = mine
                    .iter()
                    .filter_map(|((_, r, s), st)| target_e2e(*r, *s).map(|t| t / st.e2e_s))
                    .filter(|x| x.is_finite())
                    .collect();
                ratios.sort_by(f64::total_cmp);
                let drafted: usize = mine.iter().map(|(_, s)| s.n_drafted).sum();
                let accepted: usize = mine.iter().map(|(_, s)| s.n_accepted).sum();
                let n = mine.len() as f64;
                let speculative = label != "target";
                Some(ExperimentRow {
                    label: label.to_string(),
                    n_runs: mine.len(),
                    acceptance: (speculative && drafted > 0).then(|| accepted as f64 / drafted as f64),
                    mean_rounds: speculative.then(|| mine.iter().map(|(_, s)| s.n_rounds as f64).sum::<f64>() / n),
                    median_e2e_s: quantile_sorted(&e2e, 0.5),
                    speedup: (!ratios.is_empty())
                        .then(|| [0.0, 0.25, 0.5, 0.75, 1.0].map(|q| quantile_sorted(&ratios, q))),
                    mean_target_nll: mine.iter().map(|(_, s)| s.mean_target_nll).sum::<f64>() / n,
                })
            })
            .collect()
    }
}

/// What the bottom panel shows.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum BottomTab {
    #[default]
    Runs,
    Inspector,
    Experiment,
    Spend,
}

/// Where the last frame drew what the layout promises (read by the layout tests).
#[derive(Debug, Default, Clone)]
pub struct LayoutProbe {
    /// The three live plots' rectangles.
    pub plot_rects: Vec<egui::Rect>,
    /// Last frame's height of what sits below the text panes besides the plots themselves (the
    /// divergence line, the stats, the plots' legend, titles and axes), measured, so the panes
    /// and plots can share the visible height exactly.
    pub below_panes_h: Option<f32>,
    /// Where the bottom panel (runs, inspector, experiment) starts.
    pub bottom_panel_top: Option<f32>,
}

/// Everything the UI shows that is not a setting.
#[derive(Debug, Default)]
pub struct ViewState {
    /// The token pinned in the inspector: its pane and output position.
    pub pinned: Option<(Pane, usize)>,
    pub bottom_tab: BottomTab,
    pub layout: LayoutProbe,
    pub experiment: ExperimentView,
    /// The run whose events are shown; events of any other run are stale and dropped.
    pub current_run: Option<u64>,
    pub target: PaneView,
    pub mentored: PaneView,
    /// The request the target pane's content answers (to reuse it when only mentored settings change).
    pub target_request: Option<GenerateRequest>,
    pub mentored_label: String,
    pub sweep: SweepView,
    /// The last comparisons' per-position spend of their budgets, for the scatter.
    pub spend: Vec<SpendRun>,
    pub models: ModelsView,
    pub error: Option<String>,
    pub n_stale_dropped: usize,
}

impl ViewState {
    pub fn busy(&self) -> bool {
        self.current_run.is_some()
    }

    fn pane_mut(&mut self, pane: Pane) -> &mut PaneView {
        match pane {
            Pane::Target => &mut self.target,
            Pane::Mentored => &mut self.mentored,
        }
    }

    /// Apply one engine event. Returns a finished comparison's mentored stats (for the history).
    pub fn apply(&mut self, ev: EngineEvent) -> Option<(Pane, Stats)> {
        let is_current = |id: u64| {
            self.current_run == Some(id) || self.sweep.run_id == Some(id) || self.experiment.run_id == Some(id)
        };
        match ev {
            EngineEvent::Progress { message, fraction } => {
                self.models.progress = Some((message, fraction));
            }
            EngineEvent::Loaded { target, target_weights, draft } => {
                self.models.loading = false;
                self.models.progress = None;
                self.models.target = Some((target, target_weights));
                self.models.draft = draft;
                // A new model invalidates the cached target-only result.
                self.target_request = None;
            }
            EngineEvent::Notice(message) => self.error = Some(message),
            EngineEvent::CorpusRead(read) => {
                if let Err(e) = &read {
                    self.error = Some(e.clone());
                }
                self.models.corpus = read.transpose();
            }
            EngineEvent::Unloaded => {
                self.models.target = None;
                self.models.draft = None;
                self.target_request = None;
            }
            EngineEvent::Error { run_id, message } => {
                let current = run_id.is_none_or(is_current);
                self.error_event(run_id.is_none(), current, message);
            }
            EngineEvent::Started { run_id, pane } if is_current(run_id) => {
                if self.pinned.is_some_and(|(p, _)| p == pane) {
                    self.pinned = None;
                }
                let p = self.pane_mut(pane);
                *p = PaneView { running: true, ..PaneView::default() };
            }
            EngineEvent::Token { run_id, pane, token, t_s } if is_current(run_id) => {
                let p = self.pane_mut(pane);
                p.tokens.push(token);
                p.token_times.push(t_s);
            }
            EngineEvent::Round { run_id, pane, round, t_s } if is_current(run_id) => {
                self.pane_mut(pane).rounds.push((round, t_s));
            }
            EngineEvent::Finished { run_id, pane, stats, cancelled } if is_current(run_id) => {
                let p = self.pane_mut(pane);
                p.running = false;
                p.cancelled = cancelled;
                p.stats = Some(stats.clone());
                if cancelled {
                    if pane == Pane::Target {
                        self.target_request = None;
                    }
                    return None;
                }
                return Some((pane, stats));
            }
            EngineEvent::SweepPoint { run_id, label, rule, budget, draft_len, seed, stats }
                if self.sweep.run_id == Some(run_id) =>
            {
                self.sweep.points.push(SweepPoint { label, rule, budget, draft_len, seed, stats });
            }
            EngineEvent::ExperimentResult { run_id, index, stats } if self.experiment.run_id == Some(run_id) => {
                if let Some(slot) = self.experiment.results.get_mut(index) {
                    *slot = Some(stats);
                }
            }
            EngineEvent::SweepProgress { run_id, done, total } if self.sweep.run_id == Some(run_id) => {
                self.sweep.done = done;
                self.sweep.total = total;
            }
            EngineEvent::Done { run_id } => self.run_done(run_id),
            _ => self.n_stale_dropped += 1,
        }
        None
    }

    /// An error: of loading (`of_loading`, which then ends), or of a run, shown only if that run
    /// is still `current`.
    fn error_event(&mut self, of_loading: bool, current: bool, message: String) {
        if of_loading {
            self.models.loading = false;
            self.models.progress = None;
        }
        match current {
            true => self.error = Some(message),
            false => self.n_stale_dropped += 1,
        }
    }

    /// The engine finished everything it was asked for under `run_id`.
    fn run_done(&mut self, run_id: u64) {
        if self.current_run == Some(run_id) {
            self.current_run = None;
            self.target.running = false;
            self.mentored.running = false;
        } else if self.sweep.run_id == Some(run_id) {
            self.sweep.run_id = None;
        } else if self.experiment.run_id == Some(run_id) {
            self.experiment.run_id = None;
        } else {
            self.n_stale_dropped += 1;
        }
    }

    /// The pinned token, if it is still there.
    pub fn pinned_token(&self) -> Option<(Pane, &PaneView, &crate::generate::TokenInfo)> {
        let (pane, i) = self.pinned?;
        let view = match pane {
            Pane::Target => &self.target,
            Pane::Mentored => &self.mentored,
        };
        view.tokens.get(i).map(|t| (pane, view, t))
    }

    /// Every output position where both panes have a token and the tokens differ. With the
    /// same-seed coupling a position draws with the same noise in both runs, so a difference there
    /// is what the budget (or the different text before it) changed.
    pub fn differing_positions(&self) -> Vec<usize> {
        let (a, b) = (&self.target.tokens, &self.mentored.tokens);
        (0..a.len().min(b.len())).filter(|&i| a[i].id != b[i].id).collect()
    }

    /// First output position where the two panes' tokens differ.
    pub fn divergence(&self) -> Option<usize> {
        let (a, b) = (&self.target.tokens, &self.mentored.tokens);
        let n = a.len().min(b.len());
        (0..n).find(|&i| a[i].id != b[i].id).or_else(|| {
            let both_done = !self.target.running && !self.mentored.running;
            (both_done && a.len() != b.len()).then_some(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::PaneView;

    fn rates(times: &[f64], window_s: f64) -> Vec<[f64; 2]> {
        PaneView { token_times: times.to_vec(), ..PaneView::default() }.rolling_tok_s(window_s)
    }

    fn assert_points(got: &[[f64; 2]], want: &[[f64; 2]]) {
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g[0] - w[0]).abs() < 1e-12 && (g[1] - w[1]).abs() < 1e-9, "{got:?} != {want:?}");
        }
    }

    #[test]
    fn a_round_delivered_at_once_is_one_point_and_bursts_stay_bounded() {
        // Prefill and a first round of 4 tokens arriving together at 0.5 s, then one every 0.1 s.
        let got = rates(&[0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8], 0.25);
        // From the start until a token is 0.25 s old; at 0.8 s from the round at 0.5 s: 3 in 0.3 s.
        assert_points(&got, &[[0.5, 8.0], [0.6, 5.0 / 0.6], [0.7, 6.0 / 0.7], [0.8, 3.0 / 0.3]]);
        // Bursts of 8 every 0.1 s: never more than the true 80 tokens/s plus one burst per window.
        let bursts: Vec<f64> = (1..=30).flat_map(|r| std::iter::repeat_n(r as f64 * 0.1, 8)).collect();
        let got = rates(&bursts, 0.5);
        assert_eq!(got.len(), 30);
        assert!(got.iter().all(|p| p[1] > 0.0 && p[1] <= 80.0 + 8.0 / 0.5 + 1e-9), "{got:?}");
    }

    #[test]
    fn steady_tokens_give_their_rate_and_nothing_is_infinite() {
        let times: Vec<f64> = (1..=40).map(|i| i as f64 * 0.04).collect();
        let got = rates(&times, 0.5);
        assert_eq!(got.len(), 40);
        assert!(got.iter().all(|p| (p[1] - 25.0).abs() < 1e-9), "{got:?}");
        // A token at time 0 has no rate yet; an empty pane has no points.
        assert!(rates(&[0.0], 0.5).is_empty());
        assert!(rates(&[], 0.5).is_empty());
    }
}
