//! `mentor-lab bench` with `,other`: configurations that name it draft with the file of
//! `--other-draft`, the others with the loaded draft, in one process.

mod common;

use std::process::Command;

/// The default target as its own other draft (in its file's weights) proposes what the target
/// samples under the same-seed coupling, so nearly every drafted token is accepted; the loaded
/// draft, a smaller model, has many refused. Both keep the target's text at D = 0.
#[test]
fn other_configurations_draft_with_the_other_file() {
    let Some(draft) = common::draft_path() else { return };
    let target = common::target_path();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_mentor-lab"))
        .args(["bench", "--threads", "1", "--prompt", "code", "--tokens", "24", "--seeds", "2", "--repeats", "1"])
        .args(["--draft-weights", "file", "--target"])
        .arg(&target)
        .arg("--draft")
        .arg(&draft)
        .arg("--other-draft")
        .arg(&target)
        .args(["--config", "target", "fixed=3,tv=0", "fixed=3,tv=0,other", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let of = |config: &str| -> Vec<&serde_json::Value> { runs.iter().filter(|r| r["config"] == config).collect() };
    let (target_runs, loaded, other) = (of("target"), of("fixed=3,tv=0"), of("fixed=3,tv=0,other"));
    assert!(loaded.len() >= 2 && other.len() >= 2, "{runs:?}");
    for r in &other {
        assert!(r["acceptance_rate"].as_f64().unwrap() > 0.9, "the target drafting for itself: {r}");
    }
    for r in &loaded {
        assert!(r["acceptance_rate"].as_f64().unwrap() < 0.9, "the loaded draft: {r}");
    }
    for r in loaded.iter().chain(&other) {
        let same_seed_target = target_runs.iter().find(|t| t["seed"] == r["seed"]).unwrap();
        assert_eq!(r["mean_target_nll"], same_seed_target["mean_target_nll"], "D = 0 keeps the target's text");
    }
}
