//! The bundle script's Linux mode lays out `Mentor Lab.app` as on macOS; lint the result. The stub
//! SDK for linking the macOS executable on Linux.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

#[test]
fn bundle_layout_is_a_valid_app() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = tempfile::tempdir().unwrap();
    let status = Command::new("bash")
        .arg(format!("{root}/bundle/make_bundle.sh"))
        .args(["--linux", "--binary", env!("CARGO_BIN_EXE_mentor-lab"), "--out"])
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success());
    let app = out.path().join("Mentor Lab.app/Contents");
    // Parse the plist with Python's plistlib (the same parser family macOS tools accept).
    let script = r#"
import plistlib, sys, json
d = plistlib.load(open(sys.argv[1], "rb"))
print(json.dumps(d))
"#;
    let parsed = Command::new("python3").args(["-c", script]).arg(app.join("Info.plist")).output().unwrap();
    assert!(parsed.status.success(), "Info.plist does not parse: {}", String::from_utf8_lossy(&parsed.stderr));
    let plist: serde_json::Value = serde_json::from_slice(&parsed.stdout).unwrap();
    let s = |k: &str| plist[k].as_str().unwrap_or_else(|| panic!("Info.plist lacks {k}")).to_string();
    assert_eq!(s("CFBundleDisplayName"), "Mentor Lab");
    assert_eq!(s("CFBundleName"), "Mentor Lab");
    assert_eq!(s("CFBundleIdentifier"), "org.mentorlab.MentorLab");
    assert_eq!(s("CFBundlePackageType"), "APPL");
    assert_eq!(s("CFBundleShortVersionString"), env!("CARGO_PKG_VERSION"));
    assert_eq!(s("CFBundleVersion"), env!("CARGO_PKG_VERSION"));
    assert!(!s("LSMinimumSystemVersion").is_empty());
    assert_eq!(plist["NSHighResolutionCapable"], serde_json::Value::Bool(true));
    assert!(plist.get("CFBundleDocumentTypes").is_none(), "the app opens no documents");
    let exe = app.join("MacOS").join(s("CFBundleExecutable"));
    let mode = std::fs::metadata(&exe).unwrap().permissions().mode();
    assert!(mode & 0o111 != 0, "{} is not executable", exe.display());
    assert_eq!(std::fs::read(app.join("PkgInfo")).unwrap(), b"APPL????");
    let icon = app.join("Resources").join(format!("{}.icns", s("CFBundleIconFile")));
    let icns = std::fs::read(&icon).unwrap();
    assert_eq!(&icns[..4], b"icns");
    assert_eq!(u32::from_be_bytes(icns[4..8].try_into().unwrap()) as usize, icns.len());
    let mut models: Vec<_> = std::fs::read_dir(app.join("Resources/assets/models"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    models.sort();
    let mut want = vec![mentor_lab::models::DEFAULT_TARGET_FILE, mentor_lab::models::DEFAULT_DRAFT_FILE];
    want.sort();
    assert_eq!(models, want, "the default pair is inside the bundle, and no draft Metal cannot run");
    let licence = std::fs::read_to_string(app.join("Resources/assets/models/SmolLM2-135M-Instruct.Q4_1.LICENSE.txt"))
        .expect("the target's licence is beside it");
    assert!(licence.contains("SmolLM2-135M-Instruct") && licence.contains("Apache License"));
    assert_eq!(s("CFBundleExecutable"), "Mentor Lab", "macOS titles the app menu after the executable");
    // The bundled binary finds its assets (and so the draft) from inside the bundle.
    let listed = Command::new(&exe).arg("models").env("MENTOR_LAB_MODELS", out.path()).output().unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains("Resources/assets/models/"), "{text}");
    // The bundled target is used with an empty models folder: no fetch, no Python.
    let empty_path = tempfile::tempdir().unwrap();
    let run = Command::new(&exe)
        .args(["generate", "--prompt", "Hi", "--max-tokens", "2"])
        .env("MENTOR_LAB_MODELS", out.path().join("no-models-here"))
        .env("PATH", empty_path.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    // The static macOS checks refuse this bundle: its executable is not a Mach-O.
    let check = Command::new("python3")
        .arg(format!("{root}/bundle/check_macos_app.py"))
        .arg(out.path().join("Mentor Lab.app"))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "{report}");
    assert!(report.contains("not a 64-bit little-endian Mach-O") && report.contains("no arm64 code"), "{report}");
    assert!(!report.contains("default target is not in the bundle"), "{report}");
}

/// The stub SDK the macOS link uses on Linux: libSystem's export list, edited so that rust-lld's
/// reader takes it, and a stub with the install name of every framework and library.
#[test]
fn the_stub_macos_sdk_has_what_the_linker_needs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let sdk = tempfile::tempdir().unwrap();
    let status = Command::new("python3")
        .arg(format!("{root}/bundle/macos_sdk.py"))
        .arg(sdk.path())
        .args(["--cache", &format!("{root}/target/macos-sdk-cache")])
        .status()
        .unwrap();
    assert!(status.success());
    let libsystem = std::fs::read_to_string(sdk.path().join("usr/lib/libSystem.tbd")).unwrap();
    assert!(libsystem.contains("install-name:    '/usr/lib/libSystem.B.dylib'"));
    assert!(libsystem.contains("_malloc") && libsystem.contains("_pthread_create"), "the real export list");
    assert!(!libsystem.contains("arm64e.x1"));
    for list in libsystem.split("targets:").skip(1) {
        let list = &list[..list.find(']').unwrap()];
        assert!(!list.contains("arm64e-macos") || list.contains("arm64-macos"), "{list}");
    }
    let appkit =
        std::fs::read_to_string(sdk.path().join("System/Library/Frameworks/AppKit.framework/AppKit.tbd")).unwrap();
    assert!(appkit.contains("/System/Library/Frameworks/AppKit.framework/Versions/C/AppKit"));
    let metal =
        std::fs::read_to_string(sdk.path().join("System/Library/Frameworks/Metal.framework/Metal.tbd")).unwrap();
    assert!(metal.contains("/System/Library/Frameworks/Metal.framework/Versions/A/Metal"));
    let objc = std::fs::read_to_string(sdk.path().join("usr/lib/libobjc.tbd")).unwrap();
    assert!(objc.contains("/usr/lib/libobjc.A.dylib"));
}
