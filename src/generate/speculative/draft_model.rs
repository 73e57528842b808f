//! The draft model of a pair, as the decoding loop drives it: start, catch up on the context,
//! step one token, settle after a round.

use super::super::{prefill, LoadedModel};
use crate::error::{EngineError, Result};
use crate::gguf::FeatureDraftSpec;
use crate::model::{LazyLogits, Transformer};

/// A draft tree node's logits and, for a feature draft, its predicted next feature.
pub(super) type NodeRow = (Vec<f32>, Option<Vec<f32>>);

/// The draft model of a pair: the independent draft reads tokens; the feature draft reads the
/// target's hidden states too (see `Transformer::forward_features`).
pub(super) enum DraftModel {
    Independent,
    Feature {
        /// The draft's input feature for every position the target has run.
        feats: Vec<f32>,
        /// The target's width (one feature).
        d_feat: usize,
        /// The draft's prediction of the next feature, which its next step reads.
        predicted: Vec<f32>,
    },
}

impl DraftModel {
    /// Both models ready for the prompt `ids`: every token but the last is in their caches.
    pub(super) fn start(target: &mut LoadedModel, draft: &mut LoadedModel, ids: &[u32]) -> Result<Self> {
        let spec = feature_draft_for(target, draft)?;
        target.model.set_taps(spec.as_ref().map(|s| s.taps.as_slice()).unwrap_or(&[]))?;
        if spec.is_none() {
            prefill(&mut target.model, ids)?;
            prefill(&mut draft.model, ids)?;
            return Ok(DraftModel::Independent);
        }
        draft.model.borrow_embedding(&target.model)?;
        target.model.clear()?;
        draft.model.clear()?;
        let mut feats = Vec::new();
        if ids.len() > 1 {
            let h = target.model.feed_hidden(&ids[..ids.len() - 1])?;
            feats = draft.model.lift_features(&h, target.model.last_taps())?;
        }
        Ok(DraftModel::Feature { feats, d_feat: target.model.config.n_embd, predicted: Vec::new() })
    }

    /// Whether the draft can propose in a round that starts at context length `base`: a feature
    /// draft needs the feature of at least one position.
    pub(super) fn can_draft(&self, base: usize) -> bool {
        !matches!(self, DraftModel::Feature { .. }) || base >= 2
    }

    /// A round's first draft forward: catches up on the context the draft has not seen and
    /// returns the logits for the next token and how many tokens it fed.
    pub(super) fn catch_up(&mut self, dmodel: &mut Transformer, context: &[u32]) -> Result<(Vec<f32>, usize)> {
        let from = dmodel.n_cached();
        match self {
            DraftModel::Independent => Ok((dmodel.forward_last(&context[from..])?, context.len() - from)),
            DraftModel::Feature { feats, d_feat, predicted } => {
                // Position i reads the target's feature at i and the token at i + 1.
                let base = context.len();
                let f = feats
                    .get(from * *d_feat..(base - 1) * *d_feat)
                    .ok_or_else(|| EngineError::Internal("feature draft: target features missing".into()))?;
                let (h, logits) = dmodel.forward_features(&context[from + 1..base], f)?;
                *predicted = h;
                Ok((logits, base - 1 - from))
            }
        }
    }

    /// The logits after drafting `x`.
    pub(super) fn step(&mut self, dmodel: &mut Transformer, x: u32) -> Result<Vec<f32>> {
        match self {
            DraftModel::Independent => Ok(dmodel.forward_rows(&[x])?.remove(0)),
            DraftModel::Feature { predicted, .. } => {
                let (h, logits) = dmodel.forward_features(&[x], predicted)?;
                *predicted = h;
                Ok(logits)
            }
        }
    }

    /// The draft's rows for tree nodes `tokens` that follow the draft's tree nodes `parents`
    /// (None: the context). A feature draft reads node i's parent's predicted feature `feats[i]`.
    /// Returns per node its logits and, for a feature draft, its predicted next feature.
    pub(super) fn tree_step(
        &mut self,
        dmodel: &mut Transformer,
        tokens: &[u32],
        parents: &[Option<usize>],
        feats: &[&[f32]],
    ) -> Result<Vec<NodeRow>> {
        let missing = || EngineError::Internal("tree: draft row missing".into());
        match self {
            DraftModel::Independent => {
                let mut rows = dmodel.forward_tree(tokens, parents)?;
                dmodel.lazy_rows(&mut rows, tokens.len())?;
                (0..tokens.len()).map(|i| Ok((rows.row(i).ok_or_else(missing)?.to_vec(), None))).collect()
            }
            DraftModel::Feature { d_feat, .. } => {
                let d = *d_feat;
                let (h, logits) = dmodel.forward_features_tree(tokens, &feats.concat(), parents)?;
                Ok(logits.into_iter().zip(h.chunks_exact(d)).map(|(l, f)| (l, Some(f.to_vec()))).collect())
            }
        }
    }

    /// The feature a feature draft predicted for the last position it caught up on (the round's
    /// root); None for an independent draft.
    pub(super) fn predicted(&self) -> Option<&[f32]> {
        match self {
            DraftModel::Independent => None,
            DraftModel::Feature { predicted, .. } => Some(predicted),
        }
    }

    /// Roll the draft back after a tree round that started at `base` and settled the context up
    /// to `keep + 1` tokens along the target's tree nodes `path` (root first). An independent
    /// draft keeps its rows of the path (`fed`: their indices among the draft's tree nodes); a
    /// feature draft takes the target's features of the settled path nodes, as after a chain.
    pub(super) fn settle_tree(
        &mut self,
        tmodel: &Transformer,
        dmodel: &mut Transformer,
        rows: &LazyLogits,
        (base, keep): (usize, usize),
        (path, fed): (&[usize], &[usize]),
    ) -> Result<()> {
        match self {
            DraftModel::Independent => {
                if !fed.is_empty() {
                    dmodel.keep_path(fed)?;
                }
                dmodel.truncate(keep);
            }
            DraftModel::Feature { feats, d_feat, .. } => {
                let n = (keep + 1).saturating_sub(base);
                let settled = &path[..n.min(path.len())];
                settle_features(feats, *d_feat, (tmodel, dmodel), rows, base, settled)?;
            }
        }
        Ok(())
    }

    /// Roll the draft back after a round that started at `base` and settled the context up to
    /// `keep + 1` tokens. A feature draft takes the target's features of the settled positions
    /// (its verify rows up to the last emitted token: the chain's, then `side_row`'s where a side
    /// offer was taken) and keeps only positions computed from true features. An independent
    /// draft keeps its rows of the `n_accepted` chain tokens (it never ran a side offer).
    pub(super) fn settle(
        &mut self,
        tmodel: &Transformer,
        dmodel: &mut Transformer,
        rows: &LazyLogits,
        (base, keep, n_accepted): (usize, usize, usize),
        side_row: Option<usize>,
    ) -> Result<()> {
        match self {
            DraftModel::Independent => dmodel.truncate(keep.min(base + n_accepted)),
            DraftModel::Feature { feats, d_feat, .. } => {
                let n = keep + 1 - base;
                // The side offer's row is a settled position only if a token followed it.
                let side_row = side_row.filter(|_| n == n_accepted + 2);
                let settled: Vec<usize> = (0..n).map(|r| if r + 1 == n { side_row.unwrap_or(r) } else { r }).collect();
                settle_features(feats, *d_feat, (tmodel, dmodel), rows, base, &settled)?;
            }
        }
        Ok(())
    }
}

/// A feature draft's roll-back after a round that started at `base`: the target's features of
/// its verify rows `settled` (the positions from `base - 1` on, in order) are lifted and stored,
/// and the draft's cache keeps only the positions computed from true features.
fn settle_features(
    feats: &mut Vec<f32>,
    d: usize,
    (tmodel, dmodel): (&Transformer, &mut Transformer),
    rows: &LazyLogits,
    base: usize,
    settled: &[usize],
) -> Result<()> {
    let (hidden, taps) = (rows.hidden(), tmodel.last_taps());
    let per_row = taps.len() / rows.len().max(1);
    let missing = || EngineError::Internal("feature draft: verify hidden states missing".into());
    let (mut h, mut t) = (Vec::with_capacity(settled.len() * d), Vec::with_capacity(settled.len() * per_row));
    for &r in settled {
        h.extend_from_slice(hidden.get(r * d..(r + 1) * d).ok_or_else(missing)?);
        t.extend_from_slice(taps.get(r * per_row..(r + 1) * per_row).unwrap_or(&[]));
    }
    feats.truncate((base - 1) * d);
    feats.extend(dmodel.lift_features(&h, &t)?);
    dmodel.truncate(base - 1);
    Ok(())
}

/// The feature draft's spec when `draft` is one, checked against `target`.
fn feature_draft_for(target: &LoadedModel, draft: &LoadedModel) -> Result<Option<FeatureDraftSpec>> {
    let Some(spec) = draft.model.feature_spec() else { return Ok(None) };
    let c = &target.model.config;
    if spec.target_layers != c.n_layer || spec.target_embd != c.n_embd {
        return Err(EngineError::InvalidSetting(format!(
            "{} is a feature draft for a target of {} blocks, {} wide; {} has {} blocks, {} wide. \
             Pick the target it was trained for, or an independent draft",
            draft.info.path.display(),
            spec.target_layers,
            spec.target_embd,
            target.info.path.display(),
            c.n_layer,
            c.n_embd
        )));
    }
    Ok(Some(spec.clone()))
}
