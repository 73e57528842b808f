"""Write a student trained by `train/qwen_distill.py` as a `llama` GGUF Mentor Lab runs as the draft
of the Qwen2.5-Coder 1.5B target: Q8_0 matrices, the target's tokenizer keys verbatim, and its
head restricted to the student's vocabulary (`mentor_lab.head_tokens`).

Usage: python3 train/qwen_export.py TARGET.gguf PACK.npz RUN_DIR OUT.gguf

The embedding covers the target's whole vocabulary: the student's tokens get their trained rows,
every other token the target's embedding row projected as the student's were at the start
(`qwen_pack.py`'s PCA), so that prompts may hold any token.
"""
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_gguf import HEAD_TOKENS_KEY, copy_tokenizer, finish, load_f16  # noqa: E402
from qwen_pack import pca_embedding  # noqa: E402

CONTEXT = 4096


def header(tr, out, cfg, head):
    wr = GGUFWriter(out, "llama")
    wr.add_name(f"mentor-lab-draft-qwen2.5-coder-d{cfg['d']}-l{cfg['n_layers']}")
    wr.add_license("apache-2.0")
    wr.add_context_length(CONTEXT)
    wr.add_embedding_length(cfg["d"])
    wr.add_block_count(cfg["n_layers"])
    wr.add_feed_forward_length(cfg["ffn"])
    wr.add_head_count(cfg["n_heads"])
    wr.add_head_count_kv(cfg["n_kv"])
    wr.add_rope_freq_base(float(cfg["theta"]))
    wr.add_layer_norm_rms_eps(float(cfg["eps"]))
    wr.add_rope_dimension_count(cfg["d"] // cfg["n_heads"])
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    wr.add_key_value(HEAD_TOKENS_KEY, [int(t) for t in head], VT.ARRAY, sub_type=VT.UINT32)
    copy_tokenizer(tr, wr)
    return wr


def main():
    target, pack, run, out = sys.argv[1:5]
    ix, w = load_f16(run, "student")
    cfg = ix["cfg"]
    vocab = np.load(pack)["vocab"].astype(np.int64)
    tr = GGUFReader(target)
    n_vocab = len(tr.fields["tokenizer.ggml.tokens"].data)
    emb = pca_embedding(target, np.arange(n_vocab), cfg["d"])
    emb[vocab] = w["token_embd.weight"]
    w["token_embd.weight"] = emb.astype(np.float32)
    tmp = out + ".tmp"
    wr = header(tr, tmp, cfg, vocab)
    order = ["token_embd.weight"] + [k for k in w if k.startswith("blk.")] + ["output_norm.weight"]
    finish(wr, [(k, w[k]) for k in order])
    os.replace(tmp, out)
    print(f"wrote {out}: {os.path.getsize(out) / 1e6:.1f} MB, head of {len(vocab)} tokens")


if __name__ == "__main__":
    main()
