//! The forward engines behind [`Transformer`](super::Transformer): the CPU step
//! ([`crate::cpu_step`], the project's kernels) and the tensor path ([`super::tensor_path`], candle
//! tensors on any device: Metal, and the reference the CPU step is tested against). Each holds its
//! blocks, final norm, RoPE tables and KV cache and answers the same small interface; the
//! transformer owns the embedding, the output head and what the cache holds.

use super::tensor_path::TensorPath;
use crate::cpu_step::{Attend, CpuModel, TreeRows};
use crate::embedding::Embedding;
use crate::error::Result;
use crate::gguf::ModelConfig;

/// What a forward's rows start from.
pub(crate) enum Input<'a> {
    /// The embeddings of these tokens.
    Tokens(&'a Embedding, &'a [u32]),
    /// Rows already computed, `(n, n_embd)` (a feature draft's inputs).
    Rows(Vec<f32>),
}

/// One forward engine.
pub(crate) trait Backend: Send {
    /// The final normalized hidden states `(n, n_embd)` of `input`'s rows, written to cache rows
    /// `pos .. pos + n` (rows from `pos` on are overwritten; the cache grows as needed, keeping
    /// the first `pos`): a chain (`tree` None: row i at position `pos + i`, seeing every row
    /// before it) or the nodes of a tree (`tree`: each row's position and the rows it sees).
    fn hidden(&mut self, cfg: &ModelConfig, input: Input<'_>, pos: usize, tree: Option<&TreeRows>) -> Result<Vec<f32>>;

    /// Move cache rows `from[j]` to `to + j` (a tree's accepted path becomes a chain); `from`
    /// ascending with `from[j] >= to + j`.
    fn keep_rows(&mut self, cfg: &ModelConfig, from: &[usize], to: usize) -> Result<()>;

    /// Keep only the first `n` blocks; the cache starts over.
    fn keep_first_layers(&mut self, n: usize);
}

impl Backend for CpuModel {
    fn hidden(&mut self, cfg: &ModelConfig, input: Input<'_>, pos: usize, tree: Option<&TreeRows>) -> Result<Vec<f32>> {
        let x = match input {
            Input::Tokens(embed, tokens) => embed.rows(tokens)?,
            Input::Rows(x) => x,
        };
        let n = x.len() / cfg.n_embd;
        let max_pos = self.cos.len() / (cfg.head_dim / 2);
        self.reserve(cfg, pos + n, pos, max_pos);
        let attend = match tree {
            Some(t) => t.attend(pos),
            None => Attend::Causal { pos },
        };
        Ok(self.forward_at(cfg, x, pos, attend))
    }

    fn keep_rows(&mut self, cfg: &ModelConfig, from: &[usize], to: usize) -> Result<()> {
        CpuModel::keep_rows(self, cfg, from, to);
        Ok(())
    }

    fn keep_first_layers(&mut self, n: usize) {
        self.layers.truncate(n);
    }
}

/// The transformer's engines: the tensor path always, the CPU step where every matrix runs
/// through the project's kernels, and which of them runs.
pub(super) struct Backends {
    pub(super) tensor: TensorPath,
    pub(super) cpu: Option<CpuModel>,
    /// Whether forwards run on `cpu` (only where it exists).
    cpu_step: bool,
}

impl Backends {
    /// Both engines, the CPU step running where it exists.
    pub(super) fn new(tensor: TensorPath, cpu: Option<CpuModel>) -> Backends {
        Backends { tensor, cpu_step: cpu.is_some(), cpu }
    }

    /// The engine forwards run on.
    pub(super) fn active(&mut self) -> &mut dyn Backend {
        match (self.cpu_step, self.cpu.as_mut()) {
            (true, Some(cpu)) => cpu,
            _ => &mut self.tensor,
        }
    }

    /// Whether forwards run on the CPU step.
    pub(super) fn cpu_step(&self) -> bool {
        self.cpu_step
    }

    /// The CPU step, while forwards run on it (a feature draft's taps are read there).
    pub(super) fn cpu_step_mut(&mut self) -> Option<&mut CpuModel> {
        self.cpu.as_mut().filter(|_| self.cpu_step)
    }

    /// Run forwards on the CPU step (where it exists) or the tensor path; the tensor path's cache
    /// starts over. Returns whether the CPU step runs.
    pub(super) fn set_cpu_step(&mut self, on: bool) -> bool {
        self.cpu_step = on && self.cpu.is_some();
        self.tensor.drop_cache();
        self.cpu_step
    }

    /// Most positions a forward can reach (the RoPE tables' length).
    pub(super) fn max_pos(&self) -> usize {
        self.tensor.max_pos()
    }

    /// Keep only the first `n` blocks in both engines.
    pub(super) fn keep_first_layers(&mut self, n: usize) {
        self.tensor.keep_first_layers(n);
        if let Some(cpu) = self.cpu.as_mut() {
            Backend::keep_first_layers(cpu, n);
        }
    }
}
