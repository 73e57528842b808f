//! A corpus to copy from: files the user points at (their own source folder, documents), read as
//! the target's tokens and indexed by 3-gram, so that a round can propose what followed the
//! context's last tokens there, as [`crate::lookup`] does within the context. Like a copy from the
//! context, a copy from the corpus costs no draft forward and is verified with π = p: it changes
//! how fast the text comes, never what the target emits at D = 0.

use crate::error::{EngineError, Result};
use crate::lookup::{Match, MAX_MATCH, MIN_MATCH};
use crate::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};

/// File extensions read from a folder: source code and prose (a file named directly is read
/// whatever its extension).
pub const TEXT_EXTENSIONS: &[&str] = &[
    "py", "rs", "c", "h", "cc", "cpp", "hpp", "js", "ts", "tsx", "java", "go", "rb", "sh", "md", "txt", "rst", "toml",
    "json", "yaml", "yml", "html", "css", "sql", "jsonl", "kt", "swift", "cs", "php", "lua", "r", "jl", "scala", "tex",
];
/// Folders never read: version control, build output and dependencies.
const SKIPPED_DIRS: &[&str] = &["target", "node_modules", "__pycache__", "build", "dist", "venv"];
/// The most text a corpus reads (its index holds 8 bytes per token, about 2 MB per MB of text).
pub const MAX_CORPUS_BYTES: u64 = 16 << 20;
/// Larger files are skipped (generated code, data).
const MAX_FILE_BYTES: u64 = 1 << 20;
/// Occurrences of the context's last 3 tokens looked at per proposal (a common 3-gram occurs
/// thousands of times in a large corpus; the longest match among the first few is kept).
const MAX_SCAN: usize = 256;
/// Tokens that must match before a copy from the corpus is proposed: shorter matches in other
/// text are common phrases, whose next token is often not this text's.
pub const MIN_CORPUS_MATCH: usize = 6;
/// Between files: no match runs across it and no copy goes past it.
const SEP: u32 = u32::MAX;

/// A corpus's tokens and its 3-gram index.
pub struct Corpus {
    /// Every file's tokens, one after another, each followed by [`SEP`].
    tokens: Vec<u32>,
    /// Positions of every 3-gram within one file, sorted by the 3-gram (then by position).
    by_trigram: Vec<u32>,
    /// What was read: files, their bytes, and the files left out (over the size limits, not
    /// UTF-8).
    pub n_files: usize,
    pub n_bytes: u64,
    pub n_skipped: usize,
    /// The target tokenizer's fingerprint it was read with ([`TextTokenizer::pair_fingerprint`]).
    pub fingerprint: u64,
}

impl std::fmt::Debug for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Corpus({})", self.summary())
    }
}

impl Corpus {
    /// Read the text files under `roots` (folders are walked, hidden entries and build folders
    /// skipped; files named directly are read whatever their extension) with `tok`, up to
    /// [`MAX_CORPUS_BYTES`]. A path that does not exist, or roots with no text at all, are errors
    /// that say so.
    pub fn read(roots: &[PathBuf], tok: &TextTokenizer) -> Result<Corpus> {
        for r in roots {
            if !r.exists() {
                return Err(EngineError::InvalidSetting(format!(
                    "corpus path {} does not exist: name a folder or text files to copy from",
                    r.display()
                )));
            }
        }
        let mut tokens = Vec::new();
        let (mut n_files, mut n_bytes, mut n_skipped) = (0, 0u64, 0);
        for f in text_files(roots) {
            let size = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(u64::MAX);
            let text = match size <= MAX_FILE_BYTES && n_bytes + size <= MAX_CORPUS_BYTES {
                true => std::fs::read(&f).ok().and_then(|b| String::from_utf8(b).ok()).filter(|t| !t.contains('\0')),
                false => None,
            };
            let Some(text) = text else {
                n_skipped += 1;
                continue;
            };
            // Blank-line blocks keep each encode small; a split moves at most the tokens at its edge.
            for chunk in text.split_inclusive("\n\n") {
                tokens.extend(tok.encode(chunk)?);
            }
            tokens.push(SEP);
            (n_files, n_bytes) = (n_files + 1, n_bytes + size);
        }
        if n_files == 0 {
            let named: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
            return Err(EngineError::InvalidSetting(format!(
                "no text file to copy from in {} ({n_skipped} left out: over 1 MB, not UTF-8, or past the 16 MB in all)",
                named.join(", ")
            )));
        }
        Ok(Corpus::index(tokens, (n_files, n_bytes, n_skipped), tok.pair_fingerprint()))
    }

    /// The corpus of `tokens` (files separated by [`SEP`]) with its index.
    fn index(tokens: Vec<u32>, (n_files, n_bytes, n_skipped): (usize, u64, usize), fingerprint: u64) -> Corpus {
        let trigram = |i: usize| [tokens[i], tokens[i + 1], tokens[i + 2]];
        let mut by_trigram: Vec<u32> = (0..tokens.len().saturating_sub(MIN_MATCH - 1))
            .filter(|&i| !trigram(i).contains(&SEP))
            .map(|i| i as u32)
            .collect();
        by_trigram.sort_by_key(|&i| trigram(i as usize));
        Corpus { tokens, by_trigram, n_files, n_bytes, n_skipped, fingerprint }
    }

    /// The corpus of one text's `ids` (tests, and text the user pastes).
    pub fn from_ids(ids: &[u32], fingerprint: u64) -> Corpus {
        let mut tokens: Vec<u32> = ids.iter().copied().filter(|&t| t != SEP).collect();
        tokens.push(SEP);
        Corpus::index(tokens, (1, 0, 0), fingerprint)
    }

    /// Tokens read (the file separators aside).
    pub fn n_tokens(&self) -> usize {
        self.tokens.len() - self.n_files
    }

    /// "12 files, 3.4 MB, 910,000 tokens" (and what was left out).
    pub fn summary(&self) -> String {
        let skipped = match self.n_skipped {
            0 => String::new(),
            n => format!(", {n} files left out"),
        };
        let mb = self.n_bytes as f64 / 1e6;
        format!("{} files, {mb:.1} MB, {} tokens{skipped}", self.n_files, self.n_tokens())
    }

    /// Up to `max_len` tokens that followed, in the corpus, the occurrence of the context's last
    /// tokens that matches furthest back (at least [`MIN_MATCH`], within one file; among equals
    /// the first in the corpus), and that match; None where the last 3 tokens never occur or
    /// nothing follows them.
    pub fn propose_matched(&self, context: &[u32], max_len: usize) -> Option<(Vec<u32>, Match)> {
        let len = context.len();
        if max_len == 0 || len < MIN_MATCH {
            return None;
        }
        let key = [context[len - 3], context[len - 2], context[len - 1]];
        let trigram = |i: u32| [self.tokens[i as usize], self.tokens[i as usize + 1], self.tokens[i as usize + 2]];
        let from = self.by_trigram.partition_point(|&i| trigram(i) < key);
        let to = from + self.by_trigram[from..].partition_point(|&i| trigram(i) == key);
        let mut best: Option<(usize, usize)> = None;
        for &i in &self.by_trigram[from..to.min(from + MAX_SCAN)] {
            let start = i as usize;
            let back = (0..MAX_MATCH - MIN_MATCH)
                .take_while(|&j| {
                    j < start && len > MIN_MATCH + j && self.tokens[start - 1 - j] == context[len - MIN_MATCH - 1 - j]
                })
                .count();
            if best.is_none_or(|(_, m)| MIN_MATCH + back > m) {
                best = Some((start + MIN_MATCH, MIN_MATCH + back));
            }
        }
        let (next, matched) = best.filter(|&(_, m)| m >= MIN_CORPUS_MATCH)?;
        let copy: Vec<u32> = self.tokens[next..].iter().take(max_len).take_while(|&&t| t != SEP).copied().collect();
        (!copy.is_empty()).then_some((copy, Match::corpus(matched)))
    }
}

/// Every text file under `roots`, in name order: folders are walked without following links,
/// hidden entries and build or dependency folders skipped; files named directly are taken
/// whatever their extension.
pub fn text_files(roots: &[PathBuf]) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut entries: Vec<(PathBuf, std::fs::FileType)> =
            entries.flatten().filter_map(|e| Some((e.path(), e.file_type().ok()?))).collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (p, kind) in entries {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with('.') {
                continue;
            }
            if kind.is_dir() && !SKIPPED_DIRS.contains(&name.as_str()) {
                walk(&p, out);
            } else if kind.is_file()
                && p.extension().is_some_and(|x| TEXT_EXTENSIONS.iter().any(|t| x.eq_ignore_ascii_case(t)))
            {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for r in roots {
        if r.is_dir() {
            walk(r, &mut out);
        } else if r.is_file() {
            out.push(r.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(files: &[&[u32]]) -> Corpus {
        let mut tokens = Vec::new();
        for f in files {
            tokens.extend_from_slice(f);
            tokens.push(SEP);
        }
        Corpus::index(tokens, (files.len(), 0, 0), 0)
    }

    #[test]
    fn copies_what_followed_the_longest_match() {
        // "1 2 3 4 5 6" occurs twice; before the second, "9" matches the context too.
        let c = corpus(&[&[1, 2, 3, 4, 5, 6, 40, 50], &[9, 1, 2, 3, 4, 5, 6, 60, 70, 80]]);
        assert_eq!(c.propose_matched(&[5, 1, 2, 3, 4, 5, 6], 2), Some((vec![40, 50], Match::corpus(6))));
        assert_eq!(c.propose_matched(&[9, 1, 2, 3, 4, 5, 6], 8), Some((vec![60, 70, 80], Match::corpus(7))));
        // Among equal matches the first in the corpus.
        assert_eq!(c.propose_matched(&[0, 1, 2, 3, 4, 5, 6], 1), Some((vec![40], Match::corpus(6))));
        // Shorter matches are not copied from other text.
        assert_eq!(c.propose_matched(&[3, 4, 5, 6], 2), None);
        assert_eq!(c.propose_matched(&[0, 2, 3, 4, 5, 6], 2), None);
    }

    #[test]
    fn matches_and_copies_stay_within_one_file() {
        // "4 5 6" ends the first file and "7" begins the second: no match runs across.
        let c = corpus(&[&[1, 2, 3, 4, 5, 6], &[7, 8, 9, 10, 11, 12, 13]]);
        assert_eq!(c.propose_matched(&[4, 5, 6, 7, 8, 9], 3), None);
        assert_eq!(c.propose_matched(&[7, 8, 9, 10, 11, 12], 3), Some((vec![13], Match::corpus(6))));
        // Nothing follows the last tokens of a file.
        assert_eq!(c.propose_matched(&[1, 2, 3, 4, 5, 6], 3), None);
        // The match runs back no further than the file's start.
        assert_eq!(c.propose_matched(&[6, 7, 8, 9, 10, 11], 3), None);
    }

    #[test]
    fn nothing_to_propose() {
        let c = corpus(&[&[1, 2, 3, 4, 5, 6, 7, 8]]);
        assert_eq!(c.propose_matched(&[1, 2], 4), None);
        assert_eq!(c.propose_matched(&[1, 2, 3, 4, 5, 6], 0), None);
        assert_eq!(c.propose_matched(&[7, 7, 7, 7, 7, 7], 4), None);
        assert_eq!(c.n_tokens(), 8);
        let one = Corpus::from_ids(&[5, 6, 7, 8, 9, 10, 11], 0);
        assert_eq!(one.propose_matched(&[5, 6, 7, 8, 9, 10], 4), Some((vec![11], Match::corpus(6))));
    }

    #[test]
    fn folders_are_walked_without_hidden_and_build_folders() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (p, text) in [
            ("a.py", "x"),
            ("sub/b.md", "y"),
            (".git/c.txt", "z"),
            ("target/d.rs", "w"),
            ("sub/.e.py", "v"),
            ("f.bin", "u"),
        ] {
            std::fs::create_dir_all(d.join(p).parent().unwrap()).unwrap();
            std::fs::write(d.join(p), text).unwrap();
        }
        let names: Vec<String> =
            text_files(&[d.to_path_buf()]).iter().map(|p| p.strip_prefix(d).unwrap().display().to_string()).collect();
        assert_eq!(names, ["a.py", "sub/b.md"]);
        // A file named directly is taken whatever its extension.
        assert_eq!(text_files(&[d.join("f.bin")]).len(), 1);
    }
}
