//! `mentor-lab generate`: one generation from a prompt, streamed to stdout or as JSON.

use super::{load_engine, ModelArgs};
use anyhow::{bail, Result};
use clap::Args;
use mentor_lab::{
    Coupling, DraftLen, Drafting, GenEvent, GenerateRequest, Lookup, MentorRule, Mode, SamplingParams, Verify,
};
use std::io::Write;
use std::sync::atomic::AtomicBool;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    models: ModelArgs,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Use the prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Print one JSON object with every token and the statistics.
    #[arg(long)]
    json: bool,
    /// target, draft or speculative.
    #[arg(long, default_value = "target")]
    mode: Mode,
    /// The rule's one parameter: the TV budget D under --rule tv (0 is lossless), the KL budget
    /// in nats under kl, α under cascade, T under fuzzy, ε under typical, l under lenience.
    /// Without it, the rule's lossless value.
    #[arg(long, visible_alias = "tv-budget", allow_negative_numbers = true)]
    budget: Option<f64>,
    /// The mentor rule: tv, kl, cascade, fuzzy, typical or lenience.
    #[arg(long, visible_alias = "mentor", default_value = "tv")]
    rule: MentorRule,
    /// Tokens drafted per round: 1..16 or auto.
    #[arg(long, default_value = "4")]
    draft_len: DraftLen,
    /// Do not emit the target's bonus token after a fully accepted round.
    #[arg(long)]
    no_bonus: bool,
    /// With --draft-len auto: never draft by copying from the context.
    #[arg(long)]
    no_lookup: bool,
    /// With --draft-len auto: copy only from a round's start, never after tokens drafted by the model.
    #[arg(long)]
    no_copy_tail: bool,
    /// Draft a tree of candidates each round, WIDTHxDEPTH (e.g. 3x6), verified in one forward,
    /// instead of a chain (same-seed coupling). With --draft-len auto the policy shapes each
    /// round's tree inside WIDTHxDEPTH from the measured costs and acceptance.
    #[arg(long, value_name = "WxD")]
    tree: Option<mentor_lab::generate::TreeShape>,
    /// With --draft-len auto, same-seed coupling, independent draft: also verify the draft's
    /// runners-up beside the drafted chain where the policy expects them to pay (one-token
    /// branches of a tree).
    #[arg(long)]
    side_offers: bool,
    /// same-seed: a position's token depends only on the seed and its distribution, so at D = 0 the
    /// text equals target-only's; max-acceptance: the classic rule, more drafted tokens accepted.
    #[arg(long, default_value = "same-seed")]
    coupling: Coupling,
    /// With --json: also record the N most likely tokens under p, q and π at every position.
    #[arg(long, default_value_t = 0)]
    top: usize,
    /// With --draft-len auto: decide from fixed costs instead of measured times (a target step of
    /// MS milliseconds, a drafted token 0.1 of it, each verify row 0.19), so a run's rounds repeat
    /// exactly on any machine.
    #[arg(long, value_name = "MS")]
    fixed_step_ms: Option<f64>,
}

/// The budget if the rule accepts it (its lossless value if none was given), else an error saying
/// what was wrong and what to pass.
pub fn checked_budget(rule: MentorRule, budget: Option<f64>) -> Result<f64> {
    let param = rule.param();
    let range = format!("Pass a --budget from {} to {}", param.min, param.max);
    let Some(budget) = budget.or(param.lossless) else {
        bail!("--rule {rule} has no lossless value, so it needs its {}. {range}.", param.name);
    };
    param.check(budget).map_err(|e| anyhow::anyhow!("--budget {budget} does not suit --rule {rule}: {e}. {range}."))
}

/// What the flags ask each round to draft; side offers where they cannot apply are an error.
fn drafting(args: &GenerateArgs) -> Result<Drafting> {
    let lookup = Lookup::from_flags(!args.no_lookup, !args.no_copy_tail);
    let drafting = Drafting::from_controls(args.draft_len, args.tree, args.side_offers, lookup)
        .map_err(|e| anyhow::anyhow!("--side-offers: {e}"))?;
    let costs = args.fixed_step_ms.map(|ms| mentor_lab::adaptive::FixedCosts::default_pair(ms / 1000.0));
    Ok(drafting.with_costs(costs))
}

pub fn generate(args: GenerateArgs) -> Result<()> {
    let req = GenerateRequest {
        prompt: args.prompt.clone(),
        raw: args.raw,
        sampling: SamplingParams {
            temperature: args.temperature,
            repeat_penalty: args.repeat_penalty,
            repeat_last_n: args.repeat_last_n,
            top_p: args.top_p,
        },
        seed: args.seed,
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        mode: args.mode,
        verify: Verify { rule: args.rule, budget: checked_budget(args.rule, args.budget)?, bonus: !args.no_bonus },
        drafting: drafting(&args)?,
        coupling: args.coupling,
        n_top: args.top,
    };
    req.validate()?;
    if req.prompt.trim().is_empty() {
        bail!(mentor_lab::EngineError::EmptyPrompt);
    }
    let mut engine = load_engine(&args.models, args.mode != Mode::Target)?;
    let cancel = AtomicBool::new(false);
    let json = args.json;
    let mut stdout = std::io::stdout();
    let generation = engine.generate(&req, &cancel, &mut |ev| {
        if let (GenEvent::Token(t), false) = (ev, json) {
            let _ = write!(stdout, "{}", t.text);
            let _ = stdout.flush();
        }
    })?;
    if json {
        println!("{}", serde_json::to_string(&generation)?);
    } else {
        let s = &generation.stats;
        println!();
        eprintln!(
            "[{} tokens, prompt {} tokens, prefill {:.2}s, decode {:.1} tok/s, e2e {:.2}s, mean target NLL {:.3}{}]",
            s.n_tokens,
            s.n_prompt_tokens,
            s.prefill_s,
            s.decode_tok_s,
            s.e2e_s,
            s.mean_target_nll,
            if generation.mode == Mode::Speculative {
                format!(
                    ", {} coupling, acceptance {:.1}%, τ {:.2}, {} rounds, draft {:.2}s, verify {:.2}s",
                    generation.coupling,
                    100.0 * s.acceptance_rate,
                    s.mean_accepted_len,
                    s.n_rounds,
                    s.draft_s,
                    s.verify_s
                )
            } else {
                String::new()
            }
        );
    }
    Ok(())
}
