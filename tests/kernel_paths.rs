//! The kernel path is a value of each load: two loads of the real default target in one process,
//! one with `KernelPath::Auto` and one with `KernelPath::Avx2` (and no process-wide choice), each
//! run the kernels their options name, and give the same logits bit for bit.

mod common;

use candle_core::Device;
use mentor_lab::gguf::ModelFile;
use mentor_lab::model::Transformer;
use mentor_lab::{EngineOptions, KernelPath, WeightFormat};

/// Whether the CPU has what the VNNI kernels need (AVX-512 VNNI, VL and F16C), asked here apart
/// from the kernels' own detection.
fn cpu_has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The kernels' name for the baseline SIMD of this CPU.
fn baseline_name() -> &'static str {
    match mentor_lab::kernels::q6_has_simd() {
        false => "portable",
        true if cfg!(target_arch = "aarch64") => "neon",
        true => "avx2",
    }
}

/// Every logit row of a fixed sequence of steps: a prompt chunk, single steps, a rollback and a
/// verify-sized chunk (so both single-row and multi-row kernel calls run), on the CPU step and
/// on the tensor path.
fn logit_rows(m: &mut Transformer) -> Vec<Vec<f32>> {
    let ids: Vec<u32> = (0..20u32).map(|i| (101 + 977 * i) % 49_000).collect();
    let mut rows = Vec::new();
    for cpu_step in [true, false] {
        m.set_cpu_step(cpu_step).unwrap();
        m.clear().unwrap();
        rows.extend(m.forward_rows(&ids[..12]).unwrap());
        for &id in &ids[12..15] {
            rows.extend(m.forward_rows(&[id]).unwrap());
        }
        m.truncate(13);
        rows.extend(m.forward_rows(&ids[13..20]).unwrap());
    }
    rows
}

#[test]
fn auto_and_avx2_loads_in_one_process_run_their_own_kernels_with_equal_logits() {
    let file = ModelFile::open(&common::target_path()).unwrap();
    let load = |kernel: KernelPath| {
        let options = EngineOptions { kernel, ..EngineOptions::default() };
        Transformer::load_with(&file, WeightFormat::Auto, &Device::Cpu, &options).unwrap()
    };
    let (mut auto, mut avx2) = (load(KernelPath::Auto), load(KernelPath::Avx2));
    let auto_isa = auto.kernel_isa().expect("the default target runs in the project's kernels");
    let avx2_isa = avx2.kernel_isa().expect("the default target runs in the project's kernels");
    eprintln!("auto: {auto_isa} ({auto_isa:?}); avx2: {avx2_isa} ({avx2_isa:?})");
    assert_eq!(avx2_isa.name(), baseline_name(), "{avx2_isa:?}");
    assert!(!avx2_isa.vnni() && !avx2_isa.vnni512() && !avx2_isa.tiles() && !avx2_isa.amx());
    match cpu_has_vnni() {
        true => {
            assert!(auto_isa.vnni(), "auto runs VNNI where the CPU has it: {auto_isa:?}");
            assert!(["vnni256", "vnni512", "amx"].contains(&auto_isa.name()), "{auto_isa:?}");
        }
        false => assert_eq!(auto_isa, avx2_isa, "without AVX-512 VNNI both run the baseline"),
    }
    // Every path but candle's gives the same numbers bit for bit.
    let (a, b) = (logit_rows(&mut auto), logit_rows(&mut avx2));
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.len(), y.len());
        let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "logit row {i} differs between {auto_isa} and {avx2_isa}");
    }
}
