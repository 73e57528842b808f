#![allow(dead_code)]
//! Drives the real engine thread the way the app does (commands in, events out) and samples the
//! process's memory and threads, for the fault and soak tests.

use mentor_lab::app::engine_thread::{self, EngineCommand, EngineEvent, EngineHandle};
use std::time::{Duration, Instant};

pub struct Driver {
    pub handle: EngineHandle,
    /// Every event received, in order.
    pub log: Vec<EngineEvent>,
}

impl Driver {
    pub fn new() -> Self {
        Driver { handle: engine_thread::spawn(None), log: Vec::new() }
    }

    pub fn send(&self, cmd: EngineCommand) {
        self.handle.cmd_tx.send(cmd).expect("the engine thread is running");
    }

    /// Receive events until one matches `pred`; returns it. A guard (minutes, far beyond any
    /// run here) turns a hang into a failure that shows the last events.
    pub fn wait_for(&mut self, what: &str, pred: impl Fn(&EngineEvent) -> bool) -> EngineEvent {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.handle.event_rx.recv_timeout(left) {
                Ok(ev) => {
                    self.log.push(ev.clone());
                    if pred(&ev) {
                        return ev;
                    }
                }
                Err(_) => {
                    panic!("no event for {what}; last events: {:?}", &self.log[self.log.len().saturating_sub(5)..])
                }
            }
        }
    }

    /// Wait for the models to load; returns the error text instead when loading fails.
    pub fn wait_loaded(&mut self) -> Result<(), String> {
        match self.wait_for("the models to load", |e| {
            matches!(e, EngineEvent::Loaded { .. } | EngineEvent::Error { run_id: None, .. })
        }) {
            EngineEvent::Loaded { .. } => Ok(()),
            EngineEvent::Error { message, .. } => Err(message),
            _ => unreachable!(),
        }
    }

    pub fn wait_done(&mut self, run_id: u64) {
        self.wait_for("the run to end", |e| matches!(e, EngineEvent::Done { run_id: r } if *r == run_id));
    }

    /// The events of one run, from the log.
    pub fn events_of(&self, run: u64) -> Vec<&EngineEvent> {
        self.log.iter().filter(|e| run_of(e) == Some(run)).collect()
    }
}

pub fn run_of(e: &EngineEvent) -> Option<u64> {
    match e {
        EngineEvent::Started { run_id, .. }
        | EngineEvent::Token { run_id, .. }
        | EngineEvent::Round { run_id, .. }
        | EngineEvent::Finished { run_id, .. }
        | EngineEvent::SweepPoint { run_id, .. }
        | EngineEvent::SweepProgress { run_id, .. }
        | EngineEvent::ExperimentResult { run_id, .. }
        | EngineEvent::Done { run_id } => Some(*run_id),
        EngineEvent::Error { run_id, .. } => *run_id,
        _ => None,
    }
}

/// Resident memory (KiB) and thread count of this process, from /proc (Linux only).
pub fn rss_kib_and_threads() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        status.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("VmRSS:")?, field("Threads:")?))
}
