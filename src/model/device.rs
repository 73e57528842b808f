//! The device the engine runs on: Metal where it is built in and a small real forward on it
//! matches the CPU's, else the CPU with a note.

use super::*;

/// The device the engine runs on: Metal when built with the `metal` feature and available.
pub fn default_device() -> Device {
    chosen_device().0.clone()
}

/// Why the preferred device is not used (Metal present but failing its check), for the user.
pub fn device_note() -> Option<String> {
    chosen_device().1.clone()
}

/// The device, chosen once per process: Metal where this build has it and a small real forward
/// runs correctly on it, else the CPU.
pub(super) fn chosen_device() -> &'static (Device, Option<String>) {
    static CHOSEN: std::sync::OnceLock<(Device, Option<String>)> = std::sync::OnceLock::new();
    CHOSEN.get_or_init(|| {
        #[cfg(feature = "metal")]
        {
            return choose_accelerated(|| Device::new_metal(0), "Metal");
        }
        #[allow(unreachable_code)]
        (Device::Cpu, None)
    })
}

/// Make an accelerator's device and check it with [`probe_device`]; on any failure run on the
/// CPU and say why. A Metal device can be created and then fail at its first kernel (Intel Macs,
/// older macOS), so creating it proves nothing.
pub fn choose_accelerated(make: impl FnOnce() -> candle_core::Result<Device>, name: &str) -> (Device, Option<String>) {
    let checked = make().map_err(|e| e.to_string()).and_then(|d| probe_device(&d).map(|()| d));
    match checked {
        Ok(d) => (d, None),
        Err(why) => {
            let note = format!("{name} could not run the model ({why}); running on the CPU instead.");
            tracing::warn!("{note}");
            (Device::Cpu, Some(note))
        }
    }
}

/// A small real forward on `device`, compared with the same on the CPU: one attention layer's
/// operations as the tensor path runs them (RMS norm; Q, K and V projections quantized as Q8_0,
/// Q4_K and Q6_K; both RoPE layouts; KV-cache writes; scores, softmax; SiLU) over 4 tokens, 256
/// wide. Metal accumulates quantized products in f16, so the results agree to a few parts in a
/// thousand, not bit for bit; garbage, NaN or an error fails the check.
pub fn probe_device(device: &Device) -> std::result::Result<(), String> {
    let want = probe_layer(&Device::Cpu).map_err(|e| format!("the CPU reference failed: {e}"))?;
    let got = probe_layer(device).map_err(|e| e.to_string())?;
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
    let worst =
        want.iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) });
    if got.len() != want.len() || worst > 0.02 * scale {
        return Err(format!("a test layer differs from the CPU's by {worst} (scale {scale})"));
    }
    Ok(())
}

/// The probe's layer on `dev`, its output flattened.
fn probe_layer(dev: &Device) -> candle_core::Result<Vec<f32>> {
    let (n, d, heads) = (4usize, 256usize, 4usize);
    let hd = d / heads;
    // Deterministic values in [−scale, scale).
    let values = |len: usize, k: usize, scale: f32| -> Vec<f32> {
        (0..len).map(|i| (((i * k) % 1000) as f32 / 500.0 - 1.0) * scale).collect()
    };
    {
        let x = Tensor::from_vec(values(n * d, 104_729, 1.0), (n, d), dev)?;
        let norm = Tensor::from_vec(values(d, 31, 0.5), d, dev)?.affine(1.0, 1.0)?;
        let xn = candle_nn::ops::rms_norm(&x, &norm, 1e-5)?;
        let project = |k: usize, dtype: GgmlDType| -> candle_core::Result<Tensor> {
            let w = Tensor::from_vec(values(d * d, k, 1.0 / 16.0), (d, d), dev)?;
            let y = QMatMul::from_qtensor(QTensor::quantize(&w, dtype)?)?.forward(&xn)?;
            y.reshape((1, n, heads, hd))?.transpose(1, 2)?.contiguous()
        };
        let (q, k, v) =
            (project(7919, GgmlDType::Q8_0)?, project(6007, GgmlDType::Q4K)?, project(3001, GgmlDType::Q6K)?);
        let angles: Vec<f32> =
            (0..n * hd / 2).map(|i| (i / (hd / 2)) as f32 * 0.1 * (1 + i % (hd / 2)) as f32).collect();
        let cos = Tensor::from_vec(angles.iter().map(|a| a.cos()).collect::<Vec<_>>(), (n, hd / 2), dev)?;
        let sin = Tensor::from_vec(angles.iter().map(|a| a.sin()).collect::<Vec<_>>(), (n, hd / 2), dev)?;
        let q = candle_nn::rotary_emb::rope(&q, &cos, &sin)?;
        let k = candle_nn::rotary_emb::rope_i(&k, &cos, &sin)?;
        let cache = Tensor::zeros((1, heads, 2 * n, hd), DType::F32, dev)?;
        cache.slice_set(&k, 2, 1)?;
        let k = cache.narrow(2, 1, n)?;
        let scores = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
        let att = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = candle_nn::ops::silu(&att.matmul(&v)?)?;
        out.flatten_all()?.to_device(&Device::Cpu)?.to_vec1::<f32>()
    }
}

#[cfg(test)]
mod device_tests {
    use super::*;

    #[test]
    fn the_probe_passes_on_the_cpu() {
        assert_eq!(probe_device(&Device::Cpu), Ok(()));
    }

    /// The probe's layer is finite and spread out (not saturated, zero or constant), so a device
    /// that returned zeros or a constant would fail the comparison.
    #[test]
    fn the_probe_layer_has_something_to_compare() {
        let out = probe_layer(&Device::Cpu).unwrap();
        assert_eq!(out.len(), 4 * 256);
        assert!(out.iter().all(|v| v.is_finite()));
        let (lo, hi) = out.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let scale = out.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
        assert!(hi - lo > 0.1 * scale, "the probe's output spans {lo} .. {hi}");
    }

    #[test]
    fn an_accelerator_that_fails_falls_back_to_the_cpu_with_a_note() {
        let (d, note) = choose_accelerated(|| Err(candle_core::Error::Msg("no Metal device found".into())), "Metal");
        assert!(d.is_cpu());
        let note = note.unwrap_or_default();
        assert!(note.contains("Metal could not run") && note.contains("no Metal device found"), "{note}");
        assert!(note.contains("running on the CPU"), "{note}");
        // A device that passes the check is used, with nothing to say.
        let (d, note) = choose_accelerated(|| Ok(Device::Cpu), "Metal");
        assert!(d.is_cpu() && note.is_none());
    }
}
