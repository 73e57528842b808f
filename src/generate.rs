//! Generation: target-only, draft-only, and speculative / mentored rounds (draft → verify →
//! accept), streamed as events, cancellable between steps, with the statistics the reference
//! experiment reports.

use crate::error::{EngineError, Result};
use crate::mentor::Coupling;
use crate::model::Transformer;
use crate::sampling::{
    log_z_t1, nll_at_t1, nll_given_log_z, probabilities, race_argmax, sample_index, uniform, Purpose, RaceNoise,
};
use crate::tokenizer::{StreamDecoder, TextTokenizer};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

mod drafting;
mod request;
mod speculative;
pub use request::{Adaptive, Branches, DraftLen, Drafting, GenerateRequest, Lookup, TreeShape, Verify, MAX_TREE_WIDTH};
pub use speculative::generate_speculative;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Target,
    Draft,
    Speculative,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "target" => Ok(Self::Target),
            "draft" => Ok(Self::Draft),
            "speculative" | "spec" | "mentored" => Ok(Self::Speculative),
            _ => Err(format!("unknown mode `{s}`: use target, draft or speculative")),
        }
    }
}

/// Where an emitted token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// Sampled from the target (target-only mode, or a round that drafted nothing).
    Target,
    /// Proposed by the draft and accepted.
    DraftAccepted,
    /// Copied from the context ([`crate::lookup`]) and accepted.
    CopyAccepted,
    /// Drawn from the residual after the draft's proposal was rejected.
    Resampled,
    /// Sampled from the target after a fully accepted round.
    Bonus,
    /// Sampled from the draft alone (draft-only mode).
    Draft,
}

/// A token's probability under the target (p), the draft (q) and the mixture (π) at one position:
/// a row of the token inspector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopEntry {
    pub id: u32,
    pub text: String,
    pub p_target: Option<f32>,
    pub q_draft: Option<f32>,
    pub pi_mixed: Option<f32>,
}

/// One emitted token and the numbers behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: u32,
    pub text: String,
    /// Index of the token in the output (0 = first generated token).
    pub pos: usize,
    pub source: TokenSource,
    /// p(x): the target's sampling distribution at this position (None in draft-only mode).
    pub p_target: Option<f32>,
    pub q_draft: Option<f32>,
    pub pi_mixed: Option<f32>,
    pub accept_prob: Option<f64>,
    /// d = TV(p, q) at this position.
    pub tv: Option<f64>,
    pub theta: Option<f64>,
    pub round: Option<usize>,
    /// −log p(x) under the target at temperature 1: the surprise the mean target NLL averages.
    #[serde(default)]
    pub nll: Option<f64>,
    /// The token the draft proposed at this position (accepted or not), if one was verified here.
    #[serde(default)]
    pub drafted: Option<u32>,
    /// The other candidates the target verified at this position beside `drafted`: the draft's
    /// runners-up (a tree's siblings of the drafted token).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offers: Vec<u32>,
    /// The most likely tokens at this position under p, q and π (the request's `n_top`), the
    /// emitted and drafted tokens always among them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopEntry>,
    /// The mentor rule's own quantities at a drafted position ([`crate::MentorRule::explain`]),
    /// where `n_top` asks for the inspector's numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rule_notes: Vec<(String, f64)>,
}

/// One draft + verify round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundInfo {
    pub index: usize,
    pub n_proposed: usize,
    pub n_accepted: usize,
    /// Tokens this round emitted (accepted + the resampled or bonus token).
    pub n_emitted: usize,
    pub draft_s: f64,
    pub verify_s: f64,
    /// Of `n_proposed`: the tokens copied from the context. They come last: a round copies from
    /// its start, or drafts with the model and then copies where the drafted tokens led back to a
    /// passage of the context.
    #[serde(default)]
    pub n_copied: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Stats {
    pub n_prompt_tokens: usize,
    pub n_tokens: usize,
    pub prefill_s: f64,
    pub e2e_s: f64,
    pub decode_tok_s: f64,
    /// Mean −log p(x) of the emitted tokens under the target at temperature 1 (no penalty):
    /// the quality signal, comparable across sampling settings.
    pub mean_target_nll: f64,
    pub n_rounds: usize,
    pub n_drafted: usize,
    pub n_accepted: usize,
    /// Of `n_drafted` and `n_accepted`: the tokens copied from the context.
    #[serde(default)]
    pub n_copied: usize,
    #[serde(default)]
    pub n_copied_accepted: usize,
    /// accepted / drafted, as the reference reports it.
    pub acceptance_rate: f64,
    /// τ: tokens emitted per round.
    pub mean_accepted_len: f64,
    /// For each draft position i (0-based), the fraction of proposals at i that were accepted.
    pub per_position_acceptance: Vec<f64>,
    pub draft_s: f64,
    pub verify_s: f64,
    /// Mean realised TV(π, p) = min(d, D) over verified positions.
    pub mean_tv: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    pub text: String,
    pub mode: Mode,
    /// The coupling the run drew its tokens with.
    #[serde(default)]
    pub coupling: Coupling,
    pub tokens: Vec<TokenInfo>,
    pub rounds: Vec<RoundInfo>,
    pub stats: Stats,
    pub cancelled: bool,
}

/// What a run reports while it goes.
#[derive(Debug, Clone)]
pub enum GenEvent {
    /// Prompt processed; decoding starts.
    Prefilled {
        n_prompt_tokens: usize,
        prefill_s: f64,
    },
    Token(TokenInfo),
    Round(RoundInfo),
}

/// A model and its tokenizer.
pub struct LoadedModel {
    pub model: Transformer,
    /// Shared with the other model of a pair when both files describe the same tokenizer.
    pub tokenizer: std::sync::Arc<TextTokenizer>,
    pub info: crate::gguf::ModelInfo,
}

/// The ids a draft and a target agree on ([`crate::tokenizer::TextTokenizer::fits_draft`], the
/// one test of whether a draft fits a target); an error naming the first difference otherwise.
pub fn check_vocab(target: &LoadedModel, draft: &LoadedModel) -> Result<usize> {
    let mismatch = |detail: String| EngineError::VocabMismatch {
        target: target.info.path.clone(),
        draft: draft.info.path.clone(),
        detail,
    };
    let n = target.tokenizer.fits_draft(&draft.tokenizer).map_err(mismatch)?;
    Ok(n.min(target.model.config.n_vocab).min(draft.model.config.n_vocab))
}

/// Running sums that become [`Stats`].
#[derive(Default)]
struct Tally {
    nll_sum: f64,
    n_nll: usize,
    tv_sum: f64,
    n_tv: usize,
    proposed_at: Vec<usize>,
    accepted_at: Vec<usize>,
}

impl Tally {
    /// Count a verified position at depth `i` of its round and its TV(π, p).
    fn verified(&mut self, i: usize, tv_pi_p: f64) {
        if self.proposed_at.len() <= i {
            self.proposed_at.resize(i + 1, 0);
            self.accepted_at.resize(i + 1, 0);
        }
        self.proposed_at[i] += 1;
        self.tv_sum += tv_pi_p;
        self.n_tv += 1;
    }
}

/// One generation in progress: the shared bookkeeping of all modes.
struct Run<'a> {
    req: &'a GenerateRequest,
    tok: &'a TextTokenizer,
    cancel: &'a AtomicBool,
    on_event: &'a mut dyn FnMut(GenEvent),
    /// Prompt followed by every emitted token.
    context: Vec<u32>,
    n_prompt: usize,
    decoder: StreamDecoder,
    text: String,
    tokens: Vec<TokenInfo>,
    rounds: Vec<RoundInfo>,
    stats: Stats,
    tally: Tally,
    stopped: bool,
    start: Instant,
}

impl<'a> Run<'a> {
    fn n_emitted(&self) -> usize {
        self.context.len() - self.n_prompt
    }

    fn remaining(&self) -> usize {
        self.req.max_tokens.saturating_sub(self.n_emitted())
    }

    fn done(&self) -> bool {
        self.stopped || self.remaining() == 0 || self.cancel.load(Ordering::Relaxed)
    }

    /// Append a token. A stop token ends the run (and is not shown) unless EOS is ignored.
    fn emit(&mut self, mut info: TokenInfo, nll: Option<f64>) -> Result<()> {
        if !self.req.ignore_eos && self.tok.stop_ids.contains(&info.id) {
            self.stopped = true;
            return Ok(());
        }
        info.text = self.decoder.push(self.tok, info.id)?;
        info.pos = self.n_emitted();
        info.nll = nll;
        if let Some(nll) = nll {
            self.tally.nll_sum += nll;
            self.tally.n_nll += 1;
        }
        self.text.push_str(&info.text);
        self.context.push(info.id);
        self.tokens.push(info.clone());
        (self.on_event)(GenEvent::Token(info));
        Ok(())
    }

    fn finish(mut self, mode: Mode) -> Generation {
        let s = &mut self.stats;
        s.n_tokens = self.tokens.len();
        s.e2e_s = self.start.elapsed().as_secs_f64();
        let decode_s = s.e2e_s - s.prefill_s;
        s.decode_tok_s = if decode_s > 0.0 { s.n_tokens as f64 / decode_s } else { 0.0 };
        if self.tally.n_nll > 0 {
            s.mean_target_nll = self.tally.nll_sum / self.tally.n_nll as f64;
        }
        if s.n_drafted > 0 {
            s.acceptance_rate = s.n_accepted as f64 / s.n_drafted as f64;
        }
        if s.n_rounds > 0 {
            s.mean_accepted_len = s.n_tokens as f64 / s.n_rounds as f64;
        }
        if self.tally.n_tv > 0 {
            s.mean_tv = self.tally.tv_sum / self.tally.n_tv as f64;
        }
        s.per_position_acceptance = self
            .tally
            .proposed_at
            .iter()
            .zip(&self.tally.accepted_at)
            .map(|(&p, &a)| if p > 0 { a as f64 / p as f64 } else { 0.0 })
            .collect();
        Generation {
            text: self.text,
            mode,
            coupling: self.req.coupling,
            tokens: self.tokens,
            rounds: self.rounds,
            stats: self.stats,
            cancelled: self.cancel.load(Ordering::Relaxed),
        }
    }
}

fn plain_token(id: u32, source: TokenSource) -> TokenInfo {
    TokenInfo {
        id,
        text: String::new(),
        pos: 0,
        source,
        p_target: None,
        q_draft: None,
        pi_mixed: None,
        accept_prob: None,
        tv: None,
        theta: None,
        round: None,
        nll: None,
        drafted: None,
        offers: Vec::new(),
        top: Vec::new(),
        rule_notes: Vec::new(),
    }
}

/// The indices of the `k` largest values of `dist`, largest first (lowest index on ties). One
/// pass with a small sorted buffer: most values fail the threshold test at once.
pub fn top_indices(dist: &[f32], k: usize) -> Vec<usize> {
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return Vec::new();
    }
    for (i, &v) in dist.iter().enumerate() {
        if best.len() == k && v <= best[k - 1].0 {
            continue;
        }
        let at = best.partition_point(|&(b, _)| b >= v);
        best.insert(at, (v, i));
        best.truncate(k);
    }
    best.into_iter().map(|(_, i)| i).collect()
}

/// The inspector's rows at one position: the `n` tokens most likely under any of p, q and π,
/// ordered by their largest probability, with every token of `must` (emitted, drafted) kept.
fn top_entries(
    tok: &TextTokenizer,
    n: usize,
    p: Option<&[f32]>,
    q: Option<&[f32]>,
    pi: Option<&[f32]>,
    must: &[u32],
) -> Vec<TopEntry> {
    if n == 0 {
        return Vec::new();
    }
    let dists: Vec<&[f32]> = [p, q, pi].into_iter().flatten().collect();
    let mut ids: Vec<u32> = dists.iter().flat_map(|d| top_indices(d, n)).map(|i| i as u32).collect();
    let at = |d: Option<&[f32]>, id: u32| d.and_then(|d| d.get(id as usize).copied());
    let peak = |id: u32| dists.iter().filter_map(|d| d.get(id as usize).copied()).fold(0f32, f32::max);
    ids.sort_unstable();
    ids.dedup();
    ids.sort_by(|&a, &b| peak(b).total_cmp(&peak(a)).then(a.cmp(&b)));
    ids.truncate(n);
    for &m in must {
        if !ids.contains(&m) {
            if ids.len() == n {
                // Replace the least likely row that is not itself required.
                if let Some(slot) = ids.iter().rposition(|x| !must.contains(x)) {
                    ids.remove(slot);
                }
            }
            ids.push(m);
        }
    }
    ids.into_iter()
        .map(|id| TopEntry {
            id,
            text: tok.decode(&[id]).unwrap_or_default(),
            p_target: at(p, id),
            q_draft: at(q, id),
            pi_mixed: at(pi, id),
        })
        .collect()
}

/// Prompt ids after the checks every mode shares.
fn prepare(req: &GenerateRequest, tok: &TextTokenizer, n_ctx: usize) -> Result<Vec<u32>> {
    req.validate()?;
    let ids = tok.prompt_ids(&req.prompt, req.raw)?;
    if ids.len() + req.max_tokens > n_ctx {
        return Err(EngineError::PromptTooLong { n_prompt: ids.len(), n_new: req.max_tokens, n_ctx });
    }
    Ok(ids)
}

fn new_run<'a>(
    req: &'a GenerateRequest,
    tok: &'a TextTokenizer,
    ids: Vec<u32>,
    start: Instant,
    cancel: &'a AtomicBool,
    on_event: &'a mut dyn FnMut(GenEvent),
) -> Run<'a> {
    let n_prompt = ids.len();
    Run {
        req,
        tok,
        cancel,
        on_event,
        context: ids,
        n_prompt,
        decoder: StreamDecoder::new(),
        text: String::new(),
        tokens: Vec::new(),
        rounds: Vec::new(),
        stats: Stats { n_prompt_tokens: n_prompt, ..Stats::default() },
        tally: Tally::default(),
        stopped: false,
        start,
    }
}

/// Feed the prompt except its last token (each round feeds the last token itself, so that every
/// verify forward has the same shape `[last, x1..xk]`).
fn prefill(model: &mut Transformer, ids: &[u32]) -> Result<()> {
    model.clear()?;
    if ids.len() > 1 {
        model.feed(&ids[..ids.len() - 1])?;
    }
    Ok(())
}

/// Sample from a single model, one token per forward (target-only and draft-only modes).
/// In draft-only mode the target (if given) scores the text afterwards, outside the timing, so
/// the quality signal is comparable with the other modes.
pub fn generate_single(
    model: &mut LoadedModel,
    scorer: Option<&mut LoadedModel>,
    req: &GenerateRequest,
    cancel: &AtomicBool,
    on_event: &mut dyn FnMut(GenEvent),
) -> Result<Generation> {
    let start = Instant::now();
    let (mode, source, purpose) = match req.mode {
        Mode::Draft => (Mode::Draft, TokenSource::Draft, Purpose::DraftSample),
        _ => (Mode::Target, TokenSource::Target, Purpose::TargetSample),
    };
    let ids = prepare(req, &model.tokenizer, model.model.max_context())?;
    model.model.set_taps(&[])?;
    let n_vocab = model.tokenizer.vocab_size().min(model.model.config.n_vocab);
    prefill(&mut model.model, &ids)?;
    let mut run = new_run(req, &model.tokenizer, ids, start, cancel, on_event);
    run.stats.prefill_s = start.elapsed().as_secs_f64();
    (run.on_event)(GenEvent::Prefilled { n_prompt_tokens: run.n_prompt, prefill_s: run.stats.prefill_s });
    let mut noise = RaceNoise::new(req.seed, n_vocab);
    while !run.done() {
        let last = run.context[run.context.len() - 1];
        let t = Instant::now();
        let logits = model.model.forward_rows(&[last])?.remove(0);
        let scored = mode == Mode::Target;
        let (p, log_z) =
            beside_log_z(&logits, n_vocab, scored, || probabilities(&logits, &run.context, &req.sampling, n_vocab))?;
        let pos = run.n_emitted() as u64;
        let x = draw(req, &mut noise, &p, pos, purpose);
        noise.forget_before(pos + 1);
        let mut info = plain_token(x, source);
        info.top = match scored {
            true => top_entries(run.tok, req.n_top, Some(&p[..]), None, None, &[x]),
            false => top_entries(run.tok, req.n_top, None, Some(&p[..]), None, &[x]),
        };
        let nll = if scored {
            info.p_target = Some(p[x as usize]);
            log_z.map(|z| nll_given_log_z(z, &logits, x))
        } else {
            info.q_draft = Some(p[x as usize]);
            None
        };
        run.stats.verify_s += t.elapsed().as_secs_f64();
        run.emit(info, nll)?;
    }
    let mut generation = run.finish(mode);
    if mode == Mode::Draft {
        if let Some(scorer) = scorer {
            score_with_target(scorer, &model.tokenizer, req, &mut generation)?;
        }
    }
    Ok(generation)
}

/// A token from `dist` at output position `pos`: the race with the position's noise under the
/// same-seed coupling, inverse-CDF with the keyed uniform for `purpose` under max-acceptance.
fn draw(req: &GenerateRequest, noise: &mut RaceNoise, dist: &[f32], pos: u64, purpose: Purpose) -> u32 {
    match req.coupling {
        Coupling::SameSeed => race_argmax(dist, noise.at(pos)) as u32,
        Coupling::MaxAcceptance => sample_index(dist, uniform(req.seed, pos, purpose)) as u32,
    }
}

/// Fill in p(x) and the target NLL of an already generated text (one batched forward).
fn score_with_target(
    target: &mut LoadedModel,
    tok: &TextTokenizer,
    req: &GenerateRequest,
    g: &mut Generation,
) -> Result<()> {
    if g.tokens.is_empty() {
        return Ok(());
    }
    let mut ids = tok.prompt_ids(&req.prompt, req.raw)?;
    let n_prompt = ids.len();
    ids.extend(g.tokens.iter().map(|t| t.id));
    let n_vocab = target.tokenizer.vocab_size().min(target.model.config.n_vocab);
    target.model.clear()?;
    let rows = target.model.forward_rows(&ids[..ids.len() - 1])?;
    let mut nll = 0.0;
    for (i, t) in g.tokens.iter_mut().enumerate() {
        let row = &rows[n_prompt - 1 + i];
        let p = probabilities(row, &ids[..n_prompt + i], &req.sampling, n_vocab);
        t.p_target = Some(p[t.id as usize]);
        nll += nll_at_t1(row, t.id, n_vocab);
    }
    g.stats.mean_target_nll = nll / g.tokens.len() as f64;
    Ok(())
}

/// How many verify rows a round of `k` drafted tokens will likely use with per-token acceptance
/// `alpha`: the accepted prefix and the row after it (the replacement, or the bonus when all k are
/// accepted), 1 + α + … + α^k on average, rounded up.
pub fn likely_rows(alpha: f64, k: usize) -> usize {
    let a = alpha.clamp(0.0, 1.0);
    let expected: f64 = (0..=k).map(|j| a.powi(j as i32)).sum();
    (expected.ceil() as usize).clamp(1, k + 1)
}

/// `work()` on this thread while, if `scored`, the log-normaliser of `logits` at temperature 1 is
/// computed on the engine's other thread, which idles between forwards. The normaliser is for the
/// NLL reported with every token: a pass over the whole vocabulary with an exponential per token
/// (~60 µs for 49152), a third of the sampling work of a verified token.
fn beside_log_z<T: Send>(
    logits: &[f32],
    n_vocab: usize,
    scored: bool,
    work: impl FnOnce() -> T + Send,
) -> Result<(T, Option<f64>)> {
    if !scored {
        return Ok((work(), None));
    }
    let work = std::sync::Mutex::new(Some(work));
    let (out, log_z) = (std::sync::Mutex::new(None), std::sync::OnceLock::new());
    crate::team::run(2, &|task| {
        if task == 0 {
            if let Some(w) = work.lock().ok().and_then(|mut w| w.take()) {
                let done = w();
                if let Ok(mut o) = out.lock() {
                    *o = Some(done);
                }
            }
        } else {
            let _ = log_z.set(log_z_t1(logits, n_vocab));
        }
    });
    match (out.into_inner().ok().flatten(), log_z.into_inner()) {
        (Some(o), Some(z)) => Ok((o, Some(z))),
        _ => Err(EngineError::Internal("sampling: a task of the thread team did not run".into())),
    }
}
