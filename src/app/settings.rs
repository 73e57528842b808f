//! What the user set, saved across restarts (separate from runtime state).

use super::engine_thread::ModelChoice;
use crate::generate::{DraftLen, Drafting, GenerateRequest, Lookup, Mode, TreeShape, Verify, MAX_TREE_WIDTH};
use crate::mentor::{Coupling, MentorRule};
use crate::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

/// A sweep's points: each rule with one value of its parameter.
pub type SweepGrid = Vec<(MentorRule, f64)>;

/// Values per rule when the sweep covers every rule.
pub const SWEEP_VALUES_PER_RULE: usize = 5;

/// How many tokens the inspector shows per position (p, q and π's most likely).
pub const INSPECTOR_ROWS: usize = 12;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub prompt: String,
    pub raw: bool,
    pub temperature: f32,
    pub repeat_penalty: f32,
    pub top_p: f32,
    pub seed: u64,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    /// The rule's one parameter (the TV budget D under the TV rule; [`MentorRule::param`]).
    pub budget: f64,
    pub draft_len: usize,
    pub adaptive: bool,
    pub rule: MentorRule,
    /// Same-seed (the panes differ only where the budget bought a change) or max-acceptance.
    pub coupling: Coupling,
    pub bonus: bool,
    /// With the adaptive draft length: also copy from the context ([`crate::lookup`]).
    pub lookup: bool,
    /// With copying on: the user's files to copy from too ([`crate::corpus`]).
    pub copy_from: Vec<std::path::PathBuf>,
    /// Same-seed coupling: verify the draft's runners-up beside its chain where they pay.
    pub side_offers: bool,
    /// Draft a tree of candidates `tree_width` wide, as deep as the draft length, instead of a
    /// chain.
    pub tree: bool,
    pub tree_width: usize,
    pub models: ModelChoice,
    pub mark_divergence: bool,
    /// Shade every token by the target's surprise at it (−log p at T = 1) instead of provenance.
    pub shade_surprise: bool,
    /// The UI's zoom factor (Cmd/Ctrl + and −), kept across restarts.
    pub zoom: f32,
    /// The article's experiment: seeds per configuration and repeats of the whole table.
    pub experiment_seeds: u64,
    pub experiment_repeats: usize,
    /// Seeds per point of the sweep grid (settings' seed, seed + 1, …).
    pub sweep_seeds: u64,
    /// Sweep grid, as typed: comma-separated budgets and draft lengths (`auto` allowed).
    pub sweep_budgets: String,
    pub sweep_lens: String,
    /// Sweep every rule, each over five values across its range, instead of the chosen rule over
    /// the budgets typed: the rules' frontier.
    pub sweep_all_rules: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            prompt: crate::presets::PRESETS[0].prompt.to_string(),
            raw: false,
            temperature: 0.7,
            repeat_penalty: 1.0,
            top_p: 1.0,
            seed: 42,
            max_tokens: 128,
            ignore_eos: false,
            budget: 0.5,
            draft_len: 8,
            adaptive: false,
            rule: MentorRule::Tv,
            coupling: Coupling::default(),
            bonus: true,
            lookup: true,
            copy_from: Vec::new(),
            side_offers: false,
            tree: false,
            tree_width: 2,
            models: ModelChoice::default(),
            mark_divergence: true,
            shade_surprise: false,
            zoom: 1.0,
            experiment_seeds: 3,
            experiment_repeats: 1,
            sweep_seeds: 3,
            sweep_budgets: "0, 0.25, 0.5, 0.75, 1".into(),
            sweep_lens: "4, 8".into(),
            sweep_all_rules: false,
        }
    }
}

/// Longest prompt kept from a settings file (bytes): far more than the model's context holds, short
/// enough that the prompt box stays responsive.
pub const MAX_SAVED_PROMPT: usize = 1 << 16;

impl Settings {
    /// Bring every value into the range the controls allow (a settings file may hold anything):
    /// out-of-range numbers are clamped, non-finite ones take their default. Returns the names of
    /// the fields that changed.
    pub fn sanitize(&mut self) -> Vec<&'static str> {
        let d = Settings::default();
        let mut changed = Vec::new();
        let mut fix_f32 = |v: &mut f32, lo: f32, hi: f32, default: f32, name: &'static str| {
            let fixed = if v.is_finite() { v.clamp(lo, hi) } else { default };
            if fixed.to_bits() != v.to_bits() {
                *v = fixed;
                changed.push(name);
            }
        };
        fix_f32(&mut self.temperature, 0.0, 2.0, d.temperature, "temperature");
        fix_f32(&mut self.repeat_penalty, 1.0, 2.0, d.repeat_penalty, "repetition penalty");
        fix_f32(&mut self.top_p, 0.05, 1.0, d.top_p, "top-p");
        fix_f32(&mut self.zoom, 0.5, 3.0, d.zoom, "zoom");
        let budget = self.rule.param().clamp(self.budget, d.budget);
        if budget.to_bits() != self.budget.to_bits() {
            self.budget = budget;
            changed.push("budget");
        }
        let mut fix_usize = |v: &mut usize, lo: usize, hi: usize, name: &'static str| {
            if !(lo..=hi).contains(v) {
                *v = (*v).clamp(lo, hi);
                changed.push(name);
            }
        };
        fix_usize(&mut self.max_tokens, 1, 1024, "max tokens");
        fix_usize(&mut self.draft_len, 1, crate::adaptive::MAX_DRAFT_LEN, "draft length");
        fix_usize(&mut self.experiment_repeats, 1, 20, "experiment repeats");
        fix_usize(&mut self.tree_width, 2, MAX_TREE_WIDTH, "tree width");
        let mut fix_u64 = |v: &mut u64, hi: u64, name: &'static str| {
            if !(1..=hi).contains(v) {
                *v = (*v).clamp(1, hi);
                changed.push(name);
            }
        };
        fix_u64(&mut self.experiment_seeds, 50, "experiment seeds");
        fix_u64(&mut self.sweep_seeds, 20, "sweep seeds");
        if self.prompt.len() > MAX_SAVED_PROMPT {
            let mut end = MAX_SAVED_PROMPT;
            while !self.prompt.is_char_boundary(end) {
                end -= 1;
            }
            self.prompt.truncate(end);
            changed.push("prompt");
        }
        changed
    }

    pub fn draft_len(&self) -> DraftLen {
        if self.adaptive {
            DraftLen::Auto
        } else {
            DraftLen::Fixed(self.draft_len.clamp(1, crate::adaptive::MAX_DRAFT_LEN))
        }
    }

    /// What the mentored pane drafts at draft length `len`: a tree as wide as set (as deep as
    /// `len`, or as the draft length under the adaptive policy) where one is asked for, else a
    /// chain; side offers and copying where the adaptive policy drafts a chain.
    pub fn drafting(&self, len: DraftLen) -> Drafting {
        let depth = match len {
            DraftLen::Fixed(k) => k,
            DraftLen::Auto => self.draft_len.clamp(1, crate::adaptive::MAX_DRAFT_LEN),
        };
        let tree = self.tree.then(|| TreeShape { width: self.tree_width.clamp(2, MAX_TREE_WIDTH), depth });
        let side_offers = self.side_offers && len == DraftLen::Auto && tree.is_none();
        let lookup = if self.lookup { Lookup::StartAndTail } else { Lookup::Off };
        Drafting::from_controls(len, tree, side_offers, lookup).unwrap_or_default()
    }

    /// The request of the "Target only" pane.
    pub fn target_request(&self) -> GenerateRequest {
        GenerateRequest {
            prompt: self.prompt.clone(),
            raw: self.raw,
            sampling: SamplingParams {
                temperature: self.temperature,
                repeat_penalty: self.repeat_penalty,
                top_p: self.top_p,
                ..SamplingParams::default()
            },
            seed: self.seed,
            max_tokens: self.max_tokens,
            ignore_eos: self.ignore_eos,
            mode: Mode::Target,
            coupling: self.coupling,
            n_top: INSPECTOR_ROWS,
            ..GenerateRequest::default()
        }
    }

    /// The request of the "Mentored" pane: same prompt, seed and sampling as the target pane.
    pub fn mentored_request(&self) -> GenerateRequest {
        GenerateRequest {
            mode: Mode::Speculative,
            verify: Verify { rule: self.rule, budget: self.budget, bonus: self.bonus },
            drafting: self.drafting(self.draft_len()),
            ..self.target_request()
        }
    }

    /// Short description of the mentored configuration, as in the reference's tables.
    pub fn mentored_label(&self) -> String {
        let rule = self.rule.label();
        let copy = if self.adaptive && !self.lookup { ", no copying" } else { "" };
        let side_offers = self.drafting(self.draft_len()).side_offers();
        let coupling = match (self.coupling, side_offers) {
            (Coupling::SameSeed, false) => "",
            (Coupling::SameSeed, true) => ", runners-up",
            (Coupling::MaxAcceptance, _) => ", max-acceptance",
        };
        let shape = match self.drafting(self.draft_len()).tree() {
            Some(t) => format!("tree {t}"),
            None => format!("k={}", self.draft_len()),
        };
        format!("{rule}={:.2}, {shape}{}{copy}{coupling}", self.budget, if self.bonus { "" } else { ", no bonus" })
    }

    /// Parse the sweep grid: (rule, value) points and draft lengths; an error names the entry
    /// that is wrong.
    pub fn sweep_grid(&self) -> Result<(SweepGrid, Vec<DraftLen>), String> {
        let budgets = self
            .sweep_budgets
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                let param = self.rule.param();
                match s.parse::<f64>() {
                    Ok(b) => param.check(b).map_err(|e| format!("sweep budget `{s}`: {e}")),
                    Err(_) => Err(format!(
                        "sweep budget `{s}` is not a number ({} {}..={})",
                        param.name, param.min, param.max
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let lens = self
            .sweep_lens
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<DraftLen>().map_err(|e| format!("sweep draft length: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if budgets.is_empty() || lens.is_empty() {
            return Err("the sweep needs at least one budget and one draft length".into());
        }
        let grid = match self.sweep_all_rules {
            true => MentorRule::ALL
                .into_iter()
                .flat_map(|r| r.param().frontier_values(SWEEP_VALUES_PER_RULE).into_iter().map(move |v| (r, v)))
                .collect(),
            false => budgets.into_iter().map(|b| (self.rule, b)).collect(),
        };
        Ok((grid, lens))
    }
}
