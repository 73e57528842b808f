//! The main window as a whole: snapshots in both themes, panel colours, plot sizes, the shipped
//! drafts' buttons, the inspector pin, zoom, export errors, the window's icon and title.

use super::*;

fn snapshot(dark: bool, name: &str) {
    let h = window_after_a_run(dark, egui::vec2(1400.0, 1000.0));
    let mut h = h;
    h.snapshot(name);
}

/// The window at `size` after a scripted run with a known pair loaded.
fn window_after_a_run(dark: bool, size: egui::Vec2) -> Harness<'static, MentorApp> {
    let (mut app, rig) = app_with(Settings::default(), no_dialogs());
    // The same pictures whether or not the Qwen2.5-Coder pair is on this machine's disk.
    app.fetched_pairs.clear();
    let mut h = Harness::builder()
        .with_size(size)
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
    h
}

/// The Qwen2.5-Coder button says what it fetches while the pair is not on disk, and loads the
/// pair (remembered in the settings) once it is.
#[test]
fn the_qwen_coder_button_loads_the_pair_once_it_is_on_disk() {
    use mentor_lab::pairs::Pair;
    let (mut app, rig) = app_with(Settings::default(), no_dialogs());
    app.fetched_pairs.clear();
    let mut h = harness(app);
    h.run_steps(2);
    h.get_by_label("Qwen2.5-Coder 1.5B + 0.5B (fetch 1.6 GB)…");
    h.state_mut().fetched_pairs = vec![Pair::QwenCoder];
    h.run_steps(2);
    let _ = rig.cmd_rx.try_iter().count();
    h.get_by_label("Qwen2.5-Coder 1.5B + 0.5B").click();
    h.run_steps(2);
    let loads: Vec<_> =
        rig.cmd_rx.try_iter().filter_map(|c| if let EngineCommand::Load(m) = c { Some(m) } else { None }).collect();
    let (target, draft) = Pair::QwenCoder.paths();
    assert_eq!(loads.len(), 1);
    assert_eq!((loads[0].target.clone(), loads[0].draft.clone()), (Some(target.clone()), draft));
    assert_eq!(h.state().settings.models.target, Some(target), "the pair loaded last is remembered");
    assert!(h.state().pair_fetch.is_none(), "nothing is fetched");
}

/// At a laptop's 1280 × 800 the pinned token's bars carry their tokens' labels, drawn.
#[test]
fn snapshot_inspector_at_laptop_size() {
    let mut h = window_after_a_run(false, egui::vec2(1280.0, 800.0));
    h.get_by_label(" shone").click();
    h.run_steps(4);
    h.snapshot("inspector_1280x800");
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
        let panel_top = h.state().view.layout.bottom_panel_top.expect("the bottom panel is drawn");
        for r in rects {
            assert!(r.height() >= 160.0, "{size:?}: plot {r:?} is too low");
            assert!(r.bottom() <= size.y && r.top() >= 0.0, "{size:?}: plot {r:?} is off screen");
            assert!(r.bottom() <= panel_top, "{size:?}: plot {r:?} runs under the bottom panel at {panel_top}");
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
    // The rule's own quantities at the position.
    h.get_by_label("τ:");
    h.get_by_label("0.1250");
    // The round at each depth: the emitted token, then the candidates verified beside it.
    h.get_by_label_contains("At each depth: the token the walk emitted");
    h.get_by_label("rejected \"alt7\"");
    h.get_by_label("also \"other7\"");
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
        let (app, rig) = app_with(
            Settings::default(),
            ScriptedDialogs { open: Vec::new(), save: Some(place.clone()), folder: None },
        );
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
