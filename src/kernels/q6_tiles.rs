//! Q6_K matrices in the 16-output tile layout of the 4-bit tiles ([`super::amx`]), multiplied
//! with 512-bit `vpdpbusd` wherever those kernels run.
//!
//! Why: the Q6_K row kernel works on one output at a time with 256-bit vectors (8 blocks in its
//! lanes), so every output pays its own unpacking, offset and scale steps. Here a tile row holds
//! weights 4t..4t + 3 of 16 outputs: one `vpdpbusd` against 4 broadcast activations serves 16
//! outputs, a block's weights are unpacked once for up to 16 activation rows, and its integer and
//! float steps are shared by 16 outputs.
//!
//! Exactness: per output and block the integer sums are the row kernel's (Σ q·x over each half of
//! 16, exact in i32), combined as it combines them, sc_a·(Σ_a q·x − 32·Σ_a x) + sc_b·(…), and
//! scaled into accumulator lane b % 8 by (d · s_x) in one fused multiply-add; the 8 lanes are then
//! added in `hsum256`'s order. So results equal the row kernel's bit for bit.

#![cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(dead_code))]

use super::kquants::QK_K;
use super::BLOCK;

/// Outputs per tile.
const TILE_OUTS: usize = 16;
/// Activation rows whose accumulators a call keeps per group of outputs (the tile rows of
/// [`super::amx`]).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
const TILE_ROWS: usize = 16;
/// Bytes per group and block: the low nibbles (two weights per byte) and the top 2 bits (four
/// per byte).
const LOW_BYTES: usize = TILE_OUTS * BLOCK / 2;
const HIGH_BYTES: usize = TILE_OUTS * BLOCK / 4;

/// A Q6_K matrix's first `16 · groups` outputs in the tile layout.
#[derive(Debug, Clone)]
pub(super) struct Q6Tiles {
    groups: usize,
    /// (group, block, 256): byte p holds weight 4·(p / 64) + p % 4 of output p % 64 / 4 in its low
    /// nibble and that weight + 16 in its high nibble, as the 4-bit tiles store them.
    low: Vec<u8>,
    /// (group, block, 128): bits 2j, 2j + 1 of byte 64·h + p are the top 2 bits of tile row
    /// 4·h + j's byte p (rows 0–3 are each block's first 16 weights, rows 4–7 its last 16).
    high: Vec<u8>,
    /// (group, block, 32): the 16 outputs' scales of the block's first 16 weights, then of its
    /// last 16.
    scales: Vec<i8>,
    /// (group, super-block, 16): the outputs' d.
    d: Vec<f32>,
}

impl Q6Tiles {
    /// From a matrix's rows (`row(o)`: output o's quants 0..63 in plain order and its scales in
    /// file order, one per 16 weights) and its super-blocks' d (`d(o, s)`); `None` where `isa`
    /// has no tiles or there is no whole group.
    pub(super) fn build(
        isa: super::Isa,
        n_out: usize,
        n_in: usize,
        row: impl Fn(usize) -> (Vec<u8>, Vec<i8>),
        d: impl Fn(usize, usize) -> f32,
    ) -> Option<Q6Tiles> {
        let (groups, nb, ns) = (n_out / TILE_OUTS, n_in / BLOCK, n_in / QK_K);
        if !isa.tiles() || groups == 0 || ns == 0 {
            return None;
        }
        let mut t = Q6Tiles {
            groups,
            low: vec![0; groups * nb * LOW_BYTES],
            high: vec![0; groups * nb * HIGH_BYTES],
            scales: vec![0; groups * nb * 2 * TILE_OUTS],
            d: Vec::with_capacity(groups * ns * TILE_OUTS),
        };
        for g in 0..groups {
            let rows: Vec<(Vec<u8>, Vec<i8>)> = (0..TILE_OUTS).map(|n| row(g * TILE_OUTS + n)).collect();
            for b in 0..nb {
                let at = g * nb + b;
                for (p, byte) in t.low[at * LOW_BYTES..][..LOW_BYTES].iter_mut().enumerate() {
                    let (q, k) = (&rows[p % 64 / 4].0, b * BLOCK + 4 * (p / 64) + p % 4);
                    *byte = (q[k] & 0x0F) | (q[k + 16] & 0x0F) << 4;
                }
                for (i, byte) in t.high[at * HIGH_BYTES..][..HIGH_BYTES].iter_mut().enumerate() {
                    let (h, p) = (i / 64, i % 64);
                    let q = &rows[p / 4].0;
                    *byte = (0..4).fold(0, |acc, j| acc | (q[b * BLOCK + 4 * (4 * h + j) + p % 4] >> 4) << (2 * j));
                }
                let sc = &mut t.scales[at * 2 * TILE_OUTS..][..2 * TILE_OUTS];
                for (n, (_, s)) in rows.iter().enumerate() {
                    (sc[n], sc[TILE_OUTS + n]) = (s[2 * b], s[2 * b + 1]);
                }
            }
            for s in 0..ns {
                t.d.extend((0..TILE_OUTS).map(|n| d(g * TILE_OUTS + n, s)));
            }
        }
        Some(t)
    }

    /// Layouts that each hold all their matrix's outputs, one after another.
    pub(super) fn stack(parts: &[&Q6Tiles]) -> Q6Tiles {
        let cat = |f: &dyn Fn(&Q6Tiles) -> &[u8]| super::concat(parts.iter().map(|t| f(t)));
        Q6Tiles {
            groups: parts.iter().map(|t| t.groups).sum(),
            low: cat(&|t| &t.low),
            high: cat(&|t| &t.high),
            scales: super::concat(parts.iter().map(|t| &t.scales[..])),
            d: super::concat(parts.iter().map(|t| &t.d[..])),
        }
    }

    /// Whether the layout holds all of a matrix's `n_out` outputs.
    pub(super) fn covers(&self, n_out: usize) -> bool {
        self.groups * TILE_OUTS == n_out
    }

    pub(super) fn bytes(&self) -> usize {
        self.low.len() + self.high.len() + self.scales.len() + 4 * self.d.len()
    }

    /// Output `o`'s quants (0..63, plain order) and scales (file order), `n_in` wide.
    pub(super) fn row(&self, o: usize, n_in: usize) -> (Vec<u8>, Vec<i8>) {
        let (g, n, nb) = (o / TILE_OUTS, o % TILE_OUTS, n_in / BLOCK);
        let (mut q, mut scales) = (vec![0u8; n_in], vec![0i8; n_in / 16]);
        for (b, block) in q.chunks_exact_mut(BLOCK).enumerate() {
            let at = g * nb + b;
            let low = &self.low[at * LOW_BYTES..][..LOW_BYTES];
            for (p, &byte) in low.iter().enumerate().filter(|(p, _)| p % 64 / 4 == n) {
                let k = 4 * (p / 64) + p % 4;
                (block[k], block[k + 16]) = (byte & 0x0F, byte >> 4);
            }
            let high = &self.high[at * HIGH_BYTES..][..HIGH_BYTES];
            for (i, &byte) in high.iter().enumerate().filter(|(i, _)| i % 64 / 4 == n) {
                let (h, p) = (i / 64, i % 64);
                for j in 0..4 {
                    block[4 * (4 * h + j) + p % 4] |= (byte >> (2 * j) & 3) << 4;
                }
            }
            let sc = &self.scales[at * 2 * TILE_OUTS..];
            (scales[2 * b], scales[2 * b + 1]) = (sc[n], sc[TILE_OUTS + n]);
        }
        (q, scales)
    }

    /// Output `o`'s d of super-block `s` (of `ns`).
    pub(super) fn d_of(&self, o: usize, s: usize, ns: usize) -> f32 {
        self.d[((o / TILE_OUTS) * ns + s) * TILE_OUTS + o % TILE_OUTS]
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod kernel {
    use super::super::{amx, prefetch_ahead, Q8Rows, GROUP_BLOCKS, PREFETCH_BYTES};
    use super::*;
    use std::arch::x86_64::*;

    impl Q6Tiles {
        /// Outputs from `outs.start` (a multiple of 16) in whole groups, for all activation rows,
        /// written into `y` (row-major, `n_out` wide); returns how many outputs it did (0 where
        /// `outs` does not start a group). Reads the activations' plain quants, scales and half
        /// sums ([`Q8Rows::fill_half_sums`]).
        ///
        /// Safety: the layout exists, so the 512-bit VNNI kernels run (AVX-512 F, BW and VNNI);
        /// `xq` holds its half sums; `y` holds `xq.n_rows · n_out` floats, and nothing else
        /// writes these outputs' columns meanwhile.
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
        pub(in super::super) unsafe fn rows(
            &self,
            n_in: usize,
            outs: std::ops::Range<usize>,
            xq: &Q8Rows,
            y: *mut f32,
            n_out: usize,
        ) -> usize {
            let Some((g0, g1, nb)) = amx::whole_groups(&outs, self.groups, n_in, xq.n_rows) else { return 0 };
            let (ns, nh) = (n_in / QK_K, n_in / 16);
            debug_assert_eq!(xq.half_sums.len(), xq.n_rows * nh);
            amx::with_accumulators(|acc| self.rows_into(acc, (g0, g1, nb, ns, nh), n_in, xq, y, n_out));
            (g1 - g0) * TILE_OUTS
        }

        /// [`Q6Tiles::rows`]' groups `g0..g1` with the accumulators `acc`.
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn rows_into(
            &self,
            acc: &mut amx::Accumulators,
            (g0, g1, nb, ns, nh): (usize, usize, usize, usize, usize),
            n_in: usize,
            xq: &Q8Rows,
            y: *mut f32,
            n_out: usize,
        ) {
            let acc = acc.as_mut_ptr();
            let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
            for r0 in (0..xq.n_rows).step_by(TILE_ROWS) {
                let rows = (xq.n_rows - r0).min(TILE_ROWS);
                for g in g0..g1 {
                    for r in 0..rows {
                        acc.add(r).write([_mm512_setzero_ps(); 8]);
                    }
                    for b in 0..nb {
                        let at = g * nb + b;
                        let (low, high) =
                            (self.low.as_ptr().add(at * LOW_BYTES), self.high.as_ptr().add(at * HIGH_BYTES));
                        // The weights stream from memory: ask for them ahead.
                        for line in 0..LOW_BYTES / 64 {
                            prefetch_ahead(low.add(64 * line), PREFETCH_BYTES);
                        }
                        for line in 0..HIGH_BYTES / 64 {
                            prefetch_ahead(high.add(64 * line), PREFETCH_BYTES / 2);
                        }
                        // Tile row t: weights 4t..4t + 3 of the 16 outputs, nibble | top bits << 4.
                        let hb = [0, 1].map(|h| _mm512_loadu_si512(high.add(64 * h) as *const _));
                        let top = |h: usize, j: usize| {
                            let v = match j {
                                0 => _mm512_slli_epi16::<4>(hb[h]),
                                1 => _mm512_slli_epi16::<2>(hb[h]),
                                2 => hb[h],
                                _ => _mm512_srli_epi16::<2>(hb[h]),
                            };
                            _mm512_and_si512(v, m30)
                        };
                        let mut w = [_mm512_setzero_si512(); 8];
                        for i in 0..4 {
                            let raw = _mm512_loadu_si512(low.add(64 * i) as *const _);
                            w[i] = _mm512_or_si512(_mm512_and_si512(raw, m4), top(0, i));
                            w[4 + i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4), top(1, i));
                        }
                        let sc = self.scales.as_ptr().add(at * 2 * TILE_OUTS);
                        let scales =
                            [0, TILE_OUTS].map(|h| _mm512_cvtepi8_epi32(_mm_loadu_si128(sc.add(h) as *const __m128i)));
                        let d = _mm512_loadu_ps(self.d.as_ptr().add((g * ns + b / GROUP_BLOCKS) * TILE_OUTS));
                        let lane = b % GROUP_BLOCKS;
                        let mut r = 0;
                        while r < rows {
                            let row = r0 + r;
                            let x = xq.quants.as_ptr().add(row * n_in + b * BLOCK);
                            let xs = xq.scales.as_ptr().add(row * nb + b);
                            // This block's first-half sum; its second half's is GROUP_BLOCKS on.
                            let hs = xq.half_sums.as_ptr().add(row * nh + b / GROUP_BLOCKS * 16 + lane);
                            let step = Step { x, n_in, xs, nb, hs, nh, acc: acc.add(r), lane };
                            r += match rows - r {
                                1 => block_rows::<1>(&w, scales, d, step),
                                2 => block_rows::<2>(&w, scales, d, step),
                                3 => block_rows::<3>(&w, scales, d, step),
                                _ => block_rows::<4>(&w, scales, d, step),
                            };
                        }
                    }
                    for r in 0..rows {
                        amx::store_lanes(&*acc.add(r), y.add((r0 + r) * n_out + g * TILE_OUTS));
                    }
                }
            }
        }
    }

    /// Where one block's rows read and write: activation quants at `x` (rows `n_in` apart), their
    /// block scales at `xs` and first-half sums at `hs` (rows `nb` and `nh` apart), the rows'
    /// accumulators from `acc`, lane `lane`.
    #[derive(Clone, Copy)]
    struct Step {
        x: *const i8,
        n_in: usize,
        xs: *const f32,
        nb: usize,
        hs: *const i32,
        nh: usize,
        acc: *mut [__m512; 8],
        lane: usize,
    }

    /// One block of `N` activation rows against the 16 outputs' unpacked weight rows `w` (scales
    /// of each half, super-block d): the halves' integer sums from 4 `vpdpbusd`s each, the rows
    /// interleaved so that their dependent chains overlap, then the row kernel's arithmetic.
    /// Returns `N`.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn block_rows<const N: usize>(w: &[__m512i; 8], scales: [__m512i; 2], d: __m512, at: Step) -> usize {
        let mut s = [[_mm512_setzero_si512(); 2]; N];
        for (t, &wt) in w.iter().enumerate() {
            for (j, sj) in s.iter_mut().enumerate() {
                let xt = (at.x.add(j * at.n_in + 4 * t) as *const i32).read_unaligned();
                sj[t / 4] = _mm512_dpbusd_epi32(sj[t / 4], wt, _mm512_set1_epi32(xt));
            }
        }
        for (j, sj) in s.iter().enumerate() {
            let hs = at.hs.add(j * at.nh);
            // Σ q·x − 32 · Σ x for each half, times that half's scale.
            let centred = |h: usize, xsum: i32| _mm512_sub_epi32(sj[h], _mm512_set1_epi32(xsum << 5));
            let comb = _mm512_add_epi32(
                _mm512_mullo_epi32(scales[0], centred(0, *hs)),
                _mm512_mullo_epi32(scales[1], centred(1, *hs.add(GROUP_BLOCKS))),
            );
            let a = &mut (*at.acc.add(j))[at.lane];
            let ds = _mm512_mul_ps(d, _mm512_set1_ps(*at.xs.add(j * at.nb)));
            *a = _mm512_fmadd_ps(ds, _mm512_cvtepi32_ps(comb), *a);
        }
        N
    }
}
