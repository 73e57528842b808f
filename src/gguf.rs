//! Opening a GGUF file: validation (is it GGUF, is it whole, is the architecture one we run) and
//! the model configuration read from its metadata. Nothing here touches tensor data beyond
//! checking that it fits in the file.

use crate::error::{EngineError, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};

mod reader;
use reader::{read_content, HeaderError};
use std::path::{Path, PathBuf};

/// The transformer families we have model code for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// SmolLM2, Llama 3.x: no attention biases, RoPE on adjacent pairs (llama.cpp's "norm" mode).
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k, v; RoPE on half-split pairs ("neox" mode).
    Qwen2,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// Hyper-parameters of one model, from GGUF metadata and tensor shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    /// Rows of the output head, which may exceed the tokenizer's vocabulary (padded vocabularies).
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub rope_theta: f32,
    pub rms_eps: f64,
}

/// An opened, validated GGUF file. Keeps the parsed header so that loading weights and building the
/// tokenizer do not parse it again.
pub const HEAD_TOKENS_KEY: &str = "mentor_lab.head_tokens";

pub const FEATURE_TAPS_KEY: &str = "mentor_lab.feature_draft.taps";
pub const FEATURE_LAYERS_KEY: &str = "mentor_lab.feature_draft.target_layers";
pub const FEATURE_EMBD_KEY: &str = "mentor_lab.feature_draft.target_embd";

/// What a feature draft reads from its target ([`ModelFile::feature_draft`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureDraftSpec {
    pub taps: Vec<usize>,
    pub target_layers: usize,
    pub target_embd: usize,
}

#[derive(Debug)]
pub struct ModelFile {
    pub path: PathBuf,
    pub content: Content,
    pub config: ModelConfig,
    pub file_size: u64,
}

/// A one-line description of a model file, for `mentor-lab models` and the app's model list.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub name: String,
    pub arch: String,
    pub n_params: u64,
    pub quantization: String,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub file_size: u64,
    /// A feature draft: it reads a target's hidden states (`mentor_lab.feature_draft.*`), so it
    /// pairs with that target only and drafts on the CPU step. Absent in records written before
    /// the field existed.
    #[serde(default)]
    pub feature_draft: bool,
}

impl ModelFile {
    /// Drop the tokenizer's token, merge, type and score lists from the metadata (several MB for
    /// a vocabulary of 49,152 tokens) once the tokenizer is built and its digest taken, so that
    /// they are not held while the weights load.
    pub fn drop_tokenizer_lists(&mut self) {
        for key in
            ["tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"]
        {
            self.content.metadata.remove(key);
        }
    }

    pub fn open(path: &Path) -> Result<ModelFile> {
        if !path.is_file() {
            return Err(EngineError::ModelNotFound { path: path.to_path_buf() });
        }
        let file = File::open(path)?;
        let file_size = file.metadata()?.len();
        ModelFile::from_reader(path, &mut BufReader::new(file), file_size)
    }

    /// Parse and validate a GGUF from `reader`, which holds `file_size` bytes; `path` names it in
    /// errors (and is where the weights are read from later). Every size in the header is checked
    /// against `file_size` before anything is allocated for it.
    pub fn from_reader(path: &Path, reader: &mut impl Read, file_size: u64) -> Result<ModelFile> {
        let content = read_content(reader, file_size).map_err(|e| match e {
            HeaderError::NotGguf => EngineError::NotGguf { path: path.to_path_buf() },
            HeaderError::Corrupt(detail) => EngineError::CorruptGguf { path: path.to_path_buf(), detail },
        })?;
        let config = read_config(path, &content)?;
        check_shapes(path, &content, &config)?;
        Ok(ModelFile { path: path.to_path_buf(), content, config, file_size })
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// The tokens a draft's output head may be restricted to (`mentor_lab.head_tokens`, written by
    /// `train/export_gguf.py --head_tokens`): ascending, unique, inside the vocabulary. `Err` says
    /// what is wrong with a key that is present but unusable.
    pub fn head_tokens(&self) -> std::result::Result<Option<Vec<u32>>, String> {
        let Some(v) = self.content.metadata.get(HEAD_TOKENS_KEY) else { return Ok(None) };
        let items = v.to_vec().map_err(|e| format!("`{HEAD_TOKENS_KEY}` is not an array: {e}"))?;
        let ids: Vec<u32> = items
            .iter()
            .map(|x| x.to_u32())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| format!("`{HEAD_TOKENS_KEY}` must hold u32 token ids: {e}"))?;
        if ids.is_empty()
            || ids.windows(2).any(|w| w[0] >= w[1])
            || ids.last().is_some_and(|&l| l as usize >= self.config.n_vocab)
        {
            return Err(format!(
                "`{HEAD_TOKENS_KEY}` must be non-empty, ascending, unique token ids below {}",
                self.config.n_vocab
            ));
        }
        Ok(Some(ids))
    }

    /// For a feature draft (`train/export_eagle.py`): the target blocks whose outputs it reads
    /// (ascending), and the target's block count and width it was trained on. `Ok(None)` for any
    /// other model; `Err` says what is wrong with keys that are present but unusable.
    pub fn feature_draft(&self) -> std::result::Result<Option<FeatureDraftSpec>, String> {
        let md = &self.content.metadata;
        let Some(v) = md.get(FEATURE_TAPS_KEY) else { return Ok(None) };
        let bad = |what: &str| format!("feature draft metadata: {what}; re-export the file with train/export_eagle.py");
        let items = v.to_vec().map_err(|_| bad(&format!("`{FEATURE_TAPS_KEY}` is not an array")))?;
        let taps: Vec<usize> = items
            .iter()
            .map(|x| x.to_u32().map(|t| t as usize))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad(&format!("`{FEATURE_TAPS_KEY}` must hold u32 block indices")))?;
        let num = |key: &str| -> std::result::Result<usize, String> {
            md.get(key)
                .and_then(|v| v.to_u32().ok())
                .map(|v| v as usize)
                .ok_or_else(|| bad(&format!("`{key}` is missing")))
        };
        let (target_layers, target_embd) = (num(FEATURE_LAYERS_KEY)?, num(FEATURE_EMBD_KEY)?);
        if taps.windows(2).any(|w| w[0] >= w[1]) || taps.last().is_some_and(|&t| t >= target_layers) {
            return Err(bad(&format!("taps {taps:?} must be ascending block indices below {target_layers}")));
        }
        if target_embd != self.config.n_embd {
            return Err(bad(&format!(
                "it reads {target_embd}-wide features but its block is {} wide",
                self.config.n_embd
            )));
        }
        Ok(Some(FeatureDraftSpec { taps, target_layers, target_embd }))
    }

    pub fn meta_str(&self, key: &str) -> Option<&str> {
        self.content.metadata.get(key).and_then(|v| v.to_string().ok()).map(|s| s.as_str())
    }

    pub fn info(&self) -> ModelInfo {
        let n_params = self.content.tensor_infos.values().map(|t| t.shape.elem_count() as u64).sum();
        let name = self
            .meta_str("general.name")
            .map(str::to_string)
            .or_else(|| self.path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default();
        ModelInfo {
            path: self.path.clone(),
            name,
            arch: self.config.arch.name().to_string(),
            n_params,
            quantization: self.main_dtype().map(dtype_name).unwrap_or("?").to_string(),
            n_vocab: self.config.n_vocab,
            n_ctx: self.config.n_ctx,
            file_size: self.file_size,
            feature_draft: self.content.metadata.contains_key(FEATURE_TAPS_KEY),
        }
    }

    /// Bytes of the transformer blocks' tensors (`blk.*`): what each step reads besides the
    /// embedding row and the output head.
    pub fn block_bytes(&self) -> u64 {
        let infos = self.content.tensor_infos.iter().filter(|(name, _)| name.starts_with("blk."));
        // The header's sizes were checked when the file was read, so none fails here.
        infos.filter_map(|(_, t)| reader::tensor_bytes(t.shape.dims(), t.ggml_dtype).ok()).sum()
    }

    /// The dtype holding most of the weights (what users call the file's quantization).
    pub fn main_dtype(&self) -> Option<GgmlDType> {
        let mut by_dtype: Vec<(GgmlDType, usize)> = Vec::new();
        for t in self.content.tensor_infos.values() {
            let n = t.shape.elem_count();
            match by_dtype.iter_mut().find(|(d, _)| *d == t.ggml_dtype) {
                Some((_, total)) => *total += n,
                None => by_dtype.push((t.ggml_dtype, n)),
            }
        }
        by_dtype.into_iter().max_by_key(|(_, n)| *n).map(|(d, _)| d)
    }
}

pub fn dtype_name(d: GgmlDType) -> &'static str {
    match d {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

const MAX_HEAD_DIM: usize = 1024;

fn read_config(path: &Path, content: &Content) -> Result<ModelConfig> {
    let md = &content.metadata;
    let missing = |key: &str| EngineError::MissingMetadata { path: path.to_path_buf(), key: key.to_string() };
    let arch_name = md
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .ok_or_else(|| missing("general.architecture"))?
        .clone();
    let arch = match arch_name.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        _ => return Err(EngineError::UnsupportedArch { path: path.to_path_buf(), arch: arch_name }),
    };
    let get_usize = |key: &str| -> Result<usize> {
        let full = format!("{arch_name}.{key}");
        md.get(&full)
            .and_then(|v| v.to_u64().ok().or_else(|| v.to_u32().ok().map(u64::from)))
            .map(|v| v as usize)
            .ok_or_else(|| missing(&full))
    };
    let get_f64 = |key: &str| -> Option<f64> {
        md.get(&format!("{arch_name}.{key}")).and_then(|v| v.to_f32().ok().map(f64::from).or_else(|| v.to_f64().ok()))
    };
    let n_embd = get_usize("embedding_length")?;
    let n_head = get_usize("attention.head_count")?;
    let n_kv_head = get_usize("attention.head_count_kv").unwrap_or(n_head);
    let n_layer = get_usize("block_count")?;
    let n_ff = get_usize("feed_forward_length")?;
    let n_ctx = get_usize("context_length")?;
    let head_dim = get_usize("attention.key_length").unwrap_or(n_embd / n_head.max(1));
    let rms_eps = get_f64("attention.layer_norm_rms_epsilon").unwrap_or(1e-5);
    let rope_theta = get_f64("rope.freq_base").unwrap_or(10_000.0) as f32;
    // A feature draft may come without an embedding (it borrows its target's) and then states
    // its vocabulary size.
    let n_vocab = match (content.tensor_infos.get("token_embd.weight"), md.contains_key(FEATURE_TAPS_KEY)) {
        (Some(embd), _) => embd.shape.dims().first().copied().unwrap_or(0),
        (None, true) => get_usize("vocab_size")?,
        (None, false) => return Err(missing("token_embd.weight (tensor)")),
    };
    let n_vocab = match content.tensor_infos.get("output.weight") {
        Some(out) => out.shape.dims().first().copied().unwrap_or(n_vocab),
        None => n_vocab,
    };
    let corrupt = |detail: String| EngineError::CorruptGguf { path: path.to_path_buf(), detail };
    if n_head == 0 || n_kv_head == 0 || n_head % n_kv_head != 0 || n_layer == 0 {
        return Err(corrupt(format!(
            "inconsistent attention shape: {n_head} heads, {n_kv_head} KV heads, {n_layer} layers"
        )));
    }
    // RoPE rotates pairs, so a head has an even, non-zero width; its tables grow with the width
    // (the widest heads in use are 256).
    if n_embd == 0 || n_ff == 0 || n_vocab == 0 || head_dim == 0 || head_dim % 2 != 0 || head_dim > MAX_HEAD_DIM {
        return Err(corrupt(format!(
            "impossible sizes: width {n_embd}, feed-forward {n_ff}, vocabulary {n_vocab}, head width {head_dim}"
        )));
    }
    if !rope_theta.is_finite() || rope_theta <= 0.0 || !rms_eps.is_finite() || rms_eps < 0.0 {
        return Err(corrupt(format!("RoPE base {rope_theta} or RMS epsilon {rms_eps} is not a usable number")));
    }
    Ok(ModelConfig { arch, n_layer, n_embd, n_head, n_kv_head, head_dim, n_ff, n_vocab, n_ctx, rope_theta, rms_eps })
}

/// Every tensor the model code reads has the shape the configuration implies, so that a file whose
/// metadata and tensors disagree is an error here and not an out-of-range index in a forward pass.
/// Shapes are candle's (rows first). Only the rows of the embedding and head are free (the
/// vocabulary size), and they must agree with each other.
fn check_shapes(path: &Path, content: &Content, c: &ModelConfig) -> Result<()> {
    let corrupt = |detail: String| EngineError::CorruptGguf { path: path.to_path_buf(), detail };
    let ti = &content.tensor_infos;
    let (q, kv) = match (c.n_head.checked_mul(c.head_dim), c.n_kv_head.checked_mul(c.head_dim)) {
        (Some(q), Some(kv)) => (q, kv),
        _ => return Err(corrupt(format!("{} heads of width {} overflow", c.n_head, c.head_dim))),
    };
    let check = |name: &str, want: &[usize], required: bool| -> Result<()> {
        match ti.get(name) {
            Some(t) if t.shape.dims() == want => Ok(()),
            Some(t) => Err(corrupt(format!(
                "tensor `{name}` has shape {:?} but the metadata implies {want:?}",
                t.shape.dims()
            ))),
            None if required => Err(corrupt(format!("tensor `{name}` is missing"))),
            None => Ok(()),
        }
    };
    for name in ["token_embd.weight", "output.weight"] {
        check(name, &[c.n_vocab, c.n_embd], false)?;
    }
    check("output_norm.weight", &[c.n_embd], true)?;
    for i in 0..c.n_layer {
        let t = |s: &str| format!("blk.{i}.{s}");
        check(&t("attn_norm.weight"), &[c.n_embd], true)?;
        check(&t("ffn_norm.weight"), &[c.n_embd], true)?;
        check(&t("attn_q.weight"), &[q, c.n_embd], true)?;
        check(&t("attn_k.weight"), &[kv, c.n_embd], true)?;
        check(&t("attn_v.weight"), &[kv, c.n_embd], true)?;
        check(&t("attn_output.weight"), &[c.n_embd, q], true)?;
        check(&t("ffn_gate.weight"), &[c.n_ff, c.n_embd], true)?;
        check(&t("ffn_up.weight"), &[c.n_ff, c.n_embd], true)?;
        check(&t("ffn_down.weight"), &[c.n_embd, c.n_ff], true)?;
        check(&t("attn_q.bias"), &[q], false)?;
        check(&t("attn_k.bias"), &[kv], false)?;
        check(&t("attn_v.bias"), &[kv], false)?;
    }
    if let Some(fs) = ti.get("rope_freqs.weight") {
        if fs.shape.elem_count() != c.head_dim / 2 {
            return Err(corrupt(format!(
                "tensor `rope_freqs.weight` has shape {:?} but a head of width {} needs {} factors",
                fs.shape.dims(),
                c.head_dim,
                c.head_dim / 2
            )));
        }
    }
    if content.metadata.contains_key(FEATURE_TAPS_KEY) {
        let n_taps = content.metadata.get(FEATURE_TAPS_KEY).and_then(|v| v.to_vec().ok()).map_or(0, Vec::len);
        let target_embd = content.metadata.get(FEATURE_EMBD_KEY).and_then(|v| v.to_u32().ok()).unwrap_or(0) as usize;
        check("eagle.fc.weight", &[c.n_embd, c.n_embd.saturating_mul(2)], true)?;
        if n_taps > 0 {
            check("eagle.lift_fc.weight", &[c.n_embd, n_taps.saturating_mul(target_embd)], true)?;
        }
        for i in 0..n_taps {
            check(&format!("eagle.tap_norms.{i}.weight"), &[target_embd], true)?;
        }
    }
    Ok(())
}
