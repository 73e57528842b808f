//! Vector math shared by the model's forward (attention's softmax) and by sampling: a
//! branch-free `exp` for max-subtracted values, scaling, the maximum and an f64 sum, each with an
//! AVX2 form that gives the scalar form's results bit for bit. Below both `model` and `sampling`.

/// `xs[i] *= factor`, 8 at a time where the CPU has AVX2 (the same products).
pub fn scale_in_place(xs: &mut [f32], factor: f32) {
    #[inline(always)]
    fn any(xs: &mut [f32], factor: f32) {
        xs.iter_mut().for_each(|x| *x *= factor);
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(xs: &mut [f32], factor: f32) {
            any(xs, factor)
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was just detected.
            return unsafe { avx2(xs, factor) };
        }
    }
    any(xs, factor)
}

/// The largest value, NaN ignored (−∞ if there is none), as `fold(−∞, f32::max)` gives it. In 8
/// lanes of `if x > m`, which compiles to one `maxps` per vector (`f32::max` adds a NaN check to
/// each): ~17 µs over 49152 values as a plain fold, ~3 µs this way.
pub fn max_f32(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    lanes.iter().copied().fold(tail, f32::max)
}

/// `e^x` for `x ≤ 0` (max-subtracted logits; NaN and −∞ give 0), without branches so that loops
/// over a vocabulary vectorize: 49152 of these take ~30 µs instead of ~1 ms through libm's f64
/// `exp`. `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`; `e^r` by its Taylor series to `r^7` (truncation
/// < 3e-8); `2^n` written into the exponent bits. Below −87 (under f32's normal range) it returns 0.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 split so that n · LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding and subtracting it rounds to an integer
    let live = x >= -87.0; // false for NaN and −∞ too
    let xc = if live { x } else { -87.0 };
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let poly = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if live {
        poly * scale
    } else {
        0.0
    }
}

/// `dst[i] = exp_nonpositive((src[i] − max) · scale)`, with AVX2 where the CPU has it (8 lanes
/// instead of SSE2's 4; the same operations, so the same results).
pub fn exp_shifted(src: &[f32], max: f32, scale: f32, dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    // SAFETY: both slices hold at least n values; a `&mut` and a `&` never overlap.
    unsafe { exp_shifted_raw(src.as_ptr(), dst.as_mut_ptr(), n, max, scale) }
}

/// [`exp_shifted`] in place: `xs[i] = exp_nonpositive((xs[i] − max) · scale)`.
pub fn exp_shifted_in_place(xs: &mut [f32], max: f32, scale: f32) {
    let p = xs.as_mut_ptr();
    // SAFETY: each value is read before the same position is written.
    unsafe { exp_shifted_raw(p, p, xs.len(), max, scale) }
}

/// Safety: `src` and `dst` are valid for `n` values; they may be the same buffer.
unsafe fn exp_shifted_raw(src: *const f32, dst: *mut f32, n: usize, max: f32, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected.
            return exp_shifted_avx2(src, dst, n, max, scale);
        }
    }
    exp_shifted_any(src, dst, n, max, scale)
}

/// [`exp_nonpositive`] on 8 lanes: the same operations in the same order (no fused multiply-adds),
/// so every result is bit-for-bit the scalar one (tested). The compiler does not vectorize the
/// scalar form (its saturating float-to-int cast): ~2 ns per value, against ~0.3 ns here.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(src: *const f32, dst: *mut f32, n_all: usize, max: f32, scale: f32) {
    use std::arch::x86_64::*;
    let whole = n_all / 8 * 8;
    let (vmax, vscale) = (_mm256_set1_ps(max), _mm256_set1_ps(scale));
    let floor = _mm256_set1_ps(-87.0);
    let (log2e, round) = (_mm256_set1_ps(std::f32::consts::LOG2_E), _mm256_set1_ps(12_582_912.0));
    let (ln2_hi, ln2_lo) = (_mm256_set1_ps(0.693_145_75), _mm256_set1_ps(1.428_606_8e-6));
    let coef = [1.0f32 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0].map(|c| _mm256_set1_ps(c));
    for i in (0..whole).step_by(8) {
        let x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(src.add(i)), vmax), vscale);
        let live = _mm256_cmp_ps(x, floor, _CMP_GE_OQ); // false for NaN too
        if _mm256_movemask_ps(live) == 0 {
            // All eight underflow (a draft's head restricted to its frequent tokens leaves the
            // others at −∞: two thirds of the vocabulary for the shipped draft).
            _mm256_storeu_ps(dst.add(i), _mm256_setzero_ps());
            continue;
        }
        let xc = _mm256_blendv_ps(floor, x, live);
        let n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, log2e), round), round);
        let r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(n, ln2_hi)), _mm256_mul_ps(n, ln2_lo));
        let mut poly = _mm256_set1_ps(1.0 / 5040.0);
        for c in coef {
            poly = _mm256_add_ps(c, _mm256_mul_ps(r, poly));
        }
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)),
            23,
        ));
        _mm256_storeu_ps(dst.add(i), _mm256_and_ps(_mm256_mul_ps(poly, two_n), live));
    }
    exp_shifted_any(src.add(whole), dst.add(whole), n_all - whole, max, scale);
}

/// Safety: as [`exp_shifted_raw`].
#[inline(always)]
unsafe fn exp_shifted_any(src: *const f32, dst: *mut f32, n: usize, max: f32, scale: f32) {
    for i in 0..n {
        *dst.add(i) = exp_nonpositive((*src.add(i) - max) * scale);
    }
}

/// Σ x in f64, in 8 interleaved partial sums so that the loop vectorizes (a single running f64
/// sum is one dependent add per element: ~75 µs over a 49152-token vocabulary, ~10 µs this way).
pub fn sum_f64(xs: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was just detected.
            return unsafe { sum_f64_avx2(xs) };
        }
    }
    sum_f64_any(xs)
}

/// [`sum_f64`] compiled for AVX2: the same 8 partial sums in the same order (so the same result),
/// 4 doubles per instruction instead of SSE2's 2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_f64_avx2(xs: &[f32]) -> f64 {
    sum_f64_any(xs)
}

#[inline(always)]
fn sum_f64_any(xs: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = xs.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&x| x as f64).sum();
    for c in chunks {
        for (acc, &x) in lanes.iter_mut().zip(c) {
            *acc += x as f64;
        }
    }
    lanes.iter().sum::<f64>() + tail
}
