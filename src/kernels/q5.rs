//! The 5-bit formats (Q5_0, Q5_1, Q5_K) in [`Q4Matrix`]: each quant's low four bits in the
//! nibbles of the 4-bit layout, its fifth bit in a plane beside them, so that the 4-bit kernels
//! run them with one extra load per chunk and a bit test per vector.
//!
//! The plane of a row: the chunk layout's vector g (32 bytes; vector g belongs to the chunk that
//! holds block g) keeps its fifth bits in bit g % 8 of bytes 0..31 of the plane's 32-byte part
//! g / 8. A chunk's vectors are then all in one 32-byte load, one bit each, whatever the chunk's
//! size: a width of 896 (28 blocks: 8 + 8 + 8 + 4) takes 4 parts, 128 bytes.

use super::*;

/// The file formats of 32-weight blocks with their own f16 scale that [`Q4Matrix`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmallBlocks {
    /// f16 d, 16 bytes of nibbles; weight = d · (q − 8).
    Q4_0,
    /// f16 d, f16 m, 16 bytes of nibbles; weight = d · q + m.
    Q4_1,
    /// f16 d, 4 bytes of fifth bits, 16 of nibbles; weight = d · (q − 16).
    Q5_0,
    /// f16 d, f16 m, 4 bytes of fifth bits, 16 of nibbles; weight = d · q + m.
    Q5_1,
}

impl SmallBlocks {
    /// Bytes of one block in the file.
    pub(super) fn bytes(self) -> usize {
        match self {
            SmallBlocks::Q4_0 => 18,
            SmallBlocks::Q4_1 => 20,
            SmallBlocks::Q5_0 => 22,
            SmallBlocks::Q5_1 => 24,
        }
    }

    /// Whether the quants have a fifth bit.
    pub(super) fn five(self) -> bool {
        matches!(self, SmallBlocks::Q5_0 | SmallBlocks::Q5_1)
    }

    /// The offset m / d of the formats without a stored m (weight = d · q + m).
    pub(super) fn centered(self) -> Option<f32> {
        match self {
            SmallBlocks::Q4_0 => Some(-8.0),
            SmallBlocks::Q5_0 => Some(-16.0),
            SmallBlocks::Q4_1 | SmallBlocks::Q5_1 => None,
        }
    }

    /// One block's f16 d and m (m only where the file stores it) and its 32 quants in plain
    /// order. Byte j of the nibbles holds weights j and j + 16; bit i of the little-endian fifth
    /// bits is weight i's.
    pub(super) fn block(self, blk: &[u8], q: &mut [u8]) -> (half::f16, Option<half::f16>) {
        let f16 = |i: usize| half::f16::from_le_bytes([blk[i], blk[i + 1]]);
        let (d, m) = (f16(0), self.centered().is_none().then(|| f16(2)));
        let nibbles = &blk[blk.len() - 16..];
        let fifth = match self.five() {
            true => {
                u32::from_le_bytes([blk[blk.len() - 20], blk[blk.len() - 19], blk[blk.len() - 18], blk[blk.len() - 17]])
            }
            false => 0,
        };
        for (j, &byte) in nibbles.iter().enumerate() {
            q[j] = (byte & 0x0F) | (((fifth >> j) & 1) << 4) as u8;
            q[j + 16] = (byte >> 4) | (((fifth >> (j + 16)) & 1) << 4) as u8;
        }
        (d, m)
    }
}

/// Bytes of a row's fifth-bit plane: 32 per 8 blocks, rounded up.
pub(super) fn high_row_bytes(n_in: usize) -> usize {
    (n_in / BLOCK).div_ceil(GROUP_BLOCKS) * BLOCK
}

/// The fifth bits of one row of quants (0..31) in the chunk layout, into its plane (zeroed).
pub(super) fn pack_high_row(il: &[u8], plane: &mut [u8]) {
    for (g, vector) in il.chunks_exact(BLOCK).enumerate() {
        for (j, &q) in vector.iter().enumerate() {
            plane[g / GROUP_BLOCKS * BLOCK + j] |= ((q >> 4) & 1) << (g % GROUP_BLOCKS);
        }
    }
}

/// The inverse of [`pack_high_row`]: each quant of `il` (chunk layout) gets its fifth bit.
pub(super) fn add_high_row(plane: &[u8], il: &mut [u8]) {
    for (g, vector) in il.chunks_exact_mut(BLOCK).enumerate() {
        for (j, q) in vector.iter_mut().enumerate() {
            *q |= ((plane[g / GROUP_BLOCKS * BLOCK + j] >> (g % GROUP_BLOCKS)) & 1) << 4;
        }
    }
}

/// A matrix's nibbles and (for 5-bit quants) fifth-bit planes, filled row by row.
pub(super) struct PackedRows {
    n_in: usize,
    nibbles: Vec<u8>,
    high: Vec<u8>,
}

impl PackedRows {
    pub(super) fn new(n_out: usize, n_in: usize, five: bool) -> PackedRows {
        let high = if five { vec![0u8; n_out * high_row_bytes(n_in)] } else { Vec::new() };
        PackedRows { n_in, nibbles: vec![0u8; n_out * n_in / 2], high }
    }

    /// Row `o` from its quants in plain order.
    pub(super) fn pack(&mut self, o: usize, q: &[u8]) {
        let n_in = self.n_in;
        let nibbles = &mut self.nibbles[o * n_in / 2..(o + 1) * n_in / 2];
        if self.high.is_empty() {
            pack_q4_row(q, nibbles);
            return;
        }
        let low: Vec<u8> = q.iter().map(|&v| v & 0x0F).collect();
        pack_q4_row(&low, nibbles);
        let mut il = q.to_vec();
        interleave_row(&mut il);
        let hb = high_row_bytes(n_in);
        pack_high_row(&il, &mut self.high[o * hb..(o + 1) * hb]);
    }

    /// The nibbles and the planes (empty for 4-bit quants).
    pub(super) fn finish(self) -> (Vec<u8>, Vec<u8>) {
        (self.nibbles, self.high)
    }
}

/// The planes of matrices stacked by [`Q4Matrix::stack`]: none if no part has them, else each
/// part's, zeros for a 4-bit part (its quants' fifth bits are 0).
pub(super) fn stack_high(parts: &[&Q4Matrix], n_in: usize) -> Vec<u8> {
    if parts.iter().all(|m| m.high.is_empty()) {
        return Vec::new();
    }
    let zeros: Vec<Vec<u8>> = parts
        .iter()
        .map(|m| if m.high.is_empty() { vec![0u8; m.n_out * high_row_bytes(n_in)] } else { Vec::new() })
        .collect();
    concat(parts.iter().zip(&zeros).map(|(m, z)| if m.high.is_empty() { &z[..] } else { &m.high[..] }))
}

/// The planes of the given rows, in that order (none for a 4-bit matrix); `None` for a row
/// past the matrix.
pub(super) fn select_high(high: &[u8], rows: &[u32], n_in: usize) -> Option<Vec<u8>> {
    if high.is_empty() {
        return Some(Vec::new());
    }
    pick_rows(high, rows, high_row_bytes(n_in))
}

impl Q4Matrix {
    /// Whether the quants have a fifth bit (Q5_0, Q5_1, Q5_K).
    pub fn is_five_bit(&self) -> bool {
        !self.high.is_empty()
    }

    /// Row `o`'s quants in plain order (0..15, or 0..31 for the 5-bit formats).
    pub(super) fn quants_row(&self, o: usize) -> Vec<u8> {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let (true, Some(tiles)) = (self.nibbles.is_empty(), &self.amx) {
            return tiles.quants_row(o, self.n_in);
        }
        let mut il = unpack_q4_il(&self.nibbles[o * self.n_in / 2..(o + 1) * self.n_in / 2], self.n_in);
        if self.is_five_bit() {
            let hb = high_row_bytes(self.n_in);
            add_high_row(&self.high[o * hb..(o + 1) * hb], &mut il);
        }
        deinterleave_row(&il)
    }
}
