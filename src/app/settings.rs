//! What the user set, saved across restarts (separate from runtime state).

use super::engine_thread::ModelChoice;
use crate::generate::{DraftLen, GenerateRequest, Mode};
use crate::mentor::{Coupling, MentorRule};
use crate::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

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
    /// D: TV budget (or KL budget in nats with the KL rule).
    pub budget: f64,
    pub draft_len: usize,
    pub adaptive: bool,
    pub rule: MentorRule,
    /// Same-seed (the panes differ only where the budget bought a change) or max-acceptance.
    pub coupling: Coupling,
    pub bonus: bool,
    /// With the adaptive draft length: also copy from the context ([`crate::lookup`]).
    pub lookup: bool,
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
            models: ModelChoice::default(),
            mark_divergence: true,
            shade_surprise: false,
            zoom: 1.0,
            experiment_seeds: 3,
            experiment_repeats: 1,
            sweep_seeds: 3,
            sweep_budgets: "0, 0.25, 0.5, 0.75, 1".into(),
            sweep_lens: "4, 8".into(),
        }
    }
}

impl Settings {
    pub fn draft_len(&self) -> DraftLen {
        if self.adaptive {
            DraftLen::Auto
        } else {
            DraftLen::Fixed(self.draft_len.clamp(1, crate::adaptive::MAX_DRAFT_LEN))
        }
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
            budget: self.budget,
            rule: self.rule,
            draft_len: self.draft_len(),
            bonus: self.bonus,
            lookup: self.lookup,
            ..self.target_request()
        }
    }

    /// Short description of the mentored configuration, as in the reference's tables.
    pub fn mentored_label(&self) -> String {
        let rule = match self.rule {
            MentorRule::Tv => "TV",
            MentorRule::Kl => "KL",
        };
        let copy = if self.adaptive && !self.lookup { ", no copying" } else { "" };
        let coupling = match self.coupling {
            Coupling::SameSeed => "",
            Coupling::MaxAcceptance => ", max-acceptance",
        };
        format!(
            "{rule}={:.2}, k={}{}{copy}{coupling}",
            self.budget,
            self.draft_len(),
            if self.bonus { "" } else { ", no bonus" }
        )
    }

    /// Parse the sweep grid; an error names the entry that is wrong.
    pub fn sweep_grid(&self) -> Result<(Vec<f64>, Vec<DraftLen>), String> {
        let budgets = self
            .sweep_budgets
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.parse::<f64>() {
                Ok(b) if (0.0..=1.0).contains(&b) || (self.rule == MentorRule::Kl && b >= 0.0) => Ok(b),
                _ => Err(format!("sweep budget `{s}` is not a number in 0..1")),
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
        Ok((budgets, lens))
    }
}
