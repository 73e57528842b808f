//! Matrices built for each kernel path ([`Isa::for_path`]) side by side in one process: each
//! records the instruction sets it was built for and keeps them when stacked or selected, and all
//! give the same products bit for bit.

use super::tests::{ggml_bytes, pseudo_random};
use super::*;
use crate::options::KernelPath;
use candle_core::quantized::GgmlDType;

/// Every path that runs the project's kernels.
const PATHS: [KernelPath; 5] =
    [KernelPath::Auto, KernelPath::Avx2, KernelPath::Vnni256, KernelPath::NoAmx, KernelPath::NoTiles];

type Matmul = Box<dyn Fn(&[f32], usize) -> Vec<f32>>;

/// A matrix of each kernel format, read from a file's bytes as a model load reads its layers'
/// (into the tiles alone where they hold every output), built for `isa`: (name, the Isa it
/// records, its product).
fn matrices(n_out: usize, n_in: usize, isa: Isa) -> Vec<(&'static str, Isa, Matmul)> {
    let bytes = |dtype| ggml_bytes(n_out, n_in, 61, dtype);
    let q8 = Q8Matrix::from_file(&bytes(GgmlDType::Q8_0), n_out, n_in, false, isa).unwrap();
    let q6 = Q6Matrix::from_q6k_bytes(&bytes(GgmlDType::Q6K), n_out, n_in, isa).unwrap();
    let mut all: Vec<(&'static str, Isa, Matmul)> = vec![
        ("q8_0", q8.isa(), Box::new(move |x, n| q8.matmul(x, n))),
        ("q6_k", q6.isa(), Box::new(move |x, n| q6.matmul(x, n))),
    ];
    for (name, dtype, format) in [
        ("q4_0", GgmlDType::Q4_0, Q4File::Blocks(SmallBlocks::Q4_0)),
        ("q4_1", GgmlDType::Q4_1, Q4File::Blocks(SmallBlocks::Q4_1)),
        ("q5_0", GgmlDType::Q5_0, Q4File::Blocks(SmallBlocks::Q5_0)),
        ("q4_k", GgmlDType::Q4K, Q4File::Q4K),
        ("q5_k", GgmlDType::Q5K, Q4File::Q5K),
    ] {
        let m = Q4Matrix::from_file(&bytes(dtype), n_out, n_in, format, false, isa).unwrap();
        all.push((name, m.isa(), Box::new(move |x, n| m.matmul(x, n))));
    }
    all
}

/// Whole groups of 16 outputs (tiles alone where a path has them) and a partial group, single
/// rows and several: every path's matrices give the `avx2` path's products bit for bit.
#[test]
fn every_path_gives_the_same_products() {
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    for (n_out, n_in) in [(48, 512), (40, 768)] {
        let reference = matrices(n_out, n_in, Isa::for_path(KernelPath::Avx2));
        for path in PATHS {
            let isa = Isa::for_path(path);
            for ((name, built_for, matmul), (_, _, avx2)) in matrices(n_out, n_in, isa).iter().zip(&reference) {
                assert_eq!(*built_for, isa, "{name} records the Isa it was built for");
                for n_rows in [1, 2, 5, 9, 17] {
                    let x = pseudo_random(n_rows * n_in, 62 + n_rows as u64);
                    let label = format!("{name} {n_out}x{n_in}, {n_rows} rows, {path:?} ({isa})");
                    assert_eq!(bits(matmul(&x, n_rows)), bits(avx2(&x, n_rows)), "{label}");
                }
            }
        }
    }
}

/// Stacked and selected matrices keep their parts' Isa (and so their layout and kernels); parts
/// built for different instruction sets do not stack, and Q8_0's block sums are held only for
/// the VNNI kernels.
#[test]
fn stacks_and_selections_keep_the_isa() {
    let (n_out, n_in) = (32, 512);
    let w = pseudo_random(n_out * n_in, 63);
    let (q4, q6) = (ggml_bytes(n_out, n_in, 64, GgmlDType::Q4K), ggml_bytes(n_out, n_in, 65, GgmlDType::Q6K));
    for path in PATHS {
        let isa = Isa::for_path(path);
        let q8 = Q8Matrix::from_f32(&w, n_out, n_in, isa).unwrap();
        assert_eq!(q8.wsum.is_empty(), !isa.vnni(), "{path:?}: block sums only for the VNNI kernels");
        assert_eq!(q8.amx.is_some(), isa.tiles(), "{path:?}: tiles only where the Isa has them");
        assert_eq!(Q8Matrix::stack(&[&q8, &q8]).unwrap().isa(), isa);
        assert_eq!(q8.select_rows(&[3, 1]).unwrap().isa(), isa);
        let q4 = Q4Matrix::from_q4k_bytes(&q4, n_out, n_in, isa).unwrap();
        assert_eq!(Q4Matrix::stack(&[&q4, &q4]).unwrap().isa(), isa);
        assert_eq!(q4.select_rows(&[3, 1]).unwrap().isa(), isa);
        let q6 = Q6Matrix::from_q6k_bytes(&q6, n_out, n_in, isa).unwrap();
        assert_eq!(Q6Matrix::stack(&[&q6, &q6]).unwrap().isa(), isa);
        assert_eq!(q6.select_rows(&[3, 1]).unwrap().isa(), isa);
    }
    let (best, avx2) = (Isa::best(), Isa::for_path(KernelPath::Avx2));
    let (a, b) =
        (Q8Matrix::from_f32(&w, n_out, n_in, best).unwrap(), Q8Matrix::from_f32(&w, n_out, n_in, avx2).unwrap());
    assert_eq!(Q8Matrix::stack(&[&a, &b]).is_some(), best == avx2, "parts of different Isas do not stack");
}
