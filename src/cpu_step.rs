//! The whole transformer step on the CPU in plain slices, without candle tensors.
//!
//! With our batched kernels doing the matrix products, what was left of a decode step was some 25
//! small tensor operations per layer (norms, RoPE, head reshapes, cache writes, two attention
//! matmuls, softmax, SiLU), each allocating and some handing work to the thread pool: about 60 µs
//! per layer, half of the draft's step. Here the same arithmetic runs in a few loops per layer
//! over buffers the step owns. It computes what [`crate::model`]'s tensor path computes (tests
//! compare the two on the real models); the tensor path stays for Metal and for weights our
//! kernels do not handle.

mod attend;

pub use attend::{head_attend, head_attend_rows, heads_attend, heads_attend_rows, KvRows};
pub(crate) use attend::{Attend, TreeRows};

use crate::gguf::{Arch, ModelConfig};
use crate::kernels::{Q4Matrix, Q6Matrix, Q8Matrix};
use crate::vecmath::exp_shifted_in_place;
use std::sync::Arc;

/// A matrix our kernels multiply, with its optional bias.
#[derive(Debug, Clone)]
pub(crate) enum Matrix {
    Q8(Arc<Q8Matrix>),
    Q4(Arc<Q4Matrix>),
    Q6(Arc<Q6Matrix>),
}

#[derive(Debug, Clone)]
pub(crate) struct Mat {
    pub w: Matrix,
    pub bias: Option<Vec<f32>>,
}

impl Mat {
    fn n_out(&self) -> usize {
        match &self.w {
            Matrix::Q8(m) => m.n_out,
            Matrix::Q4(m) => m.n_out,
            Matrix::Q6(m) => m.n_out,
        }
    }

    /// `x: (n, in)` row-major → `(n, out)`.
    pub fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = match &self.w {
            Matrix::Q8(m) => m.matmul(x, n),
            Matrix::Q4(m) => m.matmul(x, n),
            Matrix::Q6(m) => m.matmul(x, n),
        };
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
        }
        y
    }
}

/// Matrices applied to the same input: either one stacked matrix whose output columns are split
/// into `sizes`, or one matrix per part.
#[derive(Debug, Clone)]
pub(crate) struct Proj {
    pub mats: Vec<Mat>,
    pub sizes: Vec<usize>,
}

impl Proj {
    /// One `(n, size_i)` buffer per part.
    fn apply(&self, x: &[f32], n: usize) -> Vec<Vec<f32>> {
        if self.mats.len() == self.sizes.len() {
            return self.mats.iter().map(|m| m.apply(x, n)).collect();
        }
        let mut parts: Vec<Vec<f32>> = self.sizes.iter().map(|&s| Vec::with_capacity(n * s)).collect();
        if let Some(m) = self.mats.first() {
            let y = m.apply(x, n);
            for row in y.chunks_exact(m.n_out()) {
                let mut off = 0;
                for (part, &s) in parts.iter_mut().zip(&self.sizes) {
                    part.extend_from_slice(&row[off..off + s]);
                    off += s;
                }
            }
        }
        parts
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub attn_norm: Vec<f32>,
    pub qkv: Proj,
    pub wo: Mat,
    pub ffn_norm: Vec<f32>,
    pub gate_up: Proj,
    pub down: Mat,
}

/// Keys and values of every layer, `(n_kv_head, capacity, head_dim)` each.
#[derive(Debug, Clone, Default)]
struct Cache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    capacity: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct CpuModel {
    pub layers: Vec<Layer>,
    pub out_norm: Vec<f32>,
    /// `(max_pos, head_dim / 2)`
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    cache: Cache,
    /// Layers whose output (the residual stream after them) a forward keeps in `tap_out`, for a
    /// feature draft reading this model ([`FeatureInput`]).
    pub taps: Vec<usize>,
    /// The last forward's tapped residual streams, `(n_new, taps.len() · n_embd)`: per row the
    /// taps in order.
    pub tap_out: Vec<f32>,
}

impl CpuModel {
    pub fn new(layers: Vec<Layer>, out_norm: Vec<f32>, cos: Vec<f32>, sin: Vec<f32>) -> CpuModel {
        CpuModel { layers, out_norm, cos, sin, cache: Cache::default(), taps: Vec::new(), tap_out: Vec::new() }
    }

    /// Make room for `needed` positions, keeping the first `keep` (capacity doubles from 64
    /// positions: a short run neither holds nor zeroes a larger cache).
    pub fn reserve(&mut self, cfg: &ModelConfig, needed: usize, keep: usize, max: usize) {
        let c = &mut self.cache;
        if needed <= c.capacity && c.k.len() == cfg.n_layer {
            return;
        }
        let mut cap = c.capacity.max(64);
        while cap < needed {
            cap *= 2;
        }
        let cap = cap.min(max).max(needed);
        let hd = cfg.head_dim;
        let grow = |old: &Vec<f32>| -> Vec<f32> {
            let mut new = vec![0f32; cfg.n_kv_head * cap * hd];
            if c.capacity > 0 {
                for g in 0..cfg.n_kv_head {
                    let n = keep * hd;
                    new[g * cap * hd..][..n].copy_from_slice(&old[g * c.capacity * hd..][..n]);
                }
            }
            new
        };
        let (k, v): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (0..cfg.n_layer)
            .map(|l| match (c.k.get(l), c.v.get(l)) {
                (Some(k), Some(v)) => (grow(k), grow(v)),
                _ => (vec![0f32; cfg.n_kv_head * cap * hd], vec![0f32; cfg.n_kv_head * cap * hd]),
            })
            .unzip();
        *c = Cache { k, v, capacity: cap };
    }

    /// Move cache rows `from[j]` to `to + j` in every layer (a tree's accepted path becomes a
    /// chain); `from` ascending with `from[j] >= to + j`, so no row is overwritten before it moves.
    pub fn keep_rows(&mut self, cfg: &ModelConfig, from: &[usize], to: usize) {
        let (hd, cap) = (cfg.head_dim, self.cache.capacity);
        for c in self.cache.k.iter_mut().chain(self.cache.v.iter_mut()) {
            for g in 0..cfg.n_kv_head {
                for (j, &r) in from.iter().enumerate() {
                    if r != to + j && r < cap && to + j < cap {
                        c.copy_within((g * cap + r) * hd..(g * cap + r + 1) * hd, (g * cap + to + j) * hd);
                    }
                }
            }
        }
    }

    /// The final normalized hidden states `(n_new, n_embd)` (the head's input) of rows whose
    /// inputs are `x: (n_new, n_embd)`, written to the cache from row `row0` on, each attending to
    /// the rows and at the position `attend` gives it (a chain, or a tree of candidates; see
    /// [`Attend`]); the cache must hold `row0 + n_new` positions (see [`Self::reserve`]).
    pub fn forward_at(&mut self, cfg: &ModelConfig, mut x: Vec<f32>, row0: usize, attend: Attend) -> Vec<f32> {
        let d = cfg.n_embd;
        let n = x.len() / d;
        let eps = cfg.rms_eps as f32;
        let mut h = vec![0f32; x.len()];
        let n_taps = self.taps.len();
        self.tap_out.clear();
        self.tap_out.resize(n * n_taps * d, 0.0);
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, eps, &mut h);
            let mut qkv = layer.qkv.apply(&h, n);
            let (q, rest) = qkv.split_at_mut(1);
            let (k, v) = rest.split_at_mut(1);
            let (q, k, v) = (&mut q[0], &mut k[0], &v[0]);
            rope(cfg, q, cfg.n_head, &attend, &self.cos, &self.sin);
            rope(cfg, k, cfg.n_kv_head, &attend, &self.cos, &self.sin);
            let (kc, vc) = (&mut self.cache.k[l], &mut self.cache.v[l]);
            store(cfg, kc, k, row0, self.cache.capacity);
            store(cfg, vc, v, row0, self.cache.capacity);
            let att = attend::attention(cfg, q, (kc, vc), attend, (row0, n), self.cache.capacity);
            let o = layer.wo.apply(&att, n);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            rms_norm(&x, &layer.ffn_norm, eps, &mut h);
            let gu = layer.gate_up.apply(&h, n);
            let act = silu_mul(&gu[0], &gu[1]);
            let down = layer.down.apply(&act, n);
            x.iter_mut().zip(&down).for_each(|(x, o)| *x += o);
            if let Some(t) = self.taps.iter().position(|&t| t == l) {
                for (row, out) in x.chunks_exact(d).zip(self.tap_out.chunks_exact_mut(n_taps * d)) {
                    out[t * d..][..d].copy_from_slice(row);
                }
            }
        }
        rms_norm(&x, &self.out_norm, eps, &mut h);
        h
    }
}

/// `silu(g) · u` per element, with silu(g) = g · σ(g): σ(g) = 1 / (1 + e^−g) for g ≥ 0 and
/// e^g / (1 + e^g) below, so the exponential is always of −|g| ≤ 0 and runs 8 lanes at a time
/// ([`exp_shifted_in_place`]) instead of one libm call per value.
fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut e: Vec<f32> = gate.iter().map(|g| -g.abs()).collect();
    exp_shifted_in_place(&mut e, 0.0, 1.0);
    e.iter_mut().zip(gate.iter().zip(up)).for_each(|(e, (&g, &u))| {
        let num = if g >= 0.0 { 1.0 } else { *e };
        *e = g * num / (1.0 + *e) * u;
    });
    e
}

/// An output head restricted to some tokens: the rows of those tokens only, and their ids.
#[derive(Debug, Clone)]
pub(crate) struct SmallHead {
    pub mat: Mat,
    pub tokens: Vec<u32>,
}

impl SmallHead {
    /// Logits `(n, n_vocab)` from hidden states `h: (n, n_embd)`: the kept tokens' logits, −∞ for
    /// every other token (probability exactly 0 after softmax at any temperature).
    pub fn logits(&self, h: &[f32], n: usize, n_vocab: usize) -> Vec<f32> {
        let small = self.mat.apply(h, n);
        let mut full = vec![f32::NEG_INFINITY; n * n_vocab];
        for (row, out) in small.chunks_exact(self.tokens.len()).zip(full.chunks_exact_mut(n_vocab)) {
            for (&t, &v) in self.tokens.iter().zip(row) {
                out[t as usize] = v;
            }
        }
        full
    }
}

/// What turns a feature draft's inputs into its block's input (`train/eagle.py`): at position t,
/// the target's feature (its final normed hidden state plus `lift` of its RMS-normed residual
/// streams after the tapped blocks) and the embedding of the token at t + 1, joined by `fc`.
#[derive(Debug, Clone)]
pub(crate) struct FeatureInput {
    /// `(n_embd, 2 · n_embd)` over `[embedding, feature]`.
    pub fc: Mat,
    /// The target's blocks whose outputs the feature reads, with one norm weight each.
    pub taps: Vec<usize>,
    pub tap_norms: Vec<Vec<f32>>,
    /// `(n_embd, taps · n_embd)`; none without taps.
    pub lift: Option<Mat>,
    /// The target width the draft was trained on.
    pub target_embd: usize,
}

impl FeatureInput {
    /// Features `(n, d)` from the target's final hidden states `f: (n, d)` and its tapped residual
    /// streams `taps: (n, taps · d)`.
    pub fn lift(&self, f: &[f32], taps: &[f32], eps: f32) -> Vec<f32> {
        let Some(lift) = &self.lift else { return f.to_vec() };
        let d = self.target_embd;
        let n = f.len() / d;
        let mut normed = vec![0f32; taps.len()];
        for (row, out) in taps.chunks_exact(d * self.taps.len()).zip(normed.chunks_exact_mut(d * self.taps.len())) {
            for ((x, o), w) in row.chunks_exact(d).zip(out.chunks_exact_mut(d)).zip(&self.tap_norms) {
                rms_norm(x, w, eps, o);
            }
        }
        let mut out = lift.apply(&normed, n);
        out.iter_mut().zip(f).for_each(|(o, f)| *o += f);
        out
    }

    /// The block's input `(n, d)` from embeddings `emb: (n, d)` and features `feats: (n, d)`.
    pub fn input(&self, emb: &[f32], feats: &[f32]) -> Vec<f32> {
        let d = self.target_embd;
        let n = emb.len() / d;
        let mut joined = Vec::with_capacity(2 * n * d);
        for (e, f) in emb.chunks_exact(d).zip(feats.chunks_exact(d)) {
            joined.extend_from_slice(e);
            joined.extend_from_slice(f);
        }
        self.fc.apply(&joined, n)
    }
}

/// `out = x / sqrt(mean(x²) + eps) · w`, row by row.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    for (row, o) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / w.len() as f32;
        let r = 1.0 / (ms + eps).sqrt();
        o.iter_mut().zip(row).zip(w).for_each(|((o, x), w)| *o = x * r * w);
    }
}

/// Rotate `x: (n, n_heads · head_dim)` in place, row i for its position in `attend`: Llama
/// rotates adjacent pairs (2i, 2i+1), Qwen2 the halves (i, i + head_dim/2).
fn rope(cfg: &ModelConfig, x: &mut [f32], n_heads: usize, attend: &Attend, cos: &[f32], sin: &[f32]) {
    let hd = cfg.head_dim;
    let half = hd / 2;
    for (i, row) in x.chunks_exact_mut(n_heads * hd).enumerate() {
        let pos = attend.position(i);
        let (c, s) = (&cos[pos * half..][..half], &sin[pos * half..][..half]);
        for head in row.chunks_exact_mut(hd) {
            for j in 0..half {
                let (a, b) = match cfg.arch {
                    Arch::Llama => (2 * j, 2 * j + 1),
                    Arch::Qwen2 => (j, j + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c[j] - x1 * s[j];
                head[b] = x0 * s[j] + x1 * c[j];
            }
        }
    }
}

/// Write `x: (n, n_kv · head_dim)` into the cache `(n_kv, capacity, head_dim)` at `pos ..`.
fn store(cfg: &ModelConfig, cache: &mut [f32], x: &[f32], pos: usize, capacity: usize) {
    let hd = cfg.head_dim;
    for (i, row) in x.chunks_exact(cfg.n_kv_head * hd).enumerate() {
        for (g, head) in row.chunks_exact(hd).enumerate() {
            cache[(g * capacity + pos + i) * hd..][..hd].copy_from_slice(head);
        }
    }
}
