//! Loading: the weight plan (which format each matrix is held in, which matrices go to the
//! project's kernels), the CPU step's model, the restricted head, the RoPE tables.

use super::*;
use crate::cpu_step::CpuModel;
use crate::kernels::{Isa, Q4File, SmallBlocks};
use crate::options::EngineOptions;
use candle_core::quantized::ggml_file::qtensor_from_ggml;

/// candle has SIMD dot products for these on x86 (AVX2) and Apple Silicon (NEON); other formats
/// fall back to scalar code that is 5x slower, so `auto` re-quantizes them to Q8_0.
pub(super) fn is_fast_on_cpu(d: GgmlDType) -> bool {
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
pub(super) fn has_batched_kernel(d: GgmlDType) -> bool {
    matches!(
        d,
        GgmlDType::Q8_0
            | GgmlDType::Q4_1
            | GgmlDType::Q4_0
            | GgmlDType::Q4K
            | GgmlDType::Q5_0
            | GgmlDType::Q5_1
            | GgmlDType::Q5K
            | GgmlDType::Q6K
    )
}

/// Whether `auto` puts a file whose main format is `d` in the kernels: every quantized format
/// (those without a kernel of their own, Q3_K say, as Q8_0); float files stay with candle.
fn kernels_take(d: GgmlDType) -> bool {
    has_batched_kernel(d) || !matches!(d, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

/// What `auto` runs a matrix stored as `d` in, on the CPU with our kernels, in a file whose main
/// format our kernels handle: Q8_0 as it is; the 4- and 5-bit formats and Q6_K as they are where
/// their kernel has SIMD (fewer bytes than Q8_0 and no re-quantization), else Q8_0; anything else
/// (say a Q3_K matrix) Q8_0, so that every matrix runs in our kernels and the CPU step
/// applies.
pub(super) fn auto_batched_format(d: GgmlDType) -> Option<GgmlDType> {
    match d {
        GgmlDType::Q8_0 => None,
        GgmlDType::Q4_1 | GgmlDType::Q4_0 | GgmlDType::Q4K | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q5K
            if crate::kernels::q4_has_simd() =>
        {
            None
        }
        GgmlDType::Q6K if crate::kernels::q6_has_simd() => None,
        _ => Some(GgmlDType::Q8_0),
    }
}

/// The rows of `tokens` of an output head, where our kernels run it.
pub(super) fn small_head(head: &Linear, tokens: &[u32]) -> Option<cpu_step::SmallHead> {
    let mat = match &head.w {
        Weights::BatchedQ8(m) => m.select_rows(tokens).map(|m| cpu_step::Matrix::Q8(m.into())),
        Weights::BatchedQ4(m) => m.select_rows(tokens).map(|m| cpu_step::Matrix::Q4(m.into())),
        Weights::BatchedQ6(m) => m.select_rows(tokens).map(|m| cpu_step::Matrix::Q6(m.into())),
        Weights::Candle(_) => None,
    };
    mat.map(|w| cpu_step::SmallHead { mat: cpu_step::Mat { w, bias: None }, tokens: tokens.to_vec() })
}

/// The kernels' copy of a tied head where it holds the file's own blocks (`file`: the embedding's
/// format in the file), for the embedding to read its rows from.
fn shared_rows(head: &Linear, file: GgmlDType) -> Option<std::sync::Arc<dyn crate::kernels::RowsAsF32>> {
    match &head.w {
        Weights::BatchedQ8(m) if file == GgmlDType::Q8_0 => Some(m.clone()),
        // The 4-bit and Q6_K kernels only ever hold a file's own blocks.
        Weights::BatchedQ4(m) => Some(m.clone()),
        Weights::BatchedQ6(m) => Some(m.clone()),
        _ => None,
    }
}

/// A matrix for the CPU step, if our kernels run it.
pub(super) fn cpu_mat(l: &Linear) -> Result<Option<cpu_step::Mat>> {
    let w = match &l.w {
        Weights::BatchedQ8(m) => cpu_step::Matrix::Q8(m.clone()),
        Weights::BatchedQ4(m) => cpu_step::Matrix::Q4(m.clone()),
        Weights::BatchedQ6(m) => cpu_step::Matrix::Q6(m.clone()),
        Weights::Candle(_) => return Ok(None),
    };
    let bias = match &l.b {
        Some(b) => Some(b.flatten_all()?.to_vec1::<f32>()?),
        None => None,
    };
    Ok(Some(cpu_step::Mat { w, bias }))
}

/// The CPU step's model sharing the loaded matrices, if every one runs through our kernels.
pub(super) fn cpu_model(layers: &[Layer], out_norm: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Option<CpuModel>> {
    pub(super) fn proj(p: &Projections) -> Result<Option<cpu_step::Proj>> {
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
        Ok(Some(cpu_step::Proj { mats, sizes }))
    }
    let vec = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
    let mut out = Vec::with_capacity(layers.len());
    for l in layers {
        let (Some(qkv), Some(wo), Some(gate_up), Some(down)) =
            (proj(&l.qkv)?, cpu_mat(&l.wo)?, proj(&l.gate_up)?, cpu_mat(&l.w_down)?)
        else {
            return Ok(None);
        };
        out.push(cpu_step::Layer {
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

/// Bits per weight of a format (4.5 for Q4_0 and Q4_K, 8.5 for Q8_0).
fn bits(d: GgmlDType) -> f64 {
    (d.type_size() * 8) as f64 / d.block_size() as f64
}

/// Convert one weight matrix to the format chosen at load.
pub(super) fn convert_matrix(qt: QTensor, target: Option<GgmlDType>, device: &Device) -> Result<QMatMul> {
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
                QMatMul::from_qtensor(requantize(&qt, d, device)?)?
            }
        }
    })
}

/// Rows converted at a time by [`requantize`].
const REQUANTIZE_ROWS: usize = 4096;

/// `qt` (2-D) in format `d`, converted through f32 a few thousand rows at a time: a whole
/// embedding in f32 would be 545 MB for Qwen2.5's 151,936 × 896, the resident set's peak. Rows
/// quantize independently, so the result is what converting the whole matrix at once gives.
fn requantize(qt: &QTensor, d: GgmlDType, device: &Device) -> Result<QTensor> {
    let (dims, from) = (qt.shape().dims().to_vec(), qt.dtype());
    let (rows, cols) = match dims[..] {
        [rows, cols] if device.is_cpu() && cols % from.block_size() == 0 => (rows, cols),
        _ => return Ok(QTensor::quantize(&qt.dequantize(device)?, d)?),
    };
    let data = qt.data()?;
    let row_bytes = cols / from.block_size() * from.type_size();
    let mut out = Vec::with_capacity(rows * cols / d.block_size() * d.type_size());
    for r0 in (0..rows).step_by(REQUANTIZE_ROWS) {
        let n = REQUANTIZE_ROWS.min(rows - r0);
        let part = qtensor_from_ggml(from, &data[r0 * row_bytes..][..n * row_bytes], vec![n, cols], device)?;
        out.extend_from_slice(&QTensor::quantize(&part.dequantize(device)?, d)?.data()?);
    }
    Ok(qtensor_from_ggml(d, &out, dims, device)?)
}

/// cos/sin tables `(max_pos, head_dim / 2)`; frequency i is theta^(-2i/head_dim), divided by the
/// file's per-frequency factor when it has one (Llama 3.1 long-context scaling).
pub(super) fn rope_tables(
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

/// How the matrices of one load are held: the format each is converted to and whether the
/// project's kernels run it.
struct WeightPlan<'d> {
    format: WeightFormat,
    file_dtype: GgmlDType,
    /// The format every matrix is converted to (`None`: kept as in the file).
    target_dtype: Option<GgmlDType>,
    batched: bool,
    /// The instruction sets the kernels' matrices are built for: the options' kernel path.
    isa: Isa,
    device: &'d Device,
    /// How each matrix loaded so far is held, with how many: "Q6_K, batched kernel".
    held: std::cell::RefCell<Vec<(String, usize)>>,
}

impl<'d> WeightPlan<'d> {
    fn new(file: &ModelFile, format: WeightFormat, device: &'d Device, options: &EngineOptions) -> Self {
        let file_dtype = file.main_dtype().unwrap_or(GgmlDType::F32);
        let batched = device.is_cpu() && options.batched_kernels();
        let target_dtype = match format {
            WeightFormat::Auto if batched && kernels_take(file_dtype) => auto_batched_format(file_dtype),
            WeightFormat::Auto if device.is_cpu() && !is_fast_on_cpu(file_dtype) => Some(GgmlDType::Q8_0),
            WeightFormat::Auto | WeightFormat::File => None,
            WeightFormat::Q8_0 => Some(GgmlDType::Q8_0),
            WeightFormat::Q4_0 => Some(GgmlDType::Q4_0),
            WeightFormat::Q4_1 => Some(GgmlDType::Q4_1),
            WeightFormat::F16 => Some(GgmlDType::F16),
            WeightFormat::F32 => Some(GgmlDType::F32),
        };
        let isa = Isa::for_path(options.kernel);
        WeightPlan { format, file_dtype, target_dtype, batched, isa, device, held: Default::default() }
    }

    /// The plan in words, for `models`, `cost` and the app: the main format and whether the
    /// kernels run it, then the matrices held otherwise (a Q4_K_M file's Q6_K ones, say), counted.
    fn describe(&self) -> String {
        let main = self.target_dtype.unwrap_or(self.file_dtype);
        let kernel = self.batched && has_batched_kernel(main);
        let mut desc = Self::label(main, self.file_dtype, kernel);
        let others: Vec<String> = self
            .held
            .borrow()
            .iter()
            .filter(|(label, _)| *label != desc)
            .map(|(label, n)| format!("{n} × {label}"))
            .collect();
        if !others.is_empty() {
            desc = format!("{desc}; also {}", others.join(", "));
        }
        desc
    }

    fn label(held: GgmlDType, file: GgmlDType, kernel: bool) -> String {
        let mut label = match held == file {
            true => dtype_name(held).to_string(),
            false => format!("{} (from {})", dtype_name(held), dtype_name(file)),
        };
        label.push_str(if kernel { ", batched kernel" } else { "" });
        label
    }

    /// Count one matrix held as `w` (in our kernels: blocks of format `held`), read from the file
    /// as `file`.
    fn record(&self, w: &Weights, held: GgmlDType, file: GgmlDType) {
        let (held, kernel) = match w {
            Weights::BatchedQ8(_) => (GgmlDType::Q8_0, true),
            Weights::BatchedQ4(_) | Weights::BatchedQ6(_) => (held, true),
            Weights::Candle(QMatMul::QTensor(q)) => (q.dtype(), false),
            Weights::Candle(QMatMul::Tensor(_)) => (GgmlDType::F32, false),
            Weights::Candle(QMatMul::TensorF16(_)) => (GgmlDType::F16, false),
        };
        let label = Self::label(held, file, kernel);
        let mut all = self.held.borrow_mut();
        match all.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => all.push((label, 1)),
        }
    }

    /// One matrix converted as planned, in the project's kernel layout where one runs it; `rows`:
    /// a 4- or 5-bit matrix keeps its row layout (to select rows from it) even where the tile
    /// layout holds every output. (Q8_0 and Q6_K rows are selected from the tiles.)
    fn linear(&self, qt: QTensor, bias: Option<Tensor>, rows: bool) -> Result<Linear> {
        let file_dtype = qt.dtype();
        let target = match self.format {
            WeightFormat::Auto if self.batched && kernels_take(self.file_dtype) => auto_batched_format(qt.dtype()),
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => self.target_dtype.filter(|&d| bits(qt.dtype()) > bits(d)),
            _ => self.target_dtype,
        };
        let w = convert_matrix(qt, target, self.device)?;
        let held = match &w {
            QMatMul::QTensor(q) => q.dtype(),
            _ => file_dtype,
        };
        let w = match w {
            QMatMul::QTensor(ref q) if self.batched && q.shape().rank() == 2 => {
                let (n_out, n_in, isa) = (q.shape().dims()[0], q.shape().dims()[1], self.isa);
                let q4 = |format: Q4File| -> Result<Option<Weights>> {
                    let m = Q4Matrix::from_file(&q.data()?, n_out, n_in, format, rows, isa);
                    Ok(m.map(|m| Weights::BatchedQ4(m.into())))
                };
                let packed = match q.dtype() {
                    GgmlDType::Q8_0 => {
                        Q8Matrix::from_file(&q.data()?, n_out, n_in, false, isa).map(|m| Weights::BatchedQ8(m.into()))
                    }
                    GgmlDType::Q4_1 => q4(Q4File::Blocks(SmallBlocks::Q4_1))?,
                    GgmlDType::Q4_0 => q4(Q4File::Blocks(SmallBlocks::Q4_0))?,
                    GgmlDType::Q5_0 => q4(Q4File::Blocks(SmallBlocks::Q5_0))?,
                    GgmlDType::Q5_1 => q4(Q4File::Blocks(SmallBlocks::Q5_1))?,
                    GgmlDType::Q4K => q4(Q4File::Q4K)?,
                    GgmlDType::Q5K => q4(Q4File::Q5K)?,
                    GgmlDType::Q6K => {
                        Q6Matrix::from_q6k_bytes(&q.data()?, n_out, n_in, isa).map(|m| Weights::BatchedQ6(m.into()))
                    }
                    _ => None,
                };
                packed.unwrap_or(Weights::Candle(w))
            }
            w => Weights::Candle(w),
        };
        self.record(&w, held, file_dtype);
        Ok(Linear { w, b: bias })
    }
}

/// Reads a file's tensors by name, with errors that name the tensor and the file.
struct TensorReader<'f> {
    file: &'f ModelFile,
    reader: BufReader<File>,
    device: &'f Device,
}

impl TensorReader<'_> {
    /// The token embedding and the output head. A feature draft may come without an embedding
    /// (`feature_draft`): it then borrows its target's, and has no head of its own.
    fn embedding_and_head(&mut self, plan: &WeightPlan, feature_draft: bool) -> Result<(Embedding, Option<Linear>)> {
        if !self.has("token_embd.weight") && feature_draft {
            return Ok((Embedding::None { n_embd: self.file.config.n_embd }, None));
        }
        let tied = !self.has("output.weight");
        let head = plan.linear(self.read(if tied { "token_embd.weight" } else { "output.weight" })?, None, true)?;
        // A tied head that the kernels hold in the file's own blocks also serves the lookups;
        // otherwise the embedding stays in the file's format beside the head.
        let file_dtype = self.file.content.tensor_infos.get("token_embd.weight").map(|t| t.ggml_dtype);
        let embed = match file_dtype.and_then(|d| shared_rows(&head, d)).filter(|_| tied) {
            Some(rows) => Embedding::shared(rows),
            None => Embedding::new(std::sync::Arc::new(self.read("token_embd.weight")?), self.device)?,
        };
        Ok((embed, Some(head)))
    }

    /// RoPE's cos and sin tables, with Llama 3.1+'s per-frequency scaling factors where the file
    /// has them (long-context RoPE).
    fn rope(&mut self) -> Result<(Tensor, Tensor)> {
        let freq_factors = match self.has("rope_freqs.weight") {
            true => Some(self.read("rope_freqs.weight")?.dequantize(&Device::Cpu)?.to_vec1::<f32>()?),
            false => None,
        };
        let cfg = &self.file.config;
        let max_pos = cfg.n_ctx.clamp(1, MAX_ROPE_POS);
        rope_tables(cfg.head_dim, cfg.rope_theta, max_pos, freq_factors.as_deref(), self.device)
    }

    fn has(&self, name: &str) -> bool {
        self.file.content.tensor_infos.contains_key(name)
    }

    fn read(&mut self, name: &str) -> Result<QTensor> {
        self.file.content.tensor(&mut self.reader, name, self.device).map_err(|e| EngineError::CorruptGguf {
            path: self.file.path.clone(),
            detail: format!("tensor `{name}`: {e}"),
        })
    }

    /// A vector (a norm's weights, a bias) as an f32 tensor.
    fn vector(&mut self, name: &str) -> Result<Tensor> {
        Ok(self.read(name)?.dequantize(self.device)?)
    }

    /// Block `i`'s weights.
    fn layer(&mut self, plan: &WeightPlan, cfg: &ModelConfig, i: usize) -> Result<Layer> {
        let p = format!("blk.{i}");
        // Qwen2 has biases on the attention's q, k and v projections.
        let matrix = |r: &mut Self, name: &str| -> Result<Linear> {
            let bias_name = format!("{p}.{name}.bias");
            let biased = cfg.arch == Arch::Qwen2 && matches!(name, "attn_q" | "attn_k" | "attn_v");
            let bias = match biased && r.has(&bias_name) {
                true => Some(r.vector(&bias_name)?),
                false => None,
            };
            plan.linear(r.read(&format!("{p}.{name}.weight"))?, bias, false)
        };
        let mut qkv =
            Projections::new(vec![matrix(self, "attn_q")?, matrix(self, "attn_k")?, matrix(self, "attn_v")?])?;
        let mut gate_up = Projections::new(vec![matrix(self, "ffn_gate")?, matrix(self, "ffn_up")?])?;
        let (mut wo, mut w_down) = (matrix(self, "attn_output")?, matrix(self, "ffn_down")?);
        for l in qkv.linears_mut().chain(gate_up.linears_mut()).chain([&mut wo, &mut w_down]) {
            l.drop_row_layout();
        }
        Ok(Layer {
            attn_norm: self.vector(&format!("{p}.attn_norm.weight"))?,
            qkv,
            wo,
            ffn_norm: self.vector(&format!("{p}.ffn_norm.weight"))?,
            gate_up,
            w_down,
        })
    }

    /// A feature draft's input layers, where the CPU step runs them (`cpu_step`).
    fn feature_input(
        &mut self,
        plan: &WeightPlan,
        spec: &crate::gguf::FeatureDraftSpec,
        cpu_step: bool,
    ) -> Result<Option<cpu_step::FeatureInput>> {
        let fc = cpu_mat(&plan.linear(self.read("eagle.fc.weight")?, None, true)?)?;
        let lift = match spec.taps.is_empty() {
            true => None,
            false => cpu_mat(&plan.linear(self.read("eagle.lift_fc.weight")?, None, true)?)?,
        };
        let mut tap_norms = Vec::with_capacity(spec.taps.len());
        for i in 0..spec.taps.len() {
            tap_norms.push(self.vector(&format!("eagle.tap_norms.{i}.weight"))?.to_vec1::<f32>()?);
        }
        Ok(match (fc, lift.is_some() || spec.taps.is_empty()) {
            (Some(fc), true) if cpu_step => Some(cpu_step::FeatureInput {
                fc,
                taps: spec.taps.clone(),
                tap_norms,
                lift,
                target_embd: spec.target_embd,
            }),
            _ => None,
        })
    }
}

impl Linear {
    /// The instruction sets its kernel matrix was built for (`None` where candle runs it).
    fn isa(&self) -> Option<Isa> {
        match &self.w {
            Weights::BatchedQ8(m) => Some(m.isa()),
            Weights::BatchedQ4(m) => Some(m.isa()),
            Weights::BatchedQ6(m) => Some(m.isa()),
            Weights::Candle(_) => None,
        }
    }
}

impl Transformer {
    /// The instruction sets the project's kernels run this model with: the one every matrix of
    /// its layers and head was built for (`None` where candle runs any of them, or where they
    /// differ, which a load never does).
    pub fn kernel_isa(&self) -> Option<Isa> {
        let mut linears: Vec<&Linear> = self.head.iter().collect();
        for layer in &self.backends.tensor.layers {
            for p in [&layer.qkv, &layer.gate_up] {
                match p {
                    Projections::Fused { linear, .. } => linears.push(linear),
                    Projections::Separate(parts) => linears.extend(parts),
                }
            }
            linears.extend([&layer.wo, &layer.w_down]);
        }
        let first = linears.first()?.isa();
        linears.iter().all(|l| l.isa() == first).then_some(first).flatten()
    }

    /// Restrict a draft's head to `tokens` (a list from beside its file, see
    /// [`crate::head_tokens`]) where its file lists none; `on` says whether the restriction is in
    /// use (then for good: the full head's memory is freed). Returns whether a restricted head was
    /// built (the head must be in the kernels).
    pub fn adopt_head_tokens(&mut self, tokens: Vec<u32>, on: bool) -> bool {
        if self.head_tokens.is_some() || self.feature.is_some() {
            return false;
        }
        let Some(small) = self.head.as_ref().and_then(|h| small_head(h, &tokens)) else { return false };
        if on {
            self.weight_desc.push_str(&format!(", head restricted to {} frequent tokens", tokens.len()));
            // The full head is let go (Qwen2.5-0.5B's: 145 MB); `--full-head` loads it instead.
            // Where it is tied, the embedding keeps its rows.
            self.head = None;
        }
        self.small_head = Some(small);
        self.head_tokens = Some(tokens);
        self.restrict_head = on;
        true
    }

    /// Load with the process's options ([`crate::options::current`]).
    pub fn load(file: &ModelFile, format: WeightFormat, device: &Device) -> Result<Transformer> {
        Self::load_with(file, format, device, &crate::options::current())
    }

    /// Load with `options` choosing the paths: batched kernels or candle's matmul and the kernels'
    /// instruction sets ([`Isa::for_path`] of its kernel path, which every matrix records), the
    /// CPU step or the tensor path, the restricted or full draft head.
    pub fn load_with(
        file: &ModelFile,
        format: WeightFormat,
        device: &Device,
        options: &EngineOptions,
    ) -> Result<Transformer> {
        let cfg = file.config.clone();
        let mut r = TensorReader { file, reader: BufReader::new(File::open(&file.path)?), device };
        let plan = WeightPlan::new(file, format, device, options);
        let feature_spec =
            file.feature_draft().map_err(|detail| EngineError::CorruptGguf { path: file.path.clone(), detail })?;
        let (embed, head) = r.embedding_and_head(&plan, feature_spec.is_some())?;
        let layers = (0..cfg.n_layer).map(|i| r.layer(&plan, &cfg, i)).collect::<Result<Vec<_>>>()?;
        let mut weight_desc = plan.describe();
        let out_norm = r.vector("output_norm.weight")?;
        let (cos, sin) = r.rope()?;
        let cpu = match plan.batched && options.cpu_step {
            true => cpu_model(&layers, &out_norm, &cos, &sin)?,
            false => None,
        };
        if cpu.is_some() {
            weight_desc.push_str(", CPU step");
        }
        let head_tokens = file.head_tokens().unwrap_or_else(|e| {
            tracing::warn!("{}: {e}; using the full output head", file.path.display());
            None
        });
        let small_head = head.as_ref().zip(head_tokens.as_ref()).and_then(|(h, t)| small_head(h, t));
        let restrict_head = small_head.is_some() && options.restricted_head;
        if let (true, Some(s)) = (restrict_head, &small_head) {
            weight_desc.push_str(&format!(", head restricted to {} frequent tokens", s.tokens.len()));
        }
        let feature = match feature_spec {
            Some(spec) => {
                weight_desc.push_str(", feature draft");
                let input = r.feature_input(&plan, &spec, cpu.is_some())?;
                Some(features::FeatureDraft { spec, input, borrowed_from: None })
            }
            None => None,
        };
        let mut model = Transformer {
            config: cfg,
            device: device.clone(),
            embed,
            backends: Backends::new(TensorPath::new(layers, out_norm, (cos, sin), device.clone()), cpu),
            head,
            n_cached: 0,
            weight_desc,
            small_head,
            restrict_head,
            feature,
            head_tokens,
            tree: None,
        };
        model.clear()?;
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Converting a few thousand rows at a time gives the bytes of converting the whole matrix.
    #[test]
    fn requantizing_in_pieces_equals_the_whole_matrix() {
        let (rows, cols) = (REQUANTIZE_ROWS + 77, 64);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 / 506.5 - 1.0) * 0.3).collect();
        let t = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
        let q8 = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
        let whole = QTensor::quantize(&q8.dequantize(&Device::Cpu).unwrap(), GgmlDType::Q4_0).unwrap();
        let pieces = requantize(&q8, GgmlDType::Q4_0, &Device::Cpu).unwrap();
        assert_eq!(pieces.shape().dims(), [rows, cols]);
        assert_eq!(pieces.dtype(), GgmlDType::Q4_0);
        assert_eq!(pieces.data().unwrap(), whole.data().unwrap());
    }
}
