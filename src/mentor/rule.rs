//! The mentor rules by name, and the one parameter each takes. This is the single home of a
//! rule's parameter: its name, its key on the command line and in bench configurations, its valid
//! range and the value that means "no relaxation". The settings, the CLI, bench and the request's
//! validation all ask here, so a range is written once.

use serde::{Deserialize, Serialize};

/// Which π a mentored run follows; each rule takes one parameter (the request's `budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MentorRule {
    /// π = (1−θ)p + θq with θ = min(1, D/d): π is at most D from p in TV.
    #[default]
    Tv,
    /// π maximises acceptance subject to KL(p ‖ π) ≤ D (Tran-Thien, 2023).
    Kl,
    /// Follow the draft where it is confident enough against the target (Narasimhan et al., 2025).
    Cascade,
    /// Follow the draft where JS(p, q) ≤ T (Holsman et al., 2025).
    Fuzzy,
    /// Medusa's typical acceptance (Cai et al., 2024).
    Typical,
    /// Lenient acceptance min(1, p/(l·q)) (Leviathan et al., 2023, §A.5).
    Lenience,
}

/// What a rule's parameter is and which values it may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuleParam {
    /// The parameter's name, as the slider's label and in error messages.
    pub name: &'static str,
    /// The smallest and largest valid value (both included).
    pub min: f64,
    pub max: f64,
    /// The value at which π = p exactly (lossless decoding), where the rule has one.
    pub lossless: Option<f64>,
    /// One line on what the parameter does, for hover texts and `--help`.
    pub meaning: &'static str,
}

impl MentorRule {
    /// Every rule, in the order the app lists them.
    pub const ALL: [MentorRule; 6] = [Self::Tv, Self::Kl, Self::Cascade, Self::Fuzzy, Self::Typical, Self::Lenience];

    /// The rule's key: `--rule`, bench configurations (`cascade=0.2`), sweep labels, JSON.
    pub fn key(self) -> &'static str {
        match self {
            Self::Tv => "tv",
            Self::Kl => "kl",
            Self::Cascade => "cascade",
            Self::Fuzzy => "fuzzy",
            Self::Typical => "typical",
            Self::Lenience => "lenience",
        }
    }

    /// The rule's short name in the app's selector and run labels.
    pub fn label(self) -> &'static str {
        match self {
            Self::Tv => "TV",
            Self::Kl => "KL",
            Self::Cascade => "Cascade",
            Self::Fuzzy => "Fuzzy",
            Self::Typical => "Typical",
            Self::Lenience => "Lenience",
        }
    }

    pub fn param(self) -> RuleParam {
        let p = |name, min, max, lossless, meaning| RuleParam { name, min, max, lossless, meaning };
        match self {
            Self::Tv => p(
                "TV budget",
                0.0,
                1.0,
                Some(0.0),
                "π = (1−θ)p + θq with θ = min(1, D/TV(p,q)), so TV(π, p) ≤ D; 0 = lossless, 1 = follow the draft",
            ),
            // KL(p ‖ q) is unbounded; beyond 2 nats π is q at nearly every position, so a larger
            // budget buys nothing the slider's end does not.
            Self::Kl => p(
                "KL budget (nats)",
                0.0,
                2.0,
                Some(0.0),
                "π maximises acceptance subject to KL(p‖π) ≤ D nats; 0 = lossless",
            ),
            // max q − max p ≤ TV(p, q) always, so at α = −1 the strict test never passes.
            Self::Cascade => p(
                "cascade α",
                -1.0,
                1.0,
                Some(-1.0),
                "follow the draft (π = q) where max q > max p − α·TV(p,q), else the target; −1 = lossless, 1 = almost always the draft",
            ),
            Self::Fuzzy => p(
                "fuzzy threshold T (nats)",
                0.0,
                std::f64::consts::LN_2,
                Some(0.0),
                "follow the draft (π = q) where JS(p, q) ≤ T, else the target; 0 = lossless, ln 2 = always the draft",
            ),
            Self::Typical => p(
                "typical ε",
                0.0,
                1.0,
                None,
                "accept a drafted token where the target gives it more than min(ε, √ε·e^(−H(p))); larger ε is stricter, no value is lossless",
            ),
            Self::Lenience => p(
                "lenience l",
                0.01,
                1.0,
                Some(1.0),
                "accept a drafted token with min(1, p/(l·q)); 1 = lossless, smaller l accepts more",
            ),
        }
    }
}

impl RuleParam {
    pub fn range(&self) -> std::ops::RangeInclusive<f64> {
        self.min..=self.max
    }

    /// `value` if it is valid, else what is wrong with it and the valid range (callers add what
    /// to do, which depends on where the value came from).
    pub fn check(&self, value: f64) -> Result<f64, String> {
        if value.is_finite() && self.range().contains(&value) {
            return Ok(value);
        }
        Err(format!("the {} must be between {} and {}{}, got {value}", self.name, self.min, self.max, self.ends()))
    }

    /// The nearest valid value; a non-finite one takes `fallback` (itself brought into range).
    pub fn clamp(&self, value: f64, fallback: f64) -> f64 {
        let v = if value.is_finite() { value } else { fallback };
        v.clamp(self.min, self.max)
    }

    /// `n` values for a frontier: even steps from the no-relaxation value (for a rule without one,
    /// its strict end: typical acceptance relaxes as ε falls) to the other end of the range,
    /// rounded to three decimals inside it.
    pub fn frontier_values(&self, n: usize) -> Vec<f64> {
        let start = self.lossless.unwrap_or(self.max);
        let end = if start >= self.max { self.min } else { self.max };
        (1..=n)
            .map(|i| start + (end - start) * i as f64 / n as f64)
            .map(|x| self.clamp((x * 1000.0).round() / 1000.0, x))
            .collect()
    }

    /// " (0 = lossless)", or that no value is lossless.
    fn ends(&self) -> String {
        match self.lossless {
            Some(v) => format!(" ({v} = lossless)"),
            None => " (no value is lossless)".into(),
        }
    }
}

impl std::fmt::Display for MentorRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

impl std::str::FromStr for MentorRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.to_ascii_lowercase();
        Self::ALL.into_iter().find(|r| r.key() == lower).ok_or_else(|| {
            let keys: Vec<&str> = Self::ALL.iter().map(|r| r.key()).collect();
            format!("unknown mentor rule `{s}`: use {}", keys.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_round_trips_its_key_and_its_lossless_value_is_in_range() {
        for rule in MentorRule::ALL {
            assert_eq!(rule.key().parse::<MentorRule>(), Ok(rule));
            assert_eq!(rule.to_string().to_uppercase().parse::<MentorRule>(), Ok(rule));
            let param = rule.param();
            assert!(param.min < param.max, "{rule}");
            if let Some(v) = param.lossless {
                assert_eq!(param.check(v), Ok(v), "{rule}");
            }
            let json = serde_json::to_string(&rule).unwrap();
            assert_eq!(json, format!("\"{}\"", rule.key()), "settings files hold the key");
        }
        assert!("nope".parse::<MentorRule>().unwrap_err().contains("cascade, fuzzy, typical, lenience"));
    }

    #[test]
    fn out_of_range_values_name_the_parameter_and_its_range() {
        let e = MentorRule::Cascade.param().check(1.5).unwrap_err();
        assert!(e.contains("cascade α") && e.contains("between -1 and 1") && e.contains("1.5"), "{e}");
        assert!(MentorRule::Tv.param().check(f64::NAN).is_err());
        assert!(MentorRule::Typical.param().check(-0.1).unwrap_err().contains("no value is lossless"));
        assert_eq!(MentorRule::Lenience.param().clamp(0.0, 1.0), 0.01);
        assert_eq!(MentorRule::Kl.param().clamp(f64::INFINITY, 0.5), 0.5);
    }
}
