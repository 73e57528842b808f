//! Saved state survives damage: a corrupted, truncated, empty or unreadable settings or history
//! file gives defaults (or the runs that still parse), is moved aside rather than deleted, and
//! produces a message for the window; writes are atomic; two instances appending history at the
//! same time lose nothing. Every test works in its own temporary directory.

use mentor_lab::app::settings::Settings;
use mentor_lab::app::storage::{self, Persist, HISTORY_FILE, SETTINGS_FILE};
use mentor_lab::app::view::RunRecord;
use std::path::Path;

fn run(i: u64) -> RunRecord {
    RunRecord {
        when: 1_700_000_000 + i,
        config: format!("mentored D={}", i % 5),
        prompt: format!("prompt {i}, with \"quotes\" and a newline\nhere"),
        seed: i,
        temperature: 0.7,
        n_tokens: 100 + i as usize,
        acceptance: 0.5,
        rounds: 12,
        e2e_s: 1.25,
        tok_s: 80.0,
        speedup: if i.is_multiple_of(2) { f64::NAN } else { 1.5 },
        target_nll: 2.0,
        mean_tv: 0.1,
        target: "qwen2.5-coder-1.5b-instruct".into(),
        draft: if i.is_multiple_of(3) { String::new() } else { "qwen2.5-coder-0.5b-instruct".into() },
    }
}

/// Runs compared through their JSON (NaN speed-ups compare equal that way).
fn same_runs(a: &[RunRecord], b: &[RunRecord]) -> bool {
    serde_json::to_string(a).unwrap() == serde_json::to_string(b).unwrap()
}

/// Files in `dir` whose name starts with `prefix`.
fn files_starting(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

#[test]
fn settings_round_trip_and_missing_file_gives_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = storage::load_settings(dir.path());
    assert!(!loaded.existed && loaded.notice.is_none());
    assert_eq!(loaded.value, Settings::default());

    let s = Settings { prompt: "saved prompt".into(), seed: 7, budget: 0.25, ..Default::default() };
    storage::save_settings(dir.path(), &s).unwrap();
    let loaded = storage::load_settings(dir.path());
    assert!(loaded.existed && loaded.notice.is_none());
    assert_eq!(loaded.value, s);
    // Only the file itself is left behind (the temporary file was renamed over it).
    assert_eq!(files_starting(dir.path(), ""), vec![SETTINGS_FILE.to_string()]);
}

#[test]
fn bad_settings_files_give_defaults_and_are_kept_aside() {
    let full = serde_json::to_vec_pretty(&Settings { prompt: "mine".into(), ..Default::default() }).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", full[..full.len() / 2].to_vec()),
        ("corrupted", b"{\"prompt\": 12, \"seed\": \"x\"".to_vec()),
        ("not utf-8", vec![0xFF, 0xFE, 0x00, 0x7B]),
        ("wrong type", b"[1, 2, 3]".to_vec()),
    ];
    for (what, bytes) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SETTINGS_FILE), &bytes).unwrap();
        let loaded = storage::load_settings(dir.path());
        assert_eq!(loaded.value, Settings::default(), "{what}");
        let notice = loaded.notice.unwrap_or_else(|| panic!("{what}: no notice"));
        assert!(notice.contains("started from defaults") && notice.contains(".bad-"), "{what}: {notice}");
        // The bad file is kept, byte for byte, under its new name; the original name is free.
        let aside = files_starting(dir.path(), "settings.json.bad-");
        assert_eq!(aside.len(), 1, "{what}: {aside:?}");
        assert_eq!(std::fs::read(dir.path().join(&aside[0])).unwrap(), bytes, "{what}");
        assert!(!dir.path().join(SETTINGS_FILE).exists(), "{what}");
    }
}

#[test]
fn an_unreadable_settings_file_gives_defaults_and_is_kept_aside() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the file should be: reading it fails on every platform.
    std::fs::create_dir(dir.path().join(SETTINGS_FILE)).unwrap();
    let loaded = storage::load_settings(dir.path());
    assert_eq!(loaded.value, Settings::default());
    assert!(loaded.notice.unwrap().contains("could not be read"));
    assert_eq!(files_starting(dir.path(), "settings.json.bad-").len(), 1);
}

#[test]
fn history_appends_and_reads_back_with_nan() {
    let dir = tempfile::tempdir().unwrap();
    let runs: Vec<RunRecord> = (0..5).map(run).collect();
    storage::append_history(dir.path(), &runs[..2]).unwrap();
    storage::append_history(dir.path(), &runs[2..]).unwrap();
    let loaded = storage::load_history(dir.path());
    assert!(loaded.existed && loaded.notice.is_none(), "{:?}", loaded.notice);
    assert!(same_runs(&loaded.value, &runs));
    assert!(loaded.value[0].speedup.is_nan() && loaded.value[1].speedup == 1.5);
    // An empty history file is simply no runs (that is what clearing the history writes).
    storage::rewrite_history(dir.path(), &[]).unwrap();
    let loaded = storage::load_history(dir.path());
    assert!(loaded.value.is_empty() && loaded.notice.is_none());
}

/// Runs saved before the table named their models load, with empty model names.
#[test]
fn history_saved_without_model_names_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let mut line = serde_json::to_value(run(1)).unwrap();
    let fields = line.as_object_mut().unwrap();
    fields.remove("target");
    fields.remove("draft");
    std::fs::write(dir.path().join(HISTORY_FILE), format!("{line}\n")).unwrap();
    let loaded = storage::load_history(dir.path());
    assert!(loaded.notice.is_none(), "{:?}", loaded.notice);
    assert_eq!(loaded.value.len(), 1);
    assert_eq!((loaded.value[0].target.as_str(), loaded.value[0].draft.as_str()), ("", ""));
    assert_eq!(loaded.value[0].config, run(1).config);
}

#[test]
fn damaged_history_keeps_the_runs_that_parse() {
    let dir = tempfile::tempdir().unwrap();
    let runs: Vec<RunRecord> = (0..4).map(run).collect();
    storage::append_history(dir.path(), &runs).unwrap();
    let path = dir.path().join(HISTORY_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    // A line cut short by a crash at the end, and garbage in the middle.
    let cut = bytes.len() - 30;
    bytes.truncate(cut);
    let second_line = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    bytes.splice(second_line..second_line, b"}{ not json\n".iter().copied());
    std::fs::write(&path, &bytes).unwrap();

    let loaded = storage::load_history(dir.path());
    assert!(same_runs(&loaded.value, &runs[..3]), "{} runs", loaded.value.len());
    let notice = loaded.notice.unwrap();
    assert!(notice.contains("2 of its lines do not parse") && notice.contains("3 runs"), "{notice}");
    // The damaged file is kept as it was; the clean file now holds the three good runs.
    let aside = files_starting(dir.path(), "history.jsonl.bad-");
    assert_eq!(aside.len(), 1);
    assert_eq!(std::fs::read(dir.path().join(&aside[0])).unwrap(), bytes);
    let again = storage::load_history(dir.path());
    assert!(again.notice.is_none() && same_runs(&again.value, &runs[..3]));
}

#[test]
fn history_with_nothing_usable_gives_an_empty_list_and_is_kept_aside() {
    for bytes in [&b"\x00\x01\x02garbage"[..], b"{\"when\": 1}\n", b"[]\n"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(HISTORY_FILE), bytes).unwrap();
        let loaded = storage::load_history(dir.path());
        assert!(loaded.value.is_empty());
        assert!(loaded.notice.unwrap().contains("started from defaults"));
        let aside = files_starting(dir.path(), "history.jsonl.bad-");
        assert_eq!(std::fs::read(dir.path().join(&aside[0])).unwrap(), bytes);
    }
}

#[test]
fn atomic_write_replaces_whole_files_and_leaves_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    storage::write_atomic(dir.path(), "f.json", b"first version, rather long").unwrap();
    storage::write_atomic(dir.path(), "f.json", b"second").unwrap();
    assert_eq!(std::fs::read(dir.path().join("f.json")).unwrap(), b"second");
    assert_eq!(files_starting(dir.path(), ""), vec!["f.json".to_string()]);
}

/// Saving into a folder that cannot be written is an error that says what to do, and the old
/// file is untouched. The folder is a path whose parent is a plain file, which no user (root
/// included) can create files under.
#[test]
fn a_folder_that_cannot_be_written_is_an_error_that_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"not a folder").unwrap();
    let ro = blocker.join("state");
    let e = storage::save_settings(&ro, &Settings::default()).unwrap_err().to_string();
    assert!(e.contains("could not save the settings") && e.contains("writable"), "{e}");
    let e = storage::append_history(&ro, &[run(1)]).unwrap_err().to_string();
    assert!(e.contains("run history"), "{e}");
    assert_eq!(std::fs::read(&blocker).unwrap(), b"not a folder");
}

#[test]
fn two_instances_appending_at_once_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let n_per_writer = 200;
    // Each writer stands for an app instance: its own Persist, its own growing history.
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let mut persist = Persist::open(&dir, || None, || None).persist;
                let settings = Settings::default();
                let mut history = Vec::new();
                for i in 0..n_per_writer {
                    history.push(run(w * 10_000 + i));
                    persist.save(&settings, &history).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let loaded = storage::load_history(dir.path());
    assert!(loaded.notice.is_none(), "{:?}", loaded.notice);
    let mut seeds: Vec<u64> = loaded.value.iter().map(|r| r.seed).collect();
    seeds.sort();
    let mut want: Vec<u64> = (0..2).flat_map(|w| (0..n_per_writer).map(move |i| w * 10_000 + i)).collect();
    want.sort();
    assert_eq!(seeds, want);
}

#[test]
fn persist_migrates_old_state_then_appends_and_rewrites_after_a_clear() {
    let dir = tempfile::tempdir().unwrap();
    let old_settings = Settings { prompt: "from eframe".into(), ..Default::default() };
    let old_history: Vec<RunRecord> = (0..3).map(run).collect();
    // No files yet: the values an earlier version saved through eframe are taken and written.
    let r = Persist::open(dir.path(), || Some(old_settings.clone()), || Some(old_history.clone()));
    assert!(r.notices.is_empty(), "{:?}", r.notices);
    assert_eq!(r.settings, old_settings);
    assert!(same_runs(&r.history, &old_history));
    assert_eq!(storage::load_settings(dir.path()).value, old_settings);
    assert!(same_runs(&storage::load_history(dir.path()).value, &old_history));

    // Next start: our files win; eframe's values are not even asked for.
    let r = Persist::open(dir.path(), || panic!("settings exist"), || panic!("history exists"));
    let (mut persist, settings, mut history) = (r.persist, r.settings, r.history);
    history.push(run(10));
    persist.save(&settings, &history).unwrap();
    assert_eq!(storage::load_history(dir.path()).value.len(), 4);

    // Cleared, then one new run: the file holds just that run.
    history.clear();
    history.push(run(11));
    persist.save(&settings, &history).unwrap();
    assert!(same_runs(&storage::load_history(dir.path()).value, &[run(11)]));
}

#[test]
fn persist_open_reports_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(SETTINGS_FILE), b"{ truncated").unwrap();
    std::fs::write(dir.path().join(HISTORY_FILE), b"").unwrap();
    let r = Persist::open(dir.path(), || panic!("a bad file is not a missing one"), || None);
    assert_eq!(r.settings, Settings::default());
    assert_eq!(r.notices.len(), 1, "{:?}", r.notices);
    assert!(r.notices[0].contains("settings.json") && r.notices[0].contains(".bad-"));
}

/// Settings files that parse but hold values the controls never allow (found by
/// `fuzz_saved_state`; the inputs are in tests/data/fuzz/): each value is brought into range, the
/// window says which, and the requests the app would send validate.
#[test]
fn out_of_range_settings_are_brought_into_range_and_named() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz");
    for (file, fields) in [
        ("settings-top-p-zero-sweep-seeds-zero.json", vec!["top-p", "sweep seeds"]),
        ("settings-zoom-u64-max.json", vec!["zoom"]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(data.join(file), dir.path().join(SETTINGS_FILE)).unwrap();
        let loaded = storage::load_settings(dir.path());
        let notice = loaded.notice.unwrap_or_default();
        for f in &fields {
            assert!(notice.contains(f), "{file}: {notice}");
        }
        let s = loaded.value;
        assert!(s.target_request().validate().is_ok() && s.mentored_request().validate().is_ok(), "{file}: {s:?}");
        assert!((0.5..=3.0).contains(&s.zoom) && s.sweep_seeds >= 1 && s.top_p >= 0.05, "{file}: {s:?}");
        assert!(files_starting(dir.path(), "settings.json.bad").is_empty(), "a file that parses is not moved aside");
    }
    // Non-finite values cannot be written in JSON, but a NaN in memory (an older version's
    // eframe storage) takes the default.
    let mut s = Settings { temperature: f32::NAN, budget: f64::INFINITY, max_tokens: 0, ..Settings::default() };
    let changed = s.sanitize();
    assert_eq!(changed, vec!["temperature", "budget", "max tokens"]);
    assert_eq!(
        (s.temperature, s.budget, s.max_tokens),
        (Settings::default().temperature, Settings::default().budget, 1)
    );
    assert!(Settings::default().clone().sanitize().is_empty(), "the defaults are in range");
}

/// A budget outside its rule's range is brought into it, and the window's notice says which
/// parameter, its range and where to change it; files that name only the first two rules (or none)
/// still load as they were.
#[test]
fn a_budget_out_of_its_rules_range_is_clamped_and_explained() {
    use mentor_lab::MentorRule;
    for (json, rule, budget, needles) in [
        (r#"{"rule": "cascade", "budget": -3.0}"#, MentorRule::Cascade, -1.0, vec!["cascade α", "between -1 and 1"]),
        (r#"{"rule": "lenience", "budget": 0.0}"#, MentorRule::Lenience, 0.01, vec!["lenience l", "0.01"]),
        (r#"{"rule": "kl", "budget": 5.0}"#, MentorRule::Kl, 2.0, vec!["KL budget (nats)", "Mentor panel"]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SETTINGS_FILE), json).unwrap();
        let loaded = storage::load_settings(dir.path());
        let notice = loaded.notice.unwrap_or_default();
        assert_eq!((loaded.value.rule, loaded.value.budget), (rule, budget), "{json}");
        for needle in needles {
            assert!(notice.contains(needle), "{json}: {notice}");
        }
        assert!(loaded.value.mentored_request().validate().is_ok(), "{json}");
    }
    for (json, rule) in [(r#"{"rule": "kl", "budget": 0.3}"#, MentorRule::Kl), (r#"{"budget": 0.3}"#, MentorRule::Tv)] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SETTINGS_FILE), json).unwrap();
        let loaded = storage::load_settings(dir.path());
        assert!(loaded.notice.is_none(), "{json}: {:?}", loaded.notice);
        assert_eq!((loaded.value.rule, loaded.value.budget), (rule, 0.3));
    }
}
