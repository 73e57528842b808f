#!/usr/bin/env bash
# The head-token list shipped for the Qwen2.5-Coder pair's draft
# (assets/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.head-tokens):
# - the 20,000 tokens most frequent in CPython 3.11's standard library (its own files, without
#   site-packages) and this repository's docs and prompts;
# - every token of the target's own answers to 130 training prompts (train/qwen_samples.py, kept in
#   ~/.cache/mentor-lab/qwen-samples: about 40 minutes on 2 cores the first time);
# - every token of the 10,000 most frequent English words (wordfreq 3.1.1's list, with and without
#   a capital, train/english_words.py);
# - the chat's control tokens.
# Other Python versions give a slightly different list. The samples are the target's own text for
# their seeds, the same on every kernel path (they are bit for bit the same).
set -euo pipefail
cd "$(dirname "$0")/.."
SAMPLES=${SAMPLES:-$HOME/.cache/mentor-lab/qwen-samples}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cargo build
BIN=target/debug/mentor-lab
[ -f train/build/prompts_train.jsonl ] || python3 train/prompts.py
python3 train/qwen_samples.py "$BIN" "$SAMPLES"
python3 -m pip download --quiet --no-deps wordfreq==3.1.1 -d "$WORK"
python3 -m pip install --quiet msgpack
python3 train/english_words.py "$WORK"/wordfreq-3.1.1-py3-none-any.whl 10000 "$WORK/english.txt"
STDLIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
mapfile -t CORPUS < <(find "$STDLIB" -mindepth 1 -maxdepth 1 ! -name site-packages ! -name '__pycache__' | sort)
"$BIN" head-tokens --pair qwen-coder --n 20000 \
  --corpus "${CORPUS[@]}" docs README.md assets/prompts train/prompts.py \
  --keep-all "$SAMPLES" "$WORK/english.txt" \
  --out assets/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.head-tokens
