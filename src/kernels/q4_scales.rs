//! The per-block scales and offsets of a 4- or 5-bit matrix: the file's f16 values, or the K
//! formats' compact super-block form, and the raw pointers the x86 kernels read them through.

use super::*;
use half::f16;

/// The blocks' scales d and offsets m, as the file stores them: f16 per block (Q4_1, Q5_1), f16
/// d alone where m is a fixed multiple of it (Q4_0, Q5_0), or as the K formats store them, per
/// super-block of 8 blocks an f32 `d` and `dmin` and per block a 6-bit scale and min. Each
/// reads back as the f32 values GGML computes with (`d · scale` and `−dmin · min` are exact in
/// f32), and takes 2 to 4 bytes per block instead of 8.
#[derive(Debug, Clone)]
pub(super) enum Scales {
    /// `(n_out, n_in / 32)` each.
    Block { d: Vec<f16>, m: Vec<f16> },
    /// `d`: `(n_out, n_in / 32)`; m = `offset · d` (−8 or −16, exact in f32).
    Centered { d: Vec<f16>, offset: f32 },
    /// `d`, `dmin`: `(n_out, n_in / 256)`; `sc`, `mn`: `(n_out, n_in / 32)`.
    Super { d: Vec<f32>, dmin: Vec<f32>, sc: Vec<u8>, mn: Vec<u8> },
}

impl Scales {
    /// Block `i`'s (counted over the whole matrix) d and m.
    #[inline(always)]
    pub(super) fn get(&self, i: usize) -> (f32, f32) {
        match self {
            Scales::Block { d, m } => (d[i].to_f32(), m[i].to_f32()),
            Scales::Centered { d, offset } => (d[i].to_f32(), offset * d[i].to_f32()),
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
        let (first, rest) = parts.split_first()?;
        Some(match first {
            Scales::Block { .. } => {
                let all: Vec<_> = parts
                    .iter()
                    .map(|s| if let Scales::Block { d, m } = s { Some((d, m)) } else { None })
                    .collect::<Option<_>>()?;
                let (d, m): (Vec<_>, Vec<_>) = all.into_iter().unzip();
                Scales::Block { d: cat(&d), m: cat(&m) }
            }
            Scales::Centered { offset, .. } => {
                let same = |s: &&Scales| matches!(s, Scales::Centered { offset: o, .. } if o == offset);
                if !rest.iter().all(same) {
                    return None;
                }
                let d: Vec<_> = parts
                    .iter()
                    .filter_map(|s| if let Scales::Centered { d, .. } = s { Some(d) } else { None })
                    .collect();
                Scales::Centered { d: cat(&d), offset: *offset }
            }
            Scales::Super { .. } => {
                let supers: Vec<_> = parts
                    .iter()
                    .map(|s| if let Scales::Super { d, dmin, sc, mn } = s { Some((d, dmin, sc, mn)) } else { None })
                    .collect::<Option<_>>()?;
                Scales::Super {
                    d: cat(&supers.iter().map(|p| p.0).collect::<Vec<_>>()),
                    dmin: cat(&supers.iter().map(|p| p.1).collect::<Vec<_>>()),
                    sc: cat(&supers.iter().map(|p| p.2).collect::<Vec<_>>()),
                    mn: cat(&supers.iter().map(|p| p.3).collect::<Vec<_>>()),
                }
            }
        })
    }

    /// Only the given rows (of `nb` blocks each), in that order.
    pub(super) fn select_rows(&self, rows: &[u32], nb: usize) -> Option<Scales> {
        Some(match self {
            Scales::Block { d, m } => Scales::Block { d: pick_rows(d, rows, nb)?, m: pick_rows(m, rows, nb)? },
            Scales::Centered { d, offset } => Scales::Centered { d: pick_rows(d, rows, nb)?, offset: *offset },
            Scales::Super { d, dmin, sc, mn } => Scales::Super {
                d: pick_rows(d, rows, nb / GROUP_BLOCKS)?,
                dmin: pick_rows(dmin, rows, nb / GROUP_BLOCKS)?,
                sc: pick_rows(sc, rows, nb)?,
                mn: pick_rows(mn, rows, nb)?,
            },
        })
    }
}

/// Raw pointers to a matrix's scales, for the x86 kernels' inner loops.
#[cfg(target_arch = "x86_64")]
pub(super) struct ScaleSrc {
    /// Per block f16 d and m (`m` null for `Centered`, whose m is `offset · d`).
    dh: *const u16,
    mh: *const u16,
    offset: f32,
    /// Per super-block d and dmin, per block 6-bit scales and mins (`Super`).
    d: *const f32,
    m: *const f32,
    sc: *const u8,
    mn: *const u8,
}

#[cfg(target_arch = "x86_64")]
impl ScaleSrc {
    pub(super) fn new(s: &Scales) -> ScaleSrc {
        let none = ScaleSrc {
            dh: std::ptr::null(),
            mh: std::ptr::null(),
            offset: 0.0,
            d: std::ptr::null(),
            m: std::ptr::null(),
            sc: std::ptr::null(),
            mn: std::ptr::null(),
        };
        match s {
            Scales::Block { d, m } => ScaleSrc { dh: d.as_ptr().cast(), mh: m.as_ptr().cast(), ..none },
            Scales::Centered { d, offset } => ScaleSrc { dh: d.as_ptr().cast(), offset: *offset, ..none },
            Scales::Super { d, dmin, sc, mn } => {
                ScaleSrc { d: d.as_ptr(), m: dmin.as_ptr(), sc: sc.as_ptr(), mn: mn.as_ptr(), ..none }
            }
        }
    }

    /// The d and m of blocks `i ..` (counted over the whole matrix) as 8 lanes, zeros after
    /// `SIZE` blocks; `SUPER` says which kind of scales the pointers are (a super-block's always
    /// fill a whole chunk). Safety: `i` is a block of the matrix the pointers came from, and the
    /// CPU has F16C.
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
            let d = first_halves::<SIZE>(self.dh.add(i));
            match self.mh.is_null() {
                true => (d, _mm256_mul_ps(d, _mm256_set1_ps(self.offset))),
                false => (d, first_halves::<SIZE>(self.mh.add(i))),
            }
        }
    }
}

/// `SIZE` f16 values from `p` as f32 lanes, zeros after them (reads only those).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn first_halves<const SIZE: usize>(p: *const u16) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let v = match SIZE {
        8 => _mm_loadu_si128(p as *const __m128i),
        4 => _mm_loadl_epi64(p as *const __m128i),
        2 => _mm_cvtsi32_si128((p as *const i32).read_unaligned()),
        _ => _mm_cvtsi32_si128(*p as i32),
    };
    _mm256_cvtph_ps(v)
}
