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
/// The CPU attention kernels, public for `cargo bench`.
pub mod corpus;
mod cpu_step;
mod embedding;
pub mod attention {
    pub use crate::cpu_step::{head_attend, head_attend_rows, heads_attend, heads_attend_rows, KvRows};
}
pub mod engine;
pub mod error;
pub mod eval;
pub mod fetch;
pub mod generate;
pub mod gguf;
pub mod head_tokens;
pub mod kernels;
pub mod lookup;
pub mod mentor;
pub mod model;
pub mod models;
pub mod options;
pub mod pairs;
pub mod presets;
pub mod sampling;
mod team;
pub mod tokenizer;
pub mod vecmath;

pub use engine::{load_model, Engine};
pub use error::{EngineError, Result};
pub use generate::{
    Adaptive, Branches, DraftLen, Drafting, GenEvent, GenerateRequest, Generation, Lookup, Mode, TokenInfo,
    TokenSource, TreeShape, Verify,
};
pub use mentor::{Coupling, MentorRule};
pub use model::WeightFormat;
pub use options::{EngineOptions, KernelPath};
pub use sampling::SamplingParams;
