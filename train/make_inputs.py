"""Tokenize the chat-formatted prompts locally (tokenizer rebuilt from the target GGUF) -> build/inputs.json."""
import json, os, sys
from gguf_io import build_tokenizer, chat_prompt

CATS = ["creative", "code", "qa", "chat"]

if __name__ == "__main__":
    gguf_path = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    tok = build_tokenizer(gguf_path)
    enc = lambda p: tok.encode(chat_prompt(p)).ids
    rd = lambda path: [json.loads(l) for l in open(path)]
    tr = rd(os.path.join(here, "build", "prompts_train.jsonl"))
    ev = rd(os.path.join(here, "..", "assets", "prompts", "eval.jsonl"))
    out = {"cats": CATS,
           "train": [[CATS.index(r["category"]), enc(r["prompt"])] for r in tr],
           "eval": [[CATS.index(r["category"]), enc(r["prompt"])] for r in ev],
           "sanity": enc("What is the capital of France?"),
           "newline_id": tok.encode("\n").ids}
    json.dump(out, open(os.path.join(here, "build", "inputs.json"), "w"))
    L = [len(x[1]) for x in out["train"]]
    print(len(L), "train prompts, max len", max(L), "mean", sum(L) / len(L), "newline", out["newline_id"])
