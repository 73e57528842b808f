//! The one walk of every round: a chain's proposal as a tree of width one, and the walk down a
//! tree from its root that emits each position's token and follows it where it is a child.

use super::{Proposal, Rounds, Tree};
use crate::adaptive::MAX_SIDE_OFFERS;
use crate::error::{EngineError, Result};
use crate::generate::{beside_log_z, plain_token, top_entries, Run, TokenInfo, TokenSource};
use crate::mentor::{lossless, mix, take_probabilities, verify_candidates, Coupling, Mixed};
use crate::model::{LazyLogits, Transformer};
use crate::sampling::{nll_given_log_z, probabilities, race_argmax, race_top, uniform, uniform_nth, Purpose};
use std::time::Instant;

impl Rounds<'_> {
    /// A chain's proposal as the tree the walk takes: the proposed tokens as a trunk of width one
    /// (node i + 1 is `tokens[i]`, as the verify rows are), each side offer a one-token branch
    /// beside the trunk token it stands in for. The proposal's distributions move into the tree.
    pub(in crate::generate::speculative) fn chain_tree(&self, run: &Run, p: &mut Proposal) -> Tree {
        let mut tree = Tree::new(run.context[run.context.len() - 1]);
        let mut reach = 1.0;
        for (i, (&x, q)) in p.tokens.iter().zip(std::mem::take(&mut p.q)).enumerate() {
            let copied = i >= p.n_model;
            reach *= match copied {
                true => self.policy.alpha_lookup(if p.n_model == 0 { p.matched } else { p.copy_matched }),
                false => self.policy.accept_estimate(q[x as usize]),
            };
            let node = tree.push(x, i, true, reach);
            (tree.copy_q[i], tree.copied[node]) = (copied, copied);
            tree.q[i] = Some(q);
        }
        for &(at, t) in &p.side {
            let reach = tree.reach[at] * tree.q[at].as_ref().map_or(0.0, |q| self.policy.side_estimate(q[t as usize]));
            tree.push(t, at, false, reach);
        }
        tree.copy_matched = p.copy_matched;
        tree
    }

    /// Walk the tree from the root: at a node the draft expanded, emit the race's winner under π
    /// and follow it if it is a child (max acceptance: check the children in their order with
    /// [`verify_candidates`] and follow the one taken); at any other node emit the target's own
    /// token (the root's always, a deeper one's as the bonus). A chain is a tree of width one, its
    /// side offers one-token branches ([`Self::chain_tree`]). Returns the path of nodes whose
    /// tokens are settled, and how many of them (a prefix) were walked with a verdict.
    pub(in crate::generate::speculative) fn walk_tree(
        &mut self,
        run: &mut Run,
        tmodel: &Transformer,
        tree: &Tree,
        rows: &mut LazyLogits,
        verify_s: &mut f64,
    ) -> Result<(Vec<usize>, usize)> {
        let req = self.req;
        let (base, round) = (run.context.len(), run.rounds.len());
        let mut path = vec![0usize];
        let mut node = 0;
        let mut n_walked = 0;
        while !run.done() {
            let d = tree.depth[node];
            let pos = (base - run.n_prompt + d) as u64;
            walk_rows(tmodel, tree, rows, node, verify_s)?;
            let logits =
                rows.row(node).ok_or_else(|| EngineError::Internal(format!("tree: verify row {node} missing")))?;
            let Some(q) = tree.q[node].as_ref().filter(|_| !tree.children[node].is_empty()) else {
                if node == 0 || req.verify.bonus {
                    self.bonus(run, tmodel, rows, (node, d, base, round), verify_s)?;
                }
                break;
            };
            let ((pt, mixed), log_z) = beside_log_z(logits, self.n_vocab, true, || {
                let pt = probabilities(logits, &run.context, &req.sampling, self.n_vocab);
                let mixed =
                    if tree.copy_q[node] { lossless(&pt, q) } else { mix(req.verify.rule, &pt, q, req.verify.budget) };
                (pt, mixed)
            })?;
            let children = &tree.children[node];
            let (y, next, accept_prob) = match req.coupling {
                Coupling::SameSeed => {
                    let y = race_argmax(&mixed.pi_mixed, self.noise.at(pos)) as u32;
                    (y, children.iter().copied().find(|&c| tree.tokens[c] == y), None)
                }
                Coupling::MaxAcceptance => {
                    let seed = req.seed;
                    let candidates: Vec<(u32, bool)> =
                        children.iter().map(|&c| (tree.tokens[c], tree.copied[c])).collect();
                    let u = |j: usize| match j {
                        0 => uniform(seed, pos, Purpose::AcceptTest),
                        j => uniform_nth(seed, pos, j as u32, Purpose::AcceptRunnerUp),
                    };
                    let v =
                        verify_candidates(&mixed.pi_mixed, q, &candidates, u, uniform(seed, pos, Purpose::Residual));
                    (v.token, v.taken.map(|j| children[j]), Some(v.accept_prob))
                }
            };
            n_walked += 1;
            if !tree.copy_q[node] {
                self.observe_node(tree, node, (q, &mixed.pi_mixed), (y, accept_prob), pos);
            }
            run.tally.verified(d, mixed.tv_pi_p);
            let source = match next {
                Some(c) if tree.copied[c] => TokenSource::CopyAccepted,
                Some(_) => TokenSource::DraftAccepted,
                None => TokenSource::Resampled,
            };
            let info = self.node_token_info(run, tree, node, (&pt, q, &mixed), (y, source, accept_prob), round);
            run.emit(info, log_z.map(|z| nll_given_log_z(z, logits, y)))?;
            let Some(c) = next else { break };
            run.tally.accepted_at[d] += 1;
            path.push(c);
            node = c;
            if run.stopped {
                break;
            }
        }
        Ok((path, n_walked))
    }

    /// What a tree round teaches the policy of its copies: at each walked node with a copied
    /// child, whether the walk took it (`next` follows the last walked node, if the walk went on).
    pub(super) fn observe_tree_copies(&mut self, tree: &Tree, walked: &[usize], next: Option<usize>) {
        for (i, &node) in walked.iter().enumerate() {
            if let Some(&c) = tree.children[node].iter().find(|&&c| tree.copied[c]) {
                let taken = walked.get(i + 1).copied().or(next) == Some(c);
                self.policy.observe_copies(tree.copy_matched, 1, usize::from(taken));
            }
        }
    }

    /// What the walk emits at `node`: the token `y` with the distributions behind it, the node's
    /// first choice and its other children (the offers).
    fn node_token_info(
        &self,
        run: &Run,
        tree: &Tree,
        node: usize,
        (pt, q, mixed): (&[f32], &[f32], &Mixed),
        (y, source, accept_prob): (u32, TokenSource, Option<f64>),
        round: usize,
    ) -> TokenInfo {
        let req = self.req;
        let first_choice = tree.tokens[tree.children[node][0]];
        let offers: Vec<u32> = tree.children[node][1..].iter().map(|&c| tree.tokens[c]).collect();
        let must: Vec<u32> = [y, first_choice].into_iter().chain(offers.iter().copied()).collect();
        TokenInfo {
            source,
            p_target: Some(pt[y as usize]),
            q_draft: Some(q[y as usize]),
            pi_mixed: Some(mixed.pi_mixed[y as usize]),
            accept_prob,
            tv: Some(mixed.tv_pq),
            theta: Some(mixed.theta),
            round: Some(round),
            drafted: Some(first_choice),
            top: top_entries(run.tok, req.n_top, Some(pt), Some(q), Some(&mixed.pi_mixed[..]), &must),
            offers,
            rule_notes: req.rule_notes(pt, q, first_choice),
            ..plain_token(y, TokenSource::Target)
        }
    }

    /// What the policy learns at a verified node, as at a chain's verified position: how likely
    /// the first candidate was to be taken, and each runner-up (verified or not, so the estimate
    /// is unselected). Same seed: whether the race's first choice, or a runner-up, was the
    /// emitted `y`. Max acceptance: the exact probabilities of [`take_probabilities`].
    fn observe_node(
        &mut self,
        tree: &Tree,
        node: usize,
        (q, pi_mixed): (&[f32], &[f32]),
        (y, accept_prob): (u32, Option<f64>),
        pos: u64,
    ) {
        if !self.learns_runners_up() {
            // A chain: its one candidate is the draft's choice, taken with the verdict's
            // probability (max acceptance) or where it is the token emitted (same seed).
            let first = tree.tokens[tree.children[node][0]];
            let taken = accept_prob.unwrap_or(f64::from(u8::from(first == y)));
            self.policy.observe_drafted(q[first as usize], taken);
            return;
        }
        let (drawn, taken): (Vec<usize>, Vec<f64>) = match &tree.drawn[node] {
            Some(drawn) => {
                let taken = take_probabilities(pi_mixed, q, drawn);
                (drawn.iter().map(|&x| x as usize).collect(), taken)
            }
            None => {
                let top = race_top(q, self.noise.at(pos), 1 + MAX_SIDE_OFFERS);
                let hits = top.iter().map(|&t| f64::from(u8::from(t == y as usize))).collect();
                (top, hits)
            }
        };
        if let (Some(&first), Some(&hit)) = (drawn.first(), taken.first()) {
            self.policy.observe_drafted(q[first], hit);
        }
        for (&t, &hit) in drawn.iter().zip(&taken).skip(1).take(MAX_SIDE_OFFERS) {
            self.policy.observe_side(q[t], hit);
        }
    }
}

/// The verify rows the walk needs at `node`, where they are not computed yet, in one batch: the
/// node and the first choices below it, as far as the walk is likely to get (1 + the sum of their
/// chances from here, as a chain's likely rows); where the walk outran the path it was expected
/// to take (the node is its parent's first choice), all the rest of that path, so that a long
/// accepted run costs one more head product, not one per estimate. The time goes to `verify_s`.
fn walk_rows(tmodel: &Transformer, tree: &Tree, rows: &mut LazyLogits, node: usize, verify_s: &mut f64) -> Result<()> {
    if rows.row(node).is_some() {
        return Ok(());
    }
    let t = Instant::now();
    let (mut expected, mut at) = (vec![node], node);
    while let Some(&c) = tree.children[at].first() {
        expected.push(c);
        at = c;
    }
    let outran = tree.parent[node].is_some_and(|p| tree.children[p].first() == Some(&node));
    if !outran {
        let from = tree.reach[node].max(1e-12);
        let likely = 1.0 + expected[1..].iter().map(|&c| tree.reach[c] / from).sum::<f64>();
        expected.truncate((likely.ceil() as usize).clamp(1, expected.len()));
    }
    tmodel.lazy_rows_of(rows, &expected)?;
    *verify_s += t.elapsed().as_secs_f64();
    Ok(())
}
