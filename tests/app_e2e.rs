//! The real engine thread with the default pair, driven through the app: both panes fill.

#[path = "common/app.rs"]
mod ui;

use mentor_lab::app::engine_thread;
use mentor_lab::app::settings::Settings;
use mentor_lab::app::{MentorApp, UiCommand};
use ui::{wait_until, NoDialogs};

#[test]
fn real_engine_fills_both_panes() {
    let settings =
        Settings { max_tokens: 12, ignore_eos: true, prompt: "Tell me about the moon.".into(), ..Settings::default() };
    let mut app = MentorApp::new(settings, Vec::new(), engine_thread::spawn(None), Box::new(NoDialogs));
    wait_until(&mut app, "models to load", |a| a.view.models.target.is_some() && !a.view.models.loading);
    assert!(app.view.models.draft.is_some(), "the default draft loads with the default target: {:?}", app.view.error);
    let title = app.window_title();
    assert_eq!(title, "Mentor Lab — SmolLM2-135M-Instruct + smollm2-135m-draft-d192-l8", "the title names the pair");
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "the run to finish", |a| !a.view.busy());
    assert!(app.view.error.is_none(), "{:?}", app.view.error);
    assert_eq!(app.view.target.tokens.len(), 12);
    assert_eq!(app.view.mentored.tokens.len(), 12);
    assert!(app.view.mentored.stats.as_ref().is_some_and(|s| s.n_rounds > 0));
    assert_eq!(app.history.len(), 2);
    // Stop during a longer run ends it early and keeps what was streamed.
    app.settings.max_tokens = 400;
    app.settings.seed += 1;
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "first tokens", |a| a.view.target.tokens.len() >= 3);
    app.queue(UiCommand::Stop);
    app.apply_queued();
    wait_until(&mut app, "stop", |a| !a.view.busy());
    assert!(app.view.target.cancelled && app.view.target.tokens.len() < 400);
}

/// The visible proof that lossless means lossless: with the same-seed coupling at budget 0 the
/// two panes hold the same tokens, while the mentored pane's tokens still come from the draft.
#[test]
fn zero_budget_panes_read_identically() {
    let settings = Settings {
        max_tokens: 32,
        ignore_eos: true,
        budget: 0.0,
        prompt: "Write a short poem about the sea.".into(),
        ..Settings::default()
    };
    let mut app = MentorApp::new(settings, Vec::new(), engine_thread::spawn(None), Box::new(NoDialogs));
    wait_until(&mut app, "models to load", |a| a.view.models.target.is_some() && !a.view.models.loading);
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "the run to finish", |a| !a.view.busy());
    assert!(app.view.error.is_none(), "{:?}", app.view.error);
    let ids = |p: &mentor_lab::app::view::PaneView| p.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&app.view.target), ids(&app.view.mentored));
    assert_eq!(app.view.divergence(), None);
    assert!(app.view.differing_positions().is_empty());
    let from_draft =
        app.view.mentored.tokens.iter().filter(|t| t.source == mentor_lab::TokenSource::DraftAccepted).count();
    assert!(from_draft > 0, "no drafted token was accepted");
    // A tree of candidates (3 wide, 4 deep) leaves the text as it was; its tokens carry the
    // candidates verified beside them, which the inspector draws.
    let chain = ids(&app.view.mentored);
    app.settings.tree = true;
    app.settings.tree_width = 3;
    app.settings.draft_len = 4;
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "the tree run to finish", |a| !a.view.busy());
    assert!(app.view.error.is_none(), "{:?}", app.view.error);
    assert_eq!(ids(&app.view.mentored), chain, "a tree emits the chain's text");
    assert!(app.view.mentored.tokens.iter().any(|t| !t.offers.is_empty()), "no token lists its siblings");
    assert_eq!(app.history.last().map(|r| r.config.as_str()), Some("TV=0.00, tree 3x4"));
}

/// The article's experiment runs end to end on the default pair (small token counts) and fills
/// its table: every configuration once per seed, speedups paired with target-only's runs.
#[test]
fn the_articles_experiment_fills_its_table() {
    let settings = Settings {
        max_tokens: 6,
        prompt: "Write a haiku about autumn.".into(),
        experiment_seeds: 2,
        experiment_repeats: 1,
        ..Settings::default()
    };
    let mut app = MentorApp::new(settings, Vec::new(), engine_thread::spawn(None), Box::new(NoDialogs));
    wait_until(&mut app, "models to load", |a| a.view.models.target.is_some() && !a.view.models.loading);
    app.queue(UiCommand::Experiment);
    app.apply_queued();
    assert_eq!(app.view.experiment.plan.len(), 1 + 7 * 2);
    wait_until(&mut app, "the experiment to finish", |a| a.view.experiment.run_id.is_none());
    assert!(app.view.error.is_none(), "{:?}", app.view.error);
    assert_eq!(app.view.experiment.done(), 15);
    let rows = app.view.experiment.summary();
    let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        ["target", "fixed=4,tv=1", "fixed=6,tv=1", "fixed=8,tv=1", "fixed=8,tv=0.75", "fixed=8,tv=0.5", "auto,tv=0"]
    );
    for r in &rows {
        assert_eq!(r.n_runs, 2, "{r:?}");
        let [lo, q1, m, q3, hi] = r.speedup.expect("paired with target-only");
        assert!(lo <= q1 && q1 <= m && m <= q3 && q3 <= hi && lo > 0.0, "{r:?}");
        assert!(r.median_e2e_s > 0.0 && r.mean_target_nll > 0.0);
        assert_eq!(r.acceptance.is_some(), r.label != "target");
    }
    // At TV 1 every drafted token is accepted.
    assert_eq!(rows[3].acceptance, Some(1.0));
    assert!(rows[0].speedup.is_some_and(|s| s.iter().all(|&x| (x - 1.0).abs() < 1e-12)));
}

/// Copy from a folder, end to end: the target's own text in a folder the user picks is read by the
/// real engine, and the mentored pane at budget 0 copies from it while reading the same as the
/// target-only pane.
#[test]
fn a_picked_folder_is_copied_from_and_the_text_stays_the_targets() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        max_tokens: 48,
        ignore_eos: true,
        budget: 0.0,
        adaptive: true,
        lookup: true,
        prompt: "Write a short poem about the sea.".into(),
        ..Settings::default()
    };
    let dialogs = Box::new(ui::FolderDialog(dir.path().to_path_buf()));
    let mut app = MentorApp::new(settings, Vec::new(), engine_thread::spawn(None), dialogs);
    wait_until(&mut app, "models to load", |a| a.view.models.target.is_some() && !a.view.models.loading);
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "the run to finish", |a| !a.view.busy());
    std::fs::write(dir.path().join("poem.md"), app.view.target.text()).unwrap();
    app.queue(UiCommand::PickCorpus);
    app.apply_queued();
    wait_until(&mut app, "the folder to be read", |a| a.view.models.corpus.is_some());
    let summary = app.view.models.corpus.clone().unwrap().unwrap();
    assert!(summary.starts_with("1 files"), "{summary}");
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "the second run to finish", |a| !a.view.busy());
    assert!(app.view.error.is_none(), "{:?}", app.view.error);
    let ids = |p: &mentor_lab::app::view::PaneView| p.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&app.view.target), ids(&app.view.mentored));
    let copied = app.view.mentored.tokens.iter().filter(|t| t.source == mentor_lab::TokenSource::CopyAccepted).count();
    assert!(copied > 16, "{copied} of 48 tokens copied");
}
