//! The GGUF files on disk, for the app's model lists.

use super::FoundModel;
use crate::models;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

/// What was read of each file, with its size and modification time when read: a file that has
/// not changed is not opened again (a large model's tokenizer takes tens of MB to read).
type Seen = HashMap<PathBuf, (u64, Option<SystemTime>, FoundModel)>;
static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

/// Every GGUF on disk that opens, with its tokenizer's
/// [`crate::tokenizer::TextTokenizer::pair_fingerprint`]: files that fit each other as a pair
/// have the same one.
pub fn discover() -> Vec<FoundModel> {
    let mut seen = SEEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let seen = seen.get_or_insert_with(HashMap::new);
    let found: Vec<FoundModel> = models::discover_gguf()
        .into_iter()
        .filter_map(|path| {
            let meta = std::fs::metadata(&path).ok()?;
            let stamp = (meta.len(), meta.modified().ok());
            if let Some((len, modified, found)) = seen.get(&path) {
                if (*len, *modified) == stamp {
                    return Some(found.clone());
                }
            }
            let file = crate::gguf::ModelFile::open(&path).ok()?;
            let tok = crate::tokenizer::TextTokenizer::from_model_file(&file).ok()?;
            let found = FoundModel { info: file.info(), tokenizer_fingerprint: tok.pair_fingerprint() };
            seen.insert(path, (stamp.0, stamp.1, found.clone()));
            Some(found)
        })
        .collect();
    // Files that went away are forgotten.
    seen.retain(|path, _| found.iter().any(|f| f.info.path == *path));
    found
}
