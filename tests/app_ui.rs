//! The app's UI with no display: egui_kittest drives the real widgets; the engine side is a
//! scripted stream of events on the same channels the engine thread uses. Not built on aarch64
//! Linux, where egui_kittest is not a dependency (Cargo.toml).
#![cfg(not(all(target_arch = "aarch64", target_os = "linux")))]

use crossbeam_channel::{Receiver, Sender};
use egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use mentor_lab::app::engine_thread::{EngineCommand, EngineEvent, EngineHandle, Pane};
use mentor_lab::app::settings::Settings;
use mentor_lab::app::view::RunRecord;
use mentor_lab::app::{Dialogs, MentorApp};
use mentor_lab::generate::{DraftLen, RoundInfo, Stats, TokenInfo, TokenSource, TopEntry};
use mentor_lab::Coupling;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// Answers file dialogs the way a user would, from a script.
struct ScriptedDialogs {
    open: Vec<PathBuf>,
    save: Option<PathBuf>,
}

impl Dialogs for ScriptedDialogs {
    fn open_model(&mut self) -> Option<PathBuf> {
        self.open.pop()
    }
    fn save_file(&mut self, _name: &str) -> Option<PathBuf> {
        self.save.clone()
    }
}

struct Rig {
    cmd_rx: Receiver<EngineCommand>,
    event_tx: Sender<EngineEvent>,
}

impl Rig {
    /// Commands the UI sent since the last call, skipping model loading and discovery.
    fn commands(&self) -> Vec<EngineCommand> {
        self.cmd_rx.try_iter().filter(|c| !matches!(c, EngineCommand::Load(_) | EngineCommand::Discover)).collect()
    }
    fn send(&self, ev: EngineEvent) {
        self.event_tx.send(ev).unwrap();
    }
}

fn app_with(settings: Settings, dialogs: ScriptedDialogs) -> (MentorApp, Rig) {
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
    let (event_tx, event_rx) = crossbeam_channel::unbounded();
    let app = MentorApp::new(
        settings,
        Vec::new(),
        EngineHandle { cmd_tx, event_rx, pacer: Default::default() },
        Box::new(dialogs),
    );
    (app, Rig { cmd_rx, event_tx })
}

fn harness(app: MentorApp) -> Harness<'static, MentorApp> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 1000.0))
        .build_ui_state(|ui, app: &mut MentorApp| app.frame_ui(ui), app)
}

fn no_dialogs() -> ScriptedDialogs {
    ScriptedDialogs { open: Vec::new(), save: None }
}

fn token(id: u32, text: &str, source: TokenSource, round: usize) -> TokenInfo {
    let spec = source != TokenSource::Target;
    TokenInfo {
        id,
        text: text.into(),
        pos: 0,
        source,
        p_target: Some(0.412),
        q_draft: spec.then_some(0.53),
        pi_mixed: spec.then_some(0.47),
        accept_prob: spec.then_some(0.887),
        tv: spec.then_some(0.31),
        theta: spec.then_some(1.0),
        round: spec.then_some(round),
        nll: Some(1.5 + id as f64),
        drafted: spec.then_some(id + 100),
        offers: if spec { vec![id + 200] } else { Vec::new() },
        top: inspector_rows(id, text, spec),
    }
}

/// The inspector's rows of a scripted token: itself first, then two others.
fn inspector_rows(id: u32, text: &str, spec: bool) -> Vec<TopEntry> {
    [(id, text.to_string(), 0.412), (id + 100, format!("alt{id}"), 0.2), (id + 200, format!("other{id}"), 0.1)]
        .into_iter()
        .map(|(id, text, p)| TopEntry {
            id,
            text,
            p_target: Some(p),
            q_draft: spec.then_some(p / 2.0),
            pi_mixed: spec.then_some(p * 0.75),
        })
        .collect()
}

fn stats(e2e: f64, nll: f64) -> Stats {
    Stats {
        n_tokens: 5,
        e2e_s: e2e,
        mean_target_nll: nll,
        n_rounds: 2,
        n_drafted: 8,
        n_accepted: 6,
        acceptance_rate: 0.75,
        mean_accepted_len: 2.5,
        mean_tv: 0.2,
        ..Stats::default()
    }
}

/// A complete comparison for `run_id`: target text, then mentored text with every provenance.
fn script_run(rig: &Rig, run_id: u64) {
    rig.send(EngineEvent::Started { run_id, pane: Pane::Target });
    for (i, w) in ["The", " moon", " glowed", " softly", "."].iter().enumerate() {
        rig.send(EngineEvent::Token {
            run_id,
            pane: Pane::Target,
            token: token(i as u32, w, TokenSource::Target, 0),
            t_s: 0.1 * (i + 1) as f64,
        });
    }
    rig.send(EngineEvent::Finished { run_id, pane: Pane::Target, stats: stats(0.5, 1.9), cancelled: false });
    rig.send(EngineEvent::Started { run_id, pane: Pane::Mentored });
    let m = [
        (0, "The", TokenSource::DraftAccepted, 0),
        (1, " moon", TokenSource::DraftAccepted, 0),
        (7, " shone", TokenSource::Resampled, 0),
        (8, " bright", TokenSource::DraftAccepted, 1),
        (4, ".", TokenSource::Bonus, 1),
    ];
    for (i, (id, w, s, r)) in m.iter().enumerate() {
        rig.send(EngineEvent::Token {
            run_id,
            pane: Pane::Mentored,
            token: token(*id, w, *s, *r),
            t_s: 0.05 * (i + 1) as f64,
        });
    }
    for index in 0..2 {
        let round = RoundInfo {
            index,
            n_proposed: 4,
            n_accepted: 3 - index,
            n_emitted: 3,
            draft_s: 0.01,
            verify_s: 0.02,
            n_copied: 0,
        };
        rig.send(EngineEvent::Round { run_id, pane: Pane::Mentored, round, t_s: 0.1 * (index + 1) as f64 });
    }
    rig.send(EngineEvent::Finished { run_id, pane: Pane::Mentored, stats: stats(0.25, 2.4), cancelled: false });
    rig.send(EngineEvent::Done { run_id });
}

/// The app with default settings after Run was pressed: the harness, the engine's rig and the
/// run id of the Compare command sent.
fn run_pressed() -> (Harness<'static, MentorApp>, Rig, u64) {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (run_id, ..) = compare_of(rig.commands());
    (h, rig, run_id)
}

fn compare_of(
    cmds: Vec<EngineCommand>,
) -> (
    u64,
    Option<mentor_lab::GenerateRequest>,
    mentor_lab::GenerateRequest,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let compares: Vec<_> = cmds
        .into_iter()
        .filter_map(|c| match c {
            EngineCommand::Compare { run_id, target, mentored, cancel } => Some((run_id, target, mentored, cancel)),
            _ => None,
        })
        .collect();
    assert_eq!(compares.len(), 1, "exactly one Compare command");
    compares.into_iter().next().unwrap()
}

#[test]
fn sliders_change_what_the_next_run_sends() {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.run_steps(2);
    let before = h.state().settings.clone();
    for label in ["TV budget", "Draft length", "Temperature", "Repetition penalty", "Max tokens"] {
        h.get_by_role_and_label(Role::Slider, label).focus();
        h.run_steps(1);
        for _ in 0..3 {
            h.key_press(egui::Key::ArrowRight);
            h.run_steps(1);
        }
    }
    // Top-p starts at its maximum: move it down.
    h.get_by_role_and_label(Role::Slider, "Top-p").focus();
    h.run_steps(1);
    h.key_press(egui::Key::ArrowLeft);
    h.run_steps(1);
    let s = h.state().settings.clone();
    assert!(s.budget > before.budget, "TV budget {} → {}", before.budget, s.budget);
    assert!(s.draft_len > before.draft_len);
    assert!(s.temperature > before.temperature);
    assert!(s.repeat_penalty > before.repeat_penalty);
    assert!(s.top_p < before.top_p);
    assert!(s.max_tokens > before.max_tokens);
    h.get_by_label("adaptive draft length").click();
    h.get_by_label("KL").click();
    h.get_by_label("bonus token after a fully accepted round").click();
    h.get_by_label("ignore end of sequence").click();
    h.get_by_label("max acceptance").click();
    h.run_steps(2);
    rig.commands();
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (_, target, mentored, _) = compare_of(rig.commands());
    let target = target.expect("first run computes the target-only pane");
    assert!((mentored.budget - s.budget).abs() < 1e-12);
    assert_eq!(mentored.draft_len, DraftLen::Auto);
    assert_eq!(mentored.rule, mentor_lab::MentorRule::Kl);
    assert!(!mentored.bonus);
    assert!(mentored.ignore_eos && target.ignore_eos);
    assert_eq!(mentored.sampling, target.sampling, "both panes use the same sampling settings");
    assert_eq!(mentored.seed, target.seed);
    // Both panes draw with the coupling chosen (target-only's draws depend on it too).
    assert_eq!((mentored.coupling, target.coupling), (Coupling::MaxAcceptance, Coupling::MaxAcceptance));
    assert_eq!(mentored.sampling.temperature, s.temperature);
    assert_eq!(mentored.sampling.repeat_penalty, s.repeat_penalty);
    assert_eq!(mentored.sampling.top_p, s.top_p);
    assert_eq!(mentored.max_tokens, s.max_tokens);
}

#[test]
fn run_and_stop_send_the_right_commands() {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.run_steps(2);
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (run_id, target, mentored, cancel) = compare_of(rig.commands());
    assert!(target.is_some());
    assert_eq!(mentored.mode, mentor_lab::Mode::Speculative);
    assert!(h.state().view.busy());
    assert_eq!(h.ctx.global_style().animation_time, 0.0, "no animations while a run streams");
    assert!(!cancel.load(Ordering::Relaxed));
    h.get_by_label("Stop").click();
    h.run_steps(2);
    assert!(cancel.load(Ordering::Relaxed), "Stop cancels the run in flight");
    rig.send(EngineEvent::Done { run_id });
    h.run_steps(2);
    assert!(!h.state().view.busy());
    assert!(mentor_lab::app::animation_time() > 0.0);
    assert_eq!(
        h.ctx.global_style().animation_time,
        mentor_lab::app::animation_time(),
        "animations are back when it ends"
    );
    // Keyboard: Ctrl/Cmd+Enter runs, Esc stops.
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::Enter);
    h.run_steps(2);
    let (_, _, _, cancel) = compare_of(rig.commands());
    h.key_press(egui::Key::Escape);
    h.run_steps(2);
    assert!(cancel.load(Ordering::Relaxed));
}

#[test]
fn scripted_stream_renders_tokens_with_provenance_and_hover() {
    let (mut h, rig, run_id) = run_pressed();
    script_run(&rig, run_id);
    h.run_steps(3);
    let view = &h.state().view;
    assert_eq!(view.target.text(), "The moon glowed softly.");
    assert_eq!(view.mentored.text(), "The moon shone bright.");
    let sources: Vec<_> = view.mentored.tokens.iter().map(|t| t.source).collect();
    assert_eq!(
        sources,
        [
            TokenSource::DraftAccepted,
            TokenSource::DraftAccepted,
            TokenSource::Resampled,
            TokenSource::DraftAccepted,
            TokenSource::Bonus
        ]
    );
    assert_eq!(view.divergence(), Some(2));
    // The provenance colours are distinct and exist in both themes; target tokens are plain.
    use mentor_lab::app::ui_panes::source_color;
    for dark in [true, false] {
        let c: Vec<_> = [TokenSource::DraftAccepted, TokenSource::Resampled, TokenSource::Bonus]
            .iter()
            .map(|&s| source_color(s, dark).unwrap())
            .collect();
        assert!(c[0] != c[1] && c[1] != c[2] && c[0] != c[2]);
        assert!(source_color(TokenSource::Target, dark).is_none());
    }
    // Each token is its own widget; hovering shows the numbers behind it.
    h.get_by_label(" shone").hover();
    h.run_steps(45); // past the tooltip delay
    h.get_by_label_contains("(id 7) · resampled after a rejection");
    h.get_by_label_contains("q(x) = 0.5300");
    h.get_by_label_contains("accept prob = 0.8870");
    h.get_by_label_contains("θ = 1.0000");
    // The legend and the stats are shown.
    h.get_by_label_contains("draft token, accepted");
    assert_eq!(h.query_all_by_label("2.00×").count(), 2, "speedup in the stats and in the runs table");
    // The finished runs are in the history: target-only and mentored.
    let hist = &h.state().history;
    assert_eq!(hist.len(), 2);
    assert_eq!(hist[0].config, "target");
    assert!((hist[1].speedup - 2.0).abs() < 1e-9);
}

#[test]
fn engine_errors_show_and_the_app_stays_usable() {
    let (mut h, rig, run_id) = run_pressed();
    rig.send(EngineEvent::Error { run_id: Some(run_id), message: "the prompt is empty: type a prompt".into() });
    rig.send(EngineEvent::Done { run_id });
    h.run_steps(2);
    h.get_by_label_contains("the prompt is empty");
    assert!(!h.state().view.busy());
    // A load error (no run) shows too, and Run still works afterwards.
    rig.send(EngineEvent::Error { run_id: None, message: "model file not found: /x.gguf".into() });
    h.run_steps(2);
    h.get_by_label_contains("model file not found");
    h.get_by_label("Dismiss").click();
    h.run_steps(2);
    assert!(h.state().view.error.is_none());
    h.get_by_label("Run").click();
    h.run_steps(2);
    compare_of(rig.commands());
    // An empty prompt is caught before anything is sent.
    rig.send(EngineEvent::Done { run_id: run_id + 1 });
    h.run_steps(2);
    h.state_mut().settings.prompt = "   ".into();
    assert!(!h.state().view.busy(), "current run {:?}", h.state().view.current_run);
    h.run_steps(30);
    h.get_by_label("Run").click();
    h.run_steps(2);
    assert!(rig.commands().is_empty());
    assert!(
        h.state().view.error.as_deref().is_some_and(|e| e.contains("prompt is empty")),
        "{:?}",
        h.state().view.error
    );
    h.get_by_label_contains("prompt is empty");
}

#[test]
fn stale_run_events_are_ignored() {
    let (mut h, rig, first) = run_pressed();
    h.get_by_label("Stop").click();
    h.run_steps(1);
    rig.send(EngineEvent::Done { run_id: first });
    h.run_steps(1);
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (second, ..) = compare_of(rig.commands());
    assert_ne!(first, second);
    // Late tokens of the first run arrive after the second started.
    rig.send(EngineEvent::Token {
        run_id: first,
        pane: Pane::Mentored,
        token: token(9, " stale", TokenSource::DraftAccepted, 0),
        t_s: 0.1,
    });
    rig.send(EngineEvent::Finished { run_id: first, pane: Pane::Mentored, stats: stats(1.0, 1.0), cancelled: false });
    rig.send(EngineEvent::Token {
        run_id: second,
        pane: Pane::Mentored,
        token: token(3, " fresh", TokenSource::DraftAccepted, 0),
        t_s: 0.1,
    });
    h.run_steps(2);
    let v = &h.state().view;
    assert_eq!(v.mentored.text(), " fresh");
    assert!(v.n_stale_dropped >= 2);
    assert!(h.state().history.is_empty(), "a stale Finished adds no history row");
}

#[test]
fn target_only_result_is_reused_when_only_mentored_settings_change() {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (run_id, target, ..) = compare_of(rig.commands());
    assert!(target.is_some());
    script_run(&rig, run_id);
    h.run_steps(2);
    h.state_mut().settings.budget = 0.9;
    h.state_mut().settings.draft_len = 3;
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (run2, target, mentored, _) = compare_of(rig.commands());
    assert!(target.is_none(), "same prompt/seed/sampling: target-only pane is reused");
    assert_eq!(mentored.budget, 0.9);
    assert_eq!(h.state().view.target.text(), "The moon glowed softly.", "reused pane keeps its text");
    rig.send(EngineEvent::Done { run_id: run2 });
    h.run_steps(2);
    h.state_mut().settings.seed += 1;
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (_, target, ..) = compare_of(rig.commands());
    assert!(target.is_some(), "a new seed needs a new target-only run");
}

#[test]
fn history_exports_csv_and_json_and_open_loads_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("runs.csv");
    let model = dir.path().join("picked.gguf");
    let (app, rig) =
        app_with(Settings::default(), ScriptedDialogs { open: vec![model.clone()], save: Some(csv.clone()) });
    let mut h = harness(app);
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (run_id, ..) = compare_of(rig.commands());
    script_run(&rig, run_id);
    h.run_steps(2);
    h.get_by_label("Export CSV…").click();
    h.run_steps(2);
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines[0], RunRecord::CSV_HEADER);
    assert_eq!(lines.len(), 3);
    assert!(lines[2].contains("TV=0.50, k=8"));
    h.state_mut().last_export = None;
    h.get_by_label("Export JSON…").click();
    h.run_steps(2);
    let back: Vec<RunRecord> = serde_json::from_str(&std::fs::read_to_string(&csv).unwrap()).unwrap();
    assert_eq!(back, h.state().history);
    // Open target… loads the picked file as the target.
    h.get_by_label("Open target…").click();
    h.run_steps(2);
    let loads: Vec<_> =
        rig.cmd_rx.try_iter().filter_map(|c| if let EngineCommand::Load(m) = c { Some(m) } else { None }).collect();
    assert_eq!(loads.last().and_then(|m| m.target.clone()), Some(model));
    assert_eq!(h.state().settings.models.target, loads.last().unwrap().target);
}

#[test]
fn sweep_sends_the_grid_and_plots_the_frontier() {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.state_mut().settings.sweep_budgets = "0, 0.5, 1".into();
    h.state_mut().settings.sweep_lens = "4, auto".into();
    h.get_by_role_and_label(Role::Button, "Sweep").click();
    h.run_steps(2);
    let cmds = rig.commands();
    let Some(EngineCommand::Sweep { run_id, budgets, draft_lens, seeds, .. }) = cmds.into_iter().next() else {
        panic!("no sweep sent")
    };
    assert_eq!(budgets, vec![0.0, 0.5, 1.0]);
    assert_eq!(draft_lens, vec![DraftLen::Fixed(4), DraftLen::Auto]);
    assert_eq!(seeds, vec![42, 43, 44], "three seeds from the settings' seed");
    assert_eq!(h.state().view.sweep.total, 3 * 7);
    // Two seeds of target-only and of one point: speedups paired by seed (2.0 and 1.0).
    for (seed, target_e2e, e2e, nll) in [(42, 2.0, 1.0, 2.5), (43, 3.0, 3.0, 2.1)] {
        let point = |label: &str, budget, k, e2e, nll| EngineEvent::SweepPoint {
            run_id,
            label: label.into(),
            budget,
            draft_len: DraftLen::Fixed(k),
            seed,
            stats: stats(e2e, nll),
        };
        rig.send(point("target", 0.0, 1, target_e2e, 1.5));
        rig.send(point("fixed=4,tv=1", 1.0, 4, e2e, nll));
    }
    rig.send(EngineEvent::SweepProgress { run_id, done: 4, total: 21 });
    h.run_steps(2);
    let f = h.state().view.sweep.frontier();
    assert_eq!(f.len(), 2);
    assert_eq!((f[1].label.as_str(), f[1].n_seeds), ("fixed=4,tv=1", 2));
    assert_eq!(f[1].speedup, [1.0, 1.5, 2.0]);
    assert_eq!(f[1].nll, [2.1, 2.3, 2.5]);
    assert_eq!(f[0].speedup, [1.0, 1.0, 1.0]);
    h.get_by_label("4/21");
    // Every sweep run is in the runs table, with its seed and paired speedup.
    let sweep_rows: Vec<_> = h.state().history.iter().filter(|r| r.config.starts_with("sweep: ")).cloned().collect();
    assert_eq!(sweep_rows.len(), 4);
    assert_eq!(
        (sweep_rows[1].config.as_str(), sweep_rows[1].seed, sweep_rows[1].speedup),
        ("sweep: fixed=4,tv=1", 42, 2.0)
    );
    // A bad grid is an error message, not a command.
    rig.send(EngineEvent::Done { run_id });
    h.run_steps(2);
    h.state_mut().settings.sweep_budgets = "0, lots".into();
    h.get_by_role_and_label(Role::Button, "Sweep").click();
    h.run_steps(2);
    assert!(rig.commands().is_empty());
    h.get_by_label_contains("sweep budget `lots`");
}

/// What changes size while a run streams (the stats filling in as the target pane finishes, a new
/// row in the runs table) asks egui for no frame at once: such a frame is drawn on the cores the
/// engine is using (an `egui::Grid` that changes size does ask, which cost the mentored pane a
/// ~30 ms frame at its start under software GL).
#[test]
fn a_pane_finishing_mid_run_asks_for_no_extra_frame() {
    let (mut h, rig, run_id) = run_pressed();
    rig.send(EngineEvent::Started { run_id, pane: Pane::Target });
    for (i, w) in ["The", " moon", " glowed"].iter().enumerate() {
        rig.send(EngineEvent::Token {
            run_id,
            pane: Pane::Target,
            token: token(i as u32, w, TokenSource::Target, 0),
            t_s: 0.1 * (i + 1) as f64,
        });
    }
    h.run_steps(3);
    rig.send(EngineEvent::Finished { run_id, pane: Pane::Target, stats: stats(12.345, 1.9), cancelled: false });
    rig.send(EngineEvent::Started { run_id, pane: Pane::Mentored });
    rig.send(EngineEvent::Token {
        run_id,
        pane: Pane::Mentored,
        token: token(0, "The", TokenSource::DraftAccepted, 0),
        t_s: 0.05,
    });
    h.step();
    assert!(h.query_by_label("12.35 s").is_some(), "the target's stats are shown");
    let delays: Vec<_> = h.output().viewport_output.values().map(|v| v.repaint_delay).collect();
    assert!(delays.iter().all(|d| !d.is_zero()), "egui asked for another frame at once: {delays:?}");
}

fn snapshot(dark: bool, name: &str) {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = Harness::builder()
        .with_size(egui::vec2(1400.0, 1000.0))
        .with_theme(if dark { egui::Theme::Dark } else { egui::Theme::Light })
        .wgpu()
        .build_ui_state(|ui, app: &mut MentorApp| app.frame_ui(ui), app);
    let info = |name: &str, n_params: u64, quant: &str| mentor_lab::gguf::ModelInfo {
        path: PathBuf::from(format!("/models/{name}.gguf")),
        name: name.into(),
        arch: "llama".into(),
        n_params,
        quantization: quant.into(),
        n_vocab: 49152,
        n_ctx: 8192,
        file_size: n_params / 2,
        feature_draft: false,
    };
    rig.send(EngineEvent::Loaded {
        target: info("SmolLM2-135M-Instruct", 134_515_008, "Q4_1"),
        target_weights: "Q8_0 (from Q4_1)".into(),
        draft: Some((info("draft", 14_000_000, "Q8_0"), "Q8_0".into())),
    });
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (run_id, ..) = compare_of(rig.commands());
    script_run(&rig, run_id);
    h.run_steps(4);
    h.snapshot(name);
}

#[test]
fn snapshot_main_window_dark() {
    snapshot(true, "main_window_dark");
}

#[test]
fn snapshot_main_window_light() {
    snapshot(false, "main_window_light");
}

#[test]
fn panels_are_drawn_by_the_clear_colour_of_their_theme() {
    let ctx = egui::Context::default();
    mentor_lab::app::panels_by_clearing(&ctx);
    for theme in [egui::Theme::Dark, egui::Theme::Light] {
        ctx.set_theme(theme);
        let visuals = ctx.global_style().visuals.clone();
        assert_eq!(visuals.panel_fill, egui::Color32::TRANSPARENT, "{theme:?}: panels leave their fill to the clear");
        let want = theme.default_visuals().panel_fill;
        assert_ne!(want.a(), 0);
        assert_eq!(
            mentor_lab::app::clear_color(&visuals),
            want.to_normalized_gamma_f32(),
            "{theme:?}: the clear colour is the theme's panel colour"
        );
    }
}

/// With the default target loaded, the two shipped drafts are one click apart (the click loads
/// the other draft and keeps it in the settings); with any other target the choice is not shown,
/// since the feature draft reads the default target's hidden states only.
#[test]
fn the_shipped_drafts_are_one_click_apart_with_the_default_target() {
    let (Some(independent), Some(feature)) = (mentor_lab::models::default_draft(), mentor_lab::models::feature_draft())
    else {
        panic!("the shipped drafts are missing from assets/models")
    };
    let info = |path: &std::path::Path, feature_draft: bool| mentor_lab::gguf::ModelInfo {
        path: path.to_path_buf(),
        name: path.file_stem().unwrap().to_string_lossy().into_owned(),
        arch: "llama".into(),
        n_params: 5_000_000,
        quantization: "Q8_0".into(),
        n_vocab: 49152,
        n_ctx: 8192,
        file_size: 7_000_000,
        feature_draft,
    };
    let loaded = |target: PathBuf, draft: &std::path::Path, feature_draft: bool| EngineEvent::Loaded {
        target: info(&target, false),
        target_weights: "Q4_1".into(),
        draft: Some((info(draft, feature_draft), "Q8_0".into())),
    };
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    let loads = |rig: &Rig| {
        rig.cmd_rx
            .try_iter()
            .filter_map(|c| if let EngineCommand::Load(m) = c { Some(m) } else { None })
            .collect::<Vec<_>>()
    };

    rig.send(loaded(PathBuf::from("/models/another-target.gguf"), &independent, false));
    h.run_steps(2);
    assert!(h.query_by_label("feature").is_none(), "the feature draft offered beside a target it cannot read");

    let default_target = mentor_lab::models::models_dir().join(mentor_lab::models::DEFAULT_TARGET_FILE);
    rig.send(loaded(default_target.clone(), &independent, false));
    h.run_steps(2);
    loads(&rig);
    // Clicking the draft already loaded reloads nothing.
    h.get_by_label("independent").click();
    h.run_steps(2);
    assert!(loads(&rig).is_empty());
    h.get_by_label("feature").click();
    h.run_steps(2);
    let sent = loads(&rig);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].target.clone(), sent[0].draft.clone()),
        (h.state().settings.models.target.clone(), Some(feature.clone()))
    );
    assert_eq!(h.state().settings.models.draft, Some(feature.clone()));

    // Once loaded, the draft line says what kind of draft it is, and the way back is one click.
    rig.send(loaded(default_target, &feature, true));
    h.run_steps(2);
    h.get_by_label_contains("feature draft (reads the target's hidden states)");
    h.get_by_label("independent").click();
    h.run_steps(2);
    assert_eq!(loads(&rig).last().and_then(|m| m.draft.clone()), Some(independent));
}

/// At common laptop window sizes the three live plots are drawn on screen, each at least 160
/// points high (the layout gives the panes what the stats and plots leave).
#[test]
fn plots_stay_readable_at_laptop_sizes() {
    for size in [egui::vec2(1280.0, 800.0), egui::vec2(1440.0, 900.0)] {
        let (app, rig) = app_with(Settings::default(), no_dialogs());
        let mut h = Harness::builder().with_size(size).build_ui_state(|ui, app: &mut MentorApp| app.frame_ui(ui), app);
        h.get_by_label("Run").click();
        h.run_steps(2);
        let (run_id, ..) = compare_of(rig.commands());
        script_run(&rig, run_id);
        h.run_steps(3);
        let rects = h.state().view.layout.plot_rects.clone();
        assert_eq!(rects.len(), 3, "{size:?}");
        for r in rects {
            assert!(r.height() >= 160.0, "{size:?}: plot {r:?} is too low");
            assert!(r.bottom() <= size.y && r.top() >= 0.0, "{size:?}: plot {r:?} is off screen");
        }
    }
}

/// Clicking a token pins it: the inspector tab opens and shows that token's rows of p, q and π
/// (the numbers of its event), what the draft proposed there (and the runners-up verified beside
/// it), and its round.
#[test]
fn clicking_a_token_pins_the_inspector() {
    let (mut h, rig, run_id) = run_pressed();
    script_run(&rig, run_id);
    h.run_steps(3);
    h.get_by_label(" shone").click();
    h.run_steps(3);
    assert_eq!(h.state().view.pinned, Some((Pane::Mentored, 2)));
    assert_eq!(h.state().view.bottom_tab, mentor_lab::app::view::BottomTab::Inspector);
    // Rows of the pinned token's event: itself (p 0.412, q 0.206, π 0.309), then "alt7" (p 0.2,
    // q 0.1, π 0.15) and "other7".
    assert!(h.get_all_by_label("\" shone\"").count() >= 1);
    h.get_by_label("\"alt7\"");
    h.get_by_label("\"other7\"");
    for number in ["0.206", "0.309", "0.100", "0.150", "0.050", "0.075"] {
        assert!(!h.query_all_by_label(number).collect::<Vec<_>>().is_empty(), "no cell {number}");
    }
    h.get_by_label_contains("The draft proposed \"alt7\": rejected");
    h.get_by_label_contains("Also verified here, the draft's runners-up: \"other7\".");
    h.get_by_label_contains("Round 0: 4 proposed");
    // A target-only token shows p alone.
    h.get_by_label(" glowed").click();
    h.run_steps(3);
    assert_eq!(h.state().view.pinned, Some((Pane::Target, 2)));
    assert!(h.query_by_label_contains("The draft proposed").is_none());
    h.get_by_label("\"alt2\"");
}

/// Cmd/Ctrl + zooms the UI and the factor goes into the saved settings.
#[test]
fn keyboard_zoom_is_kept_in_the_settings() {
    let (app, _rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.run_steps(2);
    assert_eq!(h.state().settings.zoom, 1.0);
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::Plus);
    h.run_steps(3);
    assert!(h.state().settings.zoom > 1.0, "zoom {}", h.state().settings.zoom);
}

/// Export to a place that cannot be written (a full device; a folder that is a file) is an error
/// in the window that says what to do; the runs stay in the table and the app keeps working.
#[test]
fn export_to_an_unwritable_place_is_an_error_and_keeps_the_runs() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let mut places = vec![blocker.join("runs.csv")];
    if std::path::Path::new("/dev/full").exists() {
        places.push(PathBuf::from("/dev/full"));
    }
    for place in places {
        let (app, rig) = app_with(Settings::default(), ScriptedDialogs { open: Vec::new(), save: Some(place.clone()) });
        let mut h = harness(app);
        h.get_by_label("Run").click();
        h.run_steps(2);
        let (run_id, ..) = compare_of(rig.commands());
        script_run(&rig, run_id);
        h.run_steps(3);
        assert_eq!(h.state().history.len(), 2);
        h.get_by_label("Export CSV…").click();
        h.run_steps(3);
        let error = h.state().view.error.clone().unwrap_or_default();
        assert!(error.contains("could not write") && error.contains("Pick another folder"), "{place:?}: {error}");
        assert_eq!(h.state().history.len(), 2, "the runs are kept");
        assert!(h.state().last_export.is_none());
    }
}

/// The window carries the app's own icon and title, and on macOS draws with wgpu (Metal) first,
/// falling back to glow; elsewhere with glow.
#[test]
fn the_window_has_the_apps_icon_title_and_renderer() {
    use mentor_lab::app::{app_icon, main_viewport, renderers_for, UiRenderer};
    let icon = app_icon().expect("the compiled-in icon decodes");
    assert_eq!((icon.width, icon.height), (1024, 1024));
    assert_eq!(icon.rgba.len(), 1024 * 1024 * 4);
    assert!(icon.rgba.chunks(4).any(|p| p[3] == 255) && icon.rgba.chunks(4).any(|p| p[0] != p[2]), "not blank");
    let viewport = main_viewport();
    assert_eq!(viewport.title.as_deref(), Some("Mentor Lab"));
    assert!(viewport.icon.is_some(), "eframe's own icon would show in the Dock otherwise");
    assert_eq!(renderers_for("macos"), vec![UiRenderer::Wgpu, UiRenderer::Glow]);
    assert_eq!(renderers_for("linux"), vec![UiRenderer::Glow]);
    assert_eq!(renderers_for("windows"), vec![UiRenderer::Glow]);
}
