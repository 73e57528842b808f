//! Settings and run history on disk, as our own files in the per-user data directory:
//! `settings.json` (one JSON object) and `history.jsonl` (one run per line).
//!
//! - Writes are atomic: a temporary file in the same directory, synced, then renamed over the old
//!   one, so a crash mid-write leaves the old file or the new one, never half of each.
//! - A file that does not parse is never deleted: it is renamed to `<name>.bad-<unix time>`, the app
//!   starts from defaults (or from the history lines that did parse) and says so in its window.
//! - History is append-only, under a lock file (`history.lock`), so that two instances of the app
//!   add their runs to the same file without losing each other's.
//!
//! Every function takes the directory, so tests run on temporary directories.

use super::settings::Settings;
use super::view::RunRecord;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

pub const SETTINGS_FILE: &str = "settings.json";
pub const HISTORY_FILE: &str = "history.jsonl";
const HISTORY_LOCK: &str = "history.lock";

/// The per-user folder for settings and history: beside the models folder
/// (`~/.local/share/mentor-lab` on Linux, `~/Library/Application Support/Mentor Lab` on macOS).
pub fn default_dir() -> PathBuf {
    let app = if cfg!(target_os = "macos") { "Mentor Lab" } else { "mentor-lab" };
    match directories::BaseDirs::new() {
        Some(b) => b.data_dir().join(app),
        None => PathBuf::from(".mentor-lab"),
    }
}

/// What a load found.
#[derive(Debug, Default)]
pub struct Loaded<T> {
    /// The value read, or the default where the file was missing or bad.
    pub value: T,
    /// False when the file does not exist yet (then the caller may migrate older saved state).
    pub existed: bool,
    /// What went wrong and where the bad file went, for the window's message line.
    pub notice: Option<String>,
}

/// A storage failure, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("could not save {what} in {dir}: {source}. Check that the folder exists and is writable; the data stays in the window until then.")]
    Write { what: &'static str, dir: PathBuf, source: std::io::Error },
}

// ---------------------------------------------------------------------------------------------
// Settings

/// Read `settings.json` from `dir`. A missing file gives defaults; a bad one gives defaults and is
/// moved aside.
pub fn load_settings(dir: &Path) -> Loaded<Settings> {
    let path = dir.join(SETTINGS_FILE);
    let text = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Loaded::default(),
        Err(e) => return bad_file(&path, &format!("it could not be read ({e})"), Settings::default()),
    };
    match serde_json::from_slice::<Settings>(&text) {
        Ok(mut value) => {
            // What was wrong with the budget, said before sanitizing changes it: its range
            // depends on the rule.
            let budget_problem = value.rule.param().check(value.budget).err();
            let changed = value.sanitize();
            let notice = (!changed.is_empty()).then(|| {
                let budget = match budget_problem {
                    Some(e) => format!(" The budget: {e}; it is now {}, set it in the Mentor panel.", value.budget),
                    None => String::new(),
                };
                format!(
                    "{} held values out of range ({}); they were set to the nearest allowed value.{budget}",
                    path.display(),
                    changed.join(", ")
                )
            });
            Loaded { value, existed: true, notice }
        }
        Err(e) => bad_file(&path, &format!("it does not parse ({e})"), Settings::default()),
    }
}

/// Write `settings.json` into `dir` atomically.
pub fn save_settings(dir: &Path, settings: &Settings) -> Result<(), StorageError> {
    let err = |source| StorageError::Write { what: "the settings", dir: dir.to_path_buf(), source };
    let json = serde_json::to_vec_pretty(settings).map_err(|e| err(e.into()))?;
    write_atomic(dir, SETTINGS_FILE, &json).map_err(err)
}

// ---------------------------------------------------------------------------------------------
// History

/// A run as stored: [`RunRecord`]'s fields, with the floats that may be NaN (a speed-up without a
/// target time) read back from JSON's `null`, which is how serde_json writes them.
#[derive(Serialize, Deserialize)]
#[serde(remote = "RunRecord")]
struct StoredRun {
    when: u64,
    config: String,
    prompt: String,
    seed: u64,
    #[serde(deserialize_with = "f32_or_nan")]
    temperature: f32,
    n_tokens: usize,
    #[serde(deserialize_with = "f64_or_nan")]
    acceptance: f64,
    rounds: usize,
    #[serde(deserialize_with = "f64_or_nan")]
    e2e_s: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    tok_s: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    speedup: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    target_nll: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    mean_tv: f64,
    #[serde(default)]
    target: String,
    #[serde(default)]
    draft: String,
}

fn f64_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn f32_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
}

#[derive(Serialize, Deserialize)]
struct Line(#[serde(with = "StoredRun")] RunRecord);

fn record_line(r: &RunRecord) -> Result<String, serde_json::Error> {
    let mut s = serde_json::to_string(&Line(r.clone()))?;
    s.push('\n');
    Ok(s)
}

/// Runs, oldest first, from `history.jsonl` in `dir`. Lines that do not parse (a line cut short
/// by a crash, damage) are skipped: the runs that do parse are kept, the original file is moved
/// aside, and a clean file with the good runs takes its place.
pub fn load_history(dir: &Path) -> Loaded<Vec<RunRecord>> {
    let path = dir.join(HISTORY_FILE);
    // A folder where the lock cannot be made (read-only) still reads; nothing is rewritten
    // without the lock.
    let lock = lock_history(dir).ok();
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => return Loaded::default(),
        Err(e) => return bad_file(&path, &format!("it could not be read ({e})"), Vec::new()),
    };
    let mut runs = Vec::new();
    let mut n_bad = 0;
    for line in bytes.split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Line>(line) {
            Ok(Line(r)) => runs.push(r),
            Err(_) => n_bad += 1,
        }
    }
    if n_bad == 0 {
        return Loaded { value: runs, existed: true, notice: None };
    }
    let why = format!("{n_bad} of its lines do not parse");
    if runs.is_empty() {
        return bad_file(&path, &why, runs);
    }
    // Keep the runs that parsed: the damaged file goes aside and a clean one takes its place.
    let notice = match move_aside(&path) {
        Ok(aside) => {
            let kept = match lock.is_some() {
                true => rewrite_history_locked(dir, &runs).err().map(|e| e.to_string()),
                false => Some("the history folder could not be locked, so they were not written back".into()),
            };
            format!(
                "{} could not be used whole: {why}. It was kept as {}; the {} runs that did parse are shown{}",
                path.display(),
                aside.display(),
                runs.len(),
                kept.map(|e| format!(" ({e})")).unwrap_or_else(|| " and saved.".into())
            )
        }
        Err(e) => format!(
            "{} could not be used whole: {why}, and could not be moved aside ({e}); the {} runs that did parse \
             are shown. Move or remove the file by hand.",
            path.display(),
            runs.len()
        ),
    };
    Loaded { value: runs, existed: true, notice: Some(notice) }
}

/// Add `runs` at the end of `history.jsonl` in `dir` (creating it). Safe with another instance
/// appending at the same time: each append holds the history lock.
pub fn append_history(dir: &Path, runs: &[RunRecord]) -> Result<(), StorageError> {
    let err = |source| StorageError::Write { what: "the run history", dir: dir.to_path_buf(), source };
    if runs.is_empty() {
        return Ok(());
    }
    let mut text = String::new();
    for r in runs {
        text.push_str(&record_line(r).map_err(|e| err(e.into()))?);
    }
    std::fs::create_dir_all(dir).map_err(err)?;
    let _lock = lock_history(dir).map_err(err)?;
    let mut f = OpenOptions::new().create(true).append(true).open(dir.join(HISTORY_FILE)).map_err(err)?;
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(err)
}

/// Replace `history.jsonl` in `dir` with `runs` (used when the history is cleared).
pub fn rewrite_history(dir: &Path, runs: &[RunRecord]) -> Result<(), StorageError> {
    let err = |source| StorageError::Write { what: "the run history", dir: dir.to_path_buf(), source };
    std::fs::create_dir_all(dir).map_err(err)?;
    let _lock = lock_history(dir).map_err(err)?;
    rewrite_history_locked(dir, runs)
}

fn rewrite_history_locked(dir: &Path, runs: &[RunRecord]) -> Result<(), StorageError> {
    let err = |source| StorageError::Write { what: "the run history", dir: dir.to_path_buf(), source };
    let mut text = String::new();
    for r in runs {
        text.push_str(&record_line(r).map_err(|e| err(e.into()))?);
    }
    write_atomic(dir, HISTORY_FILE, text.as_bytes()).map_err(err)
}

/// The history lock: held (exclusively) while history.jsonl is read, appended to or replaced.
/// Released when the returned file is dropped; the lock file itself stays (it holds nothing).
fn lock_history(dir: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(HISTORY_LOCK))?;
    f.lock()?;
    Ok(f)
}

// ---------------------------------------------------------------------------------------------
// Files

/// Write `name` in `dir` as a whole: a temporary file in the same directory (so that the rename
/// stays on one file system), synced, renamed over `name`, and the directory synced so that the
/// rename itself survives a power cut.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // Unique per process and per call, so that two writers never share a temporary file.
    static N_WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, dir.join(name))?;
        // Directories cannot be opened for syncing on every platform; the rename is done anyway.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Move a file that could not be used to `<name>.bad-<unix time>`: what the user made is never
/// deleted.
fn move_aside(path: &Path) -> std::io::Result<PathBuf> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut aside = path.with_file_name(format!("{name}.bad-{now}"));
    // Two bad files in the same second keep distinct names.
    let mut n = 1;
    while aside.exists() {
        aside = path.with_file_name(format!("{name}.bad-{now}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

/// `value` (the defaults) with a notice that `path` was bad (`why`) and where it went.
fn bad_file<T>(path: &Path, why: &str, value: T) -> Loaded<T> {
    let notice = match move_aside(path) {
        Ok(aside) => format!(
            "{} could not be used: {why}. It was kept as {}; Mentor Lab started from defaults.",
            path.display(),
            aside.display()
        ),
        Err(e) => format!(
            "{} could not be used: {why}, and could not be moved aside ({e}). Mentor Lab started from defaults; \
             move or remove the file by hand.",
            path.display()
        ),
    };
    Loaded { value, existed: true, notice: Some(notice) }
}

// ---------------------------------------------------------------------------------------------
// The app's saved state

/// Where the app's settings and history live, and what of them is on disk already.
#[derive(Debug)]
pub struct Persist {
    dir: PathBuf,
    /// The settings as last written (nothing is written while they are unchanged).
    saved_settings: Option<Settings>,
    /// How many of the app's runs are in the file, and the last of them as written: when the
    /// app's list no longer starts with what was written (it was cleared), the file is replaced
    /// instead of appended to.
    n_saved: usize,
    last_saved: Option<String>,
}

/// What [`Persist::open`] restored.
pub struct Restored {
    pub persist: Persist,
    pub settings: Settings,
    pub history: Vec<RunRecord>,
    /// Messages for the window (bad files moved aside, failed migrations).
    pub notices: Vec<String>,
}

impl Persist {
    /// Read the settings and history in `dir`. Where a file does not exist yet, the values saved
    /// by an earlier version (through eframe's storage: `old_settings`, `old_history`) are taken
    /// and written to the new files at once, so that no one loses their history in the move.
    pub fn open(
        dir: &Path,
        old_settings: impl FnOnce() -> Option<Settings>,
        old_history: impl FnOnce() -> Option<Vec<RunRecord>>,
    ) -> Restored {
        let mut notices = Vec::new();
        let s = load_settings(dir);
        notices.extend(s.notice);
        // Settings that came from a file need no write until they change.
        let (settings, saved_settings) = match s.existed {
            true => (s.value.clone(), Some(s.value)),
            false => {
                let mut old = old_settings().unwrap_or(s.value);
                old.sanitize();
                (old, None)
            }
        };
        let h = load_history(dir);
        notices.extend(h.notice);
        let mut history = h.value;
        let mut persist = Persist { dir: dir.to_path_buf(), saved_settings, n_saved: history.len(), last_saved: None };
        persist.last_saved = history.last().and_then(|r| record_line(r).ok());
        if !h.existed {
            if let Some(old) = old_history().filter(|o| !o.is_empty()) {
                history = old;
                persist.n_saved = 0;
            }
        }
        if let Err(e) = persist.save(&settings, &history) {
            notices.push(e.to_string());
        }
        Restored { persist, settings, history, notices }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Write what changed: the settings if they differ from the last written, the runs added
    /// since the last save (or the whole history, when it was cleared).
    pub fn save(&mut self, settings: &Settings, history: &[RunRecord]) -> Result<(), StorageError> {
        if self.saved_settings.as_ref() != Some(settings) {
            save_settings(&self.dir, settings)?;
            self.saved_settings = Some(settings.clone());
        }
        let continues = match self.n_saved {
            0 => true,
            n => history.len() >= n && history.get(n - 1).and_then(|r| record_line(r).ok()) == self.last_saved,
        };
        match continues {
            true => append_history(&self.dir, &history[self.n_saved..])?,
            false => rewrite_history(&self.dir, history)?,
        }
        self.n_saved = history.len();
        self.last_saved = history.last().and_then(|r| record_line(r).ok());
        Ok(())
    }
}
