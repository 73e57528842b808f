//! Hand-made hostile inputs (sizes, metadata values, tokenizers, chat templates) and the inputs
//! that once crashed: each is a typed error, never a panic or an allocation the file cannot justify.

use super::*;

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

    // Names and keys longer than any writer makes, which error messages would quote (a 16 MB
    // name of invalid UTF-8 became a 50 MB message): refused before they are read.
    let with_len_before = |needle: &str, len: u64| {
        let at = find(&base, needle.as_bytes()).unwrap() - 8;
        let mut b = base.clone();
        b[at..at + 8].copy_from_slice(&len.to_le_bytes());
        b
    };
    let d = corrupt_detail(&with_len_before("blk.0.attn_q.weight", 2000));
    assert!(d.contains("tensor name") && d.contains("2000 bytes long (at most 1024)"), "{d}");
    assert!(base.len() > 70_000, "the synthetic model is large enough for a 65,536-byte key");
    let d = corrupt_detail(&with_len_before("general.name", 65_536));
    assert!(d.contains("metadata key") && d.contains("65536 bytes long (at most 65535)"), "{d}");
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
