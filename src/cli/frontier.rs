//! `bench --frontier K`: every mentor rule over its parameter's range at a fixed draft length, and
//! where each lands in speed against the target's NLL: which rule buys the most speed for the
//! least distortion on this pair and prompt.

use mentor_lab::MentorRule;

/// Points per rule.
const N_VALUES: usize = 5;

/// A rule's values for the frontier.
pub fn rule_values(rule: MentorRule) -> Vec<f64> {
    rule.param().frontier_values(N_VALUES)
}

/// The rules a frontier covers unless told: all but KL, whose π (a nested bisection over the
/// vocabulary at every drafted position) takes longer than the forwards it saves on a CPU.
pub const DEFAULT_RULES: &str = "tv,cascade,fuzzy,typical,lenience";

/// The frontier's configurations: target-only, then `fixed=K,rule=value` for every rule and value.
pub fn configs(k: usize, rules: &[MentorRule]) -> Vec<String> {
    let mut out = vec!["target".to_string()];
    for &rule in rules {
        out.extend(rule_values(rule).into_iter().map(|v| format!("fixed={k},{}={v}", rule.key())));
    }
    out
}

/// One configuration's place on the frontier.
pub struct Point {
    pub rule: MentorRule,
    pub value: f64,
    pub nll: f64,
    pub mean_tv: f64,
    pub speedup: f64,
}

/// The speedup `points` (one rule's) reach at target NLL `at`, interpolated along NLL between
/// the two points around it; `None` outside their range.
pub fn speedup_at(points: &[&Point], at: f64) -> Option<f64> {
    let mut sorted: Vec<&&Point> = points.iter().filter(|p| p.nll.is_finite() && p.speedup.is_finite()).collect();
    sorted.sort_by(|a, b| a.nll.total_cmp(&b.nll));
    sorted.windows(2).find(|w| w[0].nll <= at && at <= w[1].nll).map(|w| {
        let span = w[1].nll - w[0].nll;
        let t = if span > 0.0 { (at - w[0].nll) / span } else { 0.5 };
        w[0].speedup + t * (w[1].speedup - w[0].speedup)
    })
}

/// The TV rule's (target NLL, speedup) at budget D = `at`, interpolated along D between its
/// points around it.
pub fn tv_at(points: &[Point], at: f64) -> Option<(f64, f64)> {
    let mut tv: Vec<&Point> = points.iter().filter(|p| p.rule == MentorRule::Tv && p.nll.is_finite()).collect();
    tv.sort_by(|a, b| a.value.total_cmp(&b.value));
    tv.windows(2).find(|w| w[0].value <= at && at <= w[1].value).map(|w| {
        let t = (at - w[0].value) / (w[1].value - w[0].value).max(1e-12);
        (w[0].nll + t * (w[1].nll - w[0].nll), w[0].speedup + t * (w[1].speedup - w[0].speedup))
    })
}

/// The frontier as Markdown: each rule's points (value → speedup, NLL, realised TV) and its
/// speedup at the TV rule's NLL for D = 0.5.
pub fn print(points: &[Point]) {
    let tv = tv_at(points, 0.5);
    let reference = tv.map(|t| t.0);
    println!();
    println!(
        "| rule | points: value → speedup (target NLL, realised TV) | speedup at the NLL of tv=0.5{} |",
        match reference {
            Some(n) => format!(" ({n:.3})"),
            None => String::new(),
        }
    );
    println!("|---|---|---|");
    for rule in MentorRule::ALL {
        let mine: Vec<&Point> = points.iter().filter(|p| p.rule == rule).collect();
        if mine.is_empty() {
            continue;
        }
        let list: Vec<String> =
            mine.iter().map(|p| format!("{} → {:.2}x ({:.3}, {:.3})", p.value, p.speedup, p.nll, p.mean_tv)).collect();
        // The TV rule itself at D = 0.5 (along D: its NLL is not monotone in D from seed noise).
        let at = match rule {
            MentorRule::Tv => tv.map(|t| t.1),
            _ => reference.and_then(|n| speedup_at(&mine, n)),
        };
        let at = at.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "-".into());
        println!("| {} | {} | {at} |", rule.key(), list.join("; "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_run_from_the_strict_end_and_stay_in_range() {
        for rule in MentorRule::ALL {
            let v = rule_values(rule);
            let p = rule.param();
            assert_eq!(v.len(), N_VALUES);
            assert!(v.iter().all(|&x| p.check(x).is_ok()), "{rule}: {v:?}");
            assert!(p.lossless.is_none_or(|l| !v.contains(&l)), "{rule}: the lossless value is target-only's");
        }
        assert_eq!(rule_values(MentorRule::Tv), vec![0.2, 0.4, 0.6, 0.8, 1.0]);
        let all = configs(8, &MentorRule::ALL);
        assert!(all.iter().any(|c| c == "fixed=8,cascade=0.2"), "{all:?}");
        assert_eq!(all.len(), 1 + 5 * MentorRule::ALL.len());
    }

    #[test]
    fn speedup_is_interpolated_along_nll() {
        let p = |nll, speedup| Point { rule: MentorRule::Fuzzy, value: 0.0, nll, mean_tv: 0.0, speedup };
        let pts = [p(1.0, 1.0), p(2.0, 2.0), p(3.0, 1.5)];
        let refs: Vec<&Point> = pts.iter().collect();
        assert_eq!(speedup_at(&refs, 1.5), Some(1.5));
        assert_eq!(speedup_at(&refs, 2.5), Some(1.75));
        assert_eq!(speedup_at(&refs, 0.5), None);
        let tv = |value, nll, speedup| Point { rule: MentorRule::Tv, value, nll, mean_tv: 0.0, speedup };
        let with_tv = [tv(0.4, 1.0, 1.2), tv(0.6, 2.0, 1.6), p(5.0, 1.0)];
        let (nll, speedup) = tv_at(&with_tv, 0.5).unwrap();
        assert!((nll - 1.5).abs() < 1e-12 && (speedup - 1.4).abs() < 1e-12, "{nll} {speedup}");
        assert_eq!(tv_at(&with_tv, 0.9), None);
    }
}
