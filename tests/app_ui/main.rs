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
    folder: Option<PathBuf>,
}

impl Dialogs for ScriptedDialogs {
    fn open_model(&mut self) -> Option<PathBuf> {
        self.open.pop()
    }
    fn save_file(&mut self, _name: &str) -> Option<PathBuf> {
        self.save.clone()
    }
    fn pick_folder(&mut self) -> Option<PathBuf> {
        self.folder.clone()
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
    ScriptedDialogs { open: Vec::new(), save: None, folder: None }
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
        rule_notes: if spec { vec![("τ".into(), 0.125)] } else { Vec::new() },
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
    h.get_by_role_and_label(Role::ComboBox, "Rule").click();
    h.run_steps(2);
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
    assert!((mentored.verify.budget - s.budget).abs() < 1e-12);
    assert_eq!(mentored.drafting.len(), DraftLen::Auto);
    assert_eq!(mentored.verify.rule, mentor_lab::MentorRule::Kl);
    assert!(!mentored.verify.bonus);
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
fn a_tree_of_candidates_is_sent_with_the_draft_length_as_its_depth() {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.run_steps(2);
    h.get_by_label("draft a tree of candidates").click();
    // The draft length is the tree's depth, even with the adaptive length on.
    h.get_by_label("adaptive draft length").click();
    h.run_steps(2);
    h.get_by_role_and_label(Role::Slider, "Draft length").focus();
    h.run_steps(1);
    h.key_press(egui::Key::ArrowLeft);
    h.run_steps(2);
    assert_eq!(h.state().settings.draft_len, 7);
    assert_eq!(h.state().settings.mentored_label(), "TV=0.50, tree 2x7");
    rig.commands();
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (run_id, _, mentored, _) = compare_of(rig.commands());
    assert_eq!(mentored.drafting.tree(), Some(mentor_lab::TreeShape { width: 2, depth: 7 }));
    assert!(mentored.validate().is_ok());
    rig.send(EngineEvent::Done { run_id });
    h.run_steps(2);
    // Under max-acceptance the tree is sent too (checked by recursive rejection sampling).
    h.get_by_label("max acceptance").click();
    h.run_steps(2);
    h.get_by_label("Run").click();
    h.run_steps(2);
    let (_, _, mentored, _) = compare_of(rig.commands());
    assert_eq!(mentored.drafting.tree(), Some(mentor_lab::TreeShape { width: 2, depth: 7 }));
    assert_eq!(mentored.coupling, Coupling::MaxAcceptance);
    assert!(mentored.validate().is_ok());
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
    assert_eq!(mentored.verify.budget, 0.9);
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
    let (app, rig) = app_with(
        Settings::default(),
        ScriptedDialogs { open: vec![model.clone()], save: Some(csv.clone()), folder: None },
    );
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

// The main window as a whole: snapshots, themes, sizes, the shipped drafts, zoom, export, icon.
mod window;
// Sweeps: the grid sent and the frontier plotted, every rule's values.
mod sweep;
// The folder that adaptive rounds copy from.
mod corpus;
