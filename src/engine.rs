//! The engine facade: a target and an optional draft, loaded once, running requests. The CLI, the
//! app's engine thread and the tests all drive this API.

use crate::error::{EngineError, Result};
use crate::generate::{
    generate_single, generate_speculative, GenEvent, GenerateRequest, Generation, LoadedModel, Mode,
};
use crate::gguf::ModelFile;
use crate::model::{Transformer, WeightFormat};
use crate::tokenizer::TextTokenizer;
use candle_core::Device;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Open, validate and load one GGUF model with its tokenizer.
pub fn load_model(path: &Path, format: WeightFormat, device: &Device) -> Result<LoadedModel> {
    let file = ModelFile::open(path)?;
    let tokenizer = TextTokenizer::from_model_file(&file)?;
    let model = Transformer::load(&file, format, device)?;
    Ok(LoadedModel { model, tokenizer, info: file.info() })
}

pub struct Engine {
    pub target: LoadedModel,
    pub draft: Option<LoadedModel>,
}

impl Engine {
    pub fn new(target: LoadedModel, draft: Option<LoadedModel>) -> Result<Engine> {
        if let Some(d) = &draft {
            crate::generate::check_vocab(&target, d)?;
        }
        Ok(Engine { target, draft })
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
                generate_speculative(&mut self.target, draft, req, cancel, on_event)
            }
        }
    }
}
