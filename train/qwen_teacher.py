"""The Qwen2.5-Coder 1.5B target's next-token distributions over a corpus of code and prose: the
data a small draft for it is distilled from on a GPU machine that cannot hold the target.

Usage: python3 train/qwen_teacher.py MENTOR_LAB_BINARY [--out DIR] [--shards N] [--threads T]
       python3 train/qwen_teacher.py MENTOR_LAB_BINARY --draft-answers [--out DIR] [--shards N]

With --draft-answers the records are instead the training prompts of train/build/prompts_train.jsonl
(`python3 train/prompts.py`), shuffled with seed 0, each answered by the pair's draft (the 0.5B
sibling, T = 0.7, up to 384 tokens, `teacher-data --answers draft`) and scored by the target:
answers close to the target's own, made at the draft's speed, in DIR/draft-NNNNN.bin (about 8
minutes a shard of 96 on 2 threads).

Records are (prompt, answer) pairs made from source files found on this machine: the Python
standard library (*.py) and the Rust crates in Cargo's registry (*.rs, at most two per Python
file, and README.md), in a fixed order shuffled with seed 0, each file's first ANSWER_CHARS characters (cut at a line end) as the
answer to a prompt asking for that file. They are written in shards of SHARD records,
DIR/shard-NNNNN.jsonl, and `mentor-lab teacher-data` turns each into DIR/shard-NNNNN.bin (the
target's top 16 log-probabilities at every answer position). First, where `train/qwen_samples.py`
has kept the target's own answers to training prompts, they make DIR/shard-samples.bin. A shard
whose .bin exists is skipped,
so an interrupted run resumes; DIR defaults to ~/.cache/mentor-lab/qwen-teacher. On 2 threads of an
AVX-512 VNNI core pair a shard takes about 6 minutes.

The .bin layout (little-endian): b"MLTD", u32 version (1), u32 K, u32 n_records, then per record
u32 n_tokens, u32 n_prompt, u32 ids[n_tokens], and for each answer position j in n_prompt ..
n_tokens - 1 (the distribution that predicts ids[j]) u32 top_ids[K] then f32 log_probs[K].
"""
import argparse
import glob
import json
import os
import random
import subprocess

SHARD = 96
ANSWER_CHARS = 2400
MAX_TOKENS = 768
ROOTS = [
    ("/usr/lib/python3*/**/*.py", "python"),
    (os.path.expanduser("~/.cargo/registry/src/*/*/src/**/*.rs"), "rust"),
    (os.path.expanduser("~/.cargo/registry/src/*/*/README.md"), "markdown"),
]


def files():
    found = []
    for pattern, lang in ROOTS:
        for path in sorted(glob.glob(pattern, recursive=True)):
            if "/test" not in path and os.path.getsize(path) >= 400:
                found.append((path, lang))
    rng = random.Random(0)
    rng.shuffle(found)
    # At most two Rust files per Python one: the registry holds five times as many.
    n_python = sum(lang == "python" for _, lang in found)
    rust = [f for f in found if f[1] == "rust"][: 2 * n_python]
    found = [f for f in found if f[1] != "rust"] + rust
    rng.shuffle(found)
    return found


def record(path, lang, index):
    """A prompt asking for the file and its beginning as the answer, or None for unusable text."""
    try:
        text = open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        return None
    if len(text) > ANSWER_CHARS:
        text = text[: text.rfind("\n", 0, ANSWER_CHARS) + 1] or text[:ANSWER_CHARS]
    name = os.path.basename(path)
    if lang == "markdown":
        crate = os.path.basename(os.path.dirname(path)).rsplit("-", 1)[0]
        asks = [f"Write a README for the Rust crate `{crate}`.", f"Document the `{crate}` crate for its users."]
        return {"prompt": asks[index % 2], "answer": text}
    asks = [
        f"Write the {lang} file `{name}`.",
        f"Show me an implementation of `{name}` in {lang.capitalize()}.",
        f"Here is what I need: a {lang} module like `{name}`. Please write it.",
    ]
    answer = f"Here is `{name}`:\n\n```{lang}\n{text.rstrip()}\n```"
    return {"prompt": asks[index % 3], "answer": answer}


def sample_records(samples, prompts_file):
    """The target's own answers to training prompts (`train/qwen_samples.py`), where kept."""
    if not (os.path.isdir(samples) and os.path.exists(prompts_file)):
        return []
    prompts = [json.loads(line)["prompt"] for line in open(prompts_file)]
    out = []
    for name in sorted(os.listdir(samples)):
        if name.endswith(".txt"):
            answer = open(os.path.join(samples, name), encoding="utf-8").read().strip()
            out.append({"prompt": prompts[int(name.split("-")[0])], "answer": answer})
    return out


def run_shard(a, base, records, extra):
    """Write `records` to base.jsonl and the target's distributions over them to base.bin."""
    with open(base + ".jsonl.tmp", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(base + ".jsonl.tmp", base + ".jsonl")
    args = [a.binary, "teacher-data", "--pair", "qwen-coder", "--threads", str(a.threads),
            "--input", base + ".jsonl", "--out", base + ".bin", "--top", "16",
            "--max-tokens", str(MAX_TOKENS), *extra]
    subprocess.run(args, check=True)


def run_shards(a, prefix, records, extra=lambda s: []):
    """`records` in shards of SHARD, DIR/prefix-NNNNN.bin (`extra(s)`: shard s's further
    teacher-data arguments), skipping the shards already made."""
    n_shards = min(a.shards, len(records) // SHARD)
    print(f"{len(records)} records, {n_shards} shards of {SHARD}", flush=True)
    for s in range(n_shards):
        base = os.path.join(a.out, f"{prefix}-{s:05d}")
        if not os.path.exists(base + ".bin"):
            run_shard(a, base, records[s * SHARD : (s + 1) * SHARD], extra(s))


def draft_answer_shards(a):
    """Training prompts, each answered by the draft (seed: the record's index) and scored by the
    target."""
    prompts = [json.loads(line) for line in open("train/build/prompts_train.jsonl")]
    order = list(range(len(prompts)))
    random.Random(0).shuffle(order)
    records = [{"prompt": prompts[i]["prompt"]} for i in order]
    run_shards(a, "draft", records, lambda s: ["--answers", "draft", "--answer-tokens", "384", "--seed", str(s * SHARD)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/mentor-lab/qwen-teacher"))
    ap.add_argument("--shards", type=int, default=10**6, help="stop after this many shards")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-answers", action="store_true", help="training prompts answered by the draft")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for stale in glob.glob(os.path.join(a.out, "*.part")):  # an interrupted shard starts over
        os.remove(stale)
    if a.draft_answers:
        draft_answer_shards(a)
        return
    samples = os.path.join(a.out, "shard-samples")
    if not os.path.exists(samples + ".bin"):
        answers = sample_records(os.path.expanduser("~/.cache/mentor-lab/qwen-samples"), "train/build/prompts_train.jsonl")
        if answers:
            run_shard(a, samples, answers, [])
    records = [r for i, (p, lang) in enumerate(files()) if (r := record(p, lang, i)) is not None]
    run_shards(a, "shard", records)


if __name__ == "__main__":
    main()
