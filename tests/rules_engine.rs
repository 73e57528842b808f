//! The mentor rules in whole runs, on a tiny synthetic pair (a two-layer target, a one-layer
//! draft): at each rule's no-relaxation value the same-seed text is the target-only text token for
//! token, in chains, trees and adaptive rounds; at any valid value every rule runs to the end
//! under both couplings.

#[path = "common/synthetic.rs"]
mod synthetic;

use candle_core::Device;
use mentor_lab::adaptive::FixedCosts;
use mentor_lab::{
    load_model, Coupling, Drafting, Engine, GenerateRequest, MentorRule, Mode, TreeShape, Verify, WeightFormat,
};
use std::sync::atomic::AtomicBool;

fn pair() -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft) = (dir.path().join("target.gguf"), dir.path().join("draft.gguf"));
    synthetic::write(&target, &synthetic::Spec::default());
    synthetic::write(&draft, &synthetic::Spec { n_layer: 1, ..Default::default() });
    let load = |p| load_model(p, WeightFormat::Auto, &Device::Cpu).unwrap();
    let engine = Engine::new(load(&target), Some(load(&draft))).unwrap();
    (dir, engine)
}

fn base() -> GenerateRequest {
    GenerateRequest {
        prompt: "the rain in the hills".into(),
        raw: true,
        max_tokens: 24,
        ignore_eos: true,
        seed: 11,
        ..GenerateRequest::default()
    }
}

fn ids(engine: &mut Engine, req: &GenerateRequest) -> Vec<u32> {
    let g = engine.generate(req, &AtomicBool::new(false), &mut |_| {}).unwrap();
    g.tokens.iter().map(|t| t.id).collect()
}

#[test]
fn at_no_relaxation_every_rule_writes_the_target_only_text() {
    let (_dir, mut engine) = pair();
    let target = ids(&mut engine, &base());
    assert_eq!(target.len(), 24);
    let shapes = [
        Drafting::Chain(4),
        Drafting::adaptive().with_costs(Some(FixedCosts::default_pair(0.01))),
        Drafting::Tree(TreeShape { width: 2, depth: 3 }),
    ];
    for rule in MentorRule::ALL {
        let Some(lossless) = rule.param().lossless else { continue };
        for drafting in shapes {
            let req =
                GenerateRequest { mode: Mode::Speculative, verify: Verify::rule(rule, lossless), drafting, ..base() };
            assert_eq!(ids(&mut engine, &req), target, "{rule}, {drafting:?}");
        }
    }
}

#[test]
fn every_rule_runs_to_the_end_under_both_couplings() {
    let (_dir, mut engine) = pair();
    for rule in MentorRule::ALL {
        let param = rule.param();
        for coupling in [Coupling::SameSeed, Coupling::MaxAcceptance] {
            for budget in [param.min, 0.5 * (param.min + param.max), param.max] {
                let req = GenerateRequest {
                    mode: Mode::Speculative,
                    coupling,
                    verify: Verify { rule, budget, ..base().verify },
                    ..base()
                };
                let g = engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap();
                let what = format!("{rule} = {budget}, {coupling}");
                assert_eq!(g.tokens.len(), 24, "{what}");
                let s = &g.stats;
                assert!(s.n_drafted > 0 && (0.0..=1.0).contains(&s.acceptance_rate), "{what}: {s:?}");
                assert!(s.mean_tv.is_finite() && s.mean_tv >= 0.0, "{what}: {s:?}");
            }
        }
    }
}

/// With the inspector's numbers asked for, every drafted position carries its rule's own
/// quantities (the cascade's test, the typical threshold), in chains and in trees.
#[test]
fn drafted_tokens_carry_the_rules_own_quantities() {
    let (_dir, mut engine) = pair();
    for (rule, budget, key) in [(MentorRule::Cascade, 0.2, "max q"), (MentorRule::Typical, 0.3, "τ")] {
        for drafting in [Drafting::Chain(3), Drafting::Tree(TreeShape { width: 2, depth: 3 })] {
            let req = GenerateRequest {
                mode: Mode::Speculative,
                verify: Verify::rule(rule, budget),
                drafting,
                n_top: 4,
                ..base()
            };
            let g = engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap();
            let drafted: Vec<_> = g.tokens.iter().filter(|t| t.drafted.is_some()).collect();
            assert!(!drafted.is_empty(), "{rule}");
            for t in drafted {
                assert!(
                    t.rule_notes.iter().any(|(k, v)| k == key && v.is_finite()),
                    "{rule} {drafting:?}: {:?}",
                    t.rule_notes
                );
            }
            // Without the inspector's numbers nothing is computed.
            let quiet =
                engine.generate(&GenerateRequest { n_top: 0, ..req }, &AtomicBool::new(false), &mut |_| {}).unwrap();
            assert!(quiet.tokens.iter().all(|t| t.rule_notes.is_empty()));
        }
    }
}
