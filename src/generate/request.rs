//! What defines a run: the request, its draft length and tree shape, and their checks.

use crate::adaptive::{FixedCosts, MAX_DRAFT_LEN};
use crate::error::{EngineError, Result};
use crate::mentor::{Coupling, MentorRule};
use crate::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

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
    fn check(&self) -> std::result::Result<(), String> {
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateRequest {
    pub prompt: String,
    /// Skip the chat template.
    pub raw: bool,
    pub sampling: SamplingParams,
    pub seed: u64,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub mode: Mode,
    /// The rule's one parameter: D in TV distance for `tv`, nats of KL for `kl`, α for `cascade`…
    /// Its name, valid range and lossless value are [`MentorRule::param`]'s.
    pub budget: f64,
    pub rule: MentorRule,
    pub draft_len: DraftLen,
    /// Emit a target token after a fully accepted round (`--no-bonus` turns this off).
    pub bonus: bool,
    /// With an adaptive draft length, also draft by copying from the context where the policy
    /// expects that to pay ([`crate::lookup`]; `--no-lookup` turns this off).
    pub lookup: bool,
    /// With copying on: a round that drafted with the model may go on by copying where its
    /// drafted tokens led back to a passage of the context (`--no-copy-tail` turns this off: a
    /// round then copies from its start or not at all).
    pub copy_tail: bool,
    /// Record this many of the most likely tokens at every position (p, q and π), for the token
    /// inspector; 0 records none (a pass over the vocabulary per distribution).
    pub n_top: usize,
    /// How random draws are tied together: the same-seed coupling makes a run's text depend only on
    /// the seed and the distributions (D = 0 reproduces target-only exactly); max-acceptance
    /// accepts more drafted tokens.
    pub coupling: Coupling,
    /// With an adaptive draft length: decide from these costs instead of measured times, so
    /// that a run's rounds depend only on the text and the seed (deterministic tests).
    #[serde(default)]
    pub costs: Option<FixedCosts>,
    /// Draft a tree of candidates each round instead of a chain.
    #[serde(default)]
    pub tree: Option<TreeShape>,
    /// Under the same-seed coupling, with an independent draft: verify beside the drafted chain
    /// the draft's runners-up where the policy expects them to pay (one-token branches).
    #[serde(default)]
    pub side_offers: bool,
}

impl Default for GenerateRequest {
    fn default() -> Self {
        Self {
            prompt: String::new(),
            raw: false,
            sampling: SamplingParams::default(),
            seed: 42,
            max_tokens: 128,
            ignore_eos: false,
            mode: Mode::Target,
            budget: 0.0,
            rule: MentorRule::Tv,
            draft_len: DraftLen::default(),
            bonus: true,
            lookup: true,
            copy_tail: true,
            coupling: Coupling::default(),
            n_top: 0,
            costs: None,
            tree: None,
            side_offers: false,
        }
    }
}

impl GenerateRequest {
    /// The rule's own quantities at a drafted position ([`crate::MentorRule::explain`]), when the
    /// request records the inspector's numbers (`n_top > 0`: they take a few passes over the
    /// vocabulary).
    pub(crate) fn rule_notes(&self, p: &[f32], q: &[f32], drafted: u32) -> Vec<(String, f64)> {
        match self.n_top {
            0 => Vec::new(),
            _ => self.rule.explain(p, q, self.budget, drafted).into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.sampling.validate().map_err(EngineError::InvalidSetting)?;
        if let Some(c) = self.costs {
            let ok = [c.draft_token_s, c.verify_base_s, c.verify_row_s].iter().all(|v| v.is_finite() && *v >= 0.0);
            if !ok || c.verify_base_s + c.verify_row_s <= 0.0 {
                return Err(EngineError::InvalidSetting(format!(
                    "fixed costs must be finite, non-negative, and a verify must cost something: {c:?}"
                )));
            }
        }
        if self.max_tokens == 0 {
            return Err(EngineError::InvalidSetting("max tokens must be at least 1".into()));
        }
        if let Err(e) = self.rule.param().check(self.budget) {
            return Err(EngineError::InvalidSetting(format!(
                "{e} under the {} rule; choose a budget in that range",
                self.rule
            )));
        }
        if let DraftLen::Fixed(k) = self.draft_len {
            if !(1..=MAX_DRAFT_LEN).contains(&k) {
                return Err(EngineError::InvalidSetting(format!("draft length must be 1..={MAX_DRAFT_LEN}, got {k}")));
            }
        }
        if let Some(t) = self.tree {
            t.check().map_err(EngineError::InvalidSetting)?;
        }
        Ok(())
    }
}
