//! The lossy acceptance rules of the literature, each written as the π it makes the emitted token
//! follow, so that the one accept / residual step (chains, trees, both couplings) verifies them
//! exactly. Each takes one parameter ([`MentorRule::param`]); where one value means "no
//! relaxation", π is p itself there, bit for bit, so same-seed text equals target-only.

use super::{kl_divergence, tv_distance, MentorRule, Mixed};

/// π with the numbers the UI explains it with: d = TV(p, q), the realised TV(π, p), and
/// θ = TV(π, p) / d (1 when d = 0). Unlike the TV rule's θ this may exceed 1: the typical rule
/// moves π away from p even where q = p.
fn realised(p: &[f32], pi_mixed: Vec<f32>, d: f64) -> Mixed {
    let tv_pi_p = tv_distance(&pi_mixed, p);
    let theta = if d <= 0.0 { 1.0 } else { tv_pi_p / d };
    Mixed { pi_mixed, tv_pq: d, theta, tv_pi_p }
}

fn max_prob(v: &[f32]) -> f64 {
    v.iter().fold(0.0f32, |m, &x| m.max(x)) as f64
}

/// The cascade's deferral test (Narasimhan et al., "Faster Cascades via Speculative Decoding",
/// ICLR 2025, the OPT-style rule): follow the draft iff max q > max p − α·d.
pub fn cascade_follows_draft(p: &[f32], q: &[f32], alpha: f64, d: f64) -> bool {
    max_prob(q) > max_prob(p) - alpha * d
}

/// π = q where the draft passes [`cascade_follows_draft`], else p. α = −1 never follows it
/// (max q − max p ≤ d, but rounding could say otherwise, hence the explicit case).
pub fn mix_cascade(p: &[f32], q: &[f32], alpha: f64) -> Mixed {
    let d = tv_distance(p, q);
    let follow = alpha > -1.0 && cascade_follows_draft(p, q, alpha, d);
    realised(p, if follow { q.to_vec() } else { p.to_vec() }, d)
}

/// Jensen–Shannon divergence in nats, in [0, ln 2]: ½KL(p‖m) + ½KL(q‖m), m = (p + q)/2.
pub fn js_divergence(p: &[f32], q: &[f32]) -> f64 {
    let half_kl = |a: f64, m: f64| if a > 0.0 { 0.5 * a * (a / m).ln() } else { 0.0 };
    let js: f64 = p
        .iter()
        .zip(q)
        .map(|(&a, &b)| {
            let (a, b) = (a as f64, b as f64);
            let m = 0.5 * (a + b);
            half_kl(a, m) + half_kl(b, m)
        })
        .sum();
    js.max(0.0)
}

/// Fuzzy speculative decoding (Holsman et al., 2025): π = q where JS(p, q) ≤ T, else p. T = 0 is
/// lossless (it follows q only where q = p, so π = p is exact there).
pub fn mix_fuzzy(p: &[f32], q: &[f32], threshold: f64) -> Mixed {
    let d = tv_distance(p, q);
    let follow = threshold > 0.0 && js_divergence(p, q) <= threshold;
    realised(p, if follow { q.to_vec() } else { p.to_vec() }, d)
}

/// Shannon entropy in nats.
pub fn entropy(p: &[f32]) -> f64 {
    -p.iter().filter(|&&a| a > 0.0).map(|&a| a as f64 * (a as f64).ln()).sum::<f64>()
}

/// Medusa's threshold τ = min(ε, √ε·exp(−H(p))) (Cai et al., 2024, with δ = √ε): a drafted token
/// x is accepted iff p(x) > τ.
pub fn typical_threshold(p: &[f32], epsilon: f64) -> f64 {
    epsilon.min(epsilon.sqrt() * (-entropy(p)).exp())
}

/// Typical acceptance: with A = {x : p(x) > τ}, a drafted x ∈ A is kept and any other is
/// replaced by a draw from p, so π = q·1_A + (1 − q(A))·p. No ε makes this p: even q = p is
/// pulled towards A.
pub fn mix_typical(p: &[f32], q: &[f32], epsilon: f64) -> Mixed {
    let d = tv_distance(p, q);
    let tau = typical_threshold(p, epsilon);
    let in_a = |a: f32| a as f64 > tau;
    let q_in: f64 = p.iter().zip(q).filter(|(&a, _)| in_a(a)).map(|(_, &b)| b as f64).sum();
    let rest = (1.0 - q_in).max(0.0);
    let pi_mixed = p
        .iter()
        .zip(q)
        .map(|(&a, &b)| {
            let kept = if in_a(a) { b as f64 } else { 0.0 };
            (kept + rest * a as f64) as f32
        })
        .collect();
    realised(p, pi_mixed, d)
}

/// Lenient acceptance (Leviathan et al., 2023, §A.5): x ~ q is accepted with
/// min(1, p(x)/(l·q(x))), a rejection draws from norm(max(p − min(q, p/l), 0)), so
/// π = min(q, p/l) + β·norm(max(p − min(q, p/l), 0)) with β = 1 − Σ min(q, p/l).
/// l = 1 is the lossless rule, and π is p itself there.
pub fn mix_lenience(p: &[f32], q: &[f32], lenience: f64) -> Mixed {
    let d = tv_distance(p, q);
    if lenience >= 1.0 {
        return realised(p, p.to_vec(), d);
    }
    let kept: Vec<f64> = p.iter().zip(q).map(|(&a, &b)| (b as f64).min(a as f64 / lenience)).collect();
    let beta = (1.0 - kept.iter().sum::<f64>()).max(0.0);
    let rest: Vec<f64> = p.iter().zip(&kept).map(|(&a, &k)| (a as f64 - k).max(0.0)).collect();
    let rest_sum: f64 = rest.iter().sum();
    // No residual mass means p ≤ q everywhere, i.e. p = q, and then β = 0 too.
    let scale = if rest_sum > 0.0 { beta / rest_sum } else { 0.0 };
    let pi_mixed = kept.iter().zip(&rest).map(|(&k, &r)| (k + scale * r) as f32).collect();
    realised(p, pi_mixed, d)
}

impl MentorRule {
    /// The rule's own quantities at a position, for the token inspector: what it compared and
    /// what it decided, given the drafted token `drafted`. Flags are 1 (yes) or 0 (no).
    pub fn explain(self, p: &[f32], q: &[f32], value: f64, drafted: u32) -> Vec<(&'static str, f64)> {
        let d = tv_distance(p, q);
        let flag = |b: bool| f64::from(u8::from(b));
        match self {
            MentorRule::Tv => {
                vec![("D", value), ("θ = min(1, D/d)", if d <= 0.0 { 1.0 } else { (value / d).min(1.0) })]
            }
            MentorRule::Kl => vec![("D (nats)", value), ("KL(p‖q)", kl_divergence(p, q))],
            MentorRule::Cascade => vec![
                ("max q", max_prob(q)),
                ("max p − α·d", max_prob(p) - value * d),
                ("follows the draft", flag(value > -1.0 && cascade_follows_draft(p, q, value, d))),
            ],
            MentorRule::Fuzzy => vec![("JS(p, q)", js_divergence(p, q)), ("T", value)],
            MentorRule::Typical => {
                let tau = typical_threshold(p, value);
                let p_x = p.get(drafted as usize).map_or(0.0, |&a| a as f64);
                vec![("τ", tau), ("drafted token in A (p(x) > τ)", flag(p_x > tau))]
            }
            MentorRule::Lenience => vec![("l", value)],
        }
    }
}
