//! `mentor-lab cost`: decode and prefill speed of the target, what it takes in memory, and the
//! cost of one forward over k new tokens relative to one single-token step — the ratio that
//! decides whether verification is cheap enough for speculation to pay.

use super::bench::median;
use super::ModelArgs;
use anyhow::{bail, Result};
use clap::Args;
use mentor_lab::generate::LoadedModel;
use mentor_lab::presets::preset;

#[derive(Args)]
pub struct CostArgs {
    #[command(flatten)]
    models: ModelArgs,
    /// Timed repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 15)]
    repeats: usize,
    /// Numbers of new tokens to time, comma-separated (k = 1, the reference, is always timed).
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4, 8, 9, 16])]
    k: Vec<usize>,
}

/// The process's peak resident memory in bytes, where the system says (Linux).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

pub fn cost(args: CostArgs) -> Result<()> {
    let mut engine = super::load_engine(&args.models, false)?;
    let m = &mut engine.target;
    let ctx: Vec<u32> = m.tokenizer.encode(&preset("creative").map(|p| p.prompt).unwrap_or("Hello").repeat(2))?;
    let ctx = &ctx[..ctx.len().min(128)];
    let mut ks = vec![1usize];
    ks.extend(args.k.iter().copied().filter(|&k| k > 1));
    if let Some(&k) = ks.iter().find(|&&k| k > ctx.len()) {
        bail!("--k {k}: at most {} new tokens (the timing context's length)", ctx.len());
    }
    // Prefill: the whole context in one forward.
    let prefill = median_time(args.repeats, &mut || {
        m.model.clear()?;
        m.model.feed(ctx)?;
        Ok(())
    })?;
    let kernels = m.model.kernel_isa().map(|isa| format!(", {isa} kernels")).unwrap_or_default();
    println!(
        "target {} ({}{kernels}), {} threads: prefill {} tokens {:.1} ms → {:.0} tok/s",
        m.info.name,
        m.model.weight_desc,
        candle_core::utils::get_num_threads(),
        ctx.len(),
        1e3 * prefill,
        ctx.len() as f64 / prefill
    );
    print_memory(m);
    println!("| k new tokens | forward ms (median) | relative to k = 1 (median of paired ratios) |");
    println!("|---|---|---|");
    let times = time_forwards(m, ctx, &ks, args.repeats)?;
    for (i, &k) in ks.iter().enumerate() {
        let ratios = times[i].iter().zip(&times[0]).map(|(t, b)| t / b).collect();
        println!("| {k} | {:.2} | {:.2}x |", 1e3 * median(times[i].clone()), median(ratios));
    }
    let step = median(times[0].clone());
    println!("decode (k = 1): {:.1} tok/s", 1.0 / step);
    print_coupling_cost(m, args.repeats, step)
}

/// The median of `repeats` timings of `f`.
fn median_time(repeats: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let mut ts = Vec::new();
    for _ in 0..repeats {
        let t = std::time::Instant::now();
        f()?;
        ts.push(t.elapsed().as_secs_f64());
    }
    Ok(median(ts))
}

fn print_memory(m: &LoadedModel) {
    let (weights, kv) = m.model.memory();
    let mb = |b: f64| b / 1e6;
    let tiles = match m.model.tile_memory() {
        0 => String::new(),
        t => {
            format!(
                " (of which {:.0} MB tile layouts beside the row layout; `--kernel notiles` holds none)",
                mb(t as f64)
            )
        }
    };
    println!(
        "memory: weights {:.0} MB ({:.2}x the {:.0} MB file){tiles}, KV cache {:.0} MB per 1,000 tokens of context{}",
        mb(weights as f64),
        weights as f64 / m.info.file_size.max(1) as f64,
        mb(m.info.file_size as f64),
        mb(1000.0 * kv as f64),
        peak_rss().map(|b| format!(", peak resident {:.0} MB so far", mb(b as f64))).unwrap_or_default()
    );
}

/// Seconds of a forward over k new tokens after `ctx`, per entry of `ks`, one list of `repeats`
/// timings each. Every repeat times each k once, back to back, so that the ratio to k = 1 is
/// taken within the repeat: a machine whose speed drifts (docs/performance.md, Machines) then moves
/// both sides of each ratio together.
fn time_forwards(m: &mut LoadedModel, ctx: &[u32], ks: &[usize], repeats: usize) -> Result<Vec<Vec<f64>>> {
    m.model.clear()?;
    m.model.feed(ctx)?;
    let mut times = vec![Vec::new(); ks.len()];
    for _ in 0..repeats {
        for (i, &k) in ks.iter().enumerate() {
            let new: Vec<u32> = ctx[..k].to_vec();
            m.model.truncate(ctx.len());
            let t = std::time::Instant::now();
            m.model.forward(&new)?;
            times[i].push(t.elapsed().as_secs_f64());
        }
    }
    Ok(times)
}

/// The same-seed coupling's per-position work: the noise over the whole vocabulary (once per
/// position) and one race over a distribution (per distribution drawn at that position).
fn print_coupling_cost(m: &LoadedModel, repeats: usize, step_s: f64) -> Result<()> {
    let n_vocab = m.tokenizer.vocab_size().min(m.model.config.n_vocab);
    let dist = vec![1.0 / n_vocab as f32; n_vocab];
    let mut w = Vec::new();
    let mut pos = 0u64;
    let noise = median_time(repeats, &mut || {
        pos += 1;
        mentor_lab::sampling::race_weights(7, pos, n_vocab, &mut w);
        Ok(())
    })?;
    let race = median_time(repeats, &mut || {
        std::hint::black_box(mentor_lab::sampling::race_argmax(&dist, &w));
        Ok(())
    })?;
    println!(
        "same-seed coupling over {n_vocab} tokens: noise {:.1} µs per position ({:.2}% of a step), race {:.1} µs per distribution",
        1e6 * noise,
        100.0 * noise / step_s,
        1e6 * race
    );
    Ok(())
}
