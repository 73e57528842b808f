//! Activation rows quantized to Q8_0 per block, with the per-block sums and the vector pairs the
//! kernels read.

use super::*;

/// Activation rows quantized to Q8_0.
pub(super) struct Q8Rows {
    pub(super) n_rows: usize,
    pub(super) scales: Vec<f32>, // (n_rows, n_in / 32)
    pub(super) quants: Vec<i8>,  // (n_rows, n_in)
    /// The same quants with each row interleaved like the Q8 weights (the SIMD kernels read
    /// these, the portable paths the plain ones; both cost n_rows · n_in bytes).
    pub(super) quants_il: Vec<i8>,
    /// `quants_il + 128` as unsigned bytes, for VNNI's unsigned × signed multiply-add (see
    /// [`Q8Matrix::wsum`]); filled only when the VNNI kernels will read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) quants_u8: Vec<u8>,
    /// `quants + 128` as unsigned bytes in plain order, for `vpdpbusd` over Q8_0's signed tiles;
    /// filled only when those will read it.
    #[cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(dead_code))]
    pub(super) plain_u8: Vec<u8>,
    /// `quants_il` with the vectors of each whole chunk of 8 blocks in the order 0 2 1 3 4 6 5 7,
    /// for the 512-bit 4-bit kernel (see [`pair_vectors`]); filled only when it will read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) quants_pair: Vec<i8>,
    /// For the AMX tiles' two blocks per multiply, blocks 2j and 2j + 1 of all rows as one tile
    /// of 2 · n_rows rows × 64 bytes: row r holds row r's block 2j then 32 zeros, row n_rows + r
    /// 32 zeros then row r's block 2j + 1, so that a 64-deep multiply against both blocks'
    /// weights leaves each block's sums in its own rows. Filled only where a kernel will read it
    /// (rows ≤ 8, an even number of blocks).
    #[cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(dead_code))]
    pub(super) tile_pairs: Vec<i8>,
    /// scale · Σ quants of each block, (n_rows, n_in / 32): the 4-bit formats' offset term
    /// Σ_b m_b · s_b · Σ x_b is then a short dot product with the weights' m.
    pub(super) scaled_sums: Vec<f32>,
    /// Σ quants over each half block of 16, (n_rows, n_in / 16), per chunk of 8 blocks the 8
    /// first halves then the 8 second halves: the Q6_K kernel's `−32` offset. Filled only where
    /// that kernel will read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) half_sums: Vec<i32>,
}

/// Quantize one block of 32 values: scale = max|x| / 127, q = round(x / scale).
#[inline(always)]
pub(super) fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qi, &xi) in q.iter_mut().zip(x) {
        *qi = (xi * inv).round() as i8;
    }
    d
}

pub(super) fn quantize_rows(x: &[f32], n_rows: usize, n_in: usize) -> Q8Rows {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected.
            return unsafe { quantize_rows_avx2(x, n_rows, n_in) };
        }
    }
    quantize_rows_any(x, n_rows, n_in)
}

/// The same quantization with AVX2: 32 values per block in four vectors, rounding half away from
/// zero like `f32::round` (truncate, then step away from zero where the dropped part is ≥ 0.5; both
/// exact), so the quants and scales equal [`quantize_block`]'s bit for bit (a test checks).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_rows_avx2(x: &[f32], n_rows: usize, n_in: usize) -> Q8Rows {
    use std::arch::x86_64::*;
    let n_blocks = n_in / BLOCK;
    let mut scales = vec![0f32; n_rows * n_blocks];
    let mut quants = vec![0i8; n_rows * n_in];
    let mut scaled_sums = vec![0f32; n_rows * n_blocks];
    let sign = _mm256_set1_ps(-0.0);
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    for (b, (xs, qs)) in x.chunks_exact(BLOCK).zip(quants.chunks_exact_mut(BLOCK)).enumerate() {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xs.as_ptr().add(8 * i)));
        // NaN-ignoring like the scalar fold: `max_ps` returns its second operand on a NaN.
        let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| _mm256_max_ps(_mm256_andnot_ps(sign, v), m));
        let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        let m2 = _mm_max_ps(_mm_movehl_ps(m4, m4), m4);
        let amax = _mm_cvtss_f32(_mm_max_ss(_mm_shuffle_ps(m2, m2, 1), m2));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let y = _mm256_mul_ps(v[i], inv);
            let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            let away = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(y, t)), half, _CMP_GE_OQ);
            let step = _mm256_and_ps(away, _mm256_or_ps(_mm256_and_ps(y, sign), one));
            _mm256_cvttps_epi32(_mm256_add_ps(t, step))
        });
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let t4 = _mm_add_epi32(_mm256_extracti128_si256(total, 1), _mm256_castsi256_si128(total));
        let t2 = _mm_add_epi32(t4, _mm_unpackhi_epi64(t4, t4));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(t2, _mm_shuffle_epi32(t2, 1)));
        // Packing works within 128-bit lanes: 4-byte groups come out as 0 4 1 5 2 6 3 7.
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, ordered);
        scales[b] = d;
        scaled_sums[b] = d * sum as f32;
    }
    finish_rows(n_rows, n_in, scales, quants, scaled_sums)
}

pub(super) fn quantize_rows_any(x: &[f32], n_rows: usize, n_in: usize) -> Q8Rows {
    let n_blocks = n_in / BLOCK;
    let mut scales = vec![0f32; n_rows * n_blocks];
    let mut quants = vec![0i8; n_rows * n_in];
    let mut scaled_sums = vec![0f32; n_rows * n_blocks];
    for (b, (xs, qs)) in x.chunks_exact(BLOCK).zip(quants.chunks_exact_mut(BLOCK)).enumerate() {
        scales[b] = quantize_block(xs, qs);
        scaled_sums[b] = scales[b] * qs.iter().map(|&q| q as i32).sum::<i32>() as f32;
    }
    finish_rows(n_rows, n_in, scales, quants, scaled_sums)
}

/// The interleaved copies of quantized rows.
pub(super) fn finish_rows(
    n_rows: usize,
    n_in: usize,
    scales: Vec<f32>,
    quants: Vec<i8>,
    scaled_sums: Vec<f32>,
) -> Q8Rows {
    let mut quants_il = vec![0i8; quants.len()];
    if n_in > 0 {
        for (plain, il) in quants.chunks_exact(n_in).zip(quants_il.chunks_exact_mut(n_in)) {
            interleave_into(plain, il);
        }
    }
    Q8Rows {
        n_rows,
        scales,
        quants,
        quants_il,
        quants_u8: Vec::new(),
        plain_u8: Vec::new(),
        quants_pair: Vec::new(),
        tile_pairs: Vec::new(),
        scaled_sums,
        half_sums: Vec::new(),
    }
}

impl Q8Rows {
    /// Fill `quants_u8` where a Q8_0 VNNI kernel of `isa` (the matrix's) will read it (groups of
    /// 2 or more rows); the 4-bit kernels and the AVX2 paths never do.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn fill_unsigned_for_vnni(&mut self, isa: Isa) {
        if self.n_rows > 1 && isa.vnni() {
            self.quants_u8 = self.quants_il.iter().map(|&q| (q as u8) ^ 0x80).collect();
        }
    }

    /// Fill `plain_u8` (see there).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    pub(super) fn fill_plain_unsigned(&mut self) {
        if self.plain_u8.is_empty() {
            self.plain_u8 = self.quants.iter().map(|&q| (q as u8) ^ 0x80).collect();
        }
    }

    /// Fill `tile_pairs` (see there) where it fits.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    pub(super) fn fill_tile_pairs(&mut self) {
        let n_in = self.quants.len() / self.n_rows.max(1);
        let nb = n_in / BLOCK;
        if self.n_rows == 0 || self.n_rows > amx::MAX_PAIR_ROWS || !nb.is_multiple_of(2) {
            return;
        }
        let rows = self.n_rows;
        let mut t = vec![0i8; rows * n_in * 2];
        for j in 0..nb / 2 {
            let pair = &mut t[j * 2 * rows * 2 * BLOCK..][..2 * rows * 2 * BLOCK];
            for r in 0..rows {
                let x = &self.quants[r * n_in..];
                pair[r * 2 * BLOCK..][..BLOCK].copy_from_slice(&x[2 * j * BLOCK..][..BLOCK]);
                pair[(rows + r) * 2 * BLOCK + BLOCK..][..BLOCK].copy_from_slice(&x[(2 * j + 1) * BLOCK..][..BLOCK]);
            }
        }
        self.tile_pairs = t;
    }

    /// Fill `half_sums` (see there) for rows whose width is whole chunks of 8 blocks.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn fill_half_sums(&mut self) {
        let n_in = self.quants.len() / self.n_rows.max(1);
        if !self.half_sums.is_empty() || !n_in.is_multiple_of(GROUP_BLOCKS * BLOCK) {
            return;
        }
        self.half_sums = vec![0; self.quants.len() / 16];
        for (chunk, sums) in self.quants.chunks_exact(GROUP_BLOCKS * BLOCK).zip(self.half_sums.chunks_exact_mut(16)) {
            for (i, block) in chunk.chunks_exact(BLOCK).enumerate() {
                sums[i] = block[..16].iter().map(|&q| q as i32).sum();
                sums[GROUP_BLOCKS + i] = block[16..].iter().map(|&q| q as i32).sum();
            }
        }
    }

    /// Fill `quants_pair` where the 512-bit 4-bit kernel will read it (`isa`: the matrix's).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn fill_pairs_for_wide(&mut self, isa: Isa) {
        if isa.vnni512() {
            self.quants_pair = pair_vectors(&self.quants_il, self.quants.len() / self.n_rows.max(1));
        }
    }
}

/// The 512-bit 4-bit kernel loads 64 bytes of nibbles at a time: two stored 32-byte vectors of a
/// chunk, whose low nibbles are the chunk's vectors 4t and 4t + 2 and whose high nibbles are 4t + 1
/// and 4t + 3 ([`pack_q4_row`]). Activations with the vectors of each whole chunk of 8 blocks in
/// the order 0 2 1 3 4 6 5 7 line up with them in two plain 64-byte loads. Chunks of fewer blocks
/// stay as they are.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) fn pair_vectors(quants_il: &[i8], n_in: usize) -> Vec<i8> {
    let mut out = quants_il.to_vec();
    if n_in == 0 {
        return out;
    }
    for (src, dst) in quants_il.chunks_exact(n_in).zip(out.chunks_exact_mut(n_in)) {
        for (b0, size) in chunks(n_in / BLOCK) {
            if size != GROUP_BLOCKS {
                continue;
            }
            for (to, from) in [0, 2, 1, 3, 4, 6, 5, 7].into_iter().enumerate() {
                dst[(b0 + to) * BLOCK..][..BLOCK].copy_from_slice(&src[(b0 + from) * BLOCK..][..BLOCK]);
            }
        }
    }
    out
}
