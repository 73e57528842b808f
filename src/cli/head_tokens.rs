//! `head-tokens`: the list of tokens a draft's output head is restricted to, counted from a
//! corpus of the user's text with the draft's tokenizer.

use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use mentor_lab::head_tokens;
use std::path::PathBuf;

#[derive(Args)]
pub struct HeadTokensArgs {
    #[command(flatten)]
    models: ModelArgs,
    /// Folders or files of text to count (source code and prose in the languages you will run).
    #[arg(long, required = true, num_args = 1..)]
    corpus: Vec<PathBuf>,
    /// How many of the most frequent tokens to keep (the chat's control tokens are always kept).
    #[arg(long, default_value_t = 32768)]
    n: usize,
    /// Folders or files whose every token is kept as well, beside the N most frequent of the
    /// corpus: text the target itself wrote, say, so that the words of its answers stay
    /// proposable however rare they are in the corpus.
    #[arg(long, num_args = 1..)]
    keep_all: Vec<PathBuf>,
    /// Where to write the list (default: beside the draft, `<draft>.head-tokens`, where loading
    /// the draft finds it).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn head_tokens(args: HeadTokensArgs) -> Result<()> {
    let draft = match (&args.models.draft, args.models.pair) {
        (Some(d), _) => d.clone(),
        (None, Some(pair)) => super::fetch_pair(pair)?.draft.context("the pair has no draft file")?,
        (None, None) => bail!("name the draft: --draft PATH or --pair qwen-coder"),
    };
    let file = mentor_lab::gguf::ModelFile::open(&draft)?;
    let tokenizer = mentor_lab::tokenizer::TextTokenizer::from_model_file(&file)?;
    let files = mentor_lab::corpus::text_files(&args.corpus);
    eprintln!("counting the tokens of {} files…", files.len());
    let counts = head_tokens::count_tokens(&tokenizer, &files)?;
    let mut always: Vec<u32> = tokenizer.inner.get_added_tokens_decoder().keys().copied().collect();
    if !args.keep_all.is_empty() {
        let kept = head_tokens::count_tokens(&tokenizer, &mentor_lab::corpus::text_files(&args.keep_all))?;
        always.extend((0..kept.len() as u32).filter(|&i| kept[i as usize] > 0));
        eprintln!("keeping every one of {} distinct tokens of --keep-all", kept.iter().filter(|&&c| c > 0).count());
    }
    let ids = head_tokens::choose(&counts, args.n, &always)?;
    let total: u64 = counts.iter().sum();
    let covered: u64 = ids.iter().map(|&i| counts[i as usize]).sum();
    let out = args.out.unwrap_or_else(|| draft.with_file_name(format!("{}.head-tokens", file_name(&draft))));
    head_tokens::write_list(&out, &ids)?;
    println!(
        "{}: {} tokens ({} distinct in the corpus), covering {:.3}% of its {} tokens",
        out.display(),
        ids.len(),
        counts.iter().filter(|&&c| c > 0).count(),
        100.0 * covered as f64 / total.max(1) as f64,
        total
    );
    Ok(())
}

fn file_name(p: &std::path::Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
