//! A tree of candidate tokens in one forward: every node attends to the cached text before the
//! tree and to its own ancestors, at the position of its depth, so that each path computes what
//! the same tokens would as a chain. [`Transformer::keep_path`] then leaves the cache exactly as
//! if the accepted path had been decoded as a chain.

use super::{LazyLogits, Transformer};
use crate::cpu_step::TreeRows;
use crate::error::{EngineError, Result};
use candle_core::{Device, Tensor};

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
        let n = tokens.len();
        let lazy = if self.cpu_step && self.cpu.is_some() && !self.restrict_head {
            self.cpu_step_hidden_at(tokens, Some(&rows))?.map(|hidden| LazyLogits { hidden, rows: vec![None; n] })
        } else {
            None
        };
        let lazy = match lazy {
            Some(l) => l,
            None => {
                let on_pool = self.device.is_cpu() && !self.cpu_step && rayon::current_thread_index().is_none();
                let logits = match on_pool {
                    true => rayon::scope(|_| self.forward_impl(tokens, Some(&rows)))?,
                    false => self.forward_impl(tokens, Some(&rows))?,
                };
                let rows = logits.to_device(&Device::Cpu)?.to_vec2::<f32>()?;
                LazyLogits { hidden: Vec::new(), rows: rows.into_iter().map(Some).collect() }
            }
        };
        self.tree = Some(region);
        Ok(lazy)
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
        if let (true, Some(cpu)) = (self.cpu_step, self.cpu.as_mut()) {
            cpu.keep_rows(&self.config, &from, region.start);
        } else if !path.is_empty() {
            let at: Vec<u32> = from.iter().map(|&r| r as u32).collect();
            let at = Tensor::new(at.as_slice(), &self.device)?;
            for c in &self.tensor.cache {
                let k = c.k.index_select(&at, 2)?;
                let v = c.v.index_select(&at, 2)?;
                c.k.slice_set(&k, 2, region.start)?;
                c.v.slice_set(&v, 2, region.start)?;
            }
        }
        self.n_cached = region.start + path.len();
        Ok(())
    }

    /// Additive mask for a tree's new rows (rows ordered (head in group, query), as in
    /// `causal_mask`) over `n_keys` cache rows: each sees the rows before the tree and its path.
    pub(super) fn tree_mask(&self, t: &TreeRows, n_keys: usize) -> Result<Tensor> {
        let n_rep = self.config.n_head / self.config.n_kv_head;
        let n_new = t.tail.len();
        let mut m = vec![f32::NEG_INFINITY; n_rep * n_new * n_keys];
        for r in 0..n_rep {
            for (i, tail) in t.tail.iter().enumerate() {
                let row = &mut m[(r * n_new + i) * n_keys..(r * n_new + i + 1) * n_keys];
                row[..t.prefix].iter_mut().for_each(|v| *v = 0.0);
                for &k in tail.iter().filter(|&&k| k < n_keys) {
                    row[k] = 0.0;
                }
            }
        }
        Ok(Tensor::from_vec(m, (n_rep * n_new, n_keys), &self.device)?)
    }
}
