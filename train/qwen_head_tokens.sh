#!/usr/bin/env bash
# The head-token list shipped for the Qwen2.5-Coder pair's draft
# (assets/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.head-tokens): the 32,768 tokens most
# frequent in a corpus of code and English prose, plus the chat's control tokens. The corpus is
# CPython 3.11's standard library (its own files, without site-packages) and this repository's
# docs and prompts; about a minute on 2 cores. Other Python versions give a slightly different list.
set -euo pipefail
cd "$(dirname "$0")/.."
STDLIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
mapfile -t CORPUS < <(find "$STDLIB" -mindepth 1 -maxdepth 1 ! -name site-packages ! -name '__pycache__' | sort)
cargo run --release -- head-tokens --pair qwen-coder --n 32768 \
  --corpus "${CORPUS[@]}" docs README.md assets/prompts train/prompts.py \
  --out assets/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.head-tokens
