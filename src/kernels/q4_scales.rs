//! The per-block scales and offsets of a 4-bit matrix: f32 per block (Q4_0, Q4_1) or Q4_K's
//! compact super-block form, and the raw pointers the x86 kernels read them through.

use super::*;

/// The blocks' scales d and offsets m: f32 per block (Q4_0, Q4_1), or as Q4_K stores them, per
/// super-block of 8 blocks an f32 `d` and `dmin` and per block a 6-bit scale and min. `d · scale`
/// and `−dmin · min` are exact in f32, so both give the same values; the second takes 2 bytes per
/// block instead of 8, which keeps a Q4_K matrix within 6% of the file's size.
#[derive(Debug, Clone)]
pub(super) enum Scales {
    /// `(n_out, n_in / 32)` each.
    Block { d: Vec<f32>, m: Vec<f32> },
    /// `d`, `dmin`: `(n_out, n_in / 256)`; `sc`, `mn`: `(n_out, n_in / 32)`.
    Super { d: Vec<f32>, dmin: Vec<f32>, sc: Vec<u8>, mn: Vec<u8> },
}

impl Scales {
    /// Block `i`'s (counted over the whole matrix) d and m.
    #[inline(always)]
    pub(super) fn get(&self, i: usize) -> (f32, f32) {
        match self {
            Scales::Block { d, m } => (d[i], m[i]),
            Scales::Super { d, dmin, sc, mn } => {
                let s = i / GROUP_BLOCKS;
                (d[s] * sc[i] as f32, -dmin[s] * mn[i] as f32)
            }
        }
    }

    /// The parts' scales one after another, if they are all of one kind.
    pub(super) fn stack(parts: &[&Scales]) -> Option<Scales> {
        fn cat<T: Copy>(parts: &[&Vec<T>]) -> Vec<T> {
            concat(parts.iter().map(|v| &v[..]))
        }
        let blocks: Option<Vec<_>> =
            parts.iter().map(|s| if let Scales::Block { d, m } = s { Some((d, m)) } else { None }).collect();
        if let Some(b) = blocks {
            let (d, m): (Vec<_>, Vec<_>) = b.into_iter().unzip();
            return Some(Scales::Block { d: cat(&d), m: cat(&m) });
        }
        let supers: Vec<_> = parts
            .iter()
            .map(|s| if let Scales::Super { d, dmin, sc, mn } = s { Some((d, dmin, sc, mn)) } else { None })
            .collect::<Option<_>>()?;
        Some(Scales::Super {
            d: cat(&supers.iter().map(|p| p.0).collect::<Vec<_>>()),
            dmin: cat(&supers.iter().map(|p| p.1).collect::<Vec<_>>()),
            sc: cat(&supers.iter().map(|p| p.2).collect::<Vec<_>>()),
            mn: cat(&supers.iter().map(|p| p.3).collect::<Vec<_>>()),
        })
    }

    /// Only the given rows (of `nb` blocks each), in that order.
    pub(super) fn select_rows(&self, rows: &[u32], nb: usize) -> Option<Scales> {
        fn pick<T: Copy>(v: &[T], rows: &[u32], per_row: usize) -> Option<Vec<T>> {
            let mut out = Vec::with_capacity(rows.len() * per_row);
            for &r in rows {
                out.extend_from_slice(v.get(r as usize * per_row..(r as usize + 1) * per_row)?);
            }
            Some(out)
        }
        Some(match self {
            Scales::Block { d, m } => Scales::Block { d: pick(d, rows, nb)?, m: pick(m, rows, nb)? },
            Scales::Super { d, dmin, sc, mn } => Scales::Super {
                d: pick(d, rows, nb / GROUP_BLOCKS)?,
                dmin: pick(dmin, rows, nb / GROUP_BLOCKS)?,
                sc: pick(sc, rows, nb)?,
                mn: pick(mn, rows, nb)?,
            },
        })
    }
}

/// Raw pointers to a matrix's scales, for the x86 kernels' inner loops.
#[cfg(target_arch = "x86_64")]
pub(super) struct ScaleSrc {
    /// Per block d (`Block`), or per super-block d (`Super`).
    d: *const f32,
    /// Per block m, or per super-block dmin.
    m: *const f32,
    /// Per block 6-bit scales and mins (`Super` only).
    sc: *const u8,
    mn: *const u8,
}

#[cfg(target_arch = "x86_64")]
impl ScaleSrc {
    pub(super) fn new(s: &Scales) -> ScaleSrc {
        match s {
            Scales::Block { d, m } => {
                ScaleSrc { d: d.as_ptr(), m: m.as_ptr(), sc: std::ptr::null(), mn: std::ptr::null() }
            }
            Scales::Super { d, dmin, sc, mn } => {
                ScaleSrc { d: d.as_ptr(), m: dmin.as_ptr(), sc: sc.as_ptr(), mn: mn.as_ptr() }
            }
        }
    }

    /// The d and m of blocks `i ..` (counted over the whole matrix) as 8 lanes, zeros after
    /// `SIZE` blocks; `SUPER` says which kind of scales the pointers are (a super-block's always
    /// fill a whole chunk). Safety: `i` is a block of the matrix the pointers came from.
    #[inline(always)]
    pub(super) unsafe fn lanes<const SIZE: usize, const SUPER: bool>(
        &self,
        i: usize,
    ) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        if SUPER {
            let bytes =
                |p: *const u8| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(i) as *const __m128i)));
            let s = i / GROUP_BLOCKS;
            (
                _mm256_mul_ps(_mm256_set1_ps(*self.d.add(s)), bytes(self.sc)),
                _mm256_mul_ps(_mm256_set1_ps(-*self.m.add(s)), bytes(self.mn)),
            )
        } else {
            (first_ps(self.d.add(i), SIZE), first_ps(self.m.add(i), SIZE))
        }
    }
}
