//! The transformer, in the shape speculative decoding needs: `forward` takes a chunk of new tokens
//! and returns logits for *every* one of them, and the KV cache can be truncated back to any
//! length (rolling back rejected draft tokens) or cleared.
//!
//! One model file covers the `llama` and `qwen2` GGUF architectures; they differ only in attention
//! biases (qwen2) and in which dimensions RoPE pairs up (see [`crate::gguf::Arch`]).

use crate::cpu_forward::{self, CpuModel};
use crate::embedding::Embedding;
use crate::error::{EngineError, Result};
use crate::gguf::{dtype_name, Arch, ModelConfig, ModelFile};
use crate::kernels::{Q4Matrix, Q8Matrix};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::fs::File;
use std::io::BufReader;

/// How the weight matrices are held in memory, chosen at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// The file's format unless candle runs it slowly on this device (then Q8_0).
    #[default]
    Auto,
    /// Exactly what the file holds.
    File,
    Q8_0,
    F16,
    F32,
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "file" => Ok(Self::File),
            "q8_0" | "q8" => Ok(Self::Q8_0),
            "f16" => Ok(Self::F16),
            "f32" => Ok(Self::F32),
            _ => Err(format!("unknown weight format `{s}`: use auto, file, q8_0, f16 or f32")),
        }
    }
}

/// The weights of a linear layer, `(out, in)`.
#[derive(Debug, Clone)]
enum Weights {
    /// candle's own matmul (any format, any device).
    Candle(QMatMul),
    /// Q8_0 on the CPU through our batched kernel (one pass over the weights for all rows).
    BatchedQ8(std::sync::Arc<Q8Matrix>),
    /// Q4_1 / Q4_0 on the CPU through our batched kernel.
    BatchedQ4(std::sync::Arc<Q4Matrix>),
}

/// One linear layer `y = x W^T (+ b)`.
#[derive(Debug, Clone)]
struct Linear {
    w: Weights,
    b: Option<Tensor>,
}

impl Linear {
    fn n_out(&self) -> usize {
        match &self.w {
            Weights::Candle(QMatMul::QTensor(q)) => q.shape().dims()[0],
            Weights::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t.dims()[0],
            Weights::BatchedQ8(m) => m.n_out,
            Weights::BatchedQ4(m) => m.n_out,
        }
    }

    /// `x: (n, in)` → `(n, out)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.w {
            Weights::Candle(w) => w.forward(x)?,
            Weights::BatchedQ8(m) => {
                let n = x.dims()[0];
                let v = x.flatten_all()?.to_vec1::<f32>()?;
                Tensor::from_vec(m.matmul(&v, n), (n, m.n_out), x.device())?
            }
            Weights::BatchedQ4(m) => {
                let n = x.dims()[0];
                let v = x.flatten_all()?.to_vec1::<f32>()?;
                Tensor::from_vec(m.matmul(&v, n), (n, m.n_out), x.device())?
            }
        };
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Linear layers applied to the same input (Q, K and V; FFN gate and up). With our CPU kernels
/// their matrices are stacked into one at load, so a step quantizes the input once and hands the
/// threads one task list instead of three (or two).
#[derive(Debug, Clone)]
enum Projections {
    Fused { linear: Linear, sizes: Vec<usize> },
    Separate(Vec<Linear>),
}

impl Projections {
    fn new(parts: Vec<Linear>) -> Result<Projections> {
        let sizes: Vec<usize> = parts.iter().map(|l| l.n_out()).collect();
        let stacked = if parts.iter().all(|l| matches!(l.w, Weights::BatchedQ8(_))) {
            let ms: Vec<&Q8Matrix> =
                parts.iter().filter_map(|l| if let Weights::BatchedQ8(m) = &l.w { Some(&**m) } else { None }).collect();
            Q8Matrix::stack(&ms).map(|m| Weights::BatchedQ8(m.into()))
        } else if parts.iter().all(|l| matches!(l.w, Weights::BatchedQ4(_))) {
            let ms: Vec<&Q4Matrix> =
                parts.iter().filter_map(|l| if let Weights::BatchedQ4(m) = &l.w { Some(&**m) } else { None }).collect();
            Q4Matrix::stack(&ms).map(|m| Weights::BatchedQ4(m.into()))
        } else {
            None
        };
        let biases: Vec<&Tensor> = parts.iter().filter_map(|l| l.b.as_ref()).collect();
        let bias = match biases.len() {
            0 => Some(None),
            n if n == parts.len() => Some(Some(Tensor::cat(&biases, 0)?)),
            _ => None, // only some parts have a bias: keep them separate
        };
        Ok(match (stacked, bias) {
            (Some(w), Some(b)) => Projections::Fused { linear: Linear { w, b }, sizes },
            _ => Projections::Separate(parts),
        })
    }

    /// One `(n, out_i)` tensor per projection, in the order given to `new`.
    fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Projections::Separate(parts) => parts.iter().map(|l| l.forward(x)).collect(),
            Projections::Fused { linear, sizes } => {
                let y = linear.forward(x)?;
                let mut offset = 0;
                let mut out = Vec::with_capacity(sizes.len());
                for &n in sizes {
                    out.push(y.narrow(1, offset, n)?);
                    offset += n;
                }
                Ok(out)
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Layer {
    attn_norm: Tensor,    // (n_embd)
    qkv: Projections,     // (n_head * head_dim | n_kv_head * head_dim | n_kv_head * head_dim, n_embd)
    wo: Linear,           // (n_embd, n_head * head_dim)
    ffn_norm: Tensor,     // (n_embd)
    gate_up: Projections, // (n_ff | n_ff, n_embd)
    w_down: Linear,       // (n_embd, n_ff)
}

/// Keys and values of one layer. The buffers are over-allocated and grown by doubling so that a
/// decode step writes in place instead of copying the whole cache.
#[derive(Debug, Clone)]
struct LayerCache {
    k: Tensor, // (1, n_kv_head, capacity, head_dim)
    v: Tensor, // (1, n_kv_head, capacity, head_dim)
}

pub struct Transformer {
    pub config: ModelConfig,
    device: Device,
    /// (n_vocab, n_embd), as in the file, for the token lookup.
    embed: Embedding,
    layers: Vec<Layer>,
    out_norm: Tensor, // (n_embd)
    /// (n_vocab, n_embd); the embedding matrix when tied. None for a feature draft that borrows
    /// its target's ([`Self::borrow_embedding`]).
    head: Option<Linear>,
    cos: Tensor, // (max_pos, head_dim / 2)
    sin: Tensor, // (max_pos, head_dim / 2)
    cache: Vec<LayerCache>,
    cache_capacity: usize,
    /// Number of positions held in the KV cache.
    n_cached: usize,
    /// Human-readable weight format actually used, e.g. "Q8_0 (from Q4_1)".
    pub weight_desc: String,
    /// The same model for the tensor-free CPU step, when every matrix runs through our kernels.
    cpu: Option<CpuModel>,
    /// Whether `forward` uses `cpu` (on by default where it exists).
    native: bool,
    /// The output head restricted to the tokens the file lists (`mentor_lab.head_tokens`), with
    /// our kernels only; used while `restrict_head` is on.
    small_head: Option<cpu_forward::SmallHead>,
    restrict_head: bool,
    /// Set for a feature draft (a model that reads its target's hidden states).
    feature_spec: Option<crate::gguf::FeatureDraftSpec>,
    /// A feature draft's input layers, where our kernels run them.
    features: Option<cpu_forward::FeatureInput>,
    /// The tokens the file restricts the output head to.
    head_tokens: Option<Vec<u32>>,
    /// The head matrix whose embedding and rows a feature draft borrowed (its address, to tell
    /// whether the next run's target is the same).
    borrowed_from: Option<usize>,
}

/// Logits of a forward over several tokens, each row computed when first asked for
/// ([`Transformer::forward_lazy`]).
#[derive(Debug, Clone)]
pub struct LazyLogits {
    hidden: Vec<f32>, // (n, n_embd); empty when every row was computed at once
    rows: Vec<Option<Vec<f32>>>,
}

impl LazyLogits {
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// The final hidden states `(n, n_embd)` of the forward's rows, where the tensor-free step ran
    /// it (empty otherwise).
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }
    /// Row `i`, if computed ([`Transformer::lazy_rows`]).
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        self.rows.get(i)?.as_deref()
    }
}

/// candle has SIMD dot products for these on x86 (AVX2) and Apple Silicon (NEON); other formats
/// fall back to scalar code that is 5x slower, so `auto` re-quantizes them to Q8_0.
fn is_fast_on_cpu(d: GgmlDType) -> bool {
    matches!(
        d,
        GgmlDType::F32
            | GgmlDType::F16
            | GgmlDType::Q4_0
            | GgmlDType::Q8_0
            | GgmlDType::Q2K
            | GgmlDType::Q3K
            | GgmlDType::Q4K
            | GgmlDType::Q5K
            | GgmlDType::Q6K
            | GgmlDType::Q8K
    )
}

/// Formats our batched CPU kernels handle.
fn has_batched_kernel(d: GgmlDType) -> bool {
    matches!(d, GgmlDType::Q8_0 | GgmlDType::Q4_1 | GgmlDType::Q4_0)
}

/// What `auto` runs a matrix stored as `d` in, on the CPU with our kernels, in a file whose main
/// format our kernels handle: Q8_0 as it is; the 4-bit formats as they are where the 4-bit kernel
/// has SIMD (half the bytes of Q8_0 and no re-quantization; measured faster from 1 to 16 rows,
/// README), else Q8_0; anything else (say a Q6_K output head) Q8_0, so that every matrix runs in
/// our kernels and the tensor-free step applies.
fn auto_batched_format(d: GgmlDType) -> Option<GgmlDType> {
    match d {
        GgmlDType::Q8_0 => None,
        GgmlDType::Q4_1 | GgmlDType::Q4_0 if crate::kernels::q4_has_simd() => None,
        _ => Some(GgmlDType::Q8_0),
    }
}

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
fn chosen_device() -> &'static (Device, Option<String>) {
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

const INITIAL_CACHE: usize = 256;
/// RoPE tables are precomputed up to this many positions (or the model's context, if smaller).
const MAX_ROPE_POS: usize = 32_768;

impl Transformer {
    /// Load with the process's options ([`crate::options::current`]).
    pub fn load(file: &ModelFile, format: WeightFormat, device: &Device) -> Result<Transformer> {
        Self::load_with(file, format, device, &crate::options::current())
    }

    /// Load with `options` choosing the paths: batched kernels or candle's matmul, the CPU step or
    /// the tensor path, the restricted or full draft head. (The kernels' instruction set is the
    /// process's, fixed at its first use.)
    pub fn load_with(
        file: &ModelFile,
        format: WeightFormat,
        device: &Device,
        options: &crate::options::EngineOptions,
    ) -> Result<Transformer> {
        let cfg = file.config.clone();
        let mut reader = BufReader::new(File::open(&file.path)?);
        let path = file.path.clone();
        let ct = &file.content;
        let mut read = |name: &str| -> Result<QTensor> {
            ct.tensor(&mut reader, name, device)
                .map_err(|e| EngineError::CorruptGguf { path: path.clone(), detail: format!("tensor `{name}`: {e}") })
        };
        let file_dtype = file.main_dtype().unwrap_or(GgmlDType::F32);
        let batched = device.is_cpu() && options.batched_kernels();
        let target_dtype = match format {
            WeightFormat::Auto if batched && has_batched_kernel(file_dtype) => auto_batched_format(file_dtype),
            WeightFormat::Auto if device.is_cpu() && !is_fast_on_cpu(file_dtype) => Some(GgmlDType::Q8_0),
            WeightFormat::Auto | WeightFormat::File => None,
            WeightFormat::Q8_0 => Some(GgmlDType::Q8_0),
            WeightFormat::F16 => Some(GgmlDType::F16),
            WeightFormat::F32 => Some(GgmlDType::F32),
        };
        let mut weight_desc = match target_dtype {
            Some(d) if d != file_dtype => format!("{} (from {})", dtype_name(d), dtype_name(file_dtype)),
            _ => dtype_name(file_dtype).to_string(),
        };
        if batched && has_batched_kernel(target_dtype.unwrap_or(file_dtype)) {
            weight_desc.push_str(", batched kernel");
        }
        let to_linear = |qt: QTensor, bias: Option<Tensor>| -> Result<Linear> {
            let target = match format {
                WeightFormat::Auto if batched && has_batched_kernel(file_dtype) => auto_batched_format(qt.dtype()),
                _ => target_dtype,
            };
            let w = convert_matrix(qt, target, device)?;
            let w = match w {
                QMatMul::QTensor(ref q) if batched && q.shape().rank() == 2 => {
                    let (n_out, n_in) = (q.shape().dims()[0], q.shape().dims()[1]);
                    let packed = match q.dtype() {
                        GgmlDType::Q8_0 => {
                            Q8Matrix::from_ggml_bytes(&q.data()?, n_out, n_in).map(|m| Weights::BatchedQ8(m.into()))
                        }
                        GgmlDType::Q4_1 => Q4Matrix::from_ggml_bytes(&q.data()?, n_out, n_in, true)
                            .map(|m| Weights::BatchedQ4(m.into())),
                        GgmlDType::Q4_0 => Q4Matrix::from_ggml_bytes(&q.data()?, n_out, n_in, false)
                            .map(|m| Weights::BatchedQ4(m.into())),
                        _ => None,
                    };
                    packed.unwrap_or(Weights::Candle(w))
                }
                w => Weights::Candle(w),
            };
            Ok(Linear { w, b: bias })
        };
        let vector = |qt: QTensor| -> Result<Tensor> { Ok(qt.dequantize(device)?) };

        // A feature draft may come without an embedding: it then borrows its target's.
        let own_embedding =
            ct.tensor_infos.contains_key("token_embd.weight") || file.feature_draft().ok().flatten().is_none();
        let (embed, head_q) = match own_embedding {
            true => {
                let embed = Embedding::new(std::sync::Arc::new(read("token_embd.weight")?), device)?;
                // A tied head reads the embedding again: the head's kernels keep their own layout.
                let head =
                    if ct.tensor_infos.contains_key("output.weight") { "output.weight" } else { "token_embd.weight" };
                (embed, Some(read(head)?))
            }
            false => (Embedding::None { n_embd: cfg.n_embd }, None),
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let p = format!("blk.{i}");
            let mut bias = |name: &str| -> Result<Option<Tensor>> {
                let full = format!("{p}.{name}.bias");
                if cfg.arch == Arch::Qwen2 && ct.tensor_infos.contains_key(&full) {
                    Ok(Some(read(&full)?.dequantize(device)?))
                } else {
                    Ok(None)
                }
            };
            let (bq, bk, bv) = (bias("attn_q")?, bias("attn_k")?, bias("attn_v")?);
            layers.push(Layer {
                attn_norm: vector(read(&format!("{p}.attn_norm.weight"))?)?,
                qkv: Projections::new(vec![
                    to_linear(read(&format!("{p}.attn_q.weight"))?, bq)?,
                    to_linear(read(&format!("{p}.attn_k.weight"))?, bk)?,
                    to_linear(read(&format!("{p}.attn_v.weight"))?, bv)?,
                ])?,
                wo: to_linear(read(&format!("{p}.attn_output.weight"))?, None)?,
                ffn_norm: vector(read(&format!("{p}.ffn_norm.weight"))?)?,
                gate_up: Projections::new(vec![
                    to_linear(read(&format!("{p}.ffn_gate.weight"))?, None)?,
                    to_linear(read(&format!("{p}.ffn_up.weight"))?, None)?,
                ])?,
                w_down: to_linear(read(&format!("{p}.ffn_down.weight"))?, None)?,
            });
        }
        let out_norm = vector(read("output_norm.weight")?)?;
        let head = head_q.map(|q| to_linear(q, None)).transpose()?;
        // Llama 3.1+ stores per-frequency scaling factors for long-context RoPE.
        let freq_factors = if ct.tensor_infos.contains_key("rope_freqs.weight") {
            Some(read("rope_freqs.weight")?.dequantize(&Device::Cpu)?.to_vec1::<f32>()?)
        } else {
            None
        };
        let max_pos = cfg.n_ctx.clamp(1, MAX_ROPE_POS);
        let (cos, sin) = rope_tables(cfg.head_dim, cfg.rope_theta, max_pos, freq_factors.as_deref(), device)?;
        let cpu = if batched && options.cpu_step { cpu_model(&layers, &out_norm, &cos, &sin)? } else { None };
        if cpu.is_some() {
            weight_desc.push_str(", tensor-free step");
        }
        let head_tokens = match file.head_tokens() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("{}: {e}; using the full output head", file.path.display());
                None
            }
        };
        let small_head = match (&head, &head_tokens) {
            (Some(head), Some(tokens)) => small_head(head, tokens),
            _ => None,
        };
        let restrict_head = small_head.is_some() && options.restricted_head;
        if let (true, Some(s)) = (restrict_head, &small_head) {
            weight_desc.push_str(&format!(", head restricted to {} frequent tokens", s.tokens.len()));
        }
        let feature_spec =
            file.feature_draft().map_err(|detail| EngineError::CorruptGguf { path: path.clone(), detail })?;
        let features = match &feature_spec {
            Some(spec) => {
                let fc = cpu_mat(&to_linear(read("eagle.fc.weight")?, None)?)?;
                let lift = match spec.taps.is_empty() {
                    true => None,
                    false => cpu_mat(&to_linear(read("eagle.lift_fc.weight")?, None)?)?,
                };
                let mut tap_norms = Vec::with_capacity(spec.taps.len());
                for i in 0..spec.taps.len() {
                    tap_norms.push(vector(read(&format!("eagle.tap_norms.{i}.weight"))?)?.to_vec1::<f32>()?);
                }
                match (fc, lift.is_some() || spec.taps.is_empty()) {
                    (Some(fc), true) if cpu.is_some() => Some(cpu_forward::FeatureInput {
                        fc,
                        taps: spec.taps.clone(),
                        tap_norms,
                        lift,
                        target_embd: spec.target_embd,
                    }),
                    _ => None,
                }
            }
            None => None,
        };
        if feature_spec.is_some() {
            weight_desc.push_str(", feature draft");
        }
        let mut model = Transformer {
            config: cfg,
            device: device.clone(),
            embed,
            layers,
            out_norm,
            head,
            cos,
            sin,
            cache: Vec::new(),
            cache_capacity: 0,
            n_cached: 0,
            weight_desc,
            native: cpu.is_some(),
            cpu,
            small_head,
            restrict_head,
            feature_spec,
            features,
            head_tokens,
            borrowed_from: None,
        };
        model.clear()?;
        Ok(model)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Positions currently in the KV cache.
    pub fn n_cached(&self) -> usize {
        self.n_cached
    }

    /// Largest context this instance can run (RoPE tables and the model's own limit).
    pub fn max_context(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Forget everything: the next forward starts at position 0. The buffers are kept (their
    /// old contents are simply overwritten).
    pub fn clear(&mut self) -> Result<()> {
        self.n_cached = 0;
        if self.cache.is_empty() && !self.native {
            self.allocate_cache(INITIAL_CACHE.min(self.max_context()))?;
        }
        Ok(())
    }

    /// Roll the cache back to its first `len` positions (exact: later positions are simply
    /// overwritten by the next forward).
    pub fn truncate(&mut self, len: usize) {
        self.n_cached = self.n_cached.min(len);
    }

    fn allocate_cache(&mut self, capacity: usize) -> Result<()> {
        let c = &self.config;
        let shape = (1, c.n_kv_head, capacity, c.head_dim);
        let mut cache = Vec::with_capacity(c.n_layer);
        for old in self.cache.iter() {
            let k = Tensor::zeros(shape, DType::F32, &self.device)?;
            let v = Tensor::zeros(shape, DType::F32, &self.device)?;
            if self.n_cached > 0 {
                k.slice_set(&old.k.narrow(2, 0, self.n_cached)?.contiguous()?, 2, 0)?;
                v.slice_set(&old.v.narrow(2, 0, self.n_cached)?.contiguous()?, 2, 0)?;
            }
            cache.push(LayerCache { k, v });
        }
        while cache.len() < c.n_layer {
            cache.push(LayerCache {
                k: Tensor::zeros(shape, DType::F32, &self.device)?,
                v: Tensor::zeros(shape, DType::F32, &self.device)?,
            });
        }
        self.cache = cache;
        self.cache_capacity = capacity;
        Ok(())
    }

    /// Run `tokens` at positions `n_cached .. n_cached + tokens.len()` and return their logits,
    /// one row per token: `(n_new, n_vocab)`.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Tensor> {
        if self.device.is_cpu() && !self.native && rayon::current_thread_index().is_none() {
            // The tensor path runs the whole step on a pool thread: the kernels' parallel sections
            // then share the caller's thread instead of waking two workers while the caller sleeps
            // (with as many workers as cores, the caller otherwise competes with the spinning
            // workers). The tensor-free step runs its sections on `crate::team` from this thread.
            return rayon::scope(|_| self.forward_impl(tokens));
        }
        self.forward_impl(tokens)
    }

    /// Whether steps run tensor-free on the CPU ([`crate::cpu_forward`]).
    pub fn native_step(&self) -> bool {
        self.native
    }

    /// Switch between the tensor-free CPU step and the tensor path (where both exist); forgets the
    /// cache. For comparing the two.
    pub fn set_native_step(&mut self, on: bool) -> Result<()> {
        self.native = on && self.cpu.is_some();
        self.cache.clear();
        self.cache_capacity = 0;
        self.n_cached = 0;
        self.clear()
    }

    /// Number of tokens the output head is restricted to, while it is.
    pub fn head_restriction(&self) -> Option<usize> {
        self.small_head.as_ref().filter(|_| self.restrict_head).map(|s| s.tokens.len())
    }

    /// Use the restricted output head (where the file lists tokens for one) or the full one.
    /// Returns whether the head is now restricted.
    pub fn set_head_restricted(&mut self, on: bool) -> bool {
        self.restrict_head = on && self.small_head.is_some();
        self.restrict_head
    }

    /// For a feature draft: the target blocks it reads, and the target shape it needs.
    pub fn feature_spec(&self) -> Option<&crate::gguf::FeatureDraftSpec> {
        self.feature_spec.as_ref()
    }

    /// Keep the residual streams after `taps` from every forward (for a feature draft reading
    /// this model; see [`Self::last_taps`]); empty stops it. Needs the tensor-free CPU step.
    pub fn set_taps(&mut self, taps: &[usize]) -> Result<()> {
        match self.cpu.as_mut().filter(|_| self.native) {
            Some(cpu) => {
                cpu.taps = taps.to_vec();
                Ok(())
            }
            None if taps.is_empty() => Ok(()),
            None => Err(EngineError::InvalidSetting(
                "a feature draft needs the target on the CPU step (its hidden states are read there); \
                 use an independent draft on this device"
                    .into(),
            )),
        }
    }

    /// The residual streams after the tapped blocks from the last forward, `(n, taps · n_embd)`.
    pub fn last_taps(&self) -> &[f32] {
        self.cpu.as_ref().map(|c| c.tap_out.as_slice()).unwrap_or(&[])
    }

    /// Feed `tokens` and return their final hidden states `(n, n_embd)` (the tensor-free step).
    pub fn feed_hidden(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_new_tokens(tokens)?;
        self.native_hidden(tokens)?.ok_or_else(|| EngineError::InvalidSetting("hidden states need the CPU step".into()))
    }

    /// A feature draft's features from its target's final hidden states `f: (n, n_embd)` and
    /// tapped residual streams (`(n, taps · n_embd)`, [`Self::last_taps`]).
    pub fn lift_features(&self, f: &[f32], taps: &[f32]) -> Result<Vec<f32>> {
        let fi = self.feature_input()?;
        if !f.len().is_multiple_of(fi.target_embd)
            || taps.len() != f.len() / fi.target_embd * fi.target_embd * fi.taps.len()
        {
            return Err(EngineError::InvalidSetting(
                "feature draft: target hidden states and taps do not match".into(),
            ));
        }
        Ok(fi.lift(f, taps, self.config.rms_eps as f32))
    }

    /// A feature draft's step over positions `n_cached ..`: row i reads the feature of position
    /// `n_cached + i` and the embedding of the token after it, `tokens[i]`. Returns the predicted
    /// next feature of the last row and the draft's logits from it.
    pub fn forward_features(&mut self, tokens: &[u32], feats: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
        self.check_new_tokens(tokens)?;
        let d = self.config.n_embd;
        if feats.len() != tokens.len() * d {
            return Err(EngineError::InvalidSetting("feature draft: one feature per token expected".into()));
        }
        let pos = self.n_cached;
        let emb = self.embed.rows(tokens)?;
        let x = self.feature_input()?.input(&emb, feats);
        let max = self.cos.dims()[0];
        let Some(cpu) = self.cpu.as_mut() else {
            return Err(EngineError::InvalidSetting("feature draft needs the CPU step".into()));
        };
        cpu.reserve(&self.config, pos + tokens.len(), pos, max);
        let h = cpu.forward(&self.config, x, pos);
        self.n_cached = pos + tokens.len();
        let last = h[h.len() - d..].to_vec();
        let logits = match (&self.small_head, self.restrict_head) {
            // The borrowed head rows, straight into the one buffer (no tensor round trip).
            (Some(s), true) => s.logits(&last, 1, self.config.n_vocab),
            _ => self.head_logits(last.clone(), 1)?.flatten_all()?.to_vec1::<f32>()?,
        };
        Ok((last, logits))
    }

    fn full_head(&self) -> Result<&Linear> {
        self.head.as_ref().ok_or_else(|| {
            EngineError::InvalidSetting(
                "this feature draft has no output head of its own; it borrows its target's".into(),
            )
        })
    }

    /// A feature draft without an embedding of its own takes its target's: the token embedding
    /// and the head rows of the tokens its file lists. Cheap when `target` is the one it already
    /// borrowed from.
    pub fn borrow_embedding(&mut self, target: &Transformer) -> Result<()> {
        if self.head.is_some() {
            return Ok(());
        }
        let head = target.full_head()?;
        let key = match &head.w {
            Weights::BatchedQ8(m) => std::sync::Arc::as_ptr(m) as usize,
            Weights::BatchedQ4(m) => std::sync::Arc::as_ptr(m) as usize,
            Weights::Candle(_) => 0,
        };
        if key != 0 && self.borrowed_from == Some(key) {
            return Ok(());
        }
        if target.config.n_embd != self.config.n_embd {
            return Err(EngineError::InvalidSetting(format!(
                "the feature draft is {} wide but the target's embedding is {} wide",
                self.config.n_embd, target.config.n_embd
            )));
        }
        let tokens = self.head_tokens.as_ref().ok_or_else(|| {
            EngineError::InvalidSetting(
                "a feature draft without an embedding must list its head tokens (`mentor_lab.head_tokens`)".into(),
            )
        })?;
        if tokens.last().is_some_and(|&t| t as usize >= target.config.n_vocab) {
            return Err(EngineError::InvalidSetting(
                "the feature draft's head tokens are outside the target's vocabulary".into(),
            ));
        }
        self.small_head = Some(small_head(head, tokens).ok_or_else(|| {
            EngineError::InvalidSetting(
                "the target's output head is not in a format the feature draft can read (Q8_0 or Q4)".into(),
            )
        })?);
        self.restrict_head = true;
        self.embed = target.embed.clone();
        self.borrowed_from = Some(key);
        Ok(())
    }

    /// Whether this model runs on tokens alone (every model but a feature draft).
    fn tokens_alone(&self) -> Result<()> {
        match self.feature_spec {
            Some(_) => Err(EngineError::InvalidSetting(
                "this model is a feature draft: it reads the target's hidden states, so it runs only as the draft \
                 of a mentored or speculative run; pick an independent draft for draft-only runs"
                    .into(),
            )),
            None => Ok(()),
        }
    }

    fn feature_input(&self) -> Result<&cpu_forward::FeatureInput> {
        self.features.as_ref().filter(|_| self.native).ok_or_else(|| {
            EngineError::InvalidSetting(
                "this feature draft runs only on the CPU step with its matrices in Q8_0 or Q4".into(),
            )
        })
    }

    /// Tokens a forward may take: at least one, within the context, inside the vocabulary.
    fn check_new_tokens(&self, tokens: &[u32]) -> Result<()> {
        let (n_new, pos) = (tokens.len(), self.n_cached);
        if n_new == 0 {
            return Err(EngineError::InvalidSetting("forward called with no tokens".into()));
        }
        if pos + n_new > self.max_context() {
            return Err(EngineError::PromptTooLong { n_prompt: pos, n_new, n_ctx: self.max_context() });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.n_vocab) {
            return Err(EngineError::InvalidSetting(format!(
                "token id {bad} is outside the model's vocabulary of {}",
                self.config.n_vocab
            )));
        }
        Ok(())
    }

    fn forward_impl(&mut self, tokens: &[u32]) -> Result<Tensor> {
        let n_new = tokens.len();
        let pos = self.n_cached;
        self.check_new_tokens(tokens)?;
        self.tokens_alone()?;
        if let Some(h) = self.native_hidden(tokens)? {
            return self.head_logits(h, n_new);
        }
        if pos + n_new > self.cache_capacity {
            let mut cap = self.cache_capacity.max(1);
            while cap < pos + n_new {
                cap *= 2;
            }
            self.allocate_cache(cap.min(self.max_context()))?;
        }
        let mut x = self.embed.rows_tensor(tokens, &self.device)?; // (n_new, n_embd)
        let cos = self.cos.narrow(0, pos, n_new)?;
        let sin = self.sin.narrow(0, pos, n_new)?;
        let mask = if n_new > 1 { Some(self.causal_mask(pos, n_new)?) } else { None };
        let eps = self.config.rms_eps as f32;
        for (layer, cache) in self.layers.iter().zip(self.cache.iter()) {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let attn = attention(&self.config, layer, cache, &h, pos, &cos, &sin, mask.as_ref())?;
            x = (x + attn)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
            let (gate, up) = match layer.gate_up.forward(&h)?.as_slice() {
                [g, u] => (candle_nn::ops::silu(g)?, u.clone()),
                _ => return Err(EngineError::InvalidSetting("FFN projections: expected gate and up".into())),
            };
            x = (x + layer.w_down.forward(&(gate * up)?)?)?;
        }
        self.n_cached = pos + n_new;
        let x = candle_nn::ops::rms_norm(&x, &self.out_norm, eps)?;
        if let (Some(s), true) = (&self.small_head, self.restrict_head) {
            let h = x.flatten_all()?.to_vec1::<f32>()?;
            return Ok(Tensor::from_vec(
                s.logits(&h, n_new, self.config.n_vocab),
                (n_new, self.config.n_vocab),
                &self.device,
            )?);
        }
        let logits = self.full_head()?.forward(&x)?; // (n_new, n_vocab)
        Ok(logits.to_dtype(DType::F32)?)
    }

    /// The tensor-free step's final hidden states `(n, n_embd)` for `tokens` (already checked by
    /// the caller), when that step applies; None leaves the forward to the tensor path.
    fn native_hidden(&mut self, tokens: &[u32]) -> Result<Option<Vec<f32>>> {
        let (n_new, pos) = (tokens.len(), self.n_cached);
        if !self.native {
            return Ok(None);
        }
        self.tokens_alone()?;
        let Some(cpu) = self.cpu.as_mut() else { return Ok(None) };
        let x = self.embed.rows(tokens)?;
        cpu.reserve(&self.config, pos + n_new, pos, self.cos.dims()[0]);
        let h = cpu.forward(&self.config, x, pos);
        self.n_cached = pos + n_new;
        Ok(Some(h))
    }

    /// Logits `(n, n_vocab)` of final hidden states `h: (n, n_embd)`.
    fn head_logits(&self, h: Vec<f32>, n: usize) -> Result<Tensor> {
        Ok(match (&self.small_head, self.restrict_head) {
            (Some(s), true) => {
                Tensor::from_vec(s.logits(&h, n, self.config.n_vocab), (n, self.config.n_vocab), &self.device)?
            }
            _ => self
                .full_head()?
                .forward(&Tensor::from_vec(h, (n, self.config.n_embd), &self.device)?)?
                .to_dtype(DType::F32)?,
        })
    }

    /// Forward and copy the logits to host memory, one `Vec` per new token.
    pub fn forward_rows(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        Ok(self.forward(tokens)?.to_device(&Device::Cpu)?.to_vec2::<f32>()?)
    }

    /// Feed `tokens` into the cache without computing any logits (the prompt's prefill). On the
    /// CPU the default target's output head costs about a quarter as much per row as the rest of
    /// the forward, all of it wasted on rows nobody reads. The tensor path computes them anyway.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        if self.native && self.cpu.is_some() {
            self.check_new_tokens(tokens)?;
            if self.native_hidden(tokens)?.is_some() {
                return Ok(());
            }
        }
        self.forward(tokens).map(|_| ())
    }

    /// Feed `tokens` and return the logits of the last one only (a draft catching up on the
    /// tokens it has not seen needs no other row). The same values as the last row of
    /// [`Self::forward_rows`]: the kernels give each row the same result batched or alone.
    pub fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let missing = || EngineError::InvalidSetting("forward returned no logits".into());
        if self.native && self.cpu.is_some() {
            self.check_new_tokens(tokens)?;
            if let Some(hidden) = self.native_hidden(tokens)? {
                let d = self.config.n_embd;
                let last = hidden.len().checked_sub(d).map(|start| hidden[start..].to_vec()).ok_or_else(missing)?;
                return self.head_logits(last, 1)?.to_device(&Device::Cpu)?.to_vec2::<f32>()?.pop().ok_or_else(missing);
            }
        }
        self.forward_rows(tokens)?.pop().ok_or_else(missing)
    }

    /// A forward whose vocabulary head runs only for the rows asked for ([`Self::lazy_rows`]).
    /// Verification stops at the first rejected draft token, so the rows after it are never
    /// used; on the CPU the head (49152 × 576 for the default target) costs about as much per
    /// row batched as alone, so skipping them saves their whole cost. Where the tensor-free step
    /// does not apply, all rows are computed at once, as by [`Self::forward_rows`].
    pub fn forward_lazy(&mut self, tokens: &[u32]) -> Result<LazyLogits> {
        let n = tokens.len();
        if self.native && self.cpu.is_some() && !self.restrict_head {
            self.check_new_tokens(tokens)?;
            let hidden = self.native_hidden(tokens)?;
            if let Some(hidden) = hidden {
                return Ok(LazyLogits { hidden, rows: vec![None; n] });
            }
        }
        Ok(LazyLogits { hidden: Vec::new(), rows: self.forward_rows(tokens)?.into_iter().map(Some).collect() })
    }

    /// Make rows `..upto` of `l` available, computing the missing ones in one batch.
    pub fn lazy_rows(&self, l: &mut LazyLogits, upto: usize) -> Result<()> {
        let upto = upto.min(l.rows.len());
        let Some(first) = l.rows[..upto].iter().position(|r| r.is_none()) else { return Ok(()) };
        let d = self.config.n_embd;
        let h = l
            .hidden
            .get(first * d..upto * d)
            .ok_or_else(|| EngineError::InvalidSetting("lazy logits: hidden states missing".into()))?
            .to_vec();
        let on_pool = self.device.is_cpu() && !self.native && rayon::current_thread_index().is_none();
        let logits = if on_pool {
            rayon::scope(|_| self.head_logits(h, upto - first))?
        } else {
            self.head_logits(h, upto - first)?
        };
        for (slot, row) in l.rows[first..upto].iter_mut().zip(logits.to_device(&Device::Cpu)?.to_vec2::<f32>()?) {
            *slot = Some(row);
        }
        Ok(())
    }

    /// Additive mask for `n_new` queries at positions `pos..pos+n_new` over `pos+n_new` keys,
    /// repeated for the query heads that share a KV head (rows are ordered (head in group, query)):
    ///
    /// ```text
    ///          keys: 0 .. pos-1 | pos .. pos+n_new-1
    /// query 0:       0 ...   0  | 0  -inf -inf
    /// query 1:       0 ...   0  | 0   0   -inf
    /// ```
    fn causal_mask(&self, pos: usize, n_new: usize) -> Result<Tensor> {
        let n_rep = self.config.n_head / self.config.n_kv_head;
        let n_keys = pos + n_new;
        let mut m = vec![0f32; n_rep * n_new * n_keys];
        for r in 0..n_rep {
            for i in 0..n_new {
                let row = &mut m[(r * n_new + i) * n_keys..(r * n_new + i + 1) * n_keys];
                for v in row.iter_mut().skip(pos + i + 1) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        Ok(Tensor::from_vec(m, (n_rep * n_new, n_keys), &self.device)?)
    }
}

/// Self-attention of one layer over `h: (n_new, n_embd)`, appending the new keys and values to
/// `cache` at `pos`. Grouped-query attention without copying K/V: the `n_rep` query heads that
/// share a KV head are stacked along the query axis, `(1, n_kv_head, n_rep * n_new, head_dim)`.
#[allow(clippy::too_many_arguments)]
fn attention(
    cfg: &ModelConfig,
    layer: &Layer,
    cache: &LayerCache,
    h: &Tensor,
    pos: usize,
    cos: &Tensor,
    sin: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let n_new = h.dims()[0];
    let (n_head, n_kv, hd) = (cfg.n_head, cfg.n_kv_head, cfg.head_dim);
    let split_heads = |t: Tensor, n: usize| -> Result<Tensor> {
        Ok(t.reshape((n_new, n, hd))?.transpose(0, 1)?.contiguous()?.reshape((1, n, n_new, hd))?)
    };
    let (q, k, v) = match layer.qkv.forward(h)?.as_slice() {
        [q, k, v] => (split_heads(q.clone(), n_head)?, split_heads(k.clone(), n_kv)?, split_heads(v.clone(), n_kv)?),
        _ => return Err(EngineError::InvalidSetting("attention projections: expected Q, K and V".into())),
    };
    let (q, k) = match cfg.arch {
        Arch::Llama => (candle_nn::rotary_emb::rope_i(&q, cos, sin)?, candle_nn::rotary_emb::rope_i(&k, cos, sin)?),
        Arch::Qwen2 => (candle_nn::rotary_emb::rope(&q, cos, sin)?, candle_nn::rotary_emb::rope(&k, cos, sin)?),
    };
    cache.k.slice_set(&k, 2, pos)?;
    cache.v.slice_set(&v, 2, pos)?;
    let n_keys = pos + n_new;
    let k_all = cache.k.narrow(2, 0, n_keys)?; // (1, n_kv, n_keys, hd)
    let v_all = cache.v.narrow(2, 0, n_keys)?;
    let n_rep = n_head / n_kv;
    let q = q.reshape((1, n_kv, n_rep * n_new, hd))?;
    let scale = 1.0 / (hd as f64).sqrt();
    let att = (q.matmul(&k_all.t()?)? * scale)?; // (1, n_kv, n_rep * n_new, n_keys)
    let att = match mask {
        Some(m) => att.broadcast_add(m)?,
        None => att,
    };
    let att = candle_nn::ops::softmax_last_dim(&att)?;
    let y = att.matmul(&v_all)?; // (1, n_kv, n_rep * n_new, hd)
    let y = y.reshape((n_head, n_new, hd))?.transpose(0, 1)?.contiguous()?.reshape((n_new, n_head * hd))?;
    layer.wo.forward(&y)
}

/// The rows of `tokens` of an output head, where our kernels run it.
fn small_head(head: &Linear, tokens: &[u32]) -> Option<cpu_forward::SmallHead> {
    let mat = match &head.w {
        Weights::BatchedQ8(m) => m.select_rows(tokens).map(|m| cpu_forward::Matrix::Q8(m.into())),
        Weights::BatchedQ4(m) => m.select_rows(tokens).map(|m| cpu_forward::Matrix::Q4(m.into())),
        Weights::Candle(_) => None,
    };
    mat.map(|w| cpu_forward::SmallHead { mat: cpu_forward::Mat { w, bias: None }, tokens: tokens.to_vec() })
}

/// A matrix for the tensor-free step, if our kernels run it.
fn cpu_mat(l: &Linear) -> Result<Option<cpu_forward::Mat>> {
    let w = match &l.w {
        Weights::BatchedQ8(m) => cpu_forward::Matrix::Q8(m.clone()),
        Weights::BatchedQ4(m) => cpu_forward::Matrix::Q4(m.clone()),
        Weights::Candle(_) => return Ok(None),
    };
    let bias = match &l.b {
        Some(b) => Some(b.flatten_all()?.to_vec1::<f32>()?),
        None => None,
    };
    Ok(Some(cpu_forward::Mat { w, bias }))
}

/// The tensor-free CPU model sharing the loaded matrices, if every one runs through our kernels.
fn cpu_model(layers: &[Layer], out_norm: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Option<CpuModel>> {
    fn proj(p: &Projections) -> Result<Option<cpu_forward::Proj>> {
        let (linears, sizes): (Vec<&Linear>, Vec<usize>) = match p {
            Projections::Fused { linear, sizes } => (vec![linear], sizes.clone()),
            Projections::Separate(parts) => (parts.iter().collect(), parts.iter().map(|l| l.n_out()).collect()),
        };
        let mut mats = Vec::with_capacity(linears.len());
        for l in linears {
            match cpu_mat(l)? {
                Some(m) => mats.push(m),
                None => return Ok(None),
            }
        }
        Ok(Some(cpu_forward::Proj { mats, sizes }))
    }
    let vec = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
    let mut out = Vec::with_capacity(layers.len());
    for l in layers {
        let (Some(qkv), Some(wo), Some(gate_up), Some(down)) =
            (proj(&l.qkv)?, cpu_mat(&l.wo)?, proj(&l.gate_up)?, cpu_mat(&l.w_down)?)
        else {
            return Ok(None);
        };
        out.push(cpu_forward::Layer {
            attn_norm: vec(&l.attn_norm)?,
            qkv,
            wo,
            ffn_norm: vec(&l.ffn_norm)?,
            gate_up,
            down,
        });
    }
    Ok(Some(CpuModel::new(out, vec(out_norm)?, vec(cos)?, vec(sin)?)))
}

/// Convert one weight matrix to the format chosen at load.
fn convert_matrix(qt: QTensor, target: Option<GgmlDType>, device: &Device) -> Result<QMatMul> {
    Ok(match target {
        None => QMatMul::from_qtensor(qt)?,
        Some(GgmlDType::F32) => QMatMul::Tensor(qt.dequantize(device)?),
        Some(GgmlDType::F16) => QMatMul::TensorF16(qt.dequantize_f16(device)?),
        Some(d) if d == qt.dtype() => QMatMul::from_qtensor(qt)?,
        Some(d) => {
            let cols = qt.shape().dims().last().copied().unwrap_or(0);
            if cols % d.block_size() != 0 {
                // Rows that do not fill whole quantization blocks stay in the file's format.
                QMatMul::from_qtensor(qt)?
            } else {
                QMatMul::from_qtensor(QTensor::quantize(&qt.dequantize(device)?, d)?)?
            }
        }
    })
}

/// cos/sin tables `(max_pos, head_dim / 2)`; frequency i is theta^(-2i/head_dim), divided by the
/// file's per-frequency factor when it has one (Llama 3.1 long-context scaling).
fn rope_tables(
    head_dim: usize,
    theta: f32,
    max_pos: usize,
    factors: Option<&[f32]>,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| {
            let f = 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32);
            match factors.and_then(|fs| fs.get(i)) {
                Some(&s) if s > 0.0 => f / s,
                _ => f,
            }
        })
        .collect();
    let mut cos = Vec::with_capacity(max_pos * half);
    let mut sin = Vec::with_capacity(max_pos * half);
    for p in 0..max_pos {
        for &f in &inv_freq {
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    Ok((Tensor::from_vec(cos, (max_pos, half), device)?, Tensor::from_vec(sin, (max_pos, half), device)?))
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
