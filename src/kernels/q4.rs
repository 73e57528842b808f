//! 4- and 5-bit weight matrices (Q4_0, Q4_1, Q4_K; Q5_0, Q5_1, Q5_K through [`super::q5`]) in
//! the file's own blocks: layout and row kernels.

use super::*;

/// The file formats [`Q4Matrix::from_file`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q4File {
    /// Blocks of 32 weights with their own f16 scale (Q4_0, Q4_1, Q5_0, Q5_1).
    Blocks(SmallBlocks),
    Q4K,
    Q5K,
}

/// A 4- or 5-bit matrix `(n_out, n_in)` as GGML's Q4_1 (Q4_0 with m = −8·d; Q4_K with its
/// super-block scales; the Q5 formats with a fifth bit per quant, [`super::q5`]): each block of 32
/// weights is `d · q + m` with q in 0..15 (0..31). About half the bytes of Q8_0, so a decode
/// step, which is bound by reading the weights, is cheaper; and it is exactly the file's own
/// quantization.
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
    pub(super) scales: Scales,
    pub(super) nibbles: Vec<u8>, // (n_out, n_in / 2), each row packed by `pack_q4_row`
    /// The 5-bit formats' fifth bits, `high_row_bytes(n_in)` per row ([`pack_high_row`]); empty
    /// for the 4-bit ones.
    pub(super) high: Vec<u8>,
    /// The same weights in the tile layout where the 512-bit VNNI kernels run (calls take AMX
    /// where it pays, `vpdpbusd` over the tiles otherwise).
    pub(super) amx: Option<amx::AmxTiles>,
    /// The instruction sets it was built for: its layout and its kernels follow them.
    pub(super) isa: Isa,
}

/// Pack one row of 4-bit quants, given in plain order (`q[i]` is weight i, 0..15), as
/// [`Q4Matrix`] stores it: in the chunk layout of the Q8 kernel ([`chunk_source`]), vectors 2t and
/// 2t + 1 of a chunk in the low and high nibbles of its 32 bytes t; a chunk of one block (one
/// vector) as GGML stores a block, byte j holding weights j and j + 16.
pub(super) fn pack_q4_row(q: &[u8], packed: &mut [u8]) {
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
pub(super) fn unpack_q4_row(packed: &[u8], n_in: usize) -> Vec<u8> {
    deinterleave_row(&unpack_q4_il(packed, n_in))
}

/// The quants of a packed row in the chunk layout (before [`deinterleave_row`]).
pub(super) fn unpack_q4_il(packed: &[u8], n_in: usize) -> Vec<u8> {
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
    il
}

impl Q4Matrix {
    /// The matrices' rows one after another (all with the same `n_in`), like [`Q8Matrix::stack`].
    /// Parts that hold only their tiles stack into tiles alone; `None` where some parts hold rows
    /// and others not, or the parts were built for different instruction sets.
    pub fn stack(parts: &[&Q4Matrix]) -> Option<Q4Matrix> {
        let n_in = common(parts.iter().map(|m| m.n_in))?;
        let isa = common(parts.iter().map(|m| m.isa))?;
        let amx = amx::AmxTiles::stack(
            &parts.iter().map(|m| m.amx.as_ref()).collect::<Vec<_>>(),
            &parts.iter().map(|m| m.n_out).collect::<Vec<_>>(),
        );
        let n_out = parts.iter().map(|m| m.n_out).sum();
        match parts.iter().filter(|m| m.tiles_only()).count() {
            0 => {}
            n if n == parts.len() => return Some(Q4Matrix::tiles_alone(n_out, n_in, amx?, isa)),
            _ => return None,
        }
        Some(Q4Matrix {
            n_out,
            n_in,
            scales: Scales::stack(&parts.iter().map(|m| &m.scales).collect::<Vec<_>>())?,
            nibbles: concat(parts.iter().map(|m| &m.nibbles[..])),
            high: stack_high(parts, n_in),
            amx,
            isa,
        })
    }

    /// A matrix held in its tile layout alone (see [`Q4Matrix::drop_row_layout`]).
    fn tiles_alone(n_out: usize, n_in: usize, tiles: amx::AmxTiles, isa: Isa) -> Q4Matrix {
        let scales = Scales::Centered { d: Vec::new(), offset: 0.0 };
        Q4Matrix { n_out, n_in, scales, nibbles: Vec::new(), high: Vec::new(), amx: Some(tiles), isa }
    }

    /// The instruction sets its kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// A file's 4- or 5-bit matrix as it is, in the tile layout alone where that holds every
    /// output and `rows` is false (so the load never holds the weights twice; such a matrix's
    /// rows cannot be selected), else as [`Q4Matrix::from_blocks`] and the K readers do; for
    /// `isa`'s kernels.
    pub fn from_file(
        bytes: &[u8],
        n_out: usize,
        n_in: usize,
        format: Q4File,
        rows: bool,
        isa: Isa,
    ) -> Option<Q4Matrix> {
        match format {
            Q4File::Blocks(f) => Self::read_blocks(bytes, n_out, n_in, f, rows, isa),
            Q4File::Q4K => Self::from_k_bytes(bytes, n_out, n_in, false, rows, isa),
            Q4File::Q5K => Self::from_k_bytes(bytes, n_out, n_in, true, rows, isa),
        }
    }

    /// Only the given rows, in that order, like [`Q8Matrix::select_rows`].
    pub fn select_rows(&self, rows: &[u32]) -> Option<Q4Matrix> {
        let nibbles = pick_rows(&self.nibbles, rows, self.n_in / 2)?;
        let scales = self.scales.select_rows(rows, self.n_in / BLOCK)?;
        let high = select_high(&self.high, rows, self.n_in)?;
        Some(Q4Matrix { n_out: rows.len(), n_in: self.n_in, scales, nibbles, high, amx: None, isa: self.isa })
    }

    /// Repack GGML Q4_1 (`min = true`: f16 d, f16 m, 16 bytes) or Q4_0 (f16 d, 16 bytes) bytes for
    /// `isa`'s kernels.
    pub fn from_ggml_bytes(bytes: &[u8], n_out: usize, n_in: usize, min: bool, isa: Isa) -> Option<Q4Matrix> {
        Self::from_blocks(bytes, n_out, n_in, if min { SmallBlocks::Q4_1 } else { SmallBlocks::Q4_0 }, isa)
    }

    /// Read a file's blocks of 32 weights with their own f16 scale (Q4_0, Q4_1, Q5_0, Q5_1) as
    /// they are: block d and m in f32, the quants' low 4 bits as nibbles, the fifth beside them.
    pub fn from_blocks(bytes: &[u8], n_out: usize, n_in: usize, format: SmallBlocks, isa: Isa) -> Option<Q4Matrix> {
        Self::read_blocks(bytes, n_out, n_in, format, true, isa)
    }

    fn read_blocks(
        bytes: &[u8],
        n_out: usize,
        n_in: usize,
        format: SmallBlocks,
        rows: bool,
        isa: Isa,
    ) -> Option<Q4Matrix> {
        let block_bytes = format.bytes();
        if !n_in.is_multiple_of(BLOCK) || bytes.len() != n_out.checked_mul(n_in / BLOCK * block_bytes)? {
            return None;
        }
        let n_blocks = n_out * n_in / BLOCK;
        let mut d = Vec::with_capacity(n_blocks);
        let mut m = Vec::with_capacity(if format.centered().is_some() { 0 } else { n_blocks });
        let mut q = [0u8; BLOCK];
        for blk in bytes.chunks_exact(block_bytes) {
            let (scale, offset) = format.block(blk, &mut q);
            d.push(scale);
            m.extend(offset);
        }
        let scales = match format.centered() {
            Some(offset) => Scales::Centered { d, offset },
            None => Scales::Block { d, m },
        };
        // Output o's quants in plain order, from the file's blocks.
        let quants_row = |o: usize| {
            let mut plain = vec![0u8; n_in];
            let row = &bytes[o * n_in / BLOCK * block_bytes..][..n_in / BLOCK * block_bytes];
            for (blk, q) in row.chunks_exact(block_bytes).zip(plain.chunks_exact_mut(BLOCK)) {
                format.block(blk, q);
            }
            plain
        };
        let amx = match format.five() {
            false => amx::AmxTiles::from_q4_ggml(isa, bytes, n_out, n_in, block_bytes, &scales),
            true => amx::AmxTiles::from_quants(isa, n_out, n_in, quants_row, &scales, true),
        };
        Some(Self::with_rows((n_out, n_in), scales, amx, format.five(), rows, isa, quants_row))
    }

    /// The matrix from its scales and tiles, built for `isa`: in the tile layout alone where that
    /// holds every output and `rows` is false, else with the row layout packed from `quants_row`.
    fn with_rows(
        (n_out, n_in): (usize, usize),
        scales: Scales,
        amx: Option<amx::AmxTiles>,
        five: bool,
        rows: bool,
        isa: Isa,
        quants_row: impl Fn(usize) -> Vec<u8>,
    ) -> Q4Matrix {
        match amx {
            Some(t) if !rows && t.covers(n_out) && n_in > 0 => Q4Matrix::tiles_alone(n_out, n_in, t, isa),
            amx => {
                let mut packed = PackedRows::new(n_out, n_in, five);
                if n_in > 0 {
                    for o in 0..n_out {
                        packed.pack(o, &quants_row(o));
                    }
                }
                let (nibbles, high) = packed.finish();
                Q4Matrix { n_out, n_in, scales, nibbles, high, amx, isa }
            }
        }
    }

    /// Read GGML Q4_K bytes as they are: each sub-block of 32 weights has its own scale and min,
    /// which become this layout's per-block d and m ([`Scales::Super`]); for `isa`'s kernels.
    pub fn from_q4k_bytes(bytes: &[u8], n_out: usize, n_in: usize, isa: Isa) -> Option<Q4Matrix> {
        Self::from_k_bytes(bytes, n_out, n_in, false, true, isa)
    }

    /// Q5_K bytes as they are: Q4_K's scales and nibbles, with a fifth bit per quant.
    pub fn from_q5k_bytes(bytes: &[u8], n_out: usize, n_in: usize, isa: Isa) -> Option<Q4Matrix> {
        Self::from_k_bytes(bytes, n_out, n_in, true, true, isa)
    }

    fn from_k_bytes(bytes: &[u8], n_out: usize, n_in: usize, five: bool, rows: bool, isa: Isa) -> Option<Q4Matrix> {
        use kquants::{Q4K_BYTES, Q5K_BYTES, QK_K};
        let (ns, block_bytes) = (n_in / QK_K, if five { Q5K_BYTES } else { Q4K_BYTES });
        if n_in == 0 || !n_in.is_multiple_of(QK_K) || bytes.len() != n_out.checked_mul(ns * block_bytes)? {
            return None;
        }
        let nb = n_in / BLOCK;
        // One super-block's scales and mins into `sc`, `mn` and its quants into `q`; its d and dmin.
        let decode = |blk: &[u8], sc: &mut [u8], mn: &mut [u8], q: &mut [u8]| match five {
            true => kquants::q5k_block(blk, sc, mn, q),
            false => kquants::q4k_block(blk, sc, mn, q),
        };
        let (mut d, mut dmin) = (Vec::with_capacity(n_out * ns), Vec::with_capacity(n_out * ns));
        let (mut sc, mut mn) = (vec![0u8; n_out * nb], vec![0u8; n_out * nb]);
        let mut q = [0u8; QK_K];
        for (i, blk) in bytes.chunks_exact(block_bytes).enumerate() {
            let at = i * GROUP_BLOCKS;
            let (dd, dm) = decode(blk, &mut sc[at..at + GROUP_BLOCKS], &mut mn[at..at + GROUP_BLOCKS], &mut q);
            d.push(dd);
            dmin.push(dm);
        }
        let quants_row = |o: usize| {
            let (mut plain, mut sc, mut mn) = (vec![0u8; n_in], [0u8; GROUP_BLOCKS], [0u8; GROUP_BLOCKS]);
            let row = &bytes[o * ns * block_bytes..][..ns * block_bytes];
            for (blk, q) in row.chunks_exact(block_bytes).zip(plain.chunks_exact_mut(QK_K)) {
                decode(blk, &mut sc, &mut mn, q);
            }
            plain
        };
        let scales = Scales::Super { d, dmin, sc, mn };
        let amx = amx::AmxTiles::from_quants(isa, n_out, n_in, quants_row, &scales, five);
        Some(Self::with_rows((n_out, n_in), scales, amx, five, rows, isa, quants_row))
    }

    /// Bytes held (the tiles included).
    pub fn bytes(&self) -> usize {
        let scales = match &self.scales {
            Scales::Block { d, m } => 2 * (d.len() + m.len()),
            Scales::Centered { d, .. } => 2 * d.len(),
            Scales::Super { d, dmin, sc, mn } => 4 * (d.len() + dmin.len()) + sc.len() + mn.len(),
        };
        self.nibbles.len() + self.high.len() + scales + self.amx.as_ref().map_or(0, |a| a.bytes())
    }

    /// Bytes of the tile layout where it is a second copy beside the row layout (see
    /// [`Q8Matrix::tile_bytes`]; 0 where the tiles are the only one).
    pub fn tile_bytes(&self) -> usize {
        match self.tiles_only() {
            // The tiles are then the weights' only copy.
            true => 0,
            false => self.amx.as_ref().map_or(0, |a| a.bytes()),
        }
    }

    pub fn matmul(&self, x: &[f32], n_rows: usize) -> Vec<f32> {
        batched_matmul(self, x, n_rows)
    }

    pub(super) fn rows_portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        let nb = self.n_in / BLOCK;
        for (i, o) in outs.enumerate() {
            let q = self.quants_row(o);
            for r in 0..xq.n_rows {
                let mut acc = 0f32;
                let mut offset = 0f32;
                for b in 0..nb {
                    let x = &xq.quants[r * self.n_in + b * BLOCK..][..BLOCK];
                    let s: i32 = q[b * BLOCK..][..BLOCK].iter().zip(x).map(|(&w, &x)| w as i32 * x as i32).sum();
                    let (d, m) = self.block_d_m(o, b);
                    acc += d * xq.scales[r * nb + b] * s as f32;
                    offset += m * xq.scaled_sums[r * nb + b];
                }
                local[i * xq.n_rows + r] = acc + offset;
            }
        }
    }

    /// Output `o` (or `o` and `o + 1`: `pair`) for activation rows `r0 .. r0 + N`, with AVX2 +
    /// FMA, with AVX-512 VNNI on 256-bit vectors, and with 512-bit vectors for whole chunks of 8
    /// blocks: [`Q4Matrix::group_scaled`] for one kind of scales (`SUPER`: the K formats' compact
    /// ones) and quants (`HIGH`: with a fifth bit). The row loops choose the kind once per call,
    /// so that each kind's group calls inline into its loop.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn group_avx2<const N: usize, const SUPER: bool, const HIGH: bool>(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
    ) {
        self.group_scaled::<N, 1, false, false, SUPER, HIGH>(o, r0, xq, out, &ScaleSrc::new(&self.scales))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    #[inline]
    unsafe fn group_vnni<const N: usize, const SUPER: bool, const HIGH: bool>(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
    ) {
        self.group_scaled::<N, 1, true, false, SUPER, HIGH>(o, r0, xq, out, &ScaleSrc::new(&self.scales))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    #[inline]
    unsafe fn group_vnni512<const N: usize, const SUPER: bool, const HIGH: bool>(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
    ) {
        self.group_scaled::<N, 1, true, true, SUPER, HIGH>(o, r0, xq, out, &ScaleSrc::new(&self.scales))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    #[inline]
    unsafe fn group_vnni512_pair<const N: usize, const SUPER: bool, const HIGH: bool>(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
    ) {
        self.group_scaled::<N, 2, true, true, SUPER, HIGH>(o, r0, xq, out, &ScaleSrc::new(&self.scales))
    }

    /// Whether the scales are the K formats' compact ones.
    #[cfg(target_arch = "x86_64")]
    fn k_scales(&self) -> bool {
        matches!(self.scales, Scales::Super { .. })
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn group_scaled<
        const N: usize,
        const U: usize,
        const VNNI: bool,
        const WIDE: bool,
        const SUPER: bool,
        const HIGH: bool,
    >(
        &self,
        o: usize,
        r0: usize,
        xq: &Q8Rows,
        out: &mut [f32],
        src: &ScaleSrc,
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
            self.chunk::<N, U, 8, VNNI, WIDE, SUPER, HIGH>(o, g * GROUP_BLOCKS, &rows, &mut acc, src);
        }
        let (mut b0, rest) = (n_groups * GROUP_BLOCKS, nb % GROUP_BLOCKS);
        if rest & 4 != 0 {
            self.chunk::<N, U, 4, VNNI, false, SUPER, HIGH>(o, b0, &rows, &mut acc, src);
            b0 += 4;
        }
        if rest & 2 != 0 {
            self.chunk::<N, U, 2, VNNI, false, SUPER, HIGH>(o, b0, &rows, &mut acc, src);
            b0 += 2;
        }
        if rest & 1 != 0 {
            self.chunk::<N, U, 1, VNNI, false, SUPER, HIGH>(o, b0, &rows, &mut acc, src);
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
    /// the chunk layout, used for all N rows; with `HIGH`, each vector then gets its fifth bits
    /// from the chunk's 32 bytes of plane ([`super::q5`]). q ≤ 15 needs no sign fix-up for
    /// `maddubs`, and a pair sum is at most 2·15·127 = 3810, so up to 8 vectors' 16-bit results
    /// add as they are (≤ 30480 < 2¹⁵) and widen once per chunk: per row and vector one `maddubs`
    /// and one 16-bit add, against four operations for Q8_0 without VNNI. With q ≤ 31 (7874 per
    /// pair) two vectors' results widen at a time.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn chunk<
        const N: usize,
        const U: usize,
        const SIZE: usize,
        const VNNI: bool,
        const WIDE: bool,
        const SUPER: bool,
        const HIGH: bool,
    >(
        &self,
        o: usize,
        b0: usize,
        rows: &Q4Rows<N>,
        acc: &mut [[std::arch::x86_64::__m256; N]; U],
        src: &ScaleSrc,
    ) {
        use std::arch::x86_64::*;
        let nb = self.n_in / BLOCK;
        let nib: [*const u8; U] =
            std::array::from_fn(|u| self.nibbles.as_ptr().add((o + u) * self.n_in / 2 + b0 * BLOCK / 2));
        // The chunk's 32 bytes of fifth bits: its vector v's are bit b0 % 8 + v.
        let (plane, bit0): ([__m256i; U], i32) = match HIGH {
            true => {
                let hb = high_row_bytes(self.n_in);
                let at = |u: usize| self.high.as_ptr().add((o + u) * hb + b0 / GROUP_BLOCKS * BLOCK);
                let plane = std::array::from_fn(|u| {
                    // A quarter of the nibbles' bytes per row: the same rows ahead.
                    prefetch_ahead(at(u), PREFETCH_BYTES / 4);
                    _mm256_loadu_si256(at(u) as *const __m256i)
                });
                (plane, (b0 % GROUP_BLOCKS) as i32)
            }
            false => ([_mm256_setzero_si256(); U], 0),
        };
        let ones = _mm256_set1_epi16(1);
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
                    prefetch_ahead(nib[u].add(2 * t * BLOCK), PREFETCH_BYTES);
                    lo[u] = _mm512_and_si512(raw, mask);
                    hi[u] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), mask);
                    if HIGH {
                        let plane = _mm512_broadcast_i64x4(plane[u]);
                        lo[u] = with_fifth_bits_512(lo[u], plane, 4 * t, 4 * t + 2);
                        hi[u] = with_fifth_bits_512(hi[u], plane, 4 * t + 1, 4 * t + 3);
                    }
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
                prefetch_ahead(nib[u], PREFETCH_BYTES);
                let raw = _mm_loadu_si128(nib[u] as *const __m128i);
                let w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
                if HIGH {
                    with_fifth_bits(w, plane[u], bit0)
                } else {
                    w
                }
            });
            for j in 0..N {
                let x = _mm256_loadu_si256(rows.xp[j].add(b0 * BLOCK) as *const __m256i);
                for u in 0..U {
                    isum[u][j] = match (VNNI, HIGH) {
                        (true, _) => _mm256_dpbusd_epi32(isum[u][j], w[u], x),
                        (false, true) => _mm256_madd_epi16(_mm256_maddubs_epi16(w[u], x), ones),
                        (false, false) => _mm256_maddubs_epi16(w[u], x),
                    };
                }
            }
        } else {
            let mask = _mm256_set1_epi8(0x0F);
            for t in 0..SIZE / 2 {
                let mut lo = [_mm256_setzero_si256(); U];
                let mut hi = [_mm256_setzero_si256(); U];
                for u in 0..U {
                    let raw = _mm256_loadu_si256(nib[u].add(t * BLOCK) as *const __m256i);
                    if t % 2 == 0 {
                        prefetch_ahead(nib[u].add(t * BLOCK), PREFETCH_BYTES);
                    }
                    lo[u] = _mm256_and_si256(raw, mask);
                    hi[u] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                    if HIGH {
                        lo[u] = with_fifth_bits(lo[u], plane[u], bit0 + 2 * t as i32);
                        hi[u] = with_fifth_bits(hi[u], plane[u], bit0 + 2 * t as i32 + 1);
                    }
                }
                for j in 0..N {
                    let x = rows.xp[j].add(b0 * BLOCK + 2 * t * BLOCK);
                    let x0 = _mm256_loadu_si256(x as *const __m256i);
                    let x1 = _mm256_loadu_si256(x.add(BLOCK) as *const __m256i);
                    for u in 0..U {
                        if VNNI {
                            isum[u][j] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(isum[u][j], lo[u], x0), hi[u], x1);
                        } else if HIGH {
                            let pair =
                                _mm256_add_epi16(_mm256_maddubs_epi16(lo[u], x0), _mm256_maddubs_epi16(hi[u], x1));
                            isum[u][j] = _mm256_add_epi32(isum[u][j], _mm256_madd_epi16(pair, ones));
                        } else {
                            isum[u][j] = _mm256_add_epi16(isum[u][j], _mm256_maddubs_epi16(lo[u], x0));
                            isum[u][j] = _mm256_add_epi16(isum[u][j], _mm256_maddubs_epi16(hi[u], x1));
                        }
                    }
                }
            }
        }
        for u in 0..U {
            // Block b0 + i's scales in lane i, zeros after the chunk's blocks.
            let (d, m) = src.lanes::<SIZE, SUPER>((o + u) * nb + b0);
            for j in 0..N {
                // VNNI's lanes (and the 5-bit ones) hold 32-bit sums already; AVX2's 16-bit pair
                // sums widen here.
                let wide = if VNNI || HIGH { isum[u][j] } else { _mm256_madd_epi16(isum[u][j], ones) };
                let sums = _mm256_cvtepi32_ps(block_sums_first::<SIZE>(wide));
                acc[u][j] = _mm256_fmadd_ps(_mm256_mul_ps(d, first_ps(rows.xs[j].add(b0), SIZE)), sums, acc[u][j]);
                acc[u][j] = _mm256_fmadd_ps(m, first_ps(rows.xsum[j].add(b0), SIZE), acc[u][j]);
            }
        }
    }
}

/// `q` (quants 0..15) with 16 added where bit `bit` of the plane's matching byte is set.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn with_fifth_bits(
    q: std::arch::x86_64::__m256i,
    plane: std::arch::x86_64::__m256i,
    bit: i32,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let m = _mm256_set1_epi8((1u8 << bit) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(plane, m), m);
    _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)))
}

/// The same for a 512-bit register of two vectors: bit `low` of the plane for its lower half,
/// `high` for its upper half (the plane in both halves).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn with_fifth_bits_512(
    q: std::arch::x86_64::__m512i,
    plane: std::arch::x86_64::__m512i,
    low: usize,
    high: usize,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let bits = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi8((1u8 << low) as i8)),
        _mm256_set1_epi8((1u8 << high) as i8),
    );
    _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(plane, bits), q, _mm512_set1_epi8(16))
}

/// A chunk's 32-bit sums (lane i holding part of block i % SIZE, [`chunk_source`]) as whole block
/// sums: block i in lane i, zeros after the chunk's blocks. Integer adds, so exact. The float
/// arithmetic is then one multiply-add per block and lane in every path, the AMX one included
/// (`amx`), which has whole block sums only: lane i of a chunk accumulates block b0 + i.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn block_sums_first<const SIZE: usize>(v: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i {
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
pub(super) struct Q4Rows<const N: usize> {
    pub(super) xp: [*const i8; N],
    pub(super) xs: [*const f32; N],
    pub(super) xsum: [*const f32; N],
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

    /// Apple Silicon's CPU path, as for the Q8_0 kernel: each 32-byte vector is two 16-byte
    /// halves (lanes 0–3 and 4–7); the 32 bytes t of a chunk unpack into its vectors 2t and
    /// 2t + 1 (one block's 16 GGML bytes into its two halves), and the 5-bit formats' vectors
    /// take their fifth bits with a bit test.
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    fn rows_neon(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) -> bool {
        use std::arch::aarch64::*;
        let nb = self.n_in / BLOCK;
        // The output's block scales and offsets in f32, once for all its rows.
        let (mut dd, mut mm) = (vec![0f32; nb], vec![0f32; nb]);
        for (i, o) in outs.enumerate() {
            for b in 0..nb {
                (dd[b], mm[b]) = self.scales.get(o * nb + b);
            }
            for r in 0..xq.n_rows {
                // SAFETY: every pointer stays inside row `o` of the weights (n_in / 2 bytes, nb
                // scales) or row `r` of the activations (n_in quants, nb scales); NEON is baseline.
                local[i * xq.n_rows + r] = unsafe {
                    let nib = self.nibbles.as_ptr().add(o * self.n_in / 2);
                    let high = match self.is_five_bit() {
                        true => self.high.as_ptr().add(o * high_row_bytes(self.n_in)),
                        false => std::ptr::null(),
                    };
                    let xp = xq.quants_il.as_ptr().add(r * self.n_in);
                    let (xs, xsum) = (xq.scales.as_ptr().add(r * nb), xq.scaled_sums.as_ptr().add(r * nb));
                    let m4 = vdupq_n_u8(0x0F);
                    let mut acc = vdupq_n_f32(0.0);
                    let mut total = 0f32;
                    for (b0, size) in chunks(nb) {
                        // This chunk's scales and offsets from block b0 on.
                        let (wd, wm) = (dd.as_ptr().add(b0), mm.as_ptr().add(b0));
                        let (xs, xsum) = (xs.add(b0), xsum.add(b0));
                        let (w, x) = (nib.add(b0 * BLOCK / 2), xp.add(b0 * BLOCK));
                        // Half p (16 bytes) of the chunk's vector v with its fifth bits, if any.
                        let plane = high.wrapping_add(b0 / GROUP_BLOCKS * BLOCK);
                        let fifth = |q: uint8x16_t, v: usize, p: usize| match high.is_null() {
                            true => vreinterpretq_s8_u8(q),
                            false => {
                                let bit = vdupq_n_u8(1 << ((b0 + v) % GROUP_BLOCKS));
                                let set = vtstq_u8(vld1q_u8(plane.add(16 * p)), bit);
                                vreinterpretq_s8_u8(vorrq_u8(q, vandq_u8(set, vdupq_n_u8(16))))
                            }
                        };
                        let mut isum = [vdupq_n_s32(0); 2];
                        if size == 1 {
                            let raw = vld1q_u8(w);
                            isum[0] = dot4_neon(isum[0], fifth(vandq_u8(raw, m4), 0, 0), vld1q_s8(x));
                            isum[1] = dot4_neon(isum[1], fifth(vshrq_n_u8::<4>(raw), 0, 1), vld1q_s8(x.add(16)));
                        } else {
                            for t in 0..size / 2 {
                                for (p, sum) in isum.iter_mut().enumerate() {
                                    let raw = vld1q_u8(w.add(BLOCK * t + 16 * p));
                                    let xa = vld1q_s8(x.add(2 * BLOCK * t + 16 * p));
                                    let xb = vld1q_s8(x.add(2 * BLOCK * t + BLOCK + 16 * p));
                                    *sum = dot4_neon(*sum, fifth(vandq_u8(raw, m4), 2 * t, p), xa);
                                    *sum = dot4_neon(*sum, fifth(vshrq_n_u8::<4>(raw), 2 * t + 1, p), xb);
                                }
                            }
                        }
                        // Block b0 + k's part, from its integer sum.
                        let block = |k: usize, s: i32| *wd.add(k) * *xs.add(k) * s as f32 + *wm.add(k) * *xsum.add(k);
                        let [lo, hi] = isum;
                        match size {
                            8 => {
                                for (h, part) in [lo, hi].into_iter().enumerate() {
                                    let k = 4 * h;
                                    let scale = vmulq_f32(vld1q_f32(wd.add(k)), vld1q_f32(xs.add(k)));
                                    acc = vfmaq_f32(acc, scale, vcvtq_f32_s32(part));
                                    acc = vfmaq_f32(acc, vld1q_f32(wm.add(k)), vld1q_f32(xsum.add(k)));
                                }
                            }
                            4 => {
                                // Lanes i and i + 4 both belong to block i.
                                let scale = vmulq_f32(vld1q_f32(wd), vld1q_f32(xs));
                                acc = vfmaq_f32(acc, scale, vcvtq_f32_s32(vaddq_s32(lo, hi)));
                                acc = vfmaq_f32(acc, vld1q_f32(wm), vld1q_f32(xsum));
                            }
                            2 => {
                                // Even lanes belong to the first block, odd lanes to the second.
                                let both = vaddq_s32(lo, hi);
                                let pair = vadd_s32(vget_low_s32(both), vget_high_s32(both));
                                total += block(0, vget_lane_s32::<0>(pair)) + block(1, vget_lane_s32::<1>(pair));
                            }
                            _ => total += block(0, vaddvq_s32(vaddq_s32(lo, hi))),
                        }
                    }
                    vaddvq_f32(acc) + total
                };
            }
        }
        true
    }

    #[cfg(target_arch = "x86_64")]
    fn prepare(&self, xq: &mut Q8Rows) {
        xq.fill_pairs_for_wide(self.isa);
        #[cfg(target_os = "linux")]
        if self.amx.as_ref().is_some_and(|t| t.takes_amx(xq.n_rows, self.n_in)) {
            xq.fill_tile_pairs();
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    unsafe fn rows_direct(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, y: *mut f32) -> usize {
        match &self.amx {
            // SAFETY: the layout exists only where the matrix's Isa has the 512-bit VNNI kernels
            // (and AMX, for the calls it takes); the rest is the caller's.
            Some(tiles) => tiles.rows(self.n_in, outs, xq, y, self.n_out),
            None => 0,
        }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx2(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        // The matrix's Isa has only what the CPU has.
        if self.isa.vnni512() {
            self.rows_vnni512(outs, xq, local)
        } else if self.isa.vnni() {
            self.rows_vnni(outs, xq, local)
        } else {
            self.rows_avx2_impl(outs, xq, local)
        }
    }
}

impl Q4Matrix {
    /// Groups of up to 4 rows: each step of a chunk unpacks two weight vectors and runs them
    /// against every row of the group, beside each row's two accumulators (15 of AVX2's 16
    /// registers). Groups of 4 rather than 3 take one pass over each output's weights instead of
    /// two for 4 rows: `cost --pair qwen-coder --threads 2 --k 3,4` (AMD EPYC Zen 3, AVX2 only)
    /// gave the 4-token forward 73 ms against 86 ms, the 3-token one the same.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2_impl(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        by_kind!(self, rows_avx2_kind, outs, xq, local)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_avx2_kind<const SUPER: bool, const HIGH: bool>(
        &self,
        outs: std::ops::Range<usize>,
        xq: &Q8Rows,
        local: &mut [f32],
    ) {
        for_groups(
            outs,
            xq.n_rows,
            AVX2_GROUP,
            local,
            |o, r0, n, out| dispatch_group!(self, group_avx2[SUPER, HIGH], o, r0, n, xq, out),
        )
    }

    /// With VNNI a row needs two registers (its 32-bit sums and its accumulator), and AVX-512VL
    /// gives 32: groups of up to MAX_GROUP rows share each unpacked weight vector (groups of up
    /// to 9 measured the same in `cost`, Intel Xeon with AVX-512, 2 threads).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    pub(super) unsafe fn rows_vnni(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        by_kind!(self, rows_vnni_kind, outs, xq, local)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    unsafe fn rows_vnni_kind<const SUPER: bool, const HIGH: bool>(
        &self,
        outs: std::ops::Range<usize>,
        xq: &Q8Rows,
        local: &mut [f32],
    ) {
        for_groups(
            outs,
            xq.n_rows,
            MAX_GROUP,
            local,
            |o, r0, n, out| dispatch_group!(self, group_vnni[SUPER, HIGH], o, r0, n, xq, out),
        )
    }

    /// The VNNI kernel with 512-bit vectors for whole chunks of 8 blocks, two outputs per call
    /// (each activation load serves both). Single thread, 1536 × 576, best of 25 alternating
    /// trials (Intel Xeon, AVX-512): 1 row 34 → 25 µs, 4 rows 102 → 79 µs, 5 rows 141 → 93 µs,
    /// 9 rows 155 → 153 µs against one output per call; in `cost` (3 alternating rounds, 2
    /// threads) 4 tokens 1.50x → 1.43x, 9 tokens 2.54x → 2.30x a step.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    pub(super) unsafe fn rows_vnni512(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        by_kind!(self, rows_vnni512_kind, outs, xq, local)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
    unsafe fn rows_vnni512_kind<const SUPER: bool, const HIGH: bool>(
        &self,
        outs: std::ops::Range<usize>,
        xq: &Q8Rows,
        local: &mut [f32],
    ) {
        pairs_vnni512!(self, outs, xq, local, group_vnni512_pair, group_vnni512[SUPER, HIGH])
    }
}

/// Call a row loop's instance for the matrix's kind of scales and quants.
#[cfg(target_arch = "x86_64")]
macro_rules! by_kind {
    ($self:ident, $f:ident, $outs:ident, $xq:ident, $local:ident) => {
        match ($self.k_scales(), $self.is_five_bit()) {
            (false, false) => $self.$f::<false, false>($outs, $xq, $local),
            (false, true) => $self.$f::<false, true>($outs, $xq, $local),
            (true, false) => $self.$f::<true, false>($outs, $xq, $local),
            (true, true) => $self.$f::<true, true>($outs, $xq, $local),
        }
    };
}
#[cfg(target_arch = "x86_64")]
use by_kind;
