//! A tree of candidate tokens in one forward: every node attends to the cached text before the
//! tree and to its own ancestors, at the position of its depth, so that each path computes what
//! the same tokens would as a chain. [`Transformer::keep_path`] then leaves the cache exactly as
//! if the accepted path had been decoded as a chain.

use super::{LazyLogits, Transformer};
use crate::cpu_step::TreeRows;
use crate::error::{EngineError, Result};

/// The cache rows from `start` on hold the nodes of a tree, in the order they were fed.
#[derive(Debug, Clone, Default)]
pub(super) struct TreeRegion {
    start: usize,
    /// Per node: its parent node, or None for a node that follows the text before the tree.
    parent: Vec<Option<usize>>,
    depth: Vec<usize>,
}

impl TreeRegion {
    /// The nodes from the root down to `node`, as node indices.
    fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path = vec![node];
        let mut at = node;
        while let Some(p) = self.parent[at] {
            path.push(p);
            at = p;
        }
        path.reverse();
        path
    }
}

impl Transformer {
    /// Feed the nodes of a tree (or more nodes of the tree fed last): `tokens[i]` follows node
    /// `parents[i]` (an index among this tree's nodes, earlier ones first, those of this call
    /// counted on from the earlier ones) or, for None, the text cached before the tree. The first
    /// call starts the tree at the current end of the cache. Returns one row of logits per node,
    /// computed when asked for ([`Self::lazy_rows`]).
    pub fn forward_tree(&mut self, tokens: &[u32], parents: &[Option<usize>]) -> Result<LazyLogits> {
        self.check_new_tokens(tokens)?;
        let (region, rows) = self.grow_tree(tokens.len(), parents)?;
        let hidden = self.pooled(|m| m.hidden_of(tokens, Some(&rows)))?;
        self.tree = Some(region);
        Ok(LazyLogits { hidden, rows: vec![None; tokens.len()] })
    }

    /// The tree region after adding `n` nodes that follow `parents` (see [`Self::forward_tree`]),
    /// and the rows the new nodes attend to. The region is stored once their forward is done.
    pub(super) fn grow_tree(&mut self, n: usize, parents: &[Option<usize>]) -> Result<(TreeRegion, TreeRows)> {
        if n != parents.len() {
            return Err(EngineError::Internal(format!("tree: {n} tokens but {} parents", parents.len())));
        }
        let mut region = match self.tree.take() {
            Some(t) if t.start + t.parent.len() == self.n_cached => t,
            _ => TreeRegion { start: self.n_cached, ..TreeRegion::default() },
        };
        let first = region.parent.len();
        for (i, &p) in parents.iter().enumerate() {
            let depth = match p {
                None => 0,
                Some(p) if p < first + i => region.depth[p] + 1,
                Some(p) => {
                    return Err(EngineError::Internal(format!(
                        "tree: node {} follows node {p}, not fed before it",
                        first + i
                    )))
                }
            };
            region.parent.push(p);
            region.depth.push(depth);
        }
        let rows = TreeRows {
            prefix: region.start,
            pos: (first..region.parent.len()).map(|i| region.start + region.depth[i]).collect(),
            tail: (first..region.parent.len())
                .map(|i| region.path_to(i).into_iter().map(|n| region.start + n).collect())
                .collect(),
        };
        Ok((region, rows))
    }

    /// Keep the tree's nodes `path` (a root's child of the text before the tree, then each
    /// node's child in turn) as a chain right after that text, and drop every other node: the
    /// cache then holds what a chain forward of the path's tokens would have left.
    pub fn keep_path(&mut self, path: &[usize]) -> Result<()> {
        let Some(region) = self.tree.take() else {
            return Err(EngineError::Internal("keep_path: no tree in the cache".into()));
        };
        for (j, &node) in path.iter().enumerate() {
            let parent =
                region.parent.get(node).ok_or_else(|| EngineError::Internal(format!("tree: no node {node}")))?;
            if *parent != j.checked_sub(1).map(|i| path[i]) {
                return Err(EngineError::Internal(format!("tree: {path:?} is not a path from the root")));
            }
        }
        let from: Vec<usize> = path.iter().map(|&n| region.start + n).collect();
        self.backends.active().keep_rows(&self.config, &from, region.start)?;
        self.n_cached = region.start + path.len();
        Ok(())
    }
}
