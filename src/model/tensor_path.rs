//! The tensor path: the forward as candle tensor operations (any device, any weight format), the
//! reference the CPU step is checked against and the path Metal runs.

use super::backend::{Backend, Input};
use super::{Layer, LayerCache};
use crate::cpu_step::TreeRows;
use crate::error::{EngineError, Result};
use crate::gguf::{Arch, ModelConfig};
use candle_core::{DType, Device, Tensor};

/// The tensor path's state: the blocks (their matrices shared with the CPU step), the final norm,
/// the RoPE tables and the per-layer KV cache, as candle tensors on the model's device.
pub(super) struct TensorPath {
    pub(super) layers: Vec<Layer>,
    pub(super) out_norm: Tensor, // (n_embd)
    pub(super) cos: Tensor,      // (max_pos, head_dim / 2)
    pub(super) sin: Tensor,      // (max_pos, head_dim / 2)
    pub(super) device: Device,
    cache: Vec<LayerCache>,
    cache_capacity: usize,
}

/// Positions the cache first makes room for.
const INITIAL_CACHE: usize = 256;

impl TensorPath {
    pub(super) fn new(layers: Vec<Layer>, out_norm: Tensor, (cos, sin): (Tensor, Tensor), device: Device) -> Self {
        TensorPath { layers, out_norm, cos, sin, device, cache: Vec::new(), cache_capacity: 0 }
    }

    pub(super) fn max_pos(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Let the cache go; the next forward allocates it.
    pub(super) fn drop_cache(&mut self) {
        self.cache.clear();
        self.cache_capacity = 0;
    }

    /// Room for `needed` positions, keeping the first `keep` (capacity doubles from
    /// [`INITIAL_CACHE`], up to the RoPE tables' length).
    fn reserve(&mut self, cfg: &ModelConfig, needed: usize, keep: usize) -> Result<()> {
        if needed <= self.cache_capacity && self.cache.len() == cfg.n_layer {
            return Ok(());
        }
        let mut cap = self.cache_capacity.max(INITIAL_CACHE);
        while cap < needed {
            cap *= 2;
        }
        let cap = cap.min(self.max_pos()).max(needed);
        let shape = (1, cfg.n_kv_head, cap, cfg.head_dim);
        let zeros = || Tensor::zeros(shape, DType::F32, &self.device);
        let mut cache = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            let (k, v) = (zeros()?, zeros()?);
            if let (Some(old), true) = (self.cache.get(l), keep > 0) {
                k.slice_set(&old.k.narrow(2, 0, keep)?.contiguous()?, 2, 0)?;
                v.slice_set(&old.v.narrow(2, 0, keep)?.contiguous()?, 2, 0)?;
            }
            cache.push(LayerCache { k, v });
        }
        self.cache = cache;
        self.cache_capacity = cap;
        Ok(())
    }

    pub(super) fn keep_first_layers(&mut self, n: usize) {
        self.layers.truncate(n);
        self.drop_cache();
    }

    /// Additive mask for `n_new` queries at positions `pos..pos+n_new` over `pos+n_new` keys,
    /// repeated for the query heads that share a KV head (rows are ordered (head in group, query)):
    ///
    /// ```text
    ///          keys: 0 .. pos-1 | pos .. pos+n_new-1
    /// query 0:       0 ...   0  | 0  -inf -inf
    /// query 1:       0 ...   0  | 0   0   -inf
    /// ```
    fn causal_mask(&self, cfg: &ModelConfig, pos: usize, n_new: usize) -> Result<Tensor> {
        let n_rep = cfg.n_head / cfg.n_kv_head;
        let n_keys = pos + n_new;
        let mut m = vec![0f32; n_rep * n_new * n_keys];
        for r in 0..n_rep {
            for i in 0..n_new {
                let row = &mut m[(r * n_new + i) * n_keys..(r * n_new + i + 1) * n_keys];
                for v in row.iter_mut().skip(pos + i + 1) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        Ok(Tensor::from_vec(m, (n_rep * n_new, n_keys), &self.device)?)
    }

    /// Additive mask for a tree's new rows (rows ordered as in `causal_mask`) over `n_keys` cache
    /// rows: each sees the rows before the tree and its path.
    fn tree_mask(&self, cfg: &ModelConfig, t: &TreeRows, n_keys: usize) -> Result<Tensor> {
        let n_rep = cfg.n_head / cfg.n_kv_head;
        let n_new = t.tail.len();
        let mut m = vec![f32::NEG_INFINITY; n_rep * n_new * n_keys];
        for r in 0..n_rep {
            for (i, tail) in t.tail.iter().enumerate() {
                let row = &mut m[(r * n_new + i) * n_keys..(r * n_new + i + 1) * n_keys];
                row[..t.prefix].iter_mut().for_each(|v| *v = 0.0);
                for &k in tail.iter().filter(|&&k| k < n_keys) {
                    row[k] = 0.0;
                }
            }
        }
        Ok(Tensor::from_vec(m, (n_rep * n_new, n_keys), &self.device)?)
    }

    /// The RoPE rows and the attention mask of `n_new` rows from cache row `pos` on.
    fn rope_and_mask(
        &self,
        cfg: &ModelConfig,
        pos: usize,
        n_new: usize,
        tree: Option<&TreeRows>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        Ok(match tree {
            None => {
                let mask = if n_new > 1 { Some(self.causal_mask(cfg, pos, n_new)?) } else { None };
                (self.cos.narrow(0, pos, n_new)?, self.sin.narrow(0, pos, n_new)?, mask)
            }
            Some(t) => {
                let at: Vec<u32> = t.pos.iter().map(|&p| p as u32).collect();
                let at = Tensor::new(at.as_slice(), &self.device)?;
                let mask = Some(self.tree_mask(cfg, t, pos + n_new)?);
                (self.cos.index_select(&at, 0)?, self.sin.index_select(&at, 0)?, mask)
            }
        })
    }
}

impl Backend for TensorPath {
    fn hidden(&mut self, cfg: &ModelConfig, input: Input<'_>, pos: usize, tree: Option<&TreeRows>) -> Result<Vec<f32>> {
        let mut x = match input {
            Input::Tokens(embed, tokens) => embed.rows_tensor(tokens, &self.device)?, // (n_new, n_embd)
            Input::Rows(x) => {
                let n = x.len() / cfg.n_embd;
                Tensor::from_vec(x, (n, cfg.n_embd), &self.device)?
            }
        };
        let n_new = x.dims()[0];
        self.reserve(cfg, pos + n_new, pos)?;
        let (cos, sin, mask) = self.rope_and_mask(cfg, pos, n_new, tree)?;
        let eps = cfg.rms_eps as f32;
        for (layer, cache) in self.layers.iter().zip(self.cache.iter()) {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let attn = attention(cfg, layer, cache, &h, pos, &cos, &sin, mask.as_ref())?;
            x = (x + attn)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
            let (gate, up) = match layer.gate_up.forward(&h)?.as_slice() {
                [g, u] => (candle_nn::ops::silu(g)?, u.clone()),
                _ => return Err(EngineError::InvalidSetting("FFN projections: expected gate and up".into())),
            };
            x = (x + layer.w_down.forward(&(gate * up)?)?)?;
        }
        let x = candle_nn::ops::rms_norm(&x, &self.out_norm, eps)?;
        Ok(x.flatten_all()?.to_vec1::<f32>()?)
    }

    fn keep_rows(&mut self, _cfg: &ModelConfig, from: &[usize], to: usize) -> Result<()> {
        if from.is_empty() {
            return Ok(());
        }
        let at: Vec<u32> = from.iter().map(|&r| r as u32).collect();
        let at = Tensor::new(at.as_slice(), &self.device)?;
        for c in &self.cache {
            let k = c.k.index_select(&at, 2)?;
            let v = c.v.index_select(&at, 2)?;
            c.k.slice_set(&k, 2, to)?;
            c.v.slice_set(&v, 2, to)?;
        }
        Ok(())
    }

    fn keep_first_layers(&mut self, n: usize) {
        TensorPath::keep_first_layers(self, n);
    }
}

/// Self-attention of one layer over `h: (n_new, n_embd)`, appending the new keys and values to
/// `cache` at `pos`. Grouped-query attention without copying K/V: the `n_rep` query heads that
/// share a KV head are stacked along the query axis, `(1, n_kv_head, n_rep * n_new, head_dim)`.
#[allow(clippy::too_many_arguments)]
fn attention(
    cfg: &ModelConfig,
    layer: &Layer,
    cache: &LayerCache,
    h: &Tensor,
    pos: usize,
    cos: &Tensor,
    sin: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let n_new = h.dims()[0];
    let (n_head, n_kv, hd) = (cfg.n_head, cfg.n_kv_head, cfg.head_dim);
    let split_heads = |t: Tensor, n: usize| -> Result<Tensor> {
        Ok(t.reshape((n_new, n, hd))?.transpose(0, 1)?.contiguous()?.reshape((1, n, n_new, hd))?)
    };
    let (q, k, v) = match layer.qkv.forward(h)?.as_slice() {
        [q, k, v] => (split_heads(q.clone(), n_head)?, split_heads(k.clone(), n_kv)?, split_heads(v.clone(), n_kv)?),
        _ => return Err(EngineError::InvalidSetting("attention projections: expected Q, K and V".into())),
    };
    let (q, k) = match cfg.arch {
        Arch::Llama => (candle_nn::rotary_emb::rope_i(&q, cos, sin)?, candle_nn::rotary_emb::rope_i(&k, cos, sin)?),
        Arch::Qwen2 => (candle_nn::rotary_emb::rope(&q, cos, sin)?, candle_nn::rotary_emb::rope(&k, cos, sin)?),
    };
    cache.k.slice_set(&k, 2, pos)?;
    cache.v.slice_set(&v, 2, pos)?;
    let n_keys = pos + n_new;
    let k_all = cache.k.narrow(2, 0, n_keys)?; // (1, n_kv, n_keys, hd)
    let v_all = cache.v.narrow(2, 0, n_keys)?;
    let n_rep = n_head / n_kv;
    let q = q.reshape((1, n_kv, n_rep * n_new, hd))?;
    let scale = 1.0 / (hd as f64).sqrt();
    let att = (q.matmul(&k_all.t()?)? * scale)?; // (1, n_kv, n_rep * n_new, n_keys)
    let att = match mask {
        Some(m) => att.broadcast_add(m)?,
        None => att,
    };
    let att = candle_nn::ops::softmax_last_dim(&att)?;
    let y = att.matmul(&v_all)?; // (1, n_kv, n_rep * n_new, hd)
    let y = y.reshape((n_head, n_new, hd))?.transpose(0, 1)?.contiguous()?.reshape((n_new, n_head * hd))?;
    layer.wo.forward(&y)
}
