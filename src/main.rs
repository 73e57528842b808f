//! `mentor-lab`: with no arguments, the desktop app; otherwise a command-line front end to the
//! same engine.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use mentor_lab::generate::LoadedModel;
use mentor_lab::models::{self, FetchProgress};
use mentor_lab::{DraftLen, Engine, GenEvent, GenerateRequest, MentorRule, Mode, SamplingParams, WeightFormat};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

mod cli_bench;

#[derive(Parser)]
#[command(name = "mentor-lab", version, about = "Speculative and mentored decoding, measured live. No subcommand opens the app.")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (target-only, draft-only or speculative).
    Generate(GenerateArgs),
    /// List the GGUF models found on disk.
    Models,
    /// Time configurations against target-only, the reference experiment's way.
    Bench(cli_bench::BenchArgs),
}

/// Which models to load and how.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Target GGUF (default: SmolLM2-135M-Instruct, fetched on first use).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Draft GGUF (default: the draft shipped in assets/models).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Weight format in memory: auto, file, q8_0, f16, f32.
    #[arg(long, default_value = "auto")]
    pub weights: WeightFormat,
    /// CPU threads (default: all physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    models: ModelArgs,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Use the prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Print one JSON object with every token and the statistics.
    #[arg(long)]
    json: bool,
    /// target, draft or speculative.
    #[arg(long, default_value = "target")]
    mode: Mode,
    /// TV budget D (or KL budget with --mentor kl); 0 is lossless.
    #[arg(long, default_value_t = 0.0)]
    tv_budget: f64,
    /// tv or kl.
    #[arg(long, default_value = "tv")]
    mentor: MentorRule,
    /// Tokens drafted per round: 1..16 or auto.
    #[arg(long, default_value = "4")]
    draft_len: DraftLen,
    /// Do not emit the target's bonus token after a fully accepted round.
    #[arg(long)]
    no_bonus: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => {
            use clap::CommandFactory;
            Cli::command().print_help().map_err(anyhow::Error::from)
        }
        Some(Command::Generate(args)) => generate(args),
        Some(Command::Models) => list_models(),
        Some(Command::Bench(args)) => cli_bench::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn fetch_progress_to_stderr() -> impl FnMut(FetchProgress) {
    let mut last_pct = u64::MAX;
    move |p| match p {
        FetchProgress::Message(m) => eprintln!("{m}"),
        FetchProgress::Extracting { done, total } => {
            let pct = done * 100 / total.max(1);
            if pct != last_pct && pct % 10 == 0 {
                eprintln!("extracting model: {pct}%");
                last_pct = pct;
            }
        }
    }
}

/// Load the target, and the draft when `need_draft` (or when one was named).
pub fn load_engine(args: &ModelArgs, need_draft: bool) -> Result<Engine> {
    if let Some(n) = args.threads {
        mentor_lab::set_threads(n);
    }
    let device = mentor_lab::model::default_device();
    let target_path = match &args.target {
        Some(p) => p.clone(),
        None => models::ensure_default_target(&mut fetch_progress_to_stderr())?,
    };
    let target = mentor_lab::load_model(&target_path, args.weights, &device)?;
    let draft: Option<LoadedModel> = match (&args.draft, need_draft) {
        (Some(p), _) => Some(mentor_lab::load_model(p, args.weights, &device)?),
        (None, true) => {
            let p = models::default_draft().context(
                "no draft model: pass --draft PATH, or restore assets/models/ (the default draft ships there)",
            )?;
            Some(mentor_lab::load_model(&p, args.weights, &device)?)
        }
        (None, false) => None,
    };
    Ok(Engine::new(target, draft)?)
}

fn generate(args: GenerateArgs) -> Result<()> {
    let req = GenerateRequest {
        prompt: args.prompt.clone(),
        raw: args.raw,
        sampling: SamplingParams {
            temperature: args.temperature,
            repeat_penalty: args.repeat_penalty,
            repeat_last_n: args.repeat_last_n,
            top_p: args.top_p,
        },
        seed: args.seed,
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        mode: args.mode,
        budget: args.tv_budget,
        rule: args.mentor,
        draft_len: args.draft_len,
        bonus: !args.no_bonus,
    };
    req.validate()?;
    if req.prompt.trim().is_empty() {
        bail!(mentor_lab::EngineError::EmptyPrompt);
    }
    let mut engine = load_engine(&args.models, args.mode != Mode::Target)?;
    let cancel = AtomicBool::new(false);
    let json = args.json;
    let mut stdout = std::io::stdout();
    let generation = engine.generate(&req, &cancel, &mut |ev| {
        if let (GenEvent::Token(t), false) = (ev, json) {
            let _ = write!(stdout, "{}", t.text);
            let _ = stdout.flush();
        }
    })?;
    if json {
        println!("{}", serde_json::to_string(&generation)?);
    } else {
        let s = &generation.stats;
        println!();
        eprintln!(
            "[{} tokens, prompt {} tokens, prefill {:.2}s, decode {:.1} tok/s, e2e {:.2}s, mean target NLL {:.3}{}]",
            s.n_tokens,
            s.n_prompt_tokens,
            s.prefill_s,
            s.decode_tok_s,
            s.e2e_s,
            s.mean_target_nll,
            if generation.mode == Mode::Speculative {
                format!(
                    ", acceptance {:.1}%, τ {:.2}, {} rounds, draft {:.2}s, verify {:.2}s",
                    100.0 * s.acceptance_rate,
                    s.mean_accepted_len,
                    s.n_rounds,
                    s.draft_s,
                    s.verify_s
                )
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

fn list_models() -> Result<()> {
    let files = models::discover_gguf();
    if files.is_empty() {
        println!("No GGUF files found in: {:?}", models::search_dirs());
        return Ok(());
    }
    println!("| file | name | arch | params | quant | vocab | context | size |");
    println!("|---|---|---|---|---|---|---|---|");
    for path in files {
        match mentor_lab::gguf::ModelFile::open(&path) {
            Ok(f) => {
                let i = f.info();
                println!(
                    "| {} | {} | {} | {:.1} M | {} | {} | {} | {:.1} MB |",
                    path.display(),
                    i.name,
                    i.arch,
                    i.n_params as f64 / 1e6,
                    i.quantization,
                    i.n_vocab,
                    i.n_ctx,
                    i.file_size as f64 / 1e6
                );
            }
            Err(e) => println!("| {} | unusable: {e} | | | | | | |", path.display()),
        }
    }
    Ok(())
}
