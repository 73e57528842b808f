//! The instruction sets the kernels run, as a value: what the CPU has, masked by a
//! [`KernelPath`]. Each matrix records the [`Isa`] it was built for; its layout (the tile layout,
//! Q8_0's block sums) and its run-time dispatch both follow it, so matrices built for different
//! paths run side by side in one process (and give the same numbers bit for bit).

use crate::options::KernelPath;
use std::sync::OnceLock;

/// Which of the CPU's instruction sets a matrix's kernels use. Built only by [`Isa::for_path`],
/// from what the CPU has, so a flag is never on where the CPU lacks it: the kernels' dispatch
/// calls their `target_feature` functions on the strength of these flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Isa {
    vnni: bool,
    vnni512: bool,
    tiles: bool,
    amx: bool,
}

impl Isa {
    /// No extension past the baseline SIMD (AVX2 or NEON, where the CPU has them).
    const BASE: Isa = Isa { vnni: false, vnni512: false, tiles: false, amx: false };

    /// What the CPU has for `path`: the `avx2` path turns VNNI off, `vnni256` the 512-bit vectors
    /// (and with them the tiles and AMX), `notiles` the tile layout and AMX, `noamx` AMX alone;
    /// `auto` and `candle` keep all (candle's matmul runs no kernel matrices).
    pub fn for_path(path: KernelPath) -> Isa {
        let cpu = Isa::cpu();
        let vnni = cpu.vnni && path != KernelPath::Avx2;
        let vnni512 = vnni && cpu.vnni512 && path != KernelPath::Vnni256;
        let tiles = vnni512 && cpu.tiles && path != KernelPath::NoTiles;
        // Linux is asked for the AMX tile state only where a path would use it.
        let amx = tiles && path != KernelPath::NoAmx && super::amx::granted();
        Isa { vnni, vnni512, tiles, amx }
    }

    /// The fastest the CPU has ([`KernelPath::Auto`]).
    pub fn best() -> Isa {
        Isa::for_path(KernelPath::Auto)
    }

    /// What the CPU has, AMX aside (see [`Isa::for_path`]), detected once.
    fn cpu() -> Isa {
        static CPU: OnceLock<Isa> = OnceLock::new();
        *CPU.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let vnni = is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("f16c");
                let vnni512 = vnni && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
                // The tile layout's kernels are built for Linux only (with its AMX calls).
                Isa { vnni, vnni512, tiles: vnni512 && cfg!(target_os = "linux"), ..Isa::BASE }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                Isa::BASE
            }
        })
    }

    /// AVX-512 VNNI on 256-bit vectors (with VL and F16C): `vpdpbusd` in the row kernels, and
    /// Q8_0 matrices hold their blocks' weight sums for it.
    pub fn vnni(self) -> bool {
        self.vnni
    }

    /// The VNNI kernels on 512-bit vectors too (AVX-512 F and BW).
    pub fn vnni512(self) -> bool {
        self.vnni512
    }

    /// Matrices hold the 16-output tile layout, run with `vpdpbusd` (Linux on x86-64).
    pub fn tiles(self) -> bool {
        self.tiles
    }

    /// Calls of several rows on the tiles take Intel AMX.
    pub fn amx(self) -> bool {
        self.amx
    }

    /// The kernels' name: `amx`, `vnni512`, `vnni256`, `avx2`, `neon` or `portable` (the row
    /// kernels where the CPU has no SIMD path for them).
    pub fn name(self) -> &'static str {
        match self {
            Isa { amx: true, .. } => "amx",
            Isa { vnni512: true, .. } => "vnni512",
            Isa { vnni: true, .. } => "vnni256",
            _ if !super::q6_has_simd() => "portable",
            _ if cfg!(target_arch = "aarch64") => "neon",
            _ => "avx2",
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())?;
        if self.vnni512 && !self.tiles {
            f.write_str(" (no tiles)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each path takes away what it names and nothing the CPU lacks is ever on.
    #[test]
    fn paths_mask_the_cpu() {
        let best = Isa::best();
        assert!(!best.vnni512 || best.vnni, "512-bit VNNI implies VNNI");
        assert!(!best.tiles || best.vnni512, "tiles imply 512-bit VNNI");
        assert!(!best.amx || best.tiles, "AMX implies tiles");
        assert_eq!(Isa::for_path(KernelPath::Candle), best);
        assert_eq!(Isa::for_path(KernelPath::Avx2), Isa::BASE);
        assert_eq!(Isa::for_path(KernelPath::Vnni256), Isa { vnni: best.vnni, ..Isa::BASE });
        assert_eq!(Isa::for_path(KernelPath::NoTiles), Isa { tiles: false, amx: false, ..best });
        assert_eq!(Isa::for_path(KernelPath::NoAmx), Isa { amx: false, ..best });
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            assert_eq!(Isa::for_path(KernelPath::Avx2).name(), "avx2");
        }
        assert_eq!(best.vnni, best.name().starts_with("vnni") || best.name() == "amx");
    }
}
