//! The mentor rules: given the target's distribution p and the draft's q at one position, and a
//! budget D, the output distribution π the decoder is allowed to follow instead of p, and the
//! accept / residual step that makes the emitted token follow π exactly.
//!
//! * `tv` (the reference): d = TV(p, q), θ = min(1, D/d) (θ = 1 when d = 0), π = (1−θ)p + θq, so
//!   TV(π, p) = min(d, D). D = 0 is lossless speculative decoding, D = 1 accepts every draft.
//! * `kl` (Tran-Thien, 2023): π maximises the acceptance probability Σ min(π, q) subject to
//!   KL(p ‖ π) ≤ D.
//! * `cascade`, `fuzzy`, `typical`, `lenience`: the lossy rules of the literature, each written as
//!   the π it implies (src/mentor/lossy.rs); the budget is their one parameter ([`MentorRule::param`]).
//!
//! Accepting x ~ q with probability min(1, π(x)/q(x)) and otherwise drawing from normalised
//! max(π − q, 0) yields exactly π (the speculative-sampling argument with π as the target).

use serde::{Deserialize, Serialize};

mod lossy;
mod rule;

pub use lossy::{
    cascade_follows_draft, entropy, js_divergence, mix_cascade, mix_fuzzy, mix_lenience, mix_typical, typical_threshold,
};
pub use rule::{MentorRule, RuleParam};

/// How a run's random draws are tied together, named by what each gives the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Coupling {
    /// Every mode draws a position's token as argmax(log dist + g) with one Gumbel noise g per
    /// (seed, position, token) ([`crate::sampling::race_weights`]): a drafted token is accepted
    /// iff the race over π picks it. The text depends only on the seed and the distributions, so
    /// at D = 0 it equals target-only token for token; acceptance is at least (1 − d)/(1 + d).
    #[default]
    SameSeed,
    /// The classic rule: accept x ~ q with probability min(1, π(x)/q(x)), else draw from the
    /// residual. Acceptance 1 − TV(π, q), the most possible, but the text is a different sample
    /// from target-only's with the same seed.
    MaxAcceptance,
}

impl Coupling {
    /// The name used by the CLI, bench labels, JSON and the app.
    pub fn name(self) -> &'static str {
        match self {
            Coupling::SameSeed => "same-seed",
            Coupling::MaxAcceptance => "max-acceptance",
        }
    }
}

impl std::fmt::Display for Coupling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Coupling {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "same-seed" | "sameseed" | "same" => Ok(Self::SameSeed),
            "max-acceptance" | "maxaccept" | "max-accept" | "max" => Ok(Self::MaxAcceptance),
            _ => Err(format!("unknown coupling `{s}`: use same-seed or max-acceptance")),
        }
    }
}

/// π at one position and the numbers the UI explains it with.
#[derive(Debug, Clone)]
pub struct Mixed {
    pub pi_mixed: Vec<f32>,
    /// d = TV(p, q).
    pub tv_pq: f64,
    /// How far π moved from p towards q: θ of the TV rule; TV(π, p) / d for the others (1 when
    /// d = 0).
    pub theta: f64,
    /// Realised TV(π, p): what the budget actually bought at this position.
    pub tv_pi_p: f64,
}

pub fn tv_distance(p: &[f32], q: &[f32]) -> f64 {
    // |p − q| rounded to f32 (relative error ≤ 6e-8), summed in f64 lanes (vectorized).
    let mut block = [0f32; 512];
    let mut total = 0f64;
    for (pc, qc) in p.chunks(block.len()).zip(q.chunks(block.len())) {
        for ((d, &a), &b) in block.iter_mut().zip(pc).zip(qc) {
            *d = (a - b).abs();
        }
        total += crate::vecmath::sum_f64(&block[..pc.len().min(qc.len())]);
    }
    0.5 * total
}

/// KL(p ‖ r) in nats; infinite if r is zero where p is not.
pub fn kl_divergence(p: &[f32], r: &[f32]) -> f64 {
    let mut kl = 0.0;
    for (&a, &b) in p.iter().zip(r) {
        if a > 0.0 {
            if b <= 0.0 {
                return f64::INFINITY;
            }
            kl += a as f64 * (a as f64 / b as f64).ln();
        }
    }
    kl
}

/// π at one position under `rule`, whose parameter is `budget` ([`MentorRule::param`]).
pub fn mix(rule: MentorRule, p: &[f32], q: &[f32], budget: f64) -> Mixed {
    match rule {
        MentorRule::Tv => mix_tv(p, q, budget),
        MentorRule::Kl => mix_kl(p, q, budget),
        MentorRule::Cascade => mix_cascade(p, q, budget),
        MentorRule::Fuzzy => mix_fuzzy(p, q, budget),
        MentorRule::Typical => mix_typical(p, q, budget),
        MentorRule::Lenience => mix_lenience(p, q, budget),
    }
}

/// π = p, for positions the budget does not apply to (tokens copied from the context), whatever
/// the rule: not every rule has a lossless value, and a rule's is not always 0.
pub fn lossless(p: &[f32], q: &[f32]) -> Mixed {
    mix_tv(p, q, 0.0)
}

pub fn mix_tv(p: &[f32], q: &[f32], budget: f64) -> Mixed {
    let d = tv_distance(p, q);
    let theta = if d <= 0.0 { 1.0 } else { (budget / d).min(1.0) };
    let pi_mixed = p.iter().zip(q).map(|(&a, &b)| ((1.0 - theta) * a as f64 + theta * b as f64) as f32).collect();
    Mixed { pi_mixed, tv_pq: d, theta, tv_pi_p: theta * d }
}

/// The KL rule. The Lagrangian of max Σ min(π, q) s.t. KL(p‖π) ≤ D, Σπ = 1 splits per token: the
/// optimum is π(x) = clamp(q(x), b·p(x), a·p(x)) for some a ≥ b > 0 — tokens the draft likes much
/// more than the target get at most a·p, tokens it likes much less keep at least b·p, the rest
/// follow q exactly. With the ratio t = a/b fixed, b is pinned by Σπ = 1 (monotone, bisection);
/// KL(p‖π) grows with t from 0 (t = 1, π = p), so an outer bisection on t meets KL = D.
pub fn mix_kl(p: &[f32], q: &[f32], budget: f64) -> Mixed {
    let d = tv_distance(p, q);
    let finish = |pi_mixed: Vec<f32>| {
        let tv_pi_p = tv_distance(&pi_mixed, p);
        let theta = if d <= 0.0 { 1.0 } else { (tv_pi_p / d).min(1.0) };
        Mixed { pi_mixed, tv_pq: d, theta, tv_pi_p }
    };
    if budget <= 0.0 || d <= 0.0 {
        return finish(p.to_vec());
    }
    if kl_divergence(p, q) <= budget {
        return finish(q.to_vec());
    }
    // Outer bisection on ln t, t = a/b ∈ [1, t_max].
    let (mut lo, mut hi) = (0.0f64, 60.0f64);
    let mut best = p.to_vec();
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        let pi = kl_candidate(p, q, mid.exp());
        if kl_divergence(p, &pi) <= budget {
            best = pi;
            lo = mid;
        } else {
            hi = mid;
        }
    }
    finish(best)
}

/// π(x) = clamp(q(x), b·p(x), t·b·p(x)) with b chosen so that Σπ = 1.
fn kl_candidate(p: &[f32], q: &[f32], t: f64) -> Vec<f32> {
    let total =
        |b: f64| -> f64 { p.iter().zip(q).map(|(&pp, &qq)| (qq as f64).clamp(b * pp as f64, t * b * pp as f64)).sum() };
    // Σπ(b) is continuous and non-decreasing, ≤ 1 at b ≤ 1/t·(something) and ≥ 1 at b = 1.
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..80 {
        let mid = 0.5 * (lo + hi);
        if total(mid) < 1.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let b = hi;
    let pi: Vec<f64> = p.iter().zip(q).map(|(&pp, &qq)| (qq as f64).clamp(b * pp as f64, t * b * pp as f64)).collect();
    let s: f64 = pi.iter().sum();
    pi.into_iter().map(|x| (x / s) as f32).collect()
}

/// Probability that a drafted token x is accepted: min(1, π(x)/q(x)).
pub fn accept_probability(pi_x: f32, q_x: f32) -> f64 {
    if q_x <= 0.0 {
        // A token the draft could not have proposed; only reachable through rounding.
        return if pi_x > 0.0 { 1.0 } else { 0.0 };
    }
    (pi_x as f64 / q_x as f64).min(1.0)
}

/// The distribution a rejected position is resampled from: normalised max(π − q, 0).
/// (For the TV rule with θ < 1 this is proportional to max(p − q, 0).)
pub fn residual(pi_mixed: &[f32], q: &[f32]) -> Vec<f32> {
    let r: Vec<f32> = pi_mixed.iter().zip(q).map(|(&a, &b)| (a - b).max(0.0)).collect();
    if r.iter().all(|&x| x <= 0.0) {
        // π = q up to rounding: nothing to correct, so follow π.
        return pi_mixed.to_vec();
    }
    r
}

/// Outcome of checking one drafted token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    pub accepted: bool,
    /// The drafted token if accepted, else the residual sample.
    pub token: u32,
    pub accept_prob: f64,
}

/// The same-seed rule at one position: the emitted token is the race's pick from π with the
/// position's weights `w` ([`crate::sampling::race_weights`]), and the drafted `x` (the race's pick
/// from q with the same weights) is accepted iff it is that token. `accept_prob` is the realised
/// outcome, 1 or 0: this coupling has no per-token acceptance probability in closed form.
pub fn verify_same_seed(pi_mixed: &[f32], x: u32, w: &[f32]) -> Verdict {
    let token = crate::sampling::race_argmax(pi_mixed, w) as u32;
    let accepted = token == x;
    Verdict { accepted, token, accept_prob: if accepted { 1.0 } else { 0.0 } }
}

/// The one-step rule: accept `x` with probability min(1, π(x)/q(x)) using `u_accept`; otherwise
/// draw the replacement from the residual with `u_residual`.
pub fn verify_token(pi_mixed: &[f32], q: &[f32], x: u32, u_accept: f64, u_residual: f64) -> Verdict {
    let i = x as usize;
    let accept_prob = accept_probability(pi_mixed[i], q[i]);
    if u_accept < accept_prob {
        return Verdict { accepted: true, token: x, accept_prob };
    }
    let r = residual(pi_mixed, q);
    let token = crate::sampling::sample_index(&r, u_residual) as u32;
    Verdict { accepted: false, token, accept_prob }
}

/// Recursive rejection sampling (Jeon et al., 2024, "Recursive Speculative Decoding"), the
/// max-acceptance rule at a tree node: its candidates are drawn from q without replacement
/// ([`crate::sampling::sample_without_replacement`]), a copied token may follow as a point mass,
/// and they are checked in that order. Candidate j is accepted with probability
/// min(1, r_j(x)/q_j(x)), where q_j is q without the candidates before it and r_j the residual
/// after their rejections (r_1 = π, r_{j+1} ∝ max(r_j − q_j, 0); a point mass δ_x leaves r_j
/// without x). Each step emits exactly r_j, as the one-step rule emits π, so the node emits π
/// whatever the candidates; with one candidate this is [`verify_token`], to the bit.
pub struct RecursiveRejection {
    /// The residual r_j, up to its sum (π itself, assumed normalised, before any rejection).
    r: Vec<f32>,
    r_sum: f64,
    /// What is left of q, up to its sum.
    q: Vec<f32>,
    q_sum: f64,
    /// No candidate rejected yet: r = π and q as given, both normalised.
    fresh: bool,
}

impl RecursiveRejection {
    pub fn new(pi_mixed: &[f32], q: &[f32]) -> Self {
        Self { r: pi_mixed.to_vec(), r_sum: 1.0, q: q.to_vec(), q_sum: 1.0, fresh: true }
    }

    /// The probability that candidate `x` is accepted now: min(1, r(x)/q(x)) for a draft from
    /// what is left of q, r(x) for a point mass.
    pub fn accept_prob(&self, x: u32, point_mass: bool) -> f64 {
        let r_x = self.r[x as usize] as f64 / self.r_sum;
        if point_mass {
            return r_x.min(1.0);
        }
        let q_x = self.q[x as usize] as f64 / self.q_sum;
        match (q_x > 0.0, self.fresh) {
            // Before any rejection: the one-step rule's own expression.
            (_, true) => accept_probability(self.r[x as usize], self.q[x as usize]),
            (true, false) => (r_x / q_x).min(1.0),
            (false, false) => f64::from(u8::from(r_x > 0.0)),
        }
    }

    /// Candidate `x` was rejected: the residual moves on to the next step.
    pub fn reject(&mut self, x: u32, point_mass: bool) {
        let i = x as usize;
        let fresh = std::mem::replace(&mut self.fresh, false);
        if point_mass {
            let mass = self.r[i];
            self.r[i] = 0.0;
            match crate::vecmath::sum_f64(&self.r) {
                // r was δ_x: the rejection was rounding; keep r.
                sum if sum <= 0.0 => self.r[i] = mass,
                sum => self.r_sum = sum,
            }
            return;
        }
        let next: Vec<f32> = match fresh {
            true => self.r.iter().zip(&self.q).map(|(&a, &b)| (a - b).max(0.0)).collect(),
            false => {
                let (sr, sq) = (1.0 / self.r_sum, 1.0 / self.q_sum);
                self.r.iter().zip(&self.q).map(|(&a, &b)| ((a as f64 * sr - b as f64 * sq) as f32).max(0.0)).collect()
            }
        };
        let sum = crate::vecmath::sum_f64(&next);
        // No residual mass means r = q up to rounding: the rejection was rounding; keep r.
        if sum > 0.0 {
            (self.r, self.r_sum) = (next, sum);
        }
        self.q[i] = 0.0;
        self.q_sum = crate::vecmath::sum_f64(&self.q);
    }

    /// The residual after every rejection so far, up to its sum (what a node that takes none of
    /// its candidates draws from).
    pub fn residual(&self) -> &[f32] {
        &self.r
    }
}

/// A tree node's verdict under [`RecursiveRejection`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeVerdict {
    /// Which candidate was accepted (its index in the order checked), if one was.
    pub taken: Option<usize>,
    /// The emitted token: the taken candidate, else a draw from the last residual.
    pub token: u32,
    /// The first candidate's acceptance probability, min(1, π(x)/q(x)).
    pub accept_prob: f64,
}

/// Check a node's candidates in order (`point_mass` tells a copied one), with uniform `u_accept(j)`
/// for the j-th; if none is accepted, draw from the residual with `u_residual`.
pub fn verify_candidates(
    pi_mixed: &[f32],
    q: &[f32],
    candidates: &[(u32, bool)],
    u_accept: impl Fn(usize) -> f64,
    u_residual: f64,
) -> NodeVerdict {
    // One drafted candidate (a chain's): the one-step rule, which it equals to the bit, without
    // the copies of π and q the recursion keeps.
    if let [(x, false)] = candidates {
        let v = verify_token(pi_mixed, q, *x, u_accept(0), u_residual);
        return NodeVerdict { taken: v.accepted.then_some(0), token: v.token, accept_prob: v.accept_prob };
    }
    let mut rule = RecursiveRejection::new(pi_mixed, q);
    let mut accept_prob = 0.0;
    for (j, &(x, point_mass)) in candidates.iter().enumerate() {
        let a = rule.accept_prob(x, point_mass);
        if j == 0 {
            accept_prob = a;
        }
        if u_accept(j) < a {
            return NodeVerdict { taken: Some(j), token: x, accept_prob };
        }
        rule.reject(x, point_mass);
    }
    let token = crate::sampling::sample_index(rule.residual(), u_residual) as u32;
    NodeVerdict { taken: None, token, accept_prob }
}

/// The probability that each of `drafted` (drawn from q without replacement, in order) is the one
/// a node takes under [`RecursiveRejection`]: ∏_{i<j}(1 − a_i) · a_j. Exact given the candidates,
/// so the adaptive policy learns from it without the luck of the draw.
pub fn take_probabilities(pi_mixed: &[f32], q: &[f32], drafted: &[u32]) -> Vec<f64> {
    let mut rule = RecursiveRejection::new(pi_mixed, q);
    let mut none_yet = 1.0;
    let mut out = Vec::with_capacity(drafted.len());
    for (j, &x) in drafted.iter().enumerate() {
        let a = rule.accept_prob(x, false);
        out.push(none_yet * a);
        none_yet *= 1.0 - a;
        if j + 1 < drafted.len() {
            rule.reject(x, false);
        }
    }
    out
}
