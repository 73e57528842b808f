//! The transformer, in the shape speculative decoding needs: `forward` takes a chunk of new tokens
//! and returns logits for *every* one of them, and the KV cache can be truncated back to any
//! length (rolling back rejected draft tokens) or cleared.
//!
//! One model file covers the `llama` and `qwen2` GGUF architectures; they differ only in attention
//! biases (qwen2) and in which dimensions RoPE pairs up (see [`crate::gguf::Arch`]).

use crate::cpu_step;
use crate::embedding::Embedding;
use crate::error::{EngineError, Result};
use crate::gguf::{dtype_name, Arch, ModelConfig, ModelFile};
use crate::kernels::{Q4Matrix, Q6Matrix, Q8Matrix};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::fs::File;
use std::io::BufReader;

mod backend;
mod device;
mod features;
mod load;
mod tensor_path;
mod tree;
mod weights;
use backend::{Backends, Input};
pub use device::{choose_accelerated, default_device, device_note, probe_device};
use load::*;
use tensor_path::TensorPath;
use weights::{Layer, LayerCache, Linear, Projections, Weights};

/// How the weight matrices are held in memory, chosen at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// The file's format unless candle runs it slowly on this device (then Q8_0).
    #[default]
    Auto,
    /// Exactly what the file holds.
    File,
    Q8_0,
    /// Matrices held in more than 4.5 bits per weight re-quantized to Q4_0 (whole blocks of 32;
    /// 4-bit matrices stay as they are): for a draft, fewer bytes per step for some acceptance.
    Q4_0,
    /// As `Q4_0`, to Q4_1 (a minimum per block too: 5 bits per weight, closer to the file).
    Q4_1,
    F16,
    F32,
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "file" => Ok(Self::File),
            "q8_0" | "q8" => Ok(Self::Q8_0),
            "q4_0" => Ok(Self::Q4_0),
            "q4_1" => Ok(Self::Q4_1),
            "f16" => Ok(Self::F16),
            "f32" => Ok(Self::F32),
            _ => Err(format!("unknown weight format `{s}`: use auto, file, q8_0, q4_0, q4_1, f16 or f32")),
        }
    }
}

/// Most tokens [`Transformer::feed`] runs in one forward.
const FEED_PIECE: usize = 128;

pub struct Transformer {
    pub config: ModelConfig,
    device: Device,
    /// (n_vocab, n_embd), as in the file, for the token lookup.
    embed: Embedding,
    /// The forward engines: the CPU step and the tensor path ([`backend`]).
    backends: Backends,
    /// (n_vocab, n_embd); the embedding matrix when tied. None for a feature draft that borrows
    /// its target's ([`Self::borrow_embedding`]).
    head: Option<Linear>,
    /// Number of positions held in the KV cache.
    n_cached: usize,
    /// Human-readable weight format actually used, e.g. "Q8_0 (from Q4_1)".
    pub weight_desc: String,
    /// The output head restricted to the tokens the file lists (`mentor_lab.head_tokens`), with
    /// our kernels only; used while `restrict_head` is on.
    small_head: Option<cpu_step::SmallHead>,
    restrict_head: bool,
    /// Set for a feature draft (a model that reads its target's hidden states).
    feature: Option<features::FeatureDraft>,
    /// The tokens the file restricts the output head to.
    head_tokens: Option<Vec<u32>>,
    /// The tree of candidates the cache holds after [`Self::forward_tree`], until
    /// [`Self::keep_path`] or any other forward, truncation or clearing ends it.
    tree: Option<tree::TreeRegion>,
}

/// Logits of a forward over several tokens, each row computed when first asked for
/// ([`Transformer::forward_lazy`]).
#[derive(Debug, Clone)]
pub struct LazyLogits {
    hidden: Vec<f32>, // (n, n_embd)
    rows: Vec<Option<Vec<f32>>>,
}

impl LazyLogits {
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// The final hidden states `(n, n_embd)` of the forward's rows.
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }
    /// Row `i`, if computed ([`Transformer::lazy_rows`]).
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        self.rows.get(i)?.as_deref()
    }
}

/// RoPE tables are precomputed up to this many positions (or the model's context, if smaller).
const MAX_ROPE_POS: usize = 32_768;

impl Transformer {
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Positions currently in the KV cache.
    pub fn n_cached(&self) -> usize {
        self.n_cached
    }

    /// Largest context this instance can run (RoPE tables and the model's own limit).
    pub fn max_context(&self) -> usize {
        self.backends.max_pos()
    }

    /// What the model takes in memory: its weights (embedding, layers, head) and its KV cache per
    /// position of context, in bytes.
    pub fn memory(&self) -> (usize, usize) {
        let weights = self.embed.bytes() + self.sum_over_matrices(Linear::bytes);
        let c = &self.config;
        (weights, c.n_layer * 2 * c.n_kv_head * c.head_dim * std::mem::size_of::<f32>())
    }

    /// Of [`Transformer::memory`]'s weights, the bytes of tile layouts held beside row layouts (a
    /// 4- or 5-bit head's; 0 without the 512-bit VNNI kernels, or with the `notiles` path).
    pub fn tile_memory(&self) -> usize {
        self.sum_over_matrices(Linear::tile_bytes)
    }

    fn sum_over_matrices(&self, f: impl Fn(&Linear) -> usize) -> usize {
        let proj = |p: &Projections| match p {
            Projections::Fused { linear, .. } => f(linear),
            Projections::Separate(parts) => parts.iter().map(&f).sum(),
        };
        let layers: usize =
            self.backends.tensor.layers.iter().map(|l| proj(&l.qkv) + f(&l.wo) + proj(&l.gate_up) + f(&l.w_down)).sum();
        layers + self.head.as_ref().map_or(0, &f)
    }

    /// Forget everything: the next forward starts at position 0. The buffers are kept (their
    /// old contents are simply overwritten).
    pub fn clear(&mut self) -> Result<()> {
        self.n_cached = 0;
        self.tree = None;
        Ok(())
    }

    /// Roll the cache back to its first `len` positions (exact: later positions are simply
    /// overwritten by the next forward).
    pub fn truncate(&mut self, len: usize) {
        self.n_cached = self.n_cached.min(len);
        self.tree = None;
    }

    /// Run `tokens` at positions `n_cached .. n_cached + tokens.len()` and return their logits,
    /// one row per token: `(n_new, n_vocab)`.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Tensor> {
        self.pooled(|m| m.forward_impl(tokens, None))
    }

    /// Run `f` where the engine wants it. The tensor path on the CPU runs the whole step on a pool
    /// thread: the kernels' parallel sections then share the caller's thread instead of waking
    /// two workers while the caller sleeps (with as many workers as cores, the caller otherwise
    /// competes with the spinning workers). The CPU step runs its sections on `crate::team` from
    /// this thread.
    fn pooled<R: Send>(&mut self, f: impl FnOnce(&mut Self) -> R + Send) -> R {
        match self.device.is_cpu() && !self.backends.cpu_step() && rayon::current_thread_index().is_none() {
            true => rayon::scope(|_| f(self)),
            false => f(self),
        }
    }

    /// The forward of `tokens` from cache row `n_cached` on, a chain or the nodes of a tree
    /// (`tree`: each row's position and the rows it sees): their logits, one row per token.
    fn forward_impl(&mut self, tokens: &[u32], tree: Option<&cpu_step::TreeRows>) -> Result<Tensor> {
        let h = self.hidden_of(tokens, tree)?;
        self.head_logits(h, tokens.len())
    }

    /// The final hidden states `(n, n_embd)` of `tokens` fed after the cache, on the engine that
    /// runs: a chain, or the nodes of a tree (`tree`).
    fn hidden_of(&mut self, tokens: &[u32], tree: Option<&cpu_step::TreeRows>) -> Result<Vec<f32>> {
        self.check_new_tokens(tokens)?;
        self.tokens_alone()?;
        if tree.is_none() {
            self.tree = None;
        }
        let pos = self.n_cached;
        let h = self.backends.active().hidden(&self.config, Input::Tokens(&self.embed, tokens), pos, tree)?;
        self.n_cached = pos + tokens.len();
        Ok(h)
    }

    /// Keep only the first `n` blocks (early exit: the rest of the stack is skipped, the final
    /// norm and head read the residual stream after block `n`); forgets the cache.
    pub fn keep_first_layers(&mut self, n: usize) -> Result<()> {
        if n == 0 || n > self.config.n_layer {
            return Err(EngineError::InvalidSetting(format!(
                "a model of {} blocks cannot keep {n}: choose 1 to {}",
                self.config.n_layer, self.config.n_layer
            )));
        }
        self.config.n_layer = n;
        self.backends.keep_first_layers(n);
        self.clear()
    }

    /// Whether decode steps run the CPU step ([`crate::cpu_step`]).
    pub fn cpu_step(&self) -> bool {
        self.backends.cpu_step()
    }

    /// Switch between the CPU step and the tensor path (where both exist); forgets the
    /// cache. For comparing the two.
    pub fn set_cpu_step(&mut self, on: bool) -> Result<()> {
        self.backends.set_cpu_step(on);
        self.clear()
    }

    /// Number of tokens the output head is restricted to, while it is.
    pub fn head_restriction(&self) -> Option<usize> {
        self.small_head.as_ref().filter(|_| self.restrict_head).map(|s| s.tokens.len())
    }

    /// Use the restricted output head (where the file lists tokens for one) or the full one.
    /// Returns whether the head is now restricted.
    pub fn set_head_restricted(&mut self, on: bool) -> bool {
        // A draft whose full head was let go at load (`adopt_head_tokens`) stays restricted.
        self.restrict_head = self.small_head.is_some() && (on || self.head.is_none());
        self.restrict_head
    }

    fn full_head(&self) -> Result<&Linear> {
        self.head.as_ref().ok_or_else(|| {
            EngineError::InvalidSetting(
                "this feature draft has no output head of its own; it borrows its target's".into(),
            )
        })
    }

    /// Tokens a forward may take: at least one, within the context, inside the vocabulary.
    fn check_new_tokens(&self, tokens: &[u32]) -> Result<()> {
        let (n_new, pos) = (tokens.len(), self.n_cached);
        if n_new == 0 {
            return Err(EngineError::InvalidSetting("forward called with no tokens".into()));
        }
        if pos + n_new > self.max_context() {
            return Err(EngineError::PromptTooLong { n_prompt: pos, n_new, n_ctx: self.max_context() });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.n_vocab) {
            return Err(EngineError::InvalidSetting(format!(
                "token id {bad} is outside the model's vocabulary of {}",
                self.config.n_vocab
            )));
        }
        Ok(())
    }

    /// Logits `(n, n_vocab)` of final hidden states `h: (n, n_embd)`.
    fn head_logits(&self, h: Vec<f32>, n: usize) -> Result<Tensor> {
        Ok(match (&self.small_head, self.restrict_head) {
            (Some(s), true) => {
                Tensor::from_vec(s.logits(&h, n, self.config.n_vocab), (n, self.config.n_vocab), &self.device)?
            }
            _ => self
                .full_head()?
                .forward(&Tensor::from_vec(h, (n, self.config.n_embd), &self.device)?)?
                .to_dtype(DType::F32)?,
        })
    }

    /// Forward and copy the logits to host memory, one `Vec` per new token.
    pub fn forward_rows(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        Ok(self.forward(tokens)?.to_device(&Device::Cpu)?.to_vec2::<f32>()?)
    }

    /// Feed `tokens` into the cache without computing any logits (the prompt's prefill): the
    /// output head would cost the default target about a quarter as much per row as the rest of
    /// the forward, all of it on rows nobody reads.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        // A long prompt goes in pieces: each piece's rows come out as they would all together,
        // and its activations stay a few MB (allocations of tens of MB come fresh from the
        // kernel each time, and their page faults took a fifth of a long prefill).
        for piece in tokens.chunks(FEED_PIECE) {
            self.pooled(|m| m.hidden_of(piece, None))?;
        }
        Ok(())
    }

    /// Feed `tokens` and return the logits of the last one only (a draft catching up on the
    /// tokens it has not seen needs no other row). The same values as the last row of
    /// [`Self::forward_rows`]: the kernels give each row the same result batched or alone.
    pub fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let missing = || EngineError::InvalidSetting("forward returned no logits".into());
        self.pooled(|m| {
            let hidden = m.hidden_of(tokens, None)?;
            let last = hidden.len().checked_sub(m.config.n_embd).map(|start| hidden[start..].to_vec());
            m.head_logits(last.ok_or_else(missing)?, 1)?
                .to_device(&Device::Cpu)?
                .to_vec2::<f32>()?
                .pop()
                .ok_or_else(missing)
        })
    }

    /// A forward whose vocabulary head runs only for the rows asked for ([`Self::lazy_rows`]).
    /// Verification stops at the first rejected draft token, so the rows after it are never
    /// used; on the CPU the head (49152 × 576 for the default target) costs about as much per
    /// row batched as alone, so skipping them saves their whole cost.
    pub fn forward_lazy(&mut self, tokens: &[u32]) -> Result<LazyLogits> {
        let hidden = self.pooled(|m| m.hidden_of(tokens, None))?;
        Ok(LazyLogits { hidden, rows: vec![None; tokens.len()] })
    }

    /// Make rows `..upto` of `l` available, computing the missing ones in one batch.
    pub fn lazy_rows(&self, l: &mut LazyLogits, upto: usize) -> Result<()> {
        let upto = upto.min(l.rows.len());
        let Some(first) = l.rows[..upto].iter().position(|r| r.is_none()) else { return Ok(()) };
        self.lazy_range(l, first, upto)
    }

    /// Make row `i` of `l` available (a tree's walk reads the rows of one path).
    pub fn lazy_row(&self, l: &mut LazyLogits, i: usize) -> Result<()> {
        self.lazy_rows_of(l, &[i])
    }

    fn lazy_range(&self, l: &mut LazyLogits, first: usize, upto: usize) -> Result<()> {
        self.lazy_rows_of(l, &(first..upto).collect::<Vec<_>>())
    }

    /// Make rows `wanted` of `l` available, computing the missing ones in one batch (a tree's
    /// walk reads the rows of the path it expects: one head product for all of them costs little
    /// more than for one, as the head's weights are read once).
    pub fn lazy_rows_of(&self, l: &mut LazyLogits, wanted: &[usize]) -> Result<()> {
        let missing: Vec<usize> = wanted.iter().copied().filter(|&i| matches!(l.rows.get(i), Some(None))).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let d = self.config.n_embd;
        let mut h = Vec::with_capacity(missing.len() * d);
        for &i in &missing {
            let row = l.hidden.get(i * d..(i + 1) * d);
            h.extend_from_slice(
                row.ok_or_else(|| EngineError::InvalidSetting("lazy logits: hidden states missing".into()))?,
            );
        }
        let on_pool = self.device.is_cpu() && !self.backends.cpu_step() && rayon::current_thread_index().is_none();
        let logits = if on_pool {
            rayon::scope(|_| self.head_logits(h, missing.len()))?
        } else {
            self.head_logits(h, missing.len())?
        };
        for (&i, row) in missing.iter().zip(logits.to_device(&Device::Cpu)?.to_vec2::<f32>()?) {
            l.rows[i] = Some(row);
        }
        Ok(())
    }
}
