//! `mentor-lab teacher-data` on the real default target: the file holds, per answer position, the
//! target's top-K tokens and their log-probabilities as the model computes them.

mod common;

use mentor_lab::model::WeightFormat;
use std::path::Path;
use std::process::Command;

const TOP: usize = 4;

/// `mentor-lab teacher-data` on the default target: whether it succeeded, and its stderr.
fn teacher_data(input: &Path, out: &Path, top: usize) -> (bool, String) {
    teacher_data_with(input, out, top, &[])
}

fn teacher_data_with(input: &Path, out: &Path, top: usize, extra: &[&str]) -> (bool, String) {
    let target = common::target_path();
    let out = Command::new(env!("CARGO_BIN_EXE_mentor-lab"))
        .args(["teacher-data", "--target", target.to_str().unwrap(), "--top", &top.to_string()])
        .args(extra)
        .arg("--input")
        .arg(input)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn u32_at(b: &[u8], o: &mut usize) -> u32 {
    let v = u32::from_le_bytes(b[*o..*o + 4].try_into().unwrap());
    *o += 4;
    v
}

fn f32_at(b: &[u8], o: &mut usize) -> f32 {
    f32::from_bits(u32_at(b, o))
}

#[test]
fn teacher_data_holds_the_targets_top_tokens_and_log_probs() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let records = [("What is the capital of France?", "The capital of France is Paris."), ("Say hi.", "Hi there!")];
    let lines: Vec<String> =
        records.iter().map(|(p, a)| serde_json::json!({"prompt": p, "answer": a}).to_string()).collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = dir.path().join("out.bin");
    let (ok, stderr) = teacher_data(&input, &out, TOP);
    assert!(ok, "{stderr}");
    let b = std::fs::read(&out).unwrap();
    assert_eq!(&b[..4], b"MLTD");
    let mut o = 4;
    assert_eq!((u32_at(&b, &mut o), u32_at(&b, &mut o), u32_at(&b, &mut o)), (1, TOP as u32, 2));
    let mut m = common::load_target(WeightFormat::Auto);
    for (prompt, answer) in records {
        let (n, n_prompt) = (u32_at(&b, &mut o) as usize, u32_at(&b, &mut o) as usize);
        let ids: Vec<u32> = (0..n).map(|_| u32_at(&b, &mut o)).collect();
        let mut expected = m.tokenizer.prompt_ids(prompt, false).unwrap();
        assert_eq!(n_prompt, expected.len());
        expected.extend(m.tokenizer.encode(answer).unwrap());
        assert_eq!(ids, expected);
        m.model.clear().unwrap();
        m.model.feed(&ids[..n_prompt - 1]).unwrap();
        let rows = m.model.forward_rows(&ids[n_prompt - 1..n - 1]).unwrap();
        for row in rows {
            let top: Vec<u32> = (0..TOP).map(|_| u32_at(&b, &mut o)).collect();
            let logp: Vec<f32> = (0..TOP).map(|_| f32_at(&b, &mut o)).collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = max + row.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
            let mut order: Vec<u32> = (0..row.len() as u32).collect();
            order.sort_by(|&x, &y| row[y as usize].total_cmp(&row[x as usize]));
            assert_eq!(top, order[..TOP]);
            for (t, lp) in top.iter().zip(&logp) {
                assert!((lp - (row[*t as usize] - lse)).abs() < 1e-5, "{lp} for token {t}");
            }
        }
    }
    assert_eq!(o, b.len(), "nothing after the last record");
}

/// With `--answers draft` each answer is the draft's own sample for the prompt at the seed plus
/// the line's index, as draft-only generation writes it, and the target's distributions follow it.
#[test]
fn draft_answers_are_the_drafts_samples_at_the_lines_seed() {
    let Some(draft_path) = common::draft_path() else { return };
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let prompts = ["Write a haiku about rain.", "What is a linked list?"];
    let lines: Vec<String> = prompts.iter().map(|p| serde_json::json!({ "prompt": p }).to_string()).collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = dir.path().join("out.bin");
    let extra = ["--draft", draft_path.to_str().unwrap(), "--answers", "draft", "--answer-tokens", "12", "--seed", "5"];
    let (ok, stderr) = teacher_data_with(&input, &out, 2, &extra);
    assert!(ok, "{stderr}");
    let b = std::fs::read(&out).unwrap();
    let mut o = 12;
    assert_eq!(u32_at(&b, &mut o), 2, "two records");
    let mut draft = mentor_lab::load_model(&draft_path, WeightFormat::Auto, &candle_core::Device::Cpu).unwrap();
    for (line, prompt) in prompts.iter().enumerate() {
        let (n, n_prompt) = (u32_at(&b, &mut o) as usize, u32_at(&b, &mut o) as usize);
        let ids: Vec<u32> = (0..n).map(|_| u32_at(&b, &mut o)).collect();
        let req = mentor_lab::GenerateRequest {
            prompt: prompt.to_string(),
            seed: 5 + line as u64,
            max_tokens: 12,
            mode: mentor_lab::Mode::Draft,
            ..Default::default()
        };
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let g = mentor_lab::generate::generate_single(&mut draft, None, &req, &cancel, &mut |_| {}).unwrap();
        let sampled: Vec<u32> = g.tokens.iter().map(|t| t.id).collect();
        assert!(!sampled.is_empty());
        assert_eq!(ids[..n_prompt], draft.tokenizer.prompt_ids(prompt, false).unwrap()[..]);
        assert_eq!(ids[n_prompt..], sampled[..], "line {line}");
        o += (n - n_prompt) * 2 * 8;
    }
    assert_eq!(o, b.len(), "nothing after the last record");
}

#[test]
fn a_malformed_line_is_named_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"prompt\": \"Hi\", \"answer\": \"Hello\"}\n{\"prompt\": \"no answer\"}\n").unwrap();
    let out = dir.path().join("out.bin");
    let (ok, stderr) = teacher_data(&input, &out, 16);
    assert!(!ok);
    assert!(stderr.contains("line 2"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("in.jsonl")], "no file written, no part left");
}
