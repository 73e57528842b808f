//! Faults while the app runs, with the real default pair: the engine panicking mid-run, a model
//! file removed or cut short after it was listed or loaded. Each must end in a message that says
//! what happened, with the app still working and nothing the user made lost.

#[path = "common/mod.rs"]
mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/app.rs"]
mod ui;

use driver::Driver;
use mentor_lab::app::engine_thread::{self, EngineCommand, EngineEvent, ModelChoice, Pane};
use mentor_lab::app::settings::Settings;
use mentor_lab::app::{MentorApp, UiCommand};
use mentor_lab::generate::{GenerateRequest, Mode};
use mentor_lab::Verify;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use ui::{wait_until, NoDialogs};

/// A panic inside the engine during a run: the window says the engine crashed and restarted, the
/// runs already in the table stay, the models come back and the next run works.
#[test]
fn an_engine_panic_mid_run_is_reported_and_the_engine_restarts() {
    let settings =
        Settings { max_tokens: 12, ignore_eos: true, prompt: "Tell me about the moon.".into(), ..Settings::default() };
    let engine = engine_thread::spawn(None);
    let inject = engine.cmd_tx.clone();
    let mut app = MentorApp::new(settings, Vec::new(), engine, Box::new(NoDialogs));
    wait_until(&mut app, "models to load", |a| a.view.models.target.is_some() && !a.view.models.loading);
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "the first run", |a| !a.view.busy());
    assert!(app.view.error.is_none(), "{:?}", app.view.error);
    assert_eq!(app.history.len(), 2);
    let before = app.history.clone();

    inject.send(EngineCommand::PanicInNextRun).unwrap();
    app.settings.seed += 1;
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "the crashed run to end", |a| !a.view.busy());
    let error = app.view.error.clone().unwrap_or_default();
    assert!(error.contains("crashed") && error.contains("restarted") && error.contains("history"), "{error}");
    assert!(error.contains("fault injected"), "the message carries the panic's text: {error}");
    assert_eq!(app.history.len(), 2, "a crashed run adds nothing to the table");
    assert_eq!(format!("{:?}", app.history), format!("{before:?}"), "earlier runs are untouched");

    // The next run is served once the models have been reloaded.
    app.settings.seed += 1;
    app.queue(UiCommand::Run);
    app.apply_queued();
    wait_until(&mut app, "a run after the restart", |a| !a.view.busy());
    assert!(app.view.error.is_none(), "{:?}", app.view.error);
    assert_eq!(app.view.target.tokens.len(), 12);
    assert_eq!(app.view.mentored.tokens.len(), 12);
    assert_eq!(app.history.len(), 4);
}

fn compare(driver: &mut Driver, run_id: u64, seed: u64) -> (usize, usize) {
    let req = GenerateRequest {
        prompt: "Name three rivers.".into(),
        max_tokens: 10,
        ignore_eos: true,
        seed,
        ..GenerateRequest::default()
    };
    let mentored =
        GenerateRequest { mode: Mode::Speculative, verify: Verify { budget: 0.5, ..req.verify }, ..req.clone() };
    let cancel = Arc::new(AtomicBool::new(false));
    driver.send(EngineCommand::Compare { run_id, target: Some(req), mentored, cancel });
    driver.wait_done(run_id);
    let tokens = |pane| {
        driver
            .events_of(run_id)
            .iter()
            .filter(|e| matches!(e, EngineEvent::Token { pane: p, .. } if *p == pane))
            .count()
    };
    let errors: Vec<_> =
        driver.events_of(run_id).into_iter().filter(|e| matches!(e, EngineEvent::Error { .. })).collect();
    assert!(errors.is_empty(), "{errors:?}");
    (tokens(Pane::Target), tokens(Pane::Mentored))
}

fn copy_of_target(dir: &std::path::Path) -> PathBuf {
    let copy = dir.join("target-copy.gguf");
    std::fs::copy(common::target_path(), &copy).unwrap();
    copy
}

/// The loaded model's file is deleted: the models are in memory, so runs go on. Loading it again
/// says the file is missing and keeps the loaded pair.
#[test]
fn a_model_file_removed_after_loading_keeps_the_loaded_pair() {
    let dir = tempfile::tempdir().unwrap();
    let copy = copy_of_target(dir.path());
    let mut driver = Driver::new();
    driver.send(EngineCommand::Load(ModelChoice { target: Some(copy.clone()), ..ModelChoice::default() }));
    driver.wait_loaded().unwrap();
    std::fs::remove_file(&copy).unwrap();
    assert_eq!(compare(&mut driver, 1, 7), (10, 10));

    driver.send(EngineCommand::Load(ModelChoice { target: Some(copy.clone()), ..ModelChoice::default() }));
    let message = driver.wait_loaded().unwrap_err();
    assert!(message.contains(&copy.display().to_string()), "names the file: {message}");
    assert!(message.contains("still in use"), "says the loaded pair stays: {message}");
    assert_eq!(compare(&mut driver, 2, 8), (10, 10), "the loaded pair still runs");
}

/// A file listed in the models bar and then cut short (a copy still in progress, a damaged disk)
/// is refused with a message, the loaded pair stays; a crash-restart that has to reload a file
/// that has since been cut short says so and leaves no model loaded rather than a broken one.
#[test]
fn a_model_file_cut_short_after_listing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let copy = copy_of_target(dir.path());
    let mut driver = Driver::new();
    driver.send(EngineCommand::Load(ModelChoice::default()));
    driver.wait_loaded().unwrap();
    let len = std::fs::metadata(&copy).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&copy).unwrap().set_len(len / 2).unwrap();
    driver.send(EngineCommand::Load(ModelChoice { target: Some(copy.clone()), ..ModelChoice::default() }));
    let message = driver.wait_loaded().unwrap_err();
    assert!(message.contains("still in use"), "{message}");
    assert_eq!(compare(&mut driver, 1, 3), (10, 10), "the loaded pair still runs");

    // Load the intact copy, cut it short, then crash: the restart cannot reload it.
    let copy = copy_of_target(dir.path());
    driver.send(EngineCommand::Load(ModelChoice { target: Some(copy.clone()), ..ModelChoice::default() }));
    driver.wait_loaded().unwrap();
    std::fs::OpenOptions::new().write(true).open(&copy).unwrap().set_len(len / 2).unwrap();
    driver.send(EngineCommand::PanicInNextRun);
    let req = GenerateRequest { prompt: "Hi".into(), max_tokens: 4, ..GenerateRequest::default() };
    let cancel = Arc::new(AtomicBool::new(false));
    driver.send(EngineCommand::Compare { run_id: 2, target: Some(req.clone()), mentored: req, cancel });
    driver.wait_for(
        "the crash report",
        |e| matches!(e, EngineEvent::Error { message, .. } if message.contains("crashed")),
    );
    driver.wait_done(2);
    let message = driver.wait_loaded().unwrap_err();
    assert!(message.contains(&copy.display().to_string()), "names the file: {message}");
    assert!(!message.contains("still in use"), "{message}");
    driver.wait_for("the view to be told", |e| {
        matches!(e, EngineEvent::Unloaded) || matches!(e, EngineEvent::Loaded { .. })
    });
    assert!(matches!(driver.log.last(), Some(EngineEvent::Unloaded)), "{:?}", driver.log.last());
}
