//! `mentor-lab bench`: the methodology of the mentored-decoding article's experiment (Qwen2.5 7B +
//! 0.5B on an Apple M2; see docs/performance.md) in one command. One warm-up run per
//! configuration, then R timed repeats of S seeds, each seed running every configuration in turn;
//! a Markdown table of medians, and optionally every raw measurement as JSON.

use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use mentor_lab::presets::preset;
use mentor_lab::{
    Coupling, DraftLen, Drafting, Engine, GenerateRequest, Lookup, MentorRule, Mode, SamplingParams, Verify,
    WeightFormat,
};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    models: ModelArgs,
    /// A preset (creative, code, qa) or the prompt text itself.
    #[arg(long, default_value = "creative")]
    prompt: String,
    /// Tokens per run (EOS is ignored so every run has the same length).
    #[arg(long, default_value_t = 256)]
    tokens: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 3)]
    seeds: usize,
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Configurations: target, draft, fixed=K,tv=D, auto,tv=D, fixed=K,kl=D, or any rule with its
    /// parameter: cascade=α, fuzzy=T, typical=ε, lenience=l (add ,nobonus; auto
    /// also copies from the context unless ,nolookup, and after drafted tokens unless ,notail,
    /// and from the files of --copy-from unless ,nocorpus;
    /// ,feature drafts with the shipped feature draft instead of the loaded one, ,other with
    /// --other-draft).
    /// Repeat the flag or separate with spaces.
    #[arg(long = "config", num_args = 1.., default_values_t = default_configs())]
    configs: Vec<String>,
    /// Write every raw measurement to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The coupling of configurations that do not name one (`,sameseed` / `,maxaccept`):
    /// same-seed, max-acceptance, or both (each speculative configuration runs with each).
    #[arg(long, default_value = "same-seed")]
    coupling: String,
    /// Instead of --config: every mentor rule at five values across its range, with draft length
    /// K, and a table of where each lands in speed against the target's NLL.
    #[arg(long, value_name = "K")]
    frontier: Option<usize>,
    /// The rules of --frontier (comma-separated; kl is left out by default: its π is slow).
    #[arg(long, value_delimiter = ',', default_value = super::frontier::DEFAULT_RULES)]
    frontier_rules: Vec<MentorRule>,
    /// A second draft for the configurations that say `,other`, so that two drafts are compared
    /// in one process.
    #[arg(long, value_name = "FILE")]
    other_draft: Option<PathBuf>,
}

fn default_configs() -> Vec<String> {
    [
        "target",
        "draft",
        "fixed=4,tv=0",
        "fixed=4,tv=1",
        "fixed=8,tv=1",
        "fixed=8,tv=0.75",
        "fixed=8,tv=0.5",
        "auto,tv=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A bench configuration applied on top of a base request.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    pub label: String,
    pub mode: Mode,
    pub drafting: Drafting,
    pub verify: Verify,
    /// Another draft this configuration runs with instead of the loaded one (`,feature`: the
    /// shipped feature draft; `,dw=q4_0`: the loaded draft in other weights; `,other`: the file of
    /// `--other-draft`), so that both are compared in one process.
    pub other_draft: Option<OtherDraft>,
    /// The coupling this configuration names, if any (`,sameseed`, `,maxaccept`).
    pub coupling: Option<Coupling>,
    /// Run without the corpus of `--copy-from` (`,nocorpus`), to compare in one process.
    pub no_corpus: bool,
}

/// The draft a configuration names instead of the loaded one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OtherDraft {
    Feature,
    File,
    Weights(WeightFormat),
}

pub fn parse_config(s: &str) -> Result<BenchConfig> {
    let mut c = BenchConfig {
        label: s.to_string(),
        mode: Mode::Speculative,
        drafting: Drafting::default(),
        verify: Verify::default(),
        other_draft: None,
        coupling: None,
        no_corpus: false,
    };
    let (mut len, mut tree, mut side, mut lookup, mut tail) = (DraftLen::Fixed(4), None, false, true, true);
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        match key {
            "target" => c.mode = Mode::Target,
            "draft" => c.mode = Mode::Draft,
            "auto" => len = DraftLen::Auto,
            "fixed" | "k" => len = value.parse().map_err(anyhow::Error::msg)?,
            "tree" => tree = Some(value.parse().map_err(anyhow::Error::msg)?),
            _ if key.parse::<MentorRule>().is_ok() => (c.verify.rule, c.verify.budget) = parse_rule(s, key, value)?,
            "nobonus" => c.verify.bonus = false,
            "side" => side = true,
            "nolookup" => lookup = false,
            "notail" => tail = false,
            "nocorpus" => c.no_corpus = true,
            "noamx" => bail!("`noamx` in config `{s}`: the kernels are chosen once per process; run bench again with --kernel noamx"),
            "feature" => c.other_draft = Some(OtherDraft::Feature),
            "other" => c.other_draft = Some(OtherDraft::File),
            "dw" => c.other_draft = Some(OtherDraft::Weights(value.parse().map_err(anyhow::Error::msg)?)),
            "sameseed" | "same-seed" => c.coupling = Some(Coupling::SameSeed),
            "maxaccept" | "max-acceptance" => c.coupling = Some(Coupling::MaxAcceptance),
            _ => bail!("unknown part `{part}` in config `{s}`: use target, draft, fixed=K, auto, tree=WxD, tv=D, kl=D, nobonus, side, nolookup, notail, nocorpus, feature, other, dw=FORMAT, sameseed, maxaccept"),
        }
    }
    c.drafting = Drafting::from_controls(len, tree, side, Lookup::from_flags(lookup, tail))
        .map_err(|e| anyhow::anyhow!("config `{s}`: {e}"))?;
    Ok(c)
}

/// A config's `rule=value` part: the rule and its checked budget.
fn parse_rule(s: &str, key: &str, value: &str) -> Result<(MentorRule, f64)> {
    let rule: MentorRule = key.parse().map_err(anyhow::Error::msg)?;
    let budget = value.parse().with_context(|| format!("budget `{value}` in config `{s}` is not a number"))?;
    let param = rule.param();
    let budget = param
        .check(budget)
        .map_err(|e| anyhow::anyhow!("config `{s}`: {e}; write {key}=V with V from {} to {}", param.min, param.max))?;
    Ok((rule, budget))
}

#[derive(Serialize)]
struct Measurement {
    config: String,
    /// The coupling the run drew its tokens with (same-seed or max-acceptance).
    coupling: &'static str,
    repeat: usize,
    seed: u64,
    n_tokens: usize,
    e2e_s: f64,
    prefill_s: f64,
    decode_tok_s: f64,
    n_rounds: usize,
    n_drafted: usize,
    n_accepted: usize,
    /// Of `n_drafted` / `n_accepted`: tokens copied from the context.
    n_copied: usize,
    n_copied_accepted: usize,
    acceptance_rate: f64,
    mean_accepted_len: f64,
    draft_s: f64,
    verify_s: f64,
    mean_target_nll: f64,
    mean_tv: f64,
}

pub fn median(v: Vec<f64>) -> f64 {
    quantile(v, 0.5)
}

/// The `q`-quantile of `v`, interpolated linearly between the sorted values (0.5: the median,
/// the mean of the middle two for an even count); NaN if `v` is empty.
pub fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    if lo == hi {
        return v[lo];
    }
    v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        s / n as f64
    }
}

/// Give every configuration its coupling: the one it names, else `--coupling`'s; with `both`, a
/// speculative configuration that names none runs once with each (labels `…,sameseed`,
/// `…,maxaccept`), and target-only and draft-only use the same-seed draws.
pub fn with_couplings(configs: Vec<BenchConfig>, coupling: &str) -> Result<Vec<BenchConfig>> {
    let both = coupling.eq_ignore_ascii_case("both");
    let default = match both {
        true => Coupling::SameSeed,
        false => coupling.parse::<Coupling>().map_err(|e| anyhow::anyhow!("--coupling: {e} (or both)"))?,
    };
    let mut out = Vec::new();
    for c in configs {
        match c.coupling {
            None if both && c.mode == Mode::Speculative => {
                for (suffix, k) in [("sameseed", Coupling::SameSeed), ("maxaccept", Coupling::MaxAcceptance)] {
                    out.push(BenchConfig { label: format!("{},{suffix}", c.label), coupling: Some(k), ..c.clone() });
                }
            }
            None => out.push(BenchConfig { coupling: Some(default), ..c }),
            Some(_) => out.push(c),
        }
    }
    Ok(out)
}

pub fn run(args: BenchArgs) -> Result<()> {
    let names = match args.frontier {
        Some(k) => super::frontier::configs(k, &args.frontier_rules),
        None => args.configs.iter().flat_map(|c| c.split_whitespace()).map(str::to_string).collect(),
    };
    let configs: Vec<BenchConfig> = names.iter().map(|c| parse_config(c)).collect::<Result<_>>()?;
    let configs = with_couplings(configs, &args.coupling)?;
    let prompt = preset(&args.prompt).map(|p| p.prompt.to_string()).unwrap_or_else(|| args.prompt.clone());
    let need_draft = configs.iter().any(|c| c.mode != Mode::Target);
    let mut engine = super::load_engine(&args.models, need_draft)?;
    let mut drafts = Drafts::load(&engine, &configs, &args)?;
    let base = GenerateRequest {
        prompt,
        sampling: SamplingParams { temperature: args.temperature, ..SamplingParams::default() },
        max_tokens: args.tokens,
        ignore_eos: true,
        ..GenerateRequest::default()
    };
    eprintln!(
        "bench: target {} ({}), draft {}, {} threads, {} tokens, {} repeats x {} seeds",
        engine.target.info.name,
        engine.target.model.weight_desc,
        engine.draft.as_ref().map(|d| format!("{} ({})", d.info.name, d.model.weight_desc)).unwrap_or("-".into()),
        candle_core::utils::get_num_threads(),
        args.tokens,
        args.repeats,
        args.seeds
    );
    let cancel = AtomicBool::new(false);
    eprint!("warm-up:");
    for c in &configs {
        drafts.use_for(&mut engine, c);
        engine.generate(&c.request(&base, 1_000_003), &cancel, &mut |_| {})?;
        eprint!(" {}", c.label);
    }
    eprintln!();
    let mut all: Vec<Measurement> = Vec::new();
    // Configurations take turns within each seed of each repeat, starting one later each time:
    // whatever drift in the machine's speed separates two runs that are compared goes into their
    // ratio (docs/performance.md, Machines).
    for repeat in 0..args.repeats {
        eprint!("repeat {}/{}:", repeat + 1, args.repeats);
        for s in 0..args.seeds {
            let seed = s as u64;
            let shift = (repeat * args.seeds + s) % configs.len();
            for c in configs.iter().cycle().skip(shift).take(configs.len()) {
                drafts.use_for(&mut engine, c);
                let g = engine.generate(&c.request(&base, seed), &cancel, &mut |_| {})?;
                eprint!(" {} {:.2}s", c.label, g.stats.e2e_s);
                all.push(Measurement::of(c, &g, repeat, seed));
            }
        }
        eprintln!();
    }
    print_table(&configs, &all);
    if args.frontier.is_some() {
        super::frontier::print(&frontier_points(&configs, &all));
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&all)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("raw measurements written to {}", path.display());
    }
    Ok(())
}

/// The other draft of a comparison (`,feature`, `,other` or `,dw=FORMAT`), swapped in for the
/// configurations that name it; and the corpus (`--copy-from`), taken out for those that say
/// `,nocorpus`.
struct Drafts {
    other: Option<mentor_lab::generate::LoadedModel>,
    other_in: bool,
    corpus: Option<std::sync::Arc<mentor_lab::corpus::Corpus>>,
    corpus_out: bool,
}

impl Drafts {
    fn load(engine: &Engine, configs: &[BenchConfig], args: &BenchArgs) -> Result<Drafts> {
        let mut named: Vec<OtherDraft> = configs.iter().filter_map(|c| c.other_draft).collect();
        named.dedup();
        let (path, weights) = match named[..] {
            [] => return Ok(Drafts { other: None, other_in: false, corpus: None, corpus_out: false }),
            [OtherDraft::Feature] => (
                mentor_lab::models::feature_draft()
                    .context("`,feature` needs assets/models/smollm2-135m-feature-draft.Q8_0.gguf")?,
                args.models.draft_weights.unwrap_or(args.models.weights),
            ),
            [OtherDraft::File] => (
                args.other_draft.clone().context("`,other` needs --other-draft FILE")?,
                args.models.draft_weights.unwrap_or(args.models.weights),
            ),
            [OtherDraft::Weights(w)] => {
                let loaded = engine.draft.as_ref().context("`,dw=FORMAT` needs a draft: pass --draft or --pair")?;
                (loaded.info.path.clone(), w)
            }
            _ => bail!(
                "the configurations name {named:?}: one other draft per run (`,feature`, `,other` or one `,dw=FORMAT`)"
            ),
        };
        let (device, options) = (mentor_lab::model::default_device(), args.models.options()?);
        let d = mentor_lab::engine::load_draft(&path, &engine.target, None, weights, &device, &options)?;
        Ok(Drafts { other: Some(d), other_in: false, corpus: None, corpus_out: false })
    }

    fn use_for(&mut self, engine: &mut Engine, c: &BenchConfig) {
        let other = c.other_draft.is_some();
        if other != self.other_in && self.other.is_some() {
            std::mem::swap(&mut engine.draft, &mut self.other);
            self.other_in = other;
        }
        if c.no_corpus != self.corpus_out {
            std::mem::swap(&mut engine.corpus, &mut self.corpus);
            self.corpus_out = c.no_corpus;
        }
    }
}

impl BenchConfig {
    /// The request this configuration runs for `seed`.
    fn request(&self, base: &GenerateRequest, seed: u64) -> GenerateRequest {
        GenerateRequest {
            seed,
            mode: self.mode,
            drafting: self.drafting,
            verify: self.verify,
            coupling: self.coupling.unwrap_or_default(),
            ..base.clone()
        }
    }
}

impl Measurement {
    fn of(c: &BenchConfig, g: &mentor_lab::Generation, repeat: usize, seed: u64) -> Measurement {
        let st = &g.stats;
        Measurement {
            config: c.label.clone(),
            coupling: g.coupling.name(),
            repeat,
            seed,
            n_tokens: st.n_tokens,
            e2e_s: st.e2e_s,
            prefill_s: st.prefill_s,
            decode_tok_s: st.decode_tok_s,
            n_rounds: st.n_rounds,
            n_drafted: st.n_drafted,
            n_accepted: st.n_accepted,
            n_copied: st.n_copied,
            n_copied_accepted: st.n_copied_accepted,
            acceptance_rate: st.acceptance_rate,
            mean_accepted_len: st.mean_accepted_len,
            draft_s: st.draft_s,
            verify_s: st.verify_s,
            mean_target_nll: st.mean_target_nll,
            mean_tv: st.mean_tv,
        }
    }
}

/// Speedup of `label`: the median over (repeat, seed) of target-only's time over the
/// configuration's, each pair run within seconds of each other; the quartiles of those ratios show
/// how far the machine's variation moves one pair.
fn speedup(all: &[Measurement], label: &str) -> Option<(f64, f64, f64)> {
    let ratios: Vec<f64> = all
        .iter()
        .filter(|m| m.config == label)
        .filter_map(|m| {
            all.iter()
                .find(|t| t.config == "target" && t.repeat == m.repeat && t.seed == m.seed)
                .map(|t| t.e2e_s / m.e2e_s)
        })
        .collect();
    let q = |p| quantile(ratios.clone(), p);
    Some((q(0.5), q(0.25), q(0.75))).filter(|s| s.0.is_finite())
}

/// Each speculative configuration's mean target NLL, realised TV and paired speedup.
fn frontier_points(configs: &[BenchConfig], all: &[Measurement]) -> Vec<super::frontier::Point> {
    configs
        .iter()
        .filter(|c| c.mode == Mode::Speculative)
        .map(|c| {
            let ms = || all.iter().filter(|m| m.config == c.label);
            super::frontier::Point {
                rule: c.verify.rule,
                value: c.verify.budget,
                nll: mean(ms().map(|m| m.mean_target_nll)),
                mean_tv: mean(ms().map(|m| m.mean_tv)),
                speedup: speedup(all, &c.label).map_or(f64::NAN, |s| s.0),
            }
        })
        .collect()
}

fn print_table(configs: &[BenchConfig], all: &[Measurement]) {
    println!("| config | coupling | acceptance | copied: share of drafted (accepted) | avg rounds/request | median e2e (s) | tok/s | speedup vs target-only (median of paired ratios; quartiles) | mean target NLL | draft s | verify s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for c in configs {
        let ms: Vec<&Measurement> = all.iter().filter(|m| m.config == c.label).collect();
        println!("{}", table_row(c, &ms, speedup(all, &c.label)));
    }
}

/// One configuration's line of the table, from its measurements.
fn table_row(c: &BenchConfig, ms: &[&Measurement], speedup: Option<(f64, f64, f64)>) -> String {
    let spec = c.mode == Mode::Speculative;
    let drafted: usize = ms.iter().map(|m| m.n_drafted).sum();
    let accepted: usize = ms.iter().map(|m| m.n_accepted).sum();
    let copied: usize = ms.iter().map(|m| m.n_copied).sum();
    let copied_accepted: usize = ms.iter().map(|m| m.n_copied_accepted).sum();
    let if_spec = |s: &dyn Fn() -> String| if spec { s() } else { "-".into() };
    format!(
        "| {} | {} | {} | {} | {} | {:.2} | {:.1} | {} | {:.3} | {} | {} |",
        c.label,
        c.coupling.unwrap_or_default(),
        if spec && drafted > 0 { format!("{:.1}%", 100.0 * accepted as f64 / drafted as f64) } else { "-".into() },
        if copied > 0 {
            format!(
                "{:.0}% ({:.0}%)",
                100.0 * copied as f64 / drafted as f64,
                100.0 * copied_accepted as f64 / copied as f64
            )
        } else {
            "-".into()
        },
        if_spec(&|| format!("{:.1}", mean(ms.iter().map(|m| m.n_rounds as f64)))),
        median(ms.iter().map(|m| m.e2e_s).collect()),
        mean(ms.iter().map(|m| m.n_tokens as f64 / m.e2e_s)),
        match speedup {
            Some((x, lo, hi)) if c.label != "target" => format!("{x:.2}x ({lo:.2}–{hi:.2})"),
            Some((x, _, _)) => format!("{x:.2}x"),
            None => "-".into(),
        },
        mean(ms.iter().map(|m| m.mean_target_nll)),
        if_spec(&|| format!("{:.2}", median(ms.iter().map(|m| m.draft_s).collect()))),
        if_spec(&|| format!("{:.2}", median(ms.iter().map(|m| m.verify_s).collect()))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_sorted_values() {
        let v = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(median(v.clone()), 2.5);
        assert_eq!(quantile(v.clone(), 0.0), 1.0);
        assert_eq!(quantile(v.clone(), 1.0), 4.0);
        assert_eq!(quantile(v.clone(), 0.25), 1.75);
        assert_eq!(median(vec![5.0, 1.0, 3.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
        // A ratio that is infinite (a run timed at zero) stays infinite at its own rank.
        assert_eq!(quantile(vec![1.0, f64::INFINITY, 2.0], 1.0), f64::INFINITY);
    }

    #[test]
    fn configs_parse_with_their_switches_and_reject_unknown_parts() {
        let c = parse_config("auto,tv=0,nolookup").unwrap();
        assert_eq!(
            (c.mode, c.drafting.len(), c.verify.budget, c.verify.bonus),
            (Mode::Speculative, DraftLen::Auto, 0.0, true)
        );
        assert_eq!(c.drafting.lookup(), Lookup::Off);
        assert_eq!(parse_config("auto,notail").unwrap().drafting.lookup(), Lookup::Start);
        assert_eq!(
            parse_config("fixed=2,tree=2x3").unwrap().drafting,
            Drafting::Tree(mentor_lab::TreeShape { width: 2, depth: 3 })
        );
        assert!(parse_config("auto,side").unwrap().drafting.side_offers());
        let e = parse_config("fixed=4,side").unwrap_err().to_string();
        assert!(e.contains("adaptive"), "{e}");
        assert!(parse_config("auto,side,tree=2x3").unwrap_err().to_string().contains("tree already branches"));
        let e = parse_config("auto,tv=0,noamx").unwrap_err().to_string();
        assert!(e.contains("--kernel noamx"), "{e}");
        for config in ["fixed=8,kl=0.5,nobonus", "nobonus,fixed=8,kl=0.5"] {
            let c = parse_config(config).unwrap();
            assert_eq!(
                (c.drafting, c.verify),
                (Drafting::Chain(8), Verify { rule: MentorRule::Kl, budget: 0.5, bonus: false })
            );
        }
        assert_eq!(parse_config("target").unwrap().mode, Mode::Target);
        let c = parse_config("auto,tv=0,feature").unwrap();
        assert!(c.other_draft == Some(OtherDraft::Feature) && parse_config("auto,tv=0").unwrap().other_draft.is_none());
        let c = parse_config("auto,tv=0,dw=q4_0").unwrap();
        assert_eq!(c.other_draft, Some(OtherDraft::Weights(WeightFormat::Q4_0)));
        assert!(parse_config("auto,dw=q3").is_err());
        assert_eq!(parse_config("fixed=2,tv=0,other").unwrap().other_draft, Some(OtherDraft::File));
        let e = parse_config("auto,fast").unwrap_err().to_string();
        assert!(e.contains("unknown part `fast`") && e.contains("notail"), "{e}");
        assert!(parse_config("fixed=8,tv=much").unwrap_err().to_string().contains("not a number"));
    }

    #[test]
    fn every_rule_parses_with_its_parameter_and_out_of_range_values_are_refused() {
        for (config, rule, value) in [
            ("fixed=8,cascade=-0.5", MentorRule::Cascade, -0.5),
            ("fixed=8,fuzzy=0.1", MentorRule::Fuzzy, 0.1),
            ("auto,typical=0.3", MentorRule::Typical, 0.3),
            ("fixed=4,lenience=0.5", MentorRule::Lenience, 0.5),
        ] {
            let c = parse_config(config).unwrap();
            assert_eq!((c.verify.rule, c.verify.budget), (rule, value), "{config}");
        }
        let e = parse_config("fixed=8,tv=1.5").unwrap_err().to_string();
        assert!(e.contains("TV budget") && e.contains("between 0 and 1") && e.contains("tv=V"), "{e}");
        let e = parse_config("fixed=8,lenience=0").unwrap_err().to_string();
        assert!(e.contains("lenience l") && e.contains("0.01"), "{e}");
        assert!(parse_config("fixed=8,cascade=2").is_err() && parse_config("fixed=8,fuzzy=0.7").is_err());
    }

    #[test]
    fn both_couplings_double_the_speculative_configs_only() {
        let parsed = |v: &[&str]| v.iter().map(|s| parse_config(s).unwrap()).collect::<Vec<_>>();
        let out = with_couplings(parsed(&["target", "fixed=8,tv=0", "auto,tv=0,maxaccept"]), "both").unwrap();
        let labels: Vec<(&str, Option<Coupling>)> = out.iter().map(|c| (c.label.as_str(), c.coupling)).collect();
        assert_eq!(
            labels,
            vec![
                ("target", Some(Coupling::SameSeed)),
                ("fixed=8,tv=0,sameseed", Some(Coupling::SameSeed)),
                ("fixed=8,tv=0,maxaccept", Some(Coupling::MaxAcceptance)),
                ("auto,tv=0,maxaccept", Some(Coupling::MaxAcceptance)),
            ]
        );
        let out = with_couplings(parsed(&["fixed=4,tv=1"]), "max-acceptance").unwrap();
        assert_eq!(out[0].coupling, Some(Coupling::MaxAcceptance));
        assert!(with_couplings(parsed(&["target"]), "sometimes").unwrap_err().to_string().contains("same-seed"));
    }
}
