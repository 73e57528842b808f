//! Head-token lists: the tokens a draft's output head is restricted to. A draft's head over a
//! large vocabulary is much of its cost (Qwen2.5-0.5B's 151,936 × 896 Q8_0 head is a third of the
//! bytes it reads per token), while text in a few languages uses a small share of the vocabulary.
//! A list comes from the draft file's own metadata (`mentor_lab.head_tokens`), or from a file of
//! ids beside it (`<draft>.head-tokens`) or in the assets' models folder; `mentor-lab head-tokens`
//! writes one by counting the tokens of a corpus. Which tokens the draft may propose never
//! changes what the target emits: the restriction only moves acceptance and cost.

use crate::error::{EngineError, Result};
use crate::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};

/// The list file for the draft at `draft`: beside it, else in the assets' models folder under the
/// draft's file name.
pub fn list_path(draft: &Path) -> Option<PathBuf> {
    let name = format!("{}.head-tokens", draft.file_name()?.to_string_lossy());
    let beside = draft.with_file_name(&name);
    if beside.is_file() {
        return Some(beside);
    }
    Some(crate::models::assets_dir().join("models").join(name)).filter(|p| p.is_file())
}

/// Read a list: one token id per line, ascending and unique, each below `n_vocab`.
pub fn read_list(path: &Path, n_vocab: usize) -> std::result::Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut ids = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let id: u32 = line
            .trim()
            .parse()
            .map_err(|_| format!("{} line {}: `{line}` is not a token id", path.display(), i + 1))?;
        ids.push(id);
    }
    if ids.is_empty() || ids.windows(2).any(|w| w[0] >= w[1]) || ids.last().is_some_and(|&l| l as usize >= n_vocab) {
        return Err(format!(
            "{}: a head-token list must be non-empty, ascending, unique token ids below {n_vocab}; write it again with \
             `mentor-lab head-tokens`",
            path.display()
        ));
    }
    Ok(ids)
}

/// Write `ids` (ascending) to `path` through a temporary file renamed into place.
pub fn write_list(path: &Path, ids: &[u32]) -> Result<()> {
    let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// How often each token id occurs in the files' text (files that are not UTF-8 are skipped).
pub fn count_tokens(tokenizer: &TextTokenizer, files: &[PathBuf]) -> Result<Vec<u64>> {
    let mut counts = vec![0u64; tokenizer.vocab_size()];
    for f in files {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        // Blank-line blocks keep each encode small; a split moves at most the tokens at its edge.
        for chunk in text.split_inclusive("\n\n") {
            for id in tokenizer.encode(chunk)? {
                if let Some(c) = counts.get_mut(id as usize) {
                    *c += 1;
                }
            }
        }
    }
    Ok(counts)
}

/// The `n` most frequent tokens (ties by id), with `always` (the control tokens a chat needs)
/// added, ascending.
pub fn choose(counts: &[u64], n: usize, always: &[u32]) -> Result<Vec<u32>> {
    let mut order: Vec<u32> = (0..counts.len() as u32).filter(|&i| counts[i as usize] > 0).collect();
    if order.is_empty() {
        return Err(EngineError::InvalidSetting("the corpus holds no text: name folders or files of text".into()));
    }
    order.sort_by_key(|&i| (std::cmp::Reverse(counts[i as usize]), i));
    order.truncate(n);
    order.extend(always.iter().copied().filter(|&i| (i as usize) < counts.len()));
    order.sort_unstable();
    order.dedup();
    Ok(order)
}

#[cfg(test)]
mod tests {
    #[test]
    fn choose_takes_the_most_frequent_and_keeps_the_specials() {
        let counts = [0, 5, 9, 1, 9, 0, 2];
        assert_eq!(super::choose(&counts, 2, &[]).unwrap(), vec![2, 4]);
        assert_eq!(super::choose(&counts, 3, &[5, 99]).unwrap(), vec![1, 2, 4, 5]);
        assert!(super::choose(&[0, 0], 2, &[]).is_err());
    }

    #[test]
    fn lists_round_trip_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.gguf.head-tokens");
        super::write_list(&p, &[1, 5, 9]).unwrap();
        assert_eq!(super::read_list(&p, 10).unwrap(), vec![1, 5, 9]);
        let e = super::read_list(&p, 9).unwrap_err();
        assert!(e.contains("below 9") && e.contains("mentor-lab head-tokens"), "{e}");
        std::fs::write(&p, "3\n2\n").unwrap();
        assert!(super::read_list(&p, 10).unwrap_err().contains("ascending"));
        std::fs::write(&p, "3\nx\n").unwrap();
        assert!(super::read_list(&p, 10).unwrap_err().contains("line 2"));
    }
}
