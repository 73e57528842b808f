//! What a round drafts and how its tokens are checked: the request's typed parts, so that a
//! request cannot name a combination the decoder would ignore.

use super::request::{DraftLen, TreeShape};
use crate::adaptive::{FixedCosts, MAX_DRAFT_LEN};
use crate::mentor::MentorRule;
use serde::{Deserialize, Serialize};

/// What each round drafts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Drafting {
    /// `k` tokens from the draft model, one after another.
    Chain(usize),
    /// A tree of candidates of this shape, verified in one forward.
    Tree(TreeShape),
    /// What the adaptive policy chooses each round from the measured costs and acceptance.
    Adaptive(Adaptive),
}

impl Default for Drafting {
    fn default() -> Self {
        Drafting::Chain(4)
    }
}

/// A chain of k tokens, or the adaptive policy with its defaults.
impl From<DraftLen> for Drafting {
    fn from(len: DraftLen) -> Self {
        match len {
            DraftLen::Fixed(k) => Drafting::Chain(k),
            DraftLen::Auto => Drafting::adaptive(),
        }
    }
}

/// The adaptive policy's options.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Adaptive {
    /// The shape a round may take.
    pub branches: Branches,
    /// Drafting by copying from the context ([`crate::lookup`]).
    pub lookup: Lookup,
    /// Decide from these costs instead of measured times, so that a run's rounds depend only on
    /// the text and the seed (deterministic tests).
    pub costs: Option<FixedCosts>,
}

/// The shape of an adaptive round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Branches {
    /// A chain, as long as the policy's depth rule says it pays.
    #[default]
    Chain,
    /// A chain with the draft's runners-up verified beside it where the policy expects them to
    /// pay (one-token branches), under the same-seed coupling; under max-acceptance a chain.
    SideOffers,
    /// A tree inside this shape, shaped by the policy.
    Tree(TreeShape),
}

/// Where an adaptive round may copy from the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lookup {
    /// Never.
    Off,
    /// At the start of a round, instead of drafting with the model.
    Start,
    /// At the start, and after drafted tokens that led back into a passage of the context.
    #[default]
    StartAndTail,
}

impl Lookup {
    /// From two switches: copying at all, and after drafted tokens too.
    pub fn from_flags(on: bool, tail: bool) -> Self {
        match (on, tail) {
            (false, _) => Lookup::Off,
            (true, false) => Lookup::Start,
            (true, true) => Lookup::StartAndTail,
        }
    }
}

impl Drafting {
    /// The adaptive policy with its defaults (a chain, copying on).
    pub fn adaptive() -> Self {
        Drafting::Adaptive(Adaptive::default())
    }

    /// From separate controls (the CLI's flags, the app's settings): a tree where a shape is
    /// given (shaped by the policy inside it when `len` is auto), else a chain. Side offers are
    /// the adaptive chain's; asking for them elsewhere is an error that says so.
    pub fn from_controls(
        len: DraftLen,
        tree: Option<TreeShape>,
        side_offers: bool,
        lookup: Lookup,
    ) -> std::result::Result<Self, String> {
        if side_offers && tree.is_some() {
            return Err(
                "side offers are one-token branches of a chain; a tree already branches: ask for one of them".into()
            );
        }
        Ok(match (len, tree) {
            (DraftLen::Fixed(_), Some(shape)) => Drafting::Tree(shape),
            (DraftLen::Fixed(_), None) if side_offers => {
                return Err("side offers are chosen by the adaptive policy: use an adaptive draft length (auto)".into())
            }
            (DraftLen::Fixed(k), None) => Drafting::Chain(k),
            (DraftLen::Auto, _) => {
                let branches = match (tree, side_offers) {
                    (Some(shape), _) => Branches::Tree(shape),
                    (None, true) => Branches::SideOffers,
                    (None, false) => Branches::Chain,
                };
                Drafting::Adaptive(Adaptive { branches, lookup, costs: None })
            }
        })
    }

    /// The draft length this drafting stands for in tables: k, a tree's depth, or auto.
    pub fn len(&self) -> DraftLen {
        match self {
            Drafting::Chain(k) => DraftLen::Fixed(*k),
            Drafting::Tree(shape) => DraftLen::Fixed(shape.depth),
            Drafting::Adaptive(_) => DraftLen::Auto,
        }
    }

    pub fn is_adaptive(&self) -> bool {
        matches!(self, Drafting::Adaptive(_))
    }

    /// The tree each round drafts, fixed or as the policy's bound.
    pub fn tree(&self) -> Option<TreeShape> {
        match self {
            Drafting::Tree(shape) | Drafting::Adaptive(Adaptive { branches: Branches::Tree(shape), .. }) => {
                Some(*shape)
            }
            _ => None,
        }
    }

    /// Whether the adaptive chain offers the draft's runners-up beside it.
    pub fn side_offers(&self) -> bool {
        matches!(self, Drafting::Adaptive(Adaptive { branches: Branches::SideOffers, .. }))
    }

    /// Where rounds may copy from the context: only the adaptive policy copies.
    pub fn lookup(&self) -> Lookup {
        match self {
            Drafting::Adaptive(a) => a.lookup,
            _ => Lookup::Off,
        }
    }

    /// The adaptive policy's fixed costs, where given.
    pub fn costs(&self) -> Option<FixedCosts> {
        match self {
            Drafting::Adaptive(a) => a.costs,
            _ => None,
        }
    }

    /// This drafting with the adaptive policy deciding from `costs` (other draftings unchanged).
    pub fn with_costs(self, costs: Option<FixedCosts>) -> Self {
        match self {
            Drafting::Adaptive(a) => Drafting::Adaptive(Adaptive { costs, ..a }),
            other => other,
        }
    }

    /// This drafting with the adaptive policy copying as `lookup` says (other draftings unchanged).
    pub fn with_lookup(self, lookup: Lookup) -> Self {
        match self {
            Drafting::Adaptive(a) => Drafting::Adaptive(Adaptive { lookup, ..a }),
            other => other,
        }
    }

    pub(super) fn check(&self) -> std::result::Result<(), String> {
        if let Drafting::Chain(k) = self {
            if !(1..=MAX_DRAFT_LEN).contains(k) {
                return Err(format!("draft length must be 1..={MAX_DRAFT_LEN}, got {k}"));
            }
        }
        if let Some(c) = self.costs() {
            let ok = [c.draft_token_s, c.verify_base_s, c.verify_row_s].iter().all(|v| v.is_finite() && *v >= 0.0);
            if !ok || c.verify_base_s + c.verify_row_s <= 0.0 {
                return Err(format!(
                    "fixed costs must be finite, non-negative, and a verify must cost something: {c:?}"
                ));
            }
        }
        match self.tree() {
            Some(shape) => shape.check(),
            None => Ok(()),
        }
    }
}

/// How drafted tokens are checked: the mentor rule and its budget, and the bonus token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Verify {
    pub rule: MentorRule,
    /// The rule's one parameter: D in TV distance for `tv`, nats of KL for `kl`, α for
    /// `cascade`… Its name, valid range and lossless value are [`MentorRule::param`]'s.
    pub budget: f64,
    /// Emit a target token after a fully accepted round (`--no-bonus` turns this off).
    pub bonus: bool,
}

impl Default for Verify {
    fn default() -> Self {
        Verify { rule: MentorRule::Tv, budget: 0.0, bonus: true }
    }
}

impl Verify {
    /// The rule at `budget`, with the bonus token.
    pub fn rule(rule: MentorRule, budget: f64) -> Self {
        Verify { rule, budget, bonus: true }
    }

    /// The TV rule at budget `d`, with the bonus token.
    pub fn tv(d: f64) -> Self {
        Verify::rule(MentorRule::Tv, d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_make_one_drafting_and_refuse_side_offers_where_they_cannot_apply() {
        let shape = TreeShape { width: 2, depth: 3 };
        let on = Lookup::StartAndTail;
        assert_eq!(Drafting::from_controls(DraftLen::Fixed(5), None, false, on), Ok(Drafting::Chain(5)));
        assert_eq!(Drafting::from_controls(DraftLen::Fixed(5), Some(shape), false, on), Ok(Drafting::Tree(shape)));
        let auto_tree = Drafting::from_controls(DraftLen::Auto, Some(shape), false, Lookup::Off).unwrap();
        assert_eq!((auto_tree.tree(), auto_tree.lookup(), auto_tree.len()), (Some(shape), Lookup::Off, DraftLen::Auto));
        let side = Drafting::from_controls(DraftLen::Auto, None, true, on).unwrap();
        assert!(side.side_offers() && side.tree().is_none());
        assert!(Drafting::from_controls(DraftLen::Fixed(4), None, true, on).unwrap_err().contains("adaptive"));
        assert!(Drafting::from_controls(DraftLen::Auto, Some(shape), true, on).unwrap_err().contains("tree"));
        // Only the adaptive policy copies and takes fixed costs.
        let costs = Some(FixedCosts::default_pair(0.01));
        assert_eq!(Drafting::Chain(4).with_costs(costs).costs(), None);
        assert_eq!(Drafting::Chain(4).with_lookup(on).lookup(), Lookup::Off);
        assert_eq!(Drafting::adaptive().with_costs(costs).costs(), costs);
        assert_eq!(Lookup::from_flags(true, false), Lookup::Start);
        assert_eq!(Lookup::from_flags(false, true), Lookup::Off);
    }

    #[test]
    fn checks_name_what_is_out_of_range() {
        assert!(Drafting::Chain(0).check().unwrap_err().contains("1..="));
        assert!(Drafting::Chain(MAX_DRAFT_LEN + 1).check().is_err());
        assert!(Drafting::Chain(MAX_DRAFT_LEN).check().is_ok());
        assert!(Drafting::Tree(TreeShape { width: 9, depth: 2 }).check().unwrap_err().contains("9x2"));
        let free = FixedCosts { draft_token_s: 0.0, verify_base_s: 0.0, verify_row_s: 0.0 };
        assert!(Drafting::adaptive().with_costs(Some(free)).check().unwrap_err().contains("verify must cost"));
        let nan = FixedCosts { draft_token_s: f64::NAN, ..FixedCosts::default_pair(0.01) };
        assert!(Drafting::adaptive().with_costs(Some(nan)).check().is_err());
    }
}
