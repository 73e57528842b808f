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
/// Output rows handled per task.
const OUT_CHUNK: usize = 32;

/// A weight matrix `(n_out, n_in)` in Q8_0, scales and quants in separate arrays.
#[derive(Debug, Clone)]
pub struct Q8Matrix {
    pub n_out: usize,
    pub n_in: usize,
    scales: Vec<f32>, // (n_out, n_in / 32)
    quants: Vec<i8>,  // (n_out, n_in)
}

/// Activation rows quantized to Q8_0.
struct Q8Rows {
    n_rows: usize,
    scales: Vec<f32>, // (n_rows, n_in / 32)
    quants: Vec<i8>,  // (n_rows, n_in)
}

/// Quantize one block of 32 values: scale = max|x| / 127, q = round(x / scale).
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
    let n_blocks = n_in / BLOCK;
    let mut scales = vec![0f32; n_rows * n_blocks];
    let mut quants = vec![0i8; n_rows * n_in];
    for (b, (xs, qs)) in x.chunks_exact(BLOCK).zip(quants.chunks_exact_mut(BLOCK)).enumerate() {
        scales[b] = quantize_block(xs, qs);
    }
    Q8Rows { n_rows, scales, quants }
}

impl Q8Matrix {
    /// Quantize an f32 matrix given row-major `(n_out, n_in)`; `n_in` must be a multiple of 32.
    pub fn from_f32(w: &[f32], n_out: usize, n_in: usize) -> Option<Q8Matrix> {
        if n_in % BLOCK != 0 || w.len() != n_out * n_in {
            return None;
        }
        let r = quantize_rows(w, n_out, n_in);
        Some(Q8Matrix { n_out, n_in, scales: r.scales, quants: r.quants })
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
        Some(Q8Matrix { n_out, n_in, scales, quants })
    }

    /// `x` is row-major `(n_rows, n_in)`; returns row-major `(n_rows, n_out)`.
    pub fn matmul(&self, x: &[f32], n_rows: usize) -> Vec<f32> {
        assert_eq!(x.len(), n_rows * self.n_in, "activation shape");
        let xq = quantize_rows(x, n_rows, self.n_in);
        // Each task computes a chunk of outputs for all rows: (chunk, n_rows), then scatters.
        let chunks: Vec<(usize, Vec<f32>)> = (0..self.n_out.div_ceil(OUT_CHUNK))
            .into_par_iter()
            .map(|c| {
                let o0 = c * OUT_CHUNK;
                let o1 = (o0 + OUT_CHUNK).min(self.n_out);
                let mut local = vec![0f32; (o1 - o0) * n_rows];
                self.rows_for(o0..o1, &xq, &mut local);
                (o0, local)
            })
            .collect();
        let mut y = vec![0f32; n_rows * self.n_out];
        for (o0, local) in chunks {
            let width = local.len() / n_rows.max(1);
            for (i, chunk) in local.chunks_exact(n_rows).enumerate() {
                for (r, &v) in chunk.iter().enumerate() {
                    y[r * self.n_out + o0 + i] = v;
                }
            }
            debug_assert!(o0 + width <= self.n_out);
        }
        y
    }

    /// Outputs `outs` for every row, into `local` laid out `(out, row)`.
    fn rows_for(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: the features were just detected.
                unsafe { self.rows_avx2(outs, xq, local) };
                return;
            }
        }
        self.rows_portable(outs, xq, local);
    }

    /// Portable version (and the reference the SIMD version is tested against).
    fn rows_portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        let nb = self.n_in / BLOCK;
        for (i, o) in outs.enumerate() {
            for r in 0..xq.n_rows {
                let mut acc = 0f32;
                for b in 0..nb {
                    let w = &self.quants[o * self.n_in + b * BLOCK..][..BLOCK];
                    let x = &xq.quants[r * self.n_in + b * BLOCK..][..BLOCK];
                    let s: i32 = w.iter().zip(x).map(|(&a, &c)| a as i32 * c as i32).sum();
                    acc += self.scales[o * nb + b] * xq.scales[r * nb + b] * s as f32;
                }
                local[i * xq.n_rows + r] = acc;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        let n_rows = xq.n_rows;
        for (i, o) in outs.enumerate() {
            let out = &mut local[i * n_rows..(i + 1) * n_rows];
            // Rows in groups of 4: the group's accumulators stay in registers while the output
            // row's weights (n_in bytes) stay in L1 across groups.
            let mut r0 = 0;
            while r0 < n_rows {
                match n_rows - r0 {
                    1 => self.group_avx2::<1>(o, r0, xq, &mut out[r0..]),
                    2 => self.group_avx2::<2>(o, r0, xq, &mut out[r0..]),
                    3 => self.group_avx2::<3>(o, r0, xq, &mut out[r0..]),
                    _ => self.group_avx2::<4>(o, r0, xq, &mut out[r0..]),
                }
                r0 += (n_rows - r0).min(4);
            }
        }
    }

    /// Output `o` for activation rows `r0 .. r0 + N`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn group_avx2<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let nb = self.n_in / BLOCK;
        let ones = _mm256_set1_epi16(1);
        let wq = self.quants.as_ptr().add(o * self.n_in);
        let ws = self.scales.as_ptr().add(o * nb);
        let mut xp = [std::ptr::null::<i8>(); N];
        let mut xs = [std::ptr::null::<f32>(); N];
        for j in 0..N {
            xp[j] = xq.quants.as_ptr().add((r0 + j) * self.n_in);
            xs[j] = xq.scales.as_ptr().add((r0 + j) * nb);
        }
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..nb {
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
            let a = acc[j];
            let s4 = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
            out[j] = _mm_cvtss_f32(s1);
        }
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
        let (n_out, n_in) = (100, 256);
        let m = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 1), n_out, n_in).unwrap();
        for n_rows in [1, 2, 7, 9, 17] {
            let x = pseudo_random(n_rows * n_in, 2 + n_rows as u64);
            let all = m.matmul(&x, n_rows);
            for r in 0..n_rows {
                let one = m.matmul(&x[r * n_in..(r + 1) * n_in], 1);
                assert_eq!(&all[r * n_out..(r + 1) * n_out], &one[..], "row {r} of {n_rows}");
            }
        }
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
