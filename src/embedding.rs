//! The token embedding, kept in the file's own format and dequantized a row at a time.
//!
//! A forward looks up one row per new token, so holding the whole matrix as f32 buys nothing and
//! costs much: 4 bytes per weight against ~0.6 for a 4-bit file (113 MB for SmolLM2's 49152 × 576
//! embedding, about 1 GB for Llama 3.2 1B's, 2.2 GB for Qwen2.5 7B's). On the CPU the rows are
//! read straight from the quantized tensor, which a tied output head shares; elsewhere (Metal)
//! the matrix is dequantized once on the device, where lookups happen.

use crate::error::{EngineError, Result};
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0,
    BlockQ8_1, GgmlType,
};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::sync::Arc;

#[derive(Clone)]
pub enum Embedding {
    /// The quantized matrix `(n_vocab, n_embd)` as read from the file.
    Quantized { q: Arc<QTensor>, n_vocab: usize, n_embd: usize, row_bytes: usize },
    /// The rows of a tied output head held by the kernels in the file's own format.
    Shared { m: Arc<dyn crate::kernels::RowsAsF32>, n_vocab: usize, n_embd: usize },
    /// Dequantized on a device other than the CPU.
    Dense(Tensor),
    /// No embedding of its own (a feature draft before it borrows its target's).
    None { n_embd: usize },
}

impl Embedding {
    /// Lookups from a kernel matrix that already holds the file's weights (a tied head's).
    pub fn shared(m: Arc<dyn crate::kernels::RowsAsF32>) -> Embedding {
        let (n_vocab, n_embd) = m.shape();
        Embedding::Shared { m, n_vocab, n_embd }
    }

    /// Bytes the matrix takes in memory (none for rows shared with the head).
    pub fn bytes(&self) -> usize {
        match self {
            Embedding::Shared { .. } => 0,
            Embedding::Quantized { q, .. } => q.storage_size_in_bytes(),
            Embedding::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Embedding::None { .. } => 0,
        }
    }

    pub fn new(q: Arc<QTensor>, device: &Device) -> Result<Embedding> {
        let (n_vocab, n_embd) = q.shape().dims2()?;
        let dtype = q.dtype();
        if !device.is_cpu() || n_embd % dtype.block_size() != 0 {
            return Ok(Embedding::Dense(q.dequantize(device)?));
        }
        let row_bytes = n_embd / dtype.block_size() * dtype.type_size();
        Ok(Embedding::Quantized { q, n_vocab, n_embd, row_bytes })
    }

    /// The rows of `ids`, one after another (`ids.len() · n_embd` values).
    pub fn rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        match self {
            Embedding::Quantized { q, n_vocab, n_embd, row_bytes } => {
                let data = q.data()?;
                let decode = decoder(q.dtype());
                let mut out = vec![0f32; ids.len() * n_embd];
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(*n_embd)) {
                    let id = id as usize;
                    if id >= *n_vocab {
                        return Err(EngineError::InvalidSetting(format!(
                            "token id {id} is past the model's {n_vocab} embedding rows"
                        )));
                    }
                    decode(&data[id * row_bytes..(id + 1) * row_bytes], row);
                }
                Ok(out)
            }
            Embedding::Shared { m, n_vocab, n_embd } => {
                let mut out = vec![0f32; ids.len() * n_embd];
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(*n_embd)) {
                    if id as usize >= *n_vocab {
                        return Err(EngineError::InvalidSetting(format!(
                            "token id {id} is past the model's {n_vocab} embedding rows"
                        )));
                    }
                    m.row_f32(id as usize, row);
                }
                Ok(out)
            }
            Embedding::Dense(t) => {
                let ids_t = Tensor::new(ids, t.device())?;
                Ok(t.index_select(&ids_t, 0)?.flatten_all()?.to_vec1::<f32>()?)
            }
            Embedding::None { .. } => {
                Err(EngineError::InvalidSetting("this model has no token embedding of its own".into()))
            }
        }
    }

    /// The rows of `ids` as a tensor `(ids.len(), n_embd)` on `device`.
    pub fn rows_tensor(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        if let Embedding::Dense(t) = self {
            return Ok(t.index_select(&Tensor::new(ids, t.device())?, 0)?);
        }
        let n_embd = self.n_embd();
        Ok(Tensor::from_vec(self.rows(ids)?, (ids.len(), n_embd), device)?)
    }

    pub fn n_embd(&self) -> usize {
        match self {
            Embedding::Quantized { n_embd, .. } | Embedding::Shared { n_embd, .. } | Embedding::None { n_embd } => {
                *n_embd
            }
            Embedding::Dense(t) => t.dims().get(1).copied().unwrap_or(0),
        }
    }
}

type Decoder = fn(&[u8], &mut [f32]);

/// How to turn one row's bytes into f32 values, for the formats GGUF files use.
fn decoder(dtype: GgmlDType) -> Decoder {
    match dtype {
        GgmlDType::F32 => |b: &[u8], out: &mut [f32]| {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        },
        GgmlDType::F16 => |b: &[u8], out: &mut [f32]| {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        },
        GgmlDType::BF16 => |b: &[u8], out: &mut [f32]| {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        },
        GgmlDType::Q4_0 => blocks::<BlockQ4_0>,
        GgmlDType::Q4_1 => blocks::<BlockQ4_1>,
        GgmlDType::Q5_0 => blocks::<BlockQ5_0>,
        GgmlDType::Q5_1 => blocks::<BlockQ5_1>,
        GgmlDType::Q8_0 => blocks::<BlockQ8_0>,
        GgmlDType::Q8_1 => blocks::<BlockQ8_1>,
        GgmlDType::Q2K => blocks::<BlockQ2K>,
        GgmlDType::Q3K => blocks::<BlockQ3K>,
        GgmlDType::Q4K => blocks::<BlockQ4K>,
        GgmlDType::Q5K => blocks::<BlockQ5K>,
        GgmlDType::Q6K => blocks::<BlockQ6K>,
        GgmlDType::Q8K => blocks::<BlockQ8K>,
    }
}

/// Dequantize whole blocks of type `T` from their bytes in the file.
fn blocks<T: GgmlType>(bytes: &[u8], out: &mut [f32]) {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut v = vec![T::zeros(); n];
    // SAFETY: GGML blocks are `repr(C)` plain data (f16 scales, u8/i8 quants), so any bytes are a
    // valid value, and `v` holds exactly `n · size_of::<T>()` bytes, which `bytes` has.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<T>());
    }
    T::to_float(&v, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows read from the quantized bytes equal the same rows of the whole matrix dequantized by
    /// candle, for every format, bit for bit.
    #[test]
    fn rows_equal_candles_dequantization_in_every_format() {
        let (n_vocab, n_embd) = (40, 512);
        let values: Vec<f32> = (0..n_vocab * n_embd).map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0).collect();
        let dense = Tensor::from_vec(values, (n_vocab, n_embd), &Device::Cpu).unwrap();
        for dtype in [
            GgmlDType::F32,
            GgmlDType::F16,
            GgmlDType::BF16,
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
            GgmlDType::Q8_0,
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ] {
            let q = Arc::new(QTensor::quantize(&dense, dtype).unwrap());
            let whole = q.dequantize(&Device::Cpu).unwrap();
            let e = Embedding::new(q.clone(), &Device::Cpu).unwrap();
            assert!(matches!(e, Embedding::Quantized { .. }), "{dtype:?} is read as it is");
            let ids = [0u32, 39, 7, 7, 21];
            let want = whole.index_select(&Tensor::new(&ids, &Device::Cpu).unwrap(), 0).unwrap();
            let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let got = e.rows(&ids).unwrap();
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{dtype:?}");
            assert!(e.rows(&[40]).is_err(), "{dtype:?}: an id past the vocabulary is an error");
            // The kernels' own copy, where one holds this format as it is, gives the same rows.
            let bytes = q.data().unwrap();
            let shared: Option<Arc<dyn crate::kernels::RowsAsF32>> = match dtype {
                GgmlDType::Q8_0 => {
                    crate::kernels::Q8Matrix::from_ggml_bytes(&bytes, n_vocab, n_embd, crate::kernels::Isa::best())
                        .map(|m| Arc::new(m) as _)
                }
                GgmlDType::Q4_0 | GgmlDType::Q4_1 => crate::kernels::Q4Matrix::from_ggml_bytes(
                    &bytes,
                    n_vocab,
                    n_embd,
                    dtype == GgmlDType::Q4_1,
                    crate::kernels::Isa::best(),
                )
                .map(|m| Arc::new(m) as _),
                GgmlDType::Q4K => {
                    crate::kernels::Q4Matrix::from_q4k_bytes(&bytes, n_vocab, n_embd, crate::kernels::Isa::best())
                        .map(|m| Arc::new(m) as _)
                }
                GgmlDType::Q5K => {
                    crate::kernels::Q4Matrix::from_q5k_bytes(&bytes, n_vocab, n_embd, crate::kernels::Isa::best())
                        .map(|m| Arc::new(m) as _)
                }
                GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
                    let format = match dtype {
                        GgmlDType::Q5_0 => crate::kernels::SmallBlocks::Q5_0,
                        _ => crate::kernels::SmallBlocks::Q5_1,
                    };
                    crate::kernels::Q4Matrix::from_blocks(&bytes, n_vocab, n_embd, format, crate::kernels::Isa::best())
                        .map(|m| Arc::new(m) as _)
                }
                GgmlDType::Q6K => {
                    crate::kernels::Q6Matrix::from_q6k_bytes(&bytes, n_vocab, n_embd, crate::kernels::Isa::best())
                        .map(|m| Arc::new(m) as _)
                }
                _ => None,
            };
            if let Some(m) = shared {
                let e = Embedding::shared(m);
                let got = e.rows(&ids).unwrap();
                // Equal values (Q4_0's and Q5_0's zero weights may be +0 here where GGML's (q − 8)·d gives −0).
                assert!(got.iter().zip(&want).all(|(a, b)| a == b), "{dtype:?} from the kernels");
                assert!(e.rows(&[40]).is_err(), "{dtype:?}: an id past the vocabulary is an error");
            }
        }
    }
}
