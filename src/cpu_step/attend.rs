//! Attention over the KV cache: causal for a chain of new rows, or along each row's ancestors for
//! a tree of candidates ([`Attend::Tree`]).

use crate::gguf::ModelConfig;
use crate::vecmath::exp_shifted_in_place;

/// Which cached rows each new row of a forward attends to, and its position (RoPE).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attend<'a> {
    /// New row i is at position and cache row `pos + i` and sees rows `..= pos + i`.
    Causal {
        pos: usize,
    },
    Tree(&'a TreeRows),
}

/// A tree's new rows: each sees the cache rows before `prefix` and its own ancestors in the tree.
#[derive(Debug, Clone, Default)]
pub(crate) struct TreeRows {
    pub prefix: usize,
    /// Per new row: its position (its depth in the tree after the prefix).
    pub pos: Vec<usize>,
    /// Per new row: the cache rows from `prefix` on that it sees, ascending, ending with its own.
    pub tail: Vec<Vec<usize>>,
}

impl TreeRows {
    /// The attention for these rows written from cache row `row0` on: causal where each row sees
    /// every row before it at its own row's position (a tree that is one chain, computed the same
    /// without gathering), else the tree's.
    pub fn attend(&self, row0: usize) -> Attend<'_> {
        let chain = self.tail.iter().zip(&self.pos).enumerate().all(|(i, (t, &p))| {
            let row = row0 + i;
            p == row && t.len() == row + 1 - self.prefix && t.first() == Some(&self.prefix)
        });
        match chain {
            true => Attend::Causal { pos: row0 },
            false => Attend::Tree(self),
        }
    }
}

impl Attend<'_> {
    /// The position of new row `i`.
    pub fn position(&self, i: usize) -> usize {
        match self {
            Attend::Causal { pos } => pos + i,
            Attend::Tree(t) => t.pos[i],
        }
    }

    /// What new row `i` sees: the cache rows `..n` in place, then the rows listed (empty when
    /// they follow on from `n`, as on a chain).
    fn seen(&self, i: usize) -> (usize, &[usize]) {
        match self {
            Attend::Causal { pos } => (pos + i + 1, &[]),
            Attend::Tree(t) => {
                let tail = &t.tail[i];
                match tail.iter().enumerate().all(|(j, &r)| r == t.prefix + j) {
                    true => (t.prefix + tail.len(), &[]),
                    false => (t.prefix, tail),
                }
            }
        }
    }

    /// The most rows any new row sees (of `n` new rows starting at cache row `row0`).
    fn max_seen(&self, row0: usize, n: usize) -> usize {
        match self {
            Attend::Causal { .. } => row0 + n,
            Attend::Tree(t) => t.prefix + t.tail.iter().map(Vec::len).max().unwrap_or(0),
        }
    }
}

/// Rows of `hd` values read as one sequence: `a`'s rows, then `b`'s. A tree node's attention
/// reads the shared prefix in place from the cache and its ancestors from a small gathered copy,
/// with the same arithmetic, bit for bit, as over one contiguous run of the same rows.
#[derive(Debug, Clone, Copy)]
pub struct KvRows<'a> {
    a: &'a [f32],
    b: &'a [f32],
    na: usize,
    hd: usize,
}

impl<'a> KvRows<'a> {
    pub fn new(a: &'a [f32], b: &'a [f32], hd: usize) -> Self {
        KvRows { a, b, na: a.len() / hd.max(1), hd }
    }

    /// Whole rows held.
    fn n(&self) -> usize {
        self.na + self.b.len() / self.hd.max(1)
    }

    /// The start of row `j` without bounds checks, for the SIMD loops.
    ///
    /// # Safety
    /// `j < self.n()`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ptr(&self, j: usize) -> *const f32 {
        match j < self.na {
            true => self.a.as_ptr().add(j * self.hd),
            false => self.b.as_ptr().add((j - self.na) * self.hd),
        }
    }

    #[inline(always)]
    fn row(&self, j: usize) -> &'a [f32] {
        match j < self.na {
            true => &self.a[j * self.hd..][..self.hd],
            false => &self.b[(j - self.na) * self.hd..][..self.hd],
        }
    }
}

/// Attention of the `n` new queries `q: (n, n_head · head_dim)` over the cached keys and values,
/// each over the rows `attend` gives it. The heads that share a KV head attend together (one pass
/// over its keys and values for all of them, [`heads_attend`]); groups × queries run in parallel
/// when there is enough work.
pub(super) fn attention(
    cfg: &ModelConfig,
    q: &[f32],
    (kc, vc): (&[f32], &[f32]),
    attend: Attend,
    (row0, n): (usize, usize),
    capacity: usize,
) -> Vec<f32> {
    let (n_head, hd) = (cfg.n_head, cfg.head_dim);
    let n_rep = n_head / cfg.n_kv_head;
    // Heads per item: all of a group's (up to `HEADS_TOGETHER`) when there are queries enough to
    // keep the threads busy; for a single-token step, pairs, so that the items (3 groups of 3 heads
    // on the default target) split evenly between threads.
    let block = if cfg.n_kv_head * n >= 8 { HEADS_TOGETHER } else { 2 }.min(n_rep.max(1));
    let blocks = n_rep.div_ceil(block);
    // Item ((g, i), b): heads `b · block ..` of KV group g for query i.
    let place = |item: usize| {
        let (gi, b) = (item / blocks, item % blocks);
        let (g, i) = (gi / n, gi % n);
        let h0 = g * n_rep + b * block;
        (i, h0, block.min(n_rep - b * block))
    };
    let one_item = |item: usize| -> Vec<f32> {
        let (i, h0, r) = place(item);
        let g = h0 / n_rep;
        let (kg, vg) = (&kc[g * capacity * hd..][..capacity * hd], &vc[g * capacity * hd..][..capacity * hd]);
        let (in_place, listed) = attend.seen(i);
        let gather =
            |c: &[f32]| -> Vec<f32> { listed.iter().flat_map(|&row| c[row * hd..][..hd].iter().copied()).collect() };
        let (kt, vt) = (gather(kg), gather(vg));
        let keys = KvRows::new(&kg[..in_place * hd], &kt, hd);
        let values = KvRows::new(&vg[..in_place * hd], &vt, hd);
        let seen = keys.n();
        let mut out = vec![0f32; r * hd];
        let mut scores = vec![0f32; r * seen];
        heads_attend_rows(&q[i * n_head * hd + h0 * hd..][..r * hd], hd, keys, values, &mut scores, &mut out);
        out
    };
    let n_items = cfg.n_kv_head * n * blocks;
    let work = n * attend.max_seen(row0, n) * n_head * hd;
    let per_item: Vec<Vec<f32>> = if work >= 1 << 16 {
        let slots: Vec<std::sync::OnceLock<Vec<f32>>> = (0..n_items).map(|_| std::sync::OnceLock::new()).collect();
        crate::team::run(n_items, &|it| {
            let _ = slots[it].set(one_item(it));
        });
        slots.into_iter().map(|s| s.into_inner().unwrap_or_default()).collect()
    } else {
        (0..n_items).map(one_item).collect()
    };
    let mut out = vec![0f32; n * n_head * hd];
    for (item, o) in per_item.iter().enumerate() {
        let (i, h0, r) = place(item);
        out[i * n_head * hd + h0 * hd..][..r * hd].copy_from_slice(o);
    }
    out
}

/// How many heads sharing a KV head [`heads_attend`] takes in one pass (its AVX2 kernel keeps 12
/// accumulators in registers: 3 heads × 4 keys, 3 heads × 4 output vectors).
const HEADS_TOGETHER: usize = 3;

/// `r = qs.len() / hd` queries of `hd` values (up to [`HEADS_TOGETHER`]) over the same keys and values, each as
/// [`head_attend`] computes it, bit for bit; `scores` holds `r` rows of `keys.len() / hd`.
/// Loading each key and value once for all of them halves the loads per multiply-add: attention
/// was 15% of a 9-token verify at 256 tokens of context, 24% of a step at 1024.
pub fn heads_attend(qs: &[f32], hd: usize, keys: &[f32], values: &[f32], scores: &mut [f32], out: &mut [f32]) {
    heads_attend_rows(qs, hd, KvRows::new(keys, &[], hd), KvRows::new(values, &[], hd), scores, out)
}

/// [`heads_attend`] over keys and values in two parts ([`KvRows`]).
pub fn heads_attend_rows(qs: &[f32], hd: usize, keys: KvRows, values: KvRows, scores: &mut [f32], out: &mut [f32]) {
    let r = qs.len() / hd.max(1);
    let seen = scores.len() / r.max(1);
    #[cfg(target_arch = "x86_64")]
    {
        if (2..=HEADS_TOGETHER).contains(&r)
            && hd.is_multiple_of(8)
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were just detected; the sizes are checked inside.
            return unsafe {
                match r {
                    2 => heads_attend_avx2::<2>(qs, keys, values, scores, out, seen),
                    _ => heads_attend_avx2::<3>(qs, keys, values, scores, out, seen),
                }
            };
        }
    }
    for h in 0..r {
        head_attend_rows(&qs[h * hd..][..hd], keys, values, &mut scores[h * seen..][..seen], &mut out[h * hd..][..hd]);
    }
}

/// [`head_attend_avx2`] for `R` queries at once, in the same order of operations per query.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn heads_attend_avx2<const R: usize>(
    qs: &[f32],
    keys: KvRows,
    values: KvRows,
    scores: &mut [f32],
    out: &mut [f32],
    n: usize,
) {
    use std::arch::x86_64::*;
    let hd = qs.len() / R;
    if keys.n() < n || values.n() < n || keys.hd != hd || values.hd != hd || out.len() < R * hd || scores.len() < R * n
    {
        for h in 0..R {
            head_attend_body(&qs[h * hd..][..hd], keys, values, &mut scores[h * n..][..n], &mut out[h * hd..][..hd]);
        }
        return;
    }
    let nv = hd / 8;
    let scale = 1.0 / (hd as f32).sqrt();
    let (qp, sp) = (qs.as_ptr(), scores.as_mut_ptr());
    let mut j = 0;
    while j + 4 <= n {
        let k = [0, 1, 2, 3].map(|t| keys.ptr(j + t));
        let mut a = [[_mm256_setzero_ps(); 4]; R];
        for v in 0..nv {
            let kv = [0, 1, 2, 3].map(|t| _mm256_loadu_ps(k[t].add(8 * v)));
            for (h, acc) in a.iter_mut().enumerate() {
                let qv = _mm256_loadu_ps(qp.add(h * hd + 8 * v));
                for t in 0..4 {
                    acc[t] = _mm256_fmadd_ps(qv, kv[t], acc[t]);
                }
            }
        }
        for (h, acc) in a.iter().enumerate() {
            let s = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
            let four = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            _mm_storeu_ps(sp.add(h * n + j), four);
        }
        j += 4;
    }
    for jj in j..n {
        let k = keys.ptr(jj);
        for h in 0..R {
            let mut acc = _mm256_setzero_ps();
            for v in 0..nv {
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * hd + 8 * v)), _mm256_loadu_ps(k.add(8 * v)), acc);
            }
            *sp.add(h * n + jj) = crate::kernels::hsum256(acc);
        }
    }
    let mut inv = [_mm256_setzero_ps(); R];
    for (h, inv) in inv.iter_mut().enumerate() {
        *inv = softmax_weights_avx2(&mut scores[h * n..][..n], scale);
    }
    // Up to 4 output vectors (32 values) per head per pass over the values.
    let sp = scores.as_ptr();
    let mut c0 = 0;
    while c0 < nv {
        let width = (nv - c0).min(4);
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for jj in 0..n {
            let v = values.ptr(jj).add(8 * c0);
            let vv = [0, 1, 2, 3].map(|t| if t < width { _mm256_loadu_ps(v.add(8 * t)) } else { _mm256_setzero_ps() });
            for (h, acc) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_ps(*sp.add(h * n + jj));
                for t in 0..width {
                    acc[t] = _mm256_fmadd_ps(w, vv[t], acc[t]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (t, a) in acc.iter().enumerate().take(width) {
                _mm256_storeu_ps(out.as_mut_ptr().add(h * hd + 8 * (c0 + t)), _mm256_mul_ps(*a, inv[h]));
            }
        }
        c0 += width;
    }
}

/// One query over `scores.len()` keys: `out = softmax(q·k / sqrt(hd)) · v`.
pub fn head_attend(q: &[f32], keys: &[f32], values: &[f32], scores: &mut [f32], out: &mut [f32]) {
    let hd = q.len();
    head_attend_rows(q, KvRows::new(keys, &[], hd), KvRows::new(values, &[], hd), scores, out)
}

/// [`head_attend`] over keys and values in two parts ([`KvRows`]).
pub fn head_attend_rows(q: &[f32], keys: KvRows, values: KvRows, scores: &mut [f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected.
            return unsafe { head_attend_avx2(q, keys, values, scores, out) };
        }
    }
    head_attend_body(q, keys, values, scores, out)
}

/// The same with explicit AVX2 for head sizes that are a multiple of 8 (64 for SmolLM2, 128 for
/// Qwen2.5 and Llama 3): four keys' dot products at a time, reduced together with horizontal adds
/// (one store for four scores instead of a horizontal sum per key), and the weighted sum of values
/// with its accumulators in registers (one pass over the values per 64 outputs, instead of loading
/// and storing the output at every key).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_attend_avx2(q: &[f32], keys: KvRows, values: KvRows, scores: &mut [f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let hd = q.len();
    let n = scores.len();
    if !hd.is_multiple_of(8) || keys.n() < n || values.n() < n || keys.hd != hd || values.hd != hd || out.len() < hd {
        return head_attend_body(q, keys, values, scores, out);
    }
    let nv = hd / 8;
    let scale = 1.0 / (hd as f32).sqrt();
    let qp = q.as_ptr();
    let mut j = 0;
    while j + 4 <= n {
        let k = [0, 1, 2, 3].map(|t| keys.ptr(j + t));
        let mut a = [_mm256_setzero_ps(); 4];
        for v in 0..nv {
            let qv = _mm256_loadu_ps(qp.add(8 * v));
            for (t, acc) in a.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[t].add(8 * v)), *acc);
            }
        }
        // hadd(hadd(a0, a1), hadd(a2, a3)) holds each key's two half-sums in lanes t and t + 4.
        let s = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        let four = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        _mm_storeu_ps(scores.as_mut_ptr().add(j), four);
        j += 4;
    }
    for (jj, s) in scores.iter_mut().enumerate().skip(j) {
        let k = keys.ptr(jj);
        let mut acc = _mm256_setzero_ps();
        for v in 0..nv {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(8 * v)), _mm256_loadu_ps(k.add(8 * v)), acc);
        }
        *s = crate::kernels::hsum256(acc);
    }
    let inv = softmax_weights_avx2(scores, scale);
    // Up to 8 output vectors (64 values) per pass over the values, accumulated in registers.
    let mut c0 = 0;
    while c0 < nv {
        let width = (nv - c0).min(8);
        let mut acc = [_mm256_setzero_ps(); 8];
        for (jj, &w) in scores.iter().enumerate() {
            let w = _mm256_set1_ps(w);
            let v = values.ptr(jj).add(8 * c0);
            for (t, a) in acc.iter_mut().enumerate().take(width) {
                *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * t)), *a);
            }
        }
        for (t, a) in acc.iter().enumerate().take(width) {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * (c0 + t)), _mm256_mul_ps(*a, inv));
        }
        c0 += width;
    }
}

/// Turn one query's raw scores into unnormalised softmax weights in place and return 1 / their sum
/// in all 8 lanes. The 1/sqrt(hd) scale goes into the exponential with the max:
/// exp((s − max) · scale).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn softmax_weights_avx2(scores: &mut [f32], scale: f32) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let n = scores.len();
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    exp_shifted_in_place(scores, max, scale);
    let mut lanes = _mm256_setzero_ps();
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        lanes = _mm256_add_ps(lanes, _mm256_loadu_ps(scores.as_ptr().add(i)));
    }
    let sum = crate::kernels::hsum256(lanes) + scores[whole..].iter().sum::<f32>();
    _mm256_set1_ps(1.0 / sum)
}

/// Written so that the compiler vectorizes it (8 independent partial sums per dot product).
#[inline(always)]
fn head_attend_body(q: &[f32], keys: KvRows, values: KvRows, scores: &mut [f32], out: &mut [f32]) {
    let hd = q.len();
    let scale = 1.0 / (hd as f32).sqrt();
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate() {
        let k = keys.row(j);
        let mut acc = [0f32; 8];
        for (qc, kc) in q.chunks_exact(8).zip(k.chunks_exact(8)) {
            for t in 0..8 {
                acc[t] += qc[t] * kc[t];
            }
        }
        let tail: f32 =
            q.chunks_exact(8).remainder().iter().zip(k.chunks_exact(8).remainder()).map(|(a, b)| a * b).sum();
        *s = acc.iter().sum::<f32>() + tail;
        max = max.max(*s);
    }
    exp_shifted_in_place(scores, max, scale);
    let sum: f32 = scores.iter().sum();
    out.iter_mut().for_each(|o| *o = 0.0);
    for (j, &w) in scores.iter().enumerate() {
        let v = values.row(j);
        out.iter_mut().zip(v).for_each(|(o, v)| *o += w * v);
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// softmax(q·k / sqrt(hd)) · v in f64, the plain way.
    fn reference(q: &[f32], keys: &[f32], values: &[f32], n: usize) -> Vec<f64> {
        let hd = q.len();
        let s: Vec<f64> = (0..n)
            .map(|j| (0..hd).map(|d| q[d] as f64 * keys[j * hd + d] as f64).sum::<f64>() / (hd as f64).sqrt())
            .collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
        let total: f64 = e.iter().sum();
        (0..hd).map(|d| (0..n).map(|j| e[j] * values[j * hd + d] as f64).sum::<f64>() / total).collect()
    }

    /// Reproducible values uniform in [−2, 2).
    fn uniform_values(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 4.0
        }
    }

    /// A tree that is one chain after the prefix runs with causal attention; a branching one,
    /// one at a position other than its row, or one that skips an earlier row keeps the tree's.
    #[test]
    fn only_a_chain_shaped_tree_attends_causally() {
        let tree = |pos: Vec<usize>, tail: Vec<Vec<usize>>| TreeRows { prefix: 10, pos, tail };
        let chain = tree(vec![10, 11, 12], vec![vec![10], vec![10, 11], vec![10, 11, 12]]);
        assert!(matches!(chain.attend(10), Attend::Causal { pos: 10 }));
        // The same rows written from another cache row are not that chain.
        assert!(matches!(chain.attend(11), Attend::Tree(_)));
        let branching = tree(vec![10, 11, 11], vec![vec![10], vec![10, 11], vec![10, 12]]);
        assert!(matches!(branching.attend(10), Attend::Tree(_)));
        let skipping = tree(vec![10, 11], vec![vec![10], vec![11]]);
        assert!(matches!(skipping.attend(10), Attend::Tree(_)));
        // More nodes fed later (a tree's next depth) continue the chain from their own row.
        let later = tree(vec![13], vec![vec![10, 11, 12, 13]]);
        assert!(matches!(later.attend(13), Attend::Causal { pos: 13 }));
    }

    #[test]
    fn head_attention_matches_the_plain_formula() {
        let mut next = uniform_values(12345u64);
        // Head sizes: SmolLM2's 64, Qwen2.5 / Llama 3's 128, 8, and 72 / 20 (not whole vectors:
        // the generic body); key counts around the 4-key blocks, and a long context.
        for hd in [64, 128, 8, 72, 20] {
            for n in [1, 2, 3, 4, 5, 7, 8, 9, 300] {
                let q: Vec<f32> = (0..hd).map(|_| next()).collect();
                let keys: Vec<f32> = (0..n * hd).map(|_| next()).collect();
                let values: Vec<f32> = (0..n * hd).map(|_| next()).collect();
                let (mut scores, mut out) = (vec![0f32; n], vec![0f32; hd]);
                head_attend(&q, &keys, &values, &mut scores, &mut out);
                for (d, (&o, r)) in out.iter().zip(reference(&q, &keys, &values, n)).enumerate() {
                    assert!((o as f64 - r).abs() < 1e-4 * (1.0 + r.abs()), "hd {hd}, {n} keys, output {d}: {o} vs {r}");
                }
            }
        }
    }

    #[test]
    fn heads_sharing_a_kv_head_attend_together_bit_for_bit_as_alone() {
        let mut next = uniform_values(777u64);
        for hd in [64, 128, 8, 72, 20] {
            for n in [1, 3, 4, 5, 9, 300] {
                for r in 1..=HEADS_TOGETHER {
                    let qs: Vec<f32> = (0..r * hd).map(|_| next()).collect();
                    let keys: Vec<f32> = (0..n * hd).map(|_| next()).collect();
                    let values: Vec<f32> = (0..n * hd).map(|_| next()).collect();
                    let (mut scores, mut out) = (vec![0f32; r * n], vec![0f32; r * hd]);
                    heads_attend(&qs, hd, &keys, &values, &mut scores, &mut out);
                    for h in 0..r {
                        let (mut s1, mut o1) = (vec![0f32; n], vec![0f32; hd]);
                        head_attend(&qs[h * hd..][..hd], &keys, &values, &mut s1, &mut o1);
                        let got: Vec<u32> = out[h * hd..][..hd].iter().map(|x| x.to_bits()).collect();
                        let alone: Vec<u32> = o1.iter().map(|x| x.to_bits()).collect();
                        assert_eq!(got, alone, "hd {hd}, {n} keys, {r} heads, head {h}");
                    }
                }
            }
        }
    }

    #[test]
    fn attention_over_rows_in_two_parts_equals_one_run_bit_for_bit() {
        let mut next = uniform_values(4242u64);
        for hd in [64, 128, 72, 20] {
            for n in [1usize, 4, 5, 9, 300] {
                for split in [0, 1, n / 2, n.saturating_sub(3), n] {
                    for r in 1..=HEADS_TOGETHER {
                        let qs: Vec<f32> = (0..r * hd).map(|_| next()).collect();
                        let keys: Vec<f32> = (0..n * hd).map(|_| next()).collect();
                        let values: Vec<f32> = (0..n * hd).map(|_| next()).collect();
                        let (mut scores, mut whole) = (vec![0f32; r * n], vec![0f32; r * hd]);
                        heads_attend(&qs, hd, &keys, &values, &mut scores, &mut whole);
                        let (ka, kb) = keys.split_at(split * hd);
                        let (va, vb) = values.split_at(split * hd);
                        let mut parts = vec![0f32; r * hd];
                        let (k2, v2) = (KvRows::new(ka, kb, hd), KvRows::new(va, vb, hd));
                        heads_attend_rows(&qs, hd, k2, v2, &mut scores, &mut parts);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                        assert_eq!(bits(&parts), bits(&whole), "hd {hd}, {n} keys split at {split}, {r} heads");
                    }
                }
            }
        }
    }
}
