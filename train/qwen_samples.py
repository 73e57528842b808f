"""The Qwen2.5-Coder 1.5B target's own answers to training prompts, as a corpus for the draft's
head-token list (`train/qwen_head_tokens.sh`): which tokens the target writes, prose included.

Usage: python3 train/qwen_samples.py MENTOR_LAB_BINARY [OUT_DIR] [--per-category N ...]
Reads train/build/prompts_train.jsonl (`python3 train/prompts.py`), takes an evenly spaced share of
each category's prompts, and writes each answer (T = 0.7, seed = its index, up to 192 tokens,
lossless speculative decoding: the target's own text) to OUT_DIR/NNNN-category.txt, skipping
answers already there, so an interrupted run resumes. OUT_DIR defaults to
~/.cache/mentor-lab/qwen-samples. About 15 s per answer on 1 thread of a 2-core machine.
"""
import json
import os
import subprocess
import sys

PER_CATEGORY = {"creative": 60, "chat": 30, "qa": 20, "code": 20}


def main():
    binary = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/mentor-lab/qwen-samples")
    os.makedirs(out, exist_ok=True)
    prompts = [json.loads(line) for line in open("train/build/prompts_train.jsonl")]
    chosen = []
    for cat, n in PER_CATEGORY.items():
        items = [(i, p["prompt"]) for i, p in enumerate(prompts) if p["category"] == cat]
        step = max(1, len(items) // n)
        chosen += [(i, cat, text) for i, text in items[::step][:n]]
    for i, cat, text in sorted(chosen):
        path = os.path.join(out, f"{i:04d}-{cat}.txt")
        if os.path.exists(path):
            continue
        args = [binary, "generate", "--pair", "qwen-coder", "--prompt", text, "--temperature", "0.7",
                "--seed", str(i), "--max-tokens", "192", "--mode", "speculative", "--threads", "1"]
        answer = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        with open(path + ".tmp", "w") as f:
            f.write(answer)
        os.replace(path + ".tmp", path)
        print(f"{path}: {len(answer)} chars", flush=True)


if __name__ == "__main__":
    main()
