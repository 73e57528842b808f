//! The device the engine runs on: Metal where it is built in and a small real product on it
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

/// A small real forward on `device`: a Q8_0 matrix (64 × 256) times a vector, compared with the
/// same product on the CPU. Metal accumulates quantized products in f16, so the results agree
/// to a few parts in a thousand, not bit for bit; garbage, NaN or an error fails the check.
pub fn probe_device(device: &Device) -> std::result::Result<(), String> {
    let (rows, cols) = (64usize, 256usize);
    let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let x: Vec<f32> = (0..cols).map(|i| ((i * 104_729) % 1000) as f32 / 500.0 - 1.0).collect();
    let product = |dev: &Device| -> candle_core::Result<Vec<f32>> {
        let q = QTensor::quantize(&Tensor::from_vec(w.clone(), (rows, cols), dev)?, GgmlDType::Q8_0)?;
        let xt = Tensor::from_vec(x.clone(), (1, cols), dev)?;
        QMatMul::from_qtensor(q)?.forward(&xt)?.flatten_all()?.to_device(&Device::Cpu)?.to_vec1::<f32>()
    };
    let want = product(&Device::Cpu).map_err(|e| format!("the CPU reference failed: {e}"))?;
    let got = product(device).map_err(|e| e.to_string())?;
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
    let worst =
        want.iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) });
    if got.len() != want.len() || worst > 0.02 * scale {
        return Err(format!("a test product differs from the CPU's by {worst} (scale {scale})"));
    }
    Ok(())
}

#[cfg(test)]
mod device_tests {
    use super::*;

    #[test]
    fn the_probe_passes_on_the_cpu() {
        assert_eq!(probe_device(&Device::Cpu), Ok(()));
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
