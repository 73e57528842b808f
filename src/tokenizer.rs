//! Text ↔ token ids. Built from the GGUF's own tokenizer metadata (byte-level BPE), or from a
//! `tokenizer.json` lying beside the GGUF. Also: the chat template, and a streaming decoder that
//! never emits half a UTF-8 character.

use crate::error::{EngineError, Result};
use crate::gguf::ModelFile;
use candle_core::quantized::gguf_file::Value;
use std::path::PathBuf;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

/// Pre-tokenizer regex of Llama 3 (`llama-bpe`): numbers in groups of up to three digits.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Pre-tokenizer regex of Qwen2: every digit on its own.
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Instructions a chat template may run for one render: far more than a real template needs for
/// one message (tests/fuzz/ renders the shipped draft's, a Llama 3 and a ChatML-with-tools
/// template within it), far less than a template that never ends would take.
pub const TEMPLATE_FUEL: u64 = 2_000_000;
/// Nesting depth (loops, macros, includes) a chat template may reach; minijinja's own maximum is 500.
pub const TEMPLATE_RECURSION_LIMIT: usize = 100;

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;
const TOKEN_TYPE_UNUSED: i32 = 5;

pub struct TextTokenizer {
    pub inner: Tokenizer,
    /// Token strings as the GGUF lists them (used to compare a draft's vocabulary with a target's).
    pub tokens: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// Ids that end a turn: EOS plus end-of-turn tokens such as `<|im_end|>` and `<|eot_id|>`.
    pub stop_ids: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
    /// Ids from here on are padding (unused entries such as `[PAD151936]` that converters add to
    /// fill a padded embedding); no text ever encodes to them.
    pub n_unpadded: usize,
    source: PathBuf,
}

impl TextTokenizer {
    /// Whether a draft whose tokenizer is `draft` fits a target with this one: the same token
    /// strings up to the shorter list, past it only padding in the longer one (Qwen2.5-7B lists
    /// 152,064 entries, its 0.5B sibling 151,936), the same end-of-sequence id. Returns how many
    /// ids both share; the error names the first difference. Loading, the engine, eval-draft and
    /// the app's model list ([`Self::pair_fingerprint`]) all decide by it.
    pub fn fits_draft(&self, draft: &TextTokenizer) -> std::result::Result<usize, String> {
        let n = self.vocab_size().min(draft.vocab_size());
        let (longer, which) = if self.vocab_size() >= draft.vocab_size() { (self, "target") } else { (draft, "draft") };
        if longer.n_unpadded > n {
            return Err(format!(
                "vocabulary sizes {} and {} differ, and the {which}'s token {n} ({:?}) is a real token, not padding",
                self.vocab_size(),
                draft.vocab_size(),
                longer.tokens[n]
            ));
        }
        if let Some(i) = (0..n).find(|&i| self.tokens[i] != draft.tokens[i]) {
            return Err(format!(
                "token {i} is {:?} in the target but {:?} in the draft",
                self.tokens[i], draft.tokens[i]
            ));
        }
        if self.eos_id != draft.eos_id {
            return Err(format!("end-of-sequence ids differ ({:?} vs {:?})", self.eos_id, draft.eos_id));
        }
        Ok(n)
    }

    /// A hash of what [`Self::fits_draft`] compares (the token strings before the padding, the
    /// end-of-sequence id), so that the app can list the drafts that fit a target without
    /// loading them: tokenizers that fit each other have the same fingerprint.
    pub fn pair_fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.tokens[..self.n_unpadded].iter().for_each(|t| t.hash(&mut h));
        self.eos_id.hash(&mut h);
        h.finish()
    }
}

/// The GGUF's token types (llama.cpp's `llama_token_type`), empty where the file has none.
fn token_types(file: &ModelFile) -> Vec<i32> {
    file.metadata()
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.to_vec().ok())
        .map(|a| a.iter().map(|v| v.to_i32().unwrap_or(1)).collect())
        .unwrap_or_default()
}

/// Index after the last token that is not padding: an UNUSED token type, or a converter's
/// `[PAD<id>]` name.
fn unpadded_len(tokens: &[String], types: &[i32]) -> usize {
    let padding = |i: usize| {
        types.get(i) == Some(&TOKEN_TYPE_UNUSED) || tokens[i].strip_prefix("[PAD").is_some_and(|r| r.ends_with(']'))
    };
    (0..tokens.len()).rev().find(|&i| !padding(i)).map_or(0, |i| i + 1)
}

fn meta_strings(file: &ModelFile, key: &str) -> Option<Vec<String>> {
    let arr = file.metadata().get(key)?.to_vec().ok()?;
    arr.iter().map(|v| v.to_string().ok().cloned()).collect()
}

fn meta_u32(file: &ModelFile, key: &str) -> Option<u32> {
    file.metadata().get(key).and_then(|v| match v {
        Value::U32(x) => Some(*x),
        Value::I32(x) => u32::try_from(*x).ok(),
        Value::U64(x) => u32::try_from(*x).ok(),
        _ => None,
    })
}

/// A digest of everything a tokenizer is built from: every `tokenizer.*` metadata entry but the
/// chat template, and
/// whether a `tokenizer.json` lies beside the file (which then wins). Two files with the same
/// digest build the same tokenizer, so a target and its draft can share one.
pub fn source_digest(file: &ModelFile) -> u64 {
    use std::hash::{Hash, Hasher};
    fn value(v: &Value, h: &mut std::collections::hash_map::DefaultHasher) {
        match v {
            Value::U8(x) => (0u8, *x).hash(h),
            Value::I8(x) => (1u8, *x).hash(h),
            Value::U16(x) => (2u8, *x).hash(h),
            Value::I16(x) => (3u8, *x).hash(h),
            Value::U32(x) => (4u8, *x).hash(h),
            Value::I32(x) => (5u8, *x).hash(h),
            Value::U64(x) => (6u8, *x).hash(h),
            Value::I64(x) => (7u8, *x).hash(h),
            Value::F32(x) => (8u8, x.to_bits()).hash(h),
            Value::F64(x) => (9u8, x.to_bits()).hash(h),
            Value::Bool(x) => (10u8, *x).hash(h),
            Value::String(x) => (11u8, x).hash(h),
            Value::Array(items) => {
                (12u8, items.len()).hash(h);
                items.iter().for_each(|item| value(item, h));
            }
        }
    }
    // The chat template is left out: a pair's prompt is always written with the target's, so two
    // files whose templates differ by a character (Qwen2.5-Coder 1.5B and 0.5B) still share one.
    let mut keys: Vec<&String> = file
        .metadata()
        .keys()
        .filter(|k| k.starts_with("tokenizer.") && k.as_str() != "tokenizer.chat_template")
        .collect();
    keys.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    file.path.with_file_name("tokenizer.json").is_file().hash(&mut h);
    for k in keys {
        k.hash(&mut h);
        value(&file.metadata()[k], &mut h);
    }
    h.finish()
}

impl TextTokenizer {
    /// Whether this tokenizer suits a model of `n_vocab` embedding rows: every id it can produce
    /// must have a row (the file at `path` is named in the error).
    pub fn check_fits(&self, n_vocab: usize, path: &std::path::Path) -> Result<()> {
        let n_ids = self.tokens.len().max(self.inner.get_vocab_size(true));
        if n_ids > n_vocab {
            return Err(EngineError::Tokenizer {
                path: path.to_path_buf(),
                detail: format!(
                    "the tokenizer has {n_ids} tokens but the model has only {n_vocab} embedding rows; the file is \
                     damaged or mixes two models: download it again"
                ),
            });
        }
        Ok(())
    }

    pub fn from_model_file(file: &ModelFile) -> Result<TextTokenizer> {
        let err = |detail: String| EngineError::Tokenizer { path: file.path.clone(), detail };
        let tokens = meta_strings(file, "tokenizer.ggml.tokens")
            .ok_or_else(|| err("the GGUF has no tokenizer.ggml.tokens list".into()))?;
        let beside = file.path.with_file_name("tokenizer.json");
        let inner = if beside.is_file() {
            Tokenizer::from_file(&beside).map_err(|e| err(format!("{}: {e}", beside.display())))?
        } else {
            build_bpe(file, &tokens).map_err(err)?
        };
        let bos_id = meta_u32(file, "tokenizer.ggml.bos_token_id");
        let eos_id = meta_u32(file, "tokenizer.ggml.eos_token_id");
        let add_bos =
            file.metadata().get("tokenizer.ggml.add_bos_token").and_then(|v| v.to_bool().ok()).unwrap_or(false);
        let mut stop_ids: Vec<u32> = eos_id.into_iter().collect();
        for name in ["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>"] {
            if let Some(id) = tokens.iter().position(|t| t == name) {
                let id = id as u32;
                if !stop_ids.contains(&id) {
                    stop_ids.push(id);
                }
            }
        }
        if let Some(id) = meta_u32(file, "tokenizer.ggml.eot_token_id") {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        }
        let chat_template = file.meta_str("tokenizer.chat_template").map(str::to_string);
        let n_unpadded = unpadded_len(&tokens, &token_types(file));
        let tok = TextTokenizer {
            n_unpadded,
            inner,
            tokens,
            bos_id,
            eos_id,
            stop_ids,
            add_bos,
            chat_template,
            source: file.path.clone(),
        };
        // An id the model has no embedding row for would be an out-of-range lookup at the first
        // forward: a file whose tokenizer outgrows its model is refused here.
        tok.check_fits(file.config.n_vocab, &file.path)?;
        Ok(tok)
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Encode text; special-token strings (e.g. `<|im_start|>`) become their single ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| EngineError::Tokenizer {
            path: self.source.clone(),
            detail: format!("encoding failed: {e}"),
        })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decode ids to text, keeping special tokens visible.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| EngineError::Tokenizer { path: self.source.clone(), detail: format!("decoding failed: {e}") })
    }

    /// The ids the model sees for a user prompt: through the chat template unless `raw`.
    pub fn prompt_ids(&self, prompt: &str, raw: bool) -> Result<Vec<u32>> {
        if prompt.trim().is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let text = if raw { prompt.to_string() } else { self.render_chat(prompt)? };
        let mut ids = self.encode(&text)?;
        if self.add_bos {
            if let Some(bos) = self.bos_id {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }

    /// Render the model's chat template for one user message, with the generation prompt.
    /// Without a template in the file, ChatML (SmolLM2's and Qwen's format) is used.
    pub fn render_chat(&self, prompt: &str) -> Result<String> {
        let template = self.chat_template.clone().unwrap_or_else(|| {
            "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".to_string()
        });
        let err = |e: minijinja::Error| {
            let detail = match e.kind() {
                minijinja::ErrorKind::OutOfFuel => {
                    format!("it ran more than {TEMPLATE_FUEL} steps for one message, so it probably never ends")
                }
                _ => e.to_string(),
            };
            EngineError::Template { path: self.source.clone(), detail }
        };
        let mut env = minijinja::Environment::new();
        // The template is a program from the file: bound its steps and its depth so that one that
        // loops or recurses forever is an error instead of a frozen app.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(TEMPLATE_RECURSION_LIMIT);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", template).map_err(err)?;
        let tmpl = env.get_template("chat").map_err(err)?;
        let token_text = |id: Option<u32>| id.and_then(|i| self.tokens.get(i as usize)).cloned().unwrap_or_default();
        tmpl.render(minijinja::context! {
            messages => vec![minijinja::context! { role => "user", content => prompt }],
            add_generation_prompt => true,
            bos_token => token_text(self.bos_id),
            eos_token => token_text(self.eos_id),
        })
        .map_err(err)
    }
}

fn build_bpe(file: &ModelFile, tokens: &[String]) -> std::result::Result<Tokenizer, String> {
    let model_kind = file.meta_str("tokenizer.ggml.model").unwrap_or("gpt2");
    if model_kind != "gpt2" {
        return Err(format!(
            "tokenizer model `{model_kind}` is not supported (only byte-level BPE, `gpt2`); put the model's tokenizer.json beside the GGUF"
        ));
    }
    let merges: Vec<(String, String)> = meta_strings(file, "tokenizer.ggml.merges")
        .ok_or("the GGUF has no tokenizer.ggml.merges list")?
        .into_iter()
        .filter_map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
        .collect();
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let pre = file.meta_str("tokenizer.ggml.pre").unwrap_or("default");
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre == "llama-bpe")
        .build()
        .map_err(|e| format!("building BPE: {e}"))?;
    let split = |pattern: &str| -> std::result::Result<PreTokenizerWrapper, String> {
        Ok(Split::new(SplitPattern::Regex(pattern.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| format!("pre-tokenizer regex: {e}"))?
            .into())
    };
    let pre_tokenizer: PreTokenizerWrapper = match pre {
        // SmolLM2: digits split one by one, then GPT-2's byte-level regex, no prefix space.
        "smollm" | "smollm2" => {
            Sequence::new(vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()]).into()
        }
        "qwen2" => Sequence::new(vec![split(QWEN2_PATTERN)?, ByteLevel::new(false, true, false).into()]).into(),
        "llama-bpe" | "llama3" => {
            Sequence::new(vec![split(LLAMA3_PATTERN)?, ByteLevel::new(false, true, false).into()]).into()
        }
        _ => ByteLevel::new(false, true, true).into(),
    };
    let mut tk = Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(pre_tokenizer));
    tk.with_decoder(Some(ByteLevelDecoder::default()));
    let types = token_types(file);
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(types.iter())
        .filter(|(_, &ty)| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED)
        .map(|(t, _)| AddedToken::from(t.clone(), true))
        .collect();
    tk.add_special_tokens(special).map_err(|e| format!("adding special tokens: {e}"))?;
    Ok(tk)
}

/// Turns a stream of ids into text pieces. A piece is emitted only once the bytes decoded so far
/// form whole UTF-8 characters; a token ending mid-character yields an empty piece and its bytes
/// come out with the next token.
#[derive(Default, Debug, Clone)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Index in `ids` from which text is re-decoded (kept small so each step is cheap).
    start: usize,
    /// Length of the text of `ids[start..]` already emitted.
    emitted: usize,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = tok.decode(&self.ids[self.start..])?;
        if text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let piece = text.get(self.emitted..).unwrap_or("").to_string();
        // Restart the window at this token: decoding context across whole tokens is only needed
        // for characters split between tokens.
        self.start = self.ids.len();
        self.emitted = 0;
        Ok(piece)
    }
}
