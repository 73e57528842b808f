//! A second opinion that needs nothing but this repository: candle-transformers' own quantized
//! Llama and Qwen2 models, an independent implementation of the same architectures, compute the
//! last position's logits for the same GGUF file, and the project's forward (CPU step
//! and batched kernels) must agree with them: on the real default target and on synthetic Llama
//! and Qwen2 files (GQA, attention biases, both RoPE layouts). The llama.cpp comparison in
//! `benches/` is the third opinion.

#[path = "common/mod.rs"]
mod common;
#[path = "common/synthetic.rs"]
mod synthetic;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2};
use mentor_lab::{load_model, WeightFormat};
use std::path::Path;

/// candle-transformers' last-position logits for `ids` (one forward over all of them).
fn candle_logits(path: &Path, ids: &[u32]) -> Vec<f32> {
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let arch = content.metadata["general.architecture"].to_string().unwrap().clone();
    let input = Tensor::new(ids, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let logits = match arch.as_str() {
        "llama" => {
            let mut m = quantized_llama::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
            m.forward(&input, 0).unwrap()
        }
        "qwen2" => {
            let mut m = quantized_qwen2::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
            m.forward(&input, 0).unwrap()
        }
        other => panic!("no candle-transformers model for {other}"),
    };
    logits.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// The project's last-position logits, with the CPU step (`cpu_step`) or the tensor path.
fn our_logits(path: &Path, ids: &[u32], format: WeightFormat, cpu_step: bool) -> Vec<f32> {
    let mut m = load_model(path, format, &Device::Cpu).unwrap();
    m.model.set_cpu_step(cpu_step).unwrap();
    assert_eq!(m.model.cpu_step(), cpu_step);
    m.model.forward_rows(ids).unwrap().pop().unwrap()
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// (KL(theirs ‖ ours) in nats, the largest |Δ log p| over the 5 tokens candle finds likeliest,
/// whether both put the same token first).
fn compare(ours: &[f32], theirs: &[f32]) -> (f64, f64, bool) {
    assert_eq!(ours.len(), theirs.len(), "vocabulary sizes differ");
    let (lo, lt) = (log_softmax(ours), log_softmax(theirs));
    let kl: f64 = lt.iter().zip(&lo).map(|(t, o)| t.exp() * (t - o)).sum();
    let mut order: Vec<usize> = (0..lt.len()).collect();
    order.sort_by(|&a, &b| lt[b].total_cmp(&lt[a]));
    let top_diff = order[..5].iter().map(|&i| (lt[i] - lo[i]).abs()).fold(0.0, f64::max);
    let argmax = |v: &[f64]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
    (kl, top_diff, argmax(&lo) == argmax(&lt))
}

/// `src` with every tensor dequantized to F32: the plain dequantize-then-f32 reference.
fn dequantized_copy(src: &Path, dst: &Path) {
    let mut file = std::fs::File::open(src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> = names
        .iter()
        .map(|n| {
            let q = content.tensor(&mut file, n, &Device::Cpu).unwrap();
            let f = q.dequantize(&Device::Cpu).unwrap();
            (n.to_string(), QTensor::quantize(&f, GgmlDType::F32).unwrap())
        })
        .collect();
    let md: Vec<(&str, &Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(dst).unwrap(), &md, &ts).unwrap();
}

/// The default target (30 layers, interleaved RoPE, GQA 3:1, tied embeddings) on a chat prompt.
/// Dequantized to F32, candle-transformers and the project's tensor path compute the same
/// arithmetic, so they agree to float rounding. On the Q4_1 file as it is, the project's kernels
/// differ from that F32 reference only by quantizing the activations to 8 bits: a KL of a few
/// thousandths of a nat (candle's own Q4_1 kernels differ from it by as much).
#[test]
fn the_default_target_agrees_with_candle_transformers() {
    let path = common::target_path();
    let dir = tempfile::tempdir().unwrap();
    let f32_copy = dir.path().join("target-f32.gguf");
    dequantized_copy(&path, &f32_copy);
    let tok = common::load_target(WeightFormat::File).tokenizer;
    let ids = tok.prompt_ids("Name three rivers in Europe and say which is longest.", false).unwrap();
    let reference = candle_logits(&f32_copy, &ids);

    let ours_f32 = our_logits(&f32_copy, &ids, WeightFormat::File, false);
    let (kl, top_diff, same_first) = compare(&ours_f32, &reference);
    eprintln!("F32 copy, tensor path: KL {kl:.2e} nats, top-5 max |Δ log p| {top_diff:.2e}");
    assert!(same_first && kl < 1e-6 && top_diff < 1e-3, "F32: KL {kl}, top-5 |Δ log p| {top_diff}");

    let (candle_kl, candle_top, _) = compare(&candle_logits(&path, &ids), &reference);
    eprintln!("Q4_1 file, candle's kernels: KL {candle_kl:.5} nats, top-5 max |Δ log p| {candle_top:.4}");
    for cpu_step in [true, false] {
        let ours = our_logits(&path, &ids, WeightFormat::File, cpu_step);
        let (kl, top_diff, same_first) = compare(&ours, &reference);
        eprintln!("Q4_1 file, cpu_step step {cpu_step}: KL {kl:.5} nats, top-5 max |Δ log p| {top_diff:.4}");
        assert!(same_first, "cpu_step {cpu_step}: the likeliest token differs");
        assert!(kl < 0.01 && top_diff < 0.25, "cpu_step {cpu_step}: KL {kl} nats, top-5 |Δ log p| {top_diff}");
    }
}

/// Synthetic files in the shapes users bring, small enough for CI: F32 weights (where both
/// programs compute the same arithmetic, so agreement is tight) and Q8_0.
#[test]
fn synthetic_llama_and_qwen2_agree_with_candle_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // (arch, biases, heads, kv heads, dtype, tolerance on KL)
        ("qwen2", true, 4, 2, GgmlDType::F32, 1e-6),
        ("qwen2", true, 8, 1, GgmlDType::Q8_0, 2e-3),
        ("llama", false, 8, 2, GgmlDType::F32, 1e-6),
        ("llama", false, 4, 4, GgmlDType::Q8_0, 2e-3),
    ];
    for (i, (arch, biases, n_head, n_kv_head, dtype, max_kl)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("{arch}-{i}.gguf"));
        let n_embd = 64;
        let extra = vec![(format!("{arch}.rope.dimension_count"), Value::U32((n_embd / n_head) as u32))];
        let spec = synthetic::Spec { arch, biases, n_head, n_kv_head, n_embd, dtype, extra, ..Default::default() };
        synthetic::write(&path, &spec);
        let ids: Vec<u32> = (0..24).map(|j| 2 + (j * 37 + i as u32 * 11) % 250).collect();
        let theirs = candle_logits(&path, &ids);
        // F32 weights run on the tensor path only; Q8_0 also on the CPU step.
        let paths: &[bool] = if dtype == GgmlDType::F32 { &[false] } else { &[true, false] };
        for &cpu_step in paths {
            let ours = our_logits(&path, &ids, WeightFormat::File, cpu_step);
            let (kl, top_diff, same_first) = compare(&ours, &theirs);
            eprintln!(
                "{arch} {n_head}:{n_kv_head} {dtype:?}, cpu_step {cpu_step}: KL {kl:.2e}, top-5 |Δ log p| {top_diff:.2e}"
            );
            assert!(
                same_first && kl < max_kl,
                "{arch} {dtype:?} cpu_step {cpu_step}: KL {kl}, top-5 |Δ log p| {top_diff}"
            );
        }
    }
}

/// Q4_K_M-like synthetic files (Q4_K and Q6_K matrices, read by our kernels as they are), a
/// Q5_K_M-like one and one 224 wide in the K formats' fallbacks (Q5_0, Q5_1, Q8_0):
/// candle-transformers dequantizes the same blocks its own way; the activations' rounding differs
/// (Q8_K per 256 there, Q8_0 per 32 here), so the tolerance is that of the Q8_0 cases.
#[test]
fn k_quant_files_agree_with_candle_transformers() {
    let dir = tempfile::tempdir().unwrap();
    type SpecFor = fn(&'static str) -> synthetic::Spec;
    let files: [(&str, usize, usize, SpecFor); 4] = [
        ("llama", 8, 1, synthetic::Spec::q4_k_m),
        ("qwen2", 4, 2, synthetic::Spec::q4_k_m),
        ("llama", 4, 1, synthetic::Spec::q5_k_m),
        ("qwen2", 7, 1, synthetic::Spec::narrow_k_quants),
    ];
    for (i, (arch, n_head, n_kv_head, spec_for)) in files.into_iter().enumerate() {
        let path = dir.path().join(format!("{arch}-{i}-k.gguf"));
        let base = spec_for(arch);
        let mix = format!("{:?} mix", base.dtype);
        let extra = vec![(format!("{arch}.rope.dimension_count"), Value::U32((base.n_embd / n_head) as u32))];
        let spec = synthetic::Spec { n_head, n_kv_head, extra, ..base };
        synthetic::write(&path, &spec);
        let ids: Vec<u32> = (0..24).map(|j| 2 + (j * 41 + i as u32 * 7) % 250).collect();
        let theirs = candle_logits(&path, &ids);
        for cpu_step in [true, false] {
            let ours = our_logits(&path, &ids, WeightFormat::Auto, cpu_step);
            let (kl, top_diff, same_first) = compare(&ours, &theirs);
            // The logits themselves, relative to their spread (these random models are peaked, so
            // KL alone sees little of the vocabulary).
            let n = theirs.len() as f64;
            let mean = theirs.iter().map(|&v| v as f64).sum::<f64>() / n;
            let spread = (theirs.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
            let rel = ours.iter().zip(&theirs).map(|(&a, &b)| (a as f64 - b as f64).abs()).sum::<f64>() / n / spread;
            eprintln!(
                "{arch} {n_head}:{n_kv_head} {mix}, cpu_step {cpu_step}: KL {kl:.2e}, top-5 |Δ log p| {top_diff:.2e}, \
                 mean |Δ logit| / spread {rel:.2e}"
            );
            assert!(same_first && kl < 2e-3, "{arch} {mix} cpu_step {cpu_step}: KL {kl}, top-5 |Δ log p| {top_diff}");
            assert!(rel < 0.05, "{arch} {mix} cpu_step {cpu_step}: mean |Δ logit| is {rel} of the logits' spread");
        }
    }
}
