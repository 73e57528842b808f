//! The bundle script's Linux mode lays out `Mentor Lab.app` as on macOS; lint the result.

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
    let models: Vec<_> = std::fs::read_dir(app.join("Resources/assets/models"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
        .collect();
    assert_eq!(models.len(), 1, "the default draft is inside the bundle, and no draft Metal cannot run");
    assert_eq!(models[0].file_name(), mentor_lab::models::DEFAULT_DRAFT_FILE);
    // The bundled binary finds its assets (and so the draft) from inside the bundle.
    let listed = Command::new(&exe).arg("models").env("MENTOR_LAB_MODELS", out.path()).output().unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains("Resources/assets/models/"), "{text}");
}
