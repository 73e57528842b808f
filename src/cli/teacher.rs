//! `teacher-data`: the target's next-token distributions over answers (its top K
//! log-probabilities at every answer position), given or sampled from the draft, the compact data a
//! small draft is distilled from on a machine that cannot hold the target (`train/qwen_teacher.py`).

use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use mentor_lab::generate::{generate_single, GenerateRequest, Mode};
use std::io::{BufRead, Seek, Write};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

#[derive(Args)]
pub struct TeacherArgs {
    #[command(flatten)]
    models: ModelArgs,
    /// JSON lines, one `{"prompt": …, "answer": …}` per line: the prompt goes through the chat
    /// template, the answer follows it as the assistant's text (with `--answers draft` the answer
    /// may be left out).
    #[arg(long)]
    input: PathBuf,
    /// Where the answers come from: `given` (each line's) or `draft` (the loaded draft samples one
    /// per prompt at T = 0.7, seed `--seed` + the line's index, up to `--answer-tokens`): text
    /// close to what the target writes, made at the draft's speed.
    #[arg(long, value_enum, default_value_t = Answers::Given)]
    answers: Answers,
    /// Most tokens of a sampled answer.
    #[arg(long, default_value_t = 384)]
    answer_tokens: usize,
    /// The first line's seed for sampled answers.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The file to write (replaced whole once done; see `train/qwen_teacher.py` for the layout).
    #[arg(long)]
    out: PathBuf,
    /// Log-probabilities kept per position.
    #[arg(long, default_value_t = 16)]
    top: usize,
    /// Most tokens of one record (prompt and answer); longer answers are cut.
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Answers {
    Given,
    Draft,
}

/// Rows of logits computed per forward (64 rows of a 151,936-token vocabulary: 39 MB).
const ROWS_PER_FORWARD: usize = 64;

pub fn teacher_data(args: TeacherArgs) -> Result<()> {
    if args.top == 0 || args.top > 256 {
        bail!("--top must be 1 to 256");
    }
    let mut engine = super::load_engine(&args.models, args.answers == Answers::Draft)?;
    let input = std::fs::File::open(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let tmp = args.out.with_extension(format!("{}.part", std::process::id()));
    let written = write_file(&args, &mut engine, input, &tmp);
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let (n_records, n_positions) = written?;
    std::fs::rename(&tmp, &args.out)?;
    println!("{}: {n_records} records, {n_positions} answer positions", args.out.display());
    Ok(())
}

/// Write the file to `tmp`, synced: the records of `input` and their distributions. Returns the
/// number of records and of answer positions.
fn write_file(
    args: &TeacherArgs,
    engine: &mut mentor_lab::engine::Engine,
    input: std::fs::File,
    tmp: &std::path::Path,
) -> Result<(u32, usize)> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(tmp)?);
    // The record count is written once known (the header's last field).
    out.write_all(b"MLTD")?;
    for v in [1u32, args.top as u32, 0] {
        out.write_all(&v.to_le_bytes())?;
    }
    let (mut n_records, mut n_positions) = (0u32, 0usize);
    for (n, line) in std::io::BufReader::new(input).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("line {}", n + 1))?;
        let (ids, n_prompt) = record_ids(args, engine, &v, n)?;
        if ids.len() <= n_prompt {
            continue;
        }
        for v in [ids.len() as u32, n_prompt as u32].iter().chain(&ids) {
            out.write_all(&v.to_le_bytes())?;
        }
        n_positions += write_distributions(&mut engine.target.model, &ids, n_prompt, args.top, &mut out)?;
        n_records += 1;
    }
    let mut file = out.into_inner().map_err(|e| e.into_error())?;
    file.seek(std::io::SeekFrom::Start(12))?;
    file.write_all(&n_records.to_le_bytes())?;
    file.sync_all()?;
    Ok((n_records, n_positions))
}

/// A record's tokens: its prompt through the chat template, then its answer (the line's, or one
/// the draft samples), cut to `--max-tokens`, and the prompt's length.
fn record_ids(
    args: &TeacherArgs,
    engine: &mut mentor_lab::engine::Engine,
    v: &serde_json::Value,
    n: usize,
) -> Result<(Vec<u32>, usize)> {
    let (Some(prompt), answer) = (v["prompt"].as_str(), v["answer"].as_str()) else {
        bail!("line {}: expected {{\"prompt\": …, \"answer\": …}}", n + 1);
    };
    let mut ids = engine.target.tokenizer.prompt_ids(prompt, false)?;
    let n_prompt = ids.len();
    match (args.answers, answer) {
        (Answers::Given, Some(answer)) => ids.extend(engine.target.tokenizer.encode(answer)?),
        (Answers::Given, None) => bail!("line {}: no \"answer\" (or pass --answers draft)", n + 1),
        (Answers::Draft, _) => {
            let draft = engine.draft.as_mut().context("--answers draft needs a draft model")?;
            let req = GenerateRequest {
                prompt: prompt.to_string(),
                seed: args.seed + n as u64,
                max_tokens: args.answer_tokens,
                mode: Mode::Draft,
                ..GenerateRequest::default()
            };
            let generation = generate_single(draft, None, &req, &AtomicBool::new(false), &mut |_| {})?;
            ids.extend(generation.tokens.iter().map(|t| t.id));
        }
    }
    ids.truncate(args.max_tokens);
    Ok((ids, n_prompt))
}

/// Write the target's top `k` log-probabilities at every position that predicts an answer token
/// (`ids[n_prompt..]`), after a fresh cache: per position the ids, then the log-probabilities.
/// Returns the number of positions.
fn write_distributions(
    model: &mut mentor_lab::model::Transformer,
    ids: &[u32],
    n_prompt: usize,
    k: usize,
    out: &mut impl Write,
) -> Result<usize> {
    model.clear()?;
    if n_prompt > 1 {
        model.feed(&ids[..n_prompt - 1])?;
    }
    let n_vocab = model.config.n_vocab;
    let mut n = 0;
    for piece in ids[n_prompt - 1..ids.len() - 1].chunks(ROWS_PER_FORWARD) {
        // One buffer for the piece's logits: rows of their own, freed among the small buffers
        // kept between them, would leave the heap too fragmented to reuse.
        let logits = model.forward(piece)?.flatten_all()?.to_vec1::<f32>()?;
        for row in logits.chunks_exact(n_vocab) {
            let (top_ids, logp) = top_log_probs(row, k);
            top_ids.iter().try_for_each(|t| out.write_all(&t.to_le_bytes()))?;
            logp.iter().try_for_each(|p| out.write_all(&p.to_le_bytes()))?;
            n += 1;
        }
    }
    Ok(n)
}

/// The `k` largest log-softmax values of `logits` and their ids, largest first.
fn top_log_probs(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(idx.len());
    idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    let logp = idx.iter().map(|&i| logits[i as usize] - lse).collect();
    (idx, logp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_log_probs_are_the_largest_normalized() {
        let logits = [0.0f32, 3.0, 1.0, 2.0, -1.0];
        let (ids, logp) = top_log_probs(&logits, 3);
        assert_eq!(ids, vec![1, 3, 2]);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        for (i, lp) in ids.iter().zip(&logp) {
            assert!((lp - (logits[*i as usize].exp() / z).ln()).abs() < 1e-5);
        }
    }
}
