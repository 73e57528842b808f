//! Every kind of bad input gives a typed error that names the problem and the fix, and the CLI
//! exits non-zero without panicking.

#[path = "common/synthetic.rs"]
mod synthetic;

use candle_core::Device;
use mentor_lab::{load_model, Engine, EngineError, GenerateRequest, Verify, WeightFormat};
use std::process::Command;
use std::sync::atomic::AtomicBool;

fn load_err(path: &std::path::Path) -> EngineError {
    match load_model(path, WeightFormat::Auto, &Device::Cpu) {
        Ok(_) => panic!("{} should not load", path.display()),
        Err(e) => e,
    }
}

#[test]
fn missing_file() {
    let e = load_err(std::path::Path::new("/nonexistent/model.gguf"));
    assert!(matches!(e, EngineError::ModelNotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("mentor-lab models"));
}

#[test]
fn not_a_gguf_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.gguf");
    std::fs::write(&p, "this is a text file, not a model").unwrap();
    let e = load_err(&p);
    assert!(matches!(e, EngineError::NotGguf { .. }), "{e:?}");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, "").unwrap();
    assert!(matches!(load_err(&empty), EngineError::NotGguf { .. }));
}

#[test]
fn truncated_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tiny.gguf");
    synthetic::write(&p, &synthetic::Spec::default());
    let bytes = std::fs::read(&p).unwrap();
    for keep in [bytes.len() - 100, bytes.len() / 2, 64] {
        let cut = dir.path().join(format!("cut{keep}.gguf"));
        std::fs::write(&cut, &bytes[..keep]).unwrap();
        let e = load_err(&cut);
        assert!(matches!(e, EngineError::CorruptGguf { .. }), "cut at {keep}: {e:?}");
        assert!(e.to_string().contains("Download the file again"));
    }
}

#[test]
fn unsupported_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("mamba.gguf");
    synthetic::write(&p, &synthetic::Spec { arch: "mamba", ..Default::default() });
    let e = load_err(&p);
    match &e {
        EngineError::UnsupportedArch { arch, .. } => assert_eq!(arch, "mamba"),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("llama") && e.to_string().contains("qwen2"));
}

fn tiny_engine(n_ctx: usize) -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tiny.gguf");
    synthetic::write(&p, &synthetic::Spec { n_ctx, ..Default::default() });
    let m = load_model(&p, WeightFormat::Auto, &Device::Cpu).unwrap();
    (dir, Engine::new(m, None).unwrap())
}

#[test]
fn empty_prompt() {
    let (_d, mut engine) = tiny_engine(256);
    for prompt in ["", "   \n\t"] {
        let req = GenerateRequest { prompt: prompt.into(), ..Default::default() };
        let e = engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap_err();
        assert!(matches!(e, EngineError::EmptyPrompt), "{e:?}");
    }
}

#[test]
fn prompt_longer_than_context() {
    let (_d, mut engine) = tiny_engine(64);
    let req = GenerateRequest { prompt: "the rain in spain ".repeat(20), max_tokens: 8, ..Default::default() };
    let e = engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap_err();
    match e {
        EngineError::PromptTooLong { n_ctx, n_new, .. } => assert_eq!((n_ctx, n_new), (64, 8)),
        other => panic!("{other:?}"),
    }
    // The engine is still usable afterwards.
    let ok = GenerateRequest { prompt: "the rain".into(), max_tokens: 4, ignore_eos: true, ..Default::default() };
    assert_eq!(engine.generate(&ok, &AtomicBool::new(false), &mut |_| {}).unwrap().tokens.len(), 4);
}

#[test]
fn invalid_settings_are_rejected() {
    let (_d, mut engine) = tiny_engine(256);
    let mut bad = vec![
        GenerateRequest { max_tokens: 0, ..Default::default() },
        GenerateRequest { verify: Verify { budget: 1.5, ..Verify::default() }, ..Default::default() },
        GenerateRequest { verify: Verify { budget: -0.1, ..Verify::default() }, ..Default::default() },
    ];
    let mut r = GenerateRequest::default();
    r.sampling.temperature = -1.0;
    bad.push(r);
    let mut r = GenerateRequest::default();
    r.sampling.top_p = 0.0;
    bad.push(r);
    for mut req in bad {
        req.prompt = "the rain".into();
        let e = engine.generate(&req, &AtomicBool::new(false), &mut |_| {}).unwrap_err();
        assert!(matches!(e, EngineError::InvalidSetting(_)), "{e:?}");
    }
}

fn cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mentor-lab")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "CLI panicked: {stderr}");
    (out.status.success(), stderr)
}

#[test]
fn cli_reports_errors_and_exits_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, "junk").unwrap();
    let tiny = dir.path().join("tiny.gguf");
    synthetic::write(&tiny, &synthetic::Spec { n_ctx: 64, ..Default::default() });
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["generate".into(), "--prompt".into(), "hi".into(), "--target".into(), "/no/such.gguf".into()],
            "not found",
        ),
        (
            vec!["generate".into(), "--prompt".into(), "hi".into(), "--target".into(), junk.display().to_string()],
            "not a GGUF",
        ),
        (
            vec!["generate".into(), "--prompt".into(), "".into(), "--target".into(), tiny.display().to_string()],
            "prompt is empty",
        ),
        (
            vec![
                "generate".into(),
                "--prompt".into(),
                "the rain ".repeat(40),
                "--target".into(),
                tiny.display().to_string(),
            ],
            "context",
        ),
        (vec!["generate".into(), "--prompt".into(), "hi".into(), "--temperature=-2".into()], "temperature"),
        (vec!["generate".into(), "--prompt".into(), "hi".into(), "--draft-len".into(), "40".into()], "draft length"),
    ];
    for (args, needle) in cases {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stderr) = cli(&refs);
        assert!(!ok, "{args:?} should fail");
        assert!(stderr.contains(needle), "{args:?}: stderr {stderr:?} lacks {needle:?}");
    }
}

/// Overwrite the first occurrence of GGUF string `s` (its u64 length, then its bytes) with a byte
/// that is never valid UTF-8 at `offset` into the string.
fn damage_string(path: &std::path::Path, s: &str, offset: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle.as_slice()).expect("string in the file");
    bytes[at + 8 + offset] = 0xFF;
    std::fs::write(path, bytes).unwrap();
}

/// Metadata strings that are not valid UTF-8 (a merge, a model name) are an error naming the
/// key: read lossily, a damaged merge would silently split prompts into more tokens.
#[test]
fn metadata_that_is_not_utf8_is_an_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (key, s, offset, element) in
        [("tokenizer.ggml.merges", "Ġt he", 4, Some(2)), ("general.name", "synthetic-qwen2", 3, None)]
    {
        let p = dir.path().join("damaged.gguf");
        synthetic::write(&p, &synthetic::Spec::default());
        damage_string(&p, s, offset);
        let e = load_err(&p);
        let msg = e.to_string();
        assert!(matches!(e, EngineError::CorruptGguf { .. }), "{msg}");
        assert!(msg.contains(key) && msg.contains("not valid UTF-8"), "{msg}");
        if let Some(k) = element {
            assert!(msg.contains(&format!("element {k}")), "{msg}");
        }
    }
}

/// A budget outside the rule's range is refused before any model loads, naming the parameter, its
/// range and the flag to change.
#[test]
fn cli_rejects_a_budget_outside_the_rules_range() {
    let generate = |extra: &[&str]| {
        let mut args = vec!["generate", "--prompt", "hi", "--target", "/no/such.gguf"];
        args.extend_from_slice(extra);
        cli(&args)
    };
    for (extra, needles) in [
        (&["--tv-budget", "1.5"][..], &["TV budget", "between 0 and 1", "--budget"][..]),
        (&["--rule", "cascade", "--budget", "-2"], &["cascade α", "between -1 and 1"]),
        (&["--rule", "fuzzy", "--budget", "0.9"], &["fuzzy threshold T", "0.693"]),
        (&["--rule", "lenience", "--budget", "0"], &["lenience l", "0.01"]),
        (&["--rule", "typical"], &["no lossless value", "typical ε"]),
        (&["--mentor", "kl", "--budget", "3"], &["KL budget (nats)", "between 0 and 2"]),
    ] {
        let (ok, stderr) = generate(extra);
        assert!(!ok, "{extra:?} should fail");
        for needle in needles {
            assert!(stderr.contains(needle), "{extra:?}: stderr {stderr:?} lacks {needle:?}");
        }
    }
    // A value in range gets past the check to the model's absence.
    let (ok, stderr) = generate(&["--rule", "cascade", "--budget", "-0.5"]);
    assert!(!ok && stderr.contains("not found"), "{stderr}");
}

/// The request's own check names the parameter of its rule and its range.
#[test]
fn requests_outside_the_rules_range_are_invalid() {
    use mentor_lab::MentorRule;
    for (rule, budget) in [
        (MentorRule::Kl, 2.5),
        (MentorRule::Cascade, -1.5),
        (MentorRule::Fuzzy, -0.1),
        (MentorRule::Typical, 1.1),
        (MentorRule::Lenience, 0.0),
        (MentorRule::Lenience, f64::NAN),
    ] {
        let req = GenerateRequest {
            prompt: "the rain".into(),
            verify: Verify { rule, budget, ..Verify::default() },
            ..Default::default()
        };
        match req.validate() {
            Err(EngineError::InvalidSetting(e)) => {
                assert!(e.contains(rule.param().name) && e.contains("choose a budget"), "{rule}: {e}")
            }
            other => panic!("{rule} {budget}: {other:?}"),
        }
        let fine = GenerateRequest { verify: Verify { budget: rule.param().max, ..req.verify }, ..req };
        assert!(fine.validate().is_ok(), "{rule}");
    }
}
