//! Q6_K weight matrices in the file's own 6-bit quants: layout and row kernels.

use super::kquants::{q6k_block, Q6K_BYTES, QK_K};
use super::q6_tiles::Q6Tiles;
use super::*;

/// A Q6_K matrix `(n_out, n_in)`, `n_in` a multiple of 256. Per super-block of 256 weights, which
/// is one chunk of 8 blocks in the chunk layout, a scale `d` and 16 i8 scales (one per 16
/// weights): weight = d · scale · (q − 32), q in 0..63.
///
/// Kernel: block i of a chunk has the integer sum sc_a·(Σ_a q·x − 32·Σ_a x) + sc_b·(Σ_b q·x −
/// 32·Σ_b x) over its halves a and b (exact in i32), then one float multiply-add by d · s_x. In the
/// chunk layout vectors 0–3 hold the first 16 weights of each block and vectors 4–7 the last 16,
/// so each half's sums build up in their own registers.
///
/// Stored per chunk: the low nibbles as [`Q4Matrix`] packs them (128 bytes); the high 2 bits of
/// vector 4h + k in bits 2k, 2k + 1 of the 32 bytes h (64 bytes); the first halves' 8 scales, then
/// the second halves' 8 (16 bytes). That is the file's 210 bytes, with `d` as f32.
#[derive(Debug, Clone)]
pub struct Q6Matrix {
    pub n_out: usize,
    pub n_in: usize,
    d: Vec<f32>,     // (n_out, n_in / 256)
    scales: Vec<i8>, // (n_out, n_in / 16)
    low: Vec<u8>,    // (n_out, n_in / 2)
    high: Vec<u8>,   // (n_out, n_in / 4)
    /// The tile layout where the 512-bit VNNI kernels run: calls take it for its whole groups of
    /// 16 outputs (see [`super::q6_tiles`]).
    pub(super) tiles: Option<Q6Tiles>,
    /// The instruction sets it was built for: its layout and its kernels follow them.
    isa: Isa,
}

impl Q6Matrix {
    /// Read GGML Q6_K bytes as they are: into the tile layout alone where it holds every output
    /// (so the load never holds the weights twice), else into the row layout (with tiles for the
    /// whole groups of 16 outputs); for `isa`'s kernels.
    pub fn from_q6k_bytes(bytes: &[u8], n_out: usize, n_in: usize, isa: Isa) -> Option<Q6Matrix> {
        Self::read(bytes, n_out, n_in, false, isa)
    }

    /// [`Q6Matrix::from_q6k_bytes`] with the row layout kept even where the tiles hold every
    /// output (`rows`), for comparing the two kernels.
    pub(super) fn read(bytes: &[u8], n_out: usize, n_in: usize, rows: bool, isa: Isa) -> Option<Q6Matrix> {
        let ns = n_in / QK_K;
        if n_in == 0 || !n_in.is_multiple_of(QK_K) || bytes.len() != n_out.checked_mul(ns * Q6K_BYTES)? {
            return None;
        }
        let block = |o: usize, s: usize| &bytes[(o * ns + s) * Q6K_BYTES..][..Q6K_BYTES];
        if !rows && n_out.is_multiple_of(16) {
            let row = |o: usize| {
                let (mut q, mut sc) = (vec![0u8; n_in], vec![0i8; n_in / 16]);
                for s in 0..ns {
                    q6k_block(block(o, s), &mut sc[s * 16..][..16], &mut q[s * QK_K..][..QK_K]);
                }
                (q, sc)
            };
            let d = |o: usize, s: usize| half::f16::from_le_bytes([block(o, s)[208], block(o, s)[209]]).to_f32();
            if let Some(tiles) = Q6Tiles::build(isa, n_out, n_in, row, d) {
                let mut m = Q6Matrix::zeroed(0, n_in, isa);
                (m.n_out, m.tiles) = (n_out, Some(tiles));
                return Some(m);
            }
        }
        let mut m = Q6Matrix::zeroed(n_out, n_in, isa);
        let (mut plain, mut sc, mut d) = (vec![0u8; n_in], vec![0i8; n_in / 16], vec![0f32; ns]);
        for o in 0..n_out {
            for (s, d) in d.iter_mut().enumerate() {
                *d = q6k_block(block(o, s), &mut sc[s * 16..][..16], &mut plain[s * QK_K..][..QK_K]);
            }
            m.set_row(o, &plain, &sc, &d);
        }
        Some(m.with_tiles())
    }

    /// A matrix of zero weights in the row layout for `isa`, for [`Q6Matrix::set_row`] to fill.
    fn zeroed(n_out: usize, n_in: usize, isa: Isa) -> Q6Matrix {
        Q6Matrix {
            n_out,
            n_in,
            d: vec![0.0; n_out * n_in / QK_K],
            scales: vec![0; n_out * n_in / 16],
            low: vec![0; n_out * n_in / 2],
            high: vec![0; n_out * n_in / 4],
            tiles: None,
            isa,
        }
    }

    /// The instruction sets its kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Row `o` from its quants (0..63) in plain order, its scales in file order and its
    /// super-blocks' d.
    fn set_row(&mut self, o: usize, plain: &[u8], sc: &[i8], d: &[f32]) {
        let (n_in, ns) = (self.n_in, self.n_in / QK_K);
        self.d[o * ns..][..ns].copy_from_slice(d);
        for (dst, src) in self.scales[o * n_in / 16..][..n_in / 16].chunks_exact_mut(16).zip(sc.chunks_exact(16)) {
            for i in 0..GROUP_BLOCKS {
                (dst[i], dst[GROUP_BLOCKS + i]) = (src[2 * i], src[2 * i + 1]);
            }
        }
        let low: Vec<u8> = plain.iter().map(|q| q & 0x0F).collect();
        pack_q4_row(&low, &mut self.low[o * n_in / 2..][..n_in / 2]);
        let mut top: Vec<u8> = plain.iter().map(|q| q >> 4).collect();
        interleave_row(&mut top);
        for (chunk, dst) in top.chunks_exact(QK_K).zip(self.high[o * n_in / 4..][..n_in / 4].chunks_exact_mut(64)) {
            for (p, byte) in dst.iter_mut().enumerate() {
                let (h, j) = (p / BLOCK, p % BLOCK);
                *byte = (0..4).fold(0, |acc, k| acc | chunk[(4 * h + k) * BLOCK + j] << (2 * k));
            }
        }
    }

    /// The same matrix with its tile layout built (where its Isa runs the tile kernels).
    fn with_tiles(mut self) -> Q6Matrix {
        self.tiles = Q6Tiles::build(self.isa, self.n_out, self.n_in, |o| self.row(o), |o, s| self.d_at(o, s));
        self
    }

    /// Drop the row layout where the tile layout holds every output: every call then runs on the
    /// tiles, and the weights are held once. Rows read back and selected come from the tiles.
    pub fn drop_row_layout(&mut self) {
        if self.tiles.as_ref().is_some_and(|t| t.covers(self.n_out)) {
            (self.d, self.scales, self.low, self.high) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        }
    }

    /// Whether [`Q6Matrix::drop_row_layout`] dropped the row layout.
    pub fn tiles_only(&self) -> bool {
        self.low.is_empty() && self.n_out > 0
    }

    /// Output `o`'s d of super-block `s`, from whichever layout holds it.
    fn d_at(&self, o: usize, s: usize) -> f32 {
        let ns = self.n_in / QK_K;
        match (&self.tiles, self.tiles_only()) {
            (Some(t), true) => t.d_of(o, s, ns),
            _ => self.d[o * ns + s],
        }
    }

    /// Row `o`'s quants (0..63) in plain order and its scales in file order.
    pub(super) fn row(&self, o: usize) -> (Vec<u8>, Vec<i8>) {
        if let (Some(t), true) = (&self.tiles, self.tiles_only()) {
            return t.row(o, self.n_in);
        }
        let mut q = unpack_q4_row(&self.low[o * self.n_in / 2..][..self.n_in / 2], self.n_in);
        let mut top = vec![0u8; self.n_in];
        for (chunk, src) in
            top.chunks_exact_mut(QK_K).zip(self.high[o * self.n_in / 4..][..self.n_in / 4].chunks_exact(64))
        {
            for (p, &byte) in src.iter().enumerate() {
                let (h, j) = (p / BLOCK, p % BLOCK);
                for k in 0..4 {
                    chunk[(4 * h + k) * BLOCK + j] = (byte >> (2 * k)) & 3;
                }
            }
        }
        for (q, t) in q.iter_mut().zip(deinterleave_row(&top)) {
            *q |= t << 4;
        }
        let stored = &self.scales[o * self.n_in / 16..][..self.n_in / 16];
        let scales =
            stored.chunks_exact(16).flat_map(|s| (0..16).map(move |i| s[i % 2 * GROUP_BLOCKS + i / 2])).collect();
        (q, scales)
    }

    /// The weights as f32, computed as GGML dequantizes Q6_K.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.n_out * self.n_in];
        for (o, row) in w.chunks_exact_mut(self.n_in.max(1)).enumerate() {
            self.dequantize_row(o, row);
        }
        w
    }

    /// Row `o` as f32 into `out`, as GGML dequantizes Q6_K.
    pub fn dequantize_row(&self, o: usize, out: &mut [f32]) {
        let (q, scales) = self.row(o);
        for (i, (w, &q)) in out.iter_mut().zip(&q).enumerate() {
            *w = self.d_at(o, i / QK_K) * scales[i / 16] as f32 * (q as i32 - 32) as f32;
        }
    }

    /// Bytes held (the tiles included).
    pub fn bytes(&self) -> usize {
        4 * self.d.len()
            + self.scales.len()
            + self.low.len()
            + self.high.len()
            + self.tiles.as_ref().map_or(0, Q6Tiles::bytes)
    }

    /// Bytes of the tile layout where it is a second copy beside the row layout (0 where the
    /// tiles are the only one, or there are none).
    pub fn tile_bytes(&self) -> usize {
        match self.tiles_only() {
            true => 0,
            false => self.tiles.as_ref().map_or(0, Q6Tiles::bytes),
        }
    }

    pub fn matmul(&self, x: &[f32], n_rows: usize) -> Vec<f32> {
        batched_matmul(self, x, n_rows)
    }

    /// The matrices' rows one after another (all with the same `n_in`), like [`Q8Matrix::stack`]:
    /// in the tile layout alone where every part holds only that, else in the row layout (with
    /// tiles for the whole groups). Parts built for different instruction sets do not stack.
    pub fn stack(parts: &[&Q6Matrix]) -> Option<Q6Matrix> {
        let n_in = common(parts.iter().map(|m| m.n_in))?;
        let isa = common(parts.iter().map(|m| m.isa))?;
        let n_out = parts.iter().map(|m| m.n_out).sum();
        if parts.iter().all(|m| m.tiles_only()) {
            let tiles: Vec<&Q6Tiles> = parts.iter().filter_map(|m| m.tiles.as_ref()).collect();
            let mut m = Q6Matrix::zeroed(0, n_in, isa);
            (m.n_out, m.tiles) = (n_out, Some(Q6Tiles::stack(&tiles)));
            return Some(m);
        }
        let mut m = Q6Matrix::zeroed(n_out, n_in, isa);
        let rows = parts.iter().flat_map(|part| (0..part.n_out).map(move |o| (part, o)));
        for (i, (part, o)) in rows.enumerate() {
            let (q, sc) = part.row(o);
            let d: Vec<f32> = (0..n_in / QK_K).map(|s| part.d_at(o, s)).collect();
            m.set_row(i, &q, &sc, &d);
        }
        Some(m.with_tiles())
    }

    /// Only the given rows, in that order, like [`Q8Matrix::select_rows`] (from whichever layout
    /// holds them).
    pub fn select_rows(&self, rows: &[u32]) -> Option<Q6Matrix> {
        let (n_in, ns) = (self.n_in, self.n_in / QK_K);
        if rows.iter().any(|&r| r as usize >= self.n_out) {
            return None;
        }
        let m = if self.tiles_only() {
            let mut m = Q6Matrix::zeroed(rows.len(), n_in, self.isa);
            for (i, &r) in rows.iter().enumerate() {
                let (q, sc) = self.row(r as usize);
                let d: Vec<f32> = (0..ns).map(|s| self.d_at(r as usize, s)).collect();
                m.set_row(i, &q, &sc, &d);
            }
            m
        } else {
            Q6Matrix {
                n_out: rows.len(),
                n_in,
                d: pick_rows(&self.d, rows, ns)?,
                scales: pick_rows(&self.scales, rows, n_in / 16)?,
                low: pick_rows(&self.low, rows, n_in / 2)?,
                high: pick_rows(&self.high, rows, n_in / 4)?,
                tiles: None,
                isa: self.isa,
            }
        };
        Some(m.with_tiles())
    }

    pub(super) fn rows_portable(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        let (nb, ns) = (self.n_in / BLOCK, self.n_in / QK_K);
        for (i, o) in outs.enumerate() {
            let (q, scales) = self.row(o);
            let d: Vec<f32> = (0..ns).map(|s| self.d_at(o, s)).collect();
            for r in 0..xq.n_rows {
                let x = &xq.quants[r * self.n_in..][..self.n_in];
                let mut acc = 0f32;
                for b in 0..nb {
                    let half = |h: usize| -> i32 {
                        (BLOCK * b + 16 * h..BLOCK * b + 16 * h + 16).map(|l| (q[l] as i32 - 32) * x[l] as i32).sum()
                    };
                    let comb = scales[2 * b] as i32 * half(0) + scales[2 * b + 1] as i32 * half(1);
                    acc += d[b / GROUP_BLOCKS] * xq.scales[r * nb + b] * comb as f32;
                }
                local[i * xq.n_rows + r] = acc;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn group_avx2<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
        self.group_body::<N, false>(o, r0, xq, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    unsafe fn group_vnni<const N: usize>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
        self.group_body::<N, true>(o, r0, xq, out)
    }

    /// Output `o` for activation rows `r0 .. r0 + N` into `out[j]`. Each half of a chunk unpacks
    /// into 4 vectors of unsigned quants (nibble | high bits << 4), used for all N rows: with VNNI
    /// one `vpdpbusd` per row and vector; with AVX2, `maddubs` pairs (≤ 2·63·127 = 16002, so two
    /// add in 16 bits) widened by `madd`. The integer sums are the same either way.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn group_body<const N: usize, const VNNI: bool>(&self, o: usize, r0: usize, xq: &Q8Rows, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let (n_in, nb, ns) = (self.n_in, self.n_in / BLOCK, self.n_in / QK_K);
        let xp: [*const i8; N] = std::array::from_fn(|j| xq.quants_il.as_ptr().add((r0 + j) * n_in));
        let xs: [*const f32; N] = std::array::from_fn(|j| xq.scales.as_ptr().add((r0 + j) * nb));
        let hs: [*const i32; N] = std::array::from_fn(|j| xq.half_sums.as_ptr().add((r0 + j) * n_in / 16));
        let (low, high) = (self.low.as_ptr().add(o * n_in / 2), self.high.as_ptr().add(o * n_in / 4));
        let sc = self.scales.as_ptr().add(o * n_in / 16);
        let (m4, m30, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30), _mm256_set1_epi16(1));
        let load = |p: *const u8| _mm256_loadu_si256(p as *const __m256i);
        let mut acc = [_mm256_setzero_ps(); N];
        for c in 0..ns {
            let mut comb = [_mm256_setzero_si256(); N];
            for h in 0..2 {
                // The low nibbles are two thirds of the bytes, the high pairs one third.
                prefetch_ahead(low.add(c * 128 + 64 * h), PREFETCH_BYTES);
                if h == 0 {
                    prefetch_ahead(high.add(c * 64), PREFETCH_BYTES / 2);
                }
                let hb = load(high.add(c * 64 + BLOCK * h));
                let (raw0, raw1) = (load(low.add(c * 128 + 64 * h)), load(low.add(c * 128 + 64 * h + BLOCK)));
                let w = [
                    _mm256_or_si256(_mm256_and_si256(raw0, m4), _mm256_and_si256(_mm256_slli_epi16::<4>(hb), m30)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw0), m4),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(hb), m30),
                    ),
                    _mm256_or_si256(_mm256_and_si256(raw1, m4), _mm256_and_si256(hb, m30)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw1), m4),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(hb), m30),
                    ),
                ];
                let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc.add(c * 16 + GROUP_BLOCKS * h) as *const __m128i));
                for j in 0..N {
                    let x = xp[j].add(c * QK_K + 4 * BLOCK * h) as *const u8;
                    let s = if VNNI {
                        let mut s = _mm256_setzero_si256();
                        for (k, &wk) in w.iter().enumerate() {
                            s = _mm256_dpbusd_epi32(s, wk, load(x.add(BLOCK * k)));
                        }
                        s
                    } else {
                        let p0 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w[0], load(x)),
                            _mm256_maddubs_epi16(w[1], load(x.add(BLOCK))),
                        );
                        let p1 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w[2], load(x.add(2 * BLOCK))),
                            _mm256_maddubs_epi16(w[3], load(x.add(3 * BLOCK))),
                        );
                        _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones))
                    };
                    // Σ q·x − 32 · Σ x for each block's half, times that half's scale.
                    let xsum = _mm256_loadu_si256(hs[j].add(c * 16 + GROUP_BLOCKS * h) as *const __m256i);
                    let centred = _mm256_sub_epi32(s, _mm256_slli_epi32::<5>(xsum));
                    comb[j] = _mm256_add_epi32(comb[j], _mm256_mullo_epi32(scale, centred));
                }
            }
            let d = _mm256_set1_ps(*self.d.get_unchecked(o * ns + c));
            for j in 0..N {
                let ds = _mm256_mul_ps(d, _mm256_loadu_ps(xs[j].add(c * GROUP_BLOCKS)));
                acc[j] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(comb[j]), acc[j]);
            }
        }
        for j in 0..N {
            out[j] = hsum256(acc[j]);
        }
    }
}

impl RowKernel for Q6Matrix {
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
        xq.fill_half_sums();
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    unsafe fn rows_direct(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, y: *mut f32) -> usize {
        match &self.tiles {
            // SAFETY: the layout exists only where the matrix's Isa has the 512-bit VNNI kernels,
            // and `prepare` filled the half sums; the rest is the caller's.
            Some(tiles) => tiles.rows(self.n_in, outs, xq, y, self.n_out),
            None => 0,
        }
    }
    /// Groups of up to 4 rows with AVX2 (16 registers: 4 weight vectors, per row a sum and an
    /// accumulator; 4 rows in one pass over the weights measured 0.3 of a step cheaper on the
    /// Qwen2.5-Coder 1.5B than 3 + 1), of up to MAX_GROUP with AVX-512VL's 32.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx2(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        // The matrix's Isa has only what the CPU has.
        if self.isa.vnni() {
            self.rows_vnni(outs, xq, local)
        } else {
            self.rows_avx2_impl(outs, xq, local)
        }
    }

    /// As for the Q8_0 kernel: each 32-byte vector is two 16-byte halves, lanes 0–3 and 4–7.
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    fn rows_neon(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) -> bool {
        use std::arch::aarch64::*;
        let (n_in, nb, ns) = (self.n_in, self.n_in / BLOCK, self.n_in / QK_K);
        for (i, o) in outs.enumerate() {
            for r in 0..xq.n_rows {
                // SAFETY: every pointer stays inside row `o` of the weights or row `r` of the
                // activations (chunk c's bytes of each array); NEON is baseline here.
                local[i * xq.n_rows + r] = unsafe {
                    let (low, high) = (self.low.as_ptr().add(o * n_in / 2), self.high.as_ptr().add(o * n_in / 4));
                    let sc = self.scales.as_ptr().add(o * n_in / 16);
                    let xp = xq.quants_il.as_ptr().add(r * n_in);
                    let xs = xq.scales.as_ptr().add(r * nb);
                    let (m4, m30) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x30));
                    let mut acc = [vdupq_n_f32(0.0); 2];
                    for c in 0..ns {
                        let mut comb = [vdupq_n_s32(0); 2];
                        for h in 0..2 {
                            for (p, comb) in comb.iter_mut().enumerate() {
                                let hb = vld1q_u8(high.add(c * 64 + BLOCK * h + 16 * p));
                                let raw0 = vld1q_u8(low.add(c * 128 + 64 * h + 16 * p));
                                let raw1 = vld1q_u8(low.add(c * 128 + 64 * h + BLOCK + 16 * p));
                                let w = [
                                    vorrq_u8(vandq_u8(raw0, m4), vandq_u8(vshlq_n_u8::<4>(hb), m30)),
                                    vorrq_u8(vshrq_n_u8::<4>(raw0), vandq_u8(vshlq_n_u8::<2>(hb), m30)),
                                    vorrq_u8(vandq_u8(raw1, m4), vandq_u8(hb, m30)),
                                    vorrq_u8(vshrq_n_u8::<4>(raw1), vandq_u8(vshrq_n_u8::<2>(hb), m30)),
                                ];
                                let (mut s, mut xsum) = (vdupq_n_s32(0), vdupq_n_s32(0));
                                for (k, &wk) in w.iter().enumerate() {
                                    let x = vld1q_s8(xp.add(c * QK_K + 4 * BLOCK * h + BLOCK * k + 16 * p));
                                    s = dot4_neon(s, vreinterpretq_s8_u8(wk), x);
                                    xsum = vaddq_s32(xsum, vpaddlq_s16(vpaddlq_s8(x)));
                                }
                                let at = sc.add(c * 16 + GROUP_BLOCKS * h + 4 * p);
                                let scale = [*at as i32, *at.add(1) as i32, *at.add(2) as i32, *at.add(3) as i32];
                                let centred = vsubq_s32(s, vshlq_n_s32::<5>(xsum));
                                *comb = vmlaq_s32(*comb, vld1q_s32(scale.as_ptr()), centred);
                            }
                        }
                        let d = *self.d.get_unchecked(o * ns + c);
                        for (p, acc) in acc.iter_mut().enumerate() {
                            let ds = vmulq_n_f32(vld1q_f32(xs.add(c * GROUP_BLOCKS + 4 * p)), d);
                            *acc = vfmaq_f32(*acc, ds, vcvtq_f32_s32(comb[p]));
                        }
                    }
                    vaddvq_f32(vaddq_f32(acc[0], acc[1]))
                };
            }
        }
        true
    }
}

impl Q6Matrix {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rows_avx2_impl(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        for_groups(outs, xq.n_rows, AVX2_GROUP, local, |o, r0, n, out| dispatch_group!(self, o, r0, n, xq, out))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    pub(super) unsafe fn rows_vnni(&self, outs: std::ops::Range<usize>, xq: &Q8Rows, local: &mut [f32]) {
        for_groups(outs, xq.n_rows, MAX_GROUP, local, |o, r0, n, out| {
            dispatch_group!(self, group_vnni, o, r0, n, xq, out)
        })
    }
}
