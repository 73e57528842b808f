//! `mentor-lab measure-ui`: the app's own measurement of a comparison, in the real window, to set
//! against the same requests run without a window (the cost of drawing while tokens stream).
//!
//! The window is a normal Mentor Lab window with the given settings; it runs one warm-up comparison
//! and then one per seed, repainting on every engine event as in normal use, and closes itself.
//! It never reads or writes the user's saved settings and history (no storage).

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
    /// Target-only and mentored record of each measured seed, in order.
    pub records: Vec<RunRecord>,
    /// Frames drawn while the measured comparisons ran, and over how many seconds.
    pub frames: u64,
    pub seconds: f64,
    /// eframe's CPU time of each frame (UI and painting, not the wait for the screen).
    pub frame_cpu_s: Vec<f32>,
    /// CPU seconds the process's threads used while the measured comparisons ran: the engine's
    /// (its thread and the compute pool) and everything else (the UI thread, the GL driver's
    /// threads). None where the platform does not say (Linux only).
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
            let (Ok(name), Ok(stat)) = (std::fs::read_to_string(dir.join("comm")), std::fs::read_to_string(dir.join("schedstat"))) else {
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
}

/// Name prefix of the compute threads (rayon's pool, see [`name_compute_threads`], and the team
/// that runs the CPU forward's parallel sections).
pub use crate::team::COMPUTE_THREAD_PREFIX;

/// Build rayon's global pool (our kernels' threads) with names, so that their CPU time can be told
/// from the UI's. Call before anything computes; harmless if the pool exists already.
pub fn name_compute_threads() {
    let _ = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("{COMPUTE_THREAD_PREFIX}{i}")).build_global();
}

struct Measuring {
    app: MentorApp,
    seeds: Vec<u64>,
    /// Index into `seeds` of the comparison running (None: the warm-up).
    current: Option<usize>,
    /// History length when the running comparison started.
    history_at_start: usize,
    started: bool,
    measured_since: Option<Instant>,
    cpu_at_start: Option<CpuSplit>,
    out: Arc<Mutex<UiMeasurement>>,
}

impl Measuring {
    fn start(&mut self, seed: u64) {
        self.app.settings.seed = seed;
        self.history_at_start = self.app.history.len();
        self.app.queue(UiCommand::Run);
        self.started = true;
    }

    fn finish(&mut self, ctx: &egui::Context, error: Option<String>) {
        if let Ok(mut out) = self.out.lock() {
            out.error = error;
            out.seconds = self.measured_since.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
            out.cpu = match (CpuSplit::now(), self.cpu_at_start) {
                (Some(end), Some(start)) => Some(end.since(start)),
                _ => None,
            };
        }
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }
}

impl eframe::App for Measuring {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        self.app.pace_frames(frame.info().cpu_usage);
        if let Some(cost) = frame.info().cpu_usage {
            if let Ok(mut out) = self.out.lock() {
                out.frame_cpu_s.push(cost);
            }
        }
        self.app.frame_ui(ui);
        if self.measured_since.is_some() {
            if let Ok(mut out) = self.out.lock() {
                out.frames += 1;
            }
        }
        if let Some(e) = self.app.view.error.clone() {
            return self.finish(&ctx, Some(e));
        }
        let models_ready = !self.app.view.models.loading && self.app.view.models.target.is_some();
        if !models_ready {
            return;
        }
        if self.app.view.models.draft.is_none() {
            return self.finish(&ctx, Some("no draft model loaded: measure-ui compares target-only with mentored decoding".into()));
        }
        if !self.started {
            return self.start(WARM_UP_SEED);
        }
        // A comparison adds two history records (target-only, mentored) when it ends.
        if self.app.history.len() < self.history_at_start + 2 {
            return; // the engine's events wake the window, as in normal use
        }
        if let Some(i) = self.current {
            let new = self.app.history[self.history_at_start..].to_vec();
            if let Ok(mut out) = self.out.lock() {
                out.records.extend(new);
            }
            if i + 1 == self.seeds.len() {
                return self.finish(&ctx, None);
            }
            self.current = Some(i + 1);
        } else {
            self.current = Some(0);
            self.measured_since = Some(Instant::now());
            self.cpu_at_start = CpuSplit::now();
        }
        let seed = self.seeds[self.current.unwrap_or(0)];
        self.start(seed);
    }

    fn persist_egui_memory(&self) -> bool {
        false
    }

    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        super::clear_color(visuals)
    }
}

/// Open the window, run the warm-up and one comparison per seed, return what the app measured.
/// `stream_frame`: a fixed wait before streamed tokens are drawn instead of the app's pacing.
pub fn measure_in_window(settings: Settings, seeds: Vec<u64>, stream_frame: Option<std::time::Duration>) -> anyhow::Result<UiMeasurement> {
    if seeds.is_empty() {
        anyhow::bail!("measure-ui needs at least one seed");
    }
    let out = Arc::new(Mutex::new(UiMeasurement::default()));
    let out_app = out.clone();
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_title("Mentor Lab (measuring)").with_inner_size([1400.0, 900.0]),
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
            Ok(Box::new(Measuring { app, seeds, current: None, history_at_start: 0, started: false, measured_since: None, cpu_at_start: None, out: out_app }))
        }),
    )
    .map_err(|e| anyhow::anyhow!("the window could not be opened: {e}"))?;
    let m = out.lock().map_err(|_| anyhow::anyhow!("measurement state poisoned"))?.clone();
    Ok(m)
}
