//! `mentor-lab measure-ui`: see [`mentor_lab::app::measure`].

use super::bench::median;
use anyhow::{bail, Result};
use clap::Args;
use mentor_lab::app::measure::UiMeasurement;
use mentor_lab::app::settings::Settings;
use mentor_lab::{DraftLen, MentorRule};

#[derive(Args)]
pub struct MeasureUiArgs {
    /// A preset (creative, code, qa) or the prompt text itself.
    #[arg(long, default_value = "creative")]
    prompt: String,
    #[arg(long, default_value_t = 256)]
    tokens: usize,
    /// Seeds 0 .. N-1, one comparison (target-only + mentored) each, after one warm-up.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    #[arg(long, default_value_t = 0.75)]
    tv_budget: f64,
    /// Tokens drafted per round: 1..16 or auto.
    #[arg(long, default_value = "8")]
    draft_len: DraftLen,
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// CPU threads (default: all physical cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Draw streamed tokens every this many ms instead of the app's pacing (100 ms, or more where
    /// frames are costly).
    #[arg(long)]
    stream_frame_ms: Option<u64>,
}

pub fn measure_ui(args: MeasureUiArgs) -> Result<()> {
    if let Some(n) = args.threads {
        super::set_threads(n);
    }
    mentor_lab::app::measure::name_compute_threads();
    let settings = settings_for(&args);
    let seeds: Vec<u64> = (0..args.seeds).collect();
    eprintln!(
        "measure-ui: {} comparisons, each run twice in the app's window (drawn as in normal use, and not drawn), after a warm-up pair",
        seeds.len()
    );
    if args.stream_frame_ms == Some(0) {
        bail!("--stream-frame-ms must be at least 1 (leave it out for the app's own pacing)");
    }
    let stream_frame = args.stream_frame_ms.map(std::time::Duration::from_millis);
    let ui = mentor_lab::app::measure::measure_in_window(settings.clone(), seeds.clone(), stream_frame)?;
    if let Some(e) = ui.error {
        bail!("the app reported: {e}");
    }
    if ui.drawn.len() != 2 * seeds.len() || ui.undrawn.len() != 2 * seeds.len() {
        bail!(
            "the window closed after {} drawn and {} undrawn runs of {}",
            ui.drawn.len(),
            ui.undrawn.len(),
            2 * seeds.len()
        );
    }
    print_report(&args, &settings, &ui, stream_frame);
    Ok(())
}

/// The app's settings for the comparisons `args` ask for.
fn settings_for(args: &MeasureUiArgs) -> Settings {
    let prompt =
        mentor_lab::presets::preset(&args.prompt).map(|p| p.prompt.to_string()).unwrap_or_else(|| args.prompt.clone());
    let (adaptive, draft_len) = match args.draft_len {
        DraftLen::Auto => (true, 4),
        DraftLen::Fixed(k) => (false, k),
    };
    Settings {
        prompt,
        max_tokens: args.tokens,
        ignore_eos: true,
        temperature: args.temperature,
        budget: args.tv_budget,
        rule: MentorRule::Tv,
        adaptive,
        draft_len,
        ..Settings::default()
    }
}

fn print_report(
    args: &MeasureUiArgs,
    settings: &Settings,
    ui: &UiMeasurement,
    stream_frame: Option<std::time::Duration>,
) {
    let frame_cpu_ms = median(ui.frame_cpu_s.iter().map(|&s| 1e3 * s as f64).collect());
    println!(
        "measure-ui: {} threads, {} tokens; drawn runs: {} frames in {:.1} s ({:.1} per second), median frame CPU {:.1} ms (UI + painting), streaming frames {}; undrawn runs: {} frames",
        candle_core::utils::get_num_threads(),
        args.tokens,
        ui.frames,
        ui.seconds,
        ui.frames as f64 / ui.seconds.max(1e-9),
        frame_cpu_ms,
        match stream_frame {
            Some(d) => format!("every {} ms (fixed)", d.as_millis()),
            None => format!(
                "paced by their cost ({}-{} ms)",
                mentor_lab::app::engine_thread::STREAM_FRAME.as_millis(),
                mentor_lab::app::engine_thread::MAX_STREAM_FRAME.as_millis()
            ),
        },
        ui.undrawn_frames
    );
    if let Some(cpu) = ui.cpu {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        println!(
            "CPU while the drawn runs streamed: engine threads {:.1} s, everything else (UI thread, GL driver) {:.1} s = {:.1}% of the machine's {} cores over {:.1} s",
            cpu.engine_s,
            cpu.other_s,
            100.0 * cpu.other_s / (cores * ui.seconds.max(1e-9)),
            cores,
            ui.seconds
        );
    }
    println!(
        "| run | drawn, median e2e (s) | not drawn, median e2e (s) | drawn / not drawn (median of paired ratios) |"
    );
    println!("|---|---|---|---|");
    let label = settings.mentored_label();
    for (name, offset) in [("target", 0), (label.as_str(), 1)] {
        let e2e = |records: &[mentor_lab::app::view::RunRecord]| -> Vec<f64> {
            records.iter().skip(offset).step_by(2).map(|r| r.e2e_s).collect()
        };
        let (drawn, undrawn) = (e2e(&ui.drawn), e2e(&ui.undrawn));
        let ratio = median(drawn.iter().zip(&undrawn).map(|(d, u)| d / u).collect());
        println!(
            "| {name} | {:.3} | {:.3} | {ratio:.3} ({:+.1}%) |",
            median(drawn),
            median(undrawn),
            100.0 * (ratio - 1.0)
        );
    }
}
