//! The K-quant matrices (Q4_K and Q5_K through [`Q4Matrix`], Q6_K through [`Q6Matrix`]) against GGML's
//! dequantization (candle's), an f32 reference, the portable path and themselves.

use super::*;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

#[cfg(target_arch = "x86_64")]
use super::tests::output_bits;
use super::tests::pseudo_random;

/// Shapes with one, two and eight super-blocks per row (67 outputs leave a part of a task), and
/// for the formats of 32-weight blocks widths with every kind of chunk after the whole groups:
/// 480 = 8 + 4 + 2 + 1 blocks, 896 (Qwen2.5-0.5B's) = 3 × 8 + 4, 96 = 2 + 1.
const SHAPES: [(usize, usize); 6] = [(67, 256), (20, 512), (9, 2048), (21, 480), (9, 896), (5, 96)];

/// A candle-quantized pseudo-random matrix: its file bytes and candle's (GGML's) dequantization.
fn quantized(n_out: usize, n_in: usize, dtype: GgmlDType, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let t = Tensor::from_vec(pseudo_random(n_out * n_in, seed), (n_out, n_in), &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&t, dtype).unwrap();
    let w = qt.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    (qt.data().unwrap().into_owned(), w)
}

pub(super) fn q4_dequantize(m: &Q4Matrix) -> Vec<f32> {
    let nb = m.n_in / BLOCK;
    let mut w = Vec::with_capacity(m.n_out * m.n_in);
    for o in 0..m.n_out {
        let q = m.quants_row(o);
        w.extend(q.iter().enumerate().map(|(i, &q)| {
            let (d, m) = m.scales.get(o * nb + i / BLOCK);
            d * q as f32 + m
        }));
    }
    w
}

/// The K formats as (name, matmul, portable path, weights as the kernel holds them, file weights).
type Matmul = Box<dyn Fn(&[f32], usize) -> Vec<f32>>;
type Portable = Box<dyn Fn(&Q8Rows, &mut [f32])>;
type KMatrix = (&'static str, Matmul, Portable, Vec<f32>, Vec<f32>);
fn k_matrices(n_out: usize, n_in: usize, seed: u64) -> Vec<KMatrix> {
    let mut all = small_matrices(n_out, n_in, seed + 3);
    if n_in.is_multiple_of(QK_K) {
        all.extend(super_block_matrices(n_out, n_in, seed));
    }
    all
}

/// Q5_0 and Q5_1 as [`KMatrix`]es.
fn small_matrices(n_out: usize, n_in: usize, seed: u64) -> Vec<KMatrix> {
    [("q5_0", GgmlDType::Q5_0, SmallBlocks::Q5_0), ("q5_1", GgmlDType::Q5_1, SmallBlocks::Q5_1)]
        .into_iter()
        .enumerate()
        .map(|(i, (name, dtype, format))| {
            let (bytes, w) = quantized(n_out, n_in, dtype, seed + i as u64);
            let m = std::sync::Arc::new(Q4Matrix::from_blocks(&bytes, n_out, n_in, format, Isa::best()).unwrap());
            let (a, b) = (m.clone(), m.clone());
            (
                name,
                Box::new(move |x: &[f32], n| a.matmul(x, n)) as Matmul,
                Box::new(move |xq: &Q8Rows, out: &mut [f32]| b.rows_portable(0..n_out, xq, out)) as Portable,
                q4_dequantize(&m),
                w,
            )
        })
        .collect()
}

fn super_block_matrices(n_out: usize, n_in: usize, seed: u64) -> Vec<KMatrix> {
    let (b4, w4) = quantized(n_out, n_in, GgmlDType::Q4K, seed);
    let q4 = std::sync::Arc::new(Q4Matrix::from_q4k_bytes(&b4, n_out, n_in, Isa::best()).unwrap());
    let (b6, w6) = quantized(n_out, n_in, GgmlDType::Q6K, seed + 1);
    let q6 = std::sync::Arc::new(Q6Matrix::from_q6k_bytes(&b6, n_out, n_in, Isa::best()).unwrap());
    let (b5, w5) = quantized(n_out, n_in, GgmlDType::Q5K, seed + 2);
    let q5 = std::sync::Arc::new(Q4Matrix::from_q5k_bytes(&b5, n_out, n_in, Isa::best()).unwrap());
    let (q4a, q4b, q6a, q6b, q5a, q5b) = (q4.clone(), q4.clone(), q6.clone(), q6.clone(), q5.clone(), q5.clone());
    vec![
        (
            "q5_k",
            Box::new(move |x: &[f32], n| q5a.matmul(x, n)) as Matmul,
            Box::new(move |xq: &Q8Rows, out: &mut [f32]| q5b.rows_portable(0..n_out, xq, out)) as Portable,
            q4_dequantize(&q5),
            w5,
        ),
        (
            "q4_k",
            Box::new(move |x: &[f32], n| q4a.matmul(x, n)) as Matmul,
            Box::new(move |xq: &Q8Rows, out: &mut [f32]| q4b.rows_portable(0..n_out, xq, out)) as Portable,
            q4_dequantize(&q4),
            w4,
        ),
        (
            "q6_k",
            Box::new(move |x: &[f32], n| q6a.matmul(x, n)),
            Box::new(move |xq: &Q8Rows, out: &mut [f32]| q6b.rows_portable(0..n_out, xq, out)),
            q6.dequantize(),
            w6,
        ),
    ]
}

/// The kernels hold exactly the file's weights: their dequantization equals GGML's bit for bit
/// (for Q5_0 in value: GGML's (q − 16)·d is −0 where d < 0 and q = 16, d·q − 16·d is +0).
#[test]
fn k_quants_are_read_exactly_as_the_file_has_them() {
    for (n_out, n_in) in SHAPES {
        for (name, _, _, ours, file) in k_matrices(n_out, n_in, 11) {
            let bits = |w: &[f32]| w.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            match name {
                "q5_0" => assert!(ours == file, "{name} {n_out}x{n_in}"),
                _ => assert_eq!(bits(&ours), bits(&file), "{name} {n_out}x{n_in}"),
            }
        }
    }
}

/// Against the exact product with the file's weights (the only error is the activations' 8-bit
/// rounding), the portable path (other summation order) and single rows (bit for bit).
#[test]
fn k_kernels_match_f32_and_portable_and_are_batch_exact() {
    for (n_out, n_in) in SHAPES {
        for (name, matmul, portable, w, _) in k_matrices(n_out, n_in, 12) {
            for n_rows in [1, 2, 3, 4, 5, 7, 9, 17] {
                let x = pseudo_random(n_rows * n_in, 13 + n_rows as u64);
                let all = matmul(&x, n_rows);
                let xq = quantize_rows(&x, n_rows, n_in);
                let mut slow = vec![0f32; n_out * n_rows];
                portable(&xq, &mut slow);
                for r in 0..n_rows {
                    let one = matmul(&x[r * n_in..(r + 1) * n_in], 1);
                    assert_eq!(
                        &all[r * n_out..(r + 1) * n_out],
                        &one[..],
                        "{name} {n_out}x{n_in}: row {r} of {n_rows}"
                    );
                    for o in 0..n_out {
                        let exact: f64 =
                            (0..n_in).map(|i| w[o * n_in + i] as f64 * x[r * n_in + i] as f64).sum::<f64>();
                        let (f, p) = (all[r * n_out + o], slow[o * n_rows + r]);
                        assert!((f - p).abs() <= 1e-3 * (1.0 + p.abs()), "{name}: simd {f} vs portable {p}");
                        // 8-bit activations: ~0.005 error per term of size ~1, so ~0.005·√n_in.
                        let tol = 0.03 * (n_in as f64).sqrt();
                        assert!((f as f64 - exact).abs() < tol, "{name} {n_out}x{n_in}: {f} vs exact {exact}");
                    }
                }
            }
        }
    }
}

/// Where the CPU has AVX-512 VNNI, the Q6_K VNNI kernel gives the AVX2 kernel's results bit for
/// bit (the same integer sums, scaled and added in the same order).
#[test]
#[cfg(target_arch = "x86_64")]
fn q6_vnni_equals_avx2() {
    if !Isa::best().vnni() {
        eprintln!("no AVX-512 VNNI on this CPU: nothing to compare");
        return;
    }
    for (n_out, n_in) in SHAPES.into_iter().filter(|&(_, n_in)| n_in.is_multiple_of(QK_K)) {
        let (bytes, _) = quantized(n_out, n_in, GgmlDType::Q6K, 21);
        let m = Q6Matrix::from_q6k_bytes(&bytes, n_out, n_in, Isa::best()).unwrap();
        for n_rows in [1, 2, 3, 5, 6, 9] {
            let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 22 + n_rows as u64), n_rows, n_in);
            xq.fill_half_sums();
            let run = |f: &dyn Fn(&mut [f32])| output_bits(n_out * n_rows, f);
            // SAFETY: `Isa::best` has AVX-512 VNNI and VL, which imply AVX2 and FMA here.
            unsafe {
                assert_eq!(
                    run(&|o| m.rows_vnni(0..n_out, &xq, o)),
                    run(&|o| m.rows_avx2_impl(0..n_out, &xq, o)),
                    "q6_k {n_out}x{n_in}, {n_rows} rows"
                );
            }
        }
    }
}

/// Where the 512-bit VNNI kernels run, Q6_K matrices hold the 16-output tile layout, and the
/// tile kernel gives the row kernel's results bit for bit for every number of rows (outputs past
/// the whole groups left to the row kernel).
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn q6_tiles_equal_the_row_kernel() {
    if !Isa::best().tiles() {
        eprintln!("no 512-bit VNNI here (or the kernel path turns tiles off): nothing to compare");
        assert!(Q6Matrix::from_q6k_bytes(&quantized(32, 256, GgmlDType::Q6K, 23).0, 32, 256, Isa::best())
            .unwrap()
            .tiles
            .is_none());
        return;
    }
    for (n_out, n_in) in [(32, 256), (48, 1536), (35, 768), (16, 512), (67, 256)] {
        let (bytes, _) = quantized(n_out, n_in, GgmlDType::Q6K, 24);
        let m = Q6Matrix::read(&bytes, n_out, n_in, true, Isa::best()).unwrap();
        let tiles = m.tiles.as_ref().expect("a tile layout where 512-bit VNNI runs");
        assert_eq!(tiles.covers(n_out), n_out % 16 == 0);
        for n_rows in [1, 2, 3, 4, 5, 9, 16, 17, 33] {
            let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 25 + n_rows as u64), n_rows, n_in);
            xq.fill_half_sums();
            let mut rows = vec![0f32; n_out * n_rows];
            let mut ours = vec![f32::NAN; n_out * n_rows];
            // SAFETY: tiles exist only with the 512-bit VNNI kernels (AVX-512 F, BW, VNNI and VL);
            // the half sums are filled and `ours` is n_rows × n_out.
            let done = unsafe {
                m.rows_vnni(0..n_out, &xq, &mut rows);
                tiles.rows(n_in, 0..n_out, &xq, ours.as_mut_ptr(), n_out)
            };
            assert_eq!(done, n_out / 16 * 16);
            for r in 0..n_rows {
                for o in 0..n_out {
                    let got = ours[r * n_out + o];
                    match o < done {
                        true => assert_eq!(
                            got.to_bits(),
                            rows[o * n_rows + r].to_bits(),
                            "q6_k {n_out}x{n_in}, {n_rows} rows: row {r}, output {o}"
                        ),
                        false => assert!(got.is_nan(), "output {o} is past the whole groups and left alone"),
                    }
                }
            }
            // SAFETY: as above; a range that does not start a group is left to the row kernel.
            assert_eq!(unsafe { tiles.rows(n_in, 8..n_out, &xq, ours.as_mut_ptr(), n_out) }, 0);
        }
    }
}

/// A Q6_K matrix that keeps only its tiles gives the full matrix's results, rows and selected
/// rows, in about half the bytes; one with a partial group of outputs keeps its rows.
#[test]
fn a_q6_matrix_without_its_row_layout_gives_the_same_results() {
    let (n_out, n_in) = (48, 768);
    let bytes = quantized(n_out, n_in, GgmlDType::Q6K, 26).0;
    let full = Q6Matrix::read(&bytes, n_out, n_in, true, Isa::best()).unwrap();
    let mut compact = full.clone();
    compact.drop_row_layout();
    // Read straight into the tiles, as a model loads it.
    let loaded = Q6Matrix::from_q6k_bytes(&bytes, n_out, n_in, Isa::best()).unwrap();
    assert_eq!(loaded.tiles_only(), full.tiles.is_some());
    if full.tiles.is_none() {
        eprintln!("no tile layout here: nothing to drop");
        assert!(!compact.tiles_only());
        return;
    }
    assert!(compact.tiles_only() && !full.tiles_only());
    assert!(compact.bytes() * 10 < full.bytes() * 6, "{} vs {} bytes", compact.bytes(), full.bytes());
    assert_eq!((compact.tile_bytes(), full.tile_bytes()), (0, compact.bytes()));
    for n_rows in [1, 2, 5, 9, 16, 17] {
        let x = pseudo_random(n_rows * n_in, 27 + n_rows as u64);
        let (a, b, c) = (full.matmul(&x, n_rows), compact.matmul(&x, n_rows), loaded.matmul(&x, n_rows));
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{n_rows} rows");
        assert!(a.iter().zip(&c).all(|(p, q)| p.to_bits() == q.to_bits()), "{n_rows} rows, loaded");
    }
    assert_eq!(loaded.bytes(), compact.bytes());
    let xq = quantize_rows(&pseudo_random(3 * n_in, 28), 3, n_in);
    let (mut a, mut b) = (vec![0f32; n_out * 3], vec![0f32; n_out * 3]);
    full.rows_portable(0..n_out, &xq, &mut a);
    compact.rows_portable(0..n_out, &xq, &mut b);
    assert_eq!(a, b, "portable results from the tiles");
    assert_eq!(full.dequantize(), compact.dequantize(), "rows read back from the tiles");
    let pick = [47, 0, 16, 16, 5];
    let x = pseudo_random(4 * n_in, 29);
    let (from_rows, from_tiles) = (full.select_rows(&pick).unwrap(), compact.select_rows(&pick).unwrap());
    assert_eq!(from_rows.matmul(&x, 4), from_tiles.matmul(&x, 4), "rows selected from the tiles");
    assert!(compact.select_rows(&[48]).is_none());
    // Stacks: of tiles alone, and of tiles beside rows (a part with a partial group).
    let odd = Q6Matrix::from_q6k_bytes(&quantized(20, n_in, GgmlDType::Q6K, 31).0, 20, n_in, Isa::best()).unwrap();
    let x = pseudo_random(3 * n_in, 32);
    let (a, c) = (full.matmul(&x, 3), odd.matmul(&x, 3));
    for (parts, tiles_only) in [(vec![&compact, &loaded], true), (vec![&compact, &odd, &full], false)] {
        let stacked = Q6Matrix::stack(&parts).unwrap();
        assert_eq!(stacked.tiles_only(), tiles_only);
        let n = stacked.n_out;
        let y = stacked.matmul(&x, 3);
        for r in 0..3 {
            assert_eq!(&y[r * n..r * n + n_out], &a[r * n_out..(r + 1) * n_out]);
            if !tiles_only {
                assert_eq!(&y[r * n + n_out..r * n + n_out + 20], &c[r * 20..(r + 1) * 20]);
            }
            assert_eq!(&y[(r + 1) * n - n_out..(r + 1) * n], &a[r * n_out..(r + 1) * n_out]);
        }
    }
    let mut odd = Q6Matrix::from_q6k_bytes(&quantized(20, 256, GgmlDType::Q6K, 30).0, 20, 256, Isa::best()).unwrap();
    odd.drop_row_layout();
    assert!(!odd.tiles_only());
}

/// Stacked and row-selected Q6_K matrices give each part's and each row's results exactly.
#[test]
fn q6_stack_and_select_rows_keep_results() {
    let (n_in, n_rows) = (512, 3);
    let parts: Vec<Q6Matrix> = [(16, 31), (8, 32)]
        .iter()
        .map(|&(n, seed)| {
            Q6Matrix::from_q6k_bytes(&quantized(n, n_in, GgmlDType::Q6K, seed).0, n, n_in, Isa::best()).unwrap()
        })
        .collect();
    let x = pseudo_random(n_rows * n_in, 33);
    let stacked = Q6Matrix::stack(&parts.iter().collect::<Vec<_>>()).unwrap().matmul(&x, n_rows);
    let picked = parts[0].select_rows(&[5, 0, 15]).unwrap().matmul(&x, n_rows);
    let (a, b) = (parts[0].matmul(&x, n_rows), parts[1].matmul(&x, n_rows));
    for r in 0..n_rows {
        assert_eq!(&stacked[r * 24..r * 24 + 16], &a[r * 16..(r + 1) * 16]);
        assert_eq!(&stacked[r * 24 + 16..(r + 1) * 24], &b[r * 8..(r + 1) * 8]);
        assert_eq!(&picked[r * 3..(r + 1) * 3], &[a[r * 16 + 5], a[r * 16], a[r * 16 + 15]]);
    }
    assert!(parts[0].select_rows(&[16]).is_none());
}

/// Bytes that do not fit the shape are refused, not read past.
#[test]
fn k_matrices_refuse_bytes_of_the_wrong_size() {
    let (b4, _) = quantized(4, 256, GgmlDType::Q4K, 41);
    let (b6, _) = quantized(4, 256, GgmlDType::Q6K, 42);
    assert!(Q4Matrix::from_q4k_bytes(&b4[..b4.len() - 1], 4, 256, Isa::best()).is_none());
    assert!(Q4Matrix::from_q4k_bytes(&b4, 4, 128, Isa::best()).is_none());
    assert!(Q4Matrix::from_q4k_bytes(&b4, usize::MAX, 256, Isa::best()).is_none());
    assert!(Q6Matrix::from_q6k_bytes(&b6[..b6.len() - 1], 4, 256, Isa::best()).is_none());
    assert!(Q6Matrix::from_q6k_bytes(&b6, 8, 128, Isa::best()).is_none());
    assert!(Q6Matrix::from_q6k_bytes(&b6, 4, 0, Isa::best()).is_none());
    assert!(Q6Matrix::from_q6k_bytes(&b6, usize::MAX / 2, 256, Isa::best()).is_none());
    let (b5, _) = quantized(4, 256, GgmlDType::Q5K, 43);
    assert!(Q4Matrix::from_q5k_bytes(&b5[..b5.len() - 1], 4, 256, Isa::best()).is_none());
    assert!(Q4Matrix::from_q5k_bytes(&b4, 4, 256, Isa::best()).is_none(), "Q4_K bytes are too few for Q5_K");
    assert!(Q4Matrix::from_q5k_bytes(&b5, 4, 0, Isa::best()).is_none());
    let (b50, _) = quantized(4, 96, GgmlDType::Q5_0, 44);
    assert!(Q4Matrix::from_blocks(&b50[..b50.len() - 1], 4, 96, SmallBlocks::Q5_0, Isa::best()).is_none());
    assert!(Q4Matrix::from_blocks(&b50, 4, 96, SmallBlocks::Q5_1, Isa::best()).is_none());
    assert!(Q4Matrix::from_blocks(&b50, 4, 100, SmallBlocks::Q5_0, Isa::best()).is_none());
    assert!(Q4Matrix::from_blocks(&b50, usize::MAX / 2, 96, SmallBlocks::Q5_0, Isa::best()).is_none());
}

/// Where the CPU has AVX-512 VNNI, the 5-bit kernels on 256- and 512-bit VNNI give the AVX2
/// kernel's results bit for bit (Q5_0 with every kind of tail chunk, Q5_K's compact scales).
#[test]
#[cfg(target_arch = "x86_64")]
fn five_bit_vnni_kernels_equal_the_avx2_one() {
    let best = Isa::best();
    if !best.vnni() {
        eprintln!("no AVX-512 VNNI on this CPU: nothing to compare");
        return;
    }
    for (n_out, n_in) in SHAPES {
        let mut ms = vec![(
            "q5_0",
            Q4Matrix::from_blocks(&quantized(n_out, n_in, GgmlDType::Q5_0, 61).0, n_out, n_in, SmallBlocks::Q5_0, best),
        )];
        if n_in.is_multiple_of(QK_K) {
            ms.push((
                "q5_k",
                Q4Matrix::from_q5k_bytes(&quantized(n_out, n_in, GgmlDType::Q5K, 62).0, n_out, n_in, best),
            ));
        }
        for (name, m) in ms {
            let m = m.unwrap();
            for n_rows in [1, 2, 3, 5, 6, 9, 17] {
                let mut xq = quantize_rows(&pseudo_random(n_rows * n_in, 63 + n_rows as u64), n_rows, n_in);
                xq.fill_pairs_for_wide(best);
                let run = |f: &dyn Fn(&mut [f32])| output_bits(n_out * n_rows, f);
                // SAFETY: `best` has AVX-512 VNNI and VL, which imply AVX2 and FMA here; the
                // 512-bit path runs only where it has AVX-512 F and BW too.
                unsafe {
                    let avx2 = run(&|o| m.rows_avx2_impl(0..n_out, &xq, o));
                    assert_eq!(run(&|o| m.rows_vnni(0..n_out, &xq, o)), avx2, "{name} {n_out}x{n_in}, {n_rows} rows");
                    if best.vnni512() {
                        assert_eq!(run(&|o| m.rows_vnni512(0..n_out, &xq, o)), avx2, "{name} 512-bit {n_out}x{n_in}");
                    }
                }
            }
        }
    }
}

/// A Q4_K and a Q5_K matrix stack into one (the 4-bit part gets zero fifth bits) that gives each
/// part's results exactly; selected rows of a 5-bit matrix keep theirs.
#[test]
fn four_and_five_bit_parts_stack_and_select_rows() {
    let (n_in, n_rows) = (512, 3);
    let q4 = Q4Matrix::from_q4k_bytes(&quantized(16, n_in, GgmlDType::Q4K, 71).0, 16, n_in, Isa::best()).unwrap();
    let q5 = Q4Matrix::from_q5k_bytes(&quantized(8, n_in, GgmlDType::Q5K, 72).0, 8, n_in, Isa::best()).unwrap();
    let x = pseudo_random(n_rows * n_in, 73);
    let stacked = Q4Matrix::stack(&[&q4, &q5]).unwrap();
    assert!(stacked.is_five_bit());
    let stacked = stacked.matmul(&x, n_rows);
    let (a, b) = (q4.matmul(&x, n_rows), q5.matmul(&x, n_rows));
    let picked = q5.select_rows(&[7, 2]).unwrap().matmul(&x, n_rows);
    for r in 0..n_rows {
        assert_eq!(&stacked[r * 24..r * 24 + 16], &a[r * 16..(r + 1) * 16]);
        assert_eq!(&stacked[r * 24 + 16..(r + 1) * 24], &b[r * 8..(r + 1) * 8]);
        assert_eq!(&picked[r * 2..(r + 1) * 2], &[b[r * 8 + 7], b[r * 8 + 2]]);
    }
    assert!(q5.select_rows(&[8]).is_none());
}

/// The fifth-bit plane gives back every quant, whatever the row's chunks.
#[test]
fn fifth_bit_planes_round_trip() {
    for n_in in [896, 576, 480, 256, 224, 96, 64, 32] {
        let q: Vec<u8> = (0..n_in).map(|i| ((i * 13 + i / 32 * 7) % 32) as u8).collect();
        let mut rows = PackedRows::new(1, n_in, true);
        rows.pack(0, &q);
        let (nibbles, high) = rows.finish();
        assert_eq!(high.len(), high_row_bytes(n_in));
        let scales = Scales::Block { d: vec![], m: vec![] };
        let m = Q4Matrix { n_out: 1, n_in, scales, nibbles, high, amx: None, isa: Isa::best() };
        assert_eq!(m.quants_row(0), q, "n_in {n_in}");
    }
}

/// Stacked and row-selected Q4_K matrices (compact scales) give each part's and each row's
/// results exactly; a Q4_K matrix does not stack with a Q4_1 one.
#[test]
fn q4k_stack_and_select_rows_keep_results() {
    let (n_in, n_rows) = (512, 3);
    let parts: Vec<Q4Matrix> = [(16, 51), (8, 52)]
        .iter()
        .map(|&(n, seed)| {
            Q4Matrix::from_q4k_bytes(&quantized(n, n_in, GgmlDType::Q4K, seed).0, n, n_in, Isa::best()).unwrap()
        })
        .collect();
    let x = pseudo_random(n_rows * n_in, 53);
    let stacked = Q4Matrix::stack(&parts.iter().collect::<Vec<_>>()).unwrap().matmul(&x, n_rows);
    let picked = parts[1].select_rows(&[7, 2]).unwrap().matmul(&x, n_rows);
    let (a, b) = (parts[0].matmul(&x, n_rows), parts[1].matmul(&x, n_rows));
    for r in 0..n_rows {
        assert_eq!(&stacked[r * 24..r * 24 + 16], &a[r * 16..(r + 1) * 16]);
        assert_eq!(&stacked[r * 24 + 16..(r + 1) * 24], &b[r * 8..(r + 1) * 8]);
        assert_eq!(&picked[r * 2..(r + 1) * 2], &[b[r * 8 + 7], b[r * 8 + 2]]);
    }
    assert!(parts[1].select_rows(&[8]).is_none());
    let (q4_1, _) = quantized(8, n_in, GgmlDType::Q4_1, 54);
    let other = Q4Matrix::from_ggml_bytes(&q4_1, 8, n_in, true, Isa::best()).unwrap();
    assert!(Q4Matrix::stack(&[&parts[0], &other]).is_none());
}
