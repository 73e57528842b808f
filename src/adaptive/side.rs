//! Side offers: beside a round's drafted chain, the draft's runners-up at each drafted position,
//! verified as one-token branches of a tree (same-seed coupling). Where the target's token at a
//! position is not the chain's but a side offer, the round settles it and the target's bonus
//! token after it, instead of ending there.

use super::{AdaptivePolicy, MAX_DRAFT_LEN};

/// Runners-up considered per drafted position.
pub const MAX_SIDE_OFFERS: usize = 3;

impl AdaptivePolicy {
    /// Estimated probability that the target's token is a side offer the draft gave probability
    /// `q_x`.
    pub fn side_estimate(&self, q_x: f32) -> f64 {
        self.accept.side(q_x)
    }

    /// Record whether the target's token at a verified position was a side offer of draft
    /// probability `q_x` (every runner-up seen, verified or not, so the estimate is unselected):
    /// `hit` is 1 or 0, or the exact probability where the rule knows it.
    pub fn observe_side(&mut self, q_x: f32, hit: f64) {
        self.accept.observe_side(q_x, hit);
    }

    /// Whether a candidate node of a tree round that holds `n` nodes besides its root, which the
    /// walk reaches and takes with estimated probability `reach`, is worth one more verify row:
    /// `reach` at least the best rate expected times that row's cost (the test for side offers).
    /// False until the costs are measured, and past `MAX_DRAFT_LEN` nodes.
    pub fn node_pays(&self, reach: f64, n: usize) -> bool {
        let Some(best) = self.best_rate() else { return false };
        n < MAX_DRAFT_LEN && self.costs.row(n).is_some_and(|row| reach >= best * row)
    }

    /// Which side offers to verify beside a chain of `k` proposed tokens. `offers[i]` is the
    /// probability that the walk reaches the offer's position and the offer's draft probability.
    /// An offer costs one verify row; when the target's token is that offer it settles one more
    /// token (the bonus after it). Offers are taken in order of that expected gain while it is at
    /// least the best rate expected times the next row's cost, as the depth rule weighs a drafted
    /// token. Returns the indices taken; none until the costs are measured.
    pub fn side_offers(&self, k: usize, offers: &[(f64, f32)]) -> Vec<usize> {
        let Some(best) = self.best_rate() else { return Vec::new() };
        let mut order: Vec<(f64, usize)> =
            offers.iter().enumerate().map(|(i, &(reach, q))| (reach * self.side_estimate(q), i)).collect();
        order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut taken = Vec::new();
        for (gain, i) in order {
            let rows = k + taken.len();
            if rows >= MAX_DRAFT_LEN {
                break;
            }
            match self.costs.row(rows) {
                Some(row) if gain >= best * row => taken.push(i),
                _ => break,
            }
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::acceptance::SIDE_PRIOR;
    use crate::adaptive::FixedCosts;

    fn policy(step_s: f64, row_s: f64) -> AdaptivePolicy {
        let c = FixedCosts { draft_token_s: 0.1 * step_s, verify_base_s: step_s - row_s, verify_row_s: row_s };
        AdaptivePolicy::with_costs(Some(c))
    }

    #[test]
    fn offers_are_taken_by_expected_gain_while_a_row_is_worth_it() {
        // Expected gains (reach × prior of the offer's class): 0.2, 0.1, 0.045, 0.04.
        let offers = [(1.0, 0.3), (0.5, 0.3), (0.9, 0.01), (0.2, 0.3)];
        // Nearly free rows: every offer pays, the most likely first.
        let cheap = policy(0.01, 0.00002);
        assert_eq!(cheap.side_offers(4, &offers), vec![0, 1, 2, 3]);
        // A row at a tenth of a step: only the likeliest offer; at 0.4 of a step, none.
        assert_eq!(policy(0.01, 0.001).side_offers(4, &offers), vec![0]);
        assert!(policy(0.01, 0.004).side_offers(4, &offers).is_empty());
        // Never more rows than a round verifies.
        let many = vec![(1.0, 0.5f32); 40];
        assert_eq!(cheap.side_offers(4, &many).len(), MAX_DRAFT_LEN - 4);
        // Before costs are known, none.
        assert!(AdaptivePolicy::default().side_offers(4, &offers).is_empty());
    }

    #[test]
    fn the_estimate_follows_what_is_seen_per_class() {
        let mut p = AdaptivePolicy::default();
        for _ in 0..200 {
            p.observe_side(0.3, 1.0);
        }
        assert!(p.side_estimate(0.3) > 0.95);
        assert_eq!(p.side_estimate(0.01), SIDE_PRIOR[0], "other classes keep their prior");
        for _ in 0..200 {
            p.observe_side(0.3, 0.0);
        }
        assert!(p.side_estimate(0.3) < 0.05);
    }
}
