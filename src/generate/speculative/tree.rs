//! A round over a tree of candidates: the draft proposes, depth by depth, the best tokens of its
//! same-seed race at the most likely nodes; the target runs every node in one forward (each node
//! attending to the text and its own ancestors); the walk from the root emits, at each node, the
//! race's winner under π with the position's noise, and follows it where it is one of the node's
//! children. At D = 0 the text emitted is the target's alone; at any D it is the chain's with
//! the independent draft (the feature draft's q depends on where rounds begin): the tree only
//! decides how much of it one round settles. With an adaptive draft length the policy shapes each
//! tree, and a copy from the context can hang in it as a branch of its own.

use super::{close_round, Proposal, RoundCounts, Rounds};
use crate::adaptive::{draft_token_s, MAX_DRAFT_LEN, MAX_SIDE_OFFERS};
use crate::error::{EngineError, Result};
use crate::generate::MAX_TREE_WIDTH;
use crate::generate::{beside_log_z, plain_token, top_entries, Run, TokenInfo, TokenSource, TreeShape};
use crate::lookup::{point_mass, propose_from, Match};
use crate::mentor::{lossless, mix, take_probabilities, verify_candidates, Coupling, Mixed};
use crate::model::{LazyLogits, Transformer};
use crate::sampling::{
    draft_uniform, nll_given_log_z, probabilities, race_argmax, race_top, sample_without_replacement, uniform,
    uniform_nth, Purpose,
};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The nodes of a round's tree, in the order the target runs them. Node 0 is the root: the last
/// token of the context, which the target has not run yet.
pub(super) struct Tree {
    tokens: Vec<u32>,
    parent: Vec<Option<usize>>,
    depth: Vec<usize>,
    children: Vec<Vec<usize>>,
    /// The draft's distribution after the node, for the nodes it ran (the parents).
    q: Vec<Option<Vec<f32>>>,
    /// Under the max-acceptance coupling, the node's candidates as drawn from its q without
    /// replacement (its draft children are a prefix), for the nodes the draft ran.
    drawn: Vec<Option<Vec<u32>>>,
    /// The node's index among the draft's tree nodes, for the nodes it ran (the root is not one:
    /// the draft had the context already).
    draft_node: Vec<Option<usize>>,
    /// A feature draft's predicted feature after the node, for the nodes it ran and the root.
    feat: Vec<Option<Vec<f32>>>,
    /// Whether the node is on the chain the draft alone would propose (each race's winner after
    /// the last).
    on_chain: Vec<bool>,
    /// The estimated chance that the walk reaches the node (adaptive trees).
    reach: Vec<f64>,
    /// Whether the node's q is a copy's next token (a point mass: verified with π = p, as a
    /// chain verifies copied tokens) rather than the draft's.
    copy_q: Vec<bool>,
    /// Copied nodes, and the context match behind the copy.
    copied: Vec<bool>,
    copy_matched: Match,
    /// Draft forwards run (the catch-up included), tokens the catch-up fed and its time.
    n_forwards: usize,
    caught_up: usize,
    catch_up_s: f64,
}

impl Tree {
    fn new(root: u32) -> Tree {
        Tree {
            tokens: vec![root],
            parent: vec![None],
            depth: vec![0],
            children: vec![Vec::new()],
            q: vec![None],
            drawn: vec![None],
            draft_node: vec![None],
            feat: vec![None],
            on_chain: vec![true],
            reach: vec![1.0],
            copy_q: vec![false],
            copied: vec![false],
            copy_matched: Match::default(),
            n_forwards: 0,
            caught_up: 0,
            catch_up_s: 0.0,
        }
    }

    fn push(&mut self, token: u32, parent: usize, on_chain: bool, reach: f64) -> usize {
        let n = self.tokens.len();
        self.tokens.push(token);
        self.parent.push(Some(parent));
        self.depth.push(self.depth[parent] + 1);
        self.children.push(Vec::new());
        self.children[parent].push(n);
        self.q.push(None);
        self.drawn.push(None);
        self.draft_node.push(None);
        self.feat.push(None);
        self.on_chain.push(on_chain);
        self.reach.push(reach);
        self.copy_q.push(false);
        self.copied.push(false);
        n
    }

    /// The tokens from the root's child down to `node`.
    fn path_tokens(&self, node: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = node;
        while let Some(p) = self.parent[at] {
            out.push(self.tokens[at]);
            at = p;
        }
        out.reverse();
        out
    }
}

/// A candidate node of the next depth.
struct Candidate {
    /// On the chain the draft alone would propose.
    on_chain: bool,
    /// Its place among its parent's candidates (0: the race's first choice, or the first draw).
    rank: usize,
    /// The draft's probability of its path.
    score: f64,
    /// The estimated chance that the walk reaches it.
    reach: f64,
    parent: usize,
    token: u32,
}

impl Rounds<'_> {
    /// One round with a tree of candidates of `shape`: propose, verify, walk, settle, record.
    pub(super) fn tree_round(
        &mut self,
        run: &mut Run,
        tmodel: &mut Transformer,
        dmodel: &mut Transformer,
        shape: TreeShape,
    ) -> Result<()> {
        let t_round = Instant::now();
        let base = run.context.len();
        let tree = self.propose_tree(run, dmodel, shape)?;
        let draft_s = t_round.elapsed().as_secs_f64();
        if run.cancel.load(Ordering::Relaxed) {
            return Ok(());
        }
        let t_verify = Instant::now();
        let mut rows = tmodel.forward_tree(&tree.tokens, &tree.parent)?;
        let mut verify_s = t_verify.elapsed().as_secs_f64();
        let (path, n_walked) = self.walk_tree(run, tmodel, &tree, &mut rows, &mut verify_s)?;
        self.observe_tree_copies(&tree, &path[..n_walked], path.get(n_walked).copied());
        let keep = run.context.len() - 1;
        self.noise.forget_before(run.n_emitted() as u64);
        tmodel.keep_path(&path)?;
        tmodel.truncate(keep);
        let fed: Vec<usize> = path[1..].iter().map_while(|&n| tree.draft_node[n]).collect();
        self.source.settle_tree(tmodel, dmodel, &rows, (base, keep), (&path, &fed))?;
        let n_proposed = tree.tokens.len() - 1;
        let n_accepted = path.len() - 1;
        if self.auto {
            // The policy's acceptance is the chain's: the path's leading run of first choices.
            let n_chain = path[1..].iter().take_while(|&&n| tree.on_chain[n]).count();
            let per_forward = draft_token_s(tree.n_forwards, draft_s, tree.caught_up, tree.catch_up_s);
            let round_s = t_round.elapsed().as_secs_f64() - draft_s;
            match tree.n_forwards {
                0 if n_proposed > 0 => self.policy.observe_verify(n_proposed, round_s),
                _ => self.policy.observe(n_proposed, n_chain, per_forward, round_s),
            }
        }
        let n_copied = tree.copied.iter().filter(|&&c| c).count();
        let counts = RoundCounts {
            n_proposed,
            n_verified: n_proposed,
            n_accepted,
            n_settled: n_accepted,
            n_copied,
            n_copied_accepted: path.iter().filter(|&&n| tree.copied[n]).count(),
        };
        close_round(run, base, counts, (draft_s, verify_s));
        Ok(())
    }

    /// A chain's proposal as the tree the walk takes: the proposed tokens as a trunk of width one
    /// (node i + 1 is `tokens[i]`, as the verify rows are), each side offer a one-token branch
    /// beside the trunk token it stands in for. The proposal's distributions move into the tree.
    pub(super) fn chain_tree(&self, run: &Run, p: &mut Proposal) -> Tree {
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

    /// Propose: depth by depth, the `width` most likely of the candidates (each expanded node's
    /// `width` best tokens of the race at its position, scored by the draft's probability of the
    /// path), one draft forward per depth over its new nodes. Never deeper than the tokens left.
    ///
    /// With an adaptive draft length the policy shapes the tree instead: each node's estimated
    /// chance that the walk reaches it (the product of its path's acceptance estimates: by draft
    /// probability for a race's first choice, as a side offer's for the others) decides, with the
    /// measured costs, which candidates get a verify row (every expanded node's first choice, as a
    /// chain drafts it; the others while they pay as side offers do) and which nodes the draft
    /// expands (as the depth rule decides whether a chain drafts on). Where no branch pays, the
    /// tree is the adaptive chain; where drafting does not pay, it is the root alone (a step).
    fn propose_tree(&mut self, run: &Run, dmodel: &mut Transformer, shape: TreeShape) -> Result<Tree> {
        let base = run.context.len();
        let mut tree = Tree::new(run.context[base - 1]);
        let depth = shape.depth.min(run.remaining());
        if depth > 0 && self.source.can_draft(base) && (!self.auto || self.policy.next_len(MAX_DRAFT_LEN) > 0) {
            self.draft_tree(run, dmodel, shape.width, depth, &mut tree)?;
        }
        if self.req.drafting.lookup() != super::Lookup::Off {
            self.add_copy(run, &mut tree);
        }
        Ok(tree)
    }

    /// The draft's part of [`Self::propose_tree`]: `depth` deep, candidates `width` per node.
    fn draft_tree(
        &mut self,
        run: &Run,
        dmodel: &mut Transformer,
        width: usize,
        depth: usize,
        tree: &mut Tree,
    ) -> Result<()> {
        let req = self.req;
        let base = run.context.len();
        let thresholds = match self.auto {
            true => self.policy.depth_thresholds(),
            false => [0.0; MAX_DRAFT_LEN + 1],
        };
        let is_stop = |x: &u32| !req.ignore_eos && run.tok.stop_ids.contains(x);
        let t_catch_up = Instant::now();
        let (logits, caught_up) = self.source.catch_up(dmodel, &run.context)?;
        (tree.caught_up, tree.catch_up_s, tree.n_forwards) = (caught_up, t_catch_up.elapsed().as_secs_f64(), 1);
        tree.q[0] = Some(probabilities(&logits, &run.context, &req.sampling, self.n_vocab));
        tree.feat[0] = self.source.predicted().map(<[f32]>::to_vec);
        // Per node: the draft's probability of its path. The chain the draft alone would propose
        // always stays in the tree, so a tree settles at least what the chain would.
        let mut score = vec![1.0f64];
        let mut frontier = vec![0usize];
        for d in 0..depth {
            let at = (base - run.n_prompt + d) as u64;
            let attempt = self.next_attempt(at);
            let mut candidates = self.depth_candidates(tree, &frontier, &score, (at, attempt), width);
            let kept = match self.auto {
                true => self.kept_by_policy(candidates, tree.tokens.len() - 1),
                false => {
                    candidates.sort_by(|a, b| b.on_chain.cmp(&a.on_chain).then(b.score.total_cmp(&a.score)));
                    candidates.truncate(width);
                    candidates
                }
            };
            let kept = match self.req.coupling {
                Coupling::SameSeed => kept,
                Coupling::MaxAcceptance => first_draws(kept),
            };
            if kept.is_empty() {
                break;
            }
            frontier.clear();
            for c in &kept {
                let n = tree.push(c.token, c.parent, c.on_chain, c.reach);
                score.push(c.score);
                frontier.push(n);
            }
            let last = d + 1 == depth || run.cancel.load(Ordering::Relaxed);
            let n_nodes = (tree.tokens.len() - 1).min(MAX_DRAFT_LEN);
            let expand: Vec<usize> = frontier
                .iter()
                .copied()
                .filter(|n| !is_stop(&tree.tokens[*n]) && tree.reach[*n] >= thresholds[n_nodes])
                .collect();
            if last || expand.is_empty() {
                break;
            }
            self.expand_nodes(run, dmodel, tree, &expand)?;
            frontier = expand;
        }
        Ok(())
    }

    /// The candidates of the next depth: each frontier node's `width` best tokens of its race
    /// (max acceptance: its first draws), scored by the draft's probability of the path and the
    /// estimated chance that the walk reaches them.
    fn depth_candidates(
        &mut self,
        tree: &mut Tree,
        frontier: &[usize],
        score: &[f64],
        (at, attempt): (u64, u32),
        width: usize,
    ) -> Vec<Candidate> {
        let max_acceptance = self.req.coupling == Coupling::MaxAcceptance;
        let mut candidates: Vec<Candidate> = Vec::new();
        for &node in frontier {
            let Some(q) = &tree.q[node] else { continue };
            let drawn = self.node_candidates(q, at, attempt, width);
            let (mut score_above, mut reach_above) = (f64::INFINITY, f64::INFINITY);
            for (rank, &x) in drawn.iter().take(width).enumerate() {
                let estimate = match rank {
                    0 => self.policy.accept_estimate(q[x]),
                    _ => self.policy.side_estimate(q[x]),
                };
                let (mut score, mut reach) = (score[node] * q[x] as f64, tree.reach[node] * estimate);
                if max_acceptance {
                    // Draws are checked in their order, so a node's kept ones must be its first
                    // few: none ranks above the one drawn before it.
                    (score, reach) = (score.min(score_above), reach.min(reach_above));
                    (score_above, reach_above) = (score, reach);
                }
                let on_chain = tree.on_chain[node] && rank == 0;
                candidates.push(Candidate { on_chain, rank, score, reach, parent: node, token: x as u32 });
            }
            if max_acceptance {
                tree.drawn[node] = Some(drawn.iter().map(|&x| x as u32).collect());
            }
        }
        candidates
    }

    /// One draft forward over the nodes `expand` (their parents are draft tree nodes already):
    /// each gets its draft node index, its q and, for a feature draft, its predicted feature.
    fn expand_nodes(&mut self, run: &Run, dmodel: &mut Transformer, tree: &mut Tree, expand: &[usize]) -> Result<()> {
        let n_before = tree.draft_node.iter().flatten().count();
        let parents: Vec<Option<usize>> =
            expand.iter().map(|&n| tree.parent[n].and_then(|p| tree.draft_node[p])).collect();
        let tokens: Vec<u32> = expand.iter().map(|&n| tree.tokens[n]).collect();
        // A feature draft's node reads its parent's predicted feature (the root's: the one its
        // catch-up predicted).
        let feats: Vec<&[f32]> =
            expand.iter().map(|&n| tree.parent[n].and_then(|p| tree.feat[p].as_deref()).unwrap_or(&[])).collect();
        let rows = self.source.tree_step(dmodel, &tokens, &parents, &feats)?;
        tree.n_forwards += 1;
        for (i, (&n, (row, feat))) in expand.iter().zip(rows).enumerate() {
            tree.draft_node[n] = Some(n_before + i);
            let mut text = run.context.clone();
            text.extend(tree.path_tokens(n));
            tree.q[n] = Some(probabilities(&row, &text, &self.req.sampling, self.n_vocab));
            tree.feat[n] = feat;
        }
        Ok(())
    }

    /// The draft attempt at output position `at` this depth's candidates are drawn with (one per
    /// depth and round, as a chain counts its drafted positions; see `draft_uniform`).
    fn next_attempt(&mut self, at: u64) -> u32 {
        let at = at as usize;
        if self.draft_attempts.len() <= at {
            self.draft_attempts.resize(at + 1, 0);
        }
        self.draft_attempts[at] += 1;
        self.draft_attempts[at] - 1
    }

    /// A node's candidates at output position `at`, in the order they are checked. Same seed: the
    /// race's best `width`. Max acceptance: a draw from q without replacement, the first as a chain
    /// drafts it; an adaptive tree draws as many as the policy learns runners-up from.
    fn node_candidates(&mut self, q: &[f32], at: u64, attempt: u32, width: usize) -> Vec<usize> {
        let seed = self.req.seed;
        match self.req.coupling {
            Coupling::SameSeed => race_top(q, self.noise.at(at), width),
            Coupling::MaxAcceptance => {
                let k = if self.auto { width.max(1 + MAX_SIDE_OFFERS) } else { width };
                let stride = (MAX_TREE_WIDTH + MAX_SIDE_OFFERS) as u32;
                let u = |j: usize| match j {
                    0 => draft_uniform(seed, at, attempt),
                    j => uniform_nth(seed, at, attempt * stride + j as u32, Purpose::DraftRunnerUp),
                };
                sample_without_replacement(q, u, k)
            }
        }
    }

    /// A copy from the context ([`crate::lookup`]) as a branch of an adaptive tree: from the
    /// root it follows the nodes that hold its tokens already, then hangs the rest below as a
    /// chain, each copied token while the policy says its row pays (its chance: the node's above
    /// times the acceptance of copies after a match this long). A node whose next token comes
    /// from the copy alone verifies it with π = p, as a chain verifies copied tokens.
    fn add_copy(&self, run: &Run, tree: &mut Tree) {
        let Some((copy, matched)) = propose_from(&run.context, self.corpus, MAX_DRAFT_LEN.min(run.remaining())) else {
            return;
        };
        let a = self.policy.alpha_lookup(matched);
        let is_stop = |x: &u32| !self.req.ignore_eos && run.tok.stop_ids.contains(x);
        let mut node = 0;
        for x in copy {
            if let Some(c) = tree.children[node].iter().copied().find(|&c| tree.tokens[c] == x) {
                node = c;
                continue;
            }
            let reach = tree.reach[node] * a;
            if !self.policy.node_pays(reach, tree.tokens.len() - 1) {
                break;
            }
            if tree.q[node].is_none() {
                tree.q[node] = Some(point_mass(x, self.n_vocab));
                tree.copy_q[node] = true;
            }
            node = tree.push(x, node, false, reach);
            tree.copied[node] = true;
            tree.copy_matched = matched;
            if is_stop(&x) {
                break;
            }
        }
    }

    /// The candidates of one depth an adaptive tree verifies, with `n_nodes` nodes in the tree
    /// already: every first choice (its parent's expansion paid for its row), then the others,
    /// most likely first, while the policy says a row pays for them.
    fn kept_by_policy(&self, mut candidates: Vec<Candidate>, n_nodes: usize) -> Vec<Candidate> {
        candidates.sort_by(|a, b| (a.rank > 0).cmp(&(b.rank > 0)).then(b.reach.total_cmp(&a.reach)));
        let mut kept: Vec<Candidate> = Vec::with_capacity(candidates.len());
        for c in candidates {
            let n = n_nodes + kept.len();
            if n >= MAX_DRAFT_LEN || !(c.rank == 0 || self.policy.node_pays(c.reach, n)) {
                break;
            }
            kept.push(c);
        }
        kept
    }

    /// Walk the tree from the root: at a node the draft expanded, emit the race's winner under π
    /// and follow it if it is a child (max acceptance: check the children in their order with
    /// [`verify_candidates`] and follow the one taken); at any other node emit the target's own
    /// token (the root's always, a deeper one's as the bonus). A chain is a tree of width one, its
    /// side offers one-token branches ([`Self::chain_tree`]). Returns the path of nodes whose
    /// tokens are settled, and how many of them (a prefix) were walked with a verdict.
    pub(super) fn walk_tree(
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
    fn observe_tree_copies(&mut self, tree: &Tree, walked: &[usize], next: Option<usize>) {
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

/// Each parent's candidates cut to its first draws (ranks 0, 1, … without a gap), in their order.
fn first_draws(kept: Vec<Candidate>) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::with_capacity(kept.len());
    for c in kept {
        if c.rank == 0 || out.iter().any(|k| k.parent == c.parent && k.rank + 1 == c.rank) {
            out.push(c);
        }
    }
    out
}
