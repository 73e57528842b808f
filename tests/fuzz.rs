//! Fuzzing on stable Rust: a small seeded mutator over real GGUF bytes (the shipped draft and
//! synthetic models) and real chat templates. Every execution must end in `Ok` or a typed error:
//! a panic fails the test and names the input, and an allocation larger than any input justifies
//! aborts the run with the target and iteration that asked for it (the run is deterministic, so the
//! pair reproduces it).
//!
//! The short run is part of `cargo test`; the long run is documented in docs/reliability.md:
//! `MENTOR_LAB_FUZZ_ITERS=20000 cargo test --test fuzz -- --ignored --nocapture` (more iterations search longer).
//! Inputs that once crashed live in tests/data/fuzz/ and are replayed by `regressions_stay_fixed`.

#[path = "common/synthetic.rs"]
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

/// No single allocation may exceed this: the largest legitimate one here (the synthetic model's
/// weights, the draft's header) is a few MB, while a header trusted blindly asks for terabytes.
const MAX_ONE_ALLOCATION: usize = 256 << 20;

struct Guard;

thread_local! {
    /// (target, iteration) running on this thread, for the abort message.
    static RUNNING: Cell<(u32, u64)> = const { Cell::new((0, 0)) };
}

fn too_big(size: usize) -> ! {
    let (target, iter) = RUNNING.with(|r| r.get());
    eprintln!("fuzz: an allocation of {size} bytes in target {target} at iteration {iter}");
    std::process::abort();
}

unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ONE_ALLOCATION {
            too_big(layout.size());
        }
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ONE_ALLOCATION {
            too_big(layout.size());
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > MAX_ONE_ALLOCATION {
            too_big(new_size);
        }
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
// Harness

/// A panic's message, for the failure report.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// Where a crashing input is written, so that it can be minimised and checked in.
fn crash_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-crashes")
}

/// Runs `exec` on `n` inputs made by `make` (which mutates from a seeded generator) and returns
/// how many ended `Ok` and how many in a typed error; panics with every crashing input's file.
fn run_target<E: std::fmt::Display>(
    target: u32,
    name: &str,
    seed: u64,
    n: u64,
    mut make: impl FnMut(&mut Rng) -> Vec<u8>,
    mut exec: impl FnMut(&[u8]) -> Result<(), E>,
) -> (u64, u64) {
    let mut rng = Rng(seed);
    let (mut n_ok, mut n_err) = (0, 0);
    let mut crashes = Vec::new();
    // `MENTOR_LAB_FUZZ_DUMP=i` saves input i before running it: how an input that aborted the
    // process (an allocation the guard refused) is recovered.
    let dump = std::env::var("MENTOR_LAB_FUZZ_DUMP").ok().and_then(|v| v.parse::<u64>().ok());
    for i in 0..n {
        RUNNING.with(|r| r.set((target, i)));
        let input = make(&mut rng);
        if dump == Some(i) {
            let _ = std::fs::create_dir_all(crash_dir());
            let file = crash_dir().join(format!("{name}-seed{seed}-iter{i}.bin"));
            let _ = std::fs::write(&file, &input);
            eprintln!("fuzz {name}: input {i} saved to {}", file.display());
        }
        match std::panic::catch_unwind(AssertUnwindSafe(|| exec(&input))) {
            Ok(Ok(())) => n_ok += 1,
            Ok(Err(e)) => {
                n_err += 1;
                assert!(!e.to_string().is_empty());
            }
            Err(p) => {
                let _ = std::fs::create_dir_all(crash_dir());
                let file = crash_dir().join(format!("{name}-seed{seed}-iter{i}.bin"));
                let _ = std::fs::write(&file, &input);
                crashes.push(format!(
                    "iteration {i}: {} ({} bytes, saved to {})",
                    panic_text(&*p),
                    input.len(),
                    file.display()
                ));
            }
        }
    }
    eprintln!("fuzz {name}: {n} executions, {n_ok} Ok, {n_err} typed errors, {} crashes", crashes.len());
    assert!(crashes.is_empty(), "{name}: {} crashing inputs:\n{}", crashes.len(), crashes.join("\n"));
    (n_ok, n_err)
}

/// Iterations: the short run's count, or `MENTOR_LAB_FUZZ_ITERS` for the long run.
fn iters(short: u64, long: bool) -> u64 {
    match long {
        true => std::env::var("MENTOR_LAB_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000),
        false => short,
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
/// fall anywhere, weights included. Three models: qwen2 F32, llama Q8_0, llama Q4_K_M-like.
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

/// Numbers a saved-state file may hold in place of a real one.
const JSON_NUMBERS: [&str; 14] = [
    "0",
    "-1",
    "-0",
    "1e308",
    "-1e308",
    "1e999",
    "18446744073709551615",
    "18446744073709551616",
    "4294967296",
    "0.000001",
    "null",
    "\"x\"",
    "[]",
    "{}",
];

/// Where the numbers are in a JSON text: runs of number characters after `:`, `,` or `[`.
fn number_spans(text: &[u8]) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let starts = (text[i] == b'-' || text[i].is_ascii_digit())
            && text[..i].iter().rev().find(|c| !c.is_ascii_whitespace()).is_some_and(|c| b":,[".contains(c));
        if starts {
            let end = (i..text.len()).find(|&j| !b"-+.eE0123456789".contains(&text[j])).unwrap_or(text.len());
            spans.push(i..end);
            i = end;
        } else {
            i += 1;
        }
    }
    spans
}

/// The app's saved state, read as at start: a real `settings.json` and a `history.jsonl` of real
/// runs, mutated at the byte level and at the JSON level (numbers set to extremes or other
/// types). Every load must give settings whose requests validate, move a bad file aside byte for
/// byte, and never panic; an outcome is an error when the load had something to say.
fn fuzz_saved_state(seed: u64, n: u64) -> (u64, u64) {
    use mentor_lab::app::settings::Settings;
    use mentor_lab::app::storage::{load_history, load_settings, HISTORY_FILE, SETTINGS_FILE};
    use mentor_lab::app::view::RunRecord;
    let settings = serde_json::to_vec_pretty(&Settings::default()).unwrap();
    let run = |i: u64| RunRecord {
        when: 1_790_000_000 + i,
        config: "TV=0.50, k=8".into(),
        prompt: "Write a short poem about the sea.".into(),
        seed: i,
        temperature: 0.7,
        n_tokens: 128,
        acceptance: 0.72,
        rounds: 30,
        e2e_s: 1.2,
        tok_s: 106.0,
        speedup: 2.1,
        target_nll: 1.9,
        mean_tv: 0.41,
    };
    let mut history = Vec::new();
    for i in 0..4 {
        history.extend(serde_json::to_vec(&run(i)).unwrap());
        history.push(b'\n');
    }
    let dir = tempfile::tempdir().unwrap();
    run_target(
        5,
        "saved-state",
        seed,
        n,
        |rng| {
            let which = rng.below(2) as u8;
            let mut text = if which == 0 { settings.clone() } else { history.clone() };
            for _ in 0..1 + rng.below(3) {
                let spans = number_spans(&text);
                if rng.below(2) == 0 && !spans.is_empty() {
                    let span = spans[rng.below(spans.len())].clone();
                    text.splice(span, JSON_NUMBERS[rng.below(JSON_NUMBERS.len())].bytes());
                } else {
                    mutate(rng, &mut text, &[]);
                }
            }
            let mut input = vec![which];
            input.extend(text);
            input
        },
        |input| {
            let (&which, bytes) = input.split_first().unwrap_or((&0, &[]));
            for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
                std::fs::remove_file(e.path()).unwrap();
            }
            let name = if which == 0 { SETTINGS_FILE } else { HISTORY_FILE };
            std::fs::write(dir.path().join(name), bytes).unwrap();
            let notice = if which == 0 {
                let loaded = load_settings(dir.path());
                let s = &loaded.value;
                assert!(s.target_request().validate().is_ok(), "{s:?}");
                assert!(s.mentored_request().validate().is_ok(), "{s:?}");
                assert!((0.5..=3.0).contains(&s.zoom), "{s:?}");
                loaded.notice
            } else {
                let loaded = load_history(dir.path());
                let lines = bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
                assert!(loaded.value.len() <= lines);
                loaded.notice
            };
            // A file that was moved aside is kept byte for byte.
            let aside: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(".bad-"))
                .collect();
            for e in &aside {
                assert_eq!(std::fs::read(e.path()).unwrap(), bytes, "the file moved aside is the original");
            }
            match notice {
                None => Ok(()),
                Some(n) => Err(n),
            }
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

// Long runs: `MENTOR_LAB_FUZZ_ITERS=N cargo test --test fuzz -- --ignored --nocapture`
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

// ---------------------------------------------------------------------------------------------
// Hand-made hostile headers: each size the issue names is refused before anything is allocated
// for it (the allocation guard above would abort the test binary otherwise).

/// `bytes` with the `len` bytes at `skip` after the first occurrence of `needle` replaced by `v`.
fn patch_after(bytes: &[u8], needle: &str, skip: usize, v: &[u8]) -> Vec<u8> {
    let at =
        find(bytes, needle.as_bytes()).unwrap_or_else(|| panic!("`{needle}` not in the file")) + needle.len() + skip;
    let mut out = bytes.to_vec();
    out[at..at + v.len()].copy_from_slice(v);
    out
}

fn corrupt_detail(bytes: &[u8]) -> String {
    match parse_and_tokenize(bytes, true) {
        Err(EngineError::CorruptGguf { detail, .. }) => detail,
        other => panic!("expected a CorruptGguf error, got {other:?}"),
    }
}

#[test]
fn hostile_sizes_are_errors_before_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let base = synthetic_bytes(dir.path(), "qwen2", GgmlDType::F32);
    parse_and_tokenize(&base, true).unwrap();

    // A 4 GB metadata string (the value of `general.name`: after the key, a u32 type, then the
    // u64 length).
    let d = corrupt_detail(&patch_after(&base, "general.name", 4, &(4u64 << 30).to_le_bytes()));
    assert!(d.contains("general.name") && d.contains("4294967296"), "{d}");

    // A vocabulary of 2^31 tokens (the array's element type, then its u64 length).
    let d = corrupt_detail(&patch_after(&base, "tokenizer.ggml.tokens", 8, &(1u64 << 31).to_le_bytes()));
    assert!(d.contains("tokenizer.ggml.tokens") && d.contains("2147483648 elements"), "{d}");

    // A tensor of 2^40 elements: `token_embd.weight`'s first dimension (after n_dims).
    let d = corrupt_detail(&patch_after(&base, "token_embd.weight", 4, &(1u64 << 40).to_le_bytes()));
    assert!(d.contains("token_embd.weight") && d.contains("ends past the end of the file"), "{d}");

    // Dimensions whose product overflows 64 bits.
    let d = corrupt_detail(&patch_after(&base, "token_embd.weight", 4, &u64::MAX.to_le_bytes()));
    assert!(d.contains("token_embd.weight") && d.contains("64 bits"), "{d}");

    // A tensor offset that wraps around when added to the data start.
    let name = "blk.0.attn_q.weight";
    let d = corrupt_detail(&patch_after(&base, name, 4 + 2 * 8 + 4, &(u64::MAX - 8).to_le_bytes()));
    assert!(d.contains(name), "{d}");

    // Tensor and metadata counts no file could hold (they follow the magic and the version).
    let mut b = base.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(corrupt_detail(&b).contains("more than the"));
    let mut b = base.clone();
    b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(corrupt_detail(&b).contains("more than the"));

    // Five dimensions (ggml has at most four).
    let d = corrupt_detail(&patch_after(&base, "output_norm.weight", 0, &5u32.to_le_bytes()));
    assert!(d.contains("5 dimensions"), "{d}");
}

/// A header with one more metadata entry, `key` = u32 `value`, right after the counts.
fn with_u32_key(base: &[u8], key: &str, value: u32) -> Vec<u8> {
    let mut b = base[..24].to_vec();
    let n_kv = u64::from_le_bytes(base[16..24].try_into().unwrap()) + 1;
    b[16..24].copy_from_slice(&n_kv.to_le_bytes());
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&value.to_le_bytes());
    b.extend_from_slice(&base[24..]);
    b
}

#[test]
fn hostile_metadata_values_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let base = synthetic_bytes(dir.path(), "qwen2", GgmlDType::F32);
    // An alignment of zero divides by zero in a reader that trusts it; not a power of two is
    // no alignment ggml writes.
    for a in [0, 3, 1 << 30] {
        let d = corrupt_detail(&with_u32_key(&base, "general.alignment", a));
        assert!(d.contains("general.alignment"), "{d}");
    }
    // The same key twice.
    let d = corrupt_detail(&with_u32_key(&base, "general.architecture", 1));
    assert!(d.contains("appears twice"), "{d}");
    // A head count that disagrees with the tensors.
    let b = patch_after(&base, "qwen2.attention.head_count", 4, &8u32.to_le_bytes());
    let d = corrupt_detail(&b);
    assert!(d.contains("attn_k.weight") && d.contains("shape"), "{d}");
}

#[test]
fn tokenizer_larger_than_the_embedding_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("small-embd.gguf");
    synthetic::write(&p, &tiny_spec("qwen2", GgmlDType::F32));
    let bytes = std::fs::read(&p).unwrap();
    // Claim 16 embedding rows for a vocabulary of 264 tokens: the rows are the embedding's second
    // GGUF dimension (the model ties its head to the embedding, so the shapes stay consistent).
    let b = patch_after(&bytes, "token_embd.weight", 4 + 8, &16u64.to_le_bytes());
    match parse_and_tokenize(&b, true) {
        Err(EngineError::Tokenizer { detail, .. }) => {
            assert!(detail.contains("16 embedding rows"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Chat templates that never end are errors.

fn tokenizer_with_template(template: &str) -> (tempfile::TempDir, TextTokenizer) {
    let dir = tempfile::tempdir().unwrap();
    let base = synthetic_bytes(dir.path(), "qwen2", GgmlDType::F32);
    let file = ModelFile::from_reader(&dir.path().join("t.gguf"), &mut &base[..], base.len() as u64).unwrap();
    let mut tok = TextTokenizer::from_model_file(&file).unwrap();
    tok.chat_template = Some(template.to_string());
    (dir, tok)
}

#[test]
fn a_template_that_loops_forever_is_an_error() {
    // 10^15 iterations: without fuel this renders for days.
    let looping = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
                   x{% endfor %}{% endfor %}{% endfor %}";
    let (_d, tok) = tokenizer_with_template(looping);
    match tok.render_chat("hi") {
        Err(EngineError::Template { detail, .. }) => assert!(detail.contains("never ends"), "{detail}"),
        other => panic!("{other:?}"),
    }
    // The error reaches the prompt path too (what the engine calls).
    assert!(matches!(tok.prompt_ids("hi", false), Err(EngineError::Template { .. })));
    assert!(tok.prompt_ids("hi", true).is_ok(), "raw mode skips the template");
}

#[test]
fn a_template_that_recurses_forever_is_an_error() {
    for recursing in [
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    ] {
        let (_d, tok) = tokenizer_with_template(recursing);
        let e = tok.render_chat("hi").unwrap_err();
        assert!(matches!(e, EngineError::Template { .. }), "{recursing}: {e:?}");
    }
    // A real template still renders well within the limits.
    let (_d, tok) = tokenizer_with_template("{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}");
    assert_eq!(tok.render_chat("hi").unwrap(), "user: hi");
}

// ---------------------------------------------------------------------------------------------
// Inputs that once crashed, replayed.

#[test]
fn regressions_stay_fixed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| parse_and_tokenize(&bytes, true));
        match outcome {
            Ok(Err(e)) => assert!(!e.to_string().is_empty()),
            Ok(Ok(())) => panic!("{} was a crash and should now be an error", path.display()),
            Err(p) => panic!("{} panics: {}", path.display(), panic_text(&*p)),
        }
        match load_model(&path, WeightFormat::Auto, &Device::Cpu) {
            Err(e) => assert!(!e.to_string().is_empty()),
            Ok(_) => panic!("{} loads", path.display()),
        }
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}

/// The checks refuse damage, not real files: both shipped drafts (one without an embedding of its
/// own) open and build their tokenizers.
#[test]
fn shipped_models_pass_the_checks() {
    for name in ["smollm2-135m-draft-d192-l8.Q8_0.gguf", "smollm2-135m-feature-draft.Q8_0.gguf"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/models").join(name);
        let file = ModelFile::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tok = TextTokenizer::from_model_file(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(tok.vocab_size(), 49152);
        assert!(tok.render_chat("hi").unwrap().contains("hi"));
    }
}
