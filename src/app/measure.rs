//! `mentor-lab measure-ui`: what drawing costs the engine while tokens stream, as the app itself
//! measures it.
//!
//! One normal Mentor Lab window with the given settings runs each comparison (target-only +
//! mentored, one seed) twice, back to back: once drawn as in normal use (repainting on the
//! engine's events, paced as always) and once not drawn (the engine's events of the run wake
//! nobody, so the window stays idle until the run ends). Same window, engine, models and memory;
//! the order alternates from seed to seed, and a drift in the machine's speed moves both runs of a pair
//! together. One warm-up pair comes first. The window closes itself, and it never reads or writes
//! the user's saved settings and history (no storage).

use super::engine_thread;
use super::settings::Settings;
use super::view::RunRecord;
use super::{MentorApp, NativeDialogs, UiCommand};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Seed of the warm-up comparison (not reported; another seed than the measured ones, so the
/// first measured comparison runs its target-only pass instead of reusing the warm-up's).
pub const WARM_UP_SEED: u64 = 1_000_003;

/// What the window measured.
#[derive(Debug, Default, Clone)]
pub struct UiMeasurement {
    /// Target-only and mentored record of each measured seed, drawn, in seed order.
    pub drawn: Vec<RunRecord>,
    /// The same, not drawn.
    pub undrawn: Vec<RunRecord>,
    /// Frames drawn while the measured drawn comparisons ran, and over how many seconds.
    pub frames: u64,
    pub seconds: f64,
    /// Frames drawn while the measured undrawn comparisons ran (nothing asks for any).
    pub undrawn_frames: u64,
    /// eframe's CPU time of each frame of the drawn comparisons (UI and painting, not the wait
    /// for the screen).
    pub frame_cpu_s: Vec<f32>,
    /// CPU seconds the process's threads used while the measured drawn comparisons ran: the
    /// engine's (its thread and the compute pool) and everything else (the UI thread, the GL
    /// driver's threads). None where the platform does not say (Linux only).
    pub cpu: Option<CpuSplit>,
    pub error: Option<String>,
}

/// CPU seconds used by the engine's threads and by all others.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuSplit {
    pub engine_s: f64,
    pub other_s: f64,
}

impl CpuSplit {
    /// CPU time of this process's threads so far, split by thread name: the engine thread
    /// (`mentor-engine`) and the compute pool ([`COMPUTE_THREAD_PREFIX`]) against the rest.
    /// Linux: `/proc/self/task/*/schedstat` (nanoseconds on the CPU).
    pub fn now() -> Option<CpuSplit> {
        let mut split = CpuSplit::default();
        for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let dir = task.path();
            let (Ok(name), Ok(stat)) =
                (std::fs::read_to_string(dir.join("comm")), std::fs::read_to_string(dir.join("schedstat")))
            else {
                continue; // the thread ended meanwhile
            };
            let Some(ns) = stat.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
            let name = name.trim();
            if name == "mentor-engine" || name.starts_with(COMPUTE_THREAD_PREFIX) {
                split.engine_s += ns * 1e-9;
            } else {
                split.other_s += ns * 1e-9;
            }
        }
        Some(split)
    }

    pub fn since(self, start: CpuSplit) -> CpuSplit {
        CpuSplit { engine_s: self.engine_s - start.engine_s, other_s: self.other_s - start.other_s }
    }

    fn plus(self, other: CpuSplit) -> CpuSplit {
        CpuSplit { engine_s: self.engine_s + other.engine_s, other_s: self.other_s + other.other_s }
    }
}

/// Name prefix of the compute threads (rayon's pool, see [`name_compute_threads`], and the team
/// that runs the CPU forward's parallel sections).
pub use crate::team::COMPUTE_THREAD_PREFIX;

/// Build rayon's global pool (our kernels' threads) with names, so that their CPU time can be told
/// from the UI's. Call before anything computes; harmless if the pool exists already.
pub fn name_compute_threads() {
    let _ = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("{COMPUTE_THREAD_PREFIX}{i}")).build_global();
}

/// One comparison of the plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub seed: u64,
    pub drawn: bool,
    /// False for the warm-up pair.
    pub measured: bool,
}

/// The comparisons `measure-ui` runs, in order: a warm-up pair, then a drawn and an undrawn run
/// of each seed, drawn first for even positions and last for odd ones.
pub fn plan(seeds: &[u64]) -> Vec<Step> {
    let mut steps = vec![
        Step { seed: WARM_UP_SEED, drawn: true, measured: false },
        Step { seed: WARM_UP_SEED, drawn: false, measured: false },
    ];
    for (i, &seed) in seeds.iter().enumerate() {
        let drawn_first = i % 2 == 0;
        steps.push(Step { seed, drawn: drawn_first, measured: true });
        steps.push(Step { seed, drawn: !drawn_first, measured: true });
    }
    steps
}

struct Measuring {
    app: MentorApp,
    plan: std::collections::VecDeque<Step>,
    /// The comparison running, the history length and the time and CPU when it started.
    current: Option<(Step, usize, Instant, Option<CpuSplit>)>,
    /// Done (or failed): the window is closing; frames drawn meanwhile change nothing.
    closing: bool,
    out: Arc<Mutex<UiMeasurement>>,
}

impl Measuring {
    fn start_next(&mut self, ctx: &egui::Context) {
        self.current = None;
        let Some(step) = self.plan.pop_front() else {
            return self.finish(ctx, None);
        };
        self.app.settings.seed = step.seed;
        // Both runs of a pair compute their target-only text (the app would reuse the first).
        self.app.view.target_request = None;
        self.app.engine.pacer.set_undrawn(!step.drawn);
        self.current = Some((step, self.app.history.len(), Instant::now(), CpuSplit::now()));
        self.app.queue(UiCommand::Run);
    }

    /// The running comparison ended (its two records are in the history).
    fn record(&mut self, step: Step, history_at_start: usize, started: Instant, cpu_at_start: Option<CpuSplit>) {
        if !step.measured {
            return;
        }
        let new = self.app.history[history_at_start..].to_vec();
        let cpu = match (CpuSplit::now(), cpu_at_start) {
            (Some(end), Some(start)) => Some(end.since(start)),
            _ => None,
        };
        if let Ok(mut out) = self.out.lock() {
            if step.drawn {
                out.drawn.extend(new);
                out.seconds += started.elapsed().as_secs_f64();
                out.cpu = out.cpu.zip(cpu).map(|(total, c)| total.plus(c));
            } else {
                out.undrawn.extend(new);
            }
        }
    }

    fn finish(&mut self, ctx: &egui::Context, error: Option<String>) {
        self.closing = true;
        self.app.engine.pacer.set_undrawn(false);
        if let Ok(mut out) = self.out.lock() {
            out.error = error;
        }
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }
}

impl eframe::App for Measuring {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        if self.closing {
            return;
        }
        self.app.pace_frames(frame.info().cpu_usage);
        if let Some((step, ..)) = self.current.filter(|(s, ..)| s.measured) {
            if let Ok(mut out) = self.out.lock() {
                if step.drawn {
                    out.frames += 1;
                    out.frame_cpu_s.extend(frame.info().cpu_usage);
                } else {
                    out.undrawn_frames += 1;
                }
            }
        }
        self.app.frame_ui(ui);
        if let Some(e) = self.app.view.error.clone() {
            return self.finish(&ctx, Some(e));
        }
        let models_ready = !self.app.view.models.loading && self.app.view.models.target.is_some();
        if !models_ready {
            return;
        }
        if self.app.view.models.draft.is_none() {
            return self.finish(
                &ctx,
                Some("no draft model loaded: measure-ui compares target-only with mentored decoding".into()),
            );
        }
        match self.current {
            None => self.start_next(&ctx),
            // A comparison adds two history records (target-only, mentored) when it ends.
            Some((step, at_start, started, cpu)) if self.app.history.len() >= at_start + 2 => {
                self.record(step, at_start, started, cpu);
                self.start_next(&ctx);
            }
            Some(_) => {} // the engine's events wake the window, as in normal use
        }
    }

    fn persist_egui_memory(&self) -> bool {
        false
    }

    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        super::clear_color(visuals)
    }
}

/// Open the window, run the comparisons of [`plan`], return what the app measured.
/// `stream_frame`: a fixed wait before streamed tokens are drawn instead of the app's pacing.
pub fn measure_in_window(
    settings: Settings,
    seeds: Vec<u64>,
    stream_frame: Option<std::time::Duration>,
) -> anyhow::Result<UiMeasurement> {
    if seeds.is_empty() {
        anyhow::bail!("measure-ui needs at least one seed");
    }
    // CPU totals start at zero where the platform reports per-thread CPU time.
    let out = Arc::new(Mutex::new(UiMeasurement {
        cpu: CpuSplit::now().map(|_| CpuSplit::default()),
        ..UiMeasurement::default()
    }));
    let out_app = out.clone();
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("Mentor Lab (measuring)")
            .with_inner_size([1400.0, 900.0]),
        persist_window: false,
        ..Default::default()
    };
    eframe::run_native(
        "Mentor Lab measure-ui",
        options,
        Box::new(move |cc| {
            super::panels_by_clearing(&cc.egui_ctx);
            let engine = engine_thread::spawn(Some(cc.egui_ctx.clone()));
            engine.pacer.set_fixed(stream_frame);
            let app = MentorApp::new(settings, Vec::new(), engine, Box::new(NativeDialogs));
            Ok(Box::new(Measuring { app, plan: plan(&seeds).into(), current: None, closing: false, out: out_app }))
        }),
    )
    .map_err(|e| anyhow::anyhow!("the window could not be opened: {e}"))?;
    let m = out.lock().map_err(|_| anyhow::anyhow!("measurement state poisoned"))?.clone();
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_pairs_each_seed_drawn_and_undrawn_in_alternating_order() {
        let p = plan(&[5, 6, 7]);
        assert_eq!(p.len(), 8);
        assert!(p[..2].iter().all(|s| s.seed == WARM_UP_SEED && !s.measured), "{p:?}");
        assert_ne!(p[0].drawn, p[1].drawn);
        let measured: Vec<(u64, bool)> = p[2..].iter().map(|s| (s.seed, s.drawn)).collect();
        assert_eq!(measured, vec![(5, true), (5, false), (6, false), (6, true), (7, true), (7, false)]);
        assert!(p[2..].iter().all(|s| s.measured));
    }
}
