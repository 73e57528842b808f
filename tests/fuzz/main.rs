//! Fuzzing on stable Rust: a small seeded mutator over real GGUF bytes (the shipped draft and
//! synthetic models) and real chat templates. Every execution must end in `Ok` or a typed error:
//! a panic fails the test and names the input, and an allocation larger than any input justifies
//! aborts the run with the target and iteration that asked for it (the run is deterministic, so the
//! pair reproduces it).
//!
//! The short run is part of `cargo test`; the long run is documented in docs/reliability.md:
//! `MENTOR_LAB_FUZZ_ITERS=20000 cargo test --profile fuzz --test fuzz -- --ignored --nocapture` (more iterations search longer).
//! Inputs that once crashed live in tests/data/fuzz/ and are replayed by `regressions_stay_fixed`.

#[path = "../common/synthetic.rs"]
mod synthetic;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::Device;
use mentor_lab::gguf::ModelFile;
use mentor_lab::tokenizer::TextTokenizer;
use mentor_lab::{load_model, EngineError, WeightFormat};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Read;
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// Allocation guard

/// Outside an execution (and on threads that run none), no single allocation may exceed this.
const MAX_ONE_ALLOCATION: usize = 256 << 20;

/// During an execution, no single allocation may exceed what its input justifies: a fixed
/// allowance (the tokenizer's tables, a forward's scratch) plus a multiple of the input's size
/// (weights dequantized from 4 bits to f32 take 8 times their bytes). A header trusted blindly
/// asks for terabytes.
fn allowance(input_len: usize) -> usize {
    (32 << 20) + 8 * input_len
}

struct Guard;

thread_local! {
    /// (target, iteration) running on this thread, for the abort message.
    static RUNNING: Cell<(u32, u64)> = const { Cell::new((0, 0)) };
    /// The largest single allocation this thread may make now.
    static LIMIT: Cell<usize> = const { Cell::new(MAX_ONE_ALLOCATION) };
    /// The largest single allocation this thread made since the execution began.
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn too_big(size: usize) -> ! {
    let (target, iter) = RUNNING.try_with(|r| r.get()).unwrap_or_default();
    eprintln!("fuzz: an allocation of {size} bytes in target {target} at iteration {iter}");
    std::process::abort();
}

/// Checks one allocation of `size` bytes against this thread's limit and records it.
fn check(size: usize) {
    let limit = LIMIT.try_with(|l| l.get()).unwrap_or(MAX_ONE_ALLOCATION);
    if size > limit {
        too_big(size);
    }
    let _ = PEAK.try_with(|p| p.set(p.get().max(size)));
}

unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GUARD: Guard = Guard;

// ---------------------------------------------------------------------------------------------
// Mutator

/// SplitMix64: small, seeded, and the same sequence on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING_U32: [u32; 8] = [0, 1, 2, 0x7F, 0xFFFF, 0x7FFF_FFFF, 0x8000_0000, u32::MAX];
const INTERESTING_U64: [u64; 8] = [0, 1, 1 << 31, 1 << 32, 1 << 40, i64::MAX as u64, u64::MAX - 1, u64::MAX];

/// One to four mutations of `bytes`. Positions fall in `hot` (the regions worth the attention:
/// header, counts, tensor infos) three times out of four.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, hot: &[Range<usize>]) {
    for _ in 0..1 + rng.below(4) {
        if bytes.is_empty() {
            return;
        }
        let pos = match hot.is_empty() || rng.below(4) == 0 {
            true => rng.below(bytes.len()),
            false => {
                let r = &hot[rng.below(hot.len())];
                (r.start + rng.below(r.len())).min(bytes.len() - 1)
            }
        };
        let put = |bytes: &mut Vec<u8>, at: usize, v: &[u8]| {
            let end = (at + v.len()).min(bytes.len());
            bytes[at..end].copy_from_slice(&v[..end - at]);
        };
        match rng.below(9) {
            0 => bytes[pos] ^= 1 << rng.below(8),
            1 => bytes[pos] = [0, 1, 0x7F, 0x80, 0xFF][rng.below(5)],
            2 => put(bytes, pos, &INTERESTING_U32[rng.below(8)].to_le_bytes()),
            3 => put(bytes, pos, &INTERESTING_U64[rng.below(8)].to_le_bytes()),
            4 => {
                // A length off by a little: the classic off-by-one in a count.
                if pos + 8 <= bytes.len() {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&bytes[pos..pos + 8]);
                    let delta = rng.below(17) as u64;
                    let v = u64::from_le_bytes(w);
                    let v = if rng.below(2) == 0 { v.wrapping_add(delta) } else { v.wrapping_sub(delta) };
                    put(bytes, pos, &v.to_le_bytes());
                }
            }
            5 => bytes.truncate(pos),
            6 => {
                // Duplicate a chunk somewhere else.
                let len = 1 + rng.below(64.min(bytes.len() - pos));
                let chunk = bytes[pos..pos + len].to_vec();
                let at = rng.below(bytes.len());
                bytes.splice(at..at, chunk);
            }
            7 => {
                let len = 1 + rng.below(64.min(bytes.len() - pos));
                bytes.drain(pos..pos + len);
            }
            _ => bytes[pos] = rng.next() as u8,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs

fn draft_bytes() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/models/smollm2-135m-draft-d192-l8.Q8_0.gguf");
    std::fs::read(&path).expect("the shipped draft is in assets/models")
}

/// Bytes up to the end of the tensor infos (what `ModelFile` parses), from a file that parses.
fn header_len(bytes: &[u8]) -> usize {
    let file = ModelFile::from_reader(Path::new("probe.gguf"), &mut &bytes[..], bytes.len() as u64).unwrap();
    let first = file.content.tensor_infos.values().map(|t| t.offset).min().unwrap_or(0);
    assert_eq!(first, 0);
    file.content.tensor_data_offset as usize
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The regions of a GGUF header worth most mutations: the fixed header and the small metadata at
/// the front, the start of each token list, and the tensor infos at the end.
fn hot_regions(bytes: &[u8], header_len: usize) -> Vec<Range<usize>> {
    let mut hot = Vec::new();
    hot.push(0..1024.min(header_len));
    for key in [
        &b"tokenizer.ggml.tokens"[..],
        b"tokenizer.ggml.merges",
        b"tokenizer.ggml.token_type",
        b"tokenizer.chat_template",
    ] {
        if let Some(at) = find(&bytes[..header_len], key) {
            hot.push(at..(at + 256).min(header_len));
        }
    }
    let infos = find(&bytes[..header_len], b"token_embd.weight")
        .or_else(|| find(&bytes[..header_len], b"blk.0."))
        .map(|p| p.saturating_sub(8))
        .unwrap_or(0);
    hot.push(infos..header_len);
    hot
}

/// A tiny synthetic model: one block, 32 wide, so that loading and a forward pass take well under
/// a millisecond.
fn tiny_spec(arch: &'static str, dtype: GgmlDType) -> synthetic::Spec {
    synthetic::Spec {
        arch,
        n_embd: 32,
        n_head: 2,
        n_kv_head: 1,
        n_ff: 64,
        n_layer: 1,
        n_ctx: 64,
        biases: arch == "qwen2",
        dtype,
        dtype_for: Vec::new(),
        pad_tokens: 0,
        pad_as_real: false,
        extra: vec![(
            "tokenizer.chat_template".into(),
            Value::String(
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                 {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
                    .into(),
            ),
        )],
    }
}

fn synthetic_bytes(dir: &Path, arch: &'static str, dtype: GgmlDType) -> Vec<u8> {
    let p = dir.join(format!("{arch}-{dtype:?}.gguf"));
    synthetic::write(&p, &tiny_spec(arch, dtype));
    std::fs::read(&p).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Targets

const PROMPT: &str = "the cat <|im_start|> in 42 ünïcödé\n";

/// Header, metadata and tensor infos of `bytes`, then (when that parses) the tokenizer built from
/// the metadata, an encode/decode round trip and the chat template.
fn parse_and_tokenize(bytes: &[u8], tokenize: bool) -> Result<(), EngineError> {
    let path = Path::new("/nonexistent-dir/fuzz.gguf");
    let file = ModelFile::from_reader(path, &mut &bytes[..], bytes.len() as u64)?;
    let _ = file.info();
    let _ = file.head_tokens();
    let _ = file.feature_draft();
    if tokenize {
        let tok = TextTokenizer::from_model_file(&file)?;
        let ids = tok.prompt_ids(PROMPT, false)?;
        tok.decode(&ids)?;
    }
    Ok(())
}

/// The draft's header with its data region cut to a random length: the parse, and now and then
/// the tokenizer (building a 49k-token BPE costs far more than the parse).
fn fuzz_draft_header(seed: u64, n: u64) -> (u64, u64) {
    let bytes = draft_bytes();
    let head = header_len(&bytes);
    let hot = hot_regions(&bytes, head);
    let data = &bytes[head..];
    // Chosen with each input by `make`, read by the execution.
    let data_len = Cell::new(data.len());
    let tokenize = Cell::new(false);
    run_target(
        1,
        "draft-header",
        seed,
        n,
        |rng| {
            let mut h = bytes[..head].to_vec();
            mutate(rng, &mut h, &hot);
            data_len.set(match rng.below(4) {
                0 => rng.below(data.len()),
                _ => data.len(),
            });
            tokenize.set(rng.below(32) == 0);
            h
        },
        |h| {
            let size = (h.len() + data_len.get()) as u64;
            // The reader sees the header and the data after it: the allowance is the whole file's.
            LIMIT.with(|l| l.set(allowance(size as usize)));
            let path = Path::new("/nonexistent-dir/fuzz.gguf");
            let file = ModelFile::from_reader(path, &mut h.chain(&data[..data_len.get()]), size)?;
            let _ = file.info();
            let _ = file.head_tokens();
            if tokenize.get() {
                let tok = TextTokenizer::from_model_file(&file)?;
                tok.decode(&tok.prompt_ids(PROMPT, false)?)?;
            }
            Ok::<(), EngineError>(())
        },
    )
}

/// A synthetic model's whole file: parse, tokenizer, encode/decode and the chat template.
fn fuzz_synthetic_tokenizer(seed: u64, n: u64) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let base = synthetic_bytes(dir.path(), "qwen2", GgmlDType::F32);
    let head = header_len(&base);
    let hot = hot_regions(&base, head);
    run_target(
        2,
        "synthetic-tokenizer",
        seed,
        n,
        |rng| {
            let mut b = base[..head].to_vec();
            mutate(rng, &mut b, &hot);
            b.extend_from_slice(&base[head..]);
            b
        },
        |b| parse_and_tokenize(b, true),
    )
}

/// A synthetic model written to disk and loaded, then one forward pass over the prompt: mutations
/// fall anywhere, weights included. Four models: qwen2 F32, llama Q8_0, llama Q4_K_M-like, and a
/// qwen2 in the K formats' 5-bit fallbacks.
fn fuzz_load_forward(seed: u64, n: u64) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut bases: Vec<Vec<u8>> = [("qwen2", GgmlDType::F32), ("llama", GgmlDType::Q8_0)]
        .into_iter()
        .map(|(arch, dtype)| synthetic_bytes(dir.path(), arch, dtype))
        .collect();
    // A Q4_K_M-like one (Q4_K and Q6_K blocks, one block 256 wide), read by the K-quant kernels.
    let k_path = dir.path().join("llama-k.gguf");
    synthetic::write(&k_path, &synthetic::Spec { n_layer: 1, ..synthetic::Spec::q4_k_m("llama") });
    bases.push(std::fs::read(&k_path).unwrap());
    // One 224 wide in Q5_0, Q5_1, Q8_0 and Q4_K blocks, read by the 5-bit kernels.
    let q5_path = dir.path().join("qwen2-q5.gguf");
    synthetic::write(&q5_path, &synthetic::Spec { n_layer: 1, ..synthetic::Spec::narrow_k_quants("qwen2") });
    bases.push(std::fs::read(&q5_path).unwrap());
    let heads: Vec<usize> = bases.iter().map(|b| header_len(b)).collect();
    let hots: Vec<Vec<Range<usize>>> = bases.iter().zip(&heads).map(|(b, &h)| hot_regions(b, h)).collect();
    let path = dir.path().join("mutated.gguf");
    run_target(
        3,
        "load-forward",
        seed,
        n,
        |rng| {
            let k = rng.below(bases.len());
            let mut b = bases[k].clone();
            // Half the time the hot header regions, half the time anywhere (weights included).
            let hot = if rng.below(2) == 0 { &hots[k][..] } else { &[] };
            mutate(rng, &mut b, hot);
            b
        },
        |b| {
            std::fs::write(&path, b)?;
            let mut m = load_model(&path, WeightFormat::Auto, &Device::Cpu)?;
            let ids = m.tokenizer.prompt_ids(PROMPT, false)?;
            m.model.forward_rows(&ids)?;
            Ok::<(), EngineError>(())
        },
    )
}

/// Pieces of Jinja that mutations splice into templates: control flow, loops, recursion, filters.
const JINJA_PIECES: [&str; 24] = [
    "{% for m in messages %}",
    "{% endfor %}",
    "{% if loop.first %}",
    "{% endif %}",
    "{{ m.content }}",
    "{{ messages[0]['role'] }}",
    "{% for i in range(100000) %}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% set ns = namespace(x=0) %}",
    "{% set ns.x = ns.x + 1 %}",
    "{{ raise_exception('bad role') }}",
    "{{ bos_token }}",
    "{{ m.content | trim | upper }}",
    "{{ m.content.split('a') | join('b') }}",
    "{{ (messages | length) // 0 }}",
    "{{ messages | tojson }}",
    "{% break %}",
    "{% continue %}",
    "{{ m['tool_calls'][0].function.name }}",
    "{%- if add_generation_prompt -%}",
    "{{",
    "%}",
    "{% endmacro %}",
];

/// Real chat templates (the shipped draft's, Llama 3's, a ChatML with tools) mutated at the text
/// level, rendered for one message. Fuel and the recursion limit make every render end.
fn fuzz_chat_template(seed: u64, n: u64) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let base = synthetic_bytes(dir.path(), "qwen2", GgmlDType::F32);
    let file = ModelFile::from_reader(Path::new("/nonexistent-dir/t.gguf"), &mut &base[..], base.len() as u64).unwrap();
    let mut tok = TextTokenizer::from_model_file(&file).unwrap();
    let draft = draft_bytes();
    let draft_file =
        ModelFile::from_reader(Path::new("/nonexistent-dir/d.gguf"), &mut &draft[..], draft.len() as u64).unwrap();
    let templates: Vec<String> = vec![
        draft_file.meta_str("tokenizer.chat_template").unwrap().to_string(),
        "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}".into(),
        "{%- for message in messages %}{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}{{- tool_call.function.name }}{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}{%- else %}{{ raise_exception('Unknown role ' + message.role) }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}".into(),
    ];
    run_target(
        4,
        "chat-template",
        seed,
        n,
        |rng| {
            let mut t = templates[rng.below(templates.len())].clone().into_bytes();
            for _ in 0..1 + rng.below(3) {
                let pos = rng.below(t.len() + 1);
                match rng.below(4) {
                    0 => {
                        let piece = JINJA_PIECES[rng.below(JINJA_PIECES.len())];
                        t.splice(pos..pos, piece.bytes());
                    }
                    1 if pos < t.len() => {
                        let len = 1 + rng.below(40.min(t.len() - pos));
                        t.drain(pos..pos + len);
                    }
                    2 if pos < t.len() => {
                        let len = 1 + rng.below(80.min(t.len() - pos));
                        let chunk = t[pos..pos + len].to_vec();
                        let at = rng.below(t.len());
                        t.splice(at..at, chunk);
                    }
                    _ => mutate(rng, &mut t, &[]),
                }
            }
            t
        },
        |t| {
            tok.chat_template = Some(String::from_utf8_lossy(t).into_owned());
            tok.render_chat(PROMPT).map(|_| ())
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Short runs (part of `cargo test`)

#[test]
fn fuzz_draft_header_short() {
    let (n_ok, n_err) = fuzz_draft_header(1, iters(400, false));
    // The mutator must reach both outcomes, or it is not exercising the reader.
    assert!(n_ok > 0 && n_err > 0, "{n_ok} Ok, {n_err} errors");
}

#[test]
fn fuzz_synthetic_tokenizer_short() {
    let (n_ok, n_err) = fuzz_synthetic_tokenizer(2, iters(2000, false));
    assert!(n_ok > 0 && n_err > 0, "{n_ok} Ok, {n_err} errors");
}

#[test]
fn fuzz_load_forward_short() {
    let (n_ok, n_err) = fuzz_load_forward(3, iters(1000, false));
    assert!(n_ok > 0 && n_err > 0, "{n_ok} Ok, {n_err} errors");
}

#[test]
fn fuzz_chat_template_short() {
    let (n_ok, n_err) = fuzz_chat_template(4, iters(1000, false));
    assert!(n_ok > 0 && n_err > 0, "{n_ok} Ok, {n_err} errors");
}

#[test]
fn fuzz_saved_state_short() {
    let (n_ok, n_err) = fuzz_saved_state(5, iters(2000, false));
    assert!(n_ok > 0 && n_err > 0, "{n_ok} Ok, {n_err} errors");
}

// Long runs: `MENTOR_LAB_FUZZ_ITERS=N cargo test --profile fuzz --test fuzz -- --ignored --nocapture`
// (another seed than the short runs, so that they add coverage).

#[test]
#[ignore]
fn fuzz_draft_header_long() {
    fuzz_draft_header(101, iters(0, true));
}

#[test]
#[ignore]
fn fuzz_synthetic_tokenizer_long() {
    fuzz_synthetic_tokenizer(102, iters(0, true));
}

#[test]
#[ignore]
fn fuzz_load_forward_long() {
    fuzz_load_forward(103, iters(0, true));
}

#[test]
#[ignore]
fn fuzz_chat_template_long() {
    fuzz_chat_template(104, iters(0, true));
}

#[test]
#[ignore]
fn fuzz_saved_state_long() {
    fuzz_saved_state(105, iters(0, true));
}

// Running a target: allowance, watchdog, crash files.
mod harness;
use harness::{iters, panic_text, run_target};

// Hand-made hostile files, endless chat templates, and inputs that once crashed.
mod hostile;
// The app's saved settings and history.
mod saved_state;
use saved_state::fuzz_saved_state;
