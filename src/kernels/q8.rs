//! Q8_0 weight matrices: layout, stacking, and the AVX2, VNNI, NEON and portable row kernels.

use super::*;

/// A weight matrix `(n_out, n_in)` in Q8_0, scales and quants in separate arrays. The quants of
/// each row are stored interleaved (see [`interleave_row`]).
#[derive(Debug, Clone)]
pub struct Q8Matrix {
    pub n_out: usize,
    pub n_in: usize,
    pub(super) scales: Vec<f32>, // (n_out, n_in / 32)
    pub(super) quants: Vec<i8>,  // (n_out, n_in), each row interleaved
    /// Σ quants of each block, (n_out, n_in / 32): with activations offset by +128 to make them
    /// unsigned, Σ (x + 128)·w − 128·Σ w = Σ x·w exactly, so VNNI's multiply-add needs no sign
    /// fix-ups per row. Held only where the VNNI kernels run (empty elsewhere); |Σ| ≤ 4096 fits
    /// an i16.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) wsum: Vec<i16>,
    /// The same weights in the tile layout where the 512-bit VNNI kernels run (calls take AMX
    /// where it pays, `vpdpbusd` over the tiles otherwise); a matrix read from a file with whole
    /// groups of 16 outputs holds only this layout there.
    pub(super) amx: Option<amx::AmxTiles>,
    /// The instruction sets it was built for: its layout and its kernels follow them.
    pub(super) isa: Isa,
}

impl Q8Matrix {
    /// The matrices' rows one after another (all with the same `n_in`): one product for several
    /// projections of the same input. Parts held in tiles alone stack into tiles alone; a mix is
    /// rebuilt in the row layout. Parts built for different instruction sets do not stack.
    pub fn stack(parts: &[&Q8Matrix]) -> Option<Q8Matrix> {
        let n_in = common(parts.iter().map(|m| m.n_in))?;
        let isa = common(parts.iter().map(|m| m.isa))?;
        let n_out = parts.iter().map(|m| m.n_out).sum();
        let tiles = || {
            amx::AmxTiles::stack(
                &parts.iter().map(|m| m.amx.as_ref()).collect::<Vec<_>>(),
                &parts.iter().map(|m| m.n_out).collect::<Vec<_>>(),
            )
        };
        match parts.iter().filter(|m| m.tiles_only()).count() {
            0 => Some(Q8Matrix {
                n_out,
                n_in,
                scales: concat(parts.iter().map(|m| &m.scales[..])),
                quants: concat(parts.iter().map(|m| &m.quants[..])),
                wsum: concat(parts.iter().map(|m| &m.wsum[..])),
                amx: tiles(),
                isa,
            }),
            n if n == parts.len() => Some(Q8Matrix::tiles_alone(n_out, n_in, tiles()?, isa)),
            _ => {
                let rows = parts.iter().flat_map(|m| (0..m.n_out).map(move |o| m.plain_row(o)));
                let (mut scales, mut quants) = (Vec::new(), Vec::new());
                for (mut w, s) in rows {
                    interleave_row(&mut w);
                    quants.extend(w);
                    scales.extend(s);
                }
                Some(Q8Matrix::new(n_out, n_in, scales, quants, isa))
            }
        }
    }

    /// A matrix held in its tile layout alone.
    fn tiles_alone(n_out: usize, n_in: usize, tiles: amx::AmxTiles, isa: Isa) -> Q8Matrix {
        Q8Matrix { n_out, n_in, scales: Vec::new(), quants: Vec::new(), wsum: Vec::new(), amx: Some(tiles), isa }
    }

    /// The instruction sets its kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Whether the matrix is held in its tile layout alone (every call runs on the tiles).
    pub fn tiles_only(&self) -> bool {
        self.quants.is_empty() && self.n_out > 0 && self.n_in > 0
    }

    /// Output `o`'s weights in plain order and its block scales, from whichever layout holds them.
    pub(super) fn plain_row(&self, o: usize) -> (Vec<i8>, Vec<f32>) {
        let (n_in, nb) = (self.n_in, self.n_in / BLOCK);
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let (true, Some(tiles)) = (self.tiles_only(), &self.amx) {
            return tiles.q8_row(o, n_in);
        }
        (deinterleave_row(&self.quants[o * n_in..(o + 1) * n_in]), self.scales[o * nb..(o + 1) * nb].to_vec())
    }

    /// From scales and interleaved quants for `isa`; computes the block sums where its kernels
    /// read them.
    pub(super) fn new(n_out: usize, n_in: usize, scales: Vec<f32>, quants: Vec<i8>, isa: Isa) -> Q8Matrix {
        // Interleaving keeps each group's bytes within the group, and a block's 32 bytes land in
        // one lane of each of the group's 8 vectors; summing by natural block needs the plain row.
        let mut wsum = Vec::new();
        // Only the VNNI kernels read the block sums.
        if n_in > 0 && isa.vnni() {
            wsum.reserve(n_out * (n_in / BLOCK));
            for row in quants.chunks_exact(n_in) {
                let plain = deinterleave_row(row);
                wsum.extend(plain.chunks_exact(BLOCK).map(|b| b.iter().map(|&q| q as i16).sum::<i16>()));
            }
        }
        let plain_row = |o: usize| deinterleave_row(&quants[o * n_in..(o + 1) * n_in]);
        let amx = amx::AmxTiles::from_q8(isa, n_out, n_in, &scales, plain_row);
        Q8Matrix { n_out, n_in, scales, quants, wsum, amx, isa }
    }

    /// Only the given rows, in that order (a vocabulary head restricted to some tokens), from
    /// whichever layout holds them.
    pub fn select_rows(&self, rows: &[u32]) -> Option<Q8Matrix> {
        let nb = self.n_in / BLOCK;
        if self.tiles_only() {
            let (mut scales, mut quants) =
                (Vec::with_capacity(rows.len() * nb), Vec::with_capacity(rows.len() * self.n_in));
            for &r in rows {
                let (mut w, s) = self.plain_row(((r as usize) < self.n_out).then_some(r as usize)?);
                interleave_row(&mut w);
                quants.extend(w);
                scales.extend(s);
            }
            return Some(Q8Matrix::new(rows.len(), self.n_in, scales, quants, self.isa));
        }
        Some(Q8Matrix {
            n_out: rows.len(),
            n_in: self.n_in,
            scales: pick_rows(&self.scales, rows, nb)?,
            quants: pick_rows(&self.quants, rows, self.n_in)?,
            wsum: pick_rows(&self.wsum, rows, if self.wsum.is_empty() { 0 } else { nb })?,
            amx: None,
            isa: self.isa,
        })
    }

    /// Quantize an f32 matrix given row-major `(n_out, n_in)` for `isa`'s kernels; `n_in` must be
    /// a multiple of 32.
    pub fn from_f32(w: &[f32], n_out: usize, n_in: usize, isa: Isa) -> Option<Q8Matrix> {
        if !n_in.is_multiple_of(BLOCK) || w.len() != n_out * n_in {
            return None;
        }
        let r = quantize_rows(w, n_out, n_in);
        Some(Q8Matrix::new(n_out, n_in, r.scales, r.quants_il, isa))
    }

    /// Repack GGML Q8_0 bytes (as in a GGUF file or candle's QTensor) for `(n_out, n_in)` and
    /// `isa`'s kernels.
    pub fn from_ggml_bytes(bytes: &[u8], n_out: usize, n_in: usize, isa: Isa) -> Option<Q8Matrix> {
        Self::from_file(bytes, n_out, n_in, true, isa)
    }

    /// GGML Q8_0 bytes in the tile layout alone where that holds every output and `rows` is
    /// false (so the load never holds the weights twice), else as [`Q8Matrix::from_ggml_bytes`].
    pub fn from_file(bytes: &[u8], n_out: usize, n_in: usize, rows: bool, isa: Isa) -> Option<Q8Matrix> {
        if !n_in.is_multiple_of(BLOCK) || bytes.len() != n_out.checked_mul(n_in / BLOCK * GGML_Q8_0_BYTES)? {
            return None;
        }
        let scales: Vec<f32> = bytes
            .chunks_exact(GGML_Q8_0_BYTES)
            .map(|blk| half::f16::from_le_bytes([blk[0], blk[1]]).to_f32())
            .collect();
        if !rows && n_out.is_multiple_of(16) && n_in > 0 {
            let row_bytes = n_in / BLOCK * GGML_Q8_0_BYTES;
            let plain_row = |o: usize| -> Vec<i8> {
                bytes[o * row_bytes..][..row_bytes]
                    .chunks_exact(GGML_Q8_0_BYTES)
                    .flat_map(|b| &b[2..])
                    .map(|&q| q as i8)
                    .collect()
            };
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            if let Some(tiles) =
                amx::AmxTiles::from_q8(isa, n_out, n_in, &scales, plain_row).filter(|t| t.covers(n_out))
            {
                return Some(Q8Matrix::tiles_alone(n_out, n_in, tiles, isa));
            }
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            let _ = plain_row;
        }
        let mut quants = Vec::with_capacity(n_out * n_in);
        for blk in bytes.chunks_exact(GGML_Q8_0_BYTES) {
            quants.extend(blk[2..].iter().map(|&b| b as i8));
        }
        if n_in > 0 {
            quants.chunks_exact_mut(n_in).for_each(interleave_row);
        }
        Some(Q8Matrix::new(n_out, n_in, scales, quants, isa))
    }

    /// Bytes held (the tiles included).
    pub fn bytes(&self) -> usize {
        4 * self.scales.len() + self.quants.len() + 2 * self.wsum.len() + self.amx.as_ref().map_or(0, |a| a.bytes())
    }

    /// Bytes of the tile layout where it is a second copy beside the row layout (0 where the
    /// tiles are the only one, or there are none).
    pub fn tile_bytes(&self) -> usize {
        match self.tiles_only() {
            true => 0,
            false => self.amx.as_ref().map_or(0, |a| a.bytes()),
        }
    }

    pub fn matmul(&self, x: &[f32], n_rows: usize) -> Vec<f32> {
        batched_matmul(self, x, n_rows)
    }

    /// Portable version (and the reference the SIMD version is tested against).
    pub(super) fn rows_portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        let nb = self.n_in / BLOCK;
        for (i, o) in outs.enumerate() {
            let (w_row, scales) = self.plain_row(o);
            for r in 0..xq.n_rows {
                let mut acc = 0f32;
                for b in 0..nb {
                    let w = &w_row[b * BLOCK..][..BLOCK];
                    let x = &xq.quants[r * self.n_in + b * BLOCK..][..BLOCK];
                    let s: i32 = w.iter().zip(x).map(|(&a, &c)| a as i32 * c as i32).sum();
                    acc += scales[b] * xq.scales[r * nb + b] * s as f32;
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
    pub(super) unsafe fn group_body<const N: usize, const VNNI: bool, const WIDE: bool>(
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
    pub(super) unsafe fn group_body_multi<const N: usize, const U: usize, const VNNI: bool, const WIDE: bool>(
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

    /// 128 · Σ quants of blocks `b0 .. b0 + 8` of output `o`, one per lane (what the unsigned
    /// activations' +128 added to the VNNI sums).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn block_sums_128(&self, o: usize, nb: usize, b0: usize) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        let sums = _mm_loadu_si128(self.wsum.as_ptr().add(o * nb + b0) as *const __m128i);
        _mm256_slli_epi32(_mm256_cvtepi16_epi32(sums), 7)
    }

    /// One chunk of `SIZE` blocks from block `b0` of outputs `o .. o + U`, added to each (output,
    /// row) accumulator: integer block sums in the 8 lanes (see [`chunk_source`]), then scaled
    /// once.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn chunk<
        const N: usize,
        const U: usize,
        const SIZE: usize,
        const VNNI: bool,
        const WIDE: bool,
    >(
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
                let w: [__m512i; U] = std::array::from_fn(|u| {
                    prefetch_ahead(wq[u].add(2 * v * BLOCK) as *const u8, PREFETCH_BYTES);
                    _mm512_loadu_si512(wq[u].add(2 * v * BLOCK) as *const _)
                });
                for j in 0..N {
                    let x = _mm512_loadu_si512(rows.xu[j].add(b0 * BLOCK + 2 * v * BLOCK) as *const _);
                    for u in 0..U {
                        wide[u][j] = _mm512_dpbusd_epi32(wide[u][j], x, w[u]);
                    }
                }
            }
            for u in 0..U {
                let offset = self.block_sums_128(o + u, nb, b0);
                for j in 0..N {
                    isum[u][j] = _mm256_sub_epi32(halves_added(wide[u][j]), offset);
                }
            }
        } else if VNNI && N >= 2 && SIZE == GROUP_BLOCKS {
            // Unsigned activations (x + 128) straight into vpdpbusd, one instruction per row and
            // vector; the +128 is taken back once per group with the weights' block sums.
            for v in 0..SIZE {
                let w: [__m256i; U] = std::array::from_fn(|u| {
                    if v % 2 == 0 {
                        prefetch_ahead(wq[u].add(v * BLOCK) as *const u8, PREFETCH_BYTES);
                    }
                    _mm256_loadu_si256(wq[u].add(v * BLOCK) as *const __m256i)
                });
                for j in 0..N {
                    let x = _mm256_loadu_si256(rows.xu[j].add(b0 * BLOCK + v * BLOCK) as *const __m256i);
                    for u in 0..U {
                        isum[u][j] = _mm256_dpbusd_epi32(isum[u][j], x, w[u]);
                    }
                }
            }
            for u in 0..U {
                let offset = self.block_sums_128(o + u, nb, b0);
                for j in 0..N {
                    isum[u][j] = _mm256_sub_epi32(isum[u][j], offset);
                }
            }
        } else {
            let ones = _mm256_set1_epi16(1);
            for v in 0..SIZE {
                for u in 0..U {
                    if v % 2 == 0 {
                        prefetch_ahead(wq[u].add(v * BLOCK) as *const u8, PREFETCH_BYTES);
                    }
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
pub(super) struct ChunkRows<const N: usize> {
    pub(super) xp: [*const i8; N],
    pub(super) xs: [*const f32; N],
    pub(super) xu: [*const u8; N],
}

/// 8 lanes from the `size` floats at `p` repeated (lane i = p[i % size]): the scales of a chunk's
/// blocks in the order of its lanes ([`chunk_source`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn repeat_ps(p: *const f32, size: usize) -> std::arch::x86_64::__m256 {
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
pub(super) unsafe fn first_ps(p: *const f32, size: usize) -> std::arch::x86_64::__m256 {
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
        if !self.tiles_only() {
            xq.fill_unsigned_for_vnni(self.isa);
        }
        #[cfg(target_os = "linux")]
        match &self.amx {
            Some(t) if t.takes_amx(xq.n_rows, self.n_in) => xq.fill_tile_pairs(),
            Some(_) => xq.fill_plain_unsigned(),
            None => {}
        }
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    unsafe fn rows_direct(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, y: *mut f32) -> usize {
        match &self.amx {
            // SAFETY: the layout exists only where the matrix's Isa has tiles (and AMX where its
            // calls take it); the rest is the caller's.
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
    pub(super) unsafe fn rows_avx2_only(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        for_groups(outs, xq.n_rows, 4, local, |o, r0, n, out| dispatch_group!(self, o, r0, n, xq, out))
    }

    /// VNNI needs fewer temporaries, and AVX-512VL gives 32 registers: groups of MAX_GROUP.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    pub(super) unsafe fn rows_vnni(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
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
    pub(super) unsafe fn rows_vnni512(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        pairs_vnni512!(self, outs, xq, local)
    }
}
