//! How close a draft is to its target: over target-generated continuations of a prompt set
//! (teacher forcing), the mean 1 − TV(p, q) at a temperature (a drafted token's acceptance under
//! the max-acceptance coupling), the same-seed coupling's acceptance, the greedy agreement, and
//! the draft's decode cost relative to the target's.

use crate::error::{EngineError, Result};
use crate::generate::{GenerateRequest, LoadedModel, Mode};
use crate::mentor::tv_distance;
use crate::sampling::{argmax, probabilities, same_seed_agreement, SamplingParams};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalPrompt {
    pub category: String,
    pub prompt: String,
}

/// Read a JSON-lines prompt file: one `{"category": .., "prompt": ..}` per line.
pub fn read_prompts(path: &Path) -> Result<Vec<EvalPrompt>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let p: EvalPrompt = serde_json::from_str(line).map_err(|e| {
            EngineError::InvalidSetting(format!(
                "{} line {}: {e}; each line must be {{\"category\": \"...\", \"prompt\": \"...\"}}",
                path.display(),
                i + 1
            ))
        })?;
        out.push(p);
    }
    if out.is_empty() {
        return Err(EngineError::InvalidSetting(format!("{} holds no prompts", path.display())));
    }
    Ok(out)
}

/// Races per position behind [`EvalRow::same_seed_acceptance`]: over a few thousand positions the
/// estimate's standard error is about 0.002.
pub const SAME_SEED_DRAWS: u32 = 16;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EvalRow {
    pub category: String,
    pub n_prompts: usize,
    pub n_positions: usize,
    /// Mean over positions of 1 − TV(p, q), both at the evaluation temperature: the probability
    /// that a drafted token is accepted under the max-acceptance coupling at D = 0.
    pub mean_one_minus_tv: f64,
    /// Mean over positions of the probability that a drafted token is accepted under the
    /// same-seed coupling at D = 0, estimated from [`SAME_SEED_DRAWS`] races per position.
    #[serde(default)]
    pub same_seed_acceptance: f64,
    /// Fraction of positions where the arg-maxes agree.
    pub greedy_agreement: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EvalReport {
    pub temperature: f32,
    pub rows: Vec<EvalRow>,
    pub overall: EvalRow,
    /// Seconds per single-token decode step at the end of a ~100-token context.
    pub target_step_s: f64,
    pub draft_step_s: f64,
    /// draft_step_s / target_step_s.
    pub draft_cost_ratio: f64,
}

#[derive(Default)]
struct Acc {
    n_prompts: usize,
    n: usize,
    sum_overlap: f64,
    sum_same_seed: f64,
    n_agree: usize,
}

impl Acc {
    fn row(&self, category: &str) -> EvalRow {
        EvalRow {
            category: category.to_string(),
            n_prompts: self.n_prompts,
            n_positions: self.n,
            mean_one_minus_tv: self.sum_overlap / self.n.max(1) as f64,
            same_seed_acceptance: self.sum_same_seed / self.n.max(1) as f64,
            greedy_agreement: self.n_agree as f64 / self.n.max(1) as f64,
        }
    }
}

/// Median seconds of `n` single-token steps after a prefill of `ctx`.
fn step_time(m: &mut LoadedModel, ctx: &[u32], n: usize) -> Result<f64> {
    m.model.clear()?;
    m.model.feed(ctx)?;
    let mut times = Vec::with_capacity(n);
    let mut tok = ctx[ctx.len() - 1];
    for _ in 0..n {
        let t = Instant::now();
        let logits = m.model.forward_rows(&[tok])?;
        times.push(t.elapsed().as_secs_f64());
        tok = argmax(&logits[0]) as u32;
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[n / 2])
}

/// Logit rows, one per position.
type Rows = Vec<Vec<f32>>;

/// The target's logits of every position of `ids` but the last, and a feature draft's where it
/// drafts the token after them (positions from `n_prompt − 1`, read from the target's settled
/// features as in a run; rows before are left empty).
fn feature_rows(
    target: &mut LoadedModel,
    draft: &mut LoadedModel,
    ids: &[u32],
    n_prompt: usize,
) -> Result<(Rows, Rows)> {
    let spec =
        draft.model.feature_spec().cloned().ok_or_else(|| EngineError::InvalidSetting("not a feature draft".into()))?;
    draft.model.borrow_embedding(&target.model)?;
    target.model.set_taps(&spec.taps)?;
    target.model.clear()?;
    let n = ids.len() - 1;
    let mut lazy = target.model.forward_lazy(&ids[..n])?;
    target.model.lazy_rows(&mut lazy, n)?;
    let rows_p = (0..n).map(|i| lazy.row(i).map(<[f32]>::to_vec).unwrap_or_default()).collect();
    let feats = draft.model.lift_features(lazy.hidden(), target.model.last_taps())?;
    let d = target.model.config.n_embd;
    // Draft row r reads the feature of position r and the token at r + 1, and drafts the token at
    // r + 2: the target's row r + 1 scores the same token.
    let r0 = n_prompt.saturating_sub(2);
    draft.model.clear()?;
    if r0 > 0 {
        draft.model.forward_features(&ids[1..r0 + 1], &feats[..r0 * d])?;
    }
    let mut rows_q = vec![Vec::new(); n];
    for r in r0..n.saturating_sub(1) {
        rows_q[r + 1] = draft.model.forward_features(&ids[r + 1..r + 2], &feats[r * d..(r + 1) * d])?.1;
    }
    Ok((rows_p, rows_q))
}

/// Median seconds of `n` feature-draft steps (each reading its own predicted feature) after a
/// catch-up on `ctx`'s features.
fn feature_step_time(target: &mut LoadedModel, draft: &mut LoadedModel, ctx: &[u32], n: usize) -> Result<f64> {
    let (_, _) = feature_rows(target, draft, ctx, ctx.len())?;
    let mut tok = ctx[ctx.len() - 1];
    let mut feat = vec![0f32; target.model.config.n_embd];
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (h, logits) = draft.model.forward_features(&[tok], &feat)?;
        times.push(t.elapsed().as_secs_f64());
        (feat, tok) = (h, argmax(&logits) as u32);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[n / 2])
}

/// Add positions `span` of one continuation (seed `seed`) to both accumulators: overlap 1 − TV,
/// the same-seed agreement and whether the arg-maxes agree, from the target's and the draft's
/// logit rows.
fn score_positions(
    (rows_p, rows_q): (&[Vec<f32>], &[Vec<f32>]),
    span: std::ops::Range<usize>,
    (params, n_vocab): (&SamplingParams, usize),
    seed: u64,
    race: &mut Vec<f32>,
    accs: [&mut Acc; 2],
) {
    let [cat, all] = accs;
    for pos in span {
        let pt = probabilities(&rows_p[pos], &[], params, n_vocab);
        let qt = probabilities(&rows_q[pos], &[], params, n_vocab);
        let overlap = 1.0 - tv_distance(&pt, &qt);
        // Races under a key of their own, apart from the noise that sampled the continuation
        // (the seed), so that the estimate does not look at the draws that chose the text.
        let first = pos as u64 * u64::from(SAME_SEED_DRAWS);
        let race_seed = seed | 1 << 63;
        let same_seed = same_seed_agreement(&pt, &qt, race_seed, first, SAME_SEED_DRAWS, race);
        let agree = argmax(&rows_p[pos][..n_vocab]) == argmax(&rows_q[pos][..n_vocab]);
        for acc in [&mut *cat, &mut *all] {
            acc.n += 1;
            acc.sum_overlap += overlap;
            acc.sum_same_seed += same_seed;
            acc.n_agree += usize::from(agree);
        }
    }
}

/// Evaluate `draft` against `target`; `n_tokens` continuation tokens per prompt, sampled from the
/// target at `temperature` (seed 0), then scored position by position.
pub fn evaluate(
    target: &mut LoadedModel,
    draft: &mut LoadedModel,
    prompts: &[EvalPrompt],
    temperature: f32,
    n_tokens: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalReport> {
    let n_vocab = crate::generate::check_vocab(target, draft)?;
    let cancel = AtomicBool::new(false);
    let params = SamplingParams { temperature, ..SamplingParams::default() };
    let mut by_cat: Vec<(String, Acc)> = Vec::new();
    let mut overall = Acc::default();
    let mut race = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        progress(i, prompts.len());
        let req = GenerateRequest {
            prompt: p.prompt.clone(),
            sampling: params,
            seed: i as u64,
            max_tokens: n_tokens,
            mode: Mode::Target,
            ..GenerateRequest::default()
        };
        let g = crate::generate::generate_single(target, None, &req, &cancel, &mut |_| {})?;
        let mut ids = target.tokenizer.prompt_ids(&p.prompt, false)?;
        let n_prompt = ids.len();
        ids.extend(g.tokens.iter().map(|t| t.id));
        if ids.len() <= n_prompt {
            continue;
        }
        let (rows_p, rows_q) = match draft.model.feature_spec() {
            Some(_) => feature_rows(target, draft, &ids, n_prompt)?,
            None => {
                target.model.clear()?;
                draft.model.clear()?;
                (target.model.forward_rows(&ids[..ids.len() - 1])?, draft.model.forward_rows(&ids[..ids.len() - 1])?)
            }
        };
        let idx = match by_cat.iter().position(|(c, _)| *c == p.category) {
            Some(i) => i,
            None => {
                by_cat.push((p.category.clone(), Acc::default()));
                by_cat.len() - 1
            }
        };
        for acc in [&mut by_cat[idx].1, &mut overall] {
            acc.n_prompts += 1;
        }
        let (cat, all) = (&mut by_cat[idx].1, &mut overall);
        let rows = (&rows_p[..], &rows_q[..]);
        score_positions(rows, n_prompt - 1..ids.len() - 1, (&params, n_vocab), i as u64, &mut race, [cat, all]);
    }
    progress(prompts.len(), prompts.len());
    let ctx: Vec<u32> = target.tokenizer.prompt_ids(&prompts[0].prompt, false)?;
    target.model.set_taps(&[])?;
    let target_step_s = step_time(target, &ctx, 32)?;
    let draft_step_s = match draft.model.feature_spec() {
        Some(_) => feature_step_time(target, draft, &ctx, 32)?,
        None => step_time(draft, &ctx, 32)?,
    };
    Ok(EvalReport {
        temperature,
        rows: by_cat.iter().map(|(c, a)| a.row(c)).collect(),
        overall: overall.row("overall"),
        target_step_s,
        draft_step_s,
        draft_cost_ratio: draft_step_s / target_step_s.max(1e-12),
    })
}
