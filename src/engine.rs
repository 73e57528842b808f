//! The engine facade: a target and an optional draft, loaded once, running requests. The CLI, the
//! app's engine thread and the tests all drive this API.

use crate::corpus::Corpus;
use crate::error::{EngineError, Result};
use crate::generate::{
    generate_single, generate_speculative, GenEvent, GenerateRequest, Generation, LoadedModel, Mode,
};
use crate::gguf::ModelFile;
use crate::model::{Transformer, WeightFormat};
use crate::models::{self, FetchProgress};
use crate::options::EngineOptions;
use crate::tokenizer::TextTokenizer;
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Open, validate and load one GGUF model with its tokenizer, with the process's options.
pub fn load_model(path: &Path, format: WeightFormat, device: &Device) -> Result<LoadedModel> {
    load_model_with(path, format, device, &crate::options::current())
}

/// [`load_model`] with `options` choosing the engine's paths.
pub fn load_model_with(
    path: &Path,
    format: WeightFormat,
    device: &Device,
    options: &EngineOptions,
) -> Result<LoadedModel> {
    let mut file = ModelFile::open(path)?;
    let tokenizer = Arc::new(TextTokenizer::from_model_file(&file)?);
    file.drop_tokenizer_lists();
    load_file(&file, tokenizer, format, device, options)
}

/// Load an opened file's weights, with its tokenizer already built.
fn load_file(
    file: &ModelFile,
    tokenizer: Arc<TextTokenizer>,
    format: WeightFormat,
    device: &Device,
    options: &EngineOptions,
) -> Result<LoadedModel> {
    let model = Transformer::load_with(file, format, device, options)?;
    Ok(LoadedModel { model, tokenizer, info: file.info() })
}

/// A draft's tokenizer: the target's own where both files describe the same one (one copy in
/// memory, built once), else its own.
fn draft_tokenizer(draft: &ModelFile, target: &LoadedModel, target_digest: u64) -> Result<Arc<TextTokenizer>> {
    if crate::tokenizer::source_digest(draft) == target_digest {
        target.tokenizer.check_fits(draft.config.n_vocab, &draft.path)?;
        return Ok(Arc::clone(&target.tokenizer));
    }
    Ok(Arc::new(TextTokenizer::from_model_file(draft)?))
}

/// Load the draft at `path` for `target`, as [`Engine::load`] does: its tokenizer shared with the
/// target's where both files describe the same one (`target_digest`, the target file's
/// [`crate::tokenizer::source_digest`]; `None`: its own), the vocabulary check, its head-token list.
pub fn load_draft(
    path: &Path,
    target: &LoadedModel,
    target_digest: Option<u64>,
    weights: WeightFormat,
    device: &Device,
    options: &EngineOptions,
) -> Result<LoadedModel> {
    let mut dfile = ModelFile::open(path)?;
    let tokenizer = match target_digest {
        Some(digest) => draft_tokenizer(&dfile, target, digest)?,
        None => Arc::new(TextTokenizer::from_model_file(&dfile)?),
    };
    dfile.drop_tokenizer_lists();
    let weights = draft_format(weights, &dfile, target, device);
    let mut d = load_file(&dfile, tokenizer, weights, device, options)?;
    crate::generate::check_vocab(target, &d)?;
    if let Some(list) = crate::head_tokens::list_path(path) {
        let ids = crate::head_tokens::read_list(&list, d.model.config.n_vocab).map_err(EngineError::InvalidSetting)?;
        d.model.adopt_head_tokens(ids, options.restricted_head);
    }
    Ok(d)
}

/// A draft's weight format: `Auto` becomes `Q4_0` on the CPU for a dear draft, one whose blocks
/// hold at least a tenth of the bytes of the target's weights (the 0.5B sibling of a 1.5B target:
/// a fifth). Each of its steps reads those bytes, and its matrices held in more than 4.5 bits per
/// weight (Q5_0, Q6_K, Q8_0) read about a fifth less as Q4_0, for a few points of acceptance.
fn draft_format(weights: WeightFormat, dfile: &ModelFile, target: &LoadedModel, device: &Device) -> WeightFormat {
    let dear = dfile.block_bytes() * DEAR_DRAFT_SHARE >= target.model.memory().0 as u64;
    match weights {
        WeightFormat::Auto if device.is_cpu() && dear => WeightFormat::Q4_0,
        w => w,
    }
}

/// A draft whose blocks hold at least 1 / this of the target's weight bytes is dear ([`draft_format`]).
const DEAR_DRAFT_SHARE: u64 = 10;

/// Which models to load. `None` means the default: the default target (fetched if missing), the
/// draft shipped for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ModelChoice {
    pub target: Option<PathBuf>,
    pub draft: Option<PathBuf>,
    pub weights: WeightFormat,
    /// The draft's weight format where it differs from the target's: a draft re-quantized to
    /// 4 bits (`q4_0`, `q4_1`) reads fewer bytes per step.
    #[serde(default)]
    pub draft_weights: Option<WeightFormat>,
}

/// Whether a load needs a draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftUse {
    /// Target only (a named draft is not loaded either).
    Skip,
    /// The chosen or shipped draft when it loads and fits; otherwise the target alone, with the
    /// draft's error in [`LoadedPair::draft_error`].
    IfAvailable,
    /// A draft, or the load fails.
    Required,
}

/// What a load is doing, for progress displays.
#[derive(Debug)]
pub enum LoadStep<'a> {
    /// The default target is being fetched.
    Fetch(FetchProgress),
    /// The target's header, tensor table and tokenizer are sound: a caller may now release
    /// the models it loaded before (the load itself needs their memory).
    Checked,
    /// A model file is being read.
    Loading(&'a Path),
    /// Something the user should know (the device fell back to the CPU, say).
    Notice(String),
}

/// A loaded pair, with the reason the draft is missing when it was optional.
pub struct LoadedPair {
    pub engine: Engine,
    pub draft_error: Option<EngineError>,
}

pub struct Engine {
    pub target: LoadedModel,
    pub draft: Option<LoadedModel>,
    /// Files the adaptive policy may copy from as from the context ([`Engine::read_corpus`]).
    pub corpus: Option<Arc<Corpus>>,
}

impl Engine {
    /// The one way the CLI, the app and `bench` load models: resolve the target (fetching the
    /// default one), check it, pick the device, load the target, then the draft as `draft_use`
    /// says, with a vocabulary check.
    pub fn load(
        choice: &ModelChoice,
        draft_use: DraftUse,
        options: &EngineOptions,
        progress: &mut dyn FnMut(LoadStep),
    ) -> Result<LoadedPair> {
        let target_path = match &choice.target {
            Some(p) => p.clone(),
            None => models::ensure_default_target(&mut |p| progress(LoadStep::Fetch(p)))?,
        };
        let mut file = ModelFile::open(&target_path)?;
        let tokenizer = Arc::new(TextTokenizer::from_model_file(&file)?);
        let target_digest = crate::tokenizer::source_digest(&file);
        file.drop_tokenizer_lists();
        progress(LoadStep::Checked);
        let device = crate::model::default_device();
        if let Some(note) = crate::model::device_note() {
            progress(LoadStep::Notice(note));
        }
        progress(LoadStep::Loading(&target_path));
        let target = load_file(&file, tokenizer, choice.weights, &device, options)?;
        drop(file);
        let draft_path = match (&choice.draft, draft_use) {
            (_, DraftUse::Skip) => None,
            (Some(p), _) => Some(models::resolve_draft(p)),
            (None, _) => models::default_draft().map(Ok),
        };
        let draft = match draft_path {
            None if draft_use == DraftUse::Required => Err(EngineError::InvalidSetting(
                "no draft model: pass --draft PATH, or restore assets/models/ (the default draft ships there)".into(),
            )),
            None => Ok(None),
            Some(path) => path.and_then(|p| {
                progress(LoadStep::Loading(&p));
                let weights = choice.draft_weights.unwrap_or(choice.weights);
                load_draft(&p, &target, Some(target_digest), weights, &device, options).map(Some)
            }),
        };
        match (draft, draft_use) {
            (Ok(draft), _) => Ok(LoadedPair { engine: Engine { target, draft, corpus: None }, draft_error: None }),
            (Err(e), DraftUse::Required) => Err(e),
            (Err(e), _) => {
                Ok(LoadedPair { engine: Engine { target, draft: None, corpus: None }, draft_error: Some(e) })
            }
        }
    }

    pub fn new(target: LoadedModel, draft: Option<LoadedModel>) -> Result<Engine> {
        if let Some(d) = &draft {
            crate::generate::check_vocab(&target, d)?;
        }
        Ok(Engine { target, draft, corpus: None })
    }

    /// Read the text files under `roots` with the target's tokenizer as the corpus that adaptive
    /// rounds copy from ([`crate::corpus`]); an empty list drops it. Returns its summary.
    pub fn read_corpus(&mut self, roots: &[std::path::PathBuf]) -> Result<Option<String>> {
        self.corpus = match roots.is_empty() {
            true => None,
            false => Some(Arc::new(Corpus::read(roots, &self.target.tokenizer)?)),
        };
        Ok(self.corpus.as_ref().map(|c| c.summary()))
    }

    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(GenEvent),
    ) -> Result<Generation> {
        let no_draft = || {
            EngineError::InvalidSetting(format!(
                "mode `{:?}` needs a draft model: pass --draft PATH (or put the default draft in assets/models)",
                req.mode
            ))
        };
        match req.mode {
            Mode::Target => generate_single(&mut self.target, None, req, cancel, on_event),
            Mode::Draft => {
                let draft = self.draft.as_mut().ok_or_else(no_draft)?;
                generate_single(draft, Some(&mut self.target), req, cancel, on_event)
            }
            Mode::Speculative => {
                let draft = self.draft.as_mut().ok_or_else(no_draft)?;
                let corpus = self.corpus.as_deref();
                if corpus.is_some_and(|c| c.fingerprint != self.target.tokenizer.pair_fingerprint()) {
                    return Err(EngineError::InvalidSetting(
                        "the corpus was read with another model's tokenizer: read it again for this target".into(),
                    ));
                }
                generate_speculative(&mut self.target, draft, req, corpus, cancel, on_event)
            }
        }
    }
}
