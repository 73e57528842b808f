//! How close a draft is to its target: over target-generated continuations of a prompt set
//! (teacher forcing), the mean 1 − TV(p, q) at a temperature, the greedy agreement, and the
//! draft's decode cost relative to the target's.

use crate::error::{EngineError, Result};
use crate::generate::{GenerateRequest, LoadedModel, Mode};
use crate::mentor::tv_distance;
use crate::sampling::{argmax, probabilities, SamplingParams};
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

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EvalRow {
    pub category: String,
    pub n_prompts: usize,
    pub n_positions: usize,
    /// Mean over positions of 1 − TV(p, q), both at the evaluation temperature.
    pub mean_one_minus_tv: f64,
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
    n_agree: usize,
}

impl Acc {
    fn row(&self, category: &str) -> EvalRow {
        EvalRow {
            category: category.to_string(),
            n_prompts: self.n_prompts,
            n_positions: self.n,
            mean_one_minus_tv: self.sum_overlap / self.n.max(1) as f64,
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
        target.model.clear()?;
        draft.model.clear()?;
        let rows_p = target.model.forward_rows(&ids[..ids.len() - 1])?;
        let rows_q = draft.model.forward_rows(&ids[..ids.len() - 1])?;
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
        for pos in n_prompt - 1..ids.len() - 1 {
            let pt = probabilities(&rows_p[pos], &[], &params, n_vocab);
            let qt = probabilities(&rows_q[pos], &[], &params, n_vocab);
            let overlap = 1.0 - tv_distance(&pt, &qt);
            let agree = argmax(&rows_p[pos][..n_vocab]) == argmax(&rows_q[pos][..n_vocab]);
            for acc in [&mut by_cat[idx].1, &mut overall] {
                acc.n += 1;
                acc.sum_overlap += overlap;
                acc.n_agree += usize::from(agree);
            }
        }
    }
    progress(prompts.len(), prompts.len());
    let ctx: Vec<u32> = target.tokenizer.prompt_ids(&prompts[0].prompt, false)?;
    let target_step_s = step_time(target, &ctx, 32)?;
    let draft_step_s = step_time(draft, &ctx, 32)?;
    Ok(EvalReport {
        temperature,
        rows: by_cat.iter().map(|(c, a)| a.row(c)).collect(),
        overall: overall.row("overall"),
        target_step_s,
        draft_step_s,
        draft_cost_ratio: draft_step_s / target_step_s.max(1e-12),
    })
}
