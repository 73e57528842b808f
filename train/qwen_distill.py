"""Distil a small draft for the Qwen2.5-Coder 1.5B target from its packed distributions
(`train/qwen_pack.py`), on one GPU, without the target itself.

Usage: python3 train/qwen_distill.py PACK.npz --out DIR [--steps N] [--fractions 0.25,0.5,1]
    [--d 384] [--layers 6] [--heads 6] [--kv 2] [--ffn 1024] [--batch 32] [--lr 2e-3] [--wd 0.01]
    [--freeze_embd] [--draft_share 0.5]

For each fraction f of the training records (the first f of them), a student (distill.py's Llama
with the pack's vocabulary, its embedding the pack's first `--d` PCA directions, tied head) trains `--steps` steps
on −Σ p log q over the teacher's top tokens (p renormalized over them) plus `--tv_weight` × TV at
T = 0.7 (p at T = 0.7 over its top tokens, q over the whole vocabulary), at every answer position.
Held-out: mean 1 − TV at T = 0.7 (the rejection rule's acceptance, p truncated to its top tokens)
and greedy agreement, every `--eval_every` steps, over the held-out records answered by the draft
where the pack has them (the closest to a chat run), else over all; the best of the last
fraction's weights are written as fp16 (distill.py's `save_f16`) with results.json. Where the pack
holds both kinds of record, `--draft_share` of each batch is drawn from those answered by the draft.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distill import Llama, save_f16  # noqa: E402

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


class Pack:
    """The packed records on the GPU: tokens per record and, per answer position, the teacher's
    top tokens and their log-probabilities."""

    def __init__(self, path, dev):
        z = np.load(path)
        self.vocab = z["vocab"]
        self.starts, self.n_prompt, self.heldout = z["starts"], z["n_prompt"], z["heldout"]
        self.tokens = torch.from_numpy(z["tokens"].astype(np.int64)).to(dev)
        lengths = np.diff(self.starts)
        self.answer_starts = np.concatenate([[0], np.cumsum(lengths - self.n_prompt)])
        self.top = torch.from_numpy(z["top"].astype(np.int64)).to(dev)
        self.logp = torch.from_numpy(z["logp"].astype(np.float32)).to(dev)
        self.emb = z["emb_q"].astype(np.float32) * z["emb_scale"]
        self.kind = z["kind"] if "kind" in z.files else np.zeros(len(self.n_prompt), np.uint8)
        self.dev = dev

    def batch(self, idx):
        """Padded tokens (B, L), and for the answer positions: (row, column) indices into them,
        the teacher's top tokens and log-probabilities."""
        lens = [int(self.starts[i + 1] - self.starts[i]) for i in idx]
        L = max(lens)
        ids = torch.zeros(len(idx), L, dtype=torch.long, device=self.dev)
        rows, cols, top, logp = [], [], [], []
        for b, i in enumerate(idx):
            s, n, npr = int(self.starts[i]), lens[b], int(self.n_prompt[i])
            ids[b, :n] = self.tokens[s:s + n]
            a0, a1 = int(self.answer_starts[i]), int(self.answer_starts[i + 1])
            rows.append(torch.full((a1 - a0,), b, device=self.dev))
            cols.append(torch.arange(npr - 1, n - 1, device=self.dev))
            top.append(self.top[a0:a1])
            logp.append(self.logp[a0:a1])
        return ids, torch.cat(rows), torch.cat(cols), torch.cat(top), torch.cat(logp)


def scores(student, pack, idx, temp=0.7):
    """Per answer position: log q over the vocabulary and the teacher's top tokens and log-probs."""
    ids, rows, cols, top, logp = pack.batch(idx)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        x = student.token_embd(ids)
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)[None]
        ang = pos[..., None].float() * student.inv_freq
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]
        for layer in student.layers:
            x = layer(x, cos, sin, None, 0, None)
        h = student.output_norm(x[rows, cols])
    logits = F.linear(h.float(), student.token_embd.weight.float())
    valid = top != 65535
    top = top.clamp(max=logits.shape[1] - 1)
    return logits, top, torch.where(valid, logp, torch.full_like(logp, -math.inf)), temp


def loss_and_acceptance(logits, top, logp, temp, tv_weight):
    logq = F.log_softmax(logits, -1)
    p = torch.softmax(logp, -1)
    ce = -(p * logq.gather(1, top)).sum(-1)
    p_t = torch.softmax(logp / temp, -1)
    q_t = torch.softmax(logits / temp, -1).gather(1, top)
    acc = torch.minimum(p_t, q_t).sum(-1)
    greedy = (logits.argmax(-1) == top[:, 0]).float()
    return (ce + tv_weight * (1 - acc)).mean(), acc.mean().item(), greedy.mean().item()


@torch.no_grad()
def evaluate(student, pack, held, batch):
    accs, greedy, n = 0.0, 0.0, 0
    for i in range(0, len(held), batch):
        idx = held[i:i + batch]
        logits, top, logp, temp = scores(student, pack, idx)
        _, a, g = loss_and_acceptance(logits, top, logp, temp, 0.0)
        accs += a * len(top); greedy += g * len(top); n += len(top)
    return accs / n, greedy / n


def train(pack, train_idx, held, a, dev):
    student = Llama(len(pack.vocab), a.d, a.layers, a.heads, a.kv, a.ffn, 1e-6, 10000.0).to(dev)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if p.dim() == 2 and name != "token_embd.weight":
                p.normal_(0, 0.02)
                if name.endswith(("attn_output.weight", "ffn_down.weight")):
                    p.mul_(1 / math.sqrt(2 * a.layers))
        e = torch.from_numpy(np.ascontiguousarray(pack.emb[:, : a.d])).to(dev)  # the top d directions
        student.token_embd.weight.copy_(e)
    student.token_embd.weight.requires_grad_(not a.freeze_embd)
    decay = [p for p in student.parameters() if p.dim() == 2 and p.requires_grad]
    nodecay = [p for p in student.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    rng = np.random.default_rng(0)
    by_kind = [train_idx[pack.kind[train_idx] == k] for k in (0, 1)]
    n_draft = int(round(a.batch * a.draft_share)) if all(len(b) for b in by_kind) else None
    best, best_state, curve = (-1.0, 0.0), None, []
    for step in range(1, a.steps + 1):
        lr = a.lr * min(1.0, step / a.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        if n_draft is None:
            idx = rng.choice(train_idx, size=min(a.batch, len(train_idx)), replace=False)
        else:
            idx = np.concatenate([rng.choice(by_kind[1], size=min(n_draft, len(by_kind[1])), replace=False),
                                  rng.choice(by_kind[0], size=min(a.batch - n_draft, len(by_kind[0])), replace=False)])
        logits, top, logp, temp = scores(student, pack, idx)
        loss, acc, _ = loss_and_acceptance(logits, top, logp, temp, a.tv_weight)
        if not torch.isfinite(loss):
            raise SystemExit(f"step {step}: the loss is not finite")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        if step % a.eval_every == 0 or step == a.steps:
            h = evaluate(student, pack, held, a.batch)
            curve.append([step, round(loss.item(), 4), round(acc, 4), round(h[0], 4), round(h[1], 4)])
            log(f"step {step} loss {loss.item():.4f} train 1-TV {acc:.4f} held-out 1-TV {h[0]:.4f} greedy {h[1]:.4f}")
            if h[0] > best[0]:
                best = h
                best_state = {k: v.detach().clone() for k, v in student.gguf_state().items()}
    return student, best, best_state, curve


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pack")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--fractions", default="1")
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--tv_weight", type=float, default=1.0)
    ap.add_argument("--eval_every", type=int, default=250)
    ap.add_argument("--wd", type=float, default=0.01, help="weight decay of the matrices")
    ap.add_argument("--freeze_embd", action="store_true", help="keep the PCA embedding (and tied head) as initialised")
    ap.add_argument("--draft_share", type=float, default=0.5, help="share of a batch answered by the draft")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test")
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = a.device
    os.makedirs(a.out, exist_ok=True)
    pack = Pack(a.pack, dev)
    held = np.flatnonzero(pack.heldout & (pack.kind == 1))
    if len(held) == 0:
        held = np.flatnonzero(pack.heldout)
    train_all = np.flatnonzero(~pack.heldout)
    log(f"{len(train_all)} training records, {len(held)} held out, vocabulary {len(pack.vocab)}")
    results = {"args": vars(a), "runs": []}
    for f in [float(x) for x in a.fractions.split(",")]:
        train_idx = train_all[: max(1, int(len(train_all) * f))]
        n_pos = int(sum(pack.answer_starts[i + 1] - pack.answer_starts[i] for i in train_idx))
        log(f"fraction {f}: {len(train_idx)} records, {n_pos} answer positions")
        student, best, state, curve = train(pack, train_idx, held, a, dev)
        results["runs"].append({"fraction": f, "records": len(train_idx), "positions": n_pos,
                                "best_heldout_1_minus_tv": best[0], "best_heldout_greedy": best[1], "curve": curve})
        json.dump(results, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    meta = {"cfg": {"vocab": len(pack.vocab), "d": a.d, "n_layers": a.layers, "n_heads": a.heads,
                    "n_kv": a.kv, "ffn": a.ffn, "eps": 1e-6, "theta": 10000.0}}
    save_f16(state, a.out, "student", meta)
    log("done")


if __name__ == "__main__":
    main()
