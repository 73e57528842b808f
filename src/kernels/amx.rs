//! The tile layout of 16 outputs per block for the 4-, 5-bit and Q8_0 kernels, and its calls: on
//! Intel AMX (Advanced Matrix Extensions, Linux on x86-64) for calls of several rows, and with
//! 512-bit `vpdpbusd` wherever those kernels run ([`AmxTiles::rows_vnni`]).
//!
//! Why: with `vpdpbusd` every activation row costs its own multiply-adds, block-scale arithmetic
//! and horizontal sums, so a verify row cost ~15% of a single-token step. An AMX tile multiply
//! (`tdpbsud`, `tdpbssd` for Q8_0's signed weights) takes up to 16 activation rows × 32 weights
//! of one block against 16 outputs' 32 weights at once, and leaves whole block sums for 16
//! outputs in each row of its result: the per-row work left is one conversion and one or two
//! multiply-adds per block for 16 outputs at a time. Up to 8 rows, one multiply takes two blocks
//! ([`super::Q8Rows::tile_pairs`]).
//!
//! Exactness: the tile's integer block sums equal the `vpdpbusd` ones, and the float arithmetic is
//! the other paths' in the same order: lane i of a chunk of blocks ([`super::chunks`]) accumulates
//! block b0 + i (`(d·s)·sum`, then `m·(s·Σx)`), and the 8 lanes are added as `hsum256` adds them.
//! So a verify row gives a single-token step's result bit for bit (`amx_equals_the_vnni_kernel`).
//!
//! Layout (Q8_0: the weight tiles as they are, 512 bytes per group of 16 outputs and block; 4-bit
//! below): per group of 16 outputs and block, the 256 GGML bytes that unpack (low nibbles, then high
//! nibbles) straight into the weight tile's 8 × 64 bytes, whose row t holds weights 4t..4t + 3 of
//! each of the 16 outputs: byte p holds weight 4·(p / 64) + p % 4 (low nibble) and that + 16 (high)
//! of output p % 64 / 4, which is byte 4·(p / 64) + p % 4 of the output's GGML block as it is.
//! Each block is unpacked into a small ring of tiles 8 blocks before its multiply: a tile load of
//! bytes just stored waits for the stores to drain (unpacking a group's blocks right before its
//! multiplies measured ~2x slower), and keeping the weights unpacked instead doubles the bytes a
//! verify pass reads (`cost`: 4 tokens 1.52x → 1.75x a step).

use super::{chunks, concat, Isa, Q8Rows, BLOCK, GROUP_BLOCKS};
use half::f16;
use std::arch::asm;
use std::arch::x86_64::*;

/// Activations (tile `$a`, signed, row stride `$stride`) times weights (tile `$b`, 64 bytes per
/// row; unsigned for `tdpbsud`, signed for `tdpbssd`) into a zeroed tile `$c`.
macro_rules! tile_mul {
    ($op:literal, $a:literal, $b:literal, $c:literal, $x:expr, $stride:expr, $w:expr) => {
        asm!(
            concat!("tileloadd tmm", $a, ", [{x} + {stride}*1]"),
            concat!("tileloadd tmm", $b, ", [{w} + {row}*1]"),
            concat!("tilezero tmm", $c),
            concat!($op, " tmm", $c, ", tmm", $a, ", tmm", $b),
            x = in(reg) $x, stride = in(reg) $stride, w = in(reg) $w, row = in(reg) 64usize,
            options(nostack)
        )
    };
}

/// Tile `$c` (rows of 16 32-bit sums) stored at `$sums`, 64 bytes per row.
macro_rules! tile_store {
    ($c:literal, $sums:expr) => {
        asm!(concat!("tilestored [{sums} + {row}*1], tmm", $c), sums = in(reg) $sums, row = in(reg) 64usize, options(nostack))
    };
}

/// Outputs per tile (its 16 columns of 32-bit sums).
const TILE_OUTS: usize = 16;
/// Activation rows per tile.
const TILE_ROWS: usize = 16;
/// Bytes of one weight tile: 16 outputs × 32 weights.
const TILE_BYTES: usize = TILE_OUTS * BLOCK;
/// Weight tiles unpacked ahead of their multiply, and the ring they go in (8 KiB).
const AHEAD: usize = 8;
const RING: usize = 16;
/// Bytes of one group's block as stored: two weights per byte.
const PACKED_BYTES: usize = TILE_BYTES / 2;
/// Bytes of one group's block of fifth bits (5-bit formats).
const FIFTH_BYTES: usize = TILE_BYTES / 8;
/// The fewest activation rows for which a 4-bit matrix `n_in` wide takes AMX (fewer take
/// `vpdpbusd` over the same tiles, [`AmxTiles::rows_vnni`]). Measured against the row kernel: single
/// thread, best of 4 alternating runs of 300 (`MENTOR_LAB_KERNEL=noamx` for the other), AMX
/// against 512-bit VNNI: 576 wide (1536, 3072 and 576 outputs) 0.97–1.04x the time at 1 row,
/// 0.88–0.91x at 2, 0.54–0.60x at 4, 0.32–0.35x at 16; 1536 wide (576 outputs) 1.27x at 2
/// rows, 1.01x at 4, 0.73x at 9, 0.62x at 16: long rows are where `vpdpbusd` does best, while a
/// tile multiply costs the same per block. Single rows stay on `vpdpbusd`: taking them too made
/// target-only `bench` runs slower (`qa`, 4 alternating pairs: 101 against 122 tok/s on average).
fn min_rows_q4(n_in: usize) -> usize {
    if n_in <= 1024 {
        2
    } else {
        4
    }
}

/// The same for Q8_0, whose `vpdpbusd` path has no nibbles to unpack, so tiles pay later (2
/// threads, best of 3): the 49152 × 576 vocabulary head 1.16x the time at 1 row, 0.90x at 2,
/// 0.47x at 9; 960 × 576 1.25x, 1.11x, 0.95x at 3; the draft's 192- and 640-wide matrices
/// 0.86–1.31x at 1 row, 0.75–1.11x at 2, 0.58–0.93x at 3.
fn min_rows_q8(n_out: usize, n_in: usize) -> usize {
    match (n_out, n_in) {
        (_, 1025..) => 4,
        (4096.., _) => 2,
        _ => 3,
    }
}

/// A matrix's first `16 · groups` outputs in the tile layout: a [`super::Q4Matrix`]'s (see the
/// module) or a [`super::Q8Matrix`]'s, whose signed bytes are stored as the tiles take them.
#[derive(Debug, Clone)]
pub(super) struct AmxTiles {
    groups: usize,
    /// Calls of enough rows take AMX ([`Isa::amx`] of the matrix it was built for); else all
    /// run with `vpdpbusd` ([`AmxTiles::rows_vnni`]).
    amx: bool,
    /// Q8_0 (signed weights, no offset term) rather than 4-bit.
    signed: bool,
    weights: Vec<u8>, // (group, block, 256 packed) or, signed, (group, block, 512)
    d: Vec<f32>,      // Q8_0: (group, block, 16), the block scales; empty for 4-bit
    /// 4-bit: per group and block the 16 outputs' d, then (without `offset`) their m, as the
    /// file's f16 values.
    dm: Vec<f16>,
    /// Q4_0's m = offset · d, computed as the row kernels compute it.
    offset: Option<f32>,
    /// Q4_K and Q5_K: the super-blocks' scales instead of `dm`.
    sup: Option<SuperScales>,
    /// The 5-bit formats: per group and block 64 bytes, bit t of byte p the fifth bit of the
    /// weight tile's row t, byte p (empty for 4-bit weights). Only `vpdpbusd` runs these.
    fifth: Vec<u8>,
    /// The accumulator lane of each block: its place in its chunk.
    lanes: Vec<u8>,
}

/// Q4_K's scales in tile order: a block's d is its super-block's d times its 6-bit scale, its m
/// minus the super-block's dmin times its 6-bit min, computed as the row kernels compute them.
#[derive(Debug, Clone)]
struct SuperScales {
    d: Vec<f32>,    // (group, super-block, 16)
    dmin: Vec<f32>, // (group, super-block, 16)
    sc: Vec<u8>,    // (group, block, 16)
    mn: Vec<u8>,    // (group, block, 16)
}

/// Whether this process can run AMX: the CPU has AMX-TILE and AMX-INT8, and Linux granted the
/// tile state (it does only on request, per process; asked once, by the first [`Isa`] whose
/// kernel path would use AMX).
pub(super) fn granted() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| cpu_has_amx_int8() && request_tile_state())
}

fn cpu_has_amx_int8() -> bool {
    // CPUID leaf 7, sub-leaf 0: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
    #[allow(unused_unsafe)]
    let (max_leaf, edx) = unsafe { (__cpuid(0).eax, __cpuid_count(7, 0).edx) };
    max_leaf >= 7 && edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: true when the kernel granted it.
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: a plain system call; it reads and writes no memory of ours.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => ret, in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

impl AmxTiles {
    /// From GGML Q4 bytes (`block_bytes` 20 for Q4_1, 18 for Q4_0: the 16 quant bytes last) and
    /// the blocks' d and m; `None` where `isa` has no tiles or there is no whole group.
    pub(super) fn from_q4_ggml(
        isa: Isa,
        bytes: &[u8],
        n_out: usize,
        n_in: usize,
        block_bytes: usize,
        scales: &super::Scales,
    ) -> Option<AmxTiles> {
        let (groups, nb) = (n_out / TILE_OUTS, n_in / BLOCK);
        if !isa.tiles() || groups == 0 || nb == 0 {
            return None;
        }
        let offset = match scales {
            super::Scales::Centered { offset, .. } => Some(*offset),
            _ => None,
        };
        let mut out = AmxTiles {
            groups,
            amx: isa.amx(),
            signed: false,
            weights: vec![0; groups * nb * PACKED_BYTES],
            d: Vec::new(),
            dm: Vec::with_capacity(groups * nb * TILE_OUTS * if offset.is_some() { 1 } else { 2 }),
            offset,
            sup: None,
            fifth: Vec::new(),
            lanes: lanes(nb),
        };
        // A block's f16 d at its start, then (Q4_1) its f16 m.
        let half = |o: usize, b: usize, at: usize| {
            let i = (o * nb + b) * block_bytes + at;
            f16::from_le_bytes([bytes[i], bytes[i + 1]])
        };
        for (gb, dst) in out.weights.chunks_exact_mut(PACKED_BYTES).enumerate() {
            let (g, b) = (gb / nb, gb % nb);
            for (p, byte) in dst.iter_mut().enumerate() {
                let (o, k) = (g * TILE_OUTS + p % 64 / 4, 4 * (p / 64) + p % 4);
                *byte = bytes[(o * nb + b) * block_bytes + block_bytes - 16 + k];
            }
            out.dm.extend((0..TILE_OUTS).map(|n| half(g * TILE_OUTS + n, b, 0)));
            if offset.is_none() {
                out.dm.extend((0..TILE_OUTS).map(|n| half(g * TILE_OUTS + n, b, 2)));
            }
        }
        Some(out)
    }

    /// From a 4- or 5-bit matrix's quants (`quants_row(o)`: output o's, 0..15 or, `five`, 0..31,
    /// in plain order) and its scales; `None` where `isa` has no tiles or there is no whole group.
    pub(super) fn from_quants(
        isa: Isa,
        n_out: usize,
        n_in: usize,
        quants_row: impl Fn(usize) -> Vec<u8>,
        scales: &super::Scales,
        five: bool,
    ) -> Option<AmxTiles> {
        let (groups, nb) = (n_out / TILE_OUTS, n_in / BLOCK);
        let ns = nb / GROUP_BLOCKS;
        if !isa.tiles() || groups == 0 || nb == 0 {
            return None;
        }
        let mut t = AmxTiles {
            groups,
            amx: isa.amx(),
            signed: false,
            weights: vec![0u8; groups * nb * PACKED_BYTES],
            d: Vec::new(),
            dm: Vec::new(),
            offset: None,
            sup: None,
            fifth: if five { vec![0u8; groups * nb * FIFTH_BYTES] } else { Vec::new() },
            lanes: lanes(nb),
        };
        let mut sup = SuperScales { d: Vec::new(), dmin: Vec::new(), sc: Vec::new(), mn: Vec::new() };
        for g in 0..groups {
            let rows: Vec<Vec<u8>> = (0..TILE_OUTS).map(|n| quants_row(g * TILE_OUTS + n)).collect();
            for b in 0..nb {
                let tile = &mut t.weights[(g * nb + b) * PACKED_BYTES..][..PACKED_BYTES];
                for (p, byte) in tile.iter_mut().enumerate() {
                    // As a GGML 4-bit block stores them: weight k in the low nibble, k + 16 in the high.
                    let (q, k) = (&rows[p % 64 / 4], b * BLOCK + 4 * (p / 64) + p % 4);
                    *byte = (q[k] & 0x0F) | (q[k + 16] << 4);
                }
                if five {
                    let plane = &mut t.fifth[(g * nb + b) * FIFTH_BYTES..][..FIFTH_BYTES];
                    for (p, byte) in plane.iter_mut().enumerate() {
                        let (q, k) = (&rows[p / 4], b * BLOCK + p % 4);
                        *byte = (0..8).fold(0, |acc, row| acc | (q[k + 4 * row] >> 4 & 1) << row);
                    }
                }
                let at = |n: usize| (g * TILE_OUTS + n) * nb + b;
                match scales {
                    super::Scales::Super { sc, mn, .. } => {
                        sup.sc.extend((0..TILE_OUTS).map(|n| sc[at(n)]));
                        sup.mn.extend((0..TILE_OUTS).map(|n| mn[at(n)]));
                    }
                    super::Scales::Block { d, m } => {
                        t.dm.extend((0..TILE_OUTS).map(|n| d[at(n)]));
                        t.dm.extend((0..TILE_OUTS).map(|n| m[at(n)]));
                    }
                    super::Scales::Centered { d, .. } => t.dm.extend((0..TILE_OUTS).map(|n| d[at(n)])),
                }
            }
            if let super::Scales::Super { d, dmin, .. } = scales {
                for s in 0..ns {
                    sup.d.extend((0..TILE_OUTS).map(|n| d[(g * TILE_OUTS + n) * ns + s]));
                    sup.dmin.extend((0..TILE_OUTS).map(|n| dmin[(g * TILE_OUTS + n) * ns + s]));
                }
            }
        }
        match scales {
            super::Scales::Super { .. } => t.sup = Some(sup),
            super::Scales::Centered { offset, .. } => t.offset = Some(*offset),
            super::Scales::Block { .. } => {}
        }
        Some(t)
    }

    /// Bytes this layout holds.
    pub(super) fn bytes(&self) -> usize {
        let sup = self.sup.as_ref().map_or(0, |p| 4 * (p.d.len() + p.dmin.len()) + p.sc.len() + p.mn.len());
        self.weights.len() + 4 * self.d.len() + 2 * self.dm.len() + sup + self.fifth.len() + self.lanes.len()
    }

    /// Whether a call of `n_rows` rows runs on AMX itself (else, 4-bit, on [`AmxTiles::rows_vnni`]).
    pub(super) fn takes_amx(&self, n_rows: usize, n_in: usize) -> bool {
        self.amx
            && match self.signed {
                true => n_rows >= min_rows_q8(self.groups * TILE_OUTS, n_in),
                // The 5-bit tiles' fifth bits are read by `vpdpbusd` alone.
                false => self.fifth.is_empty() && n_rows >= min_rows_q4(n_in),
            }
    }

    /// Whether the layout holds all of a matrix's `n_out` outputs (whole groups, nothing left).
    pub(super) fn covers(&self, n_out: usize) -> bool {
        self.groups * TILE_OUTS == n_out
    }

    /// 4-bit: output `o`'s d and m of block `b` (of `nb`), as the row kernels compute them.
    pub(super) fn d_m_of(&self, o: usize, b: usize, nb: usize) -> (f32, f32) {
        let (g, n) = (o / TILE_OUTS, o % TILE_OUTS);
        if let Some(p) = &self.sup {
            let (ns, s) = (nb / GROUP_BLOCKS, b / GROUP_BLOCKS);
            let (at, at_s) = ((g * nb + b) * TILE_OUTS + n, (g * ns + s) * TILE_OUTS + n);
            return (p.d[at_s] * p.sc[at] as f32, -p.dmin[at_s] * p.mn[at] as f32);
        }
        let at = (g * nb + b) * self.dm_stride() + n;
        let d = self.dm[at].to_f32();
        match self.offset {
            Some(offset) => (d, offset * d),
            None => (d, self.dm[at + TILE_OUTS].to_f32()),
        }
    }

    /// 4- or 5-bit: output `o`'s quants (0..15 or 0..31) in plain order, `n_in` of them.
    pub(super) fn quants_row(&self, o: usize, n_in: usize) -> Vec<u8> {
        let (g, n, nb) = (o / TILE_OUTS, o % TILE_OUTS, n_in / BLOCK);
        let mut out = vec![0u8; n_in];
        for (b, block) in out.chunks_exact_mut(BLOCK).enumerate() {
            let tile = &self.weights[(g * nb + b) * PACKED_BYTES..][..PACKED_BYTES];
            for (p, &byte) in tile.iter().enumerate().filter(|(p, _)| p % 64 / 4 == n) {
                let k = 4 * (p / 64) + p % 4;
                (block[k], block[k + 16]) = (byte & 0x0F, byte >> 4);
            }
            if !self.fifth.is_empty() {
                let plane = &self.fifth[(g * nb + b) * FIFTH_BYTES..][..FIFTH_BYTES];
                for (p, &byte) in plane.iter().enumerate().filter(|(p, _)| p / 4 == n) {
                    for row in 0..8 {
                        block[4 * row + p % 4] |= (byte >> row & 1) << 4;
                    }
                }
            }
        }
        out
    }

    /// From Q8_0 block scales `(n_out, n_in / 32)` and each output's weights in plain order;
    /// `None` where `isa` has no tiles or there is no whole group.
    pub(super) fn from_q8(
        isa: Isa,
        n_out: usize,
        n_in: usize,
        scales: &[f32],
        plain_row: impl Fn(usize) -> Vec<i8>,
    ) -> Option<AmxTiles> {
        let (groups, nb) = (n_out / TILE_OUTS, n_in / BLOCK);
        if !isa.tiles() || groups == 0 || nb == 0 {
            return None;
        }
        let mut out = AmxTiles {
            groups,
            amx: isa.amx(),
            signed: true,
            weights: vec![0; groups * nb * TILE_BYTES],
            d: Vec::new(),
            dm: Vec::new(),
            offset: None,
            sup: None,
            fifth: Vec::new(),
            lanes: lanes(nb),
        };
        for g in 0..groups {
            let rows: Vec<Vec<i8>> = (0..TILE_OUTS).map(|n| plain_row(g * TILE_OUTS + n)).collect();
            for b in 0..nb {
                let tile = &mut out.weights[(g * nb + b) * TILE_BYTES..][..TILE_BYTES];
                for (p, w) in tile.iter_mut().enumerate() {
                    // Row t of the tile: weights 4t..4t + 3 of each of the 16 outputs.
                    *w = rows[p % 64 / 4][b * BLOCK + 4 * (p / 64) + p % 4] as u8;
                }
                out.d.extend((0..TILE_OUTS).map(|n| scales[(g * TILE_OUTS + n) * nb + b]));
            }
        }
        Some(out)
    }

    /// Q8_0: output `o`'s weights in plain order and its block scales, `n_in` wide.
    pub(super) fn q8_row(&self, o: usize, n_in: usize) -> (Vec<i8>, Vec<f32>) {
        let (g, n, nb) = (o / TILE_OUTS, o % TILE_OUTS, n_in / BLOCK);
        let mut w = vec![0i8; n_in];
        for (b, block) in w.chunks_exact_mut(BLOCK).enumerate() {
            let tile = &self.weights[(g * nb + b) * TILE_BYTES..][..TILE_BYTES];
            for t in 0..BLOCK / 4 {
                for k in 0..4 {
                    block[4 * t + k] = tile[64 * t + 4 * n + k] as i8;
                }
            }
        }
        let scales = (0..nb).map(|b| self.d[(g * nb + b) * TILE_OUTS + n]).collect();
        (w, scales)
    }

    /// The layouts of matrices stacked one after another, where each has one and whole groups
    /// only (so that the groups follow each other as the outputs do).
    pub(super) fn stack(parts: &[Option<&AmxTiles>], n_outs: &[usize]) -> Option<AmxTiles> {
        let parts: Vec<&AmxTiles> = parts.iter().copied().collect::<Option<_>>()?;
        if parts.is_empty()
            || n_outs.iter().zip(&parts).any(|(&n, p)| {
                n != p.groups * TILE_OUTS
                    || p.amx != parts[0].amx
                    || p.lanes != parts[0].lanes
                    || p.signed != parts[0].signed
                    || p.offset != parts[0].offset
                    || p.sup.is_some() != parts[0].sup.is_some()
                    || p.fifth.is_empty() != parts[0].fifth.is_empty()
            })
        {
            return None;
        }
        Some(AmxTiles {
            groups: parts.iter().map(|p| p.groups).sum(),
            amx: parts[0].amx,
            signed: parts[0].signed,
            weights: concat(parts.iter().map(|p| &p.weights[..])),
            d: concat(parts.iter().map(|p| &p.d[..])),
            dm: concat(parts.iter().map(|p| &p.dm[..])),
            offset: parts[0].offset,
            sup: parts[0].sup.as_ref().map(|_| {
                let sups: Vec<&SuperScales> = parts.iter().filter_map(|p| p.sup.as_ref()).collect();
                SuperScales {
                    d: concat(sups.iter().map(|p| &p.d[..])),
                    dmin: concat(sups.iter().map(|p| &p.dmin[..])),
                    sc: concat(sups.iter().map(|p| &p.sc[..])),
                    mn: concat(sups.iter().map(|p| &p.mn[..])),
                }
            }),
            fifth: concat(parts.iter().map(|p| &p.fifth[..])),
            lanes: parts[0].lanes.clone(),
        })
    }

    /// Outputs from `outs.start` (a multiple of 16) in whole groups, for all activation rows,
    /// written into `y` (row-major, `n_out` wide); returns how many outputs it did (0 where `outs`
    /// does not start a group).
    ///
    /// Safety: the layout exists, so the CPU has the 512-bit VNNI kernels (AVX-512 F, BW and
    /// VNNI), and AMX ([`granted`]) where [`AmxTiles::takes_amx`] says the call takes it (both
    /// from the [`Isa`] it was built for); for Q8_0 calls that AMX does not take, `xq` holds its
    /// [`Q8Rows::plain_u8`]; `y` holds `xq.n_rows · n_out` floats, and nothing else writes these
    /// outputs' columns meanwhile.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    pub(super) unsafe fn rows(
        &self,
        n_in: usize,
        outs: std::ops::Range<usize>,
        xq: &Q8Rows,
        y: *mut f32,
        n_out: usize,
    ) -> usize {
        if !self.takes_amx(xq.n_rows, n_in) {
            return match self.signed {
                true => self.rows_vnni::<true>(n_in, outs, xq, y, n_out),
                false => self.rows_vnni::<false>(n_in, outs, xq, y, n_out),
            };
        }
        if self.signed {
            self.rows_of::<true>(n_in, outs, xq, y, n_out)
        } else {
            self.rows_of::<false>(n_in, outs, xq, y, n_out)
        }
    }

    /// [`AmxTiles::rows`] for Q8_0 (`SIGNED`) or 4-bit weights.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    unsafe fn rows_of<const SIGNED: bool>(
        &self,
        n_in: usize,
        outs: std::ops::Range<usize>,
        xq: &Q8Rows,
        y: *mut f32,
        n_out: usize,
    ) -> usize {
        let Some((g0, g1, nb)) = self.whole_groups(&outs, n_in, xq.n_rows) else { return 0 };
        let pairs = xq.tile_pairs.len() == xq.n_rows * n_in * 2 && xq.n_rows <= MAX_PAIR_ROWS && nb.is_multiple_of(2);
        SCRATCH.with_borrow_mut(|work| {
            let ring = work.ring.as_mut_ptr() as *mut u8;
            let steps = (g1 - g0) * nb;
            // Rows in near-equal tiles of up to 16.
            let n_tiles = xq.n_rows.div_ceil(TILE_ROWS);
            let mut r0 = 0;
            for t in 0..n_tiles {
                let rows = (xq.n_rows - r0).div_ceil(n_tiles - t);
                configure(rows, pairs);
                for s in 0..AHEAD.min(steps) {
                    if !SIGNED {
                        unpack(self.packed(g0 * nb + s), ring.add(s % RING * TILE_BYTES));
                    }
                }
                for g in g0..g1 {
                    let at = Step { g, first: (g - g0) * nb, steps, base: g0 * nb, r0, rows, nb };
                    if pairs {
                        self.group::<SIGNED, true>(at, xq, ring, &mut work.sums, &mut work.acc, y, n_out);
                    } else {
                        self.group::<SIGNED, false>(at, xq, ring, &mut work.sums, &mut work.acc, y, n_out);
                    }
                }
                r0 += rows;
            }
        });
        (g1 - g0) * TILE_OUTS
    }

    /// [`AmxTiles::rows`] where AMX does not take the call (no AMX, or too few rows for it) and
    /// the CPU has AVX-512 VNNI: the same tile layout and the same float steps in the same order
    /// (so the results are the row kernel's bit for bit), with each block's 16 outputs' integer
    /// sums from 8 `vpdpbusd`s per row (a tile row of weights against 4 activations broadcast).
    /// The float work per block is then shared by 16 outputs, where the row kernel does it per
    /// output; the weights of a block are unpacked once for up to 16 rows. Q8_0 (`SIGNED`): the
    /// activations + 128 ([`Q8Rows::plain_u8`], filled by the caller) are the unsigned operand,
    /// and 128 · Σ w, summed once per block for all rows, is taken off again (exact in i32).
    ///
    /// Safety: as [`AmxTiles::rows`], and the CPU has AVX-512 VNNI.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
    unsafe fn rows_vnni<const SIGNED: bool>(
        &self,
        n_in: usize,
        outs: std::ops::Range<usize>,
        xq: &Q8Rows,
        y: *mut f32,
        n_out: usize,
    ) -> usize {
        let Some((g0, g1, nb)) = self.whole_groups(&outs, n_in, xq.n_rows) else { return 0 };
        debug_assert!(!SIGNED || xq.plain_u8.len() == xq.n_rows * n_in, "Q8_0 tiles read the activations + 128");
        SCRATCH.with_borrow_mut(|work| {
            let acc = &mut work.acc;
            let (mask, ones) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(1));
            for r0 in (0..xq.n_rows).step_by(TILE_ROWS) {
                let rows = (xq.n_rows - r0).min(TILE_ROWS);
                for g in g0..g1 {
                    for a in acc.iter_mut().take(rows) {
                        *a = [_mm512_setzero_ps(); 8];
                    }
                    for b in 0..nb {
                        // Tile row t: weights 4t..4t + 3 of each of the 16 outputs.
                        let mut w = [_mm512_setzero_si512(); 8];
                        let (d, m, offset) = if SIGNED {
                            let src = self.weights.as_ptr().add((g * nb + b) * TILE_BYTES);
                            // The weights stream from memory: ask for them ahead.
                            for (t, wt) in w.iter_mut().enumerate() {
                                super::prefetch_ahead(src.add(64 * t), super::PREFETCH_BYTES);
                                *wt = _mm512_loadu_si512(src.add(64 * t) as *const _);
                            }
                            let sum = w.iter().fold(_mm512_setzero_si512(), |s, &wt| _mm512_dpbusd_epi32(s, ones, wt));
                            let d = _mm512_loadu_ps(self.d.as_ptr().add((g * nb + b) * TILE_OUTS));
                            (d, _mm512_setzero_ps(), _mm512_slli_epi32::<7>(sum))
                        } else {
                            let src = self.packed(g * nb + b);
                            // The weights stream from memory: ask for them, and for their scales, ahead.
                            for line in 0..PACKED_BYTES / 64 {
                                super::prefetch_ahead(src.add(64 * line), super::PREFETCH_BYTES);
                            }
                            let ahead = super::PREFETCH_BYTES / PACKED_BYTES * self.dm_stride() * 2;
                            super::prefetch_ahead(
                                self.dm.as_ptr().wrapping_add((g * nb + b) * self.dm_stride()) as *const u8,
                                ahead,
                            );
                            for i in 0..4 {
                                let raw = _mm512_loadu_si512(src.add(64 * i) as *const _);
                                w[i] = _mm512_and_si512(raw, mask);
                                w[4 + i] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), mask);
                            }
                            if !self.fifth.is_empty() {
                                add_fifth_bits(self.fifth.as_ptr().add((g * nb + b) * FIFTH_BYTES), &mut w);
                            }
                            let (d, m) = self.d_m(g * nb + b);
                            (d, m, _mm512_setzero_si512())
                        };
                        let lane = self.lanes[b] as usize;
                        let mut r = 0;
                        while r < rows {
                            // Q8_0 reads the activations + 128 ([`Q8Rows::plain_u8`]).
                            let x = match SIGNED {
                                true => xq.plain_u8.as_ptr() as *const i8,
                                false => xq.quants.as_ptr(),
                            }
                            .add((r0 + r) * n_in + b * BLOCK);
                            let at_row = (r0 + r) * nb + b;
                            let (xs, ms) = (xq.scales.as_ptr().add(at_row), xq.scaled_sums.as_ptr().add(at_row));
                            let acc = acc.as_mut_ptr().add(r);
                            let block = Block { w: &w, d, m, offset };
                            r += match rows - r {
                                1 => scale_rows::<1, SIGNED>(block, x, n_in, (xs, ms, nb), acc, lane),
                                2 => scale_rows::<2, SIGNED>(block, x, n_in, (xs, ms, nb), acc, lane),
                                3 => scale_rows::<3, SIGNED>(block, x, n_in, (xs, ms, nb), acc, lane),
                                _ => scale_rows::<4, SIGNED>(block, x, n_in, (xs, ms, nb), acc, lane),
                            };
                        }
                    }
                    for (r, a) in acc.iter().enumerate().take(rows) {
                        store_lanes(a, y.add((r0 + r) * n_out + g * TILE_OUTS));
                    }
                }
            }
        });
        (g1 - g0) * TILE_OUTS
    }

    /// 4-bit: the f16 values per group and block in `dm` (d, and m without `offset`).
    fn dm_stride(&self) -> usize {
        if self.offset.is_some() {
            TILE_OUTS
        } else {
            2 * TILE_OUTS
        }
    }

    /// 4-bit: the 16 outputs' d and m of block `gb % nb` of group `gb / nb`, in f32.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    #[inline]
    unsafe fn d_m(&self, gb: usize) -> (__m512, __m512) {
        if let Some(p) = &self.sup {
            // `ScaleSrc::lanes`' products: d_s · sc and (−dmin_s) · mn.
            let nb = self.lanes.len();
            let s = gb / nb * (nb / GROUP_BLOCKS) + gb % nb / GROUP_BLOCKS;
            let bytes = |v: &[u8]| {
                let x = _mm_loadu_si128(v.as_ptr().add(gb * TILE_OUTS) as *const __m128i);
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(x))
            };
            let d = _mm512_loadu_ps(p.d.as_ptr().add(s * TILE_OUTS));
            let dmin = _mm512_loadu_ps(p.dmin.as_ptr().add(s * TILE_OUTS));
            let neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(dmin), _mm512_set1_epi32(i32::MIN)));
            return (_mm512_mul_ps(d, bytes(&p.sc)), _mm512_mul_ps(neg, bytes(&p.mn)));
        }
        let at = self.dm.as_ptr().add(gb * self.dm_stride());
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i));
        let m = match self.offset {
            Some(offset) => _mm512_mul_ps(_mm512_set1_ps(offset), d),
            None => _mm512_cvtph_ps(_mm256_loadu_si256(at.add(TILE_OUTS) as *const __m256i)),
        };
        (d, m)
    }

    /// The whole groups of 16 outputs a call over `outs` does, and the blocks per row: none where
    /// `outs` does not start a group, or there is nothing to do.
    fn whole_groups(&self, outs: &std::ops::Range<usize>, n_in: usize, n_rows: usize) -> Option<(usize, usize, usize)> {
        whole_groups(outs, self.groups, n_in, n_rows)
    }

    /// Block `gb % nb` of group `gb / nb` as stored.
    #[inline]
    unsafe fn packed(&self, gb: usize) -> *const u8 {
        self.weights.as_ptr().add(gb * PACKED_BYTES)
    }

    /// Outputs `16 · g ..` for activation rows `r0 .. r0 + rows` into `y`. The call's blocks are
    /// one sequence of `steps` (this group's start at `first`, the call's first block at `base`
    /// of the stored ones): block s's weight tile is in ring slot s % RING, unpacked AHEAD
    /// blocks before. Two tile sets take turns (storing a tile right after its multiply, one set
    /// at a time, measured 1.7x slower for 1 row). With `PAIR`, each multiply takes two blocks
    /// (see [`Q8Rows::tile_pairs`]).
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn group<const SIGNED: bool, const PAIR: bool>(
        &self,
        at: Step,
        xq: &Q8Rows,
        ring: *mut u8,
        sums: &mut Sums,
        acc: &mut Accumulators,
        y: *mut f32,
        n_out: usize,
    ) {
        let Step { g, first, steps, base, r0, rows, nb } = at;
        let n_in = nb * BLOCK;
        let span = if PAIR { 2 } else { 1 };
        for a in acc.iter_mut().take(rows) {
            *a = [_mm512_setzero_ps(); 8];
        }
        // The activation tile of step i: rows of one block, or a pair's 2 · rows rows of 64 bytes.
        let (x, x_stride) =
            if PAIR { (xq.tile_pairs.as_ptr(), 2 * BLOCK) } else { (xq.quants.as_ptr().add(r0 * n_in), n_in) };
        let x_step = if PAIR { 2 * rows * 2 * BLOCK } else { BLOCK };
        // Step i multiplies its blocks, stores step i − 1's sums and scales step i − 2's: a tile
        // store waits for its multiply, so it comes one multiply later, and the sums are read one
        // store later.
        let n = nb / span;
        for i in 0..n + 2 {
            if i < n {
                let b = span * i;
                let tile = if SIGNED {
                    self.weights.as_ptr().add((g * nb + b) * TILE_BYTES)
                } else {
                    ring.add((first + b) % RING * TILE_BYTES) as *const u8
                };
                match (SIGNED, i % 2) {
                    (true, 0) => tile_mul!("tdpbssd", "0", "2", "4", x.add(i * x_step), x_stride, tile),
                    (true, _) => tile_mul!("tdpbssd", "1", "3", "5", x.add(i * x_step), x_stride, tile),
                    (false, 0) => tile_mul!("tdpbsud", "0", "2", "4", x.add(i * x_step), x_stride, tile),
                    (false, _) => tile_mul!("tdpbsud", "1", "3", "5", x.add(i * x_step), x_stride, tile),
                }
                if !SIGNED {
                    for s in first + b + AHEAD..(first + b + span + AHEAD).min(steps) {
                        unpack(self.packed(base + s), ring.add(s % RING * TILE_BYTES));
                    }
                }
            }
            if (1..=n).contains(&i) {
                let buf = sums.0[(i - 1) % 2].as_mut_ptr();
                if (i - 1) % 2 == 0 {
                    tile_store!("4", buf);
                } else {
                    tile_store!("5", buf);
                }
            }
            if i >= 2 {
                for half in 0..span {
                    // A pair's second block sums in the rows after the first's.
                    let sums = sums.0[i % 2].as_ptr().add(half * rows * TILE_OUTS);
                    self.scale::<SIGNED>(g, span * (i - 2) + half, nb, r0, rows, sums, xq, acc);
                }
            }
        }
        for (r, a) in acc.iter().enumerate().take(rows) {
            store_lanes(a, y.add((r0 + r) * n_out + g * TILE_OUTS));
        }
    }

    /// Block `b`'s sums (row r's 16 outputs at `sums + 16 r`) scaled into the accumulators.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scale<const SIGNED: bool>(
        &self,
        g: usize,
        b: usize,
        nb: usize,
        r0: usize,
        rows: usize,
        sums: *const i32,
        xq: &Q8Rows,
        acc: &mut Accumulators,
    ) {
        let (d, m) = match SIGNED {
            true => (_mm512_loadu_ps(self.d.as_ptr().add((g * nb + b) * TILE_OUTS)), _mm512_setzero_ps()),
            false => self.d_m(g * nb + b),
        };
        let lane = self.lanes[b] as usize;
        for (r, acc) in acc.iter_mut().enumerate().take(rows) {
            let s = _mm512_cvtepi32_ps(_mm512_loadu_si512(sums.add(r * TILE_OUTS) as *const _));
            let xs = xq.scales[(r0 + r) * nb + b];
            let a = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xs)), s, acc[lane]);
            acc[lane] =
                if SIGNED { a } else { _mm512_fmadd_ps(m, _mm512_set1_ps(xq.scaled_sums[(r0 + r) * nb + b]), a) };
        }
    }
}

/// The whole groups of 16 outputs (of a layout's `groups`) a call over `outs` does, and the blocks
/// per row: none where `outs` does not start a group, or there is nothing to do.
pub(super) fn whole_groups(
    outs: &std::ops::Range<usize>,
    groups: usize,
    n_in: usize,
    n_rows: usize,
) -> Option<(usize, usize, usize)> {
    let (g0, g1) = (outs.start / TILE_OUTS, (outs.end / TILE_OUTS).min(groups));
    let nb = n_in / BLOCK;
    (outs.start.is_multiple_of(TILE_OUTS) && g1 > g0 && n_rows > 0 && nb > 0).then_some((g0, g1, nb))
}

/// `f` with this thread's accumulators (up to 16 rows × 8 lanes for 16 outputs), kept between
/// calls.
pub(super) fn with_accumulators<R>(f: impl FnOnce(&mut Accumulators) -> R) -> R {
    SCRATCH.with_borrow_mut(|work| f(&mut work.acc))
}

/// One block's weights for 16 outputs as [`scale_rows`] takes them: the tile rows `w`, the
/// outputs' block scales `d` and offsets `m` (4-bit), and 128 · Σ w (Q8_0).
#[derive(Clone, Copy)]
struct Block<'a> {
    w: &'a [__m512i; 8],
    d: __m512,
    m: __m512,
    offset: __m512i,
}

/// One block of `N` activation rows (quants at `x`, `stride` bytes apart; their scales and scaled
/// sums at `xs` and `ms`, `nb` apart) against 16 outputs' weights, into each row's accumulator
/// `lane` (rows from `acc`): the integer sums from 8 `vpdpbusd`s per row, the rows interleaved so
/// that their dependent chains overlap, then [`AmxTiles::scale`]'s arithmetic step for step.
/// Unsigned (4-bit) weights take the activations as they are; signed (Q8_0) ones are the signed
/// operand, against the activations + 128 (`x` then points into [`Q8Rows::plain_u8`]). Returns
/// `N`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn scale_rows<const N: usize, const SIGNED: bool>(
    block: Block,
    x: *const i8,
    stride: usize,
    (xs, ms, nb): (*const f32, *const f32, usize),
    acc: *mut [__m512; 8],
    lane: usize,
) -> usize {
    let mut s = [_mm512_setzero_si512(); N];
    for (t, &wt) in block.w.iter().enumerate() {
        for (j, sj) in s.iter_mut().enumerate() {
            let xt = (x.add(j * stride + 4 * t) as *const i32).read_unaligned();
            *sj = match SIGNED {
                true => _mm512_dpbusd_epi32(*sj, _mm512_set1_epi32(xt), wt),
                false => _mm512_dpbusd_epi32(*sj, wt, _mm512_set1_epi32(xt)),
            };
        }
    }
    for (j, &sum) in s.iter().enumerate() {
        let a = &mut (*acc.add(j))[lane];
        let sum = if SIGNED { _mm512_sub_epi32(sum, block.offset) } else { sum };
        let ds = _mm512_mul_ps(block.d, _mm512_set1_ps(*xs.add(j * nb)));
        let scaled = _mm512_fmadd_ps(ds, _mm512_cvtepi32_ps(sum), *a);
        *a = if SIGNED { scaled } else { _mm512_fmadd_ps(block.m, _mm512_set1_ps(*ms.add(j * nb)), scaled) };
    }
    N
}

/// The 5-bit weights: each tile row's fifth bits (bit t of the plane's bytes for row t) as bit 4
/// of its quants. (Shifting 16-bit lanes by at most 4 keeps each byte's bit 4 from its own bits.)
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn add_fifth_bits(plane: *const u8, w: &mut [__m512i; 8]) {
    super::prefetch_ahead(plane, super::PREFETCH_BYTES / 4);
    let (bits, bit4) = (_mm512_loadu_si512(plane as *const _), _mm512_set1_epi8(0x10));
    let at_bit4 = [
        _mm512_slli_epi16::<4>(bits),
        _mm512_slli_epi16::<3>(bits),
        _mm512_slli_epi16::<2>(bits),
        _mm512_slli_epi16::<1>(bits),
        bits,
        _mm512_srli_epi16::<1>(bits),
        _mm512_srli_epi16::<2>(bits),
        _mm512_srli_epi16::<3>(bits),
    ];
    for (wt, v) in w.iter_mut().zip(at_bit4) {
        *wt = _mm512_or_si512(*wt, _mm512_and_si512(v, bit4));
    }
}

/// A row's 16 outputs from its 8 lane accumulators, added in `hsum256`'s order
/// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), stored at `y`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store_lanes(a: &[__m512; 8], y: *mut f32) {
    let even = _mm512_add_ps(_mm512_add_ps(a[4], a[0]), _mm512_add_ps(a[6], a[2]));
    let odd = _mm512_add_ps(_mm512_add_ps(a[5], a[1]), _mm512_add_ps(a[7], a[3]));
    _mm512_storeu_ps(y, _mm512_add_ps(even, odd));
}

/// Each block's lane in its chunk.
fn lanes(nb: usize) -> Vec<u8> {
    chunks(nb).flat_map(|(_, size)| 0..size as u8).collect()
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Aligned<T>(T);

/// Where a group's multiplies start (see [`AmxTiles::group`]).
#[derive(Clone, Copy)]
struct Step {
    g: usize,
    first: usize,
    steps: usize,
    base: usize,
    r0: usize,
    rows: usize,
    nb: usize,
}

/// The most activation rows that take blocks in pairs (two blocks' rows fill a 16-row tile).
pub(super) const MAX_PAIR_ROWS: usize = TILE_ROWS / 2;

/// Two tiles of 32-bit sums (16 rows of 16 outputs), taking turns.
type Sums = Aligned<[[i32; TILE_ROWS * TILE_OUTS]; 2]>;
/// Per activation row, the 8 lanes' accumulators for 16 outputs.
pub(super) type Accumulators = [[__m512; 8]; TILE_ROWS];

struct Work {
    /// Unpacked weight tiles, a ring of [`RING`].
    ring: [Aligned<[u8; TILE_BYTES]>; RING],
    sums: Sums,
    acc: Accumulators,
}

thread_local! {
    /// Each thread's buffers, kept between calls (zeroing them per group of 16 outputs was 3%
    /// of a run).
    static SCRATCH: std::cell::RefCell<Work> = const {
        std::cell::RefCell::new(Work {
            ring: [Aligned([0; TILE_BYTES]); RING],
            sums: Aligned([[0; TILE_ROWS * TILE_OUTS]; 2]),
            // SAFETY: all-zero bits are 0.0 in every lane.
            acc: unsafe { std::mem::zeroed() },
        })
    };
    /// The tile shapes this thread loaded last (2 · rows + pairs; 0: none).
    static CONFIGURED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The tile shapes for `rows` activation rows: tiles 0 and 1 the activations (rows × 32 bytes),
/// 2 and 3 the weights (8 × 64: 4 bytes of each of 16 outputs per row), 4 and 5 the sums (rows ×
/// 16 32-bit lanes); for pairs of blocks, twice the rows of activations and sums, 64 bytes of
/// activations per row and 16 rows of weights.
///
/// The configuration stays loaded (no `tilerelease`): loading one costs about as much as a whole
/// call's multiplies for a few outputs, and a thread reloads it only when the shapes change.
#[target_feature(enable = "avx512f")]
unsafe fn configure(rows: usize, pairs: bool) {
    let key = rows * 2 + pairs as usize;
    if CONFIGURED.get() == key {
        return;
    }
    CONFIGURED.set(key);
    #[repr(C, align(64))]
    struct Config {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }
    let mut c = Config { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    let span = if pairs { 2 } else { 1 };
    for t in 0..6 {
        (c.colsb[t], c.rows[t]) = match t {
            0 | 1 => ((span * BLOCK) as u16, (span * rows) as u8),
            2 | 3 => (64, (span * 8) as u8),
            _ => (64, (span * rows) as u8),
        };
    }
    // SAFETY: reads the 64-byte configuration.
    asm!("ldtilecfg [{}]", in(reg) &c as *const Config, options(nostack, readonly));
}

/// One block's 256 stored bytes into the 512 bytes of its weight tile (low nibbles, then high).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn unpack(src: *const u8, dst: *mut u8) {
    let mask = _mm512_set1_epi8(0x0F);
    for i in 0..4 {
        let raw = _mm512_loadu_si512(src.add(64 * i) as *const _);
        _mm512_store_si512(dst.add(64 * i) as *mut _, _mm512_and_si512(raw, mask));
        _mm512_store_si512(dst.add(256 + 64 * i) as *mut _, _mm512_and_si512(_mm512_srli_epi16::<4>(raw), mask));
    }
}
