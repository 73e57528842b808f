//! The interleaved weight layout: a row's blocks in chunks whose 32-byte vectors hold 4 bytes of
//! each of 8 blocks, so one multiply-add serves 8 blocks (see `chunk_source`).

use super::*;

/// Blocks per interleaved group: one 256-bit lane of 4 bytes per block.
pub(super) const GROUP_BLOCKS: usize = 8;

/// The chunks a row of `nb` blocks is stored in, as (first block, blocks): whole groups of 8, then
/// one chunk each of 4, 2 and 1 blocks as the rest needs (a width of 576 = 18 blocks is 8 + 8 + 2).
pub(super) fn chunks(nb: usize) -> impl Iterator<Item = (usize, usize)> {
    let whole = nb / GROUP_BLOCKS * GROUP_BLOCKS;
    let rest = nb - whole;
    let tails = [4, 2, 1].into_iter().filter(move |&size| rest & size != 0).scan(whole, |b0, size| {
        let chunk = (*b0, size);
        *b0 += size;
        Some(chunk)
    });
    (0..whole).step_by(GROUP_BLOCKS).map(|b0| (b0, GROUP_BLOCKS)).chain(tails)
}

/// Where byte `p` of a stored chunk of `size` blocks comes from, as an offset into the chunk's
/// blocks in plain order. The chunk is `size` vectors of 32 bytes; lane i (4 bytes) of vector v
/// holds 4 bytes of block i % size, its bytes 4·((8 / size)·v + i / size) onward. A multiply-add
/// of such vectors sums 4 products per lane, all from one block, so adding the chunk's vectors'
/// results leaves each lane with part of one block's dot product: the block scales are then applied
/// to all 8 lanes with one vector multiply (the scales repeated to match), instead of per block.
/// For 8 blocks, lane i of vector v is bytes 4v..4v+3 of block i; for 1 block, plain order.
#[inline]
pub(super) fn chunk_source(p: usize, size: usize) -> usize {
    let (v, i, l) = (p / BLOCK, p % BLOCK / 4, p % 4);
    (i % size) * BLOCK + 4 * ((GROUP_BLOCKS / size) * v + i / size) + l
}

/// For a chunk of `size` blocks: the source word (4 elements, in plain order) of each stored word
/// (see [`chunk_source`], which keeps each 4-element group together).
pub(super) fn chunk_words(size: usize) -> &'static [u16] {
    static TABLES: std::sync::OnceLock<[Vec<u16>; 4]> = std::sync::OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        [1, 2, 4, 8].map(|s| (0..s * BLOCK / 4).map(|w| (chunk_source(4 * w, s) / 4) as u16).collect())
    });
    &tables[size.trailing_zeros() as usize]
}

/// One row from plain block order into the chunk layout ([`chunk_source`]).
pub(super) fn interleave_into<T: Copy>(plain: &[T], out: &mut [T]) {
    for (b0, size) in chunks(plain.len() / BLOCK) {
        let (src, dst) = (&plain[b0 * BLOCK..(b0 + size) * BLOCK], &mut out[b0 * BLOCK..(b0 + size) * BLOCK]);
        for (d, &w) in dst.chunks_exact_mut(4).zip(chunk_words(size)) {
            d.copy_from_slice(&src[4 * w as usize..][..4]);
        }
    }
}

/// Reorder one row of quants from plain block order into the chunk layout.
pub(super) fn interleave_row<T: Copy>(row: &mut [T]) {
    let plain = row.to_vec();
    interleave_into(&plain, row);
}

/// The inverse of [`interleave_row`]: the row in plain block order.
pub(super) fn deinterleave_row<T: Copy>(row: &[T]) -> Vec<T> {
    let mut plain = row.to_vec();
    for (b0, size) in chunks(row.len() / BLOCK) {
        let (src, dst) = (&row[b0 * BLOCK..(b0 + size) * BLOCK], &mut plain[b0 * BLOCK..(b0 + size) * BLOCK]);
        for (s, &w) in src.chunks_exact(4).zip(chunk_words(size)) {
            dst[4 * w as usize..][..4].copy_from_slice(s);
        }
    }
    plain
}

/// The value all of `values` share, if they share one (of matrices to stack: their input width,
/// their [`Isa`]).
pub(super) fn common<T: PartialEq>(mut values: impl Iterator<Item = T>) -> Option<T> {
    let first = values.next()?;
    values.all(|v| v == first).then_some(first)
}
