//! `mentor-lab`: with no arguments, the desktop app; otherwise a command-line front end to the
//! same engine (the commands live in `cli/`).

use clap::{Parser, Subcommand};

mod cli;

#[derive(Parser)]
#[command(
    name = "mentor-lab",
    version,
    about = "Speculative and mentored decoding, measured live. No subcommand opens the app."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (target-only, draft-only or speculative).
    Generate(cli::generate::GenerateArgs),
    /// List the GGUF models found on disk.
    Models,
    /// The tokens a draft's output head is restricted to, counted from a corpus of your text.
    HeadTokens(cli::head_tokens::HeadTokensArgs),
    /// The target's top-K next-token log-probabilities over given answers (data to distil a draft from).
    TeacherData(cli::teacher::TeacherArgs),
    /// Fetch a built-in pair's models (`default`, `qwen-coder`): resumable, checked, atomic.
    Fetch(cli::fetch::FetchArgs),
    /// Time configurations against target-only: warm-up, repeats × seeds, medians (the article's method).
    Bench(cli::bench::BenchArgs),
    /// How close the draft is to the target: 1 − TV, greedy agreement, relative cost.
    EvalDraft(cli::models::EvalArgs),
    /// Decode / prefill speed and the cost of a forward over k tokens relative to one step.
    Cost(cli::cost::CostArgs),
    /// Write a GGUF with random weights in the shape and quantization mix of a model people run
    /// (for timing Mentor Lab and llama.cpp on the same file).
    RandomModel(cli::random::RandomModelArgs),
    /// What drawing costs while tokens stream: the app's own timing of comparisons in its real
    /// window (default models) against the same requests run without a window.
    MeasureUi(cli::measure_ui::MeasureUiArgs),
}

fn main() -> std::process::ExitCode {
    cli::init_threads();
    let cli = Cli::parse();
    let result = match cli.command {
        None => mentor_lab::app::run_app(),
        Some(Command::Generate(args)) => cli::generate::generate(args),
        Some(Command::Models) => cli::models::list_models(),
        Some(Command::Fetch(args)) => cli::fetch::fetch(args),
        Some(Command::HeadTokens(args)) => cli::head_tokens::head_tokens(args),
        Some(Command::TeacherData(args)) => cli::teacher::teacher_data(args),
        Some(Command::Bench(args)) => cli::bench::run(args),
        Some(Command::EvalDraft(args)) => cli::models::eval_draft(args),
        Some(Command::Cost(args)) => cli::cost::cost(args),
        Some(Command::RandomModel(args)) => cli::random::random_model(args),
        Some(Command::MeasureUi(args)) => cli::measure_ui::measure_ui(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
