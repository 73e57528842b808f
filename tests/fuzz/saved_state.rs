//! Fuzzing the app's saved state: settings and run history as the app reads them at start.

use super::*;

/// Numbers a saved-state file may hold in place of a real one.
const JSON_NUMBERS: [&str; 14] = [
    "0",
    "-1",
    "-0",
    "1e308",
    "-1e308",
    "1e999",
    "18446744073709551615",
    "18446744073709551616",
    "4294967296",
    "0.000001",
    "null",
    "\"x\"",
    "[]",
    "{}",
];

/// Where the numbers are in a JSON text: runs of number characters after `:`, `,` or `[`.
fn number_spans(text: &[u8]) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let starts = (text[i] == b'-' || text[i].is_ascii_digit())
            && text[..i].iter().rev().find(|c| !c.is_ascii_whitespace()).is_some_and(|c| b":,[".contains(c));
        if starts {
            let end = (i..text.len()).find(|&j| !b"-+.eE0123456789".contains(&text[j])).unwrap_or(text.len());
            spans.push(i..end);
            i = end;
        } else {
            i += 1;
        }
    }
    spans
}

/// The app's saved state, read as at start: a real `settings.json` and a `history.jsonl` of real
/// runs, mutated at the byte level and at the JSON level (numbers set to extremes or other
/// types). Every load must give settings whose requests validate, move a bad file aside byte for
/// byte, and never panic; an outcome is an error when the load had something to say.
pub(super) fn fuzz_saved_state(seed: u64, n: u64) -> (u64, u64) {
    use mentor_lab::app::storage::{load_history, load_settings, HISTORY_FILE, SETTINGS_FILE};
    let (settings, history) = saved_state_seeds();
    let dir = tempfile::tempdir().unwrap();
    run_target(
        5,
        "saved-state",
        seed,
        n,
        |rng| {
            let which = rng.below(2) as u8;
            let mut text = if which == 0 { settings.clone() } else { history.clone() };
            for _ in 0..1 + rng.below(3) {
                let spans = number_spans(&text);
                if rng.below(2) == 0 && !spans.is_empty() {
                    let span = spans[rng.below(spans.len())].clone();
                    text.splice(span, JSON_NUMBERS[rng.below(JSON_NUMBERS.len())].bytes());
                } else {
                    mutate(rng, &mut text, &[]);
                }
            }
            let mut input = vec![which];
            input.extend(text);
            input
        },
        |input| {
            let (&which, bytes) = input.split_first().unwrap_or((&0, &[]));
            for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
                std::fs::remove_file(e.path()).unwrap();
            }
            let name = if which == 0 { SETTINGS_FILE } else { HISTORY_FILE };
            std::fs::write(dir.path().join(name), bytes).unwrap();
            let notice = if which == 0 {
                let loaded = load_settings(dir.path());
                let s = &loaded.value;
                assert!(s.target_request().validate().is_ok(), "{s:?}");
                assert!(s.mentored_request().validate().is_ok(), "{s:?}");
                assert!((0.5..=3.0).contains(&s.zoom), "{s:?}");
                loaded.notice
            } else {
                let loaded = load_history(dir.path());
                let lines = bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
                assert!(loaded.value.len() <= lines);
                loaded.notice
            };
            // A file that was moved aside is kept byte for byte.
            let aside: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(".bad-"))
                .collect();
            for e in &aside {
                assert_eq!(std::fs::read(e.path()).unwrap(), bytes, "the file moved aside is the original");
            }
            match notice {
                None => Ok(()),
                Some(n) => Err(n),
            }
        },
    )
}

/// The saved state the fuzzer mutates: the default settings and a history of four runs, as the
/// app writes them.
fn saved_state_seeds() -> (Vec<u8>, Vec<u8>) {
    use mentor_lab::app::settings::Settings;
    use mentor_lab::app::view::RunRecord;
    let settings = serde_json::to_vec_pretty(&Settings::default()).unwrap();
    let run = |i: u64| RunRecord {
        when: 1_790_000_000 + i,
        config: "TV=0.50, k=8".into(),
        prompt: "Write a short poem about the sea.".into(),
        seed: i,
        temperature: 0.7,
        n_tokens: 128,
        acceptance: 0.72,
        rounds: 30,
        e2e_s: 1.2,
        tok_s: 106.0,
        speedup: 2.1,
        target_nll: 1.9,
        mean_tv: 0.41,
        target: "SmolLM2-135M-Instruct".into(),
        draft: "smollm2-135m-draft-d192-l8".into(),
    };
    let mut history = Vec::new();
    for i in 0..4 {
        history.extend(serde_json::to_vec(&run(i)).unwrap());
        history.push(b'\n');
    }
    (settings, history)
}
