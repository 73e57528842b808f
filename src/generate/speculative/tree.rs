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
use crate::error::Result;
use crate::generate::MAX_TREE_WIDTH;
use crate::generate::{Run, TreeShape};
use crate::lookup::{point_mass, propose_from, Match};
use crate::mentor::Coupling;
use crate::model::Transformer;
use crate::sampling::{draft_uniform, probabilities, race_top, sample_without_replacement, uniform_nth, Purpose};
use std::sync::atomic::Ordering;
use std::time::Instant;

mod walk;

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
