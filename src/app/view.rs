//! Runtime view state: what the panes, plots and tables show, built from engine events. No model
//! math here; the engine computed every number.

use super::engine_thread::{EngineEvent, Pane};
use crate::generate::{DraftLen, GenerateRequest, RoundInfo, Stats, TokenInfo};
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
}

impl RunRecord {
    pub const CSV_HEADER: &'static str =
        "when,config,prompt,seed,temperature,n_tokens,acceptance,rounds,e2e_s,tok_s,speedup,target_nll,mean_tv";

    pub fn csv_row(&self) -> String {
        let prompt = self.prompt.replace('"', "\"\"");
        format!(
            "{},{},\"{}\",{},{},{},{:.4},{},{:.4},{:.2},{:.4},{:.4},{:.4}",
            self.when,
            self.config,
            prompt,
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

/// One point of a sweep: the speed/quality frontier.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    pub label: String,
    pub budget: f64,
    pub draft_len: DraftLen,
    pub stats: Stats,
}

#[derive(Debug, Clone, Default)]
pub struct SweepView {
    pub run_id: Option<u64>,
    pub points: Vec<SweepPoint>,
    pub done: usize,
    pub total: usize,
}

impl SweepView {
    /// (target NLL, speedup vs target-only, label) for each speculative point.
    pub fn frontier(&self) -> Vec<(f64, f64, String)> {
        let Some(base) = self.points.iter().find(|p| p.label == "target") else { return Vec::new() };
        self.points
            .iter()
            .map(|p| (p.stats.mean_target_nll, base.stats.e2e_s / p.stats.e2e_s.max(1e-9), p.label.clone()))
            .collect()
    }
}

/// Loaded models as the top bar shows them.
#[derive(Debug, Clone, Default)]
pub struct ModelsView {
    pub target: Option<(ModelInfo, String)>,
    pub draft: Option<(ModelInfo, String)>,
    pub loading: bool,
    pub progress: Option<(String, Option<f32>)>,
}

/// What the bottom panel shows.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum BottomTab {
    #[default]
    Runs,
    Inspector,
}

/// Where the last frame drew what the layout promises (read by the layout tests).
#[derive(Debug, Default, Clone)]
pub struct LayoutProbe {
    /// The three live plots' rectangles.
    pub plot_rects: Vec<egui::Rect>,
}

/// Everything the UI shows that is not a setting.
#[derive(Debug, Default)]
pub struct ViewState {
    /// The token pinned in the inspector: its pane and output position.
    pub pinned: Option<(Pane, usize)>,
    pub bottom_tab: BottomTab,
    pub layout: LayoutProbe,
    /// The run whose events are shown; events of any other run are stale and dropped.
    pub current_run: Option<u64>,
    pub target: PaneView,
    pub mentored: PaneView,
    /// The request the target pane's content answers (to reuse it when only mentored settings change).
    pub target_request: Option<GenerateRequest>,
    pub mentored_label: String,
    pub sweep: SweepView,
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
        let is_current = |id: u64| self.current_run == Some(id) || self.sweep.run_id == Some(id);
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
            EngineEvent::Error { run_id, message } => {
                if run_id.is_none() {
                    self.models.loading = false;
                    self.models.progress = None;
                }
                if run_id.is_none_or(is_current) {
                    self.error = Some(message);
                } else {
                    self.n_stale_dropped += 1;
                }
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
            EngineEvent::SweepPoint { run_id, label, budget, draft_len, stats }
                if self.sweep.run_id == Some(run_id) =>
            {
                self.sweep.points.push(SweepPoint { label, budget, draft_len, stats });
            }
            EngineEvent::SweepProgress { run_id, done, total } if self.sweep.run_id == Some(run_id) => {
                self.sweep.done = done;
                self.sweep.total = total;
            }
            EngineEvent::Done { run_id } => {
                if self.current_run == Some(run_id) {
                    self.current_run = None;
                    self.target.running = false;
                    self.mentored.running = false;
                } else if self.sweep.run_id == Some(run_id) {
                    self.sweep.run_id = None;
                } else {
                    self.n_stale_dropped += 1;
                }
            }
            _ => self.n_stale_dropped += 1,
        }
        None
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
