//! `cargo bench`: the costs that decide whether speculation pays on this machine.
//! * quantized matmul of k activation rows against a 576 x 1536 weight (one FFN matrix of the
//!   default target): candle's matmul for each weight format, and our batched kernels (`ours_*`,
//!   with and without Intel AMX tiles where the CPU has them);
//! * our Q8_0 kernel on the shipped draft's shapes (its 49152 x 192 output head dominates its step);
//! * attention of the 3 heads that share a KV head on the default target (head size 64) over 256
//!   and 1024 keys: one pass for the three (`together`) against one head at a time (`alone`);
//! * one forward of the default target and of the shipped draft over k new tokens after a 64-token
//!   context, for k = 1, 2, 4, 8, 9, 16 (verification of k − 1 drafted tokens costs the k-token
//!   forward), with the CPU step and with the tensor path.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mentor_lab::kernels::{Isa, Q4Matrix, Q8Matrix};
use mentor_lab::{load_model, WeightFormat};

fn matmul(c: &mut Criterion) {
    let dev = Device::Cpu;
    let w = Tensor::randn(0f32, 1f32, (1536, 576), &dev).unwrap();
    let mut group = c.benchmark_group("matmul_576x1536");
    for (name, dtype) in [
        ("q8_0", GgmlDType::Q8_0),
        ("q4_1", GgmlDType::Q4_1),
        ("q4_0", GgmlDType::Q4_0),
        ("f16", GgmlDType::F16),
        ("f32", GgmlDType::F32),
    ] {
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
    let wv = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let ours_q8 = Q8Matrix::from_f32(&wv, 1536, 576, Isa::best()).unwrap();
    let q4 = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
    let ours_q4 = Q4Matrix::from_ggml_bytes(&q4.data().unwrap(), 1536, 576, true, Isa::best()).unwrap();
    let ours_q8_noamx = Q8Matrix::from_f32(&wv, 1536, 576, Isa::best()).unwrap().without_tiles();
    let ours_q4_noamx =
        Q4Matrix::from_ggml_bytes(&q4.data().unwrap(), 1536, 576, true, Isa::best()).unwrap().without_tiles();
    for k in [1usize, 4, 9, 16] {
        let x = Tensor::randn(0f32, 1f32, (k, 576), &dev).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        group.bench_with_input(BenchmarkId::new("ours_q8_0", k), &k, |b, &k| b.iter(|| ours_q8.matmul(&x, k)));
        group.bench_with_input(BenchmarkId::new("ours_q4_1", k), &k, |b, &k| b.iter(|| ours_q4.matmul(&x, k)));
        // The same without AMX tiles (where the CPU has them, the lines above use them from 2 rows).
        group.bench_with_input(BenchmarkId::new("ours_q8_0_noamx", k), &k, |b, &k| {
            b.iter(|| ours_q8_noamx.matmul(&x, k))
        });
        group.bench_with_input(BenchmarkId::new("ours_q4_1_noamx", k), &k, |b, &k| {
            b.iter(|| ours_q4_noamx.matmul(&x, k))
        });
    }
    group.finish();
}

fn draft_shapes(c: &mut Criterion) {
    let mut group = c.benchmark_group("ours_q8_0_draft_shapes");
    let mut seed = 1u64;
    let mut rand = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    };
    // (n_out, n_in): output head, stacked Q/K/V, stacked gate/up, down
    for (n_out, n_in) in [(49152usize, 192usize), (576, 192), (1280, 192), (192, 640)] {
        let m = Q8Matrix::from_f32(&rand(n_out * n_in), n_out, n_in, Isa::best()).unwrap();
        for k in [1usize, 9] {
            let x = rand(k * n_in);
            group.bench_with_input(BenchmarkId::new(format!("{n_out}x{n_in}"), k), &k, |b, &k| {
                b.iter(|| m.matmul(&x, k))
            });
        }
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    use mentor_lab::attention::{head_attend, heads_attend};
    let mut group = c.benchmark_group("attention_3_heads_hd64");
    let hd = 64;
    for n in [256usize, 1024] {
        let qs: Vec<f32> = (0..3 * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let keys: Vec<f32> = (0..n * hd).map(|i| (i as f32 * 0.11).cos()).collect();
        let values: Vec<f32> = (0..n * hd).map(|i| (i as f32 * 0.23).sin()).collect();
        let (mut scores, mut out) = (vec![0f32; 3 * n], vec![0f32; 3 * hd]);
        group.bench_with_input(BenchmarkId::new("together", n), &n, |b, _| {
            b.iter(|| heads_attend(&qs, hd, &keys, &values, &mut scores, &mut out))
        });
        group.bench_with_input(BenchmarkId::new("alone", n), &n, |b, &n| {
            b.iter(|| {
                for h in 0..3 {
                    head_attend(
                        &qs[h * hd..][..hd],
                        &keys,
                        &values,
                        &mut scores[h * n..][..n],
                        &mut out[h * hd..][..hd],
                    );
                }
            })
        });
    }
    group.finish();
}

fn forward_k(c: &mut Criterion) {
    let Ok(path) = mentor_lab::models::ensure_default_target(&mut |_| {}) else {
        eprintln!("default target unavailable; skipping forward benchmarks");
        return;
    };
    let mut runs = vec![
        ("target_forward_k", path.clone(), WeightFormat::Auto, true, "auto"),
        ("target_forward_k", path.clone(), WeightFormat::Auto, false, "auto_tensor_path"),
        ("target_forward_k", path, WeightFormat::F32, true, "f32"),
    ];
    if let Some(draft) = mentor_lab::models::default_draft() {
        runs.push(("draft_forward_k", draft.clone(), WeightFormat::Auto, true, "auto"));
        runs.push(("draft_forward_k", draft, WeightFormat::Auto, false, "auto_tensor_path"));
    }
    for (group_name, path, format, cpu_step, label) in runs {
        let mut group = c.benchmark_group(group_name);
        group.sample_size(20);
        let mut m = load_model(&path, format, &Device::Cpu).unwrap();
        m.model.set_cpu_step(cpu_step).unwrap();
        let ctx: Vec<u32> = (0..64).map(|i| 1000 + i).collect();
        m.model.forward(&ctx).unwrap();
        for k in [1usize, 2, 4, 8, 9, 16] {
            let new: Vec<u32> = (0..k as u32).map(|i| 2000 + i).collect();
            group.bench_with_input(BenchmarkId::new(label, k), &k, |b, _| {
                b.iter(|| {
                    m.model.truncate(64);
                    m.model.forward(&new).unwrap()
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, matmul, draft_shapes, attention, forward_k);
criterion_main!(benches);
