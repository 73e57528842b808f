"""Tokenize the chat-formatted prompts locally (tokenizer rebuilt from the target GGUF) -> build/inputs.json."""
import json, os, sys
from gguf_io import build_tokenizer, chat_prompt

CATS = ["creative", "code", "qa", "chat"]

# Openers for prompts the target writes itself (the user turn is sampled from the target after the opener):
# more topics than any template list, so the draft sees the target answering things nobody listed.
OPENERS = [
    "Write a poem about", "Write a short story", "Write a story about", "Describe", "Imagine", "Write a letter",
    "Write a song", "Tell me a story", "Write a haiku", "Write a scene",
    "Write a Python function", "Write a function", "How do I", "Write a program", "Explain this code",
    "What is the difference between", "Write a SQL query", "Write a JavaScript", "How can I fix",
    "What is", "Why do", "How does", "Who was", "Explain", "What are the", "When did", "Where is", "Why is",
    "Can you help me", "I need advice", "Give me some tips", "What should I", "I feel", "Can you recommend",
    "Help me plan", "Summarize", "Tell me about", "Compare", "List", "Translate",
]

MARK = "\u0001MARK\u0001"

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
           # chat_prompt(X) = head + X + tail: the self-prompt generator samples X after head + opener
           "self_head": tok.encode(chat_prompt(MARK).split(MARK)[0]).ids,
           "self_openers": [tok.encode(o).ids for o in OPENERS],
           "self_tail": tok.encode(chat_prompt(MARK).split(MARK)[1]).ids,
           "newline_id": tok.encode("\n").ids}
    json.dump(out, open(os.path.join(here, "build", "inputs.json"), "w"))
    L = [len(x[1]) for x in out["train"]]
    print(len(L), "train prompts, max len", max(L), "mean", sum(L) / len(L), "newline", out["newline_id"])
