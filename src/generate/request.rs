//! What defines a run: the request, its draft length and tree shape, and their checks.

use crate::adaptive::MAX_DRAFT_LEN;
use crate::error::{EngineError, Result};
use crate::mentor::Coupling;
use crate::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

pub use super::drafting::{Adaptive, Branches, Drafting, Lookup, Verify};
use super::Mode;

/// Tokens drafted per round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DraftLen {
    Fixed(usize),
    /// Chosen each round by [`AdaptivePolicy`].
    Auto,
}

impl Default for DraftLen {
    fn default() -> Self {
        DraftLen::Fixed(4)
    }
}

impl std::str::FromStr for DraftLen {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") || s.eq_ignore_ascii_case("adaptive") {
            return Ok(Self::Auto);
        }
        match s.parse::<usize>() {
            Ok(k) if (1..=MAX_DRAFT_LEN).contains(&k) => Ok(Self::Fixed(k)),
            _ => Err(format!("draft length must be 1..={MAX_DRAFT_LEN} or `auto`, got `{s}`")),
        }
    }
}

impl std::fmt::Display for DraftLen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftLen::Fixed(k) => write!(f, "{k}"),
            DraftLen::Auto => write!(f, "auto"),
        }
    }
}

/// A tree of candidates per round ([`TreeShape::parse`]: `WxD`): at each depth up to `width`
/// nodes, the most likely continuations of the depth before, each offering its `width` best
/// tokens of the draft's same-seed race; `depth` deep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeShape {
    pub width: usize,
    pub depth: usize,
}

/// The widest tree a round may draft.
pub const MAX_TREE_WIDTH: usize = 8;

impl std::str::FromStr for TreeShape {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!(
                "a tree is WIDTHxDEPTH, e.g. 3x6 (width 1..={MAX_TREE_WIDTH}, depth 1..={MAX_DRAFT_LEN}), got `{s}`"
            )
        };
        let (w, d) = s.split_once(['x', 'X']).ok_or_else(bad)?;
        let (width, depth) =
            (w.trim().parse::<usize>().map_err(|_| bad())?, d.trim().parse::<usize>().map_err(|_| bad())?);
        let shape = TreeShape { width, depth };
        shape.check().map_err(|_| bad())?;
        Ok(shape)
    }
}

impl std::fmt::Display for TreeShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.width, self.depth)
    }
}

impl TreeShape {
    pub(super) fn check(&self) -> std::result::Result<(), String> {
        match (1..=MAX_TREE_WIDTH).contains(&self.width) && (1..=MAX_DRAFT_LEN).contains(&self.depth) {
            true => Ok(()),
            false => Err(format!(
                "a tree is 1..={MAX_TREE_WIDTH} wide and 1..={MAX_DRAFT_LEN} deep, got {}x{}",
                self.width, self.depth
            )),
        }
    }
}

/// Everything that defines one run. Same request + same models = same output.
///
/// Its parts: the text and its sampling (prompt, sampling, seed, coupling, length), the mode,
/// and for speculative runs what each round drafts ([`Drafting`]) and how drafted tokens are
/// checked ([`Verify`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateRequest {
    pub prompt: String,
    /// Skip the chat template.
    pub raw: bool,
    pub sampling: SamplingParams,
    pub seed: u64,
    /// How random draws are tied together: the same-seed coupling makes a run's text depend only on
    /// the seed and the distributions (D = 0 reproduces target-only exactly); max-acceptance
    /// accepts more drafted tokens.
    pub coupling: Coupling,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    /// Record this many of the most likely tokens at every position (p, q and π), for the token
    /// inspector; 0 records none (a pass over the vocabulary per distribution).
    pub n_top: usize,
    pub mode: Mode,
    /// What each round drafts (speculative mode).
    pub drafting: Drafting,
    /// How drafted tokens are checked (speculative mode).
    pub verify: Verify,
}

impl Default for GenerateRequest {
    fn default() -> Self {
        Self {
            prompt: String::new(),
            raw: false,
            sampling: SamplingParams::default(),
            seed: 42,
            coupling: Coupling::default(),
            max_tokens: 128,
            ignore_eos: false,
            n_top: 0,
            mode: Mode::Target,
            drafting: Drafting::default(),
            verify: Verify::default(),
        }
    }
}

impl GenerateRequest {
    /// The rule's own quantities at a drafted position ([`crate::MentorRule::explain`]), when the
    /// request records the inspector's numbers (`n_top > 0`: they take a few passes over the
    /// vocabulary).
    pub(crate) fn rule_notes(&self, p: &[f32], q: &[f32], drafted: u32) -> Vec<(String, f64)> {
        let v = self.verify;
        match self.n_top {
            0 => Vec::new(),
            _ => v.rule.explain(p, q, v.budget, drafted).into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.sampling.validate().map_err(EngineError::InvalidSetting)?;
        if self.max_tokens == 0 {
            return Err(EngineError::InvalidSetting("max tokens must be at least 1".into()));
        }
        let Verify { rule, budget, .. } = self.verify;
        if let Err(e) = rule.param().check(budget) {
            return Err(EngineError::InvalidSetting(format!(
                "{e} under the {rule} rule; choose a budget in that range"
            )));
        }
        self.drafting.check().map_err(EngineError::InvalidSetting)
    }
}
