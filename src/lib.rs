//! Mentor Lab: speculative and mentored decoding with real models, instrumented so that what the
//! draft contributes — and what it costs in quality — can be seen token by token.
//!
//! The engine (everything but `app`, which the `app` feature adds) knows nothing of the UI, and
//! builds without any UI or command-line crate:
//! `gguf` opens files, `model` runs the transformer with a rollback-able KV cache, `tokenizer`
//! turns text into ids, `sampling` turns logits into distributions and tokens, `mentor` holds the
//! accept / residual rule for a TV or KL budget, `adaptive` picks the draft length, `generate`
//! runs rounds, `engine` ties a target and a draft together, `models` finds and fetches files.

pub mod adaptive;
#[cfg(feature = "app")]
pub mod app;
mod cpu_forward;
mod embedding;
/// The CPU attention kernels, public for `cargo bench`.
pub mod attention {
    pub use crate::cpu_forward::{head_attend, head_attend_rows, heads_attend, heads_attend_rows, KvRows};
}
pub mod engine;
pub mod error;
pub mod eval;
pub mod generate;
pub mod gguf;
pub mod kernels;
pub mod lookup;
pub mod mentor;
pub mod model;
pub mod models;
pub mod options;
pub mod presets;
pub mod sampling;
mod team;
pub mod tokenizer;

pub use engine::{load_model, Engine};
pub use error::{EngineError, Result};
pub use generate::{DraftLen, GenEvent, GenerateRequest, Generation, Mode, TokenInfo, TokenSource, TreeShape};
pub use mentor::{Coupling, MentorRule};
pub use model::WeightFormat;
pub use options::{EngineOptions, KernelPath};
pub use sampling::SamplingParams;

/// Set the number of CPU threads (rayon's pool, which runs our matmul kernels and candle's gemm).
/// Must run before the first tensor operation.
pub fn set_threads(n: usize) {
    if n > 0 {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        if !options::peek().batched_kernels() {
            std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
        }
    }
    init_threads();
}

/// Call first thing in `main`. When our kernels run the matrix products on x86, candle's own
/// spin-then-park pool only gets element-wise maps over a few hundred values, and its spinning
/// worker competes with rayon's for the cores: one candle thread (the caller) is faster
/// (decode 71 → 78 tok/s at 2 threads here). Variables set by the user win.
pub fn init_threads() {
    // candle asks for the thread count at every matrix product; unset, that reads the CPU list
    // from /proc each time (~2% of a decode step here). Resolve it once.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", candle_core::utils::get_num_threads().to_string());
    }
    if cfg!(target_arch = "x86_64")
        && options::peek().batched_kernels()
        && std::env::var_os("CANDLE_NUM_THREADS").is_none()
    {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
