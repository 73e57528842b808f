//! Batched quantized matrix multiplies for the CPU: `y = x W^T` for a few activation rows at once.
//!
//! Why: speculative verification runs the target over k + 1 tokens. candle's quantized matmul
//! treats every activation row as a separate matrix-vector product, so each row streams the whole
//! weight matrix from memory again and verifying 9 tokens costs ~7 single steps. Here each weight
//! block is loaded once and used for every row while it is in registers, so the cost of extra rows
//! is arithmetic only.
//!
//! Formats: Q8_0 ([`Q8Matrix`]) and the 4-bit Q4_1 / Q4_0 ([`Q4Matrix`]) as in GGML, blocks of 32
//! weights with their own scale. The activations are quantized to Q8_0 per row, so a block's dot
//! product is an exact integer sum times the two scales. Per (row, block) the arithmetic is the
//! same whatever the number of rows, so a batched result equals the single-row result exactly.
//!
//! Paths on x86-64: AVX2, AVX-512 VNNI (256- and 512-bit) and, on Linux with Intel AMX, tile
//! multiplies for calls of several rows ([`amx`]). They give the same results bit for bit: the
//! integer block sums are exact in each, and each adds the scaled sums in one order (lane i of a
//! chunk of blocks takes block i, then the 8 lanes are summed as `hsum256` does). The portable
//! path (and NEON's on Arm) adds block by block; tests hold it to the SIMD results within 1e-3.

// The kernels walk several arrays (rows, blocks, lanes) with one counter.
#![allow(clippy::needless_range_loop)]

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
/// Without AMX there is no tile layout to build.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod amx {
    #[derive(Debug, Clone)]
    pub(super) struct AmxTiles;
    impl AmxTiles {
        pub(super) fn from_q4_ggml(_: &[u8], _: usize, _: usize, _: usize, _: &[f32], _: &[f32]) -> Option<AmxTiles> {
            None
        }
        pub(super) fn from_q8(_: usize, _: usize, _: &[f32], _: impl Fn(usize) -> Vec<i8>) -> Option<AmxTiles> {
            None
        }
        pub(super) fn stack(_: &[Option<&AmxTiles>], _: &[usize]) -> Option<AmxTiles> {
            None
        }
    }
}

pub const BLOCK: usize = 32;

/// Whether multi-row calls may take the AMX tiles where the matrices have them (a switch for
/// comparing runs in one process: `bench`'s `noamx`).
static TILES_ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

pub fn set_tiles_enabled(on: bool) {
    TILES_ON.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// A matrix's AMX tiles where a call of `n_rows` rows takes them (switched on, and enough rows).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn tiles_for(tiles: &Option<amx::AmxTiles>, n_rows: usize, n_in: usize) -> Option<&amx::AmxTiles> {
    tiles.as_ref().filter(|t| n_rows >= t.min_rows(n_in) && TILES_ON.load(std::sync::atomic::Ordering::Relaxed))
}
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
    /// The same weights in AMX's tile layout, where this process can run it.
    amx: Option<amx::AmxTiles>,
}

/// Blocks per interleaved group: one 256-bit lane of 4 bytes per block.
const GROUP_BLOCKS: usize = 8;

/// The chunks a row of `nb` blocks is stored in, as (first block, blocks): whole groups of 8, then
/// one chunk each of 4, 2 and 1 blocks as the rest needs (a width of 576 = 18 blocks is 8 + 8 + 2).
fn chunks(nb: usize) -> impl Iterator<Item = (usize, usize)> {
    let whole = nb / GROUP_BLOCKS * GROUP_BLOCKS;
    let rest = nb - whole;
    let tails = [4, 2, 1].into_iter().filter(move |&size| rest & size != 0).scan(whole, |b0, size| {
        let chunk = (*b0, size);
        *b0 += size;
        Some(chunk)
    });
    (0..whole).step_by(GROUP_BLOCKS).map(|b0| (b0, GROUP_BLOCKS)).chain(tails)
}

/// Where byte `p` of a stored chunk of `size` blocks comes from, as an offset into the chunk's
/// blocks in plain order. The chunk is `size` vectors of 32 bytes; lane i (4 bytes) of vector v
/// holds 4 bytes of block i % size, its bytes 4·((8 / size)·v + i / size) onward. A multiply-add
/// of such vectors sums 4 products per lane, all from one block, so adding the chunk's vectors'
/// results leaves each lane with part of one block's dot product: the block scales are then applied
/// to all 8 lanes with one vector multiply (the scales repeated to match), instead of per block.
/// For 8 blocks, lane i of vector v is bytes 4v..4v+3 of block i; for 1 block, plain order.
#[inline]
fn chunk_source(p: usize, size: usize) -> usize {
    let (v, i, l) = (p / BLOCK, p % BLOCK / 4, p % 4);
    (i % size) * BLOCK + 4 * ((GROUP_BLOCKS / size) * v + i / size) + l
}

/// For a chunk of `size` blocks: the source word (4 elements, in plain order) of each stored word
/// (see [`chunk_source`], which keeps each 4-element group together).
fn chunk_words(size: usize) -> &'static [u16] {
    static TABLES: std::sync::OnceLock<[Vec<u16>; 4]> = std::sync::OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        [1, 2, 4, 8].map(|s| (0..s * BLOCK / 4).map(|w| (chunk_source(4 * w, s) / 4) as u16).collect())
    });
    &tables[size.trailing_zeros() as usize]
}

/// One row from plain block order into the chunk layout ([`chunk_source`]).
fn interleave_into<T: Copy>(plain: &[T], out: &mut [T]) {
    for (b0, size) in chunks(plain.len() / BLOCK) {
        let (src, dst) = (&plain[b0 * BLOCK..(b0 + size) * BLOCK], &mut out[b0 * BLOCK..(b0 + size) * BLOCK]);
        for (d, &w) in dst.chunks_exact_mut(4).zip(chunk_words(size)) {
            d.copy_from_slice(&src[4 * w as usize..][..4]);
        }
    }
}

/// Reorder one row of quants from plain block order into the chunk layout.
fn interleave_row<T: Copy>(row: &mut [T]) {
    let plain = row.to_vec();
    interleave_into(&plain, row);
}

/// The inverse of [`interleave_row`]: the row in plain block order.
fn deinterleave_row<T: Copy>(row: &[T]) -> Vec<T> {
    let mut plain = row.to_vec();
    for (b0, size) in chunks(row.len() / BLOCK) {
        let (src, dst) = (&row[b0 * BLOCK..(b0 + size) * BLOCK], &mut plain[b0 * BLOCK..(b0 + size) * BLOCK]);
        for (s, &w) in src.chunks_exact(4).zip(chunk_words(size)) {
            dst[4 * w as usize..][..4].copy_from_slice(s);
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
    /// The same quants with each row interleaved like the Q8 weights (the SIMD kernels read
    /// these, the portable paths the plain ones; both cost n_rows · n_in bytes).
    quants_il: Vec<i8>,
    /// `quants_il + 128` as unsigned bytes, for VNNI's unsigned × signed multiply-add (see
    /// [`Q8Matrix::wsum128`]); filled only when the VNNI kernels will read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    quants_u8: Vec<u8>,
    /// `quants_il` with the vectors of each whole chunk of 8 blocks in the order 0 2 1 3 4 6 5 7,
    /// for the 512-bit 4-bit kernel (see [`pair_vectors`]); filled only when it will read it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    quants_pair: Vec<i8>,
    /// For the AMX tiles' two blocks per multiply, blocks 2j and 2j + 1 of all rows as one tile
    /// of 2 · n_rows rows × 64 bytes: row r holds row r's block 2j then 32 zeros, row n_rows + r
    /// 32 zeros then row r's block 2j + 1, so that a 64-deep multiply against both blocks'
    /// weights leaves each block's sums in its own rows. Filled only where a kernel will read it
    /// (rows ≤ 8, an even number of blocks).
    #[cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(dead_code))]
    tile_pairs: Vec<i8>,
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

/// The same quantization with AVX2: 32 values per block in four vectors, rounding half away from
/// zero like `f32::round` (truncate, then step away from zero where the dropped part is ≥ 0.5; both
/// exact), so the quants and scales equal [`quantize_block`]'s bit for bit (a test checks).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_rows_avx2(x: &[f32], n_rows: usize, n_in: usize) -> Q8Rows {
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

fn quantize_rows_any(x: &[f32], n_rows: usize, n_in: usize) -> Q8Rows {
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
fn finish_rows(n_rows: usize, n_in: usize, scales: Vec<f32>, quants: Vec<i8>, scaled_sums: Vec<f32>) -> Q8Rows {
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
        quants_pair: Vec::new(),
        tile_pairs: Vec::new(),
        scaled_sums,
    }
}

impl Q8Rows {
    /// Fill `quants_u8` where a Q8_0 VNNI kernel will read it (groups of 2 or more rows); the
    /// 4-bit kernels and the AVX2 paths never do.
    #[cfg(target_arch = "x86_64")]
    fn fill_unsigned_for_vnni(&mut self) {
        if self.n_rows > 1 && use_vnni() {
            self.quants_u8 = self.quants_il.iter().map(|&q| (q as u8) ^ 0x80).collect();
        }
    }

    /// Fill `tile_pairs` (see there) where it fits.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn fill_tile_pairs(&mut self) {
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

    /// Fill `quants_pair` where the 512-bit 4-bit kernel will read it.
    #[cfg(target_arch = "x86_64")]
    fn fill_pairs_for_wide(&mut self) {
        if use_vnni512() {
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
fn pair_vectors(quants_il: &[i8], n_in: usize) -> Vec<i8> {
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

/// Anything that can compute a range of outputs for all activation rows, into `local` laid out
/// `(out, row)`. The batching, threading and scatter are shared.
trait RowKernel: Sync {
    fn n_out(&self) -> usize;
    fn n_in(&self) -> usize;
    /// Fill the extra copies of the activations that this kernel's SIMD path reads.
    #[cfg(target_arch = "x86_64")]
    fn prepare(&self, xq: &mut Q8Rows);
    /// The portable path for outputs `outs`.
    fn portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]);
    /// Outputs `outs` for all activation rows, into `local` laid out `(out, row)`.
    /// Safety: the CPU has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx2(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]);
    /// Outputs from `outs.start` written straight into `y` (row-major, `n_out` wide), where the
    /// kernel has such a path for these rows; returns how many (a prefix of `outs`) it did.
    /// Safety: `y` holds `n_rows · n_out` floats and no one else writes these columns meanwhile.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    unsafe fn rows_direct(&self, _outs: std::ops::Range<usize>, _xq: &Q8Rows, _y: *mut f32) -> usize {
        0
    }

    fn rows_for(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: the features were just detected.
                unsafe { self.rows_avx2(outs, xq, local) };
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

/// The loop of the AVX2 paths, inlined into each kernel's function with its CPU features (so the
/// per-group calls inline too: called once per output and group, they were ~18% of a draft step,
/// whose 192-wide rows hold only 6 blocks). Each output's rows go in near-equal groups of at most
/// `max_group` (9 rows with 3: 3 + 3 + 3; larger groups spill registers): a group's accumulators
/// stay in registers, each weight block is loaded once per group, and the output's weights stay
/// in L1 across its groups.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn for_groups(
    outs: std::ops::Range<usize>,
    n_rows: usize,
    max_group: usize,
    local: &mut [f32],
    group: impl FnMut(usize, usize, usize, &mut [f32]),
) {
    for_output_groups(outs, n_rows, max_group, 1, local, group)
}

/// [`for_groups`] taking `per_call` outputs at a time while that many are left (then one at a
/// time): `group(o, r0, n, out)` computes outputs `o ..` (as many as the call's kernel takes, the
/// caller checks `outs.end - o`), rows `r0 .. r0 + n`, into `out[u · n_rows + j]`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn for_output_groups(
    outs: std::ops::Range<usize>,
    n_rows: usize,
    max_group: usize,
    per_call: usize,
    local: &mut [f32],
    mut group: impl FnMut(usize, usize, usize, &mut [f32]),
) {
    let n_groups = n_rows.div_ceil(max_group);
    let mut o = outs.start;
    while o < outs.end {
        let i = o - outs.start;
        let mut r0 = 0;
        for g in 0..n_groups {
            let n = (n_rows - r0).div_ceil(n_groups - g);
            group(o, r0, n, &mut local[i * n_rows + r0..]);
            r0 += n;
        }
        o += if outs.end - o >= per_call { per_call } else { 1 };
    }
}

/// `acc[i] += Σ a[4i..4i+4] · b[4i..4i+4]` (NEON without the dot-product extension: widening
/// multiplies, then pairwise adds; |a|, |b| ≤ 127 keeps each pair sum inside i16).
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
#[inline(always)]
unsafe fn dot4_neon(
    acc: std::arch::aarch64::int32x4_t,
    a: std::arch::aarch64::int8x16_t,
    b: std::arch::aarch64::int8x16_t,
) -> std::arch::aarch64::int32x4_t {
    use std::arch::aarch64::*;
    let pairs = vpaddq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)), vmull_high_s8(a, b));
    vpadalq_s16(acc, pairs)
}

/// Horizontal sum of the 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum256(a: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s4 = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    _mm_cvtss_f32(s1)
}

/// The two 256-bit halves of a 512-bit register of 32-bit integers, added.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn halves_added(v: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// A kernel type's `group_avx2::<N>`, `group_vnni::<N>` and `group_vnni512::<N>`: its
/// `group_body::<N, VNNI, WIDE>` (output `o` for activation rows `r0 .. r0 + N`, inlined) compiled
/// with AVX2 + FMA, with AVX-512 VNNI on 256-bit vectors added, and with 512-bit vectors for whole
/// chunks of 8 blocks; and `group_vnni512_pair::<N>`, the last for two outputs. All give the same
/// results (`vnni_kernels_equal_the_avx2_ones`).
#[cfg(target_arch = "x86_64")]
macro_rules! group_entry_points {
    () => {
        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn group_avx2<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
            self.group_body::<N, false, false>(o, r0, xq, out)
        }

        #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
        #[inline]
        unsafe fn group_vnni<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
            self.group_body::<N, true, false>(o, r0, xq, out)
        }

        #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni,avx512vl")]
        #[inline]
        unsafe fn group_vnni512<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
            self.group_body::<N, true, true>(o, r0, xq, out)
        }

        /// Outputs `o` and `o + 1` with 512-bit vectors (the type's `group_body_multi`).
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni,avx512vl")]
        #[inline]
        unsafe fn group_vnni512_pair<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
            self.group_body_multi::<N, 2, true, true>(o, r0, xq, out)
        }
    };
}

/// The 512-bit VNNI loop of a kernel type: outputs two at a time (`group_vnni512_pair`), the last
/// one alone where their number is odd.
#[cfg(target_arch = "x86_64")]
macro_rules! pairs_vnni512 {
    ($self:ident, $outs:ident, $xq:ident, $local:ident) => {{
        let end = $outs.end;
        for_output_groups($outs, $xq.n_rows, MAX_GROUP, 2, $local, |o, r0, n, out| {
            if end - o >= 2 {
                dispatch_group!($self, group_vnni512_pair, o, r0, n, $xq, out)
            } else {
                dispatch_group!($self, group_vnni512, o, r0, n, $xq, out)
            }
        })
    }};
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
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut xq = quantize_rows(x, n_rows, n_in);
    #[cfg(target_arch = "x86_64")]
    k.prepare(&mut xq);
    let mut y = vec![0f32; n_rows * n_out];
    // About 16 tasks per thread (at least OUT_CHUNK outputs each): claiming one from the team is a
    // compare-and-swap, and smaller last tasks leave less idle time at a section's end. Four
    // alternating `cost` rounds: 9-token forward median 24.0 ms with 8 tasks per thread, 21.5 ms
    // with 16, 23.8 ms with one task per OUT_CHUNK outputs (step 7.0, 6.8, 7.5 ms).
    let chunk = OUT_CHUNK.max(n_out / (rayon::current_num_threads() * 16)).next_multiple_of(OUT_CHUNK);
    let y_ptr = SharedOut(y.as_mut_ptr());
    crate::team::run(n_out.div_ceil(chunk), &|c| {
        let mut local = [0f32; OUT_CHUNK * MAX_LOCAL_ROWS];
        let mut heap = Vec::new();
        let o_end = ((c + 1) * chunk).min(n_out);
        #[cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(unused_mut))]
        let mut o0 = c * chunk;
        // SAFETY: tasks own disjoint output columns (see below).
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            o0 += unsafe { k.rows_direct(o0..o_end, &xq, y_ptr.get()) };
        }
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
            amx: amx::AmxTiles::stack(
                &parts.iter().map(|m| m.amx.as_ref()).collect::<Vec<_>>(),
                &parts.iter().map(|m| m.n_out).collect::<Vec<_>>(),
            ),
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
        let amx = amx::AmxTiles::from_q8(n_out, n_in, &scales, |o| deinterleave_row(&quants[o * n_in..(o + 1) * n_in]));
        Q8Matrix { n_out, n_in, scales, quants, wsum128, amx }
    }

    /// Only the given rows, in that order (a vocabulary head restricted to some tokens).
    pub fn select_rows(&self, rows: &[u32]) -> Option<Q8Matrix> {
        let nb = self.n_in / BLOCK;
        let mut out = Q8Matrix {
            n_out: rows.len(),
            n_in: self.n_in,
            scales: Vec::new(),
            quants: Vec::new(),
            wsum128: Vec::new(),
            amx: None,
        };
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
        if !n_in.is_multiple_of(BLOCK) || w.len() != n_out * n_in {
            return None;
        }
        let r = quantize_rows(w, n_out, n_in);
        Some(Q8Matrix::new(n_out, n_in, r.scales, r.quants_il))
    }

    /// Repack GGML Q8_0 bytes (as in a GGUF file or candle's QTensor) for `(n_out, n_in)`.
    pub fn from_ggml_bytes(bytes: &[u8], n_out: usize, n_in: usize) -> Option<Q8Matrix> {
        if !n_in.is_multiple_of(BLOCK) || bytes.len() != n_out * n_in / BLOCK * GGML_Q8_0_BYTES {
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

    #[cfg(target_arch = "x86_64")]
    group_entry_points!();

    /// Output `o` for activation rows `r0 .. r0 + N` (see [`Q8Matrix::group_body_multi`]).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn group_body<const N: usize, const VNNI: bool, const WIDE: bool>(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
    ) {
        self.group_body_multi::<N, 1, VNNI, WIDE>(o, r0, xq, out)
    }

    /// Outputs `o .. o + U` for activation rows `r0 .. r0 + N`, into `out[u · n_rows + j]`. With
    /// VNNI, AVX-512 VNNI's `vpdpbusd` does the multiply-adds: one instruction instead of three per
    /// block and row, and the same integer sums, so the results are identical. With U > 1 each
    /// activation vector loaded serves U outputs; each (output, row) gets the same operations in
    /// the same order as with U = 1.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn group_body_multi<const N: usize, const U: usize, const VNNI: bool, const WIDE: bool>(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let nb = self.n_in / BLOCK;
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
        let rows = ChunkRows { xp, xs, xu };
        let mut acc = [[_mm256_setzero_ps(); N]; U];
        // The same chunks in the same order for any number of rows (see `chunks`), so that
        // batched results equal single-row results exactly.
        let n_groups = nb / GROUP_BLOCKS;
        for g in 0..n_groups {
            self.chunk::<N, U, 8, VNNI, WIDE>(o, g * GROUP_BLOCKS, &rows, &mut acc);
        }
        let (mut b0, rest) = (n_groups * GROUP_BLOCKS, nb % GROUP_BLOCKS);
        if rest & 4 != 0 {
            self.chunk::<N, U, 4, VNNI, false>(o, b0, &rows, &mut acc);
            b0 += 4;
        }
        if rest & 2 != 0 {
            self.chunk::<N, U, 2, VNNI, false>(o, b0, &rows, &mut acc);
            b0 += 2;
        }
        if rest & 1 != 0 {
            self.chunk::<N, U, 1, VNNI, false>(o, b0, &rows, &mut acc);
        }
        for u in 0..U {
            for j in 0..N {
                out[u * xq.n_rows + j] = hsum256(acc[u][j]);
            }
        }
    }

    /// One chunk of `SIZE` blocks from block `b0` of outputs `o .. o + U`, added to each (output,
    /// row) accumulator: integer block sums in the 8 lanes (see [`chunk_source`]), then scaled
    /// once.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk<const N: usize, const U: usize, const SIZE: usize, const VNNI: bool, const WIDE: bool>(
        &self,
        o: usize,
        b0: usize,
        rows: &ChunkRows<N>,
        acc: &mut [[std::arch::x86_64::__m256; N]; U],
    ) {
        use std::arch::x86_64::*;
        let nb = self.n_in / BLOCK;
        let wq: [*const i8; U] = std::array::from_fn(|u| self.quants.as_ptr().add((o + u) * self.n_in + b0 * BLOCK));
        let mut isum = [[_mm256_setzero_si256(); N]; U];
        if WIDE && N >= 2 && SIZE == GROUP_BLOCKS {
            // The same with 512-bit vectors: vectors 2v and 2v + 1 in one register, so the block
            // sums build up in both halves, added once per chunk (integers: the same sums).
            let mut wide = [[_mm512_setzero_si512(); N]; U];
            for v in 0..SIZE / 2 {
                let w: [__m512i; U] = std::array::from_fn(|u| _mm512_loadu_si512(wq[u].add(2 * v * BLOCK) as *const _));
                for j in 0..N {
                    let x = _mm512_loadu_si512(rows.xu[j].add(b0 * BLOCK + 2 * v * BLOCK) as *const _);
                    for u in 0..U {
                        wide[u][j] = _mm512_dpbusd_epi32(wide[u][j], x, w[u]);
                    }
                }
            }
            for u in 0..U {
                let offset = _mm256_loadu_si256(self.wsum128.as_ptr().add((o + u) * nb + b0) as *const __m256i);
                for j in 0..N {
                    isum[u][j] = _mm256_sub_epi32(halves_added(wide[u][j]), offset);
                }
            }
        } else if VNNI && N >= 2 && SIZE == GROUP_BLOCKS {
            // Unsigned activations (x + 128) straight into vpdpbusd, one instruction per row and
            // vector; the +128 is taken back once per group with the weights' block sums.
            for v in 0..SIZE {
                let w: [__m256i; U] =
                    std::array::from_fn(|u| _mm256_loadu_si256(wq[u].add(v * BLOCK) as *const __m256i));
                for j in 0..N {
                    let x = _mm256_loadu_si256(rows.xu[j].add(b0 * BLOCK + v * BLOCK) as *const __m256i);
                    for u in 0..U {
                        isum[u][j] = _mm256_dpbusd_epi32(isum[u][j], x, w[u]);
                    }
                }
            }
            for u in 0..U {
                let offset = _mm256_loadu_si256(self.wsum128.as_ptr().add((o + u) * nb + b0) as *const __m256i);
                for j in 0..N {
                    isum[u][j] = _mm256_sub_epi32(isum[u][j], offset);
                }
            }
        } else {
            let ones = _mm256_set1_epi16(1);
            for v in 0..SIZE {
                for u in 0..U {
                    let w = _mm256_loadu_si256(wq[u].add(v * BLOCK) as *const __m256i);
                    // |w| is unsigned and x takes w's sign: maddubs(|w|, sign(x, w)) sums w·x in
                    // pairs, and |w|, |x| ≤ 127 keeps each pair sum inside i16.
                    let w_abs = _mm256_sign_epi8(w, w);
                    for j in 0..N {
                        let x = _mm256_loadu_si256(rows.xp[j].add(b0 * BLOCK + v * BLOCK) as *const __m256i);
                        let x_signed = _mm256_sign_epi8(x, w);
                        isum[u][j] = if VNNI {
                            _mm256_dpbusd_epi32(isum[u][j], w_abs, x_signed)
                        } else {
                            _mm256_add_epi32(isum[u][j], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, x_signed), ones))
                        };
                    }
                }
            }
        }
        for u in 0..U {
            // Block b0 + i's scales and sum in lane i ([`block_sums_first`]).
            let w_scales = first_ps(self.scales.as_ptr().add((o + u) * nb + b0), SIZE);
            for j in 0..N {
                let scales = _mm256_mul_ps(w_scales, first_ps(rows.xs[j].add(b0), SIZE));
                acc[u][j] =
                    _mm256_fmadd_ps(scales, _mm256_cvtepi32_ps(block_sums_first::<SIZE>(isum[u][j])), acc[u][j]);
            }
        }
    }
}

/// The activation rows one kernel call reads: quants (chunk layout), scales and, for VNNI, the
/// quants as unsigned bytes.
#[cfg(target_arch = "x86_64")]
struct ChunkRows<const N: usize> {
    xp: [*const i8; N],
    xs: [*const f32; N],
    xu: [*const u8; N],
}

/// 8 lanes from the `size` floats at `p` repeated (lane i = p[i % size]): the scales of a chunk's
/// blocks in the order of its lanes ([`chunk_source`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn repeat_ps(p: *const f32, size: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    match size {
        8 => _mm256_loadu_ps(p),
        4 => {
            let v = _mm_loadu_ps(p);
            _mm256_insertf128_ps(_mm256_castps128_ps256(v), v, 1)
        }
        2 => _mm256_castpd_ps(_mm256_set1_pd(std::ptr::read_unaligned(p as *const f64))),
        _ => _mm256_set1_ps(*p),
    }
}

/// The `size` floats at `p` in lanes 0..size, zeros in the others.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn first_ps(p: *const f32, size: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if size == GROUP_BLOCKS {
        return _mm256_loadu_ps(p);
    }
    let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(size as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_and_ps(repeat_ps(p, size), _mm256_castsi256_ps(keep))
}

impl RowKernel for Q8Matrix {
    fn n_out(&self) -> usize {
        self.n_out
    }

    /// Apple Silicon's CPU path: the chunk layout works for NEON too. A 32-byte vector of a chunk
    /// is two 16-byte halves whose 4-byte lanes are lanes 0–3 and 4–7 of the AVX2 register, so the
    /// multiply-adds of a group of 8 blocks leave the 8 blocks' integer sums in two registers,
    /// scaled once; smaller chunks add the lanes of each block first.
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    fn rows_neon(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) -> bool {
        use std::arch::aarch64::*;
        let nb = self.n_in / BLOCK;
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
                    let mut total = 0f32;
                    for (b0, size) in chunks(nb) {
                        let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
                        for v in 0..size {
                            let at = (b0 + v) * BLOCK;
                            lo = dot4_neon(lo, vld1q_s8(wq.add(at)), vld1q_s8(xp.add(at)));
                            hi = dot4_neon(hi, vld1q_s8(wq.add(at + 16)), vld1q_s8(xp.add(at + 16)));
                        }
                        let scale = |b: usize| *ws.add(b) * *xs.add(b);
                        match size {
                            8 => {
                                let s_lo = vmulq_f32(vld1q_f32(ws.add(b0)), vld1q_f32(xs.add(b0)));
                                let s_hi = vmulq_f32(vld1q_f32(ws.add(b0 + 4)), vld1q_f32(xs.add(b0 + 4)));
                                acc = vfmaq_f32(acc, s_lo, vcvtq_f32_s32(lo));
                                acc = vfmaq_f32(acc, s_hi, vcvtq_f32_s32(hi));
                            }
                            4 => {
                                // Lanes i and i + 4 both belong to block i.
                                let s = vmulq_f32(vld1q_f32(ws.add(b0)), vld1q_f32(xs.add(b0)));
                                acc = vfmaq_f32(acc, s, vcvtq_f32_s32(vaddq_s32(lo, hi)));
                            }
                            2 => {
                                // Even lanes belong to the first block, odd lanes to the second.
                                let both = vaddq_s32(lo, hi);
                                let pair = vadd_s32(vget_low_s32(both), vget_high_s32(both));
                                total += scale(b0) * vget_lane_s32::<0>(pair) as f32
                                    + scale(b0 + 1) * vget_lane_s32::<1>(pair) as f32;
                            }
                            _ => total += scale(b0) * vaddvq_s32(vaddq_s32(lo, hi)) as f32,
                        }
                    }
                    vaddvq_f32(acc) + total
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
    #[cfg(target_arch = "x86_64")]
    fn prepare(&self, xq: &mut Q8Rows) {
        xq.fill_unsigned_for_vnni();
        #[cfg(target_os = "linux")]
        if tiles_for(&self.amx, xq.n_rows, self.n_in).is_some() {
            xq.fill_tile_pairs();
        }
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    unsafe fn rows_direct(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, y: *mut f32) -> usize {
        match tiles_for(&self.amx, xq.n_rows, self.n_in) {
            // SAFETY: the layout exists only where `amx::available()`; the rest is the caller's.
            Some(tiles) => tiles.rows(self.n_in, outs, xq, y, self.n_out),
            None => 0,
        }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx2(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        if use_vnni512() {
            self.rows_vnni512(outs, xq, local)
        } else if use_vnni() {
            self.rows_vnni(outs, xq, local)
        } else {
            self.rows_avx2_only(outs, xq, local)
        }
    }
}

impl Q8Matrix {
    /// AVX2 alone has 16 vector registers: 5 rows' integer and float accumulators plus the
    /// weights, their absolute values, the activations and a constant do not fit, and a 9-row
    /// product (5 + 4) cost 2.5x a 4-row one in `cargo bench` (AMD EPYC without AVX-512): groups
    /// of at most 4 rows.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2_only(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        for_groups(outs, xq.n_rows, 4, local, |o, r0, n, out| dispatch_group!(self, o, r0, n, xq, out))
    }

    /// VNNI needs fewer temporaries, and AVX-512VL gives 32 registers: groups of MAX_GROUP.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    unsafe fn rows_vnni(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        for_groups(outs, xq.n_rows, MAX_GROUP, local, |o, r0, n, out| {
            dispatch_group!(self, group_vnni, o, r0, n, xq, out)
        })
    }

    /// The VNNI kernel with 512-bit vectors for whole chunks of 8 blocks, two outputs per call
    /// (each activation load serves both). Single thread, best of 25 alternating trials (Intel
    /// Xeon, AVX-512), one → two outputs per call: the head's shape (8192 of its 49152 × 576) 1 row
    /// 290 → 256 µs, 2 rows 336 → 288, 4 rows 435 → 396, 9 rows 927 → 892; the draft's 640 × 192
    /// 1 row 12 → 8 µs, 9 rows 52 → 41.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni,avx512vl")]
    unsafe fn rows_vnni512(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        pairs_vnni512!(self, outs, xq, local)
    }
}

/// Whether the CPU has AVX-512 VNNI (with 256-bit forms); the `avx2` kernel path turns it off.
#[cfg(target_arch = "x86_64")]
fn use_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
            && crate::options::current().kernel != crate::options::KernelPath::Avx2
    })
}

/// Whether the VNNI kernels use 512-bit vectors too (AVX-512 F, BW, VNNI and VL);
/// the `vnni256` kernel path keeps them to 256 bits (`avx2` turns VNNI off altogether).
#[cfg(target_arch = "x86_64")]
fn use_vnni512() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| {
        use_vnni()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && crate::options::current().kernel != crate::options::KernelPath::Vnni256
    })
}

/// A 4-bit matrix `(n_out, n_in)` as GGML's Q4_1 (and Q4_0, with m = −8·d): each block of 32
/// weights is `d · q + m` with q in 0..15. Half the bytes of Q8_0, so a decode step, which is
/// bound by reading the weights, is cheaper; and it is exactly the file's own quantization.
///
/// Block dot product with Q8_0 activations (scale s, quants x):
/// Σ (d·q_i + m)·s·x_i = d·s·Σ q_i·x_i + m·s·Σ x_i, where s·Σ x_i is computed once per activation
/// block ([`Q8Rows::scaled_sums`]).
///
/// Layout ([`pack_q4_row`]): each group of 8 whole blocks is the interleaved layout of the Q8
/// kernel (vector k, lane i = weights 4k..4k+3 of block i) with vectors 2t and 2t+1 packed into
/// the low and high nibbles of one 32-byte chunk t; blocks after the last whole group keep GGML's
/// 16 bytes (weight j in the low nibble, j + 16 in the high one).
#[derive(Debug, Clone)]
pub struct Q4Matrix {
    pub n_out: usize,
    pub n_in: usize,
    d: Vec<f32>,      // (n_out, n_in / 32)
    m: Vec<f32>,      // (n_out, n_in / 32)
    nibbles: Vec<u8>, // (n_out, n_in / 2), each row packed by `pack_q4_row`
    /// The same weights in AMX's tile layout, where this process can run it (calls of
    /// `min_rows` rows or more take it).
    amx: Option<amx::AmxTiles>,
}

/// Pack one row of 4-bit quants, given in plain order (`q[i]` is weight i, 0..15), as
/// [`Q4Matrix`] stores it: in the chunk layout of the Q8 kernel ([`chunk_source`]), vectors 2t and
/// 2t + 1 of a chunk in the low and high nibbles of its 32 bytes t; a chunk of one block (one
/// vector) as GGML stores a block, byte j holding weights j and j + 16.
fn pack_q4_row(q: &[u8], packed: &mut [u8]) {
    let mut il = q.to_vec();
    interleave_row(&mut il);
    for (b0, size) in chunks(q.len() / BLOCK) {
        let (src, dst) = (&il[b0 * BLOCK..(b0 + size) * BLOCK], &mut packed[b0 * BLOCK / 2..(b0 + size) * BLOCK / 2]);
        let half = if size == 1 { BLOCK / 2 } else { BLOCK };
        for (t, out) in dst.chunks_exact_mut(half).enumerate() {
            for (j, byte) in out.iter_mut().enumerate() {
                *byte = src[2 * t * half + j] | (src[(2 * t + 1) * half + j] << 4);
            }
        }
    }
}

/// The inverse of [`pack_q4_row`]: weight i's quant for i in 0..n_in.
fn unpack_q4_row(packed: &[u8], n_in: usize) -> Vec<u8> {
    let mut il = vec![0u8; n_in];
    for (b0, size) in chunks(n_in / BLOCK) {
        let (src, dst) = (&packed[b0 * BLOCK / 2..(b0 + size) * BLOCK / 2], &mut il[b0 * BLOCK..(b0 + size) * BLOCK]);
        let half = if size == 1 { BLOCK / 2 } else { BLOCK };
        for (t, bytes) in src.chunks_exact(half).enumerate() {
            for (j, &byte) in bytes.iter().enumerate() {
                dst[2 * t * half + j] = byte & 0x0F;
                dst[(2 * t + 1) * half + j] = byte >> 4;
            }
        }
    }
    deinterleave_row(&il)
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
            amx: amx::AmxTiles::stack(
                &parts.iter().map(|m| m.amx.as_ref()).collect::<Vec<_>>(),
                &parts.iter().map(|m| m.n_out).collect::<Vec<_>>(),
            ),
        })
    }

    /// Only the given rows, in that order, like [`Q8Matrix::select_rows`].
    pub fn select_rows(&self, rows: &[u32]) -> Option<Q4Matrix> {
        let (nb, nh) = (self.n_in / BLOCK, self.n_in / 2);
        let mut out = Q4Matrix {
            n_out: rows.len(),
            n_in: self.n_in,
            d: Vec::new(),
            m: Vec::new(),
            nibbles: Vec::new(),
            amx: None,
        };
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
        if !n_in.is_multiple_of(BLOCK) || bytes.len() != n_out * n_in / BLOCK * block_bytes {
            return None;
        }
        let n_blocks = n_out * n_in / BLOCK;
        let (mut d, mut m) = (Vec::with_capacity(n_blocks), Vec::with_capacity(n_blocks));
        let mut nibbles = vec![0u8; n_out * n_in / 2];
        let mut plain = vec![0u8; n_in];
        if n_in > 0 {
            for (row, packed) in bytes.chunks_exact(n_in / BLOCK * block_bytes).zip(nibbles.chunks_exact_mut(n_in / 2))
            {
                for (blk, q) in row.chunks_exact(block_bytes).zip(plain.chunks_exact_mut(BLOCK)) {
                    let scale = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                    d.push(scale);
                    m.push(if min { half::f16::from_le_bytes([blk[2], blk[3]]).to_f32() } else { -8.0 * scale });
                    for (j, &byte) in blk[block_bytes - 16..].iter().enumerate() {
                        q[j] = byte & 0x0F;
                        q[j + 16] = byte >> 4;
                    }
                }
                pack_q4_row(&plain, packed);
            }
        }
        let amx = amx::AmxTiles::from_q4_ggml(bytes, n_out, n_in, block_bytes, &d, &m);
        Some(Q4Matrix { n_out, n_in, d, m, nibbles, amx })
    }

    pub fn matmul(&self, x: &[f32], n_rows: usize) -> Vec<f32> {
        batched_matmul(self, x, n_rows)
    }

    fn rows_portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        let nb = self.n_in / BLOCK;
        for (i, o) in outs.enumerate() {
            let q = unpack_q4_row(&self.nibbles[o * self.n_in / 2..(o + 1) * self.n_in / 2], self.n_in);
            for r in 0..xq.n_rows {
                let mut acc = 0f32;
                let mut offset = 0f32;
                for b in 0..nb {
                    let x = &xq.quants[r * self.n_in + b * BLOCK..][..BLOCK];
                    let s: i32 = q[b * BLOCK..][..BLOCK].iter().zip(x).map(|(&w, &x)| w as i32 * x as i32).sum();
                    acc += self.d[o * nb + b] * xq.scales[r * nb + b] * s as f32;
                    offset += self.m[o * nb + b] * xq.scaled_sums[r * nb + b];
                }
                local[i * xq.n_rows + r] = acc + offset;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    group_entry_points!();

    /// Output `o` for activation rows `r0 .. r0 + N` (see [`Q4Matrix::group_body_multi`]).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn group_body<const N: usize, const VNNI: bool, const WIDE: bool>(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
    ) {
        self.group_body_multi::<N, 1, VNNI, WIDE>(o, r0, xq, out)
    }

    /// Outputs `o .. o + U` for activation rows `r0 .. r0 + N`, into `out[u · n_rows + j]`. With
    /// VNNI, `vpdpbusd` (unsigned 4-bit weights times signed activations, four products summed
    /// into each 32-bit lane) is one instruction per row and vector instead of a `maddubs` and a
    /// 16-bit add, with no widening per chunk; the integer sums are the same, so the results are
    /// identical. With U > 1 each activation vector loaded serves U outputs' weights: the
    /// arithmetic of each (output, row) is the same operations in the same order as with U = 1.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn group_body_multi<const N: usize, const U: usize, const VNNI: bool, const WIDE: bool>(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let nb = self.n_in / BLOCK;
        let mut rows = Q4Rows { xp: [std::ptr::null(); N], xs: [std::ptr::null(); N], xsum: [std::ptr::null(); N] };
        for j in 0..N {
            // In the chunk layout, like the weights (paired for the 512-bit kernel).
            rows.xp[j] = if WIDE { xq.quants_pair.as_ptr() } else { xq.quants_il.as_ptr() }.add((r0 + j) * self.n_in);
            rows.xs[j] = xq.scales.as_ptr().add((r0 + j) * nb);
            rows.xsum[j] = xq.scaled_sums.as_ptr().add((r0 + j) * nb);
        }
        let mut acc = [[_mm256_setzero_ps(); N]; U];
        // The same chunks in the same order for any number of rows (see `chunks`).
        let n_groups = nb / GROUP_BLOCKS;
        for g in 0..n_groups {
            self.chunk::<N, U, 8, VNNI, WIDE>(o, g * GROUP_BLOCKS, &rows, &mut acc);
        }
        let (mut b0, rest) = (n_groups * GROUP_BLOCKS, nb % GROUP_BLOCKS);
        if rest & 4 != 0 {
            self.chunk::<N, U, 4, VNNI, false>(o, b0, &rows, &mut acc);
            b0 += 4;
        }
        if rest & 2 != 0 {
            self.chunk::<N, U, 2, VNNI, false>(o, b0, &rows, &mut acc);
            b0 += 2;
        }
        if rest & 1 != 0 {
            self.chunk::<N, U, 1, VNNI, false>(o, b0, &rows, &mut acc);
        }
        for u in 0..U {
            for j in 0..N {
                out[u * xq.n_rows + j] = hsum256(acc[u][j]);
            }
        }
    }

    /// One chunk of `SIZE` blocks from block `b0` of outputs `o .. o + U`, added to each (output,
    /// row) accumulator.
    ///
    /// Each 32 bytes of the chunk unpack (and, shift, and) into two vectors of unsigned quants in
    /// the chunk layout, used for all N rows. q ≤ 15 needs no sign fix-up for `maddubs`, and a
    /// pair sum is at most 2·15·127 = 3810, so up to 8 vectors' 16-bit results add as they are
    /// (≤ 30480 < 2¹⁵) and widen once per chunk: per row and vector one `maddubs` and one 16-bit
    /// add, against four operations for Q8_0 without VNNI.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk<const N: usize, const U: usize, const SIZE: usize, const VNNI: bool, const WIDE: bool>(
        &self,
        o: usize,
        b0: usize,
        rows: &Q4Rows<N>,
        acc: &mut [[std::arch::x86_64::__m256; N]; U],
    ) {
        use std::arch::x86_64::*;
        let nb = self.n_in / BLOCK;
        let nib: [*const u8; U] =
            std::array::from_fn(|u| self.nibbles.as_ptr().add((o + u) * self.n_in / 2 + b0 * BLOCK / 2));
        let mut isum = [[_mm256_setzero_si256(); N]; U];
        if WIDE && SIZE == GROUP_BLOCKS {
            // 64 bytes of nibbles: vectors 4t and 4t + 2 in the low nibbles, 4t + 1 and 4t + 3 in
            // the high ones; the activations are paired to match ([`pair_vectors`]). The block
            // sums build up in both halves of the registers and are added once per chunk.
            let mask = _mm512_set1_epi8(0x0F);
            let mut wide = [[_mm512_setzero_si512(); N]; U];
            for t in 0..SIZE / 4 {
                let mut lo = [_mm512_setzero_si512(); U];
                let mut hi = [_mm512_setzero_si512(); U];
                for u in 0..U {
                    let raw = _mm512_loadu_si512(nib[u].add(2 * t * BLOCK) as *const _);
                    lo[u] = _mm512_and_si512(raw, mask);
                    hi[u] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), mask);
                }
                for j in 0..N {
                    let x = rows.xp[j].add(b0 * BLOCK + 4 * t * BLOCK);
                    let x_lo = _mm512_loadu_si512(x as *const _);
                    let x_hi = _mm512_loadu_si512(x.add(2 * BLOCK) as *const _);
                    for u in 0..U {
                        wide[u][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(wide[u][j], lo[u], x_lo), hi[u], x_hi);
                    }
                }
            }
            for u in 0..U {
                for j in 0..N {
                    isum[u][j] = halves_added(wide[u][j]);
                }
            }
        } else if SIZE == 1 {
            let low = _mm_set1_epi8(0x0F);
            let w: [__m256i; U] = std::array::from_fn(|u| {
                let raw = _mm_loadu_si128(nib[u] as *const __m128i);
                _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low))
            });
            for j in 0..N {
                let x = _mm256_loadu_si256(rows.xp[j].add(b0 * BLOCK) as *const __m256i);
                for u in 0..U {
                    isum[u][j] =
                        if VNNI { _mm256_dpbusd_epi32(isum[u][j], w[u], x) } else { _mm256_maddubs_epi16(w[u], x) };
                }
            }
        } else {
            let mask = _mm256_set1_epi8(0x0F);
            for t in 0..SIZE / 2 {
                let mut lo = [_mm256_setzero_si256(); U];
                let mut hi = [_mm256_setzero_si256(); U];
                for u in 0..U {
                    let raw = _mm256_loadu_si256(nib[u].add(t * BLOCK) as *const __m256i);
                    lo[u] = _mm256_and_si256(raw, mask);
                    hi[u] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                }
                for j in 0..N {
                    let x = rows.xp[j].add(b0 * BLOCK + 2 * t * BLOCK);
                    let x0 = _mm256_loadu_si256(x as *const __m256i);
                    let x1 = _mm256_loadu_si256(x.add(BLOCK) as *const __m256i);
                    for u in 0..U {
                        if VNNI {
                            isum[u][j] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(isum[u][j], lo[u], x0), hi[u], x1);
                        } else {
                            isum[u][j] = _mm256_add_epi16(isum[u][j], _mm256_maddubs_epi16(lo[u], x0));
                            isum[u][j] = _mm256_add_epi16(isum[u][j], _mm256_maddubs_epi16(hi[u], x1));
                        }
                    }
                }
            }
        }
        let ones = _mm256_set1_epi16(1);
        for u in 0..U {
            // Block b0 + i's scales in lane i, zeros after the chunk's blocks.
            let d = first_ps(self.d.as_ptr().add((o + u) * nb + b0), SIZE);
            let m = first_ps(self.m.as_ptr().add((o + u) * nb + b0), SIZE);
            for j in 0..N {
                // VNNI's lanes hold 32-bit sums already; AVX2's 16-bit pair sums widen here.
                let wide = if VNNI { isum[u][j] } else { _mm256_madd_epi16(isum[u][j], ones) };
                let sums = _mm256_cvtepi32_ps(block_sums_first::<SIZE>(wide));
                acc[u][j] = _mm256_fmadd_ps(_mm256_mul_ps(d, first_ps(rows.xs[j].add(b0), SIZE)), sums, acc[u][j]);
                acc[u][j] = _mm256_fmadd_ps(m, first_ps(rows.xsum[j].add(b0), SIZE), acc[u][j]);
            }
        }
    }
}

/// A chunk's 32-bit sums (lane i holding part of block i % SIZE, [`chunk_source`]) as whole block
/// sums: block i in lane i, zeros after the chunk's blocks. Integer adds, so exact. The float
/// arithmetic is then one multiply-add per block and lane in every path, the AMX one included
/// (`amx`), which has whole block sums only: lane i of a chunk accumulates block b0 + i.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_sums_first<const SIZE: usize>(v: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    if SIZE == GROUP_BLOCKS {
        return v;
    }
    // Lanes i and i + 4 hold the same block for SIZE ≤ 4.
    let four = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let low = match SIZE {
        4 => four,
        2 => _mm_move_epi64(_mm_add_epi32(four, _mm_srli_si128::<8>(four))),
        _ => {
            let two = _mm_add_epi32(four, _mm_srli_si128::<8>(four));
            _mm_cvtsi32_si128(_mm_cvtsi128_si32(_mm_add_epi32(two, _mm_srli_si128::<4>(two))))
        }
    };
    _mm256_set_m128i(_mm_setzero_si128(), low)
}

/// The activation rows one Q4 kernel call reads: quants (chunk layout), scales, and
/// scale · Σ quants per block.
#[cfg(target_arch = "x86_64")]
struct Q4Rows<const N: usize> {
    xp: [*const i8; N],
    xs: [*const f32; N],
    xsum: [*const f32; N],
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
    fn prepare(&self, xq: &mut Q8Rows) {
        xq.fill_pairs_for_wide();
        #[cfg(target_os = "linux")]
        if tiles_for(&self.amx, xq.n_rows, self.n_in).is_some() {
            xq.fill_tile_pairs();
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    unsafe fn rows_direct(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, y: *mut f32) -> usize {
        match tiles_for(&self.amx, xq.n_rows, self.n_in) {
            // SAFETY: the layout exists only where `amx::available()`; the rest is the caller's.
            Some(tiles) => tiles.rows(self.n_in, outs, xq, y, self.n_out),
            None => 0,
        }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx2(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        if use_vnni512() {
            self.rows_vnni512(outs, xq, local)
        } else if use_vnni() {
            self.rows_vnni(outs, xq, local)
        } else {
            self.rows_avx2_impl(outs, xq, local)
        }
    }
}

impl Q4Matrix {
    /// Groups of 3 rows: the 8 unpacked weight vectors of a group stay in registers for all rows,
    /// beside each row's two accumulators. `cargo bench` 1536 × 576 (AMD EPYC, AVX2 only, 2
    /// threads): 9 rows in 151 µs with groups of 3, 173 µs with 2, 184 µs with 4, 202 µs with 5.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2_impl(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        for_groups(outs, xq.n_rows, 3, local, |o, r0, n, out| dispatch_group!(self, o, r0, n, xq, out))
    }

    /// With VNNI a row needs two registers (its 32-bit sums and its accumulator), and AVX-512VL
    /// gives 32: groups of up to MAX_GROUP rows share each unpacked weight vector (groups of up
    /// to 9 measured the same in `cost`, Intel Xeon with AVX-512, 2 threads).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    unsafe fn rows_vnni(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        for_groups(outs, xq.n_rows, MAX_GROUP, local, |o, r0, n, out| {
            dispatch_group!(self, group_vnni, o, r0, n, xq, out)
        })
    }

    /// The VNNI kernel with 512-bit vectors for whole chunks of 8 blocks, two outputs per call
    /// (each activation load serves both). Single thread, 1536 × 576, best of 25 alternating
    /// trials (Intel Xeon, AVX-512): 1 row 34 → 25 µs, 4 rows 102 → 79 µs, 5 rows 141 → 93 µs,
    /// 9 rows 155 → 153 µs against one output per call; in `cost` (3 alternating rounds, 2
    /// threads) 4 tokens 1.50x → 1.43x, 9 tokens 2.54x → 2.30x a step.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni,avx512vl")]
    unsafe fn rows_vnni512(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        pairs_vnni512!(self, outs, xq, local)
    }
}

/// Whether [`Q4Matrix`] has a SIMD path on this CPU (else it runs the portable code, and Q8_0 is
/// the faster format).
pub fn q4_has_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (crate::sampling::uniform(seed, i as u64, crate::sampling::Purpose::TargetSample) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    /// GGML Q4_1 bytes of a pseudo-random `(n_out, n_in)` matrix, quantized by candle.
    fn q4_1_bytes(n_out: usize, n_in: usize, seed: u64) -> Vec<u8> {
        let t =
            candle_core::Tensor::from_vec(pseudo_random(n_out * n_in, seed), (n_out, n_in), &candle_core::Device::Cpu)
                .unwrap();
        candle_core::quantized::QTensor::quantize(&t, candle_core::quantized::GgmlDType::Q4_1)
            .unwrap()
            .data()
            .unwrap()
            .into_owned()
    }

    /// The AVX2 quantizer gives the scalar one's quants, scales and sums bit for bit, ties
    /// (x · 127 / max = k + 0.5, which `f32::round` takes away from zero) and zero blocks included.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn simd_quantizer_equals_the_scalar_one() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        let n_in = 224;
        let mut x = pseudo_random(3 * n_in, 11);
        // Block 1 of row 0: max 127, so every x · inv is x itself; halves land on ties.
        for (i, v) in x[32..64].iter_mut().enumerate() {
            *v = if i == 0 { 127.0 } else { i as f32 - 16.5 };
        }
        x[64..96].fill(0.0);
        x[100] = -1e-30;
        let (a, b) = (quantize_rows_any(&x, 3, n_in), unsafe { quantize_rows_avx2(&x, 3, n_in) });
        assert_eq!(a.quants, b.quants);
        assert_eq!(a.quants_il, b.quants_il);
        assert_eq!(
            a.scales.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.scales.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            a.scaled_sums.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.scaled_sums.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // −0.5 and 0.5 round away from zero (to even would give 0).
        assert_eq!((a.quants[32 + 16], a.quants[32 + 17]), (-1, 1));
    }

    #[test]
    fn batched_equals_single_rows_exactly() {
        // 256: whole groups of 8 blocks only; 576 (the default model's width): a chunk of 2 blocks
        // after them; 480: chunks of 4, 2 and 1 after one group; 64: no whole group.
        for (n_out, n_in) in [(100, 256), (101, 576), (37, 480), (35, 64)] {
            let q8 = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 1), n_out, n_in).unwrap();
            let q4 = Q4Matrix::from_ggml_bytes(&q4_1_bytes(n_out, n_in, 1), n_out, n_in, true).unwrap();
            type Matmul<'a> = &'a dyn Fn(&[f32], usize) -> Vec<f32>;
            let kernels: [(&str, Matmul); 2] = [("q8_0", &|x, n| q8.matmul(x, n)), ("q4_1", &|x, n| q4.matmul(x, n))];
            for (name, matmul) in kernels {
                for n_rows in [1, 2, 3, 4, 5, 7, 9, 17] {
                    let x = pseudo_random(n_rows * n_in, 2 + n_rows as u64);
                    let all = matmul(&x, n_rows);
                    for r in 0..n_rows {
                        let one = matmul(&x[r * n_in..(r + 1) * n_in], 1);
                        assert_eq!(
                            &all[r * n_out..(r + 1) * n_out],
                            &one[..],
                            "{name} {n_out}x{n_in}: row {r} of {n_rows}"
                        );
                    }
                }
            }
        }
    }

    /// Where the CPU has AVX-512 VNNI, the VNNI kernels (256-bit, and 512-bit where AVX-512 BW is
    /// there too) give the AVX2 kernels' results bit for bit: the same integer block sums (Q8_0
    /// through the +128 offset, Q4 straight), scaled and added in the same order. Widths 576 and
    /// 1536 (the default target's) hold whole chunks of 8 blocks, which the 512-bit path takes.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vnni_kernels_equal_the_avx2_ones() {
        if !use_vnni() {
            eprintln!("no AVX-512 VNNI on this CPU (or the avx2 kernel path): nothing to compare");
            return;
        }
        for (n_out, n_in) in [(67, 576), (13, 1536), (21, 480), (20, 64), (9, 32)] {
            let q8 = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 21), n_out, n_in).unwrap();
            let q4 = Q4Matrix::from_ggml_bytes(&q4_1_bytes(n_out, n_in, 22), n_out, n_in, true).unwrap();
            for n_rows in [1, 2, 3, 5, 6, 9, 17] {
                let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 23 + n_rows as u64), n_rows, n_in);
                xq.fill_unsigned_for_vnni();
                xq.fill_pairs_for_wide();
                let run = |f: &dyn Fn(&mut [f32])| {
                    let mut out = vec![0f32; n_out * n_rows];
                    f(&mut out);
                    out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                // SAFETY: `use_vnni` checked AVX-512 VNNI and VL, which imply AVX2 and FMA here.
                unsafe {
                    assert_eq!(
                        run(&|o| q8.rows_vnni(0..n_out, &xq, o)),
                        run(&|o| q8.rows_avx2_only(0..n_out, &xq, o)),
                        "q8_0 {n_out}x{n_in}, {n_rows} rows"
                    );
                    assert_eq!(
                        run(&|o| q4.rows_vnni(0..n_out, &xq, o)),
                        run(&|o| q4.rows_avx2_impl(0..n_out, &xq, o)),
                        "q4_1 {n_out}x{n_in}, {n_rows} rows"
                    );
                    if use_vnni512() {
                        assert_eq!(
                            run(&|o| q8.rows_vnni512(0..n_out, &xq, o)),
                            run(&|o| q8.rows_avx2_only(0..n_out, &xq, o)),
                            "q8_0 512-bit {n_out}x{n_in}, {n_rows} rows"
                        );
                        assert_eq!(
                            run(&|o| q4.rows_vnni512(0..n_out, &xq, o)),
                            run(&|o| q4.rows_avx2_impl(0..n_out, &xq, o)),
                            "q4_1 512-bit {n_out}x{n_in}, {n_rows} rows"
                        );
                    }
                }
            }
        }
    }

    /// The AMX path on `xq` against the VNNI kernel's `vnni` ((out, row) layout), bit for bit,
    /// with one block per multiply and then, where the rows and blocks allow, two; the outputs
    /// past the whole groups of 16 are left alone, and a range that does not start a group is left
    /// to VNNI.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn assert_tiles_give(tiles: &amx::AmxTiles, xq: &mut Q8Rows, vnni: &[f32], n_out: usize, n_in: usize, label: &str) {
        let n_rows = xq.n_rows;
        for pairs in [false, true] {
            if pairs {
                xq.fill_tile_pairs();
            }
            let mut ours = vec![f32::NAN; n_out * n_rows];
            // SAFETY: the callers checked `amx::available` (AVX-512 F and BW with it); `ours` is
            // n_rows × n_out.
            let done = unsafe { tiles.rows(n_in, 0..n_out, xq, ours.as_mut_ptr(), n_out) };
            assert_eq!(done, n_out / 16 * 16);
            for r in 0..n_rows {
                for o in 0..n_out {
                    let got = ours[r * n_out + o];
                    if o < done {
                        assert_eq!(
                            got.to_bits(),
                            vnni[o * n_rows + r].to_bits(),
                            "{label} {n_out}x{n_in}, {n_rows} rows, pairs {pairs}: row {r}, output {o}"
                        );
                    } else {
                        assert!(got.is_nan(), "output {o} is past the whole groups and left alone");
                    }
                }
            }
        }
        assert_eq!(xq.tile_pairs.is_empty(), n_rows > 8 || !(n_in / 32).is_multiple_of(2), "pairs where they fit");
        let mut ours = vec![0f32; n_out * n_rows];
        // SAFETY: as above.
        assert_eq!(unsafe { tiles.rows(n_in, 8..n_out, xq, ours.as_mut_ptr(), n_out) }, 0);
    }

    /// Where this process can run AMX, the tile path gives the 512-bit VNNI kernel's results bit
    /// for bit, for any number of rows (one tile of up to 16, or several), for whole groups of 16
    /// outputs (the rest go to VNNI), and for the chunk shapes of every width.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn amx_equals_the_vnni_kernel() {
        if !amx::available() {
            eprintln!("no AMX here (or the kernel path turns it off): nothing to compare");
            return;
        }
        for (n_out, n_in) in [(64, 576), (48, 1536), (35, 480), (32, 64), (16, 32), (67, 256)] {
            let q4 = Q4Matrix::from_ggml_bytes(&q4_1_bytes(n_out, n_in, 31), n_out, n_in, true).unwrap();
            let tiles = q4.amx.as_ref().expect("AMX layout where AMX is available");
            for n_rows in [1, 2, 3, 5, 9, 16, 17, 33] {
                let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 32 + n_rows as u64), n_rows, n_in);
                xq.fill_pairs_for_wide();
                let mut vnni = vec![0f32; n_out * n_rows];
                // SAFETY: `amx::available` implies AVX-512 VNNI, F, BW and VL.
                unsafe { q4.rows_vnni512(0..n_out, &xq, &mut vnni) };
                assert_tiles_give(tiles, &mut xq, &vnni, n_out, n_in, "q4_1");
            }
        }
        // Q8_0 the same way (signed tiles, no offset term).
        for (n_out, n_in) in [(64, 576), (48, 1536), (35, 480), (32, 64), (16, 32), (67, 192)] {
            let q8 = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 33), n_out, n_in).unwrap();
            let tiles = q8.amx.as_ref().expect("AMX layout where AMX is available");
            for n_rows in [1, 2, 3, 5, 9, 16, 17, 33] {
                let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 34 + n_rows as u64), n_rows, n_in);
                xq.fill_unsigned_for_vnni();
                let mut vnni = vec![0f32; n_out * n_rows];
                // SAFETY: as above.
                unsafe { q8.rows_vnni512(0..n_out, &xq, &mut vnni) };
                assert_tiles_give(tiles, &mut xq, &vnni, n_out, n_in, "q8_0");
            }
        }
        // Stacked parts keep their tiles; a part with a partial group leaves the stack without.
        let parts: Vec<Q4Matrix> = [(32, 41), (16, 42)]
            .iter()
            .map(|&(n, seed)| Q4Matrix::from_ggml_bytes(&q4_1_bytes(n, 576, seed), n, 576, true).unwrap())
            .collect();
        assert!(Q4Matrix::stack(&parts.iter().collect::<Vec<_>>()).unwrap().amx.is_some());
        let odd = Q4Matrix::from_ggml_bytes(&q4_1_bytes(20, 576, 43), 20, 576, true).unwrap();
        assert!(Q4Matrix::stack(&[&parts[0], &odd]).unwrap().amx.is_none());
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
        for (n_out, n_in) in [(70, 576), (30, 480), (12, 224)] {
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
    }

    fn candle_reference(
        w: &[f32],
        x: &[f32],
        n_out: usize,
        n_in: usize,
        n_rows: usize,
        dtype: candle_core::quantized::GgmlDType,
    ) -> (Vec<u8>, Vec<Vec<f32>>) {
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
        for ((n_out, n_in), (dtype, min)) in [(67, 576), (33, 256), (21, 480), (20, 64)]
            .into_iter()
            .flat_map(|s| [(s, (GgmlDType::Q4_1, true)), (s, (GgmlDType::Q4_0, false))])
        {
            let w = pseudo_random(n_out * n_in, 7);
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
                assert_eq!(
                    &ours[r * n_out..(r + 1) * n_out],
                    &one[..],
                    "{dtype:?}: batched row {r} differs from single row"
                );
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
    fn chunk_layout_round_trips() {
        // Every mix of chunks: 8, 8 + 2, 8 + 4 + 2 + 1, 4 + 2 + 1, 2, 1.
        for n_in in [256, 576, 480, 224, 64, 32] {
            let plain: Vec<i8> = (0..n_in).map(|i| (i % 251) as i8).collect();
            let mut row = plain.clone();
            interleave_row(&mut row);
            assert_eq!(deinterleave_row(&row), plain, "n_in {n_in}");
            assert_eq!(chunks(n_in / BLOCK).map(|(_, size)| size).sum::<usize>(), n_in / BLOCK);
        }
        assert_eq!(chunks(15).collect::<Vec<_>>(), vec![(0, 8), (8, 4), (12, 2), (14, 1)]);
        assert_eq!(chunks(18).collect::<Vec<_>>(), vec![(0, 8), (8, 8), (16, 2)]);
        // Lane i of each vector of a chunk holds bytes of block i % size only.
        for size in [1, 2, 4, 8] {
            for p in 0..size * BLOCK {
                assert_eq!(chunk_source(p, size) / BLOCK, (p % BLOCK / 4) % size, "size {size}, byte {p}");
            }
        }
    }

    #[test]
    fn q4_packing_round_trips() {
        for n_in in [576, 480, 256, 224, 64, 32] {
            let q: Vec<u8> = (0..n_in).map(|i| ((i * 7 + i / 32) % 16) as u8).collect();
            let mut packed = vec![0u8; n_in / 2];
            pack_q4_row(&q, &mut packed);
            assert_eq!(unpack_q4_row(&packed, n_in), q, "n_in {n_in}");
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
        let theirs = candle_core::Module::forward(
            &candle_core::quantized::QMatMul::from_qtensor(qt).unwrap(),
            &candle_core::Tensor::from_vec(x, (1, n_in), &candle_core::Device::Cpu).unwrap(),
        )
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
        for (a, b) in ours.iter().zip(&theirs[0]) {
            assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "ours {a} vs candle {b}");
        }
        assert!(Q8Matrix::from_ggml_bytes(&bytes[1..], n_out, n_in).is_none());
    }
}
