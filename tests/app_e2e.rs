//! The real engine thread with the default pair, driven through the app: both panes fill.

use mentor_lab::app::engine_thread;
use mentor_lab::app::settings::Settings;
use mentor_lab::app::{Dialogs, MentorApp, UiCommand};
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct NoDialogs;
impl Dialogs for NoDialogs {
    fn open_model(&mut self) -> Option<PathBuf> {
        None
    }
    fn save_file(&mut self, _: &str) -> Option<PathBuf> {
        None
    }
}

fn wait_until(app: &mut MentorApp, what: &str, mut done: impl FnMut(&MentorApp) -> bool) {
    let start = Instant::now();
    while !done(app) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "timed out waiting for {what}; error: {:?}",
            app.view.error
        );
        std::thread::sleep(Duration::from_millis(20));
        app.poll_engine();
    }
}

#[test]
fn real_engine_fills_both_panes() {
    let settings =
        Settings { max_tokens: 12, ignore_eos: true, prompt: "Tell me about the moon.".into(), ..Settings::default() };
    let mut app = MentorApp::new(settings, Vec::new(), engine_thread::spawn(None), Box::new(NoDialogs));
    wait_until(&mut app, "models to load", |a| a.view.models.target.is_some() && !a.view.models.loading);
    assert!(app.view.models.draft.is_some(), "the default draft loads with the default target: {:?}", app.view.error);
    let title = app.window_title();
    assert!(title.starts_with("Mentor Lab — ") && title.contains(" + "), "the title names the pair: {title}");
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "the run to finish", |a| !a.view.busy());
    assert!(app.view.error.is_none(), "{:?}", app.view.error);
    assert_eq!(app.view.target.tokens.len(), 12);
    assert_eq!(app.view.mentored.tokens.len(), 12);
    assert!(app.view.mentored.stats.as_ref().is_some_and(|s| s.n_rounds > 0));
    assert_eq!(app.history.len(), 2);
    // Stop during a longer run returns promptly and keeps what was streamed.
    app.settings.max_tokens = 400;
    app.settings.seed += 1;
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "first tokens", |a| a.view.target.tokens.len() >= 3);
    app.queue(UiCommand::Stop);
    app.apply_queued();
    let t = Instant::now();
    wait_until(&mut app, "stop", |a| !a.view.busy());
    assert!(t.elapsed() < Duration::from_secs(5));
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
}
