//! A batched Q8_0 matrix multiply for the CPU: `y = x W^T` for a few activation rows at once.
//!
//! Why: speculative verification runs the target over k + 1 tokens. candle's quantized matmul
//! treats every activation row as a separate matrix-vector product, so each row streams the whole
//! weight matrix from memory again and verifying 9 tokens costs ~7 single steps. Here each weight
//! block is loaded once and used for every row while it is in registers, so the cost of extra rows
//! is arithmetic only (~2.5x for 9 rows on 2 AVX2 cores instead of ~7x).
//!
//! Format: Q8_0 as in GGML — blocks of 32 weights, each an f32 scale and 32 signed bytes. The
//! activations are quantized the same way per row, so a block's dot product is
//! `scale_w * scale_x * Σ w_i x_i` with an exact integer sum. Per (row, block) the arithmetic is the
//! same whatever the number of rows, so a batched result equals the single-row result exactly.

use rayon::prelude::*;

pub const BLOCK: usize = 32;
/// Bytes of one GGML Q8_0 block: f16 scale + 32 × i8.
const GGML_Q8_0_BYTES: usize = 34;
/// Activation rows one kernel call handles together (accumulators in registers).
#[cfg(target_arch = "x86_64")]
const MAX_GROUP: usize = 5;
/// Output rows handled per task.
const OUT_CHUNK: usize = 32;

/// A weight matrix `(n_out, n_in)` in Q8_0, scales and quants in separate arrays. The quants of
/// each row are stored interleaved (see [`interleave_row`]).
#[derive(Debug, Clone)]
pub struct Q8Matrix {
    pub n_out: usize,
    pub n_in: usize,
    scales: Vec<f32>, // (n_out, n_in / 32)
    quants: Vec<i8>,  // (n_out, n_in), each row interleaved
    /// 128 · Σ quants of each block, (n_out, n_in / 32): with activations offset by +128 to make
    /// them unsigned, Σ (x + 128)·w − 128·Σ w = Σ x·w exactly, so VNNI's multiply-add needs no sign
    /// fix-ups per row.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    wsum128: Vec<i32>,
}

/// Blocks per interleaved group: one 256-bit lane of 4 bytes per block.
const GROUP_BLOCKS: usize = 8;

/// Reorder one row of quants so that each group of 8 whole blocks (256 bytes) is stored as 8
/// vectors of 32 bytes where vector k, lane i (4 bytes) holds bytes 4k..4k+3 of block i. A
/// multiply-add of such vectors sums 4 products per lane, all from one block, so adding the 8
/// vectors' results gives the 8 blocks' dot products in the 8 lanes of one register: the block
/// scales are then applied once per 8 blocks, with one vector multiply, instead of per block.
/// Blocks after the last whole group stay in place.
fn interleave_row(row: &mut [i8]) {
    let mut tmp = [0i8; GROUP_BLOCKS * BLOCK];
    for group in row.chunks_exact_mut(GROUP_BLOCKS * BLOCK) {
        for (k, vector) in tmp.chunks_exact_mut(BLOCK).enumerate() {
            for (i, lane) in vector.chunks_exact_mut(4).enumerate() {
                lane.copy_from_slice(&group[i * BLOCK + 4 * k..i * BLOCK + 4 * k + 4]);
            }
        }
        group.copy_from_slice(&tmp);
    }
}

/// The inverse of [`interleave_row`]: the row in plain block order.
fn deinterleave_row(row: &[i8]) -> Vec<i8> {
    let mut plain = row.to_vec();
    for (group, stored) in plain.chunks_exact_mut(GROUP_BLOCKS * BLOCK).zip(row.chunks_exact(GROUP_BLOCKS * BLOCK)) {
        for (k, vector) in stored.chunks_exact(BLOCK).enumerate() {
            for (i, lane) in vector.chunks_exact(4).enumerate() {
                group[i * BLOCK + 4 * k..i * BLOCK + 4 * k + 4].copy_from_slice(lane);
            }
        }
    }
    plain
}

/// The common input width of matrices to stack, if they have one.
fn common_width(mut widths: impl Iterator<Item = usize>) -> Option<usize> {
    let first = widths.next()?;
    widths.all(|w| w == first).then_some(first)
}

/// Activation rows quantized to Q8_0.
struct Q8Rows {
    n_rows: usize,
    scales: Vec<f32>, // (n_rows, n_in / 32)
    quants: Vec<i8>,  // (n_rows, n_in)
    /// The same quants with each row interleaved like the Q8 weights (the Q8 SIMD kernels read
    /// these, the Q4 kernels and the portable paths the plain ones; both cost n_rows · n_in bytes).
    quants_il: Vec<i8>,
    /// `quants_il + 128` as unsigned bytes, for VNNI's unsigned × signed multiply-add (see
    /// [`Q8Matrix::wsum128`]); filled only when the VNNI kernels will read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    quants_u8: Vec<u8>,
    /// scale · Σ quants of each block, (n_rows, n_in / 32): the 4-bit formats' offset term
    /// Σ_b m_b · s_b · Σ x_b is then a short dot product with the weights' m.
    scaled_sums: Vec<f32>,
}

/// Quantize one block of 32 values: scale = max|x| / 127, q = round(x / scale).
#[inline(always)]
fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qi, &xi) in q.iter_mut().zip(x) {
        *qi = (xi * inv).round() as i8;
    }
    d
}

fn quantize_rows(x: &[f32], n_rows: usize, n_in: usize) -> Q8Rows {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected.
            return unsafe { quantize_rows_avx2(x, n_rows, n_in) };
        }
    }
    quantize_rows_any(x, n_rows, n_in)
}

/// The same code compiled for AVX2: `f32::round` becomes an inline instruction sequence instead
/// of a call to libm's `roundf` per value (the result is identical).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_rows_avx2(x: &[f32], n_rows: usize, n_in: usize) -> Q8Rows {
    quantize_rows_any(x, n_rows, n_in)
}

#[inline(always)]
fn quantize_rows_any(x: &[f32], n_rows: usize, n_in: usize) -> Q8Rows {
    let n_blocks = n_in / BLOCK;
    let mut scales = vec![0f32; n_rows * n_blocks];
    let mut quants = vec![0i8; n_rows * n_in];
    let mut scaled_sums = vec![0f32; n_rows * n_blocks];
    for (b, (xs, qs)) in x.chunks_exact(BLOCK).zip(quants.chunks_exact_mut(BLOCK)).enumerate() {
        scales[b] = quantize_block(xs, qs);
        scaled_sums[b] = scales[b] * qs.iter().map(|&q| q as i32).sum::<i32>() as f32;
    }
    let mut quants_il = quants.clone();
    if n_in > 0 {
        quants_il.chunks_exact_mut(n_in).for_each(interleave_row);
    }
    #[cfg(target_arch = "x86_64")]
    let quants_u8 = if n_rows > 1 && use_vnni() { quants_il.iter().map(|&q| (q as u8) ^ 0x80).collect() } else { Vec::new() };
    #[cfg(not(target_arch = "x86_64"))]
    let quants_u8 = Vec::new();
    Q8Rows { n_rows, scales, quants, quants_il, quants_u8, scaled_sums }
}

/// Anything that can compute a range of outputs for all activation rows, into `local` laid out
/// `(out, row)`. The batching, threading and scatter are shared.
trait RowKernel: Sync {
    fn n_out(&self) -> usize;
    fn n_in(&self) -> usize;
    /// The portable path for outputs `outs`.
    fn portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]);
    /// Output `o` for activation rows `r0 .. r0 + n` (1 ≤ n ≤ MAX_GROUP) into `out[..n]`.
    /// Safety: the CPU has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe fn group_avx2_n(&self, o: usize, r0: usize, n: usize, xq: &Q8Rows, out: &mut [f32]);
    /// Most rows `group_avx2_n` takes at once (≤ MAX_GROUP).
    #[cfg(target_arch = "x86_64")]
    fn max_group(&self) -> usize {
        MAX_GROUP
    }

    fn rows_for(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let n_rows = xq.n_rows;
                // Rows in near-equal groups of at most max_group (with 5: 9 rows → 5 + 4, 8 → 4 + 4;
                // larger groups spill registers): a group's accumulators stay in registers, each
                // weight block is loaded once per group, and the output row's weights stay in L1
                // across groups.
                let n_groups = n_rows.div_ceil(self.max_group());
                for (i, o) in outs.enumerate() {
                    let out = &mut local[i * n_rows..(i + 1) * n_rows];
                    let mut r0 = 0;
                    for g in 0..n_groups {
                        let n = (n_rows - r0).div_ceil(n_groups - g);
                        // SAFETY: the features were just detected.
                        unsafe { self.group_avx2_n(o, r0, n, xq, &mut out[r0..]) };
                        r0 += n;
                    }
                }
                return;
            }
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        {
            if self.rows_neon(outs.clone(), xq, local) {
                return;
            }
        }
        self.portable(outs, xq, local);
    }

    /// The NEON path for outputs `outs`, where the kernel has one; false leaves them to `portable`.
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    fn rows_neon(&self, _outs: std::ops::Range<usize>, _xq: &Q8Rows, _local: &mut [f32]) -> bool {
        false
    }
}

/// `acc[i] += Σ a[4i..4i+4] · b[4i..4i+4]` (NEON without the dot-product extension: widening
/// multiplies, then pairwise adds; |a|, |b| ≤ 127 keeps each pair sum inside i16).
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
#[inline(always)]
unsafe fn dot4_neon(acc: std::arch::aarch64::int32x4_t, a: std::arch::aarch64::int8x16_t, b: std::arch::aarch64::int8x16_t) -> std::arch::aarch64::int32x4_t {
    use std::arch::aarch64::*;
    let pairs = vpaddq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)), vmull_high_s8(a, b));
    vpadalq_s16(acc, pairs)
}

/// Horizontal sum of the 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum256(a: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s4 = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    _mm_cvtss_f32(s1)
}

/// Dispatch a runtime group size to the const-generic `group_avx2::<N>` of a kernel type.
#[cfg(target_arch = "x86_64")]
macro_rules! dispatch_group {
    ($self:ident, $o:ident, $r0:ident, $n:ident, $xq:ident, $out:ident) => {
        dispatch_group!($self, group_avx2, $o, $r0, $n, $xq, $out)
    };
    ($self:ident, $f:ident, $o:ident, $r0:ident, $n:ident, $xq:ident, $out:ident) => {
        match $n {
            1 => $self.$f::<1>($o, $r0, $xq, $out),
            2 => $self.$f::<2>($o, $r0, $xq, $out),
            3 => $self.$f::<3>($o, $r0, $xq, $out),
            4 => $self.$f::<4>($o, $r0, $xq, $out),
            _ => $self.$f::<5>($o, $r0, $xq, $out),
        }
    };
}

/// `x` is row-major `(n_rows, n_in)`; returns row-major `(n_rows, n_out)`.
fn batched_matmul(k: &impl RowKernel, x: &[f32], n_rows: usize) -> Vec<f32> {
    let (n_out, n_in) = (k.n_out(), k.n_in());
    assert_eq!(x.len(), n_rows * n_in, "activation shape");
    let xq = quantize_rows(x, n_rows, n_in);
    let mut y = vec![0f32; n_rows * n_out];
    // Big matrices (the vocabulary head) in fewer, larger tasks: a task costs a few µs to hand out.
    let chunk = OUT_CHUNK.max(n_out / (rayon::current_num_threads() * 8)).next_multiple_of(OUT_CHUNK);
    let y_ptr = SharedOut(y.as_mut_ptr());
    (0..n_out.div_ceil(chunk)).into_par_iter().for_each(|c| {
        let mut local = [0f32; OUT_CHUNK * MAX_LOCAL_ROWS];
        let mut heap = Vec::new();
        let o_end = ((c + 1) * chunk).min(n_out);
        let mut o0 = c * chunk;
        while o0 < o_end {
            let o1 = (o0 + OUT_CHUNK).min(o_end);
            let buf: &mut [f32] = if n_rows <= MAX_LOCAL_ROWS {
                &mut local[..(o1 - o0) * n_rows]
            } else {
                heap.resize((o1 - o0) * n_rows, 0f32);
                &mut heap
            };
            k.rows_for(o0..o1, &xq, buf);
            // `buf` is (output, row); `y` is (row, output): write each row's run of outputs in
            // order (the other loop order writes n_out apart every time, and was ~12% of a
            // 9-token forward here, mostly for the 49152-wide head).
            for r in 0..n_rows {
                // SAFETY: `r * n_out + o0 + i` < n_rows * n_out for i < o1 - o0, and tasks own
                // disjoint output columns `o`, so no two tasks write the same element.
                let dst = unsafe { y_ptr.get().add(r * n_out + o0) };
                for (i, per_row) in buf.chunks_exact(n_rows).enumerate() {
                    // SAFETY: as above.
                    unsafe { *dst.add(i) = per_row[r] };
                }
            }
            o0 = o1;
        }
    });
    y
}

/// Rows held in a task's stack buffer (more use a heap buffer).
const MAX_LOCAL_ROWS: usize = 16;

/// The output buffer shared by the tasks, each writing its own columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint elements (see `batched_matmul`), and the buffer outlives them.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}
impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

impl Q8Matrix {
    /// The matrices' rows one after another (all with the same `n_in`): one product for several
    /// projections of the same input.
    pub fn stack(parts: &[&Q8Matrix]) -> Option<Q8Matrix> {
        let n_in = common_width(parts.iter().map(|m| m.n_in))?;
        Some(Q8Matrix {
            n_out: parts.iter().map(|m| m.n_out).sum(),
            n_in,
            scales: parts.iter().flat_map(|m| m.scales.iter().copied()).collect(),
            quants: parts.iter().flat_map(|m| m.quants.iter().copied()).collect(),
            wsum128: parts.iter().flat_map(|m| m.wsum128.iter().copied()).collect(),
        })
    }

    /// From scales and interleaved quants; computes the block sums.
    fn new(n_out: usize, n_in: usize, scales: Vec<f32>, quants: Vec<i8>) -> Q8Matrix {
        // Interleaving keeps each group's bytes within the group, and a block's 32 bytes land in
        // one lane of each of the group's 8 vectors; summing by natural block needs the plain row.
        let nb = n_in / BLOCK;
        let mut wsum128 = Vec::with_capacity(n_out * nb);
        if n_in > 0 {
            for row in quants.chunks_exact(n_in) {
                let plain = deinterleave_row(row);
                wsum128.extend(plain.chunks_exact(BLOCK).map(|b| 128 * b.iter().map(|&q| q as i32).sum::<i32>()));
            }
        }
        Q8Matrix { n_out, n_in, scales, quants, wsum128 }
    }

    /// Only the given rows, in that order (a vocabulary head restricted to some tokens).
    pub fn select_rows(&self, rows: &[u32]) -> Option<Q8Matrix> {
        let nb = self.n_in / BLOCK;
        let mut out = Q8Matrix { n_out: rows.len(), n_in: self.n_in, scales: Vec::new(), quants: Vec::new(), wsum128: Vec::new() };
        for &r in rows {
            let r = r as usize;
            out.scales.extend_from_slice(self.scales.get(r * nb..(r + 1) * nb)?);
            out.quants.extend_from_slice(self.quants.get(r * self.n_in..(r + 1) * self.n_in)?);
            out.wsum128.extend_from_slice(self.wsum128.get(r * nb..(r + 1) * nb)?);
        }
        Some(out)
    }

    /// Quantize an f32 matrix given row-major `(n_out, n_in)`; `n_in` must be a multiple of 32.
    pub fn from_f32(w: &[f32], n_out: usize, n_in: usize) -> Option<Q8Matrix> {
        if n_in % BLOCK != 0 || w.len() != n_out * n_in {
            return None;
        }
        let r = quantize_rows(w, n_out, n_in);
        Some(Q8Matrix::new(n_out, n_in, r.scales, r.quants_il))
    }

    /// Repack GGML Q8_0 bytes (as in a GGUF file or candle's QTensor) for `(n_out, n_in)`.
    pub fn from_ggml_bytes(bytes: &[u8], n_out: usize, n_in: usize) -> Option<Q8Matrix> {
        if n_in % BLOCK != 0 || bytes.len() != n_out * n_in / BLOCK * GGML_Q8_0_BYTES {
            return None;
        }
        let n_blocks = n_out * n_in / BLOCK;
        let mut scales = Vec::with_capacity(n_blocks);
        let mut quants = Vec::with_capacity(n_out * n_in);
        for blk in bytes.chunks_exact(GGML_Q8_0_BYTES) {
            scales.push(half::f16::from_le_bytes([blk[0], blk[1]]).to_f32());
            quants.extend(blk[2..].iter().map(|&b| b as i8));
        }
        if n_in > 0 {
            quants.chunks_exact_mut(n_in).for_each(interleave_row);
        }
        Some(Q8Matrix::new(n_out, n_in, scales, quants))
    }

    /// `x` is row-major `(n_rows, n_in)`; returns row-major `(n_rows, n_out)`.
    pub fn matmul(&self, x: &[f32], n_rows: usize) -> Vec<f32> {
        batched_matmul(self, x, n_rows)
    }

    /// Portable version (and the reference the SIMD version is tested against).
    fn rows_portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        let nb = self.n_in / BLOCK;
        for (i, o) in outs.enumerate() {
            let w_row = deinterleave_row(&self.quants[o * self.n_in..(o + 1) * self.n_in]);
            for r in 0..xq.n_rows {
                let mut acc = 0f32;
                for b in 0..nb {
                    let w = &w_row[b * BLOCK..][..BLOCK];
                    let x = &xq.quants[r * self.n_in + b * BLOCK..][..BLOCK];
                    let s: i32 = w.iter().zip(x).map(|(&a, &c)| a as i32 * c as i32).sum();
                    acc += self.scales[o * nb + b] * xq.scales[r * nb + b] * s as f32;
                }
                local[i * xq.n_rows + r] = acc;
            }
        }
    }

    /// Output `o` for activation rows `r0 .. r0 + N` (AVX2).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn group_avx2<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
        self.group_body::<N, false>(o, r0, xq, out)
    }

    /// The same with AVX-512 VNNI's `vpdpbusd` (on 256-bit registers) for the multiply-adds: one
    /// instruction instead of three per block and row, and the same integer sums, so the results
    /// are identical.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    #[inline]
    unsafe fn group_vnni<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
        self.group_body::<N, true>(o, r0, xq, out)
    }

    /// Shared body; inlined into the two functions above, which set the CPU features.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn group_body<const N: usize, const VNNI: bool>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let nb = self.n_in / BLOCK;
        let ones = _mm256_set1_epi16(1);
        let wq = self.quants.as_ptr().add(o * self.n_in);
        let ws = self.scales.as_ptr().add(o * nb);
        let mut xp = [std::ptr::null::<i8>(); N];
        let mut xs = [std::ptr::null::<f32>(); N];
        let mut xu = [std::ptr::null::<u8>(); N];
        for j in 0..N {
            xp[j] = xq.quants_il.as_ptr().add((r0 + j) * self.n_in);
            xs[j] = xq.scales.as_ptr().add((r0 + j) * nb);
            if VNNI && N >= 2 {
                xu[j] = xq.quants_u8.as_ptr().add((r0 + j) * self.n_in);
            }
        }
        // Whole groups of 8 blocks (interleaved): integer block sums in the 8 lanes, scaled once.
        let n_groups = nb / GROUP_BLOCKS;
        let mut acc_g = [_mm256_setzero_ps(); N];
        for g in 0..n_groups {
            let base = g * GROUP_BLOCKS * BLOCK;
            let mut isum = [_mm256_setzero_si256(); N];
            if VNNI && N >= 2 {
                // Unsigned activations (x + 128) straight into vpdpbusd, one instruction per row
                // and vector; the +128 is taken back once per group with the weights' block sums.
                for k in 0..GROUP_BLOCKS {
                    let w = _mm256_loadu_si256(wq.add(base + k * BLOCK) as *const __m256i);
                    for j in 0..N {
                        let x = _mm256_loadu_si256(xu[j].add(base + k * BLOCK) as *const __m256i);
                        isum[j] = _mm256_dpbusd_epi32(isum[j], x, w);
                    }
                }
                let offset = _mm256_loadu_si256(self.wsum128.as_ptr().add(o * nb + g * GROUP_BLOCKS) as *const __m256i);
                for j in 0..N {
                    isum[j] = _mm256_sub_epi32(isum[j], offset);
                }
            } else {
            for k in 0..GROUP_BLOCKS {
                let w = _mm256_loadu_si256(wq.add(base + k * BLOCK) as *const __m256i);
                // |w| is unsigned and x takes w's sign: maddubs(|w|, sign(x, w)) sums w·x in
                // pairs, and |w|, |x| ≤ 127 keeps each pair sum inside i16.
                let w_abs = _mm256_sign_epi8(w, w);
                for j in 0..N {
                    let x = _mm256_loadu_si256(xp[j].add(base + k * BLOCK) as *const __m256i);
                    let x_signed = _mm256_sign_epi8(x, w);
                    isum[j] = if VNNI {
                        _mm256_dpbusd_epi32(isum[j], w_abs, x_signed)
                    } else {
                        _mm256_add_epi32(isum[j], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, x_signed), ones))
                    };
                }
            }
            }
            let w_scales = _mm256_loadu_ps(ws.add(g * GROUP_BLOCKS));
            for j in 0..N {
                let scales = _mm256_mul_ps(w_scales, _mm256_loadu_ps(xs[j].add(g * GROUP_BLOCKS)));
                acc_g[j] = _mm256_fmadd_ps(scales, _mm256_cvtepi32_ps(isum[j]), acc_g[j]);
            }
        }
        // The remaining blocks (fewer than 8, stored in place) one at a time, with the same
        // operations in the same order for any number of rows, so that batched results equal
        // single-row results exactly.
        let mut acc = [_mm256_setzero_ps(); N];
        for b in n_groups * GROUP_BLOCKS..nb {
            let w = _mm256_loadu_si256(wq.add(b * BLOCK) as *const __m256i);
            // |w| is unsigned and x takes w's sign: maddubs(|w|, sign(x, w)) sums w·x in pairs,
            // and |w|, |x| ≤ 127 keeps each pair sum inside i16.
            let w_abs = _mm256_sign_epi8(w, w);
            let w_scale = *ws.add(b);
            for j in 0..N {
                let x = _mm256_loadu_si256(xp[j].add(b * BLOCK) as *const __m256i);
                let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w)), ones);
                let scale = _mm256_set1_ps(w_scale * *xs[j].add(b));
                acc[j] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc[j]);
            }
        }
        for j in 0..N {
            out[j] = hsum256(_mm256_add_ps(acc_g[j], acc[j]));
        }
    }
}

impl RowKernel for Q8Matrix {
    fn n_out(&self) -> usize {
        self.n_out
    }

    /// Apple Silicon's CPU path: the interleaved layout works for NEON too. A 32-byte vector of a
    /// group is two 16-byte halves whose 4-byte lanes belong to blocks 0–3 and 4–7, so the
    /// multiply-adds of a group leave the 8 blocks' integer sums in two registers, scaled once.
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    fn rows_neon(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) -> bool {
        use std::arch::aarch64::*;
        let nb = self.n_in / BLOCK;
        let n_groups = nb / GROUP_BLOCKS;
        for (i, o) in outs.enumerate() {
            for r in 0..xq.n_rows {
                // SAFETY: every pointer below stays inside row `o` of the weights (n_in quants,
                // nb scales) or row `r` of the activations (same sizes); NEON is baseline here.
                local[i * xq.n_rows + r] = unsafe {
                    let wq = self.quants.as_ptr().add(o * self.n_in);
                    let ws = self.scales.as_ptr().add(o * nb);
                    let xp = xq.quants_il.as_ptr().add(r * self.n_in);
                    let xs = xq.scales.as_ptr().add(r * nb);
                    let mut acc = vdupq_n_f32(0.0);
                    for g in 0..n_groups {
                        let base = g * GROUP_BLOCKS * BLOCK;
                        let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
                        for k in 0..GROUP_BLOCKS {
                            let at = base + k * BLOCK;
                            lo = dot4_neon(lo, vld1q_s8(wq.add(at)), vld1q_s8(xp.add(at)));
                            hi = dot4_neon(hi, vld1q_s8(wq.add(at + 16)), vld1q_s8(xp.add(at + 16)));
                        }
                        let at = g * GROUP_BLOCKS;
                        let s_lo = vmulq_f32(vld1q_f32(ws.add(at)), vld1q_f32(xs.add(at)));
                        let s_hi = vmulq_f32(vld1q_f32(ws.add(at + 4)), vld1q_f32(xs.add(at + 4)));
                        acc = vfmaq_f32(acc, s_lo, vcvtq_f32_s32(lo));
                        acc = vfmaq_f32(acc, s_hi, vcvtq_f32_s32(hi));
                    }
                    let mut total = vaddvq_f32(acc);
                    // Blocks after the last whole group, stored in place.
                    for b in n_groups * GROUP_BLOCKS..nb {
                        let at = b * BLOCK;
                        let d = dot4_neon(vdupq_n_s32(0), vld1q_s8(wq.add(at)), vld1q_s8(xp.add(at)));
                        let d = dot4_neon(d, vld1q_s8(wq.add(at + 16)), vld1q_s8(xp.add(at + 16)));
                        total += *ws.add(b) * *xs.add(b) * vaddvq_s32(d) as f32;
                    }
                    total
                };
            }
        }
        true
    }
    fn n_in(&self) -> usize {
        self.n_in
    }
    fn portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        self.rows_portable(outs, xq, local);
    }
    /// AVX2 alone has 16 vector registers: 5 rows' integer and float accumulators plus the
    /// weights, their absolute values, the activations and a constant do not fit, and a 9-row
    /// product (5 + 4) cost 2.5x a 4-row one in `cargo bench` (AMD EPYC without AVX-512). VNNI
    /// needs fewer temporaries, and AVX-512VL gives 32 registers.
    #[cfg(target_arch = "x86_64")]
    fn max_group(&self) -> usize {
        if use_vnni() {
            MAX_GROUP
        } else {
            4
        }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn group_avx2_n(&self, o: usize, r0: usize, n: usize, xq: &Q8Rows, out: &mut [f32]) {
        if use_vnni() {
            dispatch_group!(self, group_vnni, o, r0, n, xq, out)
        } else {
            dispatch_group!(self, o, r0, n, xq, out)
        }
    }
}

/// Whether the CPU has AVX-512 VNNI (with 256-bit forms); `MENTOR_LAB_KERNEL=avx2` turns it off.
#[cfg(target_arch = "x86_64")]
fn use_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
            && std::env::var("MENTOR_LAB_KERNEL").map(|v| v != "avx2").unwrap_or(true)
    })
}

/// A 4-bit matrix `(n_out, n_in)` as GGML's Q4_1 (and Q4_0, with m = −8·d): each block of 32
/// weights is `d · q + m` with q in 0..15, two per byte (low nibbles are weights 0..15 of the
/// block, high nibbles 16..31). Half the bytes of Q8_0, so a decode step, which is bound by
/// reading the weights, is cheaper; and it is exactly the file's own quantization.
///
/// Block dot product with Q8_0 activations (scale s, quants x):
/// Σ (d·q_i + m)·s·x_i = d·s·Σ q_i·x_i + m·s·Σ x_i.
#[derive(Debug, Clone)]
pub struct Q4Matrix {
    pub n_out: usize,
    pub n_in: usize,
    d: Vec<f32>,      // (n_out, n_in / 32)
    m: Vec<f32>,      // (n_out, n_in / 32)
    nibbles: Vec<u8>, // (n_out, n_in / 2)
}

impl Q4Matrix {
    /// The matrices' rows one after another (all with the same `n_in`), like [`Q8Matrix::stack`].
    pub fn stack(parts: &[&Q4Matrix]) -> Option<Q4Matrix> {
        let n_in = common_width(parts.iter().map(|m| m.n_in))?;
        Some(Q4Matrix {
            n_out: parts.iter().map(|m| m.n_out).sum(),
            n_in,
            d: parts.iter().flat_map(|m| m.d.iter().copied()).collect(),
            m: parts.iter().flat_map(|m| m.m.iter().copied()).collect(),
            nibbles: parts.iter().flat_map(|m| m.nibbles.iter().copied()).collect(),
        })
    }

    /// Only the given rows, in that order, like [`Q8Matrix::select_rows`].
    pub fn select_rows(&self, rows: &[u32]) -> Option<Q4Matrix> {
        let (nb, nh) = (self.n_in / BLOCK, self.n_in / 2);
        let mut out = Q4Matrix { n_out: rows.len(), n_in: self.n_in, d: Vec::new(), m: Vec::new(), nibbles: Vec::new() };
        for &r in rows {
            let r = r as usize;
            out.d.extend_from_slice(self.d.get(r * nb..(r + 1) * nb)?);
            out.m.extend_from_slice(self.m.get(r * nb..(r + 1) * nb)?);
            out.nibbles.extend_from_slice(self.nibbles.get(r * nh..(r + 1) * nh)?);
        }
        Some(out)
    }

    /// Repack GGML Q4_1 (`min = true`: f16 d, f16 m, 16 bytes) or Q4_0 (f16 d, 16 bytes) bytes.
    pub fn from_ggml_bytes(bytes: &[u8], n_out: usize, n_in: usize, min: bool) -> Option<Q4Matrix> {
        let block_bytes = if min { 20 } else { 18 };
        if n_in % BLOCK != 0 || bytes.len() != n_out * n_in / BLOCK * block_bytes {
            return None;
        }
        let n_blocks = n_out * n_in / BLOCK;
        let (mut d, mut m) = (Vec::with_capacity(n_blocks), Vec::with_capacity(n_blocks));
        let mut nibbles = Vec::with_capacity(n_out * n_in / 2);
        for blk in bytes.chunks_exact(block_bytes) {
            let scale = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            d.push(scale);
            if min {
                m.push(half::f16::from_le_bytes([blk[2], blk[3]]).to_f32());
                nibbles.extend_from_slice(&blk[4..]);
            } else {
                m.push(-8.0 * scale);
                nibbles.extend_from_slice(&blk[2..]);
            }
        }
        Some(Q4Matrix { n_out, n_in, d, m, nibbles })
    }

    pub fn matmul(&self, x: &[f32], n_rows: usize) -> Vec<f32> {
        batched_matmul(self, x, n_rows)
    }

    fn rows_portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        let nb = self.n_in / BLOCK;
        for (i, o) in outs.enumerate() {
            for r in 0..xq.n_rows {
                let mut acc = 0f32;
                let mut offset = 0f32;
                for b in 0..nb {
                    let nib = &self.nibbles[(o * nb + b) * 16..][..16];
                    let x = &xq.quants[r * self.n_in + b * BLOCK..][..BLOCK];
                    let mut s = 0i32;
                    for j in 0..16 {
                        s += (nib[j] & 0x0F) as i32 * x[j] as i32 + (nib[j] >> 4) as i32 * x[j + 16] as i32;
                    }
                    acc += self.d[o * nb + b] * xq.scales[r * nb + b] * s as f32;
                    offset += self.m[o * nb + b] * xq.scaled_sums[r * nb + b];
                }
                local[i * xq.n_rows + r] = acc + offset;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn group_avx2<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let nb = self.n_in / BLOCK;
        let ones = _mm256_set1_epi16(1);
        let low = _mm_set1_epi8(0x0F);
        let nib = self.nibbles.as_ptr().add(o * nb * 16);
        let (d, m) = (self.d.as_ptr().add(o * nb), self.m.as_ptr().add(o * nb));
        let mut xp = [std::ptr::null::<i8>(); N];
        let mut xs = [std::ptr::null::<f32>(); N];
        for j in 0..N {
            xp[j] = xq.quants.as_ptr().add((r0 + j) * self.n_in);
            xs[j] = xq.scales.as_ptr().add((r0 + j) * nb);
        }
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..nb {
            // 16 bytes → 32 unsigned 4-bit weights in element order.
            let raw = _mm_loadu_si128(nib.add(b * 16) as *const __m128i);
            let lo = _mm_and_si128(raw, low);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
            let w = _mm256_set_m128i(hi, lo);
            let db = *d.add(b);
            for j in 0..N {
                let x = _mm256_loadu_si256(xp[j].add(b * BLOCK) as *const __m256i);
                // q ≤ 15 is unsigned already, so maddubs(q, x) needs no sign juggling, and
                // 2·15·127 fits in i16.
                let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(db * *xs[j].add(b)), _mm256_cvtepi32_ps(sums), acc[j]);
            }
        }
        let m = std::slice::from_raw_parts(m, nb);
        for j in 0..N {
            let t = &xq.scaled_sums[(r0 + j) * nb..(r0 + j + 1) * nb];
            let offset: f32 = m.iter().zip(t).map(|(a, b)| a * b).sum();
            out[j] = hsum256(acc[j]) + offset;
        }
    }
}

impl RowKernel for Q4Matrix {
    fn n_out(&self) -> usize {
        self.n_out
    }
    fn n_in(&self) -> usize {
        self.n_in
    }
    fn portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        self.rows_portable(outs, xq, local);
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn group_avx2_n(&self, o: usize, r0: usize, n: usize, xq: &Q8Rows, out: &mut [f32]) {
        dispatch_group!(self, o, r0, n, xq, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        (0..n).map(|i| (crate::sampling::uniform(seed, i as u64, crate::sampling::Purpose::TargetSample) as f32 - 0.5) * 4.0).collect()
    }

    #[test]
    fn batched_equals_single_rows_exactly() {
        // 256: whole groups of 8 blocks only; 576 (the default model's width): two blocks after them.
        for (n_out, n_in) in [(100, 256), (101, 576)] {
            let m = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 1), n_out, n_in).unwrap();
            for n_rows in [1, 2, 3, 5, 7, 9, 17] {
                let x = pseudo_random(n_rows * n_in, 2 + n_rows as u64);
                let all = m.matmul(&x, n_rows);
                for r in 0..n_rows {
                    let one = m.matmul(&x[r * n_in..(r + 1) * n_in], 1);
                    assert_eq!(&all[r * n_out..(r + 1) * n_out], &one[..], "{n_out}x{n_in}: row {r} of {n_rows}");
                }
            }
        }
    }

    #[test]
    fn stacked_matrices_give_each_part_exactly() {
        let n_in = 576; // two interleaved groups of 8 blocks and two blocks after them
        let parts: Vec<Q8Matrix> = [(64, 11), (32, 12), (32, 13)]
            .iter()
            .map(|&(n_out, seed)| Q8Matrix::from_f32(&pseudo_random(n_out * n_in, seed), n_out, n_in).unwrap())
            .collect();
        let stacked = Q8Matrix::stack(&parts.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(stacked.n_out, 128);
        let n_rows = 3;
        let x = pseudo_random(n_rows * n_in, 14);
        let all = stacked.matmul(&x, n_rows);
        let mut offset = 0;
        for m in &parts {
            let y = m.matmul(&x, n_rows);
            for r in 0..n_rows {
                assert_eq!(&all[r * 128 + offset..r * 128 + offset + m.n_out], &y[r * m.n_out..(r + 1) * m.n_out]);
            }
            offset += m.n_out;
        }
        let other = Q8Matrix::from_f32(&pseudo_random(32 * 64, 15), 32, 64).unwrap();
        assert!(Q8Matrix::stack(&[&parts[0], &other]).is_none(), "different input widths cannot stack");
        assert!(Q8Matrix::stack(&[]).is_none());
    }

    #[test]
    fn simd_matches_portable_and_f32() {
        let (n_out, n_in) = (70, 576);
        let w = pseudo_random(n_out * n_in, 3);
        let m = Q8Matrix::from_f32(&w, n_out, n_in).unwrap();
        let n_rows = 9;
        let x = pseudo_random(n_rows * n_in, 4);
        let fast = m.matmul(&x, n_rows);
        let xq = quantize_rows(&x, n_rows, n_in);
        let mut portable = vec![0f32; n_out * n_rows];
        m.rows_portable(0..n_out, &xq, &mut portable);
        for r in 0..n_rows {
            for o in 0..n_out {
                let exact: f32 = (0..n_in).map(|i| w[o * n_in + i] * x[r * n_in + i]).sum();
                let (f, p) = (fast[r * n_out + o], portable[o * n_rows + r]);
                assert!((f - p).abs() <= 1e-3 * (1.0 + p.abs()), "simd {f} vs portable {p}");
                // Two 8-bit quantizations: error ~1% of the magnitude of the terms.
                assert!((f - exact).abs() < 0.05 * (n_in as f32).sqrt() * 2.0, "q8 {f} vs f32 {exact}");
            }
        }
    }

    fn candle_reference(w: &[f32], x: &[f32], n_out: usize, n_in: usize, n_rows: usize, dtype: candle_core::quantized::GgmlDType) -> (Vec<u8>, Vec<Vec<f32>>) {
        use candle_core::quantized::{QMatMul, QTensor};
        use candle_core::{Device, Module, Tensor};
        let qt = QTensor::quantize(&Tensor::from_vec(w.to_vec(), (n_out, n_in), &Device::Cpu).unwrap(), dtype).unwrap();
        let bytes = qt.data().unwrap().into_owned();
        let xt = Tensor::from_vec(x.to_vec(), (n_rows, n_in), &Device::Cpu).unwrap();
        let y = QMatMul::from_qtensor(qt).unwrap().forward(&xt).unwrap();
        (bytes, y.to_vec2::<f32>().unwrap())
    }

    #[test]
    fn q4_kernels_match_candle_and_are_batch_exact() {
        use candle_core::quantized::GgmlDType;
        let (n_out, n_in) = (67, 576);
        let w = pseudo_random(n_out * n_in, 7);
        for (dtype, min) in [(GgmlDType::Q4_1, true), (GgmlDType::Q4_0, false)] {
            let n_rows = 9;
            let x = pseudo_random(n_rows * n_in, 8);
            let (bytes, theirs) = candle_reference(&w, &x, n_out, n_in, n_rows, dtype);
            let m = Q4Matrix::from_ggml_bytes(&bytes, n_out, n_in, min).unwrap();
            let ours = m.matmul(&x, n_rows);
            let xq = quantize_rows(&x, n_rows, n_in);
            let mut portable = vec![0f32; n_out * n_rows];
            m.rows_portable(0..n_out, &xq, &mut portable);
            for r in 0..n_rows {
                let one = m.matmul(&x[r * n_in..(r + 1) * n_in], 1);
                assert_eq!(&ours[r * n_out..(r + 1) * n_out], &one[..], "{dtype:?}: batched row {r} differs from single row");
                for o in 0..n_out {
                    let (a, b, p) = (ours[r * n_out + o], theirs[r][o], portable[o * n_rows + r]);
                    // candle quantizes the activations as Q8_1 for these formats, we as Q8_0: the two
                    // roundings differ by ~0.1% of the output's typical size (|y| ~ 30 here).
                    assert!((a - b).abs() <= 0.05, "{dtype:?}: ours {a} vs candle {b}");
                    assert!((a - p).abs() <= 1e-3 * (1.0 + p.abs()), "{dtype:?}: simd {a} vs portable {p}");
                }
            }
            assert!(Q4Matrix::from_ggml_bytes(&bytes[..bytes.len() - 1], n_out, n_in, min).is_none());
        }
    }

    #[test]
    fn ggml_bytes_round_trip() {
        let (n_out, n_in) = (4, 64);
        let w = pseudo_random(n_out * n_in, 5);
        let t = candle_core::Tensor::from_vec(w.clone(), (n_out, n_in), &candle_core::Device::Cpu).unwrap();
        let qt = candle_core::quantized::QTensor::quantize(&t, candle_core::quantized::GgmlDType::Q8_0).unwrap();
        let bytes = qt.data().unwrap().into_owned();
        let from_bytes = Q8Matrix::from_ggml_bytes(&bytes, n_out, n_in).unwrap();
        let x = pseudo_random(n_in, 6);
        let ours = from_bytes.matmul(&x, 1);
        let theirs = candle_core::Module::forward(&candle_core::quantized::QMatMul::from_qtensor(qt).unwrap(), &candle_core::Tensor::from_vec(x, (1, n_in), &candle_core::Device::Cpu).unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (a, b) in ours.iter().zip(&theirs[0]) {
            assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "ours {a} vs candle {b}");
        }
        assert!(Q8Matrix::from_ggml_bytes(&bytes[1..], n_out, n_in).is_none());
    }
}
