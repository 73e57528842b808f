//! Speculative / mentored decoding. A round is five named steps: `propose` (copies from the
//! context, the draft model, a copied tail), `verify` (one batched target forward), the walk (the
//! proposal as a tree of width one, walked by the one walk of every round, [`tree`]: the coupling's
//! rule token by token, then the bonus token), `settle` (both KV caches roll back to the accepted
//! text) and `record` (statistics, the policy's observations, the round event).

use super::{
    beside_log_z, check_vocab, draw, new_run, plain_token, prepare, top_entries, DraftLen, GenEvent, GenerateRequest,
    Generation, LoadedModel, Lookup, Mode, RoundInfo, Run, TokenInfo, TokenSource,
};
use crate::adaptive::{AdaptivePolicy, MAX_DRAFT_LEN, MAX_SIDE_OFFERS};
use crate::corpus::Corpus;
use crate::error::{EngineError, Result};
use crate::lookup::{point_mass, propose_from, Match};
use crate::mentor::Coupling;
use crate::model::{LazyLogits, Transformer};
use crate::sampling::{nll_given_log_z, probabilities, race_argmax, race_top, sample_index, Purpose, RaceNoise};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

mod draft_model;
mod tree;

use draft_model::DraftModel;

/// Speculative / mentored decoding with `draft` proposing and `target` verifying.
pub fn generate_speculative(
    target: &mut LoadedModel,
    draft: &mut LoadedModel,
    req: &GenerateRequest,
    corpus: Option<&Corpus>,
    cancel: &AtomicBool,
    on_event: &mut dyn FnMut(GenEvent),
) -> Result<Generation> {
    let start = Instant::now();
    let n_vocab = check_vocab(target, draft)?;
    let n_ctx = target.model.max_context().min(draft.model.max_context());
    let ids = prepare(req, &target.tokenizer, n_ctx)?;
    let source = DraftModel::start(target, draft, &ids)?;
    let (tmodel, dmodel) = (&mut target.model, &mut draft.model);
    let mut run = new_run(req, &target.tokenizer, ids, start, cancel, on_event);
    run.stats.prefill_s = start.elapsed().as_secs_f64();
    (run.on_event)(GenEvent::Prefilled { n_prompt_tokens: run.n_prompt, prefill_s: run.stats.prefill_s });
    let mut rounds = Rounds {
        req,
        corpus,
        source,
        policy: AdaptivePolicy::with_costs(req.drafting.costs()),
        auto: req.drafting.is_adaptive(),
        draft_attempts: Vec::new(),
        noise: RaceNoise::new(req.seed, n_vocab),
        n_vocab,
    };
    while !run.done() {
        if let Some(shape) = req.drafting.tree() {
            rounds.tree_round(&mut run, tmodel, dmodel, shape)?;
            continue;
        }
        let t_round = Instant::now();
        let base = run.context.len();
        let mut proposal = rounds.propose(&run, dmodel)?;
        let draft_s = t_round.elapsed().as_secs_f64();
        if run.cancel.load(Ordering::Relaxed) {
            break;
        }
        let (mut rows, mut verify_s) = rounds.verify(tmodel, &run, &proposal)?;
        let tree = rounds.chain_tree(&run, &mut proposal);
        let (path, _) = rounds.walk_tree(&mut run, tmodel, &tree, &mut rows, &mut verify_s)?;
        // The trunk's nodes are 1..=k; a node past them is a side offer.
        let k = proposal.tokens.len();
        let n_accepted = path[1..].iter().take_while(|&&n| n <= k).count();
        let side = path.last().filter(|&&n| n > k).map(|&n| n - k - 1);
        rounds.settle(&run, tmodel, dmodel, &rows, (base, n_accepted, side), k + 1)?;
        let round_s = t_round.elapsed().as_secs_f64() - draft_s;
        rounds.record(&mut run, &proposal, base, (n_accepted, side.is_some()), (draft_s, verify_s, round_s));
    }
    Ok(run.finish(Mode::Speculative))
}

/// A round's proposed tokens: `tokens[..n_model]` come from the draft model, the rest are copied
/// from the context (a leading copy when `n_model` is 0, else a tail after the drafted tokens).
struct Proposal {
    tokens: Vec<u32>,
    /// The proposal distribution of each token (a point mass for a copy).
    q: Vec<Vec<f32>>,
    n_model: usize,
    /// The match behind a leading copy, and behind the copied tokens whichever they are.
    matched: Match,
    copy_matched: Match,
    /// The context followed by the proposed tokens: the penalties' history at each position.
    text: Vec<u32>,
    /// The sum over prefixes of the estimated probability that the whole prefix is accepted.
    survival_sum: f64,
    /// Tokens the draft's first forward caught up on, and that forward's time.
    caught_up: usize,
    catch_up_s: f64,
    /// Per drafted token: the runners-up of the draft's race there (token, draft probability),
    /// and the estimated probability that the walk reaches it.
    offers: Vec<Vec<(u32, f32)>>,
    reach: Vec<f64>,
    /// The side offers verified beside the chain, as (position in `tokens`, token): one-token
    /// branches of a tree whose trunk is the chain.
    side: Vec<(usize, u32)>,
}

/// The state that lives across rounds.
struct Rounds<'r> {
    req: &'r GenerateRequest,
    /// A corpus the user pointed at, copied from as the context is.
    corpus: Option<&'r Corpus>,
    source: DraftModel,
    policy: AdaptivePolicy,
    auto: bool,
    /// How many times each output position has been drafted (see `draft_uniform`).
    draft_attempts: Vec<u32>,
    noise: RaceNoise,
    n_vocab: usize,
}

impl Rounds<'_> {
    /// Propose: a copy from the context where the policy prefers it to drafting (never past
    /// max_tokens, ending at a stop token); otherwise the draft model, token by token, for as long
    /// as the depth rule says it pays, going on by copying where its tokens lead back into the
    /// context.
    fn propose(&mut self, run: &Run, dmodel: &mut Transformer) -> Result<Proposal> {
        let req = self.req;
        let base = run.context.len();
        let is_stop = |x: &u32| !req.ignore_eos && run.tok.stop_ids.contains(x);
        let (copy, matched) = self.leading_copy(run, is_stop);
        let k_wanted = match req.drafting.len() {
            _ if !copy.is_empty() => 0,
            DraftLen::Fixed(k) => k,
            // The policy decides whether to draft; how far, token by token below.
            DraftLen::Auto => match self.policy.next_len(MAX_DRAFT_LEN) {
                0 => 0,
                _ => MAX_DRAFT_LEN,
            },
        };
        // Never draft past max_tokens: the k drafted tokens must all fit.
        let k_cap = if self.source.can_draft(base) { k_wanted.min(run.remaining()) } else { 0 };
        let mut p = Proposal::new(&run.context, matched, k_cap.max(copy.len()));
        for &x in &copy {
            p.push(x, point_mass(x, self.n_vocab));
        }
        if k_cap == 0 {
            return Ok(p);
        }
        let t_catch_up = Instant::now();
        let mut logits;
        (logits, p.caught_up) = self.source.catch_up(dmodel, &run.context)?;
        p.catch_up_s = t_catch_up.elapsed().as_secs_f64();
        // The estimated probability that every token drafted so far is accepted; its sum over
        // the prefixes is the number of verify rows the round will likely use, less one.
        let depth = if self.auto { self.policy.depth_thresholds() } else { [0.0; MAX_DRAFT_LEN + 1] };
        let mut p_prefix = 1.0;
        for i in 0..k_cap {
            let q = probabilities(&logits, &p.text, &req.sampling, self.n_vocab);
            let x = self.draft_token(&q, base - run.n_prompt + i);
            if self.side_offers() {
                let at = (base - run.n_prompt + i) as u64;
                let top = race_top(&q, self.noise.at(at), 1 + MAX_SIDE_OFFERS);
                p.offers.push(top.iter().skip(1).map(|&t| (t as u32, q[t])).collect());
                p.reach.push(p_prefix);
            }
            p_prefix *= self.policy.accept_estimate(q[x as usize]);
            p.survival_sum += p_prefix;
            p.push(x, q);
            p.n_model += 1;
            if i + 1 == k_cap || is_stop(&x) || run.cancel.load(Ordering::Relaxed) {
                break;
            }
            if req.drafting.lookup() == Lookup::StartAndTail
                && self.copy_tail(&mut p, &mut p_prefix, k_cap - i - 1, is_stop)
            {
                break;
            }
            // From the tokens drafted so far only: the next position's outcome stays the
            // target's whether it is drafted or not (see `crate::adaptive`).
            if self.auto && p_prefix < depth[(i + 1).min(MAX_DRAFT_LEN)] {
                break;
            }
            logits = self.source.step(dmodel, x)?;
        }
        p.side = self.choose_side_offers(&p);
        Ok(p)
    }

    /// A copy from the context to propose instead of drafting (empty where the policy prefers
    /// the draft), cut after a stop token, and the length of the context match behind it.
    fn leading_copy(&mut self, run: &Run, is_stop: impl Fn(&u32) -> bool) -> (Vec<u32>, Match) {
        let (mut copy, matched) = match self.req.drafting.lookup() != Lookup::Off {
            true => propose_from(&run.context, self.corpus, MAX_DRAFT_LEN.min(run.remaining())).unwrap_or_default(),
            false => (Vec::new(), Match::default()),
        };
        copy.truncate(if copy.is_empty() { 0 } else { self.policy.lookup_len(copy.len(), matched) });
        if let Some(stop) = copy.iter().position(is_stop) {
            copy.truncate(stop + 1);
        }
        (copy, matched)
    }

    /// The runners-up the policy expects to pay as side offers, as (position, token).
    fn choose_side_offers(&self, p: &Proposal) -> Vec<(usize, u32)> {
        let flat: Vec<(usize, u32, f64, f32)> = (p.offers.iter().zip(&p.reach).enumerate())
            .flat_map(|(i, (o, &reach))| o.iter().map(move |&(t, q)| (i, t, reach, q)))
            .collect();
        let gains: Vec<(f64, f32)> = flat.iter().map(|&(_, _, reach, q)| (reach, q)).collect();
        self.policy.side_offers(p.tokens.len(), &gains).into_iter().map(|j| (flat[j].0, flat[j].1)).collect()
    }

    /// Whether rounds verify side offers beside the drafted chain: asked for, under the
    /// same-seed coupling (the tree walk's exact rule).
    fn side_offers(&self) -> bool {
        self.req.drafting.side_offers() && self.req.coupling == Coupling::SameSeed
    }

    /// Whether the policy learns how often the draft's runners-up are the target's token: where
    /// rounds may verify them (trees, side offers).
    fn learns_runners_up(&self) -> bool {
        self.req.drafting.tree().is_some() || self.side_offers()
    }

    /// The draft model's token at output position `at` under the request's coupling.
    fn draft_token(&mut self, q: &[f32], at: usize) -> u32 {
        if self.draft_attempts.len() <= at {
            self.draft_attempts.resize(at + 1, 0);
        }
        match self.req.coupling {
            Coupling::SameSeed => race_argmax(q, self.noise.at(at as u64)) as u32,
            Coupling::MaxAcceptance => {
                let u = crate::sampling::draft_uniform(self.req.seed, at as u64, self.draft_attempts[at]);
                self.draft_attempts[at] += 1;
                sample_index(q, u) as u32
            }
        }
    }

    /// Where the drafted tokens lead back to a passage of the context, the round goes on by
    /// copying it (no draft forward per token) while that pays; like the depth rule, this looks
    /// only at the tokens proposed so far. True when it copied.
    fn copy_tail(&mut self, p: &mut Proposal, p_prefix: &mut f64, room: usize, is_stop: impl Fn(&u32) -> bool) -> bool {
        let Some((tail, m)) = propose_from(&p.text, self.corpus, room) else { return false };
        let n = self.policy.copy_tail_len(*p_prefix, p.tokens.len(), m, tail.len());
        let a = self.policy.alpha_lookup(m);
        for &y in tail.iter().take(n) {
            *p_prefix *= a;
            p.survival_sum += *p_prefix;
            p.push(y, point_mass(y, self.n_vocab));
            if is_stop(&y) {
                break;
            }
        }
        if n > 0 {
            p.copy_matched = m;
        }
        n > 0
    }

    /// Verify: one target forward over [last, x1..xk] gives p at k+1 positions. The output head
    /// runs first for the rows this round will likely use (see `likely_rows`); the rest only if
    /// the walk gets that far.
    fn verify(&self, tmodel: &mut Transformer, run: &Run, p: &Proposal) -> Result<(LazyLogits, f64)> {
        let t_verify = Instant::now();
        let mut feed = vec![run.context[run.context.len() - 1]];
        feed.extend_from_slice(&p.tokens);
        let mut rows = match p.side.is_empty() {
            true => tmodel.forward_lazy(&feed)?,
            false => {
                // The chain is the tree's trunk (node i + 1 is tokens[i]); a side offer at
                // position i hangs from node i.
                let mut parents: Vec<Option<usize>> = (0..feed.len()).map(|j| j.checked_sub(1)).collect();
                feed.extend(p.side.iter().map(|s| s.1));
                parents.extend(p.side.iter().map(|s| Some(s.0)));
                tmodel.forward_tree(&feed, &parents)?
            }
        };
        let likely = match p.n_model {
            0 if !p.tokens.is_empty() => super::likely_rows(self.policy.alpha_lookup(p.matched), p.tokens.len()),
            _ => ((1.0 + p.survival_sum).ceil() as usize).clamp(1, p.tokens.len() + 1),
        };
        tmodel.lazy_rows(&mut rows, likely)?;
        Ok((rows, t_verify.elapsed().as_secs_f64()))
    }

    /// The target's own token after the last accepted one, from verify row `row`, at offset `at`
    /// from the round's start `base` (`at == 0`: the round's only token).
    pub(super) fn bonus(
        &mut self,
        run: &mut Run,
        tmodel: &Transformer,
        rows: &mut LazyLogits,
        (row, at, base, round): (usize, usize, usize, usize),
        verify_s: &mut f64,
    ) -> Result<()> {
        let req = self.req;
        let pos = (base - run.n_prompt + at) as u64;
        // Only this row: the trunk's rows were computed on the walk; other branches are not needed.
        if rows.row(row).is_none() {
            let t = Instant::now();
            tmodel.lazy_row(rows, row)?;
            *verify_s += t.elapsed().as_secs_f64();
        }
        let logits = rows.row(row).ok_or_else(|| EngineError::Internal(format!("verify row {row} missing")))?;
        let (pt, log_z) = beside_log_z(logits, self.n_vocab, true, || {
            probabilities(logits, &run.context, &req.sampling, self.n_vocab)
        })?;
        let x = draw(req, &mut self.noise, &pt, pos, Purpose::TargetSample);
        let info = TokenInfo {
            p_target: Some(pt[x as usize]),
            round: Some(round),
            top: top_entries(run.tok, req.n_top, Some(&pt[..]), None, None, &[x]),
            ..plain_token(x, if at == 0 { TokenSource::Target } else { TokenSource::Bonus })
        };
        run.emit(info, log_z.map(|z| nll_given_log_z(z, logits, x)))
    }

    /// Roll back: both caches keep only positions whose tokens are in the context, minus the
    /// last one, which the next round feeds. After a side offer was taken, the target keeps the
    /// chain's accepted rows and that offer's row; the draft, which never ran the offer, only
    /// the accepted chain.
    fn settle(
        &mut self,
        run: &Run,
        tmodel: &mut Transformer,
        dmodel: &mut Transformer,
        rows: &LazyLogits,
        (base, n_accepted, side): (usize, usize, Option<usize>),
        n_fed: usize,
    ) -> Result<()> {
        let keep = run.context.len() - 1;
        self.noise.forget_before(run.n_emitted() as u64);
        let side_row = side.map(|s| n_fed + s);
        if let Some(row) = side_row {
            let mut path: Vec<usize> = (0..=n_accepted).collect();
            path.push(row);
            tmodel.keep_path(&path)?;
        }
        tmodel.truncate(keep);
        self.source.settle(tmodel, dmodel, rows, (base, keep, n_accepted), side_row)
    }

    /// Record: the run's statistics, what the policy learns from the round, the round event.
    /// `times` are the round's draft, verify and whole-round (less drafting) seconds.
    /// A side offer taken (`side_taken`) counts as an accepted drafted token; the policy's
    /// acceptance estimates see the chain's alone, its verify costs every row.
    fn record(&mut self, run: &mut Run, p: &Proposal, base: usize, accepted: (usize, bool), times: (f64, f64, f64)) {
        let (n_accepted, side_taken) = accepted;
        let (draft_s, verify_s, round_s) = times;
        let k = p.tokens.len();
        let n_copied = k - p.n_model;
        // The policy weighs whole rounds: the acceptance walk's sampling and mixing cost per token
        // too, and a round at k = 0 pays them as well.
        if p.n_model == 0 && n_copied > 0 {
            self.policy.observe_lookup(p.matched, k, n_accepted, round_s);
        } else {
            let draft_token_s = crate::adaptive::draft_token_s(p.n_model, draft_s, p.caught_up, p.catch_up_s);
            self.policy.observe(k + p.side.len(), n_accepted, draft_token_s, round_s);
            // The copies were verified only if every drafted token before them was accepted.
            if n_copied > 0 && n_accepted >= p.n_model {
                self.policy.observe_copies(p.copy_matched, n_copied, n_accepted - p.n_model);
            }
        }
        let counts = RoundCounts {
            n_proposed: k,
            n_verified: k + p.side.len(),
            n_accepted,
            n_settled: n_accepted + usize::from(side_taken),
            n_copied,
            n_copied_accepted: n_accepted.saturating_sub(p.n_model),
        };
        close_round(run, base, counts, (draft_s, verify_s));
    }
}

/// What a round proposed and settled, chain or tree, for the run's statistics and its event.
pub(super) struct RoundCounts {
    /// Tokens drafted or copied on the round's main line (a tree: all its nodes).
    pub n_proposed: usize,
    /// Tokens the target verified (the chain's side offers too).
    pub n_verified: usize,
    /// Proposed tokens accepted.
    pub n_accepted: usize,
    /// Verified tokens accepted (a side offer taken counts).
    pub n_settled: usize,
    pub n_copied: usize,
    pub n_copied_accepted: usize,
}

/// Close a round that began at context length `base`: add it to the run's statistics, keep its
/// [`RoundInfo`] and send it as an event. `times` are its draft and verify seconds.
pub(super) fn close_round(run: &mut Run, base: usize, c: RoundCounts, (draft_s, verify_s): (f64, f64)) {
    let s = &mut run.stats;
    s.n_rounds += 1;
    s.n_drafted += c.n_verified;
    s.n_accepted += c.n_settled;
    s.n_copied += c.n_copied;
    s.n_copied_accepted += c.n_copied_accepted;
    s.draft_s += draft_s;
    s.verify_s += verify_s;
    let info = RoundInfo {
        index: run.rounds.len(),
        n_proposed: c.n_proposed,
        n_accepted: c.n_accepted,
        n_emitted: run.context.len() - base,
        draft_s,
        verify_s,
        n_copied: c.n_copied,
    };
    run.rounds.push(info.clone());
    (run.on_event)(GenEvent::Round(info));
}

impl Proposal {
    /// An empty proposal after `context`, room for `capacity` tokens.
    fn new(context: &[u32], matched: Match, capacity: usize) -> Self {
        Proposal {
            tokens: Vec::with_capacity(capacity),
            q: Vec::with_capacity(capacity),
            n_model: 0,
            matched,
            copy_matched: matched,
            text: context.to_vec(),
            survival_sum: 0.0,
            caught_up: 0,
            catch_up_s: 0.0,
            offers: Vec::new(),
            reach: Vec::new(),
            side: Vec::new(),
        }
    }

    fn push(&mut self, x: u32, q: Vec<f32>) {
        self.tokens.push(x);
        self.q.push(q);
        self.text.push(x);
    }
}
