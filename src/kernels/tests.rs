//! The kernels against the portable path and against themselves: SIMD vs portable, batch
//! exactness, layouts.

use super::*;

pub(super) fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| (crate::sampling::uniform(seed, i as u64, crate::sampling::Purpose::TargetSample) as f32 - 0.5) * 4.0)
        .collect()
}

/// The values' bits, to compare results exactly.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn output_bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

/// The bits of the `len` outputs a kernel call `f` writes, for comparing paths exactly.
#[cfg(target_arch = "x86_64")]
pub(super) fn output_bits(len: usize, f: &dyn Fn(&mut [f32])) -> Vec<u32> {
    let mut out = vec![0f32; len];
    f(&mut out);
    out.iter().map(|v| v.to_bits()).collect()
}

/// GGML Q4_1 bytes of a pseudo-random `(n_out, n_in)` matrix, quantized by candle.
fn q4_1_bytes(n_out: usize, n_in: usize, seed: u64) -> Vec<u8> {
    ggml_bytes(n_out, n_in, seed, candle_core::quantized::GgmlDType::Q4_1)
}

/// The same as Q4_0.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn q4_0_bytes(n_out: usize, n_in: usize, seed: u64) -> Vec<u8> {
    ggml_bytes(n_out, n_in, seed, candle_core::quantized::GgmlDType::Q4_0)
}

pub(super) fn ggml_bytes(n_out: usize, n_in: usize, seed: u64, dtype: candle_core::quantized::GgmlDType) -> Vec<u8> {
    let t = candle_core::Tensor::from_vec(pseudo_random(n_out * n_in, seed), (n_out, n_in), &candle_core::Device::Cpu)
        .unwrap();
    candle_core::quantized::QTensor::quantize(&t, dtype).unwrap().data().unwrap().into_owned()
}

/// The AVX2 quantizer gives the scalar one's quants, scales and sums bit for bit, ties
/// (x · 127 / max = k + 0.5, which `f32::round` takes away from zero) and zero blocks included.
#[test]
#[cfg(target_arch = "x86_64")]
fn simd_quantizer_equals_the_scalar_one() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return;
    }
    let n_in = 224;
    let mut x = pseudo_random(3 * n_in, 11);
    // Block 1 of row 0: max 127, so every x · inv is x itself; halves land on ties.
    for (i, v) in x[32..64].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { i as f32 - 16.5 };
    }
    x[64..96].fill(0.0);
    x[100] = -1e-30;
    let (a, b) = (quantize_rows_any(&x, 3, n_in), unsafe { quantize_rows_avx2(&x, 3, n_in) });
    assert_eq!(a.quants, b.quants);
    assert_eq!(a.quants_il, b.quants_il);
    assert_eq!(
        a.scales.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.scales.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(
        a.scaled_sums.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.scaled_sums.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // −0.5 and 0.5 round away from zero (to even would give 0).
    assert_eq!((a.quants[32 + 16], a.quants[32 + 17]), (-1, 1));
}

#[test]
fn batched_equals_single_rows_exactly() {
    // 256: whole groups of 8 blocks only; 576 (the default model's width): a chunk of 2 blocks
    // after them; 480: chunks of 4, 2 and 1 after one group; 64: no whole group.
    for (n_out, n_in) in [(100, 256), (101, 576), (37, 480), (35, 64)] {
        let q8 = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 1), n_out, n_in, Isa::best()).unwrap();
        let q4 = Q4Matrix::from_ggml_bytes(&q4_1_bytes(n_out, n_in, 1), n_out, n_in, true, Isa::best()).unwrap();
        type Matmul<'a> = &'a dyn Fn(&[f32], usize) -> Vec<f32>;
        let kernels: [(&str, Matmul); 2] = [("q8_0", &|x, n| q8.matmul(x, n)), ("q4_1", &|x, n| q4.matmul(x, n))];
        for (name, matmul) in kernels {
            for n_rows in [1, 2, 3, 4, 5, 7, 9, 17] {
                let x = pseudo_random(n_rows * n_in, 2 + n_rows as u64);
                let all = matmul(&x, n_rows);
                for r in 0..n_rows {
                    let one = matmul(&x[r * n_in..(r + 1) * n_in], 1);
                    assert_eq!(
                        &all[r * n_out..(r + 1) * n_out],
                        &one[..],
                        "{name} {n_out}x{n_in}: row {r} of {n_rows}"
                    );
                }
            }
        }
    }
}

/// Where the CPU has AVX-512 VNNI, the VNNI kernels (256-bit, and 512-bit where AVX-512 BW is
/// there too) give the AVX2 kernels' results bit for bit: the same integer block sums (Q8_0
/// through the +128 offset, Q4 straight), scaled and added in the same order. Widths 576 and
/// 1536 (the default target's) hold whole chunks of 8 blocks, which the 512-bit path takes.
#[test]
#[cfg(target_arch = "x86_64")]
fn vnni_kernels_equal_the_avx2_ones() {
    let best = Isa::best();
    if !best.vnni() {
        eprintln!("no AVX-512 VNNI on this CPU: nothing to compare");
        return;
    }
    for (n_out, n_in) in [(67, 576), (13, 1536), (21, 480), (20, 64), (9, 32)] {
        let q8 = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 21), n_out, n_in, best).unwrap();
        let q4 = Q4Matrix::from_ggml_bytes(&q4_1_bytes(n_out, n_in, 22), n_out, n_in, true, best).unwrap();
        for n_rows in [1, 2, 3, 5, 6, 9, 17] {
            let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 23 + n_rows as u64), n_rows, n_in);
            xq.fill_unsigned_for_vnni(best);
            xq.fill_pairs_for_wide(best);
            let run = |f: &dyn Fn(&mut [f32])| output_bits(n_out * n_rows, f);
            // SAFETY: `best` has AVX-512 VNNI and VL, which imply AVX2 and FMA here.
            unsafe {
                assert_eq!(
                    run(&|o| q8.rows_vnni(0..n_out, &xq, o)),
                    run(&|o| q8.rows_avx2_only(0..n_out, &xq, o)),
                    "q8_0 {n_out}x{n_in}, {n_rows} rows"
                );
                assert_eq!(
                    run(&|o| q4.rows_vnni(0..n_out, &xq, o)),
                    run(&|o| q4.rows_avx2_impl(0..n_out, &xq, o)),
                    "q4_1 {n_out}x{n_in}, {n_rows} rows"
                );
                if best.vnni512() {
                    assert_eq!(
                        run(&|o| q8.rows_vnni512(0..n_out, &xq, o)),
                        run(&|o| q8.rows_avx2_only(0..n_out, &xq, o)),
                        "q8_0 512-bit {n_out}x{n_in}, {n_rows} rows"
                    );
                    assert_eq!(
                        run(&|o| q4.rows_vnni512(0..n_out, &xq, o)),
                        run(&|o| q4.rows_avx2_impl(0..n_out, &xq, o)),
                        "q4_1 512-bit {n_out}x{n_in}, {n_rows} rows"
                    );
                }
            }
        }
    }
}

/// The AMX path on `xq` against the VNNI kernel's `vnni` ((out, row) layout), bit for bit,
/// with one block per multiply and then, where the rows and blocks allow, two; the outputs
/// past the whole groups of 16 are left alone, and a range that does not start a group is left
/// to VNNI.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn assert_tiles_give(tiles: &amx::AmxTiles, xq: &mut Q8Rows, vnni: &[f32], n_out: usize, n_in: usize, label: &str) {
    let n_rows = xq.n_rows;
    for pairs in [false, true] {
        if pairs {
            xq.fill_tile_pairs();
        }
        let mut ours = vec![f32::NAN; n_out * n_rows];
        // SAFETY: the callers have tiles (AVX-512 F, BW and VNNI with them); `ours` is
        // n_rows × n_out.
        let done = unsafe { tiles.rows(n_in, 0..n_out, xq, ours.as_mut_ptr(), n_out) };
        assert_eq!(done, n_out / 16 * 16);
        for r in 0..n_rows {
            for o in 0..n_out {
                let got = ours[r * n_out + o];
                if o < done {
                    assert_eq!(
                        got.to_bits(),
                        vnni[o * n_rows + r].to_bits(),
                        "{label} {n_out}x{n_in}, {n_rows} rows, pairs {pairs}: row {r}, output {o}"
                    );
                } else {
                    assert!(got.is_nan(), "output {o} is past the whole groups and left alone");
                }
            }
        }
    }
    assert_eq!(xq.tile_pairs.is_empty(), n_rows > 8 || !(n_in / 32).is_multiple_of(2), "pairs where they fit");
    let mut ours = vec![0f32; n_out * n_rows];
    // SAFETY: as above.
    assert_eq!(unsafe { tiles.rows(n_in, 8..n_out, xq, ours.as_mut_ptr(), n_out) }, 0);
}

/// Where this process runs the 512-bit VNNI kernels, the tile path (AMX where the CPU has it,
/// else the tiles' 16-output blocks with `vpdpbusd`) gives the row kernel's results bit for bit,
/// for any number of rows (one tile of up to 16, or several), for whole groups of 16 outputs (the
/// rest go to the row kernel), for the chunk shapes of every width, and for Q4_0, Q4_1, Q4_K, the
/// 5-bit formats and Q8_0.
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn tiles_equal_the_vnni_kernel() {
    use candle_core::quantized::GgmlDType;
    let isa = Isa::best();
    if !isa.tiles() {
        eprintln!("no 512-bit VNNI here: nothing to compare");
        return;
    }
    for (n_out, n_in, min) in
        [(64, 576, true), (48, 1536, true), (35, 480, false), (32, 64, true), (16, 32, true), (67, 256, false)]
    {
        let bytes = match min {
            true => q4_1_bytes(n_out, n_in, 31),
            false => q4_0_bytes(n_out, n_in, 31),
        };
        let q4 = Q4Matrix::from_ggml_bytes(&bytes, n_out, n_in, min, isa).unwrap();
        let tiles = q4.amx.as_ref().expect("a tile layout where 512-bit VNNI runs");
        for n_rows in [1, 2, 3, 5, 9, 16, 17, 33] {
            let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 32 + n_rows as u64), n_rows, n_in);
            xq.fill_pairs_for_wide(isa);
            let mut vnni = vec![0f32; n_out * n_rows];
            // SAFETY: tiles exist only with the 512-bit VNNI kernels (AVX-512 VNNI, F, BW and VL).
            unsafe { q4.rows_vnni512(0..n_out, &xq, &mut vnni) };
            assert_tiles_give(tiles, &mut xq, &vnni, n_out, n_in, if min { "q4_1" } else { "q4_0" });
        }
    }
    // Q4_K: the blocks' d and m from the super-blocks' scales, as the row kernel computes them.
    for (n_out, n_in) in [(32, 256), (48, 1536), (16, 512)] {
        let q4k = Q4Matrix::from_q4k_bytes(&ggml_bytes(n_out, n_in, 35, GgmlDType::Q4K), n_out, n_in, isa).unwrap();
        let tiles = q4k.amx.as_ref().expect("a tile layout for Q4_K where 512-bit VNNI runs");
        for n_rows in [1, 2, 3, 5, 9, 16, 17] {
            let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 36 + n_rows as u64), n_rows, n_in);
            xq.fill_pairs_for_wide(isa);
            let mut vnni = vec![0f32; n_out * n_rows];
            // SAFETY: as above.
            unsafe { q4k.rows_vnni512(0..n_out, &xq, &mut vnni) };
            assert_tiles_give(tiles, &mut xq, &vnni, n_out, n_in, "q4_k");
        }
    }
    // The 5-bit formats: the fifth bits from their own plane, read by `vpdpbusd` alone.
    for (n_out, n_in, dtype) in
        [(32, 256, GgmlDType::Q5K), (48, 1536, GgmlDType::Q5K), (64, 896, GgmlDType::Q5_0), (35, 480, GgmlDType::Q5_1)]
    {
        let bytes = ggml_bytes(n_out, n_in, 37, dtype);
        let q5 = match dtype {
            GgmlDType::Q5K => Q4Matrix::from_q5k_bytes(&bytes, n_out, n_in, isa),
            GgmlDType::Q5_0 => Q4Matrix::from_blocks(&bytes, n_out, n_in, SmallBlocks::Q5_0, isa),
            _ => Q4Matrix::from_blocks(&bytes, n_out, n_in, SmallBlocks::Q5_1, isa),
        }
        .unwrap();
        let tiles = q5.amx.as_ref().expect("a tile layout for the 5-bit formats where 512-bit VNNI runs");
        assert!(!tiles.takes_amx(16, n_in), "AMX does not read the fifth bits");
        for n_rows in [1, 2, 3, 5, 9, 16, 17] {
            let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 38 + n_rows as u64), n_rows, n_in);
            xq.fill_pairs_for_wide(isa);
            let mut vnni = vec![0f32; n_out * n_rows];
            // SAFETY: as above.
            unsafe { q5.rows_vnni512(0..n_out, &xq, &mut vnni) };
            assert_tiles_give(tiles, &mut xq, &vnni, n_out, n_in, &format!("{dtype:?}"));
        }
    }
    // Stacked parts keep their tiles; a part with a partial group leaves the stack without.
    let parts: Vec<Q4Matrix> = [(32, 41), (16, 42)]
        .iter()
        .map(|&(n, seed)| Q4Matrix::from_ggml_bytes(&q4_1_bytes(n, 576, seed), n, 576, true, isa).unwrap())
        .collect();
    assert!(Q4Matrix::stack(&parts.iter().collect::<Vec<_>>()).unwrap().amx.is_some());
    let odd = Q4Matrix::from_ggml_bytes(&q4_1_bytes(20, 576, 43), 20, 576, true, isa).unwrap();
    assert!(Q4Matrix::stack(&[&parts[0], &odd]).unwrap().amx.is_none());
    // Q8_0 the same way (signed tiles, no offset term).
    for (n_out, n_in) in [(64, 576), (48, 1536), (35, 480), (32, 64), (16, 32), (67, 192)] {
        let q8 = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 33), n_out, n_in, isa).unwrap();
        let tiles = q8.amx.as_ref().expect("a signed tile layout where 512-bit VNNI runs");
        for n_rows in [1, 2, 3, 5, 9, 16, 17, 33] {
            let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 34 + n_rows as u64), n_rows, n_in);
            xq.fill_unsigned_for_vnni(isa);
            xq.fill_plain_unsigned();
            let mut vnni = vec![0f32; n_out * n_rows];
            // SAFETY: as above.
            unsafe { q8.rows_vnni512(0..n_out, &xq, &mut vnni) };
            assert_tiles_give(tiles, &mut xq, &vnni, n_out, n_in, "q8_0");
        }
    }
}

#[test]
fn q8_block_sums_are_held_only_for_the_vnni_kernels_and_are_exact() {
    let (n_out, n_in) = (24, 576);
    let m = Q8Matrix::from_f32(&pseudo_random(n_out * n_in, 41), n_out, n_in, Isa::best()).unwrap();
    let nb = n_in / BLOCK;
    match m.isa().vnni() {
        false => assert!(m.wsum.is_empty(), "no kernel here reads the block sums"),
        true => {
            assert_eq!(m.wsum.len(), n_out * nb);
            for o in 0..n_out {
                let plain = deinterleave_row(&m.quants[o * n_in..(o + 1) * n_in]);
                for b in 0..nb {
                    let sum: i32 = plain[b * BLOCK..(b + 1) * BLOCK].iter().map(|&q| q as i32).sum();
                    assert_eq!(m.wsum[o * nb + b] as i32, sum, "output {o}, block {b}");
                }
            }
        }
    }
    // Selecting rows keeps their sums (or none), so the selected matrix gives the same outputs.
    let rows = [5u32, 0, 23];
    let picked = m.select_rows(&rows).unwrap();
    assert_eq!(picked.wsum.len(), if m.wsum.is_empty() { 0 } else { rows.len() * nb });
    let x = pseudo_random(3 * n_in, 42);
    let (all, some) = (m.matmul(&x, 3), picked.matmul(&x, 3));
    for r in 0..3 {
        for (j, &o) in rows.iter().enumerate() {
            assert_eq!(some[r * rows.len() + j].to_bits(), all[r * n_out + o as usize].to_bits());
        }
    }
    let held = 4 * m.scales.len() + m.quants.len() + 2 * m.wsum.len();
    assert_eq!(m.bytes(), held + m.amx.as_ref().map_or(0, |a| a.bytes()));
}

#[test]
fn stacked_matrices_give_each_part_exactly() {
    let n_in = 576; // two interleaved groups of 8 blocks and two blocks after them
    let parts: Vec<Q8Matrix> = [(64, 11), (32, 12), (32, 13)]
        .iter()
        .map(|&(n_out, seed)| Q8Matrix::from_f32(&pseudo_random(n_out * n_in, seed), n_out, n_in, Isa::best()).unwrap())
        .collect();
    let stacked = Q8Matrix::stack(&parts.iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(stacked.n_out, 128);
    let n_rows = 3;
    let x = pseudo_random(n_rows * n_in, 14);
    let all = stacked.matmul(&x, n_rows);
    let mut offset = 0;
    for m in &parts {
        let y = m.matmul(&x, n_rows);
        for r in 0..n_rows {
            assert_eq!(&all[r * 128 + offset..r * 128 + offset + m.n_out], &y[r * m.n_out..(r + 1) * m.n_out]);
        }
        offset += m.n_out;
    }
    let other = Q8Matrix::from_f32(&pseudo_random(32 * 64, 15), 32, 64, Isa::best()).unwrap();
    assert!(Q8Matrix::stack(&[&parts[0], &other]).is_none(), "different input widths cannot stack");
    assert!(Q8Matrix::stack(&[]).is_none());
}

#[test]
fn simd_matches_portable_and_f32() {
    for (n_out, n_in) in [(70, 576), (30, 480), (12, 224)] {
        let w = pseudo_random(n_out * n_in, 3);
        let m = Q8Matrix::from_f32(&w, n_out, n_in, Isa::best()).unwrap();
        let n_rows = 9;
        let x = pseudo_random(n_rows * n_in, 4);
        let fast = m.matmul(&x, n_rows);
        let xq = quantize_rows(&x, n_rows, n_in);
        let mut portable = vec![0f32; n_out * n_rows];
        m.rows_portable(0..n_out, &xq, &mut portable);
        for r in 0..n_rows {
            for o in 0..n_out {
                let exact: f32 = (0..n_in).map(|i| w[o * n_in + i] * x[r * n_in + i]).sum();
                let (f, p) = (fast[r * n_out + o], portable[o * n_rows + r]);
                assert!((f - p).abs() <= 1e-3 * (1.0 + p.abs()), "simd {f} vs portable {p}");
                // Two 8-bit quantizations: error ~1% of the magnitude of the terms.
                assert!((f - exact).abs() < 0.05 * (n_in as f32).sqrt() * 2.0, "q8 {f} vs f32 {exact}");
            }
        }
    }
}

fn candle_reference(
    w: &[f32],
    x: &[f32],
    n_out: usize,
    n_in: usize,
    n_rows: usize,
    dtype: candle_core::quantized::GgmlDType,
) -> (Vec<u8>, Vec<Vec<f32>>) {
    use candle_core::quantized::{QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};
    let qt = QTensor::quantize(&Tensor::from_vec(w.to_vec(), (n_out, n_in), &Device::Cpu).unwrap(), dtype).unwrap();
    let bytes = qt.data().unwrap().into_owned();
    let xt = Tensor::from_vec(x.to_vec(), (n_rows, n_in), &Device::Cpu).unwrap();
    let y = QMatMul::from_qtensor(qt).unwrap().forward(&xt).unwrap();
    (bytes, y.to_vec2::<f32>().unwrap())
}

#[test]
fn q4_kernels_match_candle_and_are_batch_exact() {
    use candle_core::quantized::GgmlDType;
    for ((n_out, n_in), (dtype, min)) in [(67, 576), (33, 256), (21, 480), (20, 64)]
        .into_iter()
        .flat_map(|s| [(s, (GgmlDType::Q4_1, true)), (s, (GgmlDType::Q4_0, false))])
    {
        let w = pseudo_random(n_out * n_in, 7);
        let n_rows = 9;
        let x = pseudo_random(n_rows * n_in, 8);
        let (bytes, theirs) = candle_reference(&w, &x, n_out, n_in, n_rows, dtype);
        let m = Q4Matrix::from_ggml_bytes(&bytes, n_out, n_in, min, Isa::best()).unwrap();
        let ours = m.matmul(&x, n_rows);
        let xq = quantize_rows(&x, n_rows, n_in);
        let mut portable = vec![0f32; n_out * n_rows];
        m.rows_portable(0..n_out, &xq, &mut portable);
        for r in 0..n_rows {
            let one = m.matmul(&x[r * n_in..(r + 1) * n_in], 1);
            assert_eq!(
                &ours[r * n_out..(r + 1) * n_out],
                &one[..],
                "{dtype:?}: batched row {r} differs from single row"
            );
            for o in 0..n_out {
                let (a, b, p) = (ours[r * n_out + o], theirs[r][o], portable[o * n_rows + r]);
                // candle quantizes the activations as Q8_1 for these formats, we as Q8_0: the two
                // roundings differ by ~0.1% of the output's typical size (|y| ~ 30 here).
                assert!((a - b).abs() <= 0.05, "{dtype:?}: ours {a} vs candle {b}");
                assert!((a - p).abs() <= 1e-3 * (1.0 + p.abs()), "{dtype:?}: simd {a} vs portable {p}");
            }
        }
        assert!(Q4Matrix::from_ggml_bytes(&bytes[..bytes.len() - 1], n_out, n_in, min, Isa::best()).is_none());
    }
}

#[test]
fn chunk_layout_round_trips() {
    // Every mix of chunks: 8, 8 + 2, 8 + 4 + 2 + 1, 4 + 2 + 1, 2, 1.
    for n_in in [256, 576, 480, 224, 64, 32] {
        let plain: Vec<i8> = (0..n_in).map(|i| (i % 251) as i8).collect();
        let mut row = plain.clone();
        interleave_row(&mut row);
        assert_eq!(deinterleave_row(&row), plain, "n_in {n_in}");
        assert_eq!(chunks(n_in / BLOCK).map(|(_, size)| size).sum::<usize>(), n_in / BLOCK);
    }
    assert_eq!(chunks(15).collect::<Vec<_>>(), vec![(0, 8), (8, 4), (12, 2), (14, 1)]);
    assert_eq!(chunks(18).collect::<Vec<_>>(), vec![(0, 8), (8, 8), (16, 2)]);
    // Lane i of each vector of a chunk holds bytes of block i % size only.
    for size in [1, 2, 4, 8] {
        for p in 0..size * BLOCK {
            assert_eq!(chunk_source(p, size) / BLOCK, (p % BLOCK / 4) % size, "size {size}, byte {p}");
        }
    }
}

#[test]
fn q4_packing_round_trips() {
    for n_in in [576, 480, 256, 224, 64, 32] {
        let q: Vec<u8> = (0..n_in).map(|i| ((i * 7 + i / 32) % 16) as u8).collect();
        let mut packed = vec![0u8; n_in / 2];
        pack_q4_row(&q, &mut packed);
        assert_eq!(unpack_q4_row(&packed, n_in), q, "n_in {n_in}");
    }
}

#[test]
fn ggml_bytes_round_trip() {
    let (n_out, n_in) = (4, 64);
    let w = pseudo_random(n_out * n_in, 5);
    let t = candle_core::Tensor::from_vec(w.clone(), (n_out, n_in), &candle_core::Device::Cpu).unwrap();
    let qt = candle_core::quantized::QTensor::quantize(&t, candle_core::quantized::GgmlDType::Q8_0).unwrap();
    let bytes = qt.data().unwrap().into_owned();
    let from_bytes = Q8Matrix::from_ggml_bytes(&bytes, n_out, n_in, Isa::best()).unwrap();
    let x = pseudo_random(n_in, 6);
    let ours = from_bytes.matmul(&x, 1);
    let theirs = candle_core::Module::forward(
        &candle_core::quantized::QMatMul::from_qtensor(qt).unwrap(),
        &candle_core::Tensor::from_vec(x, (1, n_in), &candle_core::Device::Cpu).unwrap(),
    )
    .unwrap()
    .to_vec2::<f32>()
    .unwrap();
    for (a, b) in ours.iter().zip(&theirs[0]) {
        assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "ours {a} vs candle {b}");
    }
    assert!(Q8Matrix::from_ggml_bytes(&bytes[1..], n_out, n_in, Isa::best()).is_none());
}

/// A 4-bit matrix that keeps only its tile layout (as the model's layers do) gives the full
/// matrix's results bit for bit for any number of rows, reads back the same rows and the same
/// portable results, holds about half the bytes, and has no rows to select; Q4_0, Q4_1, Q4_K.
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn a_matrix_without_its_row_layout_gives_the_same_results() {
    if !Isa::best().tiles() {
        eprintln!("no tile layout here: nothing to drop");
        return;
    }
    use candle_core::quantized::GgmlDType;
    for (n_out, n_in, dtype) in [
        (64, 576, GgmlDType::Q4_1),
        (48, 1536, GgmlDType::Q4_0),
        (32, 512, GgmlDType::Q4K),
        (32, 512, GgmlDType::Q5K),
        (48, 896, GgmlDType::Q5_0),
    ] {
        let bytes = ggml_bytes(n_out, n_in, 51, dtype);
        let full = match dtype {
            GgmlDType::Q4K => Q4Matrix::from_q4k_bytes(&bytes, n_out, n_in, Isa::best()),
            GgmlDType::Q5K => Q4Matrix::from_q5k_bytes(&bytes, n_out, n_in, Isa::best()),
            GgmlDType::Q5_0 => Q4Matrix::from_blocks(&bytes, n_out, n_in, SmallBlocks::Q5_0, Isa::best()),
            _ => Q4Matrix::from_ggml_bytes(&bytes, n_out, n_in, dtype == GgmlDType::Q4_1, Isa::best()),
        }
        .unwrap();
        let mut compact = full.clone();
        compact.drop_row_layout();
        assert!(compact.tiles_only() && !full.tiles_only());
        assert!(compact.bytes() * 10 < full.bytes() * 6, "{} vs {} bytes", compact.bytes(), full.bytes());
        // Read straight into the tiles, as a model loads its layers' matrices.
        let format = match dtype {
            GgmlDType::Q4K => Q4File::Q4K,
            GgmlDType::Q5K => Q4File::Q5K,
            GgmlDType::Q5_0 => Q4File::Blocks(SmallBlocks::Q5_0),
            GgmlDType::Q4_0 => Q4File::Blocks(SmallBlocks::Q4_0),
            _ => Q4File::Blocks(SmallBlocks::Q4_1),
        };
        let loaded = Q4Matrix::from_file(&bytes, n_out, n_in, format, false, Isa::best()).unwrap();
        assert!(loaded.tiles_only() && loaded.bytes() == compact.bytes());
        assert!(!Q4Matrix::from_file(&bytes, n_out, n_in, format, true, Isa::best()).unwrap().tiles_only());
        let stacked = Q4Matrix::stack(&[&loaded, &compact]).unwrap();
        assert!(stacked.tiles_only());
        assert!(Q4Matrix::stack(&[&loaded, &full]).is_none(), "tiles alone beside rows do not stack");
        for n_rows in [1, 2, 5, 9, 16, 17] {
            let x = pseudo_random(n_rows * n_in, 52 + n_rows as u64);
            let (a, b) = (full.matmul(&x, n_rows), compact.matmul(&x, n_rows));
            assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{n_out}x{n_in}, {n_rows} rows");
            assert_eq!(output_bits_of(&a), output_bits_of(&loaded.matmul(&x, n_rows)), "{n_rows} rows, loaded");
            let y = stacked.matmul(&x, n_rows);
            for r in 0..n_rows {
                let (two, one) = (&y[r * 2 * n_out..(r + 1) * 2 * n_out], &a[r * n_out..(r + 1) * n_out]);
                assert_eq!(output_bits_of(&two[..n_out]), output_bits_of(one));
                assert_eq!(output_bits_of(&two[n_out..]), output_bits_of(one));
            }
        }
        let xq = quantize_rows(&pseudo_random(3 * n_in, 53), 3, n_in);
        let (mut a, mut b) = (vec![0f32; n_out * 3], vec![0f32; n_out * 3]);
        full.rows_portable(0..n_out, &xq, &mut a);
        compact.rows_portable(0..n_out, &xq, &mut b);
        assert_eq!(a, b, "portable results from the tiles");
        let (mut ra, mut rb) = (vec![0f32; n_in], vec![0f32; n_in]);
        for o in [0, n_out / 2, n_out - 1] {
            full.row_f32(o, &mut ra);
            compact.row_f32(o, &mut rb);
            assert_eq!(ra, rb, "row {o} read back from the tiles");
        }
        assert!(compact.select_rows(&[0, 1]).is_none());
    }
    // A matrix with a partial group keeps its row layout.
    let mut odd = Q4Matrix::from_ggml_bytes(&q4_1_bytes(20, 576, 54), 20, 576, true, Isa::best()).unwrap();
    odd.drop_row_layout();
    assert!(!odd.tiles_only());
}

/// A Q8_0 matrix read straight into its tiles gives the row layout's results bit for bit, its rows
/// and selected rows read back from the tiles, and stacks with tiles or rows beside it.
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn a_q8_matrix_in_tiles_alone_gives_the_same_results() {
    use candle_core::quantized::GgmlDType;
    let (n_out, n_in) = (48, 576);
    let bytes = ggml_bytes(n_out, n_in, 55, GgmlDType::Q8_0);
    let full = Q8Matrix::from_ggml_bytes(&bytes, n_out, n_in, Isa::best()).unwrap();
    let loaded = Q8Matrix::from_file(&bytes, n_out, n_in, false, Isa::best()).unwrap();
    assert!(!full.tiles_only());
    if !Isa::best().tiles() {
        eprintln!("no tile layout here: the rows are kept");
        assert!(!loaded.tiles_only());
        return;
    }
    assert!(loaded.tiles_only() && loaded.tile_bytes() == 0);
    assert!(loaded.bytes() < full.bytes() * 6 / 10, "{} vs {} bytes", loaded.bytes(), full.bytes());
    for n_rows in [1, 2, 5, 9, 16, 17] {
        let x = pseudo_random(n_rows * n_in, 56 + n_rows as u64);
        assert_eq!(output_bits_of(&full.matmul(&x, n_rows)), output_bits_of(&loaded.matmul(&x, n_rows)), "{n_rows}");
    }
    let xq = quantize_rows(&pseudo_random(3 * n_in, 57), 3, n_in);
    let (mut a, mut b) = (vec![0f32; n_out * 3], vec![0f32; n_out * 3]);
    full.rows_portable(0..n_out, &xq, &mut a);
    loaded.rows_portable(0..n_out, &xq, &mut b);
    assert_eq!(a, b, "portable results from the tiles");
    let (mut ra, mut rb) = (vec![0f32; n_in], vec![0f32; n_in]);
    for o in [0, 17, n_out - 1] {
        full.row_f32(o, &mut ra);
        loaded.row_f32(o, &mut rb);
        assert_eq!(ra, rb, "row {o} read back from the tiles");
    }
    let x = pseudo_random(4 * n_in, 58);
    let pick = [47, 0, 16, 16, 5];
    let (from_rows, from_tiles) = (full.select_rows(&pick).unwrap(), loaded.select_rows(&pick).unwrap());
    assert_eq!(from_rows.matmul(&x, 4), from_tiles.matmul(&x, 4), "rows selected from the tiles");
    assert!(loaded.select_rows(&[48]).is_none());
    let y = full.matmul(&x, 4);
    for (parts, tiles_only) in [(vec![&loaded, &loaded], true), (vec![&loaded, &full], false)] {
        let stacked = Q8Matrix::stack(&parts).unwrap();
        assert_eq!(stacked.tiles_only(), tiles_only);
        let z = stacked.matmul(&x, 4);
        for r in 0..4 {
            let (two, one) = (&z[r * 2 * n_out..(r + 1) * 2 * n_out], &y[r * n_out..(r + 1) * n_out]);
            assert_eq!(output_bits_of(&two[..n_out]), output_bits_of(one));
            assert_eq!(output_bits_of(&two[n_out..]), output_bits_of(one));
        }
    }
    // A partial group of outputs keeps the rows.
    let odd = ggml_bytes(20, n_in, 59, GgmlDType::Q8_0);
    assert!(!Q8Matrix::from_file(&odd, 20, n_in, false, Isa::best()).unwrap().tiles_only());
}
