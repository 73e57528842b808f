//! Batched quantized matrix multiplies for the CPU: `y = x W^T` for a few activation rows at once.
//!
//! Why: speculative verification runs the target over k + 1 tokens. candle's quantized matmul
//! treats every activation row as a separate matrix-vector product, so each row streams the whole
//! weight matrix from memory again and verifying 9 tokens costs ~7 single steps. Here each weight
//! block is loaded once and used for every row while it is in registers, so the cost of extra rows
//! is arithmetic only.
//!
//! Formats: Q8_0 ([`Q8Matrix`]), the 4- and 5-bit Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q5_K
//! ([`Q4Matrix`]) and Q6_K ([`Q6Matrix`]) as in GGML, each block of 32 weights with its own scale. The activations are quantized to Q8_0 per row, so a block's dot
//! product is an exact integer sum times the two scales. Per (row, block) the arithmetic is the
//! same whatever the number of rows, so a batched result equals the single-row result exactly.
//!
//! Paths on x86-64: AVX2, AVX-512 VNNI (256- and 512-bit) and, where the 512-bit VNNI kernels run
//! on Linux, the 16-output tile layout of every format ([`amx`], `q6_tiles`): `vpdpbusd` over the
//! tiles, and Intel AMX tile multiplies for calls of several rows. They give the same results bit
//! for bit: the integer block sums are exact in each, and each adds the scaled sums in one order
//! (lane i of a chunk of blocks takes block i, then the 8 lanes are summed as `hsum256` does). The portable
//! path (and NEON's on Arm) adds block by block; tests hold it to the SIMD results within 1e-3.
//!
//! Which of these paths a matrix runs is its [`Isa`], given to its constructor (a model load
//! passes the one its options' kernel path names): its layout and its dispatch follow it, so
//! matrices for different paths run side by side in one process.

// The kernels walk several arrays (rows, blocks, lanes) with one counter.
#![allow(clippy::needless_range_loop)]

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
/// Off Linux on x86-64 there is no tile layout to build.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod amx {
    use super::Isa;
    #[derive(Debug, Clone)]
    pub(super) struct AmxTiles;
    impl AmxTiles {
        pub(super) fn from_q4_ggml(
            _: Isa,
            _: &[u8],
            _: usize,
            _: usize,
            _: usize,
            _: &super::Scales,
        ) -> Option<AmxTiles> {
            None
        }
        pub(super) fn from_q8(_: Isa, _: usize, _: usize, _: &[f32], _: impl Fn(usize) -> Vec<i8>) -> Option<AmxTiles> {
            None
        }
        pub(super) fn from_quants(
            _: Isa,
            _: usize,
            _: usize,
            _: impl Fn(usize) -> Vec<u8>,
            _: &super::Scales,
            _: bool,
        ) -> Option<AmxTiles> {
            None
        }
        pub(super) fn stack(_: &[Option<&AmxTiles>], _: &[usize]) -> Option<AmxTiles> {
            None
        }
        pub(super) fn bytes(&self) -> usize {
            0
        }
    }
    impl AmxTiles {
        pub(super) fn covers(&self, _: usize) -> bool {
            false
        }
    }
    /// No AMX here.
    pub(super) fn granted() -> bool {
        false
    }
}

pub const BLOCK: usize = 32;

impl Q8Matrix {
    /// The same matrix without its AMX tiles: multi-row calls then take the VNNI or AVX2 path
    /// (for comparing the two in one process).
    pub fn without_tiles(self) -> Self {
        Q8Matrix { amx: None, ..self }
    }
}

impl Q4Matrix {
    /// The same matrix without its AMX tiles (see [`Q8Matrix::without_tiles`]).
    pub fn without_tiles(self) -> Self {
        Q4Matrix { amx: None, ..self }
    }

    /// Drop the row layout where the tile layout holds every output: every call then runs on the
    /// tiles (`vpdpbusd` over them, or AMX), and the weights are held once, not twice. Its rows
    /// can then no longer be selected ([`Q4Matrix::select_rows`] gives `None`).
    pub fn drop_row_layout(&mut self) {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if self.amx.as_ref().is_some_and(|t| t.covers(self.n_out)) {
            (self.nibbles, self.high) = (Vec::new(), Vec::new());
            // The tiles hold the blocks' d and m too.
            self.scales = Scales::Centered { d: Vec::new(), offset: 0.0 };
        }
    }

    /// Output `o`'s d and m of block `b`, from whichever layout holds them.
    pub(super) fn block_d_m(&self, o: usize, b: usize) -> (f32, f32) {
        let nb = self.n_in / BLOCK;
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let (true, Some(tiles)) = (self.tiles_only(), &self.amx) {
            return tiles.d_m_of(o, b, nb);
        }
        self.scales.get(o * nb + b)
    }

    /// Whether [`Q4Matrix::drop_row_layout`] dropped the row layout.
    pub fn tiles_only(&self) -> bool {
        self.nibbles.is_empty() && self.n_out > 0 && self.n_in > 0
    }
}

/// Bytes of one GGML Q8_0 block: f16 scale + 32 × i8.
const GGML_Q8_0_BYTES: usize = 34;
/// Activation rows one kernel call handles together (accumulators in registers).
#[cfg(target_arch = "x86_64")]
const MAX_GROUP: usize = 5;
/// Activation rows one AVX2 call (4- and 6-bit weights, no VNNI) handles together: measured in
/// [`Q4Matrix::rows_avx2_impl`]'s note.
#[cfg(target_arch = "x86_64")]
const AVX2_GROUP: usize = 4;
/// Output rows handled per task.
const OUT_CHUNK: usize = 32;

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
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
                // SAFETY: the features were just detected (every CPU with AVX2 has F16C, which
                // the 4-bit kernels read their f16 scales with).
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

/// How far ahead of the weights it is reading a kernel asks for the same stream's bytes
/// ([`prefetch_ahead`]): a decode step streams every weight once, and at 2 threads the hardware
/// prefetchers alone leave the loads waiting on memory (see docs/performance.md).
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 4096;

/// Ask for the cache line `bytes` after `p` (a hint: it never faults, even past the matrix).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_ahead(p: *const u8, bytes: usize) {
    use std::arch::x86_64::*;
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(bytes) as *const i8)
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
    ($self:ident, $outs:ident, $xq:ident, $local:ident) => {
        pairs_vnni512!($self, $outs, $xq, $local, group_vnni512_pair, group_vnni512)
    };
    ($self:ident, $outs:ident, $xq:ident, $local:ident, $pair:ident, $single:ident $([$($g:ident),*])?) => {{
        let end = $outs.end;
        for_output_groups($outs, $xq.n_rows, MAX_GROUP, 2, $local, |o, r0, n, out| {
            if end - o >= 2 {
                dispatch_group!($self, $pair[$($($g),*)?], o, r0, n, $xq, out)
            } else {
                dispatch_group!($self, $single[$($($g),*)?], o, r0, n, $xq, out)
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
        dispatch_group!($self, $f[], $o, $r0, $n, $xq, $out)
    };
    // With the function's further const arguments after the group size.
    ($self:ident, $f:ident [$($g:ident),*], $o:ident, $r0:ident, $n:ident, $xq:ident, $out:ident) => {
        match $n {
            1 => $self.$f::<1 $(, $g)*>($o, $r0, $xq, $out),
            2 => $self.$f::<2 $(, $g)*>($o, $r0, $xq, $out),
            3 => $self.$f::<3 $(, $g)*>($o, $r0, $xq, $out),
            4 => $self.$f::<4 $(, $g)*>($o, $r0, $xq, $out),
            _ => $self.$f::<5 $(, $g)*>($o, $r0, $xq, $out),
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

/// A kernel matrix whose rows read back as f32 exactly as GGML dequantizes the file's blocks, so
/// that a tied embedding can share its output head's weights instead of holding a second copy.
pub trait RowsAsF32: Send + Sync {
    /// `(rows, columns)`.
    fn shape(&self) -> (usize, usize);
    /// Row `row` into `out` (`columns` values); the caller checks `row`.
    fn row_f32(&self, row: usize, out: &mut [f32]);
}

impl RowsAsF32 for Q8Matrix {
    fn shape(&self) -> (usize, usize) {
        (self.n_out, self.n_in)
    }
    fn row_f32(&self, row: usize, out: &mut [f32]) {
        let (plain, scales) = self.plain_row(row);
        for (i, (o, &q)) in out.iter_mut().zip(&plain).enumerate() {
            *o = q as f32 * scales[i / BLOCK];
        }
    }
}

impl RowsAsF32 for Q4Matrix {
    fn shape(&self) -> (usize, usize) {
        (self.n_out, self.n_in)
    }
    fn row_f32(&self, row: usize, out: &mut [f32]) {
        for (i, (o, &q)) in out.iter_mut().zip(&self.quants_row(row)).enumerate() {
            let (d, m) = self.block_d_m(row, i / BLOCK);
            *o = d * q as f32 + m;
        }
    }
}

impl RowsAsF32 for Q6Matrix {
    fn shape(&self) -> (usize, usize) {
        (self.n_out, self.n_in)
    }
    fn row_f32(&self, row: usize, out: &mut [f32]) {
        self.dequantize_row(row, out)
    }
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

mod activations;
mod isa;
mod kquants;
mod layout;
mod q4;
mod q4_scales;
mod q5;
mod q6_tiles;
mod q6k;
mod q8;
use activations::*;
pub use isa::Isa;
pub use kquants::QK_K;
use layout::*;
#[allow(unused_imports)]
use q4::*;
pub use q4::{Q4File, Q4Matrix};
use q4_scales::*;
pub use q5::SmallBlocks;
use q5::*;
pub use q6k::Q6Matrix;
pub use q8::Q8Matrix;
#[allow(unused_imports)]
use q8::*;

/// The parts one after another, in a vector of exactly their total length (collecting a
/// `flat_map` grows by doubling, and the spare capacity stays with the matrix for its lifetime).
fn concat<'a, T: Copy + 'a>(parts: impl Iterator<Item = &'a [T]> + Clone) -> Vec<T> {
    let mut out = Vec::with_capacity(parts.clone().map(<[T]>::len).sum());
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

/// Rows `rows` (in that order) of `v`, `per_row` elements each, in one allocation of the exact
/// size; None if a row is out of range.
fn pick_rows<T: Copy>(v: &[T], rows: &[u32], per_row: usize) -> Option<Vec<T>> {
    let mut out = Vec::with_capacity(rows.len() * per_row);
    for &r in rows {
        out.extend_from_slice(v.get(r as usize * per_row..(r as usize + 1) * per_row)?);
    }
    Some(out)
}

/// Whether [`Q6Matrix`] (and [`Q4Matrix`]) have a SIMD path on this CPU: AVX2 with FMA, or NEON.
pub fn q6_has_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    {
        true
    }
    #[cfg(not(any(target_arch = "x86_64", all(target_arch = "aarch64", target_feature = "neon"))))]
    {
        false
    }
}

/// Whether [`Q4Matrix`] has a SIMD path on this CPU (else it runs the portable code, and Q8_0 is
/// the faster format).
pub fn q4_has_simd() -> bool {
    q6_has_simd()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_isa;
#[cfg(test)]
mod tests_k;
