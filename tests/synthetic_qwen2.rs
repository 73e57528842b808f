//! The qwen2 code path (attention biases, half-split RoPE, padded vocabulary) on a tiny random
//! model written by the test.

#[path = "common/mod.rs"]
mod common;
#[path = "common/synthetic.rs"]
mod synthetic;

use candle_core::quantized::GgmlDType;
use candle_core::Device;
use mentor_lab::sampling::argmax;
use mentor_lab::{load_model, Drafting, Engine, GenerateRequest, SamplingParams, Verify, WeightFormat};
use std::sync::atomic::AtomicBool;

fn chunk_equals_steps(spec: synthetic::Spec, format: WeightFormat, tol: f32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    synthetic::write(&path, &spec);
    let mut m = load_model(&path, format, &Device::Cpu).unwrap();
    assert_eq!(m.info.arch, spec.arch);
    let ids = m.tokenizer.encode("the thin theatre in the rain").unwrap();
    assert!(ids.len() > 8);
    let chunked = m.model.forward_rows(&ids).unwrap();
    m.model.clear().unwrap();
    for (i, &id) in ids.iter().enumerate() {
        let row = m.model.forward_rows(&[id]).unwrap().remove(0);
        assert_eq!(row.len(), chunked[i].len());
        let d = row.iter().zip(&chunked[i]).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d <= tol, "position {i}: chunk vs step differ by {d}");
        // Quantized activations are rounded per row, so near-ties may flip; clear decisions may not.
        let best = argmax(&row);
        let second =
            row.iter().enumerate().filter(|(j, _)| *j != best).map(|(_, &v)| v).fold(f32::NEG_INFINITY, f32::max);
        if row[best] - second > 2.0 * d {
            assert_eq!(best, argmax(&chunked[i]), "position {i}");
        }
    }
}

#[test]
fn qwen2_f32_chunk_equals_steps() {
    chunk_equals_steps(synthetic::Spec::default(), WeightFormat::File, 1e-4);
}

#[test]
fn qwen2_q8_0_chunk_same_argmax() {
    // (Random weights, unseeded: measured differences up to ~0.05 for Q8_0.)
    let spec = synthetic::Spec { dtype: GgmlDType::Q8_0, ..Default::default() };
    chunk_equals_steps(spec, WeightFormat::Auto, 0.3);
}

#[test]
fn q4_1_file_weights_run_through_the_batched_kernel() {
    // (Measured differences up to ~0.14 with 4-bit weights.)
    let spec = synthetic::Spec { dtype: GgmlDType::Q4_1, ..Default::default() };
    chunk_equals_steps(spec, WeightFormat::File, 0.5);
}

#[test]
fn llama_synthetic_chunk_equals_steps() {
    let spec = synthetic::Spec { arch: "llama", biases: false, ..Default::default() };
    chunk_equals_steps(spec, WeightFormat::File, 1e-4);
}

#[test]
fn qwen2_biases_change_the_output() {
    // The biases must actually be applied: the same weights without them give other logits.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    synthetic::write(&path, &synthetic::Spec::default());
    let mut with = load_model(&path, WeightFormat::File, &Device::Cpu).unwrap();
    let rows = with.model.forward_rows(&[5, 6, 7]).unwrap();
    let as_llama = dir.path().join("tiny-llama.gguf");
    synthetic::write(&as_llama, &synthetic::Spec { biases: false, ..Default::default() });
    let mut without = load_model(&as_llama, WeightFormat::File, &Device::Cpu).unwrap();
    let rows2 = without.model.forward_rows(&[5, 6, 7]).unwrap();
    assert_ne!(rows, rows2);
}

#[test]
fn qwen2_generates_and_handles_padded_vocab() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    synthetic::write(&path, &synthetic::Spec::default());
    let m = load_model(&path, WeightFormat::File, &Device::Cpu).unwrap();
    let n_tok = m.tokenizer.vocab_size();
    assert!(m.model.config.n_vocab > n_tok, "head is padded");
    let mut engine = Engine::new(m, None).unwrap();
    let req = GenerateRequest {
        prompt: "the rain".into(),
        raw: true,
        sampling: SamplingParams { temperature: 1.0, ..Default::default() },
        max_tokens: 20,
        ignore_eos: true,
        ..Default::default()
    };
    let g = engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap();
    assert_eq!(g.tokens.len(), 20);
    assert!(g.tokens.iter().all(|t| (t.id as usize) < n_tok), "padding ids are never sampled");
}

#[test]
fn cpu_step_matches_the_tensor_path_for_both_architectures() {
    // qwen2: attention biases (stacked with Q/K/V), RoPE on halves; llama: RoPE on adjacent pairs.
    for spec in [
        synthetic::Spec { dtype: GgmlDType::Q8_0, ..Default::default() },
        synthetic::Spec { arch: "llama", biases: false, dtype: GgmlDType::Q8_0, ..Default::default() },
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        synthetic::write(&path, &spec);
        let mut m = load_model(&path, WeightFormat::Auto, &Device::Cpu).unwrap();
        let ids = m.tokenizer.encode("the thin theatre in the rain, then the theme").unwrap();
        let (cpu_step, tensor, _) = common::cpu_step_and_tensor_rows(&mut m, &ids);
        let (diffs, agree) = common::compare_rows(&cpu_step, &tensor);
        let max = diffs.iter().copied().fold(0.0, f32::max);
        eprintln!("{}: max |dlogit| {max:.5}, arg-max agrees {agree}/{}", spec.arch, diffs.len());
        assert!(max < 0.3, "{}: the CPU step and the tensor path differ by {max}", spec.arch);
        assert!(agree * 10 >= diffs.len() * 9, "{}: arg-max agrees at {agree} of {}", spec.arch, diffs.len());
    }
}

#[test]
fn head_token_list_restricts_the_head_and_a_bad_list_is_reported_and_ignored() {
    use candle_core::quantized::gguf_file::Value;
    let write = |extra: Vec<(String, Value)>| -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let spec = synthetic::Spec { dtype: GgmlDType::Q8_0, extra, ..Default::default() };
        synthetic::write(&path, &spec);
        (dir, path)
    };
    let key = mentor_lab::gguf::HEAD_TOKENS_KEY.to_string();
    let list = |ids: &[u32]| Value::Array(ids.iter().map(|&i| Value::U32(i)).collect());

    // A good list: the listed tokens keep their logits, every other token is −∞.
    let kept = [1u32, 5, 6, 7, 40, 41];
    let (_d, path) = write(vec![(key.clone(), list(&kept))]);
    let file = mentor_lab::gguf::ModelFile::open(&path).unwrap();
    assert_eq!(file.head_tokens().unwrap(), Some(kept.to_vec()));
    let mut m = load_model(&path, WeightFormat::Auto, &Device::Cpu).unwrap();
    assert_eq!(m.model.head_restriction(), Some(kept.len()));
    let small = m.model.forward_rows(&[5, 6, 7]).unwrap();
    m.model.clear().unwrap();
    m.model.set_head_restricted(false);
    let full = m.model.forward_rows(&[5, 6, 7]).unwrap();
    for (s, f) in small.iter().zip(&full) {
        for (t, (&a, &b)) in s.iter().zip(f).enumerate() {
            if kept.contains(&(t as u32)) {
                assert_eq!(a, b);
            } else {
                assert_eq!(a, f32::NEG_INFINITY);
            }
        }
    }

    // Bad lists: the file still loads, with the full head, and the reason names the key.
    let n_vocab = file.config.n_vocab as u32;
    for bad in [
        list(&[5, 3]),                                 // not ascending
        list(&[1, 1, 2]),                              // repeated
        list(&[1, n_vocab]),                           // outside the vocabulary
        list(&[]),                                     // empty
        Value::Array(vec![Value::String("a".into())]), // not token ids
        Value::U32(3),                                 // not a list
    ] {
        let (_d, path) = write(vec![(key.clone(), bad)]);
        let file = mentor_lab::gguf::ModelFile::open(&path).unwrap();
        let err = file.head_tokens().unwrap_err();
        assert!(err.contains(mentor_lab::gguf::HEAD_TOKENS_KEY), "{err}");
        let m = load_model(&path, WeightFormat::Auto, &Device::Cpu).unwrap();
        assert_eq!(m.model.head_restriction(), None);
    }
}

/// Q4_K_M-like files (Q4_K matrices; Q6_K for V, the FFN's down projection and the tied head),
/// Llama with GQA 4:1 and Qwen2 with biases, a Q5_K_M-like one, and one 224 wide in the
/// fallbacks of the K formats (Q5_0, Q5_1, Q8_0; Q4_K for the down projection): every matrix
/// runs in the project's kernels as the file has it (no re-quantization), the CPU step
/// agrees with the tensor path, and a chunk agrees with single steps.
#[test]
fn k_quant_files_run_in_the_kernels_as_the_file_has_them() {
    let q4_k_m = "Q4_K, batched kernel; also 5 × Q6_K, batched kernel, CPU step";
    for (arch, spec, expected) in [
        ("llama", synthetic::Spec { n_head: 8, n_kv_head: 2, ..synthetic::Spec::q4_k_m("llama") }, q4_k_m),
        ("qwen2", synthetic::Spec::q4_k_m("qwen2"), q4_k_m),
        (
            "llama",
            synthetic::Spec::q5_k_m("llama"),
            "Q5_K, batched kernel; also 5 × Q6_K, batched kernel, CPU step",
        ),
        (
            "qwen2",
            synthetic::Spec::narrow_k_quants("qwen2"),
            "Q5_0, batched kernel; also 1 × Q8_0, batched kernel, 2 × Q5_1, batched kernel, 2 × Q4_K, batched kernel, CPU step",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.gguf");
        synthetic::write(&path, &spec);
        let mut m = load_model(&path, WeightFormat::Auto, &Device::Cpu).unwrap();
        let desc = m.model.weight_desc.clone();
        if mentor_lab::kernels::q4_has_simd() && mentor_lab::kernels::q6_has_simd() {
            // 2 layers: V and down in their own formats (and the tied head), the rest in the main one.
            assert_eq!(desc, expected, "{arch}");
        }
        assert!(m.model.cpu_step(), "{arch}: {desc}");
        let ids = m.tokenizer.encode("the thin theatre in the rain, then the theme").unwrap();
        let (cpu_step, tensor, _) = common::cpu_step_and_tensor_rows(&mut m, &ids);
        let (diffs, agree) = common::compare_rows(&cpu_step, &tensor);
        let max = diffs.iter().copied().fold(0.0, f32::max);
        eprintln!("{arch} {:?}: max |dlogit| {max:.5}, arg-max agrees {agree}/{}", spec.dtype, diffs.len());
        assert!(max < 0.3, "{arch}: the CPU step and the tensor path differ by {max}");
        assert!(agree * 10 >= diffs.len() * 9, "{arch}: arg-max agrees at {agree} of {}", diffs.len());
        chunk_equals_steps(spec, WeightFormat::Auto, 0.5);
    }
}

/// A tiny target and draft written by the test; the target's list has `target_pad` extra entries.
fn padded_pair(
    dir: &std::path::Path,
    target_pad: usize,
    pad_as_real: bool,
) -> (mentor_lab::generate::LoadedModel, mentor_lab::generate::LoadedModel) {
    let target_path = dir.join("target.gguf");
    synthetic::write(&target_path, &synthetic::Spec { pad_tokens: target_pad, pad_as_real, ..Default::default() });
    let draft_path = dir.join("draft.gguf");
    synthetic::write(&draft_path, &synthetic::Spec { n_layer: 1, ..Default::default() });
    let target = load_model(&target_path, WeightFormat::File, &Device::Cpu).unwrap();
    let draft = load_model(&draft_path, WeightFormat::File, &Device::Cpu).unwrap();
    (target, draft)
}

/// Qwen2.5-7B's file lists 152,064 tokens, its 0.5B sibling's 151,936: the extra entries are
/// `[PAD…]` padding. Such a pair loads, never emits a padding id, and at D = 0 under the
/// same-seed coupling writes the target's own text.
#[test]
fn vocabularies_that_differ_only_by_padding_pair_up() {
    use mentor_lab::Mode;
    let dir = tempfile::tempdir().unwrap();
    let (target, draft) = padded_pair(dir.path(), 128, false);
    let n_draft = draft.tokenizer.vocab_size();
    assert_eq!(target.tokenizer.vocab_size(), n_draft + 128);
    assert_eq!(mentor_lab::generate::check_vocab(&target, &draft).unwrap(), n_draft);
    // The other way round (a padded draft) fits too.
    assert_eq!(mentor_lab::generate::check_vocab(&draft, &target).unwrap(), n_draft);
    // The app lists the draft under this target: the same fingerprint.
    assert_eq!(target.tokenizer.pair_fingerprint(), draft.tokenizer.pair_fingerprint());
    let mut engine = Engine::new(target, Some(draft)).unwrap();
    let plain = GenerateRequest {
        prompt: "the rain in the thin theatre".into(),
        raw: true,
        sampling: SamplingParams { temperature: 1.0, ..Default::default() },
        max_tokens: 24,
        ignore_eos: true,
        seed: 7,
        ..Default::default()
    };
    let spec = GenerateRequest {
        mode: Mode::Speculative,
        verify: Verify { budget: 0.0, ..plain.verify },
        drafting: Drafting::Chain(4),
        ..plain.clone()
    };
    let cancel = AtomicBool::new(false);
    let a = engine.generate(&plain, &cancel, &mut |_| {}).unwrap();
    let b = engine.generate(&spec, &cancel, &mut |_| {}).unwrap();
    let ids = |g: &mentor_lab::Generation| g.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&a), ids(&b), "same-seed D = 0 equals target-only");
    assert!(ids(&b).iter().all(|&id| (id as usize) < n_draft), "padding ids are never emitted");
    assert!(b.stats.n_rounds > 0);
}

/// Extra entries that are real tokens are a different tokenizer: a clear error.
#[test]
fn extra_real_tokens_are_a_vocabulary_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft) = padded_pair(dir.path(), 4, true);
    assert_ne!(target.tokenizer.pair_fingerprint(), draft.tokenizer.pair_fingerprint());
    assert!(target.tokenizer.fits_draft(&draft.tokenizer).is_err());
    let err = Engine::new(target, Some(draft)).err().expect("a mismatch");
    let msg = err.to_string();
    assert!(matches!(err, mentor_lab::EngineError::VocabMismatch { .. }), "{msg}");
    assert!(msg.contains("real token, not padding") && msg.contains("tok"), "{msg}");
}

/// A head-token list beside a draft (`<draft>.head-tokens`, as `mentor-lab head-tokens` writes it)
/// restricts its head when it loads as a draft, unless the full head is asked for; the target's
/// text at D = 0 does not change; a damaged list is an error that names it.
#[test]
fn a_head_token_list_beside_the_draft_restricts_its_head() {
    use mentor_lab::engine::{DraftUse, ModelChoice};
    use mentor_lab::{EngineOptions, Mode};
    let dir = tempfile::tempdir().unwrap();
    let (target, draft) = (dir.path().join("target.gguf"), dir.path().join("draft.gguf"));
    synthetic::write(&target, &synthetic::Spec { dtype: GgmlDType::Q8_0, ..Default::default() });
    synthetic::write(&draft, &synthetic::Spec { n_layer: 1, dtype: GgmlDType::Q8_0, ..Default::default() });
    let list = dir.path().join("draft.gguf.head-tokens");
    let kept: Vec<u32> = (0..200).collect();
    mentor_lab::head_tokens::write_list(&list, &kept).unwrap();
    let choice =
        ModelChoice { target: Some(target), draft: Some(draft), weights: WeightFormat::File, draft_weights: None };
    let load = |options: &EngineOptions| Engine::load(&choice, DraftUse::Required, options, &mut |_| {});
    let mut engine = load(&EngineOptions::default()).unwrap().engine;
    assert_eq!(engine.draft.as_ref().unwrap().model.head_restriction(), Some(200));
    assert_eq!(engine.target.model.head_restriction(), None, "a target's head is never restricted");
    let plain = GenerateRequest {
        prompt: "the thin theatre".into(),
        raw: true,
        sampling: SamplingParams { temperature: 1.0, ..Default::default() },
        max_tokens: 16,
        ignore_eos: true,
        ..Default::default()
    };
    let spec = GenerateRequest { mode: Mode::Speculative, drafting: Drafting::Chain(3), ..plain.clone() };
    let cancel = AtomicBool::new(false);
    let ids = |g: mentor_lab::Generation| g.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    let a = ids(engine.generate(&plain, &cancel, &mut |_| {}).unwrap());
    let b = engine.generate(&spec, &cancel, &mut |_| {}).unwrap();
    assert!(b.tokens.iter().filter_map(|t| t.drafted).all(|x| x < 200), "drafts come from the list");
    assert_eq!(a, ids(b));
    let full = load(&EngineOptions { restricted_head: false, ..Default::default() }).unwrap().engine;
    assert_eq!(full.draft.as_ref().unwrap().model.head_restriction(), None);
    std::fs::write(&list, "5\n3\n").unwrap();
    let err = load(&EngineOptions::default()).err().expect("a damaged list is an error").to_string();
    assert!(err.contains("head-tokens") && err.contains("ascending"), "{err}");
}
