//! The engine's runtime switches, chosen once per process: by the command line (`--kernel`,
//! `--no-cpu-step`, `--full-head`) through [`set`], else from the environment, which is read here
//! and nowhere else (`MENTOR_LAB_KERNEL`, `MENTOR_LAB_CPU_STEP=0`, `MENTOR_LAB_FULL_HEAD=1`; and the
//! folders `MENTOR_LAB_MODELS` and `MENTOR_LAB_ASSETS`). The switches exist to compare the
//! engine's paths with each other; the defaults are the fastest paths. They reach the engine as
//! an [`EngineOptions`] value given to each load: [`current`] is only the command line's and the
//! app's way to hold the process's choice.

use crate::error::{EngineError, Result};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Which matrix kernels run on the CPU. Every path gives the same numbers bit for bit except
/// `Candle`, candle's own quantized matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelPath {
    /// The fastest the CPU has: AMX tiles, AVX-512 VNNI, AVX2 or NEON.
    #[default]
    Auto,
    /// Candle's quantized matmul instead of the project's batched kernels.
    Candle,
    /// AVX2 only (no AVX-512 VNNI, no AMX).
    Avx2,
    /// AVX-512 VNNI at 256 bits (no 512-bit vectors, no AMX).
    Vnni256,
    /// Everything but AMX (the 4-bit matrices' tile layout still runs, on `vpdpbusd`).
    NoAmx,
    /// Only the row kernels: no tile layout at all (neither AMX nor the 4-bit tiles on VNNI).
    NoTiles,
}

impl std::str::FromStr for KernelPath {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(KernelPath::Auto),
            "candle" => Ok(KernelPath::Candle),
            "avx2" => Ok(KernelPath::Avx2),
            "vnni256" => Ok(KernelPath::Vnni256),
            "noamx" => Ok(KernelPath::NoAmx),
            "notiles" => Ok(KernelPath::NoTiles),
            other => Err(format!("unknown kernel path `{other}`: use auto, candle, avx2, vnni256, noamx or notiles")),
        }
    }
}

/// The switches, as one value passed to model loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    pub kernel: KernelPath,
    /// Decode steps on the CPU run the CPU step (the project's kernels end to end) rather
    /// than the tensor path.
    pub cpu_step: bool,
    /// An independent draft's output head restricted to the tokens it was trained to propose
    /// (`false`: the full vocabulary).
    pub restricted_head: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { kernel: KernelPath::Auto, cpu_step: true, restricted_head: true }
    }
}

impl EngineOptions {
    /// The options the environment asks for. An unknown kernel path is an error that names it.
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok();
        let kernel = match var("MENTOR_LAB_KERNEL") {
            Some(v) => v.parse().map_err(|e| EngineError::InvalidSetting(format!("MENTOR_LAB_KERNEL: {e}")))?,
            None => KernelPath::Auto,
        };
        Ok(EngineOptions {
            kernel,
            cpu_step: var("MENTOR_LAB_CPU_STEP").as_deref() != Some("0"),
            restricted_head: var("MENTOR_LAB_FULL_HEAD").as_deref() != Some("1"),
        })
    }

    /// Whether the project's batched kernels run the CPU's quantized matrices.
    pub fn batched_kernels(&self) -> bool {
        self.kernel != KernelPath::Candle
    }
}

/// `$MENTOR_LAB_MODELS`, the folder the models live in, where it is set.
pub fn models_dir_from_env() -> Option<PathBuf> {
    std::env::var_os("MENTOR_LAB_MODELS").map(PathBuf::from)
}

/// `$MENTOR_LAB_ASSETS`, the folder of the shipped assets, where it is set.
pub fn assets_dir_from_env() -> Option<PathBuf> {
    std::env::var_os("MENTOR_LAB_ASSETS").map(PathBuf::from)
}

static CURRENT: OnceLock<EngineOptions> = OnceLock::new();

/// Fix the process's options. Call before the first model loads; a second call with different
/// options is an error, since kernels and weight layouts were chosen by the first.
pub fn set(options: EngineOptions) -> Result<()> {
    let now = *CURRENT.get_or_init(|| options);
    match now == options {
        true => Ok(()),
        false => Err(EngineError::InvalidSetting(format!(
            "engine options are already {now:?}; they are chosen once per process, before the first model loads"
        ))),
    }
}

/// The process's options: those [`set`] chose, else the environment's (the defaults where a
/// variable is malformed; [`EngineOptions::from_env`] reports that at the command line).
pub fn current() -> EngineOptions {
    *CURRENT.get_or_init(|| EngineOptions::from_env().unwrap_or_default())
}

/// The options [`set`] chose, else the environment's, without fixing them (for what runs before
/// the command line is read, such as the thread setup).
pub fn peek() -> EngineOptions {
    CURRENT.get().copied().unwrap_or_else(|| EngineOptions::from_env().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_paths_parse_and_unknown_ones_are_named() {
        assert_eq!("NoAMX".parse::<KernelPath>(), Ok(KernelPath::NoAmx));
        assert_eq!("candle".parse::<KernelPath>(), Ok(KernelPath::Candle));
        let e = "sse".parse::<KernelPath>().unwrap_err();
        assert!(e.contains("`sse`") && e.contains("vnni256"), "{e}");
        assert!(!EngineOptions { kernel: KernelPath::Candle, ..Default::default() }.batched_kernels());
        assert!(EngineOptions::default().batched_kernels());
    }

    #[test]
    fn options_are_fixed_once() {
        let first = current();
        assert!(set(first).is_ok());
        let other = EngineOptions { cpu_step: !first.cpu_step, ..first };
        let e = set(other).unwrap_err().to_string();
        assert!(e.contains("once per process"), "{e}");
        assert_eq!(current(), first);
    }
}
