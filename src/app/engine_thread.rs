//! The background engine thread: owns the models, takes commands from the UI and answers with
//! events, both over crossbeam channels. It wakes the UI after every event (so the UI never has to
//! poll or repaint continuously), and survives panics: a panic becomes an error event, the models
//! are reloaded and the thread carries on.

mod discover;
mod sweep;

pub use discover::discover;

use crate::engine::{DraftUse, LoadStep, LoadedPair};
use crate::generate::{DraftLen, GenEvent, GenerateRequest, RoundInfo, Stats, TokenInfo};
use crate::gguf::ModelInfo;
use crate::models::FetchProgress;
use crate::Engine;
use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which side of the comparison an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pane {
    Target,
    Mentored,
}

pub use crate::engine::ModelChoice;

/// A GGUF file found on disk, with a fingerprint of its tokenizer so that the UI can offer only
/// drafts that fit the chosen target.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundModel {
    pub info: ModelInfo,
    pub tokenizer_fingerprint: u64,
}

/// One run of an experiment: its configuration's label, which repeat it belongs to, the request.
#[derive(Debug, Clone)]
pub struct ExperimentRun {
    pub label: String,
    pub repeat: usize,
    pub req: GenerateRequest,
}

#[derive(Debug, Clone)]
pub enum EngineCommand {
    Load(ModelChoice),
    /// Look for GGUF files in the usual folders.
    Discover,
    /// Run the target-only request (unless `None`: the UI reuses its last result) and then the
    /// mentored one, same prompt and seed.
    Compare {
        run_id: u64,
        target: Option<GenerateRequest>,
        mentored: GenerateRequest,
        cancel: Arc<AtomicBool>,
    },
    /// Labelled runs one after another, each reported when it ends (the article's experiment:
    /// configurations × seeds × repeats, built by the UI).
    Experiment {
        run_id: u64,
        runs: Vec<ExperimentRun>,
        cancel: Arc<AtomicBool>,
    },
    /// For each seed: target-only, then every (budget, draft length) of the grid on the same prompt.
    Sweep {
        run_id: u64,
        base: GenerateRequest,
        /// (rule, its parameter) points, each run at every draft length.
        grid: Vec<(crate::mentor::MentorRule, f64)>,
        draftings: Vec<crate::generate::Drafting>,
        seeds: Vec<u64>,
        cancel: Arc<AtomicBool>,
    },
    /// Copy from these files too (adaptive rounds; [`crate::corpus`]): read now with the loaded
    /// target's tokenizer, and again after every load. Empty: stop.
    ReadCorpus(Vec<PathBuf>),
    /// Fault injection for the reliability tests: the next streamed run panics at its first
    /// token, as a bug in the engine would, so that the recovery path runs for real.
    #[doc(hidden)]
    PanicInNextRun,
}

#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// Fetching or loading; `fraction` when known.
    Progress {
        message: String,
        fraction: Option<f32>,
    },
    Loaded {
        target: ModelInfo,
        target_weights: String,
        draft: Option<(ModelInfo, String)>,
    },
    Started {
        run_id: u64,
        pane: Pane,
    },
    Token {
        run_id: u64,
        pane: Pane,
        token: TokenInfo,
        t_s: f64,
    },
    Round {
        run_id: u64,
        pane: Pane,
        round: RoundInfo,
        t_s: f64,
    },
    Finished {
        run_id: u64,
        pane: Pane,
        stats: Stats,
        cancelled: bool,
    },
    SweepPoint {
        run_id: u64,
        label: String,
        rule: crate::mentor::MentorRule,
        budget: f64,
        draft_len: DraftLen,
        seed: u64,
        stats: Stats,
    },
    SweepProgress {
        run_id: u64,
        done: usize,
        total: usize,
    },
    /// One experiment run ended; `index` is its place in the command's list.
    ExperimentResult {
        run_id: u64,
        index: usize,
        stats: Stats,
    },
    /// Everything asked for by `run_id` is over (finished, stopped or failed).
    Done {
        run_id: u64,
    },
    Error {
        run_id: Option<u64>,
        message: String,
    },
    Discovered(Vec<FoundModel>),
    /// The corpus was read (its summary), dropped (None), or could not be read (why).
    CorpusRead(Result<Option<String>, String>),
    /// No model is loaded any more (a load failed after the earlier pair was let go).
    Unloaded,
    /// Something the user should know that is not an error (the GPU could not be used).
    Notice(String),
}

/// The UI's end of the engine: send commands, drain events.
pub struct EngineHandle {
    pub cmd_tx: Sender<EngineCommand>,
    pub event_rx: Receiver<EngineEvent>,
    /// The UI reports each frame's cost here; the engine paces its wake-ups by it.
    pub pacer: FramePacer,
}

/// Shortest wait before streamed tokens are drawn (at most 10 frames per second while streaming).
pub const STREAM_FRAME: Duration = Duration::from_millis(100);
/// Longest wait, however costly a frame is (1 frame per second). The engine's threads run each
/// parallel section in step, so a frame drawn on any core stalls all of them: the engine loses
/// about a frame's CPU time per frame, not a share of it. Under software GL a frame costs
/// 15-20 ms of CPU (1400 × 900): every 250 ms, that was ~9% of the engine's time; with the UI
/// thread and the GL driver's threads counted, ~30 ms; with a 500 ms cap the engine lost a
/// noticeable share of its time (`measure-ui` measures it; see docs/performance.md).
pub const MAX_STREAM_FRAME: Duration = Duration::from_millis(1000);
/// While tokens stream, frames are spaced at least this many frame costs apart: drawing takes at
/// most 1/25 = 4% of one core from the engine.
const FRAME_COST_SPACING: u64 = 25;

/// How long streamed tokens wait before they are drawn. On a Mac a frame costs the CPU about a
/// millisecond and tokens are drawn every [`STREAM_FRAME`]; where drawing is expensive (software
/// rendering, a huge window, a slow machine) frames are spaced by their measured cost, so that the
/// UI never takes more than a few percent of the engine's throughput.
#[derive(Clone, Default)]
pub struct FramePacer {
    /// Running average of a frame's CPU time as eframe measures it, µs (0 until measured).
    cost_us: Arc<AtomicU32>,
    /// A frame's CPU time measured over all the UI's threads, µs (0 where unknown).
    measured_us: Arc<AtomicU32>,
    /// A fixed interval instead (ms), for measurements; 0: paced by cost.
    fixed_ms: Arc<AtomicU32>,
    /// Events of a run in progress wake nobody (see [`Self::set_undrawn`]).
    undrawn: Arc<AtomicBool>,
}

impl FramePacer {
    /// Record one frame's CPU time (eframe's `cpu_usage`: the app's UI and the painter's work).
    pub fn record(&self, cpu_s: Option<f32>) {
        let Some(s) = cpu_s.filter(|s| s.is_finite() && *s >= 0.0) else { return };
        let new = (s as f64 * 1e6).min(u32::MAX as f64);
        let old = self.cost_us.load(Ordering::Relaxed) as f64;
        let avg = if old == 0.0 { new } else { 0.8 * old + 0.2 * new };
        self.cost_us.store(avg.round() as u32, Ordering::Relaxed);
    }

    /// Record a frame's CPU time measured over all threads but the engine's (seconds).
    pub fn record_measured(&self, cpu_s: f64) {
        if cpu_s.is_finite() && cpu_s >= 0.0 {
            self.measured_us.store((cpu_s * 1e6).min(u32::MAX as f64).round() as u32, Ordering::Relaxed);
        }
    }

    /// Use a fixed interval (`None`: pace by the measured frame cost).
    pub fn set_fixed(&self, interval: Option<Duration>) {
        let ms = interval.map(|d| d.as_millis().clamp(1, u32::MAX as u128) as u32).unwrap_or(0);
        self.fixed_ms.store(ms, Ordering::Relaxed);
    }

    /// While on, the events of a run in progress do not wake the UI, so nothing is drawn until
    /// the run ends (its end, errors and loading still wake it): `measure-ui`'s runs without
    /// drawing, in the same window and process as the drawn ones.
    pub fn set_undrawn(&self, on: bool) {
        self.undrawn.store(on, Ordering::Relaxed);
    }

    /// When the UI should draw after `ev`: None (not for this event), `Duration::ZERO` (at once)
    /// or after a wait. Tokens and rounds stream at hundreds per second: a frame every 100-1000 ms
    /// ([`Self::interval`]) shows them just as well and leaves the cores to the engine (every
    /// frame costs CPU, and much more where the GPU does not draw). So do the other events of a
    /// run in progress (a pane starting or finishing while the other is still to run, a sweep's
    /// points): drawn at once, each cost two frames while the engine was busy (the second one asked
    /// for by the `egui::Grid`s of that time, whose cells had changed size; see
    /// `app::table_row`). What ends a run, errors and loading are drawn at once.
    pub fn wake_for(&self, ev: &EngineEvent) -> Option<Duration> {
        let mid_run = matches!(
            ev,
            EngineEvent::Token { .. }
                | EngineEvent::Round { .. }
                | EngineEvent::Started { .. }
                | EngineEvent::Finished { .. }
                | EngineEvent::SweepPoint { .. }
                | EngineEvent::SweepProgress { .. }
                | EngineEvent::ExperimentResult { .. }
        );
        match (mid_run, self.undrawn.load(Ordering::Relaxed)) {
            (false, _) => Some(Duration::ZERO),
            (true, false) => Some(self.interval()),
            (true, true) => None,
        }
    }

    /// The wait before streamed tokens are drawn.
    pub fn interval(&self) -> Duration {
        let fixed = self.fixed_ms.load(Ordering::Relaxed);
        if fixed > 0 {
            return Duration::from_millis(fixed as u64);
        }
        let cost_us = self.cost_us.load(Ordering::Relaxed).max(self.measured_us.load(Ordering::Relaxed));
        let paced = Duration::from_micros(cost_us as u64 * FRAME_COST_SPACING);
        paced.clamp(STREAM_FRAME, MAX_STREAM_FRAME)
    }
}

/// Sends events and wakes the UI.
#[derive(Clone)]
struct Outbox {
    tx: Sender<EngineEvent>,
    waker: Option<egui::Context>,
    pacer: FramePacer,
}

impl Outbox {
    fn send(&self, ev: EngineEvent) {
        let wake = self.pacer.wake_for(&ev);
        let _ = self.tx.send(ev);
        match (&self.waker, wake) {
            (Some(ctx), Some(Duration::ZERO)) => ctx.request_repaint(),
            (Some(ctx), Some(after)) => ctx.request_repaint_after(after),
            _ => {}
        }
    }
}

/// Start the engine thread. `waker` is repainted after every event (None in tests that poll).
pub fn spawn(waker: Option<egui::Context>) -> EngineHandle {
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded::<EngineCommand>();
    let (event_tx, event_rx) = crossbeam_channel::unbounded::<EngineEvent>();
    let pacer = FramePacer::default();
    let out = Outbox { tx: event_tx, waker, pacer: pacer.clone() };
    std::thread::Builder::new()
        .name("mentor-engine".into())
        .spawn(move || supervise(cmd_rx, out))
        .map(|_| ())
        .unwrap_or_else(|e| eprintln!("cannot start the engine thread: {e}"));
    EngineHandle { cmd_tx, event_rx, pacer }
}

#[derive(Default)]
struct Worker {
    engine: Option<Engine>,
    last_load: Option<ModelChoice>,
    /// The files adaptive rounds copy from, read again after every load.
    copy_from: Vec<PathBuf>,
    /// The run in progress, so that a panic can be reported against it.
    current_run: Option<u64>,
    /// Set by [`EngineCommand::PanicInNextRun`].
    panic_in_next_run: bool,
}

fn supervise(cmd_rx: Receiver<EngineCommand>, out: Outbox) {
    let mut worker = Worker::default();
    loop {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.serve(&cmd_rx, &out)));
        match result {
            Ok(()) => return, // the UI hung up
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                out.send(EngineEvent::Error {
                    run_id: worker.current_run,
                    message: format!("the engine crashed ({what}) and was restarted; your settings and history are kept. Reloading the models."),
                });
                if let Some(run_id) = worker.current_run.take() {
                    out.send(EngineEvent::Done { run_id });
                }
                worker.engine = None;
                if let Some(choice) = worker.last_load.clone() {
                    worker.load(choice, &out);
                }
            }
        }
    }
}

impl Worker {
    fn serve(&mut self, cmd_rx: &Receiver<EngineCommand>, out: &Outbox) {
        while let Ok(cmd) = cmd_rx.recv() {
            match cmd {
                EngineCommand::Load(choice) => self.load(choice, out),
                EngineCommand::Discover => out.send(EngineEvent::Discovered(discover())),
                EngineCommand::ReadCorpus(paths) => {
                    self.copy_from = paths;
                    self.read_corpus(out);
                }
                EngineCommand::PanicInNextRun => self.panic_in_next_run = true,
                EngineCommand::Compare { run_id, target, mentored, cancel } => {
                    self.current_run = Some(run_id);
                    if let Some(req) = target {
                        self.run_one(run_id, Pane::Target, &req, &cancel, out);
                    }
                    if !cancel.load(Ordering::Relaxed) {
                        self.run_one(run_id, Pane::Mentored, &mentored, &cancel, out);
                    }
                    self.current_run = None;
                    out.send(EngineEvent::Done { run_id });
                }
                EngineCommand::Experiment { run_id, runs, cancel } => {
                    self.current_run = Some(run_id);
                    for (index, run) in runs.iter().enumerate() {
                        if cancel.load(Ordering::Relaxed) {
                            break;
                        }
                        let Some(stats) = self.run_silent(&run.req, &cancel, out, run_id) else { break };
                        out.send(EngineEvent::ExperimentResult { run_id, index, stats });
                    }
                    self.current_run = None;
                    out.send(EngineEvent::Done { run_id });
                }
                EngineCommand::Sweep { run_id, base, grid, draftings, seeds, cancel } => {
                    self.current_run = Some(run_id);
                    self.sweep(run_id, &base, (&grid, &draftings, &seeds), &cancel, out);
                    self.current_run = None;
                    out.send(EngineEvent::Done { run_id });
                }
            }
        }
    }

    fn load(&mut self, choice: ModelChoice, out: &Outbox) {
        let progress = |message: String, fraction: Option<f32>| out.send(EngineEvent::Progress { message, fraction });
        // The loaded pair is let go only once the new target's header, tensor table and tokenizer
        // are sound: a file that was moved, cut short or replaced since it was listed leaves the
        // app with the models it had.
        let mut checked = false;
        let (engine, last_load) = (&mut self.engine, &mut self.last_load);
        let loaded = Engine::load(&choice, DraftUse::IfAvailable, &crate::options::current(), &mut |step| match step {
            LoadStep::Fetch(FetchProgress::Message(m)) => progress(m, None),
            LoadStep::Fetch(FetchProgress::Extracting { done, total }) => {
                if done == total || done % (8 << 20) < (1 << 20) {
                    progress("Extracting the default target…".into(), Some(done as f32 / total.max(1) as f32))
                }
            }
            // Split models are fetched by the app's pair fetch, never by a load.
            LoadStep::Fetch(FetchProgress::Part { .. }) => {}
            LoadStep::Checked => {
                checked = true;
                *last_load = Some(choice.clone());
                *engine = None;
            }
            LoadStep::Loading(path) => progress(format!("Loading {}…", path.display()), None),
            LoadStep::Notice(note) => out.send(EngineEvent::Notice(note)),
        });
        match loaded {
            Err(e) if !checked => self.load_failed(e, out),
            Err(e) => {
                out.send(EngineEvent::Error { run_id: None, message: e.to_string() });
                out.send(EngineEvent::Unloaded);
            }
            Ok(LoadedPair { engine, draft_error }) => {
                if let Some(e) = draft_error {
                    out.send(EngineEvent::Error { run_id: None, message: e.to_string() });
                }
                out.send(EngineEvent::Loaded {
                    target: engine.target.info.clone(),
                    target_weights: engine.target.model.weight_desc.clone(),
                    draft: engine.draft.as_ref().map(|d| (d.info.clone(), d.model.weight_desc.clone())),
                });
                self.engine = Some(engine);
                if !self.copy_from.is_empty() {
                    self.read_corpus(out);
                }
            }
        }
    }

    /// Read `copy_from` with the loaded target's tokenizer (once a target is loaded).
    fn read_corpus(&mut self, out: &Outbox) {
        if let Some(engine) = self.engine.as_mut() {
            out.send(EngineEvent::CorpusRead(engine.read_corpus(&self.copy_from).map_err(|e| e.to_string())));
        }
    }

    /// A load that did not start: say why, and whether the models loaded before are still there.
    fn load_failed(&self, e: crate::EngineError, out: &Outbox) {
        let kept = if self.engine.is_some() { " The models loaded before are still in use." } else { "" };
        out.send(EngineEvent::Error { run_id: None, message: format!("{e}{kept}") });
        if self.engine.is_none() {
            out.send(EngineEvent::Unloaded);
        }
    }

    /// Run one request, streaming its tokens; returns the stats when it ran to the end.
    fn run_one(
        &mut self,
        run_id: u64,
        pane: Pane,
        req: &GenerateRequest,
        cancel: &AtomicBool,
        out: &Outbox,
    ) -> Option<Stats> {
        let Some(engine) = self.engine.as_mut() else {
            out.send(EngineEvent::Error {
                run_id: Some(run_id),
                message: "no model is loaded yet: wait for loading to finish, or pick a model in the top bar.".into(),
            });
            return None;
        };
        out.send(EngineEvent::Started { run_id, pane });
        let start = Instant::now();
        let panic_now = std::mem::take(&mut self.panic_in_next_run);
        let result = engine.generate(req, cancel, &mut |ev| match ev {
            GenEvent::Token(token) => {
                if panic_now {
                    panic!("fault injected at the first token of run {run_id}");
                }
                out.send(EngineEvent::Token { run_id, pane, token, t_s: start.elapsed().as_secs_f64() })
            }
            GenEvent::Round(round) => {
                out.send(EngineEvent::Round { run_id, pane, round, t_s: start.elapsed().as_secs_f64() })
            }
            GenEvent::Prefilled { .. } => {}
        });
        match result {
            Ok(g) => {
                out.send(EngineEvent::Finished { run_id, pane, stats: g.stats.clone(), cancelled: g.cancelled });
                (!g.cancelled).then_some(g.stats)
            }
            Err(e) => {
                out.send(EngineEvent::Error { run_id: Some(run_id), message: e.to_string() });
                None
            }
        }
    }

    /// A run whose tokens are not streamed (sweeps only plot the end result).
    fn run_silent(&mut self, req: &GenerateRequest, cancel: &AtomicBool, out: &Outbox, run_id: u64) -> Option<Stats> {
        let engine = self.engine.as_mut()?;
        match engine.generate(req, cancel, &mut |_| {}) {
            Ok(g) if !g.cancelled => Some(g.stats),
            Ok(_) => None,
            Err(e) => {
                out.send(EngineEvent::Error { run_id: Some(run_id), message: e.to_string() });
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_frames_are_spaced_by_their_cost_within_bounds() {
        let p = FramePacer::default();
        assert_eq!(p.interval(), STREAM_FRAME, "nothing measured yet");
        p.record(Some(0.001));
        assert_eq!(p.interval(), STREAM_FRAME, "a 1 ms frame is drawn every 100 ms");
        let p = FramePacer::default();
        for _ in 0..50 {
            p.record(Some(0.008));
        }
        assert_eq!(p.interval(), Duration::from_millis(200), "8 ms frames: 25 frame costs apart");
        for _ in 0..50 {
            p.record(Some(0.5));
        }
        assert_eq!(p.interval(), MAX_STREAM_FRAME, "never slower than 1 frame per second");
        let before = p.interval();
        p.record(Some(f32::NAN));
        p.record(Some(-1.0));
        p.record(None);
        assert_eq!(p.interval(), before, "unusable measurements are ignored");
        let p2 = FramePacer::default();
        p2.record(Some(0.002));
        p2.record_measured(0.006);
        assert_eq!(p2.interval(), Duration::from_millis(150), "the larger of the two measures counts");
        p2.record_measured(f64::NAN);
        assert_eq!(p2.interval(), Duration::from_millis(150));
        p.set_fixed(Some(Duration::from_millis(40)));
        assert_eq!(p.interval(), Duration::from_millis(40));
        p.set_fixed(None);
        assert_eq!(p.interval(), MAX_STREAM_FRAME);
    }

    #[test]
    fn a_run_in_progress_is_drawn_paced_and_its_end_at_once() {
        let p = FramePacer::default();
        p.set_fixed(Some(Duration::from_millis(120)));
        let started = EngineEvent::Started { run_id: 1, pane: Pane::Target };
        let round = EngineEvent::Round {
            run_id: 1,
            pane: Pane::Mentored,
            round: RoundInfo {
                index: 0,
                n_proposed: 4,
                n_accepted: 2,
                n_emitted: 3,
                draft_s: 0.01,
                verify_s: 0.02,
                n_copied: 0,
            },
            t_s: 0.1,
        };
        let progress = EngineEvent::SweepProgress { run_id: 1, done: 1, total: 4 };
        let done = EngineEvent::Done { run_id: 1 };
        let error = EngineEvent::Error { run_id: Some(1), message: "x".into() };
        for ev in [&started, &round, &progress] {
            assert_eq!(p.wake_for(ev), Some(Duration::from_millis(120)), "{ev:?}");
        }
        for ev in [&done, &error] {
            assert_eq!(p.wake_for(ev), Some(Duration::ZERO), "{ev:?}");
        }
        p.set_undrawn(true);
        for ev in [&started, &round, &progress] {
            assert_eq!(p.wake_for(ev), None, "undrawn: {ev:?}");
        }
        assert_eq!(p.wake_for(&done), Some(Duration::ZERO), "the end of an undrawn run still wakes the UI");
        p.set_undrawn(false);
        assert_eq!(p.wake_for(&round), Some(Duration::from_millis(120)));
    }
}
