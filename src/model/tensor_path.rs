//! The tensor path: the forward as candle tensor operations (any device, any weight format), the
//! reference the CPU step is checked against and the path Metal runs.

use super::{Layer, LayerCache, Transformer};
use crate::cpu_step;
use crate::error::{EngineError, Result};
use crate::gguf::{Arch, ModelConfig};
use candle_core::{DType, Tensor};

/// The tensor path's state: the blocks (their matrices shared with the CPU step), the final norm,
/// the RoPE tables and the per-layer KV cache, as candle tensors on the model's device.
pub(super) struct TensorPath {
    pub(super) layers: Vec<Layer>,
    pub(super) out_norm: Tensor, // (n_embd)
    pub(super) cos: Tensor,      // (max_pos, head_dim / 2)
    pub(super) sin: Tensor,      // (max_pos, head_dim / 2)
    pub(super) cache: Vec<LayerCache>,
    pub(super) cache_capacity: usize,
}

impl Transformer {
    /// The forward of `tokens` from cache row `n_cached` on: a chain, or the nodes of a tree
    /// (`tree`: each row's position and the rows it sees).
    pub(super) fn forward_impl(&mut self, tokens: &[u32], tree: Option<&cpu_step::TreeRows>) -> Result<Tensor> {
        let n_new = tokens.len();
        let pos = self.n_cached;
        self.check_new_tokens(tokens)?;
        self.tokens_alone()?;
        if tree.is_none() {
            self.tree = None;
        }
        if let Some(h) = self.cpu_step_hidden_at(tokens, tree)? {
            return self.head_logits(h, n_new);
        }
        if pos + n_new > self.tensor.cache_capacity {
            let mut cap = self.tensor.cache_capacity.max(1);
            while cap < pos + n_new {
                cap *= 2;
            }
            self.allocate_cache(cap.min(self.max_context()))?;
        }
        let mut x = self.embed.rows_tensor(tokens, &self.device)?; // (n_new, n_embd)
        let (cos, sin, mask) = match tree {
            None => {
                let mask = if n_new > 1 { Some(self.causal_mask(pos, n_new)?) } else { None };
                (self.tensor.cos.narrow(0, pos, n_new)?, self.tensor.sin.narrow(0, pos, n_new)?, mask)
            }
            Some(t) => {
                let at: Vec<u32> = t.pos.iter().map(|&p| p as u32).collect();
                let at = Tensor::new(at.as_slice(), &self.device)?;
                let mask = Some(self.tree_mask(t, pos + n_new)?);
                (self.tensor.cos.index_select(&at, 0)?, self.tensor.sin.index_select(&at, 0)?, mask)
            }
        };
        let eps = self.config.rms_eps as f32;
        for (layer, cache) in self.tensor.layers.iter().zip(self.tensor.cache.iter()) {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let attn = attention(&self.config, layer, cache, &h, pos, &cos, &sin, mask.as_ref())?;
            x = (x + attn)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
            let (gate, up) = match layer.gate_up.forward(&h)?.as_slice() {
                [g, u] => (candle_nn::ops::silu(g)?, u.clone()),
                _ => return Err(EngineError::InvalidSetting("FFN projections: expected gate and up".into())),
            };
            x = (x + layer.w_down.forward(&(gate * up)?)?)?;
        }
        self.n_cached = pos + n_new;
        let x = candle_nn::ops::rms_norm(&x, &self.tensor.out_norm, eps)?;
        if let (Some(s), true) = (&self.small_head, self.restrict_head) {
            let h = x.flatten_all()?.to_vec1::<f32>()?;
            return Ok(Tensor::from_vec(
                s.logits(&h, n_new, self.config.n_vocab),
                (n_new, self.config.n_vocab),
                &self.device,
            )?);
        }
        let logits = self.full_head()?.forward(&x)?; // (n_new, n_vocab)
        Ok(logits.to_dtype(DType::F32)?)
    }

    /// Additive mask for `n_new` queries at positions `pos..pos+n_new` over `pos+n_new` keys,
    /// repeated for the query heads that share a KV head (rows are ordered (head in group, query)):
    ///
    /// ```text
    ///          keys: 0 .. pos-1 | pos .. pos+n_new-1
    /// query 0:       0 ...   0  | 0  -inf -inf
    /// query 1:       0 ...   0  | 0   0   -inf
    /// ```
    fn causal_mask(&self, pos: usize, n_new: usize) -> Result<Tensor> {
        let n_rep = self.config.n_head / self.config.n_kv_head;
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
