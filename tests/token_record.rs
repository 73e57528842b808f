//! Fixed-seed runs on the real default pair, compared with a record of their token ids, where
//! each token came from and each round's counts (`tests/data/token_record.txt`): a change to how
//! rounds are drafted, walked or verified that alters any run shows here as the first differing
//! line. Chains, trees, side offers, copying, both couplings, both drafts, lossy rules.
//!
//! `MENTOR_LAB_WRITE_RECORD=1 cargo test --test token_record` rewrites the record, for a change
//! that is meant to alter the runs.

#[path = "common/mod.rs"]
mod common;

use common::load_target;
use mentor_lab::adaptive::FixedCosts;
use mentor_lab::generate::LoadedModel;
use mentor_lab::{
    load_model, Adaptive, Branches, Coupling, Drafting, Engine, GenerateRequest, MentorRule, Mode, SamplingParams,
    TokenSource, TreeShape, Verify, WeightFormat,
};
use std::sync::atomic::AtomicBool;

const STORY: &str = "Write a short story about a lighthouse keeper who finds a message in a bottle.";
const CODE: &str = "Write a Python function that merges two sorted lists, with a docstring and an example.";

fn load(path: std::path::PathBuf) -> LoadedModel {
    load_model(&path, WeightFormat::Auto, &candle_core::Device::Cpu).unwrap()
}

fn source(s: TokenSource) -> char {
    match s {
        TokenSource::Target => 't',
        TokenSource::DraftAccepted => 'd',
        TokenSource::CopyAccepted => 'c',
        TokenSource::Resampled => 'r',
        TokenSource::Bonus => 'b',
        TokenSource::Draft => 'q',
    }
}

/// One line per run: its name, the token ids, their sources, and each round's proposed /
/// accepted / emitted / copied counts.
fn line(engine: &mut Engine, name: &str, req: &GenerateRequest) -> String {
    let g = engine.generate(req, &AtomicBool::new(false), &mut |_| {}).unwrap();
    let ids: Vec<String> = g.tokens.iter().map(|t| t.id.to_string()).collect();
    let sources: String = g.tokens.iter().map(|t| source(t.source)).collect();
    let rounds: Vec<String> =
        g.rounds.iter().map(|r| format!("{}/{}/{}/{}", r.n_proposed, r.n_accepted, r.n_emitted, r.n_copied)).collect();
    format!("{name}: {} | {sources} | {}", ids.join(" "), rounds.join(" "))
}

/// The runs of one draft: every round shape it supports under both couplings.
fn runs(feature: bool) -> Vec<(String, GenerateRequest)> {
    let cheap_rows = FixedCosts { draft_token_s: 0.001, verify_base_s: 0.0095, verify_row_s: 0.0005 };
    let base = GenerateRequest {
        sampling: SamplingParams { temperature: 0.7, ..SamplingParams::default() },
        max_tokens: 40,
        ignore_eos: true,
        seed: 5,
        mode: Mode::Speculative,
        drafting: Drafting::Chain(4),
        ..GenerateRequest::default()
    };
    let (same, max_acc, tv) = (Coupling::SameSeed, Coupling::MaxAcceptance, Verify::tv);
    let (chain, tree) = (Drafting::Chain(4), TreeShape { width: 3, depth: 4 });
    let adaptive = Adaptive { costs: Some(cheap_rows), ..Adaptive::default() };
    let auto = Drafting::Adaptive(adaptive);
    let side = Drafting::Adaptive(Adaptive { branches: Branches::SideOffers, ..adaptive });
    let auto_tree = Drafting::Adaptive(Adaptive { branches: Branches::Tree(tree), ..adaptive });
    let shapes: [(&str, Drafting, Coupling, Verify); 16] = [
        ("chain-d0", chain, same, tv(0.0)),
        ("chain-tv0.5", chain, same, tv(0.5)),
        ("chain-tv1-k8", Drafting::Chain(8), same, tv(1.0)),
        ("chain-maxacc-tv0.5", chain, max_acc, tv(0.5)),
        ("chain-maxacc-d0", chain, max_acc, tv(0.0)),
        ("chain-nobonus-tv0.3", chain, same, Verify { bonus: false, ..tv(0.3) }),
        ("chain-cascade0.2", chain, same, Verify::rule(MentorRule::Cascade, 0.2)),
        ("chain-lenience0.5", chain, same, Verify::rule(MentorRule::Lenience, 0.5)),
        ("auto-d0", auto, same, tv(0.0)),
        ("auto-tv0.5", auto, same, tv(0.5)),
        ("auto-side-d0", side, same, tv(0.0)),
        ("auto-side-tv0.5", side, same, Verify { bonus: false, ..tv(0.5) }),
        ("tree-d0", Drafting::Tree(tree), same, tv(0.0)),
        ("tree-tv0.5", Drafting::Tree(tree), same, tv(0.5)),
        ("tree-maxacc-tv0.5", Drafting::Tree(tree), max_acc, tv(0.5)),
        ("tree-auto-d0", auto_tree, same, tv(0.0)),
    ];
    let mut out = Vec::new();
    for (pname, prompt) in [("story", STORY), ("code", CODE)] {
        for &(n, drafting, coupling, verify) in &shapes {
            let name = format!("{}/{pname}/{n}", ["ind", "feat"][feature as usize]);
            out.push((name, GenerateRequest { prompt: prompt.into(), drafting, coupling, verify, ..base.clone() }));
        }
    }
    out
}

#[test]
fn fixed_seed_runs_equal_the_record() {
    let target = || load_target(WeightFormat::Auto);
    let mut lines = Vec::new();
    let mut engine = Engine::new(target(), None).unwrap();
    let only = GenerateRequest { mode: Mode::Target, ..runs(false)[0].1.clone() };
    lines.push(line(&mut engine, "target/story", &only));
    let draft = mentor_lab::models::default_draft().expect("the default draft must be in assets/models");
    let feature = mentor_lab::models::feature_draft().expect("the feature draft must be in assets/models");
    for (is_feature, path) in [(false, draft), (true, feature)] {
        let mut engine = Engine::new(target(), Some(load(path))).unwrap();
        for (name, req) in runs(is_feature) {
            lines.push(line(&mut engine, &name, &req));
        }
    }
    let got = lines.join("\n") + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/token_record.txt");
    if std::env::var("MENTOR_LAB_WRITE_RECORD").as_deref() == Ok("1") {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).expect("tests/data/token_record.txt must exist");
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "run {i} differs from the record");
    }
    assert_eq!(got.lines().count(), want.lines().count(), "the record has another number of runs");
}
