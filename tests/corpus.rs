//! Copying from a corpus of the user's files, on the real default pair: the copies come from the
//! corpus, are verified as copies, and leave the text at D = 0 the target's own.

#[path = "common/mod.rs"]
mod common;

use common::{draft_path, load_target};
use mentor_lab::adaptive::FixedCosts;
use mentor_lab::corpus::Corpus;
use mentor_lab::{
    load_model, Adaptive, Branches, Coupling, Drafting, Engine, GenerateRequest, Lookup, Mode, SamplingParams,
    TokenSource, TreeShape, WeightFormat,
};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const PROMPT: &str = "Write a short story about a lighthouse keeper who finds a message in a bottle.";

fn the_pair() -> Engine {
    let draft = load_model(&draft_path().unwrap(), WeightFormat::Auto, &candle_core::Device::Cpu).unwrap();
    Engine::new(load_target(WeightFormat::Auto), Some(draft)).unwrap()
}

/// At T = 0.7 under the same-seed coupling; greedy under max-acceptance (whose text at D = 0 is
/// another sample than target-only's unless sampling is greedy).
fn request(mode: Mode, drafting: Drafting, coupling: Coupling) -> GenerateRequest {
    let temperature = if coupling == Coupling::SameSeed { 0.7 } else { 0.0 };
    GenerateRequest {
        sampling: SamplingParams { temperature, ..SamplingParams::default() },
        prompt: PROMPT.into(),
        max_tokens: 96,
        ignore_eos: true,
        seed: 7,
        mode,
        drafting,
        coupling,
        ..GenerateRequest::default()
    }
}

fn ids(g: &mentor_lab::Generation) -> Vec<u32> {
    g.tokens.iter().map(|t| t.id).collect()
}

/// The target's own text in a file is the corpus: the adaptive policy copies from it (the context
/// alone has nothing to copy at first), the copies are marked as copies and verified as such, and
/// the text is the target-only text (same seed at T = 0.7, max-acceptance greedy), in chains and
/// in adaptive trees.
#[test]
fn copies_from_the_corpus_keep_the_targets_text() {
    let mut engine = the_pair();
    let cancel = AtomicBool::new(false);
    let policy = Adaptive { costs: Some(FixedCosts::default_pair(0.01)), ..Adaptive::default() };
    let tree = Adaptive { branches: Branches::Tree(TreeShape { width: 2, depth: 8 }), ..policy };
    for coupling in [Coupling::SameSeed, Coupling::MaxAcceptance] {
        let want = engine.generate(&request(Mode::Target, Drafting::Chain(4), coupling), &cancel, &mut |_| {}).unwrap();
        let text = engine.target.tokenizer.decode(&ids(&want)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("story.txt"), &text).unwrap();
        for adaptive in [policy, tree] {
            let req = request(Mode::Speculative, Drafting::Adaptive(adaptive), coupling);
            engine.corpus = None;
            let plain = engine.generate(&req, &cancel, &mut |_| {}).unwrap();
            let summary = engine.read_corpus(&[dir.path().to_path_buf()]).unwrap().unwrap();
            assert!(summary.starts_with("1 files"), "{summary}");
            let got = engine.generate(&req, &cancel, &mut |_| {}).unwrap();
            let at = format!("{coupling}, {:?}", adaptive.branches);
            assert_eq!(ids(&got), ids(&want), "{at}: copying from the corpus changed the text");
            assert_eq!(ids(&plain), ids(&want), "{at}");
            let copies = got.tokens.iter().filter(|t| t.source == TokenSource::CopyAccepted).count();
            assert!(copies > 48, "{at}: {copies} of 96 tokens copied");
            assert!(got.stats.n_copied_accepted > plain.stats.n_copied_accepted + 40, "{at}");
            assert!(got.stats.n_rounds < plain.stats.n_rounds, "{at}: copying saved no round");
            // Without copying, the corpus is not read from.
            let off = Drafting::Adaptive(Adaptive { lookup: Lookup::Off, ..adaptive });
            let g = engine.generate(&GenerateRequest { drafting: off, ..req.clone() }, &cancel, &mut |_| {}).unwrap();
            assert_eq!((ids(&g), g.stats.n_copied), (ids(&want), 0), "{at}");
        }
    }
}

/// Paths that do not exist, folders without text, and a corpus read with another tokenizer are
/// errors that say what to do; the engine keeps running.
#[test]
fn bad_corpora_are_refused_with_a_reason() {
    let mut engine = the_pair();
    let dir = tempfile::tempdir().unwrap();
    let e = engine.read_corpus(&[dir.path().join("nowhere")]).unwrap_err().to_string();
    assert!(e.contains("does not exist") && e.contains("nowhere"), "{e}");
    std::fs::write(dir.path().join("blob.bin"), [0u8, 159, 146, 150]).unwrap();
    std::fs::write(dir.path().join("notes.txt"), [0u8, 159, 146, 150]).unwrap();
    let e = engine.read_corpus(&[dir.path().to_path_buf()]).unwrap_err().to_string();
    assert!(e.contains("no text file") && e.contains("not UTF-8"), "{e}");
    assert!(engine.read_corpus(&[]).unwrap().is_none() && engine.corpus.is_none());
    let other = engine.target.tokenizer.pair_fingerprint() ^ 1;
    engine.corpus = Some(Arc::new(Corpus::from_ids(&[1, 2, 3, 4, 5, 6, 7], other)));
    let req = request(Mode::Speculative, Drafting::adaptive(), Coupling::SameSeed);
    let e = engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("another model's tokenizer"), "{e}");
    engine.corpus = None;
    assert_eq!(engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap().tokens.len(), 96);
}
