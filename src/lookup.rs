//! Drafting by copying from the context ("prompt lookup"): when the last few tokens occurred
//! before, propose the tokens that followed them then.
//!
//! Why: a draft model costs a forward per proposed token and, on this pair, is accepted ~55% of
//! the time on `code`. Text that repeats its context (code being refactored, names, a list's
//! pattern, and the loops small models fall into) is predicted better by the context itself, and
//! for free. A copied token is a draft from a point mass q = δ_x, so the mentor rule applies
//! unchanged: d = TV(p, δ_x) = 1 − p(x), x is accepted with probability π(x) (p(x) at D = 0), and
//! a rejection draws from p without x, renormalised — the output still follows π exactly.
//!
//! How long a suffix must match: on the target's own `code` outputs (6 seeds × 256 tokens,
//! generated text only) the latest earlier occurrence of the last 2 tokens existed at 37% of
//! positions and its successor was the next token 67% of the time; of the last 4 tokens, 22% and
//! 86%. In `generate --draft-len auto` on `code` (6 seeds) a first copied token was accepted 41%
//! of the time after a 2-token match, 55% after 3 and 86% after 4 (the draft model: ~45%). With
//! 2-token matches allowed, `bench` (8 seeds) accepted 33% of copied tokens on `creative` and 22%
//! on `qa`; from 3 tokens, 64% and 55%, at the same speed. So matches start at 3 tokens, and the
//! policy tracks the acceptance of each match length apart ([`crate::adaptive`]).

/// Longest and shortest suffix matched (the longest that occurs wins).
pub const MAX_NGRAM: usize = 4;
pub const MIN_NGRAM: usize = 3;

/// `max_len` tokens that followed the latest earlier occurrence of the context's last n tokens,
/// for the largest n in `MIN_NGRAM..=MAX_NGRAM` that has one; empty if none does. A copy that
/// reaches the context's end goes on with its own tokens: the pattern between the match and the
/// end repeats (`1 2 1 2` → `1 2 1 2 …`).
pub fn propose(context: &[u32], max_len: usize) -> Vec<u32> {
    propose_matched(context, max_len).map(|(tokens, _)| tokens).unwrap_or_default()
}

/// [`propose`] and the length n of the suffix that matched (longer matches are accepted more
/// often); None where there is nothing to copy.
pub fn propose_matched(context: &[u32], max_len: usize) -> Option<(Vec<u32>, usize)> {
    let len = context.len();
    if max_len == 0 {
        return None;
    }
    for n in (MIN_NGRAM..=MAX_NGRAM.min(len.saturating_sub(1))).rev() {
        let suffix = &context[len - n..];
        // Latest start s < len − n whose n tokens equal the suffix.
        if let Some(s) = (0..len - n).rev().find(|&s| &context[s..s + n] == suffix) {
            let from = s + n;
            let mut out: Vec<u32> = Vec::with_capacity(max_len);
            for i in 0..max_len {
                // Position from + i of the context followed by the copy itself.
                let j = from + i;
                out.push(if j < len { context[j] } else { out[j - len] });
            }
            return Some((out, n));
        }
    }
    None
}

/// The draft distribution of a copied token: a point mass on `x` over `n_vocab` tokens.
pub fn point_mass(x: u32, n_vocab: usize) -> Vec<f32> {
    let mut q = vec![0.0; n_vocab];
    if let Some(v) = q.get_mut(x as usize) {
        *v = 1.0;
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_what_followed_the_latest_match_of_the_longest_suffix() {
        // "a b c d x … a b c" → the last 3 tokens occurred at 0 and were followed by "d x".
        let ctx = [1, 2, 3, 4, 9, 7, 1, 2, 3];
        assert_eq!(propose(&ctx, 2), vec![4, 9]);
        assert_eq!(propose(&ctx, 8), vec![4, 9, 7, 1, 2, 3, 4, 9]);
        assert_eq!(propose_matched(&ctx, 2), Some((vec![4, 9], 3)));
        // Two occurrences of the suffix: the latest wins.
        let ctx = [4, 5, 6, 1, 4, 5, 6, 2, 4, 5, 6];
        assert_eq!(propose(&ctx, 3), vec![2, 4, 5]);
        // The 4-token suffix beats a later 3-token one: "8 5 6 7" occurred once, "5 6 7" later.
        let ctx = [8, 5, 6, 7, 1, 5, 6, 7, 2, 8, 5, 6, 7];
        assert_eq!(propose_matched(&ctx, 1), Some((vec![1], 4)));
    }

    #[test]
    fn a_repeating_pattern_continues_into_itself() {
        // Period 2: the latest match of "1 2 1 2" starts two tokens back; the copy repeats it.
        let ctx = [0, 1, 2, 1, 2, 1, 2];
        assert_eq!(propose(&ctx, 5), vec![1, 2, 1, 2, 1]);
        // The same token over and over.
        assert_eq!(propose(&[3, 3, 3, 3, 3], 6), vec![3; 6]);
    }

    #[test]
    fn nothing_to_copy() {
        assert!(propose(&[], 4).is_empty());
        assert!(propose(&[1], 4).is_empty());
        assert!(propose(&[1, 2], 4).is_empty());
        // A repeated pair is below MIN_NGRAM.
        assert!(propose(&[1, 2, 3, 1, 2], 4).is_empty());
        assert!(propose(&[1, 2, 1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn point_mass_is_a_distribution_on_one_token() {
        let q = point_mass(3, 5);
        assert_eq!(q, vec![0.0, 0.0, 0.0, 1.0, 0.0]);
        // An id outside the vocabulary gives no mass rather than a panic.
        assert!(point_mass(7, 5).iter().all(|&v| v == 0.0));
    }
}
