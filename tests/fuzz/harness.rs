//! The harness: runs a target's executions under the allocation guard's allowance and a hang
//! watchdog, saves crashing inputs, and counts outcomes.

use super::*;

/// A panic's message, for the failure report.
pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// Where a crashing input is written, so that it can be minimised and checked in.
fn crash_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-crashes")
}

/// An execution still running after this long is a hang: the watchdog saves its input and ends
/// the process with the target and iteration (a hung thread cannot be stopped any other way).
/// Executions take milliseconds; the bound is far above any machine's load.
const HANG_S: u64 = 120;

/// What the watchdog knows of the execution in flight: its iteration, when it began and its input.
type InFlight = std::sync::Mutex<Option<(u64, std::time::Instant, Vec<u8>)>>;

/// Watches `in_flight` until `done`; aborts the process when one execution outlives [`HANG_S`].
fn watchdog(name: &str, seed: u64, in_flight: &InFlight, done: &std::sync::atomic::AtomicBool) {
    use std::sync::atomic::Ordering;
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let guard = in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((i, began, input)) = guard.as_ref().filter(|f| f.1.elapsed().as_secs() >= HANG_S) {
            let _ = std::fs::create_dir_all(crash_dir());
            let file = crash_dir().join(format!("{name}-seed{seed}-iter{i}-hang.bin"));
            let _ = std::fs::write(&file, input);
            eprintln!(
                "fuzz {name}: iteration {i} still running after {} s (a hang); input saved to {}",
                began.elapsed().as_secs(),
                file.display()
            );
            std::process::abort();
        }
    }
}

struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs `exec` on `n` inputs made by `make` (which mutates from a seeded generator) and returns
/// how many ended `Ok` and how many in a typed error; panics with every crashing input's file.
/// Each execution runs under the allocation guard's [`allowance`] for its input and the hang
/// watchdog.
pub(super) fn run_target<E: std::fmt::Display>(
    target: u32,
    name: &str,
    seed: u64,
    n: u64,
    mut make: impl FnMut(&mut Rng) -> Vec<u8>,
    mut exec: impl FnMut(&[u8]) -> Result<(), E>,
) -> (u64, u64) {
    let mut rng = Rng(seed);
    let (mut n_ok, mut n_err, mut peak) = (0, 0, 0);
    let mut crashes = Vec::new();
    // `MENTOR_LAB_FUZZ_DUMP=i` saves input i before running it: how an input that aborted the
    // process (an allocation the guard refused) is recovered.
    let dump = std::env::var("MENTOR_LAB_FUZZ_DUMP").ok().and_then(|v| v.parse::<u64>().ok());
    let (in_flight, done) = (InFlight::new(None), std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|scope| {
        scope.spawn(|| watchdog(name, seed, &in_flight, &done));
        // Ends the watchdog however the loop ends (an assertion in it unwinds through the scope).
        let _stop = StopOnDrop(&done);
        for i in 0..n {
            RUNNING.with(|r| r.set((target, i)));
            let input = make(&mut rng);
            if dump == Some(i) {
                let _ = std::fs::create_dir_all(crash_dir());
                let file = crash_dir().join(format!("{name}-seed{seed}-iter{i}.bin"));
                let _ = std::fs::write(&file, &input);
                eprintln!("fuzz {name}: input {i} saved to {}", file.display());
            }
            *in_flight.lock().unwrap_or_else(|e| e.into_inner()) = Some((i, std::time::Instant::now(), input.clone()));
            PEAK.with(|p| p.set(0));
            LIMIT.with(|l| l.set(allowance(input.len())));
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| exec(&input)));
            LIMIT.with(|l| l.set(MAX_ONE_ALLOCATION));
            peak = peak.max(PEAK.with(|p| p.get()));
            match outcome {
                Ok(Ok(())) => n_ok += 1,
                Ok(Err(e)) => {
                    n_err += 1;
                    assert!(!e.to_string().is_empty());
                }
                Err(p) => {
                    let _ = std::fs::create_dir_all(crash_dir());
                    let file = crash_dir().join(format!("{name}-seed{seed}-iter{i}.bin"));
                    let _ = std::fs::write(&file, &input);
                    crashes.push(format!(
                        "iteration {i}: {} ({} bytes, saved to {})",
                        panic_text(&*p),
                        input.len(),
                        file.display()
                    ));
                }
            }
        }
    });
    eprintln!(
        "fuzz {name}: {n} executions, {n_ok} Ok, {n_err} typed errors, {} crashes; largest allocation {} KiB",
        crashes.len(),
        peak >> 10
    );
    assert!(crashes.is_empty(), "{name}: {} crashing inputs:\n{}", crashes.len(), crashes.join("\n"));
    (n_ok, n_err)
}

/// Iterations: the short run's count, or `MENTOR_LAB_FUZZ_ITERS` for the long run.
pub(super) fn iters(short: u64, long: bool) -> u64 {
    match long {
        true => std::env::var("MENTOR_LAB_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000),
        false => short,
    }
}
