"""Write the trained draft as a llama.cpp GGUF (Q8_0 matrices, F32 norms) with the target's tokenizer
metadata copied verbatim, then verify it: read back, numpy forward vs the training run's reference logits.

usage: python3 export_gguf.py TARGET.gguf RUN_DIR OUT.gguf [COUNTS.npy N]
RUN_DIR holds student_index.json, student_w*.f16, ref_logits.npz, results.json from distill.py.
With COUNTS.npy (distill.py's token_counts.npy: how often each token was sampled in the teacher's
responses) and N, the N most frequent tokens are listed under `mentor_lab.head_tokens`: Mentor Lab
then computes the draft's output head for those tokens only (the others get probability 0)."""
import json, os, sys
import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as Q, GGUFValueType as VT
from gguf.quants import quantize
from gguf_io import load_weights
import np_llama

CONTEXT = 2048  # trained on packed 2048-token windows


def load_f16(run, prefix):
    """distill.py's / eagle.py's fp16 export: (index, {name: float32 array})."""
    ix = json.load(open(os.path.join(run, f"{prefix}_index.json")))
    flat = np.concatenate([np.fromfile(os.path.join(run, f"{prefix}_w{i}.f16"), dtype=np.float16) for i in range(ix["files"])])
    assert len(flat) == ix["total"]
    return ix, {k: flat[o:o + int(np.prod(sh))].reshape(sh).astype(np.float32) for k, sh, o in ix["index"]}


def load_run(run):
    ix, w = load_f16(run, "student")
    return ix["cfg"], w


HEAD_TOKENS_KEY = "mentor_lab.head_tokens"


def head_tokens(counts, n):
    """The n most often sampled token ids (ties broken by id), ascending."""
    order = np.lexsort((np.arange(len(counts)), -counts))
    return np.sort(order[:n]).astype(np.uint32)


def start(tr, out, name, cfg, n_layers, head, extra=()):
    """A GGUFWriter with the `llama` header of a model of cfg's shape and n_layers blocks (RoPE base
    and norm eps from the target tr), the head token list, the `extra` (key, value, type[, sub_type])
    keys, and the target's tokenizer keys."""
    wr = GGUFWriter(out, "llama")
    wr.add_name(name)
    wr.add_license("apache-2.0")
    wr.add_context_length(CONTEXT)
    wr.add_embedding_length(cfg["d"])
    wr.add_block_count(n_layers)
    wr.add_feed_forward_length(cfg["ffn"])
    wr.add_head_count(cfg["n_heads"])
    wr.add_head_count_kv(cfg["n_kv"])
    wr.add_rope_freq_base(float(tr.fields["llama.rope.freq_base"].contents()))
    wr.add_layer_norm_rms_eps(float(tr.fields["llama.attention.layer_norm_rms_epsilon"].contents()))
    wr.add_rope_dimension_count(cfg["d"] // cfg["n_heads"])
    wr.add_vocab_size(cfg["vocab"])
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    if head is not None:
        wr.add_key_value(HEAD_TOKENS_KEY, [int(t) for t in head], VT.ARRAY, sub_type=VT.UINT32)
    for key, value, *types in extra:
        wr.add_key_value(key, value, types[0], sub_type=types[1] if len(types) > 1 else None)
    copy_tokenizer(tr, wr)
    return wr


def copy_tokenizer(tr, wr):
    """Every `tokenizer.*` key of the target's reader tr, verbatim, into the writer wr."""
    for key, f in tr.fields.items():
        if key.startswith("tokenizer."):
            if f.types[0] == VT.ARRAY:
                wr.add_key_value(key, f.contents(), VT.ARRAY, sub_type=f.types[-1])
            else:
                wr.add_key_value(key, f.contents(), f.types[0])


def write(target, cfg, w, out, name, head=None):
    tr = GGUFReader(target)
    wr = start(tr, out, name, cfg, cfg["n_layers"], head)
    order = ["token_embd.weight"] + [k for k in w if k.startswith("blk.")] + ["output_norm.weight"]
    finish(wr, [(k, w[k]) for k in order])


def finish(wr, tensors):
    """Add (name, array) tensors (matrices as Q8_0, vectors as F32) and write the file."""
    for k, a in tensors:
        if a.ndim == 2:
            wr.add_tensor(k, quantize(a, Q.Q8_0), raw_dtype=Q.Q8_0)
        else:
            wr.add_tensor(k, a.astype(np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def tv_stats(a, b, temp=0.7):
    pa = np.exp((a - a.max(-1, keepdims=True)) / temp); pa /= pa.sum(-1, keepdims=True)
    pb = np.exp((b - b.max(-1, keepdims=True)) / temp); pb /= pb.sum(-1, keepdims=True)
    return 1 - 0.5 * np.abs(pa - pb).sum(-1)


if __name__ == "__main__":
    target, run, out = sys.argv[1:4]
    cfg, w = load_run(run)
    head = None
    if len(sys.argv) > 5:
        counts = np.load(sys.argv[4])
        head = head_tokens(counts, int(sys.argv[5]))
        print(f"head tokens: {len(head)} most frequent, {counts[head].sum() / counts.sum():.4f} of "
              f"{counts.sum()} sampled response tokens")
    name = f"mentor-lab-draft-smollm2-135m-d{cfg['d']}-l{cfg['n_layers']}"
    write(target, cfg, w, out, name, head)
    print("wrote", out, os.path.getsize(out), "bytes")

    # ---- verify: read back, metadata, tensors, forward
    r = GGUFReader(out)
    t = GGUFReader(target)
    for k, f in t.fields.items():
        if k.startswith("tokenizer."):
            assert r.fields[k].contents() == f.contents(), k
    print("tokenizer.* keys identical:", sum(k.startswith("tokenizer.") for k in t.fields))
    if head is not None:
        assert list(r.fields[HEAD_TOKENS_KEY].contents()) == [int(x) for x in head]
        print(f"{HEAD_TOKENS_KEY}: {len(head)} ids read back")
    gcfg, gw = load_weights(out)
    print("cfg from gguf:", gcfg)
    assert set(gw) == set(w), set(gw) ^ set(w)
    ref = np.load(os.path.join(run, "ref_logits.npz"))
    ids, pos, rl = ref["ids"], ref["positions"], ref["logits"]
    l16 = np_llama.forward(gcfg, w, ids)[pos]
    lq8 = np_llama.forward(gcfg, gw, ids)[pos]
    print(f"numpy(fp16 weights) vs torch ref: max|dlogit| {np.abs(l16 - rl).max():.2e}, argmax equal "
          f"{(l16.argmax(-1) == rl.argmax(-1)).mean():.2f}")
    print(f"numpy(GGUF Q8_0) vs torch ref: max|dlogit| {np.abs(lq8 - rl).max():.3f}, argmax equal "
          f"{(lq8.argmax(-1) == rl.argmax(-1)).mean():.2f}, mean 1-TV(T=0.7) {tv_stats(lq8, rl).mean():.4f}")
