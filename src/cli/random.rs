//! `random-model`: a GGUF with random weights in the shape of a model people run and in the
//! quantization mix llama.cpp gives its files, with a real tokenizer, so that Mentor Lab and
//! llama.cpp can be timed on the same file without downloading gigabytes.

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct RandomModelArgs {
    /// Where to write the file.
    pub out: PathBuf,
    /// llama-1b (Llama 3.2 1B: 16 layers, 2048 wide, FFN 8192, 32 heads, 8 KV heads, tied head),
    /// qwen2.5-1.5b (28 layers, 1536 wide, FFN 8960, 12 heads, 2 KV heads, biases) or
    /// qwen2.5-0.5b (24 layers, 896 wide, FFN 4864, 14 heads, 2 KV heads, biases: a width that is
    /// not a multiple of 256, so most matrices take the K formats' fallbacks).
    #[arg(long, default_value = "llama-1b")]
    pub shape: String,
    /// q4_k_m, q5_k_m, q6_k or q8_0: which matrices get which format, as llama.cpp's quantizer
    /// chooses them.
    #[arg(long, default_value = "q4_k_m")]
    pub quant: String,
    /// The GGUF whose tokenizer the file carries (default: the default target, SmolLM2's 49,152
    /// tokens).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

struct Shape {
    arch: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_kv_head: usize,
    biases: bool,
    rope_theta: f32,
}

fn shape(name: &str) -> Result<Shape> {
    Ok(match name {
        "llama-1b" => Shape {
            arch: "llama",
            n_layer: 16,
            n_embd: 2048,
            n_ff: 8192,
            n_head: 32,
            n_kv_head: 8,
            biases: false,
            rope_theta: 500_000.0,
        },
        "qwen2.5-1.5b" => Shape {
            arch: "qwen2",
            n_layer: 28,
            n_embd: 1536,
            n_ff: 8960,
            n_head: 12,
            n_kv_head: 2,
            biases: true,
            rope_theta: 1_000_000.0,
        },
        "qwen2.5-0.5b" => Shape {
            arch: "qwen2",
            n_layer: 24,
            n_embd: 896,
            n_ff: 4864,
            n_head: 14,
            n_kv_head: 2,
            biases: true,
            rope_theta: 1_000_000.0,
        },
        other => bail!("unknown shape `{other}`: use llama-1b, qwen2.5-1.5b or qwen2.5-0.5b"),
    })
}

/// The format llama.cpp's quantizer gives a matrix in a file of type `quant` (its
/// `llama_tensor_get_type`, for the K-quant mixes): the tied embedding (the output head) Q6_K;
/// V and the FFN's down projection one size up in the first and last eighth of the layers and
/// every third one between. A matrix whose rows (`n_in` wide) do not fill whole super-blocks of
/// 256 takes the quantizer's fallback: Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K.
fn format_for(quant: &str, name: &str, layer: usize, n_layer: usize, n_in: usize) -> Result<GgmlDType> {
    let more_bits = layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
    let boosted = name.contains("attn_v") || name.contains("ffn_down");
    let chosen = match quant {
        "q8_0" => GgmlDType::Q8_0,
        "q6_k" => GgmlDType::Q6K,
        "q4_k_m" | "q5_k_m" if name == "token_embd.weight" => GgmlDType::Q6K,
        "q4_k_m" | "q5_k_m" if boosted && more_bits => GgmlDType::Q6K,
        "q4_k_m" => GgmlDType::Q4K,
        "q5_k_m" => GgmlDType::Q5K,
        other => bail!("unknown quantization `{other}`: use q4_k_m, q5_k_m, q6_k or q8_0"),
    };
    Ok(match chosen {
        _ if n_in.is_multiple_of(256) => chosen,
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        other => other,
    })
}

/// Normal(0, scale²) values from a seed (SplitMix64 and Box–Muller).
fn normal(state: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    let mut next = || {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (next().max(1e-300), next());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32 * scale
        })
        .collect()
}

pub fn random_model(args: RandomModelArgs) -> Result<()> {
    let s = shape(&args.shape)?;
    format_for(&args.quant, "", 0, 1, 256)?;
    let tok_path = match args.tokenizer {
        Some(p) => p,
        None => mentor_lab::models::ensure_default_target(&mut |_| {})?,
    };
    let mut f = std::fs::File::open(&tok_path).with_context(|| format!("opening {}", tok_path.display()))?;
    let source = gguf_file::Content::read(&mut f).with_context(|| format!("reading {}", tok_path.display()))?;
    let mut metadata: Vec<(String, Value)> =
        source.metadata.into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect();
    let n_vocab = match metadata.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
        Some((_, Value::Array(tokens))) => tokens.len(),
        _ => bail!("{} has no tokenizer.ggml.tokens list", tok_path.display()),
    };
    let a = s.arch;
    let u32v = |x: usize| Value::U32(x as u32);
    metadata.extend([
        ("general.architecture".to_string(), Value::String(a.into())),
        ("general.name".to_string(), Value::String(format!("random {} {}", args.shape, args.quant))),
        (format!("{a}.context_length"), u32v(4096)),
        (format!("{a}.embedding_length"), u32v(s.n_embd)),
        (format!("{a}.block_count"), u32v(s.n_layer)),
        (format!("{a}.feed_forward_length"), u32v(s.n_ff)),
        (format!("{a}.attention.head_count"), u32v(s.n_head)),
        (format!("{a}.attention.head_count_kv"), u32v(s.n_kv_head)),
        (format!("{a}.rope.dimension_count"), u32v(s.n_embd / s.n_head)),
        (format!("{a}.rope.freq_base"), Value::F32(s.rope_theta)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (format!("{a}.vocab_size"), u32v(n_vocab)),
    ]);
    let hd = s.n_embd / s.n_head;
    let mut rng = 0x5EED_u64;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut add = |name: String, shape: &[usize], scale: f32, layer: usize| -> Result<()> {
        let n: usize = shape.iter().product();
        let values = match name.ends_with("norm.weight") {
            true => vec![1.0; n],
            false => normal(&mut rng, n, scale),
        };
        let t = Tensor::from_vec(values, shape, &Device::Cpu)?;
        let dtype =
            if shape.len() == 1 { GgmlDType::F32 } else { format_for(&args.quant, &name, layer, s.n_layer, shape[1])? };
        eprintln!("{name} {shape:?} {dtype:?}");
        tensors.push((name, QTensor::quantize(&t, dtype)?));
        Ok(())
    };
    // The scale of trained embeddings, so that the logits of the tied head spread like a real
    // model's instead of putting all the probability on one token.
    add("token_embd.weight".into(), &[n_vocab, s.n_embd], 0.02, 0)?;
    add("output_norm.weight".into(), &[s.n_embd], 0.0, 0)?;
    let w = 1.0 / (s.n_embd as f32).sqrt();
    for i in 0..s.n_layer {
        let p = format!("blk.{i}");
        add(format!("{p}.attn_norm.weight"), &[s.n_embd], 0.0, i)?;
        add(format!("{p}.ffn_norm.weight"), &[s.n_embd], 0.0, i)?;
        add(format!("{p}.attn_q.weight"), &[s.n_head * hd, s.n_embd], w, i)?;
        add(format!("{p}.attn_k.weight"), &[s.n_kv_head * hd, s.n_embd], w, i)?;
        add(format!("{p}.attn_v.weight"), &[s.n_kv_head * hd, s.n_embd], w, i)?;
        add(format!("{p}.attn_output.weight"), &[s.n_embd, s.n_head * hd], w, i)?;
        add(format!("{p}.ffn_gate.weight"), &[s.n_ff, s.n_embd], w, i)?;
        add(format!("{p}.ffn_up.weight"), &[s.n_ff, s.n_embd], w, i)?;
        add(format!("{p}.ffn_down.weight"), &[s.n_embd, s.n_ff], 1.0 / (s.n_ff as f32).sqrt(), i)?;
        if s.biases {
            add(format!("{p}.attn_q.bias"), &[s.n_head * hd], 0.1, i)?;
            add(format!("{p}.attn_k.bias"), &[s.n_kv_head * hd], 0.1, i)?;
            add(format!("{p}.attn_v.bias"), &[s.n_kv_head * hd], 0.1, i)?;
        }
    }
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    gguf_file::write(&mut out, &md, &ts).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
