//! The desktop app. Data flows one way: widget → `UiCommand` (queued, applied once at the end of
//! the frame) → `EngineCommand` on a channel → engine thread → `EngineEvent` on a channel →
//! `ViewState` → drawing. The UI never blocks and never computes model math.

pub mod engine_thread;
mod history;
pub mod measure;
pub mod pair_fetch;
pub mod settings;
pub mod storage;
mod ui_controls;
mod ui_experiment;
mod ui_history;
mod ui_inspector;
pub mod ui_models;
pub mod ui_panes;
pub mod view;

use engine_thread::{EngineCommand, EngineEvent, EngineHandle, FoundModel, ModelChoice, Pane};
use settings::Settings;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use view::{RunRecord, ViewState};

/// Where earlier versions saved settings and history in eframe's storage (read once to migrate).
const SETTINGS_KEY: &str = "mentor-lab.settings";
const HISTORY_KEY: &str = "mentor-lab.history";

/// Native file dialogs, behind a trait so that tests (which have no desktop portal) can answer.
pub trait Dialogs {
    fn open_model(&mut self) -> Option<PathBuf>;
    fn pick_folder(&mut self) -> Option<PathBuf>;
    fn save_file(&mut self, default_name: &str) -> Option<PathBuf>;
}

/// The real dialogs (rfd). On Linux without a desktop portal they return None at once.
pub struct NativeDialogs;

impl Dialogs for NativeDialogs {
    fn open_model(&mut self) -> Option<PathBuf> {
        rfd::FileDialog::new().set_title("Open a GGUF model").add_filter("GGUF model", &["gguf"]).pick_file()
    }
    fn save_file(&mut self, default_name: &str) -> Option<PathBuf> {
        rfd::FileDialog::new().set_title("Export runs").set_file_name(default_name).save_file()
    }
    fn pick_folder(&mut self) -> Option<PathBuf> {
        rfd::FileDialog::new().set_title("A folder to copy from (your code, documents)").pick_folder()
    }
}

/// What widgets ask for; applied in one place at the end of the frame.
#[derive(Debug, Clone, PartialEq)]
pub enum UiCommand {
    Run,
    Stop,
    Sweep,
    Load(ModelChoice),
    OpenTarget,
    OpenDraft,
    /// Choose a folder whose files adaptive rounds copy from; `ClearCorpus` stops.
    PickCorpus,
    ClearCorpus,
    Discover,
    ExportCsv,
    ExportJson,
    ClearHistory,
    /// Run the article's experiment on the current prompt and settings.
    Experiment,
    /// Pin a token in the inspector (its pane and output position).
    Pin(engine_thread::Pane, usize),
    /// Load a built-in pair, fetching it first where it is not on disk.
    LoadPair(crate::pairs::Pair),
}

pub struct MentorApp {
    pub settings: Settings,
    pub history: Vec<RunRecord>,
    pub view: ViewState,
    pub found: Vec<FoundModel>,
    /// The independent and the feature draft shipped in the assets, where both are there (looked
    /// up once: the models bar offers them every frame).
    pub shipped_drafts: Option<(PathBuf, PathBuf)>,
    engine: EngineHandle,
    dialogs: Box<dyn Dialogs>,
    next_run_id: u64,
    cancel: Option<Arc<AtomicBool>>,
    queued: Vec<UiCommand>,
    /// Where the last export went (shown as a confirmation).
    pub last_export: Option<PathBuf>,
    pub show_about: bool,
    /// A built-in pair being fetched, and the pairs whose files are on disk.
    pub pair_fetch: Option<pair_fetch::PairFetch>,
    pub fetched_pairs: Vec<crate::pairs::Pair>,
    /// The window title last sent (it names the loaded pair).
    title: String,
    /// Settings and history on disk; `None` where the app runs without saving (tests).
    pub persist: Option<storage::Persist>,
    /// Frames drawn, and the last sample of the process's CPU time (see [`Self::pace_frames`]).
    frames: u64,
    cpu_sample: Option<(std::time::Instant, measure::CpuSplit, u64)>,
}

impl MentorApp {
    /// An app talking to `engine`; asks it to load the chosen models and to look for others.
    pub fn new(settings: Settings, history: Vec<RunRecord>, engine: EngineHandle, dialogs: Box<dyn Dialogs>) -> Self {
        let mut app = MentorApp {
            settings,
            history,
            view: ViewState::default(),
            found: Vec::new(),
            shipped_drafts: crate::models::default_draft().zip(crate::models::feature_draft()),
            engine,
            dialogs,
            next_run_id: 1,
            cancel: None,
            queued: Vec::new(),
            last_export: None,
            show_about: false,
            pair_fetch: None,
            fetched_pairs: crate::pairs::Pair::ALL.into_iter().filter(|p| p.is_fetched()).collect(),
            title: String::new(),
            persist: None,
            frames: 0,
            cpu_sample: None,
        };
        if !app.settings.copy_from.is_empty() {
            app.send(EngineCommand::ReadCorpus(app.settings.copy_from.clone()));
        }
        app.send(EngineCommand::Load(app.settings.models.clone()));
        app.view.models.loading = true;
        app.send(EngineCommand::Discover);
        app
    }

    /// The eframe entry: restore settings and history (our files in the data directory; eframe's
    /// storage where an earlier version saved them there), start the engine thread.
    pub fn from_creation_context(cc: &eframe::CreationContext<'_>) -> Self {
        let restored = storage::Persist::open(
            &storage::default_dir(),
            || cc.storage.and_then(|s| eframe::get_value(s, SETTINGS_KEY)),
            || cc.storage.and_then(|s| eframe::get_value(s, HISTORY_KEY)),
        );
        panels_by_clearing(&cc.egui_ctx);
        cc.egui_ctx.set_zoom_factor(restored.settings.zoom.clamp(0.5, 3.0));
        let engine = engine_thread::spawn(Some(cc.egui_ctx.clone()));
        let mut app = Self::new(restored.settings, restored.history, engine, Box::new(NativeDialogs));
        app.persist = Some(restored.persist);
        if !restored.notices.is_empty() {
            app.view.error = Some(restored.notices.join(" "));
        }
        app
    }

    /// Write settings and new runs to disk (a no-op without [`Self::persist`]); a failure is
    /// shown in the message line.
    pub fn save_state(&mut self) {
        if let Some(p) = &mut self.persist {
            if let Err(e) = p.save(&self.settings, &self.history) {
                self.view.error = Some(e.to_string());
            }
        }
    }

    /// Tell the engine what a frame costs. eframe's own figure leaves out the GL driver's work at
    /// buffer swap, which under software rendering is most of it (~30 ms of CPU per frame against
    /// eframe's ~5 ms, measured under Xvfb); where the platform reports per-thread CPU time, the
    /// CPU of every thread but the engine's, per frame drawn, is used too (sampled every second).
    pub(crate) fn pace_frames(&mut self, eframe_cpu_s: Option<f32>) {
        self.engine.pacer.record(eframe_cpu_s);
        self.frames += 1;
        let now = std::time::Instant::now();
        if self.cpu_sample.as_ref().is_some_and(|(t, _, _)| now.duration_since(*t).as_secs_f64() < 1.0) {
            return;
        }
        let Some(cpu) = measure::CpuSplit::now() else { return };
        if let Some((_, prev, prev_frames)) = self.cpu_sample {
            let frames = self.frames - prev_frames;
            if frames > 0 {
                self.engine.pacer.record_measured(cpu.since(prev).other_s / frames as f64);
            }
        }
        self.cpu_sample = Some((now, cpu, self.frames));
    }

    fn send(&mut self, cmd: EngineCommand) {
        if self.engine.cmd_tx.send(cmd).is_err() {
            self.view.error =
                Some("the engine thread is gone; restart Mentor Lab (settings and history are saved)".into());
        }
    }

    pub fn queue(&mut self, cmd: UiCommand) {
        self.queued.push(cmd);
    }

    /// Drain engine events into the view state (never blocks).
    pub fn poll_engine(&mut self) {
        self.poll_pair_fetch();
        while let Ok(ev) = self.engine.event_rx.try_recv() {
            if let EngineEvent::Discovered(found) = ev {
                self.found = found;
                continue;
            }
            let sweep_point =
                matches!(&ev, EngineEvent::SweepPoint { run_id, .. } if self.view.sweep.run_id == Some(*run_id));
            if let Some((pane, stats)) = self.view.apply(ev) {
                self.record(pane, &stats);
                if pane == Pane::Mentored {
                    self.record_spend();
                }
            }
            if sweep_point {
                self.record_sweep_point();
            }
        }
    }

    /// Apply the commands queued during this frame.
    pub fn apply_queued(&mut self) {
        for cmd in std::mem::take(&mut self.queued) {
            match cmd {
                UiCommand::Run => self.start_compare(),
                UiCommand::Stop => {
                    if let Some(c) = &self.cancel {
                        c.store(true, Ordering::Relaxed);
                    }
                }
                UiCommand::Sweep => self.start_sweep(),
                UiCommand::Experiment => self.start_experiment(),
                UiCommand::Load(choice) => {
                    self.settings.models = choice.clone();
                    self.view.models.loading = true;
                    self.send(EngineCommand::Load(choice));
                }
                UiCommand::OpenTarget => {
                    if let Some(p) = self.dialogs.open_model() {
                        let choice = ModelChoice { target: Some(p), draft: None, ..self.settings.models.clone() };
                        self.queued.push(UiCommand::Load(choice));
                        self.apply_queued();
                    }
                }
                UiCommand::OpenDraft => {
                    if let Some(p) = self.dialogs.open_model() {
                        let choice = ModelChoice { draft: Some(p), ..self.settings.models.clone() };
                        self.queued.push(UiCommand::Load(choice));
                        self.apply_queued();
                    }
                }
                UiCommand::Discover => self.send(EngineCommand::Discover),
                UiCommand::PickCorpus => {
                    if let Some(folder) = self.dialogs.pick_folder() {
                        self.settings.copy_from = vec![folder];
                        self.send(EngineCommand::ReadCorpus(self.settings.copy_from.clone()));
                    }
                }
                UiCommand::ClearCorpus => {
                    self.settings.copy_from.clear();
                    self.send(EngineCommand::ReadCorpus(Vec::new()));
                }
                UiCommand::ExportCsv => self.export("mentor-lab-runs.csv", view::to_csv(&self.history)),
                UiCommand::ExportJson => {
                    let json = serde_json::to_string_pretty(&self.history)
                        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
                    self.export("mentor-lab-runs.json", json)
                }
                UiCommand::ClearHistory => self.history.clear(),
                UiCommand::Pin(pane, i) => {
                    self.view.pinned = Some((pane, i));
                    self.view.bottom_tab = view::BottomTab::Inspector;
                }
                UiCommand::LoadPair(pair) => self.load_pair(pair),
            }
        }
    }

    fn export(&mut self, name: &str, contents: String) {
        let Some(path) = self.dialogs.save_file(name) else { return };
        match std::fs::write(&path, contents) {
            Ok(()) => self.last_export = Some(path),
            Err(e) => self.view.error = Some(format!("could not write {}: {e}. Pick another folder.", path.display())),
        }
    }

    fn new_run(&mut self) -> (u64, Arc<AtomicBool>) {
        if let Some(c) = &self.cancel {
            c.store(true, Ordering::Relaxed); // a new run supersedes the old one
        }
        let id = self.next_run_id;
        self.next_run_id += 1;
        let cancel = Arc::new(AtomicBool::new(false));
        self.cancel = Some(cancel.clone());
        self.view.error = None;
        (id, cancel)
    }

    fn start_compare(&mut self) {
        if self.settings.prompt.trim().is_empty() {
            self.view.error = Some(crate::EngineError::EmptyPrompt.to_string());
            return;
        }
        let (run_id, cancel) = self.new_run();
        let target_req = self.settings.target_request();
        // Same prompt, seed and sampling as last time: the target-only text would be identical.
        let reuse = self.view.target_request.as_ref() == Some(&target_req)
            && self.view.target.stats.is_some()
            && !self.view.target.cancelled;
        self.view.current_run = Some(run_id);
        self.view.mentored_label = self.settings.mentored_label();
        self.view.mentored = view::PaneView { running: true, ..Default::default() };
        if !reuse {
            self.view.target = view::PaneView { running: true, ..Default::default() };
            self.view.target_request = Some(target_req.clone());
        }
        let mentored = self.settings.mentored_request();
        self.send(EngineCommand::Compare { run_id, target: (!reuse).then_some(target_req), mentored, cancel });
    }

    fn start_sweep(&mut self) {
        let (grid, draft_lens) = match self.settings.sweep_grid() {
            Ok(g) => g,
            Err(e) => {
                self.view.error = Some(e);
                return;
            }
        };
        let (run_id, cancel) = self.new_run();
        let n_seeds = self.settings.sweep_seeds.clamp(1, 20);
        let seeds: Vec<u64> = (0..n_seeds).map(|i| self.settings.seed.wrapping_add(i)).collect();
        let total = seeds.len() * (1 + grid.len() * draft_lens.len());
        self.view.sweep = view::SweepView { run_id: Some(run_id), total, ..Default::default() };
        let base = self.settings.mentored_request();
        let draftings = draft_lens.iter().map(|&len| self.settings.drafting(len)).collect();
        self.send(EngineCommand::Sweep { run_id, base, grid, draftings, seeds, cancel });
    }

    fn start_experiment(&mut self) {
        let (run_id, cancel) = self.new_run();
        let base = self.settings.mentored_request();
        let (seeds, repeats) =
            (self.settings.experiment_seeds.clamp(1, 50), self.settings.experiment_repeats.clamp(1, 20));
        let runs = view::ExperimentView::plan_runs(&base, seeds, repeats);
        self.view.experiment = view::ExperimentView {
            run_id: Some(run_id),
            plan: runs.iter().map(|r| (r.label.clone(), r.repeat, r.req.seed)).collect(),
            results: vec![None; runs.len()],
            models: match self.run_models(true) {
                (t, d) if d.is_empty() => t,
                (t, d) => format!("{t} + {d}"),
            },
        };
        self.view.bottom_tab = view::BottomTab::Experiment;
        self.send(EngineCommand::Experiment { run_id, runs, cancel });
    }

    /// "Mentor Lab — target + draft", with the loaded models' names.
    pub fn window_title(&self) -> String {
        let m = &self.view.models;
        match (&m.target, &m.draft) {
            (Some((t, _)), Some((d, _))) => {
                format!("Mentor Lab — {} + {}", ui_models::short_name(t), ui_models::short_name(d))
            }
            (Some((t, _)), None) => format!("Mentor Lab — {}", ui_models::short_name(t)),
            _ => "Mentor Lab".to_string(),
        }
    }

    /// One frame: events in, widgets drawn, queued commands applied.
    pub fn frame_ui(&mut self, ui: &mut egui::Ui) {
        self.poll_engine();
        let ctx = ui.ctx().clone();
        set_animations(&ctx, !self.view.busy());
        // Cmd/Ctrl + and − zoom (egui's own shortcuts); the factor is kept with the settings.
        let zoom = ctx.zoom_factor();
        if (zoom - self.settings.zoom).abs() > 1e-3 {
            self.settings.zoom = zoom;
        }
        let title = self.window_title();
        if title != self.title {
            ctx.send_viewport_cmd(egui::ViewportCommand::Title(title.clone()));
            self.title = title;
        }
        if ctx.input(|i| i.modifiers.command && i.key_pressed(egui::Key::Enter)) {
            self.queue(UiCommand::Run);
        }
        if ctx.input(|i| i.key_pressed(egui::Key::Escape)) {
            self.queue(UiCommand::Stop);
        }
        if ctx.input(|i| i.modifiers.command && i.key_pressed(egui::Key::O)) {
            self.queue(UiCommand::OpenTarget);
        }
        if self.show_about {
            egui::Window::new("About Mentor Lab").collapsible(false).resizable(false).open(&mut self.show_about).show(
                &ctx,
                |ui| {
                    ui.label(format!("Mentor Lab {}", env!("CARGO_PKG_VERSION")));
                    ui.label("Speculative and mentored decoding, measured live with real GGUF models on the CPU (own quantized kernels; Metal through candle on macOS).");
                    ui.label("Default target: SmolLM2-135M-Instruct (Apache-2.0, Hugging Face).");
                    ui.label("Default draft: distilled from it by this project (Apache-2.0).");
                },
            );
        }
        egui::Panel::top("models").show(ui, |ui| ui_models::models_bar_ui(self, ui));
        egui::Panel::left("controls").default_size(330.0).show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| ui_controls::controls_ui(self, ui));
        });
        // Smaller on a laptop's screen, so the comparison's plots keep their axes above it.
        let history_h = (ui.available_height() * 0.22).clamp(150.0, 200.0);
        let history = egui::Panel::bottom("history")
            .default_size(history_h)
            .resizable(true)
            .show(ui, |ui| ui_history::bottom_ui(self, ui));
        self.view.layout.bottom_panel_top = Some(history.response.rect.top());
        egui::CentralPanel::default().show(ui, |ui| {
            let height = ui.available_height();
            egui::ScrollArea::vertical().id_salt("central").show(ui, |ui| ui_panes::comparison_ui(self, ui, height));
        });
        self.apply_queued();
    }
}

impl eframe::App for MentorApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        self.pace_frames(frame.info().cpu_usage);
        self.frame_ui(ui);
    }

    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        clear_color(visuals)
    }

    /// Settings and history go to our own files ([`storage`]); eframe's storage keeps only what
    /// eframe itself saves (the window's size and place).
    fn save(&mut self, _storage: &mut dyn eframe::Storage) {
        self.save_state();
    }
}

/// Panels are drawn by clearing the window to their colour ([`clear_color`]) instead of each
/// filling its own rectangle. The panels tile the window, so the picture is the same; but where
/// GL runs in software (Mesa's llvmpipe: a Linux box without a GPU, Xvfb) shading every pixel of
/// the panels once more was ~40% of a frame's CPU, taken from the engine while tokens stream.
/// `measure-ui` (Xvfb, 1400 × 900, 2 threads): 26–28 ms of CPU per frame before, 15–17 ms after.
pub fn panels_by_clearing(ctx: &egui::Context) {
    ctx.all_styles_mut(|s| s.visuals.panel_fill = egui::Color32::TRANSPARENT);
}

/// One row of a table whose columns have fixed widths (`widths`, points); `cell(i, ui)` fills
/// column i, left-aligned and cut to its width. The tables of the window are drawn this way rather
/// than with `egui::Grid`: a grid whose cells change size (a value appearing where "–" was, a new
/// row) asks for another frame at once, and while a run streams that frame is drawn on the cores
/// the engine is using — under software GL ~30 ms each, right as the mentored pane starts (seen
/// with `Context::repaint_causes` under `measure-ui`).
pub(crate) fn table_row(ui: &mut egui::Ui, widths: &[f32], striped: bool, mut cell: impl FnMut(usize, &mut egui::Ui)) {
    let height = ui.text_style_height(&egui::TextStyle::Body) + ui.spacing().item_spacing.y;
    let (rect, _) = ui.allocate_exact_size(egui::vec2(widths.iter().sum(), height), egui::Sense::hover());
    if striped {
        ui.painter().rect_filled(rect, 2.0, ui.visuals().faint_bg_color);
    }
    let mut x = rect.min.x;
    for (i, &w) in widths.iter().enumerate() {
        let at = egui::Rect::from_min_size(egui::pos2(x, rect.min.y), egui::vec2(w, height));
        let layout = egui::Layout::left_to_right(egui::Align::Center);
        ui.scope_builder(egui::UiBuilder::new().max_rect(at.shrink2(egui::vec2(2.0, 0.0))).layout(layout), |ui| {
            cell(i, ui)
        });
        x += w;
    }
}

/// The window's clear colour: the panel colour of the theme in use (see [`panels_by_clearing`]).
pub fn clear_color(visuals: &egui::Visuals) -> [f32; 4] {
    let theme = if visuals.dark_mode { egui::Visuals::dark() } else { egui::Visuals::light() };
    theme.panel_fill.to_normalized_gamma_f32()
}

/// Animation length when animations are on: egui's default.
pub fn animation_time() -> f32 {
    egui::Style::default().animation_time
}

/// Animations on or off. While a run streams they are off: as the output panes grow, each
/// scroll bar that appears and each area that shows fades in over several frames drawn back to
/// back, whatever the frame pacing; under `measure-ui` (Xvfb, software GL) those made up about
/// 40% of the frames drawn while tokens streamed. Off, each change is drawn in one frame.
pub(crate) fn set_animations(ctx: &egui::Context, on: bool) {
    let time = if on { animation_time() } else { 0.0 };
    if ctx.global_style().animation_time != time {
        ctx.all_styles_mut(|s| s.animation_time = time);
    }
}

/// Open the window.
pub fn run_app() -> anyhow::Result<()> {
    measure::name_compute_threads();
    let mut last_error = String::new();
    for renderer in renderers_for(std::env::consts::OS) {
        let Some(eframe_renderer) = renderer.to_eframe() else { continue };
        let options = eframe::NativeOptions {
            viewport: main_viewport(),
            persist_window: true,
            renderer: eframe_renderer,
            ..Default::default()
        };
        match eframe::run_native(
            "Mentor Lab",
            options,
            Box::new(|cc| Ok(Box::new(MentorApp::from_creation_context(cc)))),
        ) {
            Ok(()) => return Ok(()),
            Err(e) => {
                eprintln!("mentor-lab: the {renderer:?} renderer could not start ({e}); trying the next one");
                last_error = e.to_string();
            }
        }
    }
    Err(anyhow::anyhow!("the window could not be opened: {last_error}"))
}

/// The main window: titled "Mentor Lab", with the app's icon (eframe's own would show in the
/// Dock and the task bar otherwise).
pub fn main_viewport() -> egui::ViewportBuilder {
    let viewport = egui::ViewportBuilder::default()
        .with_title("Mentor Lab")
        .with_app_id("mentor-lab")
        .with_inner_size([1400.0, 900.0])
        .with_min_inner_size([900.0, 600.0]);
    match app_icon() {
        Some(icon) => viewport.with_icon(icon),
        None => viewport,
    }
}

/// The app's icon (assets/icon.png, compiled in), decoded for the window.
pub fn app_icon() -> Option<egui::IconData> {
    eframe::icon_data::from_png_bytes(include_bytes!("../../assets/icon.png")).ok()
}

/// A way to draw the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UiRenderer {
    /// wgpu: Metal on macOS.
    Wgpu,
    /// OpenGL through glow.
    Glow,
}

impl UiRenderer {
    /// eframe's name for it, where this build has it.
    fn to_eframe(self) -> Option<eframe::Renderer> {
        match self {
            #[cfg(target_os = "macos")]
            UiRenderer::Wgpu => Some(eframe::Renderer::Wgpu),
            #[cfg(not(target_os = "macos"))]
            UiRenderer::Wgpu => None,
            UiRenderer::Glow => Some(eframe::Renderer::Glow),
        }
    }
}

/// Renderers to try, in order, on operating system `os`: on macOS wgpu on Metal first (OpenGL is
/// deprecated there, and eframe apps on glow have crashed after sleep or a display change), glow
/// if it cannot start; elsewhere glow, which software rendering draws fastest.
pub fn renderers_for(os: &str) -> Vec<UiRenderer> {
    match os {
        "macos" => vec![UiRenderer::Wgpu, UiRenderer::Glow],
        _ => vec![UiRenderer::Glow],
    }
}
