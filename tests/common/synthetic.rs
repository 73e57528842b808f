//! Writes tiny GGUF models with random weights, so architectures we have no real weights for
//! here (qwen2) and broken files can be exercised.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::path::Path;

pub struct Spec {
    pub arch: &'static str,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_ctx: usize,
    pub biases: bool,
    pub dtype: GgmlDType,
    /// Formats for particular matrices, by a part of their name (the first match wins), as a
    /// mixed file such as Q4_K_M has them.
    pub dtype_for: Vec<(&'static str, GgmlDType)>,
    /// More metadata keys (e.g. `mentor_lab.head_tokens`).
    pub extra: Vec<(String, Value)>,
    /// Entries appended to the token list: `[PAD<id>]` padding (type UNUSED), as converters write
    /// for Qwen2.5-7B's 152,064 rows, or real tokens when `pad_as_real`.
    pub pad_tokens: usize,
    pub pad_as_real: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            arch: "qwen2",
            n_embd: 64,
            n_head: 4,
            n_kv_head: 2,
            n_ff: 128,
            n_layer: 2,
            n_ctx: 256,
            biases: true,
            dtype: GgmlDType::F32,
            dtype_for: Vec::new(),
            extra: Vec::new(),
            pad_tokens: 0,
            pad_as_real: false,
        }
    }
}

/// GPT-2's byte → printable character table (byte-level BPE's alphabet).
pub fn byte_level_alphabet() -> Vec<String> {
    let mut printable: Vec<u32> = ('!' as u32..='~' as u32).collect();
    printable.extend('¡' as u32..='¬' as u32);
    printable.extend('®' as u32..='ÿ' as u32);
    let mut out = Vec::with_capacity(256);
    let mut extra = 0;
    for b in 0..256u32 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        out.push(char::from_u32(c).unwrap().to_string());
    }
    out
}

/// Vocabulary: two control tokens, the 256 byte symbols, and a few merges.
pub fn vocab() -> (Vec<String>, Vec<String>) {
    let mut tokens = vec!["<|im_start|>".to_string(), "<|im_end|>".to_string()];
    tokens.extend(byte_level_alphabet());
    let merges = vec!["Ġ t".to_string(), "h e".to_string(), "Ġt he".to_string(), "i n".to_string()];
    tokens.extend(["Ġt", "he", "Ġthe", "in"].iter().map(|s| s.to_string()));
    (tokens, merges)
}

/// Normal(0, scale²) values from a fixed seed (SplitMix64 and Box–Muller), so that every synthetic
/// model, and every test on one, is the same on every run.
fn rand_tensor(state: &mut u64, shape: &[usize], scale: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut next = || {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let v: Vec<f32> = (0..n)
        .map(|_| {
            let (u1, u2) = (next().max(1e-300), next());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * scale) as f32
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

impl Spec {
    /// A Q4_K_M-like file: Q4_K matrices, Q6_K for V, the FFN's down projection and the
    /// embedding (the tied head), 256 wide (a K-quant block).
    #[allow(dead_code)] // not every test crate that includes this file writes one
    pub fn q4_k_m(arch: &'static str) -> Spec {
        Spec {
            arch,
            biases: arch == "qwen2",
            n_embd: 256,
            n_ff: 512,
            dtype: GgmlDType::Q4K,
            dtype_for: vec![("attn_v", GgmlDType::Q6K), ("ffn_down", GgmlDType::Q6K), ("token_embd", GgmlDType::Q6K)],
            ..Default::default()
        }
    }

    /// A Q5_K_M-like file: Q5_K matrices, Q6_K for V, the FFN's down projection and the
    /// embedding, 256 wide.
    #[allow(dead_code)]
    pub fn q5_k_m(arch: &'static str) -> Spec {
        Spec { dtype: GgmlDType::Q5K, ..Spec::q4_k_m(arch) }
    }

    /// A K-quant file whose width (224) is not a multiple of 256, as Qwen2.5-0.5B's (896) is
    /// not: the quantizer's fallbacks, Q5_0 for Q4_K and Q5_1 for Q5_K (here V) and Q8_0 for
    /// the embedding; the FFN's down projection (512 wide) keeps Q4_K.
    #[allow(dead_code)]
    pub fn narrow_k_quants(arch: &'static str) -> Spec {
        Spec {
            arch,
            biases: arch == "qwen2",
            n_embd: 224,
            n_head: 7,
            n_kv_head: 1,
            n_ff: 512,
            dtype: GgmlDType::Q5_0,
            dtype_for: vec![("attn_v", GgmlDType::Q5_1), ("ffn_down", GgmlDType::Q4K), ("token_embd", GgmlDType::Q8_0)],
            ..Default::default()
        }
    }
}

pub fn write(path: &Path, spec: &Spec) {
    let (mut tokens, merges) = vocab();
    let n_real = tokens.len();
    tokens.extend((n_real..n_real + spec.pad_tokens).map(|i| match spec.pad_as_real {
        true => format!("tok{i}"),
        false => format!("[PAD{i}]"),
    }));
    let n_vocab = tokens.len() + 6; // padded head, like Qwen's
    let hd = spec.n_embd / spec.n_head;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut rng = 0x5EED_u64;
    let mut add = |name: String, t: Tensor, quantize: bool| {
        let chosen = spec.dtype_for.iter().find(|(part, _)| name.contains(part)).map(|&(_, d)| d);
        let dtype = if quantize { chosen.unwrap_or(spec.dtype) } else { GgmlDType::F32 };
        tensors.push((name, QTensor::quantize(&t, dtype).unwrap()));
    };
    add("token_embd.weight".into(), rand_tensor(&mut rng, &[n_vocab, spec.n_embd], 0.5), true);
    add("output_norm.weight".into(), (rand_tensor(&mut rng, &[spec.n_embd], 0.1) + 1.0).unwrap(), false);
    for i in 0..spec.n_layer {
        let p = format!("blk.{i}");
        let w = 1.0 / (spec.n_embd as f64).sqrt();
        add(format!("{p}.attn_norm.weight"), (rand_tensor(&mut rng, &[spec.n_embd], 0.1) + 1.0).unwrap(), false);
        add(format!("{p}.ffn_norm.weight"), (rand_tensor(&mut rng, &[spec.n_embd], 0.1) + 1.0).unwrap(), false);
        add(format!("{p}.attn_q.weight"), rand_tensor(&mut rng, &[spec.n_head * hd, spec.n_embd], w), true);
        add(format!("{p}.attn_k.weight"), rand_tensor(&mut rng, &[spec.n_kv_head * hd, spec.n_embd], w), true);
        add(format!("{p}.attn_v.weight"), rand_tensor(&mut rng, &[spec.n_kv_head * hd, spec.n_embd], w), true);
        add(format!("{p}.attn_output.weight"), rand_tensor(&mut rng, &[spec.n_embd, spec.n_head * hd], w), true);
        add(format!("{p}.ffn_gate.weight"), rand_tensor(&mut rng, &[spec.n_ff, spec.n_embd], w), true);
        add(format!("{p}.ffn_up.weight"), rand_tensor(&mut rng, &[spec.n_ff, spec.n_embd], w), true);
        add(
            format!("{p}.ffn_down.weight"),
            rand_tensor(&mut rng, &[spec.n_embd, spec.n_ff], 1.0 / (spec.n_ff as f64).sqrt()),
            true,
        );
        if spec.biases {
            add(format!("{p}.attn_q.bias"), rand_tensor(&mut rng, &[spec.n_head * hd], 0.1), false);
            add(format!("{p}.attn_k.bias"), rand_tensor(&mut rng, &[spec.n_kv_head * hd], 0.1), false);
            add(format!("{p}.attn_v.bias"), rand_tensor(&mut rng, &[spec.n_kv_head * hd], 0.1), false);
        }
    }
    let a = spec.arch;
    let u32v = |x: usize| Value::U32(x as u32);
    let mut token_type = vec![Value::I32(3), Value::I32(3)];
    token_type.extend((2..n_real).map(|_| Value::I32(1)));
    let pad_type = if spec.pad_as_real { 1 } else { 5 };
    token_type.extend((n_real..tokens.len()).map(|_| Value::I32(pad_type)));
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String(format!("synthetic-{a}"))),
        (format!("{a}.embedding_length"), u32v(spec.n_embd)),
        (format!("{a}.attention.head_count"), u32v(spec.n_head)),
        (format!("{a}.attention.head_count_kv"), u32v(spec.n_kv_head)),
        (format!("{a}.block_count"), u32v(spec.n_layer)),
        (format!("{a}.feed_forward_length"), u32v(spec.n_ff)),
        (format!("{a}.context_length"), u32v(spec.n_ctx)),
        (format!("{a}.rope.freq_base"), Value::F32(1_000_000.0)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("qwen2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.iter().map(|t| Value::String(t.clone())).collect())),
        ("tokenizer.ggml.token_type".into(), Value::Array(token_type)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges.iter().map(|m| Value::String(m.clone())).collect())),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
    ];
    let md: Vec<(&str, &Value)> = metadata.iter().chain(&spec.extra).map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md, &ts).unwrap();
}
