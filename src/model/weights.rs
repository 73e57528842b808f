//! The weights of a block: a linear layer in candle's or the project's kernels' format, the
//! projections applied to one input (stacked into one matrix where the kernels hold them), a
//! block's parts and its tensor-path KV cache.

use crate::error::Result;
use crate::kernels::{Q4Matrix, Q6Matrix, Q8Matrix};
use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor};

/// The weights of a linear layer, `(out, in)`.
#[derive(Debug, Clone)]
pub(super) enum Weights {
    /// candle's own matmul (any format, any device).
    Candle(QMatMul),
    /// Q8_0 on the CPU through our batched kernel (one pass over the weights for all rows).
    BatchedQ8(std::sync::Arc<Q8Matrix>),
    /// Q4_1 / Q4_0 on the CPU through our batched kernel.
    BatchedQ4(std::sync::Arc<Q4Matrix>),
    /// Q6_K on the CPU through our batched kernel.
    BatchedQ6(std::sync::Arc<Q6Matrix>),
}

/// One linear layer `y = x W^T (+ b)`.
#[derive(Debug, Clone)]
pub(super) struct Linear {
    pub(super) w: Weights,
    pub(super) b: Option<Tensor>,
}

impl Linear {
    /// A 4-, 5- or 6-bit matrix keeps only its tile layout where that runs every call
    /// ([`Q4Matrix::drop_row_layout`]); for layers' matrices, whose rows are never selected. Those
    /// are read straight into tiles where the tiles hold every output, so this matters for a stack
    /// of parts that were not (a Q6_K stack whose parts have partial groups).
    pub(super) fn drop_row_layout(&mut self) {
        match &mut self.w {
            Weights::BatchedQ4(m) => {
                if let Some(m) = std::sync::Arc::get_mut(m) {
                    m.drop_row_layout();
                }
            }
            Weights::BatchedQ6(m) => {
                if let Some(m) = std::sync::Arc::get_mut(m) {
                    m.drop_row_layout();
                }
            }
            _ => {}
        }
    }

    /// Bytes its weights take in memory.
    pub(super) fn bytes(&self) -> usize {
        match &self.w {
            Weights::Candle(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Weights::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t.elem_count() * t.dtype().size_in_bytes(),
            Weights::BatchedQ8(m) => m.bytes(),
            Weights::BatchedQ4(m) => m.bytes(),
            Weights::BatchedQ6(m) => m.bytes(),
        }
    }

    /// Bytes of a tile layout the kernels keep beside the row layout (0 where the tiles are the
    /// only copy, or there are none).
    pub(super) fn tile_bytes(&self) -> usize {
        match &self.w {
            Weights::BatchedQ8(m) => m.tile_bytes(),
            Weights::BatchedQ4(m) => m.tile_bytes(),
            Weights::BatchedQ6(m) => m.tile_bytes(),
            _ => 0,
        }
    }

    pub(super) fn n_out(&self) -> usize {
        match &self.w {
            Weights::Candle(QMatMul::QTensor(q)) => q.shape().dims()[0],
            Weights::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t.dims()[0],
            Weights::BatchedQ8(m) => m.n_out,
            Weights::BatchedQ4(m) => m.n_out,
            Weights::BatchedQ6(m) => m.n_out,
        }
    }

    /// `x: (n, in)` → `(n, out)`.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // One of our kernels on the rows of `x`.
        let batched = |matmul: &dyn Fn(&[f32], usize) -> Vec<f32>| -> Result<Tensor> {
            let n = x.dims()[0];
            let y = matmul(&x.flatten_all()?.to_vec1::<f32>()?, n);
            Ok(Tensor::from_vec(y, (n, self.n_out()), x.device())?)
        };
        let y = match &self.w {
            Weights::Candle(w) => w.forward(x)?,
            Weights::BatchedQ8(m) => batched(&|v, n| m.matmul(v, n))?,
            Weights::BatchedQ4(m) => batched(&|v, n| m.matmul(v, n))?,
            Weights::BatchedQ6(m) => batched(&|v, n| m.matmul(v, n))?,
        };
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Linear layers applied to the same input (Q, K and V; FFN gate and up). With our CPU kernels
/// their matrices are stacked into one at load, so a step quantizes the input once and hands the
/// threads one task list instead of three (or two).
#[derive(Debug, Clone)]
pub(super) enum Projections {
    Fused { linear: Linear, sizes: Vec<usize> },
    Separate(Vec<Linear>),
}

impl Projections {
    /// The linears it holds: the fused one, or each part.
    pub(super) fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        match self {
            Projections::Fused { linear, .. } => std::slice::from_mut(linear).iter_mut(),
            Projections::Separate(parts) => parts.iter_mut(),
        }
    }

    pub(super) fn new(parts: Vec<Linear>) -> Result<Projections> {
        let sizes: Vec<usize> = parts.iter().map(|l| l.n_out()).collect();
        let stacked = if parts.iter().all(|l| matches!(l.w, Weights::BatchedQ8(_))) {
            let ms: Vec<&Q8Matrix> =
                parts.iter().filter_map(|l| if let Weights::BatchedQ8(m) = &l.w { Some(&**m) } else { None }).collect();
            Q8Matrix::stack(&ms).map(|m| Weights::BatchedQ8(m.into()))
        } else if parts.iter().all(|l| matches!(l.w, Weights::BatchedQ4(_))) {
            let ms: Vec<&Q4Matrix> =
                parts.iter().filter_map(|l| if let Weights::BatchedQ4(m) = &l.w { Some(&**m) } else { None }).collect();
            Q4Matrix::stack(&ms).map(|m| Weights::BatchedQ4(m.into()))
        } else if parts.iter().all(|l| matches!(l.w, Weights::BatchedQ6(_))) {
            let ms: Vec<&Q6Matrix> =
                parts.iter().filter_map(|l| if let Weights::BatchedQ6(m) = &l.w { Some(&**m) } else { None }).collect();
            Q6Matrix::stack(&ms).map(|m| Weights::BatchedQ6(m.into()))
        } else {
            None
        };
        let biases: Vec<&Tensor> = parts.iter().filter_map(|l| l.b.as_ref()).collect();
        let bias = match biases.len() {
            0 => Some(None),
            n if n == parts.len() => Some(Some(Tensor::cat(&biases, 0)?)),
            _ => None, // only some parts have a bias: keep them separate
        };
        Ok(match (stacked, bias) {
            (Some(w), Some(b)) => Projections::Fused { linear: Linear { w, b }, sizes },
            _ => Projections::Separate(parts),
        })
    }

    /// One `(n, out_i)` tensor per projection, in the order given to `new`.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Projections::Separate(parts) => parts.iter().map(|l| l.forward(x)).collect(),
            Projections::Fused { linear, sizes } => {
                let y = linear.forward(x)?;
                let mut offset = 0;
                let mut out = Vec::with_capacity(sizes.len());
                for &n in sizes {
                    out.push(y.narrow(1, offset, n)?);
                    offset += n;
                }
                Ok(out)
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Layer {
    pub(super) attn_norm: Tensor,    // (n_embd)
    pub(super) qkv: Projections,     // (n_head * head_dim | n_kv_head * head_dim | n_kv_head * head_dim, n_embd)
    pub(super) wo: Linear,           // (n_embd, n_head * head_dim)
    pub(super) ffn_norm: Tensor,     // (n_embd)
    pub(super) gate_up: Projections, // (n_ff | n_ff, n_embd)
    pub(super) w_down: Linear,       // (n_embd, n_ff)
}

/// Keys and values of one layer. The buffers are over-allocated and grown by doubling so that a
/// decode step writes in place instead of copying the whole cache.
#[derive(Debug, Clone)]
pub(super) struct LayerCache {
    pub(super) k: Tensor, // (1, n_kv_head, capacity, head_dim)
    pub(super) v: Tensor, // (1, n_kv_head, capacity, head_dim)
}
