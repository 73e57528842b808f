#![allow(dead_code)]
//! Driving the real app (with the real engine thread) from a test: no file dialogs, and a wait
//! that polls the engine's events until a condition holds.

use mentor_lab::app::{Dialogs, MentorApp};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Dialogs that a test never opens.
pub struct NoDialogs;

impl Dialogs for NoDialogs {
    fn open_model(&mut self) -> Option<PathBuf> {
        None
    }
    fn save_file(&mut self, _: &str) -> Option<PathBuf> {
        None
    }
    fn pick_folder(&mut self) -> Option<PathBuf> {
        None
    }
}

/// Picks this folder when asked for one; no other dialog.
#[allow(dead_code)]
pub struct FolderDialog(pub PathBuf);

impl Dialogs for FolderDialog {
    fn open_model(&mut self) -> Option<PathBuf> {
        None
    }
    fn save_file(&mut self, _: &str) -> Option<PathBuf> {
        None
    }
    fn pick_folder(&mut self) -> Option<PathBuf> {
        Some(self.0.clone())
    }
}

/// Poll the engine's events until `done` holds. A guard (minutes, far beyond any run here) turns
/// a hang into a failure that shows the window's message line.
pub fn wait_until(app: &mut MentorApp, what: &str, mut done: impl FnMut(&MentorApp) -> bool) {
    let start = Instant::now();
    while !done(app) {
        assert!(start.elapsed() < Duration::from_secs(600), "timed out waiting for {what}: {:?}", app.view.error);
        std::thread::sleep(Duration::from_millis(20));
        app.poll_engine();
    }
}
