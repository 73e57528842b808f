"""Pack the Qwen target's distributions (`train/qwen_teacher.py`'s shards) and the student's
initial embedding into one compressed file small enough to travel to a GPU machine.

Usage: python3 train/qwen_pack.py TARGET.gguf [--shards DIR] [--out FILE] [--d 384] [--top 8]
    [--kinds shard,draft]

The student's vocabulary is the target's tokens that a Qwen draft's head may propose (the shipped
head-token list), every token of the data and every first choice of the teacher; its ids are those tokens in ascending order
(`vocab`). Per record: its tokens in student ids, where its answer starts; per answer position the
teacher's `--top` most likely tokens among the student's vocabulary (student ids) and their
log-probabilities (float16); its kind (`kind`: 0 for `shard-*.bin`, file contents and the target's
own answers; 1 for `draft-*.bin`, training prompts answered by the draft). Every 20th record is
held out (`heldout`). The initial embedding is
the target's embedding of the student's tokens projected onto its `--d` top principal directions,
int8 with a scale per row. Writes train/build/qwen_pack.npz by default.
"""
import argparse
import glob
import os
import struct

import numpy as np

HEAD_LIST = "assets/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.head-tokens"


def read_shard(path):
    """[(ids, n_prompt, top_ids (n, K), logp (n, K))] of one teacher-data file."""
    b = open(path, "rb").read()
    assert b[:4] == b"MLTD", path
    version, k, n = struct.unpack_from("<3I", b, 4)
    assert version == 1, path
    o, out = 16, []
    for _ in range(n):
        n_tok, n_prompt = struct.unpack_from("<2I", b, o)
        o += 8
        ids = np.frombuffer(b, "<u4", n_tok, o).copy()
        o += 4 * n_tok
        m = n_tok - n_prompt
        rows = np.frombuffer(b, np.uint8, m * k * 8, o).reshape(m, k * 8)
        o += m * k * 8
        top = rows[:, : 4 * k].copy().view("<u4")
        logp = rows[:, 4 * k :].copy().view("<f4")
        out.append((ids, n_prompt, top, logp))
    assert o == len(b), path
    return out


def pca_embedding(target, vocab, d):
    """The target's embedding rows of `vocab` on the embedding's top `d` principal directions."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(target)
    t = next(t for t in r.tensors if t.name == "token_embd.weight")
    n_embd = int(t.shape[0])
    e = dequantize(t.data, t.tensor_type).reshape(-1, n_embd).astype(np.float32)
    evals, evecs = np.linalg.eigh(e.T.astype(np.float64) @ e)
    v = evecs[:, -d:][:, ::-1].astype(np.float32)
    print(f"PCA: the top {d} directions keep {evals[-d:].sum() / evals.sum():.3f} of the embedding's energy")
    return e[vocab] @ v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("--shards", default=os.path.expanduser("~/.cache/mentor-lab/qwen-teacher"))
    ap.add_argument("--out", default="train/build/qwen_pack.npz")
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--kinds", default="shard,draft", help="which shard files to read (their name's prefix)")
    a = ap.parse_args()
    records, kinds = [], []
    for kind, prefix in enumerate(["shard", "draft"]):
        if prefix in a.kinds.split(","):
            found = [r for p in sorted(glob.glob(os.path.join(a.shards, prefix + "-*.bin"))) for r in read_shard(p)]
            records += found
            kinds += [kind] * len(found)
    head = np.loadtxt(HEAD_LIST, dtype=np.int64)
    # Every token of the data and every teacher's first choice, so that no position's targets all
    # fall outside the vocabulary.
    vocab = np.union1d(head, np.concatenate([r[0] for r in records] + [r[2][:, 0] for r in records]))
    assert len(vocab) < 65535, len(vocab)
    n_ids = 1 + max(int(vocab.max()), max(int(r[2].max()) for r in records))
    to_student = np.full(n_ids, 65535, np.int64)
    to_student[vocab] = np.arange(len(vocab))
    tokens, starts, prompts, tops, logps = [], [0], [], [], []
    for ids, n_prompt, top, logp in records:
        tokens.append(to_student[ids].astype(np.uint16))
        starts.append(starts[-1] + len(ids))
        prompts.append(n_prompt)
        s = to_student[top[:, : a.top]]
        tops.append(s.astype(np.uint16))  # 65535: outside the student's vocabulary
        logps.append(np.where(s == 65535, -np.inf, logp[:, : a.top]).astype(np.float16))
    n_pos = sum(len(t) for t in tops)
    print(f"{len(records)} records ({sum(kinds)} answered by the draft), {starts[-1]} tokens, {n_pos} answer positions, student vocabulary {len(vocab)}")
    emb = pca_embedding(a.target, vocab, a.d)
    scale = np.abs(emb).max(1, keepdims=True) / 127 + 1e-12
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    tmp = a.out + ".tmp.npz"
    np.savez_compressed(
        tmp, vocab=vocab.astype(np.uint32), tokens=np.concatenate(tokens), starts=np.array(starts, np.int64),
        n_prompt=np.array(prompts, np.int32), top=np.concatenate(tops), logp=np.concatenate(logps),
        heldout=(np.arange(len(records)) % 20 == 0), kind=np.array(kinds, np.uint8), emb_q=np.round(emb / scale).astype(np.int8),
        emb_scale=scale.astype(np.float32))
    os.replace(tmp, a.out)
    print(f"{a.out}: {os.path.getsize(a.out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
