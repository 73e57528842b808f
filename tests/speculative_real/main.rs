//! Speculative and mentored decoding on the real default model.

#[path = "../common/mod.rs"]
mod common;

#[path = "../common/synthetic.rs"]
mod synthetic;

use common::{draft_path, load_target, target_path};
use mentor_lab::adaptive::FixedCosts;
use mentor_lab::generate::LoadedModel;
use mentor_lab::sampling::{nll_at_t1, probabilities, race_argmax, race_weights, sample_index, uniform, Purpose};
use mentor_lab::{
    load_model, Coupling, DraftLen, Drafting, Engine, EngineError, GenEvent, GenerateRequest, Lookup, Mode,
    SamplingParams, TokenSource, Verify, WeightFormat,
};
use std::sync::atomic::{AtomicBool, Ordering};

const PROMPT: &str = "Write a short story about a lighthouse keeper who finds a message in a bottle.";

/// A request on the lighthouse prompt. An adaptive draft length decides from fixed costs (the
/// default pair's ratios), so that the rounds, and what the tests below see of them, do not depend
/// on the machine's load.
fn request(mode: Mode, temperature: f32, budget: f64, k: DraftLen, n: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: PROMPT.into(),
        sampling: SamplingParams { temperature, ..SamplingParams::default() },
        max_tokens: n,
        ignore_eos: true,
        mode,
        verify: Verify::tv(budget),
        drafting: Drafting::from(k).with_costs(Some(FixedCosts::default_pair(0.01))),
        seed: 11,
        ..GenerateRequest::default()
    }
}

fn run(engine: &mut Engine, req: &GenerateRequest) -> mentor_lab::Generation {
    engine.generate(req, &AtomicBool::new(false), &mut |_| {}).unwrap()
}

fn the_draft(format: WeightFormat) -> LoadedModel {
    let p = draft_path().expect("the default draft must be in assets/models");
    load_model(&p, format, &candle_core::Device::Cpu).unwrap()
}

fn ids(g: &mentor_lab::Generation) -> Vec<u32> {
    g.tokens.iter().map(|t| t.id).collect()
}

/// Greedy speculative decoding at D = 0 is exactly greedy target decoding, whatever the draft.
#[test]
fn greedy_speculative_equals_greedy_target() {
    // Draft 1: the target itself with quantized weights (agrees almost always, disagrees at near-ties).
    // Draft 2: the trained draft (disagrees often, so rollback is exercised on every few tokens).
    for draft in [load_target(WeightFormat::Q8_0), the_draft(WeightFormat::F32)] {
        let mut engine = Engine::new(load_target(WeightFormat::F32), Some(draft)).unwrap();
        let want = run(&mut engine, &request(Mode::Target, 0.0, 0.0, DraftLen::Fixed(4), 48));
        for k in [DraftLen::Fixed(1), DraftLen::Fixed(4), DraftLen::Fixed(7), DraftLen::Auto] {
            let got = run(&mut engine, &request(Mode::Speculative, 0.0, 0.0, k, 48));
            assert_eq!(ids(&got), ids(&want), "k = {k}");
            assert_eq!(got.text, want.text);
            let s = &got.stats;
            assert_eq!(s.n_tokens, 48);
            assert!(s.n_accepted <= s.n_drafted);
            assert_eq!(got.rounds.iter().map(|r| r.n_emitted).sum::<usize>(), 48);
            let count = |source| got.tokens.iter().filter(|t| t.source == source).count();
            assert_eq!(count(TokenSource::DraftAccepted) + count(TokenSource::CopyAccepted), s.n_accepted);
            assert_eq!(count(TokenSource::CopyAccepted), s.n_copied_accepted);
        }
    }
}

/// With no bonus token and D = 1 every draft is accepted, and the keyed uniforms make the output
/// the draft-only output for the same seed.
#[test]
fn full_budget_without_bonus_equals_draft_only() {
    let mut engine = Engine::new(load_target(WeightFormat::Auto), Some(the_draft(WeightFormat::F32))).unwrap();
    let draft_only = run(&mut engine, &request(Mode::Draft, 0.8, 0.0, DraftLen::Fixed(4), 40));
    let mut req = request(Mode::Speculative, 0.8, 1.0, DraftLen::Fixed(5), 40);
    req.verify.bonus = false;
    let spec = run(&mut engine, &req);
    assert_eq!(ids(&spec), ids(&draft_only));
    assert_eq!(spec.stats.acceptance_rate, 1.0);
    assert!(spec.tokens.iter().all(|t| t.source == TokenSource::DraftAccepted));
    assert!(draft_only.stats.mean_target_nll > 0.0, "draft-only text is scored by the target");
    // With the bonus on, every round ends with a target token.
    req.verify.bonus = true;
    let with_bonus = run(&mut engine, &req);
    assert!(with_bonus.tokens.iter().any(|t| t.source == TokenSource::Bonus));
}

/// The prompt's ids, prompt + generated ids, the target's logits at every position but the last
/// (one forward from an empty cache) and the vocabulary size.
fn scored_by_target(engine: &mut Engine, g: &mentor_lab::Generation) -> (Vec<u32>, Vec<u32>, Vec<Vec<f32>>, usize) {
    let prompt = engine.target.tokenizer.prompt_ids(PROMPT, false).unwrap();
    let mut context = prompt.clone();
    context.extend(ids(g));
    engine.target.model.clear().unwrap();
    let rows = engine.target.model.forward_rows(&context[..context.len() - 1]).unwrap();
    (prompt, context, rows, engine.target.tokenizer.vocab_size())
}

/// Under a budget D > 0 the bonus token still follows the target's distribution p (not π): there
/// is no draft proposal at that position to mix with. Each bonus token must be exactly the draw
/// from p at its position: the race with the position's noise (same-seed coupling) or the
/// TargetSample uniform (max-acceptance).
#[test]
fn bonus_token_follows_target_distribution() {
    let mut engine = Engine::new(load_target(WeightFormat::F32), Some(the_draft(WeightFormat::F32))).unwrap();
    for coupling in [Coupling::SameSeed, Coupling::MaxAcceptance] {
        let req = GenerateRequest { coupling, ..request(Mode::Speculative, 0.7, 0.5, DraftLen::Fixed(2), 40) };
        let g = run(&mut engine, &req);
        let bonus: Vec<_> = g.tokens.iter().filter(|t| t.source == TokenSource::Bonus).collect();
        assert!(!bonus.is_empty(), "need some fully accepted rounds");
        let (prompt, context, rows, n_vocab) = scored_by_target(&mut engine, &g);
        for t in bonus {
            let at = prompt.len() + t.pos;
            let p = probabilities(&rows[at - 1], &context[..at], &req.sampling, n_vocab);
            let expect = match coupling {
                Coupling::SameSeed => {
                    let mut w = Vec::new();
                    race_weights(req.seed, t.pos as u64, n_vocab, &mut w);
                    race_argmax(&p, &w) as u32
                }
                Coupling::MaxAcceptance => {
                    sample_index(&p, uniform(req.seed, t.pos as u64, Purpose::TargetSample)) as u32
                }
            };
            assert_eq!(t.id, expect, "{coupling}: bonus at {} is not the target's draw", t.pos);
            assert!((t.p_target.unwrap() - p[t.id as usize]).abs() < 1e-4);
        }
    }
}

/// The same-seed coupling at D = 0: the mentored text is the target-only text of the same seed,
/// token for token, whatever drafts it (the independent draft or the feature draft, fixed k or
/// adaptive with copies), at T = 0.7 and T = 1, while drafted tokens are still accepted. Under
/// max-acceptance the same runs give other texts (so this test sees a coupling that is not shared).
#[test]
fn same_seed_lossless_equals_target_only() {
    let independent = Engine::new(load_target(WeightFormat::Auto), Some(the_draft(WeightFormat::Auto))).unwrap();
    let (feature, _) = with_the_feature_draft(GenerateRequest::default());
    let mut n_differing_max_acceptance = 0;
    for (name, mut engine) in [("independent", independent), ("feature", feature)] {
        for temperature in [0.7, 1.0] {
            for seed in [3, 29] {
                let base = GenerateRequest { seed, ..request(Mode::Target, temperature, 0.0, DraftLen::Fixed(4), 40) };
                let want = run(&mut engine, &base);
                for k in [DraftLen::Fixed(1), DraftLen::Fixed(4), DraftLen::Fixed(8), DraftLen::Auto] {
                    let req = GenerateRequest { mode: Mode::Speculative, drafting: k.into(), ..base.clone() };
                    let got = run(&mut engine, &req);
                    assert_eq!(ids(&got), ids(&want), "{name} draft, k = {k}, T = {temperature}, seed {seed}");
                    if k == DraftLen::Fixed(4) {
                        assert!(got.stats.n_accepted > 0, "{name} draft, T = {temperature}: nothing accepted");
                        let classic = GenerateRequest { coupling: Coupling::MaxAcceptance, ..req };
                        n_differing_max_acceptance += usize::from(ids(&run(&mut engine, &classic)) != ids(&want));
                    }
                }
            }
        }
    }
    assert!(n_differing_max_acceptance >= 6, "max-acceptance reproduced target-only in too many runs");
}

/// The target NLL reported for a run (its normaliser computed beside the sampling on the other
/// thread) is the target's own NLL of the emitted tokens, scored afterwards in one forward: for
/// target-only decoding and for a mentored run, whose tokens come from every source.
#[test]
fn reported_nll_is_the_targets_nll_of_the_text() {
    let mut engine = Engine::new(load_target(WeightFormat::F32), Some(the_draft(WeightFormat::F32))).unwrap();
    for req in [
        request(Mode::Target, 0.7, 0.0, DraftLen::Fixed(1), 30),
        request(Mode::Speculative, 0.7, 0.5, DraftLen::Fixed(3), 30),
    ] {
        let g = run(&mut engine, &req);
        let (prompt, _, rows, n_vocab) = scored_by_target(&mut engine, &g);
        let scored: f64 =
            g.tokens.iter().map(|t| nll_at_t1(&rows[prompt.len() + t.pos - 1], t.id, n_vocab)).sum::<f64>()
                / g.tokens.len() as f64;
        let reported = g.stats.mean_target_nll;
        assert!(
            (reported - scored).abs() < 1e-3 * scored.max(1.0),
            "{:?}: reported {reported}, scored {scored}",
            req.mode
        );
    }
}

/// After a run with many rejections, both caches hold exactly what a fresh run on the same tokens
/// would: the next-token logits agree.
#[test]
fn kv_rollback_matches_fresh_run() {
    let mut engine = Engine::new(load_target(WeightFormat::F32), Some(the_draft(WeightFormat::F32))).unwrap();
    let g = run(&mut engine, &request(Mode::Speculative, 1.0, 0.0, DraftLen::Fixed(6), 60));
    assert!(g.tokens.iter().any(|t| t.source == TokenSource::Resampled), "need rejections");
    let mut context = engine.target.tokenizer.prompt_ids(PROMPT, false).unwrap();
    context.extend(ids(&g));
    let last = *context.last().unwrap();
    for model in [&mut engine.target.model, &mut engine.draft.as_mut().unwrap().model] {
        // The caches hold every token but the last (the next round would feed it).
        model.truncate(context.len() - 1);
        assert!(model.n_cached() < context.len());
        let cached = model.n_cached();
        let after_rollback = model.forward_rows(&context[cached..]).unwrap().pop().unwrap();
        model.clear().unwrap();
        let fresh = model.forward_rows(&context).unwrap().pop().unwrap();
        let d = after_rollback.iter().zip(&fresh).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d < 1e-3, "logits differ by {d} (last token {last})");
    }
}

#[test]
fn cancel_mid_round_returns_tokens_so_far() {
    let mut engine = Engine::new(load_target(WeightFormat::Auto), Some(the_draft(WeightFormat::Auto))).unwrap();
    let cancel = AtomicBool::new(false);
    let mut n_tokens = 0;
    let mut n_rounds_after = 0;
    let req = request(Mode::Speculative, 0.7, 0.5, DraftLen::Fixed(8), 200);
    let g = engine
        .generate(&req, &cancel, &mut |ev| match ev {
            GenEvent::Token(_) => {
                n_tokens += 1;
                if n_tokens == 10 {
                    cancel.store(true, Ordering::Relaxed);
                }
            }
            GenEvent::Round(_) if cancel.load(Ordering::Relaxed) => n_rounds_after += 1,
            _ => {}
        })
        .unwrap();
    assert!(g.cancelled);
    assert!(g.tokens.len() >= 10 && g.tokens.len() <= 10 + 8, "{} tokens", g.tokens.len());
    assert!(n_rounds_after <= 1, "no new round starts after cancel");
}

#[test]
fn stats_and_provenance_are_consistent() {
    let mut engine = Engine::new(load_target(WeightFormat::Auto), Some(the_draft(WeightFormat::Auto))).unwrap();
    let budget = 0.4;
    // Max-acceptance: its tokens carry the acceptance probability min(1, π(x)/q(x)).
    let req = request(Mode::Speculative, 0.7, budget, DraftLen::Fixed(4), 64);
    let g = run(&mut engine, &GenerateRequest { coupling: Coupling::MaxAcceptance, ..req });
    let s = &g.stats;
    assert_eq!(s.n_rounds, g.rounds.len());
    assert!((s.mean_accepted_len - 64.0 / s.n_rounds as f64).abs() < 1e-9);
    assert!((s.acceptance_rate - s.n_accepted as f64 / s.n_drafted as f64).abs() < 1e-12);
    assert!(s.mean_tv <= budget + 1e-9 && s.mean_tv > 0.0);
    assert!(s.per_position_acceptance.len() <= 4 && !s.per_position_acceptance.is_empty());
    assert!(s.draft_s > 0.0 && s.verify_s > 0.0);
    for t in &g.tokens {
        match t.source {
            TokenSource::DraftAccepted | TokenSource::CopyAccepted | TokenSource::Resampled => {
                let (tv, theta) = (t.tv.unwrap(), t.theta.unwrap());
                assert!((theta - if tv > 0.0 { (budget / tv).min(1.0) } else { 1.0 }).abs() < 1e-6);
                let (p, q, pi) = (t.p_target.unwrap(), t.q_draft.unwrap(), t.pi_mixed.unwrap());
                assert!((pi as f64 - ((1.0 - theta) * p as f64 + theta * q as f64)).abs() < 1e-5);
                assert!(t.accept_prob.is_some() && t.round.is_some());
            }
            TokenSource::Bonus | TokenSource::Target => assert!(t.p_target.is_some()),
            TokenSource::Draft => panic!("no draft-only tokens in speculative mode"),
        }
    }
}

#[test]
fn vocabulary_mismatch_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny-qwen2.gguf");
    synthetic::write(&tiny, &synthetic::Spec::default());
    let draft = load_model(&tiny, WeightFormat::Auto, &candle_core::Device::Cpu).unwrap();
    let Err(e) = Engine::new(load_target(WeightFormat::Auto), Some(draft)) else {
        panic!("a draft with another tokenizer must be refused")
    };
    assert!(matches!(e, EngineError::VocabMismatch { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("tiny-qwen2.gguf") && msg.contains(&target_path().display().to_string()), "{msg}");
}

#[test]
fn adaptive_greedy_is_lossless_and_uses_the_draft() {
    let mut engine = Engine::new(load_target(WeightFormat::Auto), Some(the_draft(WeightFormat::Auto))).unwrap();
    let want = run(&mut engine, &request(Mode::Target, 0.0, 0.0, DraftLen::Auto, 64));
    let g = run(&mut engine, &request(Mode::Speculative, 0.0, 0.0, DraftLen::Auto, 64));
    assert_eq!(ids(&g), ids(&want));
    assert_eq!(g.stats.n_tokens, 64);
    assert!(g.stats.n_drafted > g.stats.n_copied, "adaptive should try drafting with the model");
}

/// Text that repeats its context: the adaptive policy copies from it (tokens marked as copies,
/// each drafted with q(x) = 1), the output stays the target's greedy output, and without copying
/// it is the same text with no copies.
#[test]
fn adaptive_copies_from_the_context_and_stays_lossless() {
    let mut engine = Engine::new(load_target(WeightFormat::Auto), Some(the_draft(WeightFormat::Auto))).unwrap();
    let req = GenerateRequest {
        prompt: "Copy this line exactly ten times, one per line:\nthe quick brown fox jumps over the lazy dog".into(),
        // Max-acceptance, whose tokens carry min(1, π(x)/q(x)) as their acceptance probability.
        coupling: Coupling::MaxAcceptance,
        ..request(Mode::Speculative, 0.0, 0.0, DraftLen::Auto, 96)
    };
    let want = run(&mut engine, &GenerateRequest { mode: Mode::Target, ..req.clone() });
    let got = run(&mut engine, &req);
    assert_eq!(ids(&got), ids(&want));
    let s = &got.stats;
    let copies: Vec<_> = got.tokens.iter().filter(|t| t.source == TokenSource::CopyAccepted).collect();
    assert!(!copies.is_empty(), "{:?}", got.text);
    assert_eq!(copies.len(), s.n_copied_accepted);
    assert!(copies.iter().all(|t| t.q_draft == Some(1.0) && t.accept_prob == t.p_target.map(f64::from)));
    assert!(s.n_copied_accepted <= s.n_copied && s.n_copied <= s.n_drafted);
    assert_eq!(got.rounds.iter().map(|r| r.n_copied).sum::<usize>(), s.n_copied);
    assert!(got.rounds.iter().all(|r| r.n_copied <= r.n_proposed));
    let plain = run(&mut engine, &GenerateRequest { drafting: req.drafting.with_lookup(Lookup::Off), ..req.clone() });
    assert_eq!(ids(&plain), ids(&want));
    assert_eq!(plain.stats.n_copied, 0);
    assert!(plain.rounds.iter().all(|r| r.n_copied == 0));
    // Without copies after drafted tokens, a round copies from its start or not at all.
    let no_tail =
        run(&mut engine, &GenerateRequest { drafting: req.drafting.with_lookup(Lookup::Start), ..req.clone() });
    assert_eq!(ids(&no_tail), ids(&want));
    assert!(no_tail.rounds.iter().all(|r| r.n_copied == 0 || r.n_copied == r.n_proposed));

    // The budget is the draft model's: at D = 0.5 (greedy, so p and q are one-hot) a model
    // proposal the target disagrees with has π(x) = θ = 0.5, while copies are verified against p
    // (π = p: accepted exactly when the target agrees).
    let loose = GenerateRequest { max_tokens: 128, verify: Verify { budget: 0.5, ..req.verify }, ..req.clone() };
    let got = run(&mut engine, &loose);
    let (mut n_copy, mut n_model_disagreed) = (0, 0);
    for (t, copied) in with_copy_flags(&got) {
        if copied {
            n_copy += 1;
            assert_eq!(t.pi_mixed, t.p_target, "a copy is verified against p: {t:?}");
            // What a copy emits is the target's own greedy token, accepted or resampled.
            assert_eq!(t.p_target, Some(1.0), "{t:?}");
        } else if t.tv == Some(1.0) {
            n_model_disagreed += 1;
            assert_eq!(t.accept_prob, Some(0.5), "{t:?}");
        }
    }
    assert!(n_copy > 0, "no copies at D = 0.5: {:?}", got.text);
    assert!(n_model_disagreed > 0, "the draft model never disagreed: {:?}", got.text);
}

/// A drafted round goes on by copying where its tokens led back to a passage of the context
/// (renaming the variables of a function repeats its structure): still the target's greedy text,
/// and every accepted token is marked by where its proposal came from. The policy decides from
/// fixed costs (the default pair's ratios), so the rounds depend only on the text: the same run
/// copies after drafted tokens on every machine.
#[test]
fn adaptive_rounds_go_on_by_copying_after_drafted_tokens() {
    let mut engine = Engine::new(load_target(WeightFormat::Auto), Some(the_draft(WeightFormat::Auto))).unwrap();
    let code = mentor_lab::presets::preset("code").map(|p| p.prompt).unwrap_or_default();
    let function = code.split_once("\n\n").map(|(_, f)| f).unwrap_or_default();
    let prompt = format!(
        "Rename the variables of this Python function to clearer names and show the whole function:\n\n{function}"
    );
    let req = GenerateRequest { prompt, ..request(Mode::Speculative, 0.0, 0.0, DraftLen::Auto, 160) };
    let want = run(&mut engine, &GenerateRequest { mode: Mode::Target, ..req.clone() });
    let got = run(&mut engine, &req);
    assert_eq!(ids(&got), ids(&want));
    for (t, copied) in with_copy_flags(&got) {
        match t.source {
            TokenSource::CopyAccepted => assert!(copied, "{t:?}"),
            TokenSource::DraftAccepted => assert!(!copied, "{t:?}"),
            _ => {}
        }
    }
    let tails = got.rounds.iter().filter(|r| r.n_copied > 0 && r.n_copied < r.n_proposed).count();
    assert!(tails > 0, "no round copied after drafted tokens: {:?}", got.text);
    // Fixed costs make the rounds themselves reproducible.
    let again = run(&mut engine, &req);
    let shape = |g: &mentor_lab::Generation| g.rounds.iter().map(|r| (r.n_proposed, r.n_copied)).collect::<Vec<_>>();
    assert_eq!(shape(&again), shape(&got));
}

/// Randomised probability integral transforms of `g`'s tokens under the target's own
/// distributions given the text before them, tokens ordered from the most likely: independent and
/// uniform on [0, 1) exactly when every token was drawn from p.
fn pits_under_target(engine: &mut Engine, req: &GenerateRequest, g: &mentor_lab::Generation) -> Vec<f64> {
    let mut ctx = engine.target.tokenizer.prompt_ids(&req.prompt, req.raw).unwrap();
    let n = ctx.len();
    ctx.extend(ids(g));
    engine.target.model.clear().unwrap();
    engine.target.model.feed(&ctx[..n - 1]).unwrap();
    let rows = engine.target.model.forward_rows(&ctx[n - 1..ctx.len() - 1]).unwrap();
    let mut out = Vec::new();
    for (j, row) in rows.iter().enumerate() {
        let p = probabilities(row, &ctx[..n + j], &req.sampling, row.len());
        let x = ctx[n + j] as usize;
        let px = p[x];
        let ahead: f64 =
            p.iter().enumerate().filter(|&(y, &v)| v > px || (v == px && y < x)).map(|(_, &v)| f64::from(v)).sum();
        // Randomness apart from the run's own draws (another seed space).
        let v = uniform(req.seed ^ 0x5EED_0FF1, j as u64, Purpose::Residual);
        out.push(ahead + v * f64::from(px));
    }
    out
}

/// Kolmogorov–Smirnov distance between the sample `v` and the uniform distribution on [0, 1].
fn ks_from_uniform(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.iter().enumerate().map(|(i, &x)| ((i + 1) as f64 / n - x).max(x - i as f64 / n)).fold(0.0, f64::max)
}

/// The adaptive policy at T = 0.7 (model drafts, copies at a round's start and after drafted
/// tokens, rounds of varying length) keeps the target's distribution: the tokens' transforms
/// under p pass a Kolmogorov–Smirnov test at the 1% level over 32 seeds × 64 tokens. The test has
/// the power to see a decoder that does not: mentored decoding at D = 0.3 (not lossless by
/// design) and the draft alone fail it.
#[test]
fn adaptive_sampling_follows_the_target_distribution() {
    let mut engine = Engine::new(load_target(WeightFormat::Auto), Some(the_draft(WeightFormat::Auto))).unwrap();
    let prompt = mentor_lab::presets::preset("code").map(|p| p.prompt).unwrap_or_default();
    let mut ks_of = |mode: Mode, k: DraftLen, budget: f64| -> (f64, f64) {
        let mut pits = Vec::new();
        for seed in 0..32 {
            let req = GenerateRequest { prompt: prompt.into(), seed, ..request(mode, 0.7, budget, k, 64) };
            let g = run(&mut engine, &req);
            pits.extend(pits_under_target(&mut engine, &req, &g));
        }
        let n = pits.len() as f64;
        let (d, critical) = (ks_from_uniform(pits), 1.63 / n.sqrt());
        eprintln!("{mode:?} {k:?} D = {budget}: {n} transforms, KS distance {d:.4} (1% critical {critical:.4})");
        (d, critical)
    };
    let (d, critical) = ks_of(Mode::Speculative, DraftLen::Auto, 0.0);
    assert!(d < critical, "adaptive speculative sampling: KS distance {d:.4} ≥ {critical:.4} (1% level)");
    let (d, critical) = ks_of(Mode::Speculative, DraftLen::Fixed(4), 0.3);
    assert!(d > critical, "mentored at D = 0.3 should not pass: KS distance {d:.4}");
    let (d, critical) = ks_of(Mode::Draft, DraftLen::Fixed(4), 0.0);
    assert!(d > critical, "the draft alone should not pass: KS distance {d:.4}");
}

/// The verified tokens of a speculative run (those with a draft probability), each with whether
/// its proposal was a copy from the context: a round's proposals are the model's first, then its
/// `n_copied` copies.
fn with_copy_flags(g: &mentor_lab::Generation) -> Vec<(&mentor_lab::TokenInfo, bool)> {
    let mut at_in_round = vec![0usize; g.rounds.len()];
    let mut out = Vec::new();
    for t in g.tokens.iter().filter(|t| t.q_draft.is_some()) {
        let Some(r) = t.round else { continue };
        let round = &g.rounds[r];
        out.push((t, at_in_round[r] >= round.n_proposed - round.n_copied));
        at_in_round[r] += 1;
    }
    out
}

/// `eval-draft` on the real pair: per-category rows and sane ranges. (The quality figures
/// themselves are reported in assets/models/README.md, not asserted.)
#[test]
fn eval_draft_reports_per_category_and_overall() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"category\": \"qa\", \"prompt\": \"What is the boiling point of water?\"}\n{\"category\": \"code\", \"prompt\": \"Write a Python function that reverses a string.\"}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mentor-lab"))
        .args(["eval-draft", "--json", "--tokens", "16", "--prompts"])
        .arg(&prompts)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: mentor_lab::eval::EvalReport = serde_json::from_slice(&out.stdout).unwrap();
    let cats: Vec<_> = r.rows.iter().map(|r| r.category.as_str()).collect();
    assert_eq!(cats, ["qa", "code"]);
    assert_eq!(r.overall.n_prompts, 2);
    assert!(r.overall.n_positions > 10);
    assert!((0.2..1.0).contains(&r.overall.mean_one_minus_tv), "{}", r.overall.mean_one_minus_tv);
    assert!((0.0..=1.0).contains(&r.overall.greedy_agreement));
    // The same-seed coupling accepts at most 1 − TV at each position (up to the estimate's noise
    // over this handful of positions).
    let (same_seed, overlap) = (r.overall.same_seed_acceptance, r.overall.mean_one_minus_tv);
    assert!(same_seed > 0.1 && same_seed <= overlap + 0.1, "same-seed {same_seed}, 1 − TV {overlap}");
    assert!(r.draft_cost_ratio > 0.0 && r.draft_cost_ratio < 1.0, "the draft is cheaper than the target");
    // A malformed prompt file is a clear error.
    std::fs::write(&prompts, "not json\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mentor-lab"))
        .args(["eval-draft", "--prompts"])
        .arg(&prompts)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
}

// The shipped feature draft, which reads the target's hidden states.
mod feature_draft;
use feature_draft::with_the_feature_draft;

/// A draft cut to its first blocks (`--draft-layers`, early exit) is still a draft of the same
/// vocabulary: it proposes other tokens than the whole stack, yet under the same-seed coupling
/// D = 0 writes target-only's text. Keeping 0 blocks or more than it has is an error that says
/// the range.
#[test]
fn a_draft_cut_to_its_first_blocks_keeps_the_target_text() {
    let mut draft = the_draft(WeightFormat::Auto);
    let n_layer = draft.model.config.n_layer;
    for bad in [0, n_layer + 1] {
        let e = draft.model.keep_first_layers(bad).unwrap_err().to_string();
        assert!(e.contains(&format!("choose 1 to {n_layer}")), "{e}");
    }
    let ids_in = draft.tokenizer.prompt_ids(PROMPT, false).unwrap();
    draft.model.clear().unwrap();
    let whole = draft.model.forward_last(&ids_in).unwrap();
    draft.model.keep_first_layers(n_layer - 2).unwrap();
    assert_eq!(draft.model.config.n_layer, n_layer - 2);
    let cut = draft.model.forward_last(&ids_in).unwrap();
    assert!(whole.iter().zip(&cut).any(|(a, b)| a != b), "the cut stack computes something else");
    let mut engine = Engine::new(load_target(WeightFormat::Auto), Some(draft)).unwrap();
    let want = run(&mut engine, &request(Mode::Target, 0.7, 0.0, DraftLen::Fixed(4), 32));
    let got = run(&mut engine, &request(Mode::Speculative, 0.7, 0.0, DraftLen::Fixed(4), 32));
    assert_eq!(ids(&got), ids(&want));
    assert!(got.stats.n_accepted > 0);
}
