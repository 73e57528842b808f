//! GGML's K-quant super-blocks of 256 weights (Q4_K, Q5_K, Q6_K) decoded into the project's blocks of
//! 32, exactly: the kernels then read the file's own quants, with no re-quantization.

use super::BLOCK;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of one Q4_K super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles.
pub(super) const Q4K_BYTES: usize = 144;
/// Bytes of one Q5_K super-block: Q4_K's 16 bytes of scales, 32 of fifth bits, 128 of nibbles.
pub(super) const Q5K_BYTES: usize = 176;
/// Bytes of one Q6_K super-block: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 i8 scales, f16 d.
pub(super) const Q6K_BYTES: usize = 210;

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Sub-block `j`'s (0..8) 6-bit scale and min in Q4_K's 12 packed bytes.
fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// One Q4_K super-block as 8 blocks of 32: returns `d` and `dmin` and fills each block's 6-bit
/// scale and min and its quants 0..15 in plain order. Block j's weights are
/// `(d · scale[j]) · q − dmin · min[j]`, as GGML dequantizes them.
pub(super) fn q4k_block(b: &[u8], scale: &mut [u8], min: &mut [u8], q: &mut [u8]) -> (f32, f32) {
    low_nibbles(&b[16..], q);
    scales_of(b, scale, min)
}

/// One Q5_K super-block, as [`q4k_block`] with quants 0..31: sub-block j's fifth bits are bit j
/// of the 32 bytes after the scales (byte l for its weight l).
pub(super) fn q5k_block(b: &[u8], scale: &mut [u8], min: &mut [u8], q: &mut [u8]) -> (f32, f32) {
    low_nibbles(&b[48..], q);
    for (j, sub) in q.chunks_exact_mut(BLOCK).enumerate() {
        for (out, &bits) in sub.iter_mut().zip(&b[16..48]) {
            *out |= ((bits >> j) & 1) << 4;
        }
    }
    scales_of(b, scale, min)
}

/// `d` and `dmin` of a Q4_K or Q5_K super-block, and its 8 blocks' 6-bit scales and mins.
fn scales_of(b: &[u8], scale: &mut [u8], min: &mut [u8]) -> (f32, f32) {
    for j in 0..QK_K / BLOCK {
        (scale[j], min[j]) = scale_min(j, &b[4..16]);
    }
    (f16_at(b, 0), f16_at(b, 2))
}

/// The 4-bit parts of a super-block's 256 quants from its 128 bytes, in plain order: sub-blocks
/// 2i and 2i + 1 are the low and high nibbles of the same 32 bytes.
fn low_nibbles(nibbles: &[u8], q: &mut [u8]) {
    for j in 0..QK_K / BLOCK {
        let (src, shift) = (&nibbles[BLOCK * (j / 2)..][..BLOCK], 4 * (j % 2));
        for (out, &byte) in q[BLOCK * j..][..BLOCK].iter_mut().zip(src) {
            *out = (byte >> shift) & 0x0F;
        }
    }
}

/// One Q6_K super-block: `d` (f16 as f32), the 16 scales (one per 16 weights) and the quants
/// 0..63 in plain order; weight i = `d · scales[i / 16] · (q[i] − 32)`.
pub(super) fn q6k_block(b: &[u8], scales: &mut [i8], q: &mut [u8]) -> f32 {
    let (ql, qh) = (&b[..128], &b[128..192]);
    for (s, &byte) in scales.iter_mut().zip(&b[192..208]) {
        *s = byte as i8;
    }
    for half in 0..2 {
        let (ql, qh, y) = (&ql[64 * half..], &qh[32 * half..], &mut q[128 * half..]);
        for l in 0..32 {
            y[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            y[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    f16_at(b, 208)
}
