//! Errors of the engine. Every variant says what went wrong *and* what the user can do about it:
//! the CLI prints them as they are and the app shows them in its message bar.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("model file not found: {path}. Check the path, or run `mentor-lab models` to list the GGUF files Mentor Lab knows.")]
    ModelNotFound { path: PathBuf },

    #[error("{path} is not a GGUF file (it does not start with the GGUF magic bytes). Mentor Lab loads GGUF models: pick a .gguf file, or convert the model with llama.cpp's convert_hf_to_gguf.py.")]
    NotGguf { path: PathBuf },

    #[error("{path} is truncated or corrupt ({detail}). Download the file again; a partial download looks like this.")]
    CorruptGguf { path: PathBuf, detail: String },

    #[error("{path}: model architecture `{arch}` is not supported. Mentor Lab runs `llama` (SmolLM2, Llama 3.x) and `qwen2` (Qwen2.5) GGUF models.")]
    UnsupportedArch { path: PathBuf, arch: String },

    #[error("{path}: the GGUF metadata lacks `{key}`. The file was written by a converter Mentor Lab does not understand; try a GGUF made by a recent llama.cpp.")]
    MissingMetadata { path: PathBuf, key: String },

    #[error("the prompt is empty: type a prompt (or pick a preset) and run again.")]
    EmptyPrompt,

    #[error("the prompt is {n_prompt} tokens and {n_new} new tokens were asked for, but the model's context holds {n_ctx}. Shorten the prompt or lower the maximum number of tokens.")]
    PromptTooLong { n_prompt: usize, n_new: usize, n_ctx: usize },

    #[error("tokenizer of {path}: {detail}")]
    Tokenizer { path: PathBuf, detail: String },

    #[error("chat template of {path}: {detail}. Use raw mode (--raw) to skip the template.")]
    Template { path: PathBuf, detail: String },

    #[error("the draft {draft} cannot be used with the target {target}: {detail}. A draft must share the target's tokenizer (e.g. Qwen2.5-0.5B for Qwen2.5-7B, Llama 3.2 1B for Llama 3.1 8B).")]
    VocabMismatch { target: PathBuf, draft: PathBuf, detail: String },

    #[error("invalid setting: {0}")]
    InvalidSetting(String),

    /// A broken invariant of the engine itself, not something the user did.
    #[error("internal error: {0}. This is a bug in Mentor Lab; please report it with the model and settings used.")]
    Internal(String),

    #[error("fetching a model failed: {0}")]
    Fetch(String),

    #[error(
        "the fetch was cancelled; the parts already fetched are kept in {kept}, and fetching again resumes from them."
    )]
    FetchCancelled { kept: PathBuf },

    #[error("model computation failed: {0}")]
    Candle(#[from] candle_core::Error),

    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, EngineError>;
