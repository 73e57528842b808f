//! Trees of candidates on the real default pair: a tree forward computes on every path what a
//! chain forward of the same tokens computes, keeping a path leaves the cache of that chain, and
//! a run drafting trees emits the text of the chain and of the target alone.

mod common;
#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;

use common::{draft_path, load_target};
use mentor_lab::generate::LoadedModel;
use mentor_lab::{
    load_model, Adaptive, Branches, Coupling, Drafting, Engine, EngineError, GenerateRequest, Lookup, Mode,
    SamplingParams, TreeShape, Verify, WeightFormat,
};
use std::sync::atomic::AtomicBool;

/// `drafting` with branches of `branches`: a fixed tree for a tree shape outside the adaptive
/// policy, else the policy's own options with these branches.
fn branched(drafting: Drafting, branches: Branches) -> Drafting {
    match (drafting, branches) {
        (Drafting::Adaptive(a), _) => Drafting::Adaptive(Adaptive { branches, ..a }),
        (_, Branches::Tree(shape)) => Drafting::Tree(shape),
        (other, _) => other,
    }
}

const PROMPT: &str = "Write a short story about a lighthouse keeper who finds a message in a bottle.";

/// A tree after the prompt's last token (node 0): two branches at the root, three below node 1,
/// a deep branch under node 3 and one under node 2.
const PARENTS: [Option<usize>; 10] =
    [None, Some(0), Some(0), Some(1), Some(1), Some(1), Some(3), Some(6), Some(2), Some(8)];

fn tree_tokens(m: &LoadedModel, root: u32) -> Vec<u32> {
    let mut t = vec![root];
    t.extend(m.tokenizer.encode(" The old keeper walked slowly up the winding stairs").unwrap());
    t.truncate(PARENTS.len());
    assert_eq!(t.len(), PARENTS.len());
    t
}

/// The nodes from the root down to `node`.
fn path_to(node: usize) -> Vec<usize> {
    let mut path = vec![node];
    while let Some(p) = PARENTS[*path.last().unwrap()] {
        path.push(p);
    }
    path.reverse();
    path
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The default target on both forward paths, each with the prompt's tokens but the last and the
/// tree's tokens after them: the CPU step (quantized weights as in the file), and the
/// tensor path on F32 weights (with quantized ones its rows carry the activations' rounding,
/// which differs with the batch).
fn both_paths() -> Vec<(LoadedModel, bool, Vec<u32>, Vec<u32>)> {
    [(WeightFormat::Auto, true), (WeightFormat::F32, false)]
        .into_iter()
        .map(|(format, cpu_step)| {
            let m = load_target(format);
            assert_eq!(m.model.cpu_step(), cpu_step);
            let mut context = m.tokenizer.prompt_ids(PROMPT, false).unwrap();
            let root = context.pop().unwrap();
            let tokens = tree_tokens(&m, root);
            (m, cpu_step, context, tokens)
        })
        .collect()
}

/// How far the tensor path's rows may differ on F32 weights (its matrix products sum in another
/// order per batch).
const TENSOR_TOLERANCE: f32 = 2e-3;

/// Every node's logits from one tree forward equal the last row of a chain forward over the
/// node's path: bit for bit on the CPU step, within rounding on the tensor path.
#[test]
fn tree_forward_equals_a_chain_forward_on_every_path() {
    for (mut m, cpu_step, context, tokens) in both_paths() {
        m.model.feed(&context).unwrap();
        let mut rows = m.model.forward_tree(&tokens, &PARENTS).unwrap();
        m.model.lazy_rows(&mut rows, tokens.len()).unwrap();
        for node in 0..tokens.len() {
            let path: Vec<u32> = path_to(node).iter().map(|&n| tokens[n]).collect();
            m.model.clear().unwrap();
            m.model.feed(&context).unwrap();
            let chain = m.model.forward_rows(&path).unwrap().pop().unwrap();
            let tree = rows.row(node).unwrap();
            match cpu_step {
                true => assert!(tree.iter().zip(&chain).all(|(a, b)| a.to_bits() == b.to_bits()), "node {node}"),
                false => {
                    let d = max_diff(tree, &chain);
                    assert!(d < TENSOR_TOLERANCE, "tensor path, node {node}: logits differ by {d}");
                }
            }
        }
    }
}

/// After a tree forward and `keep_path`, the next forward equals a fresh chain over the kept
/// text, for every path (the root alone included) and on both paths of the forward.
#[test]
fn keeping_a_path_leaves_the_cache_a_chain_would() {
    for (mut m, cpu_step, context, tokens) in both_paths() {
        let next = m.tokenizer.encode(" night").unwrap()[0];
        for node in [0, 2, 5, 7, 9] {
            let path = path_to(node);
            m.model.clear().unwrap();
            m.model.feed(&context).unwrap();
            m.model.forward_tree(&tokens, &PARENTS).unwrap();
            m.model.keep_path(&path).unwrap();
            assert_eq!(m.model.n_cached(), context.len() + path.len());
            let after = m.model.forward_rows(&[next]).unwrap().pop().unwrap();
            m.model.clear().unwrap();
            let mut text = context.to_vec();
            text.extend(path.iter().map(|&n| tokens[n]));
            text.push(next);
            let fresh = m.model.forward_rows(&text).unwrap().pop().unwrap();
            let d = max_diff(&after, &fresh);
            match cpu_step {
                true => assert_eq!(d, 0.0, "path to node {node}: logits differ by {d}"),
                false => assert!(d < TENSOR_TOLERANCE, "tensor path, path to node {node}: logits differ by {d}"),
            }
        }
    }
}

/// Nodes whose parent is not fed yet, and paths that are not paths, are refused, not run.
#[test]
fn malformed_trees_are_errors() {
    let mut m = load_target(WeightFormat::Auto);
    let ids = m.tokenizer.encode("One two three four").unwrap();
    m.model.feed(&ids[..2]).unwrap();
    let e = m.model.forward_tree(&ids[2..4], &[Some(1), None]).unwrap_err();
    assert!(matches!(e, EngineError::Internal(_)), "{e}");
    m.model.forward_tree(&ids[1..4], &[None, Some(0), Some(0)]).unwrap();
    let e = m.model.keep_path(&[0, 1, 2]).unwrap_err();
    assert!(e.to_string().contains("not a path"), "{e}");
    let e = m.model.keep_path(&[0]).unwrap_err();
    assert!(e.to_string().contains("no tree"), "a failed keep_path ends the tree: {e}");
}

fn the_pair() -> Engine {
    let draft = draft_path().expect("the default draft must be in assets/models");
    let draft = load_model(&draft, WeightFormat::Auto, &candle_core::Device::Cpu).unwrap();
    Engine::new(load_target(WeightFormat::Auto), Some(draft)).unwrap()
}

fn ids(engine: &mut Engine, req: &GenerateRequest) -> (Vec<u32>, mentor_lab::generate::Stats) {
    let g = engine.generate(req, &AtomicBool::new(false), &mut |_| {}).unwrap();
    (g.tokens.iter().map(|t| t.id).collect(), g.stats)
}

fn with_feature_draft() -> Engine {
    let feature = mentor_lab::models::feature_draft().expect("the feature draft must be in assets/models");
    let feature = load_model(&feature, WeightFormat::Auto, &candle_core::Device::Cpu).unwrap();
    Engine::new(load_target(WeightFormat::Auto), Some(feature)).unwrap()
}

/// Under the same-seed coupling the text does not depend on the tree: at D = 0 trees, chains and
/// the target alone emit the same tokens; at D > 0 (bonus tokens off, since a chain's bonus falls
/// where a tree may still have candidates) trees emit the chain's tokens. Trees settle more
/// tokens per round than the chain inside them. Both shipped drafts: the feature draft's nodes
/// read their parents' predicted features, and after a round it takes the target's features of
/// the settled path. A tree one wide is the chain itself: it proposes and settles what the
/// chain does, round for round. (The feature draft's text at D > 0 depends on where rounds
/// begin, trees or not, so there only the one-wide tree must match the chain.)
#[test]
fn same_seed_trees_emit_the_text_of_chains() {
    for (name, mut engine) in [("independent", the_pair()), ("feature", with_feature_draft())] {
        for (seed, temperature) in [(5, 0.7), (17, 1.0)] {
            let base = GenerateRequest {
                prompt: PROMPT.into(),
                sampling: SamplingParams { temperature, ..SamplingParams::default() },
                max_tokens: 48,
                ignore_eos: true,
                seed,
                ..GenerateRequest::default()
            };
            let (want, _) = ids(&mut engine, &base);
            for budget in [0.0, 0.5, 1.0] {
                let bonus = budget == 0.0;
                let spec = GenerateRequest {
                    mode: Mode::Speculative,
                    verify: Verify { budget, bonus, ..base.verify },
                    ..base.clone()
                };
                let (chain, chain_stats) =
                    ids(&mut engine, &GenerateRequest { drafting: Drafting::Chain(6), ..spec.clone() });
                if budget == 0.0 {
                    assert_eq!(chain, want, "{name}: chain vs target-only, seed {seed}");
                }
                for shape in ["1x6", "3x6", "2x4"] {
                    let drafting = Drafting::Tree(shape.parse::<TreeShape>().unwrap());
                    let (got, stats) = ids(&mut engine, &GenerateRequest { drafting, ..spec.clone() });
                    let at = format!("{name}: tree {shape}, D = {budget}, seed {seed}");
                    // The feature draft's q at a position depends on where its round began (the
                    // target's features before, its own predictions after), so at D > 0 its text
                    // follows the rounds; at D = 0 it is the target's whatever the rounds.
                    if name == "independent" || budget == 0.0 || shape == "1x6" {
                        assert_eq!(got, chain, "{at}: not the chain's text");
                    }
                    eprintln!(
                        "{at}: {} rounds, {} accepted; chain {}, {}",
                        stats.n_rounds, stats.n_accepted, chain_stats.n_rounds, chain_stats.n_accepted
                    );
                    if shape == "1x6" {
                        assert_eq!(
                            (stats.n_rounds, stats.n_drafted, stats.n_accepted),
                            (chain_stats.n_rounds, chain_stats.n_drafted, chain_stats.n_accepted),
                            "{at}: a one-wide tree is not the chain"
                        );
                    }
                    // A tree as deep as the chain holds it: never more rounds. With a budget the
                    // chain is mostly accepted whole; losslessly the tree's other candidates must
                    // save rounds.
                    if shape.ends_with("x6") {
                        assert!(stats.n_rounds <= chain_stats.n_rounds, "{at}: more rounds than its chain");
                    }
                    if shape == "3x6" && budget == 0.0 {
                        assert!(stats.n_rounds < chain_stats.n_rounds, "{at}: not fewer rounds than its chain");
                    }
                }
            }
        }
    }
}

/// Tree shapes are parsed and checked, under either coupling.
#[test]
fn tree_shapes_are_parsed_and_checked() {
    let drafting = Drafting::Tree(TreeShape { width: 2, depth: 4 });
    for coupling in [Coupling::SameSeed, Coupling::MaxAcceptance] {
        assert!(GenerateRequest { mode: Mode::Speculative, drafting, coupling, ..Default::default() }
            .validate()
            .is_ok());
    }
    let wide = Drafting::Tree(TreeShape { width: 9, depth: 4 });
    let e = GenerateRequest { mode: Mode::Speculative, drafting: wide, ..Default::default() }.validate().unwrap_err();
    assert!(e.to_string().contains("9x4"), "{e}");
    assert!("9x2".parse::<TreeShape>().unwrap_err().contains("WIDTHxDEPTH"));
    assert!("3,4".parse::<TreeShape>().is_err());
    assert_eq!("3x4".parse::<TreeShape>(), Ok(TreeShape { width: 3, depth: 4 }));
}

/// Side offers (the draft's runners-up verified beside its chain as one-token branches) leave the
/// same-seed text as it was, with either shipped draft: the target-only text at D = 0 and, without
/// bonus tokens, the chain's at D = 0.5; and with rows cheap enough they are verified, and some
/// rounds settle a side offer and the bonus after it (the feature draft then takes the features of
/// that offer's row).
#[test]
fn side_offers_keep_the_text_and_settle_more_per_round() {
    use mentor_lab::adaptive::FixedCosts;
    use mentor_lab::GenEvent;
    for (name, mut engine) in [("independent", the_pair()), ("feature", with_feature_draft())] {
        let cheap_rows = FixedCosts { draft_token_s: 0.001, verify_base_s: 0.0095, verify_row_s: 0.0005 };
        let base = GenerateRequest {
            prompt: PROMPT.into(),
            max_tokens: 64,
            ignore_eos: true,
            seed: 23,
            mode: Mode::Speculative,
            drafting: Drafting::Adaptive(Adaptive { costs: Some(cheap_rows), ..Adaptive::default() }),
            ..GenerateRequest::default()
        };
        let (want, _) = ids(&mut engine, &GenerateRequest { mode: Mode::Target, ..base.clone() });
        let (chain, chain_stats) = ids(&mut engine, &base);
        assert_eq!(chain, want, "{name}");
        let side = GenerateRequest { drafting: branched(base.drafting, Branches::SideOffers), ..base.clone() };
        let mut side_rounds = 0;
        let g = engine
            .generate(&side, &AtomicBool::new(false), &mut |ev| {
                if let GenEvent::Round(r) = ev {
                    side_rounds += usize::from(r.n_emitted == r.n_accepted + 2);
                }
            })
            .unwrap();
        let got: Vec<u32> = g.tokens.iter().map(|t| t.id).collect();
        assert_eq!(got, want, "{name}: side offers changed the text at D = 0");
        assert!(g.stats.n_drafted > chain_stats.n_drafted, "{name}: no side offer was verified");
        assert!(side_rounds > 0, "{name}: no round settled a side offer");
        let mentored = GenerateRequest { verify: Verify { budget: 0.5, bonus: false, ..base.verify }, ..base };
        let (chain, _) = ids(&mut engine, &mentored);
        let (got, _) = ids(
            &mut engine,
            &GenerateRequest { drafting: branched(mentored.drafting, Branches::SideOffers), ..mentored },
        );
        assert_eq!(got, chain, "{name}: side offers changed the mentored text");
    }
}

/// With an adaptive draft length the policy shapes the tree. One wide, the tree is the adaptive
/// chain: it decides to draft, how deep, and learns from each round as the chain does, round for
/// round. Wider, with verify rows cheap enough, it verifies runners-up and branches beside the
/// chain, and copies from the context as a branch of their own, and the text at D = 0 is still
/// the target's. Both drafts.
#[test]
fn adaptive_trees_follow_the_policy() {
    use mentor_lab::adaptive::FixedCosts;
    for (name, mut engine) in [("independent", the_pair()), ("feature", with_feature_draft())] {
        let base = GenerateRequest {
            prompt: PROMPT.into(),
            max_tokens: 64,
            ignore_eos: true,
            seed: 29,
            mode: Mode::Speculative,
            drafting: Drafting::Adaptive(Adaptive {
                lookup: Lookup::from_flags(false, true),
                costs: Some(FixedCosts::default_pair(0.01)),
                ..Adaptive::default()
            }),
            ..GenerateRequest::default()
        };
        let (want, _) = ids(&mut engine, &GenerateRequest { mode: Mode::Target, ..base.clone() });
        let (chain, chain_stats) = ids(&mut engine, &base);
        assert_eq!(chain, want, "{name}: adaptive chain vs target-only");
        let one_wide = branched(base.drafting, Branches::Tree(TreeShape { width: 1, depth: 16 }));
        let (got, stats) = ids(&mut engine, &GenerateRequest { drafting: one_wide, ..base.clone() });
        assert_eq!(got, want, "{name}: one-wide adaptive tree vs target-only");
        assert_eq!(
            (stats.n_rounds, stats.n_drafted, stats.n_accepted),
            (chain_stats.n_rounds, chain_stats.n_drafted, chain_stats.n_accepted),
            "{name}: a one-wide adaptive tree is not the adaptive chain"
        );
        let cheap = Some(FixedCosts { draft_token_s: 0.001, verify_base_s: 0.0095, verify_row_s: 0.0005 });
        let (_, cheap_chain) =
            ids(&mut engine, &GenerateRequest { drafting: base.drafting.with_costs(cheap), ..base.clone() });
        let wide = branched(base.drafting.with_costs(cheap), Branches::Tree(TreeShape { width: 3, depth: 16 }));
        let (got, stats) = ids(&mut engine, &GenerateRequest { drafting: wide, ..base.clone() });
        eprintln!(
            "{name}: adaptive tree {} rounds, {} verified, {} accepted; chain {} rounds, {} drafted, {} accepted",
            stats.n_rounds,
            stats.n_drafted,
            stats.n_accepted,
            cheap_chain.n_rounds,
            cheap_chain.n_drafted,
            cheap_chain.n_accepted
        );
        assert_eq!(got, want, "{name}: adaptive tree vs target-only");
        assert!(stats.n_drafted > cheap_chain.n_drafted, "{name}: no candidates beside the chain");
        // Copies from the context hang in the tree as a branch: on text that repeats itself some
        // are verified and settled, and the text stays the target's.
        let repeats = GenerateRequest {
            prompt: "Copy this list three times: apple, banana, cherry, date, elderberry, fig, grape.".into(),
            drafting: wide.with_lookup(Lookup::StartAndTail),
            ..base.clone()
        };
        let (want, _) = ids(&mut engine, &GenerateRequest { mode: Mode::Target, ..repeats.clone() });
        let (got, stats) = ids(&mut engine, &repeats);
        eprintln!("{name}: copies {} verified, {} settled", stats.n_copied, stats.n_copied_accepted);
        assert_eq!(got, want, "{name}: adaptive tree with copies vs target-only");
        assert!(stats.n_copied_accepted > 0, "{name}: no copied token settled");
    }
}

/// Under max-acceptance a tree node's candidates are a draw without replacement from q, checked
/// in order by recursive rejection sampling. One wide, the tree is the chain, token for token and
/// round for round (fixed and adaptive length, both drafts, at D = 0 and 0.5). Wider, some rounds
/// take a runner-up, and the tree settles more per round than the chain inside it.
#[test]
fn max_acceptance_trees_are_chains_one_wide_and_take_runners_up_wider() {
    use mentor_lab::adaptive::FixedCosts;
    use mentor_lab::{GenEvent, TokenSource};
    for (name, mut engine) in [("independent", the_pair()), ("feature", with_feature_draft())] {
        for budget in [0.0, 0.5] {
            let base = GenerateRequest {
                prompt: PROMPT.into(),
                max_tokens: 48,
                ignore_eos: true,
                seed: 41,
                mode: Mode::Speculative,
                coupling: Coupling::MaxAcceptance,
                verify: Verify { budget, ..Verify::default() },
                ..GenerateRequest::default()
            };
            let fixed = GenerateRequest { drafting: Drafting::Chain(6), ..base.clone() };
            let policy =
                Adaptive { lookup: Lookup::Off, costs: Some(FixedCosts::default_pair(0.01)), ..Adaptive::default() };
            let adaptive = GenerateRequest { drafting: Drafting::Adaptive(policy), ..base.clone() };
            for (kind, chain_req) in [("fixed", fixed), ("adaptive", adaptive)] {
                let at = format!("{name}, {kind}, D = {budget}");
                let (chain, chain_stats) = ids(&mut engine, &chain_req);
                let depth = if kind == "fixed" { 6 } else { 16 };
                let one_wide = branched(chain_req.drafting, Branches::Tree(TreeShape { width: 1, depth }));
                let (got, stats) = ids(&mut engine, &GenerateRequest { drafting: one_wide, ..chain_req.clone() });
                assert_eq!(got, chain, "{at}: a one-wide tree emits another text than the chain");
                assert_eq!(
                    (stats.n_rounds, stats.n_drafted, stats.n_accepted),
                    (chain_stats.n_rounds, chain_stats.n_drafted, chain_stats.n_accepted),
                    "{at}: a one-wide tree is not the chain"
                );
            }
        }
        // Three wide at D = 0: runners-up are verified and some are taken (the emitted token a
        // candidate other than the first draw), and over a few seeds the trees need fewer rounds
        // than the chains inside them.
        let (mut chain_rounds, mut tree_rounds, mut runner_up_taken) = (0, 0, 0);
        for seed in 43..49 {
            let base = GenerateRequest {
                prompt: PROMPT.into(),
                max_tokens: 64,
                ignore_eos: true,
                seed,
                mode: Mode::Speculative,
                coupling: Coupling::MaxAcceptance,
                drafting: Drafting::Chain(4),
                ..GenerateRequest::default()
            };
            chain_rounds += ids(&mut engine, &base).1.n_rounds;
            let drafting = Drafting::Tree(TreeShape { width: 3, depth: 4 });
            let g = engine
                .generate(&GenerateRequest { drafting, ..base.clone() }, &AtomicBool::new(false), &mut |ev| {
                    if let GenEvent::Token(t) = ev {
                        let runner_up = t.source == TokenSource::DraftAccepted && t.drafted != Some(t.id);
                        runner_up_taken += usize::from(runner_up);
                    }
                })
                .unwrap();
            assert_eq!(g.tokens.len(), 64, "{name}");
            tree_rounds += g.stats.n_rounds;
        }
        eprintln!(
            "{name}: 3x4 trees {tree_rounds} rounds, {runner_up_taken} runners-up taken; chains {chain_rounds} rounds"
        );
        assert!(runner_up_taken > 0, "{name}: no round took a runner-up");
        assert!(tree_rounds < chain_rounds, "{name}: the trees need no fewer rounds than their chains");
    }
}

/// On the real pair, the token a three-wide max-acceptance tree emits at the first position
/// follows the target's distribution there (D = 0, T = 1, many seeds; Pearson's χ² over the
/// likely tokens and the rest).
#[test]
fn max_acceptance_trees_emit_the_targets_distribution() {
    use mentor_lab::sampling::probabilities;
    let mut engine = the_pair();
    let prompt = "My favourite colour is";
    let sampling = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
    let p = {
        let mut m = load_target(WeightFormat::Auto);
        let context = m.tokenizer.prompt_ids(prompt, true).unwrap();
        let logits = m.model.forward_rows(&context).unwrap().pop().unwrap();
        probabilities(&logits, &context, &sampling, logits.len())
    };
    const N: u64 = 1000;
    let mut likely: Vec<usize> = (0..p.len()).filter(|&t| p[t] as f64 * N as f64 >= 8.0).collect();
    likely.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    likely.truncate(9);
    assert!(likely.len() >= 3, "the first token should be uncertain at T = 1");
    let mut counts = vec![0u64; likely.len() + 1];
    let (mut first, mut runner_up) = (0, 0);
    for seed in 0..N {
        let req = GenerateRequest {
            prompt: prompt.into(),
            raw: true,
            sampling,
            max_tokens: 1,
            seed,
            mode: Mode::Speculative,
            coupling: Coupling::MaxAcceptance,
            drafting: Drafting::Tree(TreeShape { width: 3, depth: 1 }),
            ..GenerateRequest::default()
        };
        let g = engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap();
        let t = &g.tokens[0];
        let y = t.id as usize;
        counts[likely.iter().position(|&t| t == y).unwrap_or(likely.len())] += 1;
        if t.source == mentor_lab::TokenSource::DraftAccepted {
            *(if t.drafted == Some(t.id) { &mut first } else { &mut runner_up }) += 1;
        }
    }
    let mut expected: Vec<f32> = likely.iter().map(|&t| p[t]).collect();
    expected.push(1.0 - expected.iter().sum::<f32>());
    let stat = stats::chi2(&counts, &expected, N);
    eprintln!(
        "{} buckets, chi2 {stat:.1}; taken: the first draw {first}, a runner-up {runner_up} of {N}",
        expected.len()
    );
    assert!(stat < stats::chi2_crit(expected.len() - 1), "chi2 {stat:.1}: the tree's token is not the target's");
    assert!(first > 100 && runner_up > 50, "the test must see both kinds of candidate taken");
}
