"""Write the feature draft (eagle.py) as a GGUF Mentor Lab loads as a draft, then verify it against
the training run's reference logits with a numpy forward.

usage: python3 export_eagle.py TARGET.gguf RUN_DIR OUT.gguf COUNTS.npy N [--own-embedding] [--fixture F.json]
--fixture writes what Mentor Lab's test `feature_draft_matches_the_numpy_reference` checks: the
reference token ids and, for the last 8 positions, the 16 highest logits of the written file's numpy
forward (restricted to the head tokens).
RUN_DIR holds eagle_index.json, eagle_w0.f16 and ref_eagle.npz from eagle.py.

The file is a `llama` model of the run's blocks (one for the shipped draft; the target's width, heads
and RoPE) plus:
- `eagle.fc.weight` [d, 2d]: the block's input fc([embed(x_{t+1}), feature_t]);
- `eagle.tap_norms.{i}.weight` and `eagle.lift_fc.weight` [d, taps * d]: the target's feature at t is
  its final normed hidden state plus lift_fc of its RMS-normed residual streams after the blocks listed
  under `mentor_lab.feature_draft.taps`;
- no embedding of its own: Mentor Lab lends it the target's token embedding and the target's
  output head rows of the listed tokens (`--own-embedding` copies the target's `token_embd.weight`
  byte for byte into the file instead, for tools that need a self-contained file);
- `mentor_lab.feature_draft.target_layers` / `.target_embd`: the target shape it reads;
- `mentor_lab.head_tokens`: the N most often sampled response tokens (the head is computed for those).
Matrices are Q8_0, norms F32, and all `tokenizer.*` keys are the target's."""
import json, os, sys
import numpy as np
from gguf import GGUFReader, GGUFValueType as VT
from gguf_io import load_weights
from export_gguf import HEAD_TOKENS_KEY, finish, head_tokens, load_f16, start, tv_stats
import np_llama

TAPS_KEY = "mentor_lab.feature_draft.taps"
LAYERS_KEY = "mentor_lab.feature_draft.target_layers"
EMBD_KEY = "mentor_lab.feature_draft.target_embd"


def load_run(run):
    ix, w = load_f16(run, "eagle")
    return dict(ix["cfg"], blocks=ix.get("blocks", 1)), ix["taps"], w


def write(target, cfg, taps, w, out, head, own_embedding):
    tr = GGUFReader(target)
    extra = [(TAPS_KEY, [int(t) for t in taps], VT.ARRAY, VT.UINT32),
             (LAYERS_KEY, int(cfg["n_layers"]), VT.UINT32), (EMBD_KEY, int(cfg["d"]), VT.UINT32)]
    wr = start(tr, out, "mentor-lab-feature-draft-smollm2-135m", cfg, cfg["blocks"], head, extra)
    if own_embedding:
        emb = next(t for t in tr.tensors if t.name == "token_embd.weight")
        wr.add_tensor("token_embd.weight", emb.data, raw_dtype=emb.tensor_type)
    finish(wr, w.items())


def rms(x, wt, eps):
    return np_llama.rmsnorm(x, wt, eps)


def eagle_logits(cfg, tw, ew, taps, ids):
    """Target features of ids, then the draft's logits at every position i >= 0 for the token at
    i + 2 (input: embed(ids[i + 1]), lifted feature i)."""
    eps = cfg["eps"]
    E = tw["token_embd.weight"]
    f, extras = np_llama.features(cfg, tw, E[ids].astype(np.float32), taps)
    parts = np.concatenate([rms(e, ew[f"eagle.tap_norms.{j}.weight"], eps) for j, e in enumerate(extras)], -1)
    lifted = f + parts @ ew["eagle.lift_fc.weight"].T
    x = np.concatenate([E[ids[1:]], lifted[:-1]], -1) @ ew["eagle.fc.weight"].T
    bcfg = dict(cfg, n_layers=cfg["blocks"])
    o, _ = np_llama.features(bcfg, ew, x)
    return o @ E.T


if __name__ == "__main__":
    target, run, out, counts_path, n_head = sys.argv[1:6]
    cfg, taps, w = load_run(run)
    counts = np.load(counts_path)
    head = head_tokens(counts, int(n_head))
    own = "--own-embedding" in sys.argv[6:]
    write(target, cfg, taps, w, out, head, own)
    print("wrote", out, os.path.getsize(out), "bytes; taps", taps)

    r = GGUFReader(out)
    t = GGUFReader(target)
    for k, f in t.fields.items():
        if k.startswith("tokenizer."):
            assert r.fields[k].contents() == f.contents(), k
    assert list(r.fields[HEAD_TOKENS_KEY].contents()) == [int(x) for x in head]
    assert list(r.fields[TAPS_KEY].contents()) == list(taps)
    if own:
        te = next(x for x in t.tensors if x.name == "token_embd.weight")
        oe = next(x for x in r.tensors if x.name == "token_embd.weight")
        assert oe.tensor_type == te.tensor_type and np.array_equal(np.asarray(oe.data), np.asarray(te.data))
    else:
        assert all(x.name != "token_embd.weight" for x in r.tensors)
    print("tokenizer keys, head tokens, taps" + (", token_embd bytes" if own else "") + ": identical")

    _, tw = load_weights(target)
    _, gw = load_weights(out)
    ref = np.load(os.path.join(run, "ref_eagle.npz"))
    ids, rl = ref["ids"], ref["logits"]
    f, _ = np_llama.features(cfg, tw, tw["token_embd.weight"][ids].astype(np.float32))
    print(f"numpy target features vs torch fp32: max|d| {np.abs(f - ref['feats']).max():.2e}")
    if "--fixture" in sys.argv:
        fx = sys.argv[sys.argv.index("--fixture") + 1]
        z = eagle_logits(cfg, tw, gw, taps, ids)
        rows = []
        for i in range(len(z) - 8, len(z)):
            zh = z[i][head]
            top = np.argsort(-zh)[:16]
            rows.append({"input_position": int(i), "tokens": [int(head[j]) for j in top], "logits": [float(zh[j]) for j in top]})
        json.dump({"ids": [int(x) for x in ids], "rows": rows}, open(fx, "w"), indent=1)
        print("wrote", fx)
    for label, ew in (("fp16 weights", w), ("GGUF Q8_0", gw)):
        z = eagle_logits(cfg, tw, ew, taps, ids)[-len(rl):]
        print(f"numpy eagle ({label}) vs torch ref: max|dlogit| {np.abs(z - rl).max():.3f}, argmax equal "
              f"{(z.argmax(-1) == rl.argmax(-1)).mean():.2f}, mean 1-TV(T=0.7) {tv_stats(z, rl).mean():.4f}")
