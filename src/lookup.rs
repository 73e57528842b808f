//! Drafting by copying from the context ("prompt lookup"): when the last few tokens occurred
//! before, propose the tokens that followed them then.
//!
//! Why: a draft model costs a forward per proposed token and, on this pair, is accepted ~55% of
//! the time on `code`. Text that repeats its context (code being refactored, names, a list's
//! pattern, and the loops small models fall into) is predicted better by the context itself, and
//! for free. A copied token is a draft from a point mass q = δ_x, so the mentor rule applies
//! unchanged: d = TV(p, δ_x) = 1 − p(x), x is accepted with probability π(x) (p(x) at D = 0), and
//! a rejection draws from p without x, renormalised — the output still follows π exactly. The
//! engine verifies copies at D = 0 whatever the budget (π = p): the budget is for following the
//! draft model, and spent on copies it would let a large D turn the text into loops of its context.
//!
//! How long a suffix must match, and which earlier occurrence to copy from: on the target's own
//! `code` outputs (6 seeds × 256 tokens, generated text only) the latest earlier occurrence of the
//! last 2 tokens existed at 37% of positions and its successor was the next token 67% of the time;
//! of the last 4 tokens, 22% and 86%. With 2-token matches allowed, `bench` (8 seeds) accepted 33%
//! of copied tokens on `creative` and 22% on `qa`; from 3 tokens, 64% and 55%, at the same speed.
//! So a match needs 3 tokens. Among the occurrences of the last 3, the one whose match reaches
//! furthest back is copied (the latest of those): on the same texts the copy was right 35% of the
//! time after the latest occurrence matching 3 tokens only, 78% after 4–9 and 94% after 10 or
//! more; choosing the longest match moved positions from the first class to the last (117 → 159
//! copies in the 10+ class) and the first class to 46%. The policy tracks the acceptance of each
//! class apart ([`crate::adaptive`]).

use crate::corpus::Corpus;

/// Tokens that must match before a copy is proposed.
pub const MIN_MATCH: usize = 3;
/// How far back a match is followed (longer ones fall in the last class anyway).
pub const MAX_MATCH: usize = 32;
/// Match lengths from which each class of [`match_class`] starts.
const CLASS_STARTS: [usize; 4] = [MIN_MATCH, 4, 6, 10];
/// Classes of copies whose acceptance is tracked apart: by match length, in the context and in
/// a corpus ([`Match::class`]).
pub const N_MATCH_CLASSES: usize = 2 * CLASS_STARTS.len();

/// The match behind a copy: how many tokens matched, and where (the context, or a corpus the
/// user pointed at, [`crate::corpus`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Match {
    pub len: usize,
    pub in_corpus: bool,
}

impl Match {
    pub fn context(len: usize) -> Match {
        Match { len, in_corpus: false }
    }

    pub fn corpus(len: usize) -> Match {
        Match { len, in_corpus: true }
    }

    /// Its class of acceptance: by length ([`match_class`]), a corpus's classes after the
    /// context's (a corpus is the user's text, not this one, and is right less often).
    pub fn class(&self) -> usize {
        match_class(self.len) + if self.in_corpus { CLASS_STARTS.len() } else { 0 }
    }
}

/// A length alone is a match in the context.
impl From<usize> for Match {
    fn from(len: usize) -> Match {
        Match::context(len)
    }
}

/// The copy a round may propose after `text`: from the context ([`propose_matched`]), or from
/// `corpus` where its match runs further back.
pub fn propose_from(text: &[u32], corpus: Option<&Corpus>, max_len: usize) -> Option<(Vec<u32>, Match)> {
    let own = propose_matched(text, max_len).map(|(copy, m)| (copy, Match::context(m)));
    let other = corpus.and_then(|c| c.propose_matched(text, max_len));
    match (own, other) {
        (Some(a), Some(b)) if b.1.len > a.1.len => Some(b),
        (a, b) => a.or(b),
    }
}

/// The length class of a match of `len` tokens: 0 for 3, 1 for 4–5, 2 for 6–9, 3 for 10 or more.
pub fn match_class(len: usize) -> usize {
    CLASS_STARTS.iter().rposition(|&start| len >= start).unwrap_or(0)
}

/// `max_len` tokens that followed the earlier occurrence of the context's last tokens that
/// matches furthest back (at least `MIN_MATCH` tokens; the latest among equals); empty if there is
/// none. A copy that reaches the context's end goes on with its own tokens: the pattern between
/// the match and the end repeats (`1 2 1 2` → `1 2 1 2 …`).
pub fn propose(context: &[u32], max_len: usize) -> Vec<u32> {
    propose_matched(context, max_len).map(|(tokens, _)| tokens).unwrap_or_default()
}

/// [`propose`] and the length of the match (at most 32; longer matches are accepted more often);
/// None where there is nothing to copy.
pub fn propose_matched(context: &[u32], max_len: usize) -> Option<(Vec<u32>, usize)> {
    let len = context.len();
    if max_len == 0 || len <= MIN_MATCH {
        return None;
    }
    let suffix = &context[len - MIN_MATCH..];
    // (end of the earlier occurrence, tokens matched backwards from it), latest first.
    let mut best: Option<(usize, usize)> = None;
    for end in (MIN_MATCH..len).rev() {
        if &context[end - MIN_MATCH..end] != suffix {
            continue;
        }
        let limit = MAX_MATCH.min(end);
        let matched =
            MIN_MATCH + (MIN_MATCH..limit).take_while(|&i| context[end - 1 - i] == context[len - 1 - i]).count();
        if best.is_none_or(|(_, m)| matched > m) {
            best = Some((end, matched));
        }
    }
    let (from, matched) = best?;
    let mut out: Vec<u32> = Vec::with_capacity(max_len);
    for i in 0..max_len {
        // Position from + i of the context followed by the copy itself.
        let j = from + i;
        out.push(if j < len { context[j] } else { out[j - len] });
    }
    Some((out, matched))
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
    fn copies_what_followed_the_occurrence_matching_furthest_back() {
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
        // A repeated pair is below MIN_MATCH.
        assert!(propose(&[1, 2, 3, 1, 2], 4).is_empty());
        assert!(propose(&[1, 2, 1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn match_lengths_fall_in_classes() {
        let classes: Vec<usize> = (3..=12).map(match_class).collect();
        assert_eq!(classes, [0, 1, 1, 2, 2, 2, 2, 3, 3, 3]);
        assert_eq!(match_class(MAX_MATCH), CLASS_STARTS.len() - 1);
        assert_eq!(Match::corpus(MAX_MATCH).class(), N_MATCH_CLASSES - 1);
        assert_eq!((Match::context(5).class(), Match::corpus(5).class()), (1, 5));
        // A long repetition: the match runs back MAX_MATCH tokens.
        let ctx = vec![7u32; 100];
        assert_eq!(propose_matched(&ctx, 2), Some((vec![7, 7], MAX_MATCH)));
    }

    #[test]
    fn the_longer_match_of_context_and_corpus_is_copied() {
        let ctx = [1, 2, 3, 4, 9, 8, 7, 6, 5, 1, 2, 3, 4, 9, 8, 7, 6, 5, 1, 2, 3];
        // The context matches "1 2 3" back 9 tokens; the corpus "8 7 6 5 1 2 3" (7 tokens).
        let corpus = Corpus::from_ids(&[8, 7, 6, 5, 1, 2, 3, 40, 50], 0);
        assert_eq!(propose_from(&ctx, Some(&corpus), 2), Some((vec![4, 9], Match::context(12))));
        let ctx = [0, 1, 2, 3, 11, 12, 8, 7, 6, 5, 1, 2, 3];
        assert_eq!(propose_from(&ctx, Some(&corpus), 2), Some((vec![40, 50], Match::corpus(7))));
        assert_eq!(propose_from(&ctx, None, 2), Some((vec![11, 12], Match::context(3))));
        // Only the corpus has it.
        assert_eq!(propose_from(&[8, 7, 6, 5, 1, 2, 3], Some(&corpus), 3), Some((vec![40, 50], Match::corpus(7))));
    }

    #[test]
    fn point_mass_is_a_distribution_on_one_token() {
        let q = point_mass(3, 5);
        assert_eq!(q, vec![0.0, 0.0, 0.0, 1.0, 0.0]);
        // An id outside the vocabulary gives no mass rather than a panic.
        assert!(point_mass(7, 5).iter().all(|&v| v == 0.0));
    }
}
