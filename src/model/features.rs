//! The feature draft: the target's hidden states tapped at chosen blocks, lifted into the
//! draft's input features, and the draft's step on them.

use super::*;

/// What makes a model a feature draft: what it reads of its target, its input layers, the
/// target whose embedding and head rows it borrowed.
pub(super) struct FeatureDraft {
    pub(super) spec: crate::gguf::FeatureDraftSpec,
    /// Its input layers, where our kernels run them.
    pub(super) input: Option<cpu_step::FeatureInput>,
    /// The head matrix whose embedding and rows it borrowed (its address, to tell whether the
    /// next run's target is the same).
    pub(super) borrowed_from: Option<usize>,
}

impl Transformer {
    /// For a feature draft: the target blocks it reads, and the target shape it needs.
    pub fn feature_spec(&self) -> Option<&crate::gguf::FeatureDraftSpec> {
        self.feature.as_ref().map(|f| &f.spec)
    }

    /// Keep the residual streams after `taps` from every forward (for a feature draft reading
    /// this model; see [`Self::last_taps`]); empty stops it. Needs the CPU step.
    pub fn set_taps(&mut self, taps: &[usize]) -> Result<()> {
        match self.backends.cpu_step_mut() {
            Some(cpu) => {
                cpu.taps = taps.to_vec();
                Ok(())
            }
            None if taps.is_empty() => Ok(()),
            None => Err(EngineError::InvalidSetting(
                "a feature draft needs the target on the CPU step (its hidden states are read there); \
                 use an independent draft on this device"
                    .into(),
            )),
        }
    }

    /// The residual streams after the tapped blocks from the last forward, `(n, taps · n_embd)`.
    pub fn last_taps(&self) -> &[f32] {
        self.backends.cpu.as_ref().map(|c| c.tap_out.as_slice()).unwrap_or(&[])
    }

    /// Feed `tokens` and return their final hidden states `(n, n_embd)`.
    pub fn feed_hidden(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.pooled(|m| m.hidden_of(tokens, None))
    }

    /// A feature draft's features from its target's final hidden states `f: (n, n_embd)` and
    /// tapped residual streams (`(n, taps · n_embd)`, [`Self::last_taps`]).
    pub fn lift_features(&self, f: &[f32], taps: &[f32]) -> Result<Vec<f32>> {
        let fi = self.feature_input()?;
        if !f.len().is_multiple_of(fi.target_embd)
            || taps.len() != f.len() / fi.target_embd * fi.target_embd * fi.taps.len()
        {
            return Err(EngineError::InvalidSetting(
                "feature draft: target hidden states and taps do not match".into(),
            ));
        }
        Ok(fi.lift(f, taps, self.config.rms_eps as f32))
    }

    /// A feature draft's step over positions `n_cached ..`: row i reads the feature of position
    /// `n_cached + i` and the embedding of the token after it, `tokens[i]`. Returns the predicted
    /// next feature of the last row and the draft's logits from it.
    pub fn forward_features(&mut self, tokens: &[u32], feats: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
        self.check_new_tokens(tokens)?;
        let d = self.config.n_embd;
        if feats.len() != tokens.len() * d {
            return Err(EngineError::InvalidSetting("feature draft: one feature per token expected".into()));
        }
        let pos = self.n_cached;
        let emb = self.embed.rows(tokens)?;
        let x = self.feature_input()?.input(&emb, feats);
        let h = self.backends.active().hidden(&self.config, Input::Rows(x), pos, None)?;
        self.tree = None;
        self.n_cached = pos + tokens.len();
        let last = h[h.len() - d..].to_vec();
        let logits = match (&self.small_head, self.restrict_head) {
            // The borrowed head rows, straight into the one buffer (no tensor round trip).
            (Some(s), true) => s.logits(&last, 1, self.config.n_vocab),
            _ => self.head_logits(last.clone(), 1)?.flatten_all()?.to_vec1::<f32>()?,
        };
        Ok((last, logits))
    }

    /// A feature draft's step over the nodes of a tree (see [`Self::forward_tree`] for `parents`):
    /// node i reads feature `feats[i]` (its parent's predicted feature) and the embedding of
    /// `tokens[i]`, at the position of its depth. Returns each node's predicted next feature
    /// `(n, n_embd)` and its logits, one row per node.
    pub fn forward_features_tree(
        &mut self,
        tokens: &[u32],
        feats: &[f32],
        parents: &[Option<usize>],
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        self.check_new_tokens(tokens)?;
        let (d, n) = (self.config.n_embd, tokens.len());
        if feats.len() != n * d {
            return Err(EngineError::InvalidSetting("feature draft: one feature per token expected".into()));
        }
        let (region, rows) = self.grow_tree(n, parents)?;
        let emb = self.embed.rows(tokens)?;
        let x = self.feature_input()?.input(&emb, feats);
        let pos = self.n_cached;
        let h = self.backends.active().hidden(&self.config, Input::Rows(x), pos, Some(&rows))?;
        self.n_cached = pos + n;
        self.tree = Some(region);
        let logits = match (&self.small_head, self.restrict_head) {
            (Some(s), true) => s.logits(&h, n, self.config.n_vocab),
            _ => self.head_logits(h.clone(), n)?.flatten_all()?.to_vec1::<f32>()?,
        };
        let v = self.config.n_vocab;
        Ok((h, logits.chunks_exact(v).map(<[f32]>::to_vec).collect()))
    }

    /// A feature draft without an embedding of its own takes its target's: the token embedding
    /// and the head rows of the tokens its file lists. Cheap when `target` is the one it already
    /// borrowed from.
    pub fn borrow_embedding(&mut self, target: &Transformer) -> Result<()> {
        if self.head.is_some() {
            return Ok(());
        }
        let head = target.full_head()?;
        let key = match &head.w {
            Weights::BatchedQ8(m) => std::sync::Arc::as_ptr(m) as usize,
            Weights::BatchedQ4(m) => std::sync::Arc::as_ptr(m) as usize,
            Weights::BatchedQ6(m) => std::sync::Arc::as_ptr(m) as usize,
            Weights::Candle(_) => 0,
        };
        let borrowed_from = self.feature.as_ref().and_then(|f| f.borrowed_from);
        if key != 0 && borrowed_from == Some(key) {
            return Ok(());
        }
        if target.config.n_embd != self.config.n_embd {
            return Err(EngineError::InvalidSetting(format!(
                "the feature draft is {} wide but the target's embedding is {} wide",
                self.config.n_embd, target.config.n_embd
            )));
        }
        let tokens = self.head_tokens.as_ref().ok_or_else(|| {
            EngineError::InvalidSetting(
                "a feature draft without an embedding must list its head tokens (`mentor_lab.head_tokens`)".into(),
            )
        })?;
        if tokens.last().is_some_and(|&t| t as usize >= target.config.n_vocab) {
            return Err(EngineError::InvalidSetting(
                "the feature draft's head tokens are outside the target's vocabulary".into(),
            ));
        }
        self.small_head = Some(small_head(head, tokens).ok_or_else(|| {
            EngineError::InvalidSetting(
                "the target's output head is not in a format the feature draft can read (Q8_0 or Q4)".into(),
            )
        })?);
        self.restrict_head = true;
        self.embed = target.embed.clone();
        if let Some(f) = self.feature.as_mut() {
            f.borrowed_from = Some(key);
        }
        Ok(())
    }

    /// Whether this model runs on tokens alone (every model but a feature draft).
    pub(super) fn tokens_alone(&self) -> Result<()> {
        match self.feature {
            Some(_) => Err(EngineError::InvalidSetting(
                "this model is a feature draft: it reads the target's hidden states, so it runs only as the draft \
                 of a mentored or speculative run; pick an independent draft for draft-only runs"
                    .into(),
            )),
            None => Ok(()),
        }
    }

    pub(super) fn feature_input(&self) -> Result<&cpu_step::FeatureInput> {
        self.feature.as_ref().and_then(|f| f.input.as_ref()).filter(|_| self.backends.cpu_step()).ok_or_else(|| {
            EngineError::InvalidSetting(
                "this feature draft runs only on the CPU step with its matrices in Q8_0 or Q4".into(),
            )
        })
    }
}
