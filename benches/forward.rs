//! `cargo bench`: the costs that decide whether speculation pays on this machine.
//! * quantized matmul of k activation rows against a 576 x 1536 weight (one FFN matrix of the
//!   default target) for each weight format;
//! * one forward of the default target over k new tokens after a 64-token context, for
//!   k = 1, 2, 4, 8, 9, 16 (verification of k − 1 drafted tokens costs the k-token forward).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mentor_lab::{load_model, WeightFormat};

fn matmul(c: &mut Criterion) {
    let dev = Device::Cpu;
    let w = Tensor::randn(0f32, 1f32, (1536, 576), &dev).unwrap();
    let mut group = c.benchmark_group("matmul_576x1536");
    for (name, dtype) in [("q8_0", GgmlDType::Q8_0), ("q4_1", GgmlDType::Q4_1), ("q4_0", GgmlDType::Q4_0), ("f16", GgmlDType::F16), ("f32", GgmlDType::F32)] {
        let mm = match dtype {
            GgmlDType::F32 => QMatMul::Tensor(w.clone()),
            GgmlDType::F16 => QMatMul::TensorF16(w.to_dtype(candle_core::DType::F16).unwrap()),
            d => QMatMul::from_qtensor(QTensor::quantize(&w, d).unwrap()).unwrap(),
        };
        for k in [1usize, 4, 9, 16] {
            let x = Tensor::randn(0f32, 1f32, (k, 576), &dev).unwrap();
            group.bench_with_input(BenchmarkId::new(name, k), &k, |b, _| b.iter(|| mm.forward(&x).unwrap()));
        }
    }
    group.finish();
}

fn forward_k(c: &mut Criterion) {
    let Ok(path) = mentor_lab::models::ensure_default_target(&mut |_| {}) else {
        eprintln!("default target unavailable; skipping forward benchmarks");
        return;
    };
    let mut group = c.benchmark_group("target_forward_k");
    group.sample_size(20);
    for format in [WeightFormat::Auto, WeightFormat::F32] {
        let mut m = load_model(&path, format, &Device::Cpu).unwrap();
        let ctx: Vec<u32> = (0..64).map(|i| 1000 + i).collect();
        m.model.forward(&ctx).unwrap();
        for k in [1usize, 2, 4, 8, 9, 16] {
            let new: Vec<u32> = (0..k as u32).map(|i| 2000 + i).collect();
            group.bench_with_input(BenchmarkId::new(format!("{format:?}"), k), &k, |b, _| {
                b.iter(|| {
                    m.model.truncate(64);
                    m.model.forward(&new).unwrap()
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, matmul, forward_k);
criterion_main!(benches);
